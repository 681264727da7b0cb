//! How a node reaches its underlying object, and every system call made on
//! one.
//!
//! A node's object is found from the [`Anchor`] of the mapping it belongs
//! to: the mapped directory itself, or the directory holding a mapped
//! file. Below a mapped directory the names of the node's ancestors form a
//! relative path, whose directory part is opened with
//! [`open_beneath`](crate::sandbox::dirfd::beneath::open_beneath), so a symlink (or
//! a non-directory) planted anywhere below the mapping root ends the walk
//! with ELOOP (or ENOTDIR) instead of leading elsewhere. The last name is
//! then used with an `*at` call that does not follow it either.
//!
//! Nothing is cached: each operation resolves afresh, so the view follows
//! the underlying tree as it changes (docs/SECURITY.md has the
//! measurements behind that choice).

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};

use super::error::{Errno, FsError, FsResult};
use super::node::{Node, Origin};
use crate::sandbox::dirfd::beneath::open_beneath;
use crate::sandbox::dirfd::{Anchor, PATH_DIR_FLAGS};

/// An underlying directory: an anchor, or a directory beneath one.
pub struct UDir {
    anchor: Arc<Anchor>,
    /// Path below the anchor; empty for the anchor itself.
    rel: Vec<u8>,
    /// The directory opened beneath the anchor (`None`: the anchor).
    opened: Option<OwnedFd>,
}

/// An underlying object: entry `name` of a directory (`.` for a mapped
/// directory itself).
pub struct UObj {
    dir: UDir,
    name: CString,
}

/// Where a node's object is, before anything is opened: its anchor and
/// the names below it.
struct Route {
    anchor: Arc<Anchor>,
    /// Names from the anchor down to the object (none: the anchor itself).
    names: Vec<CString>,
}

/// The route to `node`'s object; `None` for a virtual directory.
fn route(node: &Node) -> FsResult<Option<Route>> {
    let mut names = Vec::new();
    let mut origin = node.origin();
    loop {
        match origin {
            Origin::Virtual => return Ok(None),
            Origin::Refused => return Err(Errno::EIO.into()),
            Origin::Mapped(location) => {
                if !location.name.as_os_str().is_empty() {
                    names.push(c_string(location.name.as_os_str())?);
                }
                names.reverse();
                return Ok(Some(Route {
                    anchor: location.anchor,
                    names,
                }));
            }
            Origin::Child { parent, name } => {
                names.push(c_string(name.as_os_str())?);
                let parent = parent.upgrade().ok_or(Errno::ESTALE)?;
                origin = parent.origin();
            }
        }
    }
}

/// A name as a C string; EINVAL for one holding a NUL.
pub fn c_string(name: &OsStr) -> FsResult<CString> {
    crate::sandbox::dirfd::c_name(name).map_err(|_| FsError::refused(Errno::EINVAL))
}

fn join(names: &[CString]) -> Vec<u8> {
    let mut rel = Vec::new();
    for name in names {
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name.to_bytes());
    }
    rel
}

impl Route {
    /// Opens the directory `names` lead to (the anchor itself if none).
    fn into_dir(self) -> FsResult<UDir> {
        let rel = join(&self.names);
        // A mapping's directory is pinned at its first use.
        let anchor_fd = self
            .anchor
            .fd()
            .map_err(|err| FsError::at("open", err, &self.anchor, b""))?;
        let opened = if rel.is_empty() {
            None
        } else {
            let c = CString::new(rel.clone()).expect("names hold no NUL");
            let fd = open_beneath(anchor_fd, &c, PATH_DIR_FLAGS, Mode::empty())
                .map_err(|err| FsError::at("openat2", err, &self.anchor, &rel))?;
            Some(fd)
        };
        Ok(UDir {
            anchor: self.anchor,
            rel,
            opened,
        })
    }

    /// Splits off the last name and opens the directory holding it.
    fn into_obj(mut self) -> FsResult<UObj> {
        let name = self.names.pop().unwrap_or_else(|| c".".to_owned());
        Ok(UObj {
            dir: self.into_dir()?,
            name,
        })
    }
}

/// The underlying object of `node`; `None` for a virtual directory.
pub fn object(node: &Node) -> FsResult<Option<UObj>> {
    route(node)?.map(Route::into_obj).transpose()
}

/// The underlying directory `node` shows; `None` for a virtual directory.
pub fn directory(node: &Node) -> FsResult<Option<UDir>> {
    route(node)?.map(Route::into_dir).transpose()
}

