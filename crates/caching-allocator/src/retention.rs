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
//!   that keeps what the thread's live blocks asked for within the budget of its own working
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

use crate::allocator::CachingAllocator;
use crate::sync::{AtomicBool, Ordering};
use crate::thread_cache::Counters;

/// Whether the policy is on, and its slack.
pub(crate) struct Retention {
    /// Set the first time the cap or the budget evicts (never cleared): wide fit is on. Read on
    /// the fast path after a miss of the request's own class, with one relaxed load: a thread
    /// that sees it late only serves a request or two the bounded way.
    engaged: AtomicBool,
    /// `Config::working_set_slack`; `None`: never engage.
    slack: Option<f64>,
}

impl Retention {
    pub(crate) fn new(slack: Option<f64>) -> Self {
        debug_assert!(
            slack.is_none_or(|s| s >= 1.0),
            "Config clamps the slack to at least 1: the budget never asks to free live memory"
        );
        Retention {
            engaged: AtomicBool::new(false),
            slack,
        }
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
    /// bytes its live blocks asked for, plus the block, within the budget of its own working
    /// set. `None` if nothing does. So a small request takes a large idle block only while the
    /// thread is far from its peak (as at the start of a decode round), not while the blocks
    /// it holds already ask for most of its working set and a later request may need it.
    /// (Wide fit never grows reserved bytes: the blocks it hands out are held anyway.)
    #[inline]
    pub(crate) fn headroom(&self, c: &Counters) -> Option<usize> {
        let room = self
            .budget(c.peak_requested_bytes)
            .checked_sub(c.requested_bytes)?;
        (room > 0).then_some(room)
    }

    /// The most bytes worth holding for a working set of `peak` bytes.
    fn budget(&self, peak: usize) -> usize {
        let slack = self.slack.unwrap_or(f64::INFINITY);
        let budget = peak as f64 * slack;
        if budget >= usize::MAX as f64 {
            usize::MAX
        } else {
            budget as usize
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
        if self.retention.slack.is_none() {
            return;
        }
        let ws = self.working_set();
        let live = ws.reserved.saturating_sub(ws.idle) + incoming;
        let reserved = ws.reserved + incoming;
        // The working set is what the runtime asked for at its peak, not the blocks that served
        // it: wide fit hands out larger blocks, which must not raise the budget that pays for
        // them. Idle blocks are all that is evicted, so live bytes above the budget stay.
        let peak = ws
            .peak_requested
            .max(ws.requested.saturating_add(incoming_requested));
        let budget = self.retention.budget(peak);
        let mut over = reserved.saturating_sub(budget.max(live));
        if over > 0 {
            self.retention.engage();
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn engages_once_and_only_when_on() {
        let off = Retention::new(None);
        assert!(!off.engage());
        assert!(!off.engaged());
        let on = Retention::new(Some(1.25));
        assert!(!on.engaged());
        assert!(on.engage());
        assert!(!on.engage(), "only the first call engages");
        assert!(on.engaged());
    }

    #[test]
    fn budget_is_slack_times_peak_and_saturates() {
        let r = Retention::new(Some(1.25));
        assert_eq!(r.budget(4 << 20), 5 << 20);
        assert_eq!(r.budget(0), 0);
        assert_eq!(r.budget(usize::MAX), usize::MAX);
        assert_eq!(Retention::new(None).budget(1), usize::MAX);
    }
}
