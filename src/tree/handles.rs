//! Open file and directory handles.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::attr::FileKind;
use crate::sharded::Sharded;

const SHARDS: usize = 16;

/// Handles of one kind, by number (0 is never one: FUSE sends it when the
/// kernel opened a file without asking).
pub struct HandleTable<T> {
    handles: Sharded<Arc<T>>,
    next: AtomicU64,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        HandleTable {
            handles: Sharded::new(SHARDS),
            next: AtomicU64::new(1),
        }
    }
}

impl<T> HandleTable<T> {
    /// Adds a handle; returns its number and the shared value.
    pub fn insert(&self, value: T) -> (u64, Arc<T>) {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        let value = Arc::new(value);
        self.handles.shard(&fh).insert(fh, value.clone());
        (fh, value)
    }

    pub fn get(&self, fh: u64) -> Option<Arc<T>> {
        self.handles.shard(&fh).get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<T>> {
        self.handles.shard(&fh).remove(&fh)
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }
}

/// An open underlying file.
pub struct OpenFile {
    pub file: File,
    /// Whether the kernel may send writes through this handle.
    pub writable: bool,
    /// The inode it was opened as.
    pub ino: u64,
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: OsString,
    pub ino: u64,
    pub kind: FileKind,
}

/// A directory listing taken when the directory was opened, so that
/// offsets stay meaningful while entries change, and the directory itself
/// (none for a virtual one), kept open as long as the handle.
pub struct OpenDir {
    pub entries: Vec<DirEntry>,
    pub fd: Option<OwnedFd>,
    pub ino: u64,
}
