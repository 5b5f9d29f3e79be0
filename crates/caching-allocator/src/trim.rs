//! Giving memory back: `trim` and `free_cached`, the shared pool the idle blocks move to,
//! the caches of exited threads, and the figures the working-set budget weighs.

use crate::allocator::{CachingAllocator, WorkingSetFigures};
use crate::shared_cache::CREDIT_STEP;
use crate::sync::{lock, Ordering};
use crate::thread_cache::{CacheState, ThreadCache};

impl CachingAllocator {
    /// Gives every idle cached block back to the system, in every thread's cache, and the
    /// arenas' chunks that hold nothing live: the calling thread's, those of exited threads,
    /// and those of threads that have not called since the last reset. (A chunk another
    /// thread is using in the current reset interval stays: only its owner may take it.)
    pub fn free_cached(&self) {
        self.trim(0);
    }

    /// Evicts least recently used idle blocks until at most `keep_bytes` stay cached, counted
    /// over every thread's cache. The blocks that stay move to the shared pool. Arena chunks
    /// are reclaimed as by [`free_cached`](Self::free_cached).
    pub fn trim(&self, keep_bytes: usize) {
        // Exited threads' caches that hold nothing live go first, with their arenas' chunks:
        // nobody bumps through those any more, and thread churn must leave nothing behind.
        self.forget_exited_threads();
        self.park_own_chunk();
        self.revoke_stale_chunks();
        if self.cached_bytes() <= keep_bytes {
            return;
        }
        self.clock.advance();
        self.registry.for_each(|cache| {
            let mut state = cache.lock();
            self.move_to_pool(&mut state);
            cache.publish(&state);
        });
        let mut shared = lock(&self.shared);
        while shared.pool_bytes() > keep_bytes {
            let Some((_, block)) = shared.pool_pop_lru() else {
                break;
            };
            self.evict(&mut shared, block);
        }
    }

    /// Moves every idle block of a locked thread cache to the shared pool and returns its
    /// credit.
    /// The arena's chunk and the spare scope chunk stay, with their credit (only their owner
    /// moves them, or `forget_cache`).
    pub(crate) fn move_to_pool(&self, state: &mut CacheState) {
        let mut shared = lock(&self.shared);
        let chunk = state.chunk_bytes();
        shared.return_credit(state.credit - chunk);
        state.credit = chunk;
        while let Some((stamp, block)) = state.idle.pop_lru() {
            // Under the pool's lock, before anyone can take it from there.
            self.directory.set_home(block.addr(), None);
            shared.pool_insert(block, stamp);
        }
    }

    /// Empties the cache of an exited thread that is being forgotten (locked, no live block):
    /// its idle blocks go to the pool, its counters to the shared books.
    /// `false` (nothing changes) if its arena still holds live blocks.
    pub(crate) fn forget_cache(&self, cache: &ThreadCache, state: &mut CacheState) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        if cache.arena.shared.figures(epoch).live_blocks > 0 {
            return false;
        }
        cache.clear_live_hint(state);
        // The owner exited and its arena holds nothing live: nobody bumps through it, and no
        // scope is open on it (`forgettable`), so nobody has its spare scope chunk.
        self.chunk_to_idle(state);
        self.spare_to_idle(state);
        self.move_to_pool(state);
        let arena = cache.arena.shared.figures(epoch);
        lock(&self.shared).retire(
            &state.counters,
            &arena,
            cache.arena.shared.spare_lends(),
            epoch,
        );
        true
    }

    /// What working-set retention weighs, summed over every cache (see `working_set`).
    pub(crate) fn working_set_figures(&self) -> WorkingSetFigures {
        let mut ws = WorkingSetFigures::default();
        self.registry.for_each(|cache| {
            let state = cache.lock();
            ws.idle += state.idle.bytes();
            ws.peak_requested = ws
                .peak_requested
                .saturating_add(state.counters.peak_requested_bytes);
            ws.requested += state.counters.requested_bytes;
        });
        let shared = lock(&self.shared);
        ws.idle += shared.pool_bytes();
        ws.peak_requested = ws
            .peak_requested
            .saturating_add(shared.retired_peak_requested());
        ws.reserved = shared.reserved();
        ws
    }

    /// Idle bytes, in every cache.
    pub(crate) fn cached_bytes(&self) -> usize {
        let mut bytes = 0;
        self.registry
            .for_each(|cache| bytes += cache.lock().idle.bytes());
        bytes + lock(&self.shared).pool_bytes()
    }

    /// Forgets the caches of exited threads that hold nothing live.
    pub(crate) fn forget_exited_threads(&self) {
        self.registry
            .forget_exited_now(|cache, state| self.forget_cache(cache, state));
    }

    /// Hands spare credit of a just-reset cache back, keeping one step so the next kernel's
    /// releases need no shared lock.
    pub(crate) fn trim_credit(&self, state: &mut CacheState) {
        let spare = (state.credit - state.held()).saturating_sub(CREDIT_STEP);
        if spare > 0 {
            state.credit -= spare;
            lock(&self.shared).return_credit(spare);
        }
    }
}
