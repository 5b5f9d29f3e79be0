//! `caching` and `caching-scope`: this project's `CachingAllocator`.
//!
//! - `caching` drives it as ExecuTorch's runtime drives a temp allocator: `allocate` each
//!   block, `reset` after the kernel. `reset` takes back every live block of the allocator,
//!   so each worker (each thread) owns its own allocator, like one runtime per thread.
//! - `caching-scope` shares one allocator between all threads and opens a `Scope` per call
//!   (the safe API); each thread's blocks go back through its own per-thread cache.

use core::cell::RefCell;
use core::ptr::NonNull;

use caching_allocator::{CachingAllocator, Stats};

use super::{
    AllocError, Block, Call, Counters, ScratchSource, ScratchWorker, TempAllocator, TempReset,
};

/// How the benchmark drives the caching allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachingMode {
    /// `allocate` + `reset`, one allocator per worker.
    Reset,
    /// One shared allocator, a `Scope` per call.
    Scope,
}

/// This project's allocator as a scratch source.
pub struct CachingSource {
    max_cached_bytes: usize,
    /// The allocator shared by all workers in [`CachingMode::Scope`].
    shared: Option<CachingAllocator>,
}

impl CachingSource {
    /// A source whose allocators are the `llm` runner's ([`llm::caching_temp`]): at most
    /// `max_cached_bytes` idle, keeping their working set (`working_set_slack(Some(1.25))`);
    /// both ways of driving it give all scratch back after every kernel call.
    pub fn new(mode: CachingMode, max_cached_bytes: usize) -> Self {
        let shared = (mode == CachingMode::Scope).then(|| llm::caching_temp(max_cached_bytes));
        CachingSource {
            max_cached_bytes,
            shared,
        }
    }

    /// A new allocator with this source's configuration, as a [`CachingMode::Reset`] worker
    /// is one; it is `Sync`, for callers that drive a kernel from a pool worker.
    pub fn allocator(&self) -> CachingAllocator {
        llm::caching_temp(self.max_cached_bytes)
    }
}

fn counters_of(s: &Stats) -> Counters {
    Counters {
        system_allocs: Some(s.system_allocs),
        misses: Some(s.misses),
        peak_reserved: Some(s.peak_reserved_bytes as u64),
        peak_live: Some(s.peak_live_bytes as u64),
    }
}

impl ScratchSource for CachingSource {
    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        match &self.shared {
            None => Box::new(self.allocator()),
            Some(alloc) => Box::new(ScopeWorker {
                alloc,
                live: RefCell::new(Vec::with_capacity(64)),
            }),
        }
    }

    fn counters(&self) -> Counters {
        self.shared
            .as_ref()
            .map(|a| counters_of(&a.stats()))
            .unwrap_or_default()
    }
}

// SAFETY: the default `call` allocates each block with `CachingAllocator::allocate` (distinct
// live blocks of at least `size` bytes at `align`) and resets only after the kernel returned;
// the reset takes back only blocks `allocate` handed out (a scope's stay with the scope), and
// `&mut self` in `call` means no other call on this allocator runs meanwhile.
unsafe impl ScratchWorker for CachingAllocator {
    fn counters(&self) -> Counters {
        counters_of(&self.stats())
    }
}

/// A thread's handle on the shared allocator.
struct ScopeWorker<'a> {
    alloc: &'a CachingAllocator,
    /// Blocks handed out through `TempAllocator::allocate`, released by `reset` (a reset of
    /// the shared allocator would take other threads' blocks too).
    live: RefCell<Vec<NonNull<u8>>>,
}

/// The block alignment the caching allocator guarantees for every block.
const CACHING_MIN_ALIGN: usize = 64;

// SAFETY: forwards to `CachingAllocator::allocate` (distinct, aligned blocks of `size` bytes)
// and keeps each block live until `reset` releases it.
unsafe impl TempAllocator for ScopeWorker<'_> {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let p = self.alloc.allocate(size, align)?;
        if size != 0 {
            self.live.borrow_mut().push(p);
        }
        Ok(p)
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for ScopeWorker<'_> {
    unsafe fn reset_unchecked(&self) {
        for p in self.live.borrow_mut().drain(..) {
            // SAFETY: `p` came from `allocate` on this allocator and is released once (it is
            // drained from the list); the caller guarantees it is not used after.
            let r = unsafe { self.alloc.release(p) };
            debug_assert!(r.is_ok(), "release: {r:?}");
        }
    }
}

/// One cache line: what the scope worker allocates, so its blocks are 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine(#[allow(dead_code)] [u8; CACHING_MIN_ALIGN]);

// SAFETY: scope slices are distinct live blocks of `size` bytes, at least 64-byte aligned
// (the allocator's guarantee; larger alignments go through `allocate`), owned by the scope
// until it is dropped after the kernel returns; the TempAllocator path hands out live blocks
// from `allocate`, released only in `reset`.
unsafe impl ScratchWorker for ScopeWorker<'_> {
    fn call(&mut self, call: Call<'_>) -> Result<(), AllocError> {
        let align = call.align;
        if align > CACHING_MIN_ALIGN {
            // A scope aligns to the element type; beyond the guaranteed 64 bytes use the
            // raw API, released per block.
            return super::allocate_then_reset(self, call);
        }
        let scope = self.alloc.scope();
        let r = call.run(|_, size| {
            if size == 0 {
                return Ok(Block::new(super::dangling(align), 0));
            }
            // Cache lines, so the scope aligns them to 64 bytes even inside a bump chunk.
            let s = scope.alloc_uninit::<CacheLine>(size.div_ceil(CACHING_MIN_ALIGN))?;
            let p = NonNull::new(s.as_mut_ptr().cast::<u8>()).unwrap_or(NonNull::dangling());
            debug_assert_eq!(p.as_ptr() as usize % align, 0);
            Ok(Block::new(p, size))
        });
        // The kernel has returned (or never ran): the scope gives its blocks back.
        drop(scope);
        r
    }
}

impl Drop for ScopeWorker<'_> {
    fn drop(&mut self) {
        // SAFETY: dropping the worker ends the validity of what it handed out.
        unsafe { self.reset_unchecked() };
    }
}
