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

use crate::sync::{AtomicU64, Ordering};
use crate::thread_cache::CacheState;

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
