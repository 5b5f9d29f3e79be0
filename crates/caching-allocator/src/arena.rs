//! The temp arena: one thread's bump allocator for small blocks, reset in one atomic step.
//!
//! A kernel asks its temp allocator for a few to a few dozen small blocks and the runtime resets
//! the allocator after the kernel returns. For that pattern a size-class cache pays for
//! bookkeeping a bump allocator never does. So each thread's cache keeps one *chunk* (a block
//! taken from the cache like any other) and serves requests of up to
//! `Config::arena_max_bytes` by bumping an offset through it:
//!
//! - **Owner only.** [`Arena`] is touched by the cache's own thread alone, with no lock and no
//!   atomic read-modify-write: an allocation is a bounds check, a bump, a record and a few
//!   counter stores. What other threads may need (the records, the counters) is published in
//!   [`ArenaShared`] with plain release stores.
//! - **Reset in one atomic step.** A reset increments the allocator's *epoch*
//!   (`fetch_add`, so two resets never move it backwards). The owner compares its arena's epoch
//!   with the allocator's on every call and, when they differ, rewinds: every block of the old
//!   epoch is taken back at once. Blocks handed out before the reset's increment belong to the
//!   old epoch (taken), blocks handed out after it to the new one (they survive); a block handed
//!   out while the increment happens is on exactly one side, decided by the epoch its call read.
//! - **Releases.** A block released on its own thread is marked released in its record; the
//!   topmost released records are popped and the bump offset rewinds to the lowest of them, so
//!   blocks released newest-first (the common order) give their bytes back at once. A block
//!   released on another thread is checked against the published records *at the call* (a
//!   pointer never handed out, already released or taken back by a reset is
//!   `UnknownPointer` there) and queued in the arena's inbox, which the owner applies on its
//!   slow path (a chunk or the record table full) and when it rewinds. Each record carries a
//!   serial number, and an inbox entry names the serial it saw, so an entry can never release a
//!   later block that happens to sit at the same address.
//! - **Growth.** A chunk full for this epoch sends the rest of the epoch's requests to the
//!   size classes, and remembers how much the epoch wanted; the next rewind swaps the chunk for
//!   one of that size plus 1/16 (up to [`MAX_CHUNK`]), and a chunk within 1/16 of full grows
//!   the same way before it overflows (see [`next_chunk`]). A large request the chunk missed
//!   gets the block the next chunk will be ([`Arena::successor_for`]). After warm-up, one chunk
//!   holds a whole kernel call and no system allocation happens in steady state.
//! - **The cap.** A chunk is charged to its cache's credit for as long as the arena holds it,
//!   as if it were all idle (conservative: the cap holds whatever the arena's blocks do); a
//!   chunk the cap cannot cover goes back, and the arena stays off for that epoch.
//!
//! Debug checks (poison and canaries) turn the arena off: every block then needs a canary of
//! its own, which the size classes give it.

use core::cell::UnsafeCell;
use core::ptr::NonNull;

use crate::block::{Block, MIN_ALIGN};
use crate::sync::{lock, AtomicBool, AtomicUsize, Mutex, Ordering};

/// Records per epoch: past this many blocks in one reset interval, small requests go to the
/// size classes.
#[cfg(not(loom))]
pub(crate) const RECORDS: usize = 256;
/// Under loom, few records keep the models small.
#[cfg(loom)]
pub(crate) const RECORDS: usize = 4;

/// The largest alignment the arena serves; a chunk is aligned to it.
pub(crate) const ARENA_MAX_ALIGN: usize = 4096;
/// Whether the arena serves alignment `align`: a power of two up to [`ARENA_MAX_ALIGN`].
#[inline(always)]
pub(crate) fn serves_align(align: usize) -> bool {
    align.wrapping_sub(1) < ARENA_MAX_ALIGN && align & (align - 1) == 0
}

/// The smallest chunk.
pub(crate) const MIN_CHUNK: usize = 64 << 10;
/// The largest chunk: an epoch that wants more sends the rest to the size classes.
pub(crate) const MAX_CHUNK: usize = 4 << 20;

/// Low bit of a published record: the block was released (addresses are 64-byte aligned).
const RELEASED: usize = 1;
/// A record's `meta` word: the block's serial above these bits, the size asked for in them
/// (requests are at most [`MAX_CHUNK`], `Config::arena_max_bytes`'s bound; 41 bits of serial
/// outlast any process).
const SIZE_BITS: u32 = 23;
const _: () = assert!(MAX_CHUNK < 1 << SIZE_BITS);
const SIZE_MASK: usize = (1 << SIZE_BITS) - 1;

/// The chunk an arena of `len` bytes should have next, after an interval that wanted `want`
/// bytes (its peak, with what the chunk could not take): `None` to keep it. A chunk within
/// 1/[`HEADROOM`] of full grows to the want plus that much, *before* it overflows: a buffer
/// that grows a little each interval (a decode's attention scratch) then never misses, and the
/// swap happens at a rewind, with the arena empty, so the old chunk is idle (and evictable)
/// when the new one is taken; growing only after a miss would hold the old chunk (under the
/// interval's small blocks) and the miss's block at once, twice the buffer.
#[inline(always)]
fn next_chunk(want: usize, len: usize) -> Option<usize> {
    if want <= len - len / HEADROOM {
        return None;
    }
    grown_chunk(want, len)
}

/// [`next_chunk`] past its common case.
#[cold]
#[inline(never)]
fn grown_chunk(want: usize, len: usize) -> Option<usize> {
    let next = (want + want / HEADROOM).clamp(MIN_CHUNK, MAX_CHUNK);
    (next > len).then_some(next)
}

