//! The accounting every test with a counting backing allocator checks: what the system holds
//! for the allocator is exactly its live + cached bytes, block for block, within the cap.

use caching_allocator::Stats;

/// Asserts the books balance. `held_bytes` and `held_blocks` are what the backing allocator
/// counted as handed out and not given back; `ctx` names the moment in failure messages.
pub fn assert_books_balance(
    stats: &Stats,
    held_bytes: usize,
    held_blocks: usize,
    cap: usize,
    ctx: &str,
) {
    assert_eq!(
        stats.reserved_bytes,
        stats.live_bytes + stats.cached_bytes,
        "{ctx}: {stats:?}"
    );
    assert_eq!(held_bytes, stats.reserved_bytes, "{ctx}: {stats:?}");
    assert_eq!(
        held_blocks as u64,
        stats.system_allocs - stats.system_frees,
        "{ctx}: {stats:?}"
    );
    // Arena blocks are parts of their chunks: the chunks are the system's blocks.
    assert_eq!(
        (stats.live_blocks - stats.arena_live_blocks + stats.cached_blocks + stats.arena_chunks)
            as u64,
        stats.system_allocs - stats.system_frees,
        "{ctx}: {stats:?}"
    );
    assert!(
        stats.cached_bytes <= cap,
        "{ctx}: cap {cap} broken: {stats:?}"
    );
}
