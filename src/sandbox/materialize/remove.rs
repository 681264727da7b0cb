//! Deleting a tree the way GNU `rm -rf` does: each directory is opened
//! relative to its parent (O_NOFOLLOW, so a symlink is removed, never
//! entered), listed with `getdents`, and emptied with `unlinkat`; a `stat`
//! only when the file system does not give an entry's type, and a `chmod`
//! only when a removal is refused for lack of permission.

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::fcntl::OFlag;

use super::{is_denied, Error};
use crate::sandbox::dirfd::beneath::open_beneath;
use crate::sandbox::dirfd::{c_name, kind_of, Anchor, DirFd};
use crate::sandbox::file_kind::FileKind;

/// What a removal deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub dirs: usize,
    pub others: usize,
}

/// Removes `path` and everything below it. A symlink is removed as a link.
/// Refuses `/` and paths that end in `..` or `.`.
pub fn remove_tree(path: &Path) -> Result<Removed, Error> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Error::other(
            path,
            "refusing to remove a root or a path ending in '..'",
        ));
    };
    if path.components().next_back() == Some(Component::CurDir) {
        return Err(Error::other(
            path,
            "refusing to remove a path ending in '.'",
        ));
    }
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_dir = DirFd::open(parent).map_err(|e| Error::new("open", parent, e))?;
    let mut removed = Removed::default();
    let name = c_name(name).map_err(|e| Error::new("unlinkat", path, e))?;
    remove_entry(&parent_dir, parent, &name, None, &mut removed)?;
    Ok(removed)
}

/// Removes `rel` below the directory `root` pins, and everything below it,
/// resolving `rel` without following any symlink: a symlink swapped in
/// along the way fails the removal (ELOOP) instead of leading it elsewhere.
pub fn remove_beneath(root: &Anchor, rel: &Path) -> Result<Removed, Error> {
    let shown = root.path().join(rel);
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err(Error::other(
            &shown,
            "refusing to remove a pinned directory itself",
        ));
    };
    let parent_dir = if parent.as_os_str().is_empty() {
        DirFd::reopen(root)
    } else {
        let c = c_name(parent.as_os_str()).map_err(|e| Error::new("openat2", &shown, e))?;
        let root_fd = root.fd().map_err(|e| Error::new("open", root.path(), e))?;
        open_beneath(
            root_fd,
            &c,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .map(DirFd::from_owned)
    }
    .map_err(|e| Error::new("openat2", &shown, e))?;
    let mut removed = Removed::default();
    let name = c_name(name).map_err(|e| Error::new("unlinkat", &shown, e))?;
    let parent_path = root.path().join(parent);
    remove_entry(&parent_dir, &parent_path, &name, None, &mut removed)?;
    Ok(removed)
}

/// Removes `path` like [`remove_tree`], but only if it lies strictly inside
/// `base` (compared by components, after neither has `..`).
pub fn remove_tree_within(base: &Path, path: &Path) -> Result<Removed, Error> {
    let has_dotdot = |p: &Path| p.components().any(|c| c == Component::ParentDir);
    if has_dotdot(base) || has_dotdot(path) || !path.starts_with(base) || path == base {
        return Err(Error::other(
            path,
            &format!("refusing to remove a path that is not inside {base:?}"),
        ));
    }
    remove_tree(path)
}

/// Removes the entries of `dir` (at `dir_path`), leaving it empty. Entries
/// are removed while the listing streams, as `rm -rf` does: the kernel's
/// directory cursor is unaffected by removing names already returned.
pub fn empty_dir(dir: &DirFd, dir_path: &Path, removed: &mut Removed) -> Result<(), Error> {
    let mut listing = dir
        .entries()
        .map_err(|e| Error::new("opendir", dir_path, e))?;
    for item in listing.iter() {
        let (name, kind, _) = item.map_err(|e| Error::new("readdir", dir_path, e))?;
        remove_entry(dir, dir_path, &name, kind, removed)?;
    }
    Ok(())
}

/// Removes entry `name` of `parent`. Paths are only built for messages and
/// for descending, never per file.
pub(crate) fn remove_entry(
    parent: &DirFd,
    parent_path: &Path,
    name: &CStr,
    kind: Option<FileKind>,
    removed: &mut Removed,
) -> Result<(), Error> {
    let path = || parent_path.join(OsStr::from_bytes(name.to_bytes()));
    let kind = match kind {
        None => match parent.stat_at(name) {
            Ok(st) => kind_of(&st),
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(err) => return Err(Error::new("fstatat", &path(), err)),
        },
        Some(known) => known,
    };
    if kind == FileKind::Directory {
        let dir = match parent.open_at(name) {
            Ok(dir) => dir,
            // Not listable by us: grant ourselves access and retry once.
            Err(err) if is_denied(&err) => {
                // Never through a symlink swapped in meanwhile.
                parent
                    .make_child_owner_writable(name)
                    .map_err(|e| Error::new("fchmodat", &path(), e))?;
                parent
                    .open_at(name)
                    .map_err(|e| Error::new("openat", &path(), e))?
            }
            Err(err) => return Err(Error::new("openat", &path(), err)),
        };
        empty_dir_with_retry(&dir, &path(), removed)?;
        unlink_with_retry(parent, parent_path, name, true)?;
        removed.dirs += 1;
    } else {
        unlink_with_retry(parent, parent_path, name, false)?;
        removed.others += 1;
    }
    Ok(())
}

fn empty_dir_with_retry(dir: &DirFd, path: &Path, removed: &mut Removed) -> Result<(), Error> {
    match empty_dir(dir, path, removed) {
        Err(err) if err.is_denied() => {
            dir.make_owner_writable()
                .map_err(|e| Error::new("fchmod", path, e))?;
            empty_dir(dir, path, removed)
        }
        other => other,
    }
}

fn unlink_with_retry(
    parent: &DirFd,
    parent_path: &Path,
    name: &CStr,
    is_dir: bool,
) -> Result<(), Error> {
    let syscall = if is_dir {
        "unlinkat(AT_REMOVEDIR)"
    } else {
        "unlinkat"
    };
    let path = || parent_path.join(OsStr::from_bytes(name.to_bytes()));
    match parent.unlink_at(name, is_dir) {
        Ok(()) => Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(err) if is_denied(&err) => {
            parent
                .make_owner_writable()
                .map_err(|e| Error::new("fchmod", parent_path, e))?;
            parent
                .unlink_at(name, is_dir)
                .map_err(|e| Error::new(syscall, &path(), e))
        }
        Err(err) => Err(Error::new(syscall, &path(), err)),
    }
}