/// The least chunk to take for a request of `size` bytes: room for it, as [`next_chunk`]
/// would make after an interval that wanted it.
pub(crate) fn first_chunk(size: usize) -> usize {
    grown_chunk(granules(size), 0).unwrap_or(MIN_CHUNK)
}

/// One interval's large requests (above `Config::arena_max_bytes`, up to
/// `ADAPTIVE_ARENA_MAX_BYTES`), for the adaptive arena's choice at the next rewind.
#[derive(Clone, Copy, Debug, Default)]
struct LargeRequests {
    /// Their bytes that came to the arena (in its `want` or its peak too).
    bytes_in: usize,
    /// Their bytes the size classes served while the arena took none.
    bytes_elsewhere: usize,
    /// How many there were.
    count: usize,
}

impl LargeRequests {
    /// Counts a request of `size` bytes, sent to the arena (`taken`) or not. Saturating: a
    /// thread may go without a reset for ever.
    fn note(&mut self, size: usize, taken: bool) {
        let bytes = if taken {
            &mut self.bytes_in
        } else {
            &mut self.bytes_elsewhere
        };
        *bytes = bytes.saturating_add(granules(size));
        self.count = self.count.saturating_add(1);
    }

    /// What the chunk should hold after an interval that wanted `want` bytes of it, these
    /// large requests among them, and whether the next interval's large requests come to the
    /// arena: all of the interval fits the largest chunk, in at most [`LARGE_BLOCKS`] large
    /// blocks.
    fn target(&self, want: usize) -> (usize, bool) {
        let total = want.saturating_add(self.bytes_elsewhere);
        if total <= LARGE_WANT && self.count <= LARGE_BLOCKS {
            (total, true)
        } else {
            // `want` less the large requests' bytes (as much as they can have added to it):
            // what the small ones need.
            (want.saturating_sub(self.bytes_in), false)
        }
    }
}

/// Whether epoch `a` is strictly behind epoch `b`. Epochs only grow (`fetch_add`), one a
/// reset; the difference is read as signed, so the order holds across a wrap of the counter.
#[inline]
pub(crate) fn epoch_behind(a: usize, b: usize) -> bool {
    (b.wrapping_sub(a) as isize) > 0
}

/// See [`next_chunk`]: the chunk keeps 1/16 of itself free for growth.
const HEADROOM: usize = 16;

/// The most an interval may ask for, large requests included, for the next one's large
/// requests to come to the arena: what the largest chunk holds with its headroom.
const LARGE_WANT: usize = MAX_CHUNK - MAX_CHUNK / HEADROOM;

/// The most large requests an interval may make for the next one's to come to the arena: a
/// kernel's large scratch is a buffer or two (attention's scores and output). A call of many
/// large blocks keeps blocks of their own: packed into one chunk, allocbench's scratch-medium
/// (eight blocks of 64 KiB - 1 MiB, one write per 4 KiB page) ran 10-20% slower than in
/// blocks of their own, for 20-30% more memory held, though the allocator's own path was
/// 3.7x cheaper (`examples/hotpath.rs`: `medium8`). Page-aligning the blocks in the chunk
/// made it twice as slow: the one-write-per-page traffic meets cache-set conflicts in one
/// contiguous chunk that separate mappings spread out.
const LARGE_BLOCKS: usize = 2;

/// Rounds a request to the arena's granule (one cache line, as every block of the allocator).
#[inline(always)]
fn granules(size: usize) -> usize {
    (size + (MIN_ALIGN - 1)) & !(MIN_ALIGN - 1)
}

/// The owner-only part of a thread's arena.
pub(crate) struct Arena {
    /// The chunk's first byte (with the chunk's provenance); null without a chunk.
    base: *mut u8,
    /// The chunk's length; 0 without a chunk (so every request misses the fast path).
    len: usize,
    /// Bytes of the chunk bumped past.
    top: usize,
    /// The allocator epoch this arena's records belong to.
    epoch: usize,
    /// The serial the next record gets (one more than the blocks the arena ever handed out),
    /// shifted into place in a record's `meta` word.
    next_meta: usize,
    /// The highest `top` of any epoch before this one.
    max_peak: usize,
    /// How many bytes this epoch's small requests wanted, including those the chunk could not
    /// take: the size of the next chunk.
    want: usize,
    /// The epoch in which no chunk could be had (`usize::MAX`: none): not asked again in it.
    refused_epoch: usize,
    /// Whether requests above `Config::arena_max_bytes` (up to `ADAPTIVE_ARENA_MAX_BYTES`)
    /// come here this interval: the last interval asked for no more than [`LARGE_WANT`], in at
    /// most [`LARGE_BLOCKS`] large requests. Only with the adaptive arena (see
    /// [`Arena::rewind`]).
    large: bool,
    /// This interval's large requests.
    large_requests: LargeRequests,
    /// The spare scope chunk (`CacheState::scope_chunk`, mirrored here so a scope borrows it
    /// without the cache's lock), and whether a scope has it now.
    spare: Option<Block>,
    spare_lent: bool,
}

/// The records of an arena's blocks as other threads see them, one slot a block: its
/// address (low bit: released), and its serial and the size asked for in one word (`meta`).
/// Two arrays rather than one of pairs: a slot's word is then one scaled index away, which
/// saves the fast paths the multiply of a 16-byte stride.
struct Records {
    addr: [AtomicUsize; RECORDS],
    meta: [AtomicUsize; RECORDS],
}

/// One slot of [`Records`].
#[derive(Clone, Copy)]
struct Record<'a> {
    addr: &'a AtomicUsize,
    meta: &'a AtomicUsize,
}

