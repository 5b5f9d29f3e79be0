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
//!   released on another thread is found among the published records *at the call* (a pointer
//!   never handed out, already released or taken back by a reset is `UnknownPointer` there)
//!   and marked with one compare-and-swap on its record's `meta` word, which names the block's
//!   serial: a mark can only land on the very block the releasing thread found, never on a
//!   later block that reuses the slot and the address. The releasing thread then closes the
//!   arena's *gate*, which sends the owner's next release through the slow path that pops
//!   marked records. No queue and no lock of the owner's: O(log records) for the search, one CAS
//!   and one swap (the allocator finds the arena through `chunk_index`).
//! - **One owner per chunk.** Whether the arena's chunk is its owner's to bump through is one
//!   word, [`ArenaShared::claim`]: the epoch the arena is in, or [`REVOKED`]. The owner's
//!   rewind moves it from its epoch to the allocator's with one CAS; a trim on another thread
//!   may take the chunk of an arena *strictly behind* the allocator's epoch (its owner has not
//!   called since a reset took its blocks) with one CAS from that epoch to `REVOKED`. Exactly
//!   one of the two CASes from a stale epoch succeeds, and the loser never touches the chunk
//!   again: a revoked owner forgets its chunk at the rewind, a trimmer that lost leaves it.
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
use crate::sync::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, WriterLoad};

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

/// Low bit of a published record: the block was released on its owner's thread (addresses
/// are 64-byte aligned). Only the owner writes a record's address word.
const RELEASED: usize = 1;
/// A record's `meta` word: the block's serial above these bits, [`RELEASED_ELSEWHERE`] and
/// the size asked for in them (requests are at most [`MAX_CHUNK`], `Config::arena_max_bytes`'s
/// bound; 40 bits of serial outlast any process).
const SIZE_BITS: u32 = 24;
/// The bit of a record's `meta` word another thread sets, with a CAS, when it releases the
/// block: the CAS compares the serial too, so it can only mark the block it found.
const RELEASED_ELSEWHERE: usize = 1 << (SIZE_BITS - 1);
const _: () = assert!(MAX_CHUNK < RELEASED_ELSEWHERE);
const SIZE_MASK: usize = RELEASED_ELSEWHERE - 1;

