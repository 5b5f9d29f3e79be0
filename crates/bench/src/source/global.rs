//! `system`, `mimalloc`, `jemalloc`: a general-purpose allocator through its `GlobalAlloc`
//! methods (called directly, not installed as the process's global allocator).

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use core::ptr::NonNull;

use super::{AllocError, BlockWorker, Counters, PerBlock, ScratchSource, ScratchWorker};

/// A general-purpose allocator used through its [`GlobalAlloc`] methods.
#[derive(Debug)]
pub struct GlobalAllocSource<A> {
    alloc: A,
}

impl<A: GlobalAlloc + Send + Sync> GlobalAllocSource<A> {
    /// A source over `alloc`.
    pub fn new(alloc: A) -> Self {
        GlobalAllocSource { alloc }
    }
}

impl<A: GlobalAlloc + Send + Sync> ScratchSource for GlobalAllocSource<A> {
    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new(BlockWorker::new(Mallocs {
            alloc: &self.alloc,
            allocs: Cell::new(0),
        }))
    }
}

/// A thread's handle on a [`GlobalAllocSource`].
struct Mallocs<'a, A> {
    alloc: &'a A,
    /// Number of `alloc` calls made.
    allocs: Cell<u64>,
}

impl<A: GlobalAlloc> PerBlock for Mallocs<'_, A> {
    type Held = (NonNull<u8>, Layout);

    fn take(&self, size: usize, align: usize) -> Result<(NonNull<u8>, Self::Held), AllocError> {
        let layout = Layout::from_size_align(size, align)
            .map_err(|_| AllocError::SizeOverflow { size, align })?;
        // SAFETY: `take` is never asked for size 0, so the layout has a non-zero size.
        let ptr = unsafe { self.alloc.alloc(layout) };
        self.allocs.set(self.allocs.get() + 1);
        let ptr = NonNull::new(ptr).ok_or(AllocError::OutOfMemory { size, align })?;
        Ok((ptr, (ptr, layout)))
    }

    unsafe fn give_back(&self, (ptr, layout): Self::Held) {
        // SAFETY: `ptr` came from `self.alloc.alloc(layout)` and is freed once (the caller's
        // promise), so it is not used after.
        unsafe { self.alloc.dealloc(ptr.as_ptr(), layout) };
    }

    fn counters(&self) -> Counters {
        Counters::allocs(self.allocs.get())
    }
}
