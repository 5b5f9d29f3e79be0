//! The temp arena's rules: small blocks bumped through a per-thread chunk, taken back by a
//! reset in one step, released on their own thread or another one, charged to the cap.

use std::ptr::NonNull;
use std::sync::mpsc;

use caching_allocator::{AllocError, CachingAllocator, Config};

#[path = "common/books.rs"]
mod books;

fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize
}

/// `N` blocks of `size` bytes each, 64-byte aligned, allocated in order.
fn blocks<const N: usize>(alloc: &CachingAllocator, size: usize) -> [NonNull<u8>; N] {
    core::array::from_fn(|_| alloc.allocate(size, 64).unwrap())
}

/// Fills `len` bytes behind `p` with `tag`.
fn tag(p: NonNull<u8>, len: usize, tag: u8) {
    // SAFETY: the tests pass live blocks of at least `len` bytes that only they use.
    unsafe { p.as_ptr().write_bytes(tag, len) };
}

/// Whether the `len` bytes behind `p` all hold `tag`.
fn has_tag(p: NonNull<u8>, len: usize, tag: u8) -> bool {
    // SAFETY: as in `tag`.
    unsafe { core::slice::from_raw_parts(p.as_ptr(), len) }
        .iter()
        .all(|&b| b == tag)
}

#[test]
fn small_blocks_are_bumped_through_one_chunk_and_reset_in_one_step() {
    let mut alloc = CachingAllocator::new(64 << 20);
    let mut first = Vec::new();
    for call in 0..3 {
        let blocks: Vec<_> = (0..16)
            .map(|k| alloc.allocate(64 << (k % 7), 64).unwrap())
            .collect();
        // Distinct and 64-byte aligned, in one chunk.
        for (k, &p) in blocks.iter().enumerate() {
            assert_eq!(addr(p) % 64, 0);
            tag(p, 64 << (k % 7), k as u8);
        }
        for (k, &p) in blocks.iter().enumerate() {
            assert!(
                has_tag(p, 64 << (k % 7), k as u8),
                "block {k} overlaps another"
            );
        }
        if call == 0 {
            first = blocks.iter().map(|&p| addr(p)).collect();
        } else {
            // After a reset the same call gets the same memory: the arena rewound.
            assert_eq!(blocks.iter().map(|&p| addr(p)).collect::<Vec<_>>(), first);
        }
        let s = alloc.stats();
        assert_eq!((s.live_blocks, s.arena_live_blocks), (16, 16), "{s}");
        alloc.reset();
        books::assert_nothing_live(&alloc.stats(), "after the reset");
    }
    let s = alloc.stats();
    // One chunk from the system for all three calls, every block a hit.
    assert_eq!(
        (s.system_allocs, s.arena_chunks, s.hits, s.misses),
        (1, 1, 48, 0),
        "{s}"
    );
    assert_eq!(s.reserved_bytes, s.cached_bytes);
}

#[test]
fn a_reset_takes_blocks_handed_out_before_it_and_keeps_those_after() {
    let alloc = CachingAllocator::new(64 << 20);
    let before = alloc.allocate(256, 64).unwrap();
    // SAFETY: `before` is not used after the reset.
    unsafe { alloc.reset_unchecked() };
    let after = alloc.allocate(256, 64).unwrap();
    // The old block was taken: its memory serves the new one, and releasing it by its old
    // name now names the new block; so only `after` is released, and only once.
    assert_eq!(addr(before), addr(after));
    let kept = alloc.allocate(1000, 64).unwrap();
    tag(kept, 1000, 7);
    // SAFETY: released once.
    unsafe { alloc.release(after) }.unwrap();
    // SAFETY: `after` was released just above: refused without being read.
    let again = unsafe { alloc.release(after) };
    assert!(matches!(again, Err(AllocError::UnknownPointer { .. })));
    assert!(has_tag(kept, 1000, 7));
    assert_eq!(alloc.stats().live_blocks, 1);
}

