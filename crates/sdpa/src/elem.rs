//! Element types of Q, K, V and the output: f32, bf16 and f16 (accumulation is always f32).
//!
//! bf16 and f16 are plain 16-bit newtypes with round-to-nearest-even conversions written out
//! here (the workspace has no `half` dependency, and two conversions do not justify one).

/// The storage type of Q, K, V and the output of a call. Non-exhaustive: more dtypes may come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dtype {
    /// IEEE single precision.
    F32,
    /// bfloat16: the top 16 bits of an f32.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

impl core::fmt::Display for Dtype {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        })
    }
}

/// A bfloat16 value (its bit pattern).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// An IEEE half-precision value (its bit pattern).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

impl Bf16 {
    /// Rounds to the nearest bf16 (ties to even); NaN stays NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if x.is_nan() {
            return Bf16(((b >> 16) as u16) | 0x0040);
        }
        let round = 0x7fff + ((b >> 16) & 1);
        Bf16((b.wrapping_add(round) >> 16) as u16)
    }

    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

impl F16 {
    /// Rounds to the nearest f16 (ties to even; overflow gives infinity, tiny values
    /// subnormals or zero); NaN stays NaN.
    pub fn from_f32(x: f32) -> F16 {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32;
        let man = b & 0x7f_ffff;
        if exp == 0xff {
            let nan = if man != 0 {
                0x200 | (man >> 13) as u16
            } else {
                0
            };
            return F16(sign | 0x7c00 | nan);
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return F16(sign | 0x7c00);
        }
        // (kept bits, dropped bits, number of dropped bits)
        let (kept, shift) = if e <= 0 {
            if e < -10 {
                return F16(sign);
            }
            // Subnormal: value = m * 2^-24 with m = full mantissa >> (14 - e).
            (man | 0x80_0000, (14 - e) as u32)
        } else {
            ((e as u32) << 23 | man, 13)
        };
        let mut r = kept >> shift;
        let rem = kept & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1; // a carry into the exponent is the right answer (up to infinity)
        }
        F16(sign | r as u16)
    }

    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x3ff;
        match exp {
            0 => {
                let v = man as f32 * f32::from_bits(0x3380_0000); // 2^-24
                if sign != 0 {
                    -v
                } else {
                    v
                }
            }
            0x1f => f32::from_bits(sign | 0x7f80_0000 | man << 13),
            _ => f32::from_bits(sign | (exp + 112) << 23 | man << 13),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::F16 {}
}

/// A slice of one of the element types, for dispatching to the conversion kernels.
#[doc(hidden)]
pub enum Elems<'a> {
    F32(&'a [f32]),
    Bf16(&'a [Bf16]),
    F16(&'a [F16]),
}

/// An element type of Q, K, V and the output: [`f32`], [`Bf16`] or [`F16`] (sealed).
pub trait Element: Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// Its [`Dtype`].
    const DTYPE: Dtype;
    /// Its value as f32 (exact).
    fn to_f32(self) -> f32;
    /// The nearest value to `x` (ties to even).
    fn from_f32(x: f32) -> Self;
    /// The slice as its concrete type (used internally to pick conversion kernels).
    #[doc(hidden)]
    fn elems(s: &[Self]) -> Elems<'_>;
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    fn elems(s: &[Self]) -> Elems<'_> {
        Elems::F32(s)
    }
}

/// The 16-bit float types: their own conversions, and their variant of [`Elems`] (named as
/// the type).
macro_rules! half_element {
    ($($t:ident),*) => {$(
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$t;
            fn to_f32(self) -> f32 {
                $t::to_f32(self)
            }
            fn from_f32(x: f32) -> Self {
                $t::from_f32(x)
            }
            fn elems(s: &[Self]) -> Elems<'_> {
                Elems::$t(s)
            }
        }
    )*};
}
half_element!(Bf16, F16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let x = F16(h).to_f32();
            if x.is_nan() {
                assert!(F16::from_f32(x).to_f32().is_nan());
            } else {
                assert_eq!(F16::from_f32(x), F16(h), "{h:#06x} -> {x}");
            }
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // Every pair of adjacent finite f16 values: the midpoint rounds to the even one, and
        // points a little either side round to the nearer one.
        for h in 0..0x7bffu16 {
            let (a, b) = (F16(h).to_f32() as f64, F16(h + 1).to_f32() as f64);
            let mid = ((a + b) / 2.0) as f32;
            let even = if h & 1 == 0 { h } else { h + 1 };
            assert_eq!(F16::from_f32(mid).0, even, "midpoint of {h:#06x}");
            let q = (b - a) / 4.0;
            assert_eq!(F16::from_f32((a + q) as f32).0, h);
            assert_eq!(F16::from_f32((b - q) as f32).0, h + 1);
        }
        assert_eq!(F16::from_f32(65520.0).0, 0x7c00, "overflow to infinity");
        assert_eq!(F16::from_f32(-1e-10).0, 0x8000, "underflow to -0");
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        for h in (0..0x7f7fu16).step_by(7) {
            let (a, b) = (Bf16(h).to_f32() as f64, Bf16(h + 1).to_f32() as f64);
            let mid = ((a + b) / 2.0) as f32;
            let even = if h & 1 == 0 { h } else { h + 1 };
            assert_eq!(Bf16::from_f32(mid).0, even, "midpoint of {h:#06x}");
            assert_eq!(Bf16::from_f32(Bf16(h).to_f32()).0, h);
        }
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    }
}
