//! Scratch sources: everything a kernel could take its scratch memory from, behind one trait.
//!
//! A source is built once per measurement ([`ScratchSource`], shared by every thread of the
//! measurement) and hands each thread a [`ScratchWorker`]: the object a kernel actually
//! allocates from. Sources whose design is shared between threads (the thread-caching
//! allocators, `zeropool`, the caching allocator's `Scope` path) give workers that borrow the
//! shared state; sources that are one arena or one cache per runtime (`bumpalo`, `static`,
//! `exact-cache`, the caching allocator's `allocate`/`reset` path) give each worker its own.
//!
//! Every worker implements [`caching_allocator::TempAllocator`], so any source can be handed
//! to a kernel (for example the attention kernel) as its temp allocator.
//!
//! # Adding a source
//! Write a [`ScratchSource`] and a [`ScratchWorker`], then add one [`SourceKind`] entry to
//! [`SOURCES`]. Override [`ScratchWorker::call`] when the natural way to use the allocator for
//! one kernel call differs from "`allocate` each block, then `reset`".

mod bump;
mod caching;
mod exact;
mod fixed;
mod fresh;
mod global;
mod pools;

use core::cell::RefCell;
use core::ptr::NonNull;
use std::fmt;

pub use caching_allocator::{AllocError, TempAllocator, MAX_ALIGN};

pub use bump::BumpaloSource;
pub use caching::{CachingMode, CachingSource};
pub use exact::{ExactCache, ExactCacheSource, ExactCacheStats};
pub use fixed::StaticSource;
pub use fresh::FreshPagesSource;
pub use global::GlobalAllocSource;
pub use pools::{OrthotopeSource, ZeropoolSource};

/// The alignment every workload asks for: ExecuTorch's default temp-allocator alignment.
pub const SCRATCH_ALIGN: usize = 64;

/// One block of scratch memory handed to a kernel by [`ScratchWorker::call`].
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// Start of the usable memory, aligned as requested.
    pub ptr: NonNull<u8>,
    /// Usable length in bytes (the size that was asked for).
    pub len: usize,
    /// Source-private: the address to give back (may differ from `ptr` when padded).
    base: *mut u8,
    /// Source-private: the length to give back.
    base_len: usize,
}

impl Block {
    /// A zero-length placeholder, used to fill block arrays before a call.
    pub const EMPTY: Block = Block {
        ptr: NonNull::dangling(),
        len: 0,
        base: core::ptr::null_mut(),
        base_len: 0,
    };

    /// A block whose memory is given back through `ptr` itself.
    fn new(ptr: NonNull<u8>, len: usize) -> Block {
        Block {
            ptr,
            len,
            base: ptr.as_ptr(),
            base_len: len,
        }
    }

    /// A block carved out of a larger region `base .. base + base_len`.
    fn padded(ptr: NonNull<u8>, len: usize, base: *mut u8, base_len: usize) -> Block {
        Block {
            ptr,
            len,
            base,
            base_len,
        }
    }
}

/// What a source can count about itself. `None` means "this source cannot count it".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Calls into the layer below: `malloc`-family calls for the malloc baselines, `mmap` for
    /// `fresh-pages`, chunk allocations for `bumpalo`, backing allocations for the caches.
    pub system_allocs: Option<u64>,
    /// Cache misses, for sources that are caches.
    pub misses: Option<u64>,
    /// The most bytes the source held from the layer below at once (live + cached), bytes.
    pub peak_reserved: Option<u64>,
    /// The most bytes live (handed out to the kernel) at once, bytes.
    pub peak_live: Option<u64>,
}

impl Counters {
    /// Counters that count system allocations only.
    pub fn allocs(n: u64) -> Counters {
        Counters {
            system_allocs: Some(n),
            ..Counters::default()
        }
    }

    /// Field-wise sum; a field is `None` only when it is `None` on both sides. (Peaks of
    /// several workers add up: an upper bound of the peak of their sum.)
    pub fn plus(self, other: Counters) -> Counters {
        fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            }
        }
        Counters {
            system_allocs: add(self.system_allocs, other.system_allocs),
            misses: add(self.misses, other.misses),
            peak_reserved: add(self.peak_reserved, other.peak_reserved),
            peak_live: add(self.peak_live, other.peak_live),
        }
    }

    /// Field-wise `self - earlier` (saturating) for the counts; the peaks are `self`'s.
    pub fn since(self, earlier: Counters) -> Counters {
        fn sub(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            a.map(|a| a.saturating_sub(b.unwrap_or(0)))
        }
        Counters {
            system_allocs: sub(self.system_allocs, earlier.system_allocs),
            misses: sub(self.misses, earlier.misses),
            peak_reserved: self.peak_reserved,
            peak_live: self.peak_live,
        }
    }
}

