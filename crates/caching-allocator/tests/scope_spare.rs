//! The spare scope chunk: a thread keeps the first chunk of a dropped scope and lends it to its
//! next scope without the cache's lock. These tests pin what that must keep true: the books
//! (live while lent, idle otherwise), one holder at a time, the cap, and reclaiming it.

use caching_allocator::{CachingAllocator, Config, Stats};

/// The chunk size every test here uses (the default).
const CHUNK: usize = caching_allocator::DEFAULT_SCOPE_CHUNK_BYTES;

fn system_blocks(s: &Stats) -> u64 {
    s.system_allocs - s.system_frees
}

/// An allocator (arena off, so only scopes hold blocks) after two scope trips: the first
/// chunk went idle (the cache's credit grew to hold it), the second is the thread's spare.
fn warmed() -> CachingAllocator {
    let alloc = CachingAllocator::with_config(Config::default().arena_max_bytes(0));
    for _ in 0..2 {
        let scope = alloc.scope();
        scope.alloc_slice_fill(16, 0u8).unwrap();
    }
    alloc
}

#[test]
fn a_scope_borrows_the_spare_and_the_books_show_it_live_until_the_scope_drops() {
    let alloc = warmed();
    let idle = alloc.stats();
    assert_eq!((idle.live_blocks, idle.cached_blocks), (0, 1), "{idle}");
    assert_eq!(idle.cached_bytes, CHUNK, "{idle}");
    let scope = alloc.scope();
    let xs = scope.alloc_slice_fill(1024, 7u32).unwrap();
    let lent = alloc.stats();
    assert_eq!((lent.live_blocks, lent.cached_blocks), (1, 0), "{lent}");
    assert_eq!((lent.live_bytes, lent.cached_bytes), (CHUNK, 0), "{lent}");
    assert_eq!(lent.hits, idle.hits + 1, "a lend is a cache hit");
    assert!(xs.iter().all(|&x| x == 7));
    drop(scope);
    let back = alloc.stats();
    assert_eq!((back.live_blocks, back.cached_blocks), (0, 1), "{back}");
    assert_eq!(system_blocks(&back), 1, "one chunk, reused: {back}");
}

#[test]
fn a_nested_scope_gets_a_chunk_of_its_own_while_the_spare_is_lent() {
    let alloc = warmed();
    let outer = alloc.scope();
    let a = outer.alloc_slice_fill(1000, 1u32).unwrap();
    {
        let inner = alloc.scope();
        let b = inner.alloc_slice_fill(1000, 2u32).unwrap();
        // Two holders, two chunks: the inner scope's writes must not reach the outer's slice.
        let (a_range, b_range) = (a.as_ptr_range(), b.as_ptr_range());
        assert!(a_range.end <= b_range.start || b_range.end <= a_range.start);
        b.fill(9);
        assert_eq!(alloc.stats().live_blocks, 2);
    }
    assert!(
        a.iter().all(|&x| x == 1),
        "the inner scope wrote over the outer's slice"
    );
    drop(outer);
    let s = alloc.stats();
    assert_eq!(s.live_blocks, 0, "{s}");
    assert_eq!(
        s.cached_blocks, 2,
        "the spare and the inner scope's chunk: {s}"
    );
}

#[test]
fn scope_trips_after_the_first_make_no_system_allocation() {
    let alloc = CachingAllocator::new(1 << 20);
    for _ in 0..3 {
        let scope = alloc.scope();
        scope.alloc_slice_fill(4096, 1u8).unwrap();
    }
    let warm = alloc.stats();
    let trips: u8 = if cfg!(miri) { 10 } else { 100 };
    for i in 0..trips {
        let scope = alloc.scope();
        let xs = scope.alloc_slice_fill(4096, i).unwrap();
        assert!(xs.iter().all(|&x| x == i));
    }
    let s = alloc.stats();
    assert_eq!(s.system_allocs, warm.system_allocs, "{s}");
    assert_eq!(s.hits, warm.hits + u64::from(trips), "{s}");
    assert_eq!(s.live_blocks, 0, "{s}");
}

#[test]
fn free_cached_gives_the_idle_spare_back_but_not_a_lent_one() {
    let alloc = warmed();
    {
        let scope = alloc.scope();
        let xs = scope.alloc_slice_fill(64, 3u8).unwrap();
        alloc.free_cached();
        let s = alloc.stats();
        assert_eq!((s.live_blocks, s.reserved_bytes), (1, CHUNK), "{s}");
        assert!(
            xs.iter().all(|&x| x == 3),
            "a trim took the chunk a scope holds"
        );
    }
    alloc.free_cached();
    let s = alloc.stats();
    assert_eq!((s.reserved_bytes, s.cached_blocks), (0, 0), "{s}");
    assert_eq!(system_blocks(&s), 0, "{s}");
}

#[test]
fn the_spare_is_held_within_the_cap() {
    // A cap smaller than one chunk: no spare can be kept, every chunk goes back.
    let cap = CHUNK / 2;
    let alloc =
        CachingAllocator::with_config(Config::default().max_cached_bytes(cap).arena_max_bytes(0));
    for _ in 0..3 {
        let scope = alloc.scope();
        scope.alloc_slice_fill(64, 0u8).unwrap();
    }
    let s = alloc.stats();
    assert!(s.cached_bytes <= cap, "{s}");
    assert_eq!(s.reserved_bytes, s.cached_bytes, "{s}");
}

#[test]
fn scopes_on_many_threads_each_keep_their_own_spare() {
    let alloc = CachingAllocator::with_config(Config::default().arena_max_bytes(0));
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let alloc = &alloc;
            s.spawn(move || {
                // Fewer rounds under Miri, which runs each one a thousand times slower.
                let rounds = if cfg!(miri) { 20 } else { 200 };
                for i in 0..rounds {
                    let scope = alloc.scope();
                    let xs = scope.alloc_slice_fill(256, t * 1000 + i).unwrap();
                    std::thread::yield_now();
                    assert!(
                        xs.iter().all(|&x| x == t * 1000 + i),
                        "another thread wrote here"
                    );
                }
            });
        }
    });
    let s = alloc.stats();
    assert_eq!(s.live_blocks, 0, "{s}");
    assert!(system_blocks(&s) <= 4 * 2, "{s}");
}
