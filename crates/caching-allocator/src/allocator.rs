//! `CachingAllocator`: the data path size class -> thread cache -> shared cache -> system, and
//! back.
//!
//! This file is the data path itself: `allocate`, `release`, the thread caches' books.
//! What it calls lives in modules of one idea each: the arena's slow paths and its chunk's
//! life in `arena_chunks` (the arena's rules in `arena`), which idle block serves a request in
//! `fit`, blocks from and back to the system in `system`, `trim` and the pool in `trim`, the
//! cap's ledger in `shared_cache`, the least-recently-used clock in `eviction`, the thread
//! registry in `registry`, the block directory (which cache holds which address) in
//! `directory`, resets in `reset`, `stats` in `stats`.

use core::alloc::GlobalAlloc;
use core::ptr::NonNull;

use crate::arena::MIN_CHUNK;
use crate::block::{Block, Live, MIN_ALIGN};
use crate::chunk_index::ChunkIndex;
use crate::clock::Clock;
use crate::debug::{self, CANARY_LEN};
use crate::directory::Directory;
use crate::registry::Registry;
use crate::shared_cache::SharedCache;
use crate::sync::{lock, Arc, AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::thread_cache::{self, CacheGuard, CacheState, Local, ThreadCache};
use crate::working_set::WorkingSetBudget;
use crate::{AllocError, Config, SizeClass, MAX_ALIGN};

/// A thread-safe caching allocator for kernel scratch memory.
///
/// Blocks come from the system allocator, are rounded to a [`SizeClass`], and when given back
/// (by [`release`](Self::release), by dropping a [`Scope`](crate::Scope), by the
/// `allocator_api2` trait, or all at once by [`reset`](Self::reset)) they stay cached for the
/// next request of their class instead of going back to the system. At most
/// `max_cached_bytes` stay idle, counted over every thread; past that the least recently used
/// idle blocks, wherever they sit, are freed.
///
/// Each thread has its own cache, so a thread that reuses its classes takes no lock any other
/// thread takes in steady state. Every method may be called from any thread at any time,
/// including [`reset_unchecked`](Self::reset_unchecked) while other threads allocate. See the
/// [crate docs](crate) for an example.
pub struct CachingAllocator {
    id: u64,
    pub(crate) config: Config,
    /// `config.limit_bytes`, or `usize::MAX` without a limit.
    pub(crate) limit: usize,
    pub(crate) debug: bool,
    /// `config.huge_page_min_bytes`, or `usize::MAX` when off.
    pub(crate) huge_min: usize,
    /// `config.max_oversize`: the best-fit bound.
    pub(crate) oversize: f64,
    /// Requests of at most this many bytes go to the calling thread's arena; 0 when the arena
    /// is off (by `Config::arena_max_bytes`, debug checks, or a cap too small for a chunk).
    pub(crate) arena_max: usize,
    /// Requests above `arena_max` and up to this many bytes may go to the arena too, while
    /// they fit (`Arena::takes_large`); 0 when the arena is off or not adaptive.
    pub(crate) arena_large: usize,
    /// The reset interval: every reset increments it, and each thread's arena rewinds when it
    /// sees it move (see `arena`).
    pub(crate) epoch: AtomicUsize,
    /// How many thread caches hold blocks from `allocate` in their live tables.
    live_caches: Arc<AtomicUsize>,
    pub(crate) budget: WorkingSetBudget,
    /// The size of a scope's first bump chunk; 0 when chunks are off (or debug checks on).
    pub(crate) scope_chunk: usize,
    pub(crate) system: Arc<dyn GlobalAlloc + Send + Sync>,
    pub(crate) shared: Mutex<SharedCache>,
    pub(crate) registry: Registry,
    pub(crate) directory: Directory,
    /// The arenas' chunks by address: which arena a block released on another thread is in.
    pub(crate) chunks: ChunkIndex,
    pub(crate) clock: Clock,
}

/// The figures working-set retention weighs (see `working_set`), summed over every cache.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WorkingSetFigures {
    /// Idle bytes, in every cache and the pool.
    pub(crate) idle: usize,
    /// Bytes taken from the system.
    pub(crate) reserved: usize,
    /// The peak of the bytes live blocks asked for (each thread's peak, summed, as `stats`
    /// counts the peak of live bytes), and those bytes now.
    pub(crate) peak_requested: usize,
    pub(crate) requested: usize,
}

