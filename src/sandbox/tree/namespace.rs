//! Reading the tree: lookup, forget, attributes, symlinks, listings, statfs.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::attr::{file_id, fingerprint};
use super::attr::{Attr, FileKind};
use super::error::{Errno, FsError, FsResult};
use super::handles::{DirEntry, Listing, OpenDir};
use super::held::HeldFd;
use super::inodes::ROOT_INO;
use super::name::Name;
use super::node::{Access, Location, Node, Origin};
use super::underlying::{self, UDir, UObj};
use super::SandboxFs;
use crate::sandbox::dirfd::kind_of;
use nix::sys::stat::FileStat;

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
            self.note_access(&child, Access::Lookup);
            self.note_access(&parent, Access::Read);
            // A mapped input is typed by its first lookup's lstat.
            let fresh = match child.typed_kind() {
                None => Some(type_entry(&child)?),
                Some(_) => None,
            };
            // Shared inodes would hide later sandboxes' accesses.
            if is_shareable(&child) && !self.tracks_access() {
                let st = match fresh {
                    Some(st) => st,
                    None => require_object(&child)?.stat()?,
                };
                let ino = self
                    .inodes
                    .remember_shared(&child, file_id(&st), fingerprint(&st));
                return Ok(self.shown(&child, Attr::from_stat(ino, &st)));
            }
            let (attr, shown) = self.fresh_attr_of(&child, self.inodes.ino_of(&child))?;
            let ino = self.inodes.remember(&child);
            self.inodes.shown(ino, shown);
            if parent.ino() == ROOT_INO {
                // A sandbox that took over a destroyed one's cache: the
                // kernel now holds its top directory by this name.
                self.forget_kernel_name(ino);
            }
            return Ok(attr);
        }
        let Some(backing) = backing_dir(&parent)? else {
            return Err(Errno::ENOENT.into());
        };
        // Something looked up inside a mapped directory uses it.
        self.note_access(&parent, Access::Read);
        let st = match backing.stat_entry(name) {
            Ok(st) => st,
            Err(err) => {
                if err.errno() == Errno::ENOENT {
                    dir.discovered().lock().remove(name);
                }
                return Err(err);
            }
        };
        let kind = kind_of(&st);
        let (child, ino) = {
            let mut discovered = dir.discovered().lock();
            let child = match discovered.get(name) {
                // Same name, same type, and for a non-directory the same
                // object (not one replaced underneath): the same node.
                Some(known)
                    if known.kind() == kind
                        && (known.is_dir() || self.inodes.same_object(known, file_id(&st))) =>
                {
                    known.clone()
                }
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
            };
            // Counted under the directory's lock, which `forget` takes
            // before it drops a node whose last lookup went: a forget
            // racing this lookup then either sees the new count and keeps
            // the node, or drops it before this lookup picks a node.
            let ino = self.inodes.remember(&child);
            (child, ino)
        };
        self.inodes
            .shown_object(ino, fingerprint(&st), file_id(&st));
        Ok(self.shown(&child, Attr::from_stat(ino, &st)))
    }

    /// After `lookup` answered ENOENT: whether the kernel may cache the
    /// absence of `name` in `parent` for the entry lifetime, as it caches
    /// names that exist (recorded, so that a sandbox taking over this
    /// directory's kernel entries drops it if it has that name). Never at
    /// the top, where sandboxes come and go by name.
    pub fn note_absent(&self, parent: u64, name: &OsStr) -> bool {
        if parent == ROOT_INO {
            return false;
        }
        self.node(parent)
            .ok()
            .and_then(|node| Some(node.dir().ok()?.note_negative(name)))
            .unwrap_or(false)
    }

    /// Attributes as the kernel may see them: a read-only file shows no
    /// write permission when opens do not reach the daemon, so that the
    /// kernel itself refuses to open it for writing (only a caller who
    /// bypasses permissions gets as far as a write, which is refused).
    fn shown(&self, node: &Node, mut attr: Attr) -> Attr {
        if !node.is_writable() && attr.kind == FileKind::RegularFile && self.zero_message_opens() {
            attr.perm &= !0o222;
        }
        attr
    }

    /// The kernel dropped `count` lookups of `ino`.
    pub fn forget(&self, ino: u64, count: u64) {
        let Some(node) = self.inodes.forget(ino, count) else {
            return;
        };
        self.inode_files.forget(ino);
        // A discovered node leaves its parent's cache with its last lookup,
        // so memory returns once the kernel forgets a subtree.
        if let Origin::Child { parent, name } = node.origin() {
            if let Some(parent) = parent.upgrade() {
                if let Ok(dir) = parent.dir() {
                    let mut discovered = dir.discovered().lock();
                    // Not if a lookup answered meanwhile took it again (it
                    // counts under this lock): the kernel holds it anew.
                    if discovered
                        .get(name.as_os_str())
                        .is_some_and(|n| Arc::ptr_eq(n, &node))
                        && node.lookups.load(Ordering::Relaxed) == 0
                    {
                        discovered.remove(name.as_os_str());
                    }
                }
            }
        }
    }

    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> FsResult<Attr> {
        let known = self.known(ino)?;
        if let Some(held) = self.open_handle(ino, fh) {
            if let Some(fd) = held.fd() {
                let st = nix::sys::stat::fstat(fd).map_err(|e| FsError::call("fstat", e))?;
                if known.identity.is_none() {
                    self.inodes.shown(ino, fingerprint(&st));
                } else if self.inodes.reported(ino, fingerprint(&st)) {
                    self.invalidate_data_later(ino);
                }
                return Ok(self.shown(&known.node, Attr::from_stat(ino, &st)));
            }
        }
        if let Some(identity) = known.identity {
            // A shared inode stands for one object: if its name now holds
            // another, this inode is stale (a new lookup finds the new one).
            let st = require_object(&known.node)?.stat()?;
            if file_id(&st) != identity {
                return Err(Errno::ESTALE.into());
            }
            if self.inodes.reported(ino, fingerprint(&st)) {
                // Changed in place while the kernel holds it: new lookups
                // get a new inode; this one's cached pages must go.
                self.invalidate_data_later(ino);
            }
            return Ok(self.shown(&known.node, Attr::from_stat(ino, &st)));
        }
        self.attr_of(&known.node, ino)
    }

    /// Attributes of `node`, shown under `ino` (which the kernel knows).
    pub(super) fn attr_of(&self, node: &Node, ino: u64) -> FsResult<Attr> {
        let (attr, shown) = self.fresh_attr_of(node, ino)?;
        self.inodes.shown(ino, shown);
        Ok(attr)
    }

    /// Attributes of `node` under `ino`, and the fingerprint of the
    /// underlying object's (0 for a virtual directory), for the caller to
    /// record as shown once the inode is in the table.
    fn fresh_attr_of(&self, node: &Node, ino: u64) -> FsResult<(Attr, u64)> {
        let scaffold = is_scaffold(node);
        let virtual_attr = || Ok((self.virtual_attr(node, ino), 0));
        let object = match underlying::object(node) {
            Ok(Some(object)) => object,
            Ok(None) => return virtual_attr(),
            // A directory made up for nested mappings whose underlying
            // counterpart is missing (or not a directory) stays virtual.
            Err(err) if scaffold && is_absent(&err) => return virtual_attr(),
            Err(err) => return Err(err),
        };
        match object.stat() {
            Ok(st) if !node.is_dir() || kind_of(&st) == FileKind::Directory => Ok((
                self.shown(node, Attr::from_stat(ino, &st)),
                fingerprint(&st),
            )),
            Ok(_) if scaffold => virtual_attr(),
            Ok(_) => Err(Errno::ENOTDIR.into()),
            Err(err) if scaffold && is_absent(&err) => virtual_attr(),
            Err(err) => Err(err),
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
        let node = self.node(ino)?;
        if node.kind() != FileKind::Symlink {
            return Err(Errno::EINVAL.into());
        }
        self.note_access(&node, Access::Read);
        require_object(&node)?.readlink()
    }

    /// Opens directory `ino`: takes the listing that later reads page
    /// through. Explicit entries shadow underlying ones of the same name.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let node = self.node(ino)?;
        let dir = node.dir()?;
        self.note_access(&node, Access::Read);
        let explicit = dir.explicit_entries();
        // Names of the same snapshot, for shadowing in one hash lookup each.
        let shadowing: HashSet<&OsStr> = explicit.iter().map(|(n, _)| n.as_os_str()).collect();
        let mut entries = Listing::default();
        entries.push(OsStr::new("."), ino, FileKind::Directory);
        entries.push(OsStr::new(".."), ROOT_INO, FileKind::Directory);
        for (name, child) in &explicit {
            // A mapped input not looked up yet is typed here; one whose
            // object cannot be reached is left out, as its lookup fails.
            let kind = match child.typed_kind() {
                Some(kind) => kind,
                None => match type_entry(child) {
                    Ok(_) => child.kind(),
                    Err(err) => {
                        log::debug!("{err}: {name:?} not listed");
                        continue;
                    }
                },
            };
            entries.push(name, self.inodes.ino_of(child), kind);
        }
        let mut kept = None;
        if let Some(backing) = backing_dir(&node)? {
            let opened = backing.open_listing()?;
            let mut listing = opened
                .entries()
                .map_err(|e| FsError::call("fdopendir", e))?;
            let discovered = dir.discovered().lock();
            // Most listed directories have neither: skip the lookups.
            let (shadows, known) = (!shadowing.is_empty(), !discovered.is_empty());
            for item in listing.iter() {
                let (name, kind, d_ino) = item.map_err(|e| FsError::call("readdir", e))?;
                let name = OsStr::from_bytes(name.to_bytes());
                if shadows && shadowing.contains(name) {
                    continue;
                }
                // Inode numbers of names the kernel has not looked up are
                // informational only; the underlying one is as good as any.
                let ino = if known {
                    discovered
                        .get(name)
                        .map(|n| n.ino())
                        .filter(|&ino| ino != 0)
                        .unwrap_or(d_ino)
                } else {
                    d_ino
                };
                let kind = match kind {
                    Some(kind) => kind,
                    None => kind_of(&backing.stat_entry(name)?),
                };
                entries.push(name, ino, kind);
            }
            // Kept while the handle is open: what is done to the directory
            // by descriptor is done to it even after it is removed.
            drop(listing);
            kept = Some(opened.into_owned());
        }
        let (fh, open) = self.dirs.insert(OpenDir {
            entries,
            fd: kept,
            ino,
        });
        self.hold(ino, HeldFd::Dir(open));
        Ok(fh)
    }

    /// Hands the entries of an open directory from position `offset` on to
    /// `add`, with the position of the entry after each, until `add` says
    /// the reply is full. The position of the entry at index `i` is `i + 1`.
    /// A call costs what it hands out, not what is left: a listing read in
    /// many batches stays linear in its length.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, DirEntry<'_>) -> bool,
    ) -> FsResult<()> {
        let dir = self.dirs.get(fh).ok_or(FsError::refused(Errno::EBADF))?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        // Entries first: a position past the end yields none, and no
        // position is counted past u64::MAX.
        for (entry, next) in dir.entries.from(start).zip(offset.saturating_add(1)..) {
            if add(next, entry) {
                break;
            }
        }
        Ok(())
    }

    pub fn releasedir(&self, fh: u64) {
        if let Some(dir) = self.dirs.remove(fh) {
            self.unhold(dir.ino);
        }
    }

    /// Statistics of the file system holding `ino`'s underlying object;
    /// zeros for a virtual directory.
    // statvfs counts are u32 on macOS and u64 on Linux.
    #[allow(clippy::useless_conversion)]
    pub fn statfs(&self, ino: u64) -> FsResult<StatFs> {
        let st = match self.open_handle(ino, None) {
            Some(held) if held.fd().is_some() => {
                nix::sys::statvfs::fstatvfs(held.fd().expect("checked"))
                    .map_err(|e| FsError::call("fstatvfs", e))?
            }
            _ => {
                let node = self.node(ino)?;
                let Some(object) = present_object(&node)? else {
                    return Ok(StatFs {
                        bsize: 4096,
                        frsize: 4096,
                        namelen: 255,
                        ..StatFs::default()
                    });
                };
                object.on_pinned("fstatvfs", |pinned| {
                    Ok(nix::sys::statvfs::fstatvfs(pinned)?)
                })?
            }
        };
        Ok(StatFs {
            blocks: st.blocks().into(),
            bfree: st.blocks_free().into(),
            bavail: st.blocks_available().into(),
            files: st.files().into(),
            ffree: st.files_free().into(),
            bsize: st.block_size() as u32,
            namelen: st.name_max() as u32,
            frsize: st.fragment_size() as u32,
        })
    }

    /// Names listed by `opendir` + `readdir`, for tests.
    pub fn list(&self, ino: u64) -> FsResult<Vec<OsString>> {
        let fh = self.opendir(ino)?;
        let mut names = Vec::new();
        let listed = self.readdir(fh, 0, |_, entry| {
            if entry.name != OsStr::new(".") && entry.name != OsStr::new("..") {
                names.push(entry.name.to_owned());
            }
            false
        });
        self.releasedir(fh);
        listed.map(|()| names)
    }
}

