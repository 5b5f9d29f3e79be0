//! Width-generic SIMD primitives for CPU kernels, written once and run on every ISA.
//!
//! A kernel body is a generic function over [`Simd`], whose associated vector types and
//! primitives (loads, stores, `fma`, reductions, bf16/f16 widening, the integer pieces of
//! quantized dot products) are implemented per ISA:
//!
//! | token          | [`Level`]          | lanes | features                       |
//! |----------------|--------------------|-------|--------------------------------|
//! | [`Portable`]   | [`Level::Portable`]| 4     | none (plain Rust on arrays)    |
//! | `Avx2`         | [`Level::Avx2`]    | 8     | AVX2, FMA, F16C (x86-64)       |
//! | `Avx512`       | [`Level::Avx512`]  | 16    | AVX-512F, AVX-512BW + the above|
//! | `Neon`         | [`Level::Neon`]    | 4     | NEON (aarch64)                 |
//!
//! A value of a token type proves that the CPU running the program has its features
//! (tokens are made by [`Simd::try_new`], which detects them, or by the unsafe
//! [`Simd::new_unchecked`]), so the primitives are safe to call on registers. They are
//! `#[inline(always)]`: a body written as `#[inline(always)] fn body<S: Simd>(s: S, ...)`
//! compiles to the ISA's instructions once it is inlined into a function compiled with the
//! ISA's features enabled; [`instantiate!`] writes those functions, one per ISA, and a
//! dispatcher over [`Level`].
//!
//! [`detect`] picks the best level the CPU runs, capped by the `KERNEL_SIMD_MAX` environment
//! variable (`portable`, `avx2`, `avx512`, `neon`), so each level can be tested on a machine
//! that has a higher one.
//!
//! [`test_data`] has deterministic inputs for kernels' tests and benchmarks.
//!
//! ```
//! use kernel_simd::{instantiate, Simd};
//!
//! /// `sum(a[i] * b[i])` over the common length.
//! #[inline(always)]
//! fn dot_body<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
//!     let n = a.len().min(b.len());
//!     let mut acc = s.zero();
//!     let mut i = 0;
//!     while i + S::LANES <= n {
//!         // SAFETY: `i + LANES <= n`, in bounds of both slices.
//!         let (x, y) = unsafe { (s.load(a.as_ptr().add(i)), s.load(b.as_ptr().add(i))) };
//!         acc = s.fma(x, y, acc);
//!         i += S::LANES;
//!     }
//!     let mut sum = s.reduce_sum(acc);
//!     for j in i..n {
//!         sum += a[j] * b[j];
//!     }
//!     sum
//! }
//!
//! instantiate! {
//!     /// `sum(a[i] * b[i])` on the given level.
//!     fn dot(a: &[f32], b: &[f32]) -> f32 = dot_body;
//! }
//!
//! fn main() {
//!     let a = [1.0f32; 19];
//!     let b = [2.0f32; 19];
//!     for level in kernel_simd::available_levels() {
//!         assert_eq!(dot::run(level, &a, &b), 38.0);
//!     }
//! }
//! ```

#[macro_use]
mod methods;

mod convert;
mod instantiate;
mod level;
mod portable;
pub mod test_data;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
mod tests;

pub use convert::{bf16_to_f32, f16_to_f32};
pub use level::{available_levels, best_within, detect, env_cap, Level};
pub use portable::Portable;

#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub use avx512::Avx512;
#[cfg(target_arch = "aarch64")]
pub use neon::Neon;

