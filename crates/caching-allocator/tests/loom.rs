//! Model-checked concurrency: every interleaving (up to a preemption bound) of a few threads
//! using one allocator.
//!
//! Run with
//! `LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p caching-allocator --release --test loom`
//! (bound 3: thirteen models, six of them run twice, with the arena off and on; 128 s once
//! built on the 2-core machine of 2026-12-06 under load, most of it the model of a foreign
//! release racing a reset).
//! Under `cfg(loom)` the crate's locks and atomics are loom's (`src/sync.rs`) and so are its
//! thread-locals (`src/thread_cache.rs`), so each model thread has its own thread cache and loom
//! switches threads at every lock.
//!
//! Each model ends with the books checked against a counting backing allocator: stats agree
//! with what the system handed out, the cap holds, and dropping the allocator gives back
//! exactly the bytes taken.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc as StdArc;

use caching_allocator::{AllocError, CachingAllocator, Config, Stats};
use loom::sync::Arc;
use loom::thread;

#[path = "common/books.rs"]
mod books;

#[path = "common/counting.rs"]
mod counting;
use counting::Counting;

/// Runs `f` under loom on a new allocator (`cap` bytes cached, requests up to `arena_max`
/// bytes in the threads' arenas, a counting system allocator behind it), then checks that its
/// end is quiet (`end_quiet`: `f` joins every thread it starts); reports how many
/// interleavings it explored, under the name of the test that `f` is in. One interleaving
/// would mean loom sees no synchronisation in the crate (its primitives are not loom's): a
/// failure.
fn model<F>(cap: usize, arena_max: usize, f: F)
where
    F: Fn(&Arc<CachingAllocator>, &Counting) + Sync + Send + 'static,
{
    // `loom::<test>::{{closure}}`: a name for diagnostics only.
    let name = std::any::type_name_of_val(&f).trim_end_matches("::{{closure}}");
    let runs = StdArc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    loom::model(move || {
        counter.fetch_add(1, SeqCst);
        let counting = StdArc::new(Counting::default());
        let alloc = Arc::new(CachingAllocator::with_config(
            Config::default()
                .max_cached_bytes(cap)
                .arena_max_bytes(arena_max)
                .system_allocator(counting.clone()),
        ));
        f(&alloc, &counting);
        end_quiet(alloc, &counting);
    });
    let runs = runs.load(SeqCst);
    eprintln!("loom model {name}: {runs} interleavings");
    assert!(runs > 1, "loom explored a single interleaving of {name}");
}

/// [`model`] twice: with the arena off (every block through the size classes) and on (blocks
/// of up to 1 KiB bumped through the threads' arenas, as the default configuration does).
fn model_arena_off_and_on<F>(cap: usize, f: F)
where
    F: Fn(&Arc<CachingAllocator>, &Counting) + Clone + Sync + Send + 'static,
{
    model(cap, 0, f.clone());
    model(cap, 1024, f);
}

/// Starts a model thread running `f` on its own handle to `alloc`.
fn spawn<T: Send + 'static>(
    alloc: &Arc<CachingAllocator>,
    f: impl FnOnce(Arc<CachingAllocator>) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let alloc = alloc.clone();
    thread::spawn(move || f(alloc))
}

/// The books balance (see `books`) under the allocator's cap, and every system free here is
/// an eviction.
fn check_books(alloc: &CachingAllocator, stats: &Stats, counting: &Counting) {
    let cap = alloc.config().get_max_cached_bytes();
    let (bytes, blocks) = (counting.bytes.load(SeqCst), counting.blocks.load(SeqCst));
    books::assert_books_balance(stats, bytes, blocks, cap, "loom");
    assert_eq!(stats.system_frees, stats.evictions, "{stats:?}");
}

/// Dropping the allocator (the last `Arc`) gives every byte back to the system.
fn drop_and_check(alloc: Arc<CachingAllocator>, counting: &Counting) {
    drop(alloc);
    let held = (counting.bytes.load(SeqCst), counting.blocks.load(SeqCst));
    books::assert_all_given_back(held.0, held.1, "loom");
}

/// The end of a model, its threads joined: nothing is live, the books balance, and dropping
/// the allocator gives every byte back.
fn end_quiet(alloc: Arc<CachingAllocator>, counting: &Counting) {
    let stats = alloc.stats();
    books::assert_nothing_live(&stats, "loom");
    check_books(&alloc, &stats, counting);
    drop_and_check(alloc, counting);
}

