//! One operation type and a model of the allocator, shared by the corpus replay test
//! (`tests/fuzz_ops.rs`, also run under Miri) and the `cargo fuzz` target (`fuzz/`).
//!
//! An [`Input`] is a configuration and a list of [`Op`]s, built from raw bytes with
//! `arbitrary`. [`run`] applies the ops to a real allocator (backed by a counting system
//! allocator) and to a model, once per [`ArenaMode`], and checks after every op:
//!
//! - live blocks never overlap, each is aligned as asked (and to 64 bytes at least);
//! - every live block still holds the tag written over its whole requested size;
//! - stats agree with the model: live blocks/bytes/requested bytes, arena blocks, hits +
//!   misses, corrupted blocks; and with the system: reserved = live + cached = what the
//!   counting allocator holds, `system_allocs - system_frees` = the size-class blocks (live and
//!   cached) + the arena chunks; with the arena off, misses = system allocs;
//! - `cached_bytes <= max_cached_bytes`, `reserved_bytes <= limit_bytes`, peaks never drop, the
//!   reset interval's peak covers every live byte the model saw in it;
//! - releases: of a live block succeeds; of an address inside a live block, a released one, one
//!   a reset took back, a scope's block, or memory the allocator never handed out, is
//!   `UnknownPointer` and changes nothing;
//! - a reset takes every block (nothing live, no block it took can be released after);
//! - a failed call changes nothing (stats equal before and after), except the evictions a
//!   `LimitExceeded` makes first;
//! - dropping the allocator gives back exactly the bytes it took.
//!
//! With the arena off the model predicts each block's size class; with it on a block may live
//! in the thread's arena (a bump through a chunk) or in a size class, and the model learns
//! which from the stats around the call (`arena_live_blocks`), then checks the rules of that
//! place. Any violation panics with the op (and arena mode) that broke it.
#![allow(dead_code)] // each includer uses a part

use core::ptr::NonNull;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use caching_allocator::{
    AllocError, CachingAllocator, Config, Scope, SizeClass, Stats, DEFAULT_ARENA_MAX_BYTES,
};

use super::books::{assert_all_given_back, assert_books_balance, assert_nothing_live};
pub use super::counting::Counting;

/// Bytes of canary debug checks add behind every requested size (`src/debug.rs`).
pub const CANARY_LEN: usize = 16;
/// Most ops one input runs.
pub const MAX_OPS: usize = 400;
/// Most blocks the model keeps live at once; past it, allocations are skipped.
const MAX_LIVE: usize = 200;
/// The largest alignment the arena serves (`Config::arena_max_bytes`).
const ARENA_MAX_ALIGN: usize = 4096;
/// The smallest arena chunk: with a `max_cached_bytes` below it the arena is off.
const MIN_CHUNK: usize = 64 << 10;
/// The largest arena chunk.
const MAX_CHUNK: usize = 4 << 20;

/// Whether (and for which requests) the allocator's per-thread arena is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaMode {
    /// `arena_max_bytes(0)`: every block is a size class, which the model predicts.
    Off,
    /// The default configuration: requests up to [`DEFAULT_ARENA_MAX_BYTES`] are bumped, and
    /// larger ones (up to `ADAPTIVE_ARENA_MAX_BYTES`) while the intervals fit a chunk.
    Default,
    /// A bound of 256 bytes and the adaptive part off: tiny requests are bumped, the rest take
    /// size classes, mixed.
    Small,
}

impl ArenaMode {
    /// Every mode, in the order [`run_bytes`] runs them.
    pub const ALL: [ArenaMode; 3] = [ArenaMode::Off, ArenaMode::Default, ArenaMode::Small];

    /// `Config::arena_max_bytes` for this mode.
    fn max_bytes(self) -> usize {
        match self {
            ArenaMode::Off => 0,
            ArenaMode::Default => DEFAULT_ARENA_MAX_BYTES,
            ArenaMode::Small => 256,
        }
    }

    /// The largest request the arena may serve in this mode (`Config::arena_adaptive`).
    fn bound(self) -> usize {
        match self {
            ArenaMode::Default => caching_allocator::ADAPTIVE_ARENA_MAX_BYTES,
            _ => self.max_bytes(),
        }
    }
}

/// An arena block's bytes: its request rounded up to the 64-byte granule.
fn granule(size: usize) -> usize {
    size.next_multiple_of(64)
}

/// The allocator's configuration, drawn from the input's first bytes.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct FuzzConfig {
    /// `max_cached_bytes = cap_units * 256`: 0 to about 64 KiB, so eviction is common.
    pub cap_units: u8,
    /// `limit_bytes = units * 4 KiB` when present.
    pub limit_units: Option<u8>,
    /// Poison and canaries.
    pub debug: bool,
}

/// A requested size.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Size {
    /// 0 ..= 255 bytes (zero included).
    Tiny(u8),
    /// 0 ..= 8191 bytes.
    Small(u16),
    /// Multiples of 4 KiB up to 256 KiB.
    Large(u8),
}

impl Size {
    /// The size in bytes.
    pub fn bytes(self) -> usize {
        match self {
            Size::Tiny(n) => n as usize,
            Size::Small(n) => (n % 8192) as usize,
            // Under Miri every byte checked costs: keep large blocks at 16 KiB at most.
            Size::Large(n) if cfg!(miri) => (n as usize % 4 + 1) * 4096,
            Size::Large(n) => (n as usize % 64 + 1) * 4096,
        }
    }
}

