//! The temp-allocator interface: kernels take scratch through [`TempAllocator`], and the
//! runtime that owns the allocator resets it through [`TempReset`].

use core::ptr::NonNull;

use crate::AllocError;

/// Where a kernel gets its scratch memory: the Rust shape of ExecuTorch's temp allocator.
///
/// A kernel calls [`allocate`](TempAllocator::allocate) as often as it likes and never frees;
/// the memory stays valid until the *owner* of the allocator (the runtime, never the kernel)
/// resets it after the kernel returns, through [`TempReset`]. Memory is not zeroed. A kernel
/// that wants typed, borrow-checked slices wraps its allocator in a [`Scratch`](crate::Scratch).
///
/// Kernels import only this trait, which has no reset: importing it cannot change what
/// `alloc.reset()` means on a [`CachingAllocator`](crate::CachingAllocator) (its safe
/// `reset(&mut self)`).
///
/// # Safety
/// Kernels write through the pointers they get without checking them, so an implementation
/// promises: a pointer from `allocate(size, align)` is aligned to `align`, valid for reads and
/// writes of `size` bytes, and overlaps no other block handed out since the last reset; it
/// stays so until the next reset (or until the allocator is dropped).
pub unsafe trait TempAllocator {
    /// Returns `size` bytes aligned to `align` (a power of two), valid until the next reset.
    ///
    /// # Errors
    /// Whatever the implementation refuses; [`AllocError`] says why.
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError>;
}

/// The runtime's side of a temp allocator: taking back everything handed out, after a kernel.
///
/// A separate trait from [`TempAllocator`] so that kernels, which must never reset, do not
/// see the method, and so that its name (`reset_unchecked`, the same as
/// [`CachingAllocator::reset_unchecked`](crate::CachingAllocator::reset_unchecked), which
/// method lookup picks first) cannot shadow a safe inherent `reset`.
///
/// # Safety
/// After `reset_unchecked` returns, the implementation may hand out again any memory it handed
/// out before the call.
pub unsafe trait TempReset: TempAllocator {
    /// Takes back everything handed out since the last reset.
    ///
    /// # Safety
    /// No memory handed out by `allocate` since the last reset may be read, written or
    /// released after this call, and no other call on this allocator may run concurrently.
    unsafe fn reset_unchecked(&self);
}
