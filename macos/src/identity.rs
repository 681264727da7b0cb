//! Acting as the caller: what a FUSE request creates belongs to whoever
//! made it.

use std::io;

/// Who made a FUSE request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

extern "C" {
    /// Sets the calling thread's own credentials (libSystem; no header).
    fn pthread_setugid_np(uid: libc::uid_t, gid: libc::gid_t) -> libc::c_int;
}

/// From <sys/kauth.h>: back to the process's credentials.
const KAUTH_UID_NONE: libc::uid_t = !0 - 100;
const KAUTH_GID_NONE: libc::gid_t = !0 - 100;

/// Runs `create` with the calling thread's credentials switched to
/// `caller`'s, so that what it creates belongs to the caller (only when the
/// daemon runs as root). macOS has no umask per thread: what a request
/// creates has the daemon's umask applied on top of the caller's (a
/// process-wide 0 would leave what the daemon makes itself writable by
/// everyone).
pub fn as_caller<T>(caller: Caller, create: impl FnOnce() -> T) -> T {
    if !nix::unistd::geteuid().is_root() || (caller.uid == 0 && caller.gid == 0) {
        return create();
    }
    // SAFETY: plain calls on the calling thread's credentials.
    if unsafe { pthread_setugid_np(caller.uid, caller.gid) } != 0 {
        log::warn!(
            "cannot act as uid {}: {}",
            caller.uid,
            io::Error::last_os_error()
        );
        return create();
    }
    let result = create();
    // SAFETY: as above; restores the process's credentials.
    unsafe { pthread_setugid_np(KAUTH_UID_NONE, KAUTH_GID_NONE) };
    result
}