/// A new block of `size` bytes (alignment 64), by its address: what a model thread is given.
fn block(alloc: &CachingAllocator, size: usize) -> usize {
    alloc.allocate(size, 64).unwrap().as_ptr() as usize
}

/// Releases the block at `addr`.
///
/// # Safety
/// If the block is live, nothing uses it after this call.
unsafe fn release_at(alloc: &CachingAllocator, addr: usize) -> Result<(), AllocError> {
    // SAFETY: the caller's contract is `release`'s; an address that is not live is refused
    // without being read.
    unsafe { alloc.release(core::ptr::NonNull::new(addr as *mut u8).unwrap()) }
}

/// Allocates a block of `size` bytes (alignment 64) and releases it at once.
fn round_trip(alloc: &CachingAllocator, size: usize) {
    let p = alloc.allocate(size, 64).unwrap();
    // SAFETY: `p` came from `allocate` and is not used after.
    unsafe { alloc.release(p) }.unwrap();
}

/// Writes `tag` over a block's `len` bytes.
fn tag(addr: usize, len: usize, tag: u8) {
    // SAFETY: the block is live, ours alone, and at least `len` bytes long.
    unsafe { core::ptr::write_bytes(addr as *mut u8, tag, len) };
}

/// Whether a block's `len` bytes still hold `tag`.
fn tagged(addr: usize, len: usize, tag: u8) -> bool {
    // SAFETY: as in `tag`; every byte was written by it.
    let bytes = unsafe { core::slice::from_raw_parts(addr as *const u8, len) };
    bytes.iter().all(|&b| b == tag)
}

/// Two threads allocate and release blocks of one class at once; after they are joined a third
/// thread resets through `reset_unchecked`, reaching the blocks the exited threads left live.
#[test]
fn two_threads_same_class_then_reset_from_a_third() {
    model_arena_off_and_on(1 << 20, |alloc, counting| {
        let workers: Vec<_> = (1..=2u8)
            .map(|t| {
                spawn(alloc, move |alloc| {
                    let a = block(&alloc, 100);
                    tag(a, 100, t);
                    // SAFETY: `a` came from `allocate` and is not used after.
                    unsafe { release_at(&alloc, a) }.unwrap();
                    // Left live on purpose: the reset must find it in an exited thread's cache.
                    let b = block(&alloc, 100);
                    tag(b, 100, t);
                    (b, t)
                })
            })
            .collect();
        let held: Vec<(usize, u8)> = workers.into_iter().map(|h| h.join().unwrap()).collect();
        assert_ne!(held[0].0, held[1].0, "one block handed to two threads");
        for &(addr, t) in &held {
            assert!(tagged(addr, 100, t), "a live block was overwritten");
        }
        let stats = alloc.stats();
        assert_eq!(stats.live_blocks, 2);
        assert_eq!(stats.hits + stats.misses, 4);
        check_books(alloc, &stats, counting);

        // SAFETY: the workers are joined and nothing uses their blocks any more; no scope
        // is alive; the main thread makes no call until this thread is joined.
        let resetter = spawn(alloc, move |alloc| unsafe { alloc.reset_unchecked() });
        resetter.join().unwrap();
        let stats = alloc.stats();
        assert_eq!((stats.live_blocks, stats.live_bytes), (0, 0), "{stats:?}");
        // With the arena on, the exited workers' chunks stay with their arenas (a trim or the
        // next new thread takes them once their exit is seen).
        let arena_on = alloc.config().get_arena_max_bytes() > 0;
        let chunks = if arena_on { stats.arena_chunks } else { 0 };
        assert_eq!(
            (stats.cached_blocks + chunks) as u64,
            stats.system_allocs,
            "{stats:?}"
        );
        check_books(alloc, &stats, counting);

        // The reset blocks serve new requests without the system (the size classes' blocks:
        // an arena's chunk is not idle until its owner's exit is seen).
        let before = alloc.stats().system_allocs;
        let p = alloc.allocate(100, 64).unwrap();
        if !arena_on {
            assert_eq!(alloc.stats().system_allocs, before);
        }
        // SAFETY: `p` came from `allocate` and is not used after.
        unsafe { alloc.release(p) }.unwrap();
    });
}

