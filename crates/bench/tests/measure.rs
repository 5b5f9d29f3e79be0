//! The measuring helpers: statistics, the FLOPs of an attention call, sgemm, glibc's pinned
//! malloc thresholds.

use allocbench::measure::{median, pin_malloc_thresholds, prefill_flops, sgemm, Spread};
use sdpa::Shape;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn glibc_takes_the_pinned_thresholds() {
    // glibc refuses values out of its range (an mmap threshold above 32 MiB on 64-bit).
    assert!(pin_malloc_thresholds());
}

#[test]
fn spread_of_samples() {
    let s = Spread::of(&[3.0, 1.0, 2.0]);
    assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
    assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
    assert_eq!(Spread::of(&[]), Spread::default());
}

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
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert!(median(&[]).is_nan());
}
