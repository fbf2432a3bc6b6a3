//! The `exec` handler: runs a program (an argv list, never a shell string) per command.
//!
//! Protocol: the payload JSON on stdin; `ICQ_COMMAND_ID`, `ICQ_COMMAND_TYPE`,
//! `ICQ_ATTEMPT` (1-based), `ICQ_SOURCE`, `ICQ_USER_ID`, `ICQ_ROLES` (JSON array),
//! `ICQ_TENANT_ID` and `ICQ_CORRELATION_ID` in the environment. Exit status 0 is success;
//! exit status 75 (`EX_TEMPFAIL`) snoozes the command (it runs again later without
//! consuming an attempt): after the delay on the last line of stdout when it reads
//! `snooze <seconds>` (a decimal number, 0 to [`MAX_SNOOZE`](super::MAX_SNOOZE)), else after
//! [`DEFAULT_SNOOZE`] (at least [`MIN_SNOOZE`](super::MIN_SNOOZE), even after
//! `snooze 0`); a `snooze` line with a negative, too long or unreadable delay fails
//! the attempt saying why. Anything else fails the attempt with the status and the tail
//! of stderr.
//!
//! When the execution is cancelled ([`Job::cancellation`]: an operator cancelled the
//! command, its lease was lost, or the shutdown grace ran out) the process group gets
//! SIGTERM; the processor drops the execution [`STOP_GRACE`](super::STOP_GRACE) later,
//! which kills the group with SIGKILL as below.
//!
//! The program runs as the leader of its own process group, and nothing of that group
//! outlives the attempt: the group is killed with SIGKILL past the timeout (then the
//! program is reaped before the failure is reported), when the execution is cancelled (its
//! future dropped, e.g. by the processor after the shutdown grace), and once the program
//! has exited (background processes it left behind). A cancelled execution kills the
//! group and reaps the program before its future's drop returns (waiting at most
//! [`REAP_WITHIN`]), so a processor that stops a command knows it is gone. The outcome is
//! the program's exit status: once it exits its pipes are read for at most
//! [`EXIT_DRAIN`] more, so a background process holding stdout or stderr open cannot turn
//! a success into a timeout.
//!
//! On Linux the program also dies with the worker, however the worker ends (SIGKILL
//! included): it is started with a parent-death signal (`PR_SET_PDEATHSIG`, SIGKILL) set
//! before `exec`, from one spawner thread that lives as long as the process (the signal
//! fires when the *thread* that forked the child exits, and tokio's pool threads can
//! retire). A program started just as the worker dies finds itself orphaned after setting
//! the signal and does not run. The signal reaches the program itself, not processes it
//! started; setuid programs clear it. On other Unix systems there is no such signal.
//!
//! What the program started in its group dies with the worker too when a [`watchdog`] is
//! enabled (`icq work` enables it): a process of its own that kills every group still
//! running once the worker is gone, however it ended. Only what leaves the group
//! (`setsid`) escapes. Without one (the library's default), a killed worker's grandchildren
//! run on, as do, on other Unix systems, its programs themselves.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::{DEFAULT_SNOOZE, Handler, HandlerError, HandlerResult, Job, checked_snooze_seconds};

pub mod watchdog;

/// Bytes of stderr kept for `LastError`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use icq::handler::exec::{ExecHandler, STDERR_TAIL_BYTES};
/// use icq::Handler;
///
/// let argv = ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x >&2; exit 3"];
/// let noisy = ExecHandler::new(argv.map(String::from).to_vec(), None)?;
/// # let job = |payload: serde_json::Value| icq::Job::new("reports.render", payload).with_source("shop");
/// // `job(payload)` builds the `Job` a processor would pass (attempt 1).
/// let err = noisy.handle(job(serde_json::json!({}))).await.unwrap_err();
/// assert!(err.message.len() < STDERR_TAIL_BYTES + 100, "{} bytes", err.message.len());
/// # Ok(())
/// # }
/// ```
pub const STDERR_TAIL_BYTES: usize = 2048;

