//! `CachingAllocator`: the data path size class -> thread cache -> shared cache -> system.

use core::alloc::GlobalAlloc;
use core::ptr::NonNull;

use crate::block::{Block, IdleLists, MIN_ALIGN};
use crate::debug::{self, CANARY_LEN};
use crate::shared_cache::SharedCache;
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};
use crate::thread_cache::{self, CacheState, Live, ThreadCache};
use crate::{AllocError, Config, SizeClass, Stats, MAX_ALIGN};

/// Credit is granted in steps of at least this much, so a thread warming up its cache does not
/// take the shared lock for every small block it returns.
const CREDIT_STEP: usize = 64 << 10;

/// A thread-safe caching allocator for kernel scratch memory.
///
/// Blocks come from the system allocator, are rounded to a [`SizeClass`], and when given back
/// (by [`release`](Self::release), by dropping a [`Scope`](crate::Scope), by the
/// `allocator_api2` trait, or all at once by [`reset`](Self::reset)) they stay cached for the
/// next request of their class instead of going back to the system. At most
/// `max_cached_bytes` stay idle; past that the least recently used idle blocks are freed.
///
/// Each thread has its own cache, so a thread that reuses its classes takes no lock any other
/// thread takes in steady state. See the [crate docs](crate) for an example.
pub struct CachingAllocator {
    id: u64,
    config: Config,
    cap: usize,
    limit: usize,
    debug: bool,
    system: Arc<dyn GlobalAlloc + Send + Sync>,
    shared: Mutex<SharedCache>,
    /// Every thread cache, so that reset, trim and stats reach idle threads too.
    registry: Mutex<Vec<Arc<ThreadCache>>>,
    /// The cache of threads whose thread-locals are gone (calls from TLS destructors).
    fallback: Arc<ThreadCache>,
}

/// A validated request: the size and alignment asked for, the class serving it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub(crate) size: usize,
    pub(crate) align: usize,
    /// `None` for zero bytes: such requests touch no memory.
    pub(crate) class: Option<SizeClass>,
}

/// A block found overrun by debug checks, for `reset`'s panic or `try_reset`'s error.
struct Overrun {
    addr: usize,
    requested: usize,
    class_size: usize,
}

static NEXT_ALLOCATOR_ID: AtomicU64 = AtomicU64::new(1);

/// The pointer handed out for zero-byte requests: aligned, non-null, never dereferenced.
#[inline]
pub(crate) fn dangling(align: usize) -> NonNull<u8> {
    let addr = align.max(MIN_ALIGN);
    NonNull::new(core::ptr::without_provenance_mut(addr)).unwrap_or(NonNull::dangling())
}

/// Whether `addr` may be a pointer from [`dangling`].
fn is_dangling(addr: usize) -> bool {
    addr.is_power_of_two() && (MIN_ALIGN..=MAX_ALIGN).contains(&addr)
}

impl CachingAllocator {
    /// An allocator that keeps at most `max_cached_bytes` idle; otherwise the default
    /// [`Config`].
    pub fn new(max_cached_bytes: usize) -> Self {
        Self::with_config(Config::default().max_cached_bytes(max_cached_bytes))
    }

