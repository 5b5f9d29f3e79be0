//! A block of system memory, and the idle lists that keep blocks between uses.

use core::alloc::Layout;
use core::ptr::NonNull;

use crate::SizeClass;

/// Every block is at least this aligned: one cache line, and ExecuTorch's minimum.
pub(crate) const MIN_ALIGN: usize = 64;

/// A live block handed out by `allocate` or the `Allocator` trait, and the size asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Live {
    pub(crate) block: Block,
    pub(crate) requested: usize,
}

/// One block taken from the system allocator: its address, class and the alignment it was
/// allocated with (which, with the class size, is the layout to give it back with).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub(crate) ptr: NonNull<u8>,
    /// `class.size()`, kept because the hot path needs it on every call.
    size: usize,
    pub(crate) class: SizeClass,
    align_log2: u8,
    /// The kernel accepted `MADV_HUGEPAGE` for the block's whole huge pages.
    pub(crate) huge: bool,
}

// SAFETY: a `Block` is a unique handle to memory the allocator owns; the memory is not tied to
// any thread, so the handle may move between threads.
unsafe impl Send for Block {}

impl Block {
    /// # Safety
    /// `ptr` was returned by the system allocator for `Block::layout_for(class, align)`.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, class: SizeClass, align: usize) -> Block {
        debug_assert!(align.is_power_of_two() && align >= MIN_ALIGN);
        Block {
            ptr,
            size: class.size(),
            class,
            align_log2: align.trailing_zeros() as u8,
            huge: false,
        }
    }

    /// The layout a block of `class` aligned to `align` is allocated with, if it is valid.
    pub(crate) fn layout_for(class: SizeClass, align: usize) -> Option<Layout> {
        Layout::from_size_align(class.size(), align).ok()
    }

    #[inline]
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    #[inline]
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    /// The layout this block was allocated with.
    pub(crate) fn layout(&self) -> Layout {
        // SAFETY: `Block::new`'s contract: the block was allocated with exactly this layout,
        // which `Layout::from_size_align` accepted then.
        unsafe { Layout::from_size_align_unchecked(self.size(), 1 << self.align_log2) }
    }
}

/// Idle blocks, one list per size class, with least-recently-used eviction across classes.
///
/// Every block carries the stamp it was given when it became idle (see `eviction`). Each list
/// is a stack sorted by stamp, oldest first. `take` serves from the top (warm in cache),
/// `pop_lru` evicts the oldest block of all lists (the bottom of one of them), found through a
/// bitmap of non-empty classes. Eviction shifts a list down by one; it is the slow path, the
/// stack's push and pop are the fast one.
pub(crate) struct IdleLists {
    lists: Vec<Vec<(u64, Block)>>,
    occupied: [u64; SizeClass::COUNT.div_ceil(64)],
    bytes: usize,
    blocks: usize,
}

impl IdleLists {
    pub(crate) const fn new() -> Self {
        IdleLists {
            lists: Vec::new(),
            occupied: [0; SizeClass::COUNT.div_ceil(64)],
            bytes: 0,
            blocks: 0,
        }
    }

    /// Bytes of all idle blocks here (class sizes).
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many idle blocks are here.
    #[inline]
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Keeps `block`, stamped `stamp`, as the most recently used of its class: `stamp` is at
    /// least every stamp already in its list (a cache's stamps only grow).
    #[inline(always)]
    pub(crate) fn push(&mut self, block: Block, stamp: u64) {
        let i = block.class.index();
        if self.lists.is_empty() {
            self.lists.resize_with(SizeClass::COUNT, Vec::new);
        }
        let list = &mut self.lists[i];
        debug_assert!(list.last().is_none_or(|(t, _)| *t <= stamp));
        list.push((stamp, block));
        self.occupied[i / 64] |= 1 << (i % 64);
        self.bytes += block.size();
        self.blocks += 1;
    }

    /// Keeps `block` with an older `stamp` than some already here (a block moved from another
    /// cache): inserted where its stamp sorts, so least-recently-used order holds.
    pub(crate) fn insert(&mut self, block: Block, stamp: u64) {
        let i = block.class.index();
        if self.lists.is_empty() {
            self.lists.resize_with(SizeClass::COUNT, Vec::new);
        }
        let list = &mut self.lists[i];
        let at = list.partition_point(|(t, _)| *t <= stamp);
        list.insert(at, (stamp, block));
        self.occupied[i / 64] |= 1 << (i % 64);
        self.bytes += block.size();
        self.blocks += 1;
    }

    /// The most recently used idle block of `class` whose address is aligned to `align`.
    #[inline(always)]
    pub(crate) fn take(&mut self, class: SizeClass, align: usize) -> Option<Block> {
        let i = class.index();
        let list = self.lists.get_mut(i)?;
        let (_, block) = if align <= MIN_ALIGN {
            list.pop()?
        } else {
            let pos = list
                .iter()
                .rposition(|(_, b)| b.addr() & (align - 1) == 0)?;
            list.remove(pos)
        };
        if list.is_empty() {
            self.occupied[i / 64] &= !(1 << (i % 64));
        }
        self.bytes -= block.size();
        self.blocks -= 1;
        Some(block)
    }

