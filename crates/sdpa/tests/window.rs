//! Sliding-window attention (`Params::window`) and head_dim 256, against the f64 reference, at
//! every SIMD level this CPU runs, on 0xFF-poisoned scratch. The cache positions no row's
//! window reaches are NaN, like the unused tail, so reading one would show in the output.

mod common;

use std::num::NonZeroUsize;

use common::*;
use sdpa::{
    attention, available_simd_levels, scratch_bytes, scratch_bytes_with, with_max_simd, Dtype,
    KvCache, Params, Path, Plan, SdpaError, Shape, SCRATCH_ALIGN,
};

const TOL: f32 = 1e-4;

/// Gemma 3 270M's attention: 4 query heads, 1 KV head, head_dim 256, window 512.
const GEMMA_HEADS: usize = 4;
const GEMMA_KV_HEADS: usize = 1;
const GEMMA_HEAD_DIM: usize = 256;
const GEMMA_WINDOW: usize = 512;

fn windowed(window: usize) -> Params {
    Params::default().with_window(window)
}

/// `inputs` with every cache position before the first row's window NaN as well.
fn window_inputs(sh: &Shape, p: &Params, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q, mut k, mut v) = inputs(sh, seed, 2.0);
    let first = p
        .window
        .map_or(0, |w| (sh.start_pos + 1).saturating_sub(w.get()));
    let row = sh.kv_heads * sh.head_dim;
    for b in 0..sh.batch {
        let o = b * sh.kv_capacity * row;
        k[o..o + first * row].fill(f32::NAN);
        v[o..o + first * row].fill(f32::NAN);
    }
    (q, k, v)
}

/// One call per SIMD level against the reference, each making exactly one scratch request of
/// `scratch_bytes_with` bytes.
fn check(sh: Shape, p: Params, seed: u64) {
    let (q, k, v) = window_inputs(&sh, &p, seed);
    let want = reference(&q, &k, &v, &sh, &p);
    for level in available_simd_levels() {
        with_max_simd(level, || {
            let mut out = vec![f32::NAN; want.len()];
            let temp = PoisonAlloc::default();
            attention(&q, &k, &v, &mut out, &sh, &p, &temp).unwrap();
            let err = max_abs_diff(&out, &want);
            let level = sdpa::simd_level();
            assert!(err <= TOL, "{level}: {sh:?} {p:?}: max abs error {err}");
            let threads = rayon::current_num_threads();
            let bytes = scratch_bytes_with(&sh, &p, threads, Dtype::F32, KvCache::Dense).unwrap();
            let reqs = temp.requests.lock().unwrap().clone();
            assert_eq!(reqs, vec![(bytes, SCRATCH_ALIGN)], "{level}: {sh:?} {p:?}");
        });
    }
}

fn gemma(q_len: usize, start_pos: usize) -> Shape {
    shape(
        1,
        q_len,
        GEMMA_HEADS,
        GEMMA_KV_HEADS,
        GEMMA_HEAD_DIM,
        start_pos,
    )
}

/// Decode with Gemma 3's shape: a window longer than the sequence (no effect), exactly as
/// long, one shorter, and much shorter (where the first positions are NaN); head_dim 256
/// and one KV head for four query heads.
#[test]
fn decode_gemma_shape_windows_longer_and_shorter() {
    for sp in [0, 100, 510, 511, 512, 513, 700, 1100] {
        check(gemma(1, sp), windowed(GEMMA_WINDOW), sp as u64);
    }
    // Full attention at head_dim 256, for comparison on the same shapes.
    for sp in [0, 513] {
        check(gemma(1, sp), Params::default(), 7 + sp as u64);
    }
}

/// Short queries (the row path) whose rows each have their own window start, windows of 1
/// (each row sees only itself) up to longer than the sequence; batch 2 and GQA 8 / 2.
#[test]
fn short_queries_each_row_its_own_window() {
    for q_len in [2, 3, 5] {
        for (sp, w) in [(0, 1), (40, 1), (40, 3), (40, 33), (100, 64), (20, 500)] {
            check(
                shape(2, q_len, 8, 2, 72, sp),
                windowed(w),
                (q_len + sp + w) as u64,
            );
        }
    }
    for q_len in [1, 4] {
        check(gemma(q_len, 600), windowed(GEMMA_WINDOW), 40 + q_len as u64);
    }
}