    /// An allocator configured by `config`.
    pub fn with_config(config: Config) -> Self {
        // Under loom thread caches use a plain lock (see `thread_cache::CacheLock`).
        #[cfg(not(loom))]
        crate::biased_lock::init();
        let fallback = Arc::new(ThreadCache::new(false));
        CachingAllocator {
            id: NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed),
            cap: config.max_cached_bytes,
            limit: config.limit_bytes.unwrap_or(usize::MAX),
            debug: config.debug_checks,
            system: config.system.clone(),
            config,
            shared: Mutex::new(SharedCache::new()),
            registry: Mutex::new(vec![fallback.clone()]),
            fallback,
        }
    }

    /// The configuration this allocator was built with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Returns a block of at least `size` bytes aligned to `align`, from the cache if one of
    /// the right class is idle, otherwise from the system.
    ///
    /// The memory is not zeroed (with debug checks it is filled with `0xFF`). It stays valid
    /// until it is given back by [`release`](Self::release) or by a reset. `size == 0` gives
    /// an aligned dangling pointer and touches no memory.
    ///
    /// # Errors
    /// [`AllocError::InvalidAlignment`] unless `align` is a power of two up to [`MAX_ALIGN`];
    /// [`AllocError::SizeOverflow`] if the rounded size exceeds `isize::MAX`;
    /// [`AllocError::LimitExceeded`] past `limit_bytes`; [`AllocError::OutOfMemory`] if the
    /// system refuses even after the idle cache was freed. On error nothing changes.
    #[inline]
    pub fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let req = self.request(size, align)?;
        let Some(class) = req.class else {
            return Ok(dangling(align));
        };
        // SAFETY: `thread_cache` gives this thread's own cache.
        let block = unsafe {
            self.take(self.thread_cache(), class, &req, |state, live| {
                state.live.insert(live);
            })
        }?;
        Ok(block.ptr)
    }

    /// Gives one block from [`allocate`](Self::allocate) back to the cache.
    ///
    /// The allocator checks the pointer against its own books without reading the memory
    /// behind it, so passing a wrong pointer is an error, not undefined behaviour.
    ///
    /// # Errors
    /// [`AllocError::UnknownPointer`] if `ptr` is not live in this allocator (never handed out
    /// by it, already released, owned by a `Scope`, or taken back by a reset): nothing changes.
    /// [`AllocError::Corrupted`] with debug checks on, if the canary behind the block was
    /// overwritten: the block goes back to the system and is never reused.
    ///
    /// # Safety
    /// If `ptr` is live in this allocator, nothing may use the memory behind it after this call
    /// (until `allocate` hands it out again).
    pub unsafe fn release(&self, ptr: NonNull<u8>) -> Result<(), AllocError> {
        let here = self.thread_cache();
        let addr = ptr.as_ptr().addr();
        // SAFETY: `thread_cache` gives this thread's own cache, and we hold no guard of it.
        let mut state = unsafe { here.lock_local() };
        if let Some(live) = state.live.remove(addr) {
            state.counters.remove_live(&live);
            let result = self.retire(&mut state, live);
            here.publish(&state);
            return result;
        }
        drop(state);
        self.release_elsewhere(here, addr)
    }

    /// Every live block, handed out on any thread, goes back to the cache (ExecuTorch's
    /// `reset()`). `&mut self` proves nothing handed out is still in use. Idle bookkeeping of
    /// exited threads is dropped here too.
    ///
    /// # Panics
    /// With debug checks on, if any block was written past its requested end: every other
    /// block is returned first, then the panic names the overrun blocks' sizes and classes.
    pub fn reset(&mut self) {
        let overruns = self.reset_all();
        self.forget_exited_threads();
        report_overruns(&overruns);
    }

    /// Like [`reset`](Self::reset), through a shared reference, as a temp allocator's owner
    /// needs.
    ///
    /// # Safety
    /// No other call on this allocator runs concurrently; no memory handed out before this call
    /// (by `allocate`, the `Allocator` trait or a live `Scope`) is used or released after it;
    /// no `Scope` of this allocator is alive.
    ///
    /// # Panics
    /// As [`reset`](Self::reset).
    pub unsafe fn reset_unchecked(&self) {
        let overruns = self.reset_all();
        report_overruns(&overruns);
    }

    /// Like [`reset`](Self::reset), but an overrun found by debug checks is an error instead of
    /// a panic: every block is still returned (overrun ones to the system), and the error
    /// describes the first overrun block found (`Stats::corrupted_blocks` counts all of them).
    ///
    /// # Errors
    /// [`AllocError::Corrupted`] if debug checks found a block written past its requested end.
    pub fn try_reset(&mut self) -> Result<(), AllocError> {
        let overruns = self.reset_all();
        self.forget_exited_threads();
        first_overrun(&overruns)
    }

    /// [`try_reset`](Self::try_reset) through a shared reference.
    ///
    /// # Errors
    /// As [`try_reset`](Self::try_reset).
    ///
    /// # Safety
    /// As [`reset_unchecked`](Self::reset_unchecked).
    pub unsafe fn try_reset_unchecked(&self) -> Result<(), AllocError> {
        first_overrun(&self.reset_all())
    }

    /// Gives every idle cached block back to the system, in every thread's cache.
    pub fn free_cached(&self) {
        self.trim(0);
    }

    /// Evicts least recently used idle blocks until at most `keep_bytes` stay cached, counted
    /// over every thread's cache. The blocks that stay move to the shared cache.
    pub fn trim(&self, keep_bytes: usize) {
        let registry = lock(&self.registry);
        let cached: usize = registry
            .iter()
            .map(|c| c.lock().idle.bytes())
            .sum::<usize>()
            + lock(&self.shared).idle.bytes();
        if cached <= keep_bytes {
            return;
        }
        for cache in registry.iter() {
            let mut state = cache.lock();
            let mut shared = lock(&self.shared);
            Self::move_to_shared(&mut state, &mut shared);
            cache.publish(&state);
        }
        drop(registry);
        let mut shared = lock(&self.shared);
        while shared.idle.bytes() > keep_bytes {
            let Some(block) = shared.idle.pop_lru() else {
                break;
            };
            self.evict(&mut shared, block);
        }
    }

    /// A snapshot of the allocator's counters, summed over every thread's cache.
    ///
    /// Each cache is read under its own lock, one after the other, so while other threads
    /// allocate the sum is not of one instant. `peak_live_bytes` is exact while one thread
    /// allocates; with several it is the sum of each thread's peak (capped by
    /// `peak_reserved_bytes`), never below the true peak.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        let mut peak_live = 0;
        for cache in lock(&self.registry).iter() {
            let state = cache.lock();
            let c = &state.counters;
            stats.hits += c.hits;
            stats.misses += c.misses;
            stats.live_bytes += c.live_bytes;
            stats.live_blocks += c.live_blocks;
            stats.requested_bytes += c.requested_bytes;
            peak_live += c.peak_live_bytes;
            stats.cached_bytes += state.idle.bytes();
            stats.cached_blocks += state.idle.blocks();
        }
        let shared = lock(&self.shared);
        stats.hits += shared.retired_hits;
        stats.misses += shared.retired_misses;
        peak_live += shared.retired_peak_live;
        stats.cached_bytes += shared.idle.bytes();
        stats.cached_blocks += shared.idle.blocks();
        stats.reserved_bytes = shared.reserved;
        stats.peak_reserved_bytes = shared.peak_reserved;
        stats.peak_live_bytes = peak_live.min(shared.peak_reserved);
        stats.system_allocs = shared.system_allocs;
        stats.system_frees = shared.system_frees;
        stats.evictions = shared.evictions;
        stats.oom_retries = shared.oom_retries;
        stats.corrupted_blocks = shared.corrupted_blocks;
        stats
    }

    /// How many thread caches the allocator keeps: one per thread that has used it, plus one
    /// for calls made while a thread's locals are torn down. The cache of an exited thread is
    /// dropped once it holds no live block: when the next new thread arrives, or at
    /// `reset(&mut self)`. (Not part of [`Stats`]: registering a thread is not a change of
    /// the allocator's blocks, and a failed call may register one.)
    pub fn thread_caches(&self) -> usize {
        lock(&self.registry).len()
    }

    // ---- the data path ------------------------------------------------------------------

    /// Validates a request and finds its class.
    #[inline]
    pub(crate) fn request(&self, size: usize, align: usize) -> Result<Request, AllocError> {
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(AllocError::InvalidAlignment { align });
        }
        if size == 0 {
            return Ok(Request {
                size,
                align,
                class: None,
            });
        }
        let padded = if self.debug {
            size.checked_add(CANARY_LEN)
        } else {
            Some(size)
        };
        // The block's layout must be valid too: its size rounded up to the alignment must
        // not exceed isize::MAX (cheaper to check here than to build the `Layout`).
        let class = padded
            .and_then(SizeClass::for_size)
            .filter(|c| c.size() <= isize::MAX as usize - (align.max(MIN_ALIGN) - 1))
            .ok_or(AllocError::SizeOverflow { size, align })?;
        Ok(Request {
            size,
            align,
            class: Some(class),
        })
    }

    /// This thread's cache in this allocator.
    #[inline]
    pub(crate) fn thread_cache(&self) -> &ThreadCache {
        let cache = match thread_cache::last_cache(self.id) {
            Some(cache) => cache,
            None => self.thread_cache_slow(),
        };
        // SAFETY: the registry holds an `Arc` of every cache until the allocator is dropped or
        // `reset(&mut self)` forgets caches of exited threads; both need `&mut self`, which
        // cannot coexist with the `&self` this reference borrows. A cache of an exited thread
        // is never returned here (its thread cleared `LAST` before orphaning it).
        unsafe { &*cache }
    }

    #[cold]
    fn thread_cache_slow(&self) -> *const ThreadCache {
        thread_cache::find_or_create(self.id, |cache| {
            let mut registry = lock(&self.registry);
            // A new thread: the good moment to forget threads that are gone, so a runtime
            // that spawns threads does not grow the registry without bound.
            self.forget_exited(&mut registry);
            registry.push(cache.clone());
        })
        .unwrap_or(Arc::as_ptr(&self.fallback))
    }

    /// Takes a block of `class` (the class of `req`) through `cache`, records it with `record`
    /// under the cache's lock, and poisons it if debug checks are on.
    ///
    /// # Safety
    /// `cache` is the calling thread's own cache (from `thread_cache` on this thread), and the
    /// thread holds no guard of it.
    #[inline(always)]
    pub(crate) unsafe fn take(
        &self,
        cache: &ThreadCache,
        class: SizeClass,
        req: &Request,
        record: impl FnOnce(&mut CacheState, Live),
    ) -> Result<Block, AllocError> {
        // SAFETY: the caller passes this thread's own cache and holds no guard of it.
        let mut state = unsafe { cache.lock_local() };
        let block = match state.idle.take(class, req.align) {
            Some(block) => {
                state.counters.hits += 1;
                block
            }
            None => {
                drop(state);
                let (block, cached) = self.take_slow(cache, class, req)?;
                // SAFETY: as above; the guard was dropped before the slow path.
                state = unsafe { cache.lock_local() };
                if cached {
                    state.counters.hits += 1;
                } else {
                    state.counters.misses += 1;
                }
                block
            }
        };
        let live = Live {
            block,
            requested: req.size,
        };
        state.counters.add_live(&live);
        record(&mut state, live);
        cache.publish(&state);
        drop(state);
        if self.debug {
            // SAFETY: the block is ours alone and holds `size + CANARY_LEN` bytes (`request`
            // chose the class for that many).
            unsafe { debug::poison(block.ptr, req.size) };
        }
        Ok(block)
    }

    /// A miss in this thread's cache: the shared cache, then other threads' idle blocks, then
    /// the system. Returns the block and whether it came from a cache. Holds no cache lock.
    #[cold]
    fn take_slow(
        &self,
        here: &ThreadCache,
        class: SizeClass,
        req: &Request,
    ) -> Result<(Block, bool), AllocError> {
        if let Some(block) = lock(&self.shared).idle.take(class, req.align) {
            return Ok((block, true));
        }
        if let Some(block) = self.steal(here, class, req.align) {
            return Ok((block, true));
        }
        self.system_alloc(class, req).map(|block| (block, false))
    }

    /// Looks for an idle block of `class` in other threads' caches; on the way, moves the idle
    /// blocks and credit of exited threads to the shared pool.
    fn steal(&self, here: &ThreadCache, class: SizeClass, align: usize) -> Option<Block> {
        let registry = lock(&self.registry);
        let mut found = None;
        for cache in registry.iter() {
            // Our own cache was just searched; empty ones are not worth a heavy barrier.
            if core::ptr::eq(Arc::as_ptr(cache), here) || !cache.may_have_idle() {
                continue;
            }
            let mut state = cache.lock();
            if cache.has_exited() {
                let mut shared = lock(&self.shared);
                Self::move_to_shared(&mut state, &mut shared);
                if found.is_none() {
                    found = shared.idle.take(class, align);
                }
            } else if found.is_none() {
                found = state.idle.take(class, align);
            }
            cache.publish(&state);
        }
        found
    }

    /// Takes a new block from the system, within `limit_bytes`, retrying once after freeing
    /// the idle cache if the system refuses.
    fn system_alloc(&self, class: SizeClass, req: &Request) -> Result<Block, AllocError> {
        let align = req.align.max(MIN_ALIGN);
        let layout = Block::layout_for(class, align).ok_or(AllocError::SizeOverflow {
            size: req.size,
            align: req.align,
        })?;
        self.reserve(class, req)?;
        let mut retried = false;
        loop {
            // SAFETY: `layout` has a non-zero size (every class is at least 64 bytes).
            let ptr = unsafe { self.system.alloc(layout) };
            if let Some(ptr) = NonNull::new(ptr) {
                let mut shared = lock(&self.shared);
                shared.system_allocs += 1;
                // The peak counts bytes really taken: a refused request must not raise it.
                shared.peak_reserved = shared.peak_reserved.max(shared.reserved);
                drop(shared);
                // SAFETY: `ptr` came from the system allocator for exactly this layout.
                return Ok(unsafe { Block::new(ptr, class, align) });
            }
            if !retried && self.idle_blocks() > 0 {
                // As PyTorch's caching allocators do: give the idle cache back, try once more.
                lock(&self.shared).oom_retries += 1;
                self.free_cached();
                retried = true;
                continue;
            }
            lock(&self.shared).reserved -= class.size();
            return Err(AllocError::OutOfMemory {
                size: req.size,
                align: req.align,
            });
        }
    }

    /// How many idle blocks there are, in every cache.
    fn idle_blocks(&self) -> usize {
        let in_threads: usize = lock(&self.registry)
            .iter()
            .map(|c| c.lock().idle.blocks())
            .sum();
        in_threads + lock(&self.shared).idle.blocks()
    }

    /// Counts `class.size()` more bytes as taken from the system, first evicting idle blocks if
    /// the limit needs it.
    fn reserve(&self, class: SizeClass, req: &Request) -> Result<(), AllocError> {
        let size = class.size();
        let fits = |shared: &SharedCache| {
            shared
                .reserved
                .checked_add(size)
                .is_some_and(|total| total <= self.limit)
        };
        let mut shared = lock(&self.shared);
        if !fits(&shared) {
            while !fits(&shared) {
                let Some(block) = shared.idle.pop_lru() else {
                    break;
                };
                self.evict(&mut shared, block);
            }
            if !fits(&shared) {
                drop(shared);
                self.evict_thread_caches_until(|s| fits(s));
                shared = lock(&self.shared);
            }
            if !fits(&shared) {
                return Err(AllocError::LimitExceeded {
                    size: req.size,
                    class_size: size,
                    limit: self.limit,
                    reserved: shared.reserved,
                });
            }
        }
        shared.reserved += size;
        Ok(())
    }

    /// Evicts idle blocks from thread caches, least recently used first in each, until `done`.
    fn evict_thread_caches_until(&self, done: impl Fn(&SharedCache) -> bool) {
        for cache in lock(&self.registry).iter() {
            if !cache.may_have_idle() {
                continue;
            }
            let mut state = cache.lock();
            let mut shared = lock(&self.shared);
            while !done(&shared) {
                let Some(block) = state.idle.pop_lru() else {
                    break;
                };
                self.evict(&mut shared, block);
            }
            cache.publish(&state);
            if done(&shared) {
                return;
            }
        }
    }

    /// Puts a block that came back (with its live bookkeeping already removed) into `state`'s
    /// cache, after checking its canary if debug checks are on.
    #[inline(always)]
    pub(crate) fn retire(&self, state: &mut CacheState, live: Live) -> Result<(), AllocError> {
        if self.debug {
            return self.retire_checked(state, live);
        }
        self.cache_block(state, live.block);
        Ok(())
    }

    /// `retire` with debug checks: an overrun block goes back to the system, never reused.
    #[cold]
    fn retire_checked(&self, state: &mut CacheState, live: Live) -> Result<(), AllocError> {
        // SAFETY: the block came back, so nothing uses it; it holds `requested + CANARY_LEN`
        // initialised bytes since `poison` ran when it was handed out.
        if unsafe { debug::canary_intact(live.block.ptr, live.requested) } {
            self.cache_block(state, live.block);
            return Ok(());
        }
        let mut shared = lock(&self.shared);
        shared.corrupted_blocks += 1;
        self.system_free(&mut shared, live.block);
        Err(AllocError::Corrupted {
            addr: live.block.addr(),
            requested: live.requested,
            class_size: live.block.size(),
        })
    }

    /// Keeps an idle block in a thread cache, within the thread's credit.
    #[inline(always)]
    fn cache_block(&self, state: &mut CacheState, block: Block) {
        if state.idle.bytes() + block.size() <= state.credit {
            state.idle.push(block);
        } else {
            self.cache_block_slow(state, block);
        }
    }

    /// The thread's credit is used up: grow it from the unreserved part of the cap, evicting
    /// the shared cache's least recently used blocks to make room; if other threads hold the
    /// rest of the cap, evict this thread's own least recently used blocks instead.
    #[cold]
    fn cache_block_slow(&self, state: &mut CacheState, block: Block) {
        let mut shared = lock(&self.shared);
        let need = state.idle.bytes() + block.size() - state.credit;
        while shared.unreserved(self.cap) < need {
            let Some(old) = shared.idle.pop_lru() else {
                break;
            };
            self.evict(&mut shared, old);
        }
        let available = shared.unreserved(self.cap);
        let grant = if available >= need {
            need.max(CREDIT_STEP).min(available)
        } else {
            available
        };
        state.credit += grant;
        shared.credit_total += grant;
        if block.size() > state.credit {
            self.evict(&mut shared, block);
            return;
        }
        while state.idle.bytes() + block.size() > state.credit {
            let Some(old) = state.idle.pop_lru() else {
                break;
            };
            self.evict(&mut shared, old);
        }
        state.idle.push(block);
    }

    /// A released pointer is not live in this thread's cache: look in the others (a block may
    /// be released on another thread than the one that allocated it).
    #[cold]
    fn release_elsewhere(&self, here: &ThreadCache, addr: usize) -> Result<(), AllocError> {
        let registry = lock(&self.registry);
        for cache in registry.iter() {
            if core::ptr::eq(Arc::as_ptr(cache), here) {
                continue;
            }
            let mut state = cache.lock();
            if let Some(live) = state.live.remove(addr) {
                state.counters.remove_live(&live);
                drop(state);
                // SAFETY: `here` is this thread's own cache (from `release`), not locked now.
                let mut state = unsafe { here.lock_local() };
                let result = self.retire(&mut state, live);
                here.publish(&state);
                return result;
            }
        }
        if is_dangling(addr) {
            return Ok(());
        }
        Err(AllocError::UnknownPointer { addr })
    }

    /// Moves every idle block of a thread cache to the shared cache and returns its credit.
    fn move_to_shared(state: &mut CacheState, shared: &mut SharedCache) {
        while let Some(block) = state.idle.pop_lru() {
            shared.idle.push(block);
        }
        shared.credit_total -= state.credit;
        state.credit = 0;
    }

    /// Gives a block back to the system because of the cap, the limit or a trim.
    fn evict(&self, shared: &mut SharedCache, block: Block) {
        shared.evictions += 1;
        self.system_free(shared, block);
    }

    fn system_free(&self, shared: &mut SharedCache, block: Block) {
        // SAFETY: blocks are only built from system allocations of exactly `block.layout()`,
        // and every caller passes a block it just removed from the books, so it is freed once.
        unsafe { self.system.dealloc(block.ptr.as_ptr(), block.layout()) };
        shared.reserved -= block.size();
        shared.system_frees += 1;
    }

    /// Returns every live and scoped block of every thread to its thread's cache, then hands
    /// unused credit back. Returns the blocks found overrun (already freed).
    fn reset_all(&self) -> Vec<Overrun> {
        let mut overruns = Vec::new();
        for cache in lock(&self.registry).iter() {
            let mut state = cache.lock_exclusive();
            let state = &mut *state;
            let mut returning = core::mem::take(&mut state.returning);
            state.live.drain_into(&mut returning);
            returning.extend(state.scoped.drain(..).map(|s| s.live));
            for live in returning.drain(..) {
                state.counters.remove_live(&live);
                if let Err(AllocError::Corrupted {
                    addr,
                    requested,
                    class_size,
                }) = self.retire(state, live)
                {
                    overruns.push(Overrun {
                        addr,
                        requested,
                        class_size,
                    });
                }
            }
            state.returning = returning;
            cache.publish(state);
            // Credit nobody uses now goes back to the pool, for threads that need more; one
            // step of slack stays, so the next kernel's releases need no shared lock.
            let surplus = (state.credit - state.idle.bytes()).saturating_sub(CREDIT_STEP);
            if surplus > 0 {
                let mut shared = lock(&self.shared);
                state.credit -= surplus;
                shared.credit_total -= surplus;
            }
        }
        overruns
    }

    /// Drops the caches of exited threads, keeping their idle blocks in the shared cache.
    fn forget_exited_threads(&mut self) {
        self.forget_exited(&mut lock(&self.registry));
    }

    /// Drops from `registry` (locked by the caller) the caches of exited threads that hold no
    /// live block and no open scope, moving their idle blocks and credit to the shared cache and
    /// keeping their counters. Only the registry refers to such a cache any more: its thread
    /// cleared `LAST` before exiting, and other threads reach it only under the registry lock.
    fn forget_exited(&self, registry: &mut Vec<Arc<ThreadCache>>) {
        let mut gone = Vec::new();
        registry.retain(|cache| {
            if !cache.forgettable() {
                return true;
            }
            let mut state = cache.lock();
            if !state.live.is_empty() || !state.scoped.is_empty() {
                return true;
            }
            let idle = core::mem::replace(&mut state.idle, IdleLists::new());
            gone.push((idle, core::mem::take(&mut state.credit), state.counters));
            false
        });
        if gone.is_empty() {
            return;
        }
        // The shared lock comes after every cache lock (the lock order), hence two passes.
        let mut shared = lock(&self.shared);
        for (mut idle, credit, counters) in gone {
            while let Some(block) = idle.pop_lru() {
                shared.idle.push(block);
            }
            shared.credit_total -= credit;
            // Keep the forgotten cache's counters: stats must not go backwards.
            shared.retired_hits += counters.hits;
            shared.retired_misses += counters.misses;
            shared.retired_peak_live += counters.peak_live_bytes;
        }
    }
}

