//! Configuration: the cap, the hard limit, debug checks and the system allocator underneath.

use core::alloc::GlobalAlloc;
use core::fmt;
use std::alloc::System;
use std::sync::Arc;

/// How a [`CachingAllocator`](crate::CachingAllocator) behaves; a builder.
///
/// ```
/// use caching_allocator::{CachingAllocator, Config};
/// let alloc = CachingAllocator::with_config(
///     Config::default()
///         .max_cached_bytes(16 << 20) // keep at most 16 MiB idle
///         .limit_bytes(256 << 20) // never hold more than 256 MiB in all
///         .debug_checks(cfg!(debug_assertions)),
/// );
/// assert_eq!(alloc.config().get_max_cached_bytes(), 16 << 20);
/// ```
#[derive(Clone)]
pub struct Config {
    pub(crate) max_cached_bytes: usize,
    pub(crate) limit_bytes: Option<usize>,
    pub(crate) debug_checks: bool,
    pub(crate) scope_chunk_bytes: usize,
    pub(crate) system: Arc<dyn GlobalAlloc + Send + Sync>,
}

/// The default of [`Config::scope_chunk_bytes`]: 32 KiB, eight 4 KiB requests per chunk.
pub const DEFAULT_SCOPE_CHUNK_BYTES: usize = 32 << 10;

/// Requests up to this many bytes are served from a scope's chunk (when chunks are on).
pub const SCOPE_BUMP_MAX: usize = 4 << 10;

impl Default for Config {
    /// 64 MiB cached, no limit, no debug checks, 32 KiB scope chunks, `std::alloc::System`
    /// underneath.
    fn default() -> Self {
        Config {
            max_cached_bytes: 64 << 20,
            limit_bytes: None,
            debug_checks: false,
            scope_chunk_bytes: DEFAULT_SCOPE_CHUNK_BYTES,
            system: Arc::new(System),
        }
    }
}

impl Config {
    /// The default configuration (see [`Config::default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// At most this many idle bytes stay cached, counted over every thread's cache; past it the
    /// least recently used idle blocks go back to the system. Never refuses live memory.
    pub fn max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = bytes;
        self
    }

    /// A hard limit on live + cached bytes: an allocation that would pass it first evicts idle
    /// blocks, then fails with [`AllocError::LimitExceeded`](crate::AllocError::LimitExceeded).
    pub fn limit_bytes(mut self, bytes: usize) -> Self {
        self.limit_bytes = Some(bytes);
        self
    }

    /// Fill every handed-out block with `0xFF` (a NaN in f32/f64) and check a canary behind the
    /// requested end when the block comes back. Costs a memset per allocation.
    pub fn debug_checks(mut self, on: bool) -> Self {
        self.debug_checks = on;
        self
    }

    /// A [`Scope`](crate::Scope) serves requests of at most [`SCOPE_BUMP_MAX`] bytes (and
    /// alignment) by bumping a pointer through a chunk taken from the cache as one block, as an
    /// arena does: a few nanoseconds each instead of a cache round trip. The first chunk of a
    /// scope has this many bytes, each further one twice the last (up to 16 times the first);
    /// they go back when the scope drops. `0` turns chunks off (every request is a block
    /// of its own); values are raised to at least twice [`SCOPE_BUMP_MAX`]. With debug checks
    /// on, chunks are off too: each block needs its own canary.
    pub fn scope_chunk_bytes(mut self, bytes: usize) -> Self {
        self.scope_chunk_bytes = if bytes == 0 {
            0
        } else {
            bytes.max(2 * SCOPE_BUMP_MAX)
        };
        self
    }

    /// Where blocks come from and go back to; `std::alloc::System` by default. Tests use it to
    /// count calls and inject failures; a runtime may pass its own allocator.
    pub fn system_allocator(mut self, system: Arc<dyn GlobalAlloc + Send + Sync>) -> Self {
        self.system = system;
        self
    }

    /// The configured cap on idle bytes.
    pub fn get_max_cached_bytes(&self) -> usize {
        self.max_cached_bytes
    }

    /// The configured hard limit on live + cached bytes, if any.
    pub fn get_limit_bytes(&self) -> Option<usize> {
        self.limit_bytes
    }

    /// Whether debug checks (poisoning and canaries) are on.
    pub fn get_debug_checks(&self) -> bool {
        self.debug_checks
    }

    /// The size of a scope's bump chunk, 0 when chunks are off.
    pub fn get_scope_chunk_bytes(&self) -> usize {
        self.scope_chunk_bytes
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("max_cached_bytes", &self.max_cached_bytes)
            .field("limit_bytes", &self.limit_bytes)
            .field("debug_checks", &self.debug_checks)
            .field("scope_chunk_bytes", &self.scope_chunk_bytes)
            .finish_non_exhaustive()
    }
}
