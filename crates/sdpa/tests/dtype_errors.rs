//! Errors of the bf16/f16, int8-cache and run-time-dtype entry points and of `quantize_kv`:
//! each returns its `SdpaError` before anything is written or any scratch is requested (the
//! scratch failures excepted), never a panic.

mod common;

use caching_allocator::AllocError;
use common::*;
use sdpa::{
    attention_dyn, attention_quantized, attention_typed, quantize_kv, Bf16, Dtype, KvRef, Params,
    QuantizedKv, QuantizedKvMut, SdpaError, Shape, TensorMut, TensorRef, F16,
};

fn good() -> Shape {
    shape(2, 3, 8, 2, 64, 10)
}

fn bf16(x: &[f32]) -> Vec<Bf16> {
    x.iter().map(|&v| Bf16::from_f32(v)).collect()
}

/// Quantized cache buffers for `sh`, of the right lengths; `short` drops one element from
/// slice `short` (0..3: values, scales, zero points) of the K (`k = true`) or V cache.
struct Caches {
    kv: [(Vec<i8>, Vec<f32>, Vec<i8>); 2],
}

impl Caches {
    fn new(sh: &Shape) -> Caches {
        let rows = sh.batch * sh.kv_capacity * sh.kv_heads;
        let one = || {
            (
                vec![1i8; rows * sh.head_dim],
                vec![0.01f32; rows],
                vec![0i8; rows],
            )
        };
        Caches { kv: [one(), one()] }
    }

    fn view(&self, i: usize) -> QuantizedKv<'_> {
        QuantizedKv {
            values: &self.kv[i].0,
            scales: &self.kv[i].1,
            zero_points: &self.kv[i].2,
        }
    }

    /// `attention_quantized` of `q` against these caches, with the default parameters.
    fn attend(
        &self,
        q: &[f32],
        out: &mut [f32],
        sh: &Shape,
        temp: &PoisonAlloc,
    ) -> Result<(), SdpaError> {
        attention_quantized(
            q,
            self.view(0),
            self.view(1),
            out,
            sh,
            &Params::default(),
            temp,
        )
    }
}

fn assert_untouched<T: PartialEq + std::fmt::Debug>(
    out: &[T],
    fill: T,
    temp: &PoisonAlloc,
    e: &SdpaError,
) {
    assert!(out.iter().all(|x| *x == fill), "{e}: out was written");
    assert!(
        temp.requests.lock().unwrap().is_empty(),
        "{e}: scratch requested"
    );
    assert!(!e.to_string().is_empty());
}

#[test]
fn quantized_cache_lengths_name_the_slice() {
    use sdpa::Tensor::*;
    let sh = good();
    let q = data(sh.q_elems().unwrap(), 1, 1.0);
    let names = [[K, KScales, KZeroPoints], [V, VScales, VZeroPoints]];
    for (which, names) in names.into_iter().enumerate() {
        for (slice, name) in names.into_iter().enumerate() {
            let mut c = Caches::new(&sh);
            let (expected, actual) = match slice {
                0 => (
                    c.kv[which].0.len(),
                    c.kv[which].0.pop().map(|_| c.kv[which].0.len()),
                ),
                1 => (
                    c.kv[which].1.len(),
                    c.kv[which].1.pop().map(|_| c.kv[which].1.len()),
                ),
                _ => (
                    c.kv[which].2.len(),
                    c.kv[which].2.pop().map(|_| c.kv[which].2.len()),
                ),
            };
            let mut out = vec![7.5f32; q.len()];
            let temp = PoisonAlloc::default();
            let e = c.attend(&q, &mut out, &sh, &temp).unwrap_err();
            assert_eq!(
                e,
                SdpaError::LenMismatch {
                    tensor: name,
                    expected,
                    actual: actual.unwrap()
                }
            );
            assert_untouched(&out, 7.5, &temp, &e);
        }
    }
}