/// Runs one program per command.
///
/// [`Registry::insert_exec`](crate::Registry::insert_exec) registers one behind the
/// tracing layer; a `handlers:` entry with `exec:` in `icq.yaml` becomes one.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use icq::handler::exec::ExecHandler;
/// use icq::Handler;
///
/// // The payload arrives on stdin, the context in ICQ_* variables.
/// let script = r#"grep -q '"order":42' && test "$ICQ_ATTEMPT" = 1"#;
/// let argv = vec!["sh".into(), "-c".into(), script.into()];
/// let handler = ExecHandler::new(argv, Some(Duration::from_secs(5)))?;
/// handler.check_program().map_err(icq::Error::invalid)?;
/// # let job = |payload: serde_json::Value| icq::Job::new("reports.render", payload).with_source("shop");
/// // `job(payload)` builds the `Job` a processor would pass (attempt 1).
/// handler.handle(job(serde_json::json!({ "order": 42 }))).await?;
/// let failed = handler.handle(job(serde_json::json!({ "order": 7 }))).await.unwrap_err();
/// assert!(!failed.terminal, "{failed}"); // exit status 1: the attempt is retried
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ExecHandler {
    argv: Vec<String>,
    timeout: Option<Duration>,
}

impl ExecHandler {
    /// A handler running `argv` (program first), killed after `timeout` if given. See
    /// [`ExecHandler`]'s example.
    ///
    /// An empty `argv` (or an empty program) is an [`Error::Invalid`](crate::Error::Invalid).
    pub fn new(argv: Vec<String>, timeout: Option<Duration>) -> crate::Result<ExecHandler> {
        if argv.first().is_none_or(|program| program.is_empty()) {
            return Err(crate::Error::invalid(
                "an exec handler needs a non-empty argv list, program first",
            ));
        }
        Ok(ExecHandler { argv, timeout })
    }