/// What a scope allocates through.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum ScopeKind {
    /// `alloc_slice_fill::<u8>`.
    FillU8,
    /// `alloc_slice_fill::<u32>`.
    FillU32,
    /// `alloc_slice_copy::<u16>`.
    CopyU16,
    /// `alloc_slice_zeroed::<u64>`.
    ZeroedU64,
    /// `alloc_uninit::<[u8; 3]>`.
    Uninit3,
    /// `alloc_uninit::<Aligned256>`: alignment above 64.
    Uninit256,
}

/// 256-byte aligned element for scope allocations with a large alignment.
#[derive(Clone, Copy)]
#[repr(C, align(256))]
pub struct Aligned256([u8; 256]);

/// One call on the allocator.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Op {
    /// `allocate(size, 1 << (align_log2 % 17))`.
    Alloc {
        /// The size.
        size: Size,
        /// log2 of the alignment, modulo 17 (up to 64 KiB).
        align_log2: u8,
    },
    /// `release` of the live raw block `index % live`.
    Release {
        /// Which block.
        index: u16,
    },
    /// `release` of an address that is not live: inside a live block, released before (or
    /// taken by a reset), or memory the allocator never handed out.
    ReleaseUnknown {
        /// Which block to point into (or which stale address); `index % 4` picks the kind.
        index: u16,
        /// Offset in 8-byte steps (never a block start).
        offset: u8,
    },
    /// `release` of a block a scope owns: `UnknownPointer`.
    ReleaseScoped {
        /// Which scoped block.
        index: u16,
    },
    /// `allocate` with an alignment that is not a power of two, zero, or too large.
    BadAlign {
        /// Picks the alignment.
        pick: u8,
    },
    /// `allocate` of a size that overflows.
    Oversize {
        /// Subtracted from `usize::MAX`.
        less: u16,
    },
    /// Opens a scope.
    ScopeOpen,
    /// Allocates from open scope `scope % open`.
    ScopeAlloc {
        /// Which scope.
        scope: u8,
        /// Element count, modulo 3000.
        len: u16,
        /// Through which method.
        kind: ScopeKind,
    },
    /// Drops open scope `scope % open` (any order).
    ScopeClose {
        /// Which scope.
        scope: u8,
    },
    /// `trim(keep * 64)`.
    Trim {
        /// Bytes to keep, in 64-byte units.
        keep: u16,
    },
    /// `free_cached()`.
    FreeCached,
    /// `reset()` (`&mut`) or `reset_unchecked()`, after every scope is closed.
    Reset {
        /// Through `reset_unchecked`.
        unchecked: bool,
    },
    /// `allocate` on another thread (which then exits, orphaning its cache).
    ForeignAlloc {
        /// The size.
        size: Size,
    },
    /// `release` of a live raw block on another thread.
    ForeignRelease {
        /// Which block.
        index: u16,
    },
    /// An `allocator_api2` `Vec` of `len % 2000` `u32`s, filled, grown once, checked, dropped.
    Vec {
        /// Element count.
        len: u16,
    },
    /// With debug checks on: write one byte past a live raw block's requested end, then
    /// release it: `Corrupted`, and the block goes back to the system.
    Overrun {
        /// Which block.
        index: u16,
    },
}

/// A whole fuzz input.
#[derive(Debug, Clone)]
pub struct Input {
    /// The allocator's configuration.
    pub config: FuzzConfig,
    /// The calls, at most [`MAX_OPS`].
    pub ops: Vec<Op>,
}

impl Input {
    /// Decodes raw bytes (as the fuzzer gives them) into an input; `None` if too short.
    pub fn from_bytes(data: &[u8]) -> Option<Input> {
        let mut u = Unstructured::new(data);
        let config = FuzzConfig::arbitrary(&mut u).ok()?;
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_OPS {
            match Op::arbitrary(&mut u) {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        Some(Input { config, ops })
    }
}

/// Who owns a live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Handed out by `allocate`: released by `release`.
    Raw,
    /// Handed out by the scope with this id.
    Scope(u64),
}

/// A live block as the model knows it.
#[derive(Debug, Clone, Copy)]
struct LiveBlock {
    addr: usize,
    requested: usize,
    class: usize,
    tag: u8,
    owner: Owner,
    /// Bumped through the thread's arena (else a size class).
    in_arena: bool,
}

/// What the allocator should hold.
struct Model {
    cap: usize,
    limit: Option<usize>,
    debug: bool,
    /// Requests of at most this many bytes may go to the arena; 0: the arena is off.
    arena_max: usize,
    /// Live blocks of non-zero size, by address.
    live: BTreeMap<usize, LiveBlock>,
    /// Addresses released before or taken by a reset (for `ReleaseUnknown`).
    stale: Vec<usize>,
    /// Memory the allocator never handed out (for `ReleaseUnknown`).
    foreign: Box<[u64; 64]>,
    /// The most live bytes seen after any op since the last reset.
    interval_peak: usize,
    /// Another thread bumped through its arena since the last reset: its chunk is in use in
    /// this interval, and only its owner may give it back.
    foreign_arena: bool,
    /// Successful non-zero allocations: `hits + misses`.
    served: u64,
    corrupted: u64,
    next_tag: u8,
    next_scope: u64,
    peak_live: usize,
    peak_reserved: usize,
    /// The op being applied, for messages.
    step: usize,
}

/// Writes `tag` over `len` bytes at `addr`.
fn write_tag(addr: usize, len: usize, tag: u8) {
    // SAFETY: callers pass a live block the model owns, at least `len` bytes long, that no
    // reference covers.
    unsafe { core::ptr::write_bytes(addr as *mut u8, tag, len) };
}

/// The first byte of `len` at `addr` that is not `tag`.
fn first_mismatch(addr: usize, len: usize, tag: u8) -> Option<usize> {
    // SAFETY: callers pass a live block the model owns whose `len` bytes were written.
    let bytes = unsafe { core::slice::from_raw_parts(addr as *const u8, len) };
    bytes.iter().position(|&b| b != tag)
}

impl Model {
    fn class_of(&self, size: usize) -> usize {
        let padded = if self.debug { size + CANARY_LEN } else { size };
        SizeClass::for_size(padded).expect("in-range size").size()
    }

