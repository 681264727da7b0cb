//! Unmounts a mount served for others, embedded ([`super::Embedded`]) or
//! owned by a front end ([`super::Owner`], `actionfs serve`), when the
//! process that serves it dies without unmounting it (killed, or exiting
//! without dropping it, as a worker stopped by a signal does). A FUSE mount whose
//! server is gone stays in the mount table, every access failing with
//! ENOTCONN, until someone unmounts it; the daemon binary unmounts on its
//! stop signals itself, a library cannot.
//!
//! A watcher process, forked once the mount serves, waits on a pipe whose
//! write end only the server holds. A byte means the server unmounted and
//! the watcher just exits; end of file, which any death of the server
//! brings, makes it detach the mount (`umount2`, else `fusermount3 -u -z`)
//! and exit.

use std::io;
use std::path::Path;

/// The watcher of one mount; dropped once the mount is gone.
pub struct UnmountGuard {
    #[cfg(target_os = "linux")]
    watcher: Option<linux::Watcher>,
}

impl UnmountGuard {
    /// Starts watching `mount_point` for this process's death.
    pub fn watch(mount_point: &Path) -> io::Result<UnmountGuard> {
        #[cfg(target_os = "linux")]
        return Ok(UnmountGuard {
            watcher: Some(linux::Watcher::spawn(mount_point)?),
        });
        #[cfg(not(target_os = "linux"))]
        {
            let _ = mount_point;
            Ok(UnmountGuard {})
        }
    }
}

impl Drop for UnmountGuard {
    /// The mount was unmounted by its server: the watcher exits.
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(watcher) = self.watcher.take() {
            watcher.release();
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::CString;
    use std::io;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    use nix::sys::wait::waitpid;
    use nix::unistd::{fork, pipe2, write, ForkResult, Pid};

    pub struct Watcher {
        /// Its pipe's write end (close-on-exec: actions never hold it).
        tell: OwnedFd,
        pid: Pid,
    }

    impl Watcher {
        pub fn spawn(mount_point: &Path) -> io::Result<Watcher> {
            // Everything the child needs is made before the fork: after
            // it, only async-signal-safe calls (no allocation, no lock).
            let path = CString::new(mount_point.as_os_str().as_bytes())?;
            let fusermount = c"fusermount3";
            let argv = [
                fusermount.as_ptr(),
                c"-u".as_ptr(),
                c"-z".as_ptr(),
                path.as_ptr(),
                std::ptr::null(),
            ];
            let (wait_on, tell) = pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            // SAFETY: the child only makes the async-signal-safe calls of
            // `watch`, then execs or exits; it never returns here.
            match unsafe { fork() }? {
                // SAFETY: this is the child just forked, as `watch` needs.
                ForkResult::Child => unsafe { watch(wait_on.as_raw_fd(), &path, &argv) },
                ForkResult::Parent { child } => Ok(Watcher { tell, pid: child }),
            }
        }

        /// Tells the watcher the mount is gone, and reaps it.
        pub fn release(self) {
            let _ = write(&self.tell, &[1]);
            drop(self.tell);
            let _ = waitpid(self.pid, None);
        }
    }

    /// The watcher: in a session of its own (a terminal's ^C to the
    /// server's group must not take it too), with no descriptor but its
    /// pipe's read end (not `/dev/fuse`, which would keep the dead
    /// server's connection up, nor the pipe's write end).
    ///
    /// # Safety
    /// Only in a child just forked; never returns.
    unsafe fn watch(wait_on: i32, path: &CString, argv: &[*const libc::c_char; 5]) -> ! {
        libc::setsid();
        libc::dup2(wait_on, 0);
        libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32);
        let mut byte = 0u8;
        let got = loop {
            let got = libc::read(0, (&mut byte as *mut u8).cast(), 1);
            if got >= 0 || *libc::__errno_location() != libc::EINTR {
                break got;
            }
        };
        if got == 0 && libc::umount2(path.as_ptr(), libc::MNT_DETACH) != 0 {
            // Not root: the mount was made through fusermount3.
            libc::execvp(argv[0], argv.as_ptr());
        }
        libc::_exit(0)
    }
}
