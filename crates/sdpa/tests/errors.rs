//! Every shape error and the scratch failure return their `SdpaError`, never panic, never
//! touch `out`, and request no scratch (except the scratch failure itself).

mod common;

use std::error::Error;

use caching_allocator::AllocError;
use common::*;
use sdpa::{attention, scratch_bytes, Params, SdpaError, Shape, Tensor};

/// Runs with slices sized for `sized_for` but the shape `sh`; returns the error, checking that
/// `out` was not touched and no scratch was requested.
fn run_err(sh: Shape, sized_for: Shape, params: Params) -> SdpaError {
    let (q, k, v) = inputs(&sized_for, 1, 1.0);
    let mut out = vec![7.5f32; q.len()];
    let temp = PoisonAlloc::default();
    let err = attention(&q, &k, &v, &mut out, &sh, &params, &temp).unwrap_err();
    assert!(out.iter().all(|&x| x == 7.5), "{err}: out was written");
    assert!(
        temp.requests.lock().unwrap().is_empty(),
        "{err}: scratch requested"
    );
    assert!(!err.to_string().is_empty());
    err
}

fn good() -> Shape {
    shape(2, 3, 8, 2, 64, 10)
}

#[test]
fn zero_head_dim() {
    let sh = Shape {
        head_dim: 0,
        ..good()
    };
    assert_eq!(run_err(sh, sh, Params::default()), SdpaError::ZeroHeadDim);
    assert_eq!(scratch_bytes(&sh, 2), Err(SdpaError::ZeroHeadDim));
}

#[test]
fn zero_heads() {
    for (heads, kv_heads) in [(8, 0), (0, 2), (0, 0)] {
        let sh = Shape {
            heads,
            kv_heads,
            ..good()
        };
        assert_eq!(
            run_err(sh, sh, Params::default()),
            SdpaError::ZeroHeads { heads, kv_heads }
        );
    }
}

#[test]
fn heads_not_multiple_of_kv_heads() {
    let sh = Shape {
        heads: 6,
        kv_heads: 4,
        ..good()
    };
    let e = run_err(sh, sh, Params::default());
    assert_eq!(
        e,
        SdpaError::HeadsNotMultiple {
            heads: 6,
            kv_heads: 4
        }
    );
    assert!(e.to_string().contains("not a multiple"), "{e}");
}

#[test]
fn kv_overflow() {
    let mut sh = good();
    sh.kv_capacity = sh.start_pos + sh.q_len - 1;
    let e = run_err(sh, sh, Params::default());
    assert!(matches!(e, SdpaError::KvOverflow { .. }), "{e:?}");
    // start_pos + q_len overflowing usize is the same error, not a panic.
    let huge = Shape {
        start_pos: usize::MAX,
        ..good()
    };
    let e = run_err(huge, good(), Params::default());
    assert!(matches!(e, SdpaError::KvOverflow { .. }), "{e:?}");
}

#[test]
fn element_count_overflow() {
    let sh = Shape {
        batch: usize::MAX / 2,
        ..good()
    };
    let e = run_err(sh, good(), Params::default());
    assert_eq!(e, SdpaError::ShapeOverflow { tensor: Tensor::Q });
    let sh = Shape {
        batch: 1,
        q_len: 1,
        heads: 1,
        kv_heads: 1,
        head_dim: 1 << 20,
        start_pos: 0,
        kv_capacity: usize::MAX >> 20,
    };
    let e = run_err(sh, good(), Params::default());
    assert_eq!(e, SdpaError::ShapeOverflow { tensor: Tensor::K });
}

#[test]
fn slice_length_mismatch_names_the_tensor() {
    let sh = good();
    let (q, k, v) = inputs(&sh, 2, 1.0);
    let temp = PoisonAlloc::default();
    let p = Params::default();
    let mut out = vec![7.5f32; q.len()];
    let cases: [(Tensor, usize, usize); 4] = [
        (Tensor::Q, q.len(), q.len() - 1),
        (Tensor::K, k.len(), k.len() + 1),
        (Tensor::V, v.len(), v.len() - 64),
        (Tensor::Out, out.len(), out.len() + 5),
    ];
    for (tensor, expected, actual) in cases {
        let q2 = &q[..if tensor == Tensor::Q { actual } else { q.len() }];
        let mut k2 = k.clone();
        k2.resize(if tensor == Tensor::K { actual } else { k.len() }, 0.0);
        let v2 = &v[..if tensor == Tensor::V { actual } else { v.len() }];
        let mut out2 = out.clone();
        out2.resize(
            if tensor == Tensor::Out {
                actual
            } else {
                out.len()
            },
            7.5,
        );
        let e = attention(q2, &k2, v2, &mut out2, &sh, &p, &temp).unwrap_err();
        assert_eq!(
            e,
            SdpaError::LenMismatch {
                tensor,
                expected,
                actual
            }
        );
        assert!(e.to_string().contains(&format!("`{tensor}`")), "{e}");
        assert!(out2.iter().all(|&x| x == 7.5));
    }
    assert!(temp.requests.lock().unwrap().is_empty());
    out.fill(0.0);
}

#[test]
fn invalid_scale() {
    for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let p = Params {
            causal: true,
            scale: Some(s),
            window: None,
        };
        let e = run_err(good(), good(), p);
        assert!(matches!(e, SdpaError::InvalidScale { .. }), "{e:?}");
    }
}

#[test]
fn scratch_failure_is_reported() {
    for sh in [good(), shape(1, 40, 4, 4, 64, 0)] {
        let (q, k, v) = inputs(&sh, 3, 1.0);
        let mut out = vec![7.5f32; q.len()];
        let e =
            attention(&q, &k, &v, &mut out, &sh, &Params::default(), &FailingAlloc).unwrap_err();
        let bytes = scratch_bytes(&sh, rayon::current_num_threads()).unwrap();
        assert_eq!(
            e,
            SdpaError::Scratch(AllocError::OutOfMemory {
                size: bytes,
                align: sdpa::SCRATCH_ALIGN
            })
        );
        assert!(e.source().is_some());
        assert!(e.to_string().contains("scratch"), "{e}");
        assert!(out.iter().all(|&x| x == 7.5));
    }
}

#[test]
fn misaligned_scratch_is_refused() {
    let sh = good();
    let (q, k, v) = inputs(&sh, 4, 1.0);
    let mut out = vec![7.5f32; q.len()];
    let temp = MisalignedAlloc(PoisonAlloc::default());
    let e = attention(&q, &k, &v, &mut out, &sh, &Params::default(), &temp).unwrap_err();
    assert!(
        matches!(e, SdpaError::MisalignedScratch { align: 64, .. }),
        "{e:?}"
    );
    assert!(out.iter().all(|&x| x == 7.5));
}