/// A block released on one thread (not the one that allocated it) refills another thread's
/// allocation of the same class, while the release and the allocation race.
#[test]
fn release_on_one_thread_refills_allocation_on_another() {
    model_arena_off_and_on(1 << 20, |alloc, counting| {
        let p = block(alloc, 3000);
        let releaser = spawn(alloc, move |alloc| {
            tag(p, 3000, 1);
            // SAFETY: `p` was handed to this thread; nothing uses it after.
            unsafe { release_at(&alloc, p) }
        });
        let taker = spawn(alloc, move |alloc| {
            let q = block(&alloc, 3000);
            tag(q, 3000, 2);
            q
        });
        releaser.join().unwrap().unwrap();
        let q = taker.join().unwrap();
        assert!(tagged(q, 3000, 2));
        let stats = alloc.stats();
        // Either the taker found `p` (released first: no new system block) or took a new one.
        if stats.system_allocs == 1 {
            assert_eq!(q, p, "one system block but the taker holds another");
            assert_eq!((stats.hits, stats.misses), (1, 1));
        } else {
            assert_eq!(stats.system_allocs, 2);
            assert_ne!(q, p, "the block was handed out while still live");
            assert_eq!(stats.cached_blocks, 1);
        }
        assert_eq!(stats.live_blocks, 1);
        check_books(alloc, &stats, counting);

        // The main thread now finds `p` or `q`'s twin through the other threads' caches.
        let r = alloc.allocate(3000, 64).unwrap();
        assert_ne!(r.as_ptr() as usize, q);
        assert_eq!(alloc.stats().system_allocs, 2);
        // SAFETY: `r` came from `allocate` and is not used after.
        unsafe { alloc.release(r) }.unwrap();
        // SAFETY: `q` came from `allocate`, its taker has exited, and it is not used after.
        unsafe { release_at(alloc, q) }.unwrap();
    });
}

/// With a cap of one block, releases that must evict race with an allocation of the class.
#[test]
fn eviction_races_with_allocation() {
    model(64, 0, |alloc, _| {
        let p1 = block(alloc, 64);
        let p2 = block(alloc, 64);
        let releaser = spawn(alloc, move |alloc| {
            for p in [p1, p2] {
                // SAFETY: `p` was handed to this thread; nothing uses it after.
                unsafe { release_at(&alloc, p) }.unwrap();
            }
        });
        let taker = spawn(alloc, move |alloc| {
            let q = block(&alloc, 64);
            tag(q, 64, 7);
            assert!(tagged(q, 64, 7));
            // SAFETY: `q` came from `allocate` and is not used after.
            unsafe { release_at(&alloc, q) }.unwrap();
            q
        });
        releaser.join().unwrap();
        taker.join().unwrap();
        let stats = alloc.stats();
        assert!(
            stats.evictions >= 1,
            "three blocks and a one-block cap: {stats:?}"
        );
    });
}

/// `trim(0)` on one thread races with a release and an allocation on another: nothing is lost,
/// nothing is freed twice, and what stays cached is within the cap.
#[test]
fn trim_races_with_release_and_allocation() {
    model_arena_off_and_on(1 << 20, |alloc, counting| {
        let p = block(alloc, 64);
        let worker = spawn(alloc, move |alloc| {
            // SAFETY: `p` was handed to this thread; nothing uses it after.
            unsafe { release_at(&alloc, p) }.unwrap();
            round_trip(&alloc, 64);
            // Under loom a join returns before the thread's locals are dropped (which marks
            // its cache exited, so a trim may take its arena's chunk), so the worker parks its
            // own chunk. An exited thread's chunk is taken by `free_cached` in `tests/arena.rs`.
            alloc.trim(usize::MAX);
        });
        alloc.trim(0);
        worker.join().unwrap();
        check_books(alloc, &alloc.stats(), counting);
        alloc.free_cached();
        let stats = alloc.stats();
        assert_eq!(
            (stats.cached_bytes, stats.cached_blocks),
            (0, 0),
            "{stats:?}"
        );
    });
}

/// Two threads each hold a scope on the shared allocator while a third steals from the idle
/// blocks an exited thread left behind; scopes return their blocks to their own thread's cache.
#[test]
fn scopes_and_stealing() {
    model_arena_off_and_on(1 << 20, |alloc, _| {
        // A thread leaves an idle block of the class in its cache and exits.
        spawn(alloc, move |alloc| {
            round_trip(&alloc, 200);
        })
        .join()
        .unwrap();
        let scoped: Vec<_> = (1..=2u8)
            .map(|t| {
                spawn(alloc, move |alloc| {
                    let scope = alloc.scope();
                    let xs = scope.alloc_slice_fill(200, t).unwrap();
                    assert!(
                        xs.iter().all(|&x| x == t),
                        "a scope's slice was overwritten"
                    );
                    xs.as_ptr() as usize
                })
            })
            .collect();
        let addrs: Vec<usize> = scoped.into_iter().map(|h| h.join().unwrap()).collect();
        // Both were live at once only if they differ; either way one system block at most
        // was added to the one the exited thread left.
        let stats = alloc.stats();
        assert!(stats.system_allocs <= 3, "{stats:?}");
        if addrs[0] == addrs[1] {
            // Sequential reuse: one thread's scope ended before the other's began.
            assert!(stats.hits >= 1, "{stats:?}");
        }
    });
}

