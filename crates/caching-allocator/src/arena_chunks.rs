//! The arena's side of `allocate` and `release` past their fast paths, and its chunk's life:
//! the first chunk, growth at a rewind, the revocation of a stale arena's chunk by a trim,
//! parking at a thread's trim. The arena's own
//! state and rules are in `arena`; this module is where the allocator's books (the cap's
//! credit, the idle blocks) meet them, through `take` and `keep_idle`.

use core::ptr::NonNull;

use crate::allocator::{CachingAllocator, Request};
use crate::arena::{ARENA_MAX_ALIGN, MIN_CHUNK};
use crate::block::Block;
use crate::sync::Ordering;
use crate::thread_cache::{CacheState, Local};
use crate::{AllocError, SizeClass};

/// The stride at which [`fault_in`] writes: the smallest page of the targets (4 KiB; larger
/// pages are written more than once, which costs nothing more).
const PAGE: usize = 4096;

/// Writes one byte of every page of a chunk the arena is about to take, so that every page is
/// in memory from the start, as a fixed buffer's would be. The arena cuts the same bytes into
/// other blocks every interval, and a kernel may write only part of each block (ExecuTorch's
/// SDPA decode asks for a slab per thread and, with fewer heads than threads, writes 3 of 8):
/// without this, a page a layout of the warm-up left unwritten faults in when a later layout
/// writes it, long after the chunk was taken (`scripts/executorch-programs.sh` saw 2 faults in
/// the first execute after warm-up). Growth is rare and cold; a page already in memory costs
/// one store.
///
/// The caller holds `chunk` alone: taken, not yet booked anywhere.
#[cold]
fn fault_in(chunk: Block) {
    let base = chunk.ptr.as_ptr();
    for offset in (0..chunk.size()).step_by(PAGE) {
        // SAFETY: `offset < size`, so the byte lies in the chunk, a block the caller just took
        // from the cache or the system and holds alone (in no books yet: no other thread can
        // reach it, no arena bumps through it, no caller was handed any of it); its contents
        // are unspecified, so a 0 changes nothing anyone may read. Volatile: the store is for
        // its side effect (the page in memory), not its value.
        unsafe { base.add(offset).write_volatile(0) };
    }
}

impl CachingAllocator {
    /// A request above `arena_max` that the adaptive arena may take (`arena_may_take`): bumped
    /// if this thread's arena, in the current interval, takes large requests now
    /// (`Arena::takes_large`), else through the size classes. `None` for a first call or an
    /// arena behind the epoch: the rest of `allocate_slow` rewinds it first.
    #[inline(always)]
    pub(crate) fn allocate_large(
        &self,
        size: usize,
        align: usize,
    ) -> Option<Result<NonNull<u8>, AllocError>> {
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
        // The arena's slow path: other threads' marks, its first chunk, or a miss.
        Some(match self.arena_slow(local, size, align) {
            Some(ptr) => Ok(ptr),
            None => self.allocate_missed(local, size, align),
        })
    }

    /// Whether a request above `arena_max` is one the adaptive arena may take: at most
    /// `arena_large` bytes, aligned as the arena serves.
    #[inline(always)]
    pub(crate) fn arena_may_take(&self, size: usize, align: usize) -> bool {
        self.arena_max < size && size <= self.arena_large && crate::arena::serves_align(align)
    }

    /// The first small request on this thread since a reset (or any request on a shared
    /// cache): rewinds the arena, then bumps; anything else goes to `allocate_slow`.
    #[cold]
    #[inline(never)]
    pub(crate) fn allocate_after_reset(
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
        let bumped = match self.rewind(local, arena, epoch) {
            None => arena.bump_or_miss(&local.arena.shared, size, align),
            grow => self.grow_and_bump(local, grow, epoch, size, align),
        };
        match bumped {
            Some(ptr) => Ok(ptr),
            None => self.allocate_missed(local, size, align),
        }
    }