impl Records {
    fn new() -> Self {
        Records {
            addr: core::array::from_fn(|_| AtomicUsize::new(0)),
            meta: core::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    /// Slot `i`, if there is one.
    #[inline(always)]
    fn get(&self, i: usize) -> Option<Record<'_>> {
        Some(Record {
            addr: self.addr.get(i)?,
            meta: self.meta.get(i)?,
        })
    }

    /// Slot `i`.
    ///
    /// # Panics
    /// If `i >= RECORDS`.
    #[inline(always)]
    fn at(&self, i: usize) -> Record<'_> {
        Record {
            addr: &self.addr[i],
            meta: &self.meta[i],
        }
    }

    /// Slot `i`, unchecked.
    ///
    /// # Safety
    /// `i < RECORDS`.
    #[inline(always)]
    unsafe fn get_unchecked(&self, i: usize) -> Record<'_> {
        debug_assert!(i < RECORDS);
        // SAFETY: the caller's contract, and both arrays have `RECORDS` slots.
        unsafe {
            Record {
                addr: self.addr.get_unchecked(i),
                meta: self.meta.get_unchecked(i),
            }
        }
    }

    /// The first `count` slots (at most all of them).
    fn first(
        &self,
        count: usize,
    ) -> impl DoubleEndedIterator<Item = Record<'_>> + ExactSizeIterator {
        let count = count.min(RECORDS);
        self.addr[..count]
            .iter()
            .zip(&self.meta[..count])
            .map(|(addr, meta)| Record { addr, meta })
    }
}

impl Record<'_> {
    #[inline(always)]
    fn serial(meta: usize) -> usize {
        meta >> SIZE_BITS
    }

    #[inline(always)]
    fn requested(meta: usize) -> usize {
        meta & SIZE_MASK
    }
}

/// A release from another thread, waiting for the owner.
#[derive(Clone, Copy, Debug)]
struct Foreign {
    slot: usize,
    serial: usize,
    requested: usize,
}

impl Foreign {
    /// Whether this entry still names a live block: its slot is among the first `count`
    /// records and holds its serial, unreleased. Serials never repeat, so an entry that
    /// matched once and no longer does never matches again.
    fn matches(&self, records: &Records, count: usize) -> bool {
        if self.slot >= count.min(RECORDS) {
            return false;
        }
        let record = records.at(self.slot);
        let addr = record.addr.load(Ordering::Acquire);
        addr & RELEASED == 0 && Record::serial(record.meta.load(Ordering::Relaxed)) == self.serial
    }
}

/// The gate of an arena no fast path may enter: a shared cache's, or one whose inbox holds
/// releases for its owner to apply.
const CLOSED: usize = usize::MAX;

/// What other threads may read of an arena (and the inbox they write).
pub(crate) struct ArenaShared {
    /// The fast release's one check ([`ArenaCell::open`]): the arena's epoch while nothing
    /// waits in the inbox, [`CLOSED`] while something does (and always on a shared cache's
    /// arena). Only the owner stores an epoch here, only under the inbox's lock or before it
    /// publishes any record of that epoch; other threads store `CLOSED`, under the lock.
    gate: AtomicUsize,
    /// The epoch of the published records.
    epoch: AtomicUsize,
    /// The chunk's range, for finding the arena a released pointer lies in.
    base: AtomicUsize,
    len: AtomicUsize,
    /// Published records (`records[..count]`).
    count: AtomicUsize,
    records: Records,
    /// The highest bump offset (`top`) of this epoch, as of its last fall (`top` only grows
    /// between falls, so the true peak is this or `top` now). Only the owner writes it.
    peak: AtomicUsize,
    /// The peak of the epoch before this one, and of every epoch before this one.
    last_peak: AtomicUsize,
    max_peak: AtomicUsize,
    inbox: Mutex<Vec<Foreign>>,
    inbox_pending: AtomicBool,
    /// Whether a scope has the spare scope chunk (`stats` counts it live then, cached if not).
    spare_lent: AtomicBool,
    /// How many times the spare was lent: cache hits, as a chunk taken from the cache is.
    /// Only the owner writes it.
    spare_lends: AtomicUsize,
}

/// The arena's live figures as `stats` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ArenaFigures {
    pub(crate) live_bytes: usize,
    pub(crate) live_blocks: usize,
    pub(crate) requested: usize,
    pub(crate) hits: usize,
    /// The highest bump offset of the current reset interval, and of the one before it.
    pub(crate) peak: usize,
    pub(crate) last_peak: usize,
    /// The highest bump offset of any interval.
    pub(crate) max_peak: usize,
}

/// The arena of one thread cache: [`Arena`] for its owner, [`ArenaShared`] for all.
pub(crate) struct ArenaCell {
    owner: UnsafeCell<Arena>,
    pub(crate) shared: ArenaShared,
}

// SAFETY: `owner` is only reached through `ArenaCell::owner`, whose contract is that the caller
// is the cache's owner thread (one thread), so the `UnsafeCell` is never accessed from two
// threads; the raw chunk pointer in it is memory the allocator owns, not tied to a thread.
// Everything else is atomics and a mutex.
unsafe impl Sync for ArenaCell {}
// SAFETY: as above: the arena owns nothing tied to a thread.
unsafe impl Send for ArenaCell {}

impl ArenaCell {
    /// The arena of a cache one thread owns (`owned`), or of a shared cache, whose arena
    /// stays unused.
    pub(crate) fn new(owned: bool) -> Self {
        ArenaCell {
            owner: UnsafeCell::new(Arena {
                base: core::ptr::null_mut(),
                len: 0,
                top: 0,
                // A shared cache's arena is never current (the allocator's epoch starts at 0
                // and would need 2^64 resets to get here), so no thread bumps through it.
                epoch: if owned { 0 } else { usize::MAX },
                next_meta: 1 << SIZE_BITS,
                max_peak: 0,
                want: 0,
                refused_epoch: usize::MAX,
                large: false,
                large_requests: LargeRequests::default(),
                spare: None,
                spare_lent: false,
            }),
            shared: ArenaShared {
                gate: AtomicUsize::new(if owned { 0 } else { CLOSED }),
                epoch: AtomicUsize::new(0),
                base: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                count: AtomicUsize::new(0),
                records: Records::new(),
                peak: AtomicUsize::new(0),
                last_peak: AtomicUsize::new(0),
                max_peak: AtomicUsize::new(0),
                inbox: Mutex::new(Vec::new()),
                inbox_pending: AtomicBool::new(false),
                spare_lent: AtomicBool::new(false),
                spare_lends: AtomicUsize::new(0),
            },
        }
    }

