//! The scratch sizes the workloads ask for: ExecuTorch's SDPA scratch formula against
//! hand-computed cases, the decode workload's sizes token by token, the mixes' ranges.

use allocbench::workload::{sdpa_scratch_sizes, Decode, Mix, Workload};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

#[test]
fn decode_sizes_match_hand_computed_formula() {
    // T = 8, D = 128, decode (seq_len 1, qSplit 1).
    // t = 1: kvSplit 1: 8*(1 + 2 + 128)*4 = 4192; 8*1*128*4 = 4096.
    assert_eq!(sdpa_scratch_sizes(8, 1, 0, 128), [4192, 4096]);
    // t = 100: 8*(100 + 2 + 128)*4 = 7360; 8*100*128*4 = 409600.
    assert_eq!(sdpa_scratch_sizes(8, 1, 99, 128), [7360, 409_600]);
    // t = 512: 8*(512 + 130)*4 = 20544; 8*512*128*4 = 2 MiB: ~2.1 MB in all, as the
    // reference says.
    assert_eq!(sdpa_scratch_sizes(8, 1, 511, 128), [20_544, 2_097_152]);
    // kvSize is capped at 512: t = 1000 asks the same as t = 512.
    assert_eq!(sdpa_scratch_sizes(8, 1, 999, 128), [20_544, 2_097_152]);
    // T = 2: a quarter of T = 8.
    assert_eq!(sdpa_scratch_sizes(2, 1, 511, 128), [5136, 524_288]);
}

#[test]
fn prefill_sizes_match_hand_computed_formula() {
    // 2048-token prefill, T = 8: qSplit 256, kvSplit 512:
    // 8*(256*512 + 512 + 256*128)*4 = 5_259_264, plus 2 MiB: ~7.4 MB as the reference says.
    assert_eq!(sdpa_scratch_sizes(8, 2048, 0, 128), [5_259_264, 2_097_152]);
    // 100-token prefill: qSplit min(32, 100) = 32, kvSplit 100:
    // 8*(32*100 + 64 + 32*128)*4 = 235_520; 8*100*128*4 = 409_600.
    assert_eq!(sdpa_scratch_sizes(8, 100, 0, 128), [235_520, 409_600]);
    // 500 tokens: q_split 64: 8*(64*500 + 128 + 64*128)*4 = 1_290_240.
    assert_eq!(sdpa_scratch_sizes(8, 500, 0, 128)[0], 1_290_240);
}

#[test]
fn decode_workload_follows_the_tokens() {
    let d = Decode::new(600, 2, 8);
    assert_eq!(d.sizes_at(1), [4192, 4096]);
    assert_eq!(d.sizes_at(512), d.sizes_at(600));
    assert_ne!(d.sizes_at(511), d.sizes_at(512));
    assert_eq!(d.round_calls(), Some(1200));
    // 512 distinct pairs: buffer 1 is 32*(t+130), buffer 2 is 4096*t; they coincide when
    // t1 + 130 = 128*t2, i.e. (t1, t2) = (126, 2), (254, 3), (382, 4), (510, 5): 1020.
    assert_eq!(d.distinct_sizes(), 1020);
    assert!(d.distinct_size_classes() < d.distinct_sizes() / 4);
}

#[test]
fn mixes_stay_in_their_ranges() {
    let ranges = [
        (Mix::Small, 64, 4 * KIB),
        (Mix::Medium, 64 * KIB, MIB),
        (Mix::Large, 4 * MIB, 64 * MIB),
    ];
    for (mix, lo, hi) in ranges {
        assert!(
            mix.sizes().iter().all(|&s| (lo..=hi).contains(&s)),
            "{mix:?}"
        );
        assert!(
            mix.sizes().contains(&lo) && mix.sizes().contains(&hi),
            "{mix:?}"
        );
    }
}
