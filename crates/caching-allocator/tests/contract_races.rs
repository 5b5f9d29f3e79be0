//! Everything the docs allow to race, racing, inside the documented contract: workers allocate,
//! release their own blocks and other threads' blocks, and open scopes, in *bursts*; a resetter
//! resets between bursts (a gate it closes, so every block is used only between two resets, as
//! the contract of `reset_unchecked` asks); a trimmer calls `trim` and `free_cached` with no
//! gate at all; and short-lived threads come and go, some leaving live blocks behind.
//!
//! Every holder writes its tag into every byte of every block it gets and checks the tags, and
//! that the system still holds the block's memory, before it releases the block and at the end
//! of every burst. A block freed under its holder, or handed to two holders, fails the test.
//!
//! The same traffic runs with the arena on (the default configuration), with large blocks in
//! the arena, and with the arena off. Run it under the sanitizers with `scripts/sanitizers.sh`.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use caching_allocator::{CachingAllocator, Config, MAX_ARENA_BYTES};

#[path = "common/counting.rs"]
mod counting;
use counting::Counting;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

const WORKERS: usize = 3;
/// Bursts each worker runs (and each short-lived thread's single burst is on top).
const BURSTS: usize = if cfg!(miri) { 4 } else { 400 };
/// Operations in a burst.
const OPS: usize = if cfg!(miri) { 6 } else { 24 };
/// A run stops early after this long (a loaded machine or a sanitizer runs fewer bursts).
const DEADLINE: Duration = Duration::from_secs(if cfg!(miri) { 60 } else { 4 });

/// A block as its holder knows it: where, how long, the tag in every byte, and the reset
/// interval (the gate's generation) it was handed out in.
#[derive(Clone, Copy, Debug)]
struct Held {
    addr: usize,
    len: usize,
    tag: u8,
    generation: u64,
}

struct Shared {
    alloc: CachingAllocator,
    system: Arc<Counting>,
    /// Held for reading by a burst, for writing by a reset; the value counts the resets.
    gate: RwLock<u64>,
    /// Blocks handed from one thread to another, one mailbox a worker.
    mailboxes: Vec<Mutex<Vec<Held>>>,
    /// Bursts done, for the report.
    bursts: AtomicUsize,
    /// Set when the workers are done: the resetter, trimmer and churner stop.
    done: AtomicBool,
    started: Instant,
}

impl Shared {
    fn late(&self) -> bool {
        self.started.elapsed() > DEADLINE
    }

    /// Writes `tag` over the block.
    fn tag(&self, b: &Held) {
        assert!(
            self.system.holds(b.addr, b.len),
            "{b:?} lies outside every block the system holds for the allocator"
        );
        // SAFETY: the block is live and held by this thread alone (checked by the tags).
        unsafe { (b.addr as *mut u8).write_bytes(b.tag, b.len) }
    }

    /// Checks the block still holds its tag in every byte, in memory the system still holds.
    fn check(&self, b: &Held) {
        assert!(
            self.system.holds(b.addr, b.len),
            "{b:?}: its memory went back to the system while it was held"
        );
        // SAFETY: as in `tag`; every byte was written.
        let bytes = unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.len) };
        if let Some(at) = bytes.iter().position(|&x| x != b.tag) {
            panic!(
                "{b:?}: byte {at} holds {:#x}: another holder wrote into the block",
                bytes[at]
            );
        }
    }

    fn release(&self, b: &Held) {
        self.check(b);
        let p = NonNull::new(b.addr as *mut u8).unwrap();
        // SAFETY: live (its generation is the current one), released once, not used after.
        unsafe { self.alloc.release(p) }.unwrap_or_else(|e| panic!("{b:?}: {e}"));
    }

    /// One burst of `ops` operations by thread `me` (a worker's index, or `None` for a
    /// short-lived thread), between two resets. `held` is the thread's blocks; those of an
    /// earlier interval were taken by a reset and are dropped unread. With `release_all`, the
    /// burst ends by releasing every block it holds.
    fn burst(
        &self,
        me: Option<usize>,
        rng: &mut Rng,
        held: &mut Vec<Held>,
        ops: usize,
        release_all: bool,
    ) {
        let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let generation = *gate;
        held.retain(|b| b.generation == generation);
        for b in held.iter() {
            self.check(b);
        }
        for _ in 0..ops {
            let tag = (rng.next() as u8) | 1;
            match rng.below(8) {
                0..=2 => {
                    // Mostly the arena's sizes, some of the size classes'.
                    let len = match rng.below(8) {
                        0 => 1 + rng.below(300 << 10),
                        1 => 1 + rng.below(64 << 10),
                        _ => 1 + rng.below(4 << 10),
                    };
                    let len = if cfg!(miri) { len.min(2048) } else { len };
                    let align = 1 << rng.below(13);
                    let p = self.alloc.allocate(len, align).unwrap();
                    assert_eq!(p.as_ptr() as usize % align, 0);
                    let b = Held {
                        addr: p.as_ptr() as usize,
                        len,
                        tag,
                        generation,
                    };
                    self.tag(&b);
                    held.push(b);
                }
                3 | 4 if !held.is_empty() => {
                    // Newest first half the time (the arena's common order), else any.
                    let i = if rng.below(2) == 0 {
                        held.len() - 1
                    } else {
                        rng.below(held.len())
                    };
                    let b = held.swap_remove(i);
                    self.release(&b);
                }
                5 if !held.is_empty() => {
                    // Hand a block to a worker (maybe this one), to release or keep.
                    let b = held.swap_remove(rng.below(held.len()));
                    self.check(&b);
                    let to = rng.below(WORKERS);
                    self.mailboxes[to].lock().unwrap().push(b);
                }
                6 => {
                    if let Some(me) = me {
                        let mine = std::mem::take(&mut *self.mailboxes[me].lock().unwrap());
                        for b in mine {
                            assert_eq!(b.generation, generation, "mailboxes empty at a reset");
                            self.check(&b);
                            if rng.below(2) == 0 {
                                self.release(&b);
                            } else {
                                let b = Held { tag, ..b };
                                self.tag(&b);
                                held.push(b);
                            }
                        }
                    }
                }
                _ => {
                    let scope = self.alloc.scope();
                    let a = scope.alloc_slice_fill(1 + rng.below(6000), tag).unwrap();
                    let c = scope.alloc_slice_fill(1 + rng.below(300), !tag).unwrap();
                    for b in held.iter() {
                        self.check(b);
                    }
                    assert!(
                        a.iter().all(|&x| x == tag),
                        "a scope's slice was overwritten"
                    );
                    assert!(
                        c.iter().all(|&x| x == !tag),
                        "a scope's slice was overwritten"
                    );
                }
            }
        }
        for b in held.iter() {
            self.check(b);
        }
        if release_all {
            for b in held.drain(..) {
                self.release(&b);
            }
        }
        self.bursts.fetch_add(1, Ordering::Relaxed);
        drop(gate);
    }

    /// Between bursts: every block handed out so far is taken back; none is used after.
    fn reset(&self) {
        let mut gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
        for mailbox in &self.mailboxes {
            mailbox.lock().unwrap().clear();
        }
        // SAFETY: the gate is closed: no burst runs, and every block handed out is used only
        // inside the burst of its interval (holders drop blocks of an earlier generation).
        unsafe { self.alloc.reset_unchecked() };
        *gate += 1;
    }
}

