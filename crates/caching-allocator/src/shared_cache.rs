//! The shared cache: idle blocks no thread holds, the cap's ledger, and the allocator-wide
//! books (what was taken from the system, and the counters of forgotten thread caches).
//!
//! # The cap
//! `max_cached_bytes` bounds the idle bytes of the whole allocator. Counting every release in
//! one shared counter would put a shared write on every call, so the cap is handed out as
//! *credit*: a thread cache may keep idle blocks up to its credit without asking anyone, and
//! asks this ledger for more (in steps of [`CREDIT_STEP`]) when a release does not fit. The
//! ledger's invariant, checked by `debug_assert!` on every change:
//!
//! `pool bytes + credit handed out <= cap`, and in each thread cache `idle bytes <= credit`,
//!
//! so the idle bytes of the allocator never exceed the cap. Credit follows the blocks: a block
//! taken from another thread's cache, evicted, or moved to the pool gives its credit back, so
//! no thread holds cap space for blocks it no longer has. A thread's spare credit (credit
//! beyond its idle bytes, kept so the release of its live blocks stays local) is reclaimed by
//! whichever thread runs short (see `CachingAllocator::make_room`).

use crate::arena::ArenaFigures;
use crate::block::{Block, IdleLists};
use crate::thread_cache::Counters;
use crate::{SizeClass, Stats};

/// Credit is granted in steps of at least this much, so a thread warming up its cache does not
/// take the shared lock for every small block it returns.
pub(crate) const CREDIT_STEP: usize = 64 << 10;

/// What the allocator's shared mutex protects. Threads come here on slow paths only: a miss in
/// their own cache, a release that needs more of the cap, a trip to the system.
pub(crate) struct SharedCache {
    /// Idle blocks of no thread: trimmed, moved out of exited threads' caches, or spilled.
    pool: IdleLists,
    /// Credit handed out to thread caches (see the module docs).
    credit_out: usize,
    cap: usize,
    /// Bytes taken from the system and not given back (live + cached): what `limit_bytes`
    /// caps. Includes requests on their way to the system.
    reserved: usize,
    peak_reserved: usize,
    system_allocs: u64,
    system_frees: u64,
    evictions: u64,
    oom_retries: u64,
    corrupted_blocks: u64,
    /// Bytes advised `MADV_HUGEPAGE` in the blocks held now.
    huge_page_bytes: usize,
    /// Counters of thread caches forgotten after their thread exited.
    retired_hits: u64,
    retired_oversize_hits: u64,
    retired_misses: u64,
    retired_peak_live: usize,
    retired_peak_requested: usize,
    /// Interval peaks of forgotten caches: (the epoch they are of, current, last).
    retired_interval: (usize, usize, usize),
}

impl SharedCache {
    pub(crate) const fn new(cap: usize) -> Self {
        SharedCache {
            pool: IdleLists::new(),
            credit_out: 0,
            cap,
            reserved: 0,
            peak_reserved: 0,
            system_allocs: 0,
            system_frees: 0,
            evictions: 0,
            oom_retries: 0,
            corrupted_blocks: 0,
            huge_page_bytes: 0,
            retired_hits: 0,
            retired_oversize_hits: 0,
            retired_misses: 0,
            retired_peak_live: 0,
            retired_peak_requested: 0,
            retired_interval: (0, 0, 0),
        }
    }

    /// Keeps the counters of a cache forgotten after its thread exited (`counters`, and its
    /// arena's `arena` with `spare_lends` lends of its spare scope chunk) as of epoch
    /// `epoch`: stats must not go backwards.
    pub(crate) fn retire(
        &mut self,
        counters: &Counters,
        arena: &ArenaFigures,
        spare_lends: u64,
        epoch: usize,
    ) {
        self.retired_hits += counters.hits + arena.hits as u64 + spare_lends;
        self.retired_oversize_hits += counters.oversize_hits;
        self.retired_misses += counters.misses;
        self.retired_peak_live += counters.peak_live_bytes + arena.max_peak;
        self.retired_peak_requested += counters.peak_requested_bytes;
        let (current, last) = counters.interval(epoch);
        let (cur0, last0) = self.retired_interval(epoch);
        self.retired_interval = (
            epoch,
            cur0 + current + arena.peak,
            last0 + last + arena.last_peak,
        );
    }

