//! The block directory: every block the allocator holds, by address, and whose books hold it.
//!
//! A block released on another thread than the one that took it, or a pointer the allocator
//! never handed out, must be found without visiting every thread cache (that cost grew with
//! the number of threads). The directory answers "which cache's books hold this address?" in
//! one look-up of one shard. It changes only on slow paths: a block taken from or given back to
//! the system, moved into the shared pool, or moved from the pool or another thread's cache
//! into a thread cache. A cache-hit `allocate` and a same-thread `release` never touch it.
//!
//! Invariant: every block the allocator holds (live, scoped or idle) has an entry; its home is
//! the thread cache whose books hold it, or `None` for the shared pool. A home is written while
//! the block is in nobody's books (taken out of one place, not yet put into the next) or under
//! the lock of the place it goes into, so a reader that finds home `H` and then locks `H` sees
//! the block in `H`'s books if and only if it is still there.

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

use crate::sync::{lock, Arc, Mutex};
use crate::thread_cache::ThreadCache;

/// Shards: enough that threads moving blocks at once rarely meet on one lock.
const SHARDS: usize = 32;

/// Where a block's bookkeeping is: a thread cache, or the shared pool (`None`).
pub(crate) type Home = Option<Arc<ThreadCache>>;

/// Block addresses are at least 64-byte aligned: Fibonacci hashing of `addr >> 6`.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, addr: usize) {
        self.0 = ((addr as u64) >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Shard = HashMap<usize, Home, BuildHasherDefault<AddrHasher>>;

pub(crate) struct Directory {
    shards: Box<[Mutex<Shard>]>,
}

impl Directory {
    pub(crate) fn new() -> Self {
        Directory {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, addr: usize) -> &Mutex<Shard> {
        let h = ((addr as u64) >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 59) as usize % SHARDS]
    }

    /// Records a block just taken from the system, homed in `home`.
    pub(crate) fn insert(&self, addr: usize, home: Home) {
        let previous = lock(self.shard(addr)).insert(addr, home);
        debug_assert!(previous.is_none(), "block {addr:#x} entered twice");
    }

    /// Records that the block at `addr` now lives in `home`'s books.
    pub(crate) fn set_home(&self, addr: usize, home: Home) {
        let mut shard = lock(self.shard(addr));
        let entry = shard.get_mut(&addr);
        debug_assert!(entry.is_some(), "block {addr:#x} is not in the directory");
        if let Some(entry) = entry {
            *entry = home;
        }
    }

    /// Forgets a block given back to the system.
    pub(crate) fn remove(&self, addr: usize) {
        let removed = lock(self.shard(addr)).remove(&addr);
        debug_assert!(removed.is_some(), "block {addr:#x} left twice");
    }

    /// Where the block at `addr` is: `None` if the allocator holds no block there.
    pub(crate) fn home(&self, addr: usize) -> Option<Home> {
        lock(self.shard(addr)).get(&addr).cloned()
    }

    /// How many blocks are recorded (tests and debug checks).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn finds_homes_and_forgets_freed_blocks() {
        let dir = Directory::new();
        let cache = ThreadCache::new_arc(true, Default::default());
        let n = if cfg!(miri) { 50 } else { 5_000 };
        for i in 1..=n {
            dir.insert(
                i * 64,
                if i % 2 == 0 {
                    Some(cache.clone())
                } else {
                    None
                },
            );
        }
        assert_eq!(dir.len(), n);
        assert!(dir
            .home(4 * 64)
            .unwrap()
            .is_some_and(|h| Arc::ptr_eq(&h, &cache)));
        assert!(dir.home(3 * 64).unwrap().is_none());
        assert!(dir.home((n + 1) * 64).is_none());
        dir.set_home(4 * 64, None);
        assert!(dir.home(4 * 64).unwrap().is_none());
        for i in 1..=n {
            dir.remove(i * 64);
        }
        assert_eq!(dir.len(), 0);
        assert!(dir.home(64).is_none());
        // Every home `Arc` was dropped with its entry.
        assert_eq!(Arc::strong_count(&cache), 1);
    }
}