/// A reset on one thread races with an allocation and a checked release on another (the
/// pattern of ExecuTorch's thread-safety test: `reset()` while others allocate). Whatever the
/// interleaving: the released block is either released (`Ok`) or was taken by the reset
/// (`UnknownPointer`), never both; the second allocation survives or is taken, never lost; and
/// once both threads are quiet a final reset leaves live 0 and reserved = cached.
#[test]
fn reset_races_with_allocation_and_release() {
    model_arena_off_and_on(1 << 20, |alloc, counting| {
        let worker = spawn(alloc, move |alloc| {
            let p = alloc.allocate(100, 64).unwrap();
            // Nothing writes to `p`: the reset may take it back at any moment.
            // SAFETY: `p` is not used after this call.
            let released = unsafe { alloc.release(p) };
            match released {
                Ok(()) => {}
                Err(AllocError::UnknownPointer { .. }) => {}
                Err(e) => panic!("release racing a reset: {e}"),
            }
            (released.is_ok(), block(&alloc, 100))
        });
        // SAFETY: the worker never uses a block after it could have been reset (it writes to
        // none and releases only through the checked `release`).
        unsafe { alloc.reset_unchecked() };
        let (released, _q) = worker.join().unwrap();
        let stats = alloc.stats();
        // `q` is live (allocated after the reset) or was taken by it; `p` is never live.
        assert!(stats.live_blocks <= 1, "{stats:?}");
        assert_eq!(stats.hits + stats.misses, 2, "{stats:?}");
        if !released {
            // The reset took `p`, so it ran after the first allocation: the books show it.
            assert!(stats.system_allocs >= 1, "{stats:?}");
        }
        check_books(alloc, &stats, counting);
        // SAFETY: the worker is joined and its blocks are not used any more.
        unsafe { alloc.reset_unchecked() };
        let stats = alloc.stats();
        assert_eq!(stats.reserved_bytes, stats.cached_bytes, "{stats:?}");
    });
}

/// The arena's epoch protocol: a reset on another thread races the owner's allocations. The
/// block allocated before the reset may be taken (then its bytes serve the next block), the
/// one allocated after it survives if the reset came first; the books stay exact either way,
/// and a quiet reset afterwards leaves nothing live.
#[test]
fn arena_reset_racing_the_owners_allocations() {
    model(1 << 20, 1024, |alloc, counting| {
        let owner = spawn(alloc, move |alloc| {
            let p = block(&alloc, 256);
            tag(p, 256, 1);
            let q = block(&alloc, 256);
            tag(q, 256, 2);
            (p, q)
        });
        // SAFETY: nothing handed out is used after the reset but by its own thread, which
        // only checks the tags of blocks the reset cannot have taken (see below).
        let resetter = spawn(alloc, move |alloc| unsafe { alloc.reset_unchecked() });
        let (p, q) = owner.join().unwrap();
        resetter.join().unwrap();
        // `q` was allocated last: nothing was handed out over it.
        assert!(tagged(q, 256, 2));
        let s = alloc.stats();
        assert!(s.live_blocks <= 2, "{s:?}");
        if p == q {
            // The reset took `p` between the two calls: `q` reused its bytes.
            assert_eq!(s.live_blocks, 1, "{s:?}");
        }
        check_books(alloc, &s, counting);
        // SAFETY: quiet now; nothing is used after.
        unsafe { alloc.reset_unchecked() };
    });
}