    /// The peak of the bytes live blocks of forgotten caches asked for.
    pub(crate) fn retired_peak_requested(&self) -> usize {
        self.retired_peak_requested
    }

    /// Adds what this cache knows to `stats`, which holds the sums over the live thread
    /// caches (their peaks of live bytes summed in `peak_live`), as of epoch `epoch`.
    pub(crate) fn add_to(&self, stats: &mut Stats, peak_live: usize, epoch: usize) {
        stats.hits += self.retired_hits;
        stats.oversize_hits += self.retired_oversize_hits;
        stats.misses += self.retired_misses;
        let (interval, last) = self.retired_interval(epoch);
        stats.interval_peak_bytes += interval;
        stats.last_interval_peak_bytes += last;
        stats.cached_bytes += self.pool_bytes();
        stats.cached_blocks += self.pool_blocks();
        stats.reserved_bytes = self.reserved;
        stats.peak_reserved_bytes = self.peak_reserved;
        // A sum of per-thread peaks may exceed what was ever taken at once.
        stats.peak_live_bytes = peak_live
            .saturating_add(self.retired_peak_live)
            .min(self.peak_reserved);
        stats.system_allocs = self.system_allocs;
        stats.system_frees = self.system_frees;
        stats.evictions = self.evictions;
        stats.oom_retries = self.oom_retries;
        stats.corrupted_blocks = self.corrupted_blocks;
        stats.huge_page_bytes = self.huge_page_bytes;
    }

    /// Counts a block given back to the system because of the cap, the limit or a trim.
    pub(crate) fn note_eviction(&mut self) {
        self.evictions += 1;
    }

    /// Counts a request the system refused, retried once the idle cache was freed.
    pub(crate) fn note_oom_retry(&mut self) {
        self.oom_retries += 1;
    }

    /// Counts a block whose canary was overwritten.
    pub(crate) fn note_corrupted(&mut self) {
        self.corrupted_blocks += 1;
    }

    /// The peaks of forgotten caches in interval `epoch` and the one before it.
    fn retired_interval(&self, epoch: usize) -> (usize, usize) {
        let (at, current, last) = self.retired_interval;
        if epoch == at {
            (current, last)
        } else if epoch == at.wrapping_add(1) {
            (0, current)
        } else {
            (0, 0)
        }
    }

    #[inline]
    fn check(&self) {
        debug_assert!(
            self.pool.bytes() + self.credit_out <= self.cap,
            "cap broken: pool {} + credit {} > cap {}",
            self.pool.bytes(),
            self.credit_out,
            self.cap
        );
    }

    // ---- the cap's ledger ----------------------------------------------------------------

    /// Grants credit for `need` more idle bytes (at least `need`, up to a step more when the
    /// cap allows), or `None` if the unused part of the cap is smaller than `need`.
    pub(crate) fn grant(&mut self, need: usize) -> Option<usize> {
        let available = self.cap.saturating_sub(self.pool.bytes() + self.credit_out);
        if available < need {
            return None;
        }
        let grant = need.max(CREDIT_STEP).min(available);
        self.credit_out += grant;
        self.check();
        Some(grant)
    }

    /// Takes back `credit` a thread cache no longer needs.
    pub(crate) fn return_credit(&mut self, credit: usize) {
        debug_assert!(credit <= self.credit_out, "more credit back than out");
        self.credit_out -= credit;
    }

    // ---- the pool ------------------------------------------------------------------------

    /// Keeps an idle block with its stamp. The caller gave back at least its size in credit
    /// just before (the block came from a thread cache), so the cap holds.
    pub(crate) fn pool_insert(&mut self, block: Block, stamp: u64) {
        self.pool.insert(block, stamp);
        self.check();
    }

    /// The most recently used pooled block of `class` aligned to `align`.
    pub(crate) fn pool_take(&mut self, class: SizeClass, align: usize) -> Option<Block> {
        self.pool.take(class, align)
    }

