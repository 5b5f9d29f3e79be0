//! Instruction counts of the cache-hit paths, for `valgrind --tool=callgrind` (counts do not
//! depend on the machine's load): `cargo build --release -p caching-allocator --example
//! hotpath && valgrind --tool=callgrind target/release/examples/hotpath release 100000`,
//! minus the same with 0 iterations, divided by the iterations. `scripts/hotpath-counts.sh`
//! does all of it.
//!
//! The arena serves every request up to `MAX_ARENA_BYTES` (`Config::arena_max_bytes`);
//! `reset2-classes` is `reset2` with the default bound (32 KiB) and the adaptive arena off,
//! where the 2 MiB block is a size class's; `reset2-default` is `reset2` with the default
//! configuration, whose arena takes the 2 MiB block once the calls are known to fit a chunk.
//! `medium8` and `medium8-classes` are the same pair for allocbench's scratch-medium call
//! (eight blocks of 64 KiB - 1 MiB, then a reset); `reset16-default` is `reset16` with the
//! default configuration (the adaptive arena's choice at each rewind).
//!
//! Modes: `release` (allocate 4 KiB + release), `release-two` (the same round trip on two
//! allocators in turn, as a thread with a temp and a persistent allocator makes), `scope` (open, 4 KiB, drop), `reset2`
//! (allocbench's decode call: 20 KiB + 2 MiB, then a reset), `reset16` (allocbench's
//! scratch-small call: 16 blocks of 64 B - 4 KiB, then a reset), and `static16`: the
//! `reset16` loop touching one buffer allocated once, the harness's own cost to subtract.

use std::hint::black_box;

use caching_allocator::{CachingAllocator, Config, MAX_ARENA_BYTES};

/// The sizes of the `medium8` call: 64 KiB - 1 MiB, as allocbench's scratch-medium mix.
const SIZES8: [usize; 8] = [
    64 << 10,
    (96 << 10) + 192,
    128 << 10,
    (200 << 10) + 64,
    256 << 10,
    (384 << 10) + 320,
    640 << 10,
    1 << 20,
];

/// The sizes of the `reset16` call: 64 B - 4 KiB, as allocbench's scratch-small mix.
const SIZES16: [usize; 16] = [
    64, 128, 256, 512, 1024, 2048, 4096, 64, 128, 256, 512, 1024, 2048, 4096, 64, 128,
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("release", String::as_str);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let arena_max = if what == "reset2-classes" || what == "medium8-classes" {
        caching_allocator::DEFAULT_ARENA_MAX_BYTES
    } else {
        MAX_ARENA_BYTES
    };
    let config = Config::default().max_cached_bytes(64 << 20);
    // `reset2-default`: the default configuration, whose arena adapts to the call.
    let config = if what == "reset2-default" || what == "medium8" || what == "reset16-default" {
        config
    } else {
        config.arena_max_bytes(arena_max).arena_adaptive(false)
    };
    let alloc = CachingAllocator::with_config(config);
    let second = CachingAllocator::with_config(alloc.config().clone());
    let mut buffer = vec![0u8; 4096];
    // One loop per mode, so the mode's match is not part of what is counted.
    match what {
        "release" => (0..n).for_each(|_| {
            let p = alloc.allocate(black_box(4096), 64).unwrap();
            // SAFETY: just allocated, not used after.
            unsafe { alloc.release(p).unwrap() };
        }),
        "release-two" => (0..n).for_each(|i| {
            let alloc = if i % 2 == 0 { &alloc } else { &second };
            let p = alloc.allocate(black_box(4096), 64).unwrap();
            // SAFETY: just allocated, not used after.
            unsafe { alloc.release(p).unwrap() };
        }),
        "scope" => (0..n).for_each(|_| {
            let scope = alloc.scope();
            let s = scope.alloc_uninit::<u8>(black_box(4096)).unwrap();
            black_box(s.as_mut_ptr());
        }),
        "reset2" | "reset2-classes" | "reset2-default" => (0..n).for_each(|_| {
            black_box(alloc.allocate(black_box(20 << 10), 64).unwrap());
            black_box(alloc.allocate(black_box(2 << 20), 64).unwrap());
            // SAFETY: nothing handed out above is used after this.
            unsafe { alloc.reset_unchecked() };
        }),
        "medium8" | "medium8-classes" => (0..n).for_each(|_| {
            for &size in &SIZES8 {
                black_box(alloc.allocate(black_box(size), 64).unwrap());
            }
            // SAFETY: nothing handed out above is used after this.
            unsafe { alloc.reset_unchecked() };
        }),
        "reset16" | "reset16-default" => (0..n).for_each(|_| {
            for &size in &SIZES16 {
                black_box(alloc.allocate(black_box(size), 64).unwrap());
            }
            // SAFETY: nothing handed out above is used after this.
            unsafe { alloc.reset_unchecked() };
        }),
        "static16" => (0..n).for_each(|_| {
            for &size in &SIZES16 {
                black_box(&mut buffer[..black_box(size)]);
            }
        }),
        _ => panic!(
            "release, release-two, scope, reset2, reset2-classes, reset2-default, medium8, \
             medium8-classes, reset16, reset16-default or static16"
        ),
    }
}
