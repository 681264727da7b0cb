//! The store's index: which digests it holds, their sizes, their pins, and
//! the order of their last use, in 56 bytes an entry plus 5 bytes a table
//! bucket (a million digests: about 66 MiB).
//!
//! Entries live in a slab (`slots`, reused through a free list); the hash
//! table holds only slot numbers and compares through the slab. Unpinned
//! entries form a doubly linked list by slot number, least recently used
//! at the head: a use moves an entry to the tail, a pin takes it off the
//! list (a pinned entry is never evicted) and the last unpin puts it back
//! at the tail, so eviction takes the head without searching. Each sandbox
//! keeps the sorted slot numbers it pinned, each once: an entry's pin count
//! is the number of sandboxes using it, and a pinned slot cannot be freed,
//! so its number stays valid until the unpin. Nothing here does I/O.

use std::collections::HashMap;
use std::sync::Arc;

use hashbrown::HashTable;

use super::digest::Digest;

/// No slot: the end of a list.
const NIL: u32 = u32::MAX;

const LIVE: u8 = 1;
const DIRECTORY: u8 = 2;
const SINGLE_USE: u8 = 4;
/// A sandbox pinned the entry since it was last pushed.
const USED: u8 = 8;
/// The executable variant exists.
const EXECUTABLE: u8 = 16;

/// The two namespaces: file content and directory blobs (an empty file
/// and an empty directory message have the same digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Content,
    Directory,
}

impl Kind {
    fn flag(self) -> u8 {
        match self {
            Kind::Content => 0,
            Kind::Directory => DIRECTORY,
        }
    }

    fn hash(self, digest: &Digest) -> u64 {
        match self {
            Kind::Content => digest.spread(),
            Kind::Directory => digest.spread() ^ 0x9e37_79b9_7f4a_7c15,
        }
    }
}

struct Slot {
    digest: Digest,
    /// Bytes of the content file or the blob.
    size: u64,
    /// LRU neighbours while unpinned; `next` chains the free list.
    prev: u32,
    next: u32,
    /// Sandboxes pinning the entry.
    pins: u32,
    flags: u8,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 56);

impl Slot {
    fn kind(&self) -> Kind {
        if self.flags & DIRECTORY != 0 {
            Kind::Directory
        } else {
            Kind::Content
        }
    }
}

/// An entry taken out of the index, whose files the caller removes.
#[derive(Debug)]
pub struct Removed {
    pub digest: Digest,
    pub kind: Kind,
    pub executable: bool,
}

#[derive(Default)]
pub struct Index {
    table: HashTable<u32>,
    slots: Vec<Slot>,
    free: Option<u32>,
    head: Option<u32>,
    tail: Option<u32>,
    blobs: HashMap<u32, Arc<[u8]>>,
    sandboxes: HashMap<Box<str>, Vec<u32>>,
    bytes: u64,
    entries: usize,
    pinned: usize,
}

fn opt(slot: u32) -> Option<u32> {
    (slot != NIL).then_some(slot)
}

impl Index {
    /// Bytes held: content files (their executable variants counted again)
    /// and directory blobs.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Entries some sandbox pins.
    pub fn pinned(&self) -> usize {
        self.pinned
    }

    pub fn find(&self, digest: &Digest, kind: Kind) -> Option<u32> {
        let flag = kind.flag();
        self.table
            .find(kind.hash(digest), |&s| {
                let slot = &self.slots[s as usize];
                slot.digest == *digest && slot.flags & DIRECTORY == flag
            })
            .copied()
    }

