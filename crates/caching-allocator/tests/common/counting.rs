//! The counting system allocator every test that watches the allocator's system traffic
//! plugs in (`Config::system_allocator`): what is held, what was freed, and refusals on
//! demand. Plain `std` atomics and locks: loom's models read the counts only after joining
//! every model thread.
#![allow(dead_code)] // each test uses the part it needs

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A system allocator that counts what it holds and has done, logs what it frees, and
/// refuses requests of `refuse_from` bytes or more (after waiting, boundedly, until
/// `rendezvous` of them are in flight at once, so concurrent refusals really overlap) or
/// every request while `fail_all` is set.
pub struct Counting {
    /// Bytes handed out and not given back.
    pub bytes: AtomicUsize,
    /// Blocks handed out and not given back.
    pub blocks: AtomicUsize,
    /// `alloc` calls served.
    pub allocs: AtomicUsize,
    /// `dealloc` calls.
    pub frees: AtomicUsize,
    /// Refuse every request while set.
    pub fail_all: AtomicBool,
    /// Refused requests that have arrived so far.
    pub arrived: AtomicUsize,
    freed: Mutex<Vec<usize>>,
    /// What is held now: each block's address and size.
    held_blocks: Mutex<BTreeMap<usize, usize>>,
    refuse_from: usize,
    rendezvous: usize,
}

impl Default for Counting {
    fn default() -> Self {
        Self::refusing(usize::MAX, 0)
    }
}

impl Counting {
    /// Counts and refuses nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Refuses requests of `refuse_from` bytes or more, each after `rendezvous` of them are
    /// in flight (or a bounded wait).
    pub fn refusing(refuse_from: usize, rendezvous: usize) -> Self {
        Counting {
            bytes: AtomicUsize::new(0),
            blocks: AtomicUsize::new(0),
            allocs: AtomicUsize::new(0),
            frees: AtomicUsize::new(0),
            fail_all: AtomicBool::new(false),
            arrived: AtomicUsize::new(0),
            freed: Mutex::new(Vec::new()),
            held_blocks: Mutex::new(BTreeMap::new()),
            refuse_from,
            rendezvous,
        }
    }

    /// (bytes, blocks) held now.
    pub fn held(&self) -> (usize, usize) {
        (self.bytes.load(SeqCst), self.blocks.load(SeqCst))
    }

    /// Whether the `len` bytes at `addr` lie inside one block this allocator holds now (so
    /// nothing gave that memory back to the system under whoever holds it).
    pub fn holds(&self, addr: usize, len: usize) -> bool {
        let held = self.held_blocks.lock().unwrap_or_else(|e| e.into_inner());
        held.range(..=addr)
            .next_back()
            .is_some_and(|(&base, &size)| addr + len <= base + size)
    }

    /// The addresses freed so far, in order.
    pub fn freed(&self) -> Vec<usize> {
        self.freed.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

// SAFETY: forwards to `System`, only counting, logging and refusing (which `GlobalAlloc`
// permits: a null return).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.fail_all.load(SeqCst) {
            return std::ptr::null_mut();
        }
        if layout.size() >= self.refuse_from {
            self.arrived.fetch_add(1, SeqCst);
            let start = Instant::now();
            let wait = Duration::from_millis(if cfg!(miri) { 50 } else { 500 });
            while self.arrived.load(SeqCst) < self.rendezvous && start.elapsed() < wait {
                std::thread::yield_now();
            }
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract is `System::alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            self.allocs.fetch_add(1, SeqCst);
            self.bytes.fetch_add(layout.size(), SeqCst);
            self.blocks.fetch_add(1, SeqCst);
            self.held_blocks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p as usize, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.frees.fetch_add(1, SeqCst);
        self.bytes.fetch_sub(layout.size(), SeqCst);
        self.blocks.fetch_sub(1, SeqCst);
        self.freed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ptr as usize);
        self.held_blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr as usize));
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}
