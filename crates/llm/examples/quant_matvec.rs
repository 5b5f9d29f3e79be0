//! Decode matvec speed of every block format, on every kernel-simd level this CPU runs:
//! one `Linear` layer of Gemma 3 270M's MLP shape (`[2048, 640]`, and `[640, 2048]` for
//! the K-quants' down projection shape) over one row of f32 `x`, through the runtime as the
//! model calls it (rayon row jobs, scratch from the temp allocator). Prints microseconds
//! per call (median of 7 rounds) and the weight bytes streamed per second.
//!
//! `cargo run --release -p llm --example quant_matvec`

use std::time::Instant;

use llm::kernels::{available_levels, set_max_level};
use llm::matrix::{Linear, Matrix};
use llm::output::Output;
use llm::quant::format::quantize_row;
use llm::quant::{QTensor, QType};
use llm::runtime::Runtime;
use llm::safetensors::f32_to_f16;
use llm::sample::Rng;

/// `rows x cols` weights of `t`: ggml's reference quantizer over uniform values, or random
/// bytes under small f16 scales for the formats without one here (the K-quants).
fn weights(t: QType, rows: usize, cols: usize) -> QTensor {
    let mut rng = Rng::new(7);
    let mut vals = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next_f32() - 0.5).collect() };
    let mut bytes = Vec::new();
    for _ in 0..rows {
        match quantize_row(t, &vals(cols)) {
            Some(b) => bytes.extend_from_slice(&b),
            None => {
                let mut b: Vec<u8> = vals(t.row_bytes(cols))
                    .iter()
                    .map(|v| (v.to_bits() >> 11) as u8)
                    .collect();
                let d = f32_to_f16(0.01).to_le_bytes();
                for blk in b.chunks_exact_mut(t.block_bytes()) {
                    let at = if t == QType::Q6_K { 208 } else { 0 };
                    blk[at..at + 2].copy_from_slice(&d);
                }
                bytes.extend_from_slice(&b);
            }
        }
    }
    QTensor::from_bytes(t, rows, cols, &bytes).expect("whole blocks")
}

fn main() {
    let levels = available_levels();
    println!(
        "levels: {levels:?}; {} rayon threads",
        rayon::current_num_threads()
    );
    for t in QType::ALL {
        for (rows, cols) in [(2048usize, 640usize), (640, 2048)] {
            if !cols.is_multiple_of(t.block_len()) {
                continue;
            }
            let m = Matrix::Quant(weights(t, rows, cols));
            let bytes = m.bytes().len();
            let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut out = vec![0f32; rows];
            let mut line = format!("{:5} [{rows:4}, {cols:4}]", t.name());
            for &level in &levels {
                set_max_level(Some(level));
                let mut rt = Runtime::new(llm::caching_temp(1 << 20));
                let mut call = |out: &mut [f32]| {
                    rt.run("linear", |s| {
                        Linear::new(&m, None).forward(s, &x, 1, out, Output::Overwrite)
                    })
                    .expect("the layer runs")
                };
                for _ in 0..20 {
                    call(&mut out);
                }
                let mut rounds: Vec<f64> = (0..7)
                    .map(|_| {
                        let start = Instant::now();
                        for _ in 0..50 {
                            call(&mut out);
                        }
                        start.elapsed().as_secs_f64() / 50.0
                    })
                    .collect();
                rounds.sort_by(f64::total_cmp);
                let t = rounds[3];
                line += &format!(
                    "  {level}: {:7.1} us {:5.1} GB/s",
                    t * 1e6,
                    bytes as f64 / t / 1e9
                );
            }
            set_max_level(None);
            println!("{line}");
        }
    }
}
