//! The portable level: plain Rust on 4-lane arrays (the compiler vectorises what it can).

use crate::convert::{bf16_to_f32, f16_to_f32};
use crate::{Level, Simd};

/// The portable token: any CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct Portable;

const L: usize = 4;

#[inline(always)]
fn map<T: Copy, U>(a: [T; L], f: impl Fn(T) -> U) -> [U; L] {
    core::array::from_fn(|i| f(a[i]))
}

#[inline(always)]
fn zip<T: Copy, U>(a: [T; L], b: [T; L], f: impl Fn(T, T) -> U) -> [U; L] {
    core::array::from_fn(|i| f(a[i], b[i]))
}

/// The exp2 polynomial's coefficients, highest degree first (Taylor series of
/// `2^f = e^(f ln 2)` on `[-0.5, 0.5]`), shared by every level.
pub(crate) const EXP2_POLY: [f32; 7] = [
    1.540_353e-4,
    1.333_355_8e-3,
    9.618_129e-3,
    5.550_411e-2,
    0.240_226_5,
    core::f32::consts::LN_2,
    1.0,
];

// SAFETY: the portable primitives use no CPU feature; each does what its documentation says.
unsafe impl Simd for Portable {
    const LANES: usize = L;
    const LEVEL: Level = Level::Portable;
    type F32 = [f32; L];
    type I32 = [i32; L];

