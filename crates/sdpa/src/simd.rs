//! Which SIMD kernel set a call uses, and the caps that force a lower one (so each level can be
//! tested on a machine that has a higher one).
//!
//! The level of a call is the best level this CPU runs, lowered by three caps, the lowest of
//! which wins: the `SDPA_MAX_SIMD` environment variable (read once, on first use:
//! `portable`, `avx2`, `avx512`, `neon`; an unknown value is ignored), [`set_max_simd`]
//! (process-wide) and [`with_max_simd`] (the calling thread, for the duration of a closure:
//! calls made inside it pick their kernels on the calling thread, so rayon workers follow the
//! cap too).

use core::cell::Cell;
use core::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// A kernel set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SimdLevel {
    /// Portable scalar kernels (any CPU).
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512F + AVX-512BW (with AVX2 + FMA + F16C): 16-lane micro-kernels, softmax,
    /// conversions and decode row kernels, and the int8 cache's integer scores and `P . V`;
    /// the other kernels are the AVX2 ones.
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl SimdLevel {
    /// Rank for capping: portable 0, the 256-bit (or 128-bit NEON) ISA 1, AVX-512 2.
    fn rank(self) -> u8 {
        match self {
            SimdLevel::Portable => 0,
            SimdLevel::Avx2 | SimdLevel::Neon => 1,
            SimdLevel::Avx512 => 2,
        }
    }

    /// The `kernel_simd` level whose kernels this set instantiates.
    fn layer_level(self) -> kernel_simd::Level {
        match self {
            SimdLevel::Portable => kernel_simd::Level::Portable,
            SimdLevel::Avx2 => kernel_simd::Level::Avx2,
            SimdLevel::Avx512 => kernel_simd::Level::Avx512,
            SimdLevel::Neon => kernel_simd::Level::Neon,
        }
    }

    /// The name used by `SDPA_MAX_SIMD` and reports.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Portable => "portable",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
        }
    }

    /// Parses a name as [`SimdLevel::name`] prints it (case-insensitive).
    pub fn parse(s: &str) -> Option<SimdLevel> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "scalar" => Some(SimdLevel::Portable),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            "neon" => Some(SimdLevel::Neon),
            _ => None,
        }
    }
}

impl core::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

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

/// The best level this CPU runs whose rank is at most `cap` (detection is
/// `kernel_simd::Level::is_available`, the one place it is done). Allocation-free (called on
/// every attention call; the feature-detection macros cache their answer).
fn best_within(cap: u8) -> SimdLevel {
    [SimdLevel::Avx512, SimdLevel::Avx2, SimdLevel::Neon]
        .into_iter()
        .find(|l| l.rank() <= cap && l.layer_level().is_available())
        .unwrap_or(SimdLevel::Portable)
}

/// The SIMD levels this CPU can run, best first (always ends with `Portable`).
pub fn available_simd_levels() -> Vec<SimdLevel> {
    let mut v = Vec::new();
    let mut cap = UNCAPPED;
    loop {
        let l = best_within(cap);
        v.push(l);
        if l == SimdLevel::Portable {
            return v;
        }
        cap = l.rank() - 1;
    }
}

/// The level a call made now on this thread uses: the best available one within the caps.
pub fn simd_level() -> SimdLevel {
    let cap = env_cap()
        .min(GLOBAL_CAP.load(Ordering::Relaxed))
        .min(THREAD_CAP.with(Cell::get));
    best_within(cap)
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

    #[test]
    fn levels_and_caps() {
        let levels = available_simd_levels();
        println!("available SIMD levels: {levels:?}");
        assert_eq!(levels.last(), Some(&SimdLevel::Portable));
        #[cfg(target_arch = "aarch64")]
        assert!(
            levels.contains(&SimdLevel::Neon),
            "no NEON: an aarch64 run would test only the portable kernels"
        );
        for &level in &levels {
            assert_eq!(SimdLevel::parse(level.name()), Some(level));
            with_max_simd(level, || {
                // Nested caps: the inner, lower one wins while it lasts.
                with_max_simd(SimdLevel::Portable, || {
                    assert_eq!(simd_level(), SimdLevel::Portable)
                });
                if std::env::var_os("SDPA_MAX_SIMD").is_none() {
                    assert_eq!(simd_level(), level);
                }
            });
        }
        assert_eq!(SimdLevel::parse("avx9"), None);
        assert_eq!(SimdLevel::parse(" AVX512"), Some(SimdLevel::Avx512));
    }
}
