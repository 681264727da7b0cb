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
//!
//! End of input does not stop the daemon (Bazel closes stdin before it
//! sends SIGTERM, and the mount must keep serving until then).

use std::io;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::DaemonError;
use crate::mount;

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

/// What the main thread hears from the others.
pub enum Event {
    Signal(i32),
    SessionEnded(io::Result<()>),
}

/// How the daemon stopped, for its exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Unmounted from outside: exit 0.
    Unmounted,
    /// Unmounted after this signal: exit by it.
    BySignal(i32),
}

/// Waits for a reason to stop and, for a signal, unmounts (patiently,
/// then forcibly on a second signal).
pub fn wait_and_unmount(
    events: &Receiver<Event>,
    mount_point: &Path,
) -> Result<Stopped, DaemonError> {
    let signal = match events.recv() {
        Ok(Event::Signal(signal)) => signal,
        Ok(Event::SessionEnded(Ok(()))) => {
            log::info!("{mount_point:?} was unmounted");
            return Ok(Stopped::Unmounted);
        }
        Ok(Event::SessionEnded(Err(err))) => return Err(DaemonError::Session(err)),
        Err(_) => return Err(DaemonError::ThreadsEnded),
    };
    log::info!("signal {signal}: unmounting {mount_point:?}");
    let mut interval = FIRST_RETRY_INTERVAL;
    loop {
        match mount::unmount(mount_point) {
            Ok(()) => break,
            Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                log::warn!(
                    "{mount_point:?} is busy (a file open or a process inside): still serving, \\
                     trying again in {interval:?}; a second signal detaches it at once"
                );
            }
            Err(err) => {
                log::warn!("cannot unmount {mount_point:?} ({err}); detaching it");
                detach(mount_point)?;
                serve_until_closed(events, mount_point);
                return Ok(Stopped::BySignal(signal));
            }
        }
        match events.recv_timeout(interval) {
            Ok(Event::Signal(again)) => {
                log::warn!("signal {again} again: detaching {mount_point:?}");
                detach(mount_point)?;
                serve_until_closed(events, mount_point);
                return Ok(Stopped::BySignal(signal));
            }
            Ok(Event::SessionEnded(_)) => {
                log::info!("{mount_point:?} was unmounted meanwhile");
                return Ok(Stopped::BySignal(signal));
            }
            Err(RecvTimeoutError::Timeout) => interval = (interval * 2).min(MAX_RETRY_INTERVAL),
            Err(RecvTimeoutError::Disconnected) => return Err(DaemonError::ThreadsEnded),
        }
    }
    // The session notices the unmount when its next read fails.
    loop {
        match events.recv_timeout(SESSION_END_WAIT) {
            Ok(Event::SessionEnded(_)) | Err(_) => break,
            Ok(Event::Signal(_)) => continue,
        }
    }
    Ok(Stopped::BySignal(signal))
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
        Ok(Event::SessionEnded(_)) => log::info!("the last file open through {mount_point:?} was closed"),
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