    #[inline(always)]
    fn try_new() -> Option<Self> {
        Some(Portable)
    }
    #[inline(always)]
    unsafe fn new_unchecked() -> Self {
        Portable
    }
    #[inline(always)]
    fn splat(self, x: f32) -> [f32; L] {
        [x; L]
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> [f32; L] {
        // SAFETY: `p` is readable for LANES floats (caller).
        unsafe { p.cast::<[f32; L]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: [f32; L]) {
        // SAFETY: `p` is writable for LANES floats (caller).
        unsafe { p.cast::<[f32; L]>().write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> [f32; L] {
        // SAFETY: `p` is readable for LANES u16 (caller).
        let h = unsafe { p.cast::<[u16; L]>().read_unaligned() };
        map(h, bf16_to_f32)
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u16) -> [f32; L] {
        // SAFETY: `p` is readable for LANES u16 (caller).
        let h = unsafe { p.cast::<[u16; L]>().read_unaligned() };
        map(h, f16_to_f32)
    }
    #[inline(always)]
    fn add(self, a: [f32; L], b: [f32; L]) -> [f32; L] {
        zip(a, b, |x, y| x + y)
    }
    #[inline(always)]
    fn sub(self, a: [f32; L], b: [f32; L]) -> [f32; L] {
        zip(a, b, |x, y| x - y)
    }
    #[inline(always)]
    fn mul(self, a: [f32; L], b: [f32; L]) -> [f32; L] {
        zip(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn fma(self, a: [f32; L], b: [f32; L], c: [f32; L]) -> [f32; L] {
        core::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    fn max(self, a: [f32; L], b: [f32; L]) -> [f32; L] {
        zip(a, b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    fn min(self, a: [f32; L], b: [f32; L]) -> [f32; L] {
        zip(a, b, |x, y| if x < y { x } else { y })
    }
    #[inline(always)]
    fn reduce_sum(self, a: [f32; L]) -> f32 {
        (a[0] + a[2]) + (a[1] + a[3])
    }
    #[inline(always)]
    fn reduce_max(self, a: [f32; L]) -> f32 {
        a.into_iter().fold(a[0], |m, x| if x > m { x } else { m })
    }
    #[inline(always)]
    fn exp2_neg(self, x: [f32; L]) -> [f32; L] {
        map(x, |x| {
            let x = if x > -127.0 { x } else { -127.0 };
            let n = x.round_ties_even();
            let f = x - n;
            let mut p = EXP2_POLY[0];
            for c in &EXP2_POLY[1..] {
                p = p * f + c;
            }
            // 2^n from its exponent bits; n = -127 gives the bit pattern 0, i.e. 0.0.
            p * f32::from_bits(((n as i32 + 127) as u32) << 23)
        })
    }
    #[inline(always)]
    fn splat_i32(self, x: i32) -> [i32; L] {
        [x; L]
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const i8) -> [i32; L] {
        // SAFETY: `p` is readable for LANES bytes (caller).
        let b = unsafe { p.cast::<[i8; L]>().read_unaligned() };
        map(b, i32::from)
    }
    #[inline(always)]
    unsafe fn load_u8(self, p: *const u8) -> [i32; L] {
        // SAFETY: `p` is readable for LANES bytes (caller).
        let b = unsafe { p.cast::<[u8; L]>().read_unaligned() };
        map(b, i32::from)
    }
    #[inline(always)]
    fn add_i32(self, a: [i32; L], b: [i32; L]) -> [i32; L] {
        zip(a, b, i32::wrapping_add)
    }
    #[inline(always)]
    fn sub_i32(self, a: [i32; L], b: [i32; L]) -> [i32; L] {
        zip(a, b, i32::wrapping_sub)
    }
    #[inline(always)]
    fn mul_i32(self, a: [i32; L], b: [i32; L]) -> [i32; L] {
        zip(a, b, i32::wrapping_mul)
    }
    #[inline(always)]
    fn and_i32(self, a: [i32; L], b: [i32; L]) -> [i32; L] {
        zip(a, b, |x, y| x & y)
    }
    #[inline(always)]
    fn shl_i32<const N: i32>(self, a: [i32; L]) -> [i32; L] {
        map(a, |x| ((x as u32) << N) as i32)
    }
    #[inline(always)]
    fn shr_i32<const N: i32>(self, a: [i32; L]) -> [i32; L] {
        map(a, |x| ((x as u32) >> N) as i32)
    }
    #[inline(always)]
    fn reduce_sum_i32(self, a: [i32; L]) -> i32 {
        a.into_iter().fold(0, i32::wrapping_add)
    }
    #[inline(always)]
    fn i32_to_f32(self, a: [i32; L]) -> [f32; L] {
        map(a, |x| x as f32)
    }
    #[inline(always)]
    fn f32_to_i32(self, a: [f32; L]) -> [i32; L] {
        map(a, |x| x.round_ties_even() as i32)
    }
    #[inline(always)]
    fn f32_to_bits(self, a: [f32; L]) -> [i32; L] {
        map(a, |x| x.to_bits() as i32)
    }
    #[inline(always)]
    fn bits_to_f32(self, a: [i32; L]) -> [f32; L] {
        map(a, |x| f32::from_bits(x as u32))
    }
    #[inline(always)]
    unsafe fn load_i16(self, p: *const i16) -> [i32; L] {
        // SAFETY: `p` is readable for LANES i16 (caller).
        let h = unsafe { p.cast::<[i16; L]>().read_unaligned() };
        map(h, i32::from)
    }
    #[inline(always)]
    unsafe fn store_i16(self, p: *mut i16, v: [i32; L]) {
        let h = map(v, |x| x.clamp(i16::MIN.into(), i16::MAX.into()) as i16);
        // SAFETY: `p` is writable for LANES i16 (caller).
        unsafe { p.cast::<[i16; L]>().write_unaligned(h) }
    }
    #[inline(always)]
    unsafe fn madd_i16_i8(self, acc: [i32; L], q: *const i16, k: *const i8) -> [i32; L] {
        // SAFETY: `q` is readable for 2 * LANES i16, `k` for 2 * LANES bytes (caller).
        let (q, k) = unsafe {
            (
                q.cast::<[i16; 2 * L]>().read_unaligned(),
                k.cast::<[i8; 2 * L]>().read_unaligned(),
            )
        };
        let pair = |j: usize| i32::from(q[j]) * i32::from(k[j]);
        core::array::from_fn(|i| {
            acc[i]
                .wrapping_add(pair(2 * i))
                .wrapping_add(pair(2 * i + 1))
        })
    }
    #[inline(always)]
    unsafe fn madd_rows_i8(
        self,
        acc: [[i32; L]; 2],
        w: [i32; L],
        a: *const i8,
        b: *const i8,
    ) -> [[i32; L]; 2] {
        // SAFETY: `a` and `b` are readable for 2 * LANES bytes each (caller).
        let (a, b) = unsafe {
            (
                a.cast::<[i8; 2 * L]>().read_unaligned(),
                b.cast::<[i8; 2 * L]>().read_unaligned(),
            )
        };
        let (w0, w1) = (i32::from(w[0] as i16), w[0] >> 16);
        let col = |j: usize| w0 * i32::from(a[j]) + w1 * i32::from(b[j]);
        core::array::from_fn(|v| core::array::from_fn(|i| acc[v][i].wrapping_add(col(v * L + i))))
    }
    #[inline(always)]
    fn madd_rows_order(self, acc: [[i32; L]; 2]) -> [[i32; L]; 2] {
        acc
    }
}
