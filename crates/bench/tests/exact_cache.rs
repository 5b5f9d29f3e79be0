//! `exact-cache`, the re-implementation of ExecuTorch's `CPUCachingAllocator`, behaves as the
//! original: exact padded-size keys, alignment clamped to 64 and checked, free-all over the cap
//! at reset, keep-all under it.

use core::ptr::NonNull;

use allocbench::source::{AllocError, ExactCache, ExactCacheStats};

fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize
}

/// A fresh cache's block of `first` (size, alignment), then after a reset one of `second`.
fn around_a_reset(first: (usize, usize), second: (usize, usize)) -> (ExactCache, [NonNull<u8>; 2]) {
    let c = ExactCache::new(10 << 20);
    let a = c.allocate(first.0, first.1).unwrap();
    // SAFETY: `a` is not used after the reset (only its address is compared).
    unsafe { c.reset() };
    let b = c.allocate(second.0, second.1).unwrap();
    (c, [a, b])
}

#[test]
fn small_allocations_are_64_aligned() {
    let c = ExactCache::new(10 << 20);
    for size in [16, 32, 64] {
        assert_eq!(addr(c.allocate(size, 1).unwrap()) % 64, 0);
    }
}

#[test]
fn two_blocks_of_a_size_are_both_reused() {
    let c = ExactCache::new(10 << 20);
    let mut first = [c.allocate(256, 64).unwrap(), c.allocate(256, 64).unwrap()];
    assert_ne!(first[0], first[1]);
    // SAFETY: nothing is used after the reset.
    unsafe { c.reset() };
    let mut second = [c.allocate(256, 64).unwrap(), c.allocate(256, 64).unwrap()];
    first.sort();
    second.sort();
    assert_eq!(first, second);
}

#[test]
fn only_the_exact_size_is_reused_after_reset() {
    let (c, [a, b]) = around_a_reset((256, 64), (256, 64));
    let s = c.stats();
    assert_eq!((a, s.hits, s.misses), (b, 1, 1));
    // One byte more is a different key: a miss, a new malloc, a different block.
    let (c, [a, b]) = around_a_reset((256, 64), (257, 64));
    let s = c.stats();
    assert_ne!(a, b);
    assert_eq!((s.hits, s.misses, s.idle_blocks), (0, 2, 1));
}

#[test]
fn same_size_different_alignment_is_a_different_key() {
    let (c, [a, b]) = around_a_reset((100, 256), (100, 512));
    assert_eq!(addr(a) % 256, 0);
    assert_eq!(addr(b) % 512, 0);
    assert_eq!(c.stats().misses, 2);
}

#[test]
fn alignment_is_honoured_on_hits() {
    let c = ExactCache::new(10 << 20);
    for align in [64, 128, 256, 512] {
        for _ in 0..3 {
            let p = c.allocate(100, align).unwrap();
            assert_eq!(addr(p) % align, 0, "align {align}");
            // SAFETY: `p` is not used after the reset.
            unsafe { c.reset() };
        }
    }
    // A block cached for (548, 64) has padded size 611, the same key as (100, 512): the
    // hit must be re-aligned for the new request, not returned as cached.
    let c = ExactCache::new(10 << 20);
    c.allocate(548, 64).unwrap();
    // SAFETY: nothing is used after the reset.
    unsafe { c.reset() };
    let p = c.allocate(100, 512).unwrap();
    assert_eq!(c.stats().hits, 1);
    assert_eq!(addr(p) % 512, 0);
}

#[test]
fn invalid_alignment_fails() {
    let c = ExactCache::new(10 << 20);
    for align in [0, 5, 6, 12, 34] {
        assert_eq!(
            c.allocate(64, align),
            Err(AllocError::InvalidAlignment { align }),
            "align {align}"
        );
    }
    assert_eq!(c.stats(), ExactCacheStats::default());
}

#[test]
fn over_the_cap_reset_frees_everything() {
    let c = ExactCache::new(1024);
    // The cap never refuses: three 512-byte blocks under a 1 KiB cap.
    let ps: Vec<_> = (0..3).map(|_| c.allocate(512, 64).unwrap()).collect();
    assert_eq!(ps.len(), 3);
    assert!(c.stats().current_bytes > 1024);
    // SAFETY: nothing is used after the reset.
    unsafe { c.reset() };
    let s = c.stats();
    assert_eq!(s.free_all_resets, 1);
    assert_eq!(s.frees, 3);
    assert_eq!((s.current_bytes, s.idle_blocks, s.live_blocks), (0, 0, 0));
    // Everything was freed, so the next request misses again.
    c.allocate(512, 64).unwrap();
    assert_eq!(c.stats().misses, 4);
}

#[test]
fn under_the_cap_reset_keeps_everything() {
    let c = ExactCache::new(10 << 20);
    for size in [128, 256, 512, 128] {
        c.allocate(size, 64).unwrap();
    }
    // SAFETY: nothing is used after the reset.
    unsafe { c.reset() };
    let s = c.stats();
    assert_eq!((s.free_all_resets, s.frees, s.idle_blocks), (0, 0, 4));
    for size in [128, 256, 512, 128] {
        c.allocate(size, 64).unwrap();
    }
    assert_eq!(c.stats().hits, 4);
}

#[test]
fn memory_is_writable() {
    let c = ExactCache::new(10 << 20);
    let p = c.allocate(1024, 64).unwrap();
    // SAFETY: `p` points to 1024 writable bytes until the reset.
    let s = unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), 1024) };
    s.fill(0xAB);
    assert!(s.iter().all(|&b| b == 0xAB));
}