#[test]
fn bad_shapes_and_lengths_on_typed_paths() {
    let sh = good();
    let (q, k, v) = inputs(&sh, 2, 1.0);
    let (q, k, v) = (bf16(&q), bf16(&k), bf16(&v));
    let fill = Bf16::from_f32(7.5);
    let temp = PoisonAlloc::default();
    let mut out = vec![fill; q.len()];
    // Zero head dim, kv overflow, a short q, a short v.
    let zero_d = Shape { head_dim: 0, ..sh };
    let e = attention_typed(&q, &k, &v, &mut out, &zero_d, &Params::default(), &temp).unwrap_err();
    assert_eq!(e, SdpaError::ZeroHeadDim);
    let over = Shape {
        start_pos: sh.kv_capacity,
        ..sh
    };
    let e = attention_typed(&q, &k, &v, &mut out, &over, &Params::default(), &temp).unwrap_err();
    assert!(matches!(e, SdpaError::KvOverflow { .. }), "{e:?}");
    let e = attention_typed(&q[1..], &k, &v, &mut out, &sh, &Params::default(), &temp).unwrap_err();
    assert!(
        matches!(
            e,
            SdpaError::LenMismatch {
                tensor: sdpa::Tensor::Q,
                ..
            }
        ),
        "{e:?}"
    );
    let e = attention_typed(&q, &k, &v[1..], &mut out, &sh, &Params::default(), &temp).unwrap_err();
    assert!(
        matches!(
            e,
            SdpaError::LenMismatch {
                tensor: sdpa::Tensor::V,
                ..
            }
        ),
        "{e:?}"
    );
    let bad_scale = Params {
        causal: true,
        scale: Some(f32::NAN),
        window: None,
    };
    let e = attention_typed(&q, &k, &v, &mut out, &sh, &bad_scale, &temp).unwrap_err();
    assert!(matches!(e, SdpaError::InvalidScale { .. }), "{e:?}");
    assert_untouched(&out, fill, &temp, &e);

    let c = Caches::new(&sh);
    let mut out32 = vec![7.5f32; q.len()];
    let qf = data(q.len(), 3, 1.0);
    let e = c.attend(&qf, &mut out32, &over, &temp).unwrap_err();
    assert!(matches!(e, SdpaError::KvOverflow { .. }), "{e:?}");
    let e = c.attend(&qf, &mut out32[1..], &sh, &temp).unwrap_err();
    assert!(
        matches!(
            e,
            SdpaError::LenMismatch {
                tensor: sdpa::Tensor::Out,
                ..
            }
        ),
        "{e:?}"
    );
    assert_untouched(&out32, 7.5, &temp, &e);
}

#[test]
fn mismatched_dtypes_are_refused() {
    use sdpa::Tensor;
    let sh = good();
    let (q, k, v) = inputs(&sh, 4, 1.0);
    let (qb, kb, vb) = (bf16(&q), bf16(&k), bf16(&v));
    let c = Caches::new(&sh);
    let temp = PoisonAlloc::default();
    let p = Params::default();
    let mut out16 = vec![F16::from_f32(7.5); q.len()];
    let mut outb = vec![Bf16::from_f32(7.5); q.len()];
    let dense = |t| KvRef::Dense(t);
    // K (`i = 0`) or V as the dtype says: `None` is the int8 cache.
    let kv = |dtype: Option<Dtype>, i: usize| match dtype {
        Some(Dtype::Bf16) => dense(TensorRef::Bf16([&kb, &vb][i])),
        Some(Dtype::F32) => dense(TensorRef::F32([&k, &v][i])),
        _ => KvRef::Int8(c.view(i)),
    };
    let (bf, f32_, int8) = (Some(Dtype::Bf16), Some(Dtype::F32), None);
    // (K, V, the output (Q is bf16), the tensor named, its expected and actual dtype)
    let cases = [
        (bf, bf, Dtype::F16, Tensor::Out, bf, Some(Dtype::F16)),
        (f32_, bf, Dtype::Bf16, Tensor::K, bf, f32_),
        (bf, f32_, Dtype::Bf16, Tensor::V, bf, f32_),
        (bf, int8, Dtype::Bf16, Tensor::V, bf, int8),
        (int8, bf, Dtype::Bf16, Tensor::V, int8, bf),
    ];
    for (kd, vd, out_dtype, tensor, expected, actual) in cases {
        let out = if out_dtype == Dtype::F16 {
            TensorMut::F16(&mut out16)
        } else {
            TensorMut::Bf16(&mut outb)
        };
        let (k, v) = (kv(kd, 0), kv(vd, 1));
        let e = attention_dyn(TensorRef::Bf16(&qb), k, v, out, &sh, &p, &temp).unwrap_err();
        assert_eq!(
            e,
            SdpaError::DtypeMismatch {
                tensor,
                expected,
                actual
            }
        );
        assert!(e.to_string().contains("dtype"), "{e}");
    }
    assert_untouched(&outb, Bf16::from_f32(7.5), &temp, &SdpaError::ZeroHeadDim);
    assert!(out16.iter().all(|x| *x == F16::from_f32(7.5)));

    // The same call with matching dtypes agrees with the typed entry points.
    let mut want = vec![Bf16::default(); q.len()];
    attention_typed(&qb, &kb, &vb, &mut want, &sh, &p, &PoisonAlloc::default()).unwrap();
    attention_dyn(
        TensorRef::Bf16(&qb),
        dense(TensorRef::Bf16(&kb)),
        dense(TensorRef::Bf16(&vb)),
        TensorMut::Bf16(&mut outb),
        &sh,
        &p,
        &PoisonAlloc::default(),
    )
    .unwrap();
    assert_eq!(outb, want);
    let mut want = vec![0f32; q.len()];
    let mut got = vec![1f32; q.len()];
    c.attend(&q, &mut want, &sh, &PoisonAlloc::default())
        .unwrap();
    attention_dyn(
        TensorRef::F32(&q),
        KvRef::Int8(c.view(0)),
        KvRef::Int8(c.view(1)),
        TensorMut::F32(&mut got),
        &sh,
        &p,
        &PoisonAlloc::default(),
    )
    .unwrap();
    assert_eq!(got, want);
}

