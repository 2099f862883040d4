//! Test doubles for the two host seams. Both record every call so tests can assert on
//! exactly what localvol asked of the machine.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{CommandError, CommandOutput, CommandSpec, Commands, FsUsage};

mod syscalls;
pub use syscalls::FakeSyscalls;

type Handler = Box<dyn Fn(&CommandSpec) -> Result<CommandOutput, CommandError> + Send + Sync>;

/// Host seams that behave like a machine with loop devices: a host filesystem of
/// 100 GiB with 50 GiB free (`used_bytes` used), loop attach handing out `device`
/// (a 64 MiB block device 7:7), blkid reporting what mkfs.ext4 or
/// mkfs.xfs last wrote (nothing at first).
pub fn loop_machine(device: &Path, used_bytes: u64) -> (Arc<FakeCommands>, FakeSyscalls) {
    let commands = Arc::new(FakeCommands::default());
    let syscalls = FakeSyscalls::default();
    syscalls.add_device(device, 7, 7, 64 << 20);
    syscalls.set_usage(FsUsage {
        total_bytes: 100 << 30,
        available_bytes: 50 << 30,
        used_bytes,
        ..FsUsage::default()
    });
    syscalls.add_free_loop(device);
    let formatted: Arc<Mutex<Option<String>>> = Arc::default();
    {
        let formatted = Arc::clone(&formatted);
        commands.on("blkid", move |cmd| match formatted.lock().unwrap().clone() {
            Some(fs) => succeeded(format!("TYPE={fs}\nUSAGE=filesystem\n")),
            None => failed(cmd, 2, ""),
        });
    }
    for (program, fs) in [("mkfs.ext4", "ext4"), ("mkfs.xfs", "xfs")] {
        let formatted = Arc::clone(&formatted);
        commands.on(program, move |_| {
            *formatted.lock().unwrap() = Some(fs.to_string());
            Ok(CommandOutput::default())
        });
    }
    (commands, syscalls)
}

/// Takes the first failure scripted for `program` from `script`, if any: simulated
/// tools (lvm, ndctl) fail once per scripted entry, in order.
pub fn take_scripted<T>(script: &mut Vec<(&'static str, T)>, program: &str) -> Option<T> {
    let at = script.iter().position(|(p, _)| *p == program)?;
    Some(script.remove(at).1)
}

/// What a handler answers for a command that succeeds and prints `stdout`.
pub fn succeeded(stdout: impl Into<String>) -> Result<CommandOutput, CommandError> {
    Ok(CommandOutput {
        stdout: stdout.into().into_bytes(),
        stderr: String::new(),
    })
}

/// What a handler answers for `cmd` failing with `code` and `stderr`.
pub fn failed(
    cmd: &CommandSpec,
    code: i32,
    stderr: impl Into<String>,
) -> Result<CommandOutput, CommandError> {
    Err(CommandError::Failed {
        program: cmd.program,
        args: cmd.args_display(),
        exit_code: Some(code),
        stdout: String::new(),
        stderr: stderr.into(),
    })
}

/// Runs nothing: each command is answered by the first rule whose program matches.
/// An unscripted command fails, so a test states every command it expects.
#[derive(Default)]
pub struct FakeCommands {
    rules: Mutex<Vec<(&'static str, Handler)>>,
    calls: Mutex<Vec<CommandSpec>>,
}

impl FakeCommands {
    pub fn on(
        &self,
        program: &'static str,
        handler: impl Fn(&CommandSpec) -> Result<CommandOutput, CommandError> + Send + Sync + 'static,
    ) {
        self.rules.lock().unwrap().push((program, Box::new(handler)));
    }

    /// `program` succeeds and prints `stdout`.
    pub fn ok(&self, program: &'static str, stdout: &str) {
        let stdout = stdout.to_string();
        self.on(program, move |_| succeeded(stdout.clone()));
    }

    /// mkfs.ext4 and mkfs.xfs succeed: creating a loop volume whose filesystem type
    /// the request names formats its image.
    pub fn ok_mkfs(&self) {
        self.ok("mkfs.ext4", "");
        self.ok("mkfs.xfs", "");
    }

    /// `program` fails with `code` and `stderr`.
    pub fn fail(&self, program: &'static str, code: i32, stderr: &str) {
        let stderr = stderr.to_string();
        self.on(program, move |cmd| failed(cmd, code, stderr.clone()));
    }

    /// Every call so far, as `program arg arg...` lines.
    pub fn calls(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| {
                format!("{} {}", c.program, c.args_display())
                    .trim_end()
                    .to_string()
            })
            .collect()
    }

    pub fn calls_of(&self, program: &str) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.split(' ').next() == Some(program))
            .collect()
    }
}

#[async_trait]
impl Commands for FakeCommands {
    async fn run(&self, cmd: CommandSpec) -> Result<CommandOutput, CommandError> {
        self.calls.lock().unwrap().push(cmd.clone());
        let rules = self.rules.lock().unwrap();
        match rules.iter().find(|(program, _)| *program == cmd.program) {
            Some((_, handler)) => handler(&cmd),
            None => Err(CommandError::Spawn {
                program: cmd.program,
                source: std::io::Error::other(format!("unscripted command in test: {cmd:?}")),
            }),
        }
    }
}
