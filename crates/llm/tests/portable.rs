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