    fn live_bytes(&self) -> usize {
        self.live.values().map(|b| b.class).sum()
    }

    /// Records a new live block, checking alignment and overlap, and tags it.
    ///
    /// The block is bumped through the arena (`arena_live_blocks` grew: a request the arena
    /// serves, its bytes rounded to 64, a hit), or the request's class, or (best fit: an idle
    /// block of a larger class, counted in `oversize_hits`, never a system allocation) at most
    /// twice that: `before` and `after` (the stats around the allocation) tell which.
    fn add(
        &mut self,
        addr: usize,
        requested: usize,
        align: usize,
        owner: Owner,
        before: &Stats,
        after: &Stats,
    ) {
        let step = self.step;
        assert_eq!(
            addr % align.max(64),
            0,
            "op {step}: {addr:#x} not aligned to {align}"
        );
        let own = self.class_of(requested);
        let class = after.live_bytes - before.live_bytes;
        let in_arena = after.arena_live_blocks != before.arena_live_blocks;
        let arena_missed = !in_arena && requested <= self.arena_max && align <= ARENA_MAX_ALIGN;
        if in_arena {
            assert_eq!(
                after.arena_live_blocks,
                before.arena_live_blocks + 1,
                "op {step}"
            );
            assert!(
                requested <= self.arena_max && align <= ARENA_MAX_ALIGN,
                "op {step}: the arena (bound {}) served {requested} bytes aligned to {align}",
                self.arena_max
            );
            assert_eq!(class, granule(requested), "op {step}: arena block's bytes");
            assert_eq!(
                (after.misses, after.oversize_hits),
                (before.misses, before.oversize_hits),
                "op {step}: an arena block is a hit"
            );
            assert_eq!(
                after.hits,
                before.hits + 1,
                "op {step}: an arena block is a hit"
            );
        } else if after.oversize_hits == before.oversize_hits {
            // Its own class; or, for a request the arena missed that is most of the chunk its
            // next rewind wants, the block of that chunk's class (at most twice the request's
            // bytes, aligned as a chunk), which that rewind takes as the chunk.
            let successor = arena_missed
                && class > own
                && class <= self.class_of(2 * granule(requested))
                && addr.is_multiple_of(ARENA_MAX_ALIGN);
            assert!(
                class == own || successor,
                "op {step}: gave {class} for class {own}, neither its own nor a next chunk's"
            );
        } else {
            assert_eq!(after.oversize_hits, before.oversize_hits + 1, "op {step}");
            // Up to twice its class; any larger only under cap pressure or once the cap has
            // evicted (working-set mode: wide fit). A request the arena serves may have made
            // that pressure itself: the arena took a chunk first (from the system or the
            // cache), which the cap could not cover, and which went to the idle blocks.
            let chunk_first = requested <= self.arena_max
                && align <= ARENA_MAX_ALIGN
                && (after.system_allocs > before.system_allocs
                    || after.evictions > before.evictions);
            assert!(
                class > own
                    && (class <= 2 * own
                        || (arena_missed && class <= 2 * self.class_of(2 * granule(requested)))
                        || before.cached_bytes + own > self.cap
                        || before.working_set_mode
                        || chunk_first),
                "op {step}: best fit gave {class} for class {own}: {before:?}"
            );
            assert_eq!(after.misses, before.misses, "op {step}: best fit is a hit");
            // The arena may have taken a chunk on the way (a system allocation, no miss).
            assert!(
                after.system_allocs - before.system_allocs <= u64::from(self.arena_max > 0),
                "op {step}: {before:?} -> {after:?}"
            );
        }
        let end = addr + class;
        if let Some((_, prev)) = self.live.range(..=addr).next_back() {
            assert!(
                prev.addr + prev.class <= addr,
                "op {step}: new block {addr:#x}..{end:#x} overlaps live {prev:?}"
            );
        }
        if let Some((_, next)) = self.live.range(addr..).next() {
            assert!(
                end <= next.addr,
                "op {step}: new block {addr:#x}..{end:#x} overlaps live {next:?}"
            );
        }
        if self.debug && owner == Owner::Raw {
            assert_eq!(
                first_mismatch(addr, requested, 0xFF),
                None,
                "op {step}: debug checks on but the block is not poisoned"
            );
        }
        self.next_tag = self.next_tag.wrapping_add(1).max(1);
        let tag = self.next_tag;
        write_tag(addr, requested, tag);
        self.live.insert(
            addr,
            LiveBlock {
                addr,
                requested,
                class,
                tag,
                owner,
                in_arena,
            },
        );
        self.served += 1;
    }

