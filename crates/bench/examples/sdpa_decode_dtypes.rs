//! Decode per dtype (f32, bf16, int8 KV cache with f32 Q) against a streaming read, timed in
//! turns in one run: a quicker loop than `allocbench sdpa` while working on the decode
//! kernels.
//!
//! `cargo run --release -p allocbench --example sdpa_decode_dtypes [-- KV... DTYPE...]` (default KV
//! lengths 1024 and 4096, dtypes `f32 bf16 int8-kv`; 32 heads MHA, head_dim 128, 256 MiB of
//! K/V per measurement so it comes from DRAM).

use std::hint::black_box;

use allocbench::measure::{best, decode_shape, fill, gbs, interleaved, median, stream_read};
use caching_allocator::CachingAllocator;
use sdpa::{
    attention, attention_quantized, attention_typed, quantize_kv, Bf16, Params, QuantizedKv,
    QuantizedKvMut, Shape,
};

const HEADS: usize = 32;
const HEAD_DIM: usize = 128;
const SPAN: usize = 256 << 20;
const REPS: usize = 7;

/// One layer's K/V in one of the three storages.
enum Layer {
    F32(Vec<f32>, Vec<f32>),
    Bf16(Vec<Bf16>, Vec<Bf16>),
    Int8([(Vec<i8>, Vec<f32>, Vec<i8>); 2]),
}

fn quantized(x: &[f32], sh: &Shape) -> (Vec<i8>, Vec<f32>, Vec<i8>) {
    let rows = sh.kv_capacity * sh.kv_heads;
    let (mut v, mut s, mut z) = (
        vec![0i8; rows * sh.head_dim],
        vec![0f32; rows],
        vec![0i8; rows],
    );
    let all = Shape {
        q_len: sh.kv_capacity,
        start_pos: 0,
        ..*sh
    };
    let cache = QuantizedKvMut {
        values: &mut v,
        scales: &mut s,
        zero_points: &mut z,
    };
    quantize_kv(x, cache, &all).unwrap();
    (v, s, z)
}

fn view(x: &(Vec<i8>, Vec<f32>, Vec<i8>)) -> QuantizedKv<'_> {
    QuantizedKv {
        values: &x.0,
        scales: &x.1,
        zero_points: &x.2,
    }
}

fn main() {
    let kvs: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let kvs = if kvs.is_empty() {
        vec![1024, 4096]
    } else {
        kvs
    };
    let names: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a.parse::<usize>().is_err())
        .collect();
    let temp = CachingAllocator::new(64 << 20);
    let stream = fill(SPAN / 4, 7);
    println!(
        "threads {}, simd {}",
        rayon::current_num_threads(),
        sdpa::simd_level()
    );
    println!("dtype    kv_len  ms/call  stream GB/s  K/V GB/s  ratio(median)");
    for &kv in &kvs {
        let sh = decode_shape(HEADS, HEADS, HEAD_DIM, kv);
        let n = kv * HEADS * HEAD_DIM;
        for (name, bytes_per_elem) in [("f32", 4.0), ("bf16", 2.0), ("int8-kv", 1.0 + 5.0 / 128.0)]
        {
            if !names.is_empty() && !names.iter().any(|x| x == name) {
                continue;
            }
            let per_layer = (2.0 * n as f64 * bytes_per_elem) as usize;
            let layers = SPAN.div_ceil(per_layer).clamp(1, 64);
            let layers: Vec<Layer> = (0..layers)
                .map(|l| {
                    let (k, v) = (fill(n, 2 * l as u32 + 1), fill(n, 2 * l as u32 + 2));
                    match name {
                        "f32" => Layer::F32(k, v),
                        "bf16" => Layer::Bf16(
                            k.iter().map(|&x| Bf16::from_f32(x)).collect(),
                            v.iter().map(|&x| Bf16::from_f32(x)).collect(),
                        ),
                        _ => Layer::Int8([quantized(&k, &sh), quantized(&v, &sh)]),
                    }
                })
                .collect();
            let q = fill(HEADS * HEAD_DIM, 99);
            let qb: Vec<Bf16> = q.iter().map(|&x| Bf16::from_f32(x)).collect();
            let mut out = vec![0f32; HEADS * HEAD_DIM];
            let mut outb = vec![Bf16::from_f32(0.0); HEADS * HEAD_DIM];
            let p = Params::default();
            let rounds = interleaved(
                REPS,
                &mut [
                    &mut || stream_read(&stream, 1),
                    &mut || stream_read(&stream, 4),
                    // The layer calls run on a pool worker, as a model's forward pass does
                    // (and as `allocbench sdpa` times them).
                    &mut || {
                        rayon::scope(|_| {
                            for l in &layers {
                                match l {
                                    Layer::F32(k, v) => {
                                        attention(&q, k, v, &mut out, &sh, &p, &temp).unwrap()
                                    }
                                    Layer::Bf16(k, v) => {
                                        attention_typed(&qb, k, v, &mut outb, &sh, &p, &temp)
                                            .unwrap()
                                    }
                                    Layer::Int8([k, v]) => attention_quantized(
                                        &q,
                                        view(k),
                                        view(v),
                                        &mut out,
                                        &sh,
                                        &p,
                                        &temp,
                                    )
                                    .unwrap(),
                                }
                                // SAFETY: nothing from `temp` is used after the call returned.
                                unsafe { temp.reset_unchecked() };
                            }
                            black_box((&out, &outb));
                        })
                    },
                ],
            );
            let (sb, kb) = (stream.len() * 4, per_layer * layers.len());
            let ratio = median(
                &rounds
                    .iter()
                    .map(|r| gbs(kb, r[2]) / gbs(sb, r[0].min(r[1])))
                    .collect::<Vec<_>>(),
            );
            println!(
                "{name:<8} {kv:>6} {:>8.3} {:>12.1} {:>9.1} {:>13.0}%",
                best(&rounds, 2) * 1e3 / layers.len() as f64,
                gbs(sb, best(&rounds, 0).min(best(&rounds, 1))),
                gbs(kb, best(&rounds, 2)),
                ratio * 100.0
            );
        }
    }
}
