//! Kernel efficiency against this machine's own limits, measured in the same run:
//! decode as GB/s of K/V read vs a plain streaming read, prefill as GFLOP/s vs
//! `matrixmultiply`'s sgemm on the same thread count.
//!
//! `cargo run --release -p allocbench --example sdpa_speed [-- --quick]`
//!
//! Threads: rayon's global pool (`RAYON_NUM_THREADS`, default one per CPU) for the kernel and
//! the streaming read; matrixmultiply's pool is set to the same count (`MATMUL_NUM_THREADS`).

use std::hint::black_box;

use allocbench::measure::{
    best, decode_shape, fill, gbs, interleaved, median, prefill_flops, prefill_shape,
    set_sgemm_threads, sgemm, stream_read,
};
use caching_allocator::CachingAllocator;
use sdpa::{attention, scratch_bytes, Params};

const HEADS: usize = 32;
const HEAD_DIM: usize = 128;
/// Bytes of K/V the decode model spans (over its layers), well over the 32 MiB L3.
const DECODE_SPAN: usize = 512 << 20;

/// Decode over `layers` separate caches of `kv` positions each, interleaved with two streaming
/// reads (the faster is the baseline): of `stream`, one run per thread, and of the layers'
/// own K/V buffers, four runs per thread and one pool call per buffer like the kernel: (best
/// stream GB/s, best K/V GB/s, median over rounds of the ratio of the two, best ms per token
/// over all layers, scratch bytes).
fn decode(
    kv: usize,
    layers: usize,
    reps: usize,
    stream: &[f32],
    temp: &CachingAllocator,
) -> (f64, f64, f64, f64, usize) {
    let sh = decode_shape(HEADS, HEADS, HEAD_DIM, kv);
    let n = kv * HEADS * HEAD_DIM;
    let ks: Vec<Vec<f32>> = (0..layers).map(|l| fill(n, 2 * l as u32 + 1)).collect();
    let vs: Vec<Vec<f32>> = (0..layers).map(|l| fill(n, 2 * l as u32 + 2)).collect();
    let q = fill(HEADS * HEAD_DIM, 99);
    let mut out = vec![0f32; HEADS * HEAD_DIM];
    let p = Params::default();
    let rounds = interleaved(
        reps,
        &mut [
            &mut || stream_read(stream, 1),
            &mut || {
                // The same K/V bytes the kernel reads, in the same order, one call per buffer.
                for l in 0..layers {
                    stream_read(&ks[l], 4);
                    stream_read(&vs[l], 4);
                }
            },
            &mut || {
                for l in 0..layers {
                    attention(&q, &ks[l], &vs[l], &mut out, &sh, &p, temp).unwrap();
                    // SAFETY: nothing from `temp` is used after the call returned.
                    unsafe { temp.reset_unchecked() };
                }
                black_box(&out);
            },
        ],
    );
    let (sb, kb) = (stream.len() * 4, 2 * n * 4 * layers);
    // Closures 0 and 1 are the streaming reads (the faster of the two is a round's baseline),
    // closure 2 is the decode.
    let base = |r: &[f64]| r[0].min(r[1]);
    let ratio = median(
        &rounds
            .iter()
            .map(|r| gbs(kb, r[2]) / gbs(sb, base(r)))
            .collect::<Vec<_>>(),
    );
    (
        gbs(sb, best(&rounds, 0).min(best(&rounds, 1))),
        gbs(kb, best(&rounds, 2)),
        ratio,
        best(&rounds, 2) * 1e3,
        scratch_bytes(&sh, rayon::current_num_threads()).unwrap(),
    )
}

