//! The live blocks of one thread cache, by address: an open-addressing table with linear
//! probing and backward-shift deletion.
//!
//! Every `allocate` inserts and every `release` removes, so this sits on the fast path. Keys
//! are block addresses (64-byte aligned, never 0): Fibonacci hashing of `addr >> 6` spreads
//! them, and a table at most 7/8 full keeps probes short. No tombstones: a removal shifts the
//! following entries of its run back, so lookups never scan deleted slots.

use crate::block::Live;

pub(crate) struct LiveTable {
    /// The block inserted last, kept out of the table: scratch is mostly released in the
    /// order it was taken, newest first, so a release usually finds its block here without
    /// hashing or probing.
    recent: Option<Live>,
    slots: Vec<Option<Live>>,
    /// Entries in `slots` (not counting `recent`).
    len: usize,
    /// `64 - log2(slots.len())`: the hash's top bits index the table.
    shift: u32,
}

const MIN_SLOTS: usize = 16;

impl LiveTable {
    pub(crate) const fn new() -> Self {
        LiveTable {
            recent: None,
            slots: Vec::new(),
            len: 0,
            shift: 64,
        }
    }

    #[inline]
    fn home(&self, addr: usize) -> usize {
        let h = ((addr as u64) >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len + usize::from(self.recent.is_some())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0 && self.recent.is_none()
    }

    /// Adds a live block. Its address must not be in the table.
    #[inline]
    pub(crate) fn insert(&mut self, live: Live) {
        if let Some(older) = self.recent.replace(live) {
            self.insert_slot(older);
        }
    }

    /// Removes and returns the live block at `addr`, if there is one.
    #[inline]
    pub(crate) fn remove(&mut self, addr: usize) -> Option<Live> {
        match self.recent {
            Some(live) if live.block.addr() == addr => self.recent.take(),
            _ => self.remove_slot(addr),
        }
    }

    #[inline]
    fn insert_slot(&mut self, live: Live) {
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(live.block.addr());
        while self.slots[i].is_some() {
            i = (i + 1) & mask;
        }
        self.slots[i] = Some(live);
        self.len += 1;
    }

    fn remove_slot(&mut self, addr: usize) -> Option<Live> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            match &self.slots[i] {
                None => return None,
                Some(live) if live.block.addr() == addr => break,
                Some(_) => i = (i + 1) & mask,
            }
        }
        let found = self.slots[i].take();
        self.len -= 1;
        // Close the hole: move back every later entry of the run whose home is at or before it.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let Some(live) = &self.slots[j] else {
                break;
            };
            let home = self.home(live.block.addr());
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
        }
        found
    }

    /// Removes every entry, keeping the table's memory for the next round.
    pub(crate) fn drain_into(&mut self, out: &mut Vec<Live>) {
        out.extend(self.recent.take());
        if self.len == 0 {
            return;
        }
        // Stop at the last one: a runtime that resets after every kernel holds a handful of
        // blocks in a table sized for its busiest kernel.
        let mut left = self.len;
        for slot in &mut self.slots {
            if let Some(live) = slot.take() {
                out.push(live);
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        self.len = 0;
    }

    #[cold]
    fn grow(&mut self) {
        let new_len = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![None; new_len]);
        self.shift = 64 - new_len.trailing_zeros();
        self.len = 0;
        for live in old.into_iter().flatten() {
            self.insert_slot(live);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::Block;
    use crate::SizeClass;
    use core::ptr::NonNull;

    fn live(addr: usize) -> Live {
        let ptr = NonNull::new(core::ptr::without_provenance_mut(addr)).unwrap();
        // SAFETY: bookkeeping only; these blocks never reach the system allocator.
        let block = unsafe { Block::new(ptr, SizeClass::for_size(64).unwrap(), 64) };
        Live {
            block,
            requested: addr / 64,
        }
    }

    #[test]
    fn behaves_like_a_map_under_random_inserts_and_removes() {
        let mut table = LiveTable::new();
        let mut model = std::collections::HashMap::new();
        let mut x = 0x1234_5678_9abc_def0u64;
        let n = if cfg!(miri) { 300 } else { 20_000 };
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct addresses, so removes often hit and runs collide.
            let addr = 64 * (1 + (x % 512) as usize);
            if x.is_multiple_of(3) || model.contains_key(&addr) {
                let got = table.remove(addr).map(|l| l.requested);
                assert_eq!(got, model.remove(&addr));
            } else {
                table.insert(live(addr));
                model.insert(addr, addr / 64);
            }
            assert_eq!(table.len(), model.len());
        }
        let mut out = Vec::new();
        table.drain_into(&mut out);
        assert_eq!(out.len(), model.len());
        assert!(table.is_empty());
        assert!(table.remove(64).is_none());
    }
}
