//! Every dtype (f32, bf16, f16, and the int8 KV cache under each) x {causal, non-causal,
//! causal with a sliding window of 5} x {GQA, MHA} x {decode, prefill, start_pos > 0}, at every SIMD level this CPU runs, on
//! 0xFF-poisoned scratch, against the f64 reference computed from the same rounded (or
//! dequantized) inputs.
//!
//! Bounds, with `ref` the reference output element:
//! - f32 output: `|out - ref| <= 1e-4` (f32 accumulation, as `attention.rs`);
//! - bf16 output: `|out - ref| <= 1e-4 + 2^-8 |ref|` (the f32 error plus the final rounding to
//!   bf16, at most 2^-9 relative, with a factor 2 of margin);
//! - f16 output: `|out - ref| <= 1e-4 + 2^-10 |ref|` (same, for f16's 2^-11).
//!
//! Subnormal f16 outputs would need an absolute term of 2^-25; 1e-4 covers it.
//!
//! The int8 cache adds the error of its integer dot product, which scores K against the query
//! rows quantized to i16 per head (step `s_h = max_j |q_hj| / 32767`): each score is off by at
//! most `delta = |scale| * max_t kscale_t * s_h / 2 * sum_j |k_tj - zp_t|`, which moves each
//! softmax weight by a factor within `e^(+-2 delta)` and so the output by at most
//! `(e^(2 delta) - 1) * max |v|` ([`q16_bound`], computed from the data of each case).
//!
//! Its integer `P . V` (AVX2 and portable sets) adds the rounding of its i16 weights: per
//! query row, head and tile `T` of positions, `w_t = p_t * vscale_t` becomes `w16_t * step_T`
//! with `step_T = max_{t in T} |w_t| / 32767` and `|w16_t * step_T - w_t| <= c * step_T`, `c =
//! 1/2 + 2^-8` (half a step, plus the f32 rounding of `w_t / step_T`). Every later factor
//! (the online softmax's rescales, the chunk merge's weight, the final `1 / l`) multiplies
//! `w_t` and `step_T` alike, turning `p_t` into the softmax weight `a_t <= 1`; so output lane
//! `j` is off by at most `sum_T c * max_{t in T} (a_t vscale_t) / 32767 * sum_{t in T} |v_tj -
//! zp_t| <= c / 32767 * max_t vscale_t * sum_t |v_tj - zp_t|` ([`pv16_bound`], the largest
//! over the case's sequences, KV heads and lanes).

mod common;

use common::*;
use sdpa::{
    attention_quantized, attention_typed, available_simd_levels, quantize_kv, scratch_bytes_with,
    with_max_simd, Bf16, Dtype, Element, KvCache, Params, QuantizedKv, QuantizedKvMut, Shape, F16,
    SCRATCH_ALIGN,
};

/// The relative part of the bound for outputs of type `T`.
fn rel_tol<T: Element>() -> f32 {
    match T::DTYPE {
        Dtype::F32 => 0.0,
        Dtype::Bf16 => 1.0 / 256.0,
        Dtype::F16 => 1.0 / 1024.0,
        other => panic!("no error bound stated for {other:?}: add one here"),
    }
}

const ABS_TOL: f32 = 1e-4;

fn round<T: Element>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f32(v)).collect()
}

fn widen<T: Element>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// Checks `out` against `want` with the bound of `T`.
fn check_out<T: Element>(out: &[T], want: &[f32], what: &str) {
    check_out_plus(out, want, what, 0.0);
}

/// Checks `out` against `want` with the bound of `T` plus `extra` (absolute).
fn check_out_plus<T: Element>(out: &[T], want: &[f32], what: &str, extra: f32) {
    let rel = rel_tol::<T>();
    for (i, (o, w)) in out.iter().zip(want).enumerate() {
        let o = o.to_f32();
        let bound = ABS_TOL + extra + rel * w.abs();
        assert!(
            (o - w).abs() <= bound,
            "{what}: element {i}: {o} vs reference {w} (bound {bound})"
        );
    }
}

