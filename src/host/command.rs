//! The one way localvol runs an external program.
//!
//! Every storage tool (`losetup`, `mkfs.*`, `lvcreate`, `ndctl`, ...) goes through
//! [`Commands::run`]: arguments as a vector (never a shell), `LC_ALL=C` so that error
//! text can be matched, a timeout after which the child is killed, and stderr kept for
//! the error. A hung tool therefore costs one request its deadline, never the daemon.

use std::ffi::OsString;
use std::fmt;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tracing::debug;
use zeroize::Zeroizing;

/// How long a storage command may take unless its caller says otherwise. mkfs on a
/// large thin volume or an lvm call waiting for its lock can take tens of seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// One invocation: a program and its arguments, kept apart so nothing is re-parsed.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandSpec {
    pub program: &'static str,
    pub args: Vec<OsString>,
    pub timeout: Duration,
    /// Environment beside `LC_ALL=C`, for tools configured only that way.
    pub env: Vec<(&'static str, &'static str)>,
    /// Bytes written to the child's stdin, then closed; a secret (a LUKS passphrase)
    /// never goes in argv, where every process of the node can read it. Zeroed when
    /// dropped, and never shown by `Debug` or [`args_display`](Self::args_display).
    pub secret_input: Option<Zeroizing<Vec<u8>>>,
}

impl CommandSpec {
    pub fn new(program: &'static str) -> Self {
        Self {
            program,
            args: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            env: Vec::new(),
            secret_input: None,
        }
    }

    pub fn env(mut self, key: &'static str, value: &'static str) -> Self {
        self.env.push((key, value));
        self
    }

    /// Feeds `bytes` to the command on stdin (see [`CommandSpec::secret_input`]).
    pub fn secret_input(mut self, bytes: Zeroizing<Vec<u8>>) -> Self {
        self.secret_input = Some(bytes);
        self
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The arguments as one lossy string, for logs and error messages only.
    pub fn args_display(&self) -> String {
        self.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl fmt::Debug for CommandSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.program, self.args_display())
    }
}

/// What a successful command printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl CommandOutput {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} {args} failed (exit code {}): {}", exit_code.map_or("none, killed by a signal".to_string(), |c| c.to_string()), stderr.trim())]
    Failed {
        program: &'static str,
        args: String,
        exit_code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    #[error("{program} {args} did not finish within {timeout:?} and was killed")]
    TimedOut {
        program: &'static str,
        args: String,
        timeout: Duration,
    },
}

impl CommandError {
    /// The stderr text of a failed command ("" for other errors), for classifiers.
    pub fn stderr(&self) -> &str {
        match self {
            CommandError::Failed { stderr, .. } => stderr,
            CommandError::Spawn { .. } | CommandError::TimedOut { .. } => "",
        }
    }

    pub fn exit_code(&self) -> Option<i32> {
        match self {
            CommandError::Failed { exit_code, .. } => *exit_code,
            CommandError::Spawn { .. } | CommandError::TimedOut { .. } => None,
        }
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self, CommandError::TimedOut { .. })
    }

    /// Whether running the same command again cannot succeed until someone changes
    /// something (see [`crate::model::Terminal`]). A failure nobody has recognised is
    /// transient.
    pub fn is_terminal(&self) -> bool {
        match self {
            CommandError::TimedOut { .. } => false,
            // The tool is missing from the image or not executable: no retry brings it.
            CommandError::Spawn { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ),
            CommandError::Failed { stderr, stdout, .. } => {
                let text = format!("{stderr}\n{stdout}").to_ascii_lowercase();
                // Busy and lock messages win: "cannot lock" after "no space" on a full VG
                // is still worth one more try once the lock is free.
                !TRANSIENT_STDERR.iter().any(|p| text.contains(p))
                    && TERMINAL_STDERR.iter().any(|p| text.contains(p))
            }
        }
    }
}

/// stderr of LVM, ndctl, losetup, resize2fs and xfs_growfs (run with LC_ALL=C) that
/// means the request cannot be met as it is.
const TERMINAL_STDERR: &[&str] = &[
    // lvextend/lvcreate on a full VG or thin pool (tests/fixtures/lvm).
    "insufficient free space",
    "insufficient suitable allocatable extents",
    // ndctl create-namespace, resize2fs and any tool writing to a full filesystem.
    "no space left on device",
    // ext4 online resize without CAP_SYS_RESOURCE, or on a read-only mount.
    "permission denied",
    "read-only file system",
    // resize2fs on a filesystem that cannot address the new size, or told to shrink.
    "too large to be expressed in 32 bits",
    "on-line shrinking not supported",
    "requested size larger than",
    "filesystem has unsupported feature",
    "is misaligned",
];

/// stderr that means someone else holds what the command needs, or it gave up waiting.
const TRANSIENT_STDERR: &[&str] = &[
    "device or resource busy",
    "resource temporarily unavailable",
    "lock",
    "timed out",
    "timeout",
    "interrupted system call",
];

