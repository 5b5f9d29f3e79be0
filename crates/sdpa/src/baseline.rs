//! This machine's own limits, for measuring the kernel against them in the same run (feature
//! `baseline`): a plain streaming read (decode's bound) and `matrixmultiply`'s sgemm
//! (prefill's), with the timing helpers both measurements use.
//!
//! The method: baseline and kernel are timed in turns ([`interleaved`]) for a few rounds, so
//! both see the same machine load; "best" compares best times ([`best`]), "median" is the
//! [`median`] over rounds of the ratio within a round. Used by `examples/speed.rs` and by
//! `allocbench sdpa`; the kernel itself does not depend on any of it.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use crate::Shape;

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

/// `reps` timings (seconds; at least one round) of each closure after one untimed warm-up call
/// each, the closures taking turns so that a baseline and a kernel timed in the same round saw
/// the same machine load (the machine may be shared).
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

/// Best (smallest) time of closure `i` over `rounds`.
pub fn best<const N: usize>(rounds: &[[f64; N]], i: usize) -> f64 {
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

/// Adds `x` into 32 independent lanes (vectorises without a dependency chain), with AVX2
/// (fewer instructions per byte, so more loads in flight) when the CPU has it.
#[inline(never)]
fn sum_block(acc: [f32; 32], x: &[f32]) -> [f32; 32] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { sum_block_avx2(acc, x) };
        }
    }
    sum_block_portable(acc, x)
}

/// [`sum_block_portable`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_block_avx2(acc: [f32; 32], x: &[f32]) -> [f32; 32] {
    sum_block_portable(acc, x)
}

#[inline(always)]
fn sum_block_portable(mut acc: [f32; 32], x: &[f32]) -> [f32; 32] {
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

/// Bytes per second / 1e9.
pub fn gbs(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
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

/// The decode call the benchmarks measure: batch 1, one query row attending to all `kv_len`
/// positions of a cache that holds exactly them (start_pos `kv_len - 1`).
pub fn decode_shape(heads: usize, kv_heads: usize, head_dim: usize, kv_len: usize) -> Shape {
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

/// The prefill call the benchmarks measure: batch 1, a prompt of `len` tokens from position 0
/// into a cache of exactly `len` positions.
pub fn prefill_shape(heads: usize, kv_heads: usize, head_dim: usize, len: usize) -> Shape {
    Shape {
        batch: 1,
        q_len: len,
        heads,
        kv_heads,
        head_dim,
        kv_capacity: len,
        start_pos: 0,
    }
}

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