    /// The owner's arena.
    ///
    /// # Safety
    /// The caller runs on the thread that owns this cache (`ThreadCache::owned`), and no other
    /// reference from `owner` is alive (the owner's calls do not nest: the arena is never
    /// borrowed across a call that could come back into the allocator).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn owner(&self) -> &mut Arena {
        // SAFETY: the caller's contract: one thread, one borrow at a time.
        unsafe { &mut *self.owner.get() }
    }

    /// The owner's arena if it is in the allocator's epoch `epoch`, which a shared cache's
    /// arena never is: the fast allocation's one check, with no separate test of ownership.
    /// (A release waiting in the inbox does not matter to an allocation: the owner applies it
    /// on its slow path.)
    ///
    /// # Safety
    /// The caller runs on the thread that owns this cache, or the cache is shared (not
    /// owned); and no other reference from `owner` is alive (as for [`owner`](Self::owner)).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn current(&self, epoch: usize) -> Option<&mut Arena> {
        let arena = self.owner.get();
        // SAFETY: a read through the raw pointer, no reference made: on an owned cache only
        // this thread (the owner, by the caller's contract) ever reads or writes the arena; a
        // shared cache's arena is never written after `new` (only owners bump or rewind), so
        // reads from several threads do not race. A plain read, not the gate's atomic one: the
        // compiler folds it into the comparison.
        let arena_epoch = unsafe { core::ptr::addr_of!((*arena).epoch).read() };
        if arena_epoch != epoch {
            return None;
        }
        // SAFETY: only an owned cache's arena can be in a real epoch (a shared one's is
        // `usize::MAX`), so the caller is its owner thread; one borrow at a time by contract.
        Some(unsafe { &mut *arena })
    }

    /// The owner's arena if it is in the allocator's epoch `epoch` with no release of
    /// another thread waiting in its inbox: the fast release's one check (the gate), which
    /// spares it a test of the inbox. `None` sends the caller to its slow path, which
    /// applies the inbox.
    ///
    /// # Safety
    /// As for [`current`](Self::current).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn open(&self, epoch: usize) -> Option<&mut Arena> {
        // Relaxed: an open gate lets the owner touch only its own state, and past a closed
        // one the inbox's lock orders what the closing thread queued.
        if self.shared.gate.load(Ordering::Relaxed) != epoch {
            return None;
        }
        debug_assert!(
            epoch != CLOSED,
            "the allocator's epoch never reaches CLOSED"
        );
        // SAFETY: only the owner of an owned cache stores an epoch in the gate (a shared
        // cache's stays `CLOSED`, which no epoch equals), so the caller is its owner thread;
        // one borrow at a time by contract.
        Some(unsafe { &mut *self.owner.get() })
    }

    /// The owner's arena if it is in the allocator's epoch `epoch`, its inbox applied first:
    /// the slow paths' [`current`](Self::current).
    ///
    /// # Safety
    /// As for [`current`](Self::current).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn current_applied(&self, epoch: usize) -> Option<&mut Arena> {
        // SAFETY: the caller's contract is `current`'s.
        let arena = unsafe { self.current(epoch) }?;
        arena.apply_inbox(&self.shared);
        Some(arena)
    }
}

