//! [`instantiate!`](crate::instantiate): one generic kernel body, compiled once per ISA.

/// Instantiates generic kernel bodies once per level.
///
/// For each `fn name(args) -> ret = body;` (where `body` is a function in the same module,
/// `#[inline(always)] fn body<S: Simd, ...>(s: S, args) -> ret`), writes a module `name`
/// holding:
/// - `portable(args)`: the body on [`Portable`](crate::Portable) (safe);
/// - on x86-64, `unsafe avx2(args)` and `unsafe avx512(args)`: the body compiled with those
///   levels' target features enabled, for a CPU that has them;
/// - on aarch64, `unsafe neon(args)`;
/// - `run(level, args)`: the instantiation of `level` (safe: a level this CPU does not run
///   falls back to the portable one).
///
/// Each instantiation can be taken as a function pointer (`unsafe fn(args) -> ret`) for a
/// dispatch table filled once. The body may have further generic parameters, written after
/// the name as `<E: Bound, ...>` (one bound each).
///
/// Bodies that take raw pointers are `unsafe fn`s: write `unsafe fn name(..) = body;`, and
/// `portable` and `run` are `unsafe` too, with the body's contract.
#[macro_export]
macro_rules! instantiate {
    () => {};
    (
        $(#[$meta:meta])*
        $vis:vis unsafe fn $name:ident $(<$($gp:ident : $gb:path),+ $(,)?>)?
            ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:ident;
        $($rest:tt)*
    ) => {
        $crate::instantiate! { @emit [unsafe] $(#[$meta])* $vis $name
            [$($($gp: $gb),+)?] ($($arg: $ty),*) [$($ret)?] $body }
        $crate::instantiate! { $($rest)* }
    };
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident $(<$($gp:ident : $gb:path),+ $(,)?>)?
            ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:ident;
        $($rest:tt)*
    ) => {
        $crate::instantiate! { @emit [] $(#[$meta])* $vis $name
            [$($($gp: $gb),+)?] ($($arg: $ty),*) [$($ret)?] $body }
        $crate::instantiate! { $($rest)* }
    };
    // One ISA's instantiation: the body compiled with the level's target features, on a
    // token made without a check (the caller promises the features).
    (@isa $(#[$doc:meta])* $isa:ident $arch:literal $features:literal $token:ident
        [$($gp:ident : $gb:path),*] ($($arg:ident : $ty:ty),*) [$($ret:ty)?] $body:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = $arch)]
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $isa<$($gp: $gb),*>($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the CPU has the token's features (this function's contract).
            let s = unsafe { <$crate::$token as $crate::Simd>::new_unchecked() };
            #[allow(unused_unsafe)]
            // SAFETY: forwarded from this function's contract.
            unsafe { super::$body(s, $($arg),*) }
        }
    };
    (@emit [$($uns:tt)?] $(#[$meta:meta])* $vis:vis $name:ident [$($gp:ident : $gb:path),*]
        ($($arg:ident : $ty:ty),*) [$($ret:ty)?] $body:ident) => {
        $(#[$meta])*
        #[allow(dead_code)]
        $vis mod $name {
            #[allow(unused_imports)]
            use super::*;

            /// The kernel on the portable level.
            ///
            /// # Safety
            /// If `unsafe`: the body's contract.
            #[inline]
            #[allow(clippy::too_many_arguments)]
            pub $($uns)? fn portable<$($gp: $gb),*>($($arg: $ty),*) $(-> $ret)? {
                #[allow(unused_unsafe)]
                // SAFETY: forwarded from this function's contract (if it has one).
                $($uns)? { super::$body($crate::Portable, $($arg),*) }
            }

            $crate::instantiate! { @isa
                /// The kernel compiled for AVX2 + FMA + F16C.
                ///
                /// # Safety
                /// The CPU has AVX2, FMA and F16C (`Level::Avx2.is_available()`), and the
                /// body's contract holds if it has one.
                avx2 "x86_64" "avx2,fma,f16c" Avx2
                [$($gp: $gb),*] ($($arg: $ty),*) [$($ret)?] $body
            }
            $crate::instantiate! { @isa
                /// The kernel compiled for AVX-512F + AVX-512BW (with AVX2, FMA, F16C).
                ///
                /// # Safety
                /// The CPU has those features (`Level::Avx512.is_available()`), and the body's
                /// contract holds if it has one.
                avx512 "x86_64" "avx512f,avx512bw,avx2,fma,f16c" Avx512
                [$($gp: $gb),*] ($($arg: $ty),*) [$($ret)?] $body
            }
            $crate::instantiate! { @isa
                /// The kernel compiled for NEON.
                ///
                /// # Safety
                /// The CPU has NEON (`Level::Neon.is_available()`), and the body's contract
                /// holds if it has one.
                neon "aarch64" "neon" Neon
                [$($gp: $gb),*] ($($arg: $ty),*) [$($ret)?] $body
            }

            /// The kernel on `level`, or on the portable level if this CPU does not run
            /// `level`.
            ///
            /// # Safety
            /// If `unsafe`: the body's contract.
            #[inline]
            #[allow(clippy::too_many_arguments)]
            pub $($uns)? fn run<$($gp: $gb),*>(
                level: $crate::Level, $($arg: $ty),*
            ) $(-> $ret)? {
                match level {
                    #[cfg(target_arch = "x86_64")]
                    $crate::Level::Avx512 if level.is_available() => {
                        // SAFETY: `is_available` checked the features; the body's contract
                        // is this function's.
                        unsafe { avx512($($arg),*) }
                    }
                    #[cfg(target_arch = "x86_64")]
                    $crate::Level::Avx2 if level.is_available() => {
                        // SAFETY: as above.
                        unsafe { avx2($($arg),*) }
                    }
                    #[cfg(target_arch = "aarch64")]
                    $crate::Level::Neon if level.is_available() => {
                        // SAFETY: as above.
                        unsafe { neon($($arg),*) }
                    }
                    _ => {
                        #[allow(unused_unsafe)]
                        // SAFETY: the body's contract is this function's.
                        $($uns)? { portable($($arg),*) }
                    }
                }
            }
        }
    };
}
