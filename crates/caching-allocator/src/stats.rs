//! `Stats`: what the allocator did, for dashboards, tests and the benchmark.

use core::fmt;

use crate::sync::{lock, Ordering};

/// A snapshot of an allocator's counters, from [`CachingAllocator::stats`].
///
/// Byte counts of blocks are class sizes (what the blocks hold), except `requested_bytes`.
///
/// [`CachingAllocator::stats`]: crate::CachingAllocator::stats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests served by an idle cached block (this thread's, the shared cache's, or another
    /// thread's).
    pub hits: u64,
    /// Requests that needed a new block from the system.
    pub misses: u64,
    /// Hits served by an idle block of a larger class than the request's, because none of its
    /// own class was idle (best fit, `Config::max_oversize`). Counted in `hits` too.
    pub oversize_hits: u64,
    /// Bytes of the blocks live now.
    pub live_bytes: usize,
    /// How many blocks are live now.
    pub live_blocks: usize,
    /// Bytes of idle cached blocks, wherever they sit (per-thread caches included).
    pub cached_bytes: usize,
    /// How many idle blocks are cached.
    pub cached_blocks: usize,
    /// The most live bytes there have been (see `CachingAllocator::stats` for threads).
    pub peak_live_bytes: usize,
    /// Bytes taken from the system and not given back: live + cached.
    pub reserved_bytes: usize,
    /// The most bytes there have been taken from the system at once.
    pub peak_reserved_bytes: usize,
    /// The sizes requested for the live blocks: `live_bytes - requested_bytes` is rounding
    /// waste (plus debug canaries).
    pub requested_bytes: usize,
    /// Calls to the system allocator's `alloc` that succeeded.
    pub system_allocs: u64,
    /// Blocks given back to the system.
    pub system_frees: u64,
    /// Idle blocks given back to the system because of the cap, the limit, or a trim.
    pub evictions: u64,
    /// Times the system refused memory and the allocator retried after freeing its cache.
    pub oom_retries: u64,
    /// Blocks found written past their requested end (debug checks).
    pub corrupted_blocks: u64,
    /// Bytes of the blocks held now (live or idle) that were advised to use huge pages and
    /// the kernel accepted the advice for (`Config::huge_pages`; Linux only).
    pub huge_page_bytes: usize,
    /// Blocks live in the threads' arenas (counted in `live_blocks` too): small blocks bumped
    /// through a chunk rather than blocks of their own (`Config::arena_max_bytes`).
    pub arena_live_blocks: usize,
    /// Chunks the threads' arenas hold: each is one block from the system, its bytes live
    /// (those of the arena's live blocks) or cached (the rest).
    pub arena_chunks: usize,
    /// The most bytes live at once since the last reset (the reset interval running now),
    /// summed over threads. A thread's arena counts as its bump offset: from its chunk's
    /// start to the end of its newest live block, so bytes released below that block stay
    /// counted until the blocks above them go (the bytes a bump plan of the interval needs).
    /// Arena blocks count with the alignment padding below them: the bytes a bump-allocated
    /// plan of the interval needs.
    pub interval_peak_bytes: usize,
    /// The most bytes live at once in the reset interval the last reset ended: a kernel
    /// call's scratch high-water mark when the runtime resets after every kernel (what an
    /// ahead-of-time memory plan must give that call), summed over threads.
    pub last_interval_peak_bytes: usize,
    /// The cap or the working-set budget has evicted, so a miss takes any larger idle block
    /// before the system (wide fit; see `Config::working_set_slack`).
    pub working_set_mode: bool,
}

impl Stats {
    /// Hits as a share of all requests that took memory, from 0 to 1 (1 with no requests).
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            1.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Bytes in the unit that reads best.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "live {} in {} blocks ({} requested), cached {} in {} blocks",
            Bytes(self.live_bytes),
            self.live_blocks,
            Bytes(self.requested_bytes),
            Bytes(self.cached_bytes),
            self.cached_blocks
        )?;
        writeln!(
            f,
            "reserved {} (peak {}, peak live {})",
            Bytes(self.reserved_bytes),
            Bytes(self.peak_reserved_bytes),
            Bytes(self.peak_live_bytes)
        )?;
        write!(
            f,
            "hits {} ({} oversize) / misses {} ({:.1}% hit rate), system allocs {} / frees {}, \
             evictions {}, OOM retries {}, corrupted blocks {}{}",
            self.hits,
            self.oversize_hits,
            self.misses,
            self.hit_rate() * 100.0,
            self.system_allocs,
            self.system_frees,
            self.evictions,
            self.oom_retries,
            self.corrupted_blocks,
            if self.working_set_mode {
                ", working-set mode"
            } else {
                ""
            }
        )
    }
}

impl crate::CachingAllocator {
    /// A snapshot of the allocator's counters, summed over every thread's cache.
    ///
    /// Each cache is read under its own lock, one after the other, so while other threads
    /// allocate the sum is not of one instant. `peak_live_bytes` is exact while one thread
    /// allocates; with several it is the sum of each thread's peak (capped by
    /// `peak_reserved_bytes`), never below the true peak.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        let mut peak_live = 0usize;
        let epoch = self.epoch.load(Ordering::Acquire);
        self.registry.for_each(|cache| {
            let state = cache.lock();
            let arena = cache.arena.shared.figures(epoch);
            stats.hits += arena.hits as u64 + cache.arena.shared.spare_lends();
            stats.live_bytes += arena.live_bytes;
            stats.live_blocks += arena.live_blocks;
            stats.arena_live_blocks += arena.live_blocks;
            stats.requested_bytes += arena.requested;
            peak_live = peak_live.saturating_add(arena.max_peak);
            if let Some(chunk) = state.arena_chunk {
                // The chunk's bytes no live block of the arena has are cached.
                stats.cached_bytes += chunk.size().saturating_sub(arena.live_bytes);
                stats.arena_chunks += 1;
            }
            if let Some(chunk) = state.scope_chunk {
                // As when the chunk was a scope's block of its own: live while a scope has it,
                // idle otherwise.
                if cache.arena.shared.spare_lent() {
                    stats.live_bytes += chunk.size();
                    stats.live_blocks += 1;
                    stats.requested_bytes += chunk.size();
                } else {
                    stats.cached_bytes += chunk.size();
                    stats.cached_blocks += 1;
                }
            }
            let c = &state.counters;
            let (interval, last) = c.interval(epoch);
            stats.interval_peak_bytes += interval + arena.peak;
            stats.last_interval_peak_bytes += last + arena.last_peak;
            stats.hits += c.hits;
            stats.oversize_hits += c.oversize_hits;
            stats.misses += c.misses;
            stats.live_bytes += c.live_bytes;
            stats.live_blocks += c.live_blocks;
            stats.requested_bytes += c.requested_bytes;
            peak_live = peak_live.saturating_add(c.peak_live_bytes);
            stats.cached_bytes += state.idle.bytes();
            stats.cached_blocks += state.idle.blocks();
        });
        lock(&self.shared).add_to(&mut stats, peak_live, epoch);
        stats.working_set_mode = self.budget.engaged();
        stats
    }

    /// How many thread caches the allocator keeps: one per thread that has used it, plus one
    /// for calls made while a thread's locals are torn down. The cache of an exited thread is
    /// dropped once it holds no live block: when the next new thread arrives, or at
    /// `reset(&mut self)`. (Not part of [`Stats`]: registering a thread is not a change of
    /// the allocator's blocks, and a failed call may register one.)
    pub fn thread_caches(&self) -> usize {
        self.registry.len()
    }
}
