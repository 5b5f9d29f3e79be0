//! Bad input: every `AllocError` variant, what triggers it, and what state it leaves. Each test
//! here backs one row of the README's bad-input table.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::alloc::System;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use caching_allocator::{AllocError, CachingAllocator, Config, SizeClass, MAX_ALIGN};

/// An allocator with some history (a live block, an idle block), so "unchanged" means
/// something.
fn warmed(config: Config) -> (CachingAllocator, NonNull<u8>) {
    let alloc = CachingAllocator::with_config(config);
    let live = alloc.allocate(3000, 64).unwrap();
    let idle = alloc.allocate(100, 64).unwrap();
    // SAFETY: `idle` came from `allocate` and is not used after.
    unsafe { alloc.release(idle) }.unwrap();
    (alloc, live)
}

/// Checks the error's `Display` text says something useful.
fn explains(e: &AllocError, words: &[&str]) {
    let text = e.to_string();
    for w in words {
        assert!(text.contains(w), "{text:?} does not mention {w:?}");
    }
    let _: &dyn std::error::Error = e;
}

/// Releases `p`, which is not live in `alloc` (`what` says why): refused with
/// `UnknownPointer` naming it, a message saying what to do, and no stat changed.
fn assert_refused(alloc: &CachingAllocator, p: NonNull<u8>, what: &str) {
    let before = alloc.stats();
    // SAFETY: `p` is not live in `alloc`, which must refuse it without touching its memory.
    let r = unsafe { alloc.release(p) };
    let addr = p.as_ptr() as usize;
    assert_eq!(r, Err(AllocError::UnknownPointer { addr }), "{what}");
    explains(&r.unwrap_err(), &["not live", "exactly once"]);
    assert_eq!(alloc.stats(), before, "{what}");
}

/// Asks `alloc` for `size` bytes aligned to `align`, which it must refuse without changing a
/// stat (`why` says why nothing may change); returns the error.
fn refused(alloc: &CachingAllocator, size: usize, align: usize, why: &str) -> AllocError {
    let before = alloc.stats();
    let e = alloc
        .allocate(size, align)
        .expect_err("the request must be refused");
    assert_eq!(alloc.stats(), before, "{why}: {e}");
    e
}

#[test]
fn invalid_alignment_changes_nothing() {
    let (alloc, live) = warmed(Config::default());
    let before = alloc.stats();
    for align in [0, 3, 5, 6, 12, 34, 96, MAX_ALIGN * 2, 1 << 40, usize::MAX] {
        for size in [0, 1, 4096] {
            let e = alloc.allocate(size, align).unwrap_err();
            assert_eq!(e, AllocError::InvalidAlignment { align });
            explains(&e, &["alignment", &align.to_string(), "power of two"]);
        }
    }
    assert_eq!(alloc.stats(), before);
    // Still works, and the largest alignment is served.
    let p = alloc.allocate(64, MAX_ALIGN).unwrap();
    assert_eq!(p.as_ptr() as usize % MAX_ALIGN, 0);
    // SAFETY: released once, not used after.
    unsafe { alloc.release(p) }.unwrap();
    // SAFETY: released once, not used after.
    unsafe { alloc.release(live) }.unwrap();
}

#[test]
fn size_overflow_changes_nothing() {
    for debug in [false, true] {
        let (alloc, live) = warmed(Config::default().debug_checks(debug));
        let before = alloc.stats();
        let max = isize::MAX as usize;
        for (size, align) in [
            (usize::MAX, 64),
            (max + 1, 64),
            (max, 1), // the class would round past isize::MAX
            (max - 8, 64),
            // Past the largest class (15 * 2^59 bytes) the next class is 2^63.
            ((15 << 59) + 1, MAX_ALIGN),
        ] {
            let e = alloc.allocate(size, align).unwrap_err();
            assert_eq!(e, AllocError::SizeOverflow { size, align }, "debug {debug}");
            explains(&e, &["size", &size.to_string()]);
        }
        // Through a scope: `len * size_of::<T>()` overflows; the error carries the length.
        let scope = alloc.scope();
        let len = usize::MAX / 4;
        let e = scope.alloc_uninit::<u64>(len).unwrap_err();
        assert_eq!(
            e,
            AllocError::SizeOverflow {
                size: len,
                align: 8
            }
        );
        let e = scope.alloc_slice_fill(usize::MAX / 2, 0u32).unwrap_err();
        assert!(matches!(e, AllocError::SizeOverflow { .. }));
        drop(scope);
        assert_eq!(alloc.stats(), before, "debug {debug}");
        // SAFETY: released once, not used after.
        unsafe { alloc.release(live) }.unwrap();
    }
}

