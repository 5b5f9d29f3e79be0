//! `Scope`: the safe API. Slices borrow the scope, so the borrow checker forbids using them
//! after the scope is dropped or across `reset(&mut self)`.

use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::{align_of, size_of, MaybeUninit};
use core::ptr::NonNull;

use crate::allocator::{dangling, Request};
use crate::block::MIN_ALIGN;
use crate::config::SCOPE_BUMP_MAX;
use crate::thread_cache::{CacheState, Local, Scoped};
use crate::SizeClass;
use crate::{AllocError, CachingAllocator};

/// A region of scratch allocations that all go back to the cache when the scope is dropped.
///
/// Made by [`CachingAllocator::scope`]. Allocating takes `&self`, so one scope hands out many
/// slices at once; each slice borrows the scope, so none outlives it:
///
/// ```compile_fail
/// let alloc = caching_allocator::CachingAllocator::new(1 << 20);
/// let scope = alloc.scope();
/// let xs = scope.alloc_slice_fill(4, 0.0f32).unwrap();
/// drop(scope);
/// xs[0] = 1.0; // error: `scope` was dropped while `xs` borrows it
/// ```
///
/// Scopes nest, in any order, and each thread may hold its own scopes on one shared
/// allocator. A scope stays on the thread that made it (it is not `Send`); the slices it hands
/// out may go to other threads.
pub struct Scope<'a> {
    alloc: &'a CachingAllocator,
    /// This thread's cache, where the scope's blocks are booked (`Local` is not `Send`, so
    /// neither is the scope).
    cache: Local<'a>,
    id: u64,
    /// How many blocks of this scope are live in `cache`.
    blocks: Cell<usize>,
    /// The free part of the current bump chunk: its start (with the chunk's provenance) and
    /// length. Empty until the first small request.
    bump: Cell<*mut u8>,
    bump_left: Cell<usize>,
    /// Chunks taken so far: each is twice the last, up to 16 times the first, so a scope that
    /// makes many small requests takes few chunks (as bumpalo's chunks grow).
    chunks: Cell<u32>,
    /// The first chunk: the thread's spare scope chunk, borrowed without a lock (`Lent`), or
    /// one taken from the cache (`Taken`), which may become the spare when the scope drops.
    first_chunk: Cell<FirstChunk>,
    /// Explicit, though `Local` already makes the scope `!Send`.
    _not_send: PhantomData<*mut ()>,
}

/// Where a scope's first chunk came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FirstChunk {
    None,
    Lent,
    /// The chunk's address.
    Taken(usize),
}

/// A scope's chunks double up to `2^MAX_CHUNK_DOUBLINGS` times the first.
const MAX_CHUNK_DOUBLINGS: u32 = 4;

impl CachingAllocator {
    /// Opens a [`Scope`]: allocations made through it go back to the cache when it is dropped.
    #[inline]
    pub fn scope(&self) -> Scope<'_> {
        let cache = self.thread_cache();
        let id = cache.scope_opened();
        Scope {
            alloc: self,
            cache,
            id,
            blocks: Cell::new(0),
            bump: Cell::new(core::ptr::null_mut()),
            bump_left: Cell::new(0),
            chunks: Cell::new(0),
            first_chunk: Cell::new(FirstChunk::None),
            _not_send: PhantomData,
        }
    }
}