    /// Removes a live block after checking its tag.
    fn remove(&mut self, addr: usize) -> LiveBlock {
        let block = self.live.remove(&addr).expect("model block");
        self.check_tag(&block);
        self.forget(addr);
        block
    }

    /// Remembers `addr` as no longer live (the last 64 such addresses are kept).
    fn forget(&mut self, addr: usize) {
        self.stale.push(addr);
        if self.stale.len() > 64 {
            self.stale.remove(0);
        }
    }

    /// Whether the allocator may still hold an arena chunk after `free_cached` or `trim`: one
    /// with a live block, or another thread's that is in use in this reset interval.
    fn arena_chunk_may_stay(&self) -> bool {
        self.foreign_arena || self.live.values().any(|b| b.in_arena)
    }

    fn check_tag(&self, b: &LiveBlock) {
        self.check_tag_range(b, 0, b.requested);
    }

    /// Checks a block's tag quickly: all of it up to 4 KiB, else its first and last 512 bytes
    /// and one byte per 512 in between (a block handed to a second holder is overwritten
    /// whole by that holder's tag).
    fn check_tag_sampled(&self, b: &LiveBlock) {
        if b.requested <= 4096 {
            return self.check_tag(b);
        }
        self.check_tag_range(b, 0, 512);
        self.check_tag_range(b, b.requested - 512, 512);
        for at in (512..b.requested - 512).step_by(512) {
            self.check_tag_range(b, at, 1);
        }
    }

    fn check_tag_range(&self, b: &LiveBlock, from: usize, len: usize) {
        if let Some(i) = first_mismatch(b.addr + from, len, b.tag) {
            let i = i + from;
            panic!(
                "op {}: byte {i} of live block {b:?} was overwritten: held by two holders?",
                self.step
            );
        }
    }

    fn nth(&self, index: u16, owner: impl Fn(Owner) -> bool) -> Option<LiveBlock> {
        let blocks: Vec<&LiveBlock> = self.live.values().filter(|b| owner(b.owner)).collect();
        if blocks.is_empty() {
            return None;
        }
        Some(*blocks[index as usize % blocks.len()])
    }

    /// Every invariant, after an op.
    fn check(&mut self, stats: &Stats, counting: &Counting) {
        let step = self.step;
        for b in self.live.values() {
            self.check_tag_sampled(b);
        }
        let live_bytes = self.live_bytes();
        let requested: usize = self.live.values().map(|b| b.requested).sum();
        assert_eq!(stats.live_blocks, self.live.len(), "op {step}: {stats:?}");
        assert_eq!(stats.live_bytes, live_bytes, "op {step}: {stats:?}");
        assert_eq!(stats.requested_bytes, requested, "op {step}: {stats:?}");
        assert_eq!(
            stats.hits + stats.misses,
            self.served,
            "op {step}: {stats:?}"
        );
        let arena_live = self.live.values().filter(|b| b.in_arena).count();
        assert_eq!(stats.arena_live_blocks, arena_live, "op {step}: {stats:?}");
        if self.arena_max == 0 {
            assert_eq!(
                stats.arena_chunks, 0,
                "op {step}: the arena is off: {stats:?}"
            );
            assert_eq!(stats.misses, stats.system_allocs, "op {step}: {stats:?}");
        } else {
            // An arena chunk is a system allocation but not a miss (no request asked for it).
            assert!(stats.misses <= stats.system_allocs, "op {step}: {stats:?}");
        }
        assert_eq!(
            stats.corrupted_blocks, self.corrupted,
            "op {step}: {stats:?}"
        );
        assert_eq!(
            stats.system_frees,
            stats.evictions + stats.corrupted_blocks,
            "op {step}: {stats:?}"
        );
        assert_books_balance(
            stats,
            counting.bytes.load(SeqCst),
            counting.blocks.load(SeqCst),
            self.cap,
            &format!("op {step}"),
        );
        if let Some(limit) = self.limit {
            assert!(
                stats.reserved_bytes <= limit,
                "op {step}: over limit: {stats:?}"
            );
        }
        self.interval_peak = self.interval_peak.max(live_bytes);
        // Peaks cover what is live now, never drop, and the interval's covers all it saw.
        for (peak, now, seen, what) in [
            (
                stats.peak_live_bytes,
                stats.live_bytes,
                self.peak_live,
                "live",
            ),
            (
                stats.peak_reserved_bytes,
                stats.reserved_bytes,
                self.peak_reserved,
                "reserved",
            ),
            (
                stats.interval_peak_bytes,
                live_bytes,
                self.interval_peak,
                "interval",
            ),
        ] {
            assert!(
                peak >= now.max(seen),
                "op {step}: {what} peak {peak} below {now} now or {seen} seen: {stats:?}"
            );
        }
        self.peak_live = stats.peak_live_bytes;
        self.peak_reserved = stats.peak_reserved_bytes;
    }

