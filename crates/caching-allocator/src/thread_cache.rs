//! Per-thread caches: the fast path, and how a thread finds its own cache.
//!
//! Each thread that uses an allocator gets a `ThreadCache` of its own. Its lock is taken by its
//! thread on every call and by other threads only on slow paths (trim, reset, stealing idle
//! blocks, releasing a block allocated elsewhere, evicting for the cap), so in steady state it
//! is never contended: a lock costs one uncontended atomic swap.

use core::cell::{Cell, RefCell};

use core::marker::PhantomData;
use core::ops::Deref;

use crate::arena::ArenaCell;
use crate::block::{Block, IdleLists, Live};
use crate::live_table::LiveTable;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Ordering, SpinGuard, SpinLock};

/// Access to a locked thread cache.
pub(crate) type CacheGuard<'a> = SpinGuard<'a, CacheState>;

/// One thread's cache in one allocator.
pub(crate) struct ThreadCache {
    state: SpinLock<CacheState>,
    /// The temp arena: its owner's bump allocator for small blocks (see `arena`). Only an
    /// owned cache's thread uses it.
    pub(crate) arena: ArenaCell,
    /// How many caches of the allocator have `live_hint` set: a reset with none skips its walk.
    live_caches: Arc<AtomicUsize>,
    /// Whether one thread owns this cache (and alone opens scopes on it). The allocator's
    /// fallback cache, used by threads whose thread-locals are gone, is shared.
    owned: bool,
    /// Set when the allocator is dropped, so threads forget their entry.
    closed: AtomicBool,
    /// How many idle blocks the cache held when last unlocked: lets other threads skip empty
    /// caches without locking them (and without bouncing their lock's cache line). Only a
    /// hint: a stale value costs a wasted lock or a missed steal, never a wrong result.
    idle_hint: AtomicUsize,
    /// Whether the cache may hold blocks from `allocate`, so a reset skips caches with nothing
    /// to take back (the fallback cache, threads that only use scopes or the arena). Set (with
    /// `Release`) at the unlock that follows the first booking, read with `Acquire`: a block
    /// booked before a reset began (in happens-before order) is seen. Cleared only by a reset
    /// that finds the table empty (or when the cache is forgotten), not each time the table
    /// empties: a runtime that takes a large block every kernel call then pays no
    /// read-modify-write of `live_caches` per call. A stale `true` costs a reset one visit.
    live_hint: AtomicBool,
    /// The thread exited (its thread-locals were dropped): nobody takes the fast path of this
    /// cache any more, and once it holds no live block and no open scope it can be forgotten.
    exited: AtomicBool,
    /// Scopes open on this cache. Written by the owner with plain load and store (it alone
    /// opens scopes on an owned cache); read by other threads only once `exited` is set, which
    /// the owner sets after every scope it opened, so they see the final count.
    open_scopes: AtomicUsize,
    /// Numbers the scopes opened on this cache, so each scope finds its own blocks among the
    /// cache's scoped blocks. Written like `open_scopes`.
    scope_serial: AtomicU64,
}

/// A live block that belongs to a `Scope`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scoped {
    pub(crate) scope: u64,
    pub(crate) live: Live,
}

/// Counters of one thread cache; summed by `stats`.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct Counters {
    pub(crate) hits: u64,
    /// Hits served by a block of a larger class (best fit).
    pub(crate) oversize_hits: u64,
    pub(crate) misses: u64,
    pub(crate) live_bytes: usize,
    pub(crate) live_blocks: usize,
    pub(crate) requested_bytes: usize,
    pub(crate) peak_live_bytes: usize,
    /// The allocator epoch (reset interval) `interval_peak` belongs to, the most live bytes in
    /// it, and in the interval before it.
    pub(crate) interval_epoch: usize,
    pub(crate) interval_peak: usize,
    pub(crate) last_interval_peak: usize,
    /// The most bytes requested by live blocks at once: the working set as the runtime sees
    /// it (`working_set` budgets from it, so best fit's larger blocks do not raise the budget).
    pub(crate) peak_requested_bytes: usize,
}