/// The primitives of one ISA, on vectors of [`Simd::LANES`] lanes.
///
/// Lane order is memory order: `load(p)` puts `p[i]` in lane `i`, `store` writes lane `i` to
/// `p[i]`, and the integer loads widen byte `i` into lane `i`.
///
/// # Safety
/// An implementation promises that a value of `Self` exists only when the running CPU has
/// every feature its primitives use ([`Simd::try_new`] checks them), and that each primitive
/// does what its documentation says for every input (no undefined behaviour beyond the
/// pointer contracts of the `unsafe` ones).
pub unsafe trait Simd: Copy + Send + Sync + 'static {
    /// Lanes per vector.
    const LANES: usize;
    /// The level this token stands for.
    const LEVEL: Level;
    /// A vector of `LANES` f32.
    type F32: Copy;
    /// A vector of `LANES` i32.
    type I32: Copy;

    /// The token, if this CPU has the features (detected at run time; cached by `std`).
    fn try_new() -> Option<Self>;

    /// The token, without a check.
    ///
    /// # Safety
    /// The running CPU has the features of [`Simd::LEVEL`].
    unsafe fn new_unchecked() -> Self;

    /// Every lane `x`.
    fn splat(self, x: f32) -> Self::F32;
    /// Every lane 0.
    #[inline(always)]
    fn zero(self) -> Self::F32 {
        self.splat(0.0)
    }
    /// `LANES` floats from `p` (any alignment).
    ///
    /// # Safety
    /// `p` is readable for `LANES` f32.
    unsafe fn load(self, p: *const f32) -> Self::F32;
    /// Writes the lanes to `p` (any alignment).
    ///
    /// # Safety
    /// `p` is writable for `LANES` f32.
    unsafe fn store(self, p: *mut f32, v: Self::F32);
    /// The first `n` lanes from `p`, the others 0 (`n >= LANES` loads all lanes).
    ///
    /// # Safety
    /// `p` is readable for `min(n, LANES)` f32.
    #[inline(always)]
    unsafe fn load_partial(self, p: *const f32, n: usize) -> Self::F32 {
        let mut buf = [0f32; 64];
        let n = n.min(Self::LANES);
        // SAFETY: `p` is readable for `n` floats (caller); `buf` holds 64 >= LANES >= n.
        unsafe { core::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n) };
        // SAFETY: `buf` is readable for LANES <= 64 floats.
        unsafe { self.load(buf.as_ptr()) }
    }
    /// Writes the first `n` lanes to `p` (`n >= LANES` writes all lanes).
    ///
    /// # Safety
    /// `p` is writable for `min(n, LANES)` f32.
    #[inline(always)]
    unsafe fn store_partial(self, p: *mut f32, v: Self::F32, n: usize) {
        let mut buf = [0f32; 64];
        // SAFETY: `buf` is writable for LANES <= 64 floats.
        unsafe { self.store(buf.as_mut_ptr(), v) };
        // SAFETY: `p` is writable for `min(n, LANES)` floats (caller).
        unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), p, n.min(Self::LANES)) };
    }
    /// `LANES` bf16 bit patterns from `p`, widened to f32 (exact).
    ///
    /// # Safety
    /// `p` is readable for `LANES` u16 (any alignment).
    unsafe fn load_bf16(self, p: *const u16) -> Self::F32;
    /// `LANES` IEEE f16 bit patterns from `p`, widened to f32 (exact; NaNs stay NaN).
    ///
    /// # Safety
    /// `p` is readable for `LANES` u16 (any alignment).
    unsafe fn load_f16(self, p: *const u16) -> Self::F32;

    /// `a + b`.
    fn add(self, a: Self::F32, b: Self::F32) -> Self::F32;
    /// `a - b`.
    fn sub(self, a: Self::F32, b: Self::F32) -> Self::F32;
    /// `a * b`.
    fn mul(self, a: Self::F32, b: Self::F32) -> Self::F32;
    /// `a * b + c`: fused (one rounding) on the SIMD levels, two roundings on
    /// [`Portable`] (a fused multiply-add without hardware support is a slow library call).
    fn fma(self, a: Self::F32, b: Self::F32, c: Self::F32) -> Self::F32;
    /// Lane-wise maximum; if either lane is NaN the result lane is unspecified (one of the
    /// two).
    fn max(self, a: Self::F32, b: Self::F32) -> Self::F32;
    /// Lane-wise minimum; NaN as for [`Simd::max`].
    fn min(self, a: Self::F32, b: Self::F32) -> Self::F32;
    /// The sum of the lanes (in an ISA-specific order).
    fn reduce_sum(self, a: Self::F32) -> f32;
    /// The largest lane (NaN as for [`Simd::max`]).
    fn reduce_max(self, a: Self::F32) -> f32;
    /// `2^x` lane-wise for `x <= 0` (relative error about 1.2e-7, a degree-6 polynomial on
    /// the fraction); results below f32's normal range (`x < -126`) may be 0, `x <= -127`
    /// and NaN give 0. Positive `x` give unspecified values.
    fn exp2_neg(self, x: Self::F32) -> Self::F32;

    /// Every lane `x`.
    fn splat_i32(self, x: i32) -> Self::I32;
    /// `LANES` bytes from `p`, each sign-extended to an i32 lane.
    ///
    /// # Safety
    /// `p` is readable for `LANES` bytes.
    unsafe fn load_i8(self, p: *const i8) -> Self::I32;
    /// `LANES` bytes from `p`, each zero-extended to an i32 lane.
    ///
    /// # Safety
    /// `p` is readable for `LANES` bytes.
    unsafe fn load_u8(self, p: *const u8) -> Self::I32;
    /// `a + b` (wrapping).
    fn add_i32(self, a: Self::I32, b: Self::I32) -> Self::I32;
    /// `a - b` (wrapping).
    fn sub_i32(self, a: Self::I32, b: Self::I32) -> Self::I32;
    /// The low 32 bits of `a * b`.
    fn mul_i32(self, a: Self::I32, b: Self::I32) -> Self::I32;
    /// `a & b`.
    fn and_i32(self, a: Self::I32, b: Self::I32) -> Self::I32;
    /// `a << N` (`0 <= N < 32`).
    fn shl_i32<const N: i32>(self, a: Self::I32) -> Self::I32;
    /// `a >> N`, logical (zeros shifted in; `1 <= N < 32`).
    fn shr_i32<const N: i32>(self, a: Self::I32) -> Self::I32;
    /// The sum of the lanes (wrapping).
    fn reduce_sum_i32(self, a: Self::I32) -> i32;
    /// Lane `i` is [`Simd::reduce_sum_i32`] of `a[i]`, for `i < min(a.len(), LANES)`; the
    /// other lanes are 0. For `LANES` vectors the SIMD levels do one transpose-and-add,
    /// cheaper than `LANES` reductions.
    #[inline(always)]
    fn reduce_sums_i32(self, a: &[Self::I32]) -> Self::I32 {
        reduce_sums_lanes(self, a)
    }
    /// The low and high nibbles of `LANES` bytes at `p` as f32 (exact, `0.0 ..= 15.0`): lane
    /// `i` of the first vector is `p[i] & 15`, of the second `p[i] >> 4`, as
    /// [`load_nibbles`] gives them converted. A level may look the floats up in a table of
    /// 0..16 instead of masking and converting (AVX-512: a permute reads only an index's
    /// low 4 bits, so the low nibble needs no mask and neither needs a conversion).
    ///
    /// # Safety
    /// `p` is readable for `LANES` bytes.
    #[inline(always)]
    unsafe fn load_nibbles_f32(self, p: *const u8) -> (Self::F32, Self::F32) {
        // SAFETY: forwarded from the caller.
        let (lo, hi) = unsafe { load_nibbles(self, p) };
        (self.i32_to_f32(lo), self.i32_to_f32(hi))
    }
    /// Lane-wise conversion to f32 (round to nearest even where not exact).
    fn i32_to_f32(self, a: Self::I32) -> Self::F32;
    /// Lane-wise conversion to i32, rounding to nearest even; lanes outside the i32 range
    /// (and NaN) give an unspecified value.
    fn f32_to_i32(self, a: Self::F32) -> Self::I32;
    /// The bits of each lane as an i32.
    fn f32_to_bits(self, a: Self::F32) -> Self::I32;
    /// Each lane's bits as an f32.
    fn bits_to_f32(self, a: Self::I32) -> Self::F32;

    /// `LANES` i32 from `p` (any alignment): the float load and a bit cast, which moves the
    /// bits unchanged on every level.
    ///
    /// # Safety
    /// `p` is readable for `LANES` i32.
    #[inline(always)]
    unsafe fn load_i32(self, p: *const i32) -> Self::I32 {
        // SAFETY: `p` is readable for LANES 4-byte lanes (caller).
        self.f32_to_bits(unsafe { self.load(p.cast()) })
    }
    /// Writes the lanes to `p` (any alignment), as [`Simd::load_i32`] reads them.
    ///
    /// # Safety
    /// `p` is writable for `LANES` i32.
    #[inline(always)]
    unsafe fn store_i32(self, p: *mut i32, v: Self::I32) {
        // SAFETY: `p` is writable for LANES 4-byte lanes (caller).
        unsafe { self.store(p.cast(), self.bits_to_f32(v)) }
    }
    /// `LANES` i16 from `p`, each sign-extended to an i32 lane.
    ///
    /// # Safety
    /// `p` is readable for `LANES` i16.
    unsafe fn load_i16(self, p: *const i16) -> Self::I32;
    /// Writes the lanes to `p` as i16, each saturated to `i16::MIN..=i16::MAX`.
    ///
    /// # Safety
    /// `p` is writable for `LANES` i16.
    unsafe fn store_i16(self, p: *mut i16, v: Self::I32);
    /// The integer multiply-add of a dot product of i16 and int8 (`vpmaddwd` on x86):
    /// lane `i` of the result is `acc[i] + q[2i] * k[2i] + q[2i + 1] * k[2i + 1]` (wrapping),
    /// over `2 * LANES` i16 at `q` and `2 * LANES` sign-extended bytes at `k`.
    ///
    /// # Safety
    /// `q` is readable for `2 * LANES` i16, `k` for `2 * LANES` bytes.
    unsafe fn madd_i16_i8(self, acc: Self::I32, q: *const i16, k: *const i8) -> Self::I32;
    /// Two int8 rows weighted by a pair of i16, `2 * LANES` columns: each lane of `w` holds
    /// `w0` in its low and `w1` in its high 16 bits (`splat_i32(w0 as u16 as i32 | w1 << 16)`),
    /// and column `j`'s `w0 * a[j] + w1 * b[j]` is added (wrapping) to one lane of `acc`, in
    /// an order of this ISA's choosing (the one its instructions produce cheaply);
    /// [`Simd::madd_rows_order`] puts the lanes in column order. Sums of several calls stay in
    /// that order, so one reorder serves them all.
    ///
    /// # Safety
    /// `a` and `b` are readable for `2 * LANES` bytes each.
    unsafe fn madd_rows_i8(
        self,
        acc: [Self::I32; 2],
        w: Self::I32,
        a: *const i8,
        b: *const i8,
    ) -> [Self::I32; 2];
    /// Accumulators of [`Simd::madd_rows_i8`] in column order: lane `i` of the first vector
    /// is column `i`, of the second column `LANES + i`.
    fn madd_rows_order(self, acc: [Self::I32; 2]) -> [Self::I32; 2];

    /// The integer dot products of 16 rows of 4-bit quants with 32 int8 values: one block of
    /// a GGML Q4_0 / Q4_1 row group laid out byte position by byte position (`q[16 j + r]`
    /// is byte `j` of row `r`; its low nibble is column `j`, its high nibble column `j + 16`).
    /// Row `r` (lane `r % LANES` of vector `r / LANES`; vectors past `16 / LANES` are 0) is
    ///
    /// `sum over j < 16 of (q[16 j + r] & 15) * x[j] + (q[16 j + r] >> 4) * x[j + 16]`,
    ///
    /// exact for every input (at most `32 * 15 * 128` in magnitude). The SIMD levels sum byte
    /// products in 16-bit lanes (x86's `vpmaddubsw`, NEON's `vmlal_s8`), four to eight
    /// positions at a time, which cannot overflow.
    ///
    /// # Safety
    /// `q` is readable for 256 bytes, `x` for 32.
    #[inline(always)]
    unsafe fn dot_nibbles16_i8(self, q: *const u8, x: *const i8) -> [Self::I32; 4] {
        // SAFETY: 256 readable bytes at `q`, 32 at `x` (caller); any alignment.
        let (q, x) = unsafe {
            (
                q.cast::<[u8; 256]>().read_unaligned(),
                x.cast::<[i8; 32]>().read_unaligned(),
            )
        };
        let mut rows = [0i32; 64];
        for (j, qj) in q.chunks_exact(16).enumerate() {
            let (xl, xh) = (i32::from(x[j]), i32::from(x[j + 16]));
            for (row, &b) in rows.iter_mut().zip(qj) {
                *row += i32::from(b & 15) * xl + i32::from(b >> 4) * xh;
            }
        }
        core::array::from_fn(|v| {
            if v * Self::LANES < 16 {
                // SAFETY: `v * LANES < 16` and LANES <= 16: inside the 64 i32 of `rows`.
                unsafe { self.load_i32(rows.as_ptr().add(v * Self::LANES)) }
            } else {
                self.splat_i32(0)
            }
        })
    }
}