    /// Checks that the program exists and is executable (a bare name is searched on
    /// `PATH`), so a typo fails at startup instead of on every command. The reasons are
    /// those of `icq config check`: a directory is called a directory, a file without an
    /// execute bit is called not executable.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::handler::exec::ExecHandler;
    ///
    /// assert_eq!(ExecHandler::new(vec!["sh".into()], None)?.check_program(), Ok(()));
    /// let typo = ExecHandler::new(vec!["no-such-program-xyz".into()], None)?;
    /// let problem = typo.check_program().unwrap_err();
    /// assert!(problem.contains("no-such-program-xyz"), "{problem}");
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn check_program(&self) -> Result<(), String> {
        let path = std::env::var("PATH").ok();
        match super::program::program_problem(&self.argv[0], path.as_deref()) {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    }
}

/// How long the pipes are still read once the program has exited: long enough to collect
/// what it wrote just before exiting, short enough that a background process that
/// inherited them (and is killed with the group right after) cannot hold the outcome.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::{Duration, Instant};
/// use icq::handler::exec::{EXIT_DRAIN, ExecHandler};
/// use icq::Handler;
///
/// // The program exits at once but leaves a background process holding stdout open.
/// let argv = ["sh", "-c", "sleep 30 & exit 0"];
/// let handler = ExecHandler::new(argv.map(String::from).to_vec(), None)?;
/// # let job = |payload: serde_json::Value| icq::Job::new("reports.render", payload).with_source("shop");
/// // `job(payload)` builds the `Job` a processor would pass (attempt 1).
/// let started = Instant::now();
/// handler.handle(job(serde_json::json!({}))).await?;
/// assert!(started.elapsed() < EXIT_DRAIN + Duration::from_secs(5)); // not 30 s
/// # Ok(())
/// # }
/// ```
pub const EXIT_DRAIN: Duration = Duration::from_millis(150);

/// Bytes of stdout kept to read a snooze's `snooze <seconds>` line.
const STDOUT_TAIL_BYTES: usize = 1024;

/// The exit status that snoozes a command (`EX_TEMPFAIL` of sysexits.h).
pub const EX_TEMPFAIL: i32 = 75;

/// The snooze delay an exec program asked for: the last non-empty line of its stdout when
/// that line reads `snooze <seconds>`, else [`DEFAULT_SNOOZE`]. A `snooze` line whose
/// delay is negative, longer than [`MAX_SNOOZE`](super::MAX_SNOOZE) or not a number is an error saying why.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use icq::handler::exec::snooze_delay;
/// use icq::handler::DEFAULT_SNOOZE;
///
/// assert_eq!(snooze_delay("working...\nsnooze 30\n"), Ok(Duration::from_secs(30)));
/// assert_eq!(snooze_delay("snooze 0.5"), Ok(Duration::from_millis(500)));
/// assert_eq!(snooze_delay("busy, try later"), Ok(DEFAULT_SNOOZE));
/// assert_eq!(snooze_delay(""), Ok(DEFAULT_SNOOZE));
/// assert!(snooze_delay("snooze -5").unwrap_err().contains("negative"));
/// assert!(snooze_delay("snooze 1e12").unwrap_err().contains("longer than"));
/// assert!(snooze_delay("snooze soon").unwrap_err().contains("not a number"));
/// ```
pub fn snooze_delay(stdout: &str) -> Result<Duration, String> {
    let Some(line) = stdout.lines().map(str::trim).rfind(|line| !line.is_empty()) else {
        return Ok(DEFAULT_SNOOZE);
    };
    let mut words = line.split_whitespace();
    if words.next() != Some("snooze") {
        return Ok(DEFAULT_SNOOZE);
    }
    let (Some(seconds), None) = (words.next(), words.next()) else {
        if line == "snooze" {
            return Ok(DEFAULT_SNOOZE);
        }
        return Err(format!(
            "`{}`: write `snooze <seconds>`",
            crate::redact::bounded(line, 100)
        ));
    };
    checked_snooze_seconds(seconds)
}

/// The last `keep` bytes written to a stream.
struct Tail {
    bytes: Vec<u8>,
    keep: usize,
}

impl Tail {
    fn new(keep: usize) -> Tail {
        Tail {
            bytes: Vec::new(),
            keep,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > self.keep * 2 {
            self.bytes.drain(..self.bytes.len() - self.keep);
        }
    }

    /// The tail as text fit for `LastError`: lossy UTF-8, trimmed, line breaks kept and
    /// every other control character escaped.
    fn text(mut self) -> String {
        if self.bytes.len() > self.keep {
            self.bytes.drain(..self.bytes.len() - self.keep);
        }
        crate::redact::clean_stored_text(String::from_utf8_lossy(&self.bytes).trim())
    }
}

/// Reads one chunk from `stream`; `0` at the end (or on an error). Never completes for a
/// stream already closed (`None`).
async fn read_chunk(stream: &mut Option<impl AsyncRead + Unpin>, buf: &mut [u8]) -> usize {
    match stream {
        Some(stream) => stream.read(buf).await.unwrap_or(0),
        None => std::future::pending().await,
    }
}

/// Completes at `at`, or never for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How long dropping a running execution waits for its killed program to be reaped. A
/// process killed with SIGKILL exits at once unless it is stuck in the kernel (an
/// unreachable NFS mount); past this bound tokio reaps it later in the background.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert!(icq::handler::exec::REAP_WITHIN <= Duration::from_secs(1));
/// ```
pub const REAP_WITHIN: Duration = Duration::from_secs(1);

/// The running program and its process group. Dropped before the program was reaped (an
/// execution cancelled by the processor at a hard stop or after the grace, or given up by
/// a timeout layer), it kills every member of the group with SIGKILL, grandchildren
/// included, and reaps the program before the drop returns. Processes that leave the
/// group themselves (`setsid`, `setpgid`) escape it.
struct Running {
    child: Child,
    group: Option<Pid>,
    /// The program was reaped and its group killed: nothing is left to do on drop.
    done: bool,
}

impl Running {
    /// `child`, which was started as the leader of a group of its own (listed with the
    /// watchdog, when there is one).
    fn new(child: Child) -> Running {
        let group = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .filter(|&pid| pid > 1)
            .map(Pid::from_raw);
        if let Some(group) = group {
            watchdog::started(group);
        }
        Running {
            child,
            group,
            done: false,
        }
    }

    /// Sends SIGKILL to every member of the group (a group already gone is no error); the
    /// watchdog then has nothing of it left to kill.
    fn kill_group(&self) {
        if let Some(group) = self.group {
            let _ = killpg(group, Signal::SIGKILL);
            watchdog::ended(group);
        }
    }