/// What a thread cache's lock protects.
pub(crate) struct CacheState {
    /// Idle blocks kept for this thread.
    pub(crate) idle: IdleLists,
    /// The chunk the arena bumps through, if it has one. Only the owner thread sets or takes
    /// it (or anyone, once the owner exited and the arena holds nothing live).
    pub(crate) arena_chunk: Option<Block>,
    /// The thread's spare scope chunk, if it has one: lent without a lock to the first scope
    /// that needs a chunk (see `Arena::lend_spare`), and charged to the credit like the
    /// arena's chunk. Only the owner thread sets or takes it (or anyone, once it exited).
    pub(crate) scope_chunk: Option<Block>,
    /// Bytes of the allocator's cap reserved for `idle` and the arena's chunk:
    /// `held() <= credit` always, so a release that fits needs no shared lock to respect the
    /// global cap.
    pub(crate) credit: usize,
    /// Blocks handed out by `allocate` on this thread, by address.
    pub(crate) live: LiveTable,
    /// Reused by `reset` to collect blocks without allocating.
    pub(crate) returning: Vec<Live>,
    /// Blocks handed out to scopes on this thread, newest last.
    pub(crate) scoped: Vec<Scoped>,
    pub(crate) counters: Counters,
    /// The eviction clock's tick when this cache last stamped an idle block, and how many it
    /// stamped in that tick: together they order this cache's blocks (see `eviction`).
    pub(crate) stamp_tick: u64,
    pub(crate) stamp_seq: u64,
    /// Set (under this lock) when the registry forgets the cache: nothing reads its books any
    /// more, so no block may come into them (a caller holding an `Arc` of it, such as a reset
    /// keeping a spilled block, checks this first).
    pub(crate) forgotten: bool,
}

impl CacheState {
    /// Bytes charged to the cache's credit: idle blocks, the arena's chunk and the spare scope
    /// chunk.
    #[inline]
    pub(crate) fn held(&self) -> usize {
        self.idle.bytes() + self.chunk_bytes()
    }

    /// Bytes of the arena's chunk and the spare scope chunk: held, whether in use or not.
    #[inline]
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.arena_chunk.map_or(0, |c| c.size()) + self.scope_chunk.map_or(0, |c| c.size())
    }
}

impl Counters {
    /// Counts a block handed out in reset interval `epoch`.
    #[inline]
    pub(crate) fn add_live(&mut self, live: &Live, epoch: usize) {
        self.live_bytes += live.block.size();
        self.live_blocks += 1;
        self.requested_bytes += live.requested;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        self.peak_requested_bytes = self.peak_requested_bytes.max(self.requested_bytes);
        if self.interval_epoch != epoch {
            self.last_interval_peak = self.interval(epoch).1;
            self.interval_epoch = epoch;
            self.interval_peak = 0;
        }
        self.interval_peak = self.interval_peak.max(self.live_bytes);
    }

    /// The peak of live bytes in interval `epoch` (the current one) and in the one before.
    pub(crate) fn interval(&self, epoch: usize) -> (usize, usize) {
        if epoch == self.interval_epoch {
            (self.interval_peak, self.last_interval_peak)
        } else if epoch == self.interval_epoch.wrapping_add(1) {
            (0, self.interval_peak)
        } else {
            (0, 0)
        }
    }

    #[inline]
    pub(crate) fn remove_live(&mut self, live: &Live) {
        self.live_bytes -= live.block.size();
        self.live_blocks -= 1;
        self.requested_bytes -= live.requested;
    }
}

impl ThreadCache {
    /// A new cache. Every cache lives in an `Arc` (what [`Local::to_arc`] relies on).
    pub(crate) fn new_arc(owned: bool, live_caches: Arc<AtomicUsize>) -> Arc<Self> {
        Arc::new(ThreadCache {
            owned,
            arena: ArenaCell::new(owned),
            live_caches,
            state: SpinLock::new(CacheState {
                idle: IdleLists::new(),
                arena_chunk: None,
                scope_chunk: None,
                credit: 0,
                live: LiveTable::new(),
                returning: Vec::new(),
                scoped: Vec::new(),
                counters: Counters::default(),
                stamp_tick: 0,
                stamp_seq: 0,
                forgotten: false,
            }),
            closed: AtomicBool::new(false),
            idle_hint: AtomicUsize::new(0),
            live_hint: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            open_scopes: AtomicUsize::new(0),
            scope_serial: AtomicU64::new(0),
        })
    }

    /// Whether one thread owns this cache (and alone uses its arena).
    #[inline(always)]
    pub(crate) fn owned(&self) -> bool {
        self.owned
    }

    /// Whether this cache's thread has exited.
    pub(crate) fn has_exited(&self) -> bool {
        self.exited.load(Ordering::Acquire)
    }

