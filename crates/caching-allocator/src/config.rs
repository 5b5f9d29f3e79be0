//! Configuration: the cap, the hard limit, debug checks and the system allocator underneath.

use core::alloc::GlobalAlloc;
use core::fmt;
use std::alloc::System;
use std::sync::Arc;

/// How a [`CachingAllocator`](crate::CachingAllocator) behaves; a builder.
///
/// ```
/// use caching_allocator::{CachingAllocator, Config};
/// let alloc = CachingAllocator::with_config(
///     Config::default()
///         .max_cached_bytes(16 << 20) // keep at most 16 MiB idle
///         .limit_bytes(256 << 20) // never hold more than 256 MiB in all
///         .debug_checks(cfg!(debug_assertions)),
/// );
/// assert_eq!(alloc.config().get_max_cached_bytes(), 16 << 20);
/// ```
#[derive(Clone)]
pub struct Config {
    pub(crate) max_cached_bytes: usize,
    pub(crate) limit_bytes: Option<usize>,
    pub(crate) debug_checks: bool,
    pub(crate) scope_chunk_bytes: usize,
    pub(crate) arena_max_bytes: usize,
    pub(crate) arena_adaptive: bool,
    pub(crate) max_oversize: f64,
    pub(crate) working_set_slack: Option<f64>,
    pub(crate) evict_before_new_peak: bool,
    pub(crate) huge_page_min_bytes: Option<usize>,
    pub(crate) system: Arc<dyn GlobalAlloc + Send + Sync>,
}

/// The default of [`Config::scope_chunk_bytes`]: 32 KiB, eight 4 KiB requests per chunk.
pub const DEFAULT_SCOPE_CHUNK_BYTES: usize = 32 << 10;

/// The slack [`Config::working_set_slack`] recommends for a temp allocator reset after every
/// kernel.
pub const DEFAULT_WORKING_SET_SLACK: f64 = 1.25;

/// The default of [`Config::arena_max_bytes`]: 32 KiB.
pub const DEFAULT_ARENA_MAX_BYTES: usize = 32 << 10;

/// The most [`Config::arena_max_bytes`] takes: 4 MiB, the arena's largest chunk. With it,
/// every block of a kernel call is bumped through one chunk, large ones included, and a reset
/// takes them all back in one step. The default reaches much the same for the calls that fit
/// a chunk, without this bound (see [`Config::arena_adaptive`]).
pub const MAX_ARENA_BYTES: usize = crate::arena::MAX_CHUNK;

/// The largest request the adaptive arena takes ([`Config::arena_adaptive`]): 2 MiB,
/// ExecuTorch's attention scratch at 8 threads and a 512-token split. Its decode call
/// (20 KiB + 2 MiB + reset) then costs 231 instructions instead of 717 through the size
/// classes (`examples/hotpath.rs`: `reset2-default`, `reset2-classes`).
pub const ADAPTIVE_ARENA_MAX_BYTES: usize = 2 << 20;

/// Requests up to this many bytes are served from a scope's chunk (when chunks are on).
pub const SCOPE_BUMP_MAX: usize = 4 << 10;

impl Default for Config {
    /// 64 MiB cached, no limit, no debug checks, 32 KiB scope chunks, best fit up to 2x,
    /// no working-set budget, huge pages from 2 MiB, `std::alloc::System` underneath.
    fn default() -> Self {
        Config {
            max_cached_bytes: 64 << 20,
            limit_bytes: None,
            debug_checks: false,
            scope_chunk_bytes: DEFAULT_SCOPE_CHUNK_BYTES,
            arena_max_bytes: DEFAULT_ARENA_MAX_BYTES,
            arena_adaptive: true,
            max_oversize: 2.0,
            working_set_slack: None,
            evict_before_new_peak: false,
            huge_page_min_bytes: Some(2 << 20),
            system: Arc::new(System),
        }
    }
}

