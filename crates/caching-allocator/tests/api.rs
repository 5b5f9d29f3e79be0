//! One test per behaviour of the core issue, and ExecuTorch's scenarios adapted to size classes.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use caching_allocator::{AllocError, CachingAllocator, Config, SizeClass, Stats, MAX_ALIGN};

#[path = "common/counting.rs"]
mod counting;
use counting::Counting;

fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize
}

/// Writes `len` bytes and reads them back (under Miri, which interprets every byte, a sample).
fn write_read(p: NonNull<u8>, len: usize, tag: u8) {
    let step = if cfg!(miri) { 509 } else { 1 };
    // SAFETY: callers pass a live block of at least `len` bytes.
    unsafe {
        p.as_ptr().write_bytes(tag, len);
        let s = std::slice::from_raw_parts(p.as_ptr(), len);
        assert!(s.iter().step_by(step).all(|&b| b == tag));
        assert_eq!(s[len - 1], tag);
    }
}

/// An allocator whose requests all go through the size classes (no arena): what the tests of
/// classes, best fit, eviction and cross-thread block flow are about.
fn classes(max_cached_bytes: usize) -> CachingAllocator {
    CachingAllocator::with_config(
        Config::default()
            .max_cached_bytes(max_cached_bytes)
            .arena_max_bytes(0),
    )
}

/// Allocates `size` bytes (debug checks on) and writes one byte past them, inside the canary's
/// room of its class (`class_size` bytes); returns the block and the error that names it.
fn overrun(alloc: &CachingAllocator, size: usize, class_size: usize) -> (NonNull<u8>, AllocError) {
    let p = alloc.allocate(size, 64).unwrap();
    // SAFETY: one byte past the requested end lies inside the class (the canary's room).
    unsafe { p.as_ptr().add(size).write(0) };
    let corrupted = AllocError::Corrupted {
        addr: addr(p),
        requested: size,
        class_size,
    };
    (p, corrupted)
}

fn counted(config: Config) -> (CachingAllocator, Arc<Counting>) {
    let counting = Arc::new(Counting::default());
    let alloc = CachingAllocator::with_config(config.system_allocator(counting.clone()));
    (alloc, counting)
}

// ---- behaviour 1: size classes -------------------------------------------------------

#[test]
fn a_cached_block_serves_any_size_of_its_class() {
    let mut alloc = classes(1 << 20);
    let p = alloc.allocate(5000, 64).unwrap();
    alloc.reset();
    // 5000 and 5100 share the 5120-byte class.
    assert_eq!(SizeClass::for_size(5000), SizeClass::for_size(5100));
    let q = alloc.allocate(5100, 64).unwrap();
    assert_eq!(addr(p), addr(q));
    let s = alloc.stats();
    assert_eq!((s.hits, s.misses, s.system_allocs), (1, 1, 1));
    assert_eq!(s.live_bytes, 5120);
    assert_eq!(s.requested_bytes, 5100);
}

#[test]
fn decode_like_growing_sizes_hit_after_the_first_of_each_class() {
    let mut alloc = classes(64 << 20);
    let mut classes = std::collections::HashSet::new();
    let step = if cfg!(miri) { 37 } else { 1 };
    for t in (1..512usize).step_by(step) {
        let size = 8 * (t * 64 + 2 * 32 + 32 * 128) * 4;
        classes.insert(SizeClass::for_size(size).unwrap());
        alloc.allocate(size, 64).unwrap();
        alloc.reset();
    }
    assert_eq!(alloc.stats().system_allocs as usize, classes.len());
    assert!(classes.len() <= 32, "{} classes", classes.len());
}

// ---- behaviour 2: alignment ----------------------------------------------------------

#[test]
fn alignment_is_honoured_up_to_2_mib() {
    let alloc = CachingAllocator::new(64 << 20);
    let mut align = 1;
    while align <= MAX_ALIGN {
        let p = alloc.allocate(100, align).unwrap();
        assert_eq!(addr(p) % align.max(64), 0, "align {align}");
        write_read(p, 100, 7);
        align *= 2;
    }
}

#[test]
fn a_cached_block_is_reused_only_if_aligned_enough() {
    let mut alloc = CachingAllocator::new(64 << 20);
    let mut small = Vec::new();
    for _ in 0..8 {
        small.push(alloc.allocate(100, 64).unwrap());
    }
    alloc.reset();
    let p = alloc.allocate(100, 4096).unwrap();
    assert_eq!(addr(p) % 4096, 0);
    // (100, 256) vs (100, 512): both aligned as asked, distinct blocks.
    let a = alloc.allocate(100, 256).unwrap();
    let b = alloc.allocate(100, 512).unwrap();
    assert_ne!(addr(a), addr(b));
    assert_eq!(addr(a) % 256, 0);
    assert_eq!(addr(b) % 512, 0);
}

#[test]
fn invalid_alignments_fail_and_change_nothing() {
    let alloc = CachingAllocator::new(1 << 20);
    let before = alloc.stats();
    for align in [0, 5, 6, 12, 34, MAX_ALIGN * 2, usize::MAX] {
        assert_eq!(
            alloc.allocate(64, align),
            Err(AllocError::InvalidAlignment { align })
        );
    }
    assert_eq!(alloc.stats(), before);
    let msg = AllocError::InvalidAlignment { align: 6 }.to_string();
    assert!(msg.contains("power of two"), "{msg}");
}

// ---- behaviour 3: size 0 -------------------------------------------------------------

#[test]
fn zero_size_is_aligned_touches_nothing_and_releases_ok() {
    let (alloc, counting) = counted(Config::default());
    for align in [1, 64, 4096, MAX_ALIGN] {
        let p = alloc.allocate(0, align).unwrap();
        assert_eq!(addr(p) % align, 0);
        // SAFETY: `p` is from `allocate`.
        assert_eq!(unsafe { alloc.release(p) }, Ok(()));
    }
    assert_eq!(counting.allocs.load(Ordering::SeqCst), 0);
    assert_eq!(alloc.stats().live_blocks, 0);
}

// ---- behaviour 4: overflow -----------------------------------------------------------