#[test]
fn releasing_the_newest_block_rewinds_the_bump_and_others_wait_for_it() {
    let alloc = CachingAllocator::new(64 << 20);
    let [a, b, c] = blocks(&alloc, 100);
    // A round trip of the newest block gives its bytes back at once.
    // SAFETY: released once, not used after.
    unsafe { alloc.release(c) }.unwrap();
    let c2 = alloc.allocate(100, 64).unwrap();
    assert_eq!(addr(c2), addr(c));
    // A block below the top is marked; its bytes come back once everything above it goes.
    // SAFETY: released once, not used after.
    unsafe { alloc.release(b) }.unwrap();
    let d = alloc.allocate(100, 64).unwrap();
    assert!(
        addr(d) > addr(c2),
        "b's bytes are not free while c2 lives above them"
    );
    // SAFETY: each released once, not used after.
    unsafe {
        alloc.release(d).unwrap();
        alloc.release(c2).unwrap();
    }
    // c2 and the released b pop together: the next block sits where b was.
    let e = alloc.allocate(100, 64).unwrap();
    assert_eq!(addr(e), addr(b));
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.requested_bytes), (2, 200), "{s}");
    // SAFETY: released once each.
    unsafe {
        alloc.release(a).unwrap();
        alloc.release(e).unwrap();
    }
    assert_eq!(alloc.stats().live_bytes, 0);
}

#[test]
fn bad_releases_are_refused_at_the_call_and_change_nothing() {
    let alloc = CachingAllocator::new(64 << 20);
    let [a, b] = blocks(&alloc, 256);
    tag(a, 256, 1);
    tag(b, 256, 2);
    let before = alloc.stats();
    // Inside a live block, past the bump, and far away: never handed out.
    for bad in [addr(a) + 64, addr(b) + 256, addr(b) + 4096] {
        let p = NonNull::new(bad as *mut u8).unwrap();
        // SAFETY: `release` does not read behind a pointer it does not know.
        let r = unsafe { alloc.release(p) };
        assert_eq!(r, Err(AllocError::UnknownPointer { addr: bad }));
    }
    assert_eq!(alloc.stats(), before);
    // SAFETY: released once.
    unsafe { alloc.release(a) }.unwrap();
    // SAFETY: double release: refused.
    assert!(unsafe { alloc.release(a) }.is_err());
    assert!(has_tag(b, 256, 2));
}

#[test]
fn a_stale_pointer_never_rewinds_the_arena_under_a_live_holder() {
    let alloc = CachingAllocator::new(64 << 20);
    let [_a, b] = blocks(&alloc, 128);
    // SAFETY: nothing handed out above is used after this.
    unsafe { alloc.reset_unchecked() };
    // A new holder of the first bytes; `b`'s old address is past the bump now.
    let c = alloc.allocate(128, 64).unwrap();
    tag(c, 128, 9);
    // SAFETY: `b` was taken by the reset; `release` refuses it without reading it.
    assert!(unsafe { alloc.release(b) }.is_err());
    let d = alloc.allocate(128, 64).unwrap();
    tag(d, 128, 10);
    assert!(has_tag(c, 128, 9), "a block was handed out over a live one");
    assert_ne!(addr(c), addr(d));
}

#[test]
fn a_block_released_on_another_thread_is_checked_at_the_call_and_applied_by_its_owner() {
    let alloc = CachingAllocator::new(64 << 20);
    let [a, b] = blocks(&alloc, 512);
    tag(b, 512, 3);
    let (a_addr, inside_addr) = (addr(a), addr(b) + 64);
    let (ra, ra_again, inside) = std::thread::scope(|s| {
        s.spawn(|| {
            let a = NonNull::new(a_addr as *mut u8).unwrap();
            // SAFETY: `a` is released once here and not used after; the others are refused.
            unsafe {
                let first = alloc.release(a);
                let again = alloc.release(a);
                let inside = alloc.release(NonNull::new(inside_addr as *mut u8).unwrap());
                (first, again, inside)
            }
        })
        .join()
        .unwrap()
    });
    assert_eq!(ra, Ok(()));
    assert!(matches!(ra_again, Err(AllocError::UnknownPointer { .. })));
    assert!(matches!(inside, Err(AllocError::UnknownPointer { .. })));
    // Counted as released at once, though its owner applies it later.
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.requested_bytes), (1, 512), "{s}");
    assert!(has_tag(b, 512, 3));
    // SAFETY: released once.
    unsafe { alloc.release(b) }.unwrap();
    assert_eq!(alloc.stats().live_blocks, 0);
}

