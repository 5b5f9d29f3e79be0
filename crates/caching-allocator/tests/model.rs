//! Random sequences of operations against a simple model of what must hold, with the
//! per-thread arena off (every block a size class the model predicts) and on (a small block
//! may be bumped through the arena's chunk instead: the stats around each call say which).

use std::ptr::NonNull;

use caching_allocator::{CachingAllocator, Config, SizeClass, Stats, DEFAULT_ARENA_MAX_BYTES};
use proptest::prelude::*;

#[path = "common/books.rs"]
mod books;

#[derive(Clone, Debug)]
enum Op {
    Allocate { size: usize, align_log2: u32 },
    Release(usize),
    ReleaseTwice(usize),
    Reset,
    Scope(Vec<usize>),
    Trim(usize),
    FreeCached,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![0usize..200, 200usize..70_000], 0u32..13)
            .prop_map(|(size, align_log2)| Op::Allocate { size, align_log2 }),
        3 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::ReleaseTwice),
        1 => Just(Op::Reset),
        2 => prop::collection::vec(0usize..10_000, 0..5).prop_map(Op::Scope),
        1 => (0usize..300_000).prop_map(Op::Trim),
        1 => Just(Op::FreeCached),
    ]
}

struct Held {
    ptr: NonNull<u8>,
    size: usize,
    align: usize,
    tag: u8,
    /// The size of the block that serves it: its class, or a larger one (best fit), or in the
    /// arena its size rounded to 64 bytes.
    block: usize,
    /// Bumped through the arena.
    in_arena: bool,
}

/// The block a successful allocation took, from the stats around it, and whether it is in the
/// arena: there (`arena_live_blocks` grew) the request rounded to 64 bytes, a hit; else its own
/// class, or (best fit, counted in `oversize_hits`) an idle block of a larger class up to
/// twice that (any larger one only under cap pressure, in working-set mode, or after the arena
/// took a chunk the cap could not cover), never a new system block beyond that chunk.
fn block_taken(
    size: usize,
    arena_missed: bool,
    debug: bool,
    cap: usize,
    before: &Stats,
    after: &Stats,
) -> (usize, bool) {
    if size == 0 {
        return (0, false);
    }
    let block = after.live_bytes - before.live_bytes;
    let class = class_size(size, debug);
    if after.arena_live_blocks != before.arena_live_blocks {
        assert_eq!(after.arena_live_blocks, before.arena_live_blocks + 1);
        assert_eq!(
            block,
            size.next_multiple_of(64),
            "an arena block's bytes: {after}"
        );
        assert_eq!(
            (after.misses, after.oversize_hits),
            (before.misses, before.oversize_hits),
            "an arena block is a hit: {after}"
        );
        return (block, true);
    }
    let chunk_first =
        after.system_allocs > before.system_allocs || after.evictions > before.evictions;
    // The block of the chunk the arena's next rewind wants, for a request that is most of it:
    // at most the class of twice the request's bytes.
    let successor = class_size(2 * size.next_multiple_of(64), debug);
    if after.oversize_hits == before.oversize_hits {
        assert!(
            block == class || (arena_missed && block > class && block <= successor),
            "no best fit, so the request's own class or the next chunk's: {block} for {class}: \
             {after}"
        );
    } else {
        assert_eq!(after.oversize_hits, before.oversize_hits + 1);
        assert!(
            block > class
                && (block <= 2 * class
                    || (arena_missed && block <= 2 * successor)
                    || before.cached_bytes + class > cap
                    || before.working_set_mode
                    || (chunk_first && before.arena_chunks == 0)),
            "best fit {block} for class {class}: {before}"
        );
        assert_eq!(after.misses, before.misses, "best fit is a hit");
        assert!(
            after.system_allocs <= before.system_allocs + 1,
            "at most the arena's chunk"
        );
    }
    (block, false)
}

fn fill(p: NonNull<u8>, len: usize, tag: u8) {
    // SAFETY: `p` is a live block of at least `len` bytes that the model holds alone.
    unsafe { p.as_ptr().write_bytes(tag, len) }
}

fn intact(h: &Held) -> bool {
    // SAFETY: as in `fill`.
    let bytes = unsafe { std::slice::from_raw_parts(h.ptr.as_ptr(), h.size) };
    bytes.iter().all(|&b| b == h.tag)
}

fn class_size(size: usize, debug: bool) -> usize {
    SizeClass::for_size(size + if debug { 16 } else { 0 })
        .unwrap()
        .size()
}

/// Every invariant after an op; `arena` is the configured `arena_max_bytes`.
fn check(
    alloc: &CachingAllocator,
    held: &[Held],
    cap: usize,
    debug: bool,
    takes: u64,
    arena: usize,
) {
    let s = alloc.stats();
    let real: Vec<&Held> = held.iter().filter(|h| h.size > 0).collect();
    assert_eq!(s.live_blocks, real.len(), "{s}");
    assert_eq!(s.live_bytes, real.iter().map(|h| h.block).sum::<usize>());
    let in_arena = real.iter().filter(|h| h.in_arena).count();
    assert_eq!(s.arena_live_blocks, in_arena, "{s}");
    // Each block is its request's class or (best fit) a larger one, or bumped in the arena.
    for h in &real {
        assert!(h.in_arena || h.block >= class_size(h.size, debug));
    }
    assert_eq!(
        s.requested_bytes,
        real.iter().map(|h| h.size).sum::<usize>()
    );
    assert!(s.cached_bytes <= cap, "cap {cap}: {s}");
    assert_eq!(s.reserved_bytes, s.live_bytes + s.cached_bytes, "{s}");
    assert_eq!(s.hits + s.misses, takes, "{s}");
    if arena == 0 {
        assert_eq!(s.system_allocs, s.misses, "{s}");
    } else {
        // An arena chunk is a system allocation but no miss.
        assert!(s.misses <= s.system_allocs, "{s}");
    }
    assert!(s.peak_live_bytes >= s.live_bytes && s.peak_reserved_bytes >= s.reserved_bytes);
    let mut spans: Vec<(usize, usize)> = real
        .iter()
        .map(|h| (h.ptr.as_ptr() as usize, h.size))
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "live blocks overlap: {w:?}");
    }
    for h in held {
        assert_eq!(h.ptr.as_ptr() as usize % h.align.max(64), 0);
        assert!(intact(h), "a live block's contents changed");
    }
}

