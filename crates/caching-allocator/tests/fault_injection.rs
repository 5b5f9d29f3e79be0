//! Fault injection: a backing system allocator that refuses chosen calls, to prove the
//! out-of-memory path (free the idle cache, retry once, then fail cleanly) for every point of
//! failure in a run.
//!
//! A fixed workload (allocations of many classes and alignments, releases, scopes, trims,
//! resets) runs once to count its system allocations, then again for every N with the Nth
//! system allocation failing: once (the retry after freeing the idle cache succeeds), twice in a
//! row (the retry fails: `OutOfMemory`), and from N on for good. After every call the books are
//! checked against the backing allocator's own counts; after every run, dropping the allocator
//! must give back exactly the bytes it took.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::alloc::System;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use caching_allocator::{AllocError, CachingAllocator, Config, Stats};

#[path = "common/books.rs"]
mod books;

/// Counts what it hands out, and refuses calls `fail_from .. fail_from + fail_count`
/// (1-based) of `alloc`.
struct Faulty {
    bytes: AtomicUsize,
    blocks: AtomicUsize,
    calls: AtomicU64,
    refused: AtomicU64,
    fail_from: u64,
    fail_count: u64,
}

impl Faulty {
    fn new(fail_from: u64, fail_count: u64) -> Arc<Faulty> {
        Arc::new(Faulty {
            bytes: AtomicUsize::new(0),
            blocks: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            fail_from,
            fail_count,
        })
    }
}

