//! Soak test: random kernel-like traffic from several threads on one shared
//! [`CachingAllocator`], with every block's contents checked before it is given back.
//!
//! Each thread loops until the deadline, choosing among:
//! - a kernel call: a [`Scope`](caching_allocator::Scope) with a few scratch slices whose sizes
//!   grow a little every call (like attention decode's), filled, read back, dropped;
//! - raw `allocate` / `release` of blocks kept across iterations;
//! - handing a raw block to another thread through a mailbox, which checks and releases it;
//! - an `allocator_api2::vec::Vec` in the allocator, grown by pushes;
//! - now and then `trim` or `free_cached`.
//!
//! The soak counts the bytes it holds itself (requested sizes, summed over threads): their
//! high-water mark is the true peak live, against which the allocator's peak reserved (bytes
//! taken from the system: live, rounding, canaries and cache) is reported as a ratio.
//!
//! Every block gets a tag (thread and sequence number) written over all of it, checked before
//! it is released: a block handed to two holders at once shows up as a mismatch. Debug checks
//! are on, so a write past a block's end shows up as `Corrupted`. Any of these, an unexpected
//! error, or stats that do not add up at the end is a violation; the caller exits non-zero if
//! there is any.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use allocator_api2::alloc::{AllocError, Allocator};
use caching_allocator::{CachingAllocator, Config, Stats};

use crate::report::{goal, TargetCheck};

/// Idle bytes the soak's allocator may keep.
const CAP: usize = 32 << 20;
/// Raw blocks a thread keeps at most.
const MAX_HELD: usize = 32;

/// What a soak run did and found.
#[derive(Clone, Debug)]
pub struct SoakReport {
    /// How long it ran, in seconds.
    pub seconds: f64,
    /// How many threads shared the allocator.
    pub threads: usize,
    /// Allocator calls made (allocations, releases, scope allocations, trims).
    pub ops: u64,
    /// `ops` per second.
    pub ops_per_sec: f64,
    /// The most bytes live at once (as the allocator counts them).
    pub peak_live_bytes: usize,
    /// The most bytes taken from the system at once (live + cached).
    pub peak_reserved_bytes: usize,
    /// The most bytes the soak's threads held at once, summed over threads: requested sizes
    /// of the scope slices, raw blocks (mailbox included) and collections' buffers.
    pub peak_held_bytes: usize,
    /// How many violations were seen: tag mismatches, unexpected errors, stats that disagree.
    pub violations: u64,
    /// The first few violations, described.
    pub first_violations: Vec<String>,
    /// The allocator's stats at the end.
    pub stats: Stats,
}

