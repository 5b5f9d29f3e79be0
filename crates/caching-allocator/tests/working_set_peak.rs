//! Working-set retention keeps the peak of reserved bytes near the peak of live bytes when a
//! runtime's scratch grows class by class (a decode loop: the attention buffers grow with the
//! KV length every token), instead of holding the old block beside its replacement.

use caching_allocator::{CachingAllocator, Config, DEFAULT_WORKING_SET_SLACK};

#[test]
fn growing_scratch_never_holds_the_old_block_beside_its_replacement() {
    let mut alloc = CachingAllocator::with_config(
        Config::default()
            .max_cached_bytes(10 << 20)
            .working_set_slack(Some(DEFAULT_WORKING_SET_SLACK)),
    );
    // Two buffers per call, as allocbench's decode workload: a small one and one that grows
    // from 64 KiB to 2 MiB, crossing a size class every few tokens.
    for token in 1..=500usize {
        let small = 20 << 10;
        let large = (64 << 10) + token * 4000;
        alloc.allocate(small, 64).unwrap();
        alloc.allocate(large, 64).unwrap();
        alloc.reset();
    }
    let s = alloc.stats();
    let ratio = s.peak_reserved_bytes as f64 / s.peak_live_bytes as f64;
    assert!(
        ratio <= 1.3,
        "peak reserved {} B is {ratio:.2}x peak live {} B: {s}",
        s.peak_reserved_bytes,
        s.peak_live_bytes
    );
}
