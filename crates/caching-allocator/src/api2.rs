//! The `allocator-api2` trait, so Rust collections (`allocator_api2::vec::Vec`,
//! `hashbrown::HashMap`) can keep their memory in the cache.

use core::alloc::Layout;
use core::ptr::NonNull;

use allocator_api2::alloc::{AllocError as ApiAllocError, Allocator};

use crate::{AllocError, CachingAllocator};

// SAFETY: blocks handed out stay valid until deallocated or until a reset, which needs
// `&mut self` (impossible while a collection borrows the allocator) or `reset_unchecked`, whose
// contract forbids later use. Every block is at least `layout.size()` bytes and aligned to
// `layout.align()` (`request` rejects what cannot be served). Clones do not exist (`&A` is the
// shared handle), so any `&CachingAllocator` may free what another handed out.
unsafe impl Allocator for CachingAllocator {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, ApiAllocError> {
        let ptr = CachingAllocator::allocate(self, layout.size(), layout.align())
            .map_err(|_| ApiAllocError)?;
        // Report the requested size, not the class size: with debug checks the canary sits
        // right behind it, and `requested_bytes` stays true.
        Ok(NonNull::slice_from_raw_parts(ptr, layout.size()))
    }

    /// Gives the block back to the cache. With debug checks on, panics if the block was
    /// written past its end (the block is given back to the system first).
    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        // SAFETY: the trait's contract: `ptr` is currently allocated by this allocator and not
        // used after this call.
        match unsafe { self.release(ptr) } {
            Ok(()) => {}
            Err(e @ AllocError::Corrupted { .. }) => {
                if !std::thread::panicking() {
                    panic!("caching-allocator: {e}");
                }
            }
            // A pointer we do not know breaks the trait's contract; our books stay intact and
            // the memory behind it is not touched, so ignoring it is the safe answer.
            Err(_) => debug_assert!(false, "deallocate of a pointer this allocator does not own"),
        }
    }
}