/// The cases of the matrix: (name, shape) for {decode, prefill, start_pos > 0 (tiled and row
/// paths)} x {GQA, MHA}.
fn shapes() -> Vec<(String, Shape)> {
    let mut v = Vec::new();
    for (kind, heads, kv_heads) in [("gqa", 8, 2), ("mha", 4, 4)] {
        for (case, q_len, sp) in [
            ("decode", 1, 70),
            ("prefill", 23, 0),
            ("start_pos", 9, 41),
            ("short", 3, 33),
        ] {
            v.push((
                format!("{case} {kind}"),
                shape(2, q_len, heads, kv_heads, 72, sp),
            ));
        }
    }
    v
}

fn params() -> [Params; 3] {
    [
        Params::default(),
        Params::default().with_window(5),
        Params {
            causal: false,
            scale: None,
            window: None,
        },
    ]
}

/// Runs `f` once per SIMD level this CPU runs (the test names the level in failures); a
/// level above an `SDPA_MAX_SIMD` cap is skipped with a note.
fn each_level(mut f: impl FnMut(&str)) {
    for level in available_simd_levels() {
        with_max_simd(level, || {
            if sdpa::simd_level() != level {
                assert!(std::env::var_os("SDPA_MAX_SIMD").is_some());
                println!("{level} skipped: SDPA_MAX_SIMD caps it");
                return;
            }
            f(level.name())
        });
    }
}

/// The call asked `temp` for one buffer, of the documented scratch size.
fn assert_one_request(
    temp: &PoisonAlloc,
    (sh, p): (&Shape, &Params),
    dtype: Dtype,
    cache: KvCache,
    what: &str,
) {
    let threads = rayon::current_num_threads();
    let bytes = scratch_bytes_with(sh, p, threads, dtype, cache).unwrap();
    assert_eq!(
        *temp.requests.lock().unwrap(),
        vec![(bytes, SCRATCH_ALIGN)],
        "{what}"
    );
}

fn dense<T: Element>() {
    each_level(|level| {
        for (name, sh) in shapes() {
            for p in params() {
                let (q, k, v) = inputs(&sh, 7, 2.0);
                let (q, k, v) = (round::<T>(&q), round::<T>(&k), round::<T>(&v));
                let want = reference(&widen(&q), &widen(&k), &widen(&v), &sh, &p);
                let mut out = vec![T::from_f32(f32::NAN); want.len()];
                let temp = PoisonAlloc::default();
                attention_typed(&q, &k, &v, &mut out, &sh, &p, &temp).unwrap();
                let what = format!(
                    "{} {level} {name} causal={} window={:?}",
                    T::DTYPE,
                    p.causal,
                    p.window
                );
                check_out(&out, &want, &what);
                assert_one_request(&temp, (&sh, &p), T::DTYPE, KvCache::Dense, &what);
            }
        }
    });
}

/// One `#[test]` per element type, each running a whole matrix (so a failure names its type).
macro_rules! per_dtype {
    ($($name:ident => $run:expr),* $(,)?) => {$(
        #[test]
        fn $name() {
            $run;
        }
    )*};
}

per_dtype!(
    f32_matrix => dense::<f32>(),
    bf16_matrix => dense::<Bf16>(),
    f16_matrix => dense::<F16>(),
);

/// An int8 cache `[batch, cap, kv_heads, d]` with NaN scales everywhere (so a position never
/// written would poison any output that read it).
struct Cache {
    values: Vec<i8>,
    scales: Vec<f32>,
    zps: Vec<i8>,
}

impl Cache {
    fn new(sh: &Shape) -> Cache {
        let rows = sh.batch * sh.kv_capacity * sh.kv_heads;
        Cache {
            values: vec![0x55; rows * sh.head_dim],
            scales: vec![f32::NAN; rows],
            zps: vec![3; rows],
        }
    }

