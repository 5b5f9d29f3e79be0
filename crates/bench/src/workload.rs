//! Workloads: the scratch-memory patterns that kernels really have.
//!
//! A workload runs *rounds* of kernel calls on a [`ScratchWorker`]. One call = obtain the
//! call's blocks, write one byte per 4 KiB page of each (so page faults are paid where they
//! happen), give them all back. The harness times rounds; the workload only says what a round
//! is.

use std::collections::BTreeSet;

use caching_allocator::SizeClass;

use crate::source::{AllocError, Block, Call, Counters, ScratchWorker, SCRATCH_ALIGN};

/// The page size the workloads touch at.
pub const PAGE: usize = 4096;

/// What a workload saw while observed (the first warm-up round).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Observation {
    /// Decode: tokens with kvSize below 512 (sizes change every token).
    pub tokens_below_512: u64,
    /// Decode: of those, tokens during which the source missed (or allocated from the
    /// system, for sources that count no misses).
    pub tokens_below_512_with_miss: u64,
    /// Decode: distinct request sizes over the run.
    pub distinct_sizes: usize,
    /// Decode: distinct caching-allocator size classes those sizes fall in.
    pub distinct_size_classes: usize,
}

/// A scratch-memory pattern the harness can time.
pub trait Workload: Sync {
    /// Short name, used in the table and JSON (`scratch-medium`, `decode`).
    fn name(&self) -> String;

    /// One line saying what a call does.
    fn describe(&self) -> String;

    /// The most blocks one call asks for.
    fn max_blocks(&self) -> usize;

    /// Calls in one round, or `None` when the harness should pick the count (calibrated to a
    /// round duration).
    fn round_calls(&self) -> Option<u64>;

    /// Runs one round.
    fn run_round(&self, r: Round<'_>) -> Result<(), AllocError>;

    /// Runs one round while observing the source (untimed; the harness calls it for the first
    /// warm-up round of single-threaded runs). `counters` reads the source's counters.
    fn observe_round(
        &self,
        r: Round<'_>,
        counters: &ReadCounters<'_>,
    ) -> Result<Option<Observation>, AllocError> {
        let _ = counters;
        self.run_round(r).map(|()| None)
    }
}

/// One round on a worker: its calls (calibrated workloads; fixed-length ones ignore them) and
/// the caller's array for the blocks of a call (so the harness itself allocates nothing).
pub struct Round<'a> {
    /// What the round's calls take their scratch from.
    pub worker: &'a mut dyn ScratchWorker,
    /// Calls in the round.
    pub calls: u64,
    /// Room for the blocks of one call: at least [`Workload::max_blocks`].
    pub blocks: &'a mut [Block],
}

/// Reads a source's counters, its worker's included.
pub type ReadCounters<'a> = dyn Fn(&dyn ScratchWorker) -> Counters + 'a;

/// Writes one byte per 4 KiB page of every block (the first byte of each page-sized step).
///
/// # Safety
/// Every block must be valid for writes of `len` bytes, as the blocks a [`ScratchWorker`]
/// passes to its kernel callback are.
pub unsafe fn touch_pages(blocks: &[Block]) {
    for b in blocks {
        let mut off = 0;
        while off < b.len {
            // SAFETY: off < b.len and the block is valid for writes of b.len bytes.
            unsafe { b.ptr.as_ptr().add(off).write_volatile(off as u8) };
            off += PAGE;
        }
    }
}

/// One kernel call that touches its blocks.
fn touch_call(
    worker: &mut dyn ScratchWorker,
    sizes: &[usize],
    blocks: &mut [Block],
) -> Result<(), AllocError> {
    worker.call(Call {
        sizes,
        align: SCRATCH_ALIGN,
        blocks,
        // SAFETY: `ScratchWorker::call` passes blocks valid for writes of their length for
        // the whole callback (the trait's safety contract).
        kernel: &mut |bs| unsafe { touch_pages(bs) },
    })
}

/// The three scratch mixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// 64 B - 4 KiB, 16 blocks per call.
    Small,
    /// 64 KiB - 1 MiB, 8 blocks per call.
    Medium,
    /// 4 - 64 MiB, 4 blocks per call.
    Large,
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