#[test]
fn sizes_that_overflow_fail_and_change_nothing() {
    let alloc = CachingAllocator::new(1 << 20);
    drop(alloc.scope()); // this thread's cache exists from here on
    let before = alloc.stats();
    for size in [usize::MAX, isize::MAX as usize, (isize::MAX as usize) - 10] {
        assert_eq!(
            alloc.allocate(size, 64),
            Err(AllocError::SizeOverflow { size, align: 64 })
        );
    }
    let scope = alloc.scope();
    assert!(matches!(
        scope.alloc_uninit::<u64>(usize::MAX / 4),
        Err(AllocError::SizeOverflow { .. })
    ));
    drop(scope);
    assert_eq!(alloc.stats(), before);
}

// ---- behaviour 5: the cap ------------------------------------------------------------

#[test]
fn cap_evicts_least_recently_used_and_never_refuses_live_memory() {
    let (mut alloc, counting) = counted(Config::default().max_cached_bytes(1024));
    // ExecuTorch's "cap 1 KiB still serves three 512-byte blocks".
    let blocks: Vec<_> = (0..3).map(|_| alloc.allocate(512, 64).unwrap()).collect();
    assert_eq!(alloc.stats().live_bytes, 1536);
    for (i, p) in blocks.iter().enumerate() {
        write_read(*p, 512, i as u8);
    }
    alloc.reset();
    let s = alloc.stats();
    assert!(s.cached_bytes <= 1024, "{s}");
    assert_eq!(s.cached_bytes, 1024);
    assert_eq!(s.evictions, 1);
    assert_eq!(counting.bytes.load(Ordering::SeqCst), 1024);
}

#[test]
fn cap_keeps_recent_blocks_and_evicts_old_ones() {
    let alloc = CachingAllocator::new(3 * 4096);
    let old = alloc.allocate(4096, 64).unwrap();
    // SAFETY: each pointer is released once.
    unsafe { alloc.release(old).unwrap() };
    let mut newer = Vec::new();
    for _ in 0..3 {
        newer.push(alloc.allocate(4096 + 512, 64).unwrap()); // another class
    }
    for p in &newer {
        // SAFETY: released once.
        unsafe { alloc.release(*p).unwrap() };
    }
    // The cap holds 3 blocks of 4608 at most 2 (13824 > 12288): the old 4096 block goes first.
    let s = alloc.stats();
    assert!(s.cached_bytes <= 3 * 4096, "{s}");
    assert!(s.evictions >= 1);
    let again = alloc.allocate(4096, 64).unwrap();
    assert_ne!(
        addr(again),
        addr(old),
        "the least recently used block was evicted"
    );
}

#[test]
fn zero_cap_caches_nothing() {
    let (mut alloc, counting) = counted(Config::default().max_cached_bytes(0));
    for _ in 0..3 {
        let _ = alloc.allocate(4096, 64).unwrap();
        alloc.reset();
    }
    assert_eq!(alloc.stats().cached_bytes, 0);
    assert_eq!(counting.bytes.load(Ordering::SeqCst), 0);
    assert_eq!(alloc.stats().system_allocs, 3);
}

#[test]
fn trim_and_free_cached_reach_idle_threads() {
    let alloc = Arc::new(classes(64 << 20));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let worker = {
        let alloc = alloc.clone();
        std::thread::spawn(move || {
            let ps: Vec<_> = (0..4)
                .map(|_| alloc.allocate(1 << 16, 64).unwrap())
                .collect();
            for p in ps {
                // SAFETY: released once.
                unsafe { alloc.release(p).unwrap() };
            }
            ready_tx.send(()).unwrap();
            done_rx.recv().unwrap(); // stay alive and idle
        })
    };
    ready_rx.recv().unwrap();
    assert_eq!(alloc.stats().cached_bytes, 4 << 16);
    alloc.trim(2 << 16);
    assert_eq!(alloc.stats().cached_bytes, 2 << 16);
    alloc.free_cached();
    let s = alloc.stats();
    assert_eq!((s.cached_bytes, s.reserved_bytes, s.evictions), (0, 0, 4));
    done_tx.send(()).unwrap();
    worker.join().unwrap();
}

#[test]
fn cap_holds_across_threads() {
    let cap = 256 << 10;
    let alloc = Arc::new(CachingAllocator::new(cap));
    std::thread::scope(|s| {
        for t in 0..4 {
            let alloc = &alloc;
            s.spawn(move || {
                for i in 0..if cfg!(miri) { 5 } else { 50 } {
                    let ps: Vec<_> = (0..4)
                        .map(|k| alloc.allocate(4096 * (1 + (i + k + t) % 16), 64).unwrap())
                        .collect();
                    for p in ps {
                        // SAFETY: released once.
                        unsafe { alloc.release(p).unwrap() };
                    }
                }
            });
        }
    });
    let s = alloc.stats();
    assert!(s.cached_bytes <= cap, "{s}");
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.reserved_bytes, s.cached_bytes);
}

// ---- limit ---------------------------------------------------------------------------