    /// Best fit: the most recently used idle block of the smallest class above `class` and at
    /// most `largest` that has one aligned to `align`.
    pub(crate) fn take_larger(
        &mut self,
        class: SizeClass,
        largest: SizeClass,
        align: usize,
    ) -> Option<Block> {
        let (first, last) = (class.index() + 1, largest.index());
        let mut i = first;
        while i <= last {
            let word = self.occupied[i / 64] >> (i % 64);
            if word == 0 {
                // Nothing in the rest of this word.
                i = (i / 64 + 1) * 64;
                continue;
            }
            i += word.trailing_zeros() as usize;
            if i > last {
                break;
            }
            let list = &mut self.lists[i];
            let pos = if align <= MIN_ALIGN {
                Some(list.len() - 1)
            } else {
                list.iter().rposition(|(_, b)| b.addr() & (align - 1) == 0)
            };
            if let Some(pos) = pos {
                let (_, block) = list.remove(pos);
                if list.is_empty() {
                    self.occupied[i / 64] &= !(1 << (i % 64));
                }
                self.bytes -= block.size();
                self.blocks -= 1;
                return Some(block);
            }
            i += 1;
        }
        None
    }

    /// The stamp of the least recently used idle block and its class index.
    fn lru(&self) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for (word_index, &word) in self.occupied.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let i = word_index * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let tick = self.lists[i].first().map_or(u64::MAX, |(t, _)| *t);
                if best.is_none_or(|(t, _)| tick < t) {
                    best = Some((tick, i));
                }
            }
        }
        best
    }

    /// The stamp of the least recently used idle block, if any.
    pub(crate) fn oldest_stamp(&self) -> Option<u64> {
        self.lru().map(|(stamp, _)| stamp)
    }

    /// Removes and returns the least recently used idle block of any class, with its stamp.
    pub(crate) fn pop_lru(&mut self) -> Option<(u64, Block)> {
        let (_, i) = self.lru()?;
        let (stamp, block) = self.lists[i].remove(0);
        if self.lists[i].is_empty() {
            self.occupied[i / 64] &= !(1 << (i % 64));
        }
        self.bytes -= block.size();
        self.blocks -= 1;
        Some((stamp, block))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A block for bookkeeping tests: never given to (or taken from) the system allocator.
    pub(crate) fn fake(addr: usize, size: usize) -> Block {
        let ptr = NonNull::new(core::ptr::without_provenance_mut(addr)).unwrap();
        // SAFETY: these blocks are never given to the system allocator: only bookkeeping runs.
        unsafe { Block::new(ptr, SizeClass::for_size(size).unwrap(), 64) }
    }

    #[test]
    fn take_serves_newest_and_checks_alignment() {
        let mut idle = IdleLists::new();
        idle.push(fake(4096, 100), 1);
        idle.push(fake(64 * 3, 100), 2);
        assert_eq!(idle.bytes(), 256);
        // align 64: newest first.
        assert_eq!(
            idle.take(SizeClass::for_size(128).unwrap(), 64)
                .unwrap()
                .addr(),
            192
        );
        idle.push(fake(64 * 3, 100), 3);
        // align 4096: only the first block qualifies.
        assert_eq!(
            idle.take(SizeClass::for_size(100).unwrap(), 4096)
                .unwrap()
                .addr(),
            4096
        );
        assert!(idle.take(SizeClass::for_size(100).unwrap(), 4096).is_none());
        assert!(idle.take(SizeClass::for_size(64).unwrap(), 64).is_none());
        assert_eq!(idle.blocks(), 1);
    }

    #[test]
    fn pop_lru_is_oldest_across_classes() {
        let mut idle = IdleLists::new();
        idle.push(fake(64 * 10, 5000), 1);
        idle.push(fake(64 * 20, 64), 2);
        idle.push(fake(64 * 30, 5000), 3);
        assert_eq!(idle.oldest_stamp(), Some(1));
        assert_eq!(idle.pop_lru().unwrap().1.addr(), 640);
        assert_eq!(idle.pop_lru().unwrap().1.addr(), 1280);
        assert_eq!(idle.pop_lru().unwrap().1.addr(), 1920);
        assert!(idle.pop_lru().is_none());
        assert_eq!(idle.oldest_stamp(), None);
        assert_eq!((idle.bytes(), idle.blocks()), (0, 0));
    }

    #[test]
    fn take_larger_finds_the_smallest_larger_class_within_the_bound() {
        let c = |size| SizeClass::for_size(size).unwrap();
        let mut idle = IdleLists::new();
        idle.push(fake(64 * 100, 100_000), 1); // class 106496
        idle.push(fake(64 * 200, 6000), 2); // class 6144
        idle.push(fake(64 * 300, 9000), 3); // class 9216

        // 4 KiB's class is empty: 6144 is the smallest larger one.
        assert_eq!(
            idle.take_larger(c(4096), c(8192), 64).unwrap().addr(),
            64 * 200
        );
        // Next: 9216 is past the bound of 8192, so nothing.
        assert!(idle.take_larger(c(4096), c(8192), 64).is_none());
        assert_eq!(
            idle.take_larger(c(4096), c(9216), 64).unwrap().addr(),
            64 * 300
        );
        // Alignment is honoured: 6400 is not 4096-aligned.
        assert!(idle.take_larger(c(4096), c(1 << 20), 4096).is_none());
        assert_eq!(
            idle.take_larger(c(4096), c(1 << 20), 64).unwrap().addr(),
            6400
        );
        // The exact class is never "larger".
        idle.push(fake(64 * 400, 4096), 4);
        assert!(idle.take_larger(c(4096), c(1 << 20), 64).is_none());
        assert_eq!((idle.blocks(), idle.bytes()), (1, 4096));
    }

    #[test]
    fn insert_keeps_each_class_sorted_by_stamp() {
        let mut idle = IdleLists::new();
        idle.push(fake(64 * 10, 5000), 10);
        idle.push(fake(64 * 20, 5000), 30);
        // A block moved from another cache, older than both.
        idle.insert(fake(64 * 30, 5000), 5);
        idle.insert(fake(64 * 40, 5000), 20);
        let order: Vec<u64> = core::iter::from_fn(|| idle.pop_lru().map(|(t, _)| t)).collect();
        assert_eq!(order, [5, 10, 20, 30]);
    }
}
