//! Scalar bf16 / f16 widening: the portable level's loads and every level's tails.

/// The f32 value of a bf16 bit pattern (exact: bf16 is the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The f32 value of an IEEE f16 bit pattern (exact, subnormals included; a NaN stays a NaN
/// with its payload shifted into place, quieted as the hardware conversions do).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = h & 0x3ff;
    match exp {
        0 => {
            // Zero or subnormal: man * 2^-24, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            if sign != 0 {
                -v
            } else {
                v
            }
        }
        0x1f if man != 0 => f32::from_bits(sign | 0x7fc0_0000 | man << 13),
        0x1f => f32::from_bits(sign | 0x7f80_0000),
        _ => f32::from_bits(sign | (exp + 112) << 23 | man << 13),
    }
}

/// `S::LANES` f16 bit patterns at `p` widened one by one: the x86 levels' `load_f16` under
/// Miri, which lacks `vcvtph2ps` (elsewhere they use the instruction).
///
/// # Safety
/// `p` is readable for `S::LANES` u16 (any alignment).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load_f16_lanes<S: crate::Simd>(s: S, p: *const u16) -> S::F32 {
    let mut f = [0f32; 64];
    for (i, x) in f.iter_mut().take(S::LANES).enumerate() {
        // SAFETY: `i < LANES`: readable (caller).
        *x = f16_to_f32(unsafe { p.add(i).read_unaligned() });
    }
    // SAFETY: `f` holds 64 >= LANES floats.
    unsafe { s.load(f.as_ptr()) }
}