#[test]
fn limit_evicts_idle_blocks_then_refuses() {
    let (alloc, counting) = counted(Config::default().limit_bytes(3 * 4096));
    let a = alloc.allocate(4096, 64).unwrap();
    let b = alloc.allocate(4096, 64).unwrap();
    // SAFETY: released once.
    unsafe { alloc.release(b).unwrap() };
    // 4096 live + 4096 cached; a 8 KiB request must evict the cached block to fit.
    let c = alloc.allocate(8192, 64).unwrap();
    assert_eq!(alloc.stats().evictions, 1);
    assert_eq!(alloc.stats().reserved_bytes, 3 * 4096);
    let before = alloc.stats();
    let err = alloc.allocate(64, 64).unwrap_err();
    assert!(
        matches!(err, AllocError::LimitExceeded { limit: 12288, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("limit_bytes"));
    assert_eq!(alloc.stats(), before);
    // SAFETY: released once each.
    unsafe {
        alloc.release(a).unwrap();
        alloc.release(c).unwrap();
    }
    assert_eq!(counting.bytes.load(Ordering::SeqCst), 3 * 4096);
}

// ---- behaviour 6: out of memory ------------------------------------------------------

#[test]
fn out_of_memory_frees_the_cache_retries_once_then_fails() {
    let (alloc, counting) = counted(Config::default().arena_max_bytes(0));
    let p = alloc.allocate(4096, 64).unwrap();
    // SAFETY: released once.
    unsafe { alloc.release(p).unwrap() };
    counting.fail_all.store(true, Ordering::SeqCst);
    let err = alloc.allocate(8192, 64).unwrap_err();
    assert_eq!(
        err,
        AllocError::OutOfMemory {
            size: 8192,
            align: 64
        }
    );
    let s = alloc.stats();
    assert_eq!((s.oom_retries, s.cached_bytes, s.reserved_bytes), (1, 0, 0));
    // Nothing cached: no retry this time.
    assert!(alloc.allocate(8192, 64).is_err());
    assert_eq!(alloc.stats().oom_retries, 1);
    counting.fail_all.store(false, Ordering::SeqCst);
    assert!(alloc.allocate(8192, 64).is_ok());
}

// ---- behaviour 7: unknown pointers ---------------------------------------------------

#[test]
fn releasing_unknown_or_released_pointers_is_an_error() {
    let alloc = CachingAllocator::new(1 << 20);
    let p = alloc.allocate(100, 64).unwrap();
    let mut local = 0u64;
    let foreign = NonNull::from(&mut local).cast::<u8>();
    // SAFETY: `release` never reads behind a pointer it does not know.
    unsafe {
        assert_eq!(
            alloc.release(foreign),
            Err(AllocError::UnknownPointer {
                addr: addr(foreign)
            })
        );
        alloc.release(p).unwrap();
        let before = alloc.stats();
        assert_eq!(
            alloc.release(p),
            Err(AllocError::UnknownPointer { addr: addr(p) })
        );
        assert_eq!(alloc.stats(), before);
    }
    // A scope's block cannot be released by hand.
    let scope = alloc.scope();
    let s = scope.alloc_slice_fill(10, 1u8).unwrap();
    let sp = NonNull::from(&mut s[0]);
    // SAFETY: `release` never reads behind a pointer it does not know.
    let result = unsafe { alloc.release(sp) };
    assert!(matches!(result, Err(AllocError::UnknownPointer { .. })));
    assert_eq!(s[0], 1);
}

#[test]
fn a_pointer_from_another_allocator_is_unknown() {
    let a = CachingAllocator::new(1 << 20);
    let b = CachingAllocator::new(1 << 20);
    let p = a.allocate(64, 64).unwrap();
    // SAFETY: `release` never reads behind a pointer it does not know.
    assert!(unsafe { b.release(p) }.is_err());
    // SAFETY: released once, to its own allocator.
    assert!(unsafe { a.release(p) }.is_ok());
}

// ---- behaviour 8: threads ------------------------------------------------------------

#[test]
fn a_block_released_on_one_thread_serves_another() {
    let alloc = Arc::new(classes(1 << 20));
    let p = alloc.allocate(3000, 64).unwrap();
    let addr_p = addr(p);
    /// A block handed to another thread, which releases it.
    struct Handoff(NonNull<u8>);
    // SAFETY: the block is plain memory owned by the allocator; one thread holds it at a time.
    unsafe impl Send for Handoff {}
    {
        let alloc = alloc.clone();
        let handoff = Handoff(p);
        std::thread::spawn(move || {
            let handoff = handoff;
            // SAFETY: released once, on another thread than the one that allocated it.
            unsafe { alloc.release(handoff.0).unwrap() };
        })
        .join()
        .unwrap();
    }
    let alloc2 = alloc.clone();
    let q = std::thread::spawn(move || addr(alloc2.allocate(3000, 64).unwrap()))
        .join()
        .unwrap();
    assert_eq!(q, addr_p, "the idle block flowed to a third thread");
    assert_eq!(alloc.stats().system_allocs, 1);
}

#[test]
fn reset_returns_every_threads_live_blocks() {
    let mut alloc = classes(64 << 20);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..10 {
                    alloc.allocate(1000, 64).unwrap();
                }
            });
        }
    });
    assert_eq!(alloc.stats().live_blocks, 30);
    alloc.reset();
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.live_bytes, s.cached_blocks), (0, 0, 30));
}

// ---- behaviour 9: debug checks -------------------------------------------------------

#[test]
fn debug_checks_poison_every_block_hit_or_miss() {
    let mut alloc = CachingAllocator::with_config(Config::default().debug_checks(true));
    for _ in 0..2 {
        let p = alloc.allocate(256, 64).unwrap();
        // SAFETY: 256 bytes were handed out.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), 256) };
        assert!(bytes.iter().all(|&b| b == 0xFF));
        let f = f32::from_ne_bytes(bytes[..4].try_into().unwrap());
        assert!(f.is_nan());
        write_read(p, 256, 0);
        alloc.reset();
    }
    assert_eq!(alloc.stats().hits, 1);
    let scope = alloc.scope();
    let xs = scope.alloc_uninit::<f64>(8).unwrap();
    // SAFETY: with debug checks every byte was written with 0xFF.
    assert!(xs.iter().all(|x| unsafe { x.assume_init() }.is_nan()));
}

#[test]
fn an_overrun_block_is_reported_and_never_reused() {
    let (alloc, counting) = counted(Config::default().debug_checks(true));
    let (p, corrupted) = overrun(&alloc, 100, 128);
    // SAFETY: released once.
    assert_eq!(unsafe { alloc.release(p) }, Err(corrupted));
    let s = alloc.stats();
    assert_eq!(
        (s.corrupted_blocks, s.cached_blocks, s.reserved_bytes),
        (1, 0, 0)
    );
    assert_eq!(counting.bytes.load(Ordering::SeqCst), 0);
}

#[test]
fn reset_returns_good_blocks_then_panics_naming_the_overrun() {
    let mut alloc = CachingAllocator::with_config(Config::default().debug_checks(true));
    let good = alloc.allocate(64, 64).unwrap();
    write_read(good, 64, 1);
    let bad = alloc.allocate(1000, 64).unwrap();
    // SAFETY: inside the canary's room behind the requested 1000 bytes.
    unsafe { bad.as_ptr().add(1003).write(0) };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| alloc.reset()));
    let msg = *result.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains("1000 bytes requested (class 1024)"), "{msg}");
    let s = alloc.stats();
    assert_eq!(
        (s.live_blocks, s.cached_blocks, s.corrupted_blocks),
        (0, 1, 1)
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "writes past a slice on purpose: undefined behaviour Miri rightly stops at"
)]
fn an_overrun_scope_block_panics_on_drop_after_returning_the_rest() {
    let alloc = CachingAllocator::with_config(Config::default().debug_checks(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let scope = alloc.scope();
        let _ok = scope.alloc_slice_fill(8, 0u32).unwrap();
        let bad = scope.alloc_slice_fill(8, 0u32).unwrap();
        // SAFETY: inside the block (canary room), past the slice.
        unsafe { bad.as_mut_ptr().add(8).write(1) };
    }));
    assert!(result.is_err());
    let s = alloc.stats();
    assert_eq!(
        (s.live_blocks, s.cached_blocks, s.corrupted_blocks),
        (0, 1, 1)
    );
}

