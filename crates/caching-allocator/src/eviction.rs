//! Eviction: making room under the cap and within the working-set budget.
//!
//! When a release does not fit its cache's credit, [`CachingAllocator::make_room`] reclaims
//! the spare credit of every thread, then evicts the oldest idle block of the whole allocator
//! (by the stamps of `clock`), one at a time, until the cap has room. The working-set budget
//! (`working_set`) evicts the same way, before and after a block comes from the system, and
//! so does peak-bound growth (`Config::evict_before_new_peak`, in `reserve`), before.

use crate::allocator::CachingAllocator;
use crate::sync::{lock, Arc};
use crate::thread_cache::ThreadCache;

impl CachingAllocator {
    /// Grants credit for `need` idle bytes, making room under the cap if needed: first by
    /// reclaiming the credit threads hold beyond their idle blocks, then by evicting the least
    /// recently used idle blocks of the whole allocator, one at a time. `None` if even an
    /// empty cache could not hold `need` bytes, or nothing is left to evict.
    pub(crate) fn make_room(&self, need: usize) -> Option<usize> {
        if need > self.config().max_cached_bytes {
            return None;
        }
        let mut reclaimed = false;
        let mut engaged_now = false;
        loop {
            // (Bound first: the shared lock must be dropped before a trim takes it again.)
            let granted = lock(&self.shared).grant(need);
            if let Some(grant) = granted {
                if engaged_now {
                    // The cap evicted for the first time: trim to the working set too (from
                    // now on each new system block is followed by a trim anyway).
                    self.trim_to_budget();
                }
                return Some(grant);
            }
            if !reclaimed {
                reclaimed = true;
                self.reclaim_spare_credit();
                continue;
            }
            // The cap evicts: the working-set policy engages (once).
            engaged_now |= self.budget.engage();
            // Nothing left to evict: the cap cannot hold `need`.
            self.evict_oldest_bytes()?;
        }
    }

    /// Takes back every thread's credit beyond its idle blocks.
    fn reclaim_spare_credit(&self) {
        self.registry.for_each(|cache| {
            let mut state = cache.lock();
            let spare = state.credit - state.held();
            if spare > 0 {
                state.credit -= spare;
                lock(&self.shared).return_credit(spare);
            }
        });
    }

    /// Evicts the least recently used idle block of the whole allocator (pool or any thread
    /// cache; see `eviction` for how exact the order is). `false` if nothing is idle.
    pub(crate) fn evict_oldest(&self) -> bool {
        self.evict_oldest_bytes().is_some()
    }

    /// [`evict_oldest`](Self::evict_oldest), saying how many bytes went back to the system
    /// (0 if another thread took the block first). `None` if nothing is idle.
    pub(crate) fn evict_oldest_bytes(&self) -> Option<usize> {
        self.clock.advance();
        let mut oldest: Option<(u64, Option<Arc<ThreadCache>>)> =
            lock(&self.shared).pool_oldest().map(|stamp| (stamp, None));
        self.registry.for_each(|cache| {
            if !cache.may_have_idle() {
                return;
            }
            if let Some(stamp) = cache.lock().idle.oldest_stamp() {
                if oldest.as_ref().is_none_or(|(s, _)| stamp < *s) {
                    oldest = Some((stamp, Some(cache.clone())));
                }
            }
        });
        match oldest {
            None => None,
            Some((_, None)) => {
                // Another thread may have emptied the pool meanwhile: then the caller looks again.
                let mut shared = lock(&self.shared);
                let Some((_, block)) = shared.pool_pop_lru() else {
                    return Some(0);
                };
                let bytes = block.size();
                self.evict(&mut shared, block);
                Some(bytes)
            }
            Some((_, Some(cache))) => {
                // Another thread may have emptied it meanwhile: then the caller looks again.
                let mut state = cache.lock();
                let mut bytes = 0;
                if let Some((_, block)) = state.idle.pop_lru() {
                    bytes = block.size();
                    state.credit -= bytes;
                    let mut shared = lock(&self.shared);
                    shared.return_credit(bytes);
                    self.evict(&mut shared, block);
                }
                cache.publish(&state);
                Some(bytes)
            }
        }
    }
}

impl CachingAllocator {
    /// Evicts least recently used idle blocks until reserved bytes are within the working-set
    /// budget, or nothing is idle (if the policy is on). Called with no lock held, after a
    /// block came from the system and when the cap first evicts.
    pub(crate) fn trim_to_budget(&self) {
        self.trim_within_budget(0, 0);
    }

    /// Before a block of `class_size` bytes for a request of `requested` bytes comes from the
    /// system: evicts what the budget could not keep with that block added, so reserved bytes
    /// never peak with both the block and the idle ones it replaces (a decode loop's scratch,
    /// growing class by class, would otherwise hold its largest buffer twice at every step).
    pub(crate) fn trim_before_growth(&self, class_size: usize, requested: usize) {
        self.trim_within_budget(class_size, requested);
    }

    /// Evicts least recently used idle blocks until reserved bytes plus `incoming` are within
    /// the working-set budget (counting `incoming_requested` more bytes asked for by live
    /// blocks), or nothing is idle.
    fn trim_within_budget(&self, incoming: usize, incoming_requested: usize) {
        if !self.budget.is_on() {
            return;
        }
        let ws = self.working_set_figures();
        let live = ws.reserved.saturating_sub(ws.idle) + incoming;
        if live > self.limit_bytes() {
            // `limit_bytes` will refuse the incoming block whatever is evicted, and a refused
            // request evicts nothing.
            return;
        }
        let reserved = ws.reserved + incoming;
        // The working set is what the runtime asked for at its peak, not the blocks that served
        // it: wide fit hands out larger blocks, which must not raise the budget that pays for
        // them. Idle blocks are all that is evicted, so live bytes above the budget stay.
        let peak = ws
            .peak_requested
            .max(ws.requested.saturating_add(incoming_requested));
        let budget = self.budget.bytes_for(peak);
        let mut over = reserved.saturating_sub(budget.max(live));
        if over > 0 {
            self.budget.engage();
        }
        // Another thread may take the block chosen first (then 0 bytes are freed): a few such
        // races and the next trim finishes the job.
        let mut races = 0;
        while over > 0 && races < 4 {
            match self.evict_oldest_bytes() {
                None => break,
                Some(0) => races += 1,
                Some(freed) => over = over.saturating_sub(freed),
            }
        }
    }
}
