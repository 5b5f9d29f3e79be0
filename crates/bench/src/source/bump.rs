//! `bumpalo`: one `bumpalo::Bump` arena per thread, reset after every call.
//!
//! Every workload here fits an arena (all of a call's blocks die together), so this is the
//! arena's best case. `Bump::reset` keeps only the last (largest) chunk, so a call that needs
//! more than that chunk allocates new chunks again on every call until the chunk has grown
//! enough; those chunk allocations are counted as system allocations.

use core::alloc::Layout;
use core::cell::{Cell, RefCell};
use core::ptr::NonNull;

use bumpalo::Bump;

use super::{
    call_with, check_align, dangling, AllocError, Block, Counters, ScratchSource, ScratchWorker,
    TempAllocator,
};

/// A `Bump` per worker.
#[derive(Debug, Default)]
pub struct BumpaloSource;

impl ScratchSource for BumpaloSource {
    fn name(&self) -> &'static str {
        "bumpalo"
    }

    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new(BumpWorker {
            bump: RefCell::new(Bump::new()),
            chunks: Cell::new(0),
        })
    }
}

/// A thread's arena.
struct BumpWorker {
    bump: RefCell<Bump>,
    /// Chunks allocated from the system so far.
    chunks: Cell<u64>,
}

fn bump_alloc(bump: &Bump, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
    let layout = Layout::from_size_align(size, align)
        .map_err(|_| AllocError::SizeOverflow { size, align })?;
    bump.try_alloc_layout(layout)
        .map_err(|_| AllocError::OutOfMemory { size, align })
}

// SAFETY: bumpalo hands out distinct, aligned regions of `size` bytes that stay valid until
// the arena is reset, which only `reset` does.
unsafe impl TempAllocator for BumpWorker {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        check_align(align)?;
        if size == 0 {
            return Ok(dangling(align));
        }
        bump_alloc(&self.bump.borrow(), size, align)
    }

    unsafe fn reset(&self) {
        self.bump.borrow_mut().reset();
    }
}

// SAFETY: a Bump hands out disjoint, aligned regions of `size` bytes that stay valid until
// `Bump::reset`, which runs only after the kernel returns (or in `TempAllocator::reset`).
unsafe impl ScratchWorker for BumpWorker {
    fn call(
        &mut self,
        sizes: &[usize],
        align: usize,
        blocks: &mut [Block],
        kernel: &mut dyn FnMut(&[Block]),
    ) -> Result<(), AllocError> {
        let bump = self.bump.get_mut();
        // After a reset one chunk is left (none before the first call).
        let before = bump.iter_allocated_chunks().count() as u64;
        let res = {
            let b: &Bump = bump;
            call_with(
                sizes,
                align,
                blocks,
                kernel,
                |size| bump_alloc(b, size, align).map(|p| Block::new(p, size)),
                |_| {},
            )
        };
        let after = bump.iter_allocated_chunks().count() as u64;
        self.chunks
            .set(self.chunks.get() + after.saturating_sub(before));
        bump.reset();
        res
    }

    fn counters(&self) -> Counters {
        Counters::allocs(self.chunks.get())
    }

    fn as_temp(&self) -> &dyn TempAllocator {
        self
    }
}