    /// After `trim(keep)` (`free_cached` is `keep == 0`): at most `keep` idle bytes of size
    /// classes stay, and an arena chunk only where one may (see `arena_chunk_may_stay`), its
    /// idle bytes counted as cached.
    fn check_freed(&self, stats: &Stats, keep: usize) {
        let step = self.step;
        if keep == 0 {
            assert_eq!(stats.cached_blocks, 0, "op {step}: {stats:?}");
        }
        if self.arena_chunk_may_stay() {
            assert!(
                stats.cached_bytes <= keep + stats.arena_chunks * MAX_CHUNK,
                "op {step}: trim({keep}) left {stats:?}"
            );
        } else {
            assert_eq!(
                stats.arena_chunks, 0,
                "op {step}: an unused chunk stayed: {stats:?}"
            );
            assert!(
                stats.cached_bytes <= keep,
                "op {step}: trim({keep}) left {stats:?}"
            );
        }
    }

    /// The outcome of an allocation of `size` (`Ok` recorded by the caller) is consistent:
    /// errors are `LimitExceeded` only when the limit really leaves no room, and change
    /// nothing live.
    fn check_alloc_error(&self, e: &AllocError, size: usize, before: &Stats, after: &Stats) {
        let step = self.step;
        match *e {
            AllocError::LimitExceeded {
                size: s,
                class_size,
                limit,
                reserved,
            } => {
                assert_eq!(s, size, "op {step}");
                assert_eq!(class_size, self.class_of(size), "op {step}");
                assert_eq!(Some(limit), self.limit, "op {step}: no limit configured");
                assert!(reserved + class_size > limit, "op {step}");
                if before.arena_chunks == 0 {
                    assert!(
                        self.live_bytes() + class_size > limit,
                        "op {step}: LimitExceeded with room: live {} + {class_size} <= {limit}: \
                         {after:?}",
                        self.live_bytes()
                    );
                    // Live bytes alone leave no room, so evicting could not help: the request
                    // is refused before anything is evicted, and nothing changes.
                    assert_unchanged(before, after, &format!("op {step}: LimitExceeded"));
                } else {
                    // An arena chunk is given back to make room only if nothing live is in it
                    // (the caller's own, or one a reset emptied); how many bytes the others
                    // hold, the model does not know. Idle blocks may have been evicted first,
                    // each counted as an eviction, but nothing live changed and nothing came
                    // from the system.
                    let live = |s: &Stats| {
                        let held = (s.live_blocks, s.live_bytes, s.requested_bytes);
                        (
                            held,
                            s.misses,
                            s.system_allocs,
                            s.system_frees - s.evictions,
                        )
                    };
                    assert_eq!(live(after), live(before), "op {step}: LimitExceeded");
                }
            }
            ref other => panic!("op {step}: allocate({size}) failed unexpectedly: {other}"),
        }
    }
}

/// Asserts that a call which failed (or asked for nothing) changed no books. It may have
/// rewound the thread's arena after a reset (an owner rewinds on its next call, whatever the
/// call), which moves the arena's old chunk into the idle blocks: where idle bytes sit changes,
/// not how many there are.
fn assert_unchanged(before: &Stats, after: &Stats, what: &str) {
    let mut expected = *before;
    if after.arena_chunks + 1 == before.arena_chunks
        && after.cached_blocks == before.cached_blocks + 1
    {
        expected.arena_chunks -= 1;
        expected.cached_blocks += 1;
    }
    assert_eq!(*after, expected, "{what} changed the books");
}

/// An address that is not a live block start: inside a live block, a stale one, or one in
/// memory the allocator never handed out.
fn unknown_addr(model: &Model, index: u16, offset: u8) -> Option<usize> {
    match index % 4 {
        0 | 2 => {
            let b = model.nth(index / 4, |_| true)?;
            // Inside the block, 8..=2040 bytes in, not 64-aligned: never a block start.
            let off = 8 + (offset as usize % 255) * 8;
            let off = if off.is_multiple_of(64) { off + 8 } else { off };
            Some(b.addr + off.min(b.class - 8))
        }
        1 => {
            let stale = *model
                .stale
                .get(index as usize / 4 % model.stale.len().max(1))?;
            (!model.live.contains_key(&stale)).then_some(stale)
        }
        _ => Some(model.foreign.as_ptr() as usize + (offset as usize % 64) * 8),
    }
}

/// The arena modes an input runs in: every one, except with debug checks, which turn the
/// arena off (so the other modes would repeat the first).
pub fn modes(input: &Input) -> &'static [ArenaMode] {
    if input.config.debug {
        &ArenaMode::ALL[..1]
    } else {
        &ArenaMode::ALL
    }
}

