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
    pub(crate) system: Arc<dyn GlobalAlloc + Send + Sync>,
}

impl Default for Config {
    /// 64 MiB cached, no limit, no debug checks, `std::alloc::System` underneath.
    fn default() -> Self {
        Config {
            max_cached_bytes: 64 << 20,
            limit_bytes: None,
            debug_checks: false,
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
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("max_cached_bytes", &self.max_cached_bytes)
            .field("limit_bytes", &self.limit_bytes)
            .field("debug_checks", &self.debug_checks)
            .finish_non_exhaustive()
    }
}
