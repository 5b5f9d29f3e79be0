//! The temp-allocator interface kernels take their scratch from.

use core::ptr::NonNull;

use crate::AllocError;

/// Where a kernel gets its scratch memory: the Rust shape of ExecuTorch's temp allocator.
///
/// A kernel calls [`allocate`](TempAllocator::allocate) as often as it likes and never frees;
/// the memory stays valid until the *owner* of the allocator (the runtime, never the kernel)
/// calls [`reset`](TempAllocator::reset) after the kernel returns. Memory is not zeroed.
///
/// # Safety
/// Kernels write through the pointers they get without checking them, so an implementation
/// promises: a pointer from `allocate(size, align)` is aligned to `align`, valid for reads and
/// writes of `size` bytes, and overlaps no other block handed out since the last `reset`; it
/// stays so until the next `reset` (or until the allocator is dropped).
pub unsafe trait TempAllocator {
    /// Returns `size` bytes aligned to `align` (a power of two), valid until the next `reset`.
    ///
    /// # Errors
    /// Whatever the implementation refuses; [`AllocError`] says why.
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError>;

    /// Takes back everything handed out since the last reset.
    ///
    /// # Safety
    /// No memory handed out by `allocate` since the last reset may be read, written or
    /// released after this call, and no other call on this allocator may run concurrently.
    unsafe fn reset(&self);
}