/// A scratch-memory source under test. Built once per measurement and shared by its threads.
pub trait ScratchSource: Send + Sync {
    /// The name used on the command line and in the table.
    fn name(&self) -> &'static str;

    /// A worker for the calling thread. Call it on the thread that will use the worker.
    fn worker(&self) -> Box<dyn ScratchWorker + '_>;

    /// Counters of state shared by all workers (workers report their own state themselves).
    fn counters(&self) -> Counters {
        Counters::default()
    }
}

/// The per-thread face of a source: what a kernel allocates its scratch from.
///
/// # Safety
/// Implementations promise that every [`Block`] passed to the `kernel` callback of
/// [`call`](ScratchWorker::call) is valid for reads and writes of `len` bytes for the whole
/// callback, is aligned to the requested alignment, and overlaps no other block of the call;
/// and that their [`TempAllocator`] implementation keeps that trait's contract. Benchmark code
/// writes through the blocks relying on this promise.
pub unsafe trait ScratchWorker: TempAllocator {
    /// One kernel call: obtain a block for each of `sizes` (alignment `align`) into
    /// `blocks[..sizes.len()]`, run `kernel` on them, then give them all back.
    ///
    /// The default goes through [`TempAllocator`]: `allocate` each block, then `reset`, which
    /// is how ExecuTorch's runtime drives its temp allocator. `blocks` must hold at least
    /// `sizes.len()` entries (it is caller-provided so the harness itself allocates nothing).
    fn call(
        &mut self,
        sizes: &[usize],
        align: usize,
        blocks: &mut [Block],
        kernel: &mut dyn FnMut(&[Block]),
    ) -> Result<(), AllocError> {
        allocate_then_reset(self, sizes, align, blocks, kernel)
    }

    /// This worker's own counters (state not shared with other workers).
    fn counters(&self) -> Counters {
        Counters::default()
    }

    /// This worker as a temp allocator, to hand to a kernel.
    fn as_temp(&self) -> &dyn TempAllocator;
}

/// One entry of the source registry.
pub struct SourceKind {
    /// Name on the command line and in the table.
    pub name: &'static str,
    /// One line for the table legend.
    pub about: &'static str,
    /// Builds the source.
    pub build: fn(&SourceConfig) -> Box<dyn ScratchSource>,
}

impl fmt::Debug for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceKind")
            .field("name", &self.name)
            .finish()
    }
}

/// Settings that sources take from the command line.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// `exact-cache` cap in bytes (ExecuTorch's LLM runner: 10 MB).
    pub exact_cap: u32,
    /// `caching` `max_cached_bytes`.
    pub caching_cap: usize,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            exact_cap: 10 * 1024 * 1024,
            caching_cap: 256 << 20,
        }
    }
}

/// Every source, in table order.
pub const SOURCES: &[SourceKind] = &[
    SourceKind {
        name: "system",
        about: "std System (glibc malloc) through GlobalAlloc",
        build: |_| Box::new(GlobalAllocSource::new("system", std::alloc::System)),
    },
    SourceKind {
        name: "mimalloc",
        about: "mimalloc through GlobalAlloc (not the global allocator)",
        build: |_| Box::new(GlobalAllocSource::new("mimalloc", mimalloc::MiMalloc)),
    },
    SourceKind {
        name: "jemalloc",
        about: "jemalloc (tikv-jemallocator) through GlobalAlloc",
        build: |_| Box::new(GlobalAllocSource::new("jemalloc", tikv_jemallocator::Jemalloc)),
    },
    SourceKind {
        name: "fresh-pages",
        about: "mmap/munmap per block: models iOS/macOS, where large mallocs are fresh VM pages",
        build: |_| Box::new(FreshPagesSource),
    },
    SourceKind {
        name: "exact-cache",
        about: "re-implementation of ExecuTorch's CPUCachingAllocator (exact sizes, one mutex, free-all over cap)",
        build: |c| Box::new(ExactCacheSource::new(c.exact_cap)),
    },
    SourceKind {
        name: "bumpalo",
        about: "bumpalo::Bump per thread, reset after every call",
        build: |_| Box::new(BumpaloSource),
    },
    SourceKind {
        name: "zeropool",
        about: "zeropool::ZeroPool, alloc_uninit + drop (buffers padded by align-1 to align them)",
        build: |_| Box::new(ZeropoolSource::new()),
    },
    SourceKind {
        name: "orthotope",
        about: "orthotope's global allocate/deallocate (thread caches over a 1 GiB arena)",
        build: |_| Box::new(OrthotopeSource),
    },
    SourceKind {
        name: "caching",
        about: "this project: CachingAllocator::allocate + reset, one allocator per runtime (thread), working-set slack 1.25",
        build: |c| Box::new(CachingSource::new(CachingMode::Reset, c.caching_cap)),
    },
    SourceKind {
        name: "caching-scope",
        about: "this project: one shared CachingAllocator, a Scope per call",
        build: |c| Box::new(CachingSource::new(CachingMode::Scope, c.caching_cap)),
    },
    SourceKind {
        name: "static",
        about: "buffers allocated once and reused: the floor",
        build: |_| Box::new(StaticSource),
    },
];