    fn view(&self) -> QuantizedKv<'_> {
        QuantizedKv {
            values: &self.values,
            scales: &self.scales,
            zero_points: &self.zps,
        }
    }

    fn view_mut(&mut self) -> QuantizedKvMut<'_> {
        QuantizedKvMut {
            values: &mut self.values,
            scales: &mut self.scales,
            zero_points: &mut self.zps,
        }
    }

    /// The dequantized cache, computed here from the definition (NaN where never written).
    fn dequantized(&self, d: usize) -> Vec<f32> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, &q)| (f32::from(q) - f32::from(self.zps[i / d])) * self.scales[i / d])
            .collect()
    }
}

/// The extra output error bound of the int8 cache's i16 query (see the module docs), over
/// every query row, head and visible position of the case (all of `0..kv_len`: a superset).
fn q16_bound(q: &[f32], k: &Cache, vd: &[f32], sh: &Shape, p: &Params) -> f32 {
    let d = sh.head_dim;
    let scale = f64::from(p.scale.unwrap_or(1.0 / (d as f32).sqrt()).abs());
    let group = sh.heads / sh.kv_heads;
    let mut delta = 0f64;
    let mut vmax = 0f64;
    for b in 0..sh.batch {
        for t in 0..sh.kv_len() {
            for g in 0..sh.kv_heads {
                let r = (b * sh.kv_capacity + t) * sh.kv_heads + g;
                let ksum: f64 = k.values[r * d..(r + 1) * d]
                    .iter()
                    .map(|&x| (f64::from(x) - f64::from(k.zps[r])).abs())
                    .sum();
                for x in &vd[r * d..(r + 1) * d] {
                    vmax = vmax.max(f64::from(*x).abs());
                }
                for i in 0..sh.q_len {
                    for h in g * group..(g + 1) * group {
                        let o = ((b * sh.q_len + i) * sh.heads + h) * d;
                        let qmax = q[o..o + d]
                            .iter()
                            .fold(0f64, |m, x| m.max(f64::from(*x).abs()));
                        let step = qmax / 32767.0;
                        delta = delta.max(scale * f64::from(k.scales[r]) * step / 2.0 * ksum);
                    }
                }
            }
        }
    }
    ((2.0 * delta).exp_m1() * vmax) as f32
}

/// The extra output error bound of the int8 cache's integer `P . V` (see the module docs):
/// `(1/2 + 2^-8) / 32767 * max_t vscale_t * sum_t |v_t[j] - zp_t|`, the largest over every
/// sequence, KV head and lane, over all of `0..kv_len` (a superset of what a row sees).
fn pv16_bound(v: &Cache, sh: &Shape) -> f32 {
    let d = sh.head_dim;
    let mut bound = 0f64;
    for b in 0..sh.batch {
        for g in 0..sh.kv_heads {
            let r = |t: usize| (b * sh.kv_capacity + t) * sh.kv_heads + g;
            let vmax = (0..sh.kv_len()).fold(0f64, |m, t| m.max(f64::from(v.scales[r(t)]).abs()));
            for j in 0..d {
                let sum: f64 = (0..sh.kv_len())
                    .map(|t| (f64::from(v.values[r(t) * d + j]) - f64::from(v.zps[r(t)])).abs())
                    .sum();
                bound = bound.max((0.5 + 1.0 / 256.0) / 32767.0 * vmax * sum);
            }
        }
    }
    bound as f32
}

/// Quantizes positions `0..kv_len` of `x` (a dense f32 cache) into `cache` in two calls:
/// positions before `start_pos` (a "prefill"), then the rest (the new rows), as a runner would.
fn fill_cache<T: Element>(x: &[f32], sh: &Shape, cache: &mut Cache) {
    let row = sh.kv_heads * sh.head_dim;
    for (sp, n) in [(0, sh.start_pos), (sh.start_pos, sh.q_len)] {
        if n == 0 {
            continue;
        }
        let part = Shape {
            q_len: n,
            start_pos: sp,
            ..*sh
        };
        let mut rows = Vec::new();
        for b in 0..sh.batch {
            let o = (b * sh.kv_capacity + sp) * row;
            rows.extend(round::<T>(&x[o..o + n * row]));
        }
        quantize_kv(&rows, cache.view_mut(), &part).unwrap();
    }
}

