//! Every kernel set this CPU runs against the portable one ([`super::scalar`]), kernel by
//! kernel.

use super::*;
use crate::plan::{MR, NR};
use kernel_simd::test_data::uniform;

mod whole_calls;

/// `n` int8 values `(j * step + offset) mod 256` (every byte for `step` odd, over 256 of them).
fn bytes(n: usize, step: usize, offset: usize) -> Vec<i8> {
    (0..n)
        .map(|j| ((j * step + offset) % 256) as u8 as i8)
        .collect()
}

/// The lengths of `r`; under Miri (minutes per level otherwise) only those next to the
/// vector widths 8, 16 and 32, where the kernels' loops and tails change.
fn lengths(r: impl Iterator<Item = usize>) -> impl Iterator<Item = usize> {
    r.filter(|n| !cfg!(miri) || [0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33].contains(n))
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "at {i}: {x} vs {y}");
    }
}

/// Every kernel set this CPU runs agrees with the scalar one.
#[test]
fn every_level_matches_scalar() {
    let levels = crate::simd::available_simd_levels();
    println!("available SIMD levels: {levels:?}");
    #[cfg(target_arch = "aarch64")]
    assert!(
        levels.contains(&SimdLevel::Neon),
        "no NEON: an aarch64 run would test only the portable kernels"
    );
    for level in levels {
        level_matches_scalar(level);
    }
}

/// The AVX-512 set alone: on a machine without AVX-512, CI runs this test under Miri
/// with the target features enabled (see `.ci/run`), which is what tests these kernels
/// there; `every_level_matches_scalar` covers them on a machine that has AVX-512.
#[test]
#[cfg(target_arch = "x86_64")]
fn avx512_matches_scalar() {
    if !kernel_simd::Level::Avx512.is_available() {
        eprintln!("no AVX-512 here: the AVX-512 set is tested under Miri (.ci/run)");
        return;
    }
    let f = Kernels::for_level(SimdLevel::Avx512);
    assert_eq!(f.level, SimdLevel::Avx512);
    matches_scalar(f);
    conversions_match_scalar(f);
    row_kernels_match_scalar(f);
    int_pv_matches_model(f);
}

fn level_matches_scalar(level: SimdLevel) {
    let f = Kernels::for_level(level);
    assert_eq!(f.level, level);
    matches_scalar(f);
    conversions_match_scalar(f);
    row_kernels_match_scalar(f);
    int_pv_matches_model(f);
}