/// Applies every op of `input` to a fresh allocator with the arena in `mode` and to the
/// model; panics on a violation.
pub fn run(input: &Input, mode: ArenaMode) {
    let cfg = input.config;
    let counting = Arc::new(Counting::default());
    // With the arena on, a cap below one chunk would turn it off: the cap starts there.
    let cap = cfg.cap_units as usize * 256 + if mode == ArenaMode::Off { 0 } else { MIN_CHUNK };
    let limit = cfg.limit_units.map(|u| u as usize * 4096);
    // The model books every scope request as a block of its own: scope chunks off (chunked
    // scopes have their own tests in `api.rs` and `stress.rs`).
    let mut config = Config::default()
        .scope_chunk_bytes(0)
        .arena_max_bytes(mode.max_bytes())
        .arena_adaptive(mode == ArenaMode::Default)
        .max_cached_bytes(cap)
        .debug_checks(cfg.debug)
        // Working-set retention (a budget and wide fit) on half the inputs.
        .working_set_slack(cfg.cap_units.is_multiple_of(2).then_some(1.25))
        .system_allocator(counting.clone());
    if let Some(limit) = limit {
        config = config.limit_bytes(limit);
    }
    let mut alloc = CachingAllocator::with_config(config);
    let mut model = Model {
        cap,
        limit,
        debug: cfg.debug,
        arena_max: if cfg.debug { 0 } else { mode.bound() },
        live: BTreeMap::new(),
        stale: Vec::new(),
        foreign: Box::new([0; 64]),
        interval_peak: 0,
        foreign_arena: false,
        served: 0,
        corrupted: 0,
        next_tag: 0,
        next_scope: 0,
        peak_live: 0,
        peak_reserved: 0,
        step: 0,
    };
    let ops = &input.ops[..input.ops.len().min(MAX_OPS)];
    let mut i = 0;
    while i < ops.len() {
        // Ops up to the next reset share the allocator with the scopes they open.
        {
            let mut scopes: Vec<(u64, Scope<'_>)> = Vec::new();
            while i < ops.len() && !matches!(ops[i], Op::Reset { .. }) {
                model.step = i;
                apply(&alloc, &mut model, &mut scopes, ops[i]);
                model.check(&alloc.stats(), &counting);
                i += 1;
            }
            close_all(&mut model, &mut scopes);
        }
        model.check(&alloc.stats(), &counting);
        if let Some(Op::Reset { unchecked }) = ops.get(i) {
            model.step = i;
            for b in model.live.values() {
                model.check_tag(b);
            }
            let before = alloc.stats();
            if *unchecked {
                // SAFETY: no scope is alive (all closed above) and the model forgets every
                // block handed out before, so none is used or released after.
                unsafe { alloc.reset_unchecked() };
            } else {
                alloc.reset();
            }
            // The blocks are the cache's now (some may even be freed): forget them unread.
            let taken: Vec<usize> = model.live.keys().copied().collect();
            model.live.clear();
            let stats = alloc.stats();
            assert_nothing_live(&stats, &format!("op {i}: after the reset"));
            assert_eq!(
                stats.system_allocs, before.system_allocs,
                "op {i}: reset allocated"
            );
            assert_eq!(
                (
                    stats.last_interval_peak_bytes >= model.interval_peak,
                    stats.interval_peak_bytes
                ),
                (true, 0),
                "op {i}: the interval's peak ({} seen) did not move to the last one: {stats:?}",
                model.interval_peak
            );
            model.interval_peak = 0;
            model.foreign_arena = false;
            // Every block the reset took is unknown now (nothing was handed out since).
            for &addr in taken.iter().take(8) {
                // SAFETY: the reset took the block: `release` refuses it without reading it.
                let r = unsafe { alloc.release(NonNull::new(addr as *mut u8).unwrap()) };
                assert_eq!(
                    r,
                    Err(AllocError::UnknownPointer { addr }),
                    "op {i}: a block the reset took"
                );
                assert_unchanged(&stats, &alloc.stats(), &format!("op {i}: refused release"));
            }
            for addr in taken {
                model.forget(addr);
            }
            model.check(&stats, &counting);
            i += 1;
        }
    }
    alloc.free_cached();
    let stats = alloc.stats();
    model.check_freed(&stats, 0);
    model.check(&stats, &counting);
    drop(alloc);
    let held = (counting.bytes.load(SeqCst), counting.blocks.load(SeqCst));
    assert_all_given_back(held.0, held.1, "the end");
}

fn close_all(model: &mut Model, scopes: &mut Vec<(u64, Scope<'_>)>) {
    while let Some((id, scope)) = scopes.pop() {
        close(model, id, scope);
    }
}

fn close(model: &mut Model, id: u64, scope: Scope<'_>) {
    let addrs: Vec<usize> = model
        .live
        .values()
        .filter(|b| b.owner == Owner::Scope(id))
        .map(|b| b.addr)
        .collect();
    for addr in addrs {
        model.remove(addr);
    }
    drop(scope);
}

/// Applies one op (not `Reset`).
fn apply<'a>(
    alloc: &'a CachingAllocator,
    model: &mut Model,
    scopes: &mut Vec<(u64, Scope<'a>)>,
    op: Op,
) {
    let step = model.step;
    match op {
        Op::Alloc { size, align_log2 } => {
            if model.live.len() >= MAX_LIVE {
                return;
            }
            let size = size.bytes();
            let align = 1usize << (align_log2 % 17);
            let before = alloc.stats();
            match alloc.allocate(size, align) {
                Ok(p) if size == 0 => {
                    assert_eq!(p.as_ptr() as usize % align, 0, "op {step}");
                    assert_unchanged(&before, &alloc.stats(), &format!("op {step}: zero size"));
                    // SAFETY: a zero-size pointer from `allocate`; releasing it is always Ok.
                    assert_eq!(unsafe { alloc.release(p) }, Ok(()), "op {step}");
                }
                Ok(p) => {
                    let after = alloc.stats();
                    model.add(
                        p.as_ptr() as usize,
                        size,
                        align,
                        Owner::Raw,
                        &before,
                        &after,
                    )
                }
                Err(e) => model.check_alloc_error(&e, size, &before, &alloc.stats()),
            }
        }
        Op::Release { index } => {
            let Some(b) = model.nth(index, |o| o == Owner::Raw) else {
                return;
            };
            model.remove(b.addr);
            // SAFETY: a live raw block the model releases once and forgets.
            let r = unsafe { alloc.release(NonNull::new(b.addr as *mut u8).unwrap()) };
            assert_eq!(r, Ok(()), "op {step}: release of live {b:?}");
        }
        Op::ReleaseUnknown { index, offset } => {
            let Some(addr) = unknown_addr(model, index, offset) else {
                return;
            };
            let before = alloc.stats();
            // SAFETY: `addr` is not live: `release` must refuse it without touching memory.
            let r = unsafe { alloc.release(NonNull::new(addr as *mut u8).unwrap()) };
            assert_eq!(r, Err(AllocError::UnknownPointer { addr }), "op {step}");
            assert_unchanged(
                &before,
                &alloc.stats(),
                &format!("op {step}: refused release"),
            );
        }
        Op::ReleaseScoped { index } => {
            let Some(b) = model.nth(index, |o| o != Owner::Raw) else {
                return;
            };
            let before = alloc.stats();
            // SAFETY: the block belongs to a scope: `release` must refuse it.
            let r = unsafe { alloc.release(NonNull::new(b.addr as *mut u8).unwrap()) };
            assert_eq!(
                r,
                Err(AllocError::UnknownPointer { addr: b.addr }),
                "op {step}"
            );
            assert_unchanged(&before, &alloc.stats(), &format!("op {step}"));
        }
        Op::BadAlign { pick } => {
            let align = match pick % 8 {
                0 => 0,
                1 => 3,
                2 => 5,
                3 => 6,
                4 => 12,
                5 => 34,
                6 => caching_allocator::MAX_ALIGN * 2,
                _ => usize::MAX,
            };
            let before = alloc.stats();
            let r = alloc.allocate(64, align);
            assert_eq!(r, Err(AllocError::InvalidAlignment { align }), "op {step}");
            assert_unchanged(&before, &alloc.stats(), &format!("op {step}"));
        }
        Op::Oversize { less } => {
            let size = usize::MAX - less as usize;
            let before = alloc.stats();
            let r = alloc.allocate(size, 64);
            assert_eq!(
                r,
                Err(AllocError::SizeOverflow { size, align: 64 }),
                "op {step}"
            );
            assert_unchanged(&before, &alloc.stats(), &format!("op {step}"));
        }
        Op::ScopeOpen => {
            if scopes.len() < 8 {
                model.next_scope += 1;
                scopes.push((model.next_scope, alloc.scope()));
            }
        }
        Op::ScopeAlloc { scope, len, kind } => {
            if scopes.is_empty() || model.live.len() >= MAX_LIVE {
                return;
            }
            let (id, scope) = &scopes[scope as usize % scopes.len()];
            scope_alloc(model, *id, scope, len as usize % 3000, kind);
        }
        Op::ScopeClose { scope } => {
            if scopes.is_empty() {
                return;
            }
            let (id, scope) = scopes.remove(scope as usize % scopes.len());
            close(model, id, scope);
        }
        Op::Trim { keep } => {
            let keep = keep as usize * 64;
            alloc.trim(keep);
            model.check_freed(&alloc.stats(), keep);
        }
        Op::FreeCached => {
            alloc.free_cached();
            model.check_freed(&alloc.stats(), 0);
        }
        Op::Reset { .. } => unreachable!("handled by `run`"),
        Op::ForeignAlloc { size } => {
            if model.live.len() >= MAX_LIVE {
                return;
            }
            let size = size.bytes();
            let before = alloc.stats();
            let r = std::thread::scope(|s| {
                s.spawn(|| alloc.allocate(size, 64).map(|p| p.as_ptr() as usize))
                    .join()
                    .unwrap()
            });
            match r {
                Ok(addr) if size == 0 => assert_ne!(addr, 0, "op {step}"),
                Ok(addr) => {
                    let after = alloc.stats();
                    model.add(addr, size, 64, Owner::Raw, &before, &after);
                    model.foreign_arena |= after.arena_live_blocks > before.arena_live_blocks;
                }
                Err(e) => model.check_alloc_error(&e, size, &before, &alloc.stats()),
            }
        }
        Op::ForeignRelease { index } => {
            let Some(b) = model.nth(index, |o| o == Owner::Raw) else {
                return;
            };
            // `remove` offers the address to `ReleaseUnknown` as a stale pointer: a second
            // release on the owner's thread, while the first's mark waits for the owner to
            // apply it, is refused.
            model.remove(b.addr);
            let r = std::thread::scope(|s| {
                s.spawn(|| {
                    // SAFETY: a live raw block the model releases once and forgets.
                    unsafe { alloc.release(NonNull::new(b.addr as *mut u8).unwrap()) }
                })
                .join()
                .unwrap()
            });
            assert_eq!(r, Ok(()), "op {step}: foreign release of {b:?}");
        }
        Op::Vec { len } => {
            if model.live.len() >= MAX_LIVE {
                return;
            }
            vec_op(alloc, model, len as usize % 2000);
        }
        Op::Overrun { index } => {
            if !model.debug {
                return;
            }
            let Some(b) = model.nth(index, |o| o == Owner::Raw) else {
                return;
            };
            model.remove(b.addr);
            // SAFETY: the canary lies inside the block (its class was chosen for
            // `requested + CANARY_LEN`), and the block is ours.
            unsafe { *((b.addr + b.requested) as *mut u8) ^= 0x55 };
            // SAFETY: a live raw block the model releases once and forgets.
            let r = unsafe { alloc.release(NonNull::new(b.addr as *mut u8).unwrap()) };
            assert_eq!(
                r,
                Err(AllocError::Corrupted {
                    addr: b.addr,
                    requested: b.requested,
                    class_size: b.class
                }),
                "op {step}"
            );
            model.corrupted += 1;
        }
    }
}

/// Allocates `len` elements of `kind` from `scope`, checks the initial contents, and records
/// the block.
fn scope_alloc(model: &mut Model, id: u64, scope: &Scope<'_>, len: usize, kind: ScopeKind) {
    let step = model.step;
    let before = scope.allocator().stats();
    let len = if matches!(kind, ScopeKind::Uninit256) {
        len % 40
    } else {
        len
    };
    let (r, elem, align): (Result<usize, AllocError>, usize, usize) = match kind {
        ScopeKind::FillU8 => (
            scope.alloc_slice_fill(len, 0xA5u8).map(|s| {
                assert!(s.iter().all(|&x| x == 0xA5), "op {step}: fill");
                s.as_mut_ptr() as usize
            }),
            1,
            1,
        ),
        ScopeKind::FillU32 => (
            scope.alloc_slice_fill(len, 0xDEAD_BEEFu32).map(|s| {
                assert!(s.iter().all(|&x| x == 0xDEAD_BEEF), "op {step}: fill");
                s.as_mut_ptr() as usize
            }),
            4,
            4,
        ),
        ScopeKind::CopyU16 => {
            let src: Vec<u16> = (0..len as u16).collect();
            (
                scope.alloc_slice_copy(&src).map(|s| {
                    assert_eq!(&*s, &src[..], "op {step}: copy");
                    s.as_mut_ptr() as usize
                }),
                2,
                2,
            )
        }
        ScopeKind::ZeroedU64 => (
            scope.alloc_slice_zeroed::<u64>(len).map(|s| {
                assert!(s.iter().all(|&x| x == 0), "op {step}: zeroed");
                s.as_mut_ptr() as usize
            }),
            8,
            8,
        ),
        ScopeKind::Uninit3 => (
            scope
                .alloc_uninit::<[u8; 3]>(len)
                .map(|s| s.as_mut_ptr() as usize),
            3,
            1,
        ),
        ScopeKind::Uninit256 => (
            scope
                .alloc_uninit::<Aligned256>(len)
                .map(|s| s.as_mut_ptr() as usize),
            256,
            256,
        ),
    };
    let bytes = len * elem;
    match r {
        Ok(addr) if bytes == 0 => {
            assert_eq!(addr % align, 0, "op {step}");
            assert_unchanged(&before, &scope.allocator().stats(), &format!("op {step}"));
        }
        Ok(addr) => {
            let after = scope.allocator().stats();
            model.add(addr, bytes, align, Owner::Scope(id), &before, &after)
        }
        Err(e) => model.check_alloc_error(&e, bytes, &before, &scope.allocator().stats()),
    }
}

/// An `allocator_api2` vector: one allocation of `len` `u32`s, grown once, checked, dropped.
fn vec_op(alloc: &CachingAllocator, model: &mut Model, len: usize) {
    let step = model.step;
    let before = alloc.stats();
    let mut v = allocator_api2::vec::Vec::<u32, _>::new_in(alloc);
    if v.try_reserve_exact(len).is_err() {
        // Only the limit may refuse; the allocation error is opaque through the trait.
        assert!(
            model.limit.is_some(),
            "op {step}: Vec allocation failed without a limit"
        );
        assert_eq!(alloc.stats().live_blocks, before.live_blocks, "op {step}");
        return;
    };
    v.extend((0..len as u32).map(|x| x.wrapping_mul(2_654_435_761)));
    let grown = v.try_reserve_exact(len + 1).is_ok();
    if grown {
        v.push(7);
    } else {
        assert!(
            model.limit.is_some(),
            "op {step}: Vec growth failed without a limit"
        );
    }
    let served = u64::from(len > 0) + u64::from(grown);
    let taken = alloc.stats().hits + alloc.stats().misses - before.hits - before.misses;
    assert_eq!(
        taken, served,
        "op {step}: Vec took another number of blocks than it allocated"
    );
    for (i, x) in v.iter().take(len).enumerate() {
        assert_eq!(
            *x,
            (i as u32).wrapping_mul(2_654_435_761),
            "op {step}: Vec content"
        );
    }
    for b in model.live.values() {
        model.check_tag_sampled(b);
    }
    let full = alloc.stats();
    drop(v);
    model.served += served;
    let stats = alloc.stats();
    assert_eq!(
        stats.hits + stats.misses,
        full.hits + full.misses,
        "op {step}: dropping the Vec changed the requests served: {full:?} -> {stats:?}"
    );
    assert_eq!(
        stats.live_blocks,
        model.live.len(),
        "op {step}: Vec leaked a block"
    );
}

/// Decodes raw fuzzer bytes and runs them in every arena mode.
pub fn run_bytes(data: &[u8]) {
    if let Some(input) = Input::from_bytes(data) {
        for &mode in modes(&input) {
            run(&input, mode);
        }
    }
}