// ---- behaviour 10: drop --------------------------------------------------------------

#[test]
fn dropping_gives_every_block_back() {
    let (alloc, counting) = counted(
        Config::default()
            .arena_max_bytes(0)
            .max_cached_bytes(1 << 20),
    );
    let live = alloc.allocate(5000, 64).unwrap();
    write_read(live, 5000, 3);
    let idle = alloc.allocate(300, 4096).unwrap();
    // SAFETY: released once.
    unsafe { alloc.release(idle).unwrap() };
    let scope = alloc.scope();
    let _ = scope.alloc_slice_fill(100, 0u8).unwrap();
    std::mem::forget(scope); // a leaked scope's block is still freed on drop
    std::thread::scope(|s| {
        s.spawn(|| {
            alloc.allocate(777, 64).unwrap();
        });
    });
    let allocs = counting.allocs.load(Ordering::SeqCst);
    assert_eq!(allocs, 4);
    drop(alloc);
    assert_eq!(counting.frees.load(Ordering::SeqCst), allocs);
    assert_eq!(counting.bytes.load(Ordering::SeqCst), 0);
}

// ---- best fit ------------------------------------------------------------------------

#[test]
fn a_miss_takes_the_smallest_larger_idle_block_within_twice_its_class() {
    let alloc = classes(1 << 20);
    let big = alloc.allocate(16 << 10, 64).unwrap();
    let mid = alloc.allocate(6000, 64).unwrap(); // class 6144
                                                 // SAFETY: released once, not used after.
    unsafe {
        alloc.release(big).unwrap();
        alloc.release(mid).unwrap();
    }
    let before = alloc.stats();
    // 4 KiB: its class is empty; 6144 is within 2 x 4096, 16 KiB is not.
    let p = alloc.allocate(4096, 64).unwrap();
    assert_eq!(addr(p), addr(mid));
    let s = alloc.stats();
    assert_eq!(s.oversize_hits, before.oversize_hits + 1);
    assert_eq!(s.hits, before.hits + 1);
    assert_eq!(s.system_allocs, before.system_allocs);
    assert_eq!(s.live_bytes, 6144, "the block keeps its own class");
    write_read(p, 4096, 7);
    // Nothing else fits within the bound: the next 4 KiB request goes to the system.
    let q = alloc.allocate(4096, 64).unwrap();
    assert_ne!(addr(q), addr(big));
    assert_eq!(alloc.stats().system_allocs, before.system_allocs + 1);
    // Released, the 6 KiB block goes back to its own class and serves a 6000-byte request.
    // SAFETY: released once, not used after.
    unsafe { alloc.release(p).unwrap() };
    assert_eq!(addr(alloc.allocate(6000, 64).unwrap()), addr(mid));
    assert_eq!(alloc.stats().oversize_hits, before.oversize_hits + 1);
}

#[test]
fn under_cap_pressure_any_larger_idle_block_serves() {
    let big = 200 << 10; // class 212992
    for (cap, pressured) in [(1 << 20, false), (212_992 + 2048, true)] {
        let alloc = classes(cap);
        let p = alloc.allocate(big, 64).unwrap();
        // SAFETY: released once, not used after.
        unsafe { alloc.release(p).unwrap() };
        let before = alloc.stats();
        let q = alloc.allocate(4096, 64).unwrap();
        let s = alloc.stats();
        // Far beyond twice 4 KiB: only when a new 4 KiB block could not stay cached.
        assert_eq!(addr(q) == addr(p), pressured, "cap {cap}: {s:?}");
        assert_eq!(s.oversize_hits - before.oversize_hits, u64::from(pressured));
        assert_eq!(
            s.system_allocs - before.system_allocs,
            u64::from(!pressured)
        );
    }
}

#[test]
fn best_fit_can_be_turned_off() {
    let alloc =
        CachingAllocator::with_config(Config::default().arena_max_bytes(0).max_oversize(1.0));
    let mid = alloc.allocate(6000, 64).unwrap();
    // SAFETY: released once, not used after.
    unsafe { alloc.release(mid).unwrap() };
    let p = alloc.allocate(4096, 64).unwrap();
    assert_ne!(addr(p), addr(mid));
    let s = alloc.stats();
    assert_eq!((s.oversize_hits, s.system_allocs), (0, 2));
    assert_eq!(Config::default().max_oversize(0.5).get_max_oversize(), 1.0);
}

#[test]
fn best_fit_keeps_a_capped_decode_from_going_back_to_the_system() {
    // Attention decode's scratch grows every token and starts small again with the next
    // prompt; a runtime resets after every kernel. Under a cap the small classes of the first
    // round are evicted (least recently used) while larger blocks stay idle: with exact classes
    // every later round goes back to the system for them, with best fit the larger blocks serve.
    let rounds = |factor: f64| {
        let mut alloc = CachingAllocator::with_config(
            Config::default()
                .max_cached_bytes(1 << 20)
                .max_oversize(factor)
                .arena_max_bytes(0),
        );
        let mut after_first = 0;
        for round in 0..3 {
            for token in 0..141 {
                let _ = alloc.allocate(160_000 + token * 1_000, 64).unwrap();
                alloc.reset();
            }
            if round == 0 {
                after_first = alloc.stats().system_allocs;
            }
        }
        (after_first, alloc.stats())
    };
    let (first, s) = rounds(2.0);
    assert_eq!(
        s.system_allocs, first,
        "later rounds went to the system: {s:?}"
    );
    assert!(s.oversize_hits > 0, "{s:?}");
    assert!(s.cached_bytes <= 1 << 20);
    let (first, exact) = rounds(1.0);
    assert!(exact.system_allocs > first, "{exact:?}");
}

// ---- working-set retention -----------------------------------------------------------

