//! What the kernel holds open, by inode.
//!
//! An operation on an inode that has an open handle is served from that
//! handle's descriptor, not by resolving the node's name again: the object
//! may have been deleted or renamed since it was opened (a temporary file
//! unlinked at once, a directory removed under a process sitting in it),
//! and `fstat`, `fchmod`, `fchown`, `futimens`, `ftruncate`, the `f*xattr`
//! calls and `fstatfs` on it must still work, as on any file system. A
//! deleted object reports a link count of 0. The kernel sends no handle
//! with GETATTR, SETATTR (unless the caller used the descriptor for a
//! truncate) or the xattr requests, so the core keeps this map itself.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use super::handles::{OpenDir, OpenFile};
use super::SandboxFs;

/// An open descriptor of an inode: an open handle's, or the inode's own
/// (zero-message opens, or an object removed while the kernel knew it).
#[derive(Clone)]
pub enum HeldFd {
    File(Arc<OpenFile>),
    Dir(Arc<OpenDir>),
    Inode(Arc<std::fs::File>),
}

impl HeldFd {
    /// The descriptor (`None` for a directory with no underlying one).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            HeldFd::File(file) => Some(file.file.as_fd()),
            HeldFd::Dir(dir) => dir.fd.as_ref().map(|fd| fd.as_fd()),
            HeldFd::Inode(file) => Some(file.as_fd()),
        }
    }

    /// Whether it was opened for writing (only files ever are).
    pub fn writable(&self) -> bool {
        matches!(self, HeldFd::File(file) if file.writable)
    }
}

/// One inode's open handles: one of their descriptors, and how many.
pub struct Held {
    fd: HeldFd,
    handles: usize,
}

impl SandboxFs {
    /// Counts a new open handle of `ino`.
    pub(super) fn hold(&self, ino: u64, fd: HeldFd) {
        if fd.fd().is_none() {
            return;
        }
        self.held
            .shard(&ino)
            .entry(ino)
            .and_modify(|held| held.handles += 1)
            .or_insert(Held { fd, handles: 1 });
    }

    /// A handle of `ino` was released.
    pub(super) fn unhold(&self, ino: u64) {
        let mut shard = self.held.shard(&ino);
        if let Some(held) = shard.get_mut(&ino) {
            held.handles -= 1;
            if held.handles == 0 {
                shard.remove(&ino);
            }
        }
    }

    /// An open descriptor of `ino`: the handle `fh` if the kernel gave
    /// one, else any handle of the inode.
    pub(super) fn open_handle(&self, ino: u64, fh: Option<u64>) -> Option<HeldFd> {
        if let Some(file) = fh.and_then(|fh| self.files.get(fh)) {
            return Some(HeldFd::File(file));
        }
        if let Some(held) = self.held.shard(&ino).get(&ino) {
            return Some(held.fd.clone());
        }
        let kept = self.inode_files.get(ino)?;
        kept.read.or(kept.write).map(HeldFd::Inode)
    }

    /// Before a name the kernel may have open without telling us is
    /// removed, keeps a descriptor of its object, so that operations on
    /// open descriptors of it keep working (zero-message opens only; with
    /// opens, the handles are known). Best effort: an object that cannot be
    /// opened (a symlink, no permission) is just removed.
    pub(super) fn pin_before_removal(
        &self,
        node: &super::node::Node,
        object: impl FnOnce() -> Option<std::fs::File>,
    ) {
        if !self.zero_message_opens() {
            return;
        }
        let ino = node.ino();
        if ino == 0 || self.inodes.get(ino).is_none() {
            return;
        }
        if let Some(file) = object() {
            self.inode_files.keep(ino, false, file);
        }
    }
}
