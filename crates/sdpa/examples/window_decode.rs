//! A decode call with Gemma 3 270M's local-layer attention (4 heads, 1 KV head, head_dim 256,
//! sliding window 512) over a cache of 4096 positions, against the same call without the
//! window, timed in turns in one run.
//!
//! `cargo run --release -p sdpa --example window_decode [-- THREADS]` (default 2): prints the
//! median and best time per call of each and their ratio. The calls cycle over 32 layers'
//! caches (256 MiB of K/V, more than most last-level caches), as a model's decode step does.
//! `-- THREADS once full|window|none` makes 32 calls of one kind only (none: no call, the
//! set-up alone, to subtract) and prints nothing, for `valgrind --tool=callgrind` instruction
//! counts.

use std::hint::black_box;
use std::time::Instant;

use caching_allocator::CachingAllocator;
use sdpa::{attention, Params, Shape};

const HEADS: usize = 4;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 256;
const KV_LEN: usize = 4096;
const WINDOW: usize = 512;
/// Bytes of K/V the timed calls cycle over.
const SPAN: usize = 256 << 20;
const ROUNDS: usize = 15;

fn fill(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args.first().map_or(2, |a| a.parse().expect("THREADS"));
    let once = match (
        args.get(1).map(String::as_str),
        args.get(2).map(String::as_str),
    ) {
        (Some("once"), Some("full")) => Some(Some(false)),
        (Some("once"), Some("window")) => Some(Some(true)),
        (Some("once"), Some("none")) => Some(None),
        (None, None) => None,
        _ => panic!("usage: window_decode [THREADS [once full|window|none]]"),
    };
    let sh = Shape {
        batch: 1,
        q_len: 1,
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        kv_capacity: KV_LEN,
        start_pos: KV_LEN - 1,
    };
    let kv_elems = KV_LEN * KV_HEADS * HEAD_DIM;
    let layers = if once.is_some() {
        1
    } else {
        (SPAN / (2 * 4 * kv_elems)).max(1)
    };
    let caches: Vec<(Vec<f32>, Vec<f32>)> = (0..layers as u64)
        .map(|l| (fill(kv_elems, 2 * l + 1), fill(kv_elems, 2 * l + 2)))
        .collect();
    let q = fill(HEADS * HEAD_DIM, 99);
    let mut out = vec![0f32; q.len()];
    let full = Params::default();
    let window = Params::default().with_window(WINDOW);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool");
    pool.install(|| {
        let mut temp = CachingAllocator::new(10 << 20);
        let mut call = |p: &Params, layer: usize| {
            let (k, v) = &caches[layer % layers];
            attention(&q, k, v, &mut out, &sh, p, &temp).expect("attention");
            black_box(&out);
            temp.reset();
        };
        if let Some(kind) = once {
            for i in 0..kind.map_or(0, |_| 32) {
                let windowed = kind == Some(true);
                call(if windowed { &window } else { &full }, i);
            }
            return;
        }
        // Turns: one pass over every layer with each option per round.
        let (mut t_full, mut t_win) = (Vec::new(), Vec::new());
        for round in 0..=ROUNDS {
            for (p, times) in [(&full, &mut t_full), (&window, &mut t_win)] {
                let t = Instant::now();
                for layer in 0..layers {
                    call(p, layer);
                }
                if round > 0 {
                    // Round 0 warms the allocator, the pool and the page tables.
                    times.push(t.elapsed().as_secs_f64() / layers as f64);
                }
            }
        }
        let stat = |t: &mut Vec<f64>| {
            t.sort_by(f64::total_cmp);
            (t[t.len() / 2], t[0])
        };
        let ((mf, bf), (mw, bw)) = (stat(&mut t_full), stat(&mut t_win));
        println!(
            "decode, {HEADS} heads / {KV_HEADS} KV head x {HEAD_DIM}, kv {KV_LEN}, {threads} \
             threads, {layers} layers' caches, {ROUNDS} rounds, level {}",
            sdpa::simd_level()
        );
        println!(
            "full attention: median {:.1} us, best {:.1} us",
            mf * 1e6,
            bf * 1e6
        );
        println!(
            "window {WINDOW}:    median {:.1} us, best {:.1} us",
            mw * 1e6,
            bw * 1e6
        );
        println!(
            "full / window: {:.2}x (medians), {:.2}x (bests)",
            mf / mw,
            bf / bw
        );
    });
}
