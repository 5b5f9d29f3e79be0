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
//! Every block gets a tag (thread and sequence number) written over all of it, checked before
//! it is released: a block handed to two holders at once shows up as a mismatch. Debug checks
//! are on, so a write past a block's end shows up as `Corrupted`. Any of these, an unexpected
//! error, or stats that do not add up at the end is a violation; the caller exits non-zero if
//! there is any.

use core::fmt;
use core::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use caching_allocator::{CachingAllocator, Config, Stats};

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
            "violations": self.violations,
            "first_violations": self.first_violations,
            "passed": self.passed(),
        });
        let totals = format!(
            "ops/s: {:.0}; peak live bytes: {}; peak reserved bytes: {}; violations: {}",
            self.ops_per_sec, self.peak_live_bytes, self.peak_reserved_bytes, self.violations
        );
        crate::report::Section {
            title: "soak".into(),
            blocks: vec![self.to_string(), totals],
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
            "soak: {:.1} s on {} threads: {} ops ({:.2} M ops/s), peak live {:.1} MiB, \
             peak reserved {:.1} MiB, {} violations",
            self.seconds,
            self.threads,
            self.ops,
            self.ops_per_sec / 1e6,
            self.peak_live_bytes as f64 / (1 << 20) as f64,
            self.peak_reserved_bytes as f64 / (1 << 20) as f64,
            self.violations
        )?;
        for v in &self.first_violations {
            writeln!(f, "  violation: {v}")?;
        }
        write!(f, "  {}", self.stats)
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
struct Held {
    ptr: NonNull<u8>,
    len: usize,
    tag: u64,
}

// SAFETY: a `Held` is the one handle to a live block; whoever holds it owns the block, and the
// allocator allows releasing on any thread.
unsafe impl Send for Held {}

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
fn release_checked(alloc: &CachingAllocator, held: Held, violations: &Violations) {
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
    mailbox: &Mutex<Vec<Held>>,
    violations: &Violations,
    stop: &AtomicBool,
) -> u64 {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((index as u64 + 1) << 32));
    let mut held: Vec<Held> = Vec::new();
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
                for _ in 0..1 + rng.below(4) {
                    let words = kernel_size(&mut rng, call).div_ceil(8);
                    let tag = next_tag();
                    ops += 1;
                    match scope.alloc_slice_fill(words, tag) {
                        Ok(s) => slices.push((s, tag)),
                        Err(e) => violations.report(format!("scope alloc of {words} words: {e}")),
                    }
                }
                // The "kernel": read everything back.
                for (s, tag) in &slices {
                    if s.iter().any(|x| x != tag) {
                        violations.report(format!("scope slice with tag {tag:#x} overwritten"));
                    }
                }
            }
            // Raw allocate, kept.
            400..=649 => {
                if held.len() >= MAX_HELD {
                    let h = held.swap_remove(rng.below(held.len()));
                    release_checked(alloc, h, violations);
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
                        let tag = next_tag();
                        write_tag(ptr, len, tag);
                        held.push(Held { ptr, len, tag });
                    }
                    Err(e) => violations.report(format!("allocate({len}, {align}): {e}")),
                }
            }
            // Raw release.
            650..=799 => {
                if !held.is_empty() {
                    let h = held.swap_remove(rng.below(held.len()));
                    release_checked(alloc, h, violations);
                    ops += 1;
                }
            }
            // Hand a block to another thread / take one handed over.
            800..=879 => {
                let mut mail = mailbox.lock().unwrap_or_else(|e| e.into_inner());
                if rng.below(2) == 0 && !held.is_empty() && mail.len() < 256 {
                    mail.push(held.swap_remove(rng.below(held.len())));
                } else if let Some(h) = mail.pop() {
                    drop(mail);
                    release_checked(alloc, h, violations);
                    ops += 1;
                }
            }
            // A collection in the allocator.
            880..=996 => {
                let n = 1 + rng.below(2000);
                let tag = next_tag();
                let mut v = allocator_api2::vec::Vec::new_in(alloc);
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
    for h in held {
        release_checked(alloc, h, violations);
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
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds.max(0.0));
    let ops: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (alloc, mailbox, violations, stop) = (&alloc, &mailbox, &violations, &stop);
                s.spawn(move || {
                    // A panicking worker is a violation, not a crash of the whole run.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        worker(alloc, i, deadline, mailbox, violations, stop)
                    }));
                    r.unwrap_or_else(|panic| {
                        let msg = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
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
        release_checked(&alloc, h, &violations);
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
    fn short_soak_has_no_violations() {
        let report = run(0.2, 2);
        assert!(report.passed(), "{report}");
        assert!(report.ops > 0, "{report}");
        assert!(report.peak_live_bytes > 0, "{report}");
        assert_eq!(report.threads, 2);
    }

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
        release_checked(
            &alloc,
            Held {
                ptr,
                len: 100,
                tag: 7,
            },
            &violations,
        );
        assert_eq!(violations.count.load(Ordering::Relaxed), 1);
    }
}