fn first_overrun(overruns: &[Overrun]) -> Result<(), AllocError> {
    match overruns.first() {
        None => Ok(()),
        Some(o) => Err(AllocError::Corrupted {
            addr: o.addr,
            requested: o.requested,
            class_size: o.class_size,
        }),
    }
}

fn report_overruns(overruns: &[Overrun]) {
    if overruns.is_empty() {
        return;
    }
    let list: Vec<String> = overruns
        .iter()
        .map(|o| format!("{} bytes requested (class {})", o.requested, o.class_size))
        .collect();
    panic!(
        "caching-allocator: {} block(s) were written past their requested end: {}; they were \
         given back to the system and every other block was returned to the cache",
        overruns.len(),
        list.join(", ")
    );
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        let mut blocks = Vec::new();
        for cache in self
            .registry
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            // Threads may still hold an `Arc` of this cache in their thread-locals; `closed`
            // tells them to forget it. They never lock it again: that needs `&self`.
            cache.close();
            collect_blocks(&mut cache.lock_exclusive(), &mut blocks);
        }
        let shared = self.shared.get_mut().unwrap_or_else(|e| e.into_inner());
        while let Some(block) = shared.idle.pop_lru() {
            blocks.push(block);
        }
        for block in blocks {
            // SAFETY: each block was allocated by `self.system` with `block.layout()`, and
            // collecting emptied the books that listed it, so it is freed exactly once.
            unsafe { self.system.dealloc(block.ptr.as_ptr(), block.layout()) };
        }
    }
}

/// Empties a thread cache's books into `blocks`: idle, live and scoped alike.
fn collect_blocks(state: &mut CacheState, blocks: &mut Vec<Block>) {
    while let Some(block) = state.idle.pop_lru() {
        blocks.push(block);
    }
    let mut live = Vec::new();
    state.live.drain_into(&mut live);
    blocks.extend(live.into_iter().map(|l| l.block));
    blocks.extend(state.scoped.drain(..).map(|s| s.live.block));
}

const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<CachingAllocator>();
};
