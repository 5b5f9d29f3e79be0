//! A tiny `gemma3` GGUF model written by the tests, and an f64 reference forward pass of the
//! architecture written from its definition (Gemma 3's modeling code and llama.cpp's
//! `gemma3` graph), independent of the library: it recomputes the whole sequence for every
//! position, with no KV cache.
#![allow(dead_code)]

use llm::gguf::Value;
use llm::quant::QType;

use super::gguf::{dequant_reference, encode_rows, Writer, F32};

/// What tiny gemma3 model to write.
#[derive(Clone, Debug)]
pub struct GemmaSpec {
    pub hidden: usize,
    /// Blocks: with 7, layer 5 is global and the others local (every 6th is global).
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// From `gemma3.attention.key_length`, not `hidden / heads`.
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// `gemma3.attention.sliding_window`.
    pub window: usize,
    /// `gemma3.rope.freq_base`: the global layers' RoPE base.
    pub rope_global: f64,
    pub eps: f64,
    /// Matrices' type (F32 when `None`); the embedding/head always Q8_0 when quantized, as
    /// Gemma 3 270M's file stores it.
    pub quant: Option<QType>,
    pub seed: u64,
}

impl Default for GemmaSpec {
    fn default() -> Self {
        GemmaSpec {
            hidden: 32,
            layers: 7,
            heads: 4,
            kv_heads: 1,
            head_dim: 16,
            ffn: 64,
            vocab: 64,
            window: 4,
            rope_global: 1e6,
            eps: 1e-6,
            quant: None,
            seed: 11,
        }
    }
}

/// The architecture's constants that are not in the metadata (Gemma 3's definition):
/// every 6th layer is global, the local layers' RoPE base is 10,000.
pub const GLOBAL_EVERY: usize = 6;
pub const ROPE_LOCAL: f64 = 10_000.0;

/// Whether layer `l` attends over a sliding window.
pub fn is_local(l: usize) -> bool {
    !(l + 1).is_multiple_of(GLOBAL_EVERY)
}

/// The weights the file holds, dequantized, by GGUF name (matrices row-major
/// `[rows, cols]`).
pub struct GemmaWeights {
    pub spec: GemmaSpec,
    pub tensors: std::collections::HashMap<String, Vec<f64>>,
}

fn rng_vals(rng: &mut llm::sample::Rng, n: usize, center: f64, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|_| (center + (rng.next_f64() * 2.0 - 1.0) * scale) as f32)
        .collect()
}