/// Prefill (the tiled path): windows shorter than a strip (1, 5), than a KV tile (40), than
/// a query block (100) and longer than the sequence, at start_pos 0 and later; then Gemma 3's
/// shape with window 512 over 300 new rows after 400 cached ones.
#[test]
fn prefill_windows_short_and_long() {
    for (q_len, sp) in [(6, 0), (23, 0), (97, 13), (200, 70)] {
        for w in [1, 5, 40, 100, 1000] {
            check(
                shape(1, q_len, 4, 2, 64, sp),
                windowed(w),
                (q_len * 7 + sp + w) as u64,
            );
        }
    }
    check(shape(2, 30, 8, 2, 100, 50), windowed(17), 3);
    check(gemma(300, 400), windowed(GEMMA_WINDOW), 4);
    check(gemma(40, 0), Params::default(), 5);
}

/// A window as long as the whole sequence is the same call as no window, bit for bit (same
/// plan, same scratch, same order of operations).
#[test]
fn window_covering_everything_equals_no_window() {
    for (q_len, sp) in [(1, 99), (3, 50), (30, 70)] {
        let sh = gemma(q_len, sp);
        let (q, k, v) = inputs(&sh, 9, 2.0);
        let run = |p: Params| {
            let mut out = vec![f32::NAN; q.len()];
            attention(&q, &k, &v, &mut out, &sh, &p, &PoisonAlloc::default()).unwrap();
            out
        };
        let full = run(Params::default());
        assert_eq!(run(windowed(sp + q_len)), full, "{sh:?}");
        assert_eq!(run(windowed(usize::MAX)), full, "{sh:?}");
        assert_eq!(run(windowed(0)), full, "window 0 is no window: {sh:?}");
    }
}

/// Decode over a long cache with a short window splits and sizes its scratch for the window:
/// 512 positions of a 4096-position cache ask what a 512-position cache asks without one.
#[test]
fn decode_scratch_follows_the_window_not_the_cache() {
    for threads in [1, 2, 8] {
        let long = gemma(1, 4095);
        let short = gemma(1, 511);
        let win = windowed(GEMMA_WINDOW);
        let with = |sh: &Shape, p: &Params| {
            scratch_bytes_with(sh, p, threads, Dtype::F32, KvCache::Dense).unwrap()
        };
        assert_eq!(with(&long, &win), scratch_bytes(&short, threads).unwrap());
        let plan = Plan::for_params(&long, &win, threads, Dtype::F32, KvCache::Dense).unwrap();
        let Path::Rows {
            chunks_per_batch,
            chunk_len,
            ..
        } = plan.path
        else {
            panic!("decode takes the row path: {plan:?}");
        };
        let covered = chunks_per_batch * chunk_len;
        assert!(
            (GEMMA_WINDOW..GEMMA_WINDOW + chunk_len).contains(&covered),
            "{threads} threads: the chunks cover the window and no more: {plan:?}"
        );
    }
}

/// A window with non-causal attention is refused before anything is read, written or
/// requested, with a message that says what to change.
#[test]
fn window_without_causal_is_refused() {
    let sh = gemma(3, 10);
    let (q, k, v) = inputs(&sh, 1, 1.0);
    let mut out = vec![7.0f32; q.len()];
    let p = Params {
        causal: false,
        scale: None,
        window: NonZeroUsize::new(4),
    };
    let temp = PoisonAlloc::default();
    let err = attention(&q, &k, &v, &mut out, &sh, &p, &temp).unwrap_err();
    assert_eq!(err, SdpaError::WindowNotCausal { window: 4 });
    assert!(err.to_string().contains("causal: true"), "{err}");
    assert!(out.iter().all(|&x| x == 7.0));
    assert!(temp.requests.lock().unwrap().is_empty());
    let plan = Plan::for_params(&sh, &p, 2, Dtype::F32, KvCache::Dense);
    assert_eq!(plan.unwrap_err(), SdpaError::WindowNotCausal { window: 4 });
}

/// The figures quoted in the README: Gemma 3 270M's decode scratch on 2 threads over a cache
/// of 4096 positions, without and with the window of 512 (fewer chunks: 4 instead of 8).
#[test]
fn gemma_scratch_quoted_in_readme() {
    let sh = gemma(1, 4095);
    let win = windowed(GEMMA_WINDOW);
    let with = scratch_bytes_with(&sh, &win, 2, Dtype::F32, KvCache::Dense).unwrap();
    assert_eq!((scratch_bytes(&sh, 2).unwrap(), with), (34_880, 17_984));
}
