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

use super::{zero_size, AllocError, Counters, ScratchWorker, TempAllocator};

/// A thread's arena: the worker of `bumpalo`.
pub(crate) struct BumpWorker {
    bump: RefCell<Bump>,
    /// Chunks allocated from the system so far.
    chunks: Cell<u64>,
    /// Chunks the arena kept at its last reset (one after a reset; none before the first).
    kept: Cell<u64>,
}

impl BumpWorker {
    /// An empty arena.
    pub(crate) fn new() -> Self {
        BumpWorker {
            bump: RefCell::new(Bump::new()),
            chunks: Cell::new(0),
            kept: Cell::new(0),
        }
    }
}

// SAFETY: bumpalo hands out distinct, aligned regions of `size` bytes that stay valid until
// the arena is reset, which only `reset` does (the default `call` resets after the kernel).
unsafe impl TempAllocator for BumpWorker {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = zero_size(size, align)? {
            return Ok(p);
        }
        let layout = Layout::from_size_align(size, align)
            .map_err(|_| AllocError::SizeOverflow { size, align })?;
        self.bump
            .borrow()
            .try_alloc_layout(layout)
            .map_err(|_| AllocError::OutOfMemory { size, align })
    }

    unsafe fn reset(&self) {
        let mut bump = self.bump.borrow_mut();
        // Every chunk beyond the ones kept at the last reset came from the system since.
        let now = bump.iter_allocated_chunks().count() as u64;
        self.chunks
            .set(self.chunks.get() + now.saturating_sub(self.kept.get()));
        bump.reset();
        self.kept.set(bump.iter_allocated_chunks().count() as u64);
    }
}

// SAFETY: the default `call` allocates every block from the arena (disjoint, aligned, `size`
// bytes) and resets it only after the kernel returns.
unsafe impl ScratchWorker for BumpWorker {
    fn counters(&self) -> Counters {
        Counters::allocs(self.chunks.get())
    }
}