/// Prefill of `len` tokens from position 0, interleaved with two sgemms (1024^3 and the
/// attention-shaped 2048x128x2048): (best sgemm GFLOP/s, best kernel GFLOP/s counting
/// visible pairs only, median over rounds of their ratio, ms per call, scratch bytes).
fn prefill(
    len: usize,
    causal: bool,
    reps: usize,
    temp: &CachingAllocator,
) -> (f64, f64, f64, f64, usize) {
    let sh = prefill_shape(HEADS, HEADS, HEAD_DIM, len);
    let n = len * HEADS * HEAD_DIM;
    let (q, k, v) = (fill(n, 1), fill(n, 2), fill(n, 3));
    let mut out = vec![0f32; n];
    let p = Params {
        causal,
        ..Params::default()
    };
    let (a, b) = (fill(2048 * 1024, 5), fill(1024 * 2048, 6));
    let mut c = vec![0f32; 2048 * 2048];
    let mut c2 = vec![0f32; 1024 * 1024];
    let rounds = interleaved(
        reps,
        &mut [
            &mut || sgemm(1024, 1024, 1024, &a, &b, &mut c2),
            &mut || sgemm(2048, 128, 2048, &a, &b, &mut c),
            &mut || {
                attention(&q, &k, &v, &mut out, &sh, &p, temp).unwrap();
                // SAFETY: nothing from `temp` is used after the call returned.
                unsafe { temp.reset_unchecked() };
                black_box(&out);
            },
        ],
    );
    let sgemm_gflops = |r: &[f64]| {
        let g1 = 2.0 * 1024f64.powi(3) / r[0] / 1e9;
        let g2 = 2.0 * 2048.0 * 128.0 * 2048.0 / r[1] / 1e9;
        g1.max(g2)
    };
    let flops = prefill_flops(&sh, causal);
    let ratio = median(
        &rounds
            .iter()
            .map(|r| flops / r[2] / 1e9 / sgemm_gflops(r))
            .collect::<Vec<_>>(),
    );
    let sgemm_best = rounds.iter().map(|r| sgemm_gflops(r)).fold(0.0, f64::max);
    (
        sgemm_best,
        flops / best(&rounds, 2) / 1e9,
        ratio,
        best(&rounds, 2) * 1e3,
        scratch_bytes(&sh, rayon::current_num_threads()).unwrap(),
    )
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let threads = rayon::current_num_threads();
    // Read by matrixmultiply on its first threaded call (below), before it starts threads.
    set_sgemm_threads(threads);
    let reps = if quick { 3 } else { 9 };
    let temp = CachingAllocator::new(64 << 20);
    println!(
        "sdpa speed: {threads} threads, SIMD level {}, heads {HEADS} (= kv heads), \
         head_dim {HEAD_DIM}; {reps} rounds timing baseline and kernel in turns: best \
         figures, and the median over rounds of the same-round ratio",
        sdpa::simd_level()
    );

    let span = if quick { DECODE_SPAN / 2 } else { DECODE_SPAN };
    let stream = fill(span / 4, 7);
    println!(
        "\ndecode (q_len 1, layers cycled over {} MiB of K/V so they come from DRAM) vs the faster \
         of two streaming reads (a {} MiB buffer; the same K/V buffers):",
        span >> 20,
        span >> 20
    );
    println!(
        "  kv_len  layers  ms/token  stream GB/s  K/V GB/s  ratio(best)  ratio(median)  scratch bytes"
    );
    let kvs: &[usize] = if quick {
        &[256, 1024, 4096]
    } else {
        &[64, 256, 512, 1024, 2048, 4096]
    };
    for &kv in kvs {
        let per_layer = 2 * kv * HEADS * HEAD_DIM * 4;
        let layers = span.div_ceil(per_layer).clamp(1, 256);
        let (sg, kg, ratio, ms, scratch) = decode(kv, layers, reps, &stream, &temp);
        println!(
            "  {kv:>6}  {layers:>6}  {ms:>8.3}  {sg:>11.1}  {kg:>8.1}  {:>10.0}%  {:>12.0}%  {scratch:>13}",
            100.0 * kg / sg,
            100.0 * ratio
        );
    }
    drop(stream);

    println!(
        "\nprefill (batch 1, start_pos 0; FLOPs = 4 * head_dim per visible (query, key) pair) vs \
         matrixmultiply sgemm on {threads} threads (best of 1024^3 and 2048x128x2048):"
    );
    println!(
        "  tokens  causal  ms/call  sgemm GFLOP/s  GFLOP/s  ratio(best)  ratio(median)  scratch bytes"
    );
    let lens: &[usize] = if quick {
        &[128, 512]
    } else {
        &[128, 512, 2048]
    };
    for &len in lens {
        for causal in [true, false] {
            let (sg, kg, ratio, ms, scratch) = prefill(len, causal, reps, &temp);
            println!(
                "  {len:>6}  {causal:>6}  {ms:>7.2}  {sg:>13.1}  {kg:>7.1}  {:>10.0}%  {:>12.0}%  {scratch:>13}",
                100.0 * kg / sg,
                100.0 * ratio
            );
        }
    }
}
