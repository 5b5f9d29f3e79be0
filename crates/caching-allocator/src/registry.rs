//! The thread registry: every thread cache of one allocator, so that reset, trim, stats and
//! eviction reach the caches of idle threads too.
//!
//! A thread registers its cache on its first call. A cache whose thread has exited is
//! *forgotten* once it holds no live block and no open scope (its idle blocks go to the shared
//! pool first), so a runtime that spawns threads without end does not grow the registry
//! without end: forgetting runs whenever a new thread registers, and at `reset(&mut self)`.
//!
//! Lock order, allocator-wide: registry, then one thread cache, then the shared cache, then a
//! directory shard. Code that walks the registry holds its lock and locks one cache at a time.

use crate::sync::{lock, Arc, AtomicUsize, Mutex};
use crate::thread_cache::{CacheGuard, ThreadCache};

pub(crate) struct Registry {
    caches: Mutex<Vec<Arc<ThreadCache>>>,
    /// The cache of calls made while a thread's locals are torn down: shared by such threads,
    /// never forgotten.
    fallback: Arc<ThreadCache>,
}

impl Registry {
    pub(crate) fn new(live_caches: &Arc<AtomicUsize>) -> Self {
        let fallback = ThreadCache::new_arc(false, live_caches.clone());
        Registry {
            caches: Mutex::new(vec![fallback.clone()]),
            fallback,
        }
    }

    pub(crate) fn fallback(&self) -> &Arc<ThreadCache> {
        &self.fallback
    }

    /// Adds a new thread's cache; first forgets exited threads' caches, handing each (locked,
    /// empty of live blocks) to `forget` to empty it (see `forget_exited_now`).
    pub(crate) fn register(
        &self,
        cache: &Arc<ThreadCache>,
        forget: impl FnMut(&ThreadCache, &mut CacheGuard) -> bool,
    ) {
        let mut caches = lock(&self.caches);
        Self::forget_exited(&mut caches, forget);
        caches.push(cache.clone());
    }

    /// Forgets the caches of exited threads that hold no live block and no open scope, handing
    /// each (locked) to `forget`, which moves its idle blocks and credit elsewhere, or returns
    /// `false` to keep the cache (its arena still holds live blocks).
    pub(crate) fn forget_exited_now(
        &self,
        forget: impl FnMut(&ThreadCache, &mut CacheGuard) -> bool,
    ) {
        Self::forget_exited(&mut lock(&self.caches), forget);
    }

    fn forget_exited(
        caches: &mut Vec<Arc<ThreadCache>>,
        mut forget: impl FnMut(&ThreadCache, &mut CacheGuard) -> bool,
    ) {
        caches.retain(|cache| {
            if !cache.forgettable() {
                return true;
            }
            let mut state = cache.lock();
            if !state.live.is_empty() || !state.scoped.is_empty() {
                return true;
            }
            if !forget(cache, &mut state) {
                return true;
            }
            debug_assert!(state.held() == 0 && state.credit == 0);
            state.forgotten = true;
            false
        });
    }

    /// Calls `f` on every cache, under the registry's lock (so `f` may lock one cache, then the
    /// shared cache, but must not reach the registry again).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&Arc<ThreadCache>)) {
        for cache in lock(&self.caches).iter() {
            f(cache);
        }
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.caches).len()
    }
}
