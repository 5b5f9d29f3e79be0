//! Every primitive of every level this CPU runs, against scalar Rust.

use crate::{
    abs, available_levels, bf16_to_f32, dot, f16_to_f32, load_nibbles, non_finite, round_small,
    Level, Simd,
};

fn lanes<S: Simd>(s: S, v: S::F32) -> Vec<f32> {
    let mut buf = [0f32; 64];
    // SAFETY: `buf` holds 64 >= LANES floats.
    unsafe { s.store(buf.as_mut_ptr(), v) };
    buf[..S::LANES].to_vec()
}

fn lanes_i32<S: Simd>(s: S, v: S::I32) -> Vec<i32> {
    // Through the bit cast, which is itself checked against `to_bits` below.
    lanes(s, s.bits_to_f32(v))
        .into_iter()
        .map(|x| x.to_bits() as i32)
        .collect()
}

fn vec_of<S: Simd>(s: S, x: &[f32]) -> S::F32 {
    assert!(x.len() >= S::LANES);
    // SAFETY: `x` holds at least LANES floats (asserted).
    unsafe { s.load(x.as_ptr()) }
}

/// Equal as bits, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[inline(always)]
fn check_float_body<S: Simd>(s: S) {
    let l = S::LANES;
    let a: Vec<f32> = (0..l).map(|i| i as f32 * 1.5 - 3.0).collect();
    let b: Vec<f32> = (0..l).map(|i| 7.0 - i as f32 * 0.25).collect();
    let c: Vec<f32> = (0..l).map(|i| (i * i) as f32).collect();
    let (va, vb, vc) = (vec_of(s, &a), vec_of(s, &b), vec_of(s, &c));
    assert_eq!(lanes(s, va), a, "load / store");
    assert_eq!(lanes(s, s.splat(2.5)), vec![2.5; l]);
    assert_eq!(lanes(s, s.zero()), vec![0.0; l]);
    let ab =
        |f: fn(f32, f32) -> f32| -> Vec<f32> { a.iter().zip(&b).map(|(x, y)| f(*x, *y)).collect() };
    assert_eq!(lanes(s, s.add(va, vb)), ab(|x, y| x + y), "add");
    assert_eq!(lanes(s, s.sub(va, vb)), ab(|x, y| x - y), "sub");
    assert_eq!(lanes(s, s.mul(va, vb)), ab(|x, y| x * y), "mul");
    assert_eq!(lanes(s, s.max(va, vb)), ab(f32::max), "max");
    assert_eq!(lanes(s, s.min(va, vb)), ab(f32::min), "min");
    // Small multiples of 1/4: every product and sum is exact, fused or not.
    let fma: Vec<f32> = (0..l).map(|i| a[i] * b[i] + c[i]).collect();
    assert_eq!(lanes(s, s.fma(va, vb, vc)), fma, "fma");
    assert_eq!(s.reduce_sum(va), a.iter().sum::<f32>(), "reduce_sum");
    assert_eq!(s.reduce_sum(vc), c.iter().sum::<f32>(), "reduce_sum");
    assert_eq!(s.reduce_max(vb), b[0], "reduce_max");
    assert_eq!(s.reduce_max(va), a[l - 1], "reduce_max");
    // A rounding that fused and unfused multiply-adds disagree on: only the SIMD levels fuse.
    let (x, y, z) = (1.0 + f32::EPSILON, 1.0 - f32::EPSILON, -1.0);
    let got = lanes(s, s.fma(s.splat(x), s.splat(y), s.splat(z)))[0];
    let want = if S::LEVEL == Level::Portable {
        x * y + z
    } else {
        x.mul_add(y, z)
    };
    assert_eq!(got, want, "fma rounding");

    for n in 0..=l + 1 {
        let src: Vec<f32> = (0..l + 2).map(|i| i as f32 + 1.0).collect();
        // SAFETY: `src` holds LANES + 2 >= min(n, LANES) floats.
        let v = unsafe { s.load_partial(src.as_ptr(), n) };
        let want: Vec<f32> = (0..l).map(|i| if i < n { src[i] } else { 0.0 }).collect();
        assert_eq!(lanes(s, v), want, "load_partial {n}");
        let mut dst = vec![-1.0f32; l + 2];
        // SAFETY: `dst` holds LANES + 2 >= min(n, LANES) floats.
        unsafe { s.store_partial(dst.as_mut_ptr(), vec_of(s, &src), n) };
        let want: Vec<f32> = (0..l + 2)
            .map(|i| if i < n.min(l) { src[i] } else { -1.0 })
            .collect();
        assert_eq!(dst, want, "store_partial {n}");
    }

    // exp2 on x <= 0 against the library's, to its stated relative error.
    let mut xs: Vec<f32> = (0..=2600).map(|i| -(i as f32) * 0.05).collect();
    xs.extend([
        -0.0,
        -0.5,
        -1e-8,
        -126.0,
        -126.9,
        -127.0,
        -127.5,
        -200.0,
        f32::NEG_INFINITY,
    ]);
    for chunk in xs.chunks(l) {
        let mut x = chunk.to_vec();
        x.resize(l, 0.0);
        for (got, &x) in lanes(s, s.exp2_neg(vec_of(s, &x))).into_iter().zip(&x) {
            if x <= -127.0 {
                assert_eq!(got, 0.0, "exp2({x})");
            } else {
                let want = f64::from(x).exp2();
                let err = ((f64::from(got) - want) / want).abs();
                // Below 2^-126 (subnormal results) the result may flush to 0.
                assert!(
                    err < 2e-7 || (want < 1.2e-38 && f64::from(got) < 1.2e-38),
                    "exp2({x}) = {got}, want {want} (rel err {err:e})"
                );
            }
        }
    }
    let nan = lanes(s, s.exp2_neg(s.splat(f32::NAN)));
    assert_eq!(nan, vec![0.0; l], "exp2(NaN)");
}