#[test]
fn limit_exceeded_changes_nothing_live() {
    let limit = 16 << 10;
    let alloc = CachingAllocator::with_config(Config::default().limit_bytes(limit));
    let a = alloc.allocate(8192, 64).unwrap();
    let b = alloc.allocate(8192, 64).unwrap();
    let e = refused(&alloc, 64, 64, "nothing idle to evict: nothing may change");
    assert_eq!(
        e,
        AllocError::LimitExceeded {
            size: 64,
            class_size: 64,
            limit,
            reserved: limit
        }
    );
    explains(&e, &["limit_bytes", &limit.to_string()]);

    // A request that cannot fit even with every idle block evicted (8 KiB live + 16 KiB >
    // 16 KiB) is refused before anything is evicted: on error nothing changes.
    // SAFETY: released once, not used after.
    unsafe { alloc.release(b) }.unwrap();
    let e = refused(&alloc, 16 << 10, 64, "an impossible request evicted");
    assert!(
        matches!(e, AllocError::LimitExceeded { reserved, .. } if reserved == limit),
        "{e:?}"
    );
    // One that fits once idle blocks are gone evicts them, least recently used first; the
    // live blocks are never touched. (2 KiB: too small for best fit to take the idle 8 KiB
    // block, which is more than twice its class.)
    let c = alloc.allocate(2048, 64).unwrap();
    let after = alloc.stats();
    assert_eq!((after.live_blocks, after.live_bytes), (2, 8192 + 2048));
    assert_eq!((after.cached_blocks, after.evictions), (0, 1));
    // SAFETY: released once, not used after.
    unsafe { alloc.release(c) }.unwrap();
    // Zero bytes never count against the limit.
    assert!(alloc.allocate(0, 64).is_ok());
    // SAFETY: released once, not used after.
    unsafe { alloc.release(a) }.unwrap();
}

/// Refuses every allocation once `remaining` reaches 0.
struct Exhausting {
    remaining: AtomicUsize,
}

// SAFETY: forwards to `System`, or returns null (a refusal `GlobalAlloc` allows).
unsafe impl GlobalAlloc for Exhausting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self
            .remaining
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return core::ptr::null_mut();
        }
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// A configuration whose system allocator gives `blocks` blocks, then refuses; no arena, so
/// every block is one the test counts.
fn exhausting(blocks: usize) -> Config {
    Config::default()
        .arena_max_bytes(0)
        .system_allocator(Arc::new(Exhausting {
            remaining: AtomicUsize::new(blocks),
        }))
}

#[test]
fn out_of_memory_with_nothing_cached_changes_nothing() {
    let alloc = CachingAllocator::with_config(exhausting(1));
    let live = alloc.allocate(3000, 64).unwrap();
    let e = refused(
        &alloc,
        1000,
        128,
        "nothing to give back: nothing may change",
    );
    assert_eq!(
        e,
        AllocError::OutOfMemory {
            size: 1000,
            align: 128
        }
    );
    explains(&e, &["1000", "out of memory"]);
    // SAFETY: released once, not used after.
    unsafe { alloc.release(live) }.unwrap();
    // The released block still serves its class without the system.
    let again = alloc.allocate(3000, 64).unwrap();
    // SAFETY: released once, not used after.
    unsafe { alloc.release(again) }.unwrap();
}

#[test]
fn out_of_memory_after_the_retry_gives_the_idle_cache_back() {
    let (alloc, live) = warmed(exhausting(2));
    let before = alloc.stats();
    assert_eq!(before.cached_blocks, 1);
    let e = alloc.allocate(50_000, 64).unwrap_err();
    assert_eq!(
        e,
        AllocError::OutOfMemory {
            size: 50_000,
            align: 64
        }
    );
    let after = alloc.stats();
    // The documented exception: the idle cache went back to the system before the retry.
    assert_eq!(after.oom_retries, 1);
    assert_eq!((after.cached_blocks, after.cached_bytes), (0, 0));
    assert_eq!(after.evictions, before.evictions + 1);
    assert_eq!(
        (after.live_blocks, after.live_bytes),
        (before.live_blocks, before.live_bytes)
    );
    assert_eq!(after.system_allocs, before.system_allocs);
    // SAFETY: released once, not used after.
    unsafe { alloc.release(live) }.unwrap();
}