/// `allocbench soak` for `seconds` on `threads` threads (default: all cores): prints ops/s,
/// peak bytes and the violations, writes `json` if given; fails on any violation.
pub fn command(
    seconds: f64,
    threads: Option<usize>,
    json: Option<crate::output::Output>,
) -> std::process::ExitCode {
    let machine = crate::measure::Machine::detect();
    let threads = threads.unwrap_or(machine.cores).max(1);
    println!("# allocbench soak: {seconds} s on {threads} threads; {machine}");
    let section = run(seconds, threads).section(machine);
    println!("{}", section.blocks.join("\n"));
    let mut ok = section.errors.is_empty();
    for e in &section.errors {
        eprintln!("allocbench {e}");
    }
    if let (Some(out), Some((_, j))) = (json, &section.json) {
        ok &= out.write_json(j);
    }
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

impl SoakReport {
    /// Whether the run saw no violation.
    pub fn passed(&self) -> bool {
        self.violations == 0
    }

    /// Peak reserved over the true peak live ([`peak_held_bytes`](Self::peak_held_bytes)).
    pub fn reserved_over_held(&self) -> f64 {
        self.peak_reserved_bytes as f64 / self.peak_held_bytes.max(1) as f64
    }

    /// The goal of issue #20: peak reserved at most [`goal::SOAK_RESERVED_OVER_LIVE`] times
    /// the true peak live.
    pub fn target(&self) -> TargetCheck {
        let x = self.reserved_over_held();
        TargetCheck {
            target: format!(
                "soak peak reserved <= {:.1}x peak live",
                goal::SOAK_RESERVED_OVER_LIVE
            ),
            measured: format!(
                "{x:.2}x ({:.1} MiB reserved, {:.1} MiB held by the soak)",
                mib(self.peak_reserved_bytes),
                mib(self.peak_held_bytes)
            ),
            met: Some(x <= goal::SOAK_RESERVED_OVER_LIVE),
        }
    }

    /// The report's section: what ran and was found, a violation count that is not zero as
    /// its error, and every figure with units as JSON (the header every run has, then the
    /// soak's own).
    pub fn section(&self, machine: crate::measure::Machine) -> crate::report::Section {
        use serde_json::json;
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let mut info =
            crate::report::RunInfo::new(machine, command, false, self.threads, Instant::now());
        info.mode = "soak";
        info.elapsed_s = self.seconds;
        let fields = json!({
            "ops": { "value": self.ops, "unit": "allocator calls" },
            "ops_per_second": { "value": self.ops_per_sec, "unit": "ops/s (all threads)" },
            "peak_live_bytes": { "value": self.peak_live_bytes, "unit": "bytes" },
            "peak_reserved_bytes": { "value": self.peak_reserved_bytes, "unit": "bytes" },
            "peak_held_bytes": { "value": self.peak_held_bytes, "unit": "bytes (requested, held by the soak's threads at once)" },
            "peak_reserved_over_held": { "value": self.reserved_over_held(), "unit": "x" },
            "violations": self.violations,
            "first_violations": self.first_violations,
            "passed": self.passed(),
        });
        let totals = format!(
            "ops/s: {:.0}; peak live bytes: {}; peak reserved bytes: {}; peak held bytes: {}; \
             violations: {}",
            self.ops_per_sec,
            self.peak_live_bytes,
            self.peak_reserved_bytes,
            self.peak_held_bytes,
            self.violations
        );
        let t = self.target();
        let goal = format!("goal: {}: {}: {}", t.target, t.measured, t.verdict());
        crate::report::Section {
            title: "soak".into(),
            blocks: vec![self.to_string(), totals, goal],
            targets: vec![t],
            errors: (!self.passed())
                .then(|| format!("soak: {} violations", self.violations))
                .into_iter()
                .collect(),
            ..Default::default()
        }
        .with_json("soak", &info, fields)
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "soak: {:.1} s on {} threads: {} ops ({:.2} M ops/s), peak live {:.1} MiB \
             (held by the soak {:.1} MiB), peak reserved {:.1} MiB ({:.2}x the held peak), \
             {} violations",
            self.seconds,
            self.threads,
            self.ops,
            self.ops_per_sec / 1e6,
            mib(self.peak_live_bytes),
            mib(self.peak_held_bytes),
            mib(self.peak_reserved_bytes),
            self.reserved_over_held(),
            self.violations
        )?;
        for v in &self.first_violations {
            writeln!(f, "  violation: {v}")?;
        }
        write!(f, "  {}", self.stats)
    }
}

