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
//! taken from the system: live, rounding, canaries and cache) is reported as a ratio. Its
//! allocator runs the memory policy for traffic of many blocks live at once by default:
//! peak-bound growth (`Config::evict_before_new_peak`) and best fit up to
//! 1.25x ([`Policy`]; `--policy cap` runs the allocator's defaults instead).
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

use crate::report::{fig, goal, TargetCheck};

/// Idle bytes the soak's allocator may keep.
const CAP: usize = 32 << 20;
/// Best fit's bound under [`Policy::PeakBound`] (`Config::max_oversize`): with peak-bound
/// growth, the waste of larger blocks handed to smaller requests is most of what reserved
/// bytes hold above the bytes requested.
const SOAK_MAX_OVERSIZE: f64 = 1.25;

/// The memory policy of the soak's allocator, beside its 32 MiB cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// The policy for traffic of many blocks live at once (the default): peak-bound growth
    /// (`Config::evict_before_new_peak`) and best fit up to 1.25x (`SOAK_MAX_OVERSIZE`).
    #[default]
    PeakBound,
    /// The allocator's defaults: idle blocks kept up to the cap, best fit up to 2x.
    Cap,
}

impl Policy {
    /// Its name on the command line (`peak-bound`, `cap`).
    pub fn name(self) -> &'static str {
        match self {
            Policy::PeakBound => "peak-bound",
            Policy::Cap => "cap",
        }
    }

    /// The soak allocator's configuration (debug checks on).
    fn config(self) -> Config {
        let config = Config::default().max_cached_bytes(CAP).debug_checks(true);
        match self {
            Policy::PeakBound => config
                .evict_before_new_peak(true)
                .max_oversize(SOAK_MAX_OVERSIZE),
            Policy::Cap => config,
        }
    }
}

impl core::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        [Policy::PeakBound, Policy::Cap]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown soak policy {s:?}: use peak-bound or cap"))
    }
}
/// Raw blocks a thread keeps at most.
const MAX_HELD: usize = 32;

