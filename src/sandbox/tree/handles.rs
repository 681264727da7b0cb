//! Open file and directory handles.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::attr::FileKind;
use crate::sandbox::sharded::Sharded;

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

/// One entry of a directory listing, as handed out.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'a> {
    pub name: &'a OsStr,
    pub ino: u64,
    pub kind: FileKind,
}

/// A directory's entries, names back to back in one buffer: a listing of
/// a million names is a few allocations, not a million.
#[derive(Default)]
pub struct Listing {
    names: Vec<u8>,
    entries: Vec<Listed>,
}

struct Listed {
    /// Where the name ends in `names` (it starts where the previous ends).
    end: usize,
    ino: u64,
    kind: FileKind,
}

impl Listing {
    pub fn push(&mut self, name: &OsStr, ino: u64, kind: FileKind) {
        self.names.extend_from_slice(name.as_bytes());
        self.entries.push(Listed {
            end: self.names.len(),
            ino,
            kind,
        });
    }

    /// The entries from index `start` on.
    pub fn from(&self, start: usize) -> impl Iterator<Item = DirEntry<'_>> {
        let mut name_start = match start.checked_sub(1) {
            Some(before) => self.entries.get(before).map_or(self.names.len(), |e| e.end),
            None => 0,
        };
        self.entries.iter().skip(start).map(move |listed| {
            let name = OsStr::from_bytes(&self.names[name_start..listed.end]);
            name_start = listed.end;
            DirEntry {
                name,
                ino: listed.ino,
                kind: listed.kind,
            }
        })
    }
}

/// A directory listing taken when the directory was opened, so that
/// offsets stay meaningful while entries change, and the directory itself
/// (none for a virtual one), kept open as long as the handle.
pub struct OpenDir {
    pub entries: Listing,
    pub fd: Option<OwnedFd>,
    pub ino: u64,
}
