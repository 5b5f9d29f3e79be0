//! First touch of a fresh 64 MiB block, with huge pages (the default: 2 MiB-aligned and
//! advised `MADV_HUGEPAGE`) and without (`Config::huge_pages(None)`), in one run.
//!
//! `cargo run --release -p caching-allocator --example first_touch`
//!
//! Each round makes a new allocator, takes one 64 MiB block from the system, writes one byte
//! per 4 KiB page and drops everything, so every round pays the page faults of fresh memory.
//! Prints medians; asserts nothing.

use std::time::Instant;

use caching_allocator::{CachingAllocator, Config};

const SIZE: usize = 64 << 20;
const ROUNDS: usize = 9;

fn round(config: Config) -> (f64, usize) {
    let alloc = CachingAllocator::with_config(config);
    let t = Instant::now();
    let p = alloc.allocate(SIZE, 64).unwrap();
    for off in (0..SIZE).step_by(4096) {
        // SAFETY: `off < SIZE`: inside the block, which is ours alone.
        unsafe { p.as_ptr().add(off).write_volatile(1) };
    }
    let elapsed = t.elapsed().as_secs_f64() * 1e3;
    let advised = alloc.stats().huge_page_bytes;
    (elapsed, advised)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let (mut huge, mut small, mut advised) = (Vec::new(), Vec::new(), 0);
    for _ in 0..ROUNDS {
        // Interleaved, so a noisy neighbour hits both alike.
        let (ms, a) = round(Config::default());
        huge.push(ms);
        advised = a;
        small.push(round(Config::default().huge_pages(None)).0);
    }
    let (huge, small) = (median(huge), median(small));
    println!("first touch of a fresh 64 MiB block (one byte per 4 KiB page), median of {ROUNDS}");
    println!(
        "  huge pages (advised {} MiB)   {huge:8.2} ms",
        advised >> 20
    );
    println!("  4 KiB pages                  {small:8.2} ms");
    println!("  speed-up                     {:8.2}x", small / huge);
}