/// Bytes in MiB.
fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// The bytes the soak's threads hold now (requested sizes, summed over threads) and the most
/// they have held at once.
#[derive(Default)]
struct Held {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl Held {
    /// `n` more bytes held.
    fn take(&self, n: usize) {
        let now = self.now.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// `n` bytes given back.
    fn give(&self, n: usize) {
        self.now.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The soak's allocator for collections: the shared one, counting what it hands out in
/// [`Held`] (a `Vec` growing holds both buffers while it copies, and so is counted).
#[derive(Clone, Copy)]
struct Counted<'a> {
    alloc: &'a CachingAllocator,
    held: &'a Held,
}

// SAFETY: every call is forwarded to `CachingAllocator`'s own implementation, whose blocks
// stay valid until deallocated; the counting touches no block.
unsafe impl Allocator for Counted<'_> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let block = Allocator::allocate(self.alloc, layout)?;
        self.held.take(layout.size());
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's contract, handed on: `ptr` was allocated by this allocator
        // (so by `self.alloc`) with `layout` and is not used after.
        unsafe { Allocator::deallocate(self.alloc, ptr, layout) };
        self.held.give(layout.size());
    }
}

/// Violations, shared by the threads.
struct Violations {
    count: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Violations {
    fn report(&self, what: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if first.len() < 10 {
            first.push(what);
        }
    }
}

/// A small fast generator (xorshift64*), seeded per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A raw block and the tag written over it.
#[derive(Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    len: usize,
    tag: u64,
}

// SAFETY: a `Block` is the one handle to a live block; whoever holds it owns the block, and the
// allocator allows releasing on any thread.
unsafe impl Send for Block {}

/// Writes `tag` over `len` bytes (whole words, then the low bytes of the tag).
fn write_tag(ptr: NonNull<u8>, len: usize, tag: u64) {
    let words = len / 8;
    let p = ptr.as_ptr();
    // SAFETY: the caller owns `len` bytes at `ptr`, which is at least 64-byte aligned.
    unsafe {
        for i in 0..words {
            p.cast::<u64>().add(i).write(tag);
        }
        for i in words * 8..len {
            p.add(i).write(tag as u8);
        }
    }
}

/// Whether `len` bytes at `ptr` still hold `tag` as `write_tag` wrote it.
fn tag_intact(ptr: NonNull<u8>, len: usize, tag: u64) -> bool {
    let words = len / 8;
    let p = ptr.as_ptr();
    // SAFETY: the caller owns `len` bytes at `ptr`, all written by `write_tag`.
    unsafe {
        (0..words).all(|i| p.cast::<u64>().add(i).read() == tag)
            && (words * 8..len).all(|i| p.add(i).read() == tag as u8)
    }
}

/// Releases a held block after checking its tag.
fn release_checked(alloc: &CachingAllocator, held: Block, violations: &Violations, count: &Held) {
    if !tag_intact(held.ptr, held.len, held.tag) {
        violations.report(format!(
            "block {:p} ({} bytes, tag {:#x}) was overwritten while held: two holders?",
            held.ptr, held.len, held.tag
        ));
    }
    // SAFETY: the block is live, held by this thread alone, and not used after.
    if let Err(e) = unsafe { alloc.release(held.ptr) } {
        violations.report(format!("release of {:p}: {e}", held.ptr));
    }
    count.give(held.len);
}

/// A size like a kernel's scratch: mostly small, some growing with the call count, a few large.
fn kernel_size(rng: &mut Rng, call: usize) -> usize {
    match rng.below(64) {
        0..=39 => 1 + rng.below(2048),
        40..=55 => 4 * 64 * (1 + call % 512), // a score row per token, growing each call
        56..=62 => (1 + rng.below(64)) << 10,
        _ => (1 + rng.below(16)) << 18, // up to 4 MiB
    }
}

/// One thread's traffic until `deadline`. Returns the calls it made.
fn worker(
    alloc: &CachingAllocator,
    index: usize,
    deadline: Instant,
    mailbox: &Mutex<Vec<Block>>,
    violations: &Violations,
    stop: &AtomicBool,
    count: &Held,
) -> u64 {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((index as u64 + 1) << 32));
    let mut kept: Vec<Block> = Vec::new();
    let mut seq = 0u64;
    let mut ops = 0u64;
    let mut call = 0usize;
    let mut next_tag = || {
        seq += 1;
        ((index as u64) << 48) | seq
    };
    let mut iteration = 0u64;
    loop {
        iteration += 1;
        if iteration & 31 == 0 && (Instant::now() >= deadline || stop.load(Ordering::Relaxed)) {
            break;
        }
        match rng.below(1000) {
            // A kernel call through a scope.
            0..=399 => {
                call += 1;
                let scope = alloc.scope();
                let mut slices: Vec<(&mut [u64], u64)> = Vec::new();
                let mut bytes = 0;
                for _ in 0..1 + rng.below(4) {
                    let words = kernel_size(&mut rng, call).div_ceil(8);
                    let tag = next_tag();
                    ops += 1;
                    match scope.alloc_slice_fill(words, tag) {
                        Ok(s) => {
                            count.take(8 * words);
                            bytes += 8 * words;
                            slices.push((s, tag));
                        }
                        Err(e) => violations.report(format!("scope alloc of {words} words: {e}")),
                    }
                }
                // The "kernel": read everything back.
                for (s, tag) in &slices {
                    if s.iter().any(|x| x != tag) {
                        violations.report(format!("scope slice with tag {tag:#x} overwritten"));
                    }
                }
                drop(slices);
                drop(scope);
                count.give(bytes);
            }
            // Raw allocate, kept.
            400..=649 => {
                if kept.len() >= MAX_HELD {
                    let h = kept.swap_remove(rng.below(kept.len()));
                    release_checked(alloc, h, violations, count);
                    ops += 1;
                }
                let len = kernel_size(&mut rng, call);
                let align = 64 << rng.below(4);
                ops += 1;
                match alloc.allocate(len, align) {
                    Ok(ptr) => {
                        if ptr.as_ptr() as usize & (align - 1) != 0 {
                            violations.report(format!("{ptr:p} not aligned to {align}"));
                        }
                        count.take(len);
                        let tag = next_tag();
                        write_tag(ptr, len, tag);
                        kept.push(Block { ptr, len, tag });
                    }
                    Err(e) => violations.report(format!("allocate({len}, {align}): {e}")),
                }
            }
            // Raw release.
            650..=799 => {
                if !kept.is_empty() {
                    let h = kept.swap_remove(rng.below(kept.len()));
                    release_checked(alloc, h, violations, count);
                    ops += 1;
                }
            }
            // Hand a block to another thread / take one handed over.
            800..=879 => {
                let mut mail = mailbox.lock().unwrap_or_else(|e| e.into_inner());
                if rng.below(2) == 0 && !kept.is_empty() && mail.len() < 256 {
                    mail.push(kept.swap_remove(rng.below(kept.len())));
                } else if let Some(h) = mail.pop() {
                    drop(mail);
                    release_checked(alloc, h, violations, count);
                    ops += 1;
                }
            }
            // A collection in the allocator.
            880..=996 => {
                let n = 1 + rng.below(2000);
                let tag = next_tag();
                let mut v = allocator_api2::vec::Vec::new_in(Counted { alloc, held: count });
                for i in 0..n as u64 {
                    v.push(tag ^ i);
                }
                ops += 1 + (n as f64).log2() as u64; // one allocation per doubling
                if v.iter().enumerate().any(|(i, &x)| x != tag ^ i as u64) {
                    violations.report(format!("Vec with tag {tag:#x} overwritten"));
                }
            }
            // Give idle memory back.
            _ => {
                ops += 1;
                if rng.below(4) == 0 {
                    alloc.free_cached();
                } else {
                    alloc.trim(rng.below(CAP));
                }
            }
        }
    }
    for h in kept {
        release_checked(alloc, h, violations, count);
        ops += 1;
    }
    ops
}

