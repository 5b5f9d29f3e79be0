//! The shared cache: idle blocks no thread holds, and the allocator-wide books.

use crate::block::IdleLists;

/// What the allocator's shared mutex protects. Threads come here on slow paths only: a miss in
/// their own cache, a release that needs more of the cap, a trip to the system.
pub(crate) struct SharedCache {
    /// Idle blocks of no thread: trimmed, moved out of exited threads' caches, or kept by reset.
    pub(crate) idle: IdleLists,
    /// Sum of all thread caches' credits. `idle.bytes() + credit_total <= max_cached_bytes`
    /// always: this is how the cap holds without counting every thread's every release.
    pub(crate) credit_total: usize,
    /// Bytes taken from the system and not given back (live + cached): what `limit_bytes` caps.
    pub(crate) reserved: usize,
    pub(crate) peak_reserved: usize,
    pub(crate) system_allocs: u64,
    pub(crate) system_frees: u64,
    pub(crate) evictions: u64,
    pub(crate) oom_retries: u64,
    pub(crate) corrupted_blocks: u64,
    /// Counters of thread caches forgotten after their thread exited.
    pub(crate) retired_hits: u64,
    pub(crate) retired_misses: u64,
    pub(crate) retired_peak_live: usize,
}

impl SharedCache {
    pub(crate) const fn new() -> Self {
        SharedCache {
            idle: IdleLists::new(),
            credit_total: 0,
            reserved: 0,
            peak_reserved: 0,
            system_allocs: 0,
            system_frees: 0,
            evictions: 0,
            oom_retries: 0,
            corrupted_blocks: 0,
            retired_hits: 0,
            retired_misses: 0,
            retired_peak_live: 0,
        }
    }

    /// The part of the cap that neither the shared cache nor any thread's credit uses.
    pub(crate) fn unreserved(&self, cap: usize) -> usize {
        cap.saturating_sub(self.idle.bytes() + self.credit_total)
    }
}