/// Whether nothing may keep an arena chunk after a trim: no held block lives in one (this
/// test runs on one thread, whose idle chunk a trim gives back).
fn no_chunk_in_use(held: &[Held]) -> bool {
    !held.iter().any(|h| h.in_arena)
}

fn run(ops: Vec<Op>, cap: usize, debug: bool, arena: usize, peak_bound: bool) {
    let mut alloc =
        // Scope requests as blocks of their own (chunks off): what the model books.
        CachingAllocator::with_config(
            Config::default()
                .arena_max_bytes(arena)
                .arena_adaptive(arena == DEFAULT_ARENA_MAX_BYTES)
                .scope_chunk_bytes(0)
                .max_cached_bytes(cap)
                .evict_before_new_peak(peak_bound)
                .debug_checks(debug),
        );
    let mut held: Vec<Held> = Vec::new();
    let mut tag = 0u8;
    let mut takes = 0u64;
    for op in ops {
        tag = tag.wrapping_add(1);
        match op {
            Op::Allocate { size, align_log2 } => {
                let align = 1 << align_log2;
                let before = alloc.stats();
                let ptr = alloc.allocate(size, align).unwrap();
                // A request the arena serves that it missed may get the block its next chunk is.
                // With the default bound the arena is adaptive: it may take (and miss) larger
                // requests too.
                let bound = if arena == DEFAULT_ARENA_MAX_BYTES {
                    caching_allocator::ADAPTIVE_ARENA_MAX_BYTES
                } else {
                    arena
                };
                let arena_missed = size <= bound && align <= 4096 && !debug && arena > 0;
                let (block, in_arena) =
                    block_taken(size, arena_missed, debug, cap, &before, &alloc.stats());
                fill(ptr, size, tag);
                takes += u64::from(size > 0);
                held.push(Held {
                    ptr,
                    size,
                    align,
                    tag,
                    block,
                    in_arena,
                });
            }
            Op::Release(i) | Op::ReleaseTwice(i) if !held.is_empty() => {
                let h = held.swap_remove(i % held.len());
                assert!(intact(&h));
                // SAFETY: the model holds `h` alone and drops it here.
                assert_eq!(unsafe { alloc.release(h.ptr) }, Ok(()));
                if matches!(op, Op::ReleaseTwice(_)) && h.size > 0 {
                    let before = alloc.stats();
                    // SAFETY: releasing a released pointer is an error, never a read.
                    assert!(unsafe { alloc.release(h.ptr) }.is_err());
                    assert_eq!(alloc.stats(), before);
                }
            }
            Op::Release(_) | Op::ReleaseTwice(_) => {}
            Op::Reset => {
                alloc.reset();
                held.clear();
                books::assert_nothing_live(&alloc.stats(), "after a reset");
            }
            Op::Scope(sizes) => {
                let scope = alloc.scope();
                let mut slices = Vec::new();
                for (k, &n) in sizes.iter().enumerate() {
                    let v = scope
                        .alloc_slice_fill(n, tag.wrapping_add(k as u8))
                        .unwrap();
                    takes += u64::from(n > 0);
                    slices.push(v);
                }
                for (k, v) in slices.iter().enumerate() {
                    assert!(v.iter().all(|&b| b == tag.wrapping_add(k as u8)));
                }
                let in_scope = sizes.iter().filter(|&&n| n > 0).count();
                let held_blocks = held.iter().filter(|h| h.size > 0).count();
                assert_eq!(alloc.stats().live_blocks, held_blocks + in_scope);
            }
            Op::Trim(keep) => {
                alloc.trim(keep);
                let s = alloc.stats();
                if no_chunk_in_use(&held) {
                    assert!(
                        s.cached_bytes <= keep && s.arena_chunks == 0,
                        "trim({keep}): {s}"
                    );
                }
            }
            Op::FreeCached => {
                alloc.free_cached();
                let s = alloc.stats();
                assert_eq!(s.cached_blocks, 0, "{s}");
                if no_chunk_in_use(&held) {
                    assert_eq!((s.cached_bytes, s.arena_chunks), (0, 0), "{s}");
                }
            }
        }
        check(&alloc, &held, cap, debug, takes, arena);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn model_holds(ops in prop::collection::vec(op(), 1..if cfg!(miri) { 12 } else { 60 }),
                   cap in prop_oneof![Just(0usize), 1usize..200_000, Just(64 << 20)],
                   debug in any::<bool>(),
                   arena in prop_oneof![Just(0usize), Just(256), Just(DEFAULT_ARENA_MAX_BYTES)],
                   peak_bound in any::<bool>()) {
        run(ops, cap, debug, arena, peak_bound);
    }
}
