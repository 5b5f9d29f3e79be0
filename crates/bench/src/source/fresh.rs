//! `fresh-pages`: every block is a fresh anonymous mapping, unmapped when given back.
//!
//! This is what large allocations cost where the allocator returns them to the kernel every
//! time: on iOS and macOS large `malloc` blocks are fresh VM pages on every call, which is the
//! platform ExecuTorch's caching allocator was written for. Every first touch of a page is a
//! page fault.

use core::cell::Cell;
use core::ptr::NonNull;

use super::{
    align_up, call_with, AllocError, Block, Counters, LiveBlocks, ScratchSource, ScratchWorker,
    TempAllocator,
};

/// `mmap`/`munmap` per block.
#[derive(Debug, Default)]
pub struct FreshPagesSource;

impl ScratchSource for FreshPagesSource {
    fn name(&self) -> &'static str {
        "fresh-pages"
    }

    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new(FreshPagesWorker {
            live: LiveBlocks::new(),
            maps: Cell::new(0),
        })
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Maps a fresh region holding an `align`-aligned block of `size` bytes.
fn map_block(size: usize, align: usize) -> Result<Block, AllocError> {
    let page = page_size();
    let extra = align.saturating_sub(page);
    let len = size
        .checked_add(extra)
        .and_then(|l| l.checked_add(page - 1))
        .map(|l| l & !(page - 1))
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or(AllocError::SizeOverflow { size, align })?;
    // SAFETY: an anonymous private mapping with a null hint has no preconditions; the result
    // is checked against MAP_FAILED below.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(AllocError::OutOfMemory { size, align });
    }
    let base = base.cast::<u8>();
    let offset = align_up(base as usize, align) - base as usize;
    // SAFETY: the mapping is page aligned, so offset <= align - page = extra, and
    // offset + size <= len: the aligned block lies inside the mapping, which is non-null.
    let ptr = unsafe { NonNull::new_unchecked(base.add(offset)) };
    Ok(Block::padded(ptr, size, base, len))
}

/// Unmaps a block made by [`map_block`].
///
/// # Safety
/// `b` came from `map_block` and is unmapped once; nothing uses it afterwards.
unsafe fn unmap_block(b: &Block) {
    // SAFETY: `b.base .. b.base + b.base_len` is exactly one mapping made by `map_block`.
    let rc = unsafe { libc::munmap(b.base.cast(), b.base_len) };
    debug_assert_eq!(rc, 0, "munmap failed");
}

/// A thread's handle on [`FreshPagesSource`].
struct FreshPagesWorker {
    live: LiveBlocks,
    maps: Cell<u64>,
}

// SAFETY: each block is a fresh private mapping of at least `size` bytes at an `align`-aligned
// address, unmapped only by `reset`.
unsafe impl TempAllocator for FreshPagesWorker {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        self.live.allocate(size, align, |size| {
            let b = map_block(size, align)?;
            self.maps.set(self.maps.get() + 1);
            Ok(b)
        })
    }

    unsafe fn reset(&self) {
        // SAFETY: every live block came from `map_block`, which `unmap_block` gives back; the
        // caller guarantees none is used after the reset.
        unsafe { self.live.release_all(unmap_block) };
    }
}

// SAFETY: every block is its own fresh mapping (disjoint, page aligned, aligned up to the
// requested alignment inside the mapping), unmapped only after the kernel returns or in reset.
unsafe impl ScratchWorker for FreshPagesWorker {
    fn call(
        &mut self,
        sizes: &[usize],
        align: usize,
        blocks: &mut [Block],
        kernel: &mut dyn FnMut(&[Block]),
    ) -> Result<(), AllocError> {
        let maps = &self.maps;
        call_with(
            sizes,
            align,
            blocks,
            kernel,
            |size| {
                maps.set(maps.get() + 1);
                map_block(size, align)
            },
            // SAFETY: each block of the call came from `map_block` and is given back once.
            |b| unsafe { unmap_block(b) },
        )
    }

    fn counters(&self) -> Counters {
        Counters::allocs(self.maps.get())
    }

    fn as_temp(&self) -> &dyn TempAllocator {
        self
    }
}

impl Drop for FreshPagesWorker {
    fn drop(&mut self) {
        // SAFETY: dropping the worker ends the validity of what it handed out.
        unsafe { self.reset() };
    }
}