impl Config {
    /// The default configuration (see [`Config::default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// At most this many idle bytes stay cached, counted over every thread's cache; past it the
    /// least recently used idle blocks go back to the system. Never refuses live memory.
    pub fn max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = bytes;
        self
    }

    /// A hard limit on live + cached bytes: an allocation that would pass it first evicts idle
    /// blocks, then fails with [`AllocError::LimitExceeded`](crate::AllocError::LimitExceeded).
    pub fn limit_bytes(mut self, bytes: usize) -> Self {
        self.limit_bytes = Some(bytes);
        self
    }

    /// Fill every handed-out block with `0xFF` (a NaN in f32/f64) and check a canary behind the
    /// requested end when the block comes back. Costs a memset per allocation.
    pub fn debug_checks(mut self, on: bool) -> Self {
        self.debug_checks = on;
        self
    }

    /// Best fit: a request that finds no idle block of its own class may take the smallest idle
    /// block of a larger class, up to `factor` times its class's size, before asking the
    /// system (counted in `Stats::oversize_hits`). A runtime whose shapes change (attention
    /// scratch grows every decode token) then reuses what it has instead of holding one block
    /// per class. The waste of such a block is below `factor` times the request (plus the class
    /// rounding); `1.0` serves only exact classes. Values below 1 (or NaN) count as 1.
    ///
    /// Under cap pressure (when idle bytes plus the request's class would pass
    /// `max_cached_bytes`, so a new block could not stay cached without evicting another) any
    /// larger idle block serves, whatever its size: the memory is held anyway, and a new
    /// block would only push an idle one out.
    pub fn max_oversize(mut self, factor: f64) -> Self {
        self.max_oversize = if factor >= 1.0 { factor } else { 1.0 };
        self
    }

    /// The working set: after every block taken from the system, idle blocks are evicted
    /// (least recently used first) until reserved bytes (live + idle) are at most `slack`
    /// times the peak of the bytes live blocks asked for (the working set). Once anything has
    /// been evicted (by this or by the cap), a miss takes the smallest idle block of a larger
    /// class before the system, of any size that keeps the bytes the thread's live blocks hold
    /// within that budget (wide fit, counted in `Stats::oversize_hits`;
    /// `Stats::working_set_mode` says it is on). So a
    /// runtime whose shapes change (decode's attention scratch grows every token) holds its
    /// working set plus `slack - 1` of it, not one block per class it no longer asks for, and
    /// under a small cap it stops churning through the system. A runtime whose blocks all
    /// live at once never meets the budget.
    ///
    /// It suits a temp allocator reset after every kernel, whose few blocks live together
    /// ([`DEFAULT_WORKING_SET_SLACK`], 1.25, is what the benchmark's `caching` source and the
    /// `llm` runner use). It does not suit traffic where many blocks of random sizes live at
    /// once and come and go independently: there the budget evicts blocks that come back soon
    /// (in `allocbench soak`, misses went from 4% to 19% and the peak held grew by a third),
    /// so it is off by default.
    ///
    /// `None` (the default) keeps idle blocks up to `max_cached_bytes`, least recently used
    /// evicted first. Values below 1 (or NaN) count as 1. Off when `max_oversize` is 1 (wide
    /// fit is best fit without a bound).
    pub fn working_set_slack(mut self, slack: Option<f64>) -> Self {
        self.working_set_slack = slack.map(|s| if s >= 1.0 { s } else { 1.0 });
        self
    }

    /// Peak-bound growth: before a block from the system would raise reserved bytes (live +
    /// idle) past their peak so far, idle blocks are evicted, least recently used first, until
    /// the block fits under that peak or nothing is idle. Reserved bytes then reach a new
    /// peak only when nothing is idle, so their peak stays near the peak of live bytes (the
    /// blocks' class sizes, best-fit waste and canaries included) instead of live bytes plus
    /// up to `max_cached_bytes` of idle ones. Hits are untouched: only a miss that would grow
    /// reserved bytes past the peak evicts, and below the peak idle blocks stay cached up to
    /// the cap as before. Evictions it makes count in `Stats::evictions`.
    ///
    /// It suits traffic where many blocks of varied sizes live at once and come and go on their
    /// own (allocator-API collections, blocks kept across kernel calls): `allocbench soak`
    /// turns it on (with `max_oversize(1.25)`; its figures are in the bench crate's
    /// `RESULTS.md`). It does not suit a temp allocator whose kernels take blocks of very
    /// different sizes in turn: kernels of 1 MiB and 4 MiB (more than `max_oversize` apart),
    /// reset after each, would evict each other's block at every call, where the cap alone keeps
    /// both. There [`Config::working_set_slack`] serves the small kernel from the large block.
    /// Off by default.
    pub fn evict_before_new_peak(mut self, on: bool) -> Self {
        self.evict_before_new_peak = on;
        self
    }

    /// Whether peak-bound growth is on (see [`Config::evict_before_new_peak`]).
    pub fn get_evict_before_new_peak(&self) -> bool {
        self.evict_before_new_peak
    }

    /// Blocks of at least `min_bytes` are taken from the system 2 MiB-aligned and, on Linux,
    /// advised `MADV_HUGEPAGE`, so the kernel may back them with transparent huge pages (one
    /// page fault per 2 MiB instead of 512, and fewer TLB misses). `None` turns it off. Default
    /// `Some(2 MiB)`. Bytes so advised are counted in `Stats::huge_page_bytes`.
    pub fn huge_pages(mut self, min_bytes: Option<usize>) -> Self {
        self.huge_page_min_bytes = min_bytes;
        self
    }

    /// The working-set slack (see [`Config::working_set_slack`]).
    pub fn get_working_set_slack(&self) -> Option<f64> {
        self.working_set_slack
    }

    /// The smallest block given huge pages, if they are on (see [`Config::huge_pages`]).
    pub fn get_huge_pages(&self) -> Option<usize> {
        self.huge_page_min_bytes
    }

    /// A [`Scope`](crate::Scope) serves requests of at most [`SCOPE_BUMP_MAX`] bytes (and
    /// alignment) by bumping a pointer through a chunk taken from the cache as one block, as an
    /// arena does: a few nanoseconds each instead of a cache round trip. The first chunk of a
    /// scope has this many bytes, each further one twice the last (up to 16 times the first);
    /// they go back when the scope drops. `0` turns chunks off (every request is a block
    /// of its own); values are raised to at least twice [`SCOPE_BUMP_MAX`]. With debug checks
    /// on, chunks are off too: each block needs its own canary.
    pub fn scope_chunk_bytes(mut self, bytes: usize) -> Self {
        self.scope_chunk_bytes = if bytes == 0 {
            0
        } else {
            bytes.max(2 * SCOPE_BUMP_MAX)
        };
        self
    }

    /// `allocate` serves requests of up to `bytes` (with alignments up to 4 KiB) from the
    /// calling thread's *arena*: a chunk taken from the cache that it bumps through, as a bump
    /// allocator does, with no lock and no atomic read-modify-write, and that a reset takes
    /// back in one atomic step (see the crate docs' "How it works"). Its chunk grows to the
    /// most one reset interval asked for, with room to grow (up to 4 MiB), so after warm-up
    /// one chunk holds a kernel call's blocks. `0` turns the arena off; values above
    /// [`MAX_ARENA_BYTES`] count as that.
    /// The arena is off with debug checks (each block needs its canary) and with a
    /// `max_cached_bytes` below 64 KiB (the smallest chunk, charged to the cap).
    ///
    /// Default [`DEFAULT_ARENA_MAX_BYTES`]; larger requests may come too (see
    /// [`Config::arena_adaptive`]).
    pub fn arena_max_bytes(mut self, bytes: usize) -> Self {
        self.arena_max_bytes = bytes.min(MAX_ARENA_BYTES);
        self
    }

    /// With `on` (the default), requests above [`Config::arena_max_bytes`] and up to
    /// [`ADAPTIVE_ARENA_MAX_BYTES`] go to the arena too, while the thread's last reset
    /// interval asked for no more than one chunk holds, large requests included, in at most
    /// two large requests; otherwise, and with `false`, the size classes serve them. So a
    /// kernel call of a large buffer or two and a reset (an attention decode step) is bumped
    /// and rewound, and a call of many large blocks, or one that outgrows a chunk, keeps
    /// blocks of their own. No effect while the arena is off.
    pub fn arena_adaptive(mut self, on: bool) -> Self {
        self.arena_adaptive = on;
        self
    }

    /// Whether the arena takes larger requests while they fit (see
    /// [`Config::arena_adaptive`]).
    pub fn get_arena_adaptive(&self) -> bool {
        self.arena_adaptive
    }

    /// The arena's largest request, 0 when it is off (see [`Config::arena_max_bytes`]).
    pub fn get_arena_max_bytes(&self) -> usize {
        self.arena_max_bytes
    }

    /// Where blocks come from and go back to; `std::alloc::System` by default. Tests use it to
    /// count calls and inject failures; a runtime may pass its own allocator.
    pub fn system_allocator(mut self, system: Arc<dyn GlobalAlloc + Send + Sync>) -> Self {
        self.system = system;
        self
    }

    /// The configured cap on idle bytes.
    pub fn get_max_cached_bytes(&self) -> usize {
        self.max_cached_bytes
    }

    /// The configured hard limit on live + cached bytes, if any.
    pub fn get_limit_bytes(&self) -> Option<usize> {
        self.limit_bytes
    }

    /// Whether debug checks (poisoning and canaries) are on.
    pub fn get_debug_checks(&self) -> bool {
        self.debug_checks
    }

    /// The best-fit bound (see [`Config::max_oversize`]).
    pub fn get_max_oversize(&self) -> f64 {
        self.max_oversize
    }

    /// The size of a scope's bump chunk, 0 when chunks are off.
    pub fn get_scope_chunk_bytes(&self) -> usize {
        self.scope_chunk_bytes
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("max_cached_bytes", &self.max_cached_bytes)
            .field("limit_bytes", &self.limit_bytes)
            .field("debug_checks", &self.debug_checks)
            .field("scope_chunk_bytes", &self.scope_chunk_bytes)
            .field("arena_max_bytes", &self.arena_max_bytes)
            .field("arena_adaptive", &self.arena_adaptive)
            .field("max_oversize", &self.max_oversize)
            .field("working_set_slack", &self.working_set_slack)
            .field("evict_before_new_peak", &self.evict_before_new_peak)
            .field("huge_page_min_bytes", &self.huge_page_min_bytes)
            .finish_non_exhaustive()
    }
}
