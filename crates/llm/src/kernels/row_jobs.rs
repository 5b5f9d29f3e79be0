//! Decode matvecs as parallel jobs over chunks of output rows: the one fork/join shape the
//! dense and quantized decode kernels share (one matrix, or several over the same `x`, such as
//! a layer's q, k and v, in one parallel section).

use rayon::prelude::*;

use super::SharedOut;

/// One matrix of a decode matvec: `out (+)= w x + bias`, `w` of `n` rows. `W` is the
/// weights as a kernel reads them (dense rows, a quantized matrix, or either kind).
pub struct LinearJob<'a, W> {
    /// The weights, `[n, k]`.
    pub w: W,
    /// Output rows.
    pub n: usize,
    /// Optional bias of `n`.
    pub bias: Option<&'a [f32]>,
    /// `n` outputs.
    pub out: &'a mut [f32],
    /// Add to `out` instead of overwriting it.
    pub accumulate: bool,
}

/// Runs `rows(w, r0, out_chunk, accumulate)` for every chunk of `chunk(n)` output rows of
/// every job, all in one parallel section, then adds the job's bias to the chunk. The
/// callers checked that each `out` holds `n` floats and each bias `n`.
pub(crate) fn run<W: Sync, const J: usize>(
    jobs: [LinearJob<'_, W>; J],
    chunk: impl Fn(usize) -> usize,
    rows: impl Fn(&W, usize, &mut [f32], bool) + Sync,
) {
    let n: [usize; J] = core::array::from_fn(|i| jobs[i].n.min(jobs[i].out.len()));
    let chunk: [usize; J] = core::array::from_fn(|i| chunk(n[i]).max(1));
    let counts: [usize; J] = core::array::from_fn(|i| n[i].div_ceil(chunk[i]));
    let total: usize = counts.iter().sum();
    let outs: [SharedOut; J] = core::array::from_fn(|i| SharedOut(jobs[i].out.as_ptr().cast_mut()));
    let jobs = &jobs;
    (0..total).into_par_iter().for_each(|mut ci| {
        let mut j = 0;
        while ci >= counts[j] {
            ci -= counts[j];
            j += 1;
        }
        let job = &jobs[j];
        let r0 = ci * chunk[j];
        let len = chunk[j].min(n[j] - r0);
        // SAFETY: `outs[j]` points to job j's output of at least `n[j]` floats, borrowed
        // mutably by `jobs` for the whole call and not otherwise accessed during the parallel
        // section; task (j, ci) writes only rows r0 .. r0 + len <= n[j], and the row ranges
        // of the tasks of one job are disjoint.
        let o = unsafe { core::slice::from_raw_parts_mut(outs[j].ptr().add(r0), len) };
        rows(&job.w, r0, o, job.accumulate);
        if let Some(b) = job.bias {
            for (oi, bi) in o.iter_mut().zip(&b[r0..]) {
                *oi += bi;
            }
        }
    });
}
