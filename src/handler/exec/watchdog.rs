//! The exec handlers' watchdog: a process that outlives its worker just long enough to
//! kill what the worker's exec handlers left running, however the worker ended.
//!
//! Every exec handler runs as the leader of a process group of its own (see
//! [`super`]). The worker kills that group when the attempt ends, but a worker that is
//! killed itself (SIGKILL, the OOM killer, a crash) kills nothing: the parent-death signal
//! (Linux) reaches the program icq started, not the processes *it* started (`sh -c 'a &
//! b'`, `bash -c 'x; y'`), which are left running with nobody to stop them.
//!
//! So, once [`enable`]d, the first exec spawn starts a watchdog process (for `icq work`:
//! `icq exec-watchdog`, the same binary) with the read end of a pipe as its stdin; the
//! worker alone holds the write end (close-on-exec, so no handler inherits it). The worker
//! writes one line per handler as it starts (`+<group>`) and once its group has been
//! killed (`-<group>`). When the pipe reaches end of file — the worker is gone, however
//! it ended, since the kernel closes a dead process's descriptors — the watchdog sends
//! SIGKILL to every group still listed, and exits ([`run`]).
//!
//! Guarantees and limits:
//!
//! - A group is listed from just after its leader started (a program killed within the
//!   microseconds between its `exec` and that line is covered by the parent-death signal,
//!   what it started in that instant is not) until after it was sent SIGKILL, so the
//!   watchdog never signals a group id the kernel could have handed to another process.
//! - What leaves its process group (`setsid`, `setpgid`, a daemonizing program) escapes,
//!   as it escapes the worker's own kill.
//! - The watchdog runs in a process group of its own, so a terminal's Ctrl-C (sent to the
//!   worker's group) does not take it away before the worker it watches. If it dies
//!   anyway, the worker's next write notices (a broken pipe), logs it and starts a new one,
//!   to which it lists every group still running.
//! - It costs two short pipe writes per exec spawn (and the watchdog's two reads);
//!   nothing at all for a program that never starts an exec handler, or that never calls
//!   [`enable`] (the library's default: it cannot know which program to start). Without a
//!   watchdog, a killed worker's exec handlers die by the parent-death signal on Linux;
//!   on other Unix systems they run on until they end by themselves.
//!
//! An embedding service can use the installed `icq` binary
//! (`enable("icq", ["exec-watchdog"])`), or answer a subcommand of its own by calling
//! [`run`] on its stdin and pass that to [`enable`].

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The program (and arguments) that runs [`run`] on its stdin, once [`enable`]d.
static PROGRAM: OnceLock<(OsString, Vec<OsString>)> = OnceLock::new();

/// The worker's side: the watchdog running now and the groups it was told of.
static STATE: Mutex<State> = Mutex::new(State {
    watchdog: None,
    live: None,
    gave_up: false,
});

struct State {
    /// The pipe's write end and the watchdog process.
    watchdog: Option<(std::io::PipeWriter, Child)>,
    /// Groups started and not yet killed (listed again to a new watchdog).
    live: Option<HashSet<i32>>,
    /// The watchdog could not be started: not tried again.
    gave_up: bool,
}

/// Has the first exec spawn from now on start `program args…` as the watchdog (it must
/// run [`run`] on its stdin). The first call wins; later ones change nothing.
///
/// # Examples
///
/// ```no_run
/// // An embedding service with the `icq` binary installed:
/// icq::handler::exec::watchdog::enable("icq", ["exec-watchdog"]);
/// ```
pub fn enable<I, A>(program: impl Into<OsString>, args: I)
where
    I: IntoIterator<Item = A>,
    A: Into<OsString>,
{
    let _ = PROGRAM.set((program.into(), args.into_iter().map(Into::into).collect()));
}

/// The watchdog's loop: reads `+<group>` and `-<group>` lines from `input` (the worker's
/// pipe) until end of file or an unreadable line, then sends SIGKILL to every process
/// group still listed. Returns how many groups it signalled.
///
/// # Examples
///
/// ```
/// // Group 1 ended; no group is left to kill.
/// let killed = icq::handler::exec::watchdog::run(&b"+1\n-1\n"[..]);
/// assert_eq!(killed, 0);
/// ```
pub fn run(input: impl BufRead) -> usize {
    let mut live = HashSet::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (op, group) = line.split_at(line.len().min(1));
        let Ok(group) = group.trim().parse::<i32>() else {
            continue;
        };
        match op {
            "+" if group > 1 => {
                live.insert(group);
            }
            "-" => {
                live.remove(&group);
            }
            _ => {}
        }
    }
    let mut killed = 0;
    for group in live {
        if killpg(Pid::from_raw(group), Signal::SIGKILL).is_ok() {
            killed += 1;
        }
    }
    killed
}

