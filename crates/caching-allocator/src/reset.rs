//! Resets: every block handed out by `allocate` (or the `Allocator` trait), on any thread,
//! goes back to the cache at once, as ExecuTorch's runtime does after every kernel.
//!
//! Small blocks live in the threads' arenas, which a reset takes back in one atomic step: it
//! increments the allocator's epoch, and each arena's owner rewinds when it next sees the
//! epoch move (see `arena`). Larger blocks live in the thread caches' live tables, which the
//! reset then walks (only when some cache has one):
//!
//! A reset visits the thread caches one at a time, under each cache's own lock, so it is safe
//! against every other call running at the same time on other threads: allocations, releases,
//! scopes, stats, trims and other resets. What a concurrent allocation gets is decided by its
//! cache's lock:
//!
//! - a block whose `allocate` returned before the reset began is taken back;
//! - a block whose `allocate` began after the reset returned survives it;
//! - a block allocated while the reset runs is taken back if the reset reached its thread's
//!   cache after the allocation, and survives otherwise. Either way the books stay exact: the
//!   block is live or idle, never both, never lost.
//!
//! Blocks of a [`Scope`](crate::Scope) are not taken: they go back when their scope drops
//! (a scope may be open on another thread while a reset runs).

use crate::allocator::CachingAllocator;
use crate::block::{Block, Live};
use crate::sync::{Arc, Ordering};
use crate::thread_cache::{Local, ThreadCache};
use crate::AllocError;

impl CachingAllocator {
    /// Every block handed out by [`allocate`](Self::allocate) or the `Allocator` trait, on any
    /// thread, goes back to the cache (ExecuTorch's `reset()`). `&mut self` proves nothing
    /// handed out is still in use. Idle bookkeeping of exited threads is dropped here too.
    ///
    /// Blocks that do not fit under `max_cached_bytes` go back to the system, least recently
    /// used first.
    ///
    /// # Panics
    /// With debug checks on, if any block was written past its requested end: every other
    /// block is returned first, then the panic names the overrun blocks' sizes and classes.
    pub fn reset(&mut self) {
        let overruns = self.reset_all();
        self.forget_exited_threads();
        report_overruns(&overruns);
    }

    /// Like [`reset`](Self::reset), through a shared reference, as a temp allocator's owner
    /// needs. Other threads may be inside any call on this allocator meanwhile (see the
    /// `reset` module docs for which of their blocks survive); open [`Scope`](crate::Scope)s
    /// keep their blocks.
    ///
    /// # Safety
    /// No memory handed out by `allocate` or the `Allocator` trait before this call is used
    /// or released after it. (A block allocated *concurrently* with this call may have been
    /// taken back: only use such a block if the caller's own synchronisation orders its
    /// allocation after this call.)
    ///
    /// # Panics
    /// As [`reset`](Self::reset).
    #[inline]
    pub unsafe fn reset_unchecked(&self) {
        if self.reset_arenas() {
            report_overruns(&self.reset_live_tables());
        }
    }

    /// Like [`reset`](Self::reset), but an overrun found by debug checks is an error instead of
    /// a panic: every block is still returned (overrun ones to the system), and the error
    /// describes the first overrun block found (`Stats::corrupted_blocks` counts all of them).
    ///
    /// # Errors
    /// [`AllocError::Corrupted`] if debug checks found a block written past its requested end.
    pub fn try_reset(&mut self) -> Result<(), AllocError> {
        let overruns = self.reset_all();
        self.forget_exited_threads();
        first_overrun(&overruns)
    }

    /// [`try_reset`](Self::try_reset) through a shared reference.
    ///
    /// # Errors
    /// As [`try_reset`](Self::try_reset).
    ///
    /// # Safety
    /// As [`reset_unchecked`](Self::reset_unchecked).
    pub unsafe fn try_reset_unchecked(&self) -> Result<(), AllocError> {
        first_overrun(&self.reset_all())
    }

    /// Returns every live block of every thread to its thread's cache, within the cap, then
    /// hands unused credit back. Returns the errors of blocks found overrun (already freed).
    fn reset_all(&self) -> Vec<AllocError> {
        if self.reset_arenas() {
            self.reset_live_tables()
        } else {
            Vec::new()
        }
    }

