//! How the daemon stops.
//!
//! - The mount goes away from outside (`fusermount3 -u`): the FUSE session
//!   ends, and the daemon exits 0.
//! - A signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT): the daemon unmounts the
//!   normal way. While the mount is busy (a file open, or a process's
//!   working directory inside) that fails with EBUSY; the daemon then keeps
//!   serving and retries, logging each attempt, at growing intervals up to
//!   [`MAX_RETRY_INTERVAL`], so that a process inside keeps every path
//!   until it is done. A second signal detaches the mount at once: the
//!   mount point is free (a new daemon can mount there) and nothing new
//!   can be opened, while files still open keep working, as after any
//!   lazy unmount, so that a process in the middle of writing an output
//!   does not fail; the daemon serves them and exits when the last is
//!   closed. A third signal ends it at once, and what is still open then
//!   fails (ENOTCONN). Once unmounted, the daemon exits by the first
//!   signal, as a shell expects.
//!   Bazel sends SIGTERM at the end of a build with nothing inside, so its
//!   shutdown is immediate.
//! - A daemon owned by a front end (`actionfs serve`, [`super::Owner`])
//!   stops at its first signal: the front end's hook ends its work, then a
//!   busy mount is detached at once instead of waited for (Bazel sends that
//!   signal once, when a request timed out, and has failed what was in
//!   flight), and the daemon exits by that signal.
//!
//! End of input does not stop the daemon (Bazel closes stdin before it
//! sends SIGTERM, and the mount must keep serving until then).
//!
//! Each stop is logged in one line, in sandboxfs 0.2.0's words where it had
//! a line for the same event (scripts written for it grep for them), under
//! the target [`LOG`], which is shown at the default log level: `Caught
//! signal 15; unmounting /mnt`; on a busy mount, one `Unmounting file
//! system failed with '...'; will retry in ...` line per attempt; at end
//! of input, `Reached end of reconfiguration input; ...`. The daemon
//! unmounts by itself; the FUSE session's own unmount-on-drop is never run
//! (see `daemon::run`), so nothing unmounts a second time.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::DaemonError;
use crate::daemon::mount;

/// The signals that stop the daemon.
pub const STOP_SIGNALS: [i32; 4] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGQUIT,
];

/// First wait between unmount attempts of a busy mount; it doubles up to
/// [`MAX_RETRY_INTERVAL`].
const FIRST_RETRY_INTERVAL: Duration = Duration::from_millis(250);
pub const MAX_RETRY_INTERVAL: Duration = Duration::from_secs(2);

/// How long to wait for the FUSE session to notice an unmount.
const SESSION_END_WAIT: Duration = Duration::from_secs(5);

/// The log target of the lines that say how the daemon stops.
pub const LOG: &str = "actionfs::lifecycle";

/// Logs that the request input ended (the daemon goes on serving).
pub fn input_ended() {
    log::info!(
        target: LOG,
        "Reached end of reconfiguration input; no more requests are read, the mount stays up \
         until a signal or an unmount"
    );
}

/// The mount, detached if the daemon stops without unmounting it (an
/// error after mounting, or a failed FUSE session).
pub struct Mounted {
    path: Option<PathBuf>,
}

impl Mounted {
    pub fn new(path: &Path) -> Mounted {
        Mounted {
            path: Some(path.to_owned()),
        }
    }

    /// The mount is gone; nothing to do on drop.
    fn gone(&mut self) {
        self.path = None;
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            if let Err(err) = mount::unmount_lazily(&path) {
                log::warn!(target: LOG, "cannot detach {} on the way out: {err}", path.display());
            }
        }
    }
}

/// What the main thread hears from the others.
pub enum Event {
    Signal(i32),
    SessionEnded(io::Result<()>),
    /// A front end that owns the daemon's life (`actionfs serve`) is done:
    /// unmount as for a signal, then exit 0.
    FrontEndDone,
}

/// How the daemon stopped, for its exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Unmounted from outside: exit 0.
    Unmounted,
    /// Unmounted after this signal: exit by it.
    BySignal(i32),
    /// Unmounted because the front end ended (its client closed the
    /// stream): exit 0.
    FrontEndDone,
}

/// Waits for a reason to stop and, for a signal, unmounts: patiently, then
/// forcibly on a second signal; or, for an owning front end, after its
/// `on_signal` hook, at once.
pub fn wait_and_unmount(
    events: &Receiver<Event>,
    mut mounted: Mounted,
    mount_point: &Path,
    on_signal: Option<super::OnSignal>,
) -> Result<Stopped, DaemonError> {
    let shown = mount_point.display();
    let signal = match events.recv() {
        Ok(Event::Signal(signal)) => signal,
        Ok(Event::FrontEndDone) => {
            log::info!(target: LOG, "The client closed the stream; unmounting {shown}");
            return unmount_patiently(events, mounted, mount_point, Stopped::FrontEndDone);
        }
        Ok(Event::SessionEnded(Ok(()))) => {
            mounted.gone();
            log::info!(target: LOG, "{shown} was unmounted from outside; exiting");
            return Ok(Stopped::Unmounted);
        }
        Ok(Event::SessionEnded(Err(err))) => return Err(DaemonError::Session(err)),
        Err(_) => return Err(DaemonError::ThreadsEnded),
    };
    log::info!(target: LOG, "Caught signal {signal}; unmounting {shown}");
    match on_signal {
        Some(hook) => {
            hook(signal);
            unmount_or_detach(events, mounted, mount_point);
            Ok(Stopped::BySignal(signal))
        }
        None => unmount_patiently(events, mounted, mount_point, Stopped::BySignal(signal)),
    }
}