/// The arena's marks: another thread releases one of the owner's blocks while the owner
/// releases and allocates more. The foreign release is `Ok` (the block was live), the owner
/// never hands out bytes a live block holds, and the books end exact.
#[test]
fn arena_foreign_release_racing_the_owner() {
    model(1 << 20, 1024, |alloc, counting| {
        let a = block(alloc, 256);
        let b = block(alloc, 256);
        tag(b, 256, 2);
        let releaser = spawn(alloc, move |alloc| {
            // SAFETY: `a` was handed to this thread; nothing uses it after.
            unsafe { release_at(&alloc, a) }
        });
        // The owner: a new block while the release may be in flight, then a round trip.
        let c = block(alloc, 256);
        tag(c, 256, 3);
        assert_ne!(c, a, "a block was handed out over a live one");
        assert_eq!(releaser.join().unwrap(), Ok(()));
        let d = block(alloc, 256);
        tag(d, 256, 4);
        assert!(tagged(b, 256, 2) && tagged(c, 256, 3));
        let s = alloc.stats();
        assert_eq!(s.live_blocks, 3, "{s:?}");
        check_books(alloc, &s, counting);
        for p in [b, c, d] {
            // SAFETY: each released once, not used after.
            unsafe { release_at(alloc, p) }.unwrap();
        }
    });
}

/// A reset that finds an exited thread's live block over its cache's credit keeps it once the
/// walk is over, while a new thread's arrival forgets that exited thread's cache: the block
/// must land in books that are still read (or go back to the system), never in a forgotten
/// cache, where nothing would count or free it.
#[test]
fn reset_spilling_into_a_cache_that_a_new_thread_forgets() {
    model_arena_off_and_on(1 << 20, |alloc, counting| {
        // The exited thread's block, live, with no credit in its cache to keep it idle.
        spawn(alloc, |alloc| block(&alloc, 4096)).join().unwrap();
        // A new thread registers: it forgets exited threads whose caches hold nothing live.
        // (Its block may be taken by the reset: nothing uses it.)
        let newcomer = spawn(alloc, |alloc| block(&alloc, 64));
        // SAFETY: nothing handed out before this reset, or during it, is used after it.
        unsafe { alloc.reset_unchecked() };
        newcomer.join().unwrap();
        check_books(alloc, &alloc.stats(), counting);
        // SAFETY: quiet now; nothing is used after.
        unsafe { alloc.reset_unchecked() };
    });
}

/// A trim races a reset and the owner's first allocation after it (the owner resets, then
/// allocates: the block is live until the next reset). The trim may take an arena's chunk
/// only while the arena is strictly behind the allocator's epoch; a trim that read the epoch
/// before the reset and then saw the rewound arena once freed the chunk under the new block.
#[test]
fn trim_racing_a_reset_never_frees_a_current_chunk() {
    model(1 << 20, 1024, |alloc, counting| {
        let owner = spawn(alloc, move |alloc| {
            round_trip(&alloc, 256); // the arena takes its chunk
                                     // SAFETY: nothing handed out before this reset is used after it.
            unsafe { alloc.reset_unchecked() };
            block(&alloc, 256)
        });
        alloc.trim(0);
        let p = owner.join().unwrap();
        assert!(
            counting.holds(p, 256),
            "the trim gave the chunk of a live block back to the system"
        );
        tag(p, 256, 7);
        let s = alloc.stats();
        assert_eq!(s.live_blocks, 1, "{s:?}");
        check_books(alloc, &s, counting);
        alloc.free_cached();
        assert!(
            counting.holds(p, 256),
            "free_cached freed a live block's chunk"
        );
        assert!(tagged(p, 256, 7));
        // SAFETY: released once; nothing uses it after.
        unsafe { release_at(alloc, p) }.unwrap();
    });
}

/// A trim on one thread races the first call of an owner whose arena a reset left behind: the
/// two race for the chunk's claim (one CAS each, from the same stale epoch). Whichever wins,
/// the owner's new block lies in memory the allocator holds, nobody else is handed its bytes,
/// and the books balance: a trim that won moved the chunk to the idle blocks and the owner's
/// rewind let go of it without touching it; an owner that won keeps it, and the trim leaves
/// it. A second owner allocates and tags a block of its own meanwhile.
#[test]
fn trim_and_owner_race_for_a_stale_chunk() {
    model(1 << 20, 1024, |alloc, counting| {
        let (ready, started) = loom::sync::mpsc::channel();
        let (reset, after_reset) = loom::sync::mpsc::channel();
        let owner = spawn(alloc, move |alloc| {
            round_trip(&alloc, 256); // the arena takes its chunk
            ready.send(()).unwrap();
            // The arena is behind from the reset until this call.
            after_reset.recv().unwrap();
            block(&alloc, 256)
        });
        started.recv().unwrap();
        // SAFETY: nothing handed out before this reset is used after it (the owner's first
        // block was released).
        unsafe { alloc.reset_unchecked() };
        reset.send(()).unwrap();
        let trimmer = spawn(alloc, |alloc| alloc.free_cached());
        let p = owner.join().unwrap();
        tag(p, 256, 5);
        trimmer.join().unwrap();
        assert!(
            counting.holds(p, 256),
            "a trim gave a live block's chunk back to the system"
        );
        assert!(tagged(p, 256, 5));
        let s = alloc.stats();
        assert_eq!(s.live_blocks, 1, "{s:?}");
        check_books(alloc, &s, counting);
        // SAFETY: released once; nothing uses it after.
        unsafe { release_at(alloc, p) }.unwrap();
    });
}