    /// Reaps the (killed) program, waiting at most [`REAP_WITHIN`] without an executor:
    /// this runs in `drop`.
    fn reap_blocking(&mut self) {
        let give_up = std::time::Instant::now() + REAP_WITHIN;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if std::time::Instant::now() < give_up => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(None) => {
                    tracing::warn!(
                        pid = ?self.group,
                        "a killed exec handler was not reaped within {REAP_WITHIN:?}; it is left to the runtime"
                    );
                    return;
                }
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            // The group is killed while its leader is unreaped, so the group id cannot
            // have been reused.
            self.kill_group();
            self.reap_blocking();
        }
    }
}

/// Starts `command`, guarded from the instant it exists: the program comes back as a
/// [`Running`], so an execution dropped while the start is on its way (cancelled between
/// the spawn and its reply) kills the group instead of leaving it to run. On Linux, from
/// the spawner thread with the parent-death signal set (see the module documentation);
/// elsewhere, here.
async fn spawn(command: Command) -> std::io::Result<Running> {
    #[cfg(target_os = "linux")]
    {
        pdeath::spawn(command).await
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut command = command;
        command.spawn().map(Running::new)
    }
}

/// Linux: programs that die with their worker.
#[cfg(target_os = "linux")]
mod pdeath {
    use std::io;
    use std::sync::{Mutex, OnceLock, mpsc};

    use tokio::process::Command;
    use tokio::runtime::Handle;
    use tokio::sync::oneshot;

    use super::Running;

    /// A command to start, the runtime its pipes and exit status belong to, and where to
    /// send the started program.
    type Request = (Command, Handle, oneshot::Sender<io::Result<Running>>);

    /// The spawner thread's queue. The thread waits on it for the life of the process
    /// (the sender is never dropped), so the thread never exits while the process runs
    /// and the parent-death signal fires only when the process ends.
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();

    fn spawner() -> io::Result<&'static Mutex<mpsc::Sender<Request>>> {
        if let Some(sender) = SPAWNER.get() {
            return Ok(sender);
        }
        let (sender, requests) = mpsc::channel::<Request>();
        // Two racing callers may both get here: the loser's thread sees its queue close
        // at once and exits before it started anything.
        let started = std::thread::Builder::new()
            .name("icq-exec-spawner".into())
            .spawn(move || {
                for (mut command, runtime, reply) in requests {
                    let _entered = runtime.enter();
                    // Guarded at once: a reply nobody receives any more is dropped, and
                    // with it the program's whole group.
                    let _ = reply.send(command.spawn().map(Running::new));
                }
            });
        started.map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start the spawner thread: {e}"))
        })?;
        Ok(SPAWNER.get_or_init(|| Mutex::new(sender)))
    }

    /// Starts `command` with `PR_SET_PDEATHSIG` = SIGKILL, from the spawner thread.
    pub(super) async fn spawn(mut command: Command) -> io::Result<Running> {
        die_with_parent(&mut command);
        let runtime = Handle::try_current().map_err(io::Error::other)?;
        let (reply, started) = oneshot::channel();
        spawner()?
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send((command, runtime, reply))
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        started
            .await
            .map_err(|_| io::Error::other("the spawner thread dropped the request"))?
    }

    /// Sets the parent-death signal in the child, between `fork` and `exec`.
    #[allow(unsafe_code)]
    fn die_with_parent(command: &mut Command) {
        let parent = nix::unistd::getpid();
        // SAFETY: the closure runs in the forked child of a multi-threaded process, where
        // only async-signal-safe operations are allowed. It makes two system calls
        // (prctl(2), getppid(2)) through nix's thin wrappers and builds its errors from raw
        // errno values: it allocates nothing, takes no lock and touches no shared state.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                // The worker died between fork and prctl: the signal will never come, so
                // do not run at all (the spawn fails; nobody is left to see it).
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::from(nix::errno::Errno::ESRCH));
                }
                Ok(())
            });
        }
    }
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

/// `what`, or `what: stderr` when the program wrote to stderr.
fn with_stderr(what: String, stderr: &str) -> String {
    if stderr.is_empty() {
        what
    } else {
        format!("{what}: {stderr}")
    }
}