/// Rounds of a decode-like loop, reset after every call: per token, a block that grows by
/// 4 KiB (the attention scratch) and a small one. Returns the stats after each round.
fn growing_rounds(config: Config, rounds: usize, tokens: usize) -> Vec<Stats> {
    // Size classes only: the small blocks would otherwise live in the arena.
    let mut alloc = CachingAllocator::with_config(config.arena_max_bytes(0));
    (0..rounds)
        .map(|_| {
            for t in 1..=tokens {
                let grow = alloc.allocate(4096 * t, 64).unwrap();
                let small = alloc.allocate(32 * (t + 130), 64).unwrap();
                write_read(grow, 64, t as u8);
                write_read(small, 64, 3);
                alloc.reset();
            }
            alloc.stats()
        })
        .collect()
}

#[test]
fn the_allocator_keeps_its_working_set_under_any_cap() {
    // Some 30 classes up to 388 KiB, about 2.5 MiB in all, two blocks live at a time. Under a
    // 1 MiB cap (which evicts) and under 64 MiB (which never does) alike, the allocator keeps
    // its working set plus a quarter, and later rounds never go back to the system.
    // (Smaller under Miri, still more classes than the small cap holds.)
    let (tokens, small_cap) = if cfg!(miri) {
        (40, 512 << 10)
    } else {
        (96, 1 << 20)
    };
    let largest = 4096 * tokens + 4096;
    for cap in [small_cap, 64 << 20] {
        let config = Config::default()
            .arena_max_bytes(0)
            .max_cached_bytes(cap)
            .working_set_slack(Some(1.25))
            .huge_pages(None);
        let kept = growing_rounds(config.clone(), 3, tokens);
        let s = kept[2];
        assert!(s.working_set_mode, "cap {cap}: {s:?}");
        assert_eq!(
            (kept[1].system_allocs, kept[2].system_allocs),
            (kept[0].system_allocs, kept[0].system_allocs),
            "cap {cap}: later rounds went to the system: {s:?}"
        );
        assert!(
            s.oversize_hits > 0,
            "wide fit served the small tokens: {s:?}"
        );
        assert!(
            s.reserved_bytes as f64 <= 1.25 * s.peak_live_bytes as f64,
            "cap {cap}: more held than the working set allows: {s:?}"
        );
        // While it grew: never more than the budget plus the block on its way out.
        assert!(
            s.peak_reserved_bytes as f64 <= 1.25 * s.peak_live_bytes as f64 + largest as f64,
            "cap {cap}: {s:?}"
        );
    }
    // Without it: the small cap fills with classes and later rounds churn; under 64 MiB
    // every class stays.
    let small = growing_rounds(
        Config::default()
            .max_cached_bytes(small_cap)
            .working_set_slack(None),
        3,
        tokens,
    );
    let f = small[2];
    assert!(!f.working_set_mode);
    assert!(f.system_allocs > small[0].system_allocs, "{f:?}");
    assert!(f.reserved_bytes > 2 * f.peak_live_bytes, "{f:?}");
    let big = growing_rounds(
        Config::default()
            .max_cached_bytes(64 << 20)
            .working_set_slack(None),
        2,
        tokens,
    );
    let b = big[1];
    assert!(!b.working_set_mode && b.evictions == 0, "{b:?}");
    assert_eq!(b.system_allocs, big[0].system_allocs);
    assert!(
        b.reserved_bytes > 2 * b.peak_live_bytes,
        "every class stays: {b:?}"
    );
}

#[test]
fn blocks_that_all_live_at_once_meet_no_budget() {
    // The budget counts live bytes: a runtime holding all its blocks at once is never
    // trimmed, and keeps the exact-class path.
    let mut alloc = CachingAllocator::with_config(
        Config::default()
            .arena_max_bytes(0)
            .working_set_slack(Some(1.25)),
    );
    for _ in 0..3 {
        let blocks: Vec<_> = (1..=40)
            .map(|i| alloc.allocate(i * 3000, 64).unwrap())
            .collect();
        assert_eq!(blocks.len(), 40);
        alloc.reset();
    }
    let s = alloc.stats();
    assert!(!s.working_set_mode, "{s:?}");
    assert_eq!((s.evictions, s.system_allocs, s.oversize_hits), (0, 40, 0));
}

#[test]
fn once_the_cap_evicts_a_miss_takes_any_larger_idle_block() {
    assert_eq!(
        Config::default().get_working_set_slack(),
        None,
        "off by default"
    );
    for (slack, oversize, wide) in [
        (Some(1.25), 2.0, true),
        (None, 2.0, false),
        (Some(1.25), 1.0, false),
    ] {
        let alloc = CachingAllocator::with_config(
            Config::default()
                .arena_max_bytes(0)
                .max_cached_bytes(256 << 10)
                .working_set_slack(slack)
                .max_oversize(oversize),
        );
        // Two 200 KiB blocks back under a 256 KiB cap: the second evicts the first.
        let a = alloc.allocate(200 << 10, 64).unwrap();
        let b = alloc.allocate(200 << 10, 64).unwrap();
        // SAFETY: released once, not used after.
        unsafe {
            alloc.release(a).unwrap();
            alloc.release(b).unwrap();
        }
        let before = alloc.stats();
        assert_eq!(before.evictions, 1);
        assert_eq!(before.working_set_mode, wide, "{slack:?} {oversize}");
        // 4 KiB is far below half of 200 KiB, and the cap has room for it: only wide fit
        // serves it from the idle block.
        let p = alloc.allocate(4096, 64).unwrap();
        let s = alloc.stats();
        assert_eq!(addr(p) == addr(b), wide, "{slack:?} {oversize}: {s:?}");
        assert_eq!(s.system_allocs - before.system_allocs, u64::from(!wide));
    }
    let slack = |s| {
        Config::default()
            .working_set_slack(s)
            .get_working_set_slack()
    };
    assert_eq!(slack(Some(0.5)), Some(1.0));
    assert_eq!(slack(Some(f64::NAN)), Some(1.0));
    assert_eq!(slack(None), None);
}