/// A release from another thread races a reset on the owner's thread; the owner then bumps
/// a new block, hands it on, and exits; a new thread registers, which forgets exited threads
/// whose caches hold nothing live. A release that went stale during the reset (its record
/// found before it, marked after the owner's rewind) must not count against the new block:
/// the exited owner's cache must stay, with its chunk, while that block is live.
///
/// The released block is the arena's second, so no block of the new interval has its address:
/// a release that *begins* after the reset and finds a new block at its pointer's address
/// would release that block, which no pointer-based API can tell apart from a valid release;
/// the contract rules it out (nothing handed out before a reset is used after it).
#[test]
fn foreign_release_racing_a_reset_then_the_owner_exits() {
    model(1 << 20, 1024, |alloc, counting| {
        let (handed, received) = loom::sync::mpsc::channel();
        let releaser = spawn(alloc, move |alloc| {
            let b1 = received.recv().unwrap();
            // Nothing writes to `b1`: the reset may take it at any moment.
            // SAFETY: `b1` was handed to this thread; nothing uses it after.
            match unsafe { release_at(&alloc, b1) } {
                Ok(()) | Err(AllocError::UnknownPointer { .. }) => {}
                Err(e) => panic!("release racing a reset: {e}"),
            }
        });
        let owner = spawn(alloc, move |alloc| {
            let _b0 = block(&alloc, 256);
            handed.send(block(&alloc, 256)).unwrap();
            // SAFETY: nothing handed out before this reset is used after it (`b1`'s release
            // is checked and writes nothing).
            unsafe { alloc.reset_unchecked() };
            let b2 = block(&alloc, 64);
            tag(b2, 64, 9);
            b2
        });
        let b2 = owner.join().unwrap();
        releaser.join().unwrap();
        // A new thread registers: exited threads' caches that hold nothing live are forgotten.
        spawn(alloc, |alloc| round_trip(&alloc, 64)).join().unwrap();
        let s = alloc.stats();
        assert_eq!(s.live_blocks, 1, "the exited owner's live block: {s:?}");
        alloc.free_cached();
        assert!(
            counting.holds(b2, 64),
            "a live block's chunk went back to the system"
        );
        assert!(tagged(b2, 64, 9), "a live block was overwritten");
        check_books(alloc, &alloc.stats(), counting);
        // SAFETY: released once; nothing uses it after.
        unsafe { release_at(alloc, b2) }.unwrap();
    });
}

/// The adaptive arena of the default configuration: once a reset showed that a call fits a
/// chunk, a block above `arena_max_bytes` is bumped through the owner's arena. Released on
/// another thread while the owner keeps allocating, it is applied once, never handed out
/// over a live block, and the books balance.
#[test]
fn adaptive_large_block_released_on_another_thread() {
    model(1 << 20, 1024, |alloc, counting| {
        // The first call's large block comes from its class; the reset lets the arena take
        // the next call's.
        let first = block(alloc, 2048);
        tag(first, 2048, 1);
        // SAFETY: `first` is not used after the reset.
        unsafe { alloc.reset_unchecked() };
        let a = block(alloc, 2048);
        tag(a, 2048, 2);
        assert_eq!(
            alloc.stats().arena_live_blocks,
            1,
            "the arena took the large block"
        );
        let releaser = spawn(alloc, move |alloc| {
            // SAFETY: `a` was handed to this thread; nothing uses it after.
            unsafe { release_at(&alloc, a) }
        });
        let b = block(alloc, 2048);
        tag(b, 2048, 3);
        assert_ne!(b, a, "a block was handed out over a live one");
        assert_eq!(releaser.join().unwrap(), Ok(()));
        assert!(tagged(b, 2048, 3));
        let s = alloc.stats();
        assert_eq!(s.live_blocks, 1, "{s:?}");
        check_books(alloc, &s, counting);
        // SAFETY: released once, not used after.
        unsafe { release_at(alloc, b) }.unwrap();
    });
}
