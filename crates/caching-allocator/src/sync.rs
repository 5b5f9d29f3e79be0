//! The synchronisation primitives, in one module so that a model checker can swap them.
//!
//! Normal builds use `std`. Under `RUSTFLAGS="--cfg loom"` the locks and the per-cache atomics
//! come from [loom](https://docs.rs/loom), which explores every interleaving of the threads
//! of a model (see `tests/loom.rs`). Two things stay `std` under loom, on purpose:
//!
//! - `AtomicU64`: it only numbers allocators and threads from `static`s, and loom atomics
//!   cannot be built in a `const` context (nor outlive one model execution). The numbers
//!   only need to be distinct, which a `std` counter guarantees in any interleaving.
//! - `Arc`: loom's `Arc` cannot hold `dyn GlobalAlloc` (no unsized coercion), and reference
//!   counts are not where this crate's races are; the caches behind the `Arc`s are modelled.
//!
//! [`SpinLock`] becomes a loom `Mutex` under loom: a spin loop would multiply the explored
//! states without modelling anything the mutex does not (both acquire on lock, release on
//! unlock).

#[cfg(not(loom))]
use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};

pub(crate) use std::sync::atomic::AtomicU64;
pub(crate) use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

/// Locks a mutex, ignoring poisoning: no code path of this crate panics while it holds a lock,
/// so a poisoned lock can only come from a panic that left the data consistent.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A lock for data that one thread uses all the time and other threads touch rarely.
///
/// A thread cache is locked by its own thread on every call and by other threads only on slow
/// paths (trim, reset, stealing). Uncontended, taking it is one compare-exchange and giving it
/// back one plain store; a `std` mutex gives it back with a second atomic swap.
#[cfg(not(loom))]
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

#[cfg(not(loom))]
// SAFETY: the lock hands out access to `value` to one holder at a time (acquire/release on
// `locked`), so sharing the lock across threads only moves `T` between them: `T: Send` suffices.
unsafe impl<T: Send> Sync for SpinLock<T> {}
#[cfg(not(loom))]
// SAFETY: owning the lock is owning the `T` inside it.
unsafe impl<T: Send> Send for SpinLock<T> {}

#[cfg(not(loom))]
impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        SpinGuard { lock: self }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 100 {
                    core::hint::spin_loop();
                    spins += 1;
                } else {
                    // The holder may be descheduled (2 cores, many threads): let it run.
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
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
        // SAFETY: the guard exists only while `locked` is held by its creator, so no other
        // reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

#[cfg(not(loom))]
impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

#[cfg(not(loom))]
impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// Under loom, the spin lock is a loom mutex (see the module docs).
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