// Allocating methods take `&self` and return `&mut [T]`, as bumpalo's do: each call hands out
// a distinct block that no other slice, and nothing in the scope, refers to, so the `&mut`
// aliases nothing; tying it to the `&self` borrow is what keeps it from outliving the scope.
#[allow(clippy::mut_from_ref)]
impl<'a> Scope<'a> {
    /// The allocator this scope takes from.
    pub fn allocator(&self) -> &'a CachingAllocator {
        self.alloc
    }

    /// A slice of `len` uninitialised `T`s (with debug checks on, every byte is `0xFF`).
    ///
    /// # Errors
    /// [`AllocError::SizeOverflow`] if `len * size_of::<T>()` overflows (the error's `size`
    /// is then `len`), and the errors of [`CachingAllocator::allocate`].
    #[inline]
    pub fn alloc_uninit<T: Copy>(&self, len: usize) -> Result<&mut [MaybeUninit<T>], AllocError> {
        let align = align_of::<T>();
        let size = len
            .checked_mul(size_of::<T>())
            .ok_or(AllocError::SizeOverflow { size: len, align })?;
        let ptr = if size <= SCOPE_BUMP_MAX && align <= SCOPE_BUMP_MAX && size > 0 {
            match self.bump(size, align) {
                Some(ptr) => ptr,
                None => self.block(size, align)?,
            }
        } else {
            self.block(size, align)?
        };
        // SAFETY: `ptr` is aligned for `T` and valid for `size = len * size_of::<T>()` bytes: a
        // fresh block of at least that class size, a part of the scope's chunk that the bump
        // pointer has just moved past (so no other slice has it), or dangling when `size` is 0.
        // It is owned by this scope alone until the scope is dropped, which the returned borrow
        // of `self` cannot outlive. `MaybeUninit<T>` needs no initialisation.
        Ok(unsafe { core::slice::from_raw_parts_mut(ptr.as_ptr().cast(), len) })
    }

    /// A small request from the bump chunk, taking a new chunk when the current one is full.
    /// `None` when chunks are off, or the cache could not give a chunk (the caller then asks
    /// for a block of the request's own size, which reports the error if there is one).
    #[inline(always)]
    fn bump(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        let start = self.bump.get();
        let pad = (start as usize).wrapping_neg() & (align - 1);
        let left = self.bump_left.get();
        if pad + size <= left {
            // SAFETY: `left > 0` (as `size > 0`) only once `bump_slow` set `start` into a chunk
            // this scope owns with `left` free bytes from `start` on; `pad + size <= left`
            // keeps `start + pad + size` within it.
            let ptr = unsafe { start.add(pad) };
            // SAFETY: as above.
            self.bump.set(unsafe { ptr.add(size) });
            self.bump_left.set(left - pad - size);
            // SAFETY: `ptr` is inside a live chunk block, so not null.
            return Some(unsafe { NonNull::new_unchecked(ptr) });
        }
        self.bump_slow(size, align)
    }

    #[cold]
    fn bump_slow(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        if self.alloc.scope_chunk == 0 {
            return None;
        }
        let n = self.chunks.get();
        let lent = if n == 0 && self.cache.owned() {
            // SAFETY: the owner thread (`owned`; a scope stays on the thread of its `Local`),
            // and no other borrow of the arena is alive (it is confined to this statement).
            let arena = unsafe { self.cache.arena.owner() };
            // A spare was a scope's first chunk: at least `scope_chunk` bytes.
            arena.lend_spare(&self.cache.arena.shared, self.alloc.scope_chunk)
        } else {
            None
        };
        let (chunk, class_size) = match lent {
            Some(spare) => {
                self.first_chunk.set(FirstChunk::Lent);
                (spare.ptr, spare.size())
            }
            None => {
                let class =
                    SizeClass::for_size(self.alloc.scope_chunk << n.min(MAX_CHUNK_DOUBLINGS))?;
                let req = Request {
                    size: class.size(),
                    align: MIN_ALIGN,
                    class: Some(class),
                    retry: true,
                };
                let chunk = self.take_block(class, &req).ok()?;
                if n == 0 {
                    self.first_chunk
                        .set(FirstChunk::Taken(chunk.as_ptr().addr()));
                }
                (chunk, class.size())
            }
        };
        self.chunks.set(n + 1);
        // A new chunk is 64-aligned and at least twice `SCOPE_BUMP_MAX` long, so a request of
        // at most `SCOPE_BUMP_MAX` bytes and alignment fits with its padding.
        let start = chunk.as_ptr();
        let pad = (start as usize).wrapping_neg() & (align - 1);
        debug_assert!(pad + size <= class_size);
        // SAFETY: `pad + size <= class_size`: inside the chunk.
        let ptr = unsafe { start.add(pad) };
        // SAFETY: as above.
        self.bump.set(unsafe { ptr.add(size) });
        self.bump_left.set(class_size - pad - size);
        NonNull::new(ptr)
    }

    /// A block of its own for `size` bytes (`dangling` for 0), booked to this scope.
    #[inline]
    fn block(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let req = self.alloc.request(size, align)?;
        match req.class {
            Some(class) => self.take_block(class, &req),
            None => Ok(dangling(align)),
        }
    }

    #[inline]
    fn take_block(&self, class: SizeClass, req: &Request) -> Result<NonNull<u8>, AllocError> {
        let block = self
            .alloc
            .take(self.cache, class, req, true, |state, live| {
                state.scoped.push(Scoped {
                    scope: self.id,
                    live,
                });
            })?;
        self.blocks.set(self.blocks.get() + 1);
        Ok(block.ptr)
    }

    /// A slice of `len` copies of `value`.
    ///
    /// # Errors
    /// As [`alloc_uninit`](Self::alloc_uninit).
    #[inline]
    pub fn alloc_slice_fill<T: Copy>(&self, len: usize, value: T) -> Result<&mut [T], AllocError> {
        let slice = self.alloc_uninit(len)?;
        for slot in slice.iter_mut() {
            slot.write(value);
        }
        // SAFETY: every element was just written.
        Ok(unsafe { assume_init(slice) })
    }

    /// A copy of `src`.
    ///
    /// # Errors
    /// As [`alloc_uninit`](Self::alloc_uninit).
    #[inline]
    pub fn alloc_slice_copy<T: Copy>(&self, src: &[T]) -> Result<&mut [T], AllocError> {
        let slice = self.alloc_uninit(src.len())?;
        for (slot, value) in slice.iter_mut().zip(src) {
            slot.write(*value);
        }
        // SAFETY: every element was just written.
        Ok(unsafe { assume_init(slice) })
    }

    /// A slice of `len` all-zero `T`s; `T: Zeroable` promises all-zero bytes are a valid `T`.
    ///
    /// # Errors
    /// As [`alloc_uninit`](Self::alloc_uninit).
    #[inline]
    pub fn alloc_slice_zeroed<T: bytemuck::Zeroable + Copy>(
        &self,
        len: usize,
    ) -> Result<&mut [T], AllocError> {
        let slice = self.alloc_uninit::<T>(len)?;
        // SAFETY: the slice's memory is ours and `len * size_of::<T>()` bytes long.
        unsafe { slice.as_mut_ptr().write_bytes(0, len) };
        // SAFETY: all-zero bytes are a valid `T` (`Zeroable`), and all bytes were zeroed.
        Ok(unsafe { assume_init(slice) })
    }
}

