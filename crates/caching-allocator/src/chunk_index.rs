//! Which thread cache's arena chunk holds an address: a release on another thread than the
//! block's owner finds the owner's arena in one look-up, whatever the number of threads.
//!
//! Chunks are at least [`MIN_CHUNK`] bytes, so the index keys them by [`MIN_CHUNK`]-sized
//! *granules*: a chunk is entered under every granule whose first byte it holds. An address in
//! granule `g` lies in the chunk entered under `g` (one that began at or before `g`'s first
//! byte) or in the one entered under `g + 1` (one that began inside `g`, after its first byte:
//! at least `MIN_CHUNK` long, it holds `g + 1`'s first byte). Two look-ups, each of one shard.
//!
//! Invariant: the index holds exactly the chunks in thread caches' books
//! (`CacheState::arena_chunk`): a chunk is entered when it is booked and removed when it leaves
//! the books, both under its cache's lock. Booked chunks never overlap, so an entry is never
//! overwritten. A chunk a trim revoked has left the books, so a release into it is not found
//! here: its arena holds nothing live (the reset took its blocks).

use core::hash::BuildHasherDefault;
use std::collections::HashMap;

use crate::arena::MIN_CHUNK;
use crate::block::Block;
use crate::directory::AddrHasher;
use crate::sync::{lock, Arc, Mutex};
use crate::thread_cache::ThreadCache;

/// Shards: threads that release into other threads' arenas at once rarely meet on one lock.
#[cfg(not(loom))]
const SHARDS: usize = 16;
/// Under loom, one, locked once a call (`each_locked`): how many granules a chunk holds and
/// which shards they fall in depend on the addresses the system hands out, which differ from
/// one execution of a model to the next, and loom requires every execution to take the same
/// locks in the same order (it failed a model with "unexpected exploration state" when a
/// look-up locked one or two shards as the chunk's alignment fell).
#[cfg(loom)]
const SHARDS: usize = 1;

/// A booked chunk's range and its cache, as entered under each of its granules.
struct Entry {
    base: usize,
    len: usize,
    cache: Arc<ThreadCache>,
}

/// Keyed by the granule's first address (the directory's hasher spreads addresses, not small
/// numbers).
type Shard = HashMap<usize, Entry, BuildHasherDefault<AddrHasher>>;

/// The booked arena chunks by granule (see the module docs).
pub(crate) struct ChunkIndex {
    shards: Box<[Mutex<Shard>]>,
}

/// The granules whose first byte `chunk` holds.
fn granules(chunk: &Block) -> core::ops::RangeInclusive<usize> {
    granules_of(chunk.addr(), chunk.size())
}

/// The granules whose first byte the `len` bytes at `addr` hold.
fn granules_of(addr: usize, len: usize) -> core::ops::RangeInclusive<usize> {
    addr.div_ceil(MIN_CHUNK)..=(addr + len - 1) / MIN_CHUNK
}

/// The granules a chunk holding `addr` is entered under, one of them (see the module docs).
fn candidates(addr: usize) -> [usize; 2] {
    let g = addr / MIN_CHUNK;
    [g, g.wrapping_add(1)]
}

impl ChunkIndex {
    pub(crate) fn new() -> Self {
        ChunkIndex {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, granule: usize) -> &Mutex<Shard> {
        &self.shards[granule % SHARDS]
    }

    /// Granule `g`'s key.
    fn key(g: usize) -> usize {
        g.wrapping_mul(MIN_CHUNK)
    }

    /// Runs `f` on each granule of `granules` with its shard locked: a lock a granule, or,
    /// with one shard (loom), one lock for them all.
    fn each_locked(
        &self,
        granules: impl IntoIterator<Item = usize>,
        mut f: impl FnMut(&mut Shard, usize),
    ) {
        if SHARDS == 1 {
            let mut shard = lock(&self.shards[0]);
            granules.into_iter().for_each(|g| f(&mut shard, g));
        } else {
            granules
                .into_iter()
                .for_each(|g| f(&mut lock(self.shard(g)), g));
        }
    }

    /// Enters `chunk`, just booked as `cache`'s arena chunk (under its lock).
    pub(crate) fn insert(&self, chunk: &Block, cache: &Arc<ThreadCache>) {
        debug_assert!(chunk.size() >= MIN_CHUNK);
        self.each_locked(granules(chunk), |shard, g| {
            let entry = Entry {
                base: chunk.addr(),
                len: chunk.size(),
                cache: cache.clone(),
            };
            let previous = shard.insert(Self::key(g), entry);
            debug_assert!(
                previous.is_none(),
                "booked chunks overlap at granule {g:#x}"
            );
        });
    }

    /// Removes `chunk`, just taken out of its cache's books (under its lock).
    pub(crate) fn remove(&self, chunk: &Block) {
        self.each_locked(granules(chunk), |shard, g| {
            let removed = shard.remove(&Self::key(g));
            debug_assert!(removed.is_some(), "chunk granule {g:#x} was not entered");
        });
    }

    /// Calls `f` with the cache whose booked chunk holds `addr` (at most one does), after the
    /// index's lock is dropped, and returns what it returns; `false` if none does. Both
    /// candidate granules are always looked at, so a look-up takes the same locks wherever
    /// the chunk falls.
    pub(crate) fn with_owner(&self, addr: usize, f: impl FnOnce(&ThreadCache) -> bool) -> bool {
        let mut owner = None;
        self.each_locked(candidates(addr), |shard, g| {
            if let Some(e) = shard.get(&Self::key(g)) {
                if addr.wrapping_sub(e.base) < e.len {
                    owner = Some(e.cache.clone());
                }
            }
        });
        owner.is_some_and(|cache| f(&cache))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of at least `MIN_CHUNK` bytes laid end to end from `start`, some beginning in
    /// the middle of a granule: every address of each chunk is found under one of its
    /// two candidate granules (or both), and only that chunk is found; an address past the
    /// chunks finds none.
    #[test]
    fn every_address_finds_its_own_chunk_and_no_other() {
        const K: usize = 1024;
        let start = 1 << 30;
        let lens = [68 * K, 64 * K, 200 * K, 64 * K + 4 * K, 4 << 20, 96 * K];
        let mut chunks = Vec::new();
        let mut at = start + 4 * K;
        for len in lens {
            chunks.push((at, len));
            at += len;
        }
        // The index: granule -> chunk, and no granule entered twice.
        let mut index = std::collections::HashMap::new();
        for (i, &(addr, len)) in chunks.iter().enumerate() {
            assert!(
                !granules_of(addr, len).is_empty(),
                "chunk {i} has a granule"
            );
            for g in granules_of(addr, len) {
                assert!(index.insert(g, i).is_none(), "granule {g} entered twice");
            }
        }
        for (i, &(addr, len)) in chunks.iter().enumerate() {
            for probe in [
                addr,
                addr + 64,
                addr + len / 2,
                addr + len - 64,
                addr + len - 1,
            ] {
                let mut found: Vec<usize> = candidates(probe)
                    .iter()
                    .filter_map(|g| index.get(g).copied())
                    .filter(|&j| (chunks[j].0..chunks[j].0 + chunks[j].1).contains(&probe))
                    .collect();
                found.dedup(); // both candidates may be the same chunk's

                assert_eq!(found, [i], "address {probe:#x} of chunk {i}");
            }
        }
        let past = at + 2 * MIN_CHUNK;
        assert!(candidates(past).iter().all(|g| !index.contains_key(g)));
    }
}
