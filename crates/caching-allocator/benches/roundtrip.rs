//! Cache-hit round trips and allocate + touch + free at several sizes, against `System` and
//! mimalloc. Run with `cargo bench -p caching-allocator --bench roundtrip`.
//!
//! Targets (core issue): the `Scope` and allocator-api2 round trips at most 10 ns median on
//! one thread, the checked `release` round trip at most 20 ns; with 2 threads each thread
//! within 1.5x of its single-thread figure; at 256 KiB and above, faster than `System` and
//! mimalloc.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::OnceLock;

use allocator_api2::alloc::Allocator;
use caching_allocator::CachingAllocator;
use divan::{black_box, Bencher};
use mimalloc::MiMalloc;

fn main() {
    divan::main();
}

fn shared() -> &'static CachingAllocator {
    static ALLOC: OnceLock<CachingAllocator> = OnceLock::new();
    ALLOC.get_or_init(|| CachingAllocator::new(256 << 20))
}

const PAGE: usize = 4096;

/// One cache-hit round trip per iteration; `threads` runs it on 1 and 2 threads at once.
/// Samples of 1,000 iterations: divan sizes samples from the first call, which is a slow one
/// here (a cache's first block comes from the system), and would time single iterations
/// against a timer coarser than the round trip.
mod hit {
    use super::*;

    #[divan::bench(threads = [1, 2], sample_size = 1000)]
    fn scope_4k(b: Bencher) {
        let alloc = shared();
        b.bench(|| {
            let scope = alloc.scope();
            let s = scope.alloc_uninit::<u8>(black_box(4096)).unwrap();
            black_box(s.as_mut_ptr());
        });
    }

    #[divan::bench(threads = [1, 2], sample_size = 1000)]
    fn allocator_api2_4k(b: Bencher) {
        let alloc = shared();
        let layout = Layout::from_size_align(4096, 64).unwrap();
        b.bench(|| {
            let p = Allocator::allocate(alloc, black_box(layout)).unwrap();
            // SAFETY: `p` was just allocated with `layout` and is not used after.
            unsafe { Allocator::deallocate(alloc, p.cast(), layout) };
        });
    }

    #[divan::bench(threads = [1, 2], sample_size = 1000)]
    fn allocate_release_4k(b: Bencher) {
        let alloc = shared();
        b.bench(|| {
            let p = alloc.allocate(black_box(4096), 64).unwrap();
            // SAFETY: `p` was just allocated and is not used after.
            unsafe { alloc.release(p).unwrap() };
        });
    }

    /// Two release round trips per iteration on one allocator: the baseline of
    /// `two_allocators_in_turn_4k`.
    #[divan::bench(sample_size = 1000)]
    fn one_allocator_twice_4k(b: Bencher) {
        let alloc = shared();
        b.bench(|| {
            for _ in 0..2 {
                let p = alloc.allocate(black_box(4096), 64).unwrap();
                // SAFETY: `p` was just allocated and is not used after.
                unsafe { alloc.release(p).unwrap() };
            }
        });
    }

    /// One release round trip on each of two allocators per iteration, as a thread with a
    /// temp and a persistent allocator makes them (goal: within 1.3x of
    /// `one_allocator_twice_4k`).
    #[divan::bench(sample_size = 1000)]
    fn two_allocators_in_turn_4k(b: Bencher) {
        static SECOND: OnceLock<CachingAllocator> = OnceLock::new();
        let second = SECOND.get_or_init(|| CachingAllocator::new(256 << 20));
        let allocators = [shared(), second];
        b.bench(|| {
            for alloc in allocators {
                let p = alloc.allocate(black_box(4096), 64).unwrap();
                // SAFETY: `p` was just allocated and is not used after.
                unsafe { alloc.release(p).unwrap() };
            }
        });
    }

    /// The baselines: a 4 KiB `alloc` + `dealloc` round trip through a global allocator.
    fn global_4k<G: GlobalAlloc + Sync>(b: Bencher, global: &G) {
        let layout = Layout::from_size_align(4096, 64).unwrap();
        b.bench(|| {
            // SAFETY: non-zero layout; freed with the same layout.
            unsafe {
                let p = global.alloc(black_box(layout));
                global.dealloc(p, layout);
            }
        });
    }

    #[divan::bench(threads = [1, 2], sample_size = 1000)]
    fn system_4k(b: Bencher) {
        global_4k(b, &System);
    }

    #[divan::bench(threads = [1, 2], sample_size = 1000)]
    fn mimalloc_4k(b: Bencher) {
        global_4k(b, &MiMalloc);
    }
}

/// Allocate, touch one byte per 4 KiB page, give back.
mod touch {
    use super::*;

    const SIZES: [usize; 4] = [4 << 10, 256 << 10, 4 << 20, 64 << 20];

    fn touch(p: *mut u8, size: usize) {
        let mut i = 0;
        while i < size {
            // SAFETY: `p` points to `size` writable bytes.
            unsafe { p.add(i).write_volatile(1) };
            i += PAGE;
        }
    }

    #[divan::bench(args = SIZES)]
    fn caching(b: Bencher, size: usize) {
        let alloc = shared();
        b.bench(|| {
            let p = alloc.allocate(size, 64).unwrap();
            touch(p.as_ptr(), size);
            // SAFETY: `p` was just allocated and is not used after.
            unsafe { alloc.release(p).unwrap() };
        });
    }

    fn global(b: Bencher, size: usize, a: &(dyn GlobalAlloc + Sync)) {
        let layout = Layout::from_size_align(size, 64).unwrap();
        b.bench(|| {
            // SAFETY: non-zero layout; checked for null; freed with the same layout.
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                touch(p, size);
                a.dealloc(p, layout);
            }
        });
    }

    #[divan::bench(args = SIZES)]
    fn system(b: Bencher, size: usize) {
        global(b, size, &System);
    }

    #[divan::bench(args = SIZES)]
    fn mimalloc(b: Bencher, size: usize) {
        global(b, size, &MiMalloc);
    }
}
