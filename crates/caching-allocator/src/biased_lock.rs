//! A lock biased towards one owner thread: the owner's lock and unlock are plain stores and
//! loads, with no read-modify-write instruction; other threads pay instead.
//!
//! A thread cache is used by its own thread on every allocation and by other threads only on
//! slow paths (trim, stats, stealing idle blocks, a block released on another thread). A
//! compare-exchange per lock and unlock would cost its owner ~7 ns per round trip on the
//! machines we measure; this lock costs it ~1 ns.
//!
//! The protocol is Dekker's, with an asymmetric barrier (as in folly's `asymmetricLightBarrier`
//! / `asymmetricHeavyBarrier` and userspace RCU):
//!
//! - owner: `busy = true`; light barrier; if `foreign` is set, undo and take the mutex instead.
//!   Unlock: `busy = false` (release).
//! - other thread: take the mutex; `foreign = true`; heavy barrier; wait until `busy` is false.
//!   Unlock: `foreign = false` (release), release the mutex.
//!
//! The barriers make the two store-then-load sequences act as if both had a full fence, so at
//! most one side enters: either the owner sees `foreign` or the other thread sees `busy`. On
//! Linux the heavy barrier is `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full
//! fence on every CPU running one of our threads, so the light barrier only has to stop the
//! compiler. Where that is unavailable (other systems, Miri, a kernel without it) both barriers
//! are `fence(SeqCst)`. The choice is made once, before any allocator exists, and never changes.
//!
//! Data written inside one side's critical section is seen by the next: the owner's unlock is a
//! release store of `busy` that the other thread's wait loads with acquire; the other thread's
//! unlock is a release store of `foreign` that the owner loads with acquire (or the mutex).

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// 1: membarrier is registered (light = compiler fence); 2: fences on both sides.
static MODE: AtomicU8 = AtomicU8::new(0);
const MEMBARRIER: u8 = 1;
const FENCES: u8 = 2;
static INIT: Once = Once::new();

/// Chooses the barriers. Called by every allocator constructor, so it happens before any lock
/// of this kind is used.
pub(crate) fn init() {
    INIT.call_once(|| {
        let mode = if register_membarrier() {
            MEMBARRIER
        } else {
            FENCES
        };
        MODE.store(mode, Ordering::Release);
    });
}