#[test]
fn a_release_on_another_thread_after_a_reset_is_unknown() {
    let alloc = CachingAllocator::new(64 << 20);
    let a = alloc.allocate(512, 64).unwrap();
    // SAFETY: `a` is not used after this (the other thread only names it).
    unsafe { alloc.reset_unchecked() };
    let a_addr = addr(a);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            let a = NonNull::new(a_addr as *mut u8).unwrap();
            // SAFETY: refused without being read.
            unsafe { alloc.release(a) }
        })
        .join()
        .unwrap()
    });
    assert_eq!(r, Err(AllocError::UnknownPointer { addr: addr(a) }));
}

#[test]
fn blocks_pass_between_threads_and_every_holder_keeps_its_bytes() {
    let alloc = CachingAllocator::new(64 << 20);
    let rounds = if cfg!(miri) { 20 } else { 2_000 };
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<(usize, usize, u8)>();
        let alloc = &alloc;
        s.spawn(move || {
            let mut mine = Vec::new();
            for i in 0..rounds {
                let len = 64 + (i * 37) % 3000;
                let p = alloc.allocate(len, 64).unwrap();
                let t = (i % 251) as u8;
                tag(p, len, t);
                if i % 3 == 0 {
                    tx.send((addr(p), len, t)).unwrap();
                } else {
                    mine.push((p, len, t));
                }
                if mine.len() > 6 {
                    let (q, len, t) = mine.remove(i % mine.len());
                    assert!(has_tag(q, len, t), "a block was handed to two holders");
                    // SAFETY: released once, not used after.
                    unsafe { alloc.release(q) }.unwrap();
                }
            }
            for (q, len, t) in mine {
                assert!(has_tag(q, len, t));
                // SAFETY: released once.
                unsafe { alloc.release(q) }.unwrap();
            }
        });
        s.spawn(move || {
            for (a, len, t) in rx {
                let p = NonNull::new(a as *mut u8).unwrap();
                assert!(has_tag(p, len, t), "a block was handed to two holders");
                // SAFETY: sent once by the allocating thread, released once here.
                unsafe { alloc.release(p) }.unwrap();
            }
        });
    });
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.live_bytes), (0, 0), "{s}");
    assert_eq!(s.reserved_bytes, s.cached_bytes + s.live_bytes, "{s}");
}

#[test]
fn the_chunk_grows_to_what_one_interval_asked_for() {
    let mut alloc = CachingAllocator::new(64 << 20);
    let call = |alloc: &CachingAllocator| {
        for _ in 0..40 {
            alloc.allocate(4096, 64).unwrap(); // 160 KiB in all: more than a first chunk
        }
    };
    call(&alloc);
    let first = alloc.stats();
    assert!(
        first.misses > 0,
        "the first chunk cannot hold it all: {first}"
    );
    alloc.reset();
    call(&alloc); // the arena rewinds into a chunk of 160 KiB
    alloc.reset();
    let warm = alloc.stats();
    call(&alloc);
    let s = alloc.stats();
    assert_eq!(
        s.system_allocs, warm.system_allocs,
        "steady state: no system allocation"
    );
    assert_eq!(s.misses, warm.misses, "{s}");
    assert_eq!(s.arena_live_blocks, 40);
}

