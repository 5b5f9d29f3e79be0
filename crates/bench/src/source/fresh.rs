//! `fresh-pages`: every block is a fresh anonymous mapping, unmapped when given back.
//!
//! This is what large allocations cost where the allocator returns them to the kernel every
//! time: on iOS and macOS large `malloc` blocks are fresh VM pages on every call, which is the
//! platform ExecuTorch's caching allocator was written for. Every first touch of a page is a
//! page fault.

use core::cell::Cell;
use core::ptr::NonNull;

use super::{align_up, AllocError, BlockWorker, Counters, PerBlock};

/// `mmap`/`munmap` per block, counting the mappings: a thread's worker is
/// `BlockWorker::new(FreshPages::default())`.
#[derive(Debug, Default)]
pub(crate) struct FreshPages {
    maps: Cell<u64>,
}

/// The worker of `fresh-pages`.
pub(crate) fn worker() -> BlockWorker<FreshPages> {
    BlockWorker::new(FreshPages::default())
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

/// One mapping: its base and length.
pub(crate) struct Mapping {
    base: *mut u8,
    len: usize,
}

impl PerBlock for FreshPages {
    type Held = Mapping;

    /// Maps a fresh region holding an `align`-aligned block of `size` bytes.
    fn take(&self, size: usize, align: usize) -> Result<(NonNull<u8>, Mapping), AllocError> {
        let page = page_size();
        let extra = align.saturating_sub(page);
        let len = size
            .checked_add(extra)
            .and_then(|l| l.checked_add(page - 1))
            .map(|l| l & !(page - 1))
            .filter(|&l| l <= isize::MAX as usize)
            .ok_or(AllocError::SizeOverflow { size, align })?;
        // SAFETY: an anonymous private mapping with a null hint has no preconditions; the
        // result is checked against MAP_FAILED below.
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
        self.maps.set(self.maps.get() + 1);
        let base = base.cast::<u8>();
        let offset = align_up(base as usize, align) - base as usize;
        // SAFETY: the mapping is page aligned, so offset <= align - page = extra, and
        // offset + size <= len: the aligned block lies inside the mapping, which is non-null.
        let ptr = unsafe { NonNull::new_unchecked(base.add(offset)) };
        Ok((ptr, Mapping { base, len }))
    }

    unsafe fn give_back(&self, m: Mapping) {
        // SAFETY: `m.base .. m.base + m.len` is exactly one mapping made by `take`, unmapped
        // once and not used after (the caller's promise).
        let rc = unsafe { libc::munmap(m.base.cast(), m.len) };
        debug_assert_eq!(rc, 0, "munmap failed");
    }

    fn counters(&self) -> Counters {
        Counters::allocs(self.maps.get())
    }
}
