//! Open directories and the system calls relative to them.
//!
//! Everything the daemon and the materializer do to the file system goes
//! through a descriptor of a directory and a single name in it (or, with
//! [`beneath`], a relative path resolved without following any symlink),
//! never through a path string walked from `/` again. That is what keeps a
//! symlink planted in a tree someone else can write from redirecting us,
//! and it saves walking the same components over and over.
//!
//! - [`DirFd`]: an open directory and its `*at` calls;
//! - [`beneath`]: opening a relative path below a directory, never
//!   following a symlink (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//!   where the kernel has it, a walk one component at a time elsewhere);
//! - [`Anchor`]: a directory pinned when a sandbox is created, which every
//!   later operation on the sandbox's underlying objects starts from.

mod anchor;
pub mod beneath;
mod listing;

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::UnlinkatFlags;

pub use anchor::Anchor;
pub use listing::Entries;

use crate::sandbox::file_kind::FileKind;

/// Flags of a directory opened to list and change it; never through a
/// symlink in its last component.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Flags of a directory opened only to name things in it (O_PATH where the
/// platform has it).
pub use crate::sys::PATH_DIR_FLAGS;

/// A name as a C string (names from the kernel or a layout hold no NUL;
/// one that does is refused with EINVAL).
pub fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// An open directory.
#[derive(Debug)]
pub struct DirFd(OwnedFd);

impl AsFd for DirFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl DirFd {
    /// Opens the directory at `path` for listing and changing it. Symlinks
    /// in earlier components are followed (the caller chose the path), not
    /// one in the last.
    pub fn open(path: &Path) -> io::Result<DirFd> {
        Self::open_at_with(nix::fcntl::AT_FDCWD, path.as_os_str(), DIR_FLAGS)
    }

    /// Opens the directory `anchor` pins for listing and changing it (the
    /// pinned directory itself, whatever its path leads to now).
    pub fn reopen(anchor: &Anchor) -> io::Result<DirFd> {
        Self::open_at_with(anchor.fd()?, c".", DIR_FLAGS)
    }

    /// Opens subdirectory `name` of this one, not through a symlink.
    pub fn open_at(&self, name: &CStr) -> io::Result<DirFd> {
        Self::open_at_with(self.as_fd(), name, DIR_FLAGS)
    }

    /// Opens `name` of `dir` with `flags` (which must include O_DIRECTORY).
    pub fn open_at_with<P: ?Sized + nix::NixPath>(
        dir: BorrowedFd<'_>,
        name: &P,
        flags: OFlag,
    ) -> io::Result<DirFd> {
        Ok(DirFd(nix::fcntl::openat(dir, name, flags, Mode::empty())?))
    }

    /// Takes ownership of a descriptor known to be a directory.
    pub fn from_owned(fd: OwnedFd) -> DirFd {
        DirFd(fd)
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub fn into_owned(self) -> OwnedFd {
        self.0
    }

    pub fn mkdir_at(&self, name: &CStr, mode: u32) -> io::Result<()> {
        Ok(nix::sys::stat::mkdirat(
            self,
            name,
            Mode::from_bits_truncate(mode as _),
        )?)
    }

    pub fn symlink_at(&self, target: &CStr, name: &CStr) -> io::Result<()> {
        Ok(nix::unistd::symlinkat(target, self, name)?)
    }

    /// Hard-links `source_name` of `source_dir` as `name` here (the link
    /// itself if it is a symlink: linkat without AT_SYMLINK_FOLLOW).
    pub fn link_at(
        &self,
        source_dir: BorrowedFd<'_>,
        source_name: &CStr,
        name: &CStr,
    ) -> io::Result<()> {
        Ok(nix::unistd::linkat(
            source_dir,
            source_name,
            self,
            name,
            AtFlags::empty(),
        )?)
    }

    /// Creates a new file (never replacing one) for writing.
    pub fn create_file(&self, name: &CStr, mode: u32) -> io::Result<File> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(self, name, flags, Mode::from_bits_truncate(mode as _))?;
        Ok(File::from(fd))
    }

    pub fn unlink_at(&self, name: &CStr, is_dir: bool) -> io::Result<()> {
        let flags = if is_dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        Ok(nix::unistd::unlinkat(self, name, flags)?)
    }

    /// `fstatat` without following a symlink.
    pub fn stat_at(&self, name: &CStr) -> io::Result<FileStat> {
        stat_at(self.as_fd(), name)
    }

    /// The type of entry `name`, without following a symlink.
    pub fn kind_at(&self, name: &CStr) -> io::Result<FileKind> {
        Ok(kind_of(&self.stat_at(name)?))
    }

    /// Adds owner read, write and search permission, so entries can be
    /// listed and removed.
    pub fn make_owner_writable(&self) -> io::Result<()> {
        let st = nix::sys::stat::fstat(self)?;
        let mode = Mode::from_bits_truncate(st.st_mode as _) | Mode::S_IRWXU;
        Ok(nix::sys::stat::fchmod(self, mode)?)
    }

    /// Adds owner read, write and search permission to subdirectory `name`
    /// without following a symlink there (a symlink answers EOPNOTSUPP).
    pub fn make_child_owner_writable(&self, name: &CStr) -> io::Result<()> {
        let st = self.stat_at(name)?;
        let mode = Mode::from_bits_truncate(st.st_mode as _) | Mode::S_IRWXU;
        Ok(nix::sys::stat::fchmodat(
            self,
            name,
            mode,
            nix::sys::stat::FchmodatFlags::NoFollowSymlink,
        )?)
    }

    /// The directory's entries (without `.` and `..`), read with `getdents`
    /// from the start; the descriptor is rewound when the listing is dropped.
    pub fn entries(&self) -> io::Result<Entries<'_>> {
        Entries::new(self.as_fd())
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<FileStat> {
    Ok(nix::sys::stat::fstatat(
        dir,
        name,
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )?)
}

/// The type a stat result describes.
pub fn kind_of(st: &FileStat) -> FileKind {
    // st_mode is u16 on macOS.
    #[allow(clippy::unnecessary_cast)]
    FileKind::from_mode(st.st_mode as u32)
}

/// Opens existing file `name` of `dir` (AT_FDCWD for an absolute name) for
/// reading, not through a symlink.
pub fn open_file_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(File::from(nix::fcntl::openat(
        dir,
        name,
        flags,
        Mode::empty(),
    )?))
}

/// Target of symlink `name` of `dir` (AT_FDCWD for an absolute name).
pub fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<CString> {
    let target: OsString = nix::fcntl::readlinkat(dir, name)?;
    CString::new(target.into_vec()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}
