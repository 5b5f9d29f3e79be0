//! Instruction counts of the cache-hit paths, for `valgrind --tool=callgrind` (counts do not
//! depend on the machine's load): `cargo build --release -p caching-allocator --example
//! hotpath && valgrind --tool=callgrind target/release/examples/hotpath release 100000`.

use std::hint::black_box;

use caching_allocator::CachingAllocator;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("release", String::as_str);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let alloc = CachingAllocator::new(64 << 20);
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
            _ => panic!("release or scope"),
        }
    }
}
