//! Scratch sources: everything a kernel could take its scratch memory from, behind one trait.
//!
//! A source is built once per measurement ([`ScratchSource`], shared by every thread of the
//! measurement) and hands each thread a [`ScratchWorker`]: the object a kernel actually
//! allocates from. Sources whose design is shared between threads (the thread-caching
//! allocators, `zeropool`, the caching allocator's `Scope` path) give workers that borrow the
//! shared state; sources that are one arena or one cache per runtime (`bumpalo`, `static`,
//! `exact-cache`, the caching allocator's `allocate`/`reset` path) give each worker its own.
//!
//! Every worker implements [`caching_allocator::TempAllocator`] (`&dyn ScratchWorker` coerces
//! to `&dyn TempAllocator`), so any source can be handed to a kernel (for example the
//! attention kernel) as its temp allocator.
//!
//! # Adding a source
//! - An allocator used block by block (`malloc`/`free`-like): implement [`PerBlock`] and wrap
//!   it in a [`BlockWorker`]; it gets `TempAllocator`, `call`, the zero-size and alignment
//!   rules and its clean-up from there.
//! - Otherwise write a [`ScratchWorker`]; override [`ScratchWorker::call`] only when the
//!   natural way to use the allocator for one kernel call differs from "`allocate` each
//!   block, then `reset`".
//!
//! A source with no state shared between threads is [`per_thread`] over its worker's
//! constructor; one with shared state implements [`ScratchSource`]. Then add one
//! [`SourceKind`] entry to [`SOURCES`].

mod bump;
mod caching;
mod exact;
mod fixed;
pub(crate) mod fresh;
mod global;
mod pools;

use core::cell::RefCell;
use core::ptr::NonNull;
use std::fmt;

pub use caching_allocator::{AllocError, TempAllocator, TempReset, MAX_ALIGN};

pub use caching::{CachingMode, CachingSource};
pub use exact::{ExactCache, ExactCacheStats};
pub use global::GlobalAllocSource;
pub use pools::ZeropoolSource;

/// The alignment every workload asks for: ExecuTorch's default temp-allocator alignment.
pub const SCRATCH_ALIGN: usize = 64;

/// One block of scratch memory handed to a kernel by [`ScratchWorker::call`].
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// Start of the usable memory, aligned as requested.
    pub ptr: NonNull<u8>,
    /// Usable length in bytes (the size that was asked for).
    pub len: usize,
}

impl Block {
    /// A zero-length placeholder, used to fill block arrays before a call.
    pub const EMPTY: Block = Block {
        ptr: NonNull::dangling(),
        len: 0,
    };

    /// The block of `len` bytes at `ptr`.
    fn new(ptr: NonNull<u8>, len: usize) -> Block {
        Block { ptr, len }
    }
}

/// One kernel call's scratch: a block of each of `sizes`, aligned to `align`, written into
/// the caller's `blocks` (so the harness itself allocates nothing), for `kernel`.
pub struct Call<'a> {
    /// The size of each block.
    pub sizes: &'a [usize],
    /// The alignment of every block.
    pub align: usize,
    /// Where the blocks go: at least `sizes.len()` entries.
    pub blocks: &'a mut [Block],
    /// The kernel, run once on `blocks[..sizes.len()]`.
    pub kernel: &'a mut dyn FnMut(&[Block]),
}

impl Call<'_> {
    /// Checks the alignment and the room in `blocks`, fills block `i` with `get(i, size)`,
    /// then runs the kernel on the blocks. The first error stops it before the kernel runs.
    fn run(
        self,
        mut get: impl FnMut(usize, usize) -> Result<Block, AllocError>,
    ) -> Result<(), AllocError> {
        check_align(self.align)?;
        let n = self.sizes.len();
        assert!(
            self.blocks.len() >= n,
            "{} blocks for {n} sizes",
            self.blocks.len()
        );
        for (i, (slot, &size)) in self.blocks.iter_mut().zip(self.sizes).enumerate() {
            *slot = get(i, size)?;
        }
        (self.kernel)(&self.blocks[..n]);
        Ok(())
    }
}

/// What a source can count about itself. `None` means "this source cannot count it".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
pub unsafe trait ScratchWorker: TempReset {
    /// One kernel call: obtain a block for each of `call.sizes` (alignment `call.align`),
    /// run `call.kernel` on them, then give them all back.
    ///
    /// The default goes through [`TempAllocator`]: `allocate` each block, then `reset`, which
    /// is how ExecuTorch's runtime drives its temp allocator.
    fn call(&mut self, call: Call<'_>) -> Result<(), AllocError> {
        allocate_then_reset(self, call)
    }

