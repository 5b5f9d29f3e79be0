//! `Scope`: the safe API. Slices borrow the scope, so the borrow checker forbids using them
//! after the scope is dropped or across `reset(&mut self)`.

use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::{align_of, size_of, MaybeUninit};
use core::ptr::NonNull;

use crate::allocator::dangling;
use crate::thread_cache::{Local, Scoped};
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
    /// Explicit, though `Local` already makes the scope `!Send`.
    _not_send: PhantomData<*mut ()>,
}

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
        let req = self.alloc.request(size, align)?;
        let ptr: NonNull<u8> = if let Some(class) = req.class {
            let block = self.alloc.take(self.cache, class, &req, |state, live| {
                state.scoped.push(Scoped {
                    scope: self.id,
                    live,
                });
            })?;
            self.blocks.set(self.blocks.get() + 1);
            block.ptr
        } else {
            dangling(align)
        };
        // SAFETY: `ptr` is aligned for `T` and valid for `size = len * size_of::<T>()` bytes
        // (a fresh block of at least that class size, or dangling when `size` is 0), owned by
        // this scope alone until it is dropped, which the returned borrow of `self` outlives
        // not. `MaybeUninit<T>` needs no initialisation.
        Ok(unsafe { core::slice::from_raw_parts_mut(ptr.as_ptr().cast(), len) })
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

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let mut remaining = self.blocks.get();
        if remaining == 0 {
            self.cache.scope_closed();
            return;
        }
        let mut overruns = Vec::new();
        let mut spilled = Vec::new();
        let mut state = self.cache.lock();
        // Scopes dropped in the order they were opened find their blocks on top.
        while remaining > 0 {
            match state.scoped.last() {
                Some(top) if top.scope == self.id => {}
                _ => break,
            }
            let Some(entry) = state.scoped.pop() else {
                break;
            };
            remaining -= 1;
            state.counters.remove_live(&entry.live);
            match self.alloc.checked(entry.live) {
                Ok(block) => spilled.extend(self.alloc.cache_locked(&mut state, block)),
                Err(e) => overruns.push(e),
            }
        }
        // Dropped out of order: search the rest (another scope's blocks lie on top).
        let mut i = state.scoped.len();
        while remaining > 0 && i > 0 {
            i -= 1;
            if state.scoped[i].scope == self.id {
                let entry = state.scoped.remove(i);
                remaining -= 1;
                state.counters.remove_live(&entry.live);
                match self.alloc.checked(entry.live) {
                    Ok(block) => spilled.extend(self.alloc.cache_locked(&mut state, block)),
                    Err(e) => overruns.push(e),
                }
            }
        }
        self.cache.publish(&state);
        drop(state);
        for block in spilled {
            self.alloc.cache_slow(self.cache.cache(), block);
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
