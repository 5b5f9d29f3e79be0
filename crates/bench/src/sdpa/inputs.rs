//! The tensors of one benchmarked call in each measured dtype (f32, bf16, int8 KV cache), so
//! the comparison and the efficiency figures run the same code for every dtype column.

use crate::measure::fill;
use ::sdpa::{
    attention_quantized, attention_typed, quantize_kv, Bf16, Params, QuantizedKv, QuantizedKvMut,
    SdpaError, Shape,
};

use crate::source::TempAllocator;

/// A dtype column of `allocbench sdpa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum SdpaDtype {
    /// Q, K, V and out in f32.
    F32,
    /// Q, K, V and out in bf16.
    Bf16,
    /// Q and out in f32, K and V an int8 cache with per-token, per-head scales.
    Int8Kv,
}

impl SdpaDtype {
    /// All columns, in report order.
    pub const ALL: [SdpaDtype; 3] = [SdpaDtype::F32, SdpaDtype::Bf16, SdpaDtype::Int8Kv];

    /// The column label.
    pub fn name(self) -> &'static str {
        match self {
            SdpaDtype::F32 => "f32",
            SdpaDtype::Bf16 => "bf16",
            SdpaDtype::Int8Kv => "int8-kv",
        }
    }

    /// A workload label: `base` for f32 (the labels of earlier reports), `base-<dtype>` else.
    pub fn label(self, base: &str) -> String {
        match self {
            SdpaDtype::F32 => base.to_string(),
            d => format!("{base}-{}", d.name()),
        }
    }

    /// Bytes of K and V a call reads per (position, kv head) of `head_dim` lanes: both caches'
    /// values, plus the scale and zero point of each for int8.
    pub fn kv_bytes_per_head_row(self, head_dim: usize) -> usize {
        match self {
            SdpaDtype::F32 => 2 * 4 * head_dim,
            SdpaDtype::Bf16 => 2 * 2 * head_dim,
            SdpaDtype::Int8Kv => 2 * (head_dim + 4 + 1),
        }
    }

    /// The sdpa dtype and cache kind (for `scratch_bytes_for`).
    pub fn kind(self) -> (::sdpa::Dtype, ::sdpa::KvCache) {
        match self {
            SdpaDtype::F32 => (::sdpa::Dtype::F32, ::sdpa::KvCache::Dense),
            SdpaDtype::Bf16 => (::sdpa::Dtype::Bf16, ::sdpa::KvCache::Dense),
            SdpaDtype::Int8Kv => (::sdpa::Dtype::F32, ::sdpa::KvCache::Int8),
        }
    }
}

/// An int8 cache: values, scales, zero points.
pub struct Int8Cache {
    values: Vec<i8>,
    scales: Vec<f32>,
    zero_points: Vec<i8>,
}

impl Int8Cache {
    /// Quantizes every position of the dense cache `x` of shape `sh`.
    fn quantize(x: &[f32], sh: &Shape) -> Result<Int8Cache, SdpaError> {
        let rows = sh.kv_elems()? / sh.head_dim;
        let mut c = Int8Cache {
            values: vec![0; rows * sh.head_dim],
            scales: vec![0.0; rows],
            zero_points: vec![0; rows],
        };
        let all = Shape {
            q_len: sh.kv_capacity,
            start_pos: 0,
            ..*sh
        };
        quantize_kv(
            x,
            QuantizedKvMut {
                values: &mut c.values,
                scales: &mut c.scales,
                zero_points: &mut c.zero_points,
            },
            &all,
        )?;
        Ok(c)
    }

    fn view(&self) -> QuantizedKv<'_> {
        QuantizedKv {
            values: &self.values,
            scales: &self.scales,
            zero_points: &self.zero_points,
        }
    }
}

/// Q, K, V and out of one dtype column, sized for a shape.
pub enum Inputs {
    /// f32.
    F32 {
        /// Queries, keys, values, output.
        t: [Vec<f32>; 4],
    },
    /// bf16.
    Bf16 {
        /// Queries, keys, values, output.
        t: [Vec<Bf16>; 4],
    },
    /// f32 Q/out, int8 K/V.
    Int8Kv {
        /// Queries, output.
        q: [Vec<f32>; 2],
        /// Keys, values.
        kv: Box<[Int8Cache; 2]>,
    },
}

impl Inputs {
    /// Pseudo-random inputs for `sh` (seeds `seed..seed + 3`) in `dtype`.
    pub fn new(dtype: SdpaDtype, sh: &Shape, seed: u32) -> Result<Inputs, SdpaError> {
        let (qn, kn) = (sh.q_elems()?, sh.kv_elems()?);
        let (q, k, v) = (fill(qn, seed), fill(kn, seed + 1), fill(kn, seed + 2));
        let bf = |x: &[f32]| x.iter().map(|&v| Bf16::from_f32(v)).collect::<Vec<_>>();
        Ok(match dtype {
            SdpaDtype::F32 => Inputs::F32 {
                t: [q, k, v, vec![0.0; qn]],
            },
            SdpaDtype::Bf16 => Inputs::Bf16 {
                t: [bf(&q), bf(&k), bf(&v), vec![Bf16::default(); qn]],
            },
            SdpaDtype::Int8Kv => Inputs::Int8Kv {
                kv: Box::new([Int8Cache::quantize(&k, sh)?, Int8Cache::quantize(&v, sh)?]),
                q: [q, vec![0.0; qn]],
            },
        })
    }

    /// One attention call on these tensors with shape `sh` (whose sizes must be those the
    /// inputs were made for, `start_pos` and `q_len` aside as the cache allows).
    pub fn call(
        &mut self,
        sh: &Shape,
        p: &Params,
        temp: &(impl TempAllocator + ?Sized),
    ) -> Result<(), SdpaError> {
        match self {
            Inputs::F32 { t: [q, k, v, out] } => attention_typed(q, k, v, out, sh, p, temp),
            Inputs::Bf16 { t: [q, k, v, out] } => attention_typed(q, k, v, out, sh, p, temp),
            Inputs::Int8Kv { q: [q, out], kv } => {
                attention_quantized(q, kv[0].view(), kv[1].view(), out, sh, p, temp)
            }
        }
    }
}