#[inline(always)]
fn check_convert_body<S: Simd>(s: S) {
    let l = S::LANES;
    // Every 16-bit pattern, as bf16 and as f16.
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for chunk in all.chunks_exact(l) {
        // SAFETY: `chunk` holds LANES u16.
        let (b, h) = unsafe { (s.load_bf16(chunk.as_ptr()), s.load_f16(chunk.as_ptr())) };
        for ((gb, gh), &bits) in lanes(s, b).into_iter().zip(lanes(s, h)).zip(chunk) {
            assert!(same(gb, bf16_to_f32(bits)), "bf16 {bits:#06x}: {gb}");
            assert!(
                same(gh, f16_to_f32(bits)),
                "f16 {bits:#06x}: {gh} vs {}",
                f16_to_f32(bits)
            );
        }
    }
    // Every byte, signed and unsigned, and their nibbles.
    let bytes: Vec<u8> = (0..=255).collect();
    for chunk in bytes.chunks_exact(l) {
        // SAFETY: `chunk` holds LANES bytes.
        let (i, u) = unsafe { (s.load_i8(chunk.as_ptr().cast()), s.load_u8(chunk.as_ptr())) };
        let want_i: Vec<i32> = chunk.iter().map(|&b| i32::from(b as i8)).collect();
        let want_u: Vec<i32> = chunk.iter().map(|&b| i32::from(b)).collect();
        assert_eq!(lanes_i32(s, i), want_i, "load_i8");
        assert_eq!(lanes_i32(s, u), want_u, "load_u8");
        // SAFETY: as above.
        let (lo, hi) = unsafe { load_nibbles(s, chunk.as_ptr()) };
        let want_lo: Vec<i32> = chunk.iter().map(|&b| i32::from(b & 15)).collect();
        let want_hi: Vec<i32> = chunk.iter().map(|&b| i32::from(b >> 4)).collect();
        assert_eq!(lanes_i32(s, lo), want_lo, "low nibbles");
        assert_eq!(lanes_i32(s, hi), want_hi, "high nibbles");
        // SAFETY: as above.
        let (lo, hi) = unsafe { s.load_nibbles_f32(chunk.as_ptr()) };
        let as_f32 = |v: Vec<i32>| v.into_iter().map(|q| q as f32).collect::<Vec<f32>>();
        assert_eq!(lanes(s, lo), as_f32(want_lo), "low nibbles as f32");
        assert_eq!(lanes(s, hi), as_f32(want_hi), "high nibbles as f32");
    }
}