    /// Whether the cache can be forgotten: its thread exited, and nothing refers to it but the
    /// registry (no open scope, no live block; the caller checks the blocks under the lock).
    pub(crate) fn forgettable(&self) -> bool {
        self.has_exited() && self.open_scopes.load(Ordering::Acquire) == 0
    }

    /// Counts a scope opened on this cache and returns its id, unique among the scopes of this
    /// cache. Only through [`Local`]: the owner path needs the cache's own thread.
    #[inline]
    fn scope_opened(&self) -> u64 {
        if self.owned {
            // Only the owner thread opens scopes on an owned cache: no read-modify-write needed.
            let n = self.open_scopes.load(Ordering::Relaxed);
            self.open_scopes.store(n + 1, Ordering::Relaxed);
            let id = self.scope_serial.load(Ordering::Relaxed) + 1;
            self.scope_serial.store(id, Ordering::Relaxed);
            id
        } else {
            self.open_scopes.fetch_add(1, Ordering::Relaxed);
            self.scope_serial.fetch_add(1, Ordering::Relaxed) + 1
        }
    }

    /// Counts a scope closed on this cache. Only through [`Local`], as `scope_opened`.
    #[inline]
    fn scope_closed(&self) {
        if self.owned {
            let n = self.open_scopes.load(Ordering::Relaxed);
            self.open_scopes.store(n - 1, Ordering::Release);
        } else {
            self.open_scopes.fetch_sub(1, Ordering::Release);
        }
    }

    /// Records how many idle blocks `state` (this cache's, locked) holds, for `idle_hint`,
    /// and whether it holds live ones, for `live_hint`. Called before every unlock that
    /// follows a change of either.
    #[inline]
    pub(crate) fn publish(&self, state: &CacheState) {
        // The cap's invariant: what a cache holds idle (and its chunks) is covered by the
        // credit it was granted, so the sum over caches stays within `max_cached_bytes`.
        debug_assert!(
            state.held() <= state.credit,
            "a cache holds {} B on a credit of {} B",
            state.held(),
            state.credit
        );
        self.idle_hint.store(state.idle.blocks(), Ordering::Relaxed);
        // `live_hint` is written under this cache's lock only, so this load is exact.
        if !state.live.is_empty() && !self.live_hint.load(Ordering::Relaxed) {
            self.live_hint.store(true, Ordering::Release);
            // Counted before the unlock: a reset that begins after this call returns sees it.
            self.live_caches.fetch_add(1, Ordering::Release);
        }
    }

    /// Clears `live_hint` if the cache's table (of `state`, locked) is empty: a reset found it
    /// so, or the cache is being forgotten.
    pub(crate) fn clear_live_hint(&self, state: &CacheState) {
        if state.live.is_empty() && self.live_hint.load(Ordering::Relaxed) {
            self.live_hint.store(false, Ordering::Release);
            self.live_caches.fetch_sub(1, Ordering::Release);
        }
    }

    /// Whether the cache may hold blocks from `allocate` (see `live_hint`).
    #[inline]
    pub(crate) fn may_have_live(&self) -> bool {
        self.live_hint.load(Ordering::Acquire)
    }

    /// Whether the cache may hold idle blocks (see `idle_hint`).
    #[inline]
    pub(crate) fn may_have_idle(&self) -> bool {
        self.idle_hint.load(Ordering::Relaxed) > 0
    }

    /// Locks the cache, from any thread.
    #[inline]
    pub(crate) fn lock(&self) -> CacheGuard<'_> {
        self.state.lock()
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// The calling thread's own cache: a handle that cannot leave the thread (it is not `Send`),
/// so the methods that rely on running on the cache's thread need no `unsafe` contract.
///
/// It keeps the raw pointer `Arc::as_ptr` gave (which may reach the whole `Arc` allocation,
/// reference counts included), so it can make another `Arc` of the cache.
#[derive(Clone, Copy)]
pub(crate) struct Local<'a> {
    cache: *const ThreadCache,
    _borrow: PhantomData<&'a ThreadCache>,
}

impl<'a> Local<'a> {
    /// # Safety
    /// `cache` came from `Arc::as_ptr` of an `Arc` that stays alive for `'a`, and is the
    /// calling thread's own cache (or a shared one, `owned == false`).
    #[inline]
    pub(crate) unsafe fn new(cache: *const ThreadCache) -> Self {
        Local {
            cache,
            _borrow: PhantomData,
        }
    }

