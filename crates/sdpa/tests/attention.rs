//! Correctness of `sdpa::attention` against a naive f64 reference, on poisoned scratch.

mod common;

use caching_allocator::{CachingAllocator, Config};
use common::*;
use sdpa::{attention, scratch_bytes, Params, Path, Plan, Shape, SCRATCH_ALIGN};

const TOL: f32 = 1e-4;

/// Runs one call on 0xFF-poisoned scratch and checks it against the reference; also checks
/// that exactly one scratch request of `scratch_bytes` bytes was made.
fn check(sh: Shape, params: Params, seed: u64, amp: f32) {
    let (q, k, v) = inputs(&sh, seed, amp);
    let want = reference(&q, &k, &v, &sh, &params);
    let mut out = vec![f32::NAN; want.len()];
    let temp = PoisonAlloc::default();
    attention(&q, &k, &v, &mut out, &sh, &params, &temp).unwrap();
    let err = max_abs_diff(&out, &want);
    assert!(err <= TOL, "{sh:?} {params:?}: max abs error {err}");
    let reqs = temp.requests.lock().unwrap().clone();
    let bytes = scratch_bytes(&sh, rayon::current_num_threads()).unwrap();
    assert_eq!(reqs, vec![(bytes, SCRATCH_ALIGN)], "{sh:?}");
}

fn causal() -> Params {
    Params::default()
}

fn non_causal() -> Params {
    Params {
        causal: false,
        scale: None,
        window: None,
    }
}

#[test]
fn decode_mha_several_start_pos() {
    for sp in [0, 1, 7, 31, 32, 33, 100, 517] {
        check(shape(2, 1, 4, 4, 64, sp), causal(), sp as u64, 1.0);
    }
}

#[test]
fn decode_gqa_8_heads_2_kv_heads() {
    for (sp, d) in [(0, 128), (5, 128), (200, 72), (1023, 128), (300, 100)] {
        check(shape(1, 1, 8, 2, d, sp), causal(), 10 + sp as u64, 2.0);
    }
}

#[test]
fn decode_mqa_and_sharp_softmax() {
    check(shape(3, 1, 6, 1, 64, 77), causal(), 3, 8.0);
    check(shape(1, 1, 8, 2, 128, 450), non_causal(), 4, 8.0);
}

#[test]
fn short_queries_row_path() {
    for q_len in [2, 3, 4, 5] {
        for sp in [0, 50] {
            check(shape(2, q_len, 8, 2, 100, sp), causal(), q_len as u64, 2.0);
            check(
                shape(1, q_len, 8, 2, 72, sp),
                non_causal(),
                7 + q_len as u64,
                2.0,
            );
        }
    }
}

#[test]
fn paths_are_chosen_by_q_len() {
    let row = Plan::for_shape(&shape(1, 3, 8, 2, 64, 10), 2).unwrap();
    assert!(matches!(row.path, Path::Rows { .. }), "{row:?}");
    let tiled = Plan::for_shape(&shape(1, 6, 8, 2, 64, 10), 2).unwrap();
    assert!(matches!(tiled.path, Path::Tiled { .. }), "{tiled:?}");
}

#[test]
fn prefill_head_dims_and_awkward_lengths() {
    for d in [64, 72, 100, 128] {
        for (q_len, sp) in [(6, 0), (7, 3), (17, 0), (96, 0), (97, 13), (130, 61)] {
            check(
                shape(1, q_len, 4, 2, d, sp),
                causal(),
                (d + q_len) as u64,
                2.0,
            );
        }
    }
}

#[test]
fn prefill_non_causal() {
    // A single work item runs on the calling thread.
    check(shape(1, 50, 1, 1, 64, 20), non_causal(), 51, 2.0);
    check(shape(1, 50, 1, 1, 100, 20), causal(), 52, 2.0);
    for (q_len, sp, d) in [(6, 0, 64), (40, 9, 72), (100, 0, 100), (70, 200, 128)] {
        check(
            shape(2, q_len, 8, 2, d, sp),
            non_causal(),
            q_len as u64,
            2.0,
        );
    }
}

#[test]
fn prefill_sharp_softmax_and_custom_scale() {
    check(shape(1, 50, 2, 1, 64, 20), causal(), 21, 8.0);
    let p = Params {
        causal: true,
        scale: Some(0.3),
        window: None,
    };
    check(shape(1, 33, 4, 4, 72, 5), p, 22, 1.0);
    check(shape(1, 1, 4, 4, 72, 90), p, 23, 1.0);
    let neg = Params {
        causal: false,
        scale: Some(-0.05),
        window: None,
    };
    check(shape(1, 20, 2, 2, 64, 3), neg, 24, 1.0);
    check(shape(1, 2, 2, 2, 64, 40), neg, 25, 1.0);
}

