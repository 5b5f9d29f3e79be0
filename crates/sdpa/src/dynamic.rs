//! One entry point whose dtypes are chosen at run time (for callers such as a C ABI that hold
//! tensors of any dtype): mismatched dtypes are an [`SdpaError`], not a compile error.

use crate::elem::{Bf16, Dtype, F16};
use crate::quant::QuantizedKv;
use crate::{
    attention_quantized, attention_typed, Params, SdpaError, Shape, TempAllocator, Tensor,
};

/// A read-only tensor of any element type. Non-exhaustive: more dtypes may come.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum TensorRef<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 elements.
    Bf16(&'a [Bf16]),
    /// f16 elements.
    F16(&'a [F16]),
}

/// A writable tensor of any element type. Non-exhaustive: more dtypes may come.
#[derive(Debug)]
#[non_exhaustive]
pub enum TensorMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements.
    Bf16(&'a mut [Bf16]),
    /// f16 elements.
    F16(&'a mut [F16]),
}

/// K or V: dense in a float dtype, or the int8 cache. Non-exhaustive: more cache kinds may
/// come.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum KvRef<'a> {
    /// Dense, in a float dtype (which must be Q's).
    Dense(TensorRef<'a>),
    /// int8-quantized.
    Int8(QuantizedKv<'a>),
}

impl TensorRef<'_> {
    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        match self {
            TensorRef::F32(_) => Dtype::F32,
            TensorRef::Bf16(_) => Dtype::Bf16,
            TensorRef::F16(_) => Dtype::F16,
        }
    }
}

impl TensorMut<'_> {
    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        match self {
            TensorMut::F32(_) => Dtype::F32,
            TensorMut::Bf16(_) => Dtype::Bf16,
            TensorMut::F16(_) => Dtype::F16,
        }
    }
}

impl KvRef<'_> {
    /// Its element type (`None` for the int8 cache).
    fn dtype(&self) -> Option<Dtype> {
        match self {
            KvRef::Dense(t) => Some(t.dtype()),
            KvRef::Int8(_) => None,
        }
    }
}

/// [`attention_typed`] or [`attention_quantized`], picked by the dtypes of the arguments: `out`
/// and dense `k`/`v` must have `q`'s dtype, and `k` and `v` must both be dense or both int8.
///
/// # Errors
/// [`SdpaError::DtypeMismatch`] naming the first tensor that differs from `q` (`out`, `k`,
/// then `v`; an int8 `v` beside a dense `k` or the reverse names `v`), checked after the shape;
/// otherwise as the typed entry points.
pub fn attention_dyn<A: TempAllocator + ?Sized>(
    q: TensorRef<'_>,
    k: KvRef<'_>,
    v: KvRef<'_>,
    out: TensorMut<'_>,
    shape: &Shape,
    params: &Params,
    temp: &A,
) -> Result<(), SdpaError> {
    shape.validate()?;
    let want = q.dtype();
    let mismatch = |tensor, actual: Option<Dtype>| SdpaError::DtypeMismatch {
        tensor,
        expected: Some(want),
        actual,
    };
    if out.dtype() != want {
        return Err(mismatch(Tensor::Out, Some(out.dtype())));
    }
    match (k.dtype(), v.dtype()) {
        (Some(kd), _) if kd != want => return Err(mismatch(Tensor::K, Some(kd))),
        (Some(_), vd) if vd != Some(want) => return Err(mismatch(Tensor::V, vd)),
        (None, Some(vd)) => {
            return Err(SdpaError::DtypeMismatch {
                tensor: Tensor::V,
                expected: None,
                actual: Some(vd),
            })
        }
        _ => {}
    }
    macro_rules! go {
        ($q:expr, $out:expr, $variant:ident) => {
            match (k, v) {
                (KvRef::Dense(TensorRef::$variant(k)), KvRef::Dense(TensorRef::$variant(v))) => {
                    attention_typed($q, k, v, $out, shape, params, temp)
                }
                (KvRef::Int8(k), KvRef::Int8(v)) => {
                    attention_quantized($q, k, v, $out, shape, params, temp)
                }
                // Every other combination was refused above.
                _ => Err(mismatch(Tensor::K, k.dtype())),
            }
        };
    }
    match (q, out) {
        (TensorRef::F32(q), TensorMut::F32(out)) => go!(q, out, F32),
        (TensorRef::Bf16(q), TensorMut::Bf16(out)) => go!(q, out, Bf16),
        (TensorRef::F16(q), TensorMut::F16(out)) => go!(q, out, F16),
        // Refused above (out's dtype differs from q's).
        (_, out) => Err(mismatch(Tensor::Out, Some(out.dtype()))),
    }
}
