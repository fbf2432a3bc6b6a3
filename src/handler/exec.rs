//! The `exec` handler: runs a program (an argv list, never a shell string) per command.
//!
//! Protocol: the payload JSON on stdin; `ICQ_COMMAND_ID`, `ICQ_COMMAND_TYPE`,
//! `ICQ_ATTEMPT` (1-based), `ICQ_SOURCE`, `ICQ_USER_ID`, `ICQ_ROLES` (JSON array),
//! `ICQ_TENANT_ID` and `ICQ_CORRELATION_ID` in the environment. Exit status 0 is success;
//! anything else fails the attempt with the status and the tail of stderr. The program
//! runs in its own process group, and past the timeout the whole group is killed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{Handler, HandlerError, HandlerResult, Job};

/// Bytes of stderr kept for `LastError`.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// Runs one program per command.
#[derive(Debug, Clone)]
pub struct ExecHandler {
    argv: Vec<String>,
    timeout: Option<Duration>,
}

impl ExecHandler {
    /// A handler running `argv` (program first), killed after `timeout` if given.
    pub fn new(argv: Vec<String>, timeout: Option<Duration>) -> crate::Result<ExecHandler> {
        if argv.first().is_none_or(|program| program.is_empty()) {
            return Err(crate::Error::Usage(
                "an exec handler needs a non-empty argv list, program first".into(),
            ));
        }
        Ok(ExecHandler { argv, timeout })
    }

    /// Checks that the program exists and is executable (a bare name is searched on
    /// `PATH`), so a typo fails at startup instead of on every command.
    pub fn check_program(&self) -> Result<(), String> {
        let program = &self.argv[0];
        let candidates: Vec<std::path::PathBuf> = if program.contains('/') {
            vec![Path::new(program).to_path_buf()]
        } else {
            std::env::var_os("PATH")
                .map(|paths| {
                    std::env::split_paths(&paths)
                        .map(|dir| dir.join(program))
                        .collect()
                })
                .unwrap_or_default()
        };
        for candidate in &candidates {
            if let Ok(meta) = std::fs::metadata(candidate) {
                use std::os::unix::fs::PermissionsExt;
                if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                    return Ok(());
                }
                if meta.is_file() {
                    return Err(format!(
                        "{} is not executable (chmod +x it)",
                        candidate.display()
                    ));
                }
            }
        }
        Err(if program.contains('/') {
            format!("program {program} not found")
        } else {
            format!("program `{program}` not found on PATH")
        })
    }
}

/// Reads a stream to its end, keeping only the last `keep` bytes.
async fn read_tail(mut stream: impl AsyncRead + Unpin, keep: usize) -> Vec<u8> {
    let mut tail = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > keep * 2 {
                    tail.drain(..tail.len() - keep);
                }
            }
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
    tail
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

#[async_trait]
impl Handler for ExecHandler {
    async fn handle(&self, job: Job) -> HandlerResult {
        let ctx = &job.context;
        let mut command = Command::new(&self.argv[0]);
        command
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .env("ICQ_COMMAND_ID", job.id.to_string())
            .env("ICQ_COMMAND_TYPE", &job.type_name)
            .env("ICQ_ATTEMPT", job.attempt.to_string())
            .env("ICQ_SOURCE", job.source.as_ref())
            .env("ICQ_USER_ID", ctx.user_id.as_deref().unwrap_or(""))
            .env(
                "ICQ_ROLES",
                serde_json::to_string(&ctx.roles).unwrap_or_else(|_| "[]".into()),
            )
            .env("ICQ_TENANT_ID", ctx.tenant_id.as_deref().unwrap_or(""))
            .env(
                "ICQ_CORRELATION_ID",
                ctx.correlation_id.as_deref().unwrap_or(""),
            );
        let mut child = command
            .spawn()
            .map_err(|e| HandlerError::retry(format!("cannot start {}: {e}", self.argv[0])))?;
        let pid = child.id();
        let payload = job.payload.to_string();
        let stdin = child.stdin.take();
        let feed = async move {
            if let Some(mut stdin) = stdin {
                // A program that does not read its stdin closes the pipe: not an error.
                let _ = stdin.write_all(payload.as_bytes()).await;
                let _ = stdin.shutdown().await;
            }
        };
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let drain_stdout = async move {
            if let Some(out) = stdout {
                read_tail(out, STDERR_TAIL_BYTES).await;
            }
        };
        let stderr_tail = async move {
            match stderr {
                Some(err) => read_tail(err, STDERR_TAIL_BYTES).await,
                None => Vec::new(),
            }
        };
        let run = async {
            let (_, _, tail, status) = tokio::join!(feed, drain_stdout, stderr_tail, child.wait());
            (tail, status)
        };
        let outcome = match self.timeout {
            Some(limit) => tokio::time::timeout(limit, run).await.ok(),
            None => Some(run.await),
        };
        let Some((tail, status)) = outcome else {
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.wait().await;
            let limit = self.timeout.unwrap_or_default().as_secs_f64();
            return Err(HandlerError::retry(format!(
                "timed out after {limit:.1}s; process group killed"
            )));
        };
        let status = status
            .map_err(|e| HandlerError::retry(format!("waiting for {}: {e}", self.argv[0])))?;
        if status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&tail);
        let stderr = stderr.trim();
        Err(HandlerError::retry(if stderr.is_empty() {
            describe_status(status)
        } else {
            format!("{}: {stderr}", describe_status(status))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{CommandId, Context};
    use std::sync::Arc;

    fn job() -> Job {
        Job {
            id: CommandId::new(),
            type_name: "t".into(),
            payload: serde_json::json!({"k": "v"}),
            attempt: 1,
            source: Arc::from("s"),
            context: Context::default(),
        }
    }

    #[tokio::test]
    async fn non_utf8_stderr_is_kept_lossily_and_tailed() {
        let script =
            "head -c 5000 /dev/zero | tr '\\0' 'x' >&2; printf '\\377\\376 end' >&2; exit 4";
        let handler =
            ExecHandler::new(vec!["sh".into(), "-c".into(), script.into()], None).unwrap();
        let err = handler.handle(job()).await.unwrap_err();
        assert!(
            err.message.starts_with("exit status 4: xxx"),
            "{}",
            err.message
        );
        assert!(
            err.message.ends_with("\u{fffd}\u{fffd} end"),
            "{}",
            err.message
        );
        assert!(
            err.message.len() < STDERR_TAIL_BYTES + 100,
            "bounded: {}",
            err.message.len()
        );
    }

    #[tokio::test]
    async fn a_program_that_ignores_stdin_still_succeeds() {
        let handler = ExecHandler::new(vec!["true".into()], None).unwrap();
        assert_eq!(handler.handle(job()).await, Ok(()));
    }

    #[test]
    fn missing_programs_are_reported_before_running() {
        let handler = ExecHandler::new(vec!["no-such-program-icq".into()], None).unwrap();
        assert_eq!(
            handler.check_program().unwrap_err(),
            "program `no-such-program-icq` not found on PATH"
        );
        assert!(ExecHandler::new(vec![], None).is_err());
    }
}
