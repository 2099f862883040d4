//! A restore and a clone larger than their source on the loop class, on real loop
//! devices with real ext4 and xfs (root; fails as non-root unless SKIP_PRIVILEGED=1):
//! the scenario of tests/grow/mod.rs.

mod grow;

use localvol::model::Token;
use localvol_testkit::{InProcessDaemon, privileged};

/// The loop record's `grow_filesystem`, read from the class directory.
fn loop_mark(daemon: &InProcessDaemon) -> impl Fn(&str) -> bool {
    let class_dir = daemon.data_dir().join("loop/default");
    move |name: &str| {
        let path = class_dir.join(format!("{}.json", Token::for_name(name)));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let record: serde_json::Value = serde_json::from_str(&text).unwrap();
        record["grow_filesystem"] == true
    }
}

async fn on_loop(fs: &str) {
    if !privileged() {
        return;
    }
    let daemon = InProcessDaemon::start(&[]).await;
    grow::restore_and_clone_grow(&daemon, fs, &loop_mark(&daemon)).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_restore_and_clone_larger_than_the_source_are_grown_at_stage() {
    on_loop("ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_restore_and_clone_larger_than_the_source_are_grown_at_stage() {
    on_loop("xfs").await;
}
