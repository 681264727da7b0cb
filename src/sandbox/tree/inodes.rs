//! The inode table: the nodes the kernel knows, by inode number, with the
//! number of lookups the kernel holds on each.
//!
//! A read-only file or symlink mapped into many sandboxes (a build's inputs
//! are mapped into every action that uses them) is one inode, shared by
//! all of them: it is keyed by the underlying object's identity (device,
//! inode number) and version (size and times), so a file read in one
//! sandbox has its attributes and page cache, and its passthrough backing
//! file, ready in the next, and a file changed in place is a new inode. Its
//! lookup count is the sum over every name the kernel reached it by, and
//! FORGET settles it exactly. Operations on it go through the node of the
//! latest lookup, whose anchor stays pinned as long as the inode lives;
//! each checks that the object found there is still the one the inode
//! stands for.
//!
//! Sharded so that lookups of different inodes rarely share a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::node::Node;
use crate::sandbox::sharded::Sharded;

const SHARDS: usize = 64;

/// Inode number of the root directory, fixed by FUSE.
pub const ROOT_INO: u64 = 1;

/// (device, inode number) of an underlying object.
pub type Identity = (u64, u64);

/// An object at one version: its identity and the fingerprint of its
/// attributes (size, times). A file changed in place is a new version and
/// gets a new inode, with no cached pages: the kernel never serves the old
/// contents for it, and no cache needs dropping by the daemon.
type Version = (Identity, u64);

/// What the kernel was last shown of an inode of its own.
#[derive(Clone, Copy, Default)]
struct Shown {
    /// Fingerprint of the attributes (0: unknown).
    fingerprint: u64,
    /// The object they were of, where known.
    identity: Option<Identity>,
}

/// One inode the kernel knows.
enum Slot {
    /// A node of its own (its lookup count is kept in the node), and what
    /// the kernel was last shown of it (free in space: a shared slot is
    /// larger).
    Own(Arc<Node>, Shown),
    /// A read-only object shared by the nodes of many sandboxes.
    Shared(Shared),
}

struct Shared {
    /// The node of the latest lookup.
    node: Arc<Node>,
    identity: Identity,
    /// The version it was made for, its key in the table.
    version: u64,
    lookups: u64,
    /// Fingerprint of the contents at the last open (0: never opened), so
    /// that cached pages are kept only while unchanged.
    opened: u64,
    /// Fingerprint of the attributes last sent to the kernel, which it
    /// caches: a new sandbox may keep a destroyed one's entry for this
    /// inode only while the object still has them (`adoption`).
    reported: u64,
}

pub struct InodeTable {
    slots: Sharded<Slot>,
    shared: Sharded<u64, Version>,
    next_ino: AtomicU64,
}

/// What an inode number stands for.
pub struct Known {
    pub node: Arc<Node>,
    /// Set for a shared inode: the object it stands for.
    pub identity: Option<Identity>,
}

impl InodeTable {
    /// A table holding `root` as inode 1, never forgotten.
    pub fn new(root: Arc<Node>) -> InodeTable {
        let table = InodeTable {
            slots: Sharded::new(SHARDS),
            shared: Sharded::new(SHARDS),
            next_ino: AtomicU64::new(ROOT_INO + 1),
        };
        root.assign_ino(ROOT_INO);
        root.lookups.store(1, Ordering::Relaxed);
        table
            .slots
            .shard(&ROOT_INO)
            .insert(ROOT_INO, Slot::Own(root, Shown::default()));
        table
    }

    /// The node's own inode number, assigning one if it has none yet,
    /// without recording a lookup (for listings, which the kernel does not
    /// count).
    pub fn ino_of(&self, node: &Node) -> u64 {
        match node.ino() {
            0 => node.assign_ino(self.next_ino.fetch_add(1, Ordering::Relaxed)),
            ino => ino,
        }
    }

    /// Records one kernel lookup of `node` as its own inode and returns
    /// the number.
    pub fn remember(&self, node: &Arc<Node>) -> u64 {
        let ino = self.ino_of(node);
        let mut shard = self.slots.shard(&ino);
        shard
            .entry(ino)
            .or_insert_with(|| Slot::Own(node.clone(), Shown::default()));
        // Counted under the shard lock, as forget decrements it.
        let held = node.lookups.load(Ordering::Relaxed);
        node.lookups
            .store(held.saturating_add(1), Ordering::Relaxed);
        ino
    }