// SAFETY: forwards to `System` unchanged, or returns null (a refusal `GlobalAlloc` allows).
unsafe impl GlobalAlloc for Faulty {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let n = self.calls.fetch_add(1, SeqCst) + 1;
        if n >= self.fail_from && n - self.fail_from < self.fail_count {
            self.refused.fetch_add(1, SeqCst);
            return core::ptr::null_mut();
        }
        // SAFETY: the caller's contract is `System::alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            self.bytes.fetch_add(layout.size(), SeqCst);
            self.blocks.fetch_add(1, SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let before = self.bytes.fetch_sub(layout.size(), SeqCst);
        assert!(before >= layout.size(), "freed more bytes than were taken");
        self.blocks.fetch_sub(1, SeqCst);
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The books agree with what the backing allocator holds.
fn check_books(stats: &Stats, sys: &Faulty, cap: usize, ctx: &str) {
    let (bytes, blocks) = (sys.bytes.load(SeqCst), sys.blocks.load(SeqCst));
    books::assert_books_balance(stats, bytes, blocks, cap, ctx);
    assert_eq!(
        stats.system_allocs + sys.refused.load(SeqCst),
        sys.calls.load(SeqCst),
        "{ctx}: every system call is a success or a refusal: {stats:?}"
    );
}

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

const CAP: usize = 256 << 10;
const OPS: usize = if cfg!(miri) { 40 } else { 400 };

/// What a run saw.
#[derive(Default, Debug)]
struct Outcome {
    /// `OutOfMemory` errors returned.
    ooms: u64,
    /// Allocations that succeeded thanks to the retry.
    retried_ok: u64,
    /// `OutOfMemory` errors after a retry that freed the idle cache.
    oom_after_retry: u64,
}

/// Runs the workload on an allocator over `sys`, checking every call. `fail_once` says the
/// backing allocator refuses exactly one call, so a retry must succeed.
fn workload(sys: &Arc<Faulty>, seed: u64) -> Outcome {
    let mut alloc = CachingAllocator::with_config(
        Config::default()
            .arena_max_bytes(0) // the size classes' failure paths
            // Every scope request reaches the cache as a block (chunks off): the counts below.
            .scope_chunk_bytes(0)
            .max_cached_bytes(CAP)
            .system_allocator(sys.clone()),
    );
    let mut rng = Rng(seed);
    let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
    let mut out = Outcome::default();
    for step in 0..OPS {
        let ctx = format!("seed {seed:#x} step {step}");
        match rng.below(10) {
            0..=4 => {
                let size = match rng.below(4) {
                    0 => 1 + rng.below(1024),
                    // Under Miri every byte written and checked costs: stay small.
                    _ if cfg!(miri) => 64 << rng.below(6),
                    1 => 1 + rng.below(16 << 10),
                    2 => (1 + rng.below(64)) << 10,
                    _ => 64 << rng.below(6),
                };
                let align = 1 << rng.below(13);
                let before = alloc.stats();
                let calls_before = sys.calls.load(SeqCst);
                let r = alloc.allocate(size, align);
                let after = alloc.stats();
                let calls = sys.calls.load(SeqCst) - calls_before;
                match r {
                    Ok(p) => {
                        assert_eq!(p.as_ptr() as usize % align.max(64), 0, "{ctx}");
                        if after.oom_retries > before.oom_retries {
                            // Refused once, the idle cache freed, then served.
                            assert_eq!(calls, 2, "{ctx}");
                            assert_eq!(after.oom_retries, before.oom_retries + 1, "{ctx}");
                            assert!(before.cached_blocks > 0, "{ctx}: retried with no cache");
                            assert_eq!(after.cached_blocks, 0, "{ctx}: cache not freed");
                            assert_eq!(
                                after.evictions,
                                before.evictions + before.cached_blocks as u64,
                                "{ctx}"
                            );
                            out.retried_ok += 1;
                        }
                        let tag = step as u8;
                        // SAFETY: a fresh block of at least `size` bytes, ours alone.
                        unsafe { p.as_ptr().write_bytes(tag, size) };
                        live.push((p, size, tag));
                    }
                    Err(e) => {
                        assert_eq!(e, AllocError::OutOfMemory { size, align }, "{ctx}");
                        out.ooms += 1;
                        if before.cached_blocks > 0 {
                            // Retried after giving the idle cache back, refused again.
                            out.oom_after_retry += 1;
                            assert_eq!(calls, 2, "{ctx}");
                            assert_eq!(after.oom_retries, before.oom_retries + 1, "{ctx}");
                            assert_eq!((after.cached_bytes, after.cached_blocks), (0, 0));
                            let mut expect = before;
                            expect.oom_retries += 1;
                            expect.cached_bytes = 0;
                            expect.cached_blocks = 0;
                            expect.evictions += before.cached_blocks as u64;
                            expect.system_frees += before.cached_blocks as u64;
                            expect.reserved_bytes -= before.cached_bytes;
                            assert_eq!(after, expect, "{ctx}");
                        } else {
                            // Nothing to give back: refused once, nothing changed.
                            assert_eq!(calls, 1, "{ctx}");
                            assert_eq!(after, before, "{ctx}: a failed allocation changed stats");
                        }
                    }
                }
            }
            5..=7 if !live.is_empty() => {
                let (p, size, tag) = live.swap_remove(rng.below(live.len()));
                // SAFETY: the block is live and `size` bytes long.
                let bytes = unsafe { core::slice::from_raw_parts(p.as_ptr(), size) };
                assert!(
                    bytes.iter().all(|&b| b == tag),
                    "{ctx}: a live block was overwritten"
                );
                // SAFETY: released once, not used after.
                assert_eq!(unsafe { alloc.release(p) }, Ok(()), "{ctx}");
            }
            8 => {
                let retries = alloc.stats().oom_retries;
                let scope = alloc.scope();
                let n = 1 + rng.below(if cfg!(miri) { 500 } else { 5000 });
                match scope.alloc_slice_fill(n, step as u32) {
                    Ok(xs) => {
                        assert!(xs.iter().all(|&x| x == step as u32), "{ctx}");
                        if alloc.stats().oom_retries > retries {
                            out.retried_ok += 1;
                        }
                    }
                    Err(e) => {
                        assert_eq!(
                            e,
                            AllocError::OutOfMemory {
                                size: n * 4,
                                align: 4
                            }
                        );
                        out.ooms += 1;
                    }
                }
            }
            _ => match rng.below(4) {
                0 => alloc.trim(rng.below(CAP)),
                1 => alloc.free_cached(),
                2 if step % 3 == 0 => {
                    live.clear();
                    alloc.reset();
                }
                _ => {}
            },
        }
        check_books(&alloc.stats(), sys, CAP, &ctx);
    }
    // Everything live goes back; nothing was lost or counted twice on the way.
    for (p, _, _) in live.drain(..) {
        // SAFETY: released once, not used after.
        assert_eq!(unsafe { alloc.release(p) }, Ok(()));
    }
    let stats = alloc.stats();
    assert_eq!(stats.live_blocks, 0, "{stats:?}");
    check_books(&stats, sys, CAP, "end");
    drop(alloc);
    let held = (sys.bytes.load(SeqCst), sys.blocks.load(SeqCst));
    books::assert_all_given_back(held.0, held.1, &format!("seed {seed:#x}"));
    out
}

const SEED: u64 = 0x5EED_F00D_1234_5678;

/// Which N to fail at: every one, or (under Miri, where a run costs seconds) about four.
fn points(calls: u64) -> impl Iterator<Item = u64> {
    let step = if cfg!(miri) { (calls / 4).max(1) } else { 1 };
    (1..=calls).step_by(step as usize)
}

/// How many system allocations the workload makes when nothing fails.
fn clean_calls() -> u64 {
    let sys = Faulty::new(u64::MAX, 0);
    let out = workload(&sys, SEED);
    assert_eq!(out.ooms, 0);
    let calls = sys.calls.load(SeqCst);
    assert!(
        calls > 10,
        "the workload must reach the system often: {calls}"
    );
    calls
}

/// Every N, one refusal: a retry rescues the call if anything was cached, else
/// `OutOfMemory` with nothing changed.
#[test]
fn every_single_failure_is_retried_or_reported() {
    let calls = clean_calls();
    let (mut rescued, mut reported, mut missed) = (0, 0, 0);
    let mut tried = 0;
    for (i, n) in points(calls).enumerate() {
        tried = i + 1;
        let sys = Faulty::new(n, 1);
        let out = workload(&sys, SEED);
        // Cached blocks serve a large alignment only if their address has it, and addresses
        // differ between runs: a run may make a few calls fewer than the clean one.
        let refused = sys.refused.load(SeqCst);
        assert!(refused <= 1, "N = {n}");
        assert_eq!(out.ooms + out.retried_ok, refused, "N = {n}: {out:?}");
        missed += 1 - refused;
        rescued += out.retried_ok;
        reported += out.ooms;
    }
    // The workload must exercise both branches, or this test proves half of what it says.
    assert!(
        rescued > 0 && reported > 0,
        "rescued {rescued}, reported {reported}"
    );
    assert!(
        missed * 10 <= tried as u64,
        "{missed} of {tried} runs ended before their refusal"
    );
}

/// Every N, two refusals in a row: when the first falls on a call with idle blocks cached, the
/// retry fails too: `OutOfMemory`, with the idle cache given back and counted (checked call by
/// call in `workload`). When nothing is cached, the first refusal is an `OutOfMemory` at once.
#[test]
fn every_double_failure_is_out_of_memory() {
    let calls = clean_calls();
    let mut after_retry = 0;
    for n in points(calls) {
        let sys = Faulty::new(n, 2);
        let out = workload(&sys, SEED);
        let refused = sys.refused.load(SeqCst);
        assert!(out.ooms >= refused.min(1), "N = {n}: {out:?}");
        assert!(out.ooms + out.retried_ok <= refused, "N = {n}: {out:?}");
        after_retry += out.oom_after_retry;
    }
    assert!(
        after_retry > 0,
        "no refusal ever fell on a call with a cache to free"
    );
}

/// Every N, the system refuses everything from the Nth call on: the allocator keeps serving
/// from its cache what it can, reports the rest, and loses nothing.
#[test]
fn system_refusing_everything_from_n_on() {
    let calls = clean_calls();
    for n in points(calls) {
        let sys = Faulty::new(n, u64::MAX);
        let out = workload(&sys, SEED);
        let refused = sys.refused.load(SeqCst);
        assert!(out.ooms >= refused.min(1), "N = {n}: {out:?}");
    }
}

/// Two threads run the workload on one allocator while the system refuses some calls: the
/// books balance at the end and the drop returns every byte. (Also run under the sanitizers.)
#[test]
fn failures_on_two_threads() {
    let runs: u64 = if cfg!(miri) { 1 } else { 20 };
    for n in 0..runs {
        let sys = Faulty::new(5 + n * 7, 3);
        let alloc = CachingAllocator::with_config(
            Config::default()
                .arena_max_bytes(0) // the size classes' failure paths
                // Every scope request reaches the cache as a block (chunks off): the counts below.
                .scope_chunk_bytes(0)
                .max_cached_bytes(64 << 10)
                .system_allocator(sys.clone()),
        );
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let alloc = &alloc;
                s.spawn(move || {
                    let mut rng = Rng(SEED ^ (t + 1) ^ (n << 8));
                    let mut live = Vec::new();
                    for _ in 0..OPS / 2 {
                        if rng.below(2) == 0 || live.is_empty() {
                            let size = 1 + rng.below(40 << 10);
                            if let Ok(p) = alloc.allocate(size, 64) {
                                live.push(p);
                            }
                        } else {
                            let p = live.swap_remove(rng.below(live.len()));
                            // SAFETY: released once, not used after.
                            unsafe { alloc.release(p) }.unwrap();
                        }
                    }
                    for p in live {
                        // SAFETY: released once, not used after.
                        unsafe { alloc.release(p) }.unwrap();
                    }
                });
            }
        });
        let stats = alloc.stats();
        assert_eq!(stats.live_blocks, 0);
        check_books(&stats, &sys, 64 << 10, "two threads");
        drop(alloc);
        assert_eq!(sys.bytes.load(SeqCst), 0);
        assert_eq!(sys.blocks.load(SeqCst), 0);
    }
}