#[inline(always)]
fn check_int_body<S: Simd>(s: S) {
    let l = S::LANES;
    let a: Vec<i32> = (0..l as i32).map(|i| i * 1_000_003 - 7).collect();
    let b: Vec<i32> = (0..l as i32).map(|i| -i * 77 + i32::MAX - 3).collect();
    let fa: Vec<f32> = a.iter().map(|&x| f32::from_bits(x as u32)).collect();
    let fb: Vec<f32> = b.iter().map(|&x| f32::from_bits(x as u32)).collect();
    let (va, vb) = (s.f32_to_bits(vec_of(s, &fa)), s.f32_to_bits(vec_of(s, &fb)));
    assert_eq!(lanes_i32(s, va), a, "bit casts");
    let ab =
        |f: fn(i32, i32) -> i32| -> Vec<i32> { a.iter().zip(&b).map(|(x, y)| f(*x, *y)).collect() };
    assert_eq!(
        lanes_i32(s, s.add_i32(va, vb)),
        ab(i32::wrapping_add),
        "add_i32"
    );
    assert_eq!(
        lanes_i32(s, s.sub_i32(va, vb)),
        ab(i32::wrapping_sub),
        "sub_i32"
    );
    assert_eq!(
        lanes_i32(s, s.mul_i32(va, vb)),
        ab(i32::wrapping_mul),
        "mul_i32"
    );
    assert_eq!(lanes_i32(s, s.and_i32(va, vb)), ab(|x, y| x & y), "and_i32");
    let shl: Vec<i32> = b.iter().map(|&x| ((x as u32) << 5) as i32).collect();
    let shr: Vec<i32> = b.iter().map(|&x| ((x as u32) >> 9) as i32).collect();
    assert_eq!(lanes_i32(s, s.shl_i32::<5>(vb)), shl, "shl_i32");
    assert_eq!(lanes_i32(s, s.shr_i32::<9>(vb)), shr, "shr_i32");
    let neg = s.splat_i32(-8);
    assert_eq!(
        lanes_i32(s, s.shr_i32::<1>(neg)),
        vec![(-8i32 as u32 >> 1) as i32; l],
        "logical"
    );
    assert_eq!(
        s.reduce_sum_i32(vb),
        b.iter().fold(0, |x: i32, y| x.wrapping_add(*y))
    );
    // LANES different vectors (some wrapping), each summed into its own lane; fewer
    // vectors leave the other lanes 0.
    let many: Vec<S::I32> = (0..l)
        .map(|i| s.add_i32(s.mul_i32(va, s.splat_i32(i as i32 + 1)), vb))
        .collect();
    let sums: Vec<i32> = many
        .iter()
        .map(|&v| lanes_i32(s, v).into_iter().fold(0, i32::wrapping_add))
        .collect();
    assert_eq!(
        lanes_i32(s, s.reduce_sums_i32(&many)),
        sums,
        "reduce_sums_i32"
    );
    let mut part = sums.clone();
    part[l - 1] = 0;
    assert_eq!(
        lanes_i32(s, s.reduce_sums_i32(&many[..l - 1])),
        part,
        "reduce_sums_i32 short"
    );
    let want: Vec<f32> = b.iter().map(|&x| x as f32).collect();
    assert_eq!(lanes(s, s.i32_to_f32(vb)), want, "i32_to_f32");
    let halves: Vec<f32> = (0..l).map(|i| i as f32 - 2.5).collect();
    let want: Vec<i32> = halves.iter().map(|x| x.round_ties_even() as i32).collect();
    assert_eq!(
        lanes_i32(s, s.f32_to_i32(vec_of(s, &halves))),
        want,
        "f32_to_i32 ties"
    );
}

