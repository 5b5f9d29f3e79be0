//! `exact-cache`: a faithful re-implementation of ExecuTorch's `CPUCachingAllocator` (and
//! PyTorch's c10 mobile caching allocator, the same design), as the baseline this project
//! re-designs.
//!
//! The design, as in the original:
//! - alignment must be a power of two (else the allocation fails) and is clamped to >= 64;
//! - a request is padded to `size + alignment - 1`, `malloc`ed, and the pointer aligned up;
//! - the cache key is that padded size, matched **exactly**: one map from size to a list of
//!   idle blocks, one map from pointer to size for live blocks, one mutex around both;
//! - `reset()`: if the bytes ever `malloc`ed and not yet freed (live + idle) exceed the cap,
//!   free **everything**; otherwise move every live block to the idle lists. The cap never
//!   refuses an allocation. The cap is a `u32`, as in the original.
//!
//! Unlike the original it counts hits, misses (= `malloc` calls) and frees, so the benchmark
//! can show them.

use core::hash::{BuildHasherDefault, Hasher};
use core::ptr::NonNull;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{padded_size, AllocError, Counters, ScratchWorker, TempAllocator};

/// The smallest alignment the original hands out.
pub const MIN_ALIGNMENT: usize = 64;

/// What an [`ExactCache`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExactCacheStats {
    /// Allocations served from an idle block of exactly the same padded size.
    pub hits: u64,
    /// Allocations that had to `malloc` (every miss is one `malloc`).
    pub misses: u64,
    /// Blocks given back with `free`.
    pub frees: u64,
    /// Resets that found the cache over its cap and freed everything.
    pub free_all_resets: u64,
    /// Bytes currently `malloc`ed (live + idle): the figure compared with the cap.
    pub current_bytes: usize,
    /// Blocks currently live (handed out since the last reset).
    pub live_blocks: usize,
    /// Blocks currently idle in the cache.
    pub idle_blocks: usize,
    /// The most bytes `malloc`ed at once (the peak of `current_bytes`).
    pub peak_bytes: usize,
    /// The most bytes live at once (padded sizes of the blocks handed out since a reset).
    pub peak_live_bytes: usize,
}

/// A multiplicative hasher: the original uses `std::hash` on sizes and pointers, which is
/// the identity; a bare identity would cluster in Rust's SwissTable, a multiply does not.
#[derive(Debug, Default)]
struct MulHasher(u64);

impl Hasher for MulHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Map<K, V> = HashMap<K, V, BuildHasherDefault<MulHasher>>;

#[derive(Debug)]
struct Inner {
    /// padded size -> idle blocks of exactly that size (the original's `available_map_`).
    available: Map<usize, Vec<NonNull<u8>>>,
    /// malloc'd address -> (block, padded size) for live blocks (`allocation_map_`).
    live: Map<usize, (NonNull<u8>, usize)>,
    /// Bytes malloc'd and not yet freed, live + idle (`current_size_`).
    current_size: usize,
    /// Bytes of the live blocks (not in the original: for the benchmark's peak).
    live_bytes: usize,
    stats: ExactCacheStats,
}

// SAFETY: `Inner` owns the malloc'd blocks its pointers name (nothing else frees or aliases
// them while they are in its maps), and malloc'd memory is not tied to a thread.
unsafe impl Send for Inner {}

impl Inner {
    fn free_everything(&mut self) {
        for (_, list) in self.available.drain() {
            for p in list {
                // SAFETY: `p` was returned by libc::malloc and sits in exactly one list.
                unsafe { libc::free(p.as_ptr().cast()) };
                self.stats.frees += 1;
            }
        }
        for (_, (p, _)) in self.live.drain() {
            // SAFETY: `p` was returned by libc::malloc and is live exactly once; callers of
            // reset/drop guarantee it is no longer used.
            unsafe { libc::free(p.as_ptr().cast()) };
            self.stats.frees += 1;
        }
        self.current_size = 0;
    }
}

