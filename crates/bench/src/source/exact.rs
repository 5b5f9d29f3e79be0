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
#[derive(Default)]
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
pub struct ExactCache {
    max_size: u32,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ExactCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactCache")
            .field("max_size", &self.max_size)
            .field("stats", &self.stats())
            .finish()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: NonNull<u8>) -> usize {
        p.as_ptr() as usize
    }

    /// A fresh cache's block of `first` (size, alignment), then after a reset one of `second`.
    fn around_a_reset(
        first: (usize, usize),
        second: (usize, usize),
    ) -> (ExactCache, [NonNull<u8>; 2]) {
        let c = ExactCache::new(10 << 20);
        let a = c.allocate(first.0, first.1).unwrap();
        // SAFETY: `a` is not used after the reset (only its address is compared).
        unsafe { c.reset() };
        let b = c.allocate(second.0, second.1).unwrap();
        (c, [a, b])
    }

    #[test]
    fn small_allocations_are_64_aligned() {
        let c = ExactCache::new(10 << 20);
        for size in [16, 32, 64] {
            assert_eq!(addr(c.allocate(size, 1).unwrap()) % 64, 0);
        }
    }

    #[test]
    fn two_blocks_of_a_size_are_both_reused() {
        let c = ExactCache::new(10 << 20);
        let mut first = [c.allocate(256, 64).unwrap(), c.allocate(256, 64).unwrap()];
        assert_ne!(first[0], first[1]);
        // SAFETY: nothing is used after the reset.
        unsafe { c.reset() };
        let mut second = [c.allocate(256, 64).unwrap(), c.allocate(256, 64).unwrap()];
        first.sort();
        second.sort();
        assert_eq!(first, second);
    }

    #[test]
    fn only_the_exact_size_is_reused_after_reset() {
        let (c, [a, b]) = around_a_reset((256, 64), (256, 64));
        let s = c.stats();
        assert_eq!((a, s.hits, s.misses), (b, 1, 1));
        // One byte more is a different key: a miss, a new malloc, a different block.
        let (c, [a, b]) = around_a_reset((256, 64), (257, 64));
        let s = c.stats();
        assert_ne!(a, b);
        assert_eq!((s.hits, s.misses, s.idle_blocks), (0, 2, 1));
    }

    #[test]
    fn same_size_different_alignment_is_a_different_key() {
        let (c, [a, b]) = around_a_reset((100, 256), (100, 512));
        assert_eq!(addr(a) % 256, 0);
        assert_eq!(addr(b) % 512, 0);
        assert_eq!(c.stats().misses, 2);
    }

    #[test]
    fn alignment_is_honoured_on_hits() {
        let c = ExactCache::new(10 << 20);
        for align in [64, 128, 256, 512] {
            for _ in 0..3 {
                let p = c.allocate(100, align).unwrap();
                assert_eq!(addr(p) % align, 0, "align {align}");
                // SAFETY: `p` is not used after the reset.
                unsafe { c.reset() };
            }
        }
        // A block cached for (548, 64) has padded size 611, the same key as (100, 512): the
        // hit must be re-aligned for the new request, not returned as cached.
        let c = ExactCache::new(10 << 20);
        c.allocate(548, 64).unwrap();
        // SAFETY: nothing is used after the reset.
        unsafe { c.reset() };
        let p = c.allocate(100, 512).unwrap();
        assert_eq!(c.stats().hits, 1);
        assert_eq!(addr(p) % 512, 0);
    }

    #[test]
    fn invalid_alignment_fails() {
        let c = ExactCache::new(10 << 20);
        for align in [0, 5, 6, 12, 34] {
            assert_eq!(
                c.allocate(64, align),
                Err(AllocError::InvalidAlignment { align }),
                "align {align}"
            );
        }
        assert_eq!(c.stats(), ExactCacheStats::default());
    }

    #[test]
    fn over_the_cap_reset_frees_everything() {
        let c = ExactCache::new(1024);
        // The cap never refuses: three 512-byte blocks under a 1 KiB cap.
        let ps: Vec<_> = (0..3).map(|_| c.allocate(512, 64).unwrap()).collect();
        assert_eq!(ps.len(), 3);
        assert!(c.stats().current_bytes > 1024);
        // SAFETY: nothing is used after the reset.
        unsafe { c.reset() };
        let s = c.stats();
        assert_eq!(s.free_all_resets, 1);
        assert_eq!(s.frees, 3);
        assert_eq!((s.current_bytes, s.idle_blocks, s.live_blocks), (0, 0, 0));
        // Everything was freed, so the next request misses again.
        c.allocate(512, 64).unwrap();
        assert_eq!(c.stats().misses, 4);
    }

    #[test]
    fn under_the_cap_reset_keeps_everything() {
        let c = ExactCache::new(10 << 20);
        for size in [128, 256, 512, 128] {
            c.allocate(size, 64).unwrap();
        }
        // SAFETY: nothing is used after the reset.
        unsafe { c.reset() };
        let s = c.stats();
        assert_eq!((s.free_all_resets, s.frees, s.idle_blocks), (0, 0, 4));
        for size in [128, 256, 512, 128] {
            c.allocate(size, 64).unwrap();
        }
        assert_eq!(c.stats().hits, 4);
    }

    #[test]
    fn memory_is_writable() {
        let c = ExactCache::new(10 << 20);
        let p = c.allocate(1024, 64).unwrap();
        // SAFETY: `p` points to 1024 writable bytes until the reset.
        let s = unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), 1024) };
        s.fill(0xAB);
        assert!(s.iter().all(|&b| b == 0xAB));
    }
}
