//! The temp plan: the scratch high-water mark of every reset interval (with ExecuTorch: of
//! every kernel call), in the order run, in a bounded buffer the integrator reads.
//!
//! Built on the core's public stats only: after each `ca_reset`, while recording, the
//! interval's peak is `Stats::last_interval_peak_bytes`. `ca_allocate` is not touched at all,
//! and a reset while not recording costs one relaxed atomic load.

use std::collections::TryReserveError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// What the plan holds, read by `ca_plan_read`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Entries in the buffer (at most its capacity).
    pub(crate) stored: usize,
    /// Intervals recorded since the start, stored or not.
    pub(crate) intervals: u64,
    /// Intervals not stored because the buffer was full (they still count in `max_bytes`).
    pub(crate) dropped: u64,
    /// The largest peak of every recorded interval.
    pub(crate) max_bytes: usize,
    /// Whether resets are being recorded now.
    pub(crate) recording: bool,
}

#[derive(Default)]
struct Book {
    peaks: Vec<usize>, // capacity reserved at start: recording never allocates
    intervals: u64,
    dropped: u64,
    max_bytes: usize,
}

/// One allocator's plan: off until `start`.
#[derive(Default)]
pub(crate) struct TempPlan {
    recording: AtomicBool,
    book: Mutex<Book>,
}

impl TempPlan {
    fn book(&self) -> MutexGuard<'_, Book> {
        // The book is plain counters and a vector: a panic while it was held leaves nothing
        // half-updated that matters more than one entry.
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Clears the plan and records from the next reset on, keeping up to `capacity` entries.
    pub(crate) fn start(&self, capacity: usize) -> Result<(), TryReserveError> {
        let mut book = self.book();
        let mut peaks = Vec::new();
        peaks.try_reserve_exact(capacity)?;
        *book = Book {
            peaks,
            ..Book::default()
        };
        self.recording.store(true, Ordering::Release);
        Ok(())
    }

    /// Stops recording; what was recorded stays readable.
    pub(crate) fn stop(&self) {
        self.recording.store(false, Ordering::Release);
    }

    /// Whether a reset should be recorded: the only cost while the plan is off.
    #[inline]
    pub(crate) fn is_recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Records one interval's peak.
    pub(crate) fn record(&self, peak_bytes: usize) {
        let mut book = self.book();
        if !self.recording.load(Ordering::Acquire) {
            return; // stopped meanwhile
        }
        book.intervals += 1;
        book.max_bytes = book.max_bytes.max(peak_bytes);
        if book.peaks.len() < book.peaks.capacity() {
            book.peaks.push(peak_bytes);
        } else {
            book.dropped += 1;
        }
    }

    /// Copies the first `out.len()` stored entries (fewer if fewer are stored) into `out` and
    /// returns the summary.
    pub(crate) fn read(&self, out: &mut [usize]) -> Summary {
        let book = self.book();
        let n = out.len().min(book.peaks.len());
        out[..n].copy_from_slice(&book.peaks[..n]);
        Summary {
            stored: book.peaks.len(),
            intervals: book.intervals,
            dropped: book.dropped,
            max_bytes: book.max_bytes,
            recording: self.is_recording(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_in_order_keeps_the_max_of_dropped_entries_and_stops() {
        let plan = TempPlan::default();
        plan.record(5); // off: ignored
        assert_eq!(plan.read(&mut []).intervals, 0);
        plan.start(2).unwrap();
        for peak in [10, 30, 20, 40] {
            plan.record(peak);
        }
        let mut out = [0; 4];
        let s = plan.read(&mut out);
        assert_eq!(out, [10, 30, 0, 0]);
        assert_eq!(
            s,
            Summary {
                stored: 2,
                intervals: 4,
                dropped: 2,
                max_bytes: 40,
                recording: true
            }
        );
        plan.stop();
        plan.record(99);
        let s = plan.read(&mut out[..1]);
        assert_eq!((s.intervals, s.max_bytes, s.recording), (4, 40, false));
        assert_eq!(out[0], 10);
        plan.start(1).unwrap(); // a new start clears
        assert_eq!(
            plan.read(&mut []),
            Summary {
                recording: true,
                ..Summary::default()
            }
        );
    }
}