/// Writes the model's GGUF image; returns the writer and the values the file stores.
pub fn tiny_gemma3(spec: &GemmaSpec) -> (Writer, GemmaWeights) {
    let s = spec;
    let mut rng = llm::sample::Rng::new(s.seed);
    let mut w = Writer::default();
    let a = |k: &str| format!("gemma3.{k}");
    w.meta("general.architecture", Value::String("gemma3".into()))
        .meta(&a("block_count"), Value::U32(s.layers as u32))
        .meta(&a("context_length"), Value::U32(128))
        .meta(&a("embedding_length"), Value::U32(s.hidden as u32))
        .meta(&a("feed_forward_length"), Value::U32(s.ffn as u32))
        .meta(&a("attention.head_count"), Value::U32(s.heads as u32))
        .meta(&a("attention.head_count_kv"), Value::U32(s.kv_heads as u32))
        .meta(&a("attention.key_length"), Value::U32(s.head_dim as u32))
        .meta(&a("attention.value_length"), Value::U32(s.head_dim as u32))
        .meta(&a("attention.sliding_window"), Value::U32(s.window as u32))
        .meta(&a("rope.freq_base"), Value::F32(s.rope_global as f32))
        .meta(
            &a("attention.layer_norm_rms_epsilon"),
            Value::F32(s.eps as f32),
        );
    let mut tensors = std::collections::HashMap::new();
    let (h, hd) = (s.hidden, s.head_dim);
    let (qd, kvd) = (s.heads * hd, s.kv_heads * hd);
    let mut put_vec = |w: &mut Writer, name: String, vals: Vec<f32>| {
        w.tensor(
            &name,
            &[vals.len() as u64],
            F32,
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        tensors.insert(name, vals.iter().map(|&v| v as f64).collect::<Vec<_>>());
    };
    let mut mats: Vec<(String, usize, usize, f64, Option<QType>)> = vec![(
        "token_embd.weight".into(),
        s.vocab,
        h,
        0.5,
        s.quant.map(|_| QType::Q8_0),
    )];
    for l in 0..s.layers {
        let n = |t: &str| format!("blk.{l}.{t}");
        let inv = |k: usize| 1.0 / (k as f64).sqrt();
        mats.push((n("attn_q.weight"), qd, h, inv(h), s.quant));
        mats.push((n("attn_k.weight"), kvd, h, inv(h), s.quant));
        mats.push((n("attn_v.weight"), kvd, h, inv(h), s.quant));
        mats.push((n("attn_output.weight"), h, qd, inv(qd), s.quant));
        mats.push((n("ffn_gate.weight"), s.ffn, h, 2.0 * inv(h), s.quant));
        mats.push((n("ffn_up.weight"), s.ffn, h, inv(h), s.quant));
        mats.push((n("ffn_down.weight"), h, s.ffn, inv(s.ffn), s.quant));
    }
    let mut mat_vals = Vec::new();
    for (name, rows, cols, scale, q) in mats {
        let vals = rng_vals(&mut rng, rows * cols, 0.0, scale);
        let (ty, rows_bytes) = encode_rows(&vals, cols, q);
        let stored: Vec<f64> = rows_bytes
            .iter()
            .flat_map(|r| dequant_reference(ty, r))
            .map(f64::from)
            .collect();
        w.tensor(&name, &[cols as u64, rows as u64], ty, rows_bytes.concat());
        mat_vals.push((name, stored));
    }
    for l in 0..s.layers {
        let n = |t: &str| format!("blk.{l}.{t}");
        // The file's norm weights are used as they are (the converter added Gemma's 1).
        put_vec(
            &mut w,
            n("attn_norm.weight"),
            rng_vals(&mut rng, h, 1.0, 0.3),
        );
        put_vec(
            &mut w,
            n("attn_q_norm.weight"),
            rng_vals(&mut rng, hd, 1.0, 0.3),
        );
        put_vec(
            &mut w,
            n("attn_k_norm.weight"),
            rng_vals(&mut rng, hd, 1.0, 0.3),
        );
        put_vec(
            &mut w,
            n("post_attention_norm.weight"),
            rng_vals(&mut rng, h, 1.0, 0.3),
        );
        put_vec(
            &mut w,
            n("ffn_norm.weight"),
            rng_vals(&mut rng, h, 1.0, 0.3),
        );
        put_vec(
            &mut w,
            n("post_ffw_norm.weight"),
            rng_vals(&mut rng, h, 1.0, 0.3),
        );
    }
    put_vec(
        &mut w,
        "output_norm.weight".into(),
        rng_vals(&mut rng, h, 1.0, 0.3),
    );
    tensors.extend(mat_vals);
    (
        w,
        GemmaWeights {
            spec: spec.clone(),
            tensors,
        },
    )
}

impl GemmaWeights {
    fn t(&self, name: &str) -> &[f64] {
        &self.tensors[name]
    }

    /// `W x` for `W` `[rows, x.len()]`.
    fn lin(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let w = self.t(name);
        let k = x.len();
        w.chunks(k)
            .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn rms(&self, weight: &[f64], x: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + self.spec.eps).sqrt();
        x.iter().zip(weight).map(|(v, g)| v * inv * g).collect()
    }

    /// NeoX (rotate-half) RoPE of one head at `pos` with base `theta`.
    fn rope(x: &mut [f64], pos: usize, theta: f64) {
        let d = x.len();
        let half = d / 2;
        for i in 0..half {
            let a = pos as f64 * theta.powf(-((2 * i) as f64) / d as f64);
            let (c, s) = (a.cos(), a.sin());
            let (u, v) = (x[i], x[i + half]);
            x[i] = u * c - v * s;
            x[i + half] = v * c + u * s;
        }
    }

    fn gelu_tanh(x: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    }

    /// The weights of a `gemma3` file read from its bytes with the test's own decoders
    /// ([`dequant_reference`]), in f64, for a reference independent of the library's.
    pub fn from_file(f: &llm::gguf::GgufFile, spec: GemmaSpec) -> GemmaWeights {
        let mut tensors = std::collections::HashMap::new();
        for t in f.tensor_infos() {
            let bytes = f.tensor_bytes(&t.name).unwrap().unwrap();
            let cols = t.dims[0] as usize;
            let rb = super::gguf::row_bytes(t.ggml_type, cols);
            let vals: Vec<f64> = bytes
                .chunks(rb)
                .flat_map(|r| dequant_reference(t.ggml_type, r))
                .map(f64::from)
                .collect();
            tensors.insert(t.name.clone(), vals);
        }
        GemmaWeights { spec, tensors }
    }

    /// The logits at every position of `tokens`, each from the whole prefix.
    pub fn logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        self.logits_at(tokens, &(0..tokens.len()).collect::<Vec<_>>())
    }

    /// The logits at `positions` of `tokens` (the head runs only there).
    pub fn logits_at(&self, tokens: &[u32], positions: &[usize]) -> Vec<Vec<f64>> {
        let s = &self.spec;
        let (h, hd) = (s.hidden, s.head_dim);
        let group = s.heads / s.kv_heads;
        let emb = self.t("token_embd.weight");
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                emb[t as usize * h..][..h]
                    .iter()
                    .map(|v| v * (h as f64).sqrt())
                    .collect()
            })
            .collect();
        let n = tokens.len();
        for l in 0..s.layers {
            let name = |t: &str| format!("blk.{l}.{t}");
            let local = is_local(l);
            let theta = if local { ROPE_LOCAL } else { s.rope_global };
            let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for (p, xp) in x.iter().enumerate() {
                let xn = self.rms(self.t(&name("attn_norm.weight")), xp);
                let mut qp = self.lin(&name("attn_q.weight"), &xn);
                let mut kp = self.lin(&name("attn_k.weight"), &xn);
                for head in qp.chunks_mut(hd) {
                    let normed = self.rms(self.t(&name("attn_q_norm.weight")), head);
                    head.copy_from_slice(&normed);
                    Self::rope(head, p, theta);
                }
                for head in kp.chunks_mut(hd) {
                    let normed = self.rms(self.t(&name("attn_k_norm.weight")), head);
                    head.copy_from_slice(&normed);
                    Self::rope(head, p, theta);
                }
                q.push(qp);
                k.push(kp);
                v.push(self.lin(&name("attn_v.weight"), &xn));
            }
            let scale = 1.0 / (hd as f64).sqrt();
            for p in 0..n {
                let mut attn = vec![0.0; s.heads * hd];
                for head in 0..s.heads {
                    let kvh = head / group;
                    let qh = &q[p][head * hd..][..hd];
                    // Causal; a local layer sees the last `window` positions (p - j < window).
                    let keys: Vec<usize> =
                        (0..=p).filter(|&j| !local || p - j < s.window).collect();
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|&j| {
                            let kj = &k[j][kvh * hd..][..hd];
                            qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (wi, &j) in e.iter().zip(&keys) {
                        for d in 0..hd {
                            attn[head * hd + d] += wi / z * v[j][kvh * hd + d];
                        }
                    }
                }
                let o = self.lin(&name("attn_output.weight"), &attn);
                let o = self.rms(self.t(&name("post_attention_norm.weight")), &o);
                x[p].iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let xn = self.rms(self.t(&name("ffn_norm.weight")), &x[p]);
                let g = self.lin(&name("ffn_gate.weight"), &xn);
                let u = self.lin(&name("ffn_up.weight"), &xn);
                let gu: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| Self::gelu_tanh(*g) * u)
                    .collect();
                let d = self.lin(&name("ffn_down.weight"), &gu);
                let d = self.rms(self.t(&name("post_ffw_norm.weight")), &d);
                x[p].iter_mut().zip(&d).for_each(|(a, b)| *a += b);
            }
        }
        positions
            .iter()
            .map(|&p| {
                let xn = self.rms(self.t("output_norm.weight"), &x[p]);
                self.lin("token_embd.weight", &xn)
            })
            .collect()
    }
}