/// The underlying object of `node`; ENOENT for a virtual directory.
pub(super) fn require_object(node: &Node) -> FsResult<UObj> {
    underlying::object(node)?.ok_or(Errno::ENOENT.into())
}

/// The underlying object of `node`, or `None` where it shows none: a
/// virtual directory, or one made up for nested mappings whose
/// underlying counterpart is not a directory there.
pub(super) fn present_object(node: &Node) -> FsResult<Option<UObj>> {
    let object = match underlying::object(node) {
        Err(err) if is_scaffold(node) && is_absent(&err) => return Ok(None),
        other => other?,
    };
    match object {
        Some(object) if is_scaffold(node) => match object.stat() {
            Ok(st) if kind_of(&st) == FileKind::Directory => Ok(Some(object)),
            Ok(_) => Ok(None),
            Err(err) if is_absent(&err) => Ok(None),
            Err(err) => Err(err),
        },
        other => Ok(other),
    }
}

/// Whether an error means the object is not there as a directory: nothing,
/// a non-directory or a symlink. A directory made up for nested mappings
/// shows no underlying entries then.
fn is_absent(err: &FsError) -> bool {
    matches!(err.errno(), Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP)
}

/// The underlying directory whose entries `node` shows, if any. A
/// directory made up for nested mappings is backed only by a real directory
/// of the same name (never through a symlink: resolution refuses them).
pub(super) fn backing_dir(node: &Node) -> FsResult<Option<UDir>> {
    match underlying::directory(node) {
        Err(err) if is_scaffold(node) && is_absent(&err) => Ok(None),
        other => other,
    }
}