impl Arena {
    /// The fast path: bumps `size` bytes aligned to `align` (a power of two up to
    /// [`ARENA_MAX_ALIGN`], `size > 0`) if the chunk and the record table have room. The arena
    /// must be in the allocator's epoch (see [`ArenaCell::current`]).
    #[inline(always)]
    pub(crate) fn bump(
        &mut self,
        sh: &ArenaShared,
        size: usize,
        align: usize,
    ) -> Option<NonNull<u8>> {
        // Every block is a whole number of granules, so `top` needs no rounding for them.
        let start = if align <= MIN_ALIGN {
            self.top
        } else {
            (self.top + (align - 1)) & !(align - 1)
        };
        let taken = granules(size);
        let end = start + taken;
        let i = sh.owner_count();
        let record = sh.records.get(i)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `end <= len`, so `base + start` is inside the chunk (`len > 0` means a chunk
        // is set: `base` is its first byte, valid for `len` bytes).
        let ptr = unsafe { self.base.add(start) };
        record.meta.store(self.next_meta | size, Ordering::Relaxed);
        // Release: a thread that reads this address reads the meta word above.
        record.addr.store(ptr.addr(), Ordering::Release);
        sh.count.store(i + 1, Ordering::Release);
        self.next_meta += 1 << SIZE_BITS;
        self.top = end;
        // SAFETY: inside a live chunk, so not null.
        Some(unsafe { NonNull::new_unchecked(ptr) })
    }

    /// `top` is about to fall: the epoch's peak is the highest `top` before a fall. The peak
    /// is the arena's bump offset, not the sum of its live blocks: bytes released below the
    /// newest live block stay in it until the blocks above them go, as they would in a bump
    /// plan of the same calls (and it costs the fast release no read of the block's size).
    #[inline(always)]
    fn note_peak(&self, sh: &ArenaShared) {
        if self.top > sh.peak.load(Ordering::Relaxed) {
            sh.peak.store(self.top, Ordering::Relaxed);
        }
    }

    /// The allocator epoch this arena's blocks belong to.
    #[inline(always)]
    pub(crate) fn epoch(&self) -> usize {
        self.epoch
    }

    /// Releases the block at `addr`, on the owner's thread. `false` if it is not a live block
    /// of this epoch (the caller looks elsewhere). The arena must be in the allocator's epoch.
    ///
    /// The newest block (the common order: kernels release newest first) is popped at once,
    /// its bytes given back to the bump. Its record is not marked: `count` no longer covers
    /// it, so no later look-up finds it (a release racing on another thread may still have
    /// read it; its inbox entry names the popped serial and is void).
    ///
    /// The caller found the gate open or applied the inbox: another thread's release waiting
    /// for this owner may name this very block, and must go first, so that a second release
    /// of it is refused rather than taken.
    #[inline(always)]
    pub(crate) fn release(&mut self, sh: &ArenaShared, addr: usize) -> bool {
        let Some(i) = sh.owner_count().checked_sub(1) else {
            return false;
        };
        debug_assert!(i < RECORDS);
        // SAFETY: `count <= RECORDS` always (`bump` raises it only after `records.get(i)`
        // found slot `i`; everything else lowers it or sets it to 0), so `i < RECORDS`.
        let record = unsafe { sh.records.get_unchecked(i) };
        if record.addr.load(Ordering::Relaxed) != addr {
            return self.release_below(sh, addr);
        }
        self.note_peak(sh);
        sh.count.store(i, Ordering::Release);
        // The first record starts the chunk (`base` is aligned to every alignment served), so
        // this is 0 when the arena is empty again.
        self.top = addr - self.base.addr();
        // SAFETY: `i - 1 < i < RECORDS`, as above.
        if i > 0 && unsafe { sh.released_unchecked(i - 1) } {
            self.pop_released(sh);
        }
        true
    }

    /// A release of a block below the newest: found among the records and marked.
    #[cold]
    fn release_below(&mut self, sh: &ArenaShared, addr: usize) -> bool {
        if addr.wrapping_sub(self.base.addr()) >= self.top {
            return false;
        }
        let Some(i) = sh
            .records
            .first(sh.owner_count())
            .rposition(|r| r.addr.load(Ordering::Relaxed) == addr)
        else {
            return false;
        };
        Self::forget(sh, i, addr);
        true
    }

    /// Marks record `i` (live, at `addr`) released; `pop_released` gives its bytes back once
    /// nothing live lies above it.
    #[inline(always)]
    fn forget(sh: &ArenaShared, i: usize, addr: usize) {
        sh.records
            .at(i)
            .addr
            .store(addr | RELEASED, Ordering::Release);
    }

    /// Pops released records off the top and rewinds the bump offset to the lowest popped.
    #[inline]
    fn pop_released(&mut self, sh: &ArenaShared) {
        self.note_peak(sh);
        let mut count = sh.owner_count();
        while count > 0 {
            let addr = sh.records.at(count - 1).addr.load(Ordering::Relaxed);
            if addr & RELEASED == 0 {
                break;
            }
            count -= 1;
            self.top = (addr & !RELEASED) - self.base.addr();
        }
        if count == 0 {
            self.top = 0;
        }
        sh.count.store(count, Ordering::Release);
        debug_assert!(self.top <= self.len);
    }

    /// Applies the releases other threads queued. Cold: the owner calls it when the chunk or
    /// the record table is full and before it rewinds.
    #[cold]
    pub(crate) fn apply_inbox(&mut self, sh: &ArenaShared) {
        if !sh.inbox_pending.load(Ordering::Acquire) {
            return;
        }
        let entries = {
            let mut inbox = lock(&sh.inbox);
            sh.inbox_pending.store(false, Ordering::Relaxed);
            sh.gate.store(self.epoch, Ordering::Relaxed);
            core::mem::take(&mut *inbox)
        };
        for e in entries {
            // The very block the releasing thread saw, still live.
            if e.matches(&sh.records, sh.owner_count()) {
                let addr = sh.records.at(e.slot).addr.load(Ordering::Relaxed);
                Self::forget(sh, e.slot, addr);
            }
        }
        self.pop_released(sh);
    }

    /// The owner saw the allocator's epoch move to `epoch`: every block of the arena's epoch
    /// is taken back. Returns how many bytes the next chunk should have if the chunk is too
    /// small for what the past epoch wanted (`None`: keep it).
    ///
    /// With `adaptive` (the default configuration), the next interval's large requests come
    /// here if the past interval asked for at most [`LARGE_WANT`] bytes in all, in at most
    /// [`LARGE_BLOCKS`] large requests, wherever they were served; the chunk then grows to
    /// hold them. Otherwise they go to the size classes, and the chunk grows only for the
    /// small requests.
    #[inline]
    pub(crate) fn rewind(
        &mut self,
        sh: &ArenaShared,
        epoch: usize,
        adaptive: bool,
    ) -> Option<usize> {
        debug_assert!(
            epoch != self.epoch,
            "a rewind would take this interval's blocks"
        );
        // Entries queued for the old epoch's blocks are void now.
        if sh.inbox_pending.load(Ordering::Acquire) {
            lock(&sh.inbox).clear();
            sh.inbox_pending.store(false, Ordering::Relaxed);
        }
        // The gate opens on the new epoch before any of its records is published, without the
        // inbox's lock: a thread that queues a release of a block of the new epoch has read its
        // record, so its `CLOSED` comes after this store. A `CLOSED` this store overwrites can
        // only be for an entry of the old epoch (void: its serial is gone), left for the next
        // `apply_inbox` to drop.
        sh.gate.store(epoch, Ordering::Release);
        let peak = sh.peak.load(Ordering::Relaxed).max(self.top);
        let last = if epoch == self.epoch.wrapping_add(1) {
            peak
        } else {
            0
        };
        // The epoch first: a thread that sees a record written after this sees the epoch too.
        sh.epoch.store(epoch, Ordering::Release);
        sh.last_peak.store(last, Ordering::Relaxed);
        self.max_peak = self.max_peak.max(peak);
        sh.max_peak.store(self.max_peak, Ordering::Relaxed);
        sh.peak.store(0, Ordering::Relaxed);
        sh.count.store(0, Ordering::Release);
        self.epoch = epoch;
        debug_assert!(epoch != usize::MAX, "the epoch of shared caches' arenas");
        self.top = 0;
        let want = core::mem::take(&mut self.want).max(peak);
        let want = if adaptive {
            self.choose_large(want)
        } else {
            want
        };
        next_chunk(want, self.len)
    }

    /// At a rewind of the adaptive arena, after an interval that wanted `want` bytes of the
    /// chunk: whether the next interval's large requests come here, and the bytes the chunk
    /// should hold for it.
    #[inline(always)]
    fn choose_large(&mut self, want: usize) -> usize {
        // The common interval has no large request: the choice in one comparison.
        if self.large_requests.count == 0 {
            self.large = want <= LARGE_WANT;
            return want;
        }
        self.choose_large_after_large_requests(want)
    }

    /// [`choose_large`](Self::choose_large) after an interval with large requests.
    #[inline]
    fn choose_large_after_large_requests(&mut self, want: usize) -> usize {
        let (want, large) = core::mem::take(&mut self.large_requests).target(want);
        self.large = large;
        want
    }

    /// Whether a request of `size` bytes above `Config::arena_max_bytes` (up to
    /// `ADAPTIVE_ARENA_MAX_BYTES`) comes to the arena, noting it for the next rewind's choice.
    /// The arena must be in the allocator's `epoch`.
    #[inline]
    pub(crate) fn takes_large(&mut self, epoch: usize, size: usize) -> bool {
        debug_assert_eq!(
            self.epoch, epoch,
            "a large request counted in a past interval"
        );
        self.large_requests.note(size, self.large);
        self.large
    }

    /// [`bump`](Self::bump), noting a request the chunk could not take (see `missed`).
    #[inline]
    pub(crate) fn bump_or_miss(
        &mut self,
        sh: &ArenaShared,
        size: usize,
        align: usize,
    ) -> Option<NonNull<u8>> {
        let bumped = self.bump(sh, size, align);
        if bumped.is_none() {
            self.missed(size);
        }
        bumped
    }

    /// A request the chunk could not take this epoch: the next chunk should hold it too.
    #[inline]
    pub(crate) fn missed(&mut self, size: usize) {
        self.want = self.want.max(self.top) + granules(size);
    }

    /// The chunk the next rewind will ask for, if a request of `size` bytes the chunk just
    /// missed (see [`missed`](Self::missed)) is most of it: the size classes then serve the
    /// request with a block of that size, which the rewind takes back from the idle blocks
    /// as the new chunk (no second system allocation, no second copy of a large buffer).
    ///
    /// With `adaptive`, the next chunk is the one [`choose_large`](Self::choose_large) would
    /// ask for now.
    #[inline]
    pub(crate) fn successor_for(&self, size: usize, adaptive: bool) -> Option<usize> {
        let want = self.want.max(self.top);
        let want = if adaptive {
            self.large_requests.target(want).0
        } else {
            want
        };
        let next = next_chunk(want, self.len)?;
        (granules(size) * 2 >= next).then_some(next)
    }

    /// No chunk could be had in `epoch`: the arena asks for none again until the next.
    pub(crate) fn refuse(&mut self, epoch: usize) {
        self.refused_epoch = epoch;
    }

    /// Whether a chunk was refused in `epoch`.
    pub(crate) fn refused(&self, epoch: usize) -> bool {
        self.refused_epoch == epoch
    }

    /// Whether the arena holds no live block (after applying its inbox).
    pub(crate) fn is_empty(&self, sh: &ArenaShared) -> bool {
        sh.owner_count() == 0
    }

    /// The chunk's length (0 without one).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The chunk's first byte, if any.
    pub(crate) fn chunk(&self) -> Option<NonNull<u8>> {
        NonNull::new(self.base)
    }

    /// Starts using a new chunk (`base` valid for `len` bytes, aligned to
    /// [`ARENA_MAX_ALIGN`]), or none (`base` null, `len` 0). The arena must be empty.
    pub(crate) fn set_chunk(&mut self, sh: &ArenaShared, base: *mut u8, len: usize) {
        debug_assert!(sh.owner_count() == 0 && self.top == 0);
        debug_assert!(base.addr().is_multiple_of(ARENA_MAX_ALIGN));
        self.base = base;
        self.len = len;
        sh.base.store(base.addr(), Ordering::Release);
        sh.len.store(len, Ordering::Release);
    }
}

impl Arena {
    /// Lends the spare scope chunk to a scope, if there is one, it is free and it has at least
    /// `bytes`: a scope's first chunk without the cache's lock.
    #[inline]
    pub(crate) fn lend_spare(&mut self, sh: &ArenaShared, bytes: usize) -> Option<Block> {
        let chunk = self
            .spare
            .filter(|c| !self.spare_lent && c.size() >= bytes)?;
        self.spare_lent = true;
        sh.spare_lent.store(true, Ordering::Relaxed);
        let lends = sh.spare_lends.load(Ordering::Relaxed);
        sh.spare_lends.store(lends + 1, Ordering::Relaxed);
        Some(chunk)
    }

