//! The accounting every test with a counting backing allocator checks: what the system holds
//! for the allocator is exactly its live + cached bytes, block for block, within the cap; and
//! the states a reset and a drop must leave.
#![allow(dead_code)] // each includer uses a part

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

/// Asserts nothing is live (after a reset, or once every block was released): no block, arena
/// block, byte or requested byte.
pub fn assert_nothing_live(stats: &Stats, ctx: &str) {
    let live = (
        stats.live_blocks,
        stats.arena_live_blocks,
        stats.live_bytes,
        stats.requested_bytes,
    );
    assert_eq!(live, (0, 0, 0, 0), "{ctx}: something is live: {stats:?}");
}

/// Asserts the backing allocator got back every byte and block it handed out (after the
/// allocator was dropped): `held_bytes` and `held_blocks` are what it still counts.
pub fn assert_all_given_back(held_bytes: usize, held_blocks: usize, ctx: &str) {
    assert_eq!(
        (held_bytes, held_blocks),
        (0, 0),
        "{ctx}: bytes and blocks not given back at drop"
    );
}
