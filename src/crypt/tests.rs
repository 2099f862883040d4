use std::sync::{Arc, Mutex};

use super::*;
use crate::host::fake::{FakeCommands, FakeSyscalls, failed, succeeded};

fn machine() -> (Host, Arc<FakeCommands>, FakeSyscalls) {
    let commands = Arc::new(FakeCommands::default());
    let syscalls = FakeSyscalls::default();
    syscalls.add_device("/dev/vg/lv", 253, 4, 64 << 20);
    let host = Host {
        commands: commands.clone(),
        syscalls: Arc::new(syscalls.clone()),
    };
    (host, commands, syscalls)
}

fn key() -> Passphrase {
    Passphrase::new(b"correct horse").unwrap()
}

/// A cryptsetup call's stdin and environment, as the fake saw them.
type Seen = (Vec<u8>, Vec<(&'static str, &'static str)>);

fn record_inputs(commands: &FakeCommands, exit: Option<i32>) -> Arc<Mutex<Vec<Seen>>> {
    let seen: Arc<Mutex<Vec<_>>> = Arc::default();
    let log = Arc::clone(&seen);
    commands.on("cryptsetup", move |cmd| {
        let input = cmd.secret_input.as_ref().map(|i| i.to_vec()).unwrap_or_default();
        log.lock().unwrap().push((input, cmd.env.clone()));
        match exit {
            None => succeeded(""),
            Some(code) => failed(cmd, code, "No key available with this passphrase."),
        }
    });
    seen
}

#[test]
fn commands_have_the_exact_argv_and_no_key_in_it() {
    let mapping = Mapping::for_volume("fast.pvc-1");
    let device = Path::new("/dev/vg/lv");
    let argv = |c: CommandSpec| format!("{} {}", c.program, c.args_display());
    assert_eq!(
        argv(format_command(device, Pbkdf::default())),
        "cryptsetup luksFormat --type luks2 --batch-mode --key-file=- --pbkdf argon2id --pbkdf-memory 131072 \
         --iter-time 2000 \
         --luks2-metadata-size 16k --luks2-keyslots-size 2016k --offset 4096 /dev/vg/lv"
    );
    assert_eq!(
        argv(open_command(device, &mapping, false)),
        "cryptsetup open --type luks2 --key-file=- --disable-keyring /dev/vg/lv localvol-crypt-fast.pvc-1"
    );
    assert_eq!(
        argv(open_command(device, &mapping, true)),
        "cryptsetup open --type luks2 --key-file=- --disable-keyring --allow-discards /dev/vg/lv localvol-crypt-fast.pvc-1"
    );
    assert_eq!(
        argv(close_command(&mapping)),
        "cryptsetup close localvol-crypt-fast.pvc-1"
    );
    assert_eq!(
        argv(resize_command(&mapping)),
        "cryptsetup resize localvol-crypt-fast.pvc-1"
    );
}

#[test]
fn mapping_names_fit_device_mapper() {
    assert_eq!(
        Mapping::for_volume("fast.pvc-1").path(),
        Path::new("/dev/mapper/localvol-crypt-fast.pvc-1")
    );
    let long = format!("a-class-name-of-32-bytes-exactly.{}", "t".repeat(96));
    let name = Mapping::for_volume(&long).name().to_string();
    assert!(name.len() <= MAX_NAME, "{name}");
    assert!(name.starts_with("localvol-crypt-h+"), "{name}");
    assert_ne!(
        Mapping::for_volume(&long),
        Mapping::for_volume(&format!("{long}x"))
    );
}

#[test]
fn a_passphrase_shows_nowhere() {
    let shown = format!("{:?}", key());
    assert_eq!(shown, "Passphrase(..)");
    assert!(Passphrase::new(b"").is_none());
}

#[tokio::test]
async fn format_and_open_feed_the_passphrase_on_stdin_without_udev() {
    let (host, commands, _) = machine();
    let seen = record_inputs(&commands, None);
    format(&host, Path::new("/dev/vg/lv"), &key(), Pbkdf::default())
        .await
        .unwrap();
    let opened = open(
        &host,
        Path::new("/dev/vg/lv"),
        &Mapping::for_volume("c.v"),
        &key(),
        false,
    )
    .await
    .unwrap();
    assert_eq!(opened, Path::new("/dev/mapper/localvol-crypt-c.v"));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (input, env) in seen.iter() {
        assert_eq!(input, b"correct horse");
        assert_eq!(env, &[("DM_DISABLE_UDEV", "1")]);
    }
    assert!(
        commands.calls().iter().all(|c| !c.contains("horse")),
        "{:?}",
        commands.calls()
    );
}

/// What `open` makes of cryptsetup exiting with `code`.
async fn open_failing_with(code: i32) -> CryptError {
    let (host, commands, _) = machine();
    record_inputs(&commands, Some(code));
    let mapping = Mapping::for_volume("c.v");
    open(&host, Path::new("/dev/vg/lv"), &mapping, &key(), false)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn a_wrong_passphrase_is_its_own_error_naming_the_device_only() {
    let err = open_failing_with(2).await;
    assert!(matches!(err, CryptError::WrongPassphrase { .. }), "{err:?}");
    assert!(err.is_terminal());
    let text = format!("{err} {err:?}");
    assert!(text.contains("/dev/vg/lv") && !text.contains("horse"), "{text}");
}

#[tokio::test]
async fn other_open_failures_keep_cryptsetups_words() {
    let err = open_failing_with(1).await;
    assert!(matches!(err, CryptError::Command { op: "open", .. }), "{err:?}");
}

#[tokio::test]
async fn a_mapping_is_found_only_on_the_volumes_device() {
    let (host, _, syscalls) = machine();
    let mapping = Mapping::for_volume("c.v");
    assert_eq!(
        find(&host, &mapping, Path::new("/dev/vg/lv")).await.unwrap(),
        None
    );
    syscalls.add_mapping(mapping.path(), 253, 9, 48 << 20, Path::new("/dev/vg/lv"));
    assert_eq!(
        find(&host, &mapping, Path::new("/dev/vg/lv")).await.unwrap(),
        Some(mapping.path())
    );
    syscalls.add_device("/dev/vg/other", 253, 5, 64 << 20);
    let err = find(&host, &mapping, Path::new("/dev/vg/other"))
        .await
        .unwrap_err();
    assert!(matches!(err, CryptError::MappingElsewhere { .. }), "{err:?}");
    assert!(
        err.to_string().contains("cryptsetup close localvol-crypt-c.v"),
        "{err}"
    );
}

#[tokio::test]
async fn closing_a_closed_mapping_runs_nothing() {
    let (host, commands, syscalls) = machine();
    let mapping = Mapping::for_volume("c.v");
    close(&host, &mapping).await.unwrap();
    assert!(commands.calls().is_empty());
    syscalls.add_mapping(mapping.path(), 253, 9, 48 << 20, Path::new("/dev/vg/lv"));
    commands.on("cryptsetup", |cmd| {
        failed(cmd, 5, "Device localvol-crypt-c.v is still in use.")
    });
    let err = close(&host, &mapping).await.unwrap_err();
    assert!(!err.is_terminal(), "{err:?}");
}