    /// The scope that borrowed the spare chunk is done with it.
    #[inline]
    pub(crate) fn return_spare(&mut self, sh: &ArenaShared) {
        debug_assert!(self.spare_lent);
        self.spare_lent = false;
        sh.spare_lent.store(false, Ordering::Relaxed);
    }

    /// Whether a spare scope chunk would be kept: none yet (the caller books it in
    /// `CacheState::scope_chunk` under the cache's lock, then calls `set_spare`).
    pub(crate) fn wants_spare(&self) -> bool {
        self.spare.is_none()
    }

    /// Sets (or clears, with `None`) the spare scope chunk; never while it is lent.
    pub(crate) fn set_spare(&mut self, chunk: Option<Block>) {
        debug_assert!(!self.spare_lent);
        self.spare = chunk;
    }

    /// Whether the spare chunk is free to be taken away (there is one and no scope has it).
    pub(crate) fn spare_idle(&self) -> bool {
        self.spare.is_some() && !self.spare_lent
    }
}

impl ArenaShared {
    /// Whether a scope has the spare scope chunk.
    pub(crate) fn spare_lent(&self) -> bool {
        self.spare_lent.load(Ordering::Relaxed)
    }

    /// How many times the spare scope chunk was lent.
    pub(crate) fn spare_lends(&self) -> u64 {
        self.spare_lends.load(Ordering::Relaxed) as u64
    }