    /// This worker's own counters (state not shared with other workers).
    fn counters(&self) -> Counters {
        Counters::default()
    }
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

/// ExecuTorch's LLM runner's temp-allocator cap, `1024 * 1024 * 10` (used for both caches).
pub const RUNNER_CAP: usize = 10 << 20;

/// Source names the ratios and targets refer to: the floor.
pub const FLOOR: &str = "static";
/// This project's allocator, `allocate`/`reset` path.
pub const CACHING: &str = "caching";
/// This project's allocator, `Scope` path.
pub const CACHING_SCOPE: &str = "caching-scope";
/// The general-purpose allocators and pools `caching` should beat.
pub const RIVALS: [&str; 5] = ["system", "mimalloc", "jemalloc", "zeropool", "orthotope"];

/// The sources of `from` named in `names` (all of `from` when `None`); a name `from` lacks is
/// an error listing the known ones, or skipped when `skip_unknown`.
pub fn select(
    names: Option<&[String]>,
    from: &[&'static SourceKind],
    skip_unknown: bool,
) -> Result<Vec<&'static SourceKind>, String> {
    let Some(names) = names else {
        return Ok(from.to_vec());
    };
    let mut out = Vec::new();
    for n in names.iter().map(|n| n.trim()) {
        match from.iter().find(|k| k.name == n) {
            Some(k) => out.push(*k),
            None if skip_unknown => {}
            None => {
                let known: Vec<&str> = from.iter().map(|k| k.name).collect();
                return Err(format!("unknown source `{n}`; known: {}", known.join(", ")));
            }
        }
    }
    Ok(out)
}

/// Every source, in table order.
pub const SOURCES: &[SourceKind] = &[
    SourceKind {
        name: "system",
        about: "std System (glibc malloc) through GlobalAlloc",
        build: |_| Box::new(GlobalAllocSource::new(std::alloc::System)),
    },
    SourceKind {
        name: "mimalloc",
        about: "mimalloc through GlobalAlloc (not the global allocator)",
        build: |_| Box::new(GlobalAllocSource::new(mimalloc::MiMalloc)),
    },
    SourceKind {
        name: "jemalloc",
        about: "jemalloc (tikv-jemallocator) through GlobalAlloc",
        build: |_| Box::new(GlobalAllocSource::new(tikv_jemallocator::Jemalloc)),
    },
    SourceKind {
        name: "fresh-pages",
        about: "mmap/munmap per block: models iOS/macOS, where large mallocs are fresh VM pages",
        build: |_| per_thread(fresh::worker),
    },
    SourceKind {
        name: "exact-cache",
        about: "re-implementation of ExecuTorch's CPUCachingAllocator (exact sizes, one mutex, free-all over cap)",
        build: |c| {
            let cap = c.exact_cap;
            per_thread(move || ExactCache::new(cap))
        },
    },
    SourceKind {
        name: "bumpalo",
        about: "bumpalo::Bump per thread, reset after every call",
        build: |_| per_thread(bump::BumpWorker::new),
    },
    SourceKind {
        name: "zeropool",
        about: "zeropool::ZeroPool, alloc_uninit + drop (buffers padded by align-1 to align them)",
        build: |_| Box::new(ZeropoolSource::new()),
    },
    SourceKind {
        name: "orthotope",
        about: "orthotope's global allocate/deallocate (thread caches over a 1 GiB arena)",
        build: |_| per_thread(|| BlockWorker::new(pools::Orthotope)),
    },
    SourceKind {
        name: "caching",
        about: "this project: CachingAllocator::allocate + reset, one allocator per runtime (thread), working-set slack 1.25",
        build: |c| Box::new(CachingSource::new(CachingMode::Reset, c.caching_cap)),
    },
    SourceKind {
        name: "caching-scope",
        about: "this project: one shared CachingAllocator, a Scope per call, working-set slack 1.25",
        build: |c| Box::new(CachingSource::new(CachingMode::Scope, c.caching_cap)),
    },
    SourceKind {
        name: "static",
        about: "buffers allocated once and reused: the floor",
        build: |_| per_thread(fixed::StaticWorker::new),
    },
];

/// Sources only the `llm` comparison runs (on top of those of [`SOURCES`] it names).
pub const LLM_ONLY: &[SourceKind] = &[SourceKind {
    name: "caching-unbounded",
    about: "this project: CachingAllocator::allocate + reset with no cap on cached bytes",
    build: |_| Box::new(CachingSource::new(CachingMode::Reset, usize::MAX)),
}];

/// Looks a source of [`SOURCES`] up by name.
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

/// `Some(dangling)` for a zero-sized request, `None` for one to serve, after checking `align`:
/// the rules every worker's [`TempAllocator::allocate`] starts with.
pub(crate) fn zero_size(size: usize, align: usize) -> Result<Option<NonNull<u8>>, AllocError> {
    check_align(align)?;
    Ok((size == 0).then(|| dangling(align)))
}

/// The default [`ScratchWorker::call`]: [`TempAllocator::allocate`] each block, run `kernel`,
/// then [`TempReset::reset_unchecked`] (also after a failed allocation). Callable from a `call`
/// override that falls back to it.
pub(crate) fn allocate_then_reset<W: TempReset + ?Sized>(
    w: &mut W,
    call: Call<'_>,
) -> Result<(), AllocError> {
    let align = call.align;
    let r = call.run(|_, size| w.allocate(size, align).map(|p| Block::new(p, size)));
    // SAFETY: the kernel has returned (or never ran) and the blocks it saw are not used
    // again; `&mut W` proves no other call on this allocator runs concurrently.
    unsafe { w.reset_unchecked() };
    r
}

/// A source with no state shared between threads: each worker is `make()`, made on the
/// thread that uses it (one arena, cache or set of buffers per runtime).
pub fn per_thread<W, F>(make: F) -> Box<dyn ScratchSource>
where
    W: ScratchWorker + 'static,
    F: Fn() -> W + Send + Sync + 'static,
{
    Box::new(PerThread(make))
}

struct PerThread<F>(F);

impl<W, F> ScratchSource for PerThread<F>
where
    W: ScratchWorker + 'static,
    F: Fn() -> W + Send + Sync,
{
    fn worker(&self) -> Box<dyn ScratchWorker + '_> {
        Box::new((self.0)())
    }
}

