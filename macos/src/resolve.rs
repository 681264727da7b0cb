//! Opening a path beneath a directory in one call, never through a symlink.

use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// Flags of a directory opened only to name things in it (no O_PATH here).
pub const PATH_DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Flags that pin an object itself: O_SYMLINK opens a symlink as itself,
/// O_NONBLOCK keeps a FIFO from blocking.
pub const PIN_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::from_bits_retain(libc::O_SYMLINK))
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NONBLOCK);

/// Opens `rel` beneath `dir` in one call: O_NOFOLLOW_ANY refuses a symlink
/// in any component (macOS 11+). Always `Some`: there is no fallback.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &CStr,
    flags: OFlag,
    mode: Mode,
) -> Option<io::Result<OwnedFd>> {
    let any = OFlag::from_bits_retain(libc::O_NOFOLLOW_ANY);
    Some(nix::fcntl::openat(dir, rel, flags | any, mode).map_err(io::Error::from))
}

/// Whether `dir` is on tmpfs: never treated so on macOS.
pub fn on_tmpfs(_dir: &std::path::Path) -> bool {
    false
}

/// The uid of a Unix socket's peer (macOS does not say its pid).
pub fn peer_credentials(
    stream: &std::os::unix::net::UnixStream,
) -> nix::Result<(u32, Option<i32>)> {
    let (uid, _) = nix::unistd::getpeereid(stream)?;
    Ok((uid.as_raw(), None))
}
