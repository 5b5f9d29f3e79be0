//! This machine's own limits, measured in the same run as the kernel: a plain streaming read
//! (decode's bound) and `matrixmultiply`'s sgemm (prefill's), and the kernel's efficiency
//! against each.
//!
//! The method is that of `crates/sdpa/examples/speed.rs` (ported here so that `allocbench sdpa`
//! reports it in one run): baseline and kernel are timed in turns for a few rounds, so both
//! see the same machine load; "best" compares best times, "median" is the median over rounds
//! of the ratio within a round.

use std::hint::black_box;
use std::time::Instant;

use ::sdpa::{attention, Params, Shape};
use rayon::prelude::*;

use crate::source::TempAllocator;

/// Deterministic pseudo-random floats in `[-0.5, 0.5)` (xorshift), `n` of them.
pub fn fill(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// `reps` timings (seconds) of each closure after one untimed call each, the closures taking
/// turns so that a baseline and a kernel timed in the same round saw the same machine load.
pub fn interleaved<const N: usize>(reps: usize, fs: &mut [&mut dyn FnMut(); N]) -> Vec<[f64; N]> {
    for f in fs.iter_mut() {
        f();
    }
    (0..reps.max(1))
        .map(|_| {
            let mut round = [0.0; N];
            for (f, r) in fs.iter_mut().zip(&mut round) {
                let t = Instant::now();
                f();
                *r = t.elapsed().as_secs_f64();
            }
            round
        })
        .collect()
}

fn best<const N: usize>(rounds: &[[f64; N]], i: usize) -> f64 {
    rounds.iter().map(|r| r[i]).fold(f64::INFINITY, f64::min)
}

/// The median of `xs` (the upper one for even lengths); NaN when empty.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One streaming read of `buf`, split over the rayon pool; each thread reads its part as
/// `streams` interleaved sequential runs (more than one run gives the memory system more
/// independent streams, which reads faster on some machines).
pub fn stream_read(buf: &[f32], streams: usize) {
    let streams = streams.max(1);
    let part = buf.len().div_ceil(rayon::current_num_threads()).max(1);
    let s: f32 = buf
        .par_chunks(part)
        .map(|c| {
            let run = c.len().div_ceil(streams);
            let runs: Vec<&[f32]> = c.chunks(run.max(1)).collect();
            let mut acc = [0f32; 32];
            let mut pos = 0;
            while pos < run {
                let end = (pos + 4096).min(run);
                for r in &runs {
                    acc = sum_block(acc, r.get(pos..end.min(r.len())).unwrap_or(&[]));
                }
                pos = end;
            }
            acc.iter().sum::<f32>()
        })
        .sum();
    black_box(s);
}

/// Adds `x` into 32 independent lanes (vectorises without a dependency chain).
#[inline(never)]
fn sum_block(mut acc: [f32; 32], x: &[f32]) -> [f32; 32] {
    let mut it = x.chunks_exact(32);
    for ch in &mut it {
        for (a, v) in acc.iter_mut().zip(ch) {
            *a += v;
        }
    }
    for (a, v) in acc.iter_mut().zip(it.remainder()) {
        *a += v;
    }
    acc
}

/// Gives matrixmultiply's thread pool `threads` threads unless `MATMUL_NUM_THREADS` is set.
/// matrixmultiply reads the variable on its first threaded call, so call this first, while
/// the process has a single thread (setting the environment is not thread-safe).
pub fn set_sgemm_threads(threads: usize) {
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", threads.max(1).to_string());
    }
}

/// The thread count matrixmultiply uses (its environment variable), if set.
pub fn sgemm_threads() -> Option<usize> {
    std::env::var("MATMUL_NUM_THREADS").ok()?.parse().ok()
}

/// matrixmultiply's sgemm `c = a . b`, `m x k` times `k x n`, row-major.
///
/// # Panics
/// When a slice is shorter than its matrix.
pub fn sgemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: a is m x k (row stride k), b is k x n (row stride n), c is m x n (row stride n),
    // all within their slices (asserted above); c does not alias a or b (a unique borrow).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    };
    black_box(c);
}

/// Bytes per second / 1e9.
pub fn gbs(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Decode's efficiency at one KV length.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeEfficiency {
    /// KV positions read per call.
    pub kv_len: usize,
    /// Separate layer caches cycled through, so that K/V come from DRAM.
    pub layers: usize,
    /// Bytes of the streaming-read buffer (and about the K/V span).
    pub span_bytes: usize,
    /// Best streaming-read GB/s (the faster of one and four runs per thread).
    pub stream_gbs: f64,
    /// Best kernel GB/s, counting the K and V bytes read.
    pub kernel_gbs: f64,
    /// `kernel_gbs / stream_gbs`.
    pub ratio_best: f64,
    /// Median over rounds of the same-round ratio.
    pub ratio_median: f64,
    /// Best time of one attention call (one layer), milliseconds.
    pub ms_per_call: f64,
}