/// The integer `P . V` of `f` (table, weights, `pv_madd` per `PV_ROWS` rows, flush) gives
/// bit for bit what a direct model of the same integer arithmetic gives (`acc + step *
/// (sum_t w16_t (v_t - zp_t)) as f32`, the sum in i64), and that is within the weights'
/// rounding bound of the f64 sum: head dims 1..40 (every vector tail), 128 and 300; MHA
/// and groups of 2 and 3; tiles of 1..32 positions (odd ones end in a half pair, short
/// ones padded to `PV_ROWS`), with `ldw` the padded tile and 32; a head of zero weights
/// (skipped) and one with a NaN weight (NaN out). The weights are checked one by one:
/// `|w16 * step - w| <= step * (1/2 + 2^-8)`, and the largest is 32767 (a tight step).
fn int_pv_matches_model(f: Kernels) {
    use crate::kernels::int8::{PvTable, PvWeightsIn, PV_MAX_TILE, PV_ROWS};
    use crate::kernels::layout::GroupedHeads;
    use crate::kernels::row::KvRow;
    let s = Kernels::scalar();
    // Under Miri (where the AVX-512 `pv_madd` is tested; ~20 s a case) four cases: a
    // scalar-only head, a 32-lane step with a tail, two steps, a group of 3 and of 2.
    let cases: Vec<(usize, usize, usize, usize)> = if cfg!(miri) {
        vec![
            (31, 3, 1, 9),
            (33, 3, 3, 17),
            (64, 2, 1, 32),
            (70, 2, 2, 17),
        ]
    } else {
        (1..=40)
            .map(|d| (d, 3, [1, 3, 2][d % 3], 1 + (d * 7) % 32))
            .chain([
                (128, 4, 1, 32),
                (128, 4, 2, 31),
                (300, 2, 1, 9),
                (17, 6, 3, 32),
                // 8-position x 8-head blocks of the SIMD table, with remainders.
                (5, 8, 1, 32),
                (3, 9, 1, 17),
                (16, 16, 2, 24),
                (7, 11, 1, 8),
            ])
            .collect()
    };
    for (d, kvh, group, n) in cases {
        let (heads, hg) = (kvh * group, GroupedHeads { d, group });
        let nr = n.div_ceil(PV_ROWS) * PV_ROWS;
        let vals: Vec<Vec<i8>> = (0..nr).map(|t| bytes(kvh * d, 37, t * 101 + d)).collect();
        let scales: Vec<Vec<f32>> = (0..nr)
            .map(|t| {
                uniform(kvh, 70 + t as u32, 1.0)
                    .iter()
                    .map(|x| x.abs() * 0.05)
                    .collect()
            })
            .collect();
        let zps: Vec<Vec<i8>> = (0..nr).map(|t| bytes(kvh, 53, t * 7)).collect();
        let row = |t: usize| KvRow {
            x: &vals[t.min(n - 1)][..],
            scales: &scales[t.min(n - 1)][..],
            zps: &zps[t.min(n - 1)][..],
        };
        let rows: Vec<KvRow<'_, i8>> = (0..nr).map(row).collect();
        let ldp = n + 3;
        let mut p: Vec<f32> = uniform(heads * ldp, 90 + d as u32, 1.0)
            .iter()
            .map(|x| x.abs())
            .collect();
        p[ldp..ldp + n].fill(0.0); // head 1: all weights 0
        if heads > 2 {
            p[2 * ldp + n / 2] = f32::NAN; // head 2: NaN
        }
        let a0 = uniform(heads * d, 91, 1.0);
        // The table: every level's bit for bit as the scalar one, which is checked
        // against its definition.
        let table = |k: &Kernels| {
            let (mut vs, mut zp) = (
                vec![f32::NAN; kvh * PV_MAX_TILE],
                vec![7i16; kvh * PV_MAX_TILE],
            );
            // SAFETY: slice-based kernel on a CPU that runs `k`'s level.
            unsafe { (k.pv_table)(&rows[..n], kvh, &mut vs, &mut zp) };
            (vs, zp)
        };
        let (vs, zp) = table(&s);
        let (vf, zf) = table(&f);
        assert_eq!(
            (vf.map_bits(), zf),
            (vs.map_bits(), zp.clone()),
            "table d {d} kvh {kvh} n {n}"
        );
        for g in 0..kvh {
            for t in 0..PV_MAX_TILE {
                let (want_s, want_z) = if t < n {
                    (scales[t][g], i16::from(zps[t][g]))
                } else {
                    (0.0, 0)
                };
                assert_eq!(
                    (vs[g * PV_MAX_TILE + t], zp[g * PV_MAX_TILE + t]),
                    (want_s, want_z)
                );
            }
        }
        let tab = PvTable {
            vs: &vs,
            zp: &zp,
            n,
        };
        for ldw in [nr, PV_MAX_TILE] {
            let run = |k: &Kernels| {
                let mut w16 = vec![5i16; heads * ldw];
                let (mut step, mut zt) = (vec![f32::NAN; heads], vec![9i32; heads]);
                let mut acc = a0.clone();
                let mut acc32 = vec![0i32; heads * d];
                // SAFETY: slice-based kernels on a CPU that runs `k`'s level.
                unsafe {
                    let a = PvWeightsIn {
                        p: &p,
                        ldp,
                        group,
                        tab,
                    };
                    (k.pv_weights)(a, ldw, &mut w16, &mut step, &mut zt);
                    for u in (0..n).step_by(PV_ROWS) {
                        let v: [KvRow<'_, i8>; PV_ROWS] = core::array::from_fn(|j| rows[u + j]);
                        (k.pv_madd)(&mut acc32, hg, Strided(&w16[u..], ldw), v);
                    }
                    (k.pv_flush)(&mut acc, &mut acc32, d, &step, &zt);
                }
                assert!(acc32.iter().all(|&x| x == 0), "flush zeroes acc32");
                (w16, step.map_bits(), zt, acc.map_bits())
            };
            let (a, b) = (run(&f), run(&s));
            assert_eq!(a, b, "int P.V d {d} group {group} n {n} ldw {ldw}");
            let (w16, step, zt, acc) = (b.0, b.1.unbits(), b.2, b.3.unbits());
            for h in 0..heads {
                let g = h / group;
                let what = format!("d {d} group {group} n {n} ldw {ldw} h {h}");
                if h == 2 && heads > 2 {
                    assert!(step[h].is_nan() && acc[h * d..(h + 1) * d].iter().all(|x| x.is_nan()));
                    continue;
                }
                let wh = &w16[h * ldw..(h + 1) * ldw];
                assert!(wh[n..].iter().all(|&x| x == 0), "{what}: padding");
                if h == 1 {
                    assert_eq!(step[h], 0.0, "{what}");
                    assert_eq!(
                        acc[d..2 * d],
                        a0[d..2 * d],
                        "{what}: zero weights changed acc"
                    );
                    continue;
                }
                let sc = step[h];
                assert_eq!(
                    wh.iter().map(|x| x.abs()).max(),
                    Some(32767),
                    "{what}: step not tight"
                );
                let z: i64 = (0..n)
                    .map(|t| i64::from(wh[t]) * i64::from(zps[t][g]))
                    .sum();
                assert_eq!(i64::from(zt[h]), z, "{what}: zero-point term");
                let mut werr = [0f64; PV_MAX_TILE];
                for t in 0..n {
                    let w = f64::from(p[h * ldp + t] * scales[t][g]);
                    werr[t] = (f64::from(wh[t]) * f64::from(sc) - w).abs();
                    assert!(
                        werr[t] <= f64::from(sc) * (0.5 + 1.0 / 256.0),
                        "{what}: weight {t}"
                    );
                }
                for j in 0..d {
                    let x: i64 = (0..n)
                        .map(|t| {
                            i64::from(wh[t])
                                * (i64::from(vals[t][g * d + j]) - i64::from(zps[t][g]))
                        })
                        .sum();
                    let model = a0[h * d + j] + sc * (x as i32 as f32);
                    assert_eq!(
                        acc[h * d + j].to_bits(),
                        model.to_bits(),
                        "{what}: lane {j}"
                    );
                    let (mut want, mut mag, mut bound) = (f64::from(a0[h * d + j]), 0f64, 0f64);
                    for t in 0..n {
                        let v = f64::from(vals[t][g * d + j]) - f64::from(zps[t][g]);
                        let y = f64::from(p[h * ldp + t]) * f64::from(scales[t][g]) * v;
                        want += y;
                        mag += y.abs();
                        bound += f64::from(sc) * (0.5 + 1.0 / 256.0) * v.abs();
                    }
                    let got = f64::from(acc[h * d + j]);
                    assert!(
                        (got - want).abs() <= bound + 1e-5 * (mag + want.abs()),
                        "{what}: lane {j}: {got} vs {want} (bound {bound})"
                    );
                }
            }
        }
    }
}

/// f32 vectors compared and stored by their bits (NaN equal to itself). Every NaN maps to
/// one pattern: Rust leaves a NaN result's sign and payload unspecified, and Miri picks
/// them at random.
trait Bits {
    fn map_bits(&self) -> Vec<u32>;
}
impl Bits for Vec<f32> {
    fn map_bits(&self) -> Vec<u32> {
        self.iter()
            .map(|x| if x.is_nan() { f32::NAN } else { *x }.to_bits())
            .collect()
    }
}
trait Unbits {
    fn unbits(&self) -> Vec<f32>;
}
impl Unbits for Vec<u32> {
    fn unbits(&self) -> Vec<f32> {
        self.iter().map(|&x| f32::from_bits(x)).collect()
    }
}

/// The conversion kernels of `f` give exactly the scalar results (all lengths 0..40, so
/// every vector tail is covered).
fn conversions_match_scalar(f: Kernels) {
    let s = Kernels::scalar();
    let x = uniform(40, 21, 1.0);
    let bf: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v * 300.0)).collect();
    let hf: Vec<F16> = x.iter().map(|&v| F16::from_f32(v * 300.0)).collect();
    let q = bytes(40, 37, 0);
    for n in lengths(0..40) {
        let (mut a, mut b) = (vec![f32::NAN; n + 1], vec![f32::NAN; n + 1]);
        // SAFETY: slice-based kernels on a CPU that runs `f`'s level.
        unsafe {
            (f.widen_bf16)(&bf[..n], &mut a);
            (s.widen_bf16)(&bf[..n], &mut b);
        }
        assert_eq!(a[..n], b[..n], "bf16 n {n}");
        assert!(a[n].is_nan(), "bf16 wrote past n");
        // SAFETY: as above.
        unsafe {
            (f.widen_f16)(&hf[..n], &mut a);
            (s.widen_f16)(&hf[..n], &mut b);
        }
        assert_eq!(a[..n], b[..n], "f16 n {n}");
        // SAFETY: as above.
        unsafe {
            (f.dequant)(&q[..n], 0.037, -5, &mut a);
            (s.dequant)(&q[..n], 0.037, -5, &mut b);
        }
        assert_eq!(a[..n], b[..n], "dequant n {n}");
        for i in 0..n {
            assert_eq!(b[i], (f32::from(q[i]) + 5.0) * 0.037);
        }
    }
}