#[test]
fn wide_fit_hands_a_thread_no_more_than_its_budget() {
    // Wide fit lets a small request take a large idle block, within the thread's working-set
    // budget (1.25 x the most its live blocks asked for). The budget counts the bytes the
    // thread's live blocks hold: small requests held at once must not each take a block as
    // large as the whole budget (under random traffic that held several times the live bytes).
    let alloc = CachingAllocator::with_config(
        Config::default()
            .arena_max_bytes(0)
            .max_cached_bytes(8 << 20)
            .working_set_slack(Some(1.25))
            .huge_pages(None),
    );
    // Another thread leaves eight idle 1 MiB blocks and exits: they go to the shared pool.
    std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<_> = (0..8)
                .map(|_| alloc.allocate(1 << 20, 64).unwrap())
                .collect();
            for p in blocks {
                // SAFETY: released once, not used after.
                unsafe { alloc.release(p).unwrap() };
            }
        });
    });
    // This thread's working set: one 1 MiB block. Then a block over the cap engages wide fit.
    let big = alloc.allocate(1 << 20, 64).unwrap();
    let over = alloc.allocate(64 << 10, 64).unwrap();
    // SAFETY: released once, not used after.
    unsafe {
        alloc.release(big).unwrap();
        alloc.release(over).unwrap();
    }
    assert!(alloc.stats().working_set_mode, "{:?}", alloc.stats());
    let small: Vec<_> = (0..8).map(|_| alloc.allocate(4096, 64).unwrap()).collect();
    for &p in &small {
        write_read(p, 4096, 7);
    }
    let s = alloc.stats();
    assert!(s.oversize_hits > 0, "wide fit still serves: {s:?}");
    assert!(
        s.live_bytes as f64 <= 1.25 * (1 << 20) as f64 + 8.0 * 4096.0,
        "eight 4 KiB requests hold {} bytes: {s:?}",
        s.live_bytes
    );
}

// ---- Scope ---------------------------------------------------------------------------

#[test]
fn scopes_nest_in_any_order_and_return_their_blocks() {
    let alloc = CachingAllocator::new(1 << 20);
    let outer = alloc.scope();
    let a = outer.alloc_slice_copy(&[1u32, 2, 3]).unwrap();
    let first = alloc.scope();
    let second = alloc.scope();
    assert_eq!(first.alloc_slice_fill(5, 7u16).unwrap(), &[7; 5]);
    let c = second.alloc_slice_zeroed::<u64>(9).unwrap();
    assert_eq!(alloc.stats().live_blocks, 3);
    drop(first); // out of order: `second`'s block lies above
    assert_eq!(alloc.stats().live_blocks, 2);
    assert_eq!(c, &[0; 9]);
    assert_eq!(a, &[1, 2, 3]);
    drop(second);
    assert_eq!(a, &[1, 2, 3]);
    drop(outer);
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.cached_blocks), (0, 3));
}

#[test]
fn scopes_on_several_threads_share_one_allocator() {
    let alloc = CachingAllocator::new(1 << 20);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let alloc = &alloc;
            s.spawn(move || {
                for _ in 0..100 {
                    let scope = alloc.scope();
                    let xs = scope.alloc_slice_fill(100, t).unwrap();
                    assert!(xs.iter().all(|&x| x == t));
                }
            });
        }
    });
    assert_eq!(alloc.stats().live_blocks, 0);
    assert!(alloc.stats().hits >= 396);
}

#[test]
fn small_scope_requests_share_one_chunk() {
    let alloc = CachingAllocator::new(1 << 20);
    let chunk = caching_allocator::DEFAULT_SCOPE_CHUNK_BYTES;
    {
        let scope = alloc.scope();
        let mut slices: Vec<&mut [u8]> = Vec::new();
        // 64 B each: the first chunk holds `chunk / 64` of them, so this takes exactly two
        // chunks, the second twice the first.
        let n = chunk / 64 + 1;
        for i in 0..n {
            slices.push(scope.alloc_slice_fill(64, i as u8).unwrap());
        }
        let s = alloc.stats();
        assert_eq!(
            (s.live_blocks, s.live_bytes),
            (2, chunk + 2 * chunk),
            "{s:?}"
        );
        // Distinct, in order within a chunk, untouched by the others' fills.
        for (i, xs) in slices.iter().enumerate() {
            assert!(
                xs.iter().all(|&x| x == i as u8),
                "slice {i} was overwritten"
            );
        }
        let mut starts: Vec<usize> = slices.iter().map(|xs| xs.as_ptr() as usize).collect();
        starts.sort_unstable();
        assert!(
            starts.windows(2).all(|w| w[1] - w[0] >= 64),
            "slices overlap"
        );
    }
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.cached_blocks), (0, 2));
    // The next scope reuses a chunk: no new system block.
    let scope = alloc.scope();
    let _ = scope.alloc_slice_fill(100, 1u32).unwrap();
    assert_eq!(alloc.stats().system_allocs, 2);
}

#[test]
fn scope_chunks_honour_alignment_and_leave_big_requests_alone() {
    #[derive(Clone, Copy)]
    #[repr(align(4096))]
    struct Page(#[allow(dead_code)] [u8; 4096]);
    let alloc = CachingAllocator::new(1 << 20);
    let scope = alloc.scope();
    let a = scope.alloc_slice_fill(3, 7u8).unwrap();
    let b = scope.alloc_uninit::<Page>(1).unwrap();
    assert_eq!(b.as_ptr() as usize % 4096, 0);
    let c = scope.alloc_slice_fill(10, 1u64).unwrap();
    assert_eq!(c.as_ptr() as usize % 8, 0);
    assert_eq!(
        alloc.stats().live_blocks,
        1,
        "three small requests, one chunk"
    );
    // Over `SCOPE_BUMP_MAX`: a block of its own.
    let big = scope
        .alloc_slice_fill(caching_allocator::SCOPE_BUMP_MAX + 1, 2u8)
        .unwrap();
    assert_eq!(alloc.stats().live_blocks, 2);
    assert_eq!(a, &[7; 3]);
    assert!(big.iter().all(|&x| x == 2));
}

#[test]
fn scope_chunks_can_be_turned_off_and_are_off_with_debug_checks() {
    for config in [
        Config::default().scope_chunk_bytes(0),
        Config::default().debug_checks(true),
    ] {
        let alloc = CachingAllocator::with_config(config.clone());
        let scope = alloc.scope();
        for _ in 0..3 {
            let _ = scope.alloc_slice_fill(64, 0u8).unwrap();
        }
        assert_eq!(alloc.stats().live_blocks, 3, "{config:?}");
    }
    // Small chunk sizes are raised so every small request fits a fresh chunk.
    let config = Config::default().scope_chunk_bytes(100);
    assert_eq!(
        config.get_scope_chunk_bytes(),
        2 * caching_allocator::SCOPE_BUMP_MAX
    );
}

#[test]
fn zero_sized_scope_allocations() {
    let alloc = CachingAllocator::new(1 << 20);
    let scope = alloc.scope();
    let units = scope.alloc_slice_fill(1000, ()).unwrap();
    assert_eq!(units.len(), 1000);
    let empty = scope.alloc_slice_copy::<u64>(&[]).unwrap();
    assert!(empty.is_empty());
    assert_eq!(alloc.stats().system_allocs, 0);
}

// ---- allocator-api2 ------------------------------------------------------------------

#[test]
fn collections_keep_their_memory_in_the_cache() {
    let mut alloc = CachingAllocator::new(1 << 20);
    {
        let mut v = allocator_api2::vec::Vec::new_in(&alloc);
        for i in 0..1000u32 {
            v.push(i);
        }
        assert_eq!(v.iter().sum::<u32>(), 999 * 1000 / 2);
        let mut m = hashbrown::HashMap::new_in(&alloc);
        for i in 0..100u32 {
            m.insert(i, i * 2);
        }
        assert_eq!(m[&50], 100);
        assert!(alloc.stats().live_blocks >= 2);
    }
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.live_bytes), (0, 0));
    // Kept: as idle blocks, or as the free part of the arena's chunk.
    assert!(
        s.cached_bytes > 0 && s.reserved_bytes == s.cached_bytes,
        "{s}"
    );
    alloc.reset();
}

