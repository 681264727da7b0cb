//! Opening a path beneath a directory in one call, never through a symlink.

use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

/// Cleared once the kernel (or a seccomp filter) refuses openat2.
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// openat2 answers EAGAIN when a rename or mount raced the lookup;
/// after this many, the walk (which cannot race that way) is used.
const EAGAIN_RETRIES: usize = 4;

/// Flags of a directory opened only to name things in it: O_PATH, which
/// needs no read permission and cannot read the directory.
pub const PATH_DIR_FLAGS: OFlag = OFlag::O_PATH
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Flags that pin an object itself, a symlink included, for the calls
/// that have no `*at` form without following.
pub const PIN_FLAGS: OFlag = OFlag::O_PATH
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens `rel` beneath `dir` with openat2 (RESOLVE_BENEATH, no symlinks,
/// no magic links). `None` where openat2 cannot be used (refused once, or
/// raced by renames again and again): walk one component at a time then.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &CStr,
    flags: OFlag,
    mode: Mode,
) -> Option<io::Result<OwnedFd>> {
    if OPENAT2.load(Ordering::Relaxed) {
        let how = OpenHow::new().flags(flags).mode(mode).resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        for _ in 0..EAGAIN_RETRIES {
            match nix::fcntl::openat2(dir, rel, how) {
                Ok(fd) => return Some(Ok(fd)),
                Err(Errno::EAGAIN) => continue,
                Err(Errno::ENOSYS) => {
                    log::info!("openat2 is unavailable; resolving paths one component at a time");
                    OPENAT2.store(false, Ordering::Relaxed);
                    break;
                }
                Err(err) => return Some(Err(err.into())),
            }
        }
    }
    None
}

/// Whether `dir`, or its nearest existing ancestor, is on tmpfs.
pub fn on_tmpfs(dir: &std::path::Path) -> bool {
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    // One call where `dir` exists (each Create asks of its own scratch
    // directory); the search for an ancestor only where it does not.
    if let Ok(st) = statfs(dir) {
        return st.filesystem_type() == TMPFS_MAGIC;
    }
    let Some(existing) = dir.ancestors().find(|a| a.exists()) else {
        return false;
    };
    statfs(existing).is_ok_and(|st| st.filesystem_type() == TMPFS_MAGIC)
}

/// The uid and pid of a Unix socket's peer.
pub fn peer_credentials(
    stream: &std::os::unix::net::UnixStream,
) -> nix::Result<(u32, Option<i32>)> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let creds = getsockopt(stream, PeerCredentials)?;
    Ok((creds.uid(), Some(creds.pid())))
}
