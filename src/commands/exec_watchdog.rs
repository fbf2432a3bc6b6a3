//! `icq exec-watchdog` (hidden): the process `icq work` starts at its first exec handler,
//! reading the worker's pipe on stdin; when the worker is gone, however it ended, it kills
//! the process groups of the handlers still running (see
//! [`icq::handler::exec::watchdog`]).

/// Runs the watchdog until its stdin ends; says on stderr what it killed. The stderr it
/// shares with the dead worker may be a pipe nobody reads any more: the line is given a
/// second, and the process exits whether or not it was written.
pub fn run() -> anyhow::Result<()> {
    let killed = icq::handler::exec::watchdog::run(std::io::stdin().lock());
    if killed > 0 {
        let (written, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            crate::cli::output::note(&format!(
                "icq exec-watchdog: the worker is gone; killed the process groups of {killed} \
                 exec handler(s) it left running"
            ));
            let _ = written.send(());
        });
        let _ = wait.recv_timeout(std::time::Duration::from_secs(1));
    }
    Ok(())
}

/// Has exec handlers started from now on watched by `icq exec-watchdog`, run from this
/// very binary (`/proc/self/exe` on Linux, which holds even if the file was replaced).
pub fn enable() {
    #[cfg(target_os = "linux")]
    let program = Some(std::path::PathBuf::from("/proc/self/exe"));
    #[cfg(not(target_os = "linux"))]
    let program = std::env::current_exe().ok();
    if let Some(program) = program {
        icq::handler::exec::watchdog::enable(program, ["exec-watchdog"]);
    }
}
