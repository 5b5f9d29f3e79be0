//! The one error type of the crate.

use core::fmt;

/// Why an allocator call failed.
///
/// Every variant carries the values involved, and its `Display` text says what went wrong and
/// what to do about it. A call that returns an error leaves the allocator's state as it was
/// (except [`AllocError::Corrupted`], where the overrun block is given back to the system).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// The alignment is 0, not a power of two, or larger than [`MAX_ALIGN`](crate::MAX_ALIGN).
    InvalidAlignment {
        /// The alignment that was asked for.
        align: usize,
    },
    /// The size, once rounded up to its size class (plus the debug canary, if on), does not fit
    /// in `isize::MAX` bytes, or `len * size_of::<T>()` overflowed.
    SizeOverflow {
        /// The size that was asked for (for slices: the element count).
        size: usize,
        /// The alignment that was asked for.
        align: usize,
    },
    /// Serving the request would push live + cached bytes over the configured `limit_bytes`,
    /// even after every idle cached block was given back to the system.
    LimitExceeded {
        /// The size that was asked for.
        size: usize,
        /// The bytes the request would take from the system (its class size).
        class_size: usize,
        /// The configured limit on live + cached bytes.
        limit: usize,
        /// The bytes taken from the system when the request was refused (live and cached).
        reserved: usize,
    },
    /// The system allocator refused the memory, even after the idle cache was given back and
    /// the request retried once.
    OutOfMemory {
        /// The size that was asked for.
        size: usize,
        /// The alignment that was asked for.
        align: usize,
    },
    /// `release` was given a pointer that is not live in this allocator: it was never handed
    /// out by it, was already released, belongs to a `Scope`, or was returned by a `reset`.
    UnknownPointer {
        /// The address that was passed.
        addr: usize,
    },
    /// Debug checks found the canary behind a block overwritten: something wrote past the end
    /// of the requested size. The block was given back to the system, never to be reused.
    Corrupted {
        /// The block's address.
        addr: usize,
        /// The size that was requested for it.
        requested: usize,
        /// The size of its class.
        class_size: usize,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AllocError::InvalidAlignment { align } => write!(
                f,
                "invalid alignment {align}: pass a power of two from 1 to {} bytes",
                crate::MAX_ALIGN
            ),
            AllocError::SizeOverflow { size, align } => write!(
                f,
                "size {size} (alignment {align}) overflows once rounded to its size class: \
                 ask for less than isize::MAX bytes"
            ),
            AllocError::LimitExceeded {
                size,
                class_size,
                limit,
                reserved,
            } => write!(
                f,
                "allocating {size} bytes (class {class_size}) would exceed limit_bytes {limit} \
                 ({reserved} bytes held, live or cached, and the idle ones could not make \
                 room): release or reset blocks first, or raise Config::limit_bytes"
            ),
            AllocError::OutOfMemory { size, align } => write!(
                f,
                "the system allocator refused {size} bytes (alignment {align}) even after the \
                 idle cache was freed: the machine is out of memory; free memory elsewhere or \
                 lower the working set"
            ),
            AllocError::UnknownPointer { addr } => write!(
                f,
                "pointer {addr:#x} is not live in this allocator (never handed out by it, \
                 already released, owned by a Scope, or returned by reset): release each \
                 pointer from `allocate` exactly once, to the allocator that gave it"
            ),
            AllocError::Corrupted {
                addr,
                requested,
                class_size,
            } => write!(
                f,
                "block {addr:#x} was written past its requested {requested} bytes (class \
                 {class_size}): the debug canary is overwritten; the block was given back to \
                 the system. Find the out-of-bounds write in the code that used it"
            ),
        }
    }
}

impl std::error::Error for AllocError {}
