//! Shared by the test binaries: temp dirs, a tiny random checkpoint writer, a byte-level
//! tokenizer.json, and an independent f64 reference implementation of the architecture.
#![allow(dead_code, missing_docs)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use llm::safetensors::{self, bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, DType};
use llm::sample::Rng;

pub mod gemma3;
pub mod gguf;
pub mod real_model;

/// A fresh empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "llm-test-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What tiny checkpoint to write.
#[derive(Clone, Debug)]
pub struct Spec {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub tied: bool,
    /// Qwen2-style q/k/v biases.
    pub qwen2: bool,
    /// Llama 3 rope_scaling with a small original context, so all three bands occur.
    pub llama3_scaling: bool,
    pub rope_theta: f64,
    pub dtype: DType,
    pub seed: u64,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            hidden: 32,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 48,
            vocab: 64,
            tied: false,
            qwen2: false,
            llama3_scaling: false,
            rope_theta: 10000.0,
            dtype: DType::F32,
            seed: 1,
        }
    }
}

impl Spec {
    /// The default model with the weights drawn from `seed`.
    pub fn seeded(seed: u64) -> Spec {
        Spec {
            seed,
            ..Spec::default()
        }
    }
}

/// Uniform in `[-scale, scale)` from the library's seeded SplitMix64 (the weights need a
/// reproducible source, not an independent one: the reference below is what is independent).
fn uniform(rng: &mut Rng, scale: f64) -> f32 {
    ((rng.next_f64() * 2.0 - 1.0) * scale) as f32
}

impl Spec {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    pub fn config_json(&self) -> serde_json::Value {
        let mut c = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": if self.qwen2 { "qwen2" } else { "llama" },
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "rms_norm_eps": 1e-5,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": 64,
            "tie_word_embeddings": self.tied,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": [2, 3],
            "torch_dtype": "float32",
        });
        if self.llama3_scaling {
            c["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            });
        }
        c
    }

    /// Every tensor (HF name, shape, f32 values already rounded to `dtype`).
    pub fn tensors(&self) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let mut rng = Rng::new(self.seed);
        let (h, hd) = (self.hidden, self.head_dim());
        let (qd, kvd) = (self.heads * hd, self.kv_heads * hd);
        let mut out = Vec::new();
        let dtype = self.dtype;
        let mut mat = |name: String, shape: Vec<usize>, scale: f64, offset: f32| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|_| round_to(dtype, offset + uniform(&mut rng, scale)))
                .collect();
            out.push((name, shape, v));
        };
        let s = |n: usize| 1.0 / (n as f64).sqrt();
        mat(
            "model.embed_tokens.weight".into(),
            vec![self.vocab, h],
            1.0,
            0.0,
        );
        for i in 0..self.layers {
            let p = format!("model.layers.{i}.");
            mat(format!("{p}input_layernorm.weight"), vec![h], 0.2, 1.0);
            mat(
                format!("{p}self_attn.q_proj.weight"),
                vec![qd, h],
                2.0 * s(h),
                0.0,
            );
            mat(
                format!("{p}self_attn.k_proj.weight"),
                vec![kvd, h],
                2.0 * s(h),
                0.0,
            );
            mat(
                format!("{p}self_attn.v_proj.weight"),
                vec![kvd, h],
                s(h),
                0.0,
            );
            mat(
                format!("{p}self_attn.o_proj.weight"),
                vec![h, qd],
                s(qd),
                0.0,
            );
            if self.qwen2 {
                mat(format!("{p}self_attn.q_proj.bias"), vec![qd], 0.5, 0.0);
                mat(format!("{p}self_attn.k_proj.bias"), vec![kvd], 0.5, 0.0);
                mat(format!("{p}self_attn.v_proj.bias"), vec![kvd], 0.5, 0.0);
            }
            mat(
                format!("{p}post_attention_layernorm.weight"),
                vec![h],
                0.2,
                1.0,
            );
            mat(
                format!("{p}mlp.gate_proj.weight"),
                vec![self.ffn, h],
                s(h),
                0.0,
            );
            mat(
                format!("{p}mlp.up_proj.weight"),
                vec![self.ffn, h],
                s(h),
                0.0,
            );
            mat(
                format!("{p}mlp.down_proj.weight"),
                vec![h, self.ffn],
                s(self.ffn),
                0.0,
            );
        }
        mat("model.norm.weight".into(), vec![h], 0.2, 1.0);
        if !self.tied {
            mat("lm_head.weight".into(), vec![self.vocab, h], s(h), 0.0);
        }
        out
    }

    /// Writes config.json and model.safetensors into `dir`; returns the tensors written.
    pub fn write(&self, dir: &Path) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let ts = self.tensors();
        self.write_with(dir, &ts);
        ts
    }

    /// Writes config.json, and `ts` (this spec's tensors, edited) in this spec's dtype as
    /// model.safetensors, into `dir`.
    pub fn write_with(&self, dir: &Path, ts: &[(String, Vec<usize>, Vec<f32>)]) {
        write_tensors(&dir.join("model.safetensors"), ts, self.dtype);
        self.write_config(dir);
    }

    /// Writes config.json into `dir`.
    pub fn write_config(&self, dir: &Path) {
        std::fs::write(dir.join("config.json"), self.config_json().to_string()).unwrap();
    }

    /// A fresh temp dir (named after `tag`) holding this spec's checkpoint.
    pub fn checkpoint(&self, tag: &str) -> TempDir {
        let dir = TempDir::new(tag);
        self.write(dir.path());
        dir
    }
}

pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::BF16 => bf16_to_f32(f32_to_bf16(x)),
        DType::F16 => f16_to_f32(f32_to_f16(x)),
    }
}

pub fn encode(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|&x| f32_to_bf16(x).to_le_bytes())
            .collect(),
        DType::F16 => v
            .iter()
            .flat_map(|&x| f32_to_f16(x).to_le_bytes())
            .collect(),
    }
}

pub fn write_tensors(path: &Path, ts: &[(String, Vec<usize>, Vec<f32>)], dtype: DType) {
    let bytes: Vec<Vec<u8>> = ts.iter().map(|(_, _, v)| encode(dtype, v)).collect();
    let list: Vec<(&str, DType, &[usize], &[u8])> = ts
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| (n.as_str(), dtype, s.as_slice(), b.as_slice()))
        .collect();
    safetensors::write(path, &list).unwrap();
}

/// GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256 + n.
pub fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut n = 0;
    (0u32..256)
        .map(|b| {
            if printable.contains(&b) {
                char::from_u32(b).unwrap()
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap()
            }
        })
        .collect()
}

/// A byte-level BPE tokenizer.json: ids 0..3 are `<unk>`, `<s>`, `</s>`, `<eot>`; byte b is
/// id 4 + b; one merge ("h", "i") -> id 260. BOS `<s>` is prepended by the post-processor.
pub fn write_tokenizer(dir: &Path) {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>", "<eot>"].iter().enumerate() {
        vocab.insert((*t).into(), i.into());
    }
    for (b, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), (4 + b).into());
    }
    vocab.insert("hi".into(), 260.into());
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let tok = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>"), special(3, "<eot>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": ["h i"]
        }
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}

/// The reference: the architecture written plainly in f64, recomputing the whole sequence
/// (no KV cache), HF's formulation (rotate_half, repeat_kv), naive loops.
pub struct Reference {
    spec: Spec,
    w: HashMap<String, Vec<f64>>,
}

impl Reference {
    pub fn new(spec: &Spec, ts: &[(String, Vec<usize>, Vec<f32>)]) -> Self {
        Reference {
            spec: spec.clone(),
            w: ts
                .iter()
                .map(|(n, _, v)| (n.clone(), v.iter().map(|&x| x as f64).collect()))
                .collect(),
        }
    }

    fn t(&self, name: &str) -> &[f64] {
        &self.w[name]
    }

    /// `W x (+ b)` with W `[out, in]`.
    fn lin(&self, name: &str, bias: Option<&str>, x: &[f64]) -> Vec<f64> {
        let w = self.t(name);
        let n_in = x.len();
        let n_out = w.len() / n_in;
        (0..n_out)
            .map(|o| {
                let mut s = 0.0;
                for i in 0..n_in {
                    s += w[o * n_in + i] * x[i];
                }
                s + bias.map_or(0.0, |b| self.t(b)[o])
            })
            .collect()
    }

