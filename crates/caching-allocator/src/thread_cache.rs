//! Per-thread caches: the fast path, and how a thread finds its own cache.
//!
//! Each thread that uses an allocator gets a `ThreadCache` of its own. Its lock is taken by its
//! thread on every call and by other threads only on slow paths (trim, reset, stealing idle
//! blocks, releasing a block allocated elsewhere), so in steady state it is never contended.

use core::cell::{Cell, RefCell};

#[cfg(not(loom))]
use crate::biased_lock::{BiasedGuard, BiasedLock};
use crate::block::{Block, IdleLists};
use crate::live_table::LiveTable;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
use crate::sync::{SpinGuard, SpinLock};

/// The lock of a thread cache: biased towards its thread (see `biased_lock`). Under loom, a
/// plain lock: loom cannot model the asymmetric barrier, and the rest of the logic is the same.
#[cfg(not(loom))]
type CacheLock = BiasedLock<CacheState>;
/// Access to a locked thread cache.
#[cfg(not(loom))]
pub(crate) type CacheGuard<'a> = BiasedGuard<'a, CacheState>;
#[cfg(loom)]
type CacheLock = SpinLock<CacheState>;
/// Access to a locked thread cache.
#[cfg(loom)]
pub(crate) type CacheGuard<'a> = SpinGuard<'a, CacheState>;

/// One thread's cache in one allocator.
pub(crate) struct ThreadCache {
    state: CacheLock,
    /// Whether one thread owns this cache (and may take the lock's owner path). The allocator's
    /// fallback cache, used by threads whose thread-locals are gone, is shared.
    owned: bool,
    /// Set when the allocator is dropped, so threads forget their entry.
    closed: AtomicBool,
    /// How many idle blocks the cache held when last unlocked: lets other threads skip empty
    /// caches without locking them (a foreign lock costs a heavy barrier). Only a hint: a stale
    /// value costs a wasted lock or a missed steal, never a wrong result.
    idle_hint: AtomicUsize,
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

/// A live block handed out by `allocate` or the `Allocator` trait, and the size asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Live {
    pub(crate) block: Block,
    pub(crate) requested: usize,
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
    pub(crate) misses: u64,
    pub(crate) live_bytes: usize,
    pub(crate) live_blocks: usize,
    pub(crate) requested_bytes: usize,
    pub(crate) peak_live_bytes: usize,
}

/// What a thread cache's lock protects.
pub(crate) struct CacheState {
    /// Idle blocks kept for this thread.
    pub(crate) idle: IdleLists,
    /// Bytes of the allocator's cap reserved for `idle`: `idle.bytes() <= credit` always, so a
    /// release that fits needs no shared lock to respect the global cap.
    pub(crate) credit: usize,
    /// Blocks handed out by `allocate` on this thread, by address.
    pub(crate) live: LiveTable,
    /// Reused by `reset` to collect blocks without allocating.
    pub(crate) returning: Vec<Live>,
    /// Blocks handed out to scopes on this thread, newest last.
    pub(crate) scoped: Vec<Scoped>,
    pub(crate) counters: Counters,
}

impl Counters {
    #[inline]
    pub(crate) fn add_live(&mut self, live: &Live) {
        self.live_bytes += live.block.size();
        self.live_blocks += 1;
        self.requested_bytes += live.requested;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
    }

    #[inline]
    pub(crate) fn remove_live(&mut self, live: &Live) {
        self.live_bytes -= live.block.size();
        self.live_blocks -= 1;
        self.requested_bytes -= live.requested;
    }
}