/// Prefill's efficiency at one length.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PrefillEfficiency {
    /// Tokens (query rows = KV positions, start_pos 0).
    pub len: usize,
    /// Causal masking (FLOPs count visible pairs only).
    pub causal: bool,
    /// Best sgemm GFLOP/s (the best over the sgemm shapes).
    pub sgemm_gflops: f64,
    /// Best kernel GFLOP/s.
    pub kernel_gflops: f64,
    /// `kernel_gflops / sgemm_gflops`.
    pub ratio_best: f64,
    /// Median over rounds of the same-round ratio.
    pub ratio_median: f64,
    /// Best time of one attention call (one layer), milliseconds.
    pub ms_per_call: f64,
}

/// The shape of a decode call with `kv_len` positions (start_pos `kv_len - 1`).
fn decode_shape(heads: usize, kv_heads: usize, head_dim: usize, kv_len: usize) -> Shape {
    Shape {
        batch: 1,
        q_len: 1,
        heads,
        kv_heads,
        head_dim,
        kv_capacity: kv_len,
        start_pos: kv_len.saturating_sub(1),
    }
}

/// Measures decode at `kv_len` over enough separate layer caches to span `span_bytes` of K/V
/// (at most 64), against a streaming read of a `span_bytes` buffer, `reps` rounds. Scratch
/// comes from `temp`, reset after every call.
pub fn decode_efficiency(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    kv_len: usize,
    span_bytes: usize,
    reps: usize,
    temp: &dyn TempAllocator,
) -> Result<DecodeEfficiency, sdpa::SdpaError> {
    let sh = decode_shape(heads, kv_heads, head_dim, kv_len.max(1));
    let n = sh.kv_elems()?;
    let per_layer = 2 * n * 4;
    let layers = span_bytes.div_ceil(per_layer.max(1)).clamp(1, 64);
    let ks: Vec<Vec<f32>> = (0..layers).map(|l| fill(n, 2 * l as u32 + 1)).collect();
    let vs: Vec<Vec<f32>> = (0..layers).map(|l| fill(n, 2 * l as u32 + 2)).collect();
    let stream = fill(span_bytes.div_ceil(4).max(1), 7);
    let q = fill(sh.q_elems()?, 99);
    let mut out = vec![0f32; q.len()];
    let p = Params::default();
    let mut err = None;
    let rounds = interleaved(
        reps,
        &mut [
            &mut || stream_read(&stream, 1),
            &mut || stream_read(&stream, 4),
            &mut || {
                for l in 0..layers {
                    if let Err(e) = attention(&q, &ks[l], &vs[l], &mut out, &sh, &p, temp) {
                        err.get_or_insert(e);
                    }
                    // SAFETY: nothing from `temp` is used after the call returned, and no other
                    // call on it runs (this thread drives it alone).
                    unsafe { temp.reset() };
                }
                black_box(&out);
            },
        ],
    );
    if let Some(e) = err {
        return Err(e);
    }
    let (sb, kb) = (stream.len() * 4, per_layer * layers);
    // Closures 0 and 1 are the streaming reads (the faster is a round's baseline), 2 the decode.
    let ratio_median = median(
        rounds
            .iter()
            .map(|r| gbs(kb, r[2]) / gbs(sb, r[0].min(r[1])))
            .collect(),
    );
    let stream_gbs = gbs(sb, best(&rounds, 0).min(best(&rounds, 1)));
    let kernel_gbs = gbs(kb, best(&rounds, 2));
    Ok(DecodeEfficiency {
        kv_len,
        layers,
        span_bytes: sb,
        stream_gbs,
        kernel_gbs,
        ratio_best: kernel_gbs / stream_gbs,
        ratio_median,
        ms_per_call: best(&rounds, 2) * 1e3 / layers as f64,
    })
}