/// `limit_bytes`: requests past it evict idle blocks first, then fail with `LimitExceeded`
/// carrying the numbers, leaving live state unchanged; the drop still returns every byte.
#[test]
fn limit_exceeded_run() {
    let sys = Faulty::new(u64::MAX, 0);
    let limit = 64 << 10;
    let alloc = CachingAllocator::with_config(
        Config::default()
            .arena_max_bytes(0) // the size classes' failure paths
            // Every scope request reaches the cache as a block (chunks off): the counts below.
            .scope_chunk_bytes(0)
            .max_cached_bytes(32 << 10)
            .limit_bytes(limit)
            .system_allocator(sys.clone()),
    );
    // 4096 bytes is a class of its own: sixteen blocks fill the limit exactly.
    let mut live: Vec<_> = (0..16).map(|_| alloc.allocate(4096, 64).unwrap()).collect();
    let before = alloc.stats();
    assert_eq!(before.reserved_bytes, limit);
    let err = alloc.allocate(4096, 64).unwrap_err();
    assert_eq!(
        err,
        AllocError::LimitExceeded {
            size: 4096,
            class_size: 4096,
            limit,
            reserved: limit
        }
    );
    assert_eq!(
        alloc.stats(),
        before,
        "nothing cached to evict: nothing may change"
    );
    check_books(&alloc.stats(), &sys, 32 << 10, "at the limit");

    // Four blocks go idle; an 8 KiB request evicts the two least recently used to fit.
    for p in live.drain(..4) {
        // SAFETY: released once, not used after.
        unsafe { alloc.release(p) }.unwrap();
    }
    let before = alloc.stats();
    assert_eq!(before.cached_blocks, 4);
    let big = alloc.allocate(8192, 64).unwrap();
    let after = alloc.stats();
    assert_eq!(after.evictions, before.evictions + 2, "{after:?}");
    assert_eq!(after.reserved_bytes, limit);
    assert_eq!(after.cached_blocks, 2);
    check_books(&after, &sys, 32 << 10, "after evicting for the limit");

    // A cached block of the class still serves past the limit: no new bytes needed.
    let hit = alloc.allocate(4000, 64).unwrap();
    assert_eq!(alloc.stats().system_allocs, after.system_allocs);
    // Now a new class cannot fit even after evicting the last idle block: refused before
    // anything is evicted (on error nothing changes), every live block untouched.
    let before = alloc.stats();
    let err = alloc.allocate(16 << 10, 64).unwrap_err();
    let stats = alloc.stats();
    assert!(
        matches!(err, AllocError::LimitExceeded { reserved, .. } if reserved == stats.reserved_bytes)
    );
    assert_eq!(stats.live_blocks, 12 + 1 + 1);
    assert_eq!(stats, before, "an impossible request changed the books");
    assert_eq!(
        stats.cached_blocks, 1,
        "the idle block was evicted for nothing"
    );
    check_books(&stats, &sys, 32 << 10, "refused without evicting");

    for p in live.into_iter().chain([big, hit]) {
        // SAFETY: released once, not used after.
        unsafe { alloc.release(p) }.unwrap();
    }
    drop(alloc);
    assert_eq!(sys.bytes.load(SeqCst), 0);
    assert_eq!(sys.blocks.load(SeqCst), 0);
}