/// [`Simd::reduce_sums_i32`] one vector at a time (its default, and the SIMD levels' for
/// fewer than `LANES` vectors).
#[inline(always)]
pub fn reduce_sums_lanes<S: Simd>(s: S, a: &[S::I32]) -> S::I32 {
    let mut buf = [0i32; 64];
    for (b, &v) in buf.iter_mut().zip(a.iter().take(S::LANES)) {
        *b = s.reduce_sum_i32(v);
    }
    // SAFETY: `buf` holds 64 >= LANES i32.
    unsafe { s.load_i32(buf.as_ptr()) }
}

/// `|a|` lane-wise (the sign bit cleared; NaNs stay NaN).
#[inline(always)]
pub fn abs<S: Simd>(s: S, a: S::F32) -> S::F32 {
    s.bits_to_f32(s.and_i32(s.f32_to_bits(a), s.splat_i32(0x7fff_ffff)))
}

/// `a` rounded to the nearest integer, ties to even, as i32 lanes, for `|a| <= 2^22` (other
/// lanes give unspecified values): `1.5 * 2^23` is added, which leaves the integer in the low
/// bits of the sum. Unlike [`Simd::f32_to_i32`] it needs no rounding-mode instruction, so it
/// runs under Miri at every level.
#[inline(always)]
pub fn round_small<S: Simd>(s: S, a: S::F32) -> S::I32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let big = s.f32_to_bits(s.add(a, s.splat(MAGIC)));
    s.sub_i32(big, s.splat_i32(MAGIC.to_bits() as i32))
}

