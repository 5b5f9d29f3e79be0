//! A small GGUF writer for tests, the formats' dequantization written from their definitions
//! (independently of the library's), and a tiny llama GGUF model built from a [`Spec`].
#![allow(dead_code)]

use llm::gguf::Value;
use llm::quant::format::QType;
use llm::safetensors::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

use super::Spec;

/// ggml type ids (ggml.h `enum ggml_type`).
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 6;
pub const Q5_1: u32 = 7;
pub const Q8_0: u32 = 8;
pub const Q4_K: u32 = 12;
pub const Q5_K: u32 = 13;
pub const Q6_K: u32 = 14;
pub const Q3_K: u32 = 11;
pub const BF16: u32 = 30;

pub fn qtype_id(t: QType) -> u32 {
    match t {
        QType::Q4_0 => Q4_0,
        QType::Q4_1 => Q4_1,
        QType::Q5_0 => Q5_0,
        QType::Q5_1 => Q5_1,
        QType::Q8_0 => Q8_0,
        QType::Q4_K => Q4_K,
        QType::Q5_K => Q5_K,
        QType::Q6_K => Q6_K,
    }
}

/// The quantized types with their (weights, bytes) per block, as ggml-common.h lays them out.
pub const BLOCKS: [(u32, usize, usize); 8] = [
    (Q4_0, 32, 18),
    (Q4_1, 32, 20),
    (Q5_0, 32, 22),
    (Q5_1, 32, 24),
    (Q8_0, 32, 34),
    (Q4_K, 256, 144),
    (Q5_K, 256, 176),
    (Q6_K, 256, 210),
];

/// Weights per block of any type `t` (1 for the dense ones).
pub fn block_of_any(t: u32) -> usize {
    BLOCKS.iter().find(|b| b.0 == t).map_or(1, |b| b.1)
}

/// Weights and bytes per block of quantized type `t`.
pub fn block_of(t: u32) -> (usize, usize) {
    let &(_, n, b) = BLOCKS.iter().find(|b| b.0 == t).expect("a quantized type");
    (n, b)
}

/// The 6-bit field `i` (0..16) of the 12 packed K-quant scale bytes, read as a bit string:
/// fields 0..8 are the low 6 bits of bytes 0..8 (scales 0..4, then minimums 0..4); the
/// scales and minimums of sub-blocks 4..8 take their low 4 bits from the nibbles of bytes
/// 8..12 and their top 2 bits from the top bits of bytes 0..8.
fn k_field(sc: &[u8], sub: usize, min: bool) -> u32 {
    let b = |i: usize| sc[i] as u32;
    match (sub < 4, min) {
        (true, false) => b(sub) & 0x3F,
        (true, true) => b(sub + 4) & 0x3F,
        (false, false) => (b(sub + 4) & 0x0F) + (b(sub - 4) >> 6) * 16,
        (false, true) => (b(sub + 4) >> 4) + (b(sub) >> 6) * 16,
    }
}

/// One tensor to write: name, GGUF dims (innermost first), ggml type, raw data.
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
}

/// Metadata and tensors of a file to write.
pub struct Writer {
    pub version: u32,
    pub alignment: u64,
    pub meta: Vec<(String, Value)>,
    pub tensors: Vec<TensorSpec>,
    /// Lay tensors end to end without alignment padding (to write a malformed file).
    pub unpadded: bool,
}

