//! The portable kernels (what CPUs without AVX2/FMA/F16C run), forced on this machine. A test
//! binary of its own: `force_portable` is process-wide, so a test running beside it in the
//! same process could compute one forward pass on each path (and compare them bitwise).

mod common;

use common::{check_against_reference, Spec};
use llm::safetensors::DType;

/// The portable kernels (what CPUs without AVX2/FMA/F16C run), forced on this machine.
#[test]
fn portable_kernels_match_reference() {
    llm::kernels::force_portable(true);
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
    assert_eq!(llm::kernels::isa(), llm::kernels::Isa::Portable);
    llm::kernels::force_portable(false);
}