    /// The cache, for what any thread may do with it.
    #[inline]
    pub(crate) fn cache(self) -> &'a ThreadCache {
        // SAFETY: `new`'s contract: the cache is alive for `'a`.
        unsafe { &*self.cache }
    }

    /// Another `Arc` of this cache (for the block directory's entries).
    pub(crate) fn to_arc(self) -> Arc<ThreadCache> {
        // SAFETY: `new`'s contract: the pointer came from `Arc::as_ptr` of an `Arc` alive now,
        // so adding a strong count and taking ownership of it is `Arc::clone`.
        unsafe {
            Arc::increment_strong_count(self.cache);
            Arc::from_raw(self.cache)
        }
    }

    /// Counts a scope opened by this thread and returns its id.
    #[inline]
    pub(crate) fn scope_opened(self) -> u64 {
        self.cache().scope_opened()
    }

    /// Counts a scope closed by this thread.
    #[inline]
    pub(crate) fn scope_closed(self) {
        self.cache().scope_closed()
    }
}

impl<'a> Deref for Local<'a> {
    type Target = ThreadCache;
    #[inline]
    fn deref(&self) -> &ThreadCache {
        self.cache()
    }
}

/// This thread's caches, one per allocator it has used; dropped when the thread exits.
struct OwnedCaches(Vec<(u64, Arc<ThreadCache>)>);

impl Drop for OwnedCaches {
    fn drop(&mut self) {
        // Forget the fast-path pointers first: the registry may free an orphaned cache on the
        // next `reset(&mut self)`, and a TLS destructor running later must not reach it.
        // `try_with`: under loom, thread-locals are destroyed in no fixed order and `RECENT` may
        // be gone already (then nobody can read it either). With `std`, `RECENT` needs no
        // destructor and is always there.
        let _ = RECENT.try_with(|recent| {
            for slot in recent {
                slot.set((0, core::ptr::null()));
            }
        });
        for (_, cache) in &self.0 {
            cache.exited.store(true, Ordering::Release);
        }
    }
}

/// How many allocators a thread remembers (see [`RECENT`]).
const RECENT_LEN: usize = 4;

/// A remembered (allocator id, cache) pair; id 0 (no allocator has it) is an empty slot.
type Remembered = (u64, *const ThreadCache);

/// An empty [`RECENT`] table.
#[allow(clippy::declare_interior_mutable_const)] // each use makes a new table, as intended
const NONE_RECENT: [Cell<Remembered>; RECENT_LEN] =
    [const { Cell::new((0, core::ptr::null())) }; RECENT_LEN];

#[cfg(not(loom))]
thread_local! {
    /// The allocators this thread used lately and their caches; a new one goes first. Slot 0
    /// is the fast path's one comparison; a thread that alternates between two allocators (a
    /// temp one and a persistent one, two modules on one worker) finds the other's cache in
    /// slot 1 with one more comparison and load, and a few more in the next slots, all
    /// without the search of `OWNED`.
    static RECENT: [Cell<Remembered>; RECENT_LEN] = const { NONE_RECENT };
    /// Every cache this thread owns; keeps them alive as long as the thread is.
    static OWNED: RefCell<OwnedCaches> = const { RefCell::new(OwnedCaches(Vec::new())) };
}

// Under loom every model thread runs on one OS thread, so `std` thread-locals would be shared by
// all of them: use loom's, which are per model thread. Loom's macro does not take `const { .. }`
// initialisers, so the same two locals are declared again, initialised lazily.
#[cfg(loom)]
loom::thread_local! {
    /// The allocators this thread used lately and their caches (see the `std` declaration).
    static RECENT: [Cell<Remembered>; RECENT_LEN] = NONE_RECENT;
    /// Every cache this thread owns; keeps them alive as long as the thread is.
    static OWNED: RefCell<OwnedCaches> = RefCell::new(OwnedCaches(Vec::new()));
}

/// This thread's cache of allocator `id`, if the thread used it lately: the first slot's in
/// one comparison, the second's in one more without reordering the table (two allocators in
/// turn), the others' moved to the front.
#[inline]
pub(crate) fn last_cache(id: u64) -> Option<*const ThreadCache> {
    // With `std` the table needs no destructor, so `try_with` does not fail (under loom it may
    // in a thread-local destructor; then nothing is found, as after the table's clear).
    let found = RECENT.try_with(|recent| {
        let (last_id, cache) = recent[0].get();
        if last_id == id {
            return Some(cache);
        }
        second_slot(recent, id)
    });
    match found {
        Ok(Some(cache)) => Some(cache),
        _ => recent_cache(id),
    }
}