/// The integer dot-product pieces, the i16 / i32 loads and stores and the float helpers
/// built on the primitives.
#[inline(always)]
fn check_madd_body<S: Simd>(s: S) {
    let l = S::LANES;
    let q: Vec<i16> = (0..2 * l as i32)
        .map(|i| (i * 9_001 % 65_536 - 32_768) as i16)
        .collect();
    let k: Vec<i8> = (0..2 * l as i32)
        .map(|i| (i * 77 % 256) as u8 as i8)
        .collect();
    let acc0: Vec<i32> = (0..l as i32).map(|i| i * 1_000 - 5).collect();
    // SAFETY: `acc0` holds LANES i32; `q` 2 * LANES i16; `k` 2 * LANES bytes.
    let got = unsafe {
        let acc = s.load_i32(acc0.as_ptr());
        lanes_i32(s, s.madd_i16_i8(acc, q.as_ptr(), k.as_ptr()))
    };
    let want: Vec<i32> = (0..l)
        .map(|i| {
            let p = |j: usize| i32::from(q[j]) * i32::from(k[j]);
            acc0[i] + p(2 * i) + p(2 * i + 1)
        })
        .collect();
    assert_eq!(got, want, "madd_i16_i8");

    let (w0, w1) = (-32_767i16, 12_345i16);
    let w = s.splat_i32(i32::from(w0 as u16) | i32::from(w1) << 16);
    let a: Vec<i8> = (0..2 * l as i32)
        .map(|i| (i * 53 % 256) as u8 as i8)
        .collect();
    let b: Vec<i8> = (0..2 * l as i32)
        .map(|i| (i * 91 + 7) as u8 as i8)
        .collect();
    let col = |j: usize| i32::from(w0) * i32::from(a[j]) + i32::from(w1) * i32::from(b[j]);
    let mut acc = [s.splat_i32(0), s.splat_i32(0)];
    for _ in 0..3 {
        // SAFETY: `a` and `b` hold 2 * LANES bytes.
        acc = unsafe { s.madd_rows_i8(acc, w, a.as_ptr(), b.as_ptr()) };
    }
    let [c0, c1] = s.madd_rows_order(acc);
    let got: Vec<i32> = lanes_i32(s, c0)
        .into_iter()
        .chain(lanes_i32(s, c1))
        .collect();
    let want: Vec<i32> = (0..2 * l).map(|j| 3 * col(j)).collect();
    assert_eq!(got, want, "madd_rows_i8, three calls, then the order");

    let wide: Vec<i32> = (0..l as i32).map(|i| (i - 2) * 20_000).collect();
    let mut out = vec![0i16; l + 1];
    // SAFETY: `wide` holds LANES i32, `out` LANES + 1 i16.
    let (back, reloaded) = unsafe {
        let v = s.load_i32(wide.as_ptr());
        s.store_i16(out.as_mut_ptr(), v);
        let mut back = vec![0i32; l];
        s.store_i32(back.as_mut_ptr(), v);
        (back, lanes_i32(s, s.load_i16(out.as_ptr())))
    };
    assert_eq!(back, wide, "load_i32 / store_i32");
    let sat: Vec<i16> = wide
        .iter()
        .map(|&x| x.clamp(-32_768, 32_767) as i16)
        .collect();
    assert_eq!(out[..l], sat[..], "store_i16 saturates");
    assert_eq!(out[l], 0, "store_i16 wrote past LANES");
    let sat: Vec<i32> = sat.into_iter().map(i32::from).collect();
    assert_eq!(reloaded, sat, "load_i16");

    let x: Vec<f32> = (0..l).map(|i| i as f32 * 2.75 - 9.5).collect();
    let want: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    assert_eq!(lanes(s, abs(s, vec_of(s, &x))), want, "abs");
    let want: Vec<i32> = x.iter().map(|v| v.round_ties_even() as i32).collect();
    assert_eq!(
        lanes_i32(s, round_small(s, vec_of(s, &x))),
        want,
        "round_small"
    );
    let ties: Vec<f32> = (0..l).map(|i| i as f32 - 3.5).collect();
    let want: Vec<i32> = ties.iter().map(|v| v.round_ties_even() as i32).collect();
    assert_eq!(lanes_i32(s, round_small(s, vec_of(s, &ties))), want, "ties");
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut y = x.clone();
        y[l - 1] = bad;
        let sum = s.reduce_sum(non_finite(s, vec_of(s, &y)));
        assert!(sum.is_nan(), "non_finite({bad})");
    }
    assert_eq!(
        s.reduce_sum(non_finite(s, vec_of(s, &x))),
        0.0,
        "finite row"
    );
}