    /// Adds an entry that is not there, as the most recently used.
    pub fn insert(&mut self, digest: Digest, kind: Kind, size: u64, single_use: bool) -> u32 {
        debug_assert!(self.find(&digest, kind).is_none());
        let slot = Slot {
            digest,
            size,
            prev: NIL,
            next: NIL,
            pins: 0,
            flags: LIVE | kind.flag() | if single_use { SINGLE_USE } else { 0 },
        };
        let index = match self.free {
            Some(index) => {
                self.free = opt(self.slots[index as usize].next);
                self.slots[index as usize] = slot;
                index
            }
            None => {
                let index = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| i != NIL)
                    .expect("content store index: more than 2^32 - 1 entries");
                self.slots.push(slot);
                index
            }
        };
        let slots = &self.slots;
        self.table.insert_unique(kind.hash(&digest), index, |&s| {
            let slot = &slots[s as usize];
            slot.kind().hash(&slot.digest)
        });
        self.link_tail(index);
        self.bytes += size;
        self.entries += 1;
        index
    }

    pub fn blob(&self, slot: u32) -> Option<Arc<[u8]>> {
        self.blobs.get(&slot).cloned()
    }

    pub fn set_blob(&mut self, slot: u32, blob: Arc<[u8]>) {
        self.blobs.insert(slot, blob);
    }

    /// Marks a use: an unpinned entry becomes the most recently used.
    pub fn touch(&mut self, slot: u32) {
        if self.slots[slot as usize].pins == 0 {
            self.unlink(slot);
            self.link_tail(slot);
        }
    }

    /// A push of an entry already held: a use, and a retention again. Keep
    /// wins over single use; a single-use entry pushed again is not spent
    /// until a sandbox pins it after this push.
    pub fn repush(&mut self, slot: u32, single_use: bool) {
        let flags = &mut self.slots[slot as usize].flags;
        if !single_use {
            *flags &= !SINGLE_USE;
        } else if *flags & SINGLE_USE != 0 {
            *flags &= !USED;
        }
        self.touch(slot);
    }

    /// Whether `slot` holds content `digest` (with its executable variant,
    /// if `executable`): a slot freed and reused holds another.
    pub fn holds(&self, slot: u32, digest: &Digest, executable: bool) -> bool {
        self.slots.get(slot as usize).is_some_and(|entry| {
            entry.flags & LIVE != 0
                && entry.flags & DIRECTORY == 0
                && entry.digest == *digest
                && (!executable || entry.flags & EXECUTABLE != 0)
        })
    }

    pub fn is_executable(&self, slot: u32) -> bool {
        self.slots[slot as usize].flags & EXECUTABLE != 0
    }

    /// Records the executable variant, whose bytes count as well.
    pub fn set_executable(&mut self, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        if entry.flags & EXECUTABLE == 0 {
            entry.flags |= EXECUTABLE;
            self.bytes += entry.size;
        }
    }

    /// The least recently used unpinned entry.
    pub fn lru_head(&self) -> Option<u32> {
        self.head
    }

    /// The unpinned content entries kept until evicted (not single-use),
    /// least recently used first: digest, size, executable variant made.
    pub fn kept_content(&self) -> Vec<(Digest, u64, bool)> {
        let mut kept = Vec::new();
        let mut at = self.head;
        while let Some(slot) = at {
            let entry = &self.slots[slot as usize];
            if entry.flags & (DIRECTORY | SINGLE_USE) == 0 {
                kept.push((entry.digest, entry.size, entry.flags & EXECUTABLE != 0));
            }
            at = opt(entry.next);
        }
        kept
    }

    /// The directory blobs held, least recently used first.
    pub fn directory_blobs(&self) -> Vec<Arc<[u8]>> {
        let mut blobs = Vec::new();
        let mut at = self.head;
        while let Some(slot) = at {
            let entry = &self.slots[slot as usize];
            if entry.flags & DIRECTORY != 0 {
                blobs.extend(self.blobs.get(&slot).cloned());
            }
            at = opt(entry.next);
        }
        blobs
    }

    /// Whether an unpinned single-use entry has served its sandbox.
    pub fn is_spent(&self, slot: u32) -> bool {
        let entry = &self.slots[slot as usize];
        entry.pins == 0 && entry.flags & (SINGLE_USE | USED) == SINGLE_USE | USED
    }

    /// Takes an unpinned entry out.
    pub fn remove(&mut self, slot: u32) -> Removed {
        let entry = &self.slots[slot as usize];
        assert!(entry.flags & LIVE != 0 && entry.pins == 0);
        let (digest, kind) = (entry.digest, entry.kind());
        let executable = entry.flags & EXECUTABLE != 0;
        self.bytes -= entry.size * if executable { 2 } else { 1 };
        self.unlink(slot);
        match self.table.find_entry(kind.hash(&digest), |&s| s == slot) {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("content store index: slot {slot} not in the table"),
        }
        if kind == Kind::Directory {
            self.blobs.remove(&slot);
        }
        let entry = &mut self.slots[slot as usize];
        entry.flags = 0;
        entry.next = self.free.unwrap_or(NIL);
        self.free = Some(slot);
        self.entries -= 1;
        Removed {
            digest,
            kind,
            executable,
        }
    }

    /// Pins `slots` for `sandbox`, those it does not pin already, each
    /// once; returns the ones newly pinned.
    pub fn pin(&mut self, sandbox: &str, slots: &[u32]) -> Vec<u32> {
        let mut new = slots.to_vec();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return new;
        }
        match self.sandboxes.get_mut(sandbox) {
            Some(held) => {
                new.retain(|s| held.binary_search(s).is_err());
                held.extend_from_slice(&new);
                held.sort_unstable();
            }
            None => {
                self.sandboxes.insert(sandbox.into(), new.clone());
            }
        }
        for &slot in &new {
            let entry = &mut self.slots[slot as usize];
            entry.pins += 1;
            entry.flags |= USED;
            if entry.pins == 1 {
                self.pinned += 1;
                self.unlink(slot);
            }
        }
        new
    }

    /// Unpins what `sandbox` pinned (everything, or those of `only`, a
    /// sorted list); returns the entries that no sandbox pins any more, now
    /// the most recently used.
    pub fn unpin(&mut self, sandbox: &str, only: Option<&[u32]>) -> Vec<u32> {
        let slots = match only {
            None => self.sandboxes.remove(sandbox).unwrap_or_default(),
            Some(only) => {
                let Some(held) = self.sandboxes.get_mut(sandbox) else {
                    return Vec::new();
                };
                let mut taken = Vec::new();
                held.retain(|s| {
                    let take = only.binary_search(s).is_ok();
                    if take {
                        taken.push(*s);
                    }
                    !take
                });
                if held.is_empty() {
                    self.sandboxes.remove(sandbox);
                }
                taken
            }
        };
        let mut unpinned = Vec::new();
        for slot in slots {
            let entry = &mut self.slots[slot as usize];
            entry.pins -= 1;
            if entry.pins == 0 {
                self.pinned -= 1;
                self.link_tail(slot);
                unpinned.push(slot);
            }
        }
        unpinned
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let entry = &self.slots[slot as usize];
            (opt(entry.prev), opt(entry.next))
        };
        if prev.is_none() && next.is_none() && self.head != Some(slot) {
            return; // not on the list
        }
        match prev {
            Some(prev) => self.slots[prev as usize].next = next.unwrap_or(NIL),
            None => self.head = next,
        }
        match next {
            Some(next) => self.slots[next as usize].prev = prev.unwrap_or(NIL),
            None => self.tail = prev,
        }
        let entry = &mut self.slots[slot as usize];
        entry.prev = NIL;
        entry.next = NIL;
    }

    fn link_tail(&mut self, slot: u32) {
        let tail = self.tail;
        {
            let entry = &mut self.slots[slot as usize];
            entry.prev = tail.unwrap_or(NIL);
            entry.next = NIL;
        }
        match tail {
            Some(tail) => self.slots[tail as usize].next = slot,
            None => self.head = Some(slot),
        }
        self.tail = Some(slot);
    }

    /// The unpinned entries from least to most recently used (tests).
    #[cfg(test)]
    pub fn lru_order(&self) -> Vec<Digest> {
        let mut out = Vec::new();
        let mut at = self.head;
        while let Some(slot) = at {
            out.push(self.slots[slot as usize].digest);
            at = opt(self.slots[slot as usize].next);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> Digest {
        Digest::of(&[n])
    }

    #[test]
    fn lru_follows_use_and_skips_pinned_entries() {
        let mut index = Index::default();
        let a = index.insert(d(1), Kind::Content, 10, false);
        let b = index.insert(d(2), Kind::Content, 20, false);
        let c = index.insert(d(3), Kind::Directory, 30, false);
        assert_eq!(index.lru_order(), [d(1), d(2), d(3)]);
        index.touch(a);
        assert_eq!(index.lru_order(), [d(2), d(3), d(1)]);
        assert_eq!(index.pin("s", &[b, b]), [b]);
        assert_eq!(index.pin("t", &[b]), [b]);
        assert_eq!(index.pin("s", &[b]), Vec::<u32>::new());
        assert_eq!(index.pinned(), 1);
        assert_eq!(index.lru_order(), [d(3), d(1)]);
        assert_eq!(index.unpin("s", None), Vec::<u32>::new());
        assert_eq!(index.unpin("t", None), [b]);
        assert_eq!(index.lru_order(), [d(3), d(1), d(2)]);
        assert_eq!(index.bytes(), 60);
        let removed = index.remove(c);
        assert_eq!((removed.digest, removed.kind), (d(3), Kind::Directory));
        assert_eq!(index.lru_order(), [d(1), d(2)]);
        assert_eq!((index.bytes(), index.entries()), (30, 2));
        // The freed slot is reused; the table finds entries by kind.
        let again = index.insert(d(1), Kind::Directory, 5, false);
        assert_eq!(again, c);
        assert_eq!(index.find(&d(1), Kind::Content), Some(a));
        assert_eq!(index.find(&d(1), Kind::Directory), Some(c));
        assert_eq!(index.find(&d(3), Kind::Directory), None);
    }

    #[test]
    fn single_use_is_spent_after_a_pin_since_its_last_push() {
        let mut index = Index::default();
        let a = index.insert(d(1), Kind::Content, 1, true);
        assert!(!index.is_spent(a));
        index.pin("s", &[a]);
        assert!(!index.is_spent(a), "pinned");
        index.repush(a, true);
        assert_eq!(index.unpin("s", None), [a]);
        assert!(!index.is_spent(a), "pushed again while pinned");
        index.pin("t", &[a]);
        index.unpin("t", None);
        assert!(index.is_spent(a));
        index.repush(a, false);
        assert!(!index.is_spent(a), "keep wins");
    }

    #[test]
    fn unpin_only_some_keeps_the_rest() {
        let mut index = Index::default();
        let a = index.insert(d(1), Kind::Content, 1, false);
        let b = index.insert(d(2), Kind::Content, 1, false);
        index.pin("s", &[a]);
        let new = index.pin("s", &[a, b]);
        assert_eq!(new, [b]);
        assert_eq!(index.unpin("s", Some(&new)), [b]);
        assert_eq!(index.pinned(), 1);
        assert_eq!(index.unpin("s", None), [a]);
        assert_eq!(index.pinned(), 0);
    }
}
