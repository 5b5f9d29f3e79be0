//! Whole attention calls at the AVX-512 level against the portable level: what the
//! kernel-by-kernel checks of [`super`] do not reach (the dispatch, the query order the set
//! takes, the path code around the kernels).

use crate::{
    attention_quantized, attention_typed, quantize_kv, simd_level, with_max_simd, Bf16, Params,
    QuantizedKv, QuantizedKvMut, Shape, SimdLevel,
};
use caching_allocator::CachingAllocator;
use kernel_simd::test_data::uniform;

/// One call at the current level: f32, bf16 or (`int8`) f32 Q over an int8 cache holding
/// `k` and `v`; the output as f32.
fn call(kind: usize, q: &[f32], k: &[f32], v: &[f32], sh: &Shape, p: &Params) -> Vec<f32> {
    let temp = CachingAllocator::new(8 << 20);
    let mut out = vec![0f32; q.len()];
    match kind {
        0 => attention_typed(q, k, v, &mut out, sh, p, &temp).unwrap(),
        1 => {
            let b = |x: &[f32]| x.iter().map(|&y| Bf16::from_f32(y)).collect::<Vec<_>>();
            let mut ob = b(&out);
            attention_typed(&b(q), &b(k), &b(v), &mut ob, sh, p, &temp).unwrap();
            out = ob.iter().map(|x| x.to_f32()).collect();
        }
        _ => {
            let rows = sh.kv_capacity * sh.kv_heads;
            let all = Shape {
                q_len: sh.kv_capacity,
                start_pos: 0,
                ..*sh
            };
            let quant = |x: &[f32]| {
                let mut c = (vec![0i8; x.len()], vec![0f32; rows], vec![0i8; rows]);
                let m = QuantizedKvMut {
                    values: &mut c.0,
                    scales: &mut c.1,
                    zero_points: &mut c.2,
                };
                quantize_kv(x, m, &all).unwrap();
                c
            };
            let (kc, vc) = (quant(k), quant(v));
            let [kv, vv] = [&kc, &vc].map(|c| QuantizedKv {
                values: &c.0,
                scales: &c.1,
                zero_points: &c.2,
            });
            attention_quantized(q, kv, vv, &mut out, sh, p, &temp).unwrap();
        }
    }
    // SAFETY: nothing handed out by `temp` is used any more.
    unsafe { temp.reset_unchecked() };
    out
}

/// Whole calls at the AVX-512 level agree with the portable level: decode (the row path)
/// and prefill (the tiled path), causal or not, GQA, head dim 40 (16-lane tails), f32,
/// bf16 and the int8 cache. This reaches what the kernel unit checks do not: the
/// dispatch, the unsplit bf16 query order the set takes, and the path code around the
/// kernels. CI runs it under Miri with the target features on, under Tree Borrows (see
/// `.ci/run`: rayon's crossbeam-epoch is known not to pass Stacked Borrows).
#[test]
fn avx512_attention_matches_portable() {
    if !kernel_simd::Level::Avx512.is_available() {
        eprintln!("no AVX-512 here: the AVX-512 set is tested under Miri (.ci/run)");
        return;
    }
    // Under Miri (~45 s a shape there) decode and a causal prefill.
    let shapes: &[(usize, usize, bool)] = if cfg!(miri) {
        &[(1, 36, true), (9, 0, true)]
    } else {
        &[(1, 36, true), (3, 20, false), (9, 0, true)]
    };
    for &(q_len, start_pos, causal) in shapes {
        let sh = Shape {
            batch: 1,
            q_len,
            heads: 4,
            kv_heads: 2,
            head_dim: 40,
            kv_capacity: 40,
            start_pos,
        };
        let p = Params {
            causal,
            ..Params::default()
        };
        let q = uniform(q_len * 4 * 40, 1, 1.0);
        let (k, v) = (uniform(40 * 2 * 40, 2, 1.0), uniform(40 * 2 * 40, 3, 1.0));
        for kind in 0..3 {
            let got = call(kind, &q, &k, &v, &sh, &p);
            assert_eq!(simd_level(), SimdLevel::Avx512);
            let want = with_max_simd(SimdLevel::Portable, || call(kind, &q, &k, &v, &sh, &p));
            // bf16 outputs may round to neighbouring values (2^-8 apart).
            let tol = if kind == 1 { 1.0 / 128.0 } else { 1e-5 };
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + b.abs()),
                    "kind {kind} q_len {q_len} at {i}: {a} vs {b}"
                );
            }
        }
    }
}