    /// A large request (`arena_may_take`) on the owner's thread (`local`, owned) that
    /// `allocate_large` could not serve: an arena behind the epoch is rewound first, so the
    /// choice (`Arena::takes_large`) and its count are this interval's. A request left to the
    /// size classes is served before the arena takes a larger chunk for its small requests,
    /// so a refusal changes nothing.
    #[cold]
    pub(crate) fn allocate_large_slow(
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
                self.rewind(local, arena, epoch)
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
    pub(crate) fn allocate_missed(
        &self,
        local: Local<'_>,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        debug_assert!(local.owned());
        // SAFETY: the owner thread (the callers checked `owned`); the borrow ends here.
        let next = unsafe { local.arena.owner() }.successor_for(
            &local.arena.shared,
            size,
            self.arena_large > 0,
        );
        // Under a hard limit the larger block could be what passes it: its own class only.
        // A large request of the adaptive arena (above `arena_max`) gets its own class too:
        // its class size is what the interval's peak (and a temp plan) counts, and the chunk
        // that should hold it grows at the next rewind anyway.
        let next = next.filter(|_| self.limit == usize::MAX && size <= self.arena_max);
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

    /// The arena could not serve a request on its fast path: rewind it after a reset (swapping
    /// its chunk for a larger one if the last interval wanted more), apply other threads'
    /// marks, or give it its first chunk; then try once more. `None`: the size classes
    /// serve this request (the chunk is full for this interval, or the cap cannot cover one).
    #[cold]
    pub(crate) fn arena_slow(
        &self,
        local: Local<'_>,
        size: usize,
        align: usize,
    ) -> Option<NonNull<u8>> {
        let sh = &local.arena.shared;
        let epoch = self.epoch.load(Ordering::Acquire);
        let grow = {
            // SAFETY: as in `allocate_after_reset`.
            let arena = unsafe { local.arena.owner() };
            if arena.epoch() != epoch {
                self.rewind(local, arena, epoch)
            } else {
                arena.apply_marks(sh);
                if let Some(ptr) = arena.bump(sh, size, align) {
                    return Some(ptr);
                }
                if !arena.is_empty(sh) || arena.has_chunk(sh) || arena.refused(epoch) {
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
    pub(crate) fn grow_and_bump(
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
    pub(crate) fn replace_chunk(&self, local: Local<'_>, bytes: usize) -> bool {
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
        // Now, while no other thread can reach the chunk: once booked as the arena's, a trim
        // may take it from an arena a reset left behind (`revoke_stale_chunks`) and free it.
        fault_in(chunk);
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
    pub(crate) fn charge_chunk(&self, local: Local<'_>, chunk: Block) -> bool {
        for _ in 0..3 {
            let mut state = local.lock();
            let short = (state.held() + chunk.size()).saturating_sub(state.credit);
            if short == 0 {
                state.arena_chunk = Some(chunk);
                self.chunks.insert(&chunk, &local.to_arc());
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

    /// Rewinds this thread's arena (`arena`, of `local`) to `epoch` (`Arena::rewind`, which
    /// also claims the chunk for `epoch`, or lets it go if a trim revoked it).
    #[inline(always)]
    pub(crate) fn rewind(
        &self,
        local: Local<'_>,
        arena: &mut crate::arena::Arena,
        epoch: usize,
    ) -> Option<usize> {
        arena.rewind(&local.arena.shared, epoch, self.arena_large > 0)
    }

    /// Takes the chunks of other threads' arenas whose epoch is behind the allocator's (a
    /// reset took their blocks and their owners have not called since) into their caches'
    /// idle blocks, where a trim reaches them. `ArenaShared::revoke` decides, with one CAS
    /// that races the owner's rewind: the loser leaves the chunk alone. The cache's lock
    /// orders the move with the owner's own changes of its chunk in the books.
    pub(crate) fn revoke_stale_chunks(&self) {
        self.registry.for_each(|cache| {
            if !cache.owned() {
                return;
            }
            let mut state = cache.lock();
            if state.arena_chunk.is_some() && cache.arena.shared.revoke(&self.epoch) {
                self.chunk_to_idle(&mut state);
                cache.publish(&state);
            }
        });
    }

    /// On the owner's thread: gives the arena's chunk back to the idle blocks if the arena
    /// holds nothing live, and the spare scope chunk if no scope has it (so a trim can free
    /// them).
    pub(crate) fn park_own_chunk(&self) {
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
                self.rewind(local, arena, epoch);
            }
            arena.apply_marks(sh);
            let spare = arena.spare_idle(sh);
            if spare {
                arena.set_spare(sh, None);
            }
            // Whether the arena bumps through it or not: a chunk booked by a call that raced a
            // reset and a trim (`charge_chunk` after the claim was revoked) is in the books
            // while the rewind has let go of its range.
            let chunk = arena.is_empty(sh);
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
    pub(crate) fn spare_to_idle(&self, state: &mut CacheState) {
        if let Some(chunk) = state.scope_chunk.take() {
            let stamp = self.clock.stamp(state);
            state.idle.push(chunk, stamp);
        }
    }

    /// Moves a locked cache's arena chunk, if any, into its idle blocks (the most recently used
    /// of its class). Its credit stays: the chunk was charged as if idle, and now is. Only for
    /// a chunk no arena bumps through any more (see the callers).
    pub(crate) fn chunk_to_idle(&self, state: &mut CacheState) {
        if let Some(chunk) = state.arena_chunk.take() {
            self.chunks.remove(&chunk);
            let stamp = self.clock.stamp(state);
            state.idle.push(chunk, stamp);
        }
    }

    /// Releases `addr` if it is a live block of the calling thread's arena (`here`), with the
    /// arena's gate open.
    #[inline(always)]
    pub(crate) fn release_in_arena(&self, here: Local<'_>, addr: usize) -> bool {
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
    pub(crate) fn release_in_arena_applied(&self, here: Local<'_>, addr: usize) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        // SAFETY: as in `release_in_arena`.
        match unsafe { here.arena.current_applied(epoch) } {
            Some(arena) => arena.release(&here.arena.shared, addr),
            None => false,
        }
    }
}