// ---- ExecuTorch scenarios, adapted -----------------------------------------------------

#[test]
fn et_simple_allocations_are_aligned() {
    let alloc = CachingAllocator::new(1 << 20);
    for size in [16, 32, 64] {
        let p = alloc.allocate(size, 64).unwrap();
        assert_eq!(addr(p) % 64, 0);
    }
}

#[test]
fn et_same_size_after_reset_is_the_same_block() {
    let mut alloc = CachingAllocator::new(1 << 20);
    let p = alloc.allocate(256, 64).unwrap();
    alloc.reset();
    assert_eq!(addr(alloc.allocate(256, 64).unwrap()), addr(p));
}

#[test]
fn et_different_sizes_are_distinct() {
    let alloc = CachingAllocator::new(1 << 20);
    let ps: Vec<_> = [128, 256, 512]
        .iter()
        .map(|&s| alloc.allocate(s, 64).unwrap())
        .collect();
    assert!(ps[0] != ps[1] && ps[1] != ps[2] && ps[0] != ps[2]);
}

#[test]
fn et_two_blocks_reused_after_reset() {
    let mut alloc = classes(1 << 20);
    let mut a = [
        addr(alloc.allocate(256, 64).unwrap()),
        addr(alloc.allocate(256, 64).unwrap()),
    ];
    alloc.reset();
    let mut b = [
        addr(alloc.allocate(256, 64).unwrap()),
        addr(alloc.allocate(256, 64).unwrap()),
    ];
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert_eq!(alloc.stats().system_allocs, 2);
}

#[test]
fn et_rounds_of_mixed_sizes_and_repeated_resets() {
    let mut alloc = classes(1 << 20);
    for _ in 0..5 {
        for size in [256, 512, 1024] {
            let p = alloc.allocate(size, 64).unwrap();
            write_read(p, size, 0xAB);
        }
        alloc.reset();
    }
    let s = alloc.stats();
    assert_eq!((s.system_allocs, s.hits, s.cached_blocks), (3, 12, 3));
}

#[test]
fn et_multi_size_reuse_matches_classes() {
    let mut alloc = CachingAllocator::new(1 << 20);
    let sizes = [128, 256, 512, 128];
    let first: Vec<_> = sizes
        .iter()
        .map(|&s| addr(alloc.allocate(s, 64).unwrap()))
        .collect();
    alloc.reset();
    let second: Vec<_> = sizes
        .iter()
        .map(|&s| addr(alloc.allocate(s, 64).unwrap()))
        .collect();
    let mut f = first.clone();
    let mut g = second.clone();
    f.sort();
    g.sort();
    assert_eq!(f, g);
    assert_eq!((first[1], first[2]), (second[1], second[2]));
}

#[test]
fn et_one_mib_reused_under_a_ten_mib_cap() {
    // Through the size classes (the adaptive arena off): the block itself comes back.
    let mut alloc = CachingAllocator::with_config(
        Config::default()
            .max_cached_bytes(10 << 20)
            .arena_adaptive(false),
    );
    let p = alloc.allocate(1 << 20, 64).unwrap();
    write_read(p, 1 << 20, 9);
    alloc.reset();
    assert_eq!(alloc.allocate(1 << 20, 64).unwrap(), p);

    // With the default (adaptive) arena the first reset moves the call into the arena's
    // chunk; from then on the same memory comes back, with no system allocation.
    let mut alloc = CachingAllocator::new(10 << 20);
    let mut seen = Vec::new();
    for call in 0..4 {
        let p = alloc.allocate(1 << 20, 64).unwrap();
        write_read(p, 1 << 20, call);
        seen.push((p, alloc.stats().system_allocs));
        alloc.reset();
    }
    assert!(seen[1..].iter().all(|&s| s == seen[1]), "{seen:?}");
}

#[test]
fn et_threads_get_distinct_blocks() {
    let alloc = CachingAllocator::new(1 << 20);
    let addrs = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10 {
                    let p = alloc.allocate(256, 64).unwrap();
                    assert_eq!(addr(p) % 64, 0);
                    addrs.lock().unwrap().push(addr(p));
                }
            });
        }
    });
    let mut a = addrs.into_inner().unwrap();
    a.sort();
    a.dedup();
    assert_eq!(a.len(), 40);
}

#[test]
fn error_messages_say_what_to_do() {
    let errors = [
        AllocError::InvalidAlignment { align: 3 },
        AllocError::SizeOverflow { size: 1, align: 1 },
        AllocError::LimitExceeded {
            size: 1,
            class_size: 64,
            limit: 0,
            reserved: 0,
        },
        AllocError::OutOfMemory { size: 1, align: 1 },
        AllocError::UnknownPointer { addr: 0x1000 },
        AllocError::Corrupted {
            addr: 0x1000,
            requested: 1,
            class_size: 64,
        },
    ];
    for e in errors {
        let msg = e.to_string();
        assert!(msg.len() > 40, "{msg}");
        let _: &dyn std::error::Error = &e;
    }
    assert!(Config::default().get_limit_bytes().is_none());
    assert_eq!(Config::default().get_max_cached_bytes(), 64 << 20);
}