/// What a soak run did and found.
#[derive(Clone, Debug)]
pub struct SoakReport {
    /// How long it ran, in seconds.
    pub seconds: f64,
    /// How many threads shared the allocator.
    pub threads: usize,
    /// The allocator's memory policy.
    pub policy: Policy,
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
    policy: Policy,
    json: Option<crate::output::Output>,
) -> std::process::ExitCode {
    let machine = crate::measure::Machine::detect();
    let threads = threads.unwrap_or(machine.cores).max(1);
    println!(
        "# allocbench soak: {seconds} s on {threads} threads, policy {}; {machine}",
        policy.name()
    );
    let section = run(seconds, threads, policy).section(machine);
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
        let held = "bytes (requested, held by the soak's threads at once)";
        let fields = json!({
            "policy": self.policy.name(),
            "ops": fig(self.ops, "allocator calls"),
            "ops_per_second": fig(self.ops_per_sec, "ops/s (all threads)"),
            "peak_live_bytes": fig(self.peak_live_bytes, "bytes"),
            "peak_reserved_bytes": fig(self.peak_reserved_bytes, "bytes"),
            "peak_held_bytes": fig(self.peak_held_bytes, held),
            "peak_reserved_over_held": fig(self.reserved_over_held(), "x"),
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
            "soak: {:.1} s on {} threads, policy {}: {} ops ({:.2} M ops/s), peak live {:.1} \
             MiB (held by the soak {:.1} MiB), peak reserved {:.1} MiB ({:.2}x the held peak), \
             {} violations",
            self.seconds,
            self.threads,
            self.policy.name(),
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

/// A size like a kernel's scratch: mostly small, some growing with the call count, a few large.
fn kernel_size(rng: &mut Rng, call: usize) -> usize {
    match rng.below(64) {
        0..=39 => 1 + rng.below(2048),
        40..=55 => 4 * 64 * (1 + call % 512), // a score row per token, growing each call
        56..=62 => (1 + rng.below(64)) << 10,
        _ => (1 + rng.below(16)) << 18, // up to 4 MiB
    }
}

/// What the soak's threads share: the allocator under test, the mailbox of blocks handed
/// between threads, the violations, the stop flag and the count of the bytes they hold.
struct Shared {
    alloc: CachingAllocator,
    mailbox: Mutex<Vec<Block>>,
    /// Violations seen, and the first few described.
    violations: AtomicU64,
    first_violations: Mutex<Vec<String>>,
    /// Set when a thread panicked: the others stop too.
    stop: AtomicBool,
    held: Held,
}

impl Shared {
    /// The soak's allocator (debug checks on), nothing held yet.
    fn new(alloc: CachingAllocator) -> Self {
        Shared {
            alloc,
            mailbox: Mutex::new(Vec::new()),
            violations: AtomicU64::new(0),
            first_violations: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            held: Held::default(),
        }
    }

    /// A violation, described by `what`.
    fn violation(&self, what: String) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        let mut first = self
            .first_violations
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if first.len() < 10 {
            first.push(what);
        }
    }

    /// Releases a held block after checking its tag.
    fn release_checked(&self, b: Block) {
        if !tag_intact(b.ptr, b.len, b.tag) {
            self.violation(format!(
                "block {:p} ({} bytes, tag {:#x}) was overwritten while held: two holders?",
                b.ptr, b.len, b.tag
            ));
        }
        // SAFETY: the block is live, held by this thread alone, and not used after.
        if let Err(e) = unsafe { self.alloc.release(b.ptr) } {
            self.violation(format!("release of {:p}: {e}", b.ptr));
        }
        self.held.give(b.len);
    }

    /// The books at the end, when everything was given back: every way they could disagree
    /// is a violation. Returns the allocator's stats.
    fn check_books(&self) -> Stats {
        let s = self.alloc.stats();
        let checks = [
            (s.live_blocks == 0 && s.live_bytes == 0, "blocks still live"),
            (s.requested_bytes == 0, "requested bytes still counted"),
            (
                s.reserved_bytes == s.live_bytes + s.cached_bytes,
                "reserved != live + cached",
            ),
            (s.cached_bytes <= CAP, "cache over its cap"),
            (
                s.cached_blocks as u64 == s.system_allocs - s.system_frees,
                "system allocations minus frees != cached blocks",
            ),
            (s.corrupted_blocks == 0, "corrupted blocks"),
            (
                self.held.now.load(Ordering::Relaxed) == 0,
                "the soak's own count of the bytes it holds is not back to 0",
            ),
            (s.misses == s.system_allocs, "misses != system allocations"),
        ];
        for (ok, what) in checks {
            if !ok {
                self.violation(format!("stats at the end: {what}: {s:?}"));
            }
        }
        s
    }
}

/// One thread of the soak: its random choices, the raw blocks it keeps and its counts.
struct Thread<'a> {
    sh: &'a Shared,
    index: usize,
    rng: Rng,
    kept: Vec<Block>,
    /// Tags handed out so far.
    seq: u64,
    /// Allocator calls made.
    ops: u64,
    /// Kernel calls made (the growing sizes grow with it).
    call: usize,
}

impl Thread<'_> {
    /// A tag no other block of any thread has: the thread's index and a sequence number.
    fn next_tag(&mut self) -> u64 {
        self.seq += 1;
        ((self.index as u64) << 48) | self.seq
    }

    /// Traffic until `deadline` (or a stop); every block still kept is released at the end.
    /// Returns the allocator calls made.
    fn run(mut self, deadline: Instant) -> u64 {
        let mut iteration = 0u64;
        loop {
            iteration += 1;
            let due = iteration & 31 == 0;
            if due && (Instant::now() >= deadline || self.sh.stop.load(Ordering::Relaxed)) {
                break;
            }
            match self.rng.below(1000) {
                0..=399 => self.kernel_call(),
                400..=649 => self.allocate_kept(),
                650..=799 => self.release_kept(),
                800..=879 => self.hand_over(),
                880..=996 => self.collection(),
                _ => self.give_idle_back(),
            }
        }
        for b in std::mem::take(&mut self.kept) {
            self.sh.release_checked(b);
            self.ops += 1;
        }
        self.ops
    }

    /// A kernel call: a scope with a few tagged slices, read back, dropped.
    fn kernel_call(&mut self) {
        let sh = self.sh;
        self.call += 1;
        let scope = sh.alloc.scope();
        let mut slices: Vec<(&mut [u64], u64)> = Vec::new();
        let mut bytes = 0;
        for _ in 0..1 + self.rng.below(4) {
            let words = kernel_size(&mut self.rng, self.call).div_ceil(8);
            let tag = self.next_tag();
            self.ops += 1;
            match scope.alloc_slice_fill(words, tag) {
                Ok(s) => {
                    sh.held.take(8 * words);
                    bytes += 8 * words;
                    slices.push((s, tag));
                }
                Err(e) => sh.violation(format!("scope alloc of {words} words: {e}")),
            }
        }
        // The "kernel": read everything back.
        for (s, tag) in &slices {
            if s.iter().any(|x| x != tag) {
                let what = format!("scope slice with tag {tag:#x} overwritten");
                sh.violation(what);
            }
        }
        drop(slices);
        drop(scope);
        sh.held.give(bytes);
    }

    /// A raw block allocated, tagged and kept (one kept block released first when the thread
    /// keeps [`MAX_HELD`]).
    fn allocate_kept(&mut self) {
        if self.kept.len() >= MAX_HELD {
            self.release_kept();
        }
        let len = kernel_size(&mut self.rng, self.call);
        let align = 64 << self.rng.below(4);
        self.ops += 1;
        match self.sh.alloc.allocate(len, align) {
            Ok(ptr) => {
                if ptr.as_ptr() as usize & (align - 1) != 0 {
                    let what = format!("{ptr:p} not aligned to {align}");
                    self.sh.violation(what);
                }
                self.sh.held.take(len);
                let tag = self.next_tag();
                write_tag(ptr, len, tag);
                self.kept.push(Block { ptr, len, tag });
            }
            Err(e) => {
                let what = format!("allocate({len}, {align}): {e}");
                self.sh.violation(what);
            }
        }
    }

    /// A kept block, picked at random, checked and released.
    fn release_kept(&mut self) {
        if !self.kept.is_empty() {
            let b = self.kept.swap_remove(self.rng.below(self.kept.len()));
            self.sh.release_checked(b);
            self.ops += 1;
        }
    }

    /// A kept block handed to the mailbox, or one handed over by another thread released.
    fn hand_over(&mut self) {
        let mut mail = self.sh.mailbox.lock().unwrap_or_else(|e| e.into_inner());
        if self.rng.below(2) == 0 && !self.kept.is_empty() && mail.len() < 256 {
            mail.push(self.kept.swap_remove(self.rng.below(self.kept.len())));
        } else if let Some(b) = mail.pop() {
            drop(mail);
            self.sh.release_checked(b);
            self.ops += 1;
        }
    }

    /// An `allocator_api2` vector in the allocator, grown by pushes and read back.
    fn collection(&mut self) {
        let n = 1 + self.rng.below(2000);
        let tag = self.next_tag();
        let (alloc, held) = (&self.sh.alloc, &self.sh.held);
        let mut v = allocator_api2::vec::Vec::new_in(Counted { alloc, held });
        for i in 0..n as u64 {
            v.push(tag ^ i);
        }
        self.ops += 1 + (n as f64).log2() as u64; // one allocation per doubling
        if v.iter().enumerate().any(|(i, &x)| x != tag ^ i as u64) {
            let what = format!("Vec with tag {tag:#x} overwritten");
            self.sh.violation(what);
        }
    }

    /// Idle memory given back: all of it, or down to a random size.
    fn give_idle_back(&mut self) {
        self.ops += 1;
        if self.rng.below(4) == 0 {
            self.sh.alloc.free_cached();
        } else {
            self.sh.alloc.trim(self.rng.below(CAP));
        }
    }
}

