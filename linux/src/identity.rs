//! Acting as the caller: what a FUSE request creates belongs to whoever
//! made it.

/// Who made a FUSE request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// Runs `create` so that what it creates belongs to `caller`: with the
/// calling thread's file-system uid and gid switched to the caller's
/// (setfsuid/setfsgid act on this thread only), and back afterwards.
///
/// Only a daemon running as root switches; otherwise everything belongs to
/// the daemon's user anyway. The kernel has already checked the caller's
/// permission against the attributes the view reports (the mount uses
/// `default_permissions`, and they are the underlying ones), so the
/// capabilities that switching the fsuid drops (CAP_DAC_OVERRIDE and the
/// other file-system ones) are raised again for the call: the underlying
/// file system must not decide differently, e.g. for a caller allowed in
/// by a supplementary group this thread does not have.
///
/// The thread also creates with exactly the modes it is given (see
/// [`exact_modes_on_this_thread`]).
pub fn as_caller<T>(caller: Caller, create: impl FnOnce() -> T) -> T {
    exact_modes_on_this_thread();
    if !daemon_is_root() || (caller.uid == 0 && caller.gid == 0) {
        return create();
    }
    let _switched = FsIdentity::switch(caller);
    create()
}

/// Gives the calling thread a umask of its own, 0, once: a FUSE request's
/// mode already has the caller's umask applied, and the daemon's must not
/// mask it again. Per thread (unshare(CLONE_FS)) because the process keeps
/// the umask it started with for everything the daemon makes itself: a
/// process-wide 0 once made native sandboxes' directories (and the
/// directories Collect makes in Bazel's exec root) writable by everyone.
/// Where unshare is refused, modes are masked again (less than asked,
/// never more).
fn exact_modes_on_this_thread() {
    thread_local! {
        static EXACT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if EXACT.get() {
        return;
    }
    EXACT.set(true);
    // SAFETY: unshare(CLONE_FS) takes an integer and acts on this thread:
    // its own cwd, root and umask from now on (none of which it shares on
    // purpose with another thread).
    if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        let err = std::io::Error::last_os_error();
        WARNED.call_once(|| {
            log::warn!(
                "unshare(CLONE_FS): {err}; what requests create through the mount has the \
                 daemon's umask applied too"
            )
        });
        return;
    }
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
}

fn daemon_is_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| nix::unistd::geteuid().is_root())
}

/// The thread's file-system identity while switched; restored on drop.
struct FsIdentity;

impl FsIdentity {
    fn switch(caller: Caller) -> FsIdentity {
        // The gid first: switching the uid away from root first would not
        // stop setfsgid (CAP_SETGID is not a file-system capability), but
        // this order never depends on that.
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(caller.gid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(caller.uid));
        if let Err(err) = capabilities::raise_effective() {
            log::warn!("cannot keep file-system capabilities for a caller-owned create: {err}");
        }
        FsIdentity
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        // Back to fsuid 0, which gives the thread its file-system
        // capabilities back (and they were raised anyway).
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
    }
}

/// capget/capset for the calling thread, which nix and libc do not wrap.
mod capabilities {
    use std::io;

    /// _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set.
    const VERSION_3: u32 = 0x2008_0522;

    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    /// Makes the thread's effective set its permitted set.
    pub fn raise_effective() -> io::Result<()> {
        let mut header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: capget writes two Data records for version 3, as given.
        let got = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
        if got != 0 {
            return Err(io::Error::last_os_error());
        }
        for word in &mut data {
            word.effective = word.permitted;
        }
        // SAFETY: capset reads the header and two Data records, as given;
        // pid 0 is the calling thread.
        let set = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
