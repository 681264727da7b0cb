//! The action's processes. The wrapper spawns the action instead of
//! becoming it, and stays as the subreaper of everything the action
//! starts: it passes signals on, waits for the action's first process,
//! then kills whatever is left (a daemon started with `setsid`, a double
//! fork's orphan), as linux-sandbox's PID namespace would, and exits as
//! the action did. With `namespaces` it first moves into the jail's user
//! and mount namespace ([`namespaces::enter`]).

use std::ffi::OsString;
use std::io::Error;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::{namespaces, Rules, HELPER};

/// Runs `action` confined by `rules`; returns the exit status to use (or
/// does not return: a signal that killed the action kills the wrapper).
pub fn run(rules: &Rules, action: &[OsString]) -> i32 {
    match supervise(rules, action) {
        Ok(status) => exit_as(status),
        Err(why) => {
            eprintln!("{HELPER}: {why}");
            127
        }
    }
}

fn supervise(rules: &Rules, action: &[OsString]) -> Result<libc::c_int, String> {
    let signals = Signals::catch();
    if rules.namespaces {
        namespaces::enter(rules)?;
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "prctl(PR_SET_CHILD_SUBREAPER): {}",
            Error::last_os_error()
        ));
    }
    let status = start(rules, action, &signals).and_then(wait_for)?;
    kill_leftovers();
    Ok(status)
}

/// Confines this process (and so all it starts) and spawns the action
/// (posix_spawn: no copy of this process's memory, unlike a fork).
/// Where the action then runs as this process's child, this process
/// stays in its domain: it only waits for it and passes signals on.
fn start(rules: &Rules, action: &[OsString], signals: &Signals) -> Result<libc::pid_t, String> {
    crate::landlock::confine(rules)?;
    if rules.namespaces {
        namespaces::drop_capabilities()?;
    }
    let child = std::process::Command::new(&action[0])
        .args(&action[1..])
        .spawn()
        .map_err(|err| format!("exec {:?}: {err}", action[0]))?;
    let pid = child.id() as libc::pid_t;
    signals.forward_to(pid);
    Ok(pid)
}

/// Waits until `pid` exits, reaping any other child on the way (a
/// subreaper inherits the action's orphans).
fn wait_for(pid: libc::pid_t) -> Result<libc::c_int, String> {
    loop {
        let mut status = 0;
        // SAFETY: waits for any child into a live int.
        let reaped = unsafe { libc::waitpid(-1, &mut status, 0) };
        if reaped == pid {
            return Ok(status);
        }
        if reaped == -1 {
            let err = Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(format!("waitpid (for {pid}): {err}"));
            }
        }
    }
}

/// Kills and reaps every child left (orphans of the action, handed to
/// this subreaper), until there is none.
fn kill_leftovers() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    loop {
        // SAFETY: reaps without waiting; no status kept.
        let reaped = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        match reaped {
            0 => {}
            -1 if Error::last_os_error().raw_os_error() == Some(libc::EINTR) => continue,
            -1 => return, // ECHILD: none left
            _ => continue,
        }
        for child in children_of(me) {
            // SAFETY: a signal to a child of ours (not yet reaped, so its
            // PID is not reused).
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        // SAFETY: as above, now waiting for one.
        unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) };
    }
}

/// The processes whose parent is `parent`, from `/proc/PID/stat` (the
/// kernel's `children` lists need CONFIG_PROC_CHILDREN).
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            entry
                .ok()?
                .file_name()
                .to_str()?
                .parse::<libc::pid_t>()
                .ok()
        })
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // "PID (COMM) STATE PPID ...": COMM may hold spaces and parens.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) == Some(parent)
        })
        .collect()
}

/// Ends this wrapper as the action ended: its exit code, or its signal.
fn exit_as(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        return libc::WEXITSTATUS(status);
    }
    let signal = libc::WTERMSIG(status);
    // SAFETY: no core of the wrapper; the signal's default action, then
    // the signal itself.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
    128 + signal
}

/// The signals passed on to the action (what Bazel or a user sends).
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Where a signal caught is passed on (0: nowhere yet).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);
/// A signal caught before there was anywhere to pass it on.
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn pass_on(signal: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, signal) };
    } else {
        PENDING.store(signal, Ordering::SeqCst);
    }
}

/// The forwarded signals caught from the start (not blocked: std's spawn
/// keeps the mask, and the action must be able to receive them), where
/// each caught signal is passed on.
struct Signals;

/// Signal numbers to reset: 1 to 64, the kernel's `_NSIG`.
const SIGNALS: std::ops::Range<libc::c_int> = 1..65;

impl Signals {
    /// Every signal back at its default and none blocked, as
    /// linux-sandbox and Bazel's process-wrapper start
    /// (`RestoreSignalHandlersAndMask`), whatever the wrapper was started
    /// with (a shell's `&` ignores SIGINT and SIGQUIT, `nohup` SIGHUP: an
    /// action inheriting them could not be interrupted); then the
    /// forwarded ones caught. The action starts with them at their
    /// defaults (a caught signal is reset at exec).
    fn catch() -> Signals {
        // SAFETY: sigaction and sigprocmask calls on live, zeroed
        // structures; the handler is async-signal-safe. A number the
        // system reserves (SIGKILL, SIGSTOP, the C library's own) is
        // refused, and left as it is.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut default.sa_mask);
            for signal in SIGNALS {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            for signal in FORWARDED {
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
        Signals
    }

    /// Passes the forwarded signals on to `pid` from now on, and the one
    /// caught before, if any. (The handler runs on this thread, between
    /// two of its instructions: it saw either no target, and left its
    /// signal for the swap below, or this one.)
    fn forward_to(&self, pid: libc::pid_t) {
        FORWARD_TO.store(pid, Ordering::SeqCst);
        let pending = PENDING.swap(0, Ordering::SeqCst);
        if pending != 0 {
            // SAFETY: a signal to the child just spawned.
            unsafe { libc::kill(pid, pending) };
        }
    }
}
