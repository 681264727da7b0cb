//! Descriptors per inode, for files the kernel opens without asking.
//!
//! With zero-message opens (the shell answers the first OPEN with ENOSYS),
//! the kernel sends no OPEN or RELEASE at all, and READ, WRITE, FSYNC and
//! FALLOCATE arrive with no handle. They are served from one descriptor per
//! inode and direction, opened at first use (resolved beneath the node's
//! anchor like everything else) and closed when the kernel forgets the
//! inode. The number kept open is bounded: past [`InodeFiles::cap`], the
//! shard being added to is emptied first (so the count stays within the
//! cap plus one per shard), and what it held is reopened on its next use.
//!
//! The same map keeps a descriptor of an object removed through the mount
//! while the kernel still knows its inode (it may be open: the kernel did
//! not say), so that `fstat` and friends on it keep working.

use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::sandbox::sharded::Sharded;

const SHARDS: usize = 16;

/// One inode's descriptors.
#[derive(Default, Clone)]
pub struct InodeFile {
    /// Opened for reading (or a removed object's pin).
    pub read: Option<Arc<File>>,
    /// Opened for writing.
    pub write: Option<Arc<File>>,
}

impl InodeFile {
    fn count(&self) -> usize {
        usize::from(self.read.is_some()) + usize::from(self.write.is_some())
    }
}

pub struct InodeFiles {
    files: Sharded<InodeFile>,
    open: AtomicUsize,
    cap: usize,
}

impl InodeFiles {
    /// A map keeping at most `cap` descriptors.
    pub fn new(cap: usize) -> InodeFiles {
        InodeFiles {
            files: Sharded::new(SHARDS),
            open: AtomicUsize::new(0),
            cap: cap.max(SHARDS),
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn get(&self, ino: u64) -> Option<InodeFile> {
        self.files.shard(&ino).get(&ino).cloned()
    }

    /// Keeps `file` as `ino`'s descriptor for `write` or reading; returns
    /// the one kept (another thread may have opened one first).
    pub fn keep(&self, ino: u64, write: bool, file: File) -> Arc<File> {
        let mut shard = self.files.shard(&ino);
        if self.open.load(Ordering::Relaxed) >= self.cap {
            let dropped: usize = shard.values().map(InodeFile::count).sum();
            shard.clear();
            self.open.fetch_sub(dropped, Ordering::Relaxed);
        }
        let entry = shard.entry(ino).or_default();
        let slot = if write {
            &mut entry.write
        } else {
            &mut entry.read
        };
        if let Some(kept) = slot {
            return kept.clone();
        }
        let kept = Arc::new(file);
        *slot = Some(kept.clone());
        self.open.fetch_add(1, Ordering::Relaxed);
        kept
    }

    /// Closes `ino`'s descriptors (the kernel forgot it).
    pub fn forget(&self, ino: u64) {
        if let Some(entry) = self.files.shard(&ino).remove(&ino) {
            self.open.fetch_sub(entry.count(), Ordering::Relaxed);
        }
    }

    /// Descriptors kept open now.
    pub fn len(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> File {
        tempfile::tempfile().unwrap()
    }

    #[test]
    fn one_descriptor_per_inode_and_direction_and_never_more_than_the_cap() {
        let files = InodeFiles::new(SHARDS * 2);
        let first = files.keep(1, false, file());
        let again = files.keep(1, false, file());
        assert!(Arc::ptr_eq(&first, &again), "the first one opened is kept");
        files.keep(1, true, file());
        assert_eq!(files.len(), 2);
        files.forget(1);
        assert_eq!(files.len(), 0);
        assert!(files.get(1).is_none());
        for ino in 0..1000 {
            files.keep(ino, false, file());
            let bound = files.cap() + SHARDS;
            assert!(files.len() <= bound, "{} > {bound}", files.len());
        }
    }
}