/// Whether a node is served as the inode shared by every sandbox that maps
/// its object: a read-only file or symlink fixed by a mapping. (Objects
/// found below a mapped directory keep inodes of their own: their nodes
/// need their sandbox's directories to reach them.)
pub(super) fn is_shareable(node: &Node) -> bool {
    !node.is_writable()
        && matches!(
            node.typed_kind(),
            Some(FileKind::RegularFile | FileKind::Symlink)
        )
        && node.is_mapped()
}

/// [`is_shareable`], or may be once typed: a read-only mapped input the
/// kernel has not looked up.
pub(super) fn may_be_shareable(node: &Node) -> bool {
    is_shareable(node) || (node.typed_kind().is_none() && !node.is_writable() && node.is_mapped())
}

/// Types `node`, an untyped mapped input, from an `lstat` of its object,
/// and returns that `lstat`. A directory is pinned then, as a mapped
/// directory always is, so that it stays the one found.
pub(super) fn type_entry(node: &Node) -> FsResult<FileStat> {
    let object = require_object(node)?;
    let st = object.stat()?;
    let kind = kind_of(&st);
    let pinned = match (kind, node.origin()) {
        (FileKind::Directory, Origin::Mapped(location)) => {
            let name = location.name.as_os_str();
            let path = location.anchor.path().join(name);
            let dir = location
                .anchor
                .child(object.name(), &path)
                .map_err(|err| FsError::at("openat", err, &location.anchor, name.as_bytes()))?;
            Some(Origin::Mapped(Location {
                anchor: Arc::new(dir),
                name: Name::new(OsStr::new("")),
            }))
        }
        _ => None,
    };
    node.set_type(kind, pinned);
    Ok(st)
}

/// A directory made up to hold nested mappings (it has explicit entries
/// but is not mapped itself). Discovered directories never have explicit
/// entries.
pub(super) fn is_scaffold(node: &Node) -> bool {
    !matches!(node.origin(), Origin::Mapped(_)) && node.dir().is_ok_and(|d| d.explicit_count() > 0)
}