/// `dot_nibbles16_i8` against the definition, on mixed bytes and on the extremes (every
/// nibble 15 against -128 and 127: the largest sums, which a 16-bit lane must not overflow).
#[inline(always)]
fn check_nibble_dots_body<S: Simd>(s: S) {
    let mixed_q: Vec<u8> = (0..256u32).map(|i| (i * 167 + 13) as u8).collect();
    let mixed_x: Vec<i8> = (0..32i32).map(|i| (i * 71 - 128) as u8 as i8).collect();
    let cases = [
        (mixed_q, mixed_x),
        (vec![0xFF; 256], vec![-128; 32]),
        (vec![0xFF; 256], vec![127; 32]),
        (
            (0..256u32).map(|i| (i % 16 * 17) as u8).collect(),
            (0..32).map(|i| i - 16).collect(),
        ),
    ];
    for (q, x) in cases {
        let want: Vec<i32> = (0..16)
            .map(|r| {
                (0..16)
                    .map(|j| {
                        let b = q[16 * j + r];
                        i32::from(b & 15) * i32::from(x[j])
                            + i32::from(b >> 4) * i32::from(x[j + 16])
                    })
                    .sum()
            })
            .collect();
        // SAFETY: `q` holds 256 bytes, `x` 32.
        let v = unsafe { s.dot_nibbles16_i8(q.as_ptr(), x.as_ptr()) };
        let got: Vec<i32> = v.iter().flat_map(|&v| lanes_i32(s, v)).collect();
        assert_eq!(got[..16], want[..], "dot_nibbles16_i8 rows");
        assert!(
            got[16..].iter().all(|&g| g == 0),
            "dot_nibbles16_i8: vectors past 16 rows"
        );
    }
}

#[inline(always)]
fn dot_body<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    dot(s, a, b)
}

#[inline(always)]
fn check_lanes_body<S: Simd>(_: S, level: Level) {
    assert_eq!(S::LEVEL, level, "run dispatched to another level");
    assert_eq!(level.lanes(), S::LANES, "Level::lanes");
}

crate::instantiate! {
    /// `Level::lanes` and the dispatch of `run`.
    fn check_lanes(level: Level) = check_lanes_body;
    /// Float primitives.
    fn check_float() = check_float_body;
    /// bf16 / f16 / byte loads.
    fn check_convert() = check_convert_body;
    /// Integer primitives.
    fn check_int() = check_int_body;
    /// Integer dot-product primitives and the float helpers.
    fn check_madd() = check_madd_body;
    /// The 4-bit group dot products.
    fn check_nibble_dots() = check_nibble_dots_body;
    /// The dot product helper.
    fn dot_at(a: &[f32], b: &[f32]) -> f32 = dot_body;
}

#[test]
fn every_level_matches_scalar() {
    let levels = available_levels();
    println!("levels on this CPU: {levels:?}");
    assert_eq!(levels.last(), Some(&Level::Portable));
    #[cfg(target_arch = "aarch64")]
    assert!(
        levels.contains(&Level::Neon),
        "no NEON: only the portable level would be tested"
    );
    for level in levels {
        check_lanes::run(level, level);
        check_float::run(level);
        check_convert::run(level);
        check_int::run(level);
        check_madd::run(level);
        check_nibble_dots::run(level);
    }
}

#[test]
fn dot_matches_f64_on_every_length() {
    let a: Vec<f32> = (0..300)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let b: Vec<f32> = (0..300)
        .map(|i| ((i * 53) % 97) as f32 / 40.0 - 1.2)
        .collect();
    for level in available_levels() {
        for n in 0..a.len() {
            let want: f64 = a[..n]
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let got = dot_at::run(level, &a[..n], &b[..n]);
            assert!(
                (f64::from(got) - want).abs() < 1e-4,
                "{level} n={n}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn scalar_conversions_match_known_values() {
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0xc000), -2.0);
    assert_eq!(f16_to_f32(0x7bff), 65504.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    assert!(f16_to_f32(0x7e01).is_nan());
    assert_eq!(bf16_to_f32(0x3f80), 1.0);
    assert_eq!(bf16_to_f32(0xc0a0), -5.0);
}

#[test]
fn levels_parse_and_cap() {
    for level in available_levels() {
        assert_eq!(Level::parse(level.name()), Some(level));
        assert!(level.is_available());
        assert_eq!(crate::best_within(level.rank()), level);
    }
    assert_eq!(Level::parse(" AVX512"), Some(Level::Avx512));
    assert_eq!(Level::parse("avx9"), None);
    assert_eq!(crate::best_within(0), Level::Portable);
}
