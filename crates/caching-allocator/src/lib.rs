//! A caching CPU allocator for kernel scratch memory (work in progress).

mod error;
mod temp;

pub use error::AllocError;
pub use temp::TempAllocator;

/// The largest alignment the allocator serves: 2 MiB (a huge page).
pub const MAX_ALIGN: usize = 2 << 20;
