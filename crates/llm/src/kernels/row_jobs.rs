//! Decode kernels as parallel jobs over chunks of output rows: the one fork/join shape every
//! decode kernel shares (one matrix, several over the same `x` such as a layer's q, k and v,
//! or the MLP's fused gate/up pair, in one parallel section).

use rayon::prelude::*;

use super::shared_out::SharedOut;

/// One output of a parallel decode section: `rows(task, r0, chunk)` fills every chunk of
/// `chunk` rows of `out`.
pub(crate) struct RowJob<'a, T> {
    /// What computes the rows (a matrix and its epilogue, or a pair of them).
    pub task: T,
    /// Rows per parallel task (at least 1).
    pub chunk: usize,
    /// The outputs, one per row.
    pub out: &'a mut [f32],
}

/// Runs `rows(&job.task, r0, out_chunk)` for every chunk of every job, all in one parallel
/// section.
pub(crate) fn run<T: Sync, const J: usize>(
    jobs: [RowJob<'_, T>; J],
    rows: impl Fn(&T, usize, &mut [f32]) + Sync,
) {
    let n: [usize; J] = core::array::from_fn(|i| jobs[i].out.len());
    let chunk: [usize; J] = core::array::from_fn(|i| jobs[i].chunk.max(1));
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
        let r0 = ci * chunk[j];
        let len = chunk[j].min(n[j] - r0);
        // SAFETY: `outs[j]` points to job j's output of `n[j]` floats, borrowed mutably by
        // `jobs` for the whole call and not otherwise accessed during the parallel section;
        // task (j, ci) writes only rows r0 .. r0 + len <= n[j], and the row ranges of the
        // tasks of one job are disjoint.
        let o = unsafe { core::slice::from_raw_parts_mut(outs[j].ptr().add(r0), len) };
        rows(&jobs[j].task, r0, o);
    });
}

/// Rows per task of a decode kernel over `n` rows: about `per_thread` tasks per rayon
/// thread, a multiple of `multiple`, from `multiple` to [`MAX_CHUNK`] rows.
pub(crate) fn chunk(n: usize, per_thread: usize, multiple: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    n.div_ceil(threads * per_thread)
        .next_multiple_of(multiple)
        .clamp(multiple, MAX_CHUNK)
}

/// The most rows of one decode task (a multiple of every `multiple` the kernels ask for).
pub(crate) const MAX_CHUNK: usize = 256;
