//! Reading the tree: lookup, forget, attributes, symlinks, listings, statfs.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io::ErrorKind;
use std::os::unix::fs::DirEntryExt;
use std::sync::Arc;

use super::attr::{Attr, FileKind};
use super::errno::{Errno, FsResult};
use super::handles::{DirEntry, OpenDir};
use super::inodes::ROOT_INO;
use super::name::Name;
use super::node::{Node, Origin};
use super::{c_path, SandboxFs};
use crate::sys::check;

/// File-system statistics, as `statfs(2)` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

impl SandboxFs {
    /// Looks `name` up in directory `parent` and records the lookup.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        let parent = self.node(parent)?;
        let dir = parent.dir()?;
        if let Some(child) = dir.explicit(name) {
            let attr = self.attr_of(&child, self.inodes.ino_of(&child))?;
            self.inodes.remember(&child);
            return Ok(attr);
        }
        let Some(dir_path) = backing_dir(&parent)? else {
            return Err(Errno::ENOENT);
        };
        let meta = match std::fs::symlink_metadata(dir_path.join(name)) {
            Ok(meta) => meta,
            Err(err) => {
                if err.kind() == ErrorKind::NotFound {
                    dir.discovered().lock().remove(name);
                }
                return Err(err.into());
            }
        };
        let kind = FileKind::from_std(meta.file_type());
        let child = {
            let mut discovered = dir.discovered().lock();
            match discovered.get(name) {
                // Same name, same type: the same object as far as we can tell.
                Some(known) if known.kind() == kind => known.clone(),
                _ => {
                    let node = Arc::new(Node::new(
                        kind,
                        parent.is_writable(),
                        Origin::Child {
                            parent: Arc::downgrade(&parent),
                            name: Name::new(name),
                        },
                    ));
                    discovered.insert(name.to_owned(), node.clone());
                    node
                }
            }
        };
        let ino = self.inodes.remember(&child);
        Ok(Attr::from_metadata(ino, &meta))
    }

    /// The kernel dropped `count` lookups of `ino`.
    pub fn forget(&self, ino: u64, count: u64) {
        let Some(node) = self.inodes.forget(ino, count) else {
            return;
        };
        // A discovered node leaves its parent's cache with its last lookup,
        // so memory returns once the kernel forgets a subtree.
        if let Origin::Child { parent, name } = node.origin() {
            if let Some(parent) = parent.upgrade() {
                if let Ok(dir) = parent.dir() {
                    let mut discovered = dir.discovered().lock();
                    if discovered
                        .get(name.as_os_str())
                        .is_some_and(|n| Arc::ptr_eq(n, &node))
                    {
                        discovered.remove(name.as_os_str());
                    }
                }
            }
        }
    }

    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> FsResult<Attr> {
        if let Some(file) = fh.and_then(|fh| self.files.get(fh)) {
            return Ok(Attr::from_metadata(ino, &file.file.metadata()?));
        }
        let node = self.node(ino)?;
        self.attr_of(&node, ino)
    }

    /// Attributes of `node`, shown under `ino`.
    pub(super) fn attr_of(&self, node: &Node, ino: u64) -> FsResult<Attr> {
        let Some(path) = node.underlying_path()? else {
            return Ok(self.virtual_attr(node, ino));
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if !node.is_dir() || meta.is_dir() => Ok(Attr::from_metadata(ino, &meta)),
            // A directory made up for nested mappings whose underlying
            // counterpart is missing (or not a directory) stays virtual.
            Ok(_) if is_scaffold(node) => Ok(self.virtual_attr(node, ino)),
            Ok(_) => Err(Errno::ENOTDIR),
            Err(err) if err.kind() == ErrorKind::NotFound && is_scaffold(node) => {
                Ok(self.virtual_attr(node, ino))
            }
            Err(err) => Err(err.into()),
        }
    }

    fn virtual_attr(&self, node: &Node, ino: u64) -> Attr {
        let created = node
            .dir()
            .map(|d| d.created())
            .unwrap_or(std::time::UNIX_EPOCH);
        Attr::virtual_dir(ino, created, 2)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        use std::os::unix::ffi::OsStringExt;
        let node = self.node(ino)?;
        if node.kind() != FileKind::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(std::fs::read_link(node.require_path()?)?
            .into_os_string()
            .into_vec())
    }

    /// Opens directory `ino`: takes the listing that later reads page
    /// through. Explicit entries shadow underlying ones of the same name.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let node = self.node(ino)?;
        let dir = node.dir()?;
        let explicit = dir.explicit_entries();
        // Names of the same snapshot, for shadowing in one hash lookup each.
        let shadowing: HashSet<&OsStr> = explicit.iter().map(|(n, _)| n.as_os_str()).collect();
        let mut entries = Vec::with_capacity(explicit.len() + 2);
        entries.push(DirEntry {
            name: ".".into(),
            ino,
            kind: FileKind::Directory,
        });
        entries.push(DirEntry {
            name: "..".into(),
            ino: ROOT_INO,
            kind: FileKind::Directory,
        });
        for (name, child) in &explicit {
            entries.push(DirEntry {
                name: name.clone(),
                ino: self.inodes.ino_of(child),
                kind: child.kind(),
            });
        }
        if let Some(path) = backing_dir(&node)? {
            let listing = std::fs::read_dir(&path)?;
            let discovered = dir.discovered().lock();
            for entry in listing {
                let entry = entry?;
                let name = entry.file_name();
                if shadowing.contains(name.as_os_str()) {
                    continue;
                }
                // Inode numbers of names the kernel has not looked up are
                // informational only; the underlying one is as good as any.
                let ino = discovered
                    .get(&name)
                    .map(|n| n.ino())
                    .filter(|&ino| ino != 0)
                    .unwrap_or_else(|| entry.ino());
                entries.push(DirEntry {
                    name,
                    ino,
                    kind: FileKind::from_std(entry.file_type()?),
                });
            }
        }
        Ok(self.dirs.insert(OpenDir { entries }))
    }

    /// Entries of an open directory from position `offset` on. The position
    /// of the entry at index `i` is `i + 1`.
    pub fn readdir(&self, fh: u64, offset: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        let dir = self.dirs.get(fh).ok_or(Errno::EBADF)?;
        Ok(dir
            .entries
            .iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, e)| (i as u64 + 1, e.clone()))
            .collect())
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.remove(fh);
    }

    /// Statistics of the file system holding `ino`'s underlying object;
    /// zeros for a virtual directory.
    // statvfs counts are u32 on macOS and u64 on Linux.
    #[allow(clippy::useless_conversion)]
    pub fn statfs(&self, ino: u64) -> FsResult<StatFs> {
        let node = self.node(ino)?;
        let Some(path) = node.underlying_path()? else {
            return Ok(StatFs {
                bsize: 4096,
                frsize: 4096,
                namelen: 255,
                ..StatFs::default()
            });
        };
        let path = c_path(&path)?;
        // SAFETY: a zeroed statvfs is a valid out-parameter.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string and out-pointer.
        check(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
        Ok(StatFs {
            blocks: st.f_blocks.into(),
            bfree: st.f_bfree.into(),
            bavail: st.f_bavail.into(),
            files: st.f_files.into(),
            ffree: st.f_ffree.into(),
            bsize: st.f_bsize as u32,
            namelen: st.f_namemax as u32,
            frsize: st.f_frsize as u32,
        })
    }

    /// Names listed by `opendir` + `readdir`, for tests.
    pub fn list(&self, ino: u64) -> FsResult<Vec<OsString>> {
        let fh = self.opendir(ino)?;
        let names = self.readdir(fh, 0).map(|entries| {
            entries
                .into_iter()
                .map(|(_, e)| e.name)
                .filter(|n| n != "." && n != "..")
                .collect()
        });
        self.releasedir(fh);
        names
    }
}

/// The underlying directory whose entries `node` shows, if any. A
/// directory made up for nested mappings is backed only by a real directory
/// of the same name (checked with lstat: a symlink there is not followed).
pub(super) fn backing_dir(node: &Node) -> FsResult<Option<std::path::PathBuf>> {
    let Some(path) = node.underlying_path()? else {
        return Ok(None);
    };
    if is_scaffold(node) {
        let is_real_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        return Ok(is_real_dir.then_some(path));
    }
    Ok(Some(path))
}

/// A directory made up to hold nested mappings (it has explicit entries
/// but is not mapped itself). Discovered directories never have explicit
/// entries.
pub(super) fn is_scaffold(node: &Node) -> bool {
    !matches!(node.origin(), Origin::Mapped(_)) && node.dir().is_ok_and(|d| d.explicit_count() > 0)
}
