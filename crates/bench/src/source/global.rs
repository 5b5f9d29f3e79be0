//! `system`, `mimalloc`, `jemalloc`: a general-purpose allocator through its `GlobalAlloc`
//! methods (called directly, not installed as the process's global allocator).

use core::alloc::{GlobalAlloc, Layout};
use core::cell::{Cell, RefCell};
use core::ptr::NonNull;

use super::{
    call_with, check_align, dangling, AllocError, Block, Counters, ScratchSource, ScratchWorker,
    TempAllocator,
};

/// A general-purpose allocator used through its [`GlobalAlloc`] methods.
#[derive(Debug)]
pub struct GlobalAllocSource<A> {
    name: &'static str,
    alloc: A,
}

impl<A: GlobalAlloc + Send + Sync> GlobalAllocSource<A> {
    /// A source named `name` over `alloc`.
    pub fn new(name: &'static str, alloc: A) -> Self {
        GlobalAllocSource { name, alloc }
    }
}

impl<A: GlobalAlloc + Send + Sync> ScratchSource for GlobalAllocSource<A> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new(GlobalAllocWorker {
            alloc: &self.alloc,
            live: RefCell::new(Vec::with_capacity(64)),
            allocs: Cell::new(0),
        })
    }
}

/// A thread's handle on a [`GlobalAllocSource`].
struct GlobalAllocWorker<'a, A: GlobalAlloc> {
    alloc: &'a A,
    /// Blocks handed out through `TempAllocator::allocate`, freed by `reset`.
    live: RefCell<Vec<(NonNull<u8>, Layout)>>,
    /// Number of `alloc` calls made.
    allocs: Cell<u64>,
}

impl<A: GlobalAlloc> GlobalAllocWorker<'_, A> {
    fn alloc_block(&self, size: usize, align: usize) -> Result<(NonNull<u8>, Layout), AllocError> {
        let layout = Layout::from_size_align(size, align)
            .map_err(|_| AllocError::SizeOverflow { size, align })?;
        // SAFETY: callers pass size > 0, so the layout has a non-zero size.
        let ptr = unsafe { self.alloc.alloc(layout) };
        self.allocs.set(self.allocs.get() + 1);
        NonNull::new(ptr)
            .map(|p| (p, layout))
            .ok_or(AllocError::OutOfMemory { size, align })
    }
}

// SAFETY: each block is a `GlobalAlloc` allocation with a layout of `size` bytes (at least
// one) and alignment `align`, freed only by `reset`.
unsafe impl<A: GlobalAlloc> TempAllocator for GlobalAllocWorker<'_, A> {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        check_align(align)?;
        if size == 0 {
            return Ok(dangling(align));
        }
        let (ptr, layout) = self.alloc_block(size, align)?;
        self.live.borrow_mut().push((ptr, layout));
        Ok(ptr)
    }

    unsafe fn reset(&self) {
        for (ptr, layout) in self.live.borrow_mut().drain(..) {
            // SAFETY: `ptr` came from `self.alloc.alloc(layout)` and is freed once: it is
            // drained from the live list here. The caller guarantees it is not used after.
            unsafe { self.alloc.dealloc(ptr.as_ptr(), layout) };
        }
    }
}

// SAFETY: each block is a fresh `alloc` of `size` bytes with the requested alignment, live
// (hence disjoint from the others) until it is freed after the kernel returns; the
// TempAllocator impl frees blocks only in `reset`.
unsafe impl<A: GlobalAlloc> ScratchWorker for GlobalAllocWorker<'_, A> {
    fn call(
        &mut self,
        sizes: &[usize],
        align: usize,
        blocks: &mut [Block],
        kernel: &mut dyn FnMut(&[Block]),
    ) -> Result<(), AllocError> {
        let alloc = self.alloc;
        let this = &*self;
        call_with(
            sizes,
            align,
            blocks,
            kernel,
            |size| {
                this.alloc_block(size, align)
                    .map(|(p, _)| Block::new(p, size))
            },
            |b| {
                // SAFETY: `b` was allocated by `alloc_block` with exactly this layout (the
                // layout was valid then, so it is valid now) and is freed once.
                unsafe {
                    alloc.dealloc(b.base, Layout::from_size_align_unchecked(b.base_len, align))
                }
            },
        )
    }

    fn counters(&self) -> Counters {
        Counters::allocs(self.allocs.get())
    }

    fn as_temp(&self) -> &dyn TempAllocator {
        self
    }
}

impl<A: GlobalAlloc> Drop for GlobalAllocWorker<'_, A> {
    fn drop(&mut self) {
        // SAFETY: dropping the worker ends the validity of everything it handed out, as a
        // reset would; `&mut self` proves nothing else is using it.
        unsafe { self.reset() };
    }
}
