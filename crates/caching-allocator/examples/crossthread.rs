//! Cross-thread and multi-thread figures, each beside its baseline in the same run:
//!
//! 1. a 2-thread producer/consumer pipeline of 256 KiB blocks (the producer allocates and sends
//!    the block through a bounded channel, the consumer writes one byte and frees it): caching
//!    vs the System allocator (glibc) vs mimalloc, ns per block;
//! 2. one cross-thread release (a block allocated on another thread), and one release of an
//!    unknown pointer, with 3 and with 67 threads that have used the allocator (all alive);
//! 3. each further small allocation inside a live `Scope` vs bumpalo's `Bump`.
//!
//! `cargo run --release -p caching-allocator --example crossthread`
//!
//! Prints figures only: no timing is asserted. Each figure is the median of several rounds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::mpsc;
use std::time::Instant;

use caching_allocator::CachingAllocator;
use mimalloc::MiMalloc;

const ROUNDS: usize = 5;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

// ---- 1. the pipeline ----------------------------------------------------------------------

const BLOCK: usize = 256 << 10;
const PIPELINE_BLOCKS: usize = 50_000;

/// A pointer that crosses threads.
struct SendPtr(NonNull<u8>);
// SAFETY: the block behind it is used by one thread at a time: the producer hands it over.
unsafe impl Send for SendPtr {}

type AllocFn<'a> = &'a (dyn Fn() -> NonNull<u8> + Sync);
type FreeFn<'a> = &'a (dyn Fn(NonNull<u8>) + Sync);

/// ns per block of a pipeline whose producer calls `alloc` and whose consumer writes one byte
/// and calls `free`.
fn pipeline(alloc: AllocFn, free: FreeFn) -> f64 {
    let (tx, rx) = mpsc::sync_channel::<SendPtr>(64);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            for _ in 0..PIPELINE_BLOCKS {
                tx.send(SendPtr(alloc())).unwrap();
            }
        });
        s.spawn(move || {
            for SendPtr(p) in rx {
                // SAFETY: `p` is a live block of `BLOCK` bytes handed to this thread alone.
                unsafe { p.as_ptr().add(BLOCK / 2).write_volatile(1) };
                free(p);
            }
        });
    });
    start.elapsed().as_nanos() as f64 / PIPELINE_BLOCKS as f64
}

fn pipelines() {
    let layout = Layout::from_size_align(BLOCK, 64).unwrap();
    let caching = CachingAllocator::new(64 << 20);
    let cases: [(&str, AllocFn, FreeFn); 3] = [
        (
            "caching allocate / release",
            &|| caching.allocate(BLOCK, 64).unwrap(),
            // SAFETY: `p` is live in `caching` and not used after.
            &|p| unsafe { caching.release(p) }.unwrap(),
        ),
        (
            "System (glibc) alloc / dealloc",
            // SAFETY: non-zero layout; null is checked.
            &|| NonNull::new(unsafe { System.alloc(layout) }).unwrap(),
            // SAFETY: `p` came from `System.alloc(layout)` and is not used after.
            &|p| unsafe { System.dealloc(p.as_ptr(), layout) },
        ),
        (
            "mimalloc alloc / dealloc",
            // SAFETY: non-zero layout; null is checked.
            &|| NonNull::new(unsafe { MiMalloc.alloc(layout) }).unwrap(),
            // SAFETY: `p` came from `MiMalloc.alloc(layout)` and is not used after.
            &|p| unsafe { MiMalloc.dealloc(p.as_ptr(), layout) },
        ),
    ];
    println!(
        "1. pipeline, 256 KiB blocks, producer -> bounded channel -> consumer ({PIPELINE_BLOCKS} \
         blocks, median of {ROUNDS})"
    );
    let mut figures = Vec::new();
    for (name, a, f) in cases {
        pipeline(a, f); // warm-up
        let ns = median((0..ROUNDS).map(|_| pipeline(a, f)).collect());
        figures.push(ns);
        println!("   {name:<34} {ns:>8.0} ns/block");
    }
    println!(
        "   caching / glibc {:.2}x, caching / mimalloc {:.2}x",
        figures[0] / figures[1],
        figures[0] / figures[2]
    );
}

// ---- 2. cross-thread and unknown releases vs threads registered ----------------------------

const BATCH: usize = 20_000;