/// `a * 0` lane-wise: NaN where `a` is NaN or infinite, a (signed) zero elsewhere. Summed
/// over a row with [`Simd::add`], its [`Simd::reduce_sum`] is NaN exactly when the row holds
/// a NaN or an infinity (a check without a compare instruction).
#[inline(always)]
pub fn non_finite<S: Simd>(s: S, a: S::F32) -> S::F32 {
    s.mul(a, s.zero())
}

/// The low and high nibbles of `LANES` bytes at `p`, zero-extended to i32 lanes: lane `i` of
/// the first vector is `p[i] & 15`, of the second `p[i] >> 4` (the two halves of a GGML
/// Q4_0 / Q4_1 block of 32 weights).
///
/// # Safety
/// `p` is readable for `S::LANES` bytes.
#[inline(always)]
pub unsafe fn load_nibbles<S: Simd>(s: S, p: *const u8) -> (S::I32, S::I32) {
    // SAFETY: forwarded from the caller.
    let b = unsafe { s.load_u8(p) };
    (s.and_i32(b, s.splat_i32(15)), s.shr_i32::<4>(b))
}

/// `sum(a[i] * b[i])` over `min(a.len(), b.len())` elements, with four accumulators.
#[inline(always)]
pub fn dot<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let l = S::LANES;
    let mut acc = [s.zero(); 4];
    let mut i = 0;
    while i + 4 * l <= n {
        for (j, aj) in acc.iter_mut().enumerate() {
            // SAFETY: `i + 4 * LANES <= n`: lanes `i + j * LANES ..` are inside both slices.
            let (x, y) = unsafe {
                (
                    s.load(a.as_ptr().add(i + j * l)),
                    s.load(b.as_ptr().add(i + j * l)),
                )
            };
            *aj = s.fma(x, y, *aj);
        }
        i += 4 * l;
    }
    while i + l <= n {
        // SAFETY: `i + LANES <= n`.
        let (x, y) = unsafe { (s.load(a.as_ptr().add(i)), s.load(b.as_ptr().add(i))) };
        acc[0] = s.fma(x, y, acc[0]);
        i += l;
    }
    let acc = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
    let mut sum = s.reduce_sum(acc);
    for j in i..n {
        sum += a[j] * b[j];
    }
    sum
}