    /// Takes back every block of the threads' arenas in one step; `true` if some thread cache
    /// may hold size-class blocks too (then `reset_live_tables` must run).
    #[inline(always)]
    fn reset_arenas(&self) -> bool {
        // One increment takes back every block the arenas handed out before it (each owner
        // rewinds on its next call). An RMW, so two resets never move it backwards.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        // The size classes' live blocks: a block booked before this reset began was counted
        // in `live_caches` before its `allocate` returned.
        self.any_live_tables()
    }

    /// The walk over the thread caches' live tables.
    #[inline(never)]
    fn reset_live_tables(&self) -> Vec<AllocError> {
        let mut overruns = Vec::new();
        self.tick();
        // Blocks that do not fit their cache's credit need eviction, which walks the registry:
        // they wait until the walk is over (rare: a reset usually returns what the cache held).
        let mut spilled: Vec<(Arc<ThreadCache>, Block)> = Vec::new();
        match self.only_live_table() {
            // A runtime that resets its own thread's blocks: no registry walk.
            Some(own) => {
                self.reset_cache(own.cache(), &|| own.to_arc(), &mut spilled, &mut overruns)
            }
            None => self.registry.for_each(|cache| {
                if cache.may_have_live() {
                    self.reset_cache(cache, &|| cache.clone(), &mut spilled, &mut overruns);
                }
            }),
        }
        for (cache, block) in spilled {
            self.keep_or_free(&cache, block);
        }
        overruns
    }

    /// The calling thread's cache, if its live table is the only one that may hold a block:
    /// `live_caches` is 1 and this cache counts in it. A block booked on another thread before
    /// this reset began would have counted too (its `allocate` raised the count before it
    /// returned), so no other cache needs a visit.
    fn only_live_table(&self) -> Option<Local<'_>> {
        let own = self.last_local()?;
        (self.live_tables() == 1 && own.may_have_live()).then_some(own)
    }

    /// Returns every live block of `cache` to its idle blocks, within its credit; blocks the
    /// credit cannot cover go to `spilled` (with `arc`, an `Arc` of the cache), overruns found
    /// by debug checks to `overruns`.
    fn reset_cache(
        &self,
        cache: &ThreadCache,
        arc: &dyn Fn() -> Arc<ThreadCache>,
        spilled: &mut Vec<(Arc<ThreadCache>, Block)>,
        overruns: &mut Vec<AllocError>,
    ) {
        let mut state = cache.lock();
        // Nothing booked since the last reset: the hint was stale (see `live_hint`).
        cache.clear_live_hint(&state);
        let mut returning: Vec<Live> = core::mem::take(&mut state.returning);
        state.live.drain_into(&mut returning);
        let before = spilled.len();
        for live in returning.drain(..) {
            state.counters.remove_live(&live);
            match self.checked(live) {
                Ok(block) => {
                    if let Some(block) = self.keep_idle(&mut state, block) {
                        spilled.push((arc(), block));
                    }
                }
                Err(overrun) => overruns.push(overrun),
            }
        }
        state.returning = returning;
        if spilled.len() == before {
            self.trim_credit(&mut state);
        }
        cache.publish(&state);
    }
}

fn first_overrun(overruns: &[AllocError]) -> Result<(), AllocError> {
    match overruns.first() {
        None => Ok(()),
        Some(e) => Err(e.clone()),
    }
}

fn report_overruns(overruns: &[AllocError]) {
    if overruns.is_empty() {
        return;
    }
    let list: Vec<String> = overruns
        .iter()
        .map(|e| match e {
            AllocError::Corrupted {
                requested,
                class_size,
                ..
            } => format!("{requested} bytes requested (class {class_size})"),
            other => other.to_string(),
        })
        .collect();
    panic!(
        "caching-allocator: {} block(s) were written past their requested end: {}; they were \
         given back to the system and every other block was returned to the cache",
        overruns.len(),
        list.join(", ")
    );
}