#[test]
fn unknown_pointers_change_nothing_and_are_not_read() {
    let (alloc, live) = warmed(Config::default().debug_checks(true));
    let other = CachingAllocator::new(1 << 20);
    let foreign = other.allocate(3000, 64).unwrap();
    let scope = alloc.scope();
    let scoped = scope.alloc_slice_fill(10, 1u8).unwrap().as_mut_ptr();
    let on_stack = 0u64;
    let boxed = Box::new([0u8; 256]);
    let candidates: Vec<(&str, usize)> = vec![
        ("never handed out (stack)", &on_stack as *const u64 as usize),
        ("never handed out (heap)", boxed.as_ptr() as usize),
        // Non-canonical: any read of it would fault, so an Ok or a crash both fail the test.
        ("unmapped address", 0xDEAD_0000_0000_0040),
        ("inside a live block", live.as_ptr() as usize + 64),
        ("owned by a scope", scoped as usize),
        ("handed out by another allocator", foreign.as_ptr() as usize),
    ];
    for (what, addr) in candidates {
        assert_refused(&alloc, NonNull::new(addr as *mut u8).unwrap(), what);
    }
    drop(scope);

    // Released twice: the second is refused.
    let p = alloc.allocate(500, 64).unwrap();
    // SAFETY: released once, not used after.
    unsafe { alloc.release(p) }.unwrap();
    assert_refused(&alloc, p, "released before");

    // Taken back by a reset.
    let mut alloc = alloc;
    alloc.reset();
    assert_refused(&alloc, live, "taken back by a reset");
    // The other allocator still owns its block.
    // SAFETY: released once, not used after.
    unsafe { other.release(foreign) }.unwrap();
}

#[test]
fn zero_size_is_not_an_error() {
    let (alloc, live) = warmed(Config::default());
    let before = alloc.stats();
    for align in [1, 64, 4096, MAX_ALIGN] {
        let p = alloc.allocate(0, align).unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0);
        // SAFETY: a zero-size pointer: releasing it is always Ok, any number of times.
        assert_eq!(unsafe { alloc.release(p) }, Ok(()));
        // SAFETY: as above.
        assert_eq!(unsafe { alloc.release(p) }, Ok(()));
    }
    assert_eq!(alloc.stats(), before);
    // SAFETY: released once, not used after.
    unsafe { alloc.release(live) }.unwrap();
}

#[test]
fn corrupted_block_goes_back_to_the_system_and_is_never_reused() {
    let (alloc, live) = warmed(Config::default().debug_checks(true));
    let requested = 100;
    let class_size = SizeClass::for_size(requested + 16).unwrap().size();
    let p = alloc.allocate(requested, 64).unwrap();
    // SAFETY: the block has room behind the requested end (the canary): writing one byte
    // there is what the debug checks exist to catch.
    unsafe { p.as_ptr().add(requested).write(0) };
    let before = alloc.stats();
    // SAFETY: released once, not used after.
    let e = unsafe { alloc.release(p) }.unwrap_err();
    let addr = p.as_ptr() as usize;
    assert_eq!(
        e,
        AllocError::Corrupted {
            addr,
            requested,
            class_size
        }
    );
    explains(&e, &["written past", &requested.to_string()]);
    let after = alloc.stats();
    assert_eq!(after.corrupted_blocks, 1);
    assert_eq!(after.system_frees, before.system_frees + 1);
    assert_eq!(after.live_blocks, before.live_blocks - 1);
    assert_eq!(
        after.cached_blocks, before.cached_blocks,
        "an overrun block is never cached"
    );
    // Gone from the books: a second release is an unknown pointer.
    // SAFETY: `p` is not live any more: refused.
    let r = unsafe { alloc.release(p) };
    assert_eq!(r, Err(AllocError::UnknownPointer { addr }));
    // SAFETY: released once, not used after.
    unsafe { alloc.release(live) }.unwrap();
}

#[test]
fn reset_returns_every_other_block_then_names_the_overrun() {
    let mut alloc = CachingAllocator::with_config(Config::default().debug_checks(true));
    let good = alloc.allocate(3000, 64).unwrap();
    let bad = alloc.allocate(100, 64).unwrap();
    // SAFETY: one byte into the canary behind the requested end (see above).
    unsafe { bad.as_ptr().add(100).write(0) };
    let _ = good;
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| alloc.reset()))
        .expect_err("reset must panic on an overrun block");
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("100 bytes requested (class 128)"), "{msg}");
    let stats = alloc.stats();
    assert_eq!(stats.live_blocks, 0, "every other block was returned first");
    assert_eq!((stats.cached_blocks, stats.corrupted_blocks), (1, 1));
}
