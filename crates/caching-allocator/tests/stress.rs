//! Many threads share one allocator; every holder tags its whole block and checks the tag
//! before giving it back, so one block held by two holders at once fails the test.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use caching_allocator::{CachingAllocator, Config};

const THREADS: usize = 4;
#[cfg(not(miri))]
const ROUNDS: usize = 2000;
#[cfg(miri)]
const ROUNDS: usize = 20;
/// The largest block a holder asks for.
const MAX_LEN: usize = if cfg!(miri) { 4_000 } else { 20_000 };

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

fn tag(p: NonNull<u8>, len: usize, t: u8) {
    // SAFETY: `p` is a live block of at least `len` bytes held by this holder alone.
    unsafe { p.as_ptr().write_bytes(t, len) }
}

fn check(p: NonNull<u8>, len: usize, t: u8) {
    // SAFETY: as in `tag`.
    let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
    assert!(
        bytes.iter().all(|&b| b == t),
        "block {p:p} of {len} bytes was written by another holder while tagged {t}"
    );
}

fn run(config: Config) {
    let alloc = Arc::new(CachingAllocator::with_config(config));
    // Blocks handed between threads: (address, len, tag) published by one, released by another.
    let mailbox: Arc<Vec<AtomicU64>> = Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let alloc = alloc.clone();
            let mailbox = mailbox.clone();
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9 + t as u64);
                let mut held: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
                for round in 0..ROUNDS {
                    let holder_tag = (t * 50 + round % 50) as u8 | 1;
                    match rng.next() % 6 {
                        0..=2 => {
                            // Under Miri every byte tagged and checked is interpreted:
                            // smaller blocks keep the run short, the interleavings the same.
                            let len = 1 + (rng.next() % MAX_LEN as u64) as usize;
                            let align = 1 << (rng.next() % 13);
                            let p = alloc.allocate(len, align).unwrap();
                            assert_eq!(p.as_ptr() as usize % align, 0);
                            tag(p, len, holder_tag);
                            held.push((p, len, holder_tag));
                        }
                        3 if !held.is_empty() => {
                            let i = (rng.next() as usize) % held.len();
                            let (p, len, tg) = held.swap_remove(i);
                            check(p, len, tg);
                            // SAFETY: released once, by its only holder.
                            unsafe { alloc.release(p).unwrap() };
                        }
                        4 => {
                            // Scope traffic, tagged too.
                            let scope = alloc.scope();
                            let a = scope
                                .alloc_slice_fill(1 + round % 3000, holder_tag)
                                .unwrap();
                            let b = scope.alloc_slice_fill(64, !holder_tag).unwrap();
                            assert!(a.iter().all(|&x| x == holder_tag));
                            assert!(b.iter().all(|&x| x == !holder_tag));
                        }
                        _ => {
                            // Hand a block to the next thread's mailbox, take one from ours.
                            if let Some((p, len, tg)) = held.pop() {
                                check(p, len, tg);
                                let packed = (p.as_ptr() as u64) | ((len as u64) << 48);
                                let next = &mailbox[(t + 1) % THREADS];
                                if next
                                    .compare_exchange(
                                        0,
                                        packed,
                                        Ordering::AcqRel,
                                        Ordering::Acquire,
                                    )
                                    .is_err()
                                {
                                    held.push((p, len, tg));
                                }
                            }
                            let mine = mailbox[t].swap(0, Ordering::AcqRel);
                            if mine != 0 {
                                let p = NonNull::new((mine & ((1 << 48) - 1)) as *mut u8).unwrap();
                                let len = (mine >> 48) as usize;
                                tag(p, len, holder_tag);
                                held.push((p, len, holder_tag));
                            }
                        }
                    }
                }
                for (p, len, tg) in held {
                    check(p, len, tg);
                    // SAFETY: released once, by its only holder.
                    unsafe { alloc.release(p).unwrap() };
                }
            });
        }
    });
    for slot in mailbox.iter() {
        let left = slot.swap(0, Ordering::AcqRel);
        if left != 0 {
            let p = NonNull::new((left & ((1 << 48) - 1)) as *mut u8).unwrap();
            // SAFETY: the last block left in a mailbox is held by nobody else.
            unsafe { alloc.release(p).unwrap() };
        }
    }
    let stats = alloc.stats();
    assert_eq!(stats.live_blocks, 0, "{stats}");
    assert!(
        stats.cached_bytes <= alloc.config().get_max_cached_bytes(),
        "{stats}"
    );
    assert_eq!(stats.reserved_bytes, stats.cached_bytes, "{stats}");
}

#[test]
fn no_block_is_held_by_two_holders() {
    run(Config::default().max_cached_bytes(4 << 20));
}

#[test]
fn no_block_is_held_by_two_holders_with_peak_bound_growth() {
    // Misses evict before reserved bytes pass their peak, racing the other threads' frees.
    run(Config::default()
        .max_cached_bytes(1 << 20)
        .evict_before_new_peak(true));
}

#[test]
fn no_block_is_held_by_two_holders_with_a_small_cap_and_debug_checks() {
    run(Config::default()
        .max_cached_bytes(64 << 10)
        .debug_checks(true));
}