#[test]
fn stats_display_is_readable() {
    let alloc = classes(1 << 20);
    let _ = alloc.allocate(2000, 64).unwrap();
    let text = alloc.stats().to_string();
    assert!(text.contains("live 2.0 KiB in 1 blocks"), "{text}");
    assert!(text.contains("misses 1"), "{text}");
}

// ---- threads that exit -----------------------------------------------------------------

#[test]
fn idle_blocks_of_an_exited_thread_serve_others() {
    let mut alloc = classes(1 << 20);
    std::thread::scope(|s| {
        s.spawn(|| {
            let ps: Vec<_> = (0..4)
                .map(|_| alloc.allocate(10_000, 64).unwrap())
                .collect();
            for p in ps {
                // SAFETY: released once.
                unsafe { alloc.release(p).unwrap() };
            }
        });
    });
    let before = alloc.stats();
    assert_eq!((before.system_allocs, before.cached_blocks), (4, 4));
    let ps: Vec<_> = (0..4)
        .map(|_| alloc.allocate(10_000, 64).unwrap())
        .collect();
    let after = alloc.stats();
    assert_eq!(
        after.system_allocs, 4,
        "the exited thread's blocks were reused: {after}"
    );
    assert_eq!(after.hits, 4);
    drop(ps);
    alloc.reset();
    // Its bookkeeping is gone after the reset; the blocks stay cached.
    let s = alloc.stats();
    assert_eq!((s.live_blocks, s.cached_blocks), (0, 4));
}

#[test]
fn thread_local_destructors_may_still_allocate() {
    static ALLOC: std::sync::OnceLock<CachingAllocator> = std::sync::OnceLock::new();
    let alloc = ALLOC.get_or_init(|| classes(1 << 20));

    struct AllocOnDrop;
    impl Drop for AllocOnDrop {
        fn drop(&mut self) {
            // Runs while the thread's locals are being torn down.
            let alloc = ALLOC.get().unwrap();
            let p = alloc.allocate(3000, 64).unwrap();
            write_read(p, 3000, 5);
            // SAFETY: released once.
            unsafe { alloc.release(p).unwrap() };
            let scope = alloc.scope();
            assert_eq!(scope.alloc_slice_fill(10, 2u8).unwrap(), &[2; 10]);
        }
    }
    thread_local! {
        static GUARD: AllocOnDrop = const { AllocOnDrop };
    }
    std::thread::spawn(|| {
        alloc.allocate(100, 64).unwrap();
        GUARD.with(|_| {});
    })
    .join()
    .unwrap();
    let s = alloc.stats();
    assert_eq!(s.live_blocks, 1, "{s}");
    assert!(s.cached_blocks >= 2, "{s}");
}

#[test]
fn thread_churn_does_not_grow_the_books() {
    let alloc = Arc::new(classes(1 << 20));
    for round in 0..if cfg!(miri) { 8 } else { 40 } {
        let alloc = alloc.clone();
        // `spawn` + `join`, not a scoped thread: `join` returns only once the thread's
        // thread-locals (which mark its cache as exited) are gone.
        std::thread::spawn(move || {
            let scope = alloc.scope();
            let xs = scope.alloc_slice_fill(500, round as u8).unwrap();
            assert!(xs.iter().all(|&x| x == round as u8));
            let p = alloc.allocate(3000, 64).unwrap();
            // SAFETY: released once.
            unsafe { alloc.release(p).unwrap() };
        })
        .join()
        .unwrap();
    }
    // The fallback cache, at most one exited thread not yet forgotten, and nothing else.
    assert!(
        alloc.thread_caches() <= 2,
        "{} thread caches",
        alloc.thread_caches()
    );
    let s = alloc.stats();
    // Each thread reused the blocks the previous one left behind.
    assert_eq!(s.system_allocs, 2, "{s}");
    assert_eq!(s.hits + s.misses, if cfg!(miri) { 16 } else { 80 });
    assert_eq!(s.live_blocks, 0);
}

#[test]
fn try_reset_reports_an_overrun_as_an_error_after_returning_the_rest() {
    let mut alloc = CachingAllocator::with_config(Config::default().debug_checks(true));
    let good = alloc.allocate(64, 64).unwrap();
    write_read(good, 64, 1);
    let (_, corrupted) = overrun(&alloc, 1000, 1024);
    assert_eq!(alloc.try_reset(), Err(corrupted));
    let s = alloc.stats();
    assert_eq!(
        (s.live_blocks, s.cached_blocks, s.corrupted_blocks),
        (0, 1, 1)
    );
    assert_eq!(alloc.try_reset(), Ok(()));
}

/// One thread using several allocators in turn, more than it remembers at once (the last few
/// are found without a search, the others by one): every block is booked, and released, in the
/// allocator that gave it, whatever the order.
#[test]
fn one_thread_using_several_allocators_in_turn() {
    let allocs: Vec<CachingAllocator> = (0..6).map(|_| CachingAllocator::new(1 << 20)).collect();
    let order = [0, 1, 0, 1, 2, 0, 3, 4, 5, 1, 5, 0, 2, 4, 3, 3, 1];
    let mut held: Vec<Vec<core::ptr::NonNull<u8>>> = vec![Vec::new(); allocs.len()];
    for (step, &i) in order.iter().enumerate() {
        // Both paths: the arena's small blocks and a size class's.
        let size = if step % 2 == 0 { 100 } else { 50_000 };
        held[i].push(allocs[i].allocate(size, 64).unwrap());
        for (j, alloc) in allocs.iter().enumerate() {
            let s = alloc.stats();
            assert_eq!(
                s.live_blocks,
                held[j].len(),
                "allocator {j} after step {step}: {s}"
            );
        }
    }
    for (i, alloc) in allocs.iter().enumerate() {
        assert_eq!(
            alloc.thread_caches(),
            2,
            "allocator {i}: this thread's and the fallback"
        );
        for p in held[i].drain(..).rev() {
            // SAFETY: each block released once, to the allocator that gave it.
            unsafe { alloc.release(p) }.unwrap();
        }
        assert_eq!(alloc.stats().live_blocks, 0);
    }
}
