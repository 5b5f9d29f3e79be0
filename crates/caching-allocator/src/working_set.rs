//! Working-set retention: the memory an allocator can defend.
//!
//! A cache that keeps every class it was ever asked for holds far more than its runtime uses
//! when the shapes change. A decode loop is the example: its attention scratch grows token by
//! token through some 70 classes of up to 2 MiB, two blocks live at a time. Kept by class, the
//! cache fills (up to its cap) with blocks that each served a few tokens; under a small cap
//! (ExecuTorch's runner uses 10 MB) recency alone then evicts the small classes the next round
//! starts with, while the large block that could serve them sits idle, and every round goes
//! back to the system.
//!
//! So the allocator keeps a *working set*:
//!
//! - **a budget**: before every block taken from the system (the only way reserved bytes
//!   grow) it evicts least recently used idle blocks until its reserved bytes (live + idle +
//!   the new block) are at most `slack x` the peak of the bytes its live blocks asked for (the
//!   working set, counting the new request; `Config::working_set_slack`), so the peak of
//!   reserved bytes never holds a growing buffer twice; and again after, as the cap's first
//!   eviction does;
//! - **usefulness**: once anything has been evicted (by this budget or by the cap), a miss
//!   takes the smallest idle block of a larger class before asking the system, of any size
//!   that keeps the bytes the thread's live blocks hold within the budget of its own working
//!   set (wide fit): the blocks worth keeping are the large recent ones, which serve every
//!   smaller request; an exact class that never comes back is worth nothing. Before that,
//!   nothing the runtime asked for was dropped, and best fit stays within `max_oversize`. The
//!   thread's budget bound keeps a small request from taking the large block that another
//!   live block of the same kernel needs, where many blocks live at once.
//!
//! It is a `Config` choice (`working_set_slack`, off by default): it suits a temp allocator
//! reset after each kernel, not traffic where many blocks of random sizes come and go on their
//! own (there the budget evicts what comes back soon).
//!
//! A runtime whose blocks all live at once (reserved = peak live, at most 19% above what they
//! asked for by class rounding) never meets the budget and keeps the exact-class fast path.
//! Live memory is never refused: reserved bytes may exceed the budget by live bytes above the
//! peak and by the block being handed out.

use crate::sync::{AtomicBool, Ordering};
use crate::thread_cache::Counters;

/// Whether the policy is on, and its slack.
pub(crate) struct WorkingSetBudget {
    /// Set the first time the cap or the budget evicts (never cleared): wide fit is on. Read on
    /// the fast path after a miss of the request's own class, with one relaxed load: a thread
    /// that sees it late only serves a request or two the bounded way.
    engaged: AtomicBool,
    /// `Config::working_set_slack`; `None`: never engage.
    slack: Option<f64>,
}

impl WorkingSetBudget {
    pub(crate) fn new(slack: Option<f64>) -> Self {
        debug_assert!(
            slack.is_none_or(|s| s >= 1.0),
            "Config clamps the slack to at least 1: the budget never asks to free live memory"
        );
        WorkingSetBudget {
            engaged: AtomicBool::new(false),
            slack,
        }
    }

    /// Whether the policy is on (`Config::working_set_slack` is set).
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.slack.is_some()
    }

    /// Whether the cap or the budget has evicted (and the policy is on).
    #[inline]
    pub(crate) fn engaged(&self) -> bool {
        self.engaged.load(Ordering::Relaxed)
    }

    /// The cap or the budget is about to evict: engage, if the policy is on. `true` the first
    /// time.
    pub(crate) fn engage(&self) -> bool {
        self.slack.is_some() && !self.engaged.swap(true, Ordering::Relaxed)
    }

    /// How large a block wide fit may hand to a thread whose counters are `c`: what keeps the
    /// bytes its live blocks hold (their class sizes), plus the block, within the budget of its
    /// own working set. `None` if nothing does. So a small request takes a large idle block
    /// only while the thread is far from its peak (as at the start of a decode round), not
    /// while the blocks it holds already fill most of its working set and a later request may
    /// need it. Counting what the blocks hold, not what they were asked for, bounds the thread:
    /// its wide-fit blocks together stay within its budget, where counting requests let every
    /// small request take a block as large as the whole budget. (Wide fit never grows
    /// reserved bytes by itself: the blocks it hands out are held anyway; but a block handed to
    /// a small request is not there for the request it was kept for, which then goes to the
    /// system.)
    #[inline]
    pub(crate) fn headroom(&self, c: &Counters) -> Option<usize> {
        let room = self
            .bytes_for(c.peak_requested_bytes)
            .checked_sub(c.live_bytes)?;
        (room > 0).then_some(room)
    }

    /// The most bytes worth holding for a working set of `peak` bytes.
    pub(crate) fn bytes_for(&self, peak: usize) -> usize {
        let slack = self.slack.unwrap_or(f64::INFINITY);
        let budget = peak as f64 * slack;
        if budget >= usize::MAX as f64 {
            usize::MAX
        } else {
            budget as usize
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn engages_once_and_only_when_on() {
        let off = WorkingSetBudget::new(None);
        assert!(!off.engage());
        assert!(!off.engaged());
        let on = WorkingSetBudget::new(Some(1.25));
        assert!(!on.engaged());
        assert!(on.engage());
        assert!(!on.engage(), "only the first call engages");
        assert!(on.engaged());
    }

    #[test]
    fn budget_is_slack_times_peak_and_saturates() {
        let r = WorkingSetBudget::new(Some(1.25));
        assert_eq!(r.bytes_for(4 << 20), 5 << 20);
        assert_eq!(r.bytes_for(0), 0);
        assert_eq!(r.bytes_for(usize::MAX), usize::MAX);
        assert_eq!(WorkingSetBudget::new(None).bytes_for(1), usize::MAX);
    }
}
