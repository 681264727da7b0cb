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

/// An open descriptor of an inode, shared with the handle that opened it.
#[derive(Clone)]
pub enum HeldFd {
    File(Arc<OpenFile>),
    Dir(Arc<OpenDir>),
}

impl HeldFd {
    /// The descriptor (`None` for a directory with no underlying one).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            HeldFd::File(file) => Some(file.file.as_fd()),
            HeldFd::Dir(dir) => dir.fd.as_ref().map(|fd| fd.as_fd()),
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
            .shard(ino)
            .entry(ino)
            .and_modify(|held| held.handles += 1)
            .or_insert(Held { fd, handles: 1 });
    }

    /// A handle of `ino` was released.
    pub(super) fn unhold(&self, ino: u64) {
        let mut shard = self.held.shard(ino);
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
        self.held.shard(ino).get(&ino).map(|held| held.fd.clone())
    }
}