/// [`ArenaShared::claim`] of an arena whose chunk a trim took: only its owner moves it on,
/// at its next rewind. No epoch reaches it (2^64 resets).
pub(crate) const REVOKED: usize = usize::MAX;

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
///
/// The chunk itself (its range) is in [`ArenaShared`], where other threads find it: the owner
/// alone writes it, in [`set_chunk`](Arena::set_chunk).
pub(crate) struct Arena {
    /// Bytes of the chunk bumped past.
    top: usize,
    /// The allocator epoch this arena's records belong to: the owner's copy of
    /// [`ArenaShared::claim`] (equal to it unless a trim revoked the chunk), read on the fast
    /// path without an atomic load.
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
    /// without the cache's lock). Whether a scope has it is `ArenaShared::spare_lent`.
    spare: Option<Block>,
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

/// The gate of an arena no fast path may enter: a shared cache's, or one another thread
/// marked a block of (see [`RELEASED_ELSEWHERE`]).
const CLOSED: usize = usize::MAX;

/// What other threads may read of an arena (and the marks they set in its records).
///
/// `repr(C)`, the words the fast paths read first and the records after them: the records are
/// 4 KiB, so a word placed after them sits 4 KiB above the first slots, and a load of it right
/// after a store to slot 0 (every round trip) waits on that store (4K aliasing: 0.5-0.7 ns on
/// the allocate + release trip when the compiler put the gate there).
#[repr(C)]
pub(crate) struct ArenaShared {
    /// The fast release's one check ([`ArenaCell::open`]): the arena's epoch while no block
    /// is marked [`RELEASED_ELSEWHERE`] unapplied, [`CLOSED`] while one may be (and always on
    /// a shared cache's arena). Only the owner stores an epoch here: at a rewind, before it
    /// publishes any record of that epoch, and when it applies the marks, before it reads them
    /// (a swap); other threads swap in `CLOSED` after their mark.
    gate: AtomicUsize,
    /// Who may use the chunk: the epoch the arena and its published records are in, or
    /// [`REVOKED`]. See the module docs ("One owner per chunk"); the transitions are
    /// [`Arena::rewind`] (owner: its epoch or `REVOKED` -> the allocator's epoch) and
    /// [`ArenaShared::revoke`] (a trim, under the cache's lock: an epoch strictly behind the
    /// allocator's -> `REVOKED`).
    claim: AtomicUsize,
    /// The chunk's first byte (with its provenance) and length; null and 0 without a chunk
    /// (so every request misses the fast path). Only the owner writes them ([`Arena::set_chunk`]).
    base: AtomicPtr<u8>,
    len: AtomicUsize,
    /// Published records (`records[..count]`).
    count: AtomicUsize,
    /// The highest bump offset (`top`) of this epoch, as of its last fall (`top` only grows
    /// between falls, so the true peak is this or `top` now). Only the owner writes it.
    peak: AtomicUsize,
    /// After the fields above (see the type's docs).
    records: Records,
    /// The peak of the epoch before this one, and of every epoch before this one.
    last_peak: AtomicUsize,
    max_peak: AtomicUsize,
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

/// The arena of one thread cache: [`Arena`] for its owner, [`ArenaShared`] for all
/// (`repr(C)`: the owner's words first, below the shared ones; see [`ArenaShared`]).
#[repr(C)]
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
            }),
            shared: ArenaShared {
                gate: AtomicUsize::new(if owned { 0 } else { CLOSED }),
                claim: AtomicUsize::new(0),
                base: AtomicPtr::new(core::ptr::null_mut()),
                len: AtomicUsize::new(0),
                count: AtomicUsize::new(0),
                records: Records::new(),
                peak: AtomicUsize::new(0),
                last_peak: AtomicUsize::new(0),
                max_peak: AtomicUsize::new(0),
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
    /// (A block marked by another thread's release does not matter to an allocation: the
    /// owner pops it on its slow path.)
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

    /// The owner's arena if it is in the allocator's epoch `epoch` with no block marked by
    /// another thread's release left to apply: the fast release's one check (the gate), which
    /// spares it a test of the marks. `None` sends the caller to its slow path, which applies
    /// them.
    ///
    /// # Safety
    /// As for [`current`](Self::current).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn open(&self, epoch: usize) -> Option<&mut Arena> {
        // Relaxed: an open gate lets the owner touch only its own state, and past a closed
        // one `apply_marks` reads the marks with the ordering it needs.
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

    /// The owner's arena if it is in the allocator's epoch `epoch`, other threads' marks
    /// applied first: the slow paths' [`current`](Self::current).
    ///
    /// # Safety
    /// As for [`current`](Self::current).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn current_applied(&self, epoch: usize) -> Option<&mut Arena> {
        // SAFETY: the caller's contract is `current`'s.
        let arena = unsafe { self.current(epoch) }?;
        arena.apply_marks(&self.shared);
        Some(arena)
    }
}

impl Arena {
    /// The chunk's first byte, with its provenance (null without a chunk). `sh` is this
    /// arena's.
    #[inline(always)]
    fn base_ptr(&self, sh: &ArenaShared) -> *mut u8 {
        // SAFETY: only the owner writes `base` (`set_chunk`), and `&self` is the owner's arena
        // (`ArenaCell::owner`'s contract: only the owner thread reaches it).
        unsafe { sh.base.writer_load() }
    }

    /// The chunk's first byte as an address (0 without a chunk). `sh` is this arena's.
    #[inline(always)]
    fn base(&self, sh: &ArenaShared) -> usize {
        self.base_ptr(sh).addr()
    }

