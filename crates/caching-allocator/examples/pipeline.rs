//! A cross-thread pipeline: one thread allocates 256 KiB blocks, writes into them and hands them
//! to a second thread, which reads them and frees them. The cache must send each block back to
//! the thread that allocated it (where it is reused) at no more cost than the system
//! allocator's free. Runs this project's allocator, glibc (`System`) and mimalloc in turns and
//! prints the median time per block and the ratio against glibc's from the same run:
//! `cargo run --release -p caching-allocator --example pipeline [blocks] [rounds]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::NonNull;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use caching_allocator::CachingAllocator;
use mimalloc::MiMalloc;

const BLOCK: usize = 256 << 10;
/// Blocks in flight between the two threads at most.
const DEPTH: usize = 4;

/// A pointer that crosses to the consumer thread (the block is the consumer's alone then).
struct Sent(NonNull<u8>);
// SAFETY: the producer never touches a block after sending it; the consumer owns it alone.
unsafe impl Send for Sent {}

/// One way of getting and freeing a block, from any thread.
trait Source: Sync {
    fn name(&self) -> &'static str;
    fn alloc(&self) -> NonNull<u8>;
    /// # Safety
    /// `ptr` came from `alloc` of this source and is not used after.
    unsafe fn free(&self, ptr: NonNull<u8>);
}

struct Caching(CachingAllocator);
impl Source for Caching {
    fn name(&self) -> &'static str {
        "caching"
    }
    fn alloc(&self) -> NonNull<u8> {
        self.0.allocate(BLOCK, 64).expect("256 KiB block")
    }
    unsafe fn free(&self, ptr: NonNull<u8>) {
        // SAFETY: the caller's contract: live in this allocator, not used after.
        unsafe { self.0.release(ptr) }.expect("a block this allocator handed out");
    }
}

struct Global<A: GlobalAlloc + Sync>(A, &'static str);
impl<A: GlobalAlloc + Sync> Source for Global<A> {
    fn name(&self) -> &'static str {
        self.1
    }
    fn alloc(&self) -> NonNull<u8> {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { self.0.alloc(layout()) };
        NonNull::new(p).expect("the system refused a 256 KiB block")
    }
    unsafe fn free(&self, ptr: NonNull<u8>) {
        // SAFETY: the caller's contract: from `alloc` with this layout.
        unsafe { self.0.dealloc(ptr.as_ptr(), layout()) }
    }
}

fn layout() -> Layout {
    Layout::from_size_align(BLOCK, 64).expect("valid layout")
}

/// Nanoseconds per block of one round of `blocks` blocks through the pipeline.
fn round(source: &dyn Source, blocks: usize) -> f64 {
    let (tx, rx) = sync_channel::<Sent>(DEPTH);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut sum = 0u64;
            for Sent(ptr) in rx {
                // SAFETY: the block is ours alone and its first and last bytes were written.
                unsafe {
                    sum += u64::from(*ptr.as_ptr()) + u64::from(*ptr.as_ptr().add(BLOCK - 1));
                    source.free(ptr);
                }
            }
            std::hint::black_box(sum);
        });
        for i in 0..blocks {
            let ptr = source.alloc();
            // SAFETY: a fresh block of `BLOCK` bytes, ours until sent. One write a page, as a
            // producer that fills the block would fault each page in.
            unsafe {
                for page in (0..BLOCK).step_by(4096) {
                    ptr.as_ptr().add(page).write(i as u8);
                }
                ptr.as_ptr().add(BLOCK - 1).write(i as u8);
            }
            tx.send(Sent(ptr)).expect("the consumer is alive");
        }
        drop(tx);
    });
    start.elapsed().as_nanos() as f64 / blocks as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let blocks: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(7);
    let sources: [&dyn Source; 3] = [
        &Caching(CachingAllocator::new(64 << 20)),
        &Global(System, "glibc"),
        &Global(MiMalloc, "mimalloc"),
    ];
    let mut times = vec![Vec::new(); sources.len()];
    for r in 0..=rounds {
        // In turns, so a busy moment of the machine falls on every source alike; round 0 warms.
        for (t, source) in times.iter_mut().zip(sources) {
            let ns = round(source, blocks);
            if r > 0 {
                t.push(ns);
            }
        }
    }
    let glibc = median(times[1].clone());
    println!(
        "pipeline: {blocks} blocks of 256 KiB per round, {rounds} rounds, median ns per block"
    );
    for (t, source) in times.into_iter().zip(sources) {
        let m = median(t);
        println!(
            "  {:<9} {:>8.0} ns   {:.2}x glibc's time",
            source.name(),
            m,
            m / glibc
        );
    }
}