/// Whether two directories lie in the same mapped tree (renames and links
/// between them stay on one underlying file system and mapping).
pub fn same_tree(a: &UDir, b: &UDir) -> bool {
    a.anchor.same_dir(&b.anchor)
}

impl UDir {
    pub fn fd(&self) -> BorrowedFd<'_> {
        match &self.opened {
            Some(fd) => fd.as_fd(),
            None => self
                .anchor
                .fd()
                .expect("an anchor is pinned before a UDir is made of it"),
        }
    }

    /// An error of `syscall` on entry `name` (or the directory itself).
    fn fail(&self, syscall: &'static str, err: impl Into<Errno>, name: Option<&CStr>) -> FsError {
        let mut rel = self.rel.clone();
        if let Some(name) = name.filter(|n| n.to_bytes() != b".") {
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.to_bytes());
        }
        FsError::at(syscall, err, &self.anchor, &rel)
    }

    /// `lstat` of entry `name`.
    pub fn stat_entry(&self, name: &OsStr) -> FsResult<FileStat> {
        let c = c_string(name)?;
        nix::sys::stat::fstatat(self.fd(), c.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|err| self.fail("fstatat", err, Some(&c)))
    }

    /// Opens the directory for listing.
    pub fn open_listing(&self) -> FsResult<crate::sandbox::dirfd::DirFd> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        crate::sandbox::dirfd::DirFd::open_at_with(self.fd(), c".", flags)
            .map_err(|err| self.fail("openat", err, None))
    }

    /// Runs `call` with this directory and `name` as a C string; a failure
    /// is reported as `syscall` on that entry.
    pub fn at<T>(
        &self,
        syscall: &'static str,
        name: &OsStr,
        call: impl FnOnce(BorrowedFd<'_>, &CStr) -> nix::Result<T>,
    ) -> FsResult<T> {
        let c = c_string(name)?;
        call(self.fd(), &c).map_err(|err| self.fail(syscall, err, Some(&c)))
    }

    /// Creates and opens file `name` with open(2) `flags` and `mode`.
    pub fn create_file(&self, name: &OsStr, flags: OFlag, mode: u32) -> FsResult<File> {
        self.at("openat", name, |dir, c| {
            nix::fcntl::openat(
                dir,
                c,
                flags | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(mode as _),
            )
        })
        .map(File::from)
    }
}

impl UObj {
    fn fail(&self, syscall: &'static str, err: impl Into<Errno>) -> FsError {
        self.dir.fail(syscall, err, Some(&self.name))
    }

    pub fn dir(&self) -> &UDir {
        &self.dir
    }

    pub fn name(&self) -> &CStr {
        &self.name
    }

    /// `lstat` of the object.
    pub fn stat(&self) -> FsResult<FileStat> {
        nix::sys::stat::fstatat(
            self.dir.fd(),
            self.name.as_c_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|err| self.fail("fstatat", err))
    }

    /// Opens the object with open(2) `flags`, never through a symlink.
    pub fn open(&self, flags: OFlag) -> FsResult<File> {
        nix::fcntl::openat(
            self.dir.fd(),
            self.name.as_c_str(),
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(File::from)
        .map_err(|err| self.fail("openat", err))
    }

    /// An O_PATH descriptor of the object itself, symlink or not: what
    /// calls that have no `*at` form without following act through.
    pub fn pin(&self) -> FsResult<OwnedFd> {
        let flags = crate::sys::PIN_FLAGS;
        nix::fcntl::openat(self.dir.fd(), self.name.as_c_str(), flags, Mode::empty())
            .map_err(|err| self.fail("openat", err))
    }

    pub fn readlink(&self) -> FsResult<Vec<u8>> {
        nix::fcntl::readlinkat(self.dir.fd(), self.name.as_c_str())
            .map(|target| target.into_encoded_bytes())
            .map_err(|err| self.fail("readlinkat", err))
    }

    /// Runs `call` with the object's directory and name; a failure is
    /// reported as `syscall` on the object.
    pub fn at<T>(
        &self,
        syscall: &'static str,
        call: impl FnOnce(BorrowedFd<'_>, &CStr) -> nix::Result<T>,
    ) -> FsResult<T> {
        call(self.dir.fd(), &self.name).map_err(|err| self.fail(syscall, err))
    }

    /// Runs `call` on the pinned object; failures are reported as
    /// `syscall` on the object.
    pub fn on_pinned<T>(
        &self,
        syscall: &'static str,
        call: impl FnOnce(&OwnedFd) -> std::io::Result<T>,
    ) -> FsResult<T> {
        let pinned = self.pin()?;
        call(&pinned).map_err(|err| self.fail(syscall, err))
    }
}