#[test]
fn the_last_interval_peak_is_the_calls_high_water_mark() {
    // Blocks above 32 KiB go to the size classes here, so the peak sums both kinds.
    let mut alloc = CachingAllocator::with_config(Config::default().arena_max_bytes(32 << 10));
    let a = alloc.allocate(1000, 64).unwrap(); // 1024 bytes in the arena
    let _b = alloc.allocate(3000, 64).unwrap(); // 3008
                                                // SAFETY: released once.
    unsafe { alloc.release(a) }.unwrap();
    // `a`'s bytes lie below `b`, which is live: the bump cannot reuse them, so `c` goes on
    // top and the arena's peak is its bump offset, 1024 + 3008 + 128.
    let _c = alloc.allocate(100, 64).unwrap(); // 128
    let big = alloc.allocate(1 << 20, 64).unwrap(); // a size class: 1 MiB
                                                    // SAFETY: released once.
    unsafe { alloc.release(big) }.unwrap();
    let arena_peak = 1024 + 3008 + 128;
    assert_eq!(alloc.stats().interval_peak_bytes, arena_peak + (1 << 20));
    alloc.reset();
    let s = alloc.stats();
    assert_eq!(s.interval_peak_bytes, 0);
    assert_eq!(s.last_interval_peak_bytes, arena_peak + (1 << 20), "{s}");
    let _d = alloc.allocate(64, 64).unwrap();
    alloc.reset();
    assert_eq!(alloc.stats().last_interval_peak_bytes, 64);
    alloc.reset();
    assert_eq!(
        alloc.stats().last_interval_peak_bytes,
        0,
        "an empty interval"
    );
}

#[test]
fn the_chunk_counts_against_the_cap_and_a_trim_frees_it() {
    let cap = 256 << 10;
    let alloc = CachingAllocator::new(cap);
    let threads = 6; // more threads than the cap has room for chunks
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..if cfg!(miri) { 2 } else { 20 } {
                    let p = alloc.allocate(2000, 64).unwrap();
                    // SAFETY: released once.
                    unsafe { alloc.release(p) }.unwrap();
                }
            });
        }
    });
    let s = alloc.stats();
    assert!(s.cached_bytes <= cap, "{s}");
    assert!(s.arena_chunks * (64 << 10) <= cap, "{s}");
    // SAFETY: nothing is live.
    unsafe { alloc.reset_unchecked() };
    alloc.free_cached();
    let s = alloc.stats();
    assert_eq!((s.reserved_bytes, s.arena_chunks), (0, 0), "{s}");
}

/// Thread churn leaves nothing behind: the chunk of an exited thread whose arena holds nothing
/// live goes back with `free_cached`, without a reset (nobody bumps through it any more).
#[test]
fn free_cached_takes_the_chunks_of_exited_threads() {
    let alloc = std::sync::Arc::new(CachingAllocator::new(4 << 20));
    // This thread registers first, so `free_cached` registers no thread (which would forget
    // the exited ones on its own).
    let p = alloc.allocate(100, 64).unwrap();
    // SAFETY: released once.
    unsafe { alloc.release(p) }.unwrap();
    for _ in 0..if cfg!(miri) { 2 } else { 8 } {
        // `spawn` + `join`, not a scope: a join waits for the thread's locals to be dropped
        // (which marks its cache exited); a scope's end does not.
        let alloc = alloc.clone();
        std::thread::spawn(move || {
            let p = alloc.allocate(2000, 64).unwrap();
            // SAFETY: released once.
            unsafe { alloc.release(p) }.unwrap();
        })
        .join()
        .unwrap();
    }
    assert!(alloc.stats().arena_chunks >= 1);
    alloc.free_cached();
    let s = alloc.stats();
    assert_eq!((s.reserved_bytes, s.arena_chunks), (0, 0), "{s}");
    // The fallback and this thread's: the exited threads' caches are gone too.
    assert_eq!(alloc.thread_caches(), 2, "{s}");
}

#[test]
fn the_arena_can_be_turned_off_and_is_off_with_debug_checks() {
    for config in [
        Config::default().arena_max_bytes(0),
        Config::default().debug_checks(true),
        Config::default().max_cached_bytes(16 << 10),
    ] {
        let alloc = CachingAllocator::with_config(config.clone());
        let _p = alloc.allocate(100, 64).unwrap();
        let s = alloc.stats();
        assert_eq!(
            (s.arena_chunks, s.arena_live_blocks, s.misses),
            (0, 0, 1),
            "{config:?}"
        );
    }
    assert_eq!(
        Config::default().get_arena_max_bytes(),
        caching_allocator::DEFAULT_ARENA_MAX_BYTES
    );
    // Requests above the bound and large alignments go to the size classes.
    let alloc = CachingAllocator::new(64 << 20);
    let _big = alloc.allocate(caching_allocator::DEFAULT_ARENA_MAX_BYTES + 1, 64);
    let _aligned = alloc.allocate(100, 8192).unwrap();
    assert_eq!(alloc.stats().arena_live_blocks, 0);
}