fn run(config: Config) {
    let system = Arc::new(Counting::new());
    let shared = Arc::new(Shared {
        alloc: CachingAllocator::with_config(config.system_allocator(system.clone())),
        system,
        gate: RwLock::new(0),
        mailboxes: (0..WORKERS).map(|_| Mutex::new(Vec::new())).collect(),
        bursts: AtomicUsize::new(0),
        done: AtomicBool::new(false),
        started: Instant::now(),
    });
    let threads = AtomicUsize::new(0);
    let resets = AtomicUsize::new(0);
    let trims = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let shared = &shared;
                s.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (w as u64 + 1));
                    let mut held = Vec::new();
                    for _ in 0..BURSTS {
                        if shared.late() {
                            break;
                        }
                        shared.burst(Some(w), &mut rng, &mut held, OPS, false);
                    }
                    // What is left is taken by the last reset.
                })
            })
            .collect();
        s.spawn(|| {
            while !shared.done.load(Ordering::Acquire) {
                shared.reset();
                resets.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        s.spawn(|| {
            let mut rng = Rng(0xD1B5_4A32_D192_ED03);
            while !shared.done.load(Ordering::Acquire) {
                match rng.below(4) {
                    0 => shared.alloc.free_cached(),
                    1 => shared.alloc.trim(rng.below(1 << 20)),
                    2 => shared.alloc.trim(0),
                    _ => {
                        let _ = shared.alloc.stats();
                    }
                }
                trims.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        s.spawn(|| {
            let mut seed = 0x2545_F491u64;
            while !shared.done.load(Ordering::Acquire) {
                seed += 1;
                let shared = &shared;
                std::thread::scope(|t| {
                    t.spawn(move || {
                        let mut rng = Rng(seed);
                        // Left live on purpose half the time: the next reset takes them.
                        let release_all = seed.is_multiple_of(2);
                        shared.burst(None, &mut rng, &mut Vec::new(), OPS / 4, release_all);
                    });
                });
                threads.fetch_add(1, Ordering::Relaxed);
            }
        });
        // Every worker joined before the others are told to stop, even one that panicked
        // (else they would run on and the test would hang instead of failing).
        let joined: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        shared.done.store(true, Ordering::Release);
        for result in joined {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
    });
    shared.reset();
    let stats = shared.alloc.stats();
    assert_eq!((stats.live_blocks, stats.live_bytes), (0, 0), "{stats}");
    let (bytes, _) = shared.system.held();
    assert_eq!(stats.reserved_bytes, bytes, "{stats}");
    eprintln!(
        "{} bursts, {} resets, {} trims, {} short-lived threads in {:.1} s; {} thread caches",
        shared.bursts.load(Ordering::Relaxed),
        resets.load(Ordering::Relaxed),
        trims.load(Ordering::Relaxed),
        threads.load(Ordering::Relaxed),
        shared.started.elapsed().as_secs_f64(),
        shared.alloc.thread_caches(),
    );
}

#[test]
fn every_allowed_race_with_the_default_arena() {
    run(Config::default().max_cached_bytes(4 << 20));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri runs the default configuration's races (3 minutes for all three)"
)]
fn every_allowed_race_with_large_blocks_in_the_arena() {
    run(Config::default()
        .max_cached_bytes(8 << 20)
        .arena_max_bytes(MAX_ARENA_BYTES));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri runs the default configuration's races (3 minutes for all three)"
)]
fn every_allowed_race_with_the_arena_off_and_a_small_cap() {
    run(Config::default()
        .max_cached_bytes(256 << 10)
        .arena_max_bytes(0));
}