/// Measures a causal prefill of `len` tokens from position 0 against sgemm on each of
/// `sgemm_shapes` (`m, k, n`; the fastest counts), `reps` rounds. Scratch comes from `temp`.
pub fn prefill_efficiency(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    len: usize,
    sgemm_shapes: &[(usize, usize, usize)],
    reps: usize,
    temp: &dyn TempAllocator,
) -> Result<PrefillEfficiency, sdpa::SdpaError> {
    let sh = Shape {
        batch: 1,
        q_len: len,
        heads,
        kv_heads,
        head_dim,
        kv_capacity: len,
        start_pos: 0,
    };
    let (qn, kn) = (sh.q_elems()?, sh.kv_elems()?);
    let (q, k, v) = (fill(qn, 1), fill(kn, 2), fill(kn, 3));
    let mut out = vec![0f32; qn];
    let p = Params::default();
    let mut err = None;
    let mut kernel = || {
        if let Err(e) = attention(&q, &k, &v, &mut out, &sh, &p, temp) {
            err.get_or_insert(e);
        }
        // SAFETY: nothing from `temp` is used after the call returned; this thread alone
        // drives it.
        unsafe { temp.reset() };
        black_box(&out);
    };
    // One sgemm per shape, each with its own operands (m, k, n, a, b, c), then the kernel.
    let mut mats: Vec<SgemmCase> = sgemm_shapes
        .iter()
        .map(|&(m, k, n)| (m, k, n, fill(m * k, 5), fill(k * n, 6), vec![0f32; m * n]))
        .collect();
    let shape_count = mats.len();
    let mut times: Vec<Vec<f64>> = Vec::new();
    // Warm-up, then rounds in turns (as `interleaved`, with a run-time number of closures).
    for (m, k, n, a, b, c) in &mut mats {
        sgemm(*m, *k, *n, a, b, c);
    }
    kernel();
    for _ in 0..reps.max(1) {
        let mut round = Vec::with_capacity(shape_count + 1);
        for (m, k, n, a, b, c) in &mut mats {
            let t = Instant::now();
            sgemm(*m, *k, *n, a, b, c);
            round.push(t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        kernel();
        round.push(t.elapsed().as_secs_f64());
        times.push(round);
    }
    if let Some(e) = err {
        return Err(e);
    }
    let sgemm_gflops = |r: &[f64]| {
        sgemm_shapes
            .iter()
            .zip(r)
            .map(|(&(m, k, n), t)| 2.0 * (m * k * n) as f64 / t / 1e9)
            .fold(0.0, f64::max)
    };
    let flops = prefill_flops(&sh, true);
    let kernel_at = |r: &[f64]| flops / r[shape_count] / 1e9;
    let ratio_median = median(
        times
            .iter()
            .map(|r| kernel_at(r) / sgemm_gflops(r))
            .collect(),
    );
    let sgemm_best = times.iter().map(|r| sgemm_gflops(r)).fold(0.0, f64::max);
    let kernel_best = times.iter().map(|r| kernel_at(r)).fold(0.0, f64::max);
    let best_call = times
        .iter()
        .map(|r| r[shape_count])
        .fold(f64::INFINITY, f64::min);
    Ok(PrefillEfficiency {
        len,
        causal: true,
        sgemm_gflops: sgemm_best,
        kernel_gflops: kernel_best,
        ratio_best: kernel_best / sgemm_best,
        ratio_median,
        ms_per_call: best_call * 1e3,
    })
}

/// An sgemm baseline: `m, k, n` and the operands `a`, `b`, `c`.
type SgemmCase = (usize, usize, usize, Vec<f32>, Vec<f32>, Vec<f32>);

/// FLOPs of one attention call: `4 * head_dim` per visible (query, key) pair per head (a dot
/// product and an axpy of `head_dim`), counting only the visible pairs.
pub fn prefill_flops(sh: &Shape, causal: bool) -> f64 {
    let (q, s) = (sh.q_len as f64, sh.start_pos as f64);
    let pairs = if causal {
        // Row i sees s + i + 1 positions.
        q * s + q * (q + 1.0) / 2.0
    } else {
        q * (s + q)
    };
    (sh.batch * sh.heads) as f64 * pairs * 4.0 * sh.head_dim as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_count_visible_pairs() {
        let sh = Shape {
            batch: 1,
            q_len: 4,
            heads: 2,
            kv_heads: 2,
            head_dim: 8,
            kv_capacity: 4,
            start_pos: 0,
        };
        // 1 + 2 + 3 + 4 = 10 visible pairs per head, 2 heads, 32 FLOPs each.
        assert_eq!(prefill_flops(&sh, true), 10.0 * 2.0 * 32.0);
        assert_eq!(prefill_flops(&sh, false), 16.0 * 2.0 * 32.0);
    }

    #[test]
    fn sgemm_multiplies() {
        let (a, b) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let mut c = [0.0f32; 4];
        sgemm(2, 2, 2, &a, &b, &mut c);
        assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
    }

    #[test]
    fn median_picks_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert!(median(vec![]).is_nan());
    }
}