/// The decode row kernels of `f` (f32, bf16, int8 rows) agree with the scalar ones, and the
/// scalar ones with an f64 sum, to 1e-5 relative to the sum of magnitudes (plus, for the
/// integer int8 scores, the query's i16 rounding): head dims 1..40 (every vector tail) and
/// 128, MHA and groups of 2 and 4; 6 and 7 heads (a remainder after the four-head blocks);
/// head dims 300 and 520 (several 256-lane integer blocks); every `w`, zero weights.
fn row_kernels_match_scalar(f: Kernels) {
    use crate::kernels::int8::Q16;
    use crate::kernels::layout::GroupedHeads;
    use crate::kernels::row::KvRow;
    let s = Kernels::scalar();
    // quantize_q16: bit-identical to the scalar version, on heads of zeros, with a NaN,
    // with an infinity, and of every length 1..40 (every vector tail).
    for d in lengths(1..40) {
        let mut q = uniform(5 * d, 60 + d as u32, 1.0);
        q[d..2 * d].fill(0.0);
        q[2 * d + d / 2] = f32::NAN;
        q[3 * d] = f32::NEG_INFINITY;
        let run = |k: &Kernels| {
            let (mut a, mut b, mut c) = (vec![7i16; 5 * d], vec![7f32; 5], vec![7i32; 5]);
            // SAFETY: slice-based kernel on a CPU that runs its level.
            unsafe { (k.quantize_q16)(&q, d, &mut a, &mut b, &mut c) };
            (a, b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), c)
        };
        let (a, b) = (run(&f), run(&s));
        assert_eq!(a, b, "quantize_q16 d {d}");
        assert_eq!(b.1[1], 0, "zero head: scale 0");
        assert!(f32::from_bits(b.1[2]).is_nan() && f32::from_bits(b.1[3]).is_nan());
        for h in [0, 4] {
            let sc = f32::from_bits(b.1[h]);
            for j in 0..d {
                let x = q[h * d + j];
                assert!(
                    (f32::from(b.0[h * d + j]) * sc - x).abs() <= sc * 0.5001,
                    "{x}"
                );
            }
            assert_eq!(
                b.2[h],
                b.0[h * d..(h + 1) * d].iter().map(|&x| i32::from(x)).sum()
            );
        }
    }
    // Under Miri (a minute for 128 x 8 heads there) smaller long cases with the same loop
    // shapes: 80 and 97 lanes reach the 64- and 16-lane steps and a tail, 290 the integer
    // scores' second block of 256 lanes.
    // 16 and 24 heads take the integer scores' `LANES`-heads path on every level, with a
    // tail (200) and with KV groups that straddle two of its chunks (24 heads, group 3).
    let long: &[(usize, usize, usize)] = if cfg!(miri) {
        &[(80, 2, 2), (97, 2, 1), (290, 2, 2)]
    } else {
        &[
            (128, 8, 1),
            (128, 8, 4),
            (24, 6, 3),
            (300, 7, 7),
            (520, 2, 1),
            (200, 16, 2),
            (72, 24, 3),
        ]
    };
    for (d, heads, group) in lengths(1..40)
        .map(|d| (d, 4, 1 + d % 3 * (d % 3)))
        .chain(long.iter().copied())
    {
        let group = if heads % group == 0 { group } else { 1 };
        let hg = GroupedHeads { d, group };
        let kvh = heads / group;
        let n = kvh * d;
        let q = uniform(heads * d, 31 + d as u32, 1.0);
        let fl: Vec<Vec<f32>> = (0..4).map(|u| uniform(n, 32 + u + d as u32, 1.0)).collect();
        let bf: Vec<Vec<Bf16>> = fl
            .iter()
            .map(|r| r.iter().map(|&x| Bf16::from_f32(x)).collect())
            .collect();
        let i8s: Vec<Vec<i8>> = (0..4).map(|u| bytes(n, 37, u * 11)).collect();
        let scales: Vec<Vec<f32>> = (0..4).map(|u| uniform(kvh, 40 + u, 1.0)).collect();
        let zps: Vec<Vec<i8>> = (0..4).map(|u| bytes(kvh, 53, u * 7)).collect();
        let rf = |u: usize| KvRow::dense(&fl[u][..]);
        let rb = |u: usize| KvRow::dense(&bf[u][..]);
        let ri = |u: usize| KvRow {
            x: &i8s[u][..],
            scales: &scales[u][..],
            zps: &zps[u][..],
        };
        // f64 reference of element j of head g of row u, and its magnitude bound.
        let deq = |u: usize, kind: usize, g: usize, j: usize| -> f64 {
            match kind {
                0 => f64::from(fl[u][g * d + j]),
                1 => f64::from(bf[u][g * d + j].to_f32()),
                _ => {
                    (f64::from(i8s[u][g * d + j]) - f64::from(zps[u][g])) * f64::from(scales[u][g])
                }
            }
        };
        let (mut q16, mut q16_scale, mut q16_sum) =
            (vec![0i16; heads * d], vec![0f32; heads], vec![0i32; heads]);
        // SAFETY: slice-based kernel on a CPU that runs `f`'s level.
        unsafe { (f.quantize_q16)(&q, d, &mut q16, &mut q16_scale, &mut q16_sum) };
        // The query as `f.scores_bf16` takes it.
        #[cfg(target_arch = "x86_64")]
        let q_split = {
            let mut x = q.clone();
            row::split16(&mut x, d);
            x
        };
        #[cfg(not(target_arch = "x86_64"))]
        let q_split = q.clone();
        let q_bf16 = |k: &Kernels| if k.bf16_split_q { &q_split[..] } else { &q[..] };
        let lds = 3;
        for kind in 0..3 {
            let (mut s1, mut s2) = (vec![f32::NAN; heads * lds], vec![f32::NAN; heads * lds]);
            // SAFETY: slice-based kernels (they check their lengths) on a CPU that runs
            // `f`'s level.
            unsafe {
                match kind {
                    0 => {
                        (f.scores_f32)(&q, hg, rf(0), Strided(&mut s1, lds));
                        (s.scores_f32)(&q, hg, rf(0), Strided(&mut s2, lds));
                    }
                    1 => {
                        (f.scores_bf16)(q_bf16(&f), hg, rb(0), Strided(&mut s1, lds));
                        (s.scores_bf16)(&q, hg, rb(0), Strided(&mut s2, lds));
                    }
                    _ => {
                        let q16 = Q16 {
                            q: &q16,
                            scale: &q16_scale,
                            sum: &q16_sum,
                        };
                        (f.scores_q16)(q16, hg, ri(0), Strided(&mut s1, lds));
                        (s.scores_q16)(q16, hg, ri(0), Strided(&mut s2, lds));
                    }
                }
            }
            for h in 0..heads {
                let g = h / group;
                let (mut want, mut mag, mut q16_err) = (0f64, 0f64, 0f64);
                for j in 0..d {
                    let x = f64::from(q[h * d + j]) * deq(0, kind, g, j);
                    want += x;
                    mag += x.abs();
                    // int8: each query element is off by at most half its head's i16 step.
                    q16_err += 0.5 * f64::from(q16_scale[h]) * deq(0, kind, g, j).abs();
                }
                let bound = 1e-5 * mag + if kind == 2 { q16_err } else { 0.0 };
                for got in [s1[h * lds], s2[h * lds]] {
                    assert!(
                        (f64::from(got) - want).abs() <= bound + 1e-30,
                        "scores kind {kind} d {d} group {group} h {h}: {got} vs {want}"
                    );
                }
                assert!(s1[h * lds + 1].is_nan(), "wrote between heads");
                if kind == 2 {
                    // The same integer sums and last step as the portable kernel.
                    assert_eq!(s1[h * lds].to_bits(), s2[h * lds].to_bits(), "q16 bits");
                }
            }
            for w in 1..=4 {
                let ldp = 5;
                let mut p = uniform(heads * ldp, 50 + w as u32, 1.0);
                p[ldp..2 * ldp].fill(0.0); // head 1: all weights 0, skipped
                let a0 = uniform(heads * d, 51, 1.0);
                let (mut a1, mut a2) = (a0.clone(), a0.clone());
                // SAFETY: as above.
                unsafe {
                    match kind {
                        0 => {
                            let v = [0, 1, 2, 3].map(rf);
                            (f.axpy_f32)(&mut a1, hg, Strided(&p, ldp), &v[..w]);
                            (s.axpy_f32)(&mut a2, hg, Strided(&p, ldp), &v[..w]);
                        }
                        1 => {
                            let v = [0, 1, 2, 3].map(rb);
                            (f.axpy_bf16)(&mut a1, hg, Strided(&p, ldp), &v[..w]);
                            (s.axpy_bf16)(&mut a2, hg, Strided(&p, ldp), &v[..w]);
                        }
                        _ => {
                            let v = [0, 1, 2, 3].map(ri);
                            (f.axpy_i8)(&mut a1, hg, Strided(&p, ldp), &v[..w]);
                            (s.axpy_i8)(&mut a2, hg, Strided(&p, ldp), &v[..w]);
                        }
                    }
                }
                for h in 0..heads {
                    let g = h / group;
                    for j in 0..d {
                        let i = h * d + j;
                        let (mut want, mut mag) = (f64::from(a0[i]), f64::from(a0[i]).abs());
                        for u in 0..w {
                            let x = f64::from(p[h * ldp + u]) * deq(u, kind, g, j);
                            want += x;
                            mag += x.abs();
                        }
                        for got in [a1[i], a2[i]] {
                            assert!(
                                (f64::from(got) - want).abs() <= 1e-5 * mag,
                                "axpy kind {kind} d {d} group {group} w {w} at {i}: \
                                 {got} vs {want}"
                            );
                        }
                    }
                }
                assert_eq!(a1[d..2 * d], a0[d..2 * d], "head 1 (zero weights) changed");
            }
        }
    }
}