#[test]
fn long_prefill_q_len_1000() {
    // Small heads (and one non-causal case of 400) so the f64 reference stays affordable in
    // debug builds.
    check(shape(1, 1000, 2, 1, 72, 0), causal(), 1000, 2.0);
    check(shape(1, 400, 1, 1, 64, 5), non_causal(), 1001, 1.0);
}

#[test]
fn same_results_on_other_pool_sizes() {
    let sh = shape(2, 45, 8, 2, 64, 19);
    let dec = shape(2, 1, 8, 2, 64, 300);
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            assert_eq!(rayon::current_num_threads(), threads);
            check(sh, causal(), 30, 2.0);
            check(dec, causal(), 31, 2.0);
        });
    }
}

#[test]
fn nothing_to_compute_requests_no_scratch() {
    for sh in [shape(0, 4, 2, 2, 64, 0), shape(2, 0, 2, 2, 64, 5)] {
        let (q, k, v) = inputs(&sh, 1, 1.0);
        let mut out = vec![0f32; q.len()];
        let temp = PoisonAlloc::default();
        attention(&q, &k, &v, &mut out, &sh, &causal(), &temp).unwrap();
        assert!(temp.requests.lock().unwrap().is_empty());
        assert_eq!(scratch_bytes(&sh, 2).unwrap(), 0);
    }
}

/// The caching allocator in debug-checks mode poisons every block with 0xFF, and its cache
/// hands back blocks holding the previous call's data: both must be invisible in the results.
#[test]
fn caching_allocator_debug_checks() {
    let temp = CachingAllocator::with_config(Config::default().debug_checks(true));
    let cases = [
        (shape(1, 1, 8, 2, 128, 0), causal()),
        (shape(1, 1, 8, 2, 128, 700), causal()),
        (shape(2, 3, 8, 2, 100, 40), non_causal()),
        (shape(1, 97, 4, 2, 72, 13), causal()),
        (shape(1, 200, 8, 2, 64, 0), causal()),
        (shape(2, 64, 4, 4, 128, 30), non_causal()),
        (shape(1, 1, 8, 2, 128, 701), causal()),
    ];
    for round in 0..2 {
        for (i, (sh, p)) in cases.iter().enumerate() {
            let (q, k, v) = inputs(sh, (round * 100 + i) as u64, 2.0);
            let want = reference(&q, &k, &v, sh, p);
            let mut out = vec![f32::NAN; want.len()];
            attention(&q, &k, &v, &mut out, sh, p, &temp).unwrap();
            // SAFETY: nothing from the allocator is used after this point.
            unsafe { temp.reset_unchecked() };
            let err = max_abs_diff(&out, &want);
            assert!(
                err <= TOL,
                "round {round} {sh:?} {p:?}: max abs error {err}"
            );
        }
    }
    let stats = temp.stats();
    assert_eq!(stats.corrupted_blocks, 0, "{stats:?}");
    assert!(stats.hits > 0, "{stats:?}");
}

/// The scratch sizes quoted in the README (32 heads, head_dim 128).
#[test]
fn scratch_sizes_quoted_in_readme() {
    let dec = |kv: usize| Shape {
        batch: 1,
        q_len: 1,
        heads: 32,
        kv_heads: 32,
        head_dim: 128,
        kv_capacity: kv,
        start_pos: kv - 1,
    };
    let pre = |len: usize| Shape {
        batch: 1,
        q_len: len,
        heads: 32,
        kv_heads: 32,
        head_dim: 128,
        kv_capacity: len,
        start_pos: 0,
    };
    let sizes = [
        scratch_bytes(&dec(64), 2).unwrap(),
        scratch_bytes(&dec(256), 2).unwrap(),
        scratch_bytes(&dec(4096), 2).unwrap(),
        scratch_bytes(&pre(128), 2).unwrap(),
        scratch_bytes(&pre(2048), 2).unwrap(),
        scratch_bytes(&dec(1024), 8).unwrap(),
        scratch_bytes(&pre(2048), 8).unwrap(),
    ];
    assert_eq!(
        sizes,
        [41_536, 141_376, 141_376, 471_360, 625_728, 565_312, 2_502_720]
    );
}