/// A validated request: the size and alignment asked for, the class serving it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub(crate) size: usize,
    pub(crate) align: usize,
    /// `None` for zero bytes: such requests touch no memory.
    pub(crate) class: Option<SizeClass>,
    /// If the system refuses, free the idle cache and ask once more. Off for an arena's chunk,
    /// which is worth less than the cache it would empty.
    pub(crate) retry: bool,
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
        let live_caches = Arc::new(AtomicUsize::new(0));
        let arena_max = if config.debug_checks || config.max_cached_bytes < MIN_CHUNK {
            0
        } else {
            config.arena_max_bytes
        };
        let arena_large = if arena_max > 0 && config.arena_adaptive {
            crate::config::ADAPTIVE_ARENA_MAX_BYTES
        } else {
            0
        };
        CachingAllocator {
            arena_max,
            arena_large,
            epoch: AtomicUsize::new(0),
            id: NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed),
            limit: config.limit_bytes.unwrap_or(usize::MAX),
            debug: config.debug_checks,
            oversize: config.max_oversize,
            // Wide fit is best fit without a bound: off with best fit off.
            budget: WorkingSetBudget::new(if config.max_oversize > 1.0 {
                config.working_set_slack
            } else {
                None
            }),
            huge_min: config.huge_page_min_bytes.unwrap_or(usize::MAX),
            scope_chunk: if config.debug_checks {
                0
            } else {
                config.scope_chunk_bytes
            },
            system: config.system.clone(),
            shared: Mutex::new(SharedCache::new(config.max_cached_bytes)),
            config,
            registry: Registry::new(&live_caches),
            live_caches,
            directory: Directory::new(),
            chunks: ChunkIndex::new(),
            clock: Clock::new(),
        }
    }

    /// `Config::limit_bytes`, or `usize::MAX` without a limit.
    pub(crate) fn limit_bytes(&self) -> usize {
        self.limit
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
    /// [`AllocError::LimitExceeded`] past `limit_bytes` (checked before anything is evicted:
    /// a request that cannot fit even with every idle block freed evicts nothing);
    /// [`AllocError::OutOfMemory`] if the system refuses. On error nothing changes, with one
    /// exception: before reporting `OutOfMemory` the allocator gives its idle cache back to the
    /// system and asks once more (as PyTorch's caching allocators do), unless the request is
    /// larger than the machine's memory.
    #[inline(always)]
    pub fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        // The common case in a few lines: a small request bumped through this thread's arena,
        // touching only state its owner reaches.
        if self.arena_serves(size, align) {
            if let Some(local) = self.last_local() {
                let epoch = self.epoch.load(Ordering::Acquire);
                // SAFETY: `local` is this thread's own cache or a shared one (`Local`), and no
                // borrow of its arena is alive: each is confined to one call.
                match unsafe { local.arena.current(epoch) } {
                    Some(arena) => {
                        if let Some(ptr) = arena.bump(&local.arena.shared, size, align) {
                            return Ok(ptr);
                        }
                    }
                    None => return self.allocate_after_reset(local, size, align),
                }
            }
        }
        self.allocate_slow(size, align)
    }

    /// Whether a request goes to the arena: sizes 1..=arena_max, alignments powers of two up
    /// to 4 KiB.
    #[inline(always)]
    fn arena_serves(&self, size: usize, align: usize) -> bool {
        size.wrapping_sub(1) < self.arena_max && crate::arena::serves_align(align)
    }

    /// Everything the fast path of `allocate` does not serve.
    #[inline(never)]
    pub(crate) fn allocate_slow(
        &self,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        if self.arena_may_take(size, align) {
            if let Some(done) = self.allocate_large(size, align) {
                return done;
            }
        }
        let local = self.thread_cache();
        if local.owned() {
            if self.arena_serves(size, align) {
                return match self.arena_slow(local, size, align) {
                    Some(ptr) => Ok(ptr),
                    None => self.allocate_missed(local, size, align),
                };
            }
            if self.arena_may_take(size, align) {
                return self.allocate_large_slow(local, size, align);
            }
        }
        self.allocate_block(local, size, align)
    }

    /// A block of `class` for `req`, booked in the live table.
    #[inline]
    pub(crate) fn take_live(
        &self,
        local: Local<'_>,
        class: SizeClass,
        req: &Request,
    ) -> Result<NonNull<u8>, AllocError> {
        let block = self.take(local, class, req, true, |state, live| {
            state.live.insert(live);
        })?;
        Ok(block.ptr)
    }

    /// `allocate` through the size classes.
    #[inline]
    pub(crate) fn allocate_block(
        &self,
        local: Local<'_>,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let req = self.request(size, align)?;
        self.allocate_request(local, &req)
    }

    /// A validated request through the size classes, in a block of its own class.
    #[inline(always)]
    pub(crate) fn allocate_request(
        &self,
        local: Local<'_>,
        req: &Request,
    ) -> Result<NonNull<u8>, AllocError> {
        match req.class {
            Some(class) => self.take_live(local, class, req),
            None => Ok(dangling(req.align)),
        }
    }

    /// Gives one block from [`allocate`](Self::allocate) back to the cache, from any thread.
    ///
    /// The allocator checks the pointer against its own books without reading the memory
    /// behind it, so passing a wrong pointer is an error, not undefined behaviour. A block
    /// released on another thread than the one that allocated it goes back to that thread's
    /// cache (where it will be reused), found in one look-up whatever the number of threads.
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
    #[inline]
    pub unsafe fn release(&self, ptr: NonNull<u8>) -> Result<(), AllocError> {
        let addr = ptr.as_ptr().addr();
        if let Some(here) = self.last_local() {
            if self.release_in_arena(here, addr) {
                return Ok(());
            }
        }
        self.release_block(addr)
    }

    /// A release `release`'s fast path did not find in this thread's arena.
    #[inline(never)]
    fn release_block(&self, addr: usize) -> Result<(), AllocError> {
        let here = self.thread_cache();
        // The fast path looks only when this allocator is the thread's last used one, and
        // only past an open gate.
        if self.release_in_arena_applied(here, addr) {
            return Ok(());
        }
        let mut state = here.lock();
        if let Some(live) = state.live.remove(addr) {
            state.counters.remove_live(&live);
            return self.take_back(&here, state, live);
        }
        drop(state);
        self.release_elsewhere(&here, addr)
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
                retry: true,
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
            retry: true,
        })
    }

    /// This thread's cache in this allocator if it is the one this thread used last (the
    /// fast path's one comparison), without registering anything.
    #[inline(always)]
    pub(crate) fn last_local(&self) -> Option<Local<'_>> {
        let cache = thread_cache::last_cache(self.id)?;
        // SAFETY: as in `thread_cache`.
        Some(unsafe { Local::new(cache) })
    }

    /// This thread's cache in this allocator.
    #[inline]
    pub(crate) fn thread_cache(&self) -> Local<'_> {
        let cache = match thread_cache::last_cache(self.id) {
            Some(cache) => cache,
            None => self.thread_cache_slow(),
        };
        // SAFETY: the registry holds an `Arc` of every cache until the allocator is dropped or
        // the cache is forgotten; dropping needs `&mut self`, which cannot coexist with the
        // `&self` this reference borrows, and only caches of exited threads are forgotten,
        // which `last_cache` never returns (a thread clears `RECENT` before it exits); a cache
        // of a dropped allocator is never returned either (ids are never reused, and
        // `last_cache` matches the id). The pointer came from `Arc::as_ptr` (`find_or_create`
        // stores nothing else in `RECENT`, and the fallback is `Arc::as_ptr` too), and is this
        // thread's own cache or the fallback.
        unsafe { Local::new(cache) }
    }

    #[cold]
    fn thread_cache_slow(&self) -> *const ThreadCache {
        thread_cache::find_or_create(self.id, &self.live_caches, |cache| {
            // A new thread: the good moment to forget threads that are gone, so a runtime
            // that spawns threads does not grow the registry without bound.
            self.registry
                .register(cache, |cache, state| self.forget_cache(cache, state));
        })
        .unwrap_or(Arc::as_ptr(self.registry.fallback()))
    }

    /// Puts a block that came back to `cache` (locked as `state`, the block's live
    /// bookkeeping already removed) into its idle lists, after checking its canary if debug
    /// checks are on.
    #[inline(always)]
    pub(crate) fn take_back(
        &self,
        cache: &ThreadCache,
        mut state: CacheGuard<'_>,
        live: Live,
    ) -> Result<(), AllocError> {
        let block = self.checked(live)?;
        let spilled = self.keep_idle(&mut state, block);
        cache.publish(&state);
        drop(state);
        if let Some(block) = spilled {
            self.keep_or_free(cache, block);
        }
        Ok(())
    }

    /// With debug checks on, checks a returned block's canary: an overrun block goes back to
    /// the system, never reused.
    #[inline(always)]
    pub(crate) fn checked(&self, live: Live) -> Result<Block, AllocError> {
        if !self.debug {
            return Ok(live.block);
        }
        self.checked_slow(live)
    }

    #[cold]
    fn checked_slow(&self, live: Live) -> Result<Block, AllocError> {
        // SAFETY: the block came back, so nothing uses it; it holds `requested + CANARY_LEN`
        // initialised bytes since `poison` ran when it was handed out.
        if unsafe { debug::canary_intact(live.block.ptr, live.requested) } {
            return Ok(live.block);
        }
        let mut shared = lock(&self.shared);
        shared.note_corrupted();
        self.system_free(&mut shared, live.block);
        Err(AllocError::Corrupted {
            addr: live.block.addr(),
            requested: live.requested,
            class_size: live.block.size(),
        })
    }

    /// Keeps an idle block in a locked thread cache if its credit covers it; otherwise hands
    /// the block back for [`keep_or_free`](Self::keep_or_free), to call once the lock is dropped.
    #[inline(always)]
    pub(crate) fn keep_idle(&self, state: &mut CacheState, block: Block) -> Option<Block> {
        debug_assert!(
            !state.forgotten,
            "a block kept in a forgotten cache is lost"
        );
        if state.held() + block.size() > state.credit {
            return Some(block);
        }
        let stamp = self.clock.stamp(state);
        state.idle.push(block, stamp);
        None
    }

    /// A block did not fit its cache's credit: get more of the cap (reclaiming other threads'
    /// spare credit, then evicting the least recently used idle blocks anywhere), or give the
    /// block back to the system if the cap cannot hold it. Called with no lock held.
    #[cold]
    pub(crate) fn keep_or_free(&self, cache: &ThreadCache, mut block: Block) {
        // Other threads may fill the new credit first; after a few rounds the block goes.
        for _ in 0..3 {
            let Some(grant) = self.make_room(block.size()) else {
                break;
            };
            let mut state = cache.lock();
            if state.forgotten {
                // The cache's thread exited and a new thread's arrival forgot it while the
                // lock was not held (a reset spills after its walk): its books are read by
                // nobody, so the block goes back to the system.
                drop(state);
                let mut shared = lock(&self.shared);
                shared.return_credit(grant);
                self.evict(&mut shared, block);
                return;
            }
            state.credit += grant;
            let spilled = self.keep_idle(&mut state, block);
            cache.publish(&state);
            match spilled {
                None => return,
                Some(b) => block = b,
            }
        }
        let mut shared = lock(&self.shared);
        self.evict(&mut shared, block);
    }

    /// A released pointer is not live in this thread's cache: the directory says which
    /// cache's books hold it, if any.
    #[cold]
    fn release_elsewhere(&self, here: &ThreadCache, addr: usize) -> Result<(), AllocError> {
        if let Some(Some(home)) = self.directory.home(addr) {
            if !core::ptr::eq(&*home, here) {
                let mut state = home.lock();
                if let Some(live) = state.live.remove(addr) {
                    state.counters.remove_live(&live);
                    // Back to the cache of the thread that took it, which will reuse it.
                    return self.take_back(&home, state, live);
                }
            }
        }
        if is_dangling(addr) {
            return Ok(());
        }
        // A block of another thread's arena: found by its chunk, checked against the arena's
        // records and marked for its owner.
        let released = self.chunks.with_owner(addr, |cache| {
            !core::ptr::eq(cache, here) && cache.arena.shared.release_foreign(&self.epoch, addr)
        });
        if released {
            return Ok(());
        }
        Err(AllocError::UnknownPointer { addr })
    }

    /// Whether any thread cache's live table may hold a block (see `ThreadCache::publish`).
    #[inline]
    pub(crate) fn any_live_tables(&self) -> bool {
        self.live_tables() > 0
    }

    /// How many thread caches' live tables may hold a block (see `ThreadCache::publish`).
    #[inline]
    pub(crate) fn live_tables(&self) -> usize {
        self.live_caches.load(Ordering::Acquire)
    }

    /// Advances the eviction clock (resets do).
    pub(crate) fn tick(&self) {
        self.clock.advance();
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        let mut blocks = Vec::new();
        self.registry.for_each(|cache| {
            // Threads may still hold an `Arc` of this cache in their thread-locals; `closed`
            // tells them to forget it. They never lock it again: that needs `&self`.
            cache.close();
            collect_blocks(&mut cache.lock(), &mut blocks);
        });
        let shared = self.shared.get_mut().unwrap_or_else(|e| e.into_inner());
        while let Some((_, block)) = shared.pool_pop_lru() {
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
    while let Some((_, block)) = state.idle.pop_lru() {
        blocks.push(block);
    }
    let mut live = Vec::new();
    state.live.drain_into(&mut live);
    blocks.extend(live.into_iter().map(|l| l.block));
    blocks.extend(state.scoped.drain(..).map(|s| s.live.block));
    blocks.extend(state.arena_chunk.take());
    blocks.extend(state.scope_chunk.take());
}

const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<CachingAllocator>();
};