    /// Records one kernel lookup of the shared inode of `identity`, reached
    /// through `node`, with attributes of fingerprint `reported`, and
    /// returns its number (which `node` remembers: the inode its name
    /// stands for in the kernel).
    pub fn remember_shared(&self, node: &Arc<Node>, identity: Identity, reported: u64) -> u64 {
        let version = (identity, reported);
        // Lock order: the version's shard, then the slot's.
        let mut shared = self.shared.shard(&version);
        if let Some(&ino) = shared.get(&version) {
            if let Some(Slot::Shared(slot)) = self.slots.shard(&ino).get_mut(&ino) {
                slot.lookups += 1;
                slot.node = node.clone();
                slot.reported = reported;
                node.set_ino(ino);
                return ino;
            }
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        self.slots.shard(&ino).insert(
            ino,
            Slot::Shared(Shared {
                node: node.clone(),
                identity,
                version: reported,
                lookups: 1,
                opened: 0,
                reported,
            }),
        );
        shared.insert(version, ino);
        node.set_ino(ino);
        ino
    }

    /// Records that shared inode `ino`'s attributes were sent to the
    /// kernel again, with fingerprint `reported`; returns whether they
    /// changed since last sent (the object was changed in place).
    pub fn reported(&self, ino: u64, reported: u64) -> bool {
        match self.slots.shard(&ino).get_mut(&ino) {
            Some(Slot::Shared(slot)) => std::mem::replace(&mut slot.reported, reported) != reported,
            _ => false,
        }
    }

    /// Records that attributes of fingerprint `shown` were just sent to the
    /// kernel for `ino` (a lookup or getattr answer), which caches them.
    pub fn shown(&self, ino: u64, shown: u64) {
        match self.slots.shard(&ino).get_mut(&ino) {
            Some(Slot::Own(_, last)) => last.fingerprint = shown,
            Some(Slot::Shared(slot)) => slot.reported = shown,
            None => {}
        }
    }

    /// `shown`, for a lookup that found `identity` under the node's name.
    pub fn shown_object(&self, ino: u64, shown: u64, identity: Identity) {
        if let Some(Slot::Own(_, last)) = self.slots.shard(&ino).get_mut(&ino) {
            *last = Shown {
                fingerprint: shown,
                identity: Some(identity),
            };
        }
    }

    /// Whether `identity`, just found under `node`'s name, is the object the
    /// kernel was shown for the node (or nothing says otherwise). A file
    /// replaced underneath is another object and gets a node, and an
    /// inode, of its own, as on the underlying file system.
    pub fn same_object(&self, node: &Node, identity: Identity) -> bool {
        let ino = node.ino();
        match self.slots.shard(&ino).get(&ino) {
            Some(Slot::Own(_, shown)) => shown.identity.is_none_or(|known| known == identity),
            _ => true,
        }
    }

    /// At an open of `ino`, whose file now has fingerprint `now`: whether
    /// the attributes the kernel caches may be older (they were sent for
    /// another fingerprint, or it is not known for which). Records `now`
    /// as shown, since the caller then drops them.
    pub fn shown_stale(&self, ino: u64, now: u64) -> bool {
        match self.slots.shard(&ino).get_mut(&ino) {
            Some(Slot::Own(_, last)) => std::mem::replace(&mut last.fingerprint, now) != now,
            Some(Slot::Shared(slot)) => std::mem::replace(&mut slot.reported, now) != now,
            None => false,
        }
    }

    /// For a new sandbox taking over a destroyed one's kernel entries: if
    /// `ino` is a shared inode the kernel holds, with attributes last sent
    /// as `reported`, it is served through `node` from now on. False if
    /// the kernel's copy is stale or the inode is gone.
    pub fn adopt_shared(&self, ino: u64, reported: u64, node: &Arc<Node>) -> bool {
        match self.slots.shard(&ino).get_mut(&ino) {
            Some(Slot::Shared(slot)) if slot.reported == reported && slot.lookups > 0 => {
                slot.node = node.clone();
                node.set_ino(ino);
                true
            }
            _ => false,
        }
    }

    /// For a new sandbox taking over a destroyed one's kernel entries:
    /// inode `ino`, the kernel's for `from`, stands for `to` from now on,
    /// with the lookups the kernel holds. False if it no longer stands
    /// for `from`.
    pub fn adopt_own(&self, ino: u64, from: &Arc<Node>, to: &Arc<Node>) -> bool {
        let mut shard = self.slots.shard(&ino);
        let Some(slot) = shard.get_mut(&ino) else {
            return false;
        };
        match slot {
            Slot::Own(node, _) if Arc::ptr_eq(node, from) => {
                let held = from.lookups.swap(0, Ordering::Relaxed);
                if held == 0 || to.assign_ino(ino) != ino {
                    from.lookups.store(held, Ordering::Relaxed);
                    return false;
                }
                to.lookups.store(held, Ordering::Relaxed);
                *slot = Slot::Own(to.clone(), Shown::default());
                true
            }
            _ => false,
        }
    }

    pub fn get(&self, ino: u64) -> Option<Known> {
        match self.slots.shard(&ino).get(&ino)? {
            Slot::Own(node, _) => Some(Known {
                node: node.clone(),
                identity: None,
            }),
            Slot::Shared(slot) => Some(Known {
                node: slot.node.clone(),
                identity: Some(slot.identity),
            }),
        }
    }

    /// For a shared inode: records the fingerprint of the contents just
    /// opened and says whether it is the same as at the previous open.
    /// `None` for an inode of its own.
    pub fn reopened_same(&self, ino: u64, fingerprint: u64) -> Option<bool> {
        match self.slots.shard(&ino).get_mut(&ino)? {
            Slot::Own(..) => None,
            Slot::Shared(slot) => {
                Some(std::mem::replace(&mut slot.opened, fingerprint) == fingerprint)
            }
        }
    }

    /// Drops `count` kernel lookups; returns the node if the kernel no
    /// longer knows the inode.
    pub fn forget(&self, ino: u64, count: u64) -> Option<Arc<Node>> {
        if ino == ROOT_INO {
            return None;
        }
        let (node, version) = {
            let mut shard = self.slots.shard(&ino);
            let left = match shard.get_mut(&ino)? {
                Slot::Own(node, _) => {
                    let held = node.lookups.load(Ordering::Relaxed);
                    let left = held.saturating_sub(count.min(u32::MAX as u64) as u32);
                    node.lookups.store(left, Ordering::Relaxed);
                    u64::from(left)
                }
                Slot::Shared(slot) => {
                    slot.lookups = slot.lookups.saturating_sub(count);
                    slot.lookups
                }
            };
            if left > 0 {
                return None;
            }
            let removed = shard.remove(&ino);
            // Tables never shrink by themselves: after a large sandbox is
            // gone its inodes' slots would stay allocated for good.
            if shard.capacity() > 64 && shard.len() < shard.capacity() / 4 {
                let keep = shard.len() * 2;
                shard.shrink_to(keep);
            }
            match removed? {
                Slot::Own(node, _) => (node, None),
                Slot::Shared(slot) => (slot.node, Some((slot.identity, slot.version))),
            }
        };
        if let Some(version) = version {
            let mut shared = self.shared.shard(&version);
            // A new inode may stand for the version by now.
            if shared.get(&version) == Some(&ino) {
                shared.remove(&version);
            }
        }
        Some(node)
    }

    /// Number of inodes the kernel knows, root included.
    pub fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::tree::attr::FileKind;
    use crate::sandbox::tree::node::Origin;

    fn file_node() -> Arc<Node> {
        Arc::new(Node::new(FileKind::RegularFile, false, Origin::Virtual))
    }

    #[test]
    fn one_shared_inode_per_identity_with_exact_lookup_counts() {
        let root = Arc::new(Node::new(FileKind::Directory, false, Origin::Virtual));
        let table = InodeTable::new(root);
        let (a, b) = (file_node(), file_node());
        let ino = table.remember_shared(&a, (1, 7), 0);
        assert_eq!(
            table.remember_shared(&b, (1, 7), 0),
            ino,
            "same object, same inode"
        );
        assert_eq!(table.remember_shared(&b, (1, 7), 0), ino);
        assert_ne!(table.remember_shared(&a, (1, 8), 0), ino, "another object");
        let changed = table.remember_shared(&a, (1, 7), 9);
        assert_ne!(
            changed, ino,
            "the same object changed in place: a new inode"
        );
        assert!(table.forget(changed, 1).is_some());
        let known = table.get(ino).unwrap();
        assert!(
            Arc::ptr_eq(&known.node, &b),
            "served through the latest lookup"
        );
        assert_eq!(known.identity, Some((1, 7)));
        assert_eq!(table.reopened_same(ino, 42), Some(false));
        assert_eq!(table.reopened_same(ino, 42), Some(true));
        assert!(table.forget(ino, 2).is_none(), "one lookup left");
        assert!(table.forget(ino, 1).is_some());
        assert!(table.get(ino).is_none());
        let again = table.remember_shared(&a, (1, 7), 0);
        assert_ne!(again, ino, "a forgotten inode number is not reused");
        let own = table.remember(&file_node());
        assert_eq!(table.reopened_same(own, 1), None);
    }

    #[test]
    fn what_the_kernel_was_shown_tells_a_stale_cache_and_a_replaced_object() {
        let root = Arc::new(Node::new(FileKind::Directory, false, Origin::Virtual));
        let table = InodeTable::new(root);
        let node = file_node();
        let own = table.remember(&node);
        assert!(table.shown_stale(own, 5), "nothing recorded: may be stale");
        assert!(!table.shown_stale(own, 5), "as shown at the last open");
        table.shown_object(own, 6, (1, 7));
        assert!(table.shown_stale(own, 7), "changed since the lookup");
        assert!(table.same_object(&node, (1, 7)));
        assert!(!table.same_object(&node, (1, 8)), "replaced underneath");
        let shared = table.remember_shared(&file_node(), (1, 9), 3);
        assert!(!table.shown_stale(shared, 3), "as the lookup showed it");
        table.shown(shared, 4);
        assert!(table.shown_stale(shared, 5));
        assert!(!table.reported(shared, 5), "the open recorded it");
    }
}
