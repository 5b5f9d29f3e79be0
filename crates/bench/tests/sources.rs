//! The sources' registry and what they count: counters add up and subtract, names are unique,
//! arenas, buffers, caches and block allocators count their system allocations.

use allocbench::source::{find, Block, Call, Counters, SourceConfig, SOURCES};

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
