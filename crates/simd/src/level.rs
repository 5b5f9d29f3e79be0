//! Which ISA a kernel runs on: the [`Level`]s, run-time detection and the environment cap.

use std::sync::OnceLock;

/// An instruction-set level a kernel can be instantiated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Level {
    /// Plain Rust, any CPU ([`crate::Portable`]).
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512F + AVX-512BW, with AVX2 + FMA + F16C.
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl Level {
    /// Rank for capping: portable 0, AVX2 and NEON 1, AVX-512 2.
    pub fn rank(self) -> u8 {
        match self {
            Level::Portable => 0,
            Level::Avx2 | Level::Neon => 1,
            Level::Avx512 => 2,
        }
    }

    /// The name [`Level::parse`] reads: `portable`, `avx2`, `avx512`, `neon`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Neon => "neon",
        }
    }

    /// Parses a name as [`Level::name`] prints it (case-insensitive, `scalar` for
    /// `portable`); `None` for anything else.
    pub fn parse(s: &str) -> Option<Level> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "scalar" => Some(Level::Portable),
            "avx2" => Some(Level::Avx2),
            "avx512" => Some(Level::Avx512),
            "neon" => Some(Level::Neon),
            _ => None,
        }
    }

    /// Lanes of an f32 vector at this level (`Simd::LANES` of its token), for layouts chosen
    /// before a kernel is dispatched (a block of `2 * lanes` elements, say).
    pub fn lanes(self) -> usize {
        match self {
            Level::Portable | Level::Neon => 4,
            Level::Avx2 => 8,
            Level::Avx512 => 16,
        }
    }

    /// Whether this CPU runs this level (a kernel instantiated for it may be called).
    pub fn is_available(self) -> bool {
        match self {
            Level::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => {
                std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => {
                Level::Avx2.is_available()
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "aarch64")]
            Level::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)] // every arm is reachable on some target
            _ => false,
        }
    }
}

impl core::fmt::Display for Level {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The rank cap set by the `KERNEL_SIMD_MAX` environment variable (read once, on first
/// use), or `u8::MAX` when it is unset or names no level.
pub fn env_cap() -> u8 {
    static CAP: OnceLock<u8> = OnceLock::new();
    *CAP.get_or_init(|| {
        std::env::var("KERNEL_SIMD_MAX")
            .ok()
            .and_then(|s| Level::parse(&s))
            .map_or(u8::MAX, Level::rank)
    })
}

/// The best level this CPU runs whose rank is at most `cap` (ignores the environment).
/// Allocation-free: the feature-detection macros cache their answers.
pub fn best_within(cap: u8) -> Level {
    [Level::Avx512, Level::Avx2, Level::Neon]
        .into_iter()
        .find(|l| l.rank() <= cap && l.is_available())
        .unwrap_or(Level::Portable)
}

/// The best level this CPU runs within the `KERNEL_SIMD_MAX` cap.
pub fn detect() -> Level {
    best_within(env_cap())
}

/// Every level this CPU runs, best first (the last is always [`Level::Portable`]; ignores
/// the environment).
pub fn available_levels() -> Vec<Level> {
    let mut v = Vec::new();
    let mut cap = u8::MAX;
    loop {
        let l = best_within(cap);
        v.push(l);
        if l == Level::Portable {
            return v;
        }
        cap = l.rank() - 1;
    }
}