/// The seam for external programs. The real implementation runs them; tests use
/// [`crate::host::fake::FakeCommands`], which records each call and replays a script.
#[async_trait]
pub trait Commands: Send + Sync + 'static {
    async fn run(&self, cmd: CommandSpec) -> Result<CommandOutput, CommandError>;
}

/// Runs commands for real with `tokio::process`.
#[derive(Debug, Default, Clone)]
pub struct SystemCommands;

#[async_trait]
impl Commands for SystemCommands {
    async fn run(&self, cmd: CommandSpec) -> Result<CommandOutput, CommandError> {
        debug!(command = ?cmd, "running");
        let mut child = tokio::process::Command::new(cmd.program)
            .args(&cmd.args)
            .env("LC_ALL", "C")
            .envs(cmd.env.iter().copied())
            .stdin(if cmd.secret_input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropping the future (timeout, cancelled RPC) kills the child.
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| CommandError::Spawn {
                program: cmd.program,
                source,
            })?;
        let started = std::time::Instant::now();
        // Written while the child runs, and closed at the end so it sees EOF. A child
        // that exits without reading it all makes the write fail: its exit status
        // says why, so that error is not the one reported.
        let feed = match (child.stdin.take(), cmd.secret_input.clone()) {
            (Some(mut stdin), Some(bytes)) => Some(async move {
                let _ = stdin.write_all(&bytes).await;
                drop(stdin);
            }),
            _ => None,
        };
        let run = async {
            let (output, ()) = tokio::join!(child.wait_with_output(), async {
                if let Some(feed) = feed {
                    feed.await;
                }
            });
            output
        };
        let output = match tokio::time::timeout(cmd.timeout, run).await {
            Ok(result) => result.map_err(|source| CommandError::Spawn {
                program: cmd.program,
                source,
            })?,
            Err(_) => {
                return Err(CommandError::TimedOut {
                    program: cmd.program,
                    args: cmd.args_display(),
                    timeout: cmd.timeout,
                });
            }
        };
        debug!(
            program = cmd.program,
            elapsed_us = started.elapsed().as_micros() as u64,
            exit_code = output.status.code(),
            "finished"
        );
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if output.status.success() {
            Ok(CommandOutput {
                stdout: output.stdout,
                stderr,
            })
        } else {
            Err(CommandError::Failed {
                program: cmd.program,
                args: cmd.args_display(),
                exit_code: output.status.code(),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn success_keeps_stdout_and_runs_in_c_locale() {
        let out = SystemCommands
            .run(CommandSpec::new("sh").args(["-c", "echo $LC_ALL"]))
            .await
            .unwrap();
        assert_eq!(out.stdout_str().trim(), "C");
    }

    #[tokio::test]
    async fn failure_keeps_exit_code_and_stderr() {
        let err = SystemCommands
            .run(CommandSpec::new("sh").args(["-c", "echo boom >&2; exit 3"]))
            .await
            .unwrap_err();
        assert_eq!(err.exit_code(), Some(3));
        assert_eq!(err.stderr().trim(), "boom");
        assert!(err.to_string().contains("exit code 3"), "{err}");
    }

    #[tokio::test]
    async fn a_hung_command_times_out() {
        let started = std::time::Instant::now();
        let err = SystemCommands
            .run(
                CommandSpec::new("sleep")
                    .arg("30")
                    .timeout(Duration::from_millis(100)),
            )
            .await
            .unwrap_err();
        assert!(err.is_timeout());
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn arguments_are_not_interpreted_by_a_shell() {
        let out = SystemCommands
            .run(CommandSpec::new("echo").arg("$(id); rm -rf /"))
            .await
            .unwrap();
        assert_eq!(out.stdout_str().trim(), "$(id); rm -rf /");
    }

    #[tokio::test]
    async fn secret_input_reaches_stdin_and_stays_out_of_argv_and_debug() {
        let cmd = CommandSpec::new("sh")
            .args(["-c", "cat; echo \" $FOR_TEST\""])
            .env("FOR_TEST", "set")
            .secret_input(Zeroizing::new(b"s3cret".to_vec()));
        assert!(!format!("{cmd:?}").contains("s3cret"));
        assert!(!cmd.args_display().contains("s3cret"));
        let out = SystemCommands.run(cmd).await.unwrap();
        assert_eq!(out.stdout_str(), "s3cret set\n");
    }

    #[tokio::test]
    async fn a_child_that_ignores_its_input_still_reports_its_own_status() {
        let err = SystemCommands
            .run(
                CommandSpec::new("sh")
                    .args(["-c", "exec 0<&-; echo refused >&2; exit 2"])
                    .secret_input(Zeroizing::new(vec![b'x'; 1 << 20])),
            )
            .await
            .unwrap_err();
        assert_eq!(err.exit_code(), Some(2));
        assert_eq!(err.stderr().trim(), "refused");
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error() {
        let err = SystemCommands
            .run(CommandSpec::new("/nonexistent/localvol-tool"))
            .await
            .unwrap_err();
        assert!(matches!(err, CommandError::Spawn { .. }), "{err:?}");
    }
}