impl Mix {
    /// All mixes, in table order.
    pub const ALL: [Mix; 3] = [Mix::Small, Mix::Medium, Mix::Large];

    /// The block sizes of one call, in allocation order. Fixed, so every run asks the same;
    /// not round numbers, as tensor scratch rarely is.
    pub fn sizes(self) -> &'static [usize] {
        match self {
            Mix::Small => &[
                64, 100, 128, 200, 256, 320, 384, 512, 640, 768, 1000, 1500, 2048, 3000, 3500, 4096,
            ],
            Mix::Medium => &[
                64 * KIB,
                96 * KIB + 192,
                128 * KIB,
                200 * KIB + 64,
                256 * KIB,
                384 * KIB + 320,
                640 * KIB,
                MIB,
            ],
            Mix::Large => &[4 * MIB, 10 * MIB + 4 * KIB, 24 * MIB, 64 * MIB],
        }
    }

    /// `small`, `medium` or `large`.
    pub fn label(self) -> &'static str {
        match self {
            Mix::Small => "small",
            Mix::Medium => "medium",
            Mix::Large => "large",
        }
    }
}

/// `scratch`: every call asks for the blocks of one [`Mix`].
#[derive(Clone, Debug)]
pub struct Scratch {
    /// The mix.
    pub mix: Mix,
    /// Overrides the mix's sizes (tests use tiny sizes).
    pub sizes: Vec<usize>,
}

impl Scratch {
    /// The workload for `mix`.
    pub fn new(mix: Mix) -> Self {
        Scratch {
            mix,
            sizes: mix.sizes().to_vec(),
        }
    }
}

impl Workload for Scratch {
    fn name(&self) -> String {
        format!("scratch-{}", self.mix.label())
    }

    fn describe(&self) -> String {
        let total: usize = self.sizes.iter().sum();
        format!(
            "{} blocks ({} - {} B, {:.1} KiB in all) per call, one byte written per 4 KiB page",
            self.sizes.len(),
            self.sizes.iter().min().copied().unwrap_or(0),
            self.sizes.iter().max().copied().unwrap_or(0),
            total as f64 / KIB as f64
        )
    }

    fn max_blocks(&self) -> usize {
        self.sizes.len()
    }

    fn round_calls(&self) -> Option<u64> {
        None
    }

    fn run_round(&self, r: Round<'_>) -> Result<(), AllocError> {
        for _ in 0..r.calls {
            touch_call(&mut *r.worker, &self.sizes, &mut *r.blocks)?;
        }
        Ok(())
    }
}

/// The two scratch buffers ExecuTorch's CPU flash attention asks its temp allocator for on
/// one call (extension/llm/custom_ops/op_sdpa_impl.h), in bytes, alignment 64:
///
/// - buffer 1: `T * (qSplit*kvSplit + 2*qSplit + qSplit*D) * 4` (scores, row max, row sum,
///   output accumulator per thread);
/// - buffer 2: `T * kvSplit * D * 4` (dequantization scratch for quantized KV);
///
/// with `kvSize = start_pos + seq_len`, `kvSplit = min(512, kvSize)`, `qSplit = min(q_split,
/// seq_len)` and `q_split` 32 (seq_len < 192), 64 (< 768) or 256.
pub fn sdpa_scratch_sizes(
    threads: usize,
    seq_len: usize,
    start_pos: usize,
    head_dim: usize,
) -> [usize; 2] {
    let kv_size = start_pos + seq_len;
    let kv_split = kv_size.min(512);
    let q_split_cfg = if seq_len < 192 {
        32
    } else if seq_len < 768 {
        64
    } else {
        256
    };
    let q_split = q_split_cfg.min(seq_len);
    let f32_size = 4;
    let buf1 = threads * (q_split * kv_split + 2 * q_split + q_split * head_dim) * f32_size;
    let buf2 = threads * kv_split * head_dim * f32_size;
    [buf1, buf2]
}