    fn rmsnorm(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + 1e-5).sqrt();
        x.iter().zip(self.t(name)).map(|(v, w)| v * r * w).collect()
    }

    /// HF's inverse frequencies, Llama 3 rule written as in `_compute_llama3_parameters`.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.spec.head_dim();
        let base: Vec<f64> = (0..d / 2)
            .map(|i| self.spec.rope_theta.powf(-((2 * i) as f64) / d as f64))
            .collect();
        if !self.spec.llama3_scaling {
            return base;
        }
        let (factor, lo, hi, old) = (8.0, 1.0, 4.0, 64.0);
        base.iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let scaled = if wavelen > old / lo { f / factor } else { f };
                let smooth = (old / wavelen - lo) / (hi - lo);
                let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                let medium = wavelen >= old / hi && wavelen <= old / lo;
                if medium {
                    smoothed
                } else {
                    scaled
                }
            })
            .collect()
    }

    /// `x * cos + rotate_half(x) * sin` on one head, cos/sin duplicated over both halves.
    fn rope(&self, x: &[f64], pos: usize) -> Vec<f64> {
        let d = x.len();
        let inv = self.inv_freq();
        let emb: Vec<f64> = (0..d).map(|j| pos as f64 * inv[j % (d / 2)]).collect();
        let rot: Vec<f64> = (0..d)
            .map(|j| {
                if j < d / 2 {
                    -x[j + d / 2]
                } else {
                    x[j - d / 2]
                }
            })
            .collect();
        (0..d)
            .map(|j| x[j] * emb[j].cos() + rot[j] * emb[j].sin())
            .collect()
    }

    /// Logits of every position of `tokens`.
    pub fn logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let sp = &self.spec;
        let (h, hd) = (sp.hidden, sp.head_dim());
        let n_rep = sp.heads / sp.kv_heads;
        let emb = self.t("model.embed_tokens.weight");
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| emb[t as usize * h..][..h].to_vec())
            .collect();
        let bias = |p: &str, n: &str| sp.qwen2.then(|| format!("{p}self_attn.{n}_proj.bias"));
        for l in 0..sp.layers {
            let p = format!("model.layers.{l}.");
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, xt) in x.iter().enumerate() {
                let xn = self.rmsnorm(&format!("{p}input_layernorm.weight"), xt);
                let q = self.lin(
                    &format!("{p}self_attn.q_proj.weight"),
                    bias(&p, "q").as_deref(),
                    &xn,
                );
                let k = self.lin(
                    &format!("{p}self_attn.k_proj.weight"),
                    bias(&p, "k").as_deref(),
                    &xn,
                );
                let v = self.lin(
                    &format!("{p}self_attn.v_proj.weight"),
                    bias(&p, "v").as_deref(),
                    &xn,
                );
                let q: Vec<f64> = q.chunks(hd).flat_map(|c| self.rope(c, pos)).collect();
                let k: Vec<f64> = k.chunks(hd).flat_map(|c| self.rope(c, pos)).collect();
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            for t in 0..x.len() {
                let mut attn = vec![0.0; sp.heads * hd];
                for head in 0..sp.heads {
                    let kvh = head / n_rep; // repeat_kv
                    let q = &qs[t][head * hd..][..hd];
                    let scores: Vec<f64> = (0..=t)
                        .map(|s| {
                            let k = &ks[s][kvh * hd..][..hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (s, es) in e.iter().enumerate() {
                        for j in 0..hd {
                            attn[head * hd + j] += es / z * vs[s][kvh * hd + j];
                        }
                    }
                }
                let o = self.lin(&format!("{p}self_attn.o_proj.weight"), None, &attn);
                for j in 0..h {
                    x[t][j] += o[j];
                }
                let xn = self.rmsnorm(&format!("{p}post_attention_layernorm.weight"), &x[t]);
                let g = self.lin(&format!("{p}mlp.gate_proj.weight"), None, &xn);
                let u = self.lin(&format!("{p}mlp.up_proj.weight"), None, &xn);
                let a: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let d = self.lin(&format!("{p}mlp.down_proj.weight"), None, &a);
                for j in 0..h {
                    x[t][j] += d[j];
                }
            }
        }
        let head = if sp.tied {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        x.iter()
            .map(|xt| {
                let xn = self.rmsnorm("model.norm.weight", xt);
                self.lin(head, None, &xn)
            })
            .collect()
    }
}

/// max |a - b| / max |b|: the error relative to the logits' scale.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((*x as f64 - y).abs()));
    err / scale
}

/// 16 prompt ids in `4..vocab`.
pub fn prompt(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..n)
        .map(|_| 4 + (r.next_f64() * (vocab - 4) as f64) as u32)
        .collect()
}

/// A model over the checkpoint in `dir`, with the runner's default temp allocator.
pub fn model(dir: &std::path::Path) -> llm::Llama<caching_allocator::CachingAllocator> {
    let w = std::sync::Arc::new(llm::Weights::load(dir).unwrap());
    llm::Module::new(
        w,
        llm::caching_temp(llm::DEFAULT_TEMP_CAP),
        &llm::ModelOptions::default(),
    )
    .unwrap()
}

/// 16-token prompt (every position's logits), then 8 decode steps, against the reference.
pub fn check_against_reference(spec: &Spec, bound: f64) {
    let dir = TempDir::new("ref");
    let ts = spec.write(dir.path());
    let reference = Reference::new(spec, &ts);
    let mut m = model(dir.path());
    let mut tokens = prompt(spec.vocab, 16, spec.seed + 100);
    let got = m.forward_all(&tokens).unwrap().to_vec();
    let want = reference.logits(&tokens);
    let v = spec.vocab;
    for (i, w) in want.iter().enumerate() {
        let e = rel_err(&got[i * v..][..v], w);
        assert!(
            e < bound,
            "{spec:?}: prompt position {i}: relative error {e:e}"
        );
    }
    let extra = prompt(spec.vocab, 8, spec.seed + 200);
    for (step, &t) in extra.iter().enumerate() {
        tokens.push(t);
        let got = m.forward(&[t]).unwrap().to_vec();
        let want = reference.logits(&tokens);
        let e = rel_err(&got, want.last().unwrap());
        assert!(
            e < bound,
            "{spec:?}: decode step {step}: relative error {e:e}"
        );
    }
}