/// Runs the soak for about `seconds` on `threads` threads (at least one), the allocator
/// configured by `policy`, and reports.
pub fn run(seconds: f64, threads: usize, policy: Policy) -> SoakReport {
    let threads = threads.max(1);
    let sh = Shared::new(CachingAllocator::with_config(policy.config()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds.max(0.0));
    let ops: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|index| {
                let sh = &sh;
                s.spawn(move || {
                    let thread = Thread {
                        sh,
                        index,
                        rng: Rng(0x9E37_79B9_7F4A_7C15 ^ ((index as u64 + 1) << 32)),
                        kept: Vec::new(),
                        seq: 0,
                        ops: 0,
                        call: 0,
                    };
                    // A panicking thread is a violation, not a crash of the whole run.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        thread.run(deadline)
                    }));
                    r.unwrap_or_else(|panic| {
                        let msg = crate::harness::panic_message(panic.as_ref());
                        sh.violation(format!("thread {index} panicked: {msg}"));
                        sh.stop.store(true, Ordering::Relaxed);
                        0
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let handed_over = std::mem::take(&mut *sh.mailbox.lock().unwrap_or_else(|e| e.into_inner()));
    for b in handed_over {
        sh.release_checked(b);
    }
    let stats = sh.check_books();
    let violations = sh.violations.load(Ordering::Relaxed);
    let first_violations = sh.first_violations.into_inner();
    SoakReport {
        seconds: elapsed,
        threads,
        policy,
        ops,
        ops_per_sec: ops as f64 / elapsed.max(1e-9),
        peak_live_bytes: stats.peak_live_bytes,
        peak_reserved_bytes: stats.peak_reserved_bytes,
        peak_held_bytes: sh.held.peak.load(Ordering::Relaxed),
        violations,
        first_violations: first_violations.unwrap_or_else(|e| e.into_inner()),
        stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_catch_an_overwrite() {
        // The check the soak relies on must be able to fail.
        let sh = Shared::new(CachingAllocator::new(1 << 20));
        let ptr = sh.alloc.allocate(100, 64).unwrap();
        write_tag(ptr, 100, 7);
        // SAFETY: the block is ours and 100 bytes long.
        unsafe { ptr.as_ptr().add(99).write(0) };
        sh.held.take(100);
        let block = Block {
            ptr,
            len: 100,
            tag: 7,
        };
        sh.release_checked(block);
        assert_eq!(sh.violations.load(Ordering::Relaxed), 1);
        assert_eq!(sh.held.now.load(Ordering::Relaxed), 0);
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