    /// Whether record `i` is marked released.
    ///
    /// # Safety
    /// `i < RECORDS`.
    #[inline(always)]
    unsafe fn released_unchecked(&self, i: usize) -> bool {
        debug_assert!(i < RECORDS);
        // SAFETY: the caller's contract.
        let record = unsafe { self.records.get_unchecked(i) };
        record.addr.load(Ordering::Relaxed) & RELEASED != 0
    }

    /// The records in use, as the owner reads them (it alone writes `count`, so a relaxed
    /// load gives its own last store).
    #[inline(always)]
    fn owner_count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The epoch of the published records (the owner stores it when it rewinds).
    pub(crate) fn epoch(&self) -> usize {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether `addr` lies in this arena's chunk.
    pub(crate) fn in_chunk(&self, addr: usize) -> bool {
        let base = self.base.load(Ordering::Acquire);
        base != 0 && addr.wrapping_sub(base) < self.len.load(Ordering::Acquire)
    }

    /// A release from another thread than the owner: `true` if `addr` is a live block of
    /// this arena in the allocator's current epoch `epoch` (then it is queued for the owner),
    /// `false` if not (nothing changes).
    pub(crate) fn release_foreign(&self, epoch: &AtomicUsize, addr: usize) -> bool {
        self.find_foreign(epoch, addr)
            .is_some_and(|entry| self.queue_foreign(entry))
    }

    /// The live record of `addr` in the allocator's current epoch, as a release from another
    /// thread would queue it; `None` if there is none.
    fn find_foreign(&self, epoch: &AtomicUsize, addr: usize) -> Option<Foreign> {
        loop {
            let seen = self.epoch.load(Ordering::Acquire);
            if seen != epoch.load(Ordering::Acquire) {
                // A reset took the arena's blocks back (its owner has not rewound yet).
                return None;
            }
            let count = self.count.load(Ordering::Acquire);
            let mut found = None;
            for (slot, record) in self.records.first(count).enumerate().rev() {
                if record.addr.load(Ordering::Acquire) == addr {
                    let meta = record.meta.load(Ordering::Relaxed);
                    // Read again: the owner may have reused the slot meanwhile.
                    if record.addr.load(Ordering::Acquire) == addr {
                        found = Some(Foreign {
                            slot,
                            serial: Record::serial(meta),
                            requested: Record::requested(meta),
                        });
                    }
                    break;
                }
            }
            if self.epoch.load(Ordering::Acquire) != seen {
                continue; // the owner rewound during the scan: look again
            }
            return found;
        }
    }

    /// Queues `entry` for the owner: `false` if it is no longer live (the owner rewound or
    /// reused its slot since it was found) or another thread queued it already.
    ///
    /// The owner does not take the inbox's lock to rewind or bump, so an entry can still go
    /// stale once queued (found, then a reset and a rewind, then queued). That is harmless by
    /// construction: an entry counts as a release only while its slot holds its serial, live
    /// ([`Foreign::matches`]), which the owner's apply and `figures` both check, and serials
    /// are never reused.
    fn queue_foreign(&self, entry: Foreign) -> bool {
        let mut inbox = lock(&self.inbox);
        if !entry.matches(&self.records, self.count.load(Ordering::Acquire)) {
            return false;
        }
        if inbox.iter().any(|e| e.serial == entry.serial) {
            return false; // already released by another thread
        }
        inbox.push(entry);
        self.inbox_pending.store(true, Ordering::Release);
        self.gate.store(CLOSED, Ordering::Release);
        true
    }

    /// The arena's figures as of the allocator's epoch `epoch`: an arena whose epoch is behind
    /// holds nothing live (a reset took its blocks), and releases waiting in the inbox count
    /// as done.
    pub(crate) fn figures(&self, epoch: usize) -> ArenaFigures {
        let count = self.count.load(Ordering::Acquire).min(RECORDS);
        let (mut bytes, mut blocks, mut requested) = (0usize, 0usize, 0usize);
        for record in self.records.first(count) {
            let addr = record.addr.load(Ordering::Acquire);
            let meta = record.meta.load(Ordering::Relaxed);
            if addr & RELEASED == 0 {
                bytes += granules(Record::requested(meta));
                blocks += 1;
                requested += Record::requested(meta);
            }
        }
        // Serials grow by one a block, and a slot is only written with a newer serial than it
        // held: the largest serial in any slot, in use or not, counts every block handed out.
        let hits = self
            .records
            .meta
            .iter()
            .map(|meta| Record::serial(meta.load(Ordering::Relaxed)))
            .max()
            .unwrap_or(0);
        // The owner's `top` now: the end of the newest record (never a marked one: marks above
        // the newest live block are popped at once).
        let top = count.checked_sub(1).map_or(0, |i| {
            let r = self.records.at(i);
            let start = (r.addr.load(Ordering::Acquire) & !RELEASED)
                .wrapping_sub(self.base.load(Ordering::Relaxed));
            start.wrapping_add(granules(Record::requested(r.meta.load(Ordering::Relaxed))))
        });
        let peak = self
            .peak
            .load(Ordering::Relaxed)
            .max(top.min(self.len.load(Ordering::Relaxed)));
        let max_peak = self.max_peak.load(Ordering::Relaxed).max(peak);
        let seen = self.epoch.load(Ordering::Acquire);
        if seen != epoch {
            // A reset took the blocks back; its owner has not rewound yet.
            let last_peak = if epoch == seen.wrapping_add(1) {
                peak
            } else {
                0
            };
            return ArenaFigures {
                hits,
                last_peak,
                max_peak,
                ..ArenaFigures::default()
            };
        }
        if self.inbox_pending.load(Ordering::Acquire) {
            // Only entries that still name a live record: a stale one (its block taken by a
            // reset, its slot reused) must not hide the later block in that slot.
            for e in lock(&self.inbox)
                .iter()
                .filter(|e| e.matches(&self.records, count))
            {
                bytes = bytes.saturating_sub(granules(e.requested));
                blocks = blocks.saturating_sub(1);
                requested = requested.saturating_sub(e.requested);
            }
        }
        ArenaFigures {
            live_bytes: bytes,
            live_blocks: blocks,
            requested,
            hits,
            peak,
            last_peak: self.last_peak.load(Ordering::Relaxed),
            max_peak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{alloc, dealloc, Layout};

    /// An owned arena over a fresh chunk of `MIN_CHUNK` bytes, in epoch 0.
    struct Fixture {
        cell: ArenaCell,
        layout: Layout,
        base: *mut u8,
    }

    impl Fixture {
        fn new() -> Self {
            let layout = Layout::from_size_align(MIN_CHUNK, ARENA_MAX_ALIGN).unwrap();
            // SAFETY: the layout has a non-zero size.
            let base = unsafe { alloc(layout) };
            assert!(!base.is_null());
            let cell = ArenaCell::new(true);
            let fixture = Fixture { cell, layout, base };
            fixture
                .owner()
                .set_chunk(&fixture.cell.shared, base, MIN_CHUNK);
            fixture
        }

        /// The owner's arena, as the allocator's owner thread reaches it.
        #[allow(clippy::mut_from_ref)] // as `ArenaCell::owner`: one thread, one borrow at a time
        fn owner(&self) -> &mut Arena {
            // SAFETY: one thread, and each test keeps one borrow at a time.
            unsafe { self.cell.owner() }
        }

        fn bump(&self, size: usize) -> usize {
            let ptr = self.owner().bump(&self.cell.shared, size, 64).unwrap();
            ptr.as_ptr().addr()
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout; the arena is dropped with it.
            unsafe { dealloc(self.base, self.layout) };
        }
    }

    /// A release from another thread that found its block before a reset and queues it after
    /// the owner rewound and handed the same slot (and address) to a later block: the stale
    /// entry must release nothing and must not count the later block as released (else an
    /// exited owner's cache would look empty and its chunk would go to the pool under a live
    /// block).
    #[test]
    fn a_stale_foreign_entry_never_counts_against_a_later_block() {
        let f = Fixture::new();
        let sh = &f.cell.shared;
        let epoch = AtomicUsize::new(0);
        let b1 = f.bump(256);
        let stale = sh.find_foreign(&epoch, b1).expect("b1 is live");
        // A reset; the owner rewinds and bumps the next block into the same slot.
        epoch.store(1, Ordering::Release);
        assert_eq!(f.owner().rewind(sh, 1, false), None);
        let b2 = f.bump(256);
        assert_eq!(b1, b2, "the later block reuses the slot and the address");
        // Queued now, the entry is refused.
        assert!(!sh.queue_foreign(stale));
        // Queued just before the rewind (the window the check above cannot close): it sits
        // in the inbox, and neither the books nor the owner take it as b2's release.
        lock(&sh.inbox).push(stale);
        sh.inbox_pending.store(true, Ordering::Release);
        assert_eq!(sh.figures(1).live_blocks, 1);
        f.owner().apply_inbox(sh);
        assert_eq!(sh.figures(1).live_blocks, 1);
        assert!(
            f.owner().release(sh, b2),
            "b2 is still live, its own to release"
        );
        assert_eq!(sh.figures(1).live_blocks, 0);
    }

    /// The live entry of the same scenario, for contrast: queued before any reset, it
    /// counts at once and the owner applies it.
    #[test]
    fn a_foreign_entry_counts_while_its_block_is_live() {
        let f = Fixture::new();
        let sh = &f.cell.shared;
        let epoch = AtomicUsize::new(0);
        let b1 = f.bump(256);
        let _b2 = f.bump(128);
        assert!(sh.release_foreign(&epoch, b1));
        assert!(
            !sh.release_foreign(&epoch, b1),
            "a second release is refused"
        );
        assert_eq!(sh.figures(0).live_blocks, 1);
        f.owner().apply_inbox(sh);
        assert_eq!(sh.figures(0).live_blocks, 1);
        assert!(
            !f.owner().release(sh, b1),
            "already released by the other thread"
        );
    }

    #[test]
    fn epochs_order_across_a_wrap() {
        assert!(epoch_behind(3, 4));
        assert!(!epoch_behind(4, 4));
        assert!(!epoch_behind(5, 4));
        assert!(epoch_behind(usize::MAX, 0));
        assert!(!epoch_behind(0, usize::MAX));
    }
}