impl ThreadCache {
    pub(crate) fn new(owned: bool) -> Self {
        ThreadCache {
            owned,
            state: CacheLock::new(CacheState {
                idle: IdleLists::new(),
                credit: 0,
                live: LiveTable::new(),
                returning: Vec::new(),
                scoped: Vec::new(),
                counters: Counters::default(),
            }),
            closed: AtomicBool::new(false),
            idle_hint: AtomicUsize::new(0),
            exited: AtomicBool::new(false),
            open_scopes: AtomicUsize::new(0),
            scope_serial: AtomicU64::new(0),
        }
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

    /// Counts a scope opened on this cache (by the calling thread) and returns its id, unique
    /// among the scopes of this cache.
    #[inline]
    pub(crate) fn scope_opened(&self) -> u64 {
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

    /// Counts a scope closed on this cache (by the thread that opened it).
    #[inline]
    pub(crate) fn scope_closed(&self) {
        if self.owned {
            let n = self.open_scopes.load(Ordering::Relaxed);
            self.open_scopes.store(n - 1, Ordering::Release);
        } else {
            self.open_scopes.fetch_sub(1, Ordering::Release);
        }
    }

    /// Records how many idle blocks `state` (this cache's, locked) holds, for `idle_hint`.
    #[inline]
    pub(crate) fn publish(&self, state: &CacheState) {
        self.idle_hint.store(state.idle.blocks(), Ordering::Relaxed);
    }

    /// Whether the cache may hold idle blocks (see `idle_hint`).
    #[inline]
    pub(crate) fn may_have_idle(&self) -> bool {
        self.idle_hint.load(Ordering::Relaxed) > 0
    }

    /// Locks from this cache's own thread: no atomic read-modify-write in the common case.
    ///
    /// # Safety
    /// The calling thread is the one this cache was made for (the cache came from
    /// `CachingAllocator::thread_cache` on this thread), and it holds no guard of this cache.
    #[inline]
    pub(crate) unsafe fn lock_local(&self) -> CacheGuard<'_> {
        #[cfg(not(loom))]
        if self.owned {
            // SAFETY: the caller is the owner thread and holds no guard; `owned` caches are
            // reached through `lock_local` by that thread only.
            return unsafe { self.state.lock_as_owner() };
        }
        self.state.lock()
    }

    /// Locks from any thread.
    pub(crate) fn lock(&self) -> CacheGuard<'_> {
        self.state.lock()
    }

    /// Locks when no other thread is inside a call on the allocator (`&mut self`, or
    /// `reset_unchecked`'s contract): skips the barrier the owner protocol needs.
    pub(crate) fn lock_exclusive(&self) -> CacheGuard<'_> {
        #[cfg(not(loom))]
        return self.state.lock_exclusive();
        #[cfg(loom)]
        return self.state.lock();
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// This thread's caches, one per allocator it has used; dropped when the thread exits.
struct OwnedCaches(Vec<(u64, Arc<ThreadCache>)>);

impl Drop for OwnedCaches {
    fn drop(&mut self) {
        // Forget the fast-path pointer first: the registry may free an orphaned cache on the
        // next `reset(&mut self)`, and a TLS destructor running later must not reach it.
        // `try_with`: under loom, thread-locals are destroyed in no fixed order and `LAST` may be
        // gone already (then nobody can read it either). With `std`, `LAST` needs no destructor
        // and is always there.
        let _ = LAST.try_with(|last| last.set((0, core::ptr::null())));
        for (_, cache) in &self.0 {
            cache.exited.store(true, Ordering::Release);
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    /// The allocator id and cache this thread used last: the fast path's one comparison.
    static LAST: Cell<(u64, *const ThreadCache)> = const { Cell::new((0, core::ptr::null())) };
    /// Every cache this thread owns; keeps them alive as long as the thread is.
    static OWNED: RefCell<OwnedCaches> = const { RefCell::new(OwnedCaches(Vec::new())) };
}

// Under loom every model thread runs on one OS thread, so `std` thread-locals would be shared by
// all of them: use loom's, which are per model thread. Loom's macro does not take `const { .. }`
// initialisers, so the same two locals are declared again, initialised lazily.
#[cfg(loom)]
loom::thread_local! {
    /// The allocator id and cache this thread used last: the fast path's one comparison.
    static LAST: Cell<(u64, *const ThreadCache)> = Cell::new((0, core::ptr::null()));
    /// Every cache this thread owns; keeps them alive as long as the thread is.
    static OWNED: RefCell<OwnedCaches> = RefCell::new(OwnedCaches(Vec::new()));
}

/// The cache this thread last used, if it belongs to allocator `id`.
#[inline]
pub(crate) fn last_cache(id: u64) -> Option<*const ThreadCache> {
    match LAST.try_with(Cell::get) {
        Ok((last_id, cache)) if last_id == id => Some(cache),
        _ => None,
    }
}

/// Finds or creates this thread's cache for allocator `id`. `register` is called with a new
/// cache so the allocator can reach it. `None` once the thread's locals are gone (thread exit).
pub(crate) fn find_or_create(
    id: u64,
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
                    let cache = Arc::new(ThreadCache::new(true));
                    register(&cache);
                    let ptr = Arc::as_ptr(&cache);
                    owned.0.push((id, cache));
                    ptr
                }
            };
            LAST.with(|last| last.set((id, cache)));
            cache
        })
        .ok()
}