    /// The chunk's length (0 without a chunk). `sh` is this arena's.
    #[inline(always)]
    fn len(&self, sh: &ArenaShared) -> usize {
        // SAFETY: as in `base_ptr`.
        unsafe { sh.len.writer_load() }
    }

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
        if end > self.len(sh) {
            return None;
        }
        // SAFETY: `end <= len`, so `base + start` is inside the chunk (`len > 0` means a chunk
        // is set: `base` is its first byte, valid for `len` bytes).
        let ptr = unsafe { self.base_ptr(sh).add(start) };
        // The address before the meta word (release): a thread that reads this meta word
        // reads this address or a later one (see `ArenaShared::release_foreign`).
        record.addr.store(ptr.addr(), Ordering::Relaxed);
        record.meta.store(self.next_meta | size, Ordering::Release);
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
    /// read it; its mark names the popped serial, which the slot's next block overwrites).
    ///
    /// The caller found the gate open or applied the marks: another thread's release of this
    /// very block must go first, so that a second release of it is refused rather than taken.
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
            return Self::release_below(sh, addr);
        }
        self.note_peak(sh);
        sh.count.store(i, Ordering::Release);
        // The first record starts the chunk (`base` is aligned to every alignment served), so
        // this is 0 when the arena is empty again.
        self.top = addr - self.base(sh);
        // SAFETY: `i - 1 < i < RECORDS`, as above.
        if i > 0 && unsafe { sh.released_unchecked(i - 1) } {
            self.pop_released(sh);
        }
        true
    }

    /// A release of a block below the newest: found among the records and marked.
    #[cold]
    #[inline(never)]
    fn release_below(sh: &ArenaShared, addr: usize) -> bool {
        match sh.slot_of(addr) {
            // Not marked already (the search ignores the mark).
            Some(i) if sh.records.at(i).addr.load(Ordering::Relaxed) == addr => {
                Self::forget(sh, i, addr);
                true
            }
            _ => false,
        }
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
            self.top = (addr & !RELEASED) - self.base(sh);
        }
        if count == 0 {
            self.top = 0;
        }
        sh.count.store(count, Ordering::Release);
        debug_assert!(self.top <= self.len(sh));
    }

    /// Applies the releases other threads marked ([`RELEASED_ELSEWHERE`]) behind a closed
    /// gate. Cold: the owner calls it when its fast release found the gate closed, when the
    /// chunk or the record table is full, and before it parks its chunk.
    #[cold]
    pub(crate) fn apply_marks(&mut self, sh: &ArenaShared) {
        if sh.gate.load(Ordering::Relaxed) == self.epoch {
            return;
        }
        // Open the gate before reading the marks, with a swap, as a marking thread closes it
        // (`ArenaShared::mark`): the two swaps are ordered. If the closing swap came first,
        // this one reads it and acquires the mark before it; if it comes after, the gate
        // stays closed and the next slow path applies the mark this scan may miss.
        sh.gate.swap(self.epoch, Ordering::AcqRel);
        for (i, record) in sh.records.first(sh.owner_count()).enumerate() {
            if record.meta.load(Ordering::Relaxed) & RELEASED_ELSEWHERE != 0 {
                let addr = record.addr.load(Ordering::Relaxed);
                if addr & RELEASED == 0 {
                    Self::forget(sh, i, addr);
                }
            }
        }
        self.pop_released(sh);
    }

    /// The owner saw the allocator's epoch move to `epoch`: every block of the arena's epoch
    /// is taken back, and the arena claims its chunk for `epoch`. Returns how many bytes the
    /// next chunk should have if the chunk is too small for what the past epoch wanted, or if
    /// a trim revoked it (`None`: keep it).
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
        // The gate opens on the new epoch before any of its records is published: a thread
        // that marks a block of the new epoch has read its record, so its `CLOSED` comes after
        // this store. A `CLOSED` this store overwrites can only follow a mark of the old
        // epoch's records, void now (the slots' next blocks overwrite them).
        sh.gate.store(epoch, Ordering::Release);
        let peak = sh.peak.load(Ordering::Relaxed).max(self.top);
        let last = if epoch == self.epoch.wrapping_add(1) {
            peak
        } else {
            0
        };
        sh.last_peak.store(last, Ordering::Relaxed);
        self.max_peak = self.max_peak.max(peak);
        sh.max_peak.store(self.max_peak, Ordering::Relaxed);
        sh.peak.store(0, Ordering::Relaxed);
        sh.count.store(0, Ordering::Release);
        debug_assert!(epoch != REVOKED, "the epoch of shared caches' arenas");
        // The claim after the records are gone, and before any of the new epoch's is
        // published: a thread that sees one sees the claim too.
        let revoked = sh
            .claim
            .compare_exchange(self.epoch, epoch, Ordering::AcqRel, Ordering::Acquire)
            .is_err();
        self.epoch = epoch;
        self.top = 0;
        let want = core::mem::take(&mut self.want).max(peak);
        let want = if adaptive {
            self.choose_large(want)
        } else {
            want
        };
        let len = self.len(sh);
        if revoked {
            return Some(self.forget_revoked_chunk(sh, epoch, want, len));
        }
        next_chunk(want, len)
    }

    /// A trim took the chunk while the arena was behind ([`ArenaShared::revoke`]): the arena
    /// lets go of it without touching it and claims `epoch` with no chunk. Returns the size
    /// of the next chunk: what the past interval wanted, at least the old chunk's `len`.
    #[cold]
    fn forget_revoked_chunk(
        &mut self,
        sh: &ArenaShared,
        epoch: usize,
        want: usize,
        len: usize,
    ) -> usize {
        debug_assert_eq!(sh.claim.load(Ordering::Relaxed), REVOKED);
        self.set_chunk(sh, core::ptr::null_mut(), 0);
        // Only the owner moves a claim on from `REVOKED`, so a plain store does.
        sh.claim.store(epoch, Ordering::Release);
        next_chunk(want, len).unwrap_or(len).max(MIN_CHUNK)
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
    pub(crate) fn successor_for(
        &self,
        sh: &ArenaShared,
        size: usize,
        adaptive: bool,
    ) -> Option<usize> {
        let want = self.want.max(self.top);
        let want = if adaptive {
            self.large_requests.target(want).0
        } else {
            want
        };
        let next = next_chunk(want, self.len(sh))?;
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

    /// Whether the arena holds no live block (after applying the marks).
    pub(crate) fn is_empty(&self, sh: &ArenaShared) -> bool {
        sh.owner_count() == 0
    }

    /// Whether the arena has a chunk.
    pub(crate) fn has_chunk(&self, sh: &ArenaShared) -> bool {
        self.len(sh) > 0
    }

    /// Starts using a new chunk (`base` valid for `len` bytes, aligned to
    /// [`ARENA_MAX_ALIGN`]), or none (`base` null, `len` 0). The arena must be empty.
    pub(crate) fn set_chunk(&mut self, sh: &ArenaShared, base: *mut u8, len: usize) {
        debug_assert!(sh.owner_count() == 0 && self.top == 0);
        debug_assert!(base.addr().is_multiple_of(ARENA_MAX_ALIGN));
        debug_assert_eq!(base.is_null(), len == 0);
        sh.base.store(base, Ordering::Release);
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
            .filter(|c| !self.spare_lent(sh) && c.size() >= bytes)?;
        sh.spare_lent.store(true, Ordering::Relaxed);
        let lends = sh.spare_lends.load(Ordering::Relaxed);
        sh.spare_lends.store(lends + 1, Ordering::Relaxed);
        Some(chunk)
    }

    /// The scope that borrowed the spare chunk is done with it.
    #[inline]
    pub(crate) fn return_spare(&mut self, sh: &ArenaShared) {
        debug_assert!(self.spare_lent(sh));
        sh.spare_lent.store(false, Ordering::Relaxed);
    }

    /// Whether a scope has the spare chunk. `sh` is this arena's.
    #[inline(always)]
    fn spare_lent(&self, sh: &ArenaShared) -> bool {
        // SAFETY: only the owner writes `spare_lent` (`lend_spare`, `return_spare`), and
        // `&self` is the owner's arena, as in `Arena::base_ptr`.
        unsafe { sh.spare_lent.writer_load() }
    }

    /// Whether a spare scope chunk would be kept: none yet (the caller books it in
    /// `CacheState::scope_chunk` under the cache's lock, then calls `set_spare`).
    pub(crate) fn wants_spare(&self) -> bool {
        self.spare.is_none()
    }

    /// Sets (or clears, with `None`) the spare scope chunk; never while it is lent.
    pub(crate) fn set_spare(&mut self, sh: &ArenaShared, chunk: Option<Block>) {
        debug_assert!(!self.spare_lent(sh));
        self.spare = chunk;
    }

    /// Whether the spare chunk is free to be taken away (there is one and no scope has it).
    pub(crate) fn spare_idle(&self, sh: &ArenaShared) -> bool {
        self.spare.is_some() && !self.spare_lent(sh)
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

    /// A trim, on any thread, holding the cache's lock (which orders it with the owner's
    /// chunk changes in the books): takes the chunk of an arena strictly behind the
    /// allocator's epoch, with one CAS of its claim to [`REVOKED`]. `true`: the chunk is the
    /// caller's to move to the idle blocks, and the owner will never touch it again (its
    /// rewind's CAS from the stale epoch fails). `false`: the arena is current, already
    /// revoked, or its owner rewound first; the caller leaves the chunk alone.
    pub(crate) fn revoke(&self, epoch: &AtomicUsize) -> bool {
        let claim = self.claim.load(Ordering::Acquire);
        // Read after the claim: an owner rewinds to an epoch it read from the allocator, so
        // this one is at least the claim's, unless the claim is `REVOKED`.
        let now = epoch.load(Ordering::Acquire);
        if claim == REVOKED || !epoch_behind(claim, now) {
            debug_assert!(
                claim == REVOKED || claim == now,
                "an arena claimed epoch {claim}, ahead of the allocator's {now}"
            );
            return false;
        }
        self.claim
            .compare_exchange(claim, REVOKED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// A release from another thread than the owner: `true` if `addr` is a live block of
    /// this arena in the allocator's current epoch `epoch` (then its record is marked
    /// [`RELEASED_ELSEWHERE`] and the gate closed, for the owner to apply), `false` if not
    /// (nothing changes that anyone counts).
    ///
    /// The contract: a pointer that is not a live block of this arena when the call looks is
    /// refused here (never handed out, released already, or taken back by a reset). A
    /// release that races with the owner's release of the same block, or with the reset that
    /// takes it back, may be taken by both or refused by either: the mark lands on the
    /// serial's own `meta` word, so it never releases a later block.
    pub(crate) fn release_foreign(&self, epoch: &AtomicUsize, addr: usize) -> bool {
        let claim = self.claim.load(Ordering::Acquire);
        if claim != epoch.load(Ordering::Acquire) {
            // A reset took the arena's blocks back (its owner has not rewound yet), or a trim
            // took its chunk.
            return false;
        }
        let Some(found) = self.look_up(addr) else {
            return false;
        };
        if !self.mark(found) {
            return false;
        }
        // A rewind after the look-up made the mark void (the block was taken back).
        self.claim.load(Ordering::Acquire) == claim
    }

    /// The live record at `addr`, as [`mark`](Self::mark) takes it: its slot and its meta
    /// word (which names its serial). `None` if no published record is a live block there.
    fn look_up(&self, addr: usize) -> Option<(usize, usize)> {
        let slot = self.slot_of(addr)?;
        let record = self.records.at(slot);
        // The meta word first, then the address: the owner writes a block's address before
        // its meta word (`bump`, release store), so the address read here is the one that
        // came with this meta word or a later one; if later, the slot holds another serial
        // and `mark`'s CAS fails.
        let meta = record.meta.load(Ordering::Acquire);
        let live = meta & RELEASED_ELSEWHERE == 0 && record.addr.load(Ordering::Acquire) == addr;
        live.then_some((slot, meta))
    }

    /// Marks the record `look_up` found released, if its slot still holds that serial
    /// unmarked, and closes the gate for the owner: `false` if it does not (the owner reused
    /// the slot, or another thread marked it first).
    fn mark(&self, (slot, meta): (usize, usize)) -> bool {
        let marked = self.records.at(slot).meta.compare_exchange(
            meta,
            meta | RELEASED_ELSEWHERE,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if marked.is_err() {
            return false;
        }
        // A swap, releasing the mark: see `Arena::apply_marks`.
        self.gate.swap(CLOSED, Ordering::AcqRel);
        true
    }

    /// The slot of the published record at `addr`, by binary search. Within an epoch the
    /// published records lie in address order: the bump only moves up, a pop takes every
    /// slot above it along, and a slot is written again only at the top. For a block the
    /// caller holds live, every slot below it is stable (only its released bit may change)
    /// and every slot above it that `count` covers was written after it, higher, so the
    /// search finds it whatever the owner does meanwhile; for any other address the caller's
    /// checks refuse whatever it finds.
    fn slot_of(&self, addr: usize) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.count.load(Ordering::Acquire).min(RECORDS));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let at = self.records.at(mid).addr.load(Ordering::Acquire) & !RELEASED;
            match at.cmp(&addr) {
                core::cmp::Ordering::Less => lo = mid + 1,
                core::cmp::Ordering::Greater => hi = mid,
                core::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The arena's figures as of the allocator's epoch `epoch`: an arena whose epoch is behind
    /// holds nothing live (a reset took its blocks), and blocks another thread marked
    /// released count as released.
    pub(crate) fn figures(&self, epoch: usize) -> ArenaFigures {
        let count = self.count.load(Ordering::Acquire).min(RECORDS);
        let (mut bytes, mut blocks, mut requested) = (0usize, 0usize, 0usize);
        // A mark (`RELEASED_ELSEWHERE`) counts for the serial it names only: a later block in
        // the slot comes with a meta word of its own.
        for record in self.records.first(count) {
            let addr = record.addr.load(Ordering::Acquire);
            let meta = record.meta.load(Ordering::Relaxed);
            if addr & RELEASED == 0 && meta & RELEASED_ELSEWHERE == 0 {
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
                .wrapping_sub(self.base.load(Ordering::Relaxed).addr());
            start.wrapping_add(granules(Record::requested(r.meta.load(Ordering::Relaxed))))
        });
        let peak = self
            .peak
            .load(Ordering::Relaxed)
            .max(top.min(self.len.load(Ordering::Relaxed)));
        let max_peak = self.max_peak.load(Ordering::Relaxed).max(peak);
        let seen = self.claim.load(Ordering::Acquire);
        if seen != epoch {
            // A reset took the blocks back; its owner has not rewound yet (or a trim took its
            // chunk).
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

    /// A release from another thread that looked its block up before a reset and marks it
    /// after the owner rewound and handed the same slot (and address) to a later block: the
    /// mark names the first block's serial, so it must not land, and the later block stays
    /// live (else an exited owner's cache would look empty and its chunk would go to the pool
    /// under a live block).
    #[test]
    fn a_stale_mark_never_lands_on_a_later_block() {
        let f = Fixture::new();
        let sh = &f.cell.shared;
        let b1 = f.bump(256);
        let stale = sh.look_up(b1).expect("b1 is live");
        // A reset; the owner rewinds and bumps the next block into the same slot.
        assert_eq!(f.owner().rewind(sh, 1, false), None);
        let b2 = f.bump(256);
        assert_eq!(b1, b2, "the later block reuses the slot and the address");
        assert!(!sh.mark(stale), "the slot holds another serial now");
        assert_eq!(sh.figures(1).live_blocks, 1);
        f.owner().apply_marks(sh);
        assert_eq!(sh.figures(1).live_blocks, 1);
        assert!(
            f.owner().release(sh, b2),
            "b2 is still live, its own to release"
        );
        assert_eq!(sh.figures(1).live_blocks, 0);
    }

    /// The live mark of the same scenario, for contrast: made before any reset, it counts at
    /// once, a second release of the block is refused, and the owner applies it.
    #[test]
    fn a_mark_counts_while_its_block_is_live() {
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
        let gate_open = |f: &Fixture| {
            // SAFETY: one thread, the owner; no other borrow of the arena is alive.
            unsafe { f.cell.open(0) }.is_some()
        };
        assert!(
            !gate_open(&f),
            "the gate is closed until the owner applies the mark"
        );
        f.owner().apply_marks(sh);
        assert!(gate_open(&f));
        assert_eq!(sh.figures(0).live_blocks, 1);
        assert!(
            !f.owner().release(sh, b1),
            "already released by the other thread"
        );
    }

    /// Another thread finds every live block by its address, whatever was released around it
    /// (the binary search over the records), and nothing else: not a released block, not an
    /// address inside a block.
    #[test]
    fn another_thread_finds_each_live_block_and_nothing_else() {
        let f = Fixture::new();
        let sh = &f.cell.shared;
        let epoch = AtomicUsize::new(0);
        let blocks: Vec<usize> = (1..=40).map(|i| f.bump(64 * (i % 5 + 1))).collect();
        // Release every third below the top on the owner's thread.
        for &b in blocks.iter().step_by(3).filter(|&&b| b != blocks[39]) {
            assert!(f.owner().release(sh, b));
        }
        for (i, &b) in blocks.iter().enumerate() {
            assert!(!sh.release_foreign(&epoch, b + 8), "inside block {i}");
            let live = i % 3 != 0 || i == 39;
            assert_eq!(sh.release_foreign(&epoch, b), live, "block {i}");
        }
        assert_eq!(sh.figures(0).live_blocks, 0);
        f.owner().apply_marks(sh);
        assert!(f.owner().is_empty(sh), "every record popped");
    }

    /// A trim takes the chunk only of an arena strictly behind the allocator's epoch, and
    /// then the owner's rewind lets go of it; an arena that rewound first keeps it.
    #[test]
    fn a_trim_revokes_only_an_arena_behind_and_the_owner_lets_go() {
        let f = Fixture::new();
        let sh = &f.cell.shared;
        let epoch = AtomicUsize::new(0);
        f.bump(256);
        assert!(!sh.revoke(&epoch), "the arena is current");
        epoch.store(1, Ordering::Release);
        // The owner rewinds first: its claim moves on and the trim's CAS has nothing to take.
        assert_eq!(f.owner().rewind(sh, 1, false), None);
        assert!(!sh.revoke(&epoch));
        assert!(f.owner().has_chunk(sh));
        // Behind again: the trim wins, and the rewind gives the chunk up.
        epoch.store(2, Ordering::Release);
        assert!(sh.revoke(&epoch));
        assert!(!sh.revoke(&epoch), "revoked once");
        assert_eq!(
            sh.figures(2),
            ArenaFigures {
                max_peak: 256,
                hits: 1,
                ..Default::default()
            }
        );
        assert_eq!(f.owner().rewind(sh, 2, false), Some(MIN_CHUNK));
        assert!(!f.owner().has_chunk(sh));
        assert_eq!(sh.claim.load(Ordering::Relaxed), 2);
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
