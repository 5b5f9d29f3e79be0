//! The sources' registry and what they count: counters add up and subtract, names are unique,
//! arenas, buffers, caches and block allocators count their system allocations; a block
//! allocator's worker gives every block back.

use std::cell::Cell;
use std::ptr::NonNull;
use std::rc::Rc;

use allocbench::source::{
    find, AllocError, Block, BlockWorker, Call, Counters, PerBlock, ScratchWorker, SourceConfig,
    TempAllocator, TempReset, SOURCES,
};

#[test]
fn counters_add_and_since() {
    let a = Counters {
        system_allocs: Some(5),
        peak_live: Some(10),
        ..Counters::default()
    };
    let b = Counters {
        system_allocs: Some(2),
        misses: Some(1),
        ..Counters::default()
    };
    let s = a.plus(b);
    assert_eq!(s.system_allocs, Some(7));
    assert_eq!(s.misses, Some(1));
    assert_eq!(s.since(b).system_allocs, Some(5));
    assert_eq!((s.peak_live, s.since(b).peak_live), (Some(10), Some(10)));
    assert_eq!(s.peak_reserved, None);
    assert_eq!(
        Counters::default().plus(Counters::default()),
        Counters::default()
    );
}

#[test]
fn arenas_and_block_sources_count_their_system_allocations() {
    let mut blocks = [Block::EMPTY; 2];
    for name in ["system", "fresh-pages", "bumpalo", "static", "exact-cache"] {
        let source = (find(name).unwrap().build)(&SourceConfig::default());
        let mut w = source.worker();
        for _ in 0..2 {
            w.call(Call {
                sizes: &[1 << 20, 3 << 20],
                align: 64,
                blocks: &mut blocks,
                kernel: &mut |_| {},
            })
            .unwrap();
        }
        let n = w.counters().plus(source.counters()).system_allocs.unwrap();
        let expect = match name {
            "system" | "fresh-pages" => 4..=4,
            // Buffers and caches allocate once per block; an arena grows chunk by chunk
            // and may need a new one on the second call (the reset keeps only the last).
            "bumpalo" => 1..=4,
            _ => 2..=2,
        };
        assert!(expect.contains(&n), "{name}: {n} system allocations");
        if name == "static" {
            // Its buffers: what the floor holds.
            assert_eq!(w.counters().peak_reserved, Some(4 << 20));
        }
    }
}

#[test]
fn registry_names_are_unique_and_findable() {
    for (i, k) in SOURCES.iter().enumerate() {
        assert!(SOURCES[..i].iter().all(|o| o.name != k.name), "{}", k.name);
        assert_eq!(find(k.name).map(|f| f.name), Some(k.name));
    }
    assert!(find("nonesuch").is_none());
}

/// A [`PerBlock`] over the system allocator that fails the take after `fail_after`
/// successful ones and counts what is out; the test keeps both cells to watch and steer it.
struct Flaky {
    out: Rc<Cell<isize>>,
    fail_after: Rc<Cell<usize>>,
}

impl PerBlock for Flaky {
    type Held = (NonNull<u8>, std::alloc::Layout);

    fn take(&self, size: usize, align: usize) -> Result<(NonNull<u8>, Self::Held), AllocError> {
        let left = self.fail_after.get();
        if left == 0 {
            return Err(AllocError::OutOfMemory { size, align });
        }
        self.fail_after.set(left - 1);
        let layout = std::alloc::Layout::from_size_align(size, align).unwrap();
        // SAFETY: size > 0 (PerBlock's contract).
        let p = NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap();
        self.out.set(self.out.get() + 1);
        Ok((p, (p, layout)))
    }

    unsafe fn give_back(&self, (p, layout): Self::Held) {
        self.out.set(self.out.get() - 1);
        // SAFETY: allocated above with this layout, given back once.
        unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
    }
}

#[test]
fn a_block_worker_gives_every_block_back() {
    let (out, fail_after) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(usize::MAX)));
    let flaky = || Flaky {
        out: out.clone(),
        fail_after: fail_after.clone(),
    };
    let mut w = BlockWorker::new(flaky());
    let mut blocks = [Block::EMPTY; 3];
    let mut seen = 0;
    w.call(Call {
        sizes: &[64, 0, 4096],
        align: 64,
        blocks: &mut blocks,
        kernel: &mut |b| {
            seen = b.len();
            assert_eq!(b[1].len, 0);
        },
    })
    .unwrap();
    assert_eq!((seen, out.get()), (3, 0));
    // Through TempAllocator: live until reset, and a call in between keeps them.
    let p = w.allocate(100, 128).unwrap();
    assert_eq!(p.as_ptr() as usize % 128, 0);
    w.call(Call {
        sizes: &[64],
        align: 64,
        blocks: &mut blocks,
        kernel: &mut |_| {},
    })
    .unwrap();
    assert_eq!(out.get(), 1);
    // SAFETY: `p` is not used again.
    unsafe { w.reset_unchecked() };
    assert_eq!(out.get(), 0);
    // A failed take gives back what the call took, and the kernel does not run.
    fail_after.set(1);
    let r = w.call(Call {
        sizes: &[64, 64],
        align: 64,
        blocks: &mut blocks,
        kernel: &mut |_| panic!("kernel ran"),
    });
    assert!(matches!(r, Err(AllocError::OutOfMemory { .. })));
    assert_eq!(out.get(), 0);
    // Dropping the worker gives back what is still live.
    fail_after.set(usize::MAX);
    let w = BlockWorker::new(flaky());
    w.allocate(64, 64).unwrap();
    assert!(w.allocate(64, 48).is_err(), "alignment 48 accepted");
    assert_eq!(out.get(), 1);
    drop(w);
    assert_eq!(out.get(), 0);
}
