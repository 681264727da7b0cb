//! Open file and directory handles.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::attr::FileKind;

const SHARDS: usize = 16;

/// Handles of one kind, by number.
pub struct HandleTable<T> {
    shards: Vec<Mutex<HashMap<u64, Arc<T>>>>,
    next: AtomicU64,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        HandleTable {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            next: AtomicU64::new(1),
        }
    }
}

impl<T> HandleTable<T> {
    fn shard(&self, fh: u64) -> &Mutex<HashMap<u64, Arc<T>>> {
        &self.shards[(fh as usize) % SHARDS]
    }

    pub fn insert(&self, value: T) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh).lock().insert(fh, Arc::new(value));
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<T>> {
        self.shard(fh).lock().get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<T>> {
        self.shard(fh).lock().remove(&fh)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

/// An open underlying file.
pub struct OpenFile {
    pub file: File,
    /// Whether the kernel may send writes through this handle.
    pub writable: bool,
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: OsString,
    pub ino: u64,
    pub kind: FileKind,
}

/// A directory listing taken when the directory was opened, so that
/// offsets stay meaningful while entries change.
pub struct OpenDir {
    pub entries: Vec<DirEntry>,
}