impl Default for Writer {
    fn default() -> Self {
        Writer {
            version: 3,
            alignment: 32,
            meta: Vec::new(),
            tensors: Vec::new(),
            unpadded: false,
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_of(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => {
            let et = a.first().map_or(4, type_of);
            out.extend_from_slice(&et.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                put_value(out, e);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl Writer {
    pub fn meta(&mut self, key: &str, v: Value) -> &mut Self {
        self.meta.push((key.into(), v));
        self
    }

    /// Replaces `key`'s value (the key moves to the end).
    pub fn set_meta(&mut self, key: &str, v: Value) -> &mut Self {
        self.meta.retain(|(k, _)| k != key);
        self.meta(key, v)
    }

    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) {
        self.tensors.push(TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
    }

    /// The file image, laid out as gguf.h describes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        for (k, v) in &self.meta {
            put_str(&mut out, k);
            out.extend_from_slice(&type_of(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let a = self
            .meta
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(self.alignment);
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset += t.data.len() as u64;
            if !self.unpadded {
                offset = offset.next_multiple_of(a);
            }
        }
        out.resize((out.len() as u64).next_multiple_of(a) as usize, 0);
        let start = out.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(start + off as usize, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }

    pub fn write(&self, path: &std::path::Path) {
        std::fs::write(path, self.bytes()).unwrap();
    }
}

/// Dequantization of one row as `ggml-quants.c`'s `dequantize_row_*` defines it.
pub fn dequant_reference(t: u32, row: &[u8]) -> Vec<f32> {
    let h = |b: &[u8], i: usize| f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]));
    let mut out = Vec::new();
    match t {
        F32 => {
            for c in row.chunks_exact(4) {
                out.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        F16 => {
            for c in row.chunks_exact(2) {
                out.push(f16_to_f32(u16::from_le_bytes([c[0], c[1]])));
            }
        }
        BF16 => {
            for c in row.chunks_exact(2) {
                out.push(bf16_to_f32(u16::from_le_bytes([c[0], c[1]])));
            }
        }
        Q4_0 => {
            for b in row.chunks_exact(18) {
                let d = h(b, 0);
                let mut y = [0f32; 32];
                for j in 0..16 {
                    let x0 = (b[2 + j] & 0x0F) as i32 - 8;
                    let x1 = (b[2 + j] >> 4) as i32 - 8;
                    y[j] = x0 as f32 * d;
                    y[j + 16] = x1 as f32 * d;
                }
                out.extend_from_slice(&y);
            }
        }
        Q4_1 => {
            for b in row.chunks_exact(20) {
                let (d, m) = (h(b, 0), h(b, 2));
                let mut y = [0f32; 32];
                for j in 0..16 {
                    let x0 = (b[4 + j] & 0x0F) as i32;
                    let x1 = (b[4 + j] >> 4) as i32;
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                }
                out.extend_from_slice(&y);
            }
        }
        Q8_0 => {
            for b in row.chunks_exact(34) {
                let d = h(b, 0);
                for j in 0..32 {
                    out.push(b[2 + j] as i8 as f32 * d);
                }
            }
        }
        // Q5_0 / Q5_1: element e's low 4 bits in nibble (e / 16) of qs[e % 16], its fifth
        // bit is bit e of the little-endian u32 after the scale (and minimum).
        Q5_0 | Q5_1 => {
            let (bb, q0) = if t == Q5_0 { (22, 2) } else { (24, 4) };
            for b in row.chunks_exact(bb) {
                let d = h(b, 0);
                let qh = u32::from_le_bytes(b[q0..q0 + 4].try_into().unwrap());
                for e in 0..32 {
                    let byte = b[q0 + 4 + e % 16];
                    let low = if e < 16 { byte & 0x0F } else { byte >> 4 } as i32;
                    let q = low + 16 * ((qh >> e) & 1) as i32;
                    out.push(if t == Q5_0 {
                        (q - 16) as f32 * d
                    } else {
                        q as f32 * d + h(b, 2)
                    });
                }
            }
        }
        // Q4_K / Q5_K: element e of a super-block is in sub-block e / 32; sub-blocks 2i and
        // 2i + 1 read the low and high nibbles of qs[32 i + e % 32]; Q5_K's fifth bit is
        // bit (e / 32) of qh[e % 32]. Value (d * scale) * q - dmin * min.
        Q4_K | Q5_K => {
            let (bb, qs0) = if t == Q4_K { (144, 16) } else { (176, 48) };
            for b in row.chunks_exact(bb) {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let sc = &b[4..16];
                for e in 0..256 {
                    let sub = e / 32;
                    let byte = b[qs0 + 32 * (sub / 2) + e % 32];
                    let mut q = if sub % 2 == 0 { byte & 0x0F } else { byte >> 4 } as u32;
                    if t == Q5_K {
                        q += 16 * ((b[16 + e % 32] as u32 >> sub) & 1);
                    }
                    let scale = d * k_field(sc, sub, false) as f32;
                    let min = dmin * k_field(sc, sub, true) as f32;
                    out.push(scale * q as f32 - min);
                }
            }
        }
        // Q6_K: element e is in half e / 128; within it r = e % 128 is in quarter r / 32 and
        // column l = r % 32: its low 4 bits are a nibble (high for quarters 2, 3) of
        // ql[64 half + 32 (quarter % 2) + l], its top 2 bits are bits 2 quarter of
        // qh[32 half + l], its scale the signed byte 8 half + 2 quarter + l / 16; d last.
        Q6_K => {
            for b in row.chunks_exact(210) {
                let d = h(b, 208);
                for e in 0..256 {
                    let (half, r) = (e / 128, e % 128);
                    let (quarter, l) = (r / 32, r % 32);
                    let byte = b[64 * half + 32 * (quarter % 2) + l];
                    let low = if quarter < 2 { byte & 0x0F } else { byte >> 4 } as i32;
                    let high = ((b[128 + 32 * half + l] >> (2 * quarter)) & 3) as i32;
                    let scale = b[192 + 8 * half + 2 * quarter + l / 16] as i8;
                    out.push(d * scale as f32 * (low + 16 * high - 32) as f32);
                }
            }
        }
        _ => panic!("no reference for type {t}"),
    }
    out
}

/// Bytes per row of `cols` elements of type `t`.
pub fn row_bytes(t: u32, cols: usize) -> usize {
    match t {
        F32 => cols * 4,
        F16 | BF16 => cols * 2,
        _ => {
            let (n, b) = block_of(t);
            cols / n * b
        }
    }
}

/// Random bytes that are a valid tensor of type `t` (finite f16 scales in a sane range).
pub fn random_tensor_bytes(t: u32, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = llm::sample::Rng::new(seed);
    let mut f = |s: f32| (rng.next_f32() * 2.0 - 1.0) * s;
    let mut out = Vec::new();
    for _ in 0..rows {
        match t {
            F32 => (0..cols).for_each(|_| out.extend_from_slice(&f(2.0).to_le_bytes())),
            F16 => (0..cols).for_each(|_| out.extend_from_slice(&f32_to_f16(f(2.0)).to_le_bytes())),
            BF16 => {
                (0..cols).for_each(|_| out.extend_from_slice(&f32_to_bf16(f(2.0)).to_le_bytes()))
            }
            Q4_0 | Q4_1 | Q8_0 => {
                for _ in 0..cols / 32 {
                    out.extend_from_slice(&f32_to_f16(f(0.1)).to_le_bytes());
                    if t == Q4_1 {
                        out.extend_from_slice(&f32_to_f16(f(0.5)).to_le_bytes());
                    }
                    let n = if t == Q8_0 { 32 } else { 16 };
                    for _ in 0..n {
                        out.push((f(1.0).to_bits() >> 7) as u8);
                    }
                }
            }
            // Random bytes, with the f16 scales (and minimums) set to sane values.
            Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K => {
                let (n, bb) = block_of(t);
                for _ in 0..cols / n {
                    let mut b: Vec<u8> = (0..bb).map(|_| (f(1.0).to_bits() >> 9) as u8).collect();
                    let put = |b: &mut Vec<u8>, at: usize, v: f32| {
                        b[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes())
                    };
                    match t {
                        Q5_0 => put(&mut b, 0, f(0.1)),
                        Q5_1 | Q4_K | Q5_K => {
                            put(&mut b, 0, f(0.1));
                            put(&mut b, 2, f(0.05));
                        }
                        _ => put(&mut b, 208, f(0.01)),
                    }
                    out.extend_from_slice(&b);
                }
            }
            _ => panic!("type {t}"),
        }
    }
    out
}

/// llama.cpp's converter permutation of q/k rows (`LlamaModel.permute`): HF row
/// `h * hd + j * hd / 2 + i` goes to GGUF row `h * hd + 2 i + j`.
pub fn permute_hf_to_gguf<T: Clone>(rows: &[T], heads: usize) -> Vec<T> {
    let mut out = rows.to_vec();
    for_each_permuted_row(rows.len(), heads, |hf, gguf| out[gguf] = rows[hf].clone());
    out
}

/// The inverse of [`permute_hf_to_gguf`]: a GGUF file's q/k rows back in HF's order.
pub fn permute_gguf_to_hf<T: Clone>(rows: &[T], heads: usize) -> Vec<T> {
    let mut out = rows.to_vec();
    for_each_permuted_row(rows.len(), heads, |hf, gguf| out[hf] = rows[gguf].clone());
    out
}

/// Calls `f(hf_row, gguf_row)` for each of `rows` q/k rows of `heads` heads, as llama.cpp's
/// converter moves them.
fn for_each_permuted_row(rows: usize, heads: usize, mut f: impl FnMut(usize, usize)) {
    let hd = rows / heads;
    let half = hd / 2;
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                f(h * hd + j * half + i, h * hd + 2 * i + j);
            }
        }
    }
}

/// A tiny llama GGUF model from `spec`'s random weights: matrices in `qt` (or F32 when
/// `None`), norms in F32, q/k permuted as llama.cpp's converter does. Returns the file image
/// and the HF-named tensors holding the values the file actually stores (dequantized), for
/// the f64 reference.
/// HF-named tensors: name, shape, values.
pub type NamedTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

pub fn tiny_model(spec: &Spec, qt: Option<QType>) -> (Writer, NamedTensors) {
    let ts = spec.tensors();
    let mut w = Writer::default();
    let hd = spec.head_dim();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("llama.block_count", Value::U32(spec.layers as u32))
        .meta("llama.context_length", Value::U32(64))
        .meta("llama.embedding_length", Value::U32(spec.hidden as u32))
        .meta("llama.feed_forward_length", Value::U32(spec.ffn as u32))
        .meta("llama.attention.head_count", Value::U32(spec.heads as u32))
        .meta(
            "llama.attention.head_count_kv",
            Value::U32(spec.kv_heads as u32),
        )
        .meta("llama.rope.freq_base", Value::F32(spec.rope_theta as f32))
        .meta("llama.rope.dimension_count", Value::U32(hd as u32))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .meta("llama.vocab_size", Value::U32(spec.vocab as u32));
    let mut reference = Vec::new();
    for (name, shape, vals) in ts {
        let gname = hf_to_gguf_name(&name);
        if shape.len() == 1 {
            w.tensor(
                &gname,
                &[shape[0] as u64],
                F32,
                vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            );
            reference.push((name, shape, vals));
            continue;
        }
        let (rows, cols) = (shape[0], shape[1]);
        let (ty, row_data) = encode_rows(&vals, cols, qt);
        let stored: Vec<f32> = row_data
            .iter()
            .flat_map(|r| dequant_reference(ty, r))
            .collect();
        reference.push((name.clone(), shape.clone(), stored));
        let row_data = if name.ends_with("q_proj.weight") {
            permute_hf_to_gguf(&row_data, spec.heads)
        } else if name.ends_with("k_proj.weight") {
            permute_hf_to_gguf(&row_data, spec.kv_heads)
        } else {
            row_data
        };
        w.tensor(&gname, &[cols as u64, rows as u64], ty, row_data.concat());
    }
    (w, reference)
}

/// The whole-model tensors of a llama: (HF name, llama.cpp's name).
const LLAMA_GLOBAL_NAMES: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// A llama layer's tensors: (HF name after `model.layers.{i}.`, llama.cpp's after `blk.{i}.`).
const LLAMA_LAYER_NAMES: [(&str, &str); 9] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// llama.cpp's tensor names for HF's.
pub fn hf_to_gguf_name(hf: &str) -> String {
    if let Some(&(_, g)) = LLAMA_GLOBAL_NAMES.iter().find(|(h, _)| *h == hf) {
        return g.into();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (i, t) = rest.split_once('.').unwrap();
    let Some(&(_, t)) = LLAMA_LAYER_NAMES.iter().find(|(h, _)| *h == t) else {
        panic!("no GGUF name for {t}")
    };
    format!("blk.{i}.{t}")
}

/// HF's tensor name for llama.cpp's `gguf` name in a llama of `layers` layers.
fn gguf_to_hf_name(gguf: &str, layers: usize) -> Option<String> {
    if let Some(&(h, _)) = LLAMA_GLOBAL_NAMES.iter().find(|(_, g)| *g == gguf) {
        return Some(h.into());
    }
    let (i, t) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let i: usize = i.parse().ok().filter(|&i| i < layers)?;
    let &(h, _) = LLAMA_LAYER_NAMES.iter().find(|(_, g)| *g == t)?;
    Some(format!("model.layers.{i}.{h}"))
}

/// The HF-named tensors of a `llama` GGUF file, read from its bytes with the tests' own
/// decoders ([`dequant_reference`], not the library's loader) and the q/k rows put back in
/// HF's order ([`permute_gguf_to_hf`]; `heads`, `kv_heads` from the file's metadata): the
/// weights of an f64 [`super::Reference`] independent of the library's.
pub fn llama_tensors_from_file(
    f: &llm::gguf::GgufFile,
    layers: usize,
    heads: usize,
    kv_heads: usize,
) -> NamedTensors {
    f.tensor_infos()
        .iter()
        .map(|t| {
            let name = gguf_to_hf_name(&t.name, layers)
                .unwrap_or_else(|| panic!("{}: not a llama tensor", t.name));
            let bytes = f.tensor_bytes(&t.name).unwrap().unwrap();
            let cols = t.dims[0] as usize;
            let rows: Vec<Vec<f32>> = bytes
                .chunks(row_bytes(t.ggml_type, cols))
                .map(|r| dequant_reference(t.ggml_type, r))
                .collect();
            let rows = if name.ends_with("q_proj.weight") {
                permute_gguf_to_hf(&rows, heads)
            } else if name.ends_with("k_proj.weight") {
                permute_gguf_to_hf(&rows, kv_heads)
            } else {
                rows
            };
            let shape = t.dims.iter().rev().map(|&d| d as usize).collect();
            (name, shape, rows.concat())
        })
        .collect()
}

/// A simple K-quant quantizer (not ggml's search for the best scales; any valid bytes do, as
/// the reference reads back what is stored): `x` (a multiple of 256) as Q4_K, Q5_K or Q6_K.
pub fn quantize_k(t: u32, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    let f16 = |v: f32| f32_to_f16(v).to_le_bytes();
    let h = |v: f32| f16_to_f32(f32_to_f16(v));
    for sb in x.chunks_exact(256) {
        match t {
            Q4_K | Q5_K => {
                let nmax = if t == Q4_K { 15.0 } else { 31.0 };
                let (mut scale, mut min) = ([0f32; 8], [0f32; 8]);
                for (j, xs) in sb.chunks_exact(32).enumerate() {
                    let lo = xs.iter().copied().fold(0f32, f32::min);
                    let hi = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    scale[j] = (hi - lo) / nmax;
                    min[j] = -lo;
                }
                let d = h(scale.iter().copied().fold(0f32, f32::max) / 63.0);
                let dmin = h(min.iter().copied().fold(0f32, f32::max) / 63.0);
                let six = |v: f32, by: f32| {
                    if by > 0.0 {
                        (v / by).round().clamp(0.0, 63.0) as u8
                    } else {
                        0
                    }
                };
                let sc: Vec<u8> = scale.iter().map(|&v| six(v, d)).collect();
                let m: Vec<u8> = min.iter().map(|&v| six(v, dmin)).collect();
                let mut q = [0u8; 256];
                for (e, qe) in q.iter_mut().enumerate() {
                    let (step, off) = (d * sc[e / 32] as f32, dmin * m[e / 32] as f32);
                    if step > 0.0 {
                        *qe = ((sb[e] + off) / step).round().clamp(0.0, nmax) as u8;
                    }
                }
                out.extend_from_slice(&f16(d));
                out.extend_from_slice(&f16(dmin));
                let mut packed = [0u8; 12];
                for j in 0..4 {
                    packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
                    packed[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
                    packed[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
                }
                out.extend_from_slice(&packed);
                if t == Q5_K {
                    let mut qh = [0u8; 32];
                    for (e, &qe) in q.iter().enumerate() {
                        qh[e % 32] |= (qe >> 4) << (e / 32);
                    }
                    out.extend_from_slice(&qh);
                }
                for i in 0..4 {
                    for l in 0..32 {
                        out.push((q[64 * i + l] & 15) | ((q[64 * i + 32 + l] & 15) << 4));
                    }
                }
            }
            Q6_K => {
                let scale: Vec<f32> = sb
                    .chunks_exact(16)
                    .map(|xs| xs.iter().fold(0f32, |a, v| a.max(v.abs())) / 31.0)
                    .collect();
                let d = h(scale.iter().copied().fold(0f32, f32::max) / 127.0);
                let sc: Vec<i8> = scale
                    .iter()
                    .map(|&v| {
                        if d > 0.0 {
                            (v / d).round().clamp(-128.0, 127.0) as i8
                        } else {
                            0
                        }
                    })
                    .collect();
                let mut biased = [0u8; 256];
                for (e, be) in biased.iter_mut().enumerate() {
                    let step = d * sc[e / 16] as f32;
                    let q = if step != 0.0 {
                        (sb[e] / step).round().clamp(-32.0, 31.0) as i32
                    } else {
                        0
                    };
                    *be = (q + 32) as u8;
                }
                let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
                for half in 0..2 {
                    let b6 = &biased[128 * half..];
                    for l in 0..32 {
                        ql[64 * half + l] = (b6[l] & 15) | ((b6[l + 64] & 15) << 4);
                        ql[64 * half + 32 + l] = (b6[l + 32] & 15) | ((b6[l + 96] & 15) << 4);
                        qh[32 * half + l] = (b6[l] >> 4)
                            | ((b6[l + 32] >> 4) << 2)
                            | ((b6[l + 64] >> 4) << 4)
                            | ((b6[l + 96] >> 4) << 6);
                    }
                }
                out.extend_from_slice(&ql);
                out.extend_from_slice(&qh);
                out.extend(sc.iter().map(|&v| v as u8));
                out.extend_from_slice(&f16(d));
            }
            _ => panic!("not a K-quant: {t}"),
        }
    }
    out
}

/// A matrix's rows (`vals`, `cols` to a row) as a GGUF tensor stores them: its type id and
/// each row's bytes, f32 without `q`, else quantized (the K-quants by the tests' own
/// quantizer).
pub fn encode_rows(vals: &[f32], cols: usize, q: Option<QType>) -> (u32, Vec<Vec<u8>>) {
    match q {
        None => (
            F32,
            vals.chunks(cols)
                .map(|r| r.iter().flat_map(|v| v.to_le_bytes()).collect())
                .collect(),
        ),
        Some(q) => (
            qtype_id(q),
            vals.chunks(cols)
                .map(|r| {
                    llm::quant::format::quantize_row(q, r)
                        .unwrap_or_else(|| quantize_k(qtype_id(q), r))
                })
                .collect(),
        ),
    }
}
