//! `static`: buffers allocated once and reused, the floor no allocator can beat.
//!
//! Each worker keeps one buffer per block position of a call (the i-th block of every call
//! reuses the i-th buffer). A buffer grows only when a call asks for more than it has, which
//! in a benchmark happens during warm-up; after that a call allocates nothing.
//!
//! Buffers of [`HUGE_MIN`] bytes or more get what the caching allocator gives its blocks of
//! that size by default: 2 MiB alignment and `MADV_HUGEPAGE`. With plain malloc'd buffers
//! (4 KiB pages) the floor lost to the cache on scratch-large (0.86x): the kernel's sweeps
//! over 4-64 MiB took more TLB misses, a cost of the pages, not of allocating.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::{Cell, RefCell};
use core::ptr::NonNull;
use std::alloc::System;

use super::{zero_size, AllocError, Block, Call, Counters, ScratchWorker, TempAllocator};

/// One reusable buffer.
struct Slot {
    ptr: NonNull<u8>,
    layout: Layout,
}

/// A thread's preallocated buffers: the worker of `static`.
pub(crate) struct StaticWorker {
    slots: RefCell<Vec<Slot>>,
    /// Next slot `TempAllocator::allocate` hands out.
    next: Cell<usize>,
    /// Buffers allocated (or grown) so far.
    allocs: Cell<u64>,
}

impl StaticWorker {
    /// No buffers yet (the first calls allocate them).
    pub(crate) fn new() -> Self {
        StaticWorker {
            slots: RefCell::new(Vec::with_capacity(64)),
            next: Cell::new(0),
            allocs: Cell::new(0),
        }
    }
}

/// The buffer size from which `static` asks for huge pages: the caching allocator's default
/// `huge_page_min_bytes`, and the size of one huge page (the buffer's alignment then).
pub(crate) const HUGE_MIN: usize = 2 << 20;

/// Advises the kernel to back the whole huge pages of the buffer at `ptr` (`len` bytes,
/// [`HUGE_MIN`]-aligned) with huge pages; a refusal costs nothing but the call.
fn advise_huge_pages(ptr: NonNull<u8>, len: usize) {
    let whole = len & !(HUGE_MIN - 1);
    if whole > 0 {
        // SAFETY: `[ptr, ptr + whole)` lies inside a buffer just allocated and owned by this
        // worker alone; MADV_HUGEPAGE changes how the kernel backs the pages, never their
        // contents or who may access them.
        unsafe { libc::madvise(ptr.as_ptr().cast(), whole, libc::MADV_HUGEPAGE) };
    }
}

/// Makes sure `slots[i]` exists with at least `size` bytes at `align`; returns its pointer.
fn ensure(
    slots: &mut Vec<Slot>,
    allocs: &Cell<u64>,
    i: usize,
    size: usize,
    align: usize,
) -> Result<NonNull<u8>, AllocError> {
    if let Some(s) = slots.get(i) {
        if s.layout.size() >= size && s.layout.align() >= align {
            return Ok(s.ptr);
        }
    }
    let huge = size >= HUGE_MIN;
    let layout =
        Layout::from_size_align(size.max(1), if huge { align.max(HUGE_MIN) } else { align })
            .map_err(|_| AllocError::SizeOverflow { size, align })?;
    // SAFETY: the layout has a non-zero size.
    let raw = unsafe { System.alloc(layout) };
    let ptr = NonNull::new(raw).ok_or(AllocError::OutOfMemory { size, align })?;
    if huge {
        advise_huge_pages(ptr, layout.size());
    }
    allocs.set(allocs.get() + 1);
    let new = Slot { ptr, layout };
    if i < slots.len() {
        let old = core::mem::replace(&mut slots[i], new);
        // SAFETY: `old` was allocated by System with exactly `old.layout`, and is replaced
        // (so freed) once; no block of it is live (slots are only regrown between calls or
        // for a position not yet handed out since the last reset).
        unsafe { System.dealloc(old.ptr.as_ptr(), old.layout) };
    } else {
        slots.push(new);
    }
    Ok(ptr)
}

// SAFETY: the i-th request since a reset gets the i-th preallocated slot, grown to at least
// `size` bytes at an `align`-aligned address; slots are distinct and never freed before drop.
unsafe impl TempAllocator for StaticWorker {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = zero_size(size, align)? {
            return Ok(p);
        }
        let i = self.next.get();
        let p = ensure(&mut self.slots.borrow_mut(), &self.allocs, i, size, align)?;
        self.next.set(i + 1);
        Ok(p)
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for StaticWorker {
    unsafe fn reset_unchecked(&self) {
        self.next.set(0);
    }
}

// SAFETY: block i of a call is slot i, a distinct System allocation of at least `size` bytes
// at alignment >= `align`; slots are not touched again until the kernel has returned.
unsafe impl ScratchWorker for StaticWorker {
    fn call(&mut self, call: Call<'_>) -> Result<(), AllocError> {
        let (align, slots) = (call.align, self.slots.get_mut());
        call.run(|i, size| ensure(slots, &self.allocs, i, size, align).map(|p| Block::new(p, size)))
    }

    /// System allocations, and the bytes the buffers hold (they only grow, so that is also
    /// the peak). Live bytes are not counted: it would add work to the floor's calls.
    fn counters(&self) -> Counters {
        let held = self
            .slots
            .borrow()
            .iter()
            .map(|s| s.layout.size() as u64)
            .sum();
        Counters {
            peak_reserved: Some(held),
            ..Counters::allocs(self.allocs.get())
        }
    }
}

impl Drop for StaticWorker {
    fn drop(&mut self) {
        for s in self.slots.get_mut().drain(..) {
            // SAFETY: each slot was allocated by System with exactly its layout and is
            // drained (so freed) once; dropping the worker ends the validity of its blocks.
            unsafe { System.dealloc(s.ptr.as_ptr(), s.layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use caching_allocator::TempReset;

    #[test]
    fn big_buffers_are_huge_page_aligned_as_the_cache_gives_them() {
        let w = StaticWorker::new();
        let small = w.allocate(100_000, 64).unwrap();
        let big = w.allocate(3 << 20, 64).unwrap();
        assert_eq!(big.as_ptr() as usize % HUGE_MIN, 0);
        assert_ne!(small, big);
        // SAFETY: nothing allocated above is used after this.
        unsafe { w.reset_unchecked() };
        // The same slot, reused: the floor allocates once.
        assert_eq!(w.allocate(100_000, 64).unwrap(), small);
        assert_eq!(w.allocate(3 << 20, 64).unwrap(), big);
        assert_eq!(w.counters().system_allocs, Some(2));
    }
}
