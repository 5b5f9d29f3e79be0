//! `Scratch`: typed slices over any [`TempAllocator`], for kernels, that the borrow checker
//! keeps within the kernel call.

use core::mem::{align_of, size_of, MaybeUninit};
use core::ptr::NonNull;

use crate::{AllocError, TempAllocator};

/// A kernel's typed view of its temp allocator: slices of `T` instead of raw pointers.
///
/// Each slice borrows the allocator for `'t`, so it cannot outlive the borrow the kernel was
/// given; the runtime resets only after the kernel returns (a safe `reset(&mut self)` cannot
/// even run while the borrow lives, and `TempReset::reset_unchecked` makes it the caller's
/// promise). Slices are at least 64-byte aligned (and to `align_of::<T>()`).
///
/// ```
/// use caching_allocator::{CachingAllocator, Scratch, TempAllocator};
///
/// fn softmax_kernel(x: &[f32], temp: &(impl TempAllocator + ?Sized)) -> Result<f32, caching_allocator::AllocError> {
///     let scratch = Scratch::new(temp);
///     let e = scratch.alloc_fill(x.len(), 0.0f32)?;
///     let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
///     for (e, &v) in e.iter_mut().zip(x) {
///         *e = (v - max).exp();
///     }
///     Ok(e.iter().sum())
/// }
///
/// let mut alloc = CachingAllocator::new(1 << 20);
/// let sum = softmax_kernel(&[1.0, 2.0, 3.0], &alloc)?;
/// assert!(sum > 1.0);
/// alloc.reset(); // the runtime's side, after the kernel: the safe reset
/// # Ok::<(), caching_allocator::AllocError>(())
/// ```
pub struct Scratch<'t, A: ?Sized> {
    temp: &'t A,
}

/// Every scratch slice is at least this aligned (one cache line, as the allocator's blocks).
const SCRATCH_ALIGN: usize = 64;

// Allocating methods take `&self` and return `&'t mut [T]`, as bumpalo's do: each call hands
// out a distinct block (the `TempAllocator` contract) that nothing else refers to.
#[allow(clippy::mut_from_ref)]
impl<'t, A: TempAllocator + ?Sized> Scratch<'t, A> {
    /// Typed scratch from `temp`.
    pub fn new(temp: &'t A) -> Self {
        Scratch { temp }
    }

    /// The allocator underneath, for kernels that take a `TempAllocator` themselves.
    pub fn allocator(&self) -> &'t A {
        self.temp
    }

    /// `len` uninitialised `T`s.
    ///
    /// # Errors
    /// [`AllocError::SizeOverflow`] if `len * size_of::<T>()` overflows (its `size` is then
    /// `len`); [`AllocError::InvalidAlignment`] if the allocator broke its alignment promise;
    /// and whatever the allocator refuses.
    pub fn alloc_uninit<T: Copy>(
        &self,
        len: usize,
    ) -> Result<&'t mut [MaybeUninit<T>], AllocError> {
        let align = align_of::<T>().max(SCRATCH_ALIGN);
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(AllocError::SizeOverflow { size: len, align })?;
        let ptr = if bytes == 0 {
            NonNull::<MaybeUninit<T>>::dangling().cast::<u8>()
        } else {
            let p = self.temp.allocate(bytes, align)?;
            if !p.as_ptr().addr().is_multiple_of(align) {
                return Err(AllocError::InvalidAlignment { align });
            }
            p
        };
        // SAFETY: `ptr` is aligned for `T` (checked, or dangling for no bytes) and valid for
        // `len * size_of::<T>()` bytes until the next reset (the `TempAllocator` contract),
        // which cannot come while `'t`'s borrow lives (see the type's docs); no other block
        // overlaps it. `MaybeUninit<T>` needs no initialisation.
        Ok(unsafe { core::slice::from_raw_parts_mut(ptr.as_ptr().cast(), len) })
    }

    /// `len` copies of `value`.
    ///
    /// # Errors
    /// As [`alloc_uninit`](Self::alloc_uninit).
    pub fn alloc_fill<T: Copy>(&self, len: usize, value: T) -> Result<&'t mut [T], AllocError> {
        let slice = self.alloc_uninit(len)?;
        for slot in slice.iter_mut() {
            slot.write(value);
        }
        // SAFETY: every element was just written.
        Ok(unsafe { assume_init(slice) })
    }

    /// `len` all-zero `T`s; `T: Zeroable` promises all-zero bytes are a valid `T`.
    ///
    /// # Errors
    /// As [`alloc_uninit`](Self::alloc_uninit).
    pub fn alloc_zeroed<T: bytemuck::Zeroable + Copy>(
        &self,
        len: usize,
    ) -> Result<&'t mut [T], AllocError> {
        let slice = self.alloc_uninit::<T>(len)?;
        // SAFETY: the slice's memory is ours and `len * size_of::<T>()` bytes long.
        unsafe { slice.as_mut_ptr().write_bytes(0, len) };
        // SAFETY: all-zero bytes are a valid `T` (`Zeroable`), and all bytes were zeroed.
        Ok(unsafe { assume_init(slice) })
    }
}

/// # Safety
/// Every element of `slice` is initialised.
unsafe fn assume_init<T>(slice: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and the caller vouches every element is
    // initialised.
    unsafe { &mut *(slice as *mut [MaybeUninit<T>] as *mut [T]) }
}