/// ExecuTorch's `CPUCachingAllocator`, re-implemented; see the module docs.
#[derive(Debug)]
pub struct ExactCache {
    max_size: u32,
    inner: Mutex<Inner>,
}

impl ExactCache {
    /// A cache that frees everything at `reset` once it holds more than `max_size` bytes.
    pub fn new(max_size: u32) -> Self {
        ExactCache {
            max_size,
            inner: Mutex::new(Inner {
                available: Map::default(),
                live: Map::default(),
                current_size: 0,
                live_bytes: 0,
                stats: ExactCacheStats::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the maps consistent (no step is half done
        // across a panic point), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the cache has done so far.
    pub fn stats(&self) -> ExactCacheStats {
        let g = self.lock();
        ExactCacheStats {
            current_bytes: g.current_size,
            live_blocks: g.live.len(),
            idle_blocks: g.available.values().map(Vec::len).sum(),
            ..g.stats
        }
    }

    /// The original's `allocate(size, alignment)`.
    pub fn allocate(&self, size: usize, alignment: usize) -> Result<NonNull<u8>, AllocError> {
        if !alignment.is_power_of_two() {
            return Err(AllocError::InvalidAlignment { align: alignment });
        }
        let alignment = alignment.max(MIN_ALIGNMENT);
        let adjusted = padded_size(size, alignment)?;
        let mut g = self.lock();
        let reused = g.available.get_mut(&adjusted).and_then(Vec::pop);
        let base = match reused {
            Some(p) => {
                g.stats.hits += 1;
                p
            }
            None => {
                // SAFETY: malloc has no preconditions; the result is null-checked below.
                let raw = unsafe { libc::malloc(adjusted) }.cast::<u8>();
                let p = NonNull::new(raw).ok_or(AllocError::OutOfMemory {
                    size,
                    align: alignment,
                })?;
                g.stats.misses += 1;
                g.current_size += adjusted;
                g.stats.peak_bytes = g.stats.peak_bytes.max(g.current_size);
                p
            }
        };
        g.live.insert(base.as_ptr() as usize, (base, adjusted));
        g.live_bytes += adjusted;
        g.stats.peak_live_bytes = g.stats.peak_live_bytes.max(g.live_bytes);
        // SAFETY: `base` points to `adjusted = size + alignment - 1` malloc'd bytes.
        Ok(unsafe { super::align_within(base, alignment) })
    }

    /// The original's `reset()`: free everything when over the cap, else cache every live
    /// block.
    ///
    /// # Safety
    /// Nothing allocated since the last reset may be used after this call.
    pub unsafe fn reset(&self) {
        let mut g = self.lock();
        g.live_bytes = 0;
        if g.current_size > self.max_size as usize {
            g.stats.free_all_resets += 1;
            g.free_everything();
        } else {
            let Inner {
                available, live, ..
            } = &mut *g;
            for (_, (p, size)) in live.drain() {
                available.entry(size).or_default().push(p);
            }
        }
    }
}

impl Drop for ExactCache {
    fn drop(&mut self) {
        self.inner
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .free_everything();
    }
}

// SAFETY: forwards to `ExactCache::allocate`, whose live blocks are distinct malloc'd regions
// holding `size` bytes behind an `align`-aligned pointer until `reset`.
unsafe impl TempAllocator for ExactCache {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        ExactCache::allocate(self, size, align)
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for ExactCache {
    unsafe fn reset_unchecked(&self) {
        // SAFETY: forwarded from the caller.
        unsafe { ExactCache::reset(self) }
    }
}

// SAFETY: every live block is a distinct malloc'd region (a block is in the live map, not in
// an idle list, from `allocate` to `reset`), holding `size` bytes after the aligned pointer;
// blocks are reused or freed only by `reset`, which the default `call` runs after the kernel.
unsafe impl ScratchWorker for ExactCache {
    fn counters(&self) -> Counters {
        let s = self.stats();
        Counters {
            system_allocs: Some(s.misses),
            misses: Some(s.misses),
            peak_reserved: Some(s.peak_bytes as u64),
            peak_live: Some(s.peak_live_bytes as u64),
        }
    }
}