#[test]
fn quantize_kv_checks_its_arguments() {
    use sdpa::Tensor::*;
    let sh = good();
    let rows = data(sh.batch * sh.q_len * sh.kv_heads * sh.head_dim, 5, 1.0);
    let mut c = Caches::new(&sh);
    let before = c.kv[0].clone();
    let (vals, scales, zps) = &mut c.kv[0];
    let (nv, ns) = (vals.len(), scales.len());
    let call = |r: &[f32], v: &mut [i8], s: &mut [f32], z: &mut [i8], sh: &Shape| {
        quantize_kv(
            r,
            QuantizedKvMut {
                values: v,
                scales: s,
                zero_points: z,
            },
            sh,
        )
        .unwrap_err()
    };
    let e = call(&rows[1..], vals, scales, zps, &sh);
    assert_eq!(
        e,
        SdpaError::LenMismatch {
            tensor: NewRows,
            expected: rows.len(),
            actual: rows.len() - 1
        }
    );
    let e = call(&rows, &mut vals[1..], scales, zps, &sh);
    assert_eq!(
        e,
        SdpaError::LenMismatch {
            tensor: CacheValues,
            expected: nv,
            actual: nv - 1
        }
    );
    let e = call(&rows, vals, &mut scales[1..], zps, &sh);
    assert_eq!(
        e,
        SdpaError::LenMismatch {
            tensor: CacheScales,
            expected: ns,
            actual: ns - 1
        }
    );
    let e = call(&rows, vals, scales, &mut zps[1..], &sh);
    assert_eq!(
        e,
        SdpaError::LenMismatch {
            tensor: CacheZeroPoints,
            expected: ns,
            actual: ns - 1
        }
    );
    let over = Shape {
        start_pos: sh.kv_capacity - 1,
        ..sh
    };
    let e = call(&rows, vals, scales, zps, &over);
    assert!(matches!(e, SdpaError::KvOverflow { .. }), "{e:?}");
    assert_eq!(c.kv[0], before, "nothing written");
}

/// A refused (too small a budget) or misaligned scratch buffer is reported on every
/// conversion path, decode and prefill, with `out` untouched.
#[test]
fn scratch_refused_or_misaligned_on_every_path() {
    for sh in [good(), shape(1, 40, 4, 4, 64, 0)] {
        let (q, k, v) = inputs(&sh, 6, 1.0);
        let (qb, kb, vb) = (bf16(&q), bf16(&k), bf16(&v));
        let c = Caches::new(&sh);
        let p = Params::default();
        let fill = Bf16::from_f32(7.5);
        let mut out = vec![fill; q.len()];
        let e = attention_typed(&qb, &kb, &vb, &mut out, &sh, &p, &FailingAlloc).unwrap_err();
        assert!(
            matches!(e, SdpaError::Scratch(AllocError::OutOfMemory { .. })),
            "{e:?}"
        );
        let e = attention_quantized(&qb, c.view(0), c.view(1), &mut out, &sh, &p, &FailingAlloc)
            .unwrap_err();
        assert!(
            matches!(e, SdpaError::Scratch(AllocError::OutOfMemory { .. })),
            "{e:?}"
        );
        let temp = MisalignedAlloc(PoisonAlloc::default());
        let e = attention_typed(&qb, &kb, &vb, &mut out, &sh, &p, &temp).unwrap_err();
        assert!(
            matches!(e, SdpaError::MisalignedScratch { align: 64, .. }),
            "{e:?}"
        );
        let e =
            attention_quantized(&qb, c.view(0), c.view(1), &mut out, &sh, &p, &temp).unwrap_err();
        assert!(
            matches!(e, SdpaError::MisalignedScratch { align: 64, .. }),
            "{e:?}"
        );
        assert!(out.iter().all(|x| *x == fill));
    }
}
