//! Debug checks: poison on hand-out, a canary behind the requested end.

use core::ptr::NonNull;

/// Bytes of canary behind every block's requested end when debug checks are on.
pub(crate) const CANARY_LEN: usize = 16;
const CANARY: [u8; CANARY_LEN] =
    *b"\xCA\xFE\xF0\x0D\xDE\xAD\xBE\xEF\xCA\xFE\xF0\x0D\xDE\xAD\xBE\xEF";
/// What handed-out memory is filled with: all-ones bytes are a NaN in f32 and f64.
pub(crate) const POISON: u8 = 0xFF;

/// Fills `requested` bytes with [`POISON`] and writes the canary right behind them.
///
/// # Safety
/// `ptr` is valid for writes of `requested + CANARY_LEN` bytes and nobody else uses them.
pub(crate) unsafe fn poison(ptr: NonNull<u8>, requested: usize) {
    // SAFETY: the caller gives us `requested + CANARY_LEN` writable bytes.
    unsafe {
        ptr.as_ptr().write_bytes(POISON, requested);
        ptr.as_ptr()
            .add(requested)
            .copy_from_nonoverlapping(CANARY.as_ptr(), CANARY_LEN);
    }
}

/// Whether the canary behind `requested` bytes is as [`poison`] wrote it.
///
/// # Safety
/// `ptr` is valid for reads of `requested + CANARY_LEN` bytes, all initialised by [`poison`]
/// or by the block's user, and nobody writes them meanwhile.
pub(crate) unsafe fn canary_intact(ptr: NonNull<u8>, requested: usize) -> bool {
    // SAFETY: the caller gives us `requested + CANARY_LEN` readable, initialised bytes.
    let canary = unsafe { core::slice::from_raw_parts(ptr.as_ptr().add(requested), CANARY_LEN) };
    canary == CANARY
}