/// # Safety
/// Every element of `slice` is initialised.
#[inline]
unsafe fn assume_init<T>(slice: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and the caller vouches every element is
    // initialised.
    unsafe { &mut *(slice as *mut [MaybeUninit<T>] as *mut [T]) }
}

impl Scope<'_> {
    /// Keeps the scope's first chunk (`entry`, just taken out of the books of the locked
    /// cache `state`) as the thread's spare scope chunk, if the cache's credit covers it.
    fn keep_as_spare(&self, state: &mut CacheState, entry: Scoped) -> bool {
        let chunk = entry.live.block;
        if state.scope_chunk.is_some() || state.held() + chunk.size() > state.credit {
            return false;
        }
        state.scope_chunk = Some(chunk);
        // SAFETY: as in `bump_slow` (the caller checked `owned`); one borrow, here.
        unsafe { self.cache.arena.owner() }.set_spare(&self.cache.arena.shared, Some(chunk));
        true
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let first = self.first_chunk.get();
        if first == FirstChunk::Lent {
            // SAFETY: as in `bump_slow`: only an owned cache lends its spare, to scopes on its
            // thread; one borrow, in this statement.
            unsafe { self.cache.arena.owner() }.return_spare(&self.cache.arena.shared);
        }
        let mut remaining = self.blocks.get();
        if remaining == 0 {
            self.cache.scope_closed();
            return;
        }
        let keep = match first {
            FirstChunk::Taken(chunk) if self.cache.owned() => {
                // SAFETY: as above.
                unsafe { self.cache.arena.owner() }
                    .wants_spare()
                    .then_some(chunk)
            }
            _ => None,
        };
        let mut overruns = Vec::new();
        let mut spilled = Vec::new();
        let mut state = self.cache.lock();
        // One block of this scope, out of the scoped table: kept as the spare, or idle.
        let mut give_back = |state: &mut CacheState, entry: Scoped| {
            state.counters.remove_live(&entry.live);
            if keep == Some(entry.live.block.addr()) && self.keep_as_spare(state, entry) {
                return;
            }
            match self.alloc.checked(entry.live) {
                Ok(block) => spilled.extend(self.alloc.keep_idle(state, block)),
                Err(e) => overruns.push(e),
            }
        };
        // Scopes dropped in the order they were opened find their blocks on top.
        while remaining > 0 && state.scoped.last().is_some_and(|top| top.scope == self.id) {
            let Some(entry) = state.scoped.pop() else {
                break;
            };
            remaining -= 1;
            give_back(&mut state, entry);
        }
        // Dropped out of order: search the rest (another scope's blocks lie on top).
        let mut i = state.scoped.len();
        while remaining > 0 && i > 0 {
            i -= 1;
            if state.scoped[i].scope == self.id {
                let entry = state.scoped.remove(i);
                remaining -= 1;
                give_back(&mut state, entry);
            }
        }
        self.cache.publish(&state);
        drop(state);
        for block in spilled {
            self.alloc.keep_or_free(self.cache.cache(), block);
        }
        self.cache.scope_closed();
        if !overruns.is_empty() && !std::thread::panicking() {
            let list: Vec<String> = overruns.iter().map(ToString::to_string).collect();
            panic!(
                "caching-allocator: a Scope's blocks were overrun: {}",
                list.join("; ")
            );
        }
    }
}
