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

use super::{zero_size, AllocError, Block, Call, Counters, ScratchWorker, TempAllocator};

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
        bump_alloc(&self.bump.borrow(), size, align)
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for BumpWorker {
    unsafe fn reset_unchecked(&self) {
        count_and_reset(&mut self.bump.borrow_mut(), &self.chunks, &self.kept);
    }
}

/// Adds to `chunks` the chunks `bump` took from the system since its last reset (it had
/// `kept` then), resets it and records how many it keeps now.
fn count_and_reset(bump: &mut Bump, chunks: &Cell<u64>, kept: &Cell<u64>) {
    let now = bump.iter_allocated_chunks().count() as u64;
    chunks.set(chunks.get() + now.saturating_sub(kept.get()));
    bump.reset();
    kept.set(bump.iter_allocated_chunks().count() as u64);
}

/// One block from `bump`: an aligned dangling pointer for size 0.
#[inline]
fn bump_alloc(bump: &Bump, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
    if let Some(p) = zero_size(size, align)? {
        return Ok(p);
    }
    let layout = Layout::from_size_align(size, align)
        .map_err(|_| AllocError::SizeOverflow { size, align })?;
    bump.try_alloc_layout(layout)
        .map_err(|_| AllocError::OutOfMemory { size, align })
}

// SAFETY: the default `call` allocates every block from the arena (disjoint, aligned, `size`
// bytes) and resets it only after the kernel returns.
unsafe impl ScratchWorker for BumpWorker {
    /// The default `call` without the `RefCell`: `&mut self` already proves the arena is not
    /// borrowed, and a borrow flag check per block made bumpalo's small-mix call 1.7x slower
    /// (57 -> 96 ns for 16 blocks, measured against the earlier per-source `call`).
    fn call(&mut self, call: Call<'_>) -> Result<(), AllocError> {
        let align = call.align;
        let bump = self.bump.get_mut();
        let res = call.run(|_, size| bump_alloc(bump, size, align).map(|p| Block::new(p, size)));
        // The kernel has returned (or never ran): its blocks go back.
        count_and_reset(bump, &self.chunks, &self.kept);
        res
    }

    fn counters(&self) -> Counters {
        Counters::allocs(self.chunks.get())
    }
}
