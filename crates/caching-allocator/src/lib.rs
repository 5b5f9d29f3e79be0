//! A caching CPU allocator for the scratch memory of compute kernels.
//!
//! ML runtimes call kernels (attention, matmul, quantize) thousands of times a second, and
//! each call needs temporary buffers. Taking them from `malloc` costs system calls and page
//! faults. This allocator keeps blocks that come back and hands them out again:
//!
//! - **size classes** with bounded waste (under 12.5% from 1 KiB up), so scratch that grows a
//!   little every call, like attention decode's, still hits the cache ([`SizeClass`]);
//! - a **true cap** on idle bytes with least-recently-used eviction, and an optional hard
//!   limit on everything held ([`Config`]);
//! - a **temp arena** per thread for small blocks: bump-allocator speed on the temp pattern
//!   (allocate a few blocks, reset after the kernel), a reset that takes every thread's
//!   blocks back in one atomic step ([`Config::arena_max_bytes`]);
//! - a **per-thread fast path** for larger blocks: a thread reusing its classes takes no lock
//!   another thread takes, yet blocks flow between threads and
//!   [`reset`](CachingAllocator::reset) reaches all;
//! - **stats** ([`Stats`]), **debug poisoning and canaries**, and **clear errors**
//!   ([`AllocError`]);
//! - a **safe API** ([`Scope`]) where the borrow checker forbids use after reset, the
//!   `allocator_api2` `Allocator` trait for collections, and a [`TempAllocator`] trait for
//!   kernels.
//!
//! # Example
//!
//! ```
//! use caching_allocator::CachingAllocator;
//!
//! let mut alloc = CachingAllocator::new(64 << 20); // keep up to 64 MiB idle
//! for _call in 0..3 {
//!     let scope = alloc.scope();
//!     let scores = scope.alloc_slice_fill(4096, 0.0f32)?; // scratch for one kernel call
//!     let row_max = scope.alloc_slice_fill(64, f32::NEG_INFINITY)?;
//!     scores[0] = 1.0;
//!     row_max[0] = scores[0];
//! } // the scope's blocks go back to the cache here
//! let stats = alloc.stats();
//! assert_eq!(stats.system_allocs, 2); // the first call took two blocks from the system...
//! assert_eq!(stats.hits, 4); // ...and the next two calls reused them
//!
//! // The raw API, as a runtime's temp allocator uses it: allocate, then reset after the kernel.
//! let p = alloc.allocate(1000, 64)?;
//! assert_eq!(p.as_ptr() as usize % 64, 0);
//! alloc.reset(); // every live block back to the cache; `p` must not be used any more
//! # Ok::<(), caching_allocator::AllocError>(())
//! ```
//!
// How it works (the data path, the cap, reset, size classes, errors, stats, debug checks): kept
// in a file inside the crate so it is part of the published docs.
#![doc = include_str!("../docs/how-it-works.md")]
#![warn(missing_docs)]

mod allocator;
mod api2;
mod arena;
mod arena_chunks;
mod block;
mod chunk_index;
mod clock;
mod config;
mod debug;
mod directory;
mod error;
mod eviction;
mod fit;
mod huge_pages;
mod live_table;
mod registry;
mod reset;
mod scope;
mod scratch;
mod shared_cache;
mod size_class;
mod stats;
mod sync;
mod system;
mod temp;
mod thread_cache;
mod trim;
mod working_set;

/// The `allocator-api2` crate this one implements `Allocator` for (0.2): use its collections
/// through this path (`caching_allocator::allocator_api2::vec::Vec`) and no second copy of the
/// crate can disagree with the trait. hashbrown 0.15 and later with its `allocator-api2`
/// feature takes the same trait.
pub use allocator_api2;

pub use allocator::CachingAllocator;
pub use config::{
    Config, ADAPTIVE_ARENA_MAX_BYTES, DEFAULT_ARENA_MAX_BYTES, DEFAULT_SCOPE_CHUNK_BYTES,
    DEFAULT_WORKING_SET_SLACK, MAX_ARENA_BYTES, SCOPE_BUMP_MAX,
};
pub use error::AllocError;
pub use scope::Scope;
pub use scratch::Scratch;
pub use size_class::SizeClass;
pub use stats::Stats;
pub use temp::{TempAllocator, TempReset};

/// The largest alignment the allocator serves: 2 MiB (a huge page).
pub const MAX_ALIGN: usize = 2 << 20;

/// The smallest alignment of every block handed out (one cache line).
pub const MIN_ALIGN: usize = block::MIN_ALIGN;

/// The crate README's examples, compiled and run as doc-tests (the README is inside the
/// package, so they also run from a packaged crate).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

// SAFETY: `allocate` hands out distinct live blocks of at least `size` bytes, aligned as asked
// (at least 64), that stay valid until a reset or release takes them back.
unsafe impl TempAllocator for CachingAllocator {
    #[inline(always)]
    fn allocate(&self, size: usize, align: usize) -> Result<core::ptr::NonNull<u8>, AllocError> {
        CachingAllocator::allocate(self, size, align)
    }
}

// SAFETY: `reset_unchecked` takes back every block `allocate` handed out before it, and only
// those (blocks of open scopes stay with their scopes).
unsafe impl TempReset for CachingAllocator {
    #[inline]
    unsafe fn reset_unchecked(&self) {
        // SAFETY: `TempReset::reset_unchecked`'s contract is the inherent method's.
        unsafe { CachingAllocator::reset_unchecked(self) }
    }
}
