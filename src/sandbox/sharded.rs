//! Maps split over mutex-guarded shards, so that operations on different
//! keys rarely contend for one lock: every FUSE request touches at least
//! one of them. Keys are inode numbers and file handles (spread by their
//! low bits) or file identities (device, inode).

use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::{Mutex, MutexGuard};

/// A key that says which shard it belongs in.
pub trait ShardKey: Hash + Eq {
    fn spread(&self) -> usize;
}

impl ShardKey for u64 {
    fn spread(&self) -> usize {
        *self as usize
    }
}

impl ShardKey for (u64, u64) {
    fn spread(&self) -> usize {
        // Inode numbers of one device differ in their low bits.
        (self.1 ^ self.0.rotate_left(32)) as usize
    }
}

impl ShardKey for ((u64, u64), u64) {
    fn spread(&self) -> usize {
        self.0.spread() ^ self.1 as usize
    }
}

pub struct Sharded<V, K = u64> {
    shards: Box<[Mutex<HashMap<K, V>>]>,
}

impl<K: ShardKey, V> Sharded<V, K> {
    /// A map of `shards` shards.
    pub fn new(shards: usize) -> Sharded<V, K> {
        Sharded {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    /// The locked shard that holds `key`.
    pub fn shard(&self, key: &K) -> MutexGuard<'_, HashMap<K, V>> {
        self.shards[key.spread() % self.shards.len()].lock()
    }

    /// Entries in all shards (each locked in turn, so only a snapshot).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_land_in_one_shard_each_and_are_counted_once() {
        let map = Sharded::new(4);
        for key in 0..100u64 {
            map.shard(&key).insert(key, key * 2);
        }
        assert_eq!(map.len(), 100);
        assert_eq!(map.shard(&42).get(&42), Some(&84));
        assert_eq!(map.shard(&42).len(), 25, "keys spread by their low bits");
        map.shard(&7).remove(&7);
        assert_eq!(map.len(), 99);
        let ids: Sharded<u64, (u64, u64)> = Sharded::new(8);
        ids.shard(&(1, 2)).insert((1, 2), 9);
        assert_eq!(ids.shard(&(1, 2)).get(&(1, 2)), Some(&9));
    }
}
