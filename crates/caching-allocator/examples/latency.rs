//! Cache-hit round trips on long-lived threads, and the first call on a new thread.
//!
//! `cargo run --release -p caching-allocator --example latency`
//!
//! divan's `threads = [1, 2]` (in `benches/roundtrip.rs`) starts threads per sample, so its
//! 2-thread figures mostly measure a thread's first calls; this example keeps its threads for
//! the whole run and reports the median of several rounds, plus what a fresh thread's first
//! call costs (registering its cache, its first miss).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use allocator_api2::alloc::Allocator;
use caching_allocator::CachingAllocator;
use mimalloc::MiMalloc;

const ITERS: usize = 2_000_000;
const ROUNDS: usize = 7;

fn per_op(f: &(dyn Fn() + Sync)) -> f64 {
    let t = Instant::now();
    for _ in 0..ITERS {
        f();
    }
    t.elapsed().as_nanos() as f64 / ITERS as f64
}

/// Median ns per op of `f` on each of `threads` threads running at once.
fn measure(threads: usize, f: &(dyn Fn() + Sync)) -> f64 {
    let mut rounds = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    per_op(f); // warm-up: the thread's cache fills
                    (0..ROUNDS).map(|_| per_op(f)).collect::<Vec<f64>>()
                })
            })
            .collect();
        for h in handles {
            rounds.extend(h.join().unwrap());
        }
    });
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn main() {
    let alloc = CachingAllocator::new(256 << 20);
    let layout = Layout::from_size_align(4096, 64).unwrap();
    let scope = || {
        let scope = alloc.scope();
        let s = scope.alloc_uninit::<u8>(black_box(4096)).unwrap();
        black_box(s.as_mut_ptr());
    };
    let api2 = || {
        let p = Allocator::allocate(&alloc, black_box(layout)).unwrap();
        // SAFETY: `p` was just allocated with `layout` and is not used after.
        unsafe { Allocator::deallocate(&alloc, p.cast(), layout) };
    };
    let release = || {
        let p = alloc.allocate(black_box(4096), 64).unwrap();
        // SAFETY: `p` was just allocated and is not used after.
        unsafe { alloc.release(p).unwrap() };
    };
    let system = || {
        // SAFETY: non-zero layout, freed with the same layout.
        unsafe { System.dealloc(black_box(System.alloc(layout)), layout) };
    };
    let mimalloc = || {
        // SAFETY: non-zero layout, freed with the same layout.
        unsafe { MiMalloc.dealloc(black_box(MiMalloc.alloc(layout)), layout) };
    };
    let cases: [(&str, &(dyn Fn() + Sync)); 5] = [
        ("Scope (open, 4 KiB, drop)", &scope),
        ("allocator-api2 allocate + deallocate", &api2),
        ("allocate + checked release", &release),
        ("System alloc + dealloc", &system),
        ("mimalloc alloc + dealloc", &mimalloc),
    ];
    println!("round trip, 4 KiB, cache hit       1 thread   2 threads   2 thr / 1 thr");
    for (name, f) in cases {
        let one = measure(1, f);
        let two = measure(2, f);
        println!(
            "{name:<36} {one:>6.1} ns  {two:>7.1} ns  {:>10.2}x",
            two / one
        );
    }

    // One thread with two allocators (a temp and a persistent one) using them in turn,
    // against the same two round trips on one allocator (goal: within 1.3x).
    let second = CachingAllocator::new(256 << 20);
    let trip = |a: &CachingAllocator| {
        let p = a.allocate(black_box(4096), 64).unwrap();
        // SAFETY: `p` was just allocated and is not used after.
        unsafe { a.release(p).unwrap() };
    };
    let one_twice = || {
        trip(&alloc);
        trip(&alloc);
    };
    let two_in_turn = || {
        trip(&alloc);
        trip(&second);
    };
    let one = measure(1, &one_twice);
    let two = measure(1, &two_in_turn);
    println!(
        "two release trips, one thread: one allocator {one:.1} ns, two in turn {two:.1} ns, \
         {:.2}x",
        two / one
    );

    // A fresh thread's first call: registration, first miss, first credit.
    let mut firsts: Vec<f64> = (0..200)
        .map(|_| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let t = Instant::now();
                    scope();
                    t.elapsed().as_nanos() as f64
                })
                .join()
                .unwrap()
            })
        })
        .collect();
    firsts.sort_by(f64::total_cmp);
    println!(
        "first Scope round trip on a new thread: median {:.1} us ({} thread caches kept)",
        firsts[firsts.len() / 2] / 1000.0,
        alloc.thread_caches()
    );
}