/// Looks a source up by name.
pub fn find(name: &str) -> Option<&'static SourceKind> {
    SOURCES.iter().find(|k| k.name == name)
}

/// Checks `align` the way the core library does: a power of two no larger than [`MAX_ALIGN`].
pub fn check_align(align: usize) -> Result<(), AllocError> {
    if align.is_power_of_two() && align <= MAX_ALIGN {
        Ok(())
    } else {
        Err(AllocError::InvalidAlignment { align })
    }
}

/// The pointer returned for zero-sized requests: dangling, aligned, never dereferenced.
pub fn dangling(align: usize) -> NonNull<u8> {
    // `align` is a non-zero power of two here, so it is a non-null address; fall back to the
    // std dangling pointer rather than panic if a caller skipped `check_align`.
    NonNull::new(core::ptr::without_provenance_mut(align)).unwrap_or(NonNull::dangling())
}

/// `addr` rounded up to a multiple of `align` (a power of two).
pub(crate) fn align_up(addr: usize, align: usize) -> usize {
    (addr + align - 1) & !(align - 1)
}

/// `size + align - 1`, the padded size that guarantees an aligned `size`-byte block inside.
pub(crate) fn padded_size(size: usize, align: usize) -> Result<usize, AllocError> {
    size.checked_add(align - 1)
        .filter(|&p| p <= isize::MAX as usize)
        .ok_or(AllocError::SizeOverflow { size, align })
}

/// The aligned pointer inside a padded region starting at `base`.
///
/// # Safety
/// `base` must point to at least `size + align - 1` bytes of one allocation.
pub(crate) unsafe fn align_within(base: NonNull<u8>, align: usize) -> NonNull<u8> {
    let offset = align_up(base.as_ptr() as usize, align) - base.as_ptr() as usize;
    // SAFETY: offset <= align - 1, and the caller guarantees the region holds
    // size + align - 1 bytes, so base + offset stays inside the same allocation.
    unsafe { base.add(offset) }
}

/// The default [`ScratchWorker::call`]: [`TempAllocator::allocate`] each block, run `kernel`,
/// then [`TempAllocator::reset`] (also after a failed allocation). Callable from a `call`
/// override that falls back to it.
pub(crate) fn allocate_then_reset<W: TempAllocator + ?Sized>(
    w: &mut W,
    sizes: &[usize],
    align: usize,
    blocks: &mut [Block],
    kernel: &mut dyn FnMut(&[Block]),
) -> Result<(), AllocError> {
    let n = sizes.len();
    assert!(blocks.len() >= n, "{} blocks for {n} sizes", blocks.len());
    for (slot, &size) in blocks.iter_mut().zip(sizes) {
        match w.allocate(size, align) {
            Ok(ptr) => *slot = Block::new(ptr, size),
            Err(e) => {
                // SAFETY: `&mut W` proves no other call on this allocator runs concurrently,
                // and nothing handed out so far has reached a kernel, so none of it is used
                // after this reset.
                unsafe { w.reset() };
                return Err(e);
            }
        }
    }
    kernel(&blocks[..n]);
    // SAFETY: the kernel has returned and the blocks it saw are not used again; `&mut W`
    // proves no other call on this allocator runs concurrently.
    unsafe { w.reset() };
    Ok(())
}

