//! Least-recently-used order across threads: the clock that stamps idle blocks.
//!
//! When the cap needs room, the allocator evicts the idle block with the oldest stamp, wherever
//! it sits: the shared pool or any thread's cache. A stamp is `(tick, seq)`: `tick` is this
//! allocator's clock, which advances on every slow-path event (a miss, a reset, an eviction,
//! a trim) and is read with one relaxed load, and `seq` counts the blocks a cache stamped
//! within that tick. So the order is exact within a thread, and across threads exact to one
//! tick: two blocks made idle on different threads between the same two slow-path events may
//! be evicted in either order. In a runtime that resets after every kernel call, a tick is at
//! most one kernel call. (A global counter bumped on every release would make the order exact
//! at the price of a shared read-modify-write on the fast path.)
//!
//! The policy that uses it lives here too: when a release does not fit its cache's credit,
//! [`CachingAllocator::make_room`] reclaims the spare credit of every thread, then evicts the
//! oldest idle block of the whole allocator, one at a time, until the cap has room.

use crate::allocator::CachingAllocator;
use crate::sync::{lock, Arc, AtomicU64, Ordering};
use crate::thread_cache::{CacheState, ThreadCache};

/// Bits of a stamp that count blocks within one tick; past `2^SEQ_BITS - 1` blocks in one tick
/// a cache's later blocks share the last stamp (still ordered by their place in each list).
const SEQ_BITS: u32 = 24;
const SEQ_MAX: u64 = (1 << SEQ_BITS) - 1;

/// The allocator's eviction clock.
pub(crate) struct Clock {
    tick: AtomicU64,
}

impl Clock {
    pub(crate) const fn new() -> Self {
        Clock {
            tick: AtomicU64::new(1),
        }
    }

    /// Advances the clock: blocks made idle from now on are newer than all before.
    pub(crate) fn advance(&self) {
        self.tick.fetch_add(1, Ordering::Relaxed);
    }

    /// The stamp of the next block `state` (a locked cache) makes idle. Stamps of one cache
    /// never decrease, whichever thread holds its lock.
    #[inline]
    pub(crate) fn stamp(&self, state: &mut CacheState) -> u64 {
        let tick = self.tick.load(Ordering::Relaxed);
        if tick > state.stamp_tick {
            state.stamp_tick = tick;
            state.stamp_seq = 0;
        } else if state.stamp_seq < SEQ_MAX {
            state.stamp_seq += 1;
        }
        (state.stamp_tick << SEQ_BITS) | state.stamp_seq
    }
}

impl CachingAllocator {
    /// Grants credit for `need` idle bytes, making room under the cap if needed: first by
    /// reclaiming the credit threads hold beyond their idle blocks, then by evicting the least
    /// recently used idle blocks of the whole allocator, one at a time. `None` if even an
    /// empty cache could not hold `need` bytes, or nothing is left to evict.
    pub(crate) fn make_room(&self, need: usize) -> Option<usize> {
        if need > self.config().max_cached_bytes {
            return None;
        }
        let mut reclaimed = false;
        let mut engaged_now = false;
        loop {
            // (Bound first: the shared lock must be dropped before a trim takes it again.)
            let granted = lock(&self.shared).grant(need);
            if let Some(grant) = granted {
                if engaged_now {
                    // The cap evicted for the first time: trim to the working set too (from
                    // now on each new system block is followed by a trim anyway).
                    self.trim_to_budget();
                }
                return Some(grant);
            }
            if !reclaimed {
                reclaimed = true;
                self.reclaim_spare_credit();
                continue;
            }
            // The cap evicts: the policy of `retention` engages (once).
            engaged_now |= self.retention.engage();
            // Nothing left to evict: the cap cannot hold `need`.
            self.evict_oldest_bytes()?;
        }
    }

    /// Takes back every thread's credit beyond its idle blocks.
    fn reclaim_spare_credit(&self) {
        self.registry.for_each(|cache| {
            let mut state = cache.lock();
            let spare = state.credit - state.held();
            if spare > 0 {
                state.credit -= spare;
                lock(&self.shared).return_credit(spare);
            }
        });
    }

    /// Evicts the least recently used idle block of the whole allocator (pool or any thread
    /// cache; see `eviction` for how exact the order is). `false` if nothing is idle.
    pub(crate) fn evict_oldest(&self) -> bool {
        self.evict_oldest_bytes().is_some()
    }

    /// [`evict_oldest`](Self::evict_oldest), saying how many bytes went back to the system
    /// (0 if another thread took the block first). `None` if nothing is idle.
    pub(crate) fn evict_oldest_bytes(&self) -> Option<usize> {
        self.clock.advance();
        let mut oldest: Option<(u64, Option<Arc<ThreadCache>>)> =
            lock(&self.shared).pool_oldest().map(|stamp| (stamp, None));
        self.registry.for_each(|cache| {
            if !cache.may_have_idle() {
                return;
            }
            if let Some(stamp) = cache.lock().idle.oldest_stamp() {
                if oldest.as_ref().is_none_or(|(s, _)| stamp < *s) {
                    oldest = Some((stamp, Some(cache.clone())));
                }
            }
        });
        match oldest {
            None => None,
            Some((_, None)) => {
                // Another thread may have emptied the pool meanwhile: then the caller looks again.
                let mut shared = lock(&self.shared);
                let Some((_, block)) = shared.pool_pop_lru() else {
                    return Some(0);
                };
                let bytes = block.size();
                self.evict(&mut shared, block);
                Some(bytes)
            }
            Some((_, Some(cache))) => {
                // Another thread may have emptied it meanwhile: then the caller looks again.
                let mut state = cache.lock();
                let mut bytes = 0;
                if let Some((_, block)) = state.idle.pop_lru() {
                    bytes = block.size();
                    state.credit -= bytes;
                    let mut shared = lock(&self.shared);
                    shared.return_credit(bytes);
                    self.evict(&mut shared, block);
                }
                cache.publish(&state);
                Some(bytes)
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::thread_cache::ThreadCache;

    #[test]
    fn stamps_grow_within_a_cache_and_across_ticks() {
        let clock = Clock::new();
        let a = ThreadCache::new_arc(true, Default::default());
        let b = ThreadCache::new_arc(true, Default::default());
        let mut sa = a.lock();
        let mut sb = b.lock();
        let a1 = clock.stamp(&mut sa);
        let a2 = clock.stamp(&mut sa);
        let b1 = clock.stamp(&mut sb);
        assert!(a1 < a2, "a cache's stamps grow");
        // Same tick on two threads: ordered within each, not across (the stated bound).
        assert_eq!(a1 >> SEQ_BITS, b1 >> SEQ_BITS);
        clock.advance();
        let b2 = clock.stamp(&mut sb);
        let a3 = clock.stamp(&mut sa);
        // After a tick, every new stamp is newer than every stamp before it, on any thread.
        assert!(b2 > a2 && a3 > a2 && b2 > b1);
        // Past 2^SEQ_BITS stamps in one tick, a cache's stamps stop growing but never shrink.
        sa.stamp_seq = SEQ_MAX - 1;
        let x = clock.stamp(&mut sa);
        let y = clock.stamp(&mut sa);
        assert!(x <= y && y >> SEQ_BITS == a3 >> SEQ_BITS);
    }
}