/// A system allocator that refuses blocks of 64 KiB and more (so every arena chunk) and counts
/// the calls it gets.
struct NoChunks {
    calls: std::sync::atomic::AtomicUsize,
}

// SAFETY: refusing (null) is always allowed; everything else is `System`'s.
unsafe impl core::alloc::GlobalAlloc for NoChunks {
    unsafe fn alloc(&self, layout: core::alloc::Layout) -> *mut u8 {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if layout.size() >= 64 << 10 {
            return core::ptr::null_mut();
        }
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: core::alloc::Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[test]
fn without_a_chunk_small_requests_use_the_size_classes_and_ask_once_per_interval() {
    use std::sync::atomic::Ordering::Relaxed;
    let sys = std::sync::Arc::new(NoChunks {
        calls: Default::default(),
    });
    let mut alloc = CachingAllocator::with_config(Config::default().system_allocator(sys.clone()));
    for _ in 0..2 {
        for _ in 0..10 {
            let p = alloc.allocate(100, 64).unwrap(); // served by a size class
            tag(p, 100, 5);
        }
        alloc.reset();
    }
    let s = alloc.stats();
    assert_eq!((s.arena_chunks, s.misses), (0, 10), "{s}");
    // Per interval: one refused chunk, then the class blocks (10 new in the first, reused in
    // the second); no refused chunk per request.
    assert_eq!(sys.calls.load(Relaxed), 1 + 10 + 1, "{s}");
}

#[test]
fn releases_that_rewind_the_bump_keep_the_hit_count() {
    let alloc = CachingAllocator::new(64 << 20);
    let [a, b, c] = blocks(&alloc, 256);
    assert_eq!(alloc.stats().arena_live_blocks, 3);
    // SAFETY: each released once, not used after.
    unsafe {
        alloc.release(b).unwrap(); // below the top: marked
        alloc.release(c).unwrap(); // the top: c and b pop together
    }
    let s = alloc.stats();
    assert_eq!((s.hits, s.misses, s.live_blocks), (3, 0, 1), "{s}");
    // SAFETY: released once.
    unsafe { alloc.release(a) }.unwrap();
    assert_eq!(alloc.stats().hits, 3);
}

#[test]
fn an_idle_chunk_makes_room_under_the_limit() {
    let limit = 160 << 10;
    let big = 128 << 10;
    let class = caching_allocator::SizeClass::for_size(big).unwrap().size();
    assert!(
        class <= limit && class + (64 << 10) > limit,
        "the chunk must be in the way"
    );
    let alloc = CachingAllocator::with_config(Config::default().limit_bytes(limit));
    let p = alloc.allocate(100, 64).unwrap();
    // SAFETY: released once.
    unsafe { alloc.release(p) }.unwrap();
    let s = alloc.stats();
    assert_eq!((s.live_bytes, s.arena_chunks), (0, 1), "{s}");
    let q = alloc.allocate(big, 64);
    assert!(q.is_ok(), "{q:?} with nothing live: {}", alloc.stats());
}

#[test]
fn a_block_released_on_another_thread_cannot_be_released_again_by_its_owner() {
    let alloc = CachingAllocator::new(64 << 20);
    let [a, _b] = blocks(&alloc, 512);
    let a_addr = addr(a);
    let first = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: released once here; the owner's second release below must be refused.
            unsafe { alloc.release(NonNull::new(a_addr as *mut u8).unwrap()) }
        })
        .join()
        .unwrap()
    });
    assert_eq!(first, Ok(()));
    let before = alloc.stats();
    // SAFETY: `a` was released above: refused without being read.
    let again = unsafe { alloc.release(a) };
    assert_eq!(again, Err(AllocError::UnknownPointer { addr: a_addr }));
    assert_eq!(alloc.stats(), before);
}