/// With `threads` threads that have used a fresh allocator (all alive): ns of one release of a
/// block allocated on another thread, and of one release of a pointer never handed out.
fn releases(threads: usize) -> (f64, f64) {
    assert!(threads >= 3);
    let alloc = CachingAllocator::new(256 << 20);
    let (park_tx, park_rx) = mpsc::channel::<()>();
    let park_rx = std::sync::Mutex::new(park_rx);
    let foreign = vec![0u8; 4096];
    let mut cross = Vec::new();
    let mut unknown = Vec::new();
    std::thread::scope(|s| {
        // threads - 2 idle helpers (registered first), a producer (main), a releaser.
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        for _ in 0..threads - 2 {
            let (alloc, ready_tx, park_rx) = (&alloc, ready_tx.clone(), &park_rx);
            s.spawn(move || {
                let p = alloc.allocate(4096, 64).unwrap();
                // SAFETY: just allocated, not used after.
                unsafe { alloc.release(p) }.unwrap();
                ready_tx.send(()).unwrap();
                let _ = park_rx.lock().unwrap().recv(); // alive until the end
            });
        }
        for _ in 0..threads - 2 {
            ready_rx.recv().unwrap();
        }
        let (work_tx, work_rx) = mpsc::channel::<Vec<SendPtr>>();
        let (time_tx, time_rx) = mpsc::channel::<(f64, f64)>();
        let (alloc, foreign) = (&alloc, &foreign);
        s.spawn(move || {
            // The releaser: registered too, by a first round trip.
            let p = alloc.allocate(4096, 64).unwrap();
            // SAFETY: just allocated, not used after.
            unsafe { alloc.release(p) }.unwrap();
            let bogus = NonNull::new(foreign.as_ptr().wrapping_add(64).cast_mut()).unwrap();
            for batch in work_rx {
                let n = batch.len();
                let t = Instant::now();
                for SendPtr(p) in batch {
                    // SAFETY: live, allocated on the producer thread, not used after.
                    unsafe { alloc.release(black_box(p)) }.unwrap();
                }
                let cross = t.elapsed().as_nanos() as f64 / n as f64;
                let t = Instant::now();
                for _ in 0..n / 4 {
                    // SAFETY: never handed out: rejected without touching the memory.
                    let r = unsafe { alloc.release(black_box(bogus)) };
                    assert!(r.is_err());
                }
                let unknown = t.elapsed().as_nanos() as f64 / (n / 4) as f64;
                time_tx.send((cross, unknown)).unwrap();
            }
        });
        for _ in 0..=ROUNDS {
            let batch: Vec<SendPtr> = (0..BATCH)
                .map(|_| SendPtr(alloc.allocate(4096, 64).unwrap()))
                .collect();
            work_tx.send(batch).unwrap();
            let (c, u) = time_rx.recv().unwrap();
            cross.push(c);
            unknown.push(u);
        }
        assert_eq!(
            alloc.thread_caches(),
            threads + 1,
            "threads + the fallback cache"
        );
        drop(work_tx);
        drop(park_tx);
    });
    cross.remove(0); // warm-up round
    unknown.remove(0);
    (median(cross), median(unknown))
}

fn cross_thread_releases() {
    println!(
        "2. release on another thread than the one that allocated (4 KiB, batches of {BATCH}), \
         and release of an unknown pointer, vs threads that have used the allocator (alive)"
    );
    for threads in [3, 67] {
        let (cross, unknown) = releases(threads);
        println!(
            "   {threads:>2} threads: cross-thread release {cross:>8.0} ns, unknown pointer \
             {unknown:>8.0} ns"
        );
    }
}

// ---- 3. small allocations inside a live Scope vs bumpalo ----------------------------------

const PER_SCOPE: usize = 1000;
const SCOPES: usize = 200;

fn scope_vs_bumpalo() {
    println!(
        "3. each further allocation inside a live Scope vs bumpalo ({PER_SCOPE} per scope / \
         reset, median of {ROUNDS})"
    );
    let alloc = CachingAllocator::new(256 << 20);
    let mut bump = bumpalo::Bump::new();
    for size in [64usize, 256, 1024, 4096] {
        let caching = || {
            let t = Instant::now();
            for _ in 0..SCOPES {
                let scope = alloc.scope();
                for _ in 0..PER_SCOPE {
                    let s = scope.alloc_uninit::<u8>(black_box(size)).unwrap();
                    black_box(s.as_mut_ptr());
                }
            }
            t.elapsed().as_nanos() as f64 / (SCOPES * PER_SCOPE) as f64
        };
        let mut bumping = || {
            let t = Instant::now();
            for _ in 0..SCOPES {
                for _ in 0..PER_SCOPE {
                    let l = Layout::from_size_align(black_box(size), 1).unwrap();
                    black_box(bump.alloc_layout(l));
                }
                bump.reset();
            }
            t.elapsed().as_nanos() as f64 / (SCOPES * PER_SCOPE) as f64
        };
        caching();
        bumping();
        let c = median((0..ROUNDS).map(|_| caching()).collect());
        let b = median((0..ROUNDS).map(|_| bumping()).collect());
        println!(
            "   {size:>5} B: Scope {c:>7.1} ns/alloc, bumpalo {b:>6.1} ns/alloc, ratio {:.1}x",
            c / b
        );
    }
}

fn main() {
    let which: Vec<String> = std::env::args().skip(1).collect();
    let run = |n: &str| which.is_empty() || which.iter().any(|w| w == n);
    if run("1") {
        pipelines();
    }
    if run("2") {
        cross_thread_releases();
    }
    if run("3") {
        scope_vs_bumpalo();
    }
}
