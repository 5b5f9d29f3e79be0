//! What `ca_last_error` says about a core error, in C's words.
//!
//! The core's `AllocError` texts speak Rust (`Config::limit_bytes`, `Scope`); a C caller sets
//! `CaConfig` fields and calls `ca_*` functions, so every variant is written again here, with
//! addresses in hex and, for the limit, the live, cached and reserved bytes told apart.

use ca::{AllocError, CachingAllocator, MAX_ALIGN};

use crate::{CaStatus, Failure};

/// The failure a core error becomes for a C caller of `function` on `allocator`.
///
/// `allocator` is read only for [`AllocError::LimitExceeded`]: the core's error carries the
/// reserved bytes at the refusal, not how many of them were live, so the split comes from the
/// allocator's counters right after (a refused call changes nothing, so with one thread they
/// are the figures of the refusal; with others allocating, of a moment later).
pub(crate) fn failure(e: &AllocError, allocator: &CachingAllocator, function: &str) -> Failure {
    match *e {
        AllocError::InvalidAlignment { align } => {
            Failure::new(CaStatus::InvalidAlignment, invalid_alignment(align))
        }
        AllocError::SizeOverflow { size, align } => Failure::new(
            CaStatus::SizeOverflow,
            format!(
                "size {size} (alignment {align}) does not fit in PTRDIFF_MAX bytes once rounded \
                 up to its size class (and, with CaConfig.debug_checks, the canary): ask for \
                 less"
            ),
        ),
        AllocError::LimitExceeded {
            size,
            class_size,
            limit,
            reserved,
        } => {
            let stats = allocator.stats();
            Failure::new(
                CaStatus::LimitExceeded,
                limit_exceeded(LimitFigures {
                    size,
                    class_size,
                    limit,
                    reserved,
                    live: stats.live_bytes,
                    cached: stats.cached_bytes,
                }),
            )
        }
        AllocError::OutOfMemory { size, align } => Failure::new(
            CaStatus::OutOfMemory,
            format!(
                "the system allocator refused {size} bytes (alignment {align}), even after the \
                 idle cache was given back: the machine is out of memory; free memory elsewhere \
                 or ask for less"
            ),
        ),
        AllocError::UnknownPointer { addr } => Failure::new(
            CaStatus::UnknownPointer,
            format!(
                "pointer {addr:#x} is not live in this allocator (not returned by ca_allocate \
                 on this handle, already given back by ca_release, or taken back by ca_reset); \
                 nothing changed: pass each pointer from ca_allocate to ca_release once, on the \
                 handle that gave it"
            ),
        ),
        AllocError::Corrupted {
            addr,
            requested,
            class_size,
        } => {
            let rest = if function == "ca_reset" {
                "; every other block was still reset, and CaStats.corrupted_blocks counts every \
                 overrun block found"
            } else {
                ""
            };
            Failure::new(
                CaStatus::Corrupted,
                format!(
                    "block {addr:#x} was written past its requested {requested} bytes (size \
                     class {class_size}): the canary of CaConfig.debug_checks is overwritten, \
                     and the block went back to the system{rest}. Find the out-of-bounds write \
                     in the code that used the block"
                ),
            )
        }
        // A variant added to the core after this version of the C API.
        _ => Failure::new(
            CaStatus::Internal,
            format!("{e} (an error this version of the C API does not know: please report it)"),
        ),
    }
}

/// Claims no bound for an alignment that is not a power of two: the C++ adapter passes those
/// on to `ca_allocate` and serves every power of two, above `CA_MAX_ALIGN` included.
fn invalid_alignment(align: usize) -> String {
    if align.is_power_of_two() {
        format!(
            "alignment {align} is above CA_MAX_ALIGN ({MAX_ALIGN} bytes): ask for size + \
             alignment - CA_MAX_ALIGN bytes at CA_MAX_ALIGN and align the pointer up, as \
             ExecuTorchTempAllocator does"
        )
    } else {
        format!("alignment {align} is not a power of two: pass 1, 2, 4, 8, ... (alignof gives a type's)")
    }
}

/// The figures of a refusal at `CaConfig.limit_bytes`.
struct LimitFigures {
    size: usize,
    class_size: usize,
    limit: usize,
    /// Bytes taken from the system at the refusal (live + cached), from the core's error.
    reserved: usize,
    /// Bytes of live blocks, from the counters right after.
    live: usize,
    /// Bytes of idle cached blocks, from the counters right after.
    cached: usize,
}

fn limit_exceeded(f: LimitFigures) -> String {
    let LimitFigures {
        size,
        class_size,
        limit,
        reserved,
        live,
        cached,
    } = f;
    let head = format!(
        "allocating {size} bytes (size class {class_size}) would pass CaConfig.limit_bytes \
         ({limit}): {reserved} bytes were reserved from the system ({live} live in blocks \
         handed out, {cached} idle in the cache)"
    );
    if class_size > limit {
        format!("{head}; this size class alone is over the limit: raise CaConfig.limit_bytes to at least {class_size}, or ask for less")
    } else {
        format!(
            "{head}; idle blocks are given back by themselves, live ones are not: ca_release \
             or ca_reset blocks first, or raise CaConfig.limit_bytes"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_class_over_the_limit_says_to_raise_it_even_with_nothing_live() {
        let text = limit_exceeded(LimitFigures {
            size: 20_000,
            class_size: 20_480,
            limit: 16_384,
            reserved: 12_288,
            live: 0,
            cached: 12_288,
        });
        assert!(text.contains("12288 bytes were reserved from the system (0 live in blocks handed out, 12288 idle in the cache)"), "{text}");
        assert!(
            text.contains("raise CaConfig.limit_bytes to at least 20480"),
            "{text}"
        );
        assert!(
            !text.contains("ca_release"),
            "releasing cannot help: {text}"
        );
    }

    #[test]
    fn a_limit_full_of_live_blocks_says_to_release_them() {
        let text = limit_exceeded(LimitFigures {
            size: 4000,
            class_size: 4096,
            limit: 16_384,
            reserved: 16_384,
            live: 16_384,
            cached: 0,
        });
        assert!(
            text.contains("(16384 live in blocks handed out, 0 idle"),
            "{text}"
        );
        assert!(
            text.contains("ca_release or ca_reset blocks first"),
            "{text}"
        );
    }

    #[test]
    fn only_alignments_above_the_maximum_mention_it() {
        for align in [0, 3, 6, 12] {
            let text = invalid_alignment(align);
            assert!(text.contains("not a power of two"), "{text}");
            assert!(
                !text.contains("CA_MAX_ALIGN") && !text.contains("2097152"),
                "{text}"
            );
        }
        let text = invalid_alignment(4 << 20);
        assert!(
            text.contains("above CA_MAX_ALIGN (2097152 bytes)"),
            "{text}"
        );
    }
}
