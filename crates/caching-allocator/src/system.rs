//! Blocks from and back to the system allocator: the hard limit, room under the cap, the retry
//! after an out-of-memory refusal, huge pages, debug canaries.

use core::ptr::NonNull;

use crate::allocator::{CachingAllocator, Request};
use crate::block::{Block, MIN_ALIGN};
use crate::huge_pages::{self, HUGE_PAGE};
use crate::shared_cache::SharedCache;
use crate::sync::lock;
use crate::{AllocError, SizeClass};

impl CachingAllocator {
    /// Takes a new block from the system, within `limit_bytes`, retrying once after freeing
    /// the idle cache if the system refuses.
    pub(crate) fn system_alloc(
        &self,
        class: SizeClass,
        req: &Request,
    ) -> Result<Block, AllocError> {
        // Make room first, so the peak of reserved bytes never holds the block that is about to
        // be given back beside the one replacing it.
        self.trim_before_growth(class.size(), req.size);
        let huge = class.size() >= self.huge_min;
        let align = if huge {
            req.align.max(HUGE_PAGE)
        } else {
            req.align.max(MIN_ALIGN)
        };
        let layout = Block::layout_for(class, align).ok_or(AllocError::SizeOverflow {
            size: req.size,
            align: req.align,
        })?;
        self.reserve(class, req)?;
        let mut retried = false;
        loop {
            // SAFETY: `layout` has a non-zero size (every class is at least 64 bytes).
            let ptr = unsafe { self.system.alloc(layout) };
            if let Some(ptr) = NonNull::new(ptr) {
                let advised = if huge {
                    huge_pages::advise(ptr.as_ptr(), class.size())
                } else {
                    0
                };
                lock(&self.shared).allocated(advised);
                // Reserved bytes grew: keep them within the working set (if that policy is on).
                self.trim_to_budget();
                // SAFETY: `ptr` came from the system allocator for exactly this layout.
                let mut block = unsafe { Block::new(ptr, class, align) };
                block.huge = advised > 0;
                return Ok(block);
            }
            if req.retry && !retried && self.cached_bytes() > 0 && !larger_than_memory(class.size())
            {
                // As PyTorch's caching allocators do: give the idle cache back, try once more.
                lock(&self.shared).note_oom_retry();
                self.free_cached();
                retried = true;
                continue;
            }
            lock(&self.shared).unreserve(class.size());
            return Err(AllocError::OutOfMemory {
                size: req.size,
                align: req.align,
            });
        }
    }

    /// Counts `class.size()` more bytes as taken from the system. With peak-bound growth
    /// (`Config::evict_before_new_peak`), while they would pass the peak of reserved bytes,
    /// evicts least recently used idle blocks first, until nothing is idle. Past
    /// `limit_bytes`, evicts them too, but only if that can make room: a request that would
    /// not fit with every idle block gone fails before anything is evicted.
    pub(crate) fn reserve(&self, class: SizeClass, req: &Request) -> Result<(), AllocError> {
        let size = class.size();
        let mut chunks_parked = false;
        let mut hold_peak = self.config.evict_before_new_peak;
        // Another thread may take the block chosen for eviction first (then 0 bytes are
        // freed): after a few such races the block goes ahead and the peak grows.
        let mut races = 0;
        loop {
            let mut shared = lock(&self.shared);
            // Checked and counted under one lock, so threads missing at once do not all pass
            // the peak on the strength of the same idle bytes.
            if hold_peak && shared.reserved().saturating_add(size) > shared.peak_reserved() {
                drop(shared);
                match self.evict_oldest_bytes() {
                    None => hold_peak = false, // nothing idle: the peak grows
                    Some(0) => {
                        races += 1;
                        hold_peak = races < 4;
                    }
                    Some(_) => {}
                }
                continue;
            }
            if shared.try_reserve(size, self.limit) {
                return Ok(());
            }
            if !chunks_parked && self.limit != usize::MAX {
                // Arena chunks that hold nothing live are idle bytes too: the caller's own,
                // and those of arenas a reset emptied. Into the idle blocks with them, where
                // the eviction below can free them.
                drop(shared);
                chunks_parked = true;
                self.park_own_chunk();
                self.revoke_stale_chunks();
                continue;
            }
            let reserved = shared.reserved();
            drop(shared);
            let refuse = || {
                if self.limit == usize::MAX {
                    // No limit, yet the total would pass `usize::MAX`: no system has that.
                    AllocError::OutOfMemory {
                        size: req.size,
                        align: req.align,
                    }
                } else {
                    AllocError::LimitExceeded {
                        size: req.size,
                        class_size: size,
                        limit: self.limit,
                        reserved,
                    }
                }
            };
            let live = reserved.saturating_sub(self.cached_bytes());
            if self.limit == usize::MAX || live.saturating_add(size) > self.limit {
                return Err(refuse());
            }
            if !self.evict_oldest() {
                return Err(refuse());
            }
        }
    }

    pub(crate) fn system_free(&self, shared: &mut SharedCache, block: Block) {
        self.directory.remove(block.addr());
        // As `system_alloc` counted it: the whole huge pages inside the block.
        let advised = if block.huge {
            huge_pages::whole_pages(block.ptr.as_ptr(), block.size()).1
        } else {
            0
        };
        // SAFETY: blocks are only built from system allocations of exactly `block.layout()`,
        // and every caller passes a block it just removed from the books, so it is freed once.
        unsafe { self.system.dealloc(block.ptr.as_ptr(), block.layout()) };
        shared.freed(block.size(), advised);
    }

    /// Gives a block back to the system because of the cap, the limit or a trim.
    pub(crate) fn evict(&self, shared: &mut SharedCache, block: Block) {
        shared.note_eviction();
        self.system_free(shared, block);
    }
}

/// Whether `bytes` is more than the machine's memory, so freeing the idle cache cannot help.
/// Unknown (other systems, Miri) counts as no.
pub(crate) fn larger_than_memory(bytes: usize) -> bool {
    physical_memory().is_some_and(|total| bytes > total)
}

#[cfg(all(target_os = "linux", not(miri)))]
fn physical_memory() -> Option<usize> {
    static TOTAL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    })
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn physical_memory() -> Option<usize> {
    None
}
