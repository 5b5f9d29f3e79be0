//! The synchronisation primitives, in one module so that a model checker can swap them.
//!
//! Normal builds use `std`. Under `RUSTFLAGS="--cfg loom"` the locks and atomics come from
//! [loom](https://docs.rs/loom), which explores every interleaving of the threads of a model
//! (see `tests/loom.rs`): every lock the allocator takes, in the order it takes them, and every
//! atomic it reads. One primitive is swapped: the thread caches' [`SpinLock`] waits by spinning,
//! and loom 0.7 cannot bound a spin loop (its model lets a waiting thread's swap read the old
//! `true` forever, even with `yield_now`: a two-thread model of the bare lock exceeds loom's
//! branch limit). Under loom the spin lock is therefore a loom `Mutex` with the same interface
//! and the same acquire/release edges (lock = acquire, unlock = release); the spinning itself
//! is checked by the multi-thread test below under Miri and by ThreadSanitizer
//! (`scripts/sanitizers.sh`). Two things stay `std` under loom, on purpose:
//!
//! - `AtomicU64`: it numbers allocators from a `static` and ticks the eviction clock, and loom
//!   atomics cannot be built in a `const` context (nor outlive one model execution). The
//!   numbers only need to be distinct (ids) or roughly ordered (the clock), which `std`
//!   guarantees in any interleaving.
//! - `Arc`: loom's `Arc` cannot hold `dyn GlobalAlloc` (no unsized coercion), and reference
//!   counts are not where this crate's races are; the caches behind the `Arc`s are modelled.

use core::ops::{Deref, DerefMut};

pub(crate) use std::sync::atomic::AtomicU64;
pub(crate) use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

/// A plain load of an atomic word that only the calling thread ever stores to: the arena's
/// chunk range and whether its spare scope chunk is lent, which its owner writes and other
/// threads only load. The compiler may fold a plain load into the instruction that uses it,
/// which it never does with an atomic load (three instructions on the allocate + release
/// round trip).
pub(crate) trait WriterLoad {
    type Value;

    /// The value this thread last stored.
    ///
    /// # Safety
    /// The calling thread is the only one that ever stores to this word, so no store races
    /// this read (reads by other threads do not conflict with it).
    unsafe fn writer_load(&self) -> Self::Value;
}

/// `WriterLoad` for each atomic type the crate reads that way: `std`'s through `as_ptr`,
/// loom's through `unsync_load` (which checks the claim).
macro_rules! writer_load {
    ($([$($generic:ident)?] $atomic:ty => $value:ty),* $(,)?) => {$(
        impl<$($generic)?> WriterLoad for $atomic {
            type Value = $value;

            #[inline(always)]
            unsafe fn writer_load(&self) -> $value {
                // SAFETY: the caller's contract: every store to this word is this thread's, so
                // this read is ordered after all of them by program order, and only reads run
                // beside it.
                #[cfg(not(loom))]
                return unsafe { *self.as_ptr() };
                // SAFETY: as above; loom checks the claim.
                #[cfg(loom)]
                return unsafe { self.unsync_load() };
            }
        }
    )*};
}

writer_load!([] AtomicUsize => usize, [] AtomicBool => bool, [T] AtomicPtr<T> => *mut T);

/// Locks a mutex, ignoring poisoning: no code path of this crate panics while it holds a lock,
/// so a poisoned lock can only come from a panic that left the data consistent.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A test-and-set lock: one atomic swap to lock, one release store to unlock.
///
/// The thread caches use it. Its owner thread takes it on every call and other threads only
/// on slow paths, so it is almost never contended, and then cheaper than `std::sync::Mutex`
/// (whose unlock is a second read-modify-write). A waiter spins briefly, then yields: the
/// holder keeps it for a few dozen instructions, but may have been preempted.
#[cfg(not(loom))]
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    data: core::cell::UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `data` to one thread at a time (the swap in `lock` is
// the only way to a guard), so sharing the lock shares `T` only by moving access between
// threads: `T: Send` is enough, as for `std::sync::Mutex`.
#[cfg(not(loom))]
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: the lock owns its `T`.
#[cfg(not(loom))]
unsafe impl<T: Send> Send for SpinLock<T> {}

#[cfg(not(loom))]
impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            data: core::cell::UnsafeCell::new(value),
        }
    }

    /// Locks, spinning (then yielding) while another thread holds the lock.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.swap(true, Ordering::Acquire) {
            self.lock_contended();
        }
        SpinGuard { lock: self }
    }

    /// Waits until the lock looks free (reading only, so the waiter does not bounce the
    /// holder's cache line), then retries the swap.
    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 64 {
                    spins += 1;
                    core::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if !self.locked.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }
}

/// Access to a [`SpinLock`]'s data; dropping it unlocks.
#[cfg(not(loom))]
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

#[cfg(not(loom))]
impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock (see `SpinLock::lock`),
        // so no other reference to the data exists; the borrow of `self` ends before the unlock.
        unsafe { &*self.lock.data.get() }
    }
}

#[cfg(not(loom))]
impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { &mut *self.lock.data.get() }
    }
}

#[cfg(not(loom))]
impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// Under loom: the spin lock's interface over a loom `Mutex` (see the module docs).
#[cfg(loom)]
pub(crate) struct SpinLock<T> {
    inner: Mutex<T>,
}

#[cfg(loom)]
impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        SpinLock {
            inner: Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        SpinGuard {
            guard: lock(&self.inner),
        }
    }
}

/// Access to a [`SpinLock`]'s data under loom; dropping it unlocks.
#[cfg(loom)]
pub(crate) struct SpinGuard<'a, T> {
    guard: MutexGuard<'a, T>,
}

#[cfg(loom)]
impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

#[cfg(loom)]
impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spin_lock_excludes_other_threads() {
        let lock = SpinLock::new(0u64);
        let per_thread = if cfg!(miri) { 200 } else { 100_000 };
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..per_thread {
                        // A non-atomic read-modify-write: lost updates if two threads overlap.
                        let mut g = lock.lock();
                        let v = *g;
                        core::hint::black_box(());
                        *g = v + 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), 3 * per_thread);
    }
}
