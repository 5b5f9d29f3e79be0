//! Importing the kernel-facing and runtime traits does not change what `alloc.reset()` means:
//! it stays the safe, borrow-checked `reset(&mut self)`. (When the trait's reset was
//! `unsafe fn reset(&self)` on `TempAllocator`, importing it made this file fail to compile:
//! method lookup picked the trait's `&self` method, an unsafe call outside `unsafe`, E0133.)
#![deny(unused_mut)]

use caching_allocator::{CachingAllocator, Scratch, TempAllocator, TempReset};

/// A kernel generic over its temp allocator, as sdpa's and llm's are.
fn kernel(temp: &(impl TempAllocator + ?Sized)) -> usize {
    let scratch = Scratch::new(temp);
    let xs = scratch.alloc_fill(100, 1.0f32).unwrap();
    assert_eq!(xs.iter().sum::<f32>(), 100.0);
    xs.as_ptr() as usize
}

#[test]
fn importing_the_traits_keeps_the_safe_reset() {
    let mut alloc = CachingAllocator::new(1 << 20);
    let first = kernel(&alloc);
    alloc.reset(); // the safe reset: `&mut alloc` proves the kernel's slices are gone
    assert_eq!(alloc.stats().live_blocks, 0);
    assert_eq!(kernel(&alloc), first, "the reset gave the memory back");
    // The runtime's reset through the trait, for allocators it only knows as `TempReset`.
    fn runtime_reset(temp: &impl TempReset) {
        // SAFETY: nothing handed out before is used after this.
        unsafe { temp.reset_unchecked() };
    }
    runtime_reset(&alloc);
    assert_eq!(alloc.stats().live_blocks, 0);
}

#[test]
fn scratch_slices_are_typed_zeroed_and_aligned() {
    let alloc = CachingAllocator::new(1 << 20);
    let scratch = Scratch::new(&alloc);
    let z = scratch.alloc_zeroed::<u64>(33).unwrap();
    assert!(z.iter().all(|&v| v == 0));
    assert_eq!(z.as_ptr() as usize % 64, 0);
    let empty = scratch.alloc_zeroed::<f32>(0).unwrap();
    assert!(empty.is_empty());
    let e = scratch.alloc_uninit::<u32>(usize::MAX / 2).unwrap_err();
    assert!(
        matches!(e, caching_allocator::AllocError::SizeOverflow { size, .. } if size == usize::MAX / 2)
    );
    assert_eq!(alloc.stats().live_blocks, 1);
}