fn quantized<T: Element>() {
    each_level(|level| {
        for (name, sh) in shapes() {
            for p in params() {
                let (q, k, v) = inputs(&sh, 9, 2.0);
                let q = round::<T>(&q);
                let (mut kc, mut vc) = (Cache::new(&sh), Cache::new(&sh));
                fill_cache::<T>(&k, &sh, &mut kc);
                fill_cache::<T>(&v, &sh, &mut vc);
                let (kd, vd) = (kc.dequantized(sh.head_dim), vc.dequantized(sh.head_dim));
                let want = reference(&widen(&q), &kd, &vd, &sh, &p);
                let mut out = vec![T::from_f32(f32::NAN); want.len()];
                let temp = PoisonAlloc::default();
                attention_quantized(&q, kc.view(), vc.view(), &mut out, &sh, &p, &temp).unwrap();
                let what = format!(
                    "int8 kv, {} {level} {name} causal={} window={:?}",
                    T::DTYPE,
                    p.causal,
                    p.window
                );
                let extra = q16_bound(&widen(&q), &kc, &vd, &sh, &p) + pv16_bound(&vc, &sh);
                check_out_plus(&out, &want, &what, extra);
                assert_one_request(&temp, (&sh, &p), T::DTYPE, KvCache::Int8, &what);
                // The quantized cache is close to the f32 one it came from (half a step).
                let kv_len = sh.kv_len() * sh.kv_heads * sh.head_dim;
                for (a, b) in kd[..kv_len].iter().zip(&k[..kv_len]) {
                    assert!(
                        (a - b).abs() <= 2.0 / 255.0 * 0.5 + 1e-2,
                        "{what}: {a} vs {b}"
                    );
                }
            }
        }
    });
}

per_dtype!(
    int8_kv_f32_matrix => quantized::<f32>(),
    int8_kv_bf16_matrix => quantized::<Bf16>(),
    int8_kv_f16_matrix => quantized::<F16>(),
);

/// Long prefill and long decode through the conversion paths (several tiles and chunks).
#[test]
fn long_bf16_and_int8() {
    let p = Params::default();
    for sh in [shape(1, 150, 2, 1, 64, 0), shape(1, 1, 8, 2, 128, 900)] {
        let (q, k, v) = inputs(&sh, 11, 2.0);
        let (qb, kb, vb) = (round::<Bf16>(&q), round::<Bf16>(&k), round::<Bf16>(&v));
        let want = reference(&widen(&qb), &widen(&kb), &widen(&vb), &sh, &p);
        let mut out = vec![Bf16::default(); want.len()];
        attention_typed(&qb, &kb, &vb, &mut out, &sh, &p, &PoisonAlloc::default()).unwrap();
        check_out(&out, &want, &format!("bf16 {sh:?}"));

        let (mut kc, mut vc) = (Cache::new(&sh), Cache::new(&sh));
        fill_cache::<f32>(&k, &sh, &mut kc);
        fill_cache::<f32>(&v, &sh, &mut vc);
        let want = reference(
            &q,
            &kc.dequantized(sh.head_dim),
            &vc.dequantized(sh.head_dim),
            &sh,
            &p,
        );
        let mut out = vec![0f32; want.len()];
        attention_quantized(
            &q,
            kc.view(),
            vc.view(),
            &mut out,
            &sh,
            &p,
            &PoisonAlloc::default(),
        )
        .unwrap();
        let extra =
            q16_bound(&q, &kc, &vc.dequantized(sh.head_dim), &sh, &p) + pv16_bound(&vc, &sh);
        check_out_plus(&out, &want, &format!("int8 {sh:?}"), extra);
    }
}
