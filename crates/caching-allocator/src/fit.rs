//! Which block serves a request of a size class: an idle block of its own class, else best fit
//! (a larger idle class within `Config::max_oversize`, any larger one under cap pressure or in
//! working-set mode), else another thread's idle block, else the system (`system`).

use crate::allocator::{CachingAllocator, Request};
use crate::block::{Block, Live};
use crate::debug::{self};
use crate::sync::{lock, Ordering};
use crate::thread_cache::{CacheState, Local, ThreadCache};
use crate::{AllocError, SizeClass};

impl CachingAllocator {
    /// Takes a block of `class` (the class of `req`) for the calling thread, records it with
    /// `record` under its cache's lock, and poisons it if debug checks are on.
    #[inline(always)]
    pub(crate) fn take(
        &self,
        local: Local<'_>,
        class: SizeClass,
        req: &Request,
        counts_live: bool,
        record: impl FnOnce(&mut CacheState, Live),
    ) -> Result<Block, AllocError> {
        let mut state = local.lock();
        let (block, cached) = match state.idle.take(class, req.align) {
            Some(block) => (block, true),
            None => {
                let bound = self.fit_bound(class, &state);
                match bound.and_then(|largest| state.idle.take_larger(class, largest, req.align)) {
                    Some(block) => (block, true),
                    None => {
                        drop(state);
                        let found = self.take_slow(local, class, bound, req)?;
                        state = local.lock();
                        found
                    }
                }
            }
        };
        // A request counts as a hit or a miss; an arena's chunk is not a request (its blocks
        // count as hits).
        if !counts_live {
        } else if !cached {
            state.counters.misses += 1;
        } else {
            state.counters.hits += 1;
            if block.class != class {
                state.counters.oversize_hits += 1;
            }
        }
        if self.debug {
            // Poisoned before it is booked live: from then on a reset on another thread may
            // take it back (and check its canary) at any moment.
            drop(state);
            // SAFETY: the block is in nobody's books, so ours alone, and holds
            // `size + CANARY_LEN` bytes (`request` chose the class for that many).
            unsafe { debug::poison(block.ptr, req.size) };
            state = local.lock();
        }
        let live = Live {
            block,
            requested: req.size,
        };
        if counts_live {
            state
                .counters
                .add_live(&live, self.epoch.load(Ordering::Relaxed));
        }
        record(&mut state, live);
        local.publish(&state);
        drop(state);
        Ok(block)
    }

    /// A miss in this thread's cache: the shared pool, then other threads' idle blocks, then
    /// the system. Returns the block (homed in `here` in the directory) and whether it came
    /// from a cache. Holds no cache lock.
    #[cold]
    pub(crate) fn take_slow(
        &self,
        here: Local<'_>,
        class: SizeClass,
        bound: Option<SizeClass>,
        req: &Request,
    ) -> Result<(Block, bool), AllocError> {
        self.clock.advance();
        let pooled = {
            let mut shared = lock(&self.shared);
            shared.pool_take(class, req.align).or_else(|| {
                let largest = bound?;
                shared.pool_take_larger(class, largest, req.align)
            })
        };
        let cached = pooled
            .or_else(|| self.steal(here.cache(), class, req.align))
            .or_else(|| self.take_under_pressure(here, class, req.align));
        if let Some(block) = cached {
            // In nobody's books now: we may write its home.
            self.directory.set_home(block.addr(), Some(here.to_arc()));
            return Ok((block, true));
        }
        let block = self.system_alloc(class, req)?;
        self.directory.insert(block.addr(), Some(here.to_arc()));
        Ok((block, false))
    }

    /// Best fit under cap pressure: when a new block of `class` could not stay cached without
    /// evicting another (idle bytes + the class would pass the cap), any larger idle block
    /// serves instead,
    /// from this thread's cache or the pool. The memory is held anyway; a new block would only
    /// push an idle one out (a runtime under ExecuTorch's 10 MiB cap otherwise churns through
    /// the system every time its shapes start small again). Off with best fit off.
    pub(crate) fn take_under_pressure(
        &self,
        here: Local<'_>,
        class: SizeClass,
        align: usize,
    ) -> Option<Block> {
        if self.oversize <= 1.0
            || self.cached_bytes().saturating_add(class.size()) <= self.config.max_cached_bytes
        {
            return None;
        }
        let any = SizeClass::largest_within(usize::MAX)?;
        let mut state = here.lock();
        let found = state.idle.take_larger(class, any, align);
        here.publish(&state);
        drop(state);
        found.or_else(|| lock(&self.shared).pool_take_larger(class, any, align))
    }

    /// The largest class best fit may serve a request of `class` with, on the thread whose
    /// cache is `state` (`None`: exact only): `max_oversize` times the class, and once
    /// working-set retention is engaged (wide fit), any class that keeps the bytes this
    /// thread's live blocks hold within its working-set budget (see `working_set`).
    #[inline]
    pub(crate) fn fit_bound(&self, class: SizeClass, state: &CacheState) -> Option<SizeClass> {
        let bounded = self.larger_class(class);
        if !self.budget.engaged() {
            return bounded;
        }
        let wide = self
            .budget
            .headroom(&state.counters)
            .and_then(SizeClass::largest_within)
            .filter(|&c| c > class);
        bounded.max(wide)
    }

    /// The largest class `max_oversize` lets a request of `class` take (`None`: exact only).
    #[inline]
    pub(crate) fn larger_class(&self, class: SizeClass) -> Option<SizeClass> {
        if self.oversize <= 1.0 {
            return None;
        }
        let bound = class.size() as f64 * self.oversize;
        let largest = SizeClass::largest_within(bound.min(usize::MAX as f64) as usize)?;
        (largest > class).then_some(largest)
    }

    /// Looks for an idle block of `class` in other threads' caches; on the way, moves the idle
    /// blocks of exited threads to the shared pool. A block taken gives its credit back.
    pub(crate) fn steal(
        &self,
        here: &ThreadCache,
        class: SizeClass,
        align: usize,
    ) -> Option<Block> {
        let mut found = None;
        self.registry.for_each(|cache| {
            // Our own cache was just searched; empty ones are not worth a lock.
            if found.is_some() || core::ptr::eq(&**cache, here) || !cache.may_have_idle() {
                return;
            }
            let mut state = cache.lock();
            if cache.has_exited() {
                self.move_to_pool(&mut state);
                found = lock(&self.shared).pool_take(class, align);
            } else if let Some(block) = state.idle.take(class, align) {
                // The credit goes with the block: the cache no longer holds it.
                state.credit -= block.size();
                lock(&self.shared).return_credit(block.size());
                found = Some(block);
            }
            cache.publish(&state);
        });
        found
    }
}