/// ExecuTorch's decode scratch: a small buffer and one that grows by 4 KiB a token, reset
/// after every call (`tokens` tokens, 4 calls each), under a 10 MiB cap with the working-set
/// budget, as its runner configures it, on top of `config`. `before_reset(t, alloc)` runs
/// after each call of token `t`, its blocks live. Returns the stats and the largest call's
/// bytes.
fn growing_decode(
    config: Config,
    tokens: usize,
    mut before_reset: impl FnMut(usize, &CachingAllocator),
) -> (caching_allocator::Stats, usize) {
    let mut alloc = CachingAllocator::with_config(
        config
            .max_cached_bytes(10 << 20)
            .working_set_slack(Some(caching_allocator::DEFAULT_WORKING_SET_SLACK)),
    );
    let mut largest = 0;
    for t in 1..=tokens {
        let sizes = [8 * (t + 130) * 4, 8 * t * 128 * 4];
        largest = largest.max(sizes[0] + sizes[1]);
        for _ in 0..4 {
            for size in sizes {
                tag(alloc.allocate(size, 64).unwrap(), 64, t as u8);
            }
            before_reset(t, &alloc);
            alloc.reset();
        }
    }
    (alloc.stats(), largest)
}

#[test]
fn a_growing_buffer_moves_to_a_larger_chunk_before_it_overflows() {
    let tokens = if cfg!(miri) { 24 } else { 512 };
    let config = Config::default().arena_max_bytes(caching_allocator::MAX_ARENA_BYTES);
    let (s, largest) = growing_decode(config, tokens, |_, _| {});
    // The chunk grows at a rewind while it still has room, so the old one is idle (and goes)
    // when the new one comes: growing after an overflow would hold both at once.
    assert!(
        s.peak_reserved_bytes as f64 <= 1.25 * largest as f64,
        "peak reserved {} for calls of at most {largest} bytes: {s}",
        s.peak_reserved_bytes
    );
    // Both buffers live in the arena: no block of a size class was ever needed (chunks are
    // not misses), and each growth took one system allocation.
    assert_eq!(s.misses, 0, "{s}");
    assert!(s.system_allocs <= 64, "{s}");
}

#[test]
fn a_large_request_the_chunk_misses_gets_the_block_that_becomes_the_next_chunk() {
    let mut alloc = CachingAllocator::with_config(
        Config::default()
            .max_cached_bytes(10 << 20)
            .arena_max_bytes(caching_allocator::MAX_ARENA_BYTES),
    );
    // A thread's first request gets a chunk that holds it.
    let first = alloc.allocate(100 << 10, 64).unwrap();
    alloc.reset();
    let s = alloc.stats();
    assert_eq!(
        (s.system_allocs, s.misses, s.arena_chunks),
        (1, 0, 1),
        "{s}"
    );
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let p = alloc.allocate(1 << 20, 64).unwrap();
        tag(p, 1 << 20, 7);
        addrs.push(addr(p));
        alloc.reset();
    }
    // The first 1 MiB block (the first chunk could not take it) was sized and aligned as the
    // chunk the next rewind wanted, which took it back as that chunk: the same memory every
    // call, two system allocations in all (the first chunk and that block).
    assert_ne!(addrs[0], addr(first));
    assert_eq!((addrs[0], addrs[0]), (addrs[1], addrs[2]));
    let s = alloc.stats();
    assert_eq!((s.system_allocs, s.misses), (2, 1), "{s}");
    assert!(
        s.reserved_bytes <= (1 << 20) + (1 << 20) / 4 + (64 << 10),
        "{s}"
    );
}

/// The bytes of a block of `size` that `calls_of` tags: all of them, or under Miri (where every
/// byte costs) its first 4 KiB.
fn tagged(size: usize) -> usize {
    if cfg!(miri) {
        size.min(4096)
    } else {
        size
    }
}

