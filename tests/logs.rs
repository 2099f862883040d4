//! The daemon's log as a node's log collector reads it: a container's stderr is a
//! file, not a terminal.

use std::time::Duration;

use localvol_testkit::process::{Output, Spawn};

#[tokio::test]
async fn a_text_log_written_to_a_file_has_no_colour_codes() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (the loop backend's data directory, as the daemon runs)"
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let mut daemon = Spawn::new(localvol_testkit::localvol_bin!(), dir.path(), "logs")
        .standalone()
        .args(["--loop-capacity", "1Gi"])
        .env("RUST_LOG", "info")
        .env("LOCALVOL_LOG_FORMAT", "text")
        .output(Output::StderrTo(Some(log.clone())))
        .spawn();
    if let Err(e) = daemon
        .wait_for_socket(Duration::from_secs(30), Duration::from_millis(25))
        .await
    {
        panic!("{e}");
    }
    daemon.terminate().await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("serving CSI"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "terminal escape codes in a file:\n{text:?}"
    );
}
