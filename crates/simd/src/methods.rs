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
/// - `new: Level::X;` writes `try_new` (the token if `Level::X` is available) and
///   `new_unchecked`;
/// - `fn (a: A, b: B) -> R { m = intrinsic, .. }` writes, for each `m`,
///   `fn m(self, a: A, b: B) -> R { feat!(intrinsic(a, b)) }`;
/// - `unsafe fn (p: P, ..) [-> R] { .. }` the same as `unsafe fn`s.
///
/// Every method is `#[inline(always)]`, as the primitives must be to inline into a body
/// compiled with the level's target features.
macro_rules! simd_methods {
    () => {};
    (new: $level:path; $($rest:tt)*) => {
        #[inline(always)]
        fn try_new() -> Option<Self> {
            $level.is_available().then_some(Self(()))
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