/// The blocks a worker that allocates and frees block by block has handed out through
/// [`TempAllocator::allocate`], given back together by its `reset`.
pub(crate) struct LiveBlocks(RefCell<Vec<Block>>);

impl LiveBlocks {
    /// An empty list, with room for a call's blocks.
    pub(crate) fn new() -> Self {
        LiveBlocks(RefCell::new(Vec::with_capacity(64)))
    }

    /// [`TempAllocator::allocate`] over `alloc_one` (which gets the non-zero size): checks
    /// `align`, answers a zero size with [`dangling`], and records the block for
    /// [`release_all`](Self::release_all).
    pub(crate) fn allocate(
        &self,
        size: usize,
        align: usize,
        alloc_one: impl FnOnce(usize) -> Result<Block, AllocError>,
    ) -> Result<NonNull<u8>, AllocError> {
        check_align(align)?;
        if size == 0 {
            return Ok(dangling(align));
        }
        let b = alloc_one(size)?;
        self.0.borrow_mut().push(b);
        Ok(b.ptr)
    }

    /// Gives every recorded block back through `free_one`, once each, and forgets it.
    ///
    /// # Safety
    /// `free_one` gives back blocks made by the `alloc_one` every recorded block came from,
    /// and none of those blocks is used afterwards.
    pub(crate) unsafe fn release_all(&self, free_one: unsafe fn(&Block)) {
        for b in self.0.borrow_mut().drain(..) {
            // SAFETY: `b` came from the matching `alloc_one` (the caller's promise) and is
            // drained, so given back once; the caller guarantees it is not used afterwards.
            unsafe { free_one(&b) };
        }
    }
}

/// Runs one call for sources that allocate and free block by block.
///
/// `alloc_one` obtains one block (zero sizes are handled here); `free_one` gives one back.
/// On an allocation failure the blocks obtained so far are given back before returning.
pub(crate) fn call_with(
    sizes: &[usize],
    align: usize,
    blocks: &mut [Block],
    kernel: &mut dyn FnMut(&[Block]),
    mut alloc_one: impl FnMut(usize) -> Result<Block, AllocError>,
    mut free_one: impl FnMut(&Block),
) -> Result<(), AllocError> {
    check_align(align)?;
    let n = sizes.len();
    assert!(blocks.len() >= n, "{} blocks for {n} sizes", blocks.len());
    for i in 0..n {
        let size = sizes[i];
        let got = if size == 0 {
            Ok(Block::padded(dangling(align), 0, core::ptr::null_mut(), 0))
        } else {
            alloc_one(size)
        };
        match got {
            Ok(b) => blocks[i] = b,
            Err(e) => {
                for b in &blocks[..i] {
                    if b.len != 0 {
                        free_one(b);
                    }
                }
                return Err(e);
            }
        }
    }
    kernel(&blocks[..n]);
    for b in &blocks[..n] {
        if b.len != 0 {
            free_one(b);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_and_since() {
        let a = Counters {
            system_allocs: Some(5),
            peak_live: Some(10),
            ..Counters::default()
        };
        let b = Counters {
            system_allocs: Some(2),
            misses: Some(1),
            ..Counters::default()
        };
        let s = a.plus(b);
        assert_eq!(s.system_allocs, Some(7));
        assert_eq!(s.misses, Some(1));
        assert_eq!(s.since(b).system_allocs, Some(5));
        assert_eq!((s.peak_live, s.since(b).peak_live), (Some(10), Some(10)));
        assert_eq!(s.peak_reserved, None);
        assert_eq!(
            Counters::default().plus(Counters::default()),
            Counters::default()
        );
    }

    #[test]
    fn registry_names_are_unique_and_findable() {
        for (i, k) in SOURCES.iter().enumerate() {
            assert!(SOURCES[..i].iter().all(|o| o.name != k.name), "{}", k.name);
            assert_eq!(find(k.name).map(|f| f.name), Some(k.name));
        }
        assert!(find("nonesuch").is_none());
    }

    #[test]
    fn align_helpers() {
        assert_eq!(align_up(65, 64), 128);
        assert_eq!(align_up(64, 64), 64);
        assert!(check_align(0).is_err());
        assert!(check_align(48).is_err());
        assert!(check_align(MAX_ALIGN * 2).is_err());
        assert!(check_align(4096).is_ok());
        assert_eq!(dangling(256).as_ptr() as usize, 256);
        assert!(padded_size(usize::MAX, 64).is_err());
    }
}
