//! Sharing the scratch buffer and the output between rayon workers.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use crate::plan::Plan;

/// The call's one scratch buffer: `[worker-slot flags | worker slices | chunk partials]`.
///
/// Worker slices are handed out through [`Scratch::claim`], which takes a free slot with an
/// atomic flag, so two items running at the same time never share a slice whatever thread runs
/// them. Scratch memory is never assumed initialised: every float is written by the call
/// before it is read (the tests run on 0xFF-poisoned scratch, which is NaN as f32, to check it).
pub(crate) struct Scratch {
    base: NonNull<u8>,
    threads: usize,
    flag_bytes: usize,
    thread_bytes: usize,
    chunk_bytes: usize,
    chunks: usize,
}

// SAFETY: `Scratch` is a raw view of a buffer that outlives the parallel section (see
// `Scratch::new`). Concurrent access is disciplined: flags are atomics; a worker slice is only
// reachable through a `Slot`, exclusive while its flag is held; chunk partials are only
// reachable through the unsafe `chunk`, whose callers guarantee exclusive use per chunk.
unsafe impl Sync for Scratch {}
// SAFETY: as for Sync: the pointer is only a view of memory that is valid on any thread.
unsafe impl Send for Scratch {}

impl Scratch {
    /// Views `base` as the scratch of `plan` and clears the slot flags.
    ///
    /// # Safety
    /// `base` must point to at least `plan.total_bytes` writable bytes aligned to 64 that stay
    /// valid, and are not used by anything else, for as long as the returned value lives.
    pub(crate) unsafe fn new(base: NonNull<u8>, plan: &Plan) -> Self {
        let flags = base.as_ptr().cast::<AtomicU32>();
        for i in 0..plan.threads {
            // SAFETY: the flag area is `plan.flag_bytes >= 4 * threads` bytes at the start of
            // the buffer (caller's guarantee on size), 64-aligned so each u32 is aligned, and no
            // other thread sees the buffer yet.
            unsafe { flags.add(i).write(AtomicU32::new(0)) };
        }
        Scratch {
            base,
            threads: plan.threads,
            flag_bytes: plan.flag_bytes,
            thread_bytes: plan.thread_bytes,
            chunk_bytes: plan.chunk_bytes,
            chunks: plan.chunks,
        }
    }

    fn flag(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.threads);
        // SAFETY: `i < threads`, so the flag lies in the flag area initialised in `new` with a
        // valid AtomicU32; it is only ever accessed atomically afterwards.
        unsafe { &*self.base.as_ptr().cast::<AtomicU32>().add(i) }
    }

    /// Takes a free worker slice; it is released when the returned slot drops.
    ///
    /// At most one item runs per rayon worker at a time and an item never waits on another,
    /// so with one slot per worker a free slot exists whenever this is called; the loop only
    /// spins if that reasoning were ever wrong, and still never shares a slice.
    pub(crate) fn claim(&self) -> Slot<'_> {
        let hint = rayon::current_thread_index().unwrap_or(0) % self.threads;
        loop {
            for j in 0..self.threads {
                let i = (hint + j) % self.threads;
                if self
                    .flag(i)
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return Slot {
                        scratch: self,
                        index: i,
                    };
                }
            }
            std::thread::yield_now();
        }
    }

    /// The partial result of chunk `c` (row path), as floats.
    ///
    /// # Safety
    /// No other reference to chunk `c`'s floats may be alive while the returned one is, and
    /// the floats must be written before they are read (they start uninitialised).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn chunk(&self, c: usize) -> &mut [f32] {
        // SAFETY: the range is in bounds and 4-aligned (`chunk_ptr`); f32 has no invalid bit
        // patterns and exclusive access is the caller's guarantee.
        unsafe { core::slice::from_raw_parts_mut(self.chunk_ptr(c), self.chunk_bytes / 4) }
    }

    /// The partial result of chunk `c` (row path), read-only.
    ///
    /// # Safety
    /// No mutable reference to chunk `c` may be alive while the returned one is, and its
    /// floats must have been written.
    pub(crate) unsafe fn chunk_ref(&self, c: usize) -> &[f32] {
        // SAFETY: in bounds and aligned (`chunk_ptr`); no writer exists (caller's guarantee).
        unsafe { core::slice::from_raw_parts(self.chunk_ptr(c), self.chunk_bytes / 4) }
    }

    /// The first float of chunk `c`, 64-aligned, with `chunk_bytes` bytes of the buffer
    /// behind it; panics unless `c < chunks`.
    fn chunk_ptr(&self, c: usize) -> *mut f32 {
        assert!(c < self.chunks);
        let off = self.flag_bytes + self.threads * self.thread_bytes + c * self.chunk_bytes;
        // SAFETY: the chunk area starts after the flags and worker slices and holds `chunks`
        // chunks of `chunk_bytes` (a multiple of 64) inside the buffer (`new`'s contract), so
        // `off` is in bounds.
        unsafe { self.base.as_ptr().add(off).cast::<f32>() }
    }
}

/// A worker's exclusive slice of the scratch, held while one work item runs.
pub(crate) struct Slot<'a> {
    scratch: &'a Scratch,
    index: usize,
}

impl Slot<'_> {
    /// The slice, as floats. Its contents are whatever the previous user left (or poison).
    pub(crate) fn floats(&mut self) -> &mut [f32] {
        let s = self.scratch;
        let off = s.flag_bytes + self.index * s.thread_bytes;
        // SAFETY: slot `index` is held (its flag was won with a CAS and is released only on
        // drop), so no other reference to this slice exists; `&mut self` prevents two from
        // this slot. The slice lies inside the buffer (`Scratch::new`'s contract), 64-aligned.
        unsafe {
            core::slice::from_raw_parts_mut(
                s.base.as_ptr().add(off).cast::<f32>(),
                s.thread_bytes / 4,
            )
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.scratch.flag(self.index).store(0, Ordering::Release);
    }
}

/// The output slice shared by workers that write disjoint parts of it.
pub(crate) struct SharedOut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: only a view of a `&mut [T]` (T: Send) borrowed for the parallel section; writers use
// `SharedOut::range`, whose callers guarantee that concurrently used ranges are disjoint.
unsafe impl<T: Send> Sync for SharedOut<T> {}
// SAFETY: as for Sync.
unsafe impl<T: Send> Send for SharedOut<T> {}

impl<T> SharedOut<T> {
    pub(crate) fn new(out: &mut [T]) -> Self {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        }
    }

    /// The output's start and length in bytes, for prefetch hints (never dereferenced
    /// through this).
    pub(crate) fn as_raw_bytes(&self) -> (*const u8, usize) {
        (self.ptr.cast::<u8>(), self.len * size_of::<T>())
    }

    /// `out[start..start + len]`.
    ///
    /// # Safety
    /// Ranges in use at the same time (on any thread) must not overlap, and the `&mut [T]`
    /// this was made from must outlive every returned slice.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start <= self.len && len <= self.len - start);
        // SAFETY: in bounds (checked above) of the borrowed output; disjointness and lifetime
        // are the caller's guarantee.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