/// Calls of the given sizes, each byte of each block tagged and checked, then a reset: `calls`
/// times on an allocator built from `config`. Returns each call's `arena_live_blocks` (taken
/// before its reset) and the stats at the end.
fn calls_of(
    config: Config,
    sizes: &[usize],
    calls: usize,
) -> (Vec<usize>, caching_allocator::Stats) {
    let mut alloc = CachingAllocator::with_config(config);
    let mut in_arena = Vec::new();
    for call in 0..calls {
        let blocks: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(k, &size)| {
                let p = alloc.allocate(size, 64).unwrap();
                tag(p, tagged(size), (call + k) as u8);
                p
            })
            .collect();
        for (k, (&p, &size)) in blocks.iter().zip(sizes).enumerate() {
            assert!(
                has_tag(p, tagged(size), (call + k) as u8),
                "call {call}: block {k} overlaps"
            );
        }
        in_arena.push(alloc.stats().arena_live_blocks);
        alloc.reset();
    }
    (in_arena, alloc.stats())
}

#[test]
fn the_default_arena_takes_a_calls_large_blocks_once_they_fit_a_chunk() {
    let calls = if cfg!(miri) { 4 } else { 12 };
    // ExecuTorch's decode call at 8 threads: 20 KiB and 2 MiB.
    let sizes = [20 << 10, 2 << 20];
    let (in_arena, s) = calls_of(Config::default(), &sizes, calls);
    // The first call is the size classes' for the large block (nothing is known yet); from
    // the second on, both blocks are bumped through one chunk.
    assert_eq!(in_arena[0], 1, "{in_arena:?}");
    assert!(in_arena[1..].iter().all(|&n| n == 2), "{in_arena:?}");
    // Three system allocations in all: the first chunk, the first call's 2 MiB block (idle
    // since, evicted first when the cap needs room) and the chunk that holds both blocks.
    assert!(s.system_allocs <= 3, "{s}");
    assert!(s.reserved_bytes <= (4 << 20) + (512 << 10), "{s}");

    // The same calls with the adaptive part off: the large block is always a size class's.
    let fixed = Config::default().arena_adaptive(false);
    let (in_arena, _) = calls_of(fixed, &sizes, calls);
    assert!(in_arena.iter().all(|&n| n == 1), "{in_arena:?}");
}

#[test]
fn calls_that_outgrow_a_chunk_keep_their_large_blocks_in_the_size_classes() {
    let calls = if cfg!(miri) { 4 } else { 12 };
    // 4.5 MiB a call: more than the largest chunk holds.
    let sizes = [1536 << 10, 1536 << 10, 1536 << 10];
    let (in_arena, s) = calls_of(Config::default(), &sizes, calls);
    // After the first call the arena knows the calls do not fit and leaves them alone.
    assert!(in_arena[1..].iter().all(|&n| n == 0), "{in_arena:?}");
    // And its chunk did not grow for them: what is held is the three blocks and at most the
    // smallest chunk.
    assert!(s.reserved_bytes <= 3 * (2 << 20) + (64 << 10), "{s}");
}

#[test]
fn calls_of_many_large_blocks_keep_them_in_the_size_classes() {
    let calls = if cfg!(miri) { 4 } else { 12 };
    // Three blocks of 256 KiB: they would fit a chunk, but a kernel's large scratch is a
    // buffer or two, and many large blocks packed in one chunk measured slower.
    let sizes = [20 << 10, 256 << 10, 256 << 10, 256 << 10];
    let (in_arena, _) = calls_of(Config::default(), &sizes, calls);
    assert!(in_arena.iter().all(|&n| n == 1), "{in_arena:?}");
    // Two are a kernel's buffers: the arena takes them from the second call on.
    let (in_arena, _) = calls_of(Config::default(), &sizes[..3], calls);
    assert!(in_arena[1..].iter().all(|&n| n == 3), "{in_arena:?}");
}

#[test]
fn a_decode_whose_buffer_grows_stays_in_the_default_arena() {
    // `growing_decode`'s calls with the default configuration: after the first call both
    // buffers are the arena's, and the chunk grows ahead of them.
    let tokens = if cfg!(miri) { 24 } else { 512 };
    let (s, largest) = growing_decode(Config::default(), tokens, |t, alloc| {
        if t > 1 {
            assert_eq!(alloc.stats().arena_live_blocks, 2, "token {t}");
        }
    });
    assert!(
        s.peak_reserved_bytes as f64 <= 1.25 * largest as f64 + (64 << 10) as f64,
        "peak reserved {} for calls of at most {largest} bytes: {s}",
        s.peak_reserved_bytes
    );
    assert!(s.system_allocs <= 64, "{s}");
}

