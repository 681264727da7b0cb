//! The inode table: the nodes the kernel knows, by inode number, with the
//! number of lookups the kernel holds on each.
//!
//! Sharded so that lookups of different inodes rarely share a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::node::Node;
use crate::sharded::Sharded;

const SHARDS: usize = 64;

/// Inode number of the root directory, fixed by FUSE.
pub const ROOT_INO: u64 = 1;

pub struct InodeTable {
    nodes: Sharded<Arc<Node>>,
    next_ino: AtomicU64,
}

impl InodeTable {
    /// A table holding `root` as inode 1, never forgotten.
    pub fn new(root: Arc<Node>) -> InodeTable {
        let table = InodeTable {
            nodes: Sharded::new(SHARDS),
            next_ino: AtomicU64::new(ROOT_INO + 1),
        };
        root.assign_ino(ROOT_INO);
        root.lookups.store(1, Ordering::Relaxed);
        table.nodes.shard(ROOT_INO).insert(ROOT_INO, root);
        table
    }

    /// The node's inode number, assigning one if it has none yet, without
    /// recording a lookup (for listings, which the kernel does not count).
    pub fn ino_of(&self, node: &Node) -> u64 {
        match node.ino() {
            0 => node.assign_ino(self.next_ino.fetch_add(1, Ordering::Relaxed)),
            ino => ino,
        }
    }

    /// Records one kernel lookup of `node` and returns its inode number.
    pub fn remember(&self, node: &Arc<Node>) -> u64 {
        let ino = self.ino_of(node);
        let mut shard = self.nodes.shard(ino);
        shard.entry(ino).or_insert_with(|| node.clone());
        // Counted under the shard lock, as forget decrements it.
        let held = node.lookups.load(Ordering::Relaxed);
        node.lookups
            .store(held.saturating_add(1), Ordering::Relaxed);
        ino
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Node>> {
        self.nodes.shard(ino).get(&ino).cloned()
    }

    /// Drops `count` kernel lookups; returns the node if the kernel no
    /// longer knows it.
    pub fn forget(&self, ino: u64, count: u64) -> Option<Arc<Node>> {
        if ino == ROOT_INO {
            return None;
        }
        let mut shard = self.nodes.shard(ino);
        let node = shard.get(&ino)?;
        let held = node.lookups.load(Ordering::Relaxed);
        let left = held.saturating_sub(count.min(u32::MAX as u64) as u32);
        node.lookups.store(left, Ordering::Relaxed);
        if left > 0 {
            return None;
        }
        let node = shard.remove(&ino);
        // Tables never shrink by themselves: after a large sandbox is gone
        // its inodes' slots would stay allocated for good.
        if shard.capacity() > 64 && shard.len() < shard.capacity() / 4 {
            let keep = shard.len() * 2;
            shard.shrink_to(keep);
        }
        node
    }

    /// Number of inodes the kernel knows, root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}
