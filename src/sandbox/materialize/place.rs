//! Placing one leaf of a sandbox: a file by the chosen method, a symlink
//! recreated as a symlink, or a link to an object that must stay shared.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sandbox::dirfd::{c_name, open_file_at, readlink_at, DirFd};
use crate::sys;

/// How regular files are materialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// A symlink to the underlying file (what Bazel does without sandboxfs).
    Symlink,
    /// A hard link to the underlying file (same file system only).
    Hardlink,
    /// A copy-on-write clone (FICLONE on Linux, clonefile on macOS).
    Clone,
    /// A full copy of the bytes.
    Copy,
    /// Per file, the fastest method that works: hard link, else clone,
    /// else symlink.
    Auto,
}

impl Method {
    pub fn parse(text: &str) -> Option<Method> {
        Some(match text {
            "symlink" => Method::Symlink,
            "hardlink" => Method::Hardlink,
            "clone" => Method::Clone,
            "copy" => Method::Copy,
            "auto" => Method::Auto,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Method::Symlink => "symlink",
            Method::Hardlink => "hardlink",
            Method::Clone => "clone",
            Method::Copy => "copy",
            Method::Auto => "auto",
        }
    }
}

/// How a leaf was actually made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Made {
    Symlink,
    Hardlink,
    Clone,
    Copy,
    /// A symlink from the source tree, recreated with the same target.
    CopiedSymlink,
}

impl Made {
    pub const ALL: [Made; 5] = [
        Made::Symlink,
        Made::Hardlink,
        Made::Clone,
        Made::Copy,
        Made::CopiedSymlink,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Made::Symlink => "symlink",
            Made::Hardlink => "hardlink",
            Made::Clone => "clone",
            Made::Copy => "copy",
            Made::CopiedSymlink => "copied symlink",
        }
    }
}

/// What a leaf is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafKind {
    /// A regular file, placed by the method.
    File,
    /// A symlink, recreated as a symlink (never followed).
    Symlink,
    /// An object that must stay the same object (a writable mapping, a FIFO,
    /// a device): always a symlink to it.
    Shared,
}

/// One entry to create in a directory.
pub struct Leaf {
    pub name: CString,
    pub kind: LeafKind,
    /// The source's directory, or `None` when `source_name` is absolute.
    pub source_dir: Option<Arc<DirFd>>,
    pub source_name: CString,
    /// Absolute path of the source, for symlinks and messages.
    pub source_path: PathBuf,
}

impl Leaf {
    fn source_fd(&self) -> BorrowedFd<'_> {
        self.source_dir
            .as_ref()
            .map_or(nix::fcntl::AT_FDCWD, |d| d.as_fd())
    }
}

/// Creates `leaf` in `dest`.
pub fn place(method: Method, leaf: &Leaf, dest: &DirFd) -> io::Result<Made> {
    match leaf.kind {
        LeafKind::Symlink => {
            let target = readlink_at(leaf.source_fd(), &leaf.source_name)?;
            dest.symlink_at(&target, &leaf.name)?;
            Ok(Made::CopiedSymlink)
        }
        LeafKind::Shared => symlink_to(&leaf.source_path, dest, &leaf.name),
        LeafKind::File => place_file(method, leaf, dest),
    }
}

fn place_file(method: Method, leaf: &Leaf, dest: &DirFd) -> io::Result<Made> {
    let (src, name) = (leaf.source_fd(), leaf.name.as_c_str());
    match method {
        Method::Symlink => symlink_to(&leaf.source_path, dest, name),
        Method::Hardlink => dest
            .link_at(src, &leaf.source_name, name)
            .map(|()| Made::Hardlink),
        Method::Clone => {
            sys::clone_file(src, &leaf.source_name, dest.as_fd(), name).map(|()| Made::Clone)
        }
        Method::Copy => copy_file(src, &leaf.source_name, dest, name).map(|()| Made::Copy),
        Method::Auto => match dest.link_at(src, &leaf.source_name, name) {
            Ok(()) => Ok(Made::Hardlink),
            Err(err) if may_fall_back(&err) => {
                match sys::clone_file(src, &leaf.source_name, dest.as_fd(), name) {
                    Ok(()) => Ok(Made::Clone),
                    Err(err) if may_fall_back(&err) => symlink_to(&leaf.source_path, dest, name),
                    Err(err) => Err(err),
                }
            }
            Err(err) => Err(err),
        },
    }
}

/// Errors that mean "this method cannot work for this pair of file
/// systems or this file", as opposed to a real failure.
pub(crate) fn may_fall_back(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(
            libc::EXDEV
                | libc::EPERM
                | libc::EMLINK
                | libc::EOPNOTSUPP
                | libc::EINVAL
                | libc::ENOTTY
                | libc::ENOSYS
        )
    )
}

fn symlink_to(target: &Path, dest: &DirFd, name: &CStr) -> io::Result<Made> {
    let target = c_name(target.as_os_str())?;
    dest.symlink_at(&target, name)?;
    Ok(Made::Symlink)
}

/// Copies file `src_name` of `src_dir` as new file `name` in `dest`, with
/// the source's mode; a failed copy leaves no file behind.
pub(crate) fn copy_file(
    src_dir: BorrowedFd<'_>,
    src_name: &CStr,
    dest: &DirFd,
    name: &CStr,
) -> io::Result<()> {
    let mut source = open_file_at(src_dir, src_name)?;
    let mode = std::os::unix::fs::MetadataExt::mode(&source.metadata()?);
    let mut target = dest.create_file(name, mode & 0o7777)?;
    if let Err(err) = io::copy(&mut source, &mut target) {
        drop(target);
        let _ = dest.unlink_at(name, false);
        return Err(err);
    }
    Ok(())
}
