//! Maps keyed by numbers (inode numbers, file handles) split over
//! mutex-guarded shards, so that operations on different keys rarely
//! contend for one lock: every FUSE request touches at least one of them.

use std::collections::HashMap;

use parking_lot::{Mutex, MutexGuard};

pub struct Sharded<V> {
    shards: Box<[Mutex<HashMap<u64, V>>]>,
}

impl<V> Sharded<V> {
    /// A map of `shards` shards (keys are spread by their low bits).
    pub fn new(shards: usize) -> Sharded<V> {
        Sharded {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    /// The locked shard that holds `key`.
    pub fn shard(&self, key: u64) -> MutexGuard<'_, HashMap<u64, V>> {
        self.shards[(key as usize) % self.shards.len()].lock()
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
            map.shard(key).insert(key, key * 2);
        }
        assert_eq!(map.len(), 100);
        assert_eq!(map.shard(42).get(&42), Some(&84));
        assert_eq!(map.shard(42).len(), 25, "keys spread by their low bits");
        map.shard(7).remove(&7);
        assert_eq!(map.len(), 99);
    }
}
