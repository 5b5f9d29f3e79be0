//! Instruction counts of the cache-hit paths, for `valgrind --tool=callgrind` (counts do not
//! depend on the machine's load): `cargo build --release -p caching-allocator --example
//! hotpath && valgrind --tool=callgrind target/release/examples/hotpath release 100000`
//! (modes: `release`, `scope`, `reset2`, `reset16`, and `static16`: the `reset16` loop
//! touching one buffer allocated once, the harness's own cost to subtract).

use std::hint::black_box;

use caching_allocator::CachingAllocator;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("release", String::as_str);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let alloc = CachingAllocator::new(64 << 20);
    let mut buffer = vec![0u8; 4096];
    for _ in 0..n {
        match what {
            "release" => {
                let p = alloc.allocate(black_box(4096), 64).unwrap();
                // SAFETY: just allocated, not used after.
                unsafe { alloc.release(p).unwrap() };
            }
            "scope" => {
                let scope = alloc.scope();
                let s = scope.alloc_uninit::<u8>(black_box(4096)).unwrap();
                black_box(s.as_mut_ptr());
            }
            "reset2" => {
                // allocbench's decode call: two blocks, then a reset.
                black_box(alloc.allocate(black_box(20 << 10), 64).unwrap());
                black_box(alloc.allocate(black_box(2 << 20), 64).unwrap());
                // SAFETY: nothing handed out above is used after this.
                unsafe { alloc.reset_unchecked() };
            }
            "reset16" => {
                // allocbench's scratch-small call: 16 blocks of 64 B - 4 KiB, then a reset.
                for k in 0..16 {
                    black_box(alloc.allocate(black_box(64 << (k % 7)), 64).unwrap());
                }
                // SAFETY: nothing handed out above is used after this.
                unsafe { alloc.reset_unchecked() };
            }
            "static16" => {
                // The reset16 loop without the allocator: what the loop itself costs.
                for k in 0..16 {
                    black_box(&mut buffer[..black_box(64 << (k % 7))]);
                }
            }
            _ => panic!("release, scope, reset2, reset16 or static16"),
        }
    }
}