#[async_trait]
impl Handler for ExecHandler {
    async fn handle(&self, job: Job) -> HandlerResult {
        let Job {
            id,
            type_name,
            payload,
            attempt,
            source,
            context: ctx,
            cancellation,
        } = job;
        // Serialized once, and the value dropped before the program starts: what waits
        // for the program to read its stdin is the compact text alone, and it is dropped
        // as soon as the program has read it, closed its stdin or exited.
        let payload = {
            let value = payload;
            value.to_string()
        };
        let mut command = Command::new(&self.argv[0]);
        command
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The leader of a new process group, so the whole group can be killed.
            .process_group(0)
            .kill_on_drop(true)
            .env("ICQ_COMMAND_ID", id.to_string())
            .env("ICQ_COMMAND_TYPE", &type_name)
            .env("ICQ_ATTEMPT", attempt.to_string())
            .env("ICQ_SOURCE", source.as_ref())
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
        // The execution span's context (W3C Trace Context in the environment, as
        // OpenTelemetry SDKs read it), so the handler's own spans join the trace; never a
        // `TRACEPARENT` the worker itself inherited, which belongs to another trace.
        match crate::otel::current_traceparent() {
            Some(traceparent) => command.env("TRACEPARENT", traceparent),
            None => command.env_remove("TRACEPARENT"),
        };
        let started = Instant::now();
        let mut running = spawn(command)
            .await
            .map_err(|e| HandlerError::retry(format!("cannot start {}: {e}", self.argv[0])))?;
        let group = running.group;
        let child = &mut running.child;
        let stdin = child.stdin.take();
        let feed = async move {
            if let Some(mut stdin) = stdin {
                // A program that does not read its stdin closes the pipe: not an error.
                let _ = stdin.write_all(payload.as_bytes()).await;
                let _ = stdin.shutdown().await;
            }
        };
        tokio::pin!(feed);
        let mut fed = false;
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let (mut out_buf, mut err_buf) = ([0u8; 8192], [0u8; 8192]);
        let mut tail = Tail::new(STDERR_TAIL_BYTES);
        let mut out_tail = Tail::new(STDOUT_TAIL_BYTES);
        let mut terminated = false;
        let deadline = self.timeout.map(|limit| started + limit);
        let mut status = None;
        let mut drained_by = None;
        let mut timed_out = false;
        // Until the program exits and its pipes are read to their end; once it has
        // exited, at most EXIT_DRAIN more: the exit status is the outcome, whatever a
        // background process holding the pipes does.
        while status.is_none() || stdout.is_some() || stderr.is_some() {
            tokio::select! {
                result = child.wait(), if status.is_none() => {
                    status = Some(result);
                    drained_by = Some(Instant::now() + EXIT_DRAIN);
                }
                n = read_chunk(&mut stderr, &mut err_buf), if stderr.is_some() => {
                    if n == 0 {
                        stderr = None;
                    } else {
                        tail.push(&err_buf[..n]);
                    }
                }
                n = read_chunk(&mut stdout, &mut out_buf), if stdout.is_some() => {
                    if n == 0 {
                        stdout = None;
                    } else {
                        out_tail.push(&out_buf[..n]);
                    }
                }
                () = cancellation.cancelled(), if !terminated && status.is_none() => {
                    // Asked to stop: SIGTERM now; the processor drops this execution (and
                    // so kills the group) if the program is still there after the grace.
                    terminated = true;
                    if let Some(group) = group {
                        // The leader is unreaped (no status yet): the group id is ours.
                        let _ = killpg(group, Signal::SIGTERM);
                    }
                }
                () = &mut feed, if !fed => fed = true,
                () = sleep_until(drained_by), if drained_by.is_some() => break,
                () = sleep_until(deadline), if status.is_none() && deadline.is_some() => {
                    timed_out = true;
                    break;
                }
            }
        }
        // Nothing of the attempt outlives it: background processes the program left in
        // its group are killed too.
        running.kill_group();
        drop((stdout, stderr));
        if timed_out {
            // The leader is dead or about to be: reap it before reporting.
            let _ = running.child.wait().await;
        }
        running.done = true;
        if timed_out {
            let limit = self.timeout.unwrap_or_default().as_secs_f64();
            return Err(HandlerError::retry(with_stderr(
                format!("timed out after {limit:.1}s; process group killed"),
                &tail.text(),
            )));
        }
        let status = match status {
            Some(Ok(status)) => status,
            Some(Err(e)) => {
                return Err(HandlerError::retry(format!(
                    "waiting for {}: {e}",
                    self.argv[0]
                )));
            }
            None => {
                return Err(HandlerError::retry(format!(
                    "waiting for {}: no exit status",
                    self.argv[0]
                )));
            }
        };
        if status.success() {
            return Ok(());
        }
        if terminated {
            return Err(HandlerError::retry(with_stderr(
                format!(
                    "stopped: the execution was cancelled and its process group got SIGTERM; {}",
                    describe_status(status)
                ),
                &tail.text(),
            )));
        }
        if status.code() == Some(EX_TEMPFAIL) {
            return Err(match snooze_delay(&out_tail.text()) {
                Ok(delay) => {
                    let mut snooze = HandlerError::snooze(delay);
                    snooze.message = format!("exit status 75: {}", snooze.message);
                    snooze
                }
                Err(why) => HandlerError::retry(with_stderr(
                    format!("exit status 75 (snooze) with an unusable delay: {why}"),
                    &tail.text(),
                )),
            });
        }
        Err(HandlerError::retry(with_stderr(
            describe_status(status),
            &tail.text(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{CommandId, Context};
    use std::path::Path;
    use std::sync::Arc;

    fn job() -> Job {
        Job {
            id: CommandId::new(),
            type_name: "t".into(),
            payload: serde_json::json!({"k": "v"}),
            attempt: 1,
            source: Arc::from("s"),
            context: Context::default(),
            cancellation: Default::default(),
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
    async fn exit_75_snoozes_after_the_last_stdout_line() {
        let run = |script: &str| {
            let handler =
                ExecHandler::new(vec!["sh".into(), "-c".into(), script.into()], None).unwrap();
            async move { handler.handle(job()).await.unwrap_err() }
        };
        let err = run("echo working; echo 'snooze 1'; exit 75").await;
        assert_eq!(err.snooze, Some(Duration::from_secs(1)), "{err:?}");
        let err = run("exit 75").await;
        assert_eq!(err.snooze, Some(DEFAULT_SNOOZE), "{err:?}");
        let err = run("echo 'snooze -1'; exit 75").await;
        assert_eq!(err.snooze, None);
        assert!(
            err.message.starts_with(
                "exit status 75 (snooze) with an unusable delay: snooze delay `-1` is negative"
            ),
            "{}",
            err.message
        );
        // `snooze` on stdout without exit status 75 is an ordinary failure.
        let err = run("echo 'snooze 1'; exit 1").await;
        assert_eq!((err.snooze, err.message.as_str()), (None, "exit status 1"));
    }

    #[tokio::test]
    async fn cancellation_sends_sigterm_to_the_group() {
        let handler = ExecHandler::new(vec!["sleep".into(), "60".into()], None).unwrap();
        let job = job();
        let cancel = job.cancellation.clone();
        let started = std::time::Instant::now();
        let stopper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            cancel.cancel();
        });
        let err = handler.handle(job).await.unwrap_err();
        stopper.await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            err.message
                .starts_with("stopped: the execution was cancelled")
                && err.message.contains("signal 15"),
            "{}",
            err.message
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

    #[test]
    fn defect_10_a_directory_is_not_a_program() {
        let handler = ExecHandler::new(vec!["/tmp".into()], None).unwrap();
        assert_eq!(
            handler.check_program().unwrap_err(),
            "/tmp is a directory, not a program"
        );
    }

    fn sh(script: &str, timeout: Option<Duration>) -> ExecHandler {
        ExecHandler::new(vec!["sh".into(), "-c".into(), script.into()], timeout).unwrap()
    }

    /// True while `pid` names a live process (a zombie, killed but not yet reaped by its
    /// new parent, counts as dead: it runs nothing).
    fn alive(pid: i32) -> bool {
        if nix::sys::signal::kill(Pid::from_raw(pid), None).is_err() {
            return false;
        }
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| !matches!(state, 'Z' | 'X')),
            Err(_) => false,
        }
    }

    /// Waits up to `limit` for `pid` to be dead.
    async fn dies_within(pid: i32, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if !alive(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !alive(pid)
    }

    /// The pid a script wrote to `file`, once it is there.
    async fn pid_in(file: &Path) -> i32 {
        for _ in 0..500 {
            if let Ok(text) = std::fs::read_to_string(file)
                && let Ok(pid) = text.trim().parse()
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} never got a pid", file.display());
    }

    /// A shell wrapper whose background grandchild writes its pid to `file`, then waits.
    fn wrapper(file: &Path) -> String {
        format!("sleep 30 & echo $! > '{}'; wait", file.display())
    }

    /// An execution of [`wrapper`] on a task of its own.
    fn run_wrapper(file: &Path) -> tokio::task::JoinHandle<HandlerResult> {
        let handler = sh(&wrapper(file), None);
        tokio::spawn(async move { handler.handle(job()).await })
    }

    #[tokio::test]
    async fn exec_cancelled_execution_kills_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild");
        let task = run_wrapper(&pidfile);
        let grandchild = pid_in(&pidfile).await;
        assert!(alive(grandchild));
        // What the processor does to an execution still running after the grace period.
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        // SIGKILL is immediate; the bound only allows for a loaded machine's scheduling.
        assert!(
            dies_within(grandchild, Duration::from_secs(5)).await,
            "grandchild {grandchild} survived its cancelled execution"
        );
    }

    /// Cancelled while its start is on the way back from the spawner thread (the program
    /// runs, the execution has not received it yet): the program's group dies too. This
    /// test's runtime has one thread, blocked below, so the execution cannot take the
    /// reply before it is dropped. Before the start came back guarded, the program and its
    /// children ran on (the flaky `exec_cancelled_execution_kills_the_process_group`).
    #[tokio::test]
    async fn exec_cancelled_before_its_start_arrives_kills_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild");
        let task = run_wrapper(&pidfile);
        // Let the execution send its start to the spawner thread, then hold the runtime.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let grandchild = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok())
            {
                break pid;
            }
            assert!(
                std::time::Instant::now() < until,
                "the program never started"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert!(
            dies_within(grandchild, Duration::from_secs(5)).await,
            "grandchild {grandchild} survived an execution cancelled before its start arrived"
        );
    }

    #[tokio::test]
    async fn exec_a_cancelled_program_is_reaped_before_the_drop_returns() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("leader");
        // `exec`: the pid written is the program's own, the group leader icq started.
        let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
        let handler = Arc::new(sh(&script, None));
        let task = tokio::spawn({
            let handler = handler.clone();
            async move { handler.handle(job()).await }
        });
        let leader = pid_in(&pidfile).await;
        assert!(alive(leader));
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        // Not merely killed: reaped, so not even a zombie is left. The drop waits for that
        // (at most REAP_WITHIN); the extra bound only allows for a loaded machine, where
        // one run in a full parallel suite saw the entry linger past the drop.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while Path::new(&format!("/proc/{leader}")).exists() && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !Path::new(&format!("/proc/{leader}")).exists(),
            "program {leader} was not reaped when its execution was dropped"
        );
    }

    /// The parent-death signal fires when the *thread* that forked the program exits, and
    /// the threads that poll executions come and go (tokio's pool threads retire): the
    /// program is forked by a thread that lives as long as the process, so it runs on
    /// after the thread that polled its start has exited, and dies with its execution.
    #[cfg(target_os = "linux")]
    #[test]
    fn exec_a_program_outlives_the_thread_that_polled_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("leader");
        let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
        let handler = Arc::new(sh(&script, None));
        let (runtime, execution, leader) = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut execution = Box::pin(async move { handler.handle(job()).await });
            let leader = runtime.block_on(async {
                tokio::select! {
                    result = &mut execution => panic!("finished early: {result:?}"),
                    leader = pid_in(&pidfile) => leader,
                }
            });
            (runtime, execution, leader)
        })
        .join()
        .unwrap();
        // Were the signal tied to that thread, the program would be dead at once.
        let watch_until = std::time::Instant::now() + Duration::from_millis(300);
        while std::time::Instant::now() < watch_until {
            assert!(
                alive(leader),
                "program {leader} died with the thread that polled it"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        runtime.block_on(async move { drop(execution) });
        // Killed and reaped at once; the runtime is driven meanwhile, and the bound only
        // allows for a loaded machine's scheduling.
        let gone = runtime.block_on(async {
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while Path::new(&format!("/proc/{leader}")).exists() {
                if std::time::Instant::now() > until {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            true
        });
        assert!(gone, "program {leader} outlived its dropped execution");
    }

    /// The pid a script wrote to `file`, if it wrote one whole.
    fn pid_written(file: &Path) -> Option<i32> {
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// Runs `attempt` (an execution of a [`wrapper`] writing to the given file, under the
    /// given timeout) until the shell wrote its grandchild's pid before the timeout fired:
    /// a loaded machine can take longer than a short timeout to start `sh`, and such an
    /// attempt proves nothing. Each try doubles the timeout, from 1 s up to 16 s. The
    /// group is killed before the result comes back, so no pid is written after it: the
    /// file is read once, not waited for. Returns the result, the grandchild's pid, the
    /// timeout and how long the execution took.
    async fn timed_out_after_writing_its_pid<F, Fut>(
        mut attempt: F,
    ) -> (HandlerResult, i32, Duration, Duration)
    where
        F: FnMut(std::path::PathBuf, Duration) -> Fut,
        Fut: std::future::Future<Output = HandlerResult>,
    {
        let mut timeout = Duration::from_secs(1);
        loop {
            let dir = tempfile::tempdir().unwrap();
            let pidfile = dir.path().join("grandchild");
            let started = Instant::now();
            let result = attempt(pidfile.clone(), timeout).await;
            let took = started.elapsed();
            if let Some(grandchild) = pid_written(&pidfile) {
                return (result, grandchild, timeout, took);
            }
            assert!(
                timeout < Duration::from_secs(16),
                "sh never wrote its grandchild's pid within a {timeout:?} timeout: {result:?}"
            );
            timeout *= 2;
        }
    }

    #[tokio::test]
    async fn exec_dropped_by_a_timeout_layer_kills_the_process_group() {
        use crate::handler::{Layer, TimeoutLayer};
        let (result, grandchild, timeout, _) =
            timed_out_after_writing_its_pid(|pidfile, timeout| async move {
                let inner: Arc<dyn Handler> = Arc::new(sh(&wrapper(&pidfile), None));
                TimeoutLayer { timeout }.layer(inner).handle(job()).await
            })
            .await;
        let message = result.unwrap_err().message;
        assert!(
            message.starts_with(&format!("timed out after {:.1}s", timeout.as_secs_f64())),
            "{message}"
        );
        // SIGKILL is immediate; the bound only allows for a loaded machine's scheduling.
        assert!(
            dies_within(grandchild, Duration::from_secs(5)).await,
            "grandchild {grandchild} survived"
        );
    }

    #[tokio::test]
    async fn exec_timeout_kills_the_whole_group_and_reaps_it() {
        let (result, grandchild, timeout, took) =
            timed_out_after_writing_its_pid(|pidfile, timeout| async move {
                let script = format!("echo started >&2; {}", wrapper(&pidfile));
                sh(&script, Some(timeout)).handle(job()).await
            })
            .await;
        let err = result.unwrap_err();
        assert_eq!(
            err.message,
            format!(
                "timed out after {:.1}s; process group killed: started",
                timeout.as_secs_f64()
            )
        );
        assert!(!err.terminal);
        // Well before the 30 s the wrapper would wait for its grandchild; the margin
        // allows for a loaded machine's scheduling.
        assert!(took < timeout + Duration::from_secs(10), "{took:?}");
        // Already dead when the failure is reported, not merely signalled (a zombie
        // counts as dead; the bound allows for the kernel's scheduling under load).
        assert!(
            dies_within(grandchild, Duration::from_secs(5)).await,
            "the wrapper's child {grandchild} outlived the timeout"
        );
    }

    #[tokio::test]
    async fn exec_exit_status_is_the_outcome_when_a_background_child_holds_the_pipes() {
        // The background subshell inherits stdout and stderr and keeps them open for 5 s.
        let handler = sh("(sleep 5) & exit 0", Some(Duration::from_secs(2)));
        let started = Instant::now();
        assert_eq!(handler.handle(job()).await, Ok(()));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited {:?} for pipes a background process held",
            started.elapsed()
        );

        // A failure is a failure, with what was written before the exit.
        let handler = sh(
            "echo 'disk full' >&2; (sleep 5) & exit 3",
            Some(Duration::from_secs(2)),
        );
        let started = Instant::now();
        assert_eq!(
            handler.handle(job()).await.unwrap_err().message,
            "exit status 3: disk full"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn exec_background_processes_left_behind_are_killed_after_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("background");
        let script = format!("sleep 30 & echo $! > '{}'; exit 0", pidfile.display());
        let handler = sh(&script, None);
        assert_eq!(handler.handle(job()).await, Ok(()));
        let background = pid_in(&pidfile).await;
        assert!(
            dies_within(background, Duration::from_secs(1)).await,
            "background process {background} outlived the attempt"
        );
    }

    #[tokio::test]
    async fn exec_output_written_just_before_exit_is_kept() {
        let handler = sh(
            "head -c 100000 /dev/zero; printf 'last words' >&2; exit 1",
            None,
        );
        assert_eq!(
            handler.handle(job()).await.unwrap_err().message,
            "exit status 1: last words"
        );
    }

    #[tokio::test]
    async fn exec_stderr_keeps_lines_but_not_terminal_controls() {
        let handler = sh("printf 'one\\ntwo\\r\\n\\033[2Jthree' >&2; exit 2", None);
        assert_eq!(
            handler.handle(job()).await.unwrap_err().message,
            "exit status 2: one\ntwo\n\\u{1b}[2Jthree"
        );
    }
}
