//! Minimal reproductions of bugs the fuzzer and the fault-injection tests found in the core.

use core::alloc::{GlobalAlloc, Layout};
use std::sync::Arc;

use caching_allocator::{AllocError, CachingAllocator, Config};

/// Found by `fuzz_ops` (seeded input, op 13): `reset(&mut self)` forgets the caches of exited
/// threads, and their `hits`/`misses`/peak counters went with them, so `hits + misses` went
/// backwards (2 after 3 allocations) and `misses != system_allocs`.
#[test]
fn counters_survive_forgetting_an_exited_threads_cache() {
    // Size classes (the arena would serve the block as a hit of its chunk).
    let mut alloc = CachingAllocator::with_config(
        Config::default()
            .max_cached_bytes(1 << 20)
            .arena_max_bytes(0),
    );
    let addr = std::thread::scope(|s| {
        s.spawn(|| alloc.allocate(5000, 64).unwrap().as_ptr() as usize)
            .join()
            .unwrap()
    });
    // Released here, so the exited thread's cache holds nothing live and reset may forget it.
    // SAFETY: `addr` came from `allocate` and is not used after.
    unsafe { alloc.release(core::ptr::NonNull::new(addr as *mut u8).unwrap()) }.unwrap();
    let counters = |s: &caching_allocator::Stats| (s.hits, s.misses);
    let before = alloc.stats();
    assert_eq!(counters(&before), (0, 1));
    alloc.reset();
    let after = alloc.stats();
    assert_eq!(
        counters(&after),
        counters(&before),
        "counters went backwards: {after:?}"
    );
    assert_eq!(after.misses, after.system_allocs);
    assert!(after.peak_live_bytes >= before.peak_live_bytes, "{after:?}");
}

/// A system allocator that refuses everything.
struct Refusing;

// SAFETY: returning null is a valid refusal; `dealloc` is never reached (nothing is handed out).
unsafe impl GlobalAlloc for Refusing {
    unsafe fn alloc(&self, _: Layout) -> *mut u8 {
        core::ptr::null_mut()
    }
    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {
        unreachable!("nothing was allocated")
    }
}

/// Found by `fault_injection`: `reserve` raised `peak_reserved_bytes` before asking the system,
/// so a refused allocation (`OutOfMemory`, "nothing changes") left a peak of bytes never held.
#[test]
fn refused_allocation_leaves_the_peak_alone() {
    let alloc =
        CachingAllocator::with_config(Config::default().system_allocator(Arc::new(Refusing)));
    let before = alloc.stats();
    let err = alloc.allocate(40_000, 64).unwrap_err();
    assert_eq!(
        err,
        AllocError::OutOfMemory {
            size: 40_000,
            align: 64
        }
    );
    assert_eq!(
        alloc.stats(),
        before,
        "a refused allocation changed the stats"
    );
}
