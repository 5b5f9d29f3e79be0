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
//! Thread caches use `biased_lock` normally; under loom they use [`SpinLock`], a loom `Mutex`:
//! loom cannot model the biased lock's asymmetric barrier (its own test runs under Miri).

#[cfg(loom)]
use core::ops::{Deref, DerefMut};

pub(crate) use std::sync::atomic::AtomicU64;
pub(crate) use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// Under loom, the thread caches' lock: a loom mutex. Normal builds use `biased_lock`, whose
/// asymmetric barrier loom cannot model (it is checked by its own test under Miri instead).
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
