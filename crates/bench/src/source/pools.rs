//! Rust pools that target the same job: `zeropool` and `orthotope`, each used as its docs say.

use core::cell::RefCell;
use core::ptr::NonNull;

use zeropool::{BufUninit, ZeroPool};

use super::{
    align_up, call_with, check_align, dangling, padded_size, AllocError, Block, Counters,
    LiveBlocks, ScratchSource, ScratchWorker, TempAllocator,
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
    fn name(&self) -> &'static str {
        "zeropool"
    }

    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new(ZeropoolWorker {
            pool: &self.pool,
            live: RefCell::new(Vec::with_capacity(64)),
        })
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

/// A thread's handle on the shared pool; holds the guards of live buffers.
struct ZeropoolWorker<'a> {
    pool: &'a ZeroPool,
    live: RefCell<Vec<BufUninit<'a>>>,
}

/// Takes a buffer for `size` bytes at `align` from `pool`; returns the aligned pointer and
/// the guard that gives the buffer back when dropped.
fn take(
    pool: &ZeroPool,
    size: usize,
    align: usize,
) -> Result<(NonNull<u8>, BufUninit<'_>), AllocError> {
    let padded = padded_size(size, align)?;
    let mut buf = pool.alloc_uninit(padded);
    let base = buf.as_uninit_mut().as_mut_ptr().cast::<u8>();
    let offset = align_up(base as usize, align) - base as usize;
    // SAFETY: the buffer holds `padded = size + align - 1` bytes, so base + offset (offset <=
    // align - 1) is inside it, and non-null because base is.
    let ptr = unsafe { NonNull::new_unchecked(base.add(offset)) };
    Ok((ptr, buf))
}

// SAFETY: each block is a pool buffer held by its guard until `reset` drops it, padded so the
// returned pointer is `align`-aligned with `size` bytes behind it.
unsafe impl TempAllocator for ZeropoolWorker<'_> {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        check_align(align)?;
        if size == 0 {
            return Ok(dangling(align));
        }
        let (ptr, guard) = take(self.pool, size, align)?;
        self.live.borrow_mut().push(guard);
        Ok(ptr)
    }

    unsafe fn reset(&self) {
        // Dropping the guards gives the buffers back to the pool.
        self.live.borrow_mut().clear();
    }
}

// SAFETY: each block lies inside its own pooled buffer (at least size + align - 1 bytes, the
// block aligned inside it), which the guard keeps out of the pool until it is dropped after
// the kernel returns (or in reset). Moving a guard does not move its heap buffer.
unsafe impl ScratchWorker for ZeropoolWorker<'_> {
    fn call(
        &mut self,
        sizes: &[usize],
        align: usize,
        blocks: &mut [Block],
        kernel: &mut dyn FnMut(&[Block]),
    ) -> Result<(), AllocError> {
        let pool = self.pool;
        let live = self.live.get_mut();
        let res = call_with(
            sizes,
            align,
            blocks,
            kernel,
            |size| {
                let (ptr, guard) = take(pool, size, align)?;
                live.push(guard);
                Ok(Block::new(ptr, size))
            },
            |_| {},
        );
        // The guards go back to the pool here, after the kernel returned.
        self.live.get_mut().clear();
        res
    }

    fn as_temp(&self) -> &dyn TempAllocator {
        self
    }
}

/// `orthotope`: its process-global `allocate` / `deallocate` API (thread caches over a
/// pre-mapped 1 GiB arena), as its README shows. Blocks are 64-byte aligned; a larger
/// alignment is served by padding. It cannot count its system allocations.
#[derive(Debug, Default)]
pub struct OrthotopeSource;

impl ScratchSource for OrthotopeSource {
    fn name(&self) -> &'static str {
        "orthotope"
    }

    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new(OrthotopeWorker {
            live: LiveBlocks::new(),
        })
    }
}

/// Orthotope's own block alignment.
const ORTHOTOPE_ALIGN: usize = 64;

fn ortho_alloc(size: usize, align: usize) -> Result<Block, AllocError> {
    let want = if align <= ORTHOTOPE_ALIGN {
        size
    } else {
        padded_size(size, align)?
    };
    let base = orthotope::allocate(want).map_err(|_| AllocError::OutOfMemory { size, align })?;
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
    Ok(Block::padded(ptr, size, base.as_ptr(), want))
}

/// # Safety
/// `b` came from [`ortho_alloc`] and is given back once; nothing uses it afterwards.
unsafe fn ortho_free(b: &Block) {
    // SAFETY: `b.base` is a live pointer returned by orthotope::allocate, freed once.
    let r = unsafe { orthotope::deallocate(NonNull::new_unchecked(b.base)) };
    debug_assert!(r.is_ok(), "orthotope deallocate: {r:?}");
}

/// A thread's handle on orthotope's global allocator (which keeps its own thread cache).
struct OrthotopeWorker {
    live: LiveBlocks,
}

// SAFETY: each block is an orthotope allocation of at least `size` bytes at an `align`-aligned
// address, kept until `reset` frees it.
unsafe impl TempAllocator for OrthotopeWorker {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        self.live
            .allocate(size, align, |size| ortho_alloc(size, align))
    }

    unsafe fn reset(&self) {
        // SAFETY: every live block came from `ortho_alloc`, which `ortho_free` gives back; the
        // caller guarantees none is used after the reset.
        unsafe { self.live.release_all(ortho_free) };
    }
}

// SAFETY: each block is a live orthotope allocation of at least `size` bytes (plus padding
// when aligned up), freed only after the kernel returns or in reset.
unsafe impl ScratchWorker for OrthotopeWorker {
    fn call(
        &mut self,
        sizes: &[usize],
        align: usize,
        blocks: &mut [Block],
        kernel: &mut dyn FnMut(&[Block]),
    ) -> Result<(), AllocError> {
        call_with(
            sizes,
            align,
            blocks,
            kernel,
            |size| ortho_alloc(size, align),
            // SAFETY: each block of the call came from ortho_alloc and is given back once.
            |b| unsafe { ortho_free(b) },
        )
    }

    fn as_temp(&self) -> &dyn TempAllocator {
        self
    }
}

impl Drop for OrthotopeWorker {
    fn drop(&mut self) {
        // SAFETY: dropping the worker ends the validity of what it handed out.
        unsafe { self.reset() };
    }
}