fn matches_scalar(f: Kernels) {
    let s = Kernels::scalar();
    // Under Miri (half a minute per length there) three lengths: 40 still has a 16-lane
    // tail after full vectors in `softmax_row` (valid 21 and 40) and `scale`.
    let dims: &[usize] = if cfg!(miri) {
        &[1, 8, 40]
    } else {
        &[1, 7, 8, 64, 72, 100, 128]
    };
    for &d in dims {
        let a = uniform(d * MR, d as u32, 1.0);
        let b = uniform(d * NR, 3 + d as u32, 1.0);
        let (mut s1, mut s2) = (vec![0f32; MR * 20], vec![0f32; MR * 20]);
        // SAFETY: a holds d*MR floats, b d*NR, s rows of NR at stride 20 (MR*20 floats).
        unsafe {
            (f.qk_tile)(a.as_ptr(), d, b.as_ptr(), s1.as_mut_ptr(), 20);
            (s.qk_tile)(a.as_ptr(), d, b.as_ptr(), s2.as_mut_ptr(), 20);
        }
        close(&s1, &s2, 1e-5);

        let nk = d.min(50);
        let p = uniform(MR * 50, 5, 1.0);
        let v = uniform(nk * 32, 6, 1.0);
        let (mut o1, mut o2) = (uniform(MR * 24, 7, 1.0), uniform(MR * 24, 7, 1.0));
        // SAFETY: p rows of nk <= 50 at stride 50; v rows of 16 at stride 32 (nk rows);
        // o rows of 16 at stride 24.
        unsafe {
            let (p, v) = (Strided(p.as_ptr(), 50), Strided(v.as_ptr(), 32));
            (f.pv_tile)(p, v, nk, Strided(o1.as_mut_ptr(), 24));
            (s.pv_tile)(p, v, nk, Strided(o2.as_mut_ptr(), 24));
        }
        close(&o1, &o2, 1e-5);

        let mut a1 = uniform(d, 10, 1.0);
        let mut a2 = a1.clone();
        // SAFETY: slice-based kernels on a CPU `detect` chose them for.
        unsafe {
            (f.scale)(&mut a1, 0.7);
            (s.scale)(&mut a2, 0.7);
        }
        close(&a1, &a2, 1e-5);

        for (nk, nkp) in [(0, 16), (5, 16), (8, 16), (16, 16), (27, 32), (64, 64)] {
            let stride = d + 5;
            let k = uniform(nk.max(1) * stride, 16, 1.0);
            let (mut p1, mut p2) = (vec![f32::NAN; nkp * d], vec![f32::NAN; nkp * d]);
            // SAFETY: as above.
            unsafe {
                let t = scalar::KTile { stride, nk, nkp, d };
                (f.pack_k)(&k, t, &mut p1);
                (s.pack_k)(&k, t, &mut p2);
            }
            assert_eq!(p1, p2, "pack_k d {d} nk {nk}");
            for j in 0..nkp {
                for x in 0..d {
                    let want = if j < nk { k[j * stride + x] } else { 0.0 };
                    assert_eq!(p2[(j / NR) * d * NR + x * NR + j % NR], want);
                }
            }
        }

        for valid in [1, d / 2 + 1, d] {
            let (mut r1, mut r2) = (uniform(d, 15, 1.0), uniform(d, 15, 1.0));
            for m_old in [f32::NEG_INFINITY, 0.5, 30.0] {
                // SAFETY: as above.
                let (x1, x2) = unsafe {
                    (
                        (f.softmax_row)(&mut r1, valid, 9.0, m_old),
                        (s.softmax_row)(&mut r2, valid, 9.0, m_old),
                    )
                };
                close(&[x1.0, x1.1], &[x2.0, x2.1], 1e-5);
                close(&r1, &r2, 1e-5);
                assert!(r1[valid..].iter().all(|&z| z == 0.0));
            }
        }
    }
}