/// A handler's group started: listed with the watchdog (started now if need be).
pub(super) fn started(group: Pid) {
    let Some(program) = PROGRAM.get() else {
        return;
    };
    let mut state = STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    state
        .live
        .get_or_insert_with(HashSet::new)
        .insert(group.as_raw());
    let line = format!("+{group}\n");
    // A watchdog that died is replaced once; the new one is told every live group.
    for _ in 0..2 {
        if state.watchdog.is_none() && !state.start(program) {
            return;
        }
        if state.send(&line) {
            return;
        }
    }
}

/// A handler's group was sent SIGKILL: no longer the watchdog's to kill.
pub(super) fn ended(group: Pid) {
    if PROGRAM.get().is_none() {
        return;
    }
    let mut state = STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(live) = state.live.as_mut() {
        live.remove(&group.as_raw());
    }
    if state.watchdog.is_some() {
        state.send(&format!("-{group}\n"));
    }
}

impl State {
    /// Starts the watchdog and lists every live group to it; false (logged once) when it
    /// cannot be started.
    fn start(&mut self, (program, args): &(OsString, Vec<OsString>)) -> bool {
        if self.gave_up {
            return false;
        }
        let spawned = std::io::pipe().and_then(|(reader, writer)| {
            let mut command = Command::new(program);
            command
                .args(args)
                .stdin(reader)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            // Out of the worker's process group: a terminal's Ctrl-C is for the worker.
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
            command.spawn().map(|child| (writer, child))
        });
        match spawned {
            Ok(watchdog) => {
                self.watchdog = Some(watchdog);
                let listed: String = self
                    .live
                    .iter()
                    .flatten()
                    .map(|group| format!("+{group}\n"))
                    .collect();
                listed.is_empty() || self.send(&listed)
            }
            Err(err) => {
                self.gave_up = true;
                tracing::warn!(
                    program = %program.to_string_lossy(),
                    "cannot start the exec handlers' watchdog ({err}): processes an exec \
                     handler starts may outlive a worker that is killed"
                );
                false
            }
        }
    }

    /// Writes `text` to the watchdog; false when it is gone (then reaped and forgotten,
    /// so the next spawn starts another).
    fn send(&mut self, text: &str) -> bool {
        let Some((writer, _)) = self.watchdog.as_mut() else {
            return false;
        };
        if writer.write_all(text.as_bytes()).is_ok() {
            return true;
        }
        if let Some((writer, mut child)) = self.watchdog.take() {
            drop(writer);
            let status = child.try_wait();
            tracing::warn!(
                ?status,
                "the exec handlers' watchdog is gone; starting another"
            );
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    use super::*;

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| !matches!(state, 'Z' | 'X'))
        })
    }

    #[test]
    fn at_end_of_file_the_groups_still_listed_are_killed() {
        let spawn = |script: &str| {
            std::process::Command::new("sh")
                .args(["-c", script])
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let mut listed = spawn("sleep 300 & sleep 300");
        let mut ended = spawn("sleep 300");
        let (a, b) = (listed.id() as i32, ended.id() as i32);
        let input = format!("+{a}\n+{b}\nnonsense\n-{b}\n");
        assert_eq!(run(input.as_bytes()), 1);
        let status = listed.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        // The group's background `sleep` went with it; the ended group was left alone.
        let start = Instant::now();
        while std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            let pid = entry
                .file_name()
                .to_string_lossy()
                .parse::<i32>()
                .unwrap_or(0);
            pid > 0
                && nix::unistd::getpgid(Some(Pid::from_raw(pid))).is_ok_and(|g| g.as_raw() == a)
                && alive(pid)
        }) {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "group {a} survived"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(alive(b));
        let _ = killpg(Pid::from_raw(b), Signal::SIGKILL);
        let _ = ended.wait();
    }
}