/// [`last_cache`]'s second slot, compared in line: a thread that alternates between two
/// allocators asks for it on every other call (out of line, it cost that thread a call and a
/// return each time). Cold, so the compiler lays it out of the first slot's way and the
/// one-allocator path stays one comparison and one load.
#[cold]
#[inline(always)]
fn second_slot(recent: &[Cell<Remembered>; RECENT_LEN], id: u64) -> Option<*const ThreadCache> {
    let (second_id, cache) = recent[1].get();
    (second_id == id).then_some(cache)
}

/// [`last_cache`] past its first two slots: `id`'s cache among the others, moved to the
/// front.
#[cold]
#[inline(never)]
fn recent_cache(id: u64) -> Option<*const ThreadCache> {
    RECENT
        .try_with(|recent| {
            let i = (2..RECENT_LEN).find(|&i| recent[i].get().0 == id)?;
            let found = recent[i].get();
            move_down(recent, i);
            recent[0].set(found);
            Some(found.1)
        })
        .ok()
        .flatten()
}

/// Moves slots `0..end` down one (slot `end` is overwritten), freeing slot 0.
fn move_down(recent: &[Cell<Remembered>; RECENT_LEN], end: usize) {
    for j in (1..=end).rev() {
        recent[j].set(recent[j - 1].get());
    }
}

/// Makes `(id, cache)` the last used; the others move down, the least recent drops out.
fn remember(id: u64, cache: *const ThreadCache) {
    RECENT.with(|recent| {
        let end = (0..RECENT_LEN)
            .find(|&i| recent[i].get().0 == id)
            .unwrap_or(RECENT_LEN - 1);
        move_down(recent, end);
        recent[0].set((id, cache));
    });
}

/// Finds or creates this thread's cache for allocator `id`. `register` is called with a new
/// cache so the allocator can reach it. `None` once the thread's locals are gone (thread exit).
pub(crate) fn find_or_create(
    id: u64,
    live_caches: &Arc<AtomicUsize>,
    register: impl FnOnce(&Arc<ThreadCache>),
) -> Option<*const ThreadCache> {
    OWNED
        .try_with(|owned| {
            let mut owned = owned.borrow_mut();
            let cache = match owned.0.iter().find(|(i, _)| *i == id) {
                Some((_, cache)) => Arc::as_ptr(cache),
                None => {
                    // Entries of dropped allocators only hold empty caches: forget them.
                    owned
                        .0
                        .retain(|(_, cache)| !cache.closed.load(Ordering::Acquire));
                    let cache = ThreadCache::new_arc(true, live_caches.clone());
                    register(&cache);
                    let ptr = Arc::as_ptr(&cache);
                    owned.0.push((id, cache));
                    ptr
                }
            };
            remember(id, cache);
            cache
        })
        .ok()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The allocator ids in this thread's `RECENT`, first slot first.
    fn recent_ids() -> Vec<u64> {
        RECENT.with(|recent| recent.iter().map(|slot| slot.get().0).collect())
    }

    /// Two allocators used in turn are both found in the table and stay where they are (a
    /// reordering on every other call is what made the second allocator slow); an older one
    /// found further down moves to the front; an unknown id is found nowhere. Ids from the top
    /// of the range: no allocator of this process has them.
    #[test]
    fn two_allocators_in_turn_leave_the_table_in_place() {
        let live_caches = Arc::new(AtomicUsize::new(0));
        let (a, b, c) = (u64::MAX - 1, u64::MAX - 2, u64::MAX - 3);
        let cache_a = find_or_create(a, &live_caches, |_| {}).unwrap();
        let cache_b = find_or_create(b, &live_caches, |_| {}).unwrap();
        assert_ne!(cache_a, cache_b);
        assert_eq!(recent_ids()[..2], [b, a]);
        for _ in 0..3 {
            assert_eq!(last_cache(a), Some(cache_a));
            assert_eq!(
                recent_ids()[..2],
                [b, a],
                "a second-slot hit moved the table"
            );
            assert_eq!(last_cache(b), Some(cache_b));
        }
        let cache_c = find_or_create(c, &live_caches, |_| {}).unwrap();
        assert_eq!(recent_ids()[..3], [c, b, a]);
        assert_eq!(last_cache(a), Some(cache_a));
        assert_eq!(
            recent_ids()[..3],
            [a, c, b],
            "a third-slot hit goes to the front"
        );
        assert_eq!(last_cache(c), Some(cache_c));
        assert_eq!(last_cache(u64::MAX - 9), None);
    }
}