/// Runs the soak for about `seconds` on `threads` threads (at least one) and reports.
pub fn run(seconds: f64, threads: usize) -> SoakReport {
    let threads = threads.max(1);
    let alloc =
        CachingAllocator::with_config(Config::default().max_cached_bytes(CAP).debug_checks(true));
    let violations = Violations {
        count: AtomicU64::new(0),
        first: Mutex::new(Vec::new()),
    };
    let mailbox = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let count = Held::default();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds.max(0.0));
    let ops: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (alloc, mailbox, violations, stop, count) =
                    (&alloc, &mailbox, &violations, &stop, &count);
                s.spawn(move || {
                    // A panicking worker is a violation, not a crash of the whole run.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        worker(alloc, i, deadline, mailbox, violations, stop, count)
                    }));
                    r.unwrap_or_else(|panic| {
                        let msg = crate::harness::panic_message(panic.as_ref());
                        violations.report(format!("thread {i} panicked: {msg}"));
                        stop.store(true, Ordering::Relaxed);
                        0
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    let elapsed = start.elapsed().as_secs_f64();
    for h in mailbox.into_inner().unwrap_or_else(|e| e.into_inner()) {
        release_checked(&alloc, h, &violations, &count);
    }

    // Everything was given back: the books must say so.
    let stats = alloc.stats();
    let check = |ok: bool, what: &str| {
        if !ok {
            violations.report(format!("stats at the end: {what}: {stats:?}"));
        }
    };
    check(
        stats.live_blocks == 0 && stats.live_bytes == 0,
        "blocks still live",
    );
    check(stats.requested_bytes == 0, "requested bytes still counted");
    check(
        stats.reserved_bytes == stats.live_bytes + stats.cached_bytes,
        "reserved != live + cached",
    );
    check(stats.cached_bytes <= CAP, "cache over its cap");
    check(
        (stats.cached_blocks as u64) == stats.system_allocs - stats.system_frees,
        "system allocations minus frees != cached blocks",
    );
    check(stats.corrupted_blocks == 0, "corrupted blocks");
    check(
        count.now.load(Ordering::Relaxed) == 0,
        "the soak's own count of the bytes it holds is not back to 0",
    );
    check(
        stats.misses == stats.system_allocs,
        "misses != system allocations",
    );

    let violations_count = violations.count.load(Ordering::Relaxed);
    SoakReport {
        seconds: elapsed,
        threads,
        ops,
        ops_per_sec: ops as f64 / elapsed.max(1e-9),
        peak_live_bytes: stats.peak_live_bytes,
        peak_reserved_bytes: stats.peak_reserved_bytes,
        peak_held_bytes: count.peak.load(Ordering::Relaxed),
        violations: violations_count,
        first_violations: violations
            .first
            .into_inner()
            .unwrap_or_else(|e| e.into_inner()),
        stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_catch_an_overwrite() {
        // The check the soak relies on must be able to fail.
        let alloc = CachingAllocator::new(1 << 20);
        let violations = Violations {
            count: AtomicU64::new(0),
            first: Mutex::new(Vec::new()),
        };
        let ptr = alloc.allocate(100, 64).unwrap();
        write_tag(ptr, 100, 7);
        // SAFETY: the block is ours and 100 bytes long.
        unsafe { ptr.as_ptr().add(99).write(0) };
        let count = Held::default();
        count.take(100);
        let block = Block {
            ptr,
            len: 100,
            tag: 7,
        };
        release_checked(&alloc, block, &violations, &count);
        assert_eq!(violations.count.load(Ordering::Relaxed), 1);
        assert_eq!(count.now.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn held_bytes_count_a_growing_vec_with_both_buffers() {
        let alloc = CachingAllocator::new(1 << 20);
        let count = Held::default();
        let mut v = allocator_api2::vec::Vec::new_in(Counted {
            alloc: &alloc,
            held: &count,
        });
        for i in 0..1000u64 {
            v.push(i);
        }
        let cap = v.capacity() * 8;
        drop(v);
        // The last growth held the old buffer (half the final one) and the new one at once.
        let peak = count.peak.load(Ordering::Relaxed);
        assert!(peak >= cap + cap / 2 - 8, "peak {peak}, final buffer {cap}");
        assert_eq!(count.now.load(Ordering::Relaxed), 0);
    }
}