/// Unmounts, retrying while the mount is busy; a signal meanwhile
/// detaches it. `stopped` is how the daemon ends once unmounted.
fn unmount_patiently(
    events: &Receiver<Event>,
    mut mounted: Mounted,
    mount_point: &Path,
    stopped: Stopped,
) -> Result<Stopped, DaemonError> {
    let shown = mount_point.display();
    let mut interval = FIRST_RETRY_INTERVAL;
    loop {
        match mount::unmount(mount_point) {
            Ok(()) => break,
            Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                log::warn!(
                    target: LOG,
                    "Unmounting file system failed with '{err}'; will retry in {interval:?} \
                     ({shown} is busy: a file is open or a process is inside, and it is still \
                     served; a second signal detaches it at once)"
                );
            }
            Err(err) => {
                log::warn!(
                    target: LOG,
                    "Unmounting file system failed with '{err}'; detaching {shown} instead"
                );
                detach(mount_point)?;
                serve_until_closed(events, mount_point);
                return Ok(stopped);
            }
        }
        match events.recv_timeout(interval) {
            Ok(Event::Signal(again)) => {
                log::warn!(target: LOG, "Caught signal {again} again; detaching {shown}");
                detach(mount_point)?;
                serve_until_closed(events, mount_point);
                return Ok(stopped);
            }
            Ok(Event::FrontEndDone) => {}
            Ok(Event::SessionEnded(_)) => {
                mounted.gone();
                log::info!(target: LOG, "{shown} was unmounted from outside meanwhile");
                return Ok(stopped);
            }
            Err(RecvTimeoutError::Timeout) => interval = (interval * 2).min(MAX_RETRY_INTERVAL),
            Err(RecvTimeoutError::Disconnected) => return Err(DaemonError::ThreadsEnded),
        }
    }
    mounted.gone();
    await_session_end(events);
    Ok(stopped)
}

/// Unmounts at once for a caller that is done with the mount (an
/// embedded one, [`crate::daemon::Embedded`]): a busy mount is detached,
/// so files still open through it keep working until closed.
pub fn unmount_or_detach(events: &Receiver<Event>, mut mounted: Mounted, mount_point: &Path) {
    match mount::unmount(mount_point) {
        Ok(()) => {}
        Err(err) => {
            log::warn!(
                target: LOG,
                "Unmounting file system failed with '{err}'; detaching {}",
                mount_point.display()
            );
            // The session serves the open files on, by itself.
            match detach(mount_point) {
                Ok(()) => mounted.gone(),
                Err(err) => log::error!(target: LOG, "{err}"),
            }
            return;
        }
    }
    mounted.gone();
    await_session_end(events);
}

/// After an unmount, waits (a while) for the session to notice it, which
/// it does when its next read fails.
fn await_session_end(events: &Receiver<Event>) {
    loop {
        match events.recv_timeout(SESSION_END_WAIT) {
            Ok(Event::SessionEnded(_)) | Err(_) => break,
            Ok(Event::Signal(_) | Event::FrontEndDone) => continue,
        }
    }
}

/// After a detach: serves what is still open until the kernel lets the
/// file system go with its last close (the session ends), or until another
/// signal, which ends the daemon at once.
fn serve_until_closed(events: &Receiver<Event>, mount_point: &Path) {
    log::warn!(
        "{mount_point:?} detached: files still open through it keep working, and the \
         daemon exits when the last is closed; another signal exits at once (they then fail)"
    );
    match events.recv() {
        Ok(Event::SessionEnded(_) | Event::FrontEndDone) => {
            log::info!("the last file open through {mount_point:?} was closed")
        }
        Ok(Event::Signal(again)) => log::warn!(
            "signal {again} again: exiting; files still open through {mount_point:?} fail from now on"
        ),
        Err(_) => {}
    }
}

fn detach(mount_point: &Path) -> Result<(), DaemonError> {
    mount::unmount_lazily(mount_point).map_err(|source| DaemonError::Unmount {
        path: mount_point.to_owned(),
        source,
    })
}

/// Ends the process by `signal`, with its default action restored, as if
/// the daemon had not caught it.
pub fn exit_by(signal: i32) -> ! {
    // Failing that (a signal whose default is to continue), exit as a
    // shell reports a death by signal.
    let _ = signal_hook::low_level::emulate_default_handler(signal);
    std::process::exit(128 + signal)
}
