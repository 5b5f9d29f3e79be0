//! A same-run bound for decode: the time to stream every weight byte a decode step reads,
//! over the rayon pool (what a decode step cannot beat when weights do not fit in cache).

use rayon::prelude::*;

use crate::weights::Weights;

/// The best of `reps` passes of reading every byte of the matrices a decode step reads (in
/// parallel, 64-byte lines summed so the reads are not optimised away), in seconds.
pub fn weight_stream_seconds(w: &Weights, reps: usize) -> f64 {
    let mut slices: Vec<&[u8]> = vec![w.head.bytes()];
    for l in &w.layers {
        for m in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
            slices.push(m.bytes());
        }
    }
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        let t0 = std::time::Instant::now();
        let s: u64 = slices
            .par_iter()
            .flat_map_iter(|s| s.chunks(1 << 16))
            .map(|c| {
                c.chunks(64)
                    .map(|l| u64::from(l[0]) + u64::from(l[l.len() - 1]))
                    .sum::<u64>()
            })
            .sum();
        best = best.min(t0.elapsed().as_secs_f64());
        sink = sink.wrapping_add(s);
    }
    std::hint::black_box(sink);
    best
}
