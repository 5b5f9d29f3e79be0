//! Which SIMD kernel set a call uses, and the caps that force a lower one (so each level can be
//! tested on a machine that has a higher one).
//!
//! The levels and their detection are `kernel_simd`'s ([`SimdLevel`] is [`kernel_simd::Level`]).
//! The level of a call is the best level this CPU runs, lowered by three caps, the lowest of
//! which wins: the `SDPA_MAX_SIMD` environment variable (read once, on first use:
//! `portable`, `avx2`, `avx512`, `neon`; an unknown value is ignored), [`set_max_simd`]
//! (process-wide) and [`with_max_simd`] (the calling thread, for the duration of a closure:
//! calls made inside it pick their kernels on the calling thread, so rayon workers follow the
//! cap too).

use core::cell::Cell;
use core::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// A kernel set: one per instruction-set level of `kernel_simd`. On the AVX-512 level the
/// generic kernels run at 16 lanes (the integer ones at 32 per `vpmaddwd`) and the x86 kernels
/// that are not generic are the AVX2 ones.
pub use kernel_simd::Level as SimdLevel;

/// No cap.
const UNCAPPED: u8 = u8::MAX;
static GLOBAL_CAP: AtomicU8 = AtomicU8::new(UNCAPPED);

thread_local! {
    static THREAD_CAP: Cell<u8> = const { Cell::new(UNCAPPED) };
}

fn env_cap() -> u8 {
    static ENV: OnceLock<u8> = OnceLock::new();
    *ENV.get_or_init(|| {
        std::env::var("SDPA_MAX_SIMD")
            .ok()
            .and_then(|s| SimdLevel::parse(&s))
            .map_or(UNCAPPED, SimdLevel::rank)
    })
}

/// The SIMD levels this CPU can run, best first (always ends with `Portable`).
pub fn available_simd_levels() -> Vec<SimdLevel> {
    kernel_simd::available_levels()
}

/// The level a call made now on this thread uses: the best available one within the caps.
/// Allocation-free (called on every attention call; the feature-detection macros cache
/// their answer).
pub fn simd_level() -> SimdLevel {
    let cap = env_cap()
        .min(GLOBAL_CAP.load(Ordering::Relaxed))
        .min(THREAD_CAP.with(Cell::get));
    kernel_simd::best_within(cap)
}

/// Caps the level of every later call in the process (`None` removes this cap; the
/// environment variable and [`with_max_simd`] still apply).
pub fn set_max_simd(level: Option<SimdLevel>) {
    GLOBAL_CAP.store(level.map_or(UNCAPPED, SimdLevel::rank), Ordering::Relaxed);
}

/// Runs `f` with calls made on this thread capped at `level` (the other caps still apply),
/// restoring the previous thread cap afterwards, also if `f` panics.
pub fn with_max_simd<R>(level: SimdLevel, f: impl FnOnce() -> R) -> R {
    struct Restore(u8);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_CAP.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(THREAD_CAP.with(|c| c.replace(level.rank())));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nested thread caps: the inner, lower one wins while it lasts, and the outer one is
    /// back afterwards.
    #[test]
    fn thread_caps_nest() {
        for level in available_simd_levels() {
            with_max_simd(level, || {
                with_max_simd(SimdLevel::Portable, || {
                    assert_eq!(simd_level(), SimdLevel::Portable)
                });
                if std::env::var_os("SDPA_MAX_SIMD").is_none() {
                    assert_eq!(simd_level(), level);
                }
            });
        }
    }
}
