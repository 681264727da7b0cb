//! What every file-system operation returns on failure: the errno the
//! kernel gets, and, for the log, the system call that failed and the
//! underlying object it was made on (with the sandbox that pinned it).
//! The FUSE shell turns these into replies in one place.

use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::sandbox::dirfd::Anchor;

/// A positive errno value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
}

impl From<nix::errno::Errno> for Errno {
    fn from(err: nix::errno::Errno) -> Self {
        Errno(err as i32)
    }
}

impl From<io::Error> for Errno {
    fn from(err: io::Error) -> Self {
        // Errors without an OS code come from our own path handling.
        Errno(err.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// A failed operation.
#[derive(Clone)]
pub struct FsError {
    errno: Errno,
    /// Boxed: most errors (ENOENT on a lookup) are built and dropped
    /// without being logged, and results stay small.
    at: Option<Box<Where>>,
}

/// The failed system call and what it was made on.
#[derive(Clone)]
struct Where {
    syscall: &'static str,
    object: Option<(Arc<Anchor>, Vec<u8>)>,
}

pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    /// A refusal the daemon decided itself (EPERM for a read-only node...).
    pub fn refused(errno: Errno) -> FsError {
        FsError { errno, at: None }
    }

    /// `syscall` failed on an open descriptor or handle.
    pub fn call(syscall: &'static str, err: impl Into<Errno>) -> FsError {
        FsError {
            errno: err.into(),
            at: Some(Box::new(Where {
                syscall,
                object: None,
            })),
        }
    }

    /// `syscall` failed on `rel` below `anchor` (empty: the anchor itself).
    pub fn at(
        syscall: &'static str,
        err: impl Into<Errno>,
        anchor: &Arc<Anchor>,
        rel: &[u8],
    ) -> FsError {
        FsError {
            errno: err.into(),
            at: Some(Box::new(Where {
                syscall,
                object: Some((anchor.clone(), rel.to_vec())),
            })),
        }
    }

    pub fn errno(&self) -> Errno {
        self.errno
    }

    /// The sandbox whose underlying object the failure concerns, if known.
    pub fn sandbox(&self) -> Option<&str> {
        self.at.as_ref()?.object.as_ref()?.0.sandbox()
    }
}

impl From<FsError> for Errno {
    fn from(err: FsError) -> Self {
        err.errno
    }
}

impl From<Errno> for FsError {
    fn from(errno: Errno) -> Self {
        FsError::refused(errno)
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = io::Error::from_raw_os_error(self.errno.0);
        let Some(at) = &self.at else {
            return write!(f, "refused: {text}");
        };
        match &at.object {
            None => write!(f, "{}: {text}", at.syscall),
            Some((anchor, rel)) => {
                if let Some(sandbox) = anchor.sandbox() {
                    write!(f, "sandbox {sandbox:?}: ")?;
                }
                let mut path = anchor.path().to_owned();
                if !rel.is_empty() {
                    path.push(std::ffi::OsStr::from_bytes(rel));
                }
                write!(f, "{} {path:?}: {text}", at.syscall)
            }
        }
    }
}

impl fmt::Debug for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} ({:?})", self.errno)
    }
}

impl std::error::Error for FsError {}