    /// Best fit in the pool: the smallest class above `class`, up to `largest`.
    pub(crate) fn pool_take_larger(
        &mut self,
        class: SizeClass,
        largest: SizeClass,
        align: usize,
    ) -> Option<Block> {
        self.pool.take_larger(class, largest, align)
    }

    /// The pool's least recently used block, with its stamp.
    pub(crate) fn pool_pop_lru(&mut self) -> Option<(u64, Block)> {
        self.pool.pop_lru()
    }

    /// The stamp of the pool's least recently used block.
    pub(crate) fn pool_oldest(&self) -> Option<u64> {
        self.pool.oldest_stamp()
    }

    pub(crate) fn pool_bytes(&self) -> usize {
        self.pool.bytes()
    }

    pub(crate) fn pool_blocks(&self) -> usize {
        self.pool.blocks()
    }

    // ---- what was taken from the system ---------------------------------------------------

    /// Counts `size` more bytes as taken from the system if the total stays within `limit`.
    /// `false` leaves the books unchanged.
    pub(crate) fn try_reserve(&mut self, size: usize, limit: usize) -> bool {
        match self.reserved.checked_add(size) {
            Some(total) if total <= limit => {
                self.reserved = total;
                true
            }
            _ => false,
        }
    }

    /// Undoes `try_reserve` for a request the system refused, or counts a block given back.
    pub(crate) fn unreserve(&mut self, size: usize) {
        debug_assert!(size <= self.reserved, "more bytes back than taken");
        self.reserved -= size;
    }

    pub(crate) fn reserved(&self) -> usize {
        self.reserved
    }

    /// The most bytes ever taken from the system at once.
    pub(crate) fn peak_reserved(&self) -> usize {
        self.peak_reserved
    }

    /// Records a block the system handed over (its bytes were reserved before the call), of
    /// which `huge_page_bytes` were advised huge pages.
    pub(crate) fn allocated(&mut self, huge_page_bytes: usize) {
        self.system_allocs += 1;
        self.huge_page_bytes += huge_page_bytes;
        // The peak counts bytes really taken: a refused request must not raise it.
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    /// Records a block of `size` bytes given back to the system, `huge_page_bytes` of them
    /// advised huge pages (as `allocated` counted them).
    pub(crate) fn freed(&mut self, size: usize, huge_page_bytes: usize) {
        debug_assert!(huge_page_bytes <= self.huge_page_bytes);
        self.huge_page_bytes -= huge_page_bytes;
        self.unreserve(size);
        self.system_frees += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::tests::fake;

    #[test]
    fn credit_and_pool_share_the_cap() {
        let mut shared = SharedCache::new(256 << 10);
        // A small need gets a whole step.
        assert_eq!(shared.grant(100), Some(CREDIT_STEP));
        assert_eq!(shared.grant(128 << 10), Some(128 << 10));
        // 64 KiB left: a 128 KiB need is refused, a 64 KiB one granted exactly.
        assert_eq!(shared.grant(128 << 10), None);
        assert_eq!(shared.grant(64 << 10), Some(64 << 10));
        assert_eq!(shared.grant(1), None);
        // A cache gives 128 KiB of credit back and moves a 128 KiB block to the pool: the
        // pool's bytes count against the cap like credit.
        shared.return_credit(128 << 10);
        shared.pool_insert(fake(4096, 128 << 10), 7);
        assert_eq!(shared.grant(1), None);
        assert_eq!(shared.pool_pop_lru().map(|(t, _)| t), Some(7));
        assert_eq!(shared.grant(1), Some(CREDIT_STEP));
    }

    #[test]
    fn reserve_never_overflows() {
        let mut shared = SharedCache::new(0);
        // Three requests of 15 << 59 bytes: the third would pass 2^64.
        assert!(shared.try_reserve(15 << 59, usize::MAX));
        assert!(shared.try_reserve(15 << 59, usize::MAX));
        assert!(!shared.try_reserve(15 << 59, usize::MAX));
        assert_eq!(shared.reserved(), 30 << 59);
        assert!(!shared.try_reserve(100, 30 << 59));
        shared.unreserve(30 << 59);
        assert_eq!(shared.reserved(), 0);
    }
}