#[cfg(all(target_os = "linux", not(miri)))]
fn register_membarrier() -> bool {
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    // SAFETY: membarrier takes integer arguments only and touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    r == 0
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn register_membarrier() -> bool {
    false
}

#[inline]
fn light_barrier() {
    if MODE.load(Ordering::Relaxed) == MEMBARRIER {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

fn heavy_barrier() {
    #[cfg(all(target_os = "linux", not(miri)))]
    if MODE.load(Ordering::Relaxed) == MEMBARRIER {
        membarrier_all_cpus();
        return;
    }
    fence(Ordering::SeqCst);
}

/// A full fence on every CPU that runs one of our threads.
#[cfg(all(target_os = "linux", not(miri)))]
#[cold]
fn membarrier_all_cpus() {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    let call = |cmd: libc::c_long| {
        // SAFETY: membarrier takes integer arguments only and touches no memory of ours.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        }
    };
    if call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 {
        return;
    }
    // A forked child may not inherit the registration: register again and retry, and fall back
    // to the slow global command, which needs none.
    if (register_membarrier() && call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
        || call(MEMBARRIER_CMD_GLOBAL) == 0
    {
        return;
    }
    // Owners rely on this barrier (they only stop the compiler): there is no safe way on.
    panic!("caching-allocator: membarrier failed after it was registered");
}

/// The lock. See the module docs for the protocol.
pub(crate) struct BiasedLock<T> {
    busy: AtomicBool,
    foreign: AtomicBool,
    mutex: Mutex<()>,
    value: UnsafeCell<T>,
}

// SAFETY: one side at a time reaches `value` (the protocol above), and the release/acquire
// pairs order its accesses, so sharing the lock only moves `T` between threads.
unsafe impl<T: Send> Sync for BiasedLock<T> {}
// SAFETY: owning the lock is owning the `T`.
unsafe impl<T: Send> Send for BiasedLock<T> {}

/// Access to a [`BiasedLock`]'s value; dropping it unlocks.
pub(crate) struct BiasedGuard<'a, T> {
    lock: &'a BiasedLock<T>,
    /// `None` on the owner's fast path.
    mutex: Option<MutexGuard<'a, ()>>,
    /// Whether this guard set `foreign` (and must clear it).
    foreign: bool,
}

impl<T> BiasedLock<T> {
    pub(crate) fn new(value: T) -> Self {
        BiasedLock {
            busy: AtomicBool::new(false),
            foreign: AtomicBool::new(false),
            mutex: Mutex::new(()),
            value: UnsafeCell::new(value),
        }
    }

    /// Locks as the owner.
    ///
    /// # Safety
    /// Only one thread ever calls this on a given lock (the owner; any other thread calls
    /// [`lock`](Self::lock)), and it does not call it again while it holds the guard.
    #[inline]
    pub(crate) unsafe fn lock_as_owner(&self) -> BiasedGuard<'_, T> {
        self.busy.store(true, Ordering::Relaxed);
        light_barrier();
        if !self.foreign.load(Ordering::Acquire) {
            return BiasedGuard {
                lock: self,
                mutex: None,
                foreign: false,
            };
        }
        self.busy.store(false, Ordering::Release);
        self.owner_slow()
    }

    /// Another thread holds the lock: wait for it on the mutex, which every other thread takes.
    #[cold]
    fn owner_slow(&self) -> BiasedGuard<'_, T> {
        let mutex = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        BiasedGuard {
            lock: self,
            mutex: Some(mutex),
            foreign: false,
        }
    }

    /// Locks from any thread (including the owner, outside `lock_as_owner`).
    pub(crate) fn lock(&self) -> BiasedGuard<'_, T> {
        let mutex = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        self.foreign.store(true, Ordering::Relaxed);
        heavy_barrier();
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) {
            if spins < 100 {
                core::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        BiasedGuard {
            lock: self,
            mutex: Some(mutex),
            foreign: true,
        }
    }

    /// Locks when the caller knows no other thread is inside any call on this lock (reset
    /// through `&mut`, or under `reset_unchecked`'s contract): no barrier needed.
    pub(crate) fn lock_exclusive(&self) -> BiasedGuard<'_, T> {
        let mutex = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        // The owner's last unlock stored `busy = false` with release; loading it with acquire
        // makes its critical sections happen before ours.
        let busy = self.busy.load(Ordering::Acquire);
        debug_assert!(!busy, "lock_exclusive while the owner is inside a call");
        BiasedGuard {
            lock: self,
            mutex: Some(mutex),
            foreign: false,
        }
    }
}

impl<T> Deref for BiasedGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a guard exists only while its side holds the lock (module docs), so no other
        // reference to the value is live.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for BiasedGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for BiasedGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.mutex.is_none() {
            self.lock.busy.store(false, Ordering::Release);
        } else if self.foreign {
            self.lock.foreign.store(false, Ordering::Release);
        }
        // The mutex guard, if any, unlocks after this.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn owner_and_others_never_overlap() {
        init();
        let lock = Arc::new(BiasedLock::new((0u64, 0u64)));
        let rounds = if cfg!(miri) { 50 } else { 20_000 };
        let owner = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    // SAFETY: this thread is the only one calling `lock_as_owner`.
                    let mut g = unsafe { lock.lock_as_owner() };
                    // A torn pair would show another side inside at the same time.
                    assert_eq!(g.0, g.1);
                    g.0 += 1;
                    g.1 += 1;
                }
            })
        };
        let others: Vec<_> = (0..2)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..rounds / 20 {
                        let mut g = lock.lock();
                        assert_eq!(g.0, g.1);
                        g.0 += 1;
                        std::thread::yield_now();
                        g.1 += 1;
                    }
                })
            })
            .collect();
        owner.join().unwrap();
        for t in others {
            t.join().unwrap();
        }
        let g = lock.lock_exclusive();
        assert_eq!(g.0, rounds + 2 * (rounds / 20));
        assert_eq!(g.0, g.1);
    }
}
