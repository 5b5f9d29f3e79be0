//! `CachingAllocator`: the data path size class -> thread cache -> shared cache -> system, and
//! back.
//!
//! The policies it calls live in their own modules: the cap's ledger in `shared_cache`, the
//! least-recently-used clock in `eviction`, the thread registry in `registry`, the block
//! directory (which cache holds which address) in `directory`; resets in `reset`.

use core::alloc::GlobalAlloc;
use core::ptr::NonNull;

use crate::arena::{ARENA_MAX_ALIGN, MIN_CHUNK};
use crate::block::{Block, Live, MIN_ALIGN};
use crate::clock::Clock;
use crate::debug::{self, CANARY_LEN};
use crate::directory::Directory;
use crate::huge_pages::{self, HUGE_PAGE};
use crate::registry::Registry;
use crate::shared_cache::{SharedCache, CREDIT_STEP};
use crate::sync::{lock, Arc, AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::thread_cache::{self, CacheGuard, CacheState, Local, ThreadCache};
use crate::working_set::WorkingSetBudget;
use crate::{AllocError, Config, SizeClass, Stats, MAX_ALIGN};

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
    config: Config,
    /// `config.limit_bytes`, or `usize::MAX` without a limit.
    limit: usize,
    debug: bool,
    /// `config.huge_page_min_bytes`, or `usize::MAX` when off.
    huge_min: usize,
    /// `config.max_oversize`: the best-fit bound.
    oversize: f64,
    /// Requests of at most this many bytes go to the calling thread's arena; 0 when the arena
    /// is off (by `Config::arena_max_bytes`, debug checks, or a cap too small for a chunk).
    arena_max: usize,
    /// Requests above `arena_max` and up to this many bytes may go to the arena too, while
    /// they fit (`Arena::takes_large`); 0 when the arena is off or not adaptive.
    arena_large: usize,
    /// The reset interval: every reset increments it, and each thread's arena rewinds when it
    /// sees it move (see `arena`).
    pub(crate) epoch: AtomicUsize,
    /// How many thread caches hold blocks from `allocate` in their live tables.
    live_caches: Arc<AtomicUsize>,
    pub(crate) budget: WorkingSetBudget,
    /// The size of a scope's first bump chunk; 0 when chunks are off (or debug checks on).
    pub(crate) scope_chunk: usize,
    system: Arc<dyn GlobalAlloc + Send + Sync>,
    pub(crate) shared: Mutex<SharedCache>,
    pub(crate) registry: Registry,
    directory: Directory,
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
    #[inline]
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

    /// A request above `arena_max` that the adaptive arena may take (`arena_may_take`): bumped
    /// if this thread's arena, in the current interval, takes large requests now
    /// (`Arena::takes_large`), else through the size classes. `None` for a first call or an
    /// arena behind the epoch: the rest of `allocate_slow` rewinds it first.
    #[inline(always)]
    fn allocate_large(&self, size: usize, align: usize) -> Option<Result<NonNull<u8>, AllocError>> {
        let local = self.last_local()?;
        let epoch = self.epoch.load(Ordering::Acquire);
        // SAFETY: as in `allocate`.
        let arena = unsafe { local.arena.current(epoch) }?;
        if !arena.takes_large(epoch, size) {
            return Some(self.allocate_block(local, size, align));
        }
        if let Some(ptr) = arena.bump(&local.arena.shared, size, align) {
            return Some(Ok(ptr));
        }
        // The arena's slow path: its inbox, its first chunk, or a miss.
        Some(match self.arena_slow(local, size, align) {
            Some(ptr) => Ok(ptr),
            None => self.allocate_missed(local, size, align),
        })
    }

    /// Whether a request above `arena_max` is one the adaptive arena may take: at most
    /// `arena_large` bytes, aligned as the arena serves.
    #[inline(always)]
    fn arena_may_take(&self, size: usize, align: usize) -> bool {
        self.arena_max < size
            && size <= self.arena_large
            && align.wrapping_sub(1) < ARENA_MAX_ALIGN
            && align & (align - 1) == 0
    }

    /// The first small request on this thread since a reset (or any request on a shared
    /// cache): rewinds the arena, then bumps; anything else goes to `allocate_slow`.
    #[cold]
    #[inline(never)]
    fn allocate_after_reset(
        &self,
        local: Local<'_>,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        if !local.owned() {
            return self.allocate_slow(size, align);
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        // SAFETY: the owner thread (`owned`, and `Local` is this thread's); one borrow at a
        // time (this one ends before `grow_and_bump` borrows again).
        let arena = unsafe { local.arena.owner() };
        let bumped = match self.rewind_arena(local, arena, epoch) {
            None => arena.bump_or_miss(&local.arena.shared, size, align),
            grow => self.grow_and_bump(local, grow, epoch, size, align),
        };
        match bumped {
            Some(ptr) => Ok(ptr),
            None => self.allocate_missed(local, size, align),
        }
    }

    /// Whether a request goes to the arena: sizes 1..=arena_max, alignments powers of two up
    /// to 4 KiB.
    #[inline(always)]
    fn arena_serves(&self, size: usize, align: usize) -> bool {
        size.wrapping_sub(1) < self.arena_max
            && align.wrapping_sub(1) < ARENA_MAX_ALIGN
            && align & (align - 1) == 0
    }

    /// Everything the fast path of `allocate` does not serve.
    #[inline(never)]
    fn allocate_slow(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
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

    /// A large request (`arena_may_take`) on the owner's thread (`local`, owned) that
    /// `allocate_large` could not serve: an arena behind the epoch is rewound first, so the
    /// choice (`Arena::takes_large`) and its count are this interval's. A request left to the
    /// size classes is served before the arena takes a larger chunk for its small requests,
    /// so a refusal changes nothing.
    #[cold]
    fn allocate_large_slow(
        &self,
        local: Local<'_>,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let (grow, takes) = {
            // SAFETY: the owner thread (the caller checked `owned`); the borrow ends in this
            // block.
            let arena = unsafe { local.arena.owner() };
            let grow = if arena.epoch() != epoch {
                self.rewind_arena(local, arena, epoch)
            } else {
                None
            };
            (grow, arena.takes_large(epoch, size))
        };
        if !takes {
            let ptr = self.allocate_block(local, size, align)?;
            if let Some(bytes) = grow {
                if !self.replace_chunk(local, bytes) {
                    // SAFETY: as above; `replace_chunk` holds no borrow of the arena.
                    unsafe { local.arena.owner() }.refuse(epoch);
                }
            }
            return Ok(ptr);
        }
        let bumped = match grow {
            None => self.arena_slow(local, size, align),
            grow => self.grow_and_bump(local, grow, epoch, size, align),
        };
        match bumped {
            Some(ptr) => Ok(ptr),
            None => self.allocate_missed(local, size, align),
        }
    }

    /// A request the owner's arena (of `local`, owned) missed, through the size classes: in
    /// the block its next chunk will be, when the request is most of that chunk
    /// (`Arena::successor_for`), else in a block of its own class.
    #[cold]
    fn allocate_missed(
        &self,
        local: Local<'_>,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        debug_assert!(local.owned());
        // SAFETY: the owner thread (the callers checked `owned`); the borrow ends here.
        let next = unsafe { local.arena.owner() }.successor_for(size, self.arena_large > 0);
        // Under a hard limit the larger block could be what passes it: its own class only.
        let next = next.filter(|_| self.limit == usize::MAX);
        let req = self.request(size, align)?;
        let larger = next
            .and_then(SizeClass::for_size)
            .filter(|&chunk| req.class.is_some_and(|own| chunk > own));
        if let Some(chunk) = larger {
            // Aligned as a chunk must be, so the rewind can take it as one.
            let req = Request {
                align: ARENA_MAX_ALIGN,
                ..req
            };
            // Refused (the cap or the limit): the request's own class may still fit.
            if let Ok(ptr) = self.take_live(local, chunk, &req) {
                return Ok(ptr);
            }
        }
        self.allocate_request(local, &req)
    }

    /// A block of `class` for `req`, booked in the live table.
    #[inline]
    fn take_live(
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
    fn allocate_block(
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
    fn allocate_request(&self, local: Local<'_>, req: &Request) -> Result<NonNull<u8>, AllocError> {
        match req.class {
            Some(class) => self.take_live(local, class, req),
            None => Ok(dangling(req.align)),
        }
    }

    /// The arena could not serve a request on its fast path: rewind it after a reset (swapping
    /// its chunk for a larger one if the last interval wanted more), apply other threads'
    /// releases, or give it its first chunk; then try once more. `None`: the size classes
    /// serve this request (the chunk is full for this interval, or the cap cannot cover one).
    #[cold]
    fn arena_slow(&self, local: Local<'_>, size: usize, align: usize) -> Option<NonNull<u8>> {
        let sh = &local.arena.shared;
        let epoch = self.epoch.load(Ordering::Acquire);
        let grow = {
            // SAFETY: as in `allocate_after_reset`.
            let arena = unsafe { local.arena.owner() };
            if arena.epoch() != epoch {
                self.rewind_arena(local, arena, epoch)
            } else {
                arena.apply_inbox(sh);
                if let Some(ptr) = arena.bump(sh, size, align) {
                    return Some(ptr);
                }
                if !arena.is_empty(sh) || arena.chunk().is_some() || arena.refused(epoch) {
                    arena.missed(size);
                    return None;
                }
                // No chunk yet.
                Some(MIN_CHUNK)
            }
        };
        self.grow_and_bump(local, grow, epoch, size, align)
    }

    /// Gives the arena (just rewound or empty, in `epoch`) a chunk of `grow` bytes if asked,
    /// then bumps.
    #[cold]
    fn grow_and_bump(
        &self,
        local: Local<'_>,
        grow: Option<usize>,
        epoch: usize,
        size: usize,
        align: usize,
    ) -> Option<NonNull<u8>> {
        // A new chunk holds this request too.
        let grow = grow.map(|bytes| bytes.max(crate::arena::first_chunk(size)));
        let got = grow.is_none_or(|bytes| self.replace_chunk(local, bytes));
        // SAFETY: as in `allocate_after_reset`; `replace_chunk` holds no borrow of the arena.
        let arena = unsafe { local.arena.owner() };
        if !got {
            // No chunk to be had (the cap, the limit or the system): the size classes serve
            // this interval's small requests, rather than one failed chunk per request.
            arena.refuse(epoch);
        }
        arena.bump_or_miss(&local.arena.shared, size, align)
    }

    /// Gives the (empty) arena of this thread a chunk of at least `bytes` instead of the one it
    /// has, which goes back to the cache's idle blocks. `false`: no chunk could be had (the
    /// cap, the limit or the system refused), and the arena is left without one.
    #[cold]
    fn replace_chunk(&self, local: Local<'_>, bytes: usize) -> bool {
        let sh = &local.arena.shared;
        {
            // SAFETY: as in `allocate`; the borrow ends in this block.
            let arena = unsafe { local.arena.owner() };
            debug_assert!(arena.is_empty(sh));
            arena.set_chunk(sh, core::ptr::null_mut(), 0);
        }
        let mut state = local.lock();
        self.chunk_to_idle(&mut state);
        local.publish(&state);
        drop(state);
        let Some(class) = SizeClass::for_size(bytes) else {
            return false;
        };
        let req = Request {
            size: class.size(),
            align: ARENA_MAX_ALIGN,
            class: Some(class),
            retry: false,
        };
        // In nobody's books until the cap covers it.
        let Ok(chunk) = self.take(local, class, &req, false, |_, _| {}) else {
            return false;
        };
        if !self.charge_chunk(local, chunk) {
            let mut state = local.lock();
            let spilled = self.keep_idle(&mut state, chunk);
            local.publish(&state);
            drop(state);
            if let Some(block) = spilled {
                self.keep_or_free(&local, block);
            }
            return false;
        }
        // SAFETY: as in `allocate`.
        let arena = unsafe { local.arena.owner() };
        arena.set_chunk(sh, chunk.ptr.as_ptr(), chunk.size());
        true
    }

    /// Books `chunk` as the thread's arena chunk once its credit covers it, asking the cap for
    /// more if needed (so `held() <= credit` holds at every unlock). `false` if the cap cannot.
    fn charge_chunk(&self, local: Local<'_>, chunk: Block) -> bool {
        for _ in 0..3 {
            let mut state = local.lock();
            let short = (state.held() + chunk.size()).saturating_sub(state.credit);
            if short == 0 {
                state.arena_chunk = Some(chunk);
                return true;
            }
            drop(state);
            let Some(grant) = self.make_room(short) else {
                return false;
            };
            local.lock().credit += grant;
        }
        false
    }

    /// Rewinds this thread's arena (`arena`, of `local`) to `epoch`, under the cache's lock: a
    /// trim on another thread may have taken the chunk of an arena whose epoch was behind
    /// (see `revoke_stale_chunks`), and the lock orders the two. Returns what `Arena::rewind`
    /// does, or the chunk to take when the old one was taken.
    #[inline]
    fn rewind_arena(
        &self,
        local: Local<'_>,
        arena: &mut crate::arena::Arena,
        epoch: usize,
    ) -> Option<usize> {
        let sh = &local.arena.shared;
        let state = local.lock();
        let old_len = arena.len();
        let grow = arena.rewind(sh, epoch, self.arena_large > 0);
        if state.arena_chunk.is_none() && arena.chunk().is_some() {
            // Taken by a trim while the arena was behind: forget it, take another next.
            arena.set_chunk(sh, core::ptr::null_mut(), 0);
            return Some(grow.unwrap_or(old_len).max(MIN_CHUNK));
        }
        grow
    }

    /// Takes the chunks of other threads' arenas whose epoch is behind the allocator's (a
    /// reset took their blocks and their owners have not called since) into their caches'
    /// idle blocks, where a trim reaches them. The lock orders this with the owner's rewind.
    ///
    /// The allocator's epoch is read under each cache's lock, after the arena's: an owner
    /// rewinds under that lock to an epoch it read from the allocator, so the read here sees
    /// that epoch or a later one, and the arena is never *ahead* of it. Only an arena strictly
    /// behind is revoked. (Reading the epoch once before the walk revoked arenas that had
    /// rewound past that stale value meanwhile: a chunk in use in the current interval, then
    /// freed by the trim under its owner's blocks.)
    fn revoke_stale_chunks(&self) {
        self.registry.for_each(|cache| {
            if !cache.owned() {
                return;
            }
            let mut state = cache.lock();
            let arena_epoch = cache.arena.shared.epoch();
            let epoch = self.epoch.load(Ordering::Acquire);
            debug_assert!(
                !crate::arena::epoch_behind(epoch, arena_epoch),
                "an arena rewound to epoch {arena_epoch}, ahead of the allocator's {epoch}"
            );
            if state.arena_chunk.is_some() && crate::arena::epoch_behind(arena_epoch, epoch) {
                self.chunk_to_idle(&mut state);
                cache.publish(&state);
            }
        });
    }

    /// On the owner's thread: gives the arena's chunk back to the idle blocks if the arena
    /// holds nothing live, and the spare scope chunk if no scope has it (so a trim can free
    /// them).
    fn park_own_chunk(&self) {
        let local = self.thread_cache();
        if !local.owned() {
            return;
        }
        let sh = &local.arena.shared;
        let epoch = self.epoch.load(Ordering::Acquire);
        {
            // SAFETY: as in `allocate`; the borrow ends in this block (nothing in it comes back
            // into the arena).
            let arena = unsafe { local.arena.owner() };
            if arena.epoch() != epoch {
                self.rewind_arena(local, arena, epoch);
            }
            arena.apply_inbox(sh);
            let spare = arena.spare_idle();
            if spare {
                arena.set_spare(None);
            }
            let chunk = arena.is_empty(sh) && arena.chunk().is_some();
            if chunk {
                arena.set_chunk(sh, core::ptr::null_mut(), 0);
            }
            if !spare && !chunk {
                return;
            }
            let mut state = local.lock();
            if chunk {
                self.chunk_to_idle(&mut state);
            }
            if spare {
                self.spare_to_idle(&mut state);
            }
            local.publish(&state);
        }
    }

    /// Moves a locked cache's spare scope chunk, if any, into its idle blocks (see
    /// `chunk_to_idle`). Only for a spare no scope has and none will borrow again.
    fn spare_to_idle(&self, state: &mut CacheState) {
        if let Some(chunk) = state.scope_chunk.take() {
            let stamp = self.clock.stamp(state);
            state.idle.push(chunk, stamp);
        }
    }

    /// Moves a locked cache's arena chunk, if any, into its idle blocks (the most recently used
    /// of its class). Its credit stays: the chunk was charged as if idle, and now is. Only for
    /// a chunk no arena bumps through any more (see the callers).
    fn chunk_to_idle(&self, state: &mut CacheState) {
        if let Some(chunk) = state.arena_chunk.take() {
            let stamp = self.clock.stamp(state);
            state.idle.push(chunk, stamp);
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

    /// Releases `addr` if it is a live block of the calling thread's arena (`here`), with the
    /// arena's gate open.
    #[inline(always)]
    fn release_in_arena(&self, here: Local<'_>, addr: usize) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        // SAFETY: as in `allocate`: this thread's own cache or a shared one, one borrow, in
        // this function.
        match unsafe { here.arena.open(epoch) } {
            Some(arena) => arena.release(&here.arena.shared, addr),
            None => false,
        }
    }

    /// [`release_in_arena`](Self::release_in_arena) past a closed gate: the releases other
    /// threads queued go first.
    fn release_in_arena_applied(&self, here: Local<'_>, addr: usize) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        // SAFETY: as in `release_in_arena`.
        match unsafe { here.arena.current_applied(epoch) } {
            Some(arena) => arena.release(&here.arena.shared, addr),
            None => false,
        }
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

    /// Gives every idle cached block back to the system, in every thread's cache, and the
    /// arenas' chunks that hold nothing live: the calling thread's, those of exited threads,
    /// and those of threads that have not called since the last reset. (A chunk another
    /// thread is using in the current reset interval stays: only its owner may take it.)
    pub fn free_cached(&self) {
        self.trim(0);
    }

    /// Evicts least recently used idle blocks until at most `keep_bytes` stay cached, counted
    /// over every thread's cache. The blocks that stay move to the shared pool. Arena chunks
    /// are reclaimed as by [`free_cached`](Self::free_cached).
    pub fn trim(&self, keep_bytes: usize) {
        // Exited threads' caches that hold nothing live go first, with their arenas' chunks:
        // nobody bumps through those any more, and thread churn must leave nothing behind.
        self.forget_exited_threads();
        self.park_own_chunk();
        self.revoke_stale_chunks();
        if self.cached_bytes() <= keep_bytes {
            return;
        }
        self.clock.advance();
        self.registry.for_each(|cache| {
            let mut state = cache.lock();
            self.move_to_pool(&mut state);
            cache.publish(&state);
        });
        let mut shared = lock(&self.shared);
        while shared.pool_bytes() > keep_bytes {
            let Some((_, block)) = shared.pool_pop_lru() else {
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
        let mut peak_live = 0usize;
        let epoch = self.epoch.load(Ordering::Acquire);
        self.registry.for_each(|cache| {
            let state = cache.lock();
            let arena = cache.arena.shared.figures(epoch);
            stats.hits += arena.hits as u64 + cache.arena.shared.spare_lends();
            stats.live_bytes += arena.live_bytes;
            stats.live_blocks += arena.live_blocks;
            stats.arena_live_blocks += arena.live_blocks;
            stats.requested_bytes += arena.requested;
            peak_live = peak_live.saturating_add(arena.max_peak);
            if let Some(chunk) = state.arena_chunk {
                // The chunk's bytes no live block of the arena has are cached.
                stats.cached_bytes += chunk.size().saturating_sub(arena.live_bytes);
                stats.arena_chunks += 1;
            }
            if let Some(chunk) = state.scope_chunk {
                // As when the chunk was a scope's block of its own: live while a scope has it,
                // idle otherwise.
                if cache.arena.shared.spare_lent() {
                    stats.live_bytes += chunk.size();
                    stats.live_blocks += 1;
                    stats.requested_bytes += chunk.size();
                } else {
                    stats.cached_bytes += chunk.size();
                    stats.cached_blocks += 1;
                }
            }
            let c = &state.counters;
            let (interval, last) = c.interval(epoch);
            stats.interval_peak_bytes += interval + arena.peak;
            stats.last_interval_peak_bytes += last + arena.last_peak;
            stats.hits += c.hits;
            stats.oversize_hits += c.oversize_hits;
            stats.misses += c.misses;
            stats.live_bytes += c.live_bytes;
            stats.live_blocks += c.live_blocks;
            stats.requested_bytes += c.requested_bytes;
            peak_live = peak_live.saturating_add(c.peak_live_bytes);
            stats.cached_bytes += state.idle.bytes();
            stats.cached_blocks += state.idle.blocks();
        });
        lock(&self.shared).add_to(&mut stats, peak_live, epoch);
        stats.working_set_mode = self.budget.engaged();
        stats
    }

    /// How many thread caches the allocator keeps: one per thread that has used it, plus one
    /// for calls made while a thread's locals are torn down. The cache of an exited thread is
    /// dropped once it holds no live block: when the next new thread arrives, or at
    /// `reset(&mut self)`. (Not part of [`Stats`]: registering a thread is not a change of
    /// the allocator's blocks, and a failed call may register one.)
    pub fn thread_caches(&self) -> usize {
        self.registry.len()
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
        // which `last_cache` never returns (a thread clears `RECENT` before it exits); a cache of a dropped allocator is never returned either (ids are never
        // reused, and `last_cache` matches the id). The pointer came from `Arc::as_ptr`
        // (`find_or_create` stores nothing else in `RECENT`, and the fallback is
        // `Arc::as_ptr` too), and is this thread's own cache or the fallback.
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

    /// Takes a block of `class` (the class of `req`) for the calling thread, records it with
    /// `record` under its cache's lock, and poisons it if debug checks are on.
    #[inline(always)]
    pub(crate) fn take(
        &self,
        local: Local<'_>,
        class: SizeClass,
        req: &Request,
        counts_live: bool,
        record: impl FnOnce(&mut CacheState, Live),
    ) -> Result<Block, AllocError> {
        let mut state = local.lock();
        let (block, cached) = match state.idle.take(class, req.align) {
            Some(block) => (block, true),
            None => {
                let bound = self.fit_bound(class, &state);
                match bound.and_then(|largest| state.idle.take_larger(class, largest, req.align)) {
                    Some(block) => (block, true),
                    None => {
                        drop(state);
                        let found = self.take_slow(local, class, bound, req)?;
                        state = local.lock();
                        found
                    }
                }
            }
        };
        // A request counts as a hit or a miss; an arena's chunk is not a request (its blocks
        // count as hits).
        if !counts_live {
        } else if !cached {
            state.counters.misses += 1;
        } else {
            state.counters.hits += 1;
            if block.class != class {
                state.counters.oversize_hits += 1;
            }
        }
        if self.debug {
            // Poisoned before it is booked live: from then on a reset on another thread may
            // take it back (and check its canary) at any moment.
            drop(state);
            // SAFETY: the block is in nobody's books, so ours alone, and holds
            // `size + CANARY_LEN` bytes (`request` chose the class for that many).
            unsafe { debug::poison(block.ptr, req.size) };
            state = local.lock();
        }
        let live = Live {
            block,
            requested: req.size,
        };
        if counts_live {
            state
                .counters
                .add_live(&live, self.epoch.load(Ordering::Relaxed));
        }
        record(&mut state, live);
        local.publish(&state);
        drop(state);
        Ok(block)
    }

    /// A miss in this thread's cache: the shared pool, then other threads' idle blocks, then
    /// the system. Returns the block (homed in `here` in the directory) and whether it came
    /// from a cache. Holds no cache lock.
    #[cold]
    fn take_slow(
        &self,
        here: Local<'_>,
        class: SizeClass,
        bound: Option<SizeClass>,
        req: &Request,
    ) -> Result<(Block, bool), AllocError> {
        self.clock.advance();
        let pooled = {
            let mut shared = lock(&self.shared);
            shared.pool_take(class, req.align).or_else(|| {
                let largest = bound?;
                shared.pool_take_larger(class, largest, req.align)
            })
        };
        let cached = pooled
            .or_else(|| self.steal(here.cache(), class, req.align))
            .or_else(|| self.take_under_pressure(here, class, req.align));
        if let Some(block) = cached {
            // In nobody's books now: we may write its home.
            self.directory.set_home(block.addr(), Some(here.to_arc()));
            return Ok((block, true));
        }
        let block = self.system_alloc(class, req)?;
        self.directory.insert(block.addr(), Some(here.to_arc()));
        Ok((block, false))
    }

    /// Best fit under cap pressure: when a new block of `class` could not stay cached without
    /// evicting another (idle bytes + the class would pass the cap), any larger idle block
    /// serves instead,
    /// from this thread's cache or the pool. The memory is held anyway; a new block would only
    /// push an idle one out (a runtime under ExecuTorch's 10 MiB cap otherwise churns through
    /// the system every time its shapes start small again). Off with best fit off.
    fn take_under_pressure(
        &self,
        here: Local<'_>,
        class: SizeClass,
        align: usize,
    ) -> Option<Block> {
        if self.oversize <= 1.0
            || self.cached_bytes().saturating_add(class.size()) <= self.config.max_cached_bytes
        {
            return None;
        }
        let any = SizeClass::largest_within(usize::MAX)?;
        let mut state = here.lock();
        let found = state.idle.take_larger(class, any, align);
        here.publish(&state);
        drop(state);
        found.or_else(|| lock(&self.shared).pool_take_larger(class, any, align))
    }

    /// The largest class best fit may serve a request of `class` with, on the thread whose
    /// cache is `state` (`None`: exact only): `max_oversize` times the class, and once
    /// working-set retention is engaged (wide fit), any class that keeps the bytes this
    /// thread's live blocks hold within its working-set budget (see `working_set`).
    #[inline]
    fn fit_bound(&self, class: SizeClass, state: &CacheState) -> Option<SizeClass> {
        let bounded = self.larger_class(class);
        if !self.budget.engaged() {
            return bounded;
        }
        let wide = self
            .budget
            .headroom(&state.counters)
            .and_then(SizeClass::largest_within)
            .filter(|&c| c > class);
        bounded.max(wide)
    }

    /// The largest class `max_oversize` lets a request of `class` take (`None`: exact only).
    #[inline]
    fn larger_class(&self, class: SizeClass) -> Option<SizeClass> {
        if self.oversize <= 1.0 {
            return None;
        }
        let bound = class.size() as f64 * self.oversize;
        let largest = SizeClass::largest_within(bound.min(usize::MAX as f64) as usize)?;
        (largest > class).then_some(largest)
    }

    /// Looks for an idle block of `class` in other threads' caches; on the way, moves the idle
    /// blocks of exited threads to the shared pool. A block taken gives its credit back.
    fn steal(&self, here: &ThreadCache, class: SizeClass, align: usize) -> Option<Block> {
        let mut found = None;
        self.registry.for_each(|cache| {
            // Our own cache was just searched; empty ones are not worth a lock.
            if found.is_some() || core::ptr::eq(&**cache, here) || !cache.may_have_idle() {
                return;
            }
            let mut state = cache.lock();
            if cache.has_exited() {
                self.move_to_pool(&mut state);
                found = lock(&self.shared).pool_take(class, align);
            } else if let Some(block) = state.idle.take(class, align) {
                // The credit goes with the block: the cache no longer holds it.
                state.credit -= block.size();
                lock(&self.shared).return_credit(block.size());
                found = Some(block);
            }
            cache.publish(&state);
        });
        found
    }

    /// Takes a new block from the system, within `limit_bytes`, retrying once after freeing
    /// the idle cache if the system refuses.
    fn system_alloc(&self, class: SizeClass, req: &Request) -> Result<Block, AllocError> {
        // Make room first, so the peak of reserved bytes never holds the block that is about to
        // be given back beside the one replacing it.
        self.trim_before_growth(class.size(), req.size);
        let huge = class.size() >= self.huge_min;
        let align = if huge {
            req.align.max(HUGE_PAGE)
        } else {
            req.align.max(MIN_ALIGN)
        };
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
                let advised = if huge {
                    huge_pages::advise(ptr.as_ptr(), class.size())
                } else {
                    0
                };
                lock(&self.shared).allocated(advised);
                // Reserved bytes grew: keep them within the working set (if that policy is on).
                self.trim_to_budget();
                // SAFETY: `ptr` came from the system allocator for exactly this layout.
                let mut block = unsafe { Block::new(ptr, class, align) };
                block.huge = advised > 0;
                return Ok(block);
            }
            if req.retry && !retried && self.cached_bytes() > 0 && !larger_than_memory(class.size())
            {
                // As PyTorch's caching allocators do: give the idle cache back, try once more.
                lock(&self.shared).note_oom_retry();
                self.free_cached();
                retried = true;
                continue;
            }
            lock(&self.shared).unreserve(class.size());
            return Err(AllocError::OutOfMemory {
                size: req.size,
                align: req.align,
            });
        }
    }

    /// Counts `class.size()` more bytes as taken from the system. With peak-bound growth
    /// (`Config::evict_before_new_peak`), while they would pass the peak of reserved bytes,
    /// evicts least recently used idle blocks first, until nothing is idle. Past
    /// `limit_bytes`, evicts them too, but only if that can make room: a request that would
    /// not fit with every idle block gone fails before anything is evicted.
    fn reserve(&self, class: SizeClass, req: &Request) -> Result<(), AllocError> {
        let size = class.size();
        let mut chunks_parked = false;
        let mut hold_peak = self.config.evict_before_new_peak;
        // Another thread may take the block chosen for eviction first (then 0 bytes are
        // freed): after a few such races the block goes ahead and the peak grows.
        let mut races = 0;
        loop {
            let mut shared = lock(&self.shared);
            // Checked and counted under one lock, so threads missing at once do not all pass
            // the peak on the strength of the same idle bytes.
            if hold_peak && shared.reserved().saturating_add(size) > shared.peak_reserved() {
                drop(shared);
                match self.evict_oldest_bytes() {
                    None => hold_peak = false, // nothing idle: the peak grows
                    Some(0) => {
                        races += 1;
                        hold_peak = races < 4;
                    }
                    Some(_) => {}
                }
                continue;
            }
            if shared.try_reserve(size, self.limit) {
                return Ok(());
            }
            if !chunks_parked && self.limit != usize::MAX {
                // Arena chunks that hold nothing live are idle bytes too: the caller's own,
                // and those of arenas a reset emptied. Into the idle blocks with them, where
                // the eviction below can free them.
                drop(shared);
                chunks_parked = true;
                self.park_own_chunk();
                self.revoke_stale_chunks();
                continue;
            }
            let reserved = shared.reserved();
            drop(shared);
            let refuse = || {
                if self.limit == usize::MAX {
                    // No limit, yet the total would pass `usize::MAX`: no system has that.
                    AllocError::OutOfMemory {
                        size: req.size,
                        align: req.align,
                    }
                } else {
                    AllocError::LimitExceeded {
                        size: req.size,
                        class_size: size,
                        limit: self.limit,
                        reserved,
                    }
                }
            };
            let live = reserved.saturating_sub(self.cached_bytes());
            if self.limit == usize::MAX || live.saturating_add(size) > self.limit {
                return Err(refuse());
            }
            if !self.evict_oldest() {
                return Err(refuse());
            }
        }
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
        // A small block of another thread's arena: checked against its records, queued for
        // its owner.
        let mut released = false;
        self.registry.for_each(|cache| {
            if !released && !core::ptr::eq(&**cache, here) && cache.arena.shared.in_chunk(addr) {
                released = cache.arena.shared.release_foreign(&self.epoch, addr);
            }
        });
        if released {
            return Ok(());
        }
        Err(AllocError::UnknownPointer { addr })
    }

    /// Moves every idle block of a locked thread cache to the shared pool and returns its
    /// credit.
    /// The arena's chunk and the spare scope chunk stay, with their credit (only their owner
    /// moves them, or `forget_cache`).
    pub(crate) fn move_to_pool(&self, state: &mut CacheState) {
        let mut shared = lock(&self.shared);
        let chunk = state.chunk_bytes();
        shared.return_credit(state.credit - chunk);
        state.credit = chunk;
        while let Some((stamp, block)) = state.idle.pop_lru() {
            // Under the pool's lock, before anyone can take it from there.
            self.directory.set_home(block.addr(), None);
            shared.pool_insert(block, stamp);
        }
    }

    /// Empties the cache of an exited thread that is being forgotten (locked, no live block):
    /// its idle blocks go to the pool, its counters to the shared books.
    /// `false` (nothing changes) if its arena still holds live blocks.
    fn forget_cache(&self, cache: &ThreadCache, state: &mut CacheState) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        if cache.arena.shared.figures(epoch).live_blocks > 0 {
            return false;
        }
        cache.clear_live_hint(state);
        // The owner exited and its arena holds nothing live: nobody bumps through it, and no
        // scope is open on it (`forgettable`), so nobody has its spare scope chunk.
        self.chunk_to_idle(state);
        self.spare_to_idle(state);
        self.move_to_pool(state);
        let arena = cache.arena.shared.figures(epoch);
        lock(&self.shared).retire(
            &state.counters,
            &arena,
            cache.arena.shared.spare_lends(),
            epoch,
        );
        true
    }

    /// Gives a block back to the system because of the cap, the limit or a trim.
    pub(crate) fn evict(&self, shared: &mut SharedCache, block: Block) {
        shared.note_eviction();
        self.system_free(shared, block);
    }

    pub(crate) fn system_free(&self, shared: &mut SharedCache, block: Block) {
        self.directory.remove(block.addr());
        // As `system_alloc` counted it: the whole huge pages inside the block.
        let advised = if block.huge {
            huge_pages::whole_pages(block.ptr.as_ptr(), block.size()).1
        } else {
            0
        };
        // SAFETY: blocks are only built from system allocations of exactly `block.layout()`,
        // and every caller passes a block it just removed from the books, so it is freed once.
        unsafe { self.system.dealloc(block.ptr.as_ptr(), block.layout()) };
        shared.freed(block.size(), advised);
    }

    /// What working-set retention weighs, summed over every cache (see `working_set`).
    pub(crate) fn working_set_figures(&self) -> WorkingSetFigures {
        let mut ws = WorkingSetFigures::default();
        self.registry.for_each(|cache| {
            let state = cache.lock();
            ws.idle += state.idle.bytes();
            ws.peak_requested = ws
                .peak_requested
                .saturating_add(state.counters.peak_requested_bytes);
            ws.requested += state.counters.requested_bytes;
        });
        let shared = lock(&self.shared);
        ws.idle += shared.pool_bytes();
        ws.peak_requested = ws
            .peak_requested
            .saturating_add(shared.retired_peak_requested());
        ws.reserved = shared.reserved();
        ws
    }

    /// Idle bytes, in every cache.
    fn cached_bytes(&self) -> usize {
        let mut bytes = 0;
        self.registry
            .for_each(|cache| bytes += cache.lock().idle.bytes());
        bytes + lock(&self.shared).pool_bytes()
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

    /// Forgets the caches of exited threads that hold nothing live.
    pub(crate) fn forget_exited_threads(&self) {
        self.registry
            .forget_exited_now(|cache, state| self.forget_cache(cache, state));
    }

    /// Hands spare credit of a just-reset cache back, keeping one step so the next kernel's
    /// releases need no shared lock.
    pub(crate) fn trim_credit(&self, state: &mut CacheState) {
        let spare = (state.credit - state.held()).saturating_sub(CREDIT_STEP);
        if spare > 0 {
            state.credit -= spare;
            lock(&self.shared).return_credit(spare);
        }
    }
}

/// Whether `bytes` is more than the machine's memory, so freeing the idle cache cannot help.
/// Unknown (other systems, Miri) counts as no.
fn larger_than_memory(bytes: usize) -> bool {
    physical_memory().is_some_and(|total| bytes > total)
}

#[cfg(all(target_os = "linux", not(miri)))]
fn physical_memory() -> Option<usize> {
    static TOTAL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    })
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn physical_memory() -> Option<usize> {
    None
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
