//! Rust pools that target the same job: `zeropool` and `orthotope`, each used as its docs say.

use core::ptr::NonNull;

use zeropool::{BufUninit, ZeroPool};

use super::{
    align_up, padded_size, AllocError, BlockWorker, Counters, PerBlock, ScratchSource,
    ScratchWorker,
};

/// `zeropool::ZeroPool`: size-class buffer pool with thread-local caches, shared by all
/// workers, used through `alloc_uninit` (scratch is not zeroed) and dropping the guard.
///
/// A pooled buffer is a `Vec<u8>` and carries no alignment guarantee beyond the global
/// allocator's, so each request is padded by `align - 1` and aligned inside the buffer (as
/// ExecuTorch does over `malloc`). Its largest class is 64 MiB, so a padded 64 MiB request
/// bypasses the pool. Stats tracking is on (`track_stats(true)`) so its fresh allocations can
/// be counted.
#[derive(Debug)]
pub struct ZeropoolSource {
    pool: ZeroPool,
}

impl ZeropoolSource {
    /// A fresh pool with zeropool's defaults (plus stats).
    pub fn new() -> Self {
        ZeropoolSource {
            pool: ZeroPool::new().track_stats(true),
        }
    }
}

impl Default for ZeropoolSource {
    fn default() -> Self {
        Self::new()
    }
}

impl ScratchSource for ZeropoolSource {
    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new(BlockWorker::new(Pooled(&self.pool)))
    }

    fn counters(&self) -> Counters {
        let s = self.pool.stats();
        Counters {
            system_allocs: Some(s.allocations),
            misses: Some(s.allocations),
            ..Counters::default()
        }
    }
}

/// A thread's handle on the shared pool.
struct Pooled<'a>(&'a ZeroPool);

impl<'a> PerBlock for Pooled<'a> {
    /// The guard that gives the buffer back to the pool when dropped.
    type Held = BufUninit<'a>;

    fn take(&self, size: usize, align: usize) -> Result<(NonNull<u8>, BufUninit<'a>), AllocError> {
        let padded = padded_size(size, align)?;
        let mut buf = self.0.alloc_uninit(padded);
        let base = buf.as_uninit_mut().as_mut_ptr().cast::<u8>();
        let offset = align_up(base as usize, align) - base as usize;
        // SAFETY: the buffer holds `padded = size + align - 1` bytes, so base + offset
        // (offset <= align - 1) is inside it, and non-null because base is. Moving the guard
        // does not move its heap buffer.
        let ptr = unsafe { NonNull::new_unchecked(base.add(offset)) };
        Ok((ptr, buf))
    }

    unsafe fn give_back(&self, guard: BufUninit<'a>) {
        drop(guard);
    }
}

/// `orthotope`: its process-global `allocate` / `deallocate` API (thread caches over a
/// pre-mapped 1 GiB arena), as its README shows. Blocks are 64-byte aligned; a larger
/// alignment is served by padding. It cannot count its system allocations.
#[derive(Debug, Default)]
pub(crate) struct Orthotope;

/// Orthotope's own block alignment.
const ORTHOTOPE_ALIGN: usize = 64;

impl PerBlock for Orthotope {
    /// The pointer orthotope returned (the block may start further in, when padded).
    type Held = NonNull<u8>;

    fn take(&self, size: usize, align: usize) -> Result<(NonNull<u8>, NonNull<u8>), AllocError> {
        let want = if align <= ORTHOTOPE_ALIGN {
            size
        } else {
            padded_size(size, align)?
        };
        let base =
            orthotope::allocate(want).map_err(|_| AllocError::OutOfMemory { size, align })?;
        let ptr = if align <= ORTHOTOPE_ALIGN {
            base
        } else {
            // SAFETY: `base` points to size + align - 1 bytes.
            unsafe { super::align_within(base, align) }
        };
        debug_assert_eq!(
            ptr.as_ptr() as usize % align,
            0,
            "orthotope block misaligned"
        );
        Ok((ptr, base))
    }

    unsafe fn give_back(&self, base: NonNull<u8>) {
        // SAFETY: `base` is a live pointer returned by orthotope::allocate, freed once (the
        // caller's promise).
        let r = unsafe { orthotope::deallocate(base) };
        debug_assert!(r.is_ok(), "orthotope deallocate: {r:?}");
    }
}