/// An allocator used block by block: each block taken on its own and given back on its own
/// (`malloc`/`free`, `mmap`/`munmap`, a pool's take and drop). [`BlockWorker`] makes it a
/// worker.
pub trait PerBlock {
    /// What giving a block back needs (its base pointer and layout, a pool's guard, ...).
    type Held;

    /// A block of `size` bytes (never 0) whose start is aligned to `align` (a power of two
    /// up to [`MAX_ALIGN`], already checked), and what giving it back needs.
    ///
    /// # Errors
    /// The allocator's failure, as an [`AllocError`].
    fn take(&self, size: usize, align: usize) -> Result<(NonNull<u8>, Self::Held), AllocError>;

    /// Gives a block back.
    ///
    /// # Safety
    /// `held` came from [`take`](PerBlock::take) on `self` and is given back once; its block
    /// is not used afterwards.
    unsafe fn give_back(&self, held: Self::Held);

    /// Counters of this allocator (as [`ScratchWorker::counters`]).
    fn counters(&self) -> Counters {
        Counters::default()
    }
}

/// The worker of a [`PerBlock`] allocator: a kernel call takes each block, runs the kernel
/// and gives every block back; through [`TempAllocator`], blocks stay live until `reset`.
pub struct BlockWorker<P: PerBlock> {
    blocks: P,
    /// What the blocks live since the last reset (or live during a call) need to be given
    /// back, in the order they were taken.
    live: RefCell<Vec<P::Held>>,
}

impl<P: PerBlock> BlockWorker<P> {
    /// A worker over `blocks`, with room for a call's blocks.
    pub fn new(blocks: P) -> Self {
        BlockWorker {
            blocks,
            live: RefCell::new(Vec::with_capacity(64)),
        }
    }

    /// Gives back everything in `live` from index `from` on.
    fn give_back_from(blocks: &P, live: &mut Vec<P::Held>, from: usize) {
        for held in live.drain(from..) {
            // SAFETY: everything in `live` came from `blocks.take` and is drained, so given
            // back once; callers drain only blocks whose users are done with them.
            unsafe { blocks.give_back(held) };
        }
    }
}

// SAFETY: `PerBlock::take` gives a distinct live block of `size` bytes at `align`; it stays
// in `live` (so is not given back) until `reset`.
unsafe impl<P: PerBlock> TempAllocator for BlockWorker<P> {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = zero_size(size, align)? {
            return Ok(p);
        }
        let (ptr, held) = self.blocks.take(size, align)?;
        self.live.borrow_mut().push(held);
        Ok(ptr)
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl<P: PerBlock> caching_allocator::TempReset for BlockWorker<P> {
    unsafe fn reset_unchecked(&self) {
        // The caller guarantees nothing handed out is used after the reset.
        Self::give_back_from(&self.blocks, &mut self.live.borrow_mut(), 0);
    }
}

// SAFETY: each block of a call is its own `take` (distinct, `size` bytes at `align`), given
// back only after the kernel has returned.
unsafe impl<P: PerBlock> ScratchWorker for BlockWorker<P> {
    fn call(&mut self, call: Call<'_>) -> Result<(), AllocError> {
        let align = call.align;
        let (blocks, live) = (&self.blocks, self.live.get_mut());
        // Blocks handed out through `allocate` and not yet reset stay live.
        let mark = live.len();
        let res = call.run(|_, size| {
            if size == 0 {
                return Ok(Block::new(dangling(align), 0));
            }
            let (ptr, held) = blocks.take(size, align)?;
            live.push(held);
            Ok(Block::new(ptr, size))
        });
        // The kernel has returned (or never ran): the call's blocks go back.
        Self::give_back_from(blocks, live, mark);
        res
    }

    fn counters(&self) -> Counters {
        self.blocks.counters()
    }
}

impl<P: PerBlock> Drop for BlockWorker<P> {
    fn drop(&mut self) {
        // Dropping the worker ends the validity of what it handed out.
        Self::give_back_from(&self.blocks, self.live.get_mut(), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
