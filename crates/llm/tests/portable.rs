//! Every lower SIMD level of the kernels (down to the portable one, what CPUs without AVX2
//! run), forced on this machine, against the f64 reference. A test binary of its own:
//! `set_max_level` is process-wide, so a test running beside it in the same process could
//! compute one forward pass on each level (and compare them bitwise).

mod common;

use common::{check_against_reference, Spec};
use llm::kernels::{available_levels, isa, set_max_level};
use llm::safetensors::DType;

/// Each level this CPU runs below its best (the best is the other tests' level), forced.
#[test]
fn lower_levels_match_reference() {
    let levels = available_levels();
    println!("kernel levels on this CPU: {levels:?}");
    for &level in levels.iter().skip(1) {
        set_max_level(Some(level));
        assert_eq!(isa(), level, "the cap picks the level");
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let spec = Spec {
                dtype,
                hidden: 40,
                heads: 5,
                kv_heads: 1,
                ffn: 72,
                seed: 13,
                ..Spec::default()
            };
            check_against_reference(&spec, 1e-4);
        }
    }
    set_max_level(None);
    if std::env::var_os("KERNEL_SIMD_MAX").is_none() {
        assert_eq!(isa(), levels[0], "removing the cap restores the best level");
    }
}

/// The quantized kernels on each level below this CPU's best, forced: a tiny GGUF model in
/// each quantized type against the f64 reference.
#[test]
fn lower_levels_quantized_kernels_match_reference() {
    use llm::quant::format::QType;
    let dir = common::TempDir::new("levels-gguf");
    let levels = available_levels();
    for &level in levels.iter().skip(1) {
        set_max_level(Some(level));
        assert_eq!(isa(), level, "the cap picks the level");
        for (i, qt) in QType::ALL.into_iter().enumerate() {
            quantized_model_matches_reference(&dir, level, i, qt);
        }
    }
    set_max_level(None);
}

/// A tiny GGUF model in `qt` (seed from `i`) against the f64 reference, prefill and decode.
fn quantized_model_matches_reference(
    dir: &common::TempDir,
    level: llm::kernels::Level,
    i: usize,
    qt: llm::quant::format::QType,
) {
    // The K-quants' rows are whole super-blocks of 256.
    let k_quant = qt.block_len() == 256;
    let spec = Spec {
        hidden: if k_quant { 256 } else { 64 },
        heads: 4,
        kv_heads: 2,
        ffn: if k_quant { 512 } else { 96 },
        seed: 20 + i as u64,
        ..Spec::default()
    };
    let (w, ts) = common::gguf::tiny_model(&spec, Some(qt));
    let p = dir.path().join(format!("{level}-{i}.gguf"));
    w.write(&p);
    let reference = common::Reference::new(&spec, &ts);
    let mut m = common::model(&p);
    let tokens = common::prompt(spec.vocab, 10, 3);
    let got = m.forward_all(&tokens).unwrap().to_vec();
    let v = spec.vocab;
    for (pos, want) in reference.logits(&tokens).iter().enumerate() {
        let e = common::rel_err(&got[pos * v..][..v], want);
        assert!(e < 1e-4, "{level} {qt:?} position {pos}: {e:e}");
    }
    let got = m.forward(&[5]).unwrap().to_vec();
    let mut all = tokens.clone();
    all.push(5);
    let e = common::rel_err(&got, reference.logits(&all).last().unwrap());
    assert!(e < 1e-4, "{level} {qt:?} decode: {e:e}");
}