/// ExecuTorch's SDPA decode scratch (op_sdpa_impl.h, int8 KV cache, one query row) for a KV
/// length `kv`: the accumulator (`[scores kvSplit][max][sum][out head_dim]` a thread) and the
/// dequantized keys or values (`kvSplit x head_dim` a thread), in bytes, sized for `threads`.
fn sdpa_decode_scratch(kv: usize, threads: usize) -> [usize; 2] {
    const KV_SPLIT: usize = 512;
    const HEAD_DIM: usize = 64;
    let split = kv.min(KV_SPLIT);
    let accum = threads * (split + 2 + HEAD_DIM) * 4;
    let dequant = threads * split * HEAD_DIM * 4;
    [accum, dequant]
}

/// Minor page faults of the calling thread so far.
#[cfg(all(target_os = "linux", not(miri)))]
fn thread_minor_faults() -> u64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is given (all-zero is a
    // valid `rusage`: integers and `timeval`s).
    let usage = unsafe {
        let mut usage: libc::rusage = core::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
        usage
    };
    usage.ru_minflt as u64
}

/// `scripts/executorch-programs.sh`'s `sdpa_decode` program in Rust: one execute per KV length
/// 1, 41, ..., 601 (its `--quick` stride), each a reset and then `layers` kernel calls, each
/// call the two scratch blocks of `sdpa_decode_scratch` at 8 threads and a reset. The kernel
/// has 3 heads, so it writes only the first 3 of the 8 slabs of each block: 5/8 of what it asks
/// for is never written, and which pages those are moves with the KV length.
fn sdpa_decode_executes(alloc: &mut CachingAllocator, layers: usize) {
    const THREADS: usize = 8;
    const HEADS: usize = 3;
    for kv in (1..=601).step_by(40) {
        alloc.reset();
        for layer in 0..layers {
            let sizes = sdpa_decode_scratch(kv, THREADS);
            for (k, size) in sizes.into_iter().enumerate() {
                let p = alloc.allocate(size, 64).unwrap();
                let slab = size / THREADS;
                for head in 0..HEADS {
                    // SAFETY: slab `head` lies inside the live block of `size` bytes.
                    let s = unsafe { NonNull::new_unchecked(p.as_ptr().add(head * slab)) };
                    tag(s, tagged(slab), (layer + k) as u8);
                }
            }
            alloc.reset();
        }
    }
}

/// After one round of the decode program (the warm-up), the adaptive arena takes nothing from
/// the system and the kernel's writes fault in no page: its chunk grew during the warm-up, and
/// the early executes' layouts, replayed on the final chunk, write pages the late executes'
/// layouts (the same bytes, cut into other slabs) left unwritten. Those pages must be in
/// memory already, as a fixed buffer's would be, or each costs a page fault after warm-up.
#[test]
fn the_decode_program_faults_in_no_page_after_its_warm_up() {
    let layers = if cfg!(miri) { 1 } else { 2 };
    // As `ExecuTorchTempAllocator` configures it (crates/capi/include).
    let mut alloc = CachingAllocator::with_config(
        Config::default()
            .max_cached_bytes(64 << 20)
            .working_set_slack(Some(caching_allocator::DEFAULT_WORKING_SET_SLACK)),
    );
    sdpa_decode_executes(&mut alloc, layers); // warm-up
    let before = alloc.stats();
    #[cfg(all(target_os = "linux", not(miri)))]
    let faults = thread_minor_faults();
    for _ in 0..2 {
        sdpa_decode_executes(&mut alloc, layers);
    }
    #[cfg(all(target_os = "linux", not(miri)))]
    let faults = thread_minor_faults() - faults;
    let after = alloc.stats();
    assert_eq!(after.system_allocs, before.system_allocs, "{after}");
    assert!(after.arena_chunks >= 1, "the arena took the calls: {after}");
    // Sanitizers keep shadow memory of their own, which may fault in on any access.
    #[cfg(all(target_os = "linux", not(miri)))]
    if std::env::var_os("CA_SANITIZER").is_none() {
        assert_eq!(faults, 0, "page faults after warm-up: {after}");
    }
}
