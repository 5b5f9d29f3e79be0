//! What the SIMD levels' `Simd` impls share: `feat!`, the `unsafe` block their intrinsics
//! need, and [`simd_methods!`], the methods that are each one intrinsic.

/// Evaluates intrinsics that need the features a token proves (and, in the `unsafe`
/// primitives, the caller's pointer contract); for use inside a SIMD level's `Simd` methods.
macro_rules! feat {
    ($e:expr) => {
        // SAFETY: a token (`self`) exists only if the CPU has its level's features (the
        // `Simd` impl's invariant, checked by `try_new` or promised to `new_unchecked`); in
        // the `unsafe` primitives, pointers as the primitive's contract says (its caller's
        // promise).
        unsafe { $e }
    };
}

/// Writes the methods of an `unsafe impl Simd for Token` (a SIMD level's token, a tuple
/// struct around `()`) that are each one intrinsic called on the method's arguments (in
/// `feat!`), so a level's file lists its intrinsics instead of a wrapper per primitive.
///
/// - `X: n lanes, F, I;` (first) writes `LANES = n`, `LEVEL = Level::X`, `F32 = F`,
///   `I32 = I`, `try_new` (the token if `Level::X` is available) and `new_unchecked`;
/// - `fn (a: A, b: B) -> R { m = intrinsic, .. }` writes, for each `m`,
///   `fn m(self, a: A, b: B) -> R { feat!(intrinsic(a, b)) }`;
/// - `unsafe fn (p: P, ..) [-> R] { .. }` the same as `unsafe fn`s.
///
/// Every method is `#[inline(always)]`, as the primitives must be to inline into a body
/// compiled with the level's target features.
macro_rules! simd_methods {
    () => {};
    ($level:ident: $lanes:literal lanes, $f32:ty, $i32:ty; $($rest:tt)*) => {
        const LANES: usize = $lanes;
        const LEVEL: $crate::Level = $crate::Level::$level;
        type F32 = $f32;
        type I32 = $i32;

        #[inline(always)]
        fn try_new() -> Option<Self> {
            $crate::Level::$level.is_available().then_some(Self(()))
        }
        #[inline(always)]
        unsafe fn new_unchecked() -> Self {
            Self(())
        }
        simd_methods! { $($rest)* }
    };
    (fn $args:tt $(-> $r:ty)? { $($m:ident = $f:path),* $(,)? } $($rest:tt)*) => {
        simd_methods! { @each [] $args [$(-> $r)?] $($m = $f),* }
        simd_methods! { $($rest)* }
    };
    (unsafe fn $args:tt $(-> $r:ty)? { $($m:ident = $f:path),* $(,)? } $($rest:tt)*) => {
        simd_methods! { @each [unsafe] $args [$(-> $r)?] $($m = $f),* }
        simd_methods! { $($rest)* }
    };
    (@each $uns:tt $args:tt $ret:tt $($m:ident = $f:path),*) => {
        $(simd_methods! { @one $uns $m $args $ret $f })*
    };
    (@one [$($uns:tt)?] $m:ident ($($a:ident: $t:ty),*) [$($ret:tt)*] $f:path) => {
        #[inline(always)]
        $($uns)? fn $m(self, $($a: $t),*) $($ret)* {
            feat!($f($($a),*))
        }
    };
}

/// `madd_i16_i8` and `madd_rows_i8` of an x86 level, the same instructions at 256 and 512
/// bits: `$v` the level's i32 vector, `load_half` the load of the half-width integer vector
/// the bytes of `2 * LANES` columns fill, `load` the full-width load, `widen8` the
/// sign-extension of those bytes to i16 lanes, and the level's `vpmaddwd`, `vpaddd` and byte
/// unpacks (which interleave per 128-bit block: `madd_rows_order` undoes it).
#[cfg(target_arch = "x86_64")]
macro_rules! x86_madd {
    ($v:ty; load_half = $lh:ident, load = $lw:ident, widen8 = $w8:ident, madd = $madd:ident,
        add = $add:ident, unpacklo = $lo:ident, unpackhi = $hi:ident $(,)?) => {
        #[inline(always)]
        unsafe fn madd_i16_i8(self, acc: $v, q: *const i16, k: *const i8) -> $v {
            // SAFETY: the features (token); `2 * LANES` readable i16 at `q` and bytes at `k`
            // (caller).
            unsafe {
                let kv = $w8($lh(k.cast()));
                let qv = $lw(q.cast());
                $add(acc, $madd(qv, kv))
            }
        }
        #[inline(always)]
        unsafe fn madd_rows_i8(self, acc: [$v; 2], w: $v, a: *const i8, b: *const i8) -> [$v; 2] {
            // SAFETY: the features (token); `2 * LANES` readable bytes at `a` and at `b`
            // (caller).
            unsafe {
                let (x, y) = ($lh(a.cast()), $lh(b.cast()));
                // Bytes interleaved `a[j], b[j]` and widened: each i16 pair meets `(w0, w1)`.
                let lo = $w8($lo(x, y));
                let hi = $w8($hi(x, y));
                [$add(acc[0], $madd(lo, w)), $add(acc[1], $madd(hi, w))]
            }
        }
    };
}

/// The widening loads of an x86 level (`load_bf16`, `load_f16`, `load_i8`, `load_u8`,
/// `load_i16`), the same instructions at 256 and 512 bits: `$f` / `$i` the level's float and
/// i32 vectors, `load_words` the load of the half-width integer vector that `LANES` 16-bit
/// values fill, `load_bytes` the load of the integer vector whose low bytes `LANES` bytes
/// fill, and the level's extensions to i32 lanes, 32-bit left shift, bit cast to floats and
/// f16 conversion.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_widening_loads {
    ($f:ty, $i:ty; load_words = $lw:ident, load_bytes = $lb:ident, zext16 = $zx16:ident,
        sext16 = $sx16:ident, zext8 = $zx8:ident, sext8 = $sx8:ident, shl = $shl:ident,
        cast = $cast:ident, from_f16 = $cvtph:ident $(,)?) => {
        #[inline(always)]
        unsafe fn load_bf16(self, p: *const u16) -> $f {
            // SAFETY: the features (token) and `LANES` readable u16 at `p` (caller), the
            // bytes `load_words` reads.
            let h = unsafe { $lw(p.cast()) };
            feat!($cast($shl::<16>($zx16(h))))
        }
        #[inline(always)]
        unsafe fn load_f16(self, p: *const u16) -> $f {
            if cfg!(miri) {
                // SAFETY: `LANES` readable u16 at `p` (caller).
                return unsafe { $crate::convert::load_f16_lanes(self, p) };
            }
            // SAFETY: the features (token) and `LANES` readable u16 at `p` (caller).
            unsafe { $cvtph($lw(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_i8(self, p: *const i8) -> $i {
            // SAFETY: the features (token) and `LANES` readable bytes at `p` (caller), the
            // bytes `load_bytes` reads.
            unsafe { $sx8($lb(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_u8(self, p: *const u8) -> $i {
            // SAFETY: as in `load_i8`.
            unsafe { $zx8($lb(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_i16(self, p: *const i16) -> $i {
            // SAFETY: the features (token) and `LANES` readable i16 at `p` (caller), the bytes
            // `load_words` reads.
            unsafe { $sx16($lw(p.cast())) }
        }
    };
}