/// `decode`: the SDPA scratch pattern of LLM decode. For tokens t = 1..=tokens and `layers`
/// layers per token, one call asks for the two buffers of [`sdpa_scratch_sizes`] with
/// seq_len 1 and kvSize = t, so the sizes change every token while t < 512.
#[derive(Clone, Debug)]
pub struct Decode {
    /// Tokens generated per round.
    pub tokens: usize,
    /// Attention calls per token.
    pub layers: usize,
    /// `T`, the kernel's thread count in the formula.
    pub kernel_threads: usize,
    /// Attention heads (the model's; the scratch formula does not depend on it).
    pub heads: usize,
    /// Head dimension `D`.
    pub head_dim: usize,
    sizes: Vec<[usize; 2]>,
}

impl Decode {
    /// The decode workload with 32 heads and head_dim 128.
    pub fn new(tokens: usize, layers: usize, kernel_threads: usize) -> Self {
        let head_dim = 128;
        let sizes = (1..=tokens)
            .map(|t| sdpa_scratch_sizes(kernel_threads, 1, t - 1, head_dim))
            .collect();
        Decode {
            tokens,
            layers,
            kernel_threads,
            heads: 32,
            head_dim,
            sizes,
        }
    }

    /// The two sizes asked for at token `t` (1-based).
    pub fn sizes_at(&self, t: usize) -> [usize; 2] {
        self.sizes[t - 1]
    }

    /// Distinct request sizes over a round.
    pub fn distinct_sizes(&self) -> usize {
        self.sizes.iter().flatten().collect::<BTreeSet<_>>().len()
    }

    /// Distinct caching-allocator size classes over a round (`SizeClass::for_size`).
    pub fn distinct_size_classes(&self) -> usize {
        self.sizes
            .iter()
            .flatten()
            .filter_map(|&s| SizeClass::for_size(s))
            .collect::<BTreeSet<_>>()
            .len()
    }
}

impl Workload for Decode {
    fn name(&self) -> String {
        "decode".to_string()
    }

    fn describe(&self) -> String {
        let [a, b] = self.sizes_at(self.tokens.min(512));
        format!(
            "SDPA decode scratch, {} heads, head_dim {}, T={} threads: tokens 1..={} x {} layers, \
             2 blocks per call ({:.1} KiB at kvSize 512)",
            self.heads,
            self.head_dim,
            self.kernel_threads,
            self.tokens,
            self.layers,
            (a + b) as f64 / KIB as f64
        )
    }

    fn max_blocks(&self) -> usize {
        2
    }

    fn round_calls(&self) -> Option<u64> {
        Some((self.tokens * self.layers) as u64)
    }

    fn run_round(&self, r: Round<'_>) -> Result<(), AllocError> {
        self.each_token(r, |_, _| {})
    }

    fn observe_round(
        &self,
        r: Round<'_>,
        counters: &ReadCounters<'_>,
    ) -> Result<Option<Observation>, AllocError> {
        let mut obs = Observation {
            distinct_sizes: self.distinct_sizes(),
            distinct_size_classes: self.distinct_size_classes(),
            ..Observation::default()
        };
        let missed = |w: &dyn ScratchWorker| {
            let c = counters(w);
            c.misses.or(c.system_allocs).unwrap_or(0)
        };
        let mut before = missed(&*r.worker);
        self.each_token(r, |t, w| {
            let now = missed(w);
            if t < 512 {
                obs.tokens_below_512 += 1;
                if now > before {
                    obs.tokens_below_512_with_miss += 1;
                }
            }
            before = now;
        })?;
        Ok(Some(obs))
    }
}

impl Decode {
    /// A round: every token's calls, each layer's, then `after(t, worker)` for token `t`
    /// (from 1).
    fn each_token(
        &self,
        r: Round<'_>,
        mut after: impl FnMut(usize, &dyn ScratchWorker),
    ) -> Result<(), AllocError> {
        for (i, sizes) in self.sizes.iter().enumerate() {
            for _ in 0..self.layers {
                touch_call(&mut *r.worker, sizes, &mut *r.blocks)?;
            }
            after(i + 1, &*r.worker);
        }
        Ok(())
    }
}
