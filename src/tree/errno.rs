//! The error every file-system operation returns: an errno for the kernel.

use std::io;

/// A positive errno value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
}

impl From<io::Error> for Errno {
    fn from(err: io::Error) -> Self {
        // Errors without an OS code come from our own path handling.
        Errno(err.raw_os_error().unwrap_or(libc::EIO))
    }
}

pub type FsResult<T> = Result<T, Errno>;
