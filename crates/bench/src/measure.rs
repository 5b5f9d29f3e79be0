//! Measuring, and what the operating system can tell: statistics ([`Spread`], [`median`]),
//! timing in turns ([`interleaved`], [`best`]), this machine's own limits (a streaming read,
//! decode's bound; `matrixmultiply`'s sgemm, prefill's), the attention shapes the kernel
//! benchmarks measure, and the process's page faults, resident memory, malloc settings,
//! thread pools ([`init_threads`]) and machine.
//!
//! The method of every efficiency figure: baseline and kernel are timed in turns for a few
//! rounds, so both see the same machine load; "best" compares best times, "median" is the
//! median over rounds of the ratio within a round.

use std::fs;
use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;
use sdpa::Shape;

/// Median, min and max of a sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

impl Spread {
    /// The spread of `xs` (all zero when empty).
    pub fn of(xs: &[f64]) -> Spread {
        if xs.is_empty() {
            return Spread::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// Deterministic pseudo-random floats in `[-0.5, 0.5)`, `n` of them
/// ([`kernel_simd::test_data::uniform`] with amplitude 0.5).
pub fn fill(n: usize, seed: u32) -> Vec<f32> {
    kernel_simd::test_data::uniform(n, seed, 0.5)
}

/// `reps` timings (seconds; at least one round) of each closure after one untimed warm-up call
/// each, the closures taking turns so that a baseline and a kernel timed in the same round saw
/// the same machine load (the machine may be shared).
pub fn interleaved(reps: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<Vec<f64>> {
    for f in fs.iter_mut() {
        f();
    }
    (0..reps.max(1))
        .map(|_| {
            fs.iter_mut()
                .map(|f| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .collect()
        })
        .collect()
}

/// Best (smallest) time of closure `i` over `rounds`.
pub fn best(rounds: &[Vec<f64>], i: usize) -> f64 {
    rounds.iter().map(|r| r[i]).fold(f64::INFINITY, f64::min)
}

/// A kernel against its machine limit, timed in turns ([`interleaved`]): the ratio of the
/// best times, and the median over rounds of the ratio within a round.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Ratios {
    /// Best over best.
    pub ratio_best: f64,
    /// Median of the same-round ratios.
    pub ratio_median: f64,
}

impl Ratios {
    /// A kernel against its baseline over rounds timed in turns ([`interleaved`]): `rates`
    /// gives one round's (baseline, kernel) rates, higher meaning faster. Returns each one's
    /// best rate over the rounds and the kernel's ratios to the baseline.
    pub fn of_rounds(
        rounds: &[Vec<f64>],
        rates: impl Fn(&[f64]) -> (f64, f64),
    ) -> (f64, f64, Ratios) {
        let rates: Vec<(f64, f64)> = rounds.iter().map(|r| rates(r)).collect();
        let base = rates.iter().map(|r| r.0).fold(0.0, f64::max);
        let kernel = rates.iter().map(|r| r.1).fold(0.0, f64::max);
        let same_round: Vec<f64> = rates.iter().map(|r| r.1 / r.0).collect();
        let ratios = Ratios {
            ratio_best: kernel / base,
            ratio_median: median(&same_round),
        };
        (base, kernel, ratios)
    }

    /// Both as percentages, no decimals: best, median.
    pub fn percent(self) -> [String; 2] {
        [self.ratio_best, self.ratio_median].map(pct)
    }
}

/// A percentage, no decimals.
pub(crate) fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

/// The median of `xs` (the mean of the middle two for even lengths); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        f64::NAN
    } else {
        Spread::of(xs).median
    }
}

/// One streaming read of `buf`, split over the rayon pool; each thread reads its part as
/// `streams` interleaved sequential runs (more than one run gives the memory system more
/// independent streams, which reads faster on some machines).
pub fn stream_read(buf: &[f32], streams: usize) {
    let streams = streams.max(1);
    let part = buf.len().div_ceil(rayon::current_num_threads()).max(1);
    let s: f32 = buf
        .par_chunks(part)
        .map(|c| {
            let run = c.len().div_ceil(streams);
            let runs: Vec<&[f32]> = c.chunks(run.max(1)).collect();
            let mut acc = [0f32; 32];
            let mut pos = 0;
            while pos < run {
                let end = (pos + 4096).min(run);
                for r in &runs {
                    acc = sum_block(acc, r.get(pos..end.min(r.len())).unwrap_or(&[]));
                }
                pos = end;
            }
            acc.iter().sum::<f32>()
        })
        .sum();
    black_box(s);
}

/// Adds `x` into 32 independent lanes (vectorises without a dependency chain), with AVX2
/// (fewer instructions per byte, so more loads in flight) when the CPU has it.
#[inline(never)]
fn sum_block(acc: [f32; 32], x: &[f32]) -> [f32; 32] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { sum_block_avx2(acc, x) };
        }
    }
    sum_block_portable(acc, x)
}

/// [`sum_block_portable`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_block_avx2(acc: [f32; 32], x: &[f32]) -> [f32; 32] {
    sum_block_portable(acc, x)
}

#[inline(always)]
fn sum_block_portable(mut acc: [f32; 32], x: &[f32]) -> [f32; 32] {
    let mut it = x.chunks_exact(32);
    for ch in &mut it {
        for (a, v) in acc.iter_mut().zip(ch) {
            *a += v;
        }
    }
    for (a, v) in acc.iter_mut().zip(it.remainder()) {
        *a += v;
    }
    acc
}

/// Bytes per second / 1e9.
pub fn gbs(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Gives matrixmultiply's thread pool `threads` threads unless `MATMUL_NUM_THREADS` is set.
/// matrixmultiply reads the variable on its first threaded call, so call this first, while
/// the process has a single thread (setting the environment is not thread-safe).
pub fn set_sgemm_threads(threads: usize) {
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", threads.max(1).to_string());
    }
}

/// Gives matrixmultiply as many threads as rayon's global pool will have (RAYON_NUM_THREADS or
/// one per core), and makes this (the main) thread one of the pool's. Call before any thread
/// exists: matrixmultiply reads the environment.
///
/// The kernels and model steps run from the main thread. Outside the pool, each parallel
/// section would hand its work to the pool and wait to be woken at the end (24 us for an empty
/// one on the project's VM; the `llm` runner's decode measured 51-54 tok/s that way against
/// 66-70 inside); as a member, the main thread runs its share and starts the section at once,
/// as when a runtime drives its model from inside the pool (`llm generate` uses
/// `rayon::scope`). With one thread the pool keeps its own worker: a pool made of the main
/// thread alone would leave work sent from other threads waiting for it.
pub fn init_threads(cores: usize) {
    let rayon_threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(cores);
    set_sgemm_threads(rayon_threads);
    if rayon_threads >= 2 {
        // An error means a global pool exists already: then the calls stay outside it, which
        // costs time, not correctness.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon_threads)
            .use_current_thread()
            .build_global();
    }
}

/// The thread count matrixmultiply uses (its environment variable), if set.
pub fn sgemm_threads() -> Option<usize> {
    std::env::var("MATMUL_NUM_THREADS").ok()?.parse().ok()
}

/// matrixmultiply's sgemm `c = a . b`, `m x k` times `k x n`, row-major.
///
/// # Panics
/// When a slice is shorter than its matrix.
pub fn sgemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: a is m x k (row stride k), b is k x n (row stride n), c is m x n (row stride n),
    // all within their slices (asserted above); c does not alias a or b (a unique borrow).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    };
    black_box(c);
}

/// The decode call the benchmarks measure: batch 1, one query row attending to all `kv_len`
/// positions of a cache that holds exactly them (start_pos `kv_len - 1`).
pub fn decode_shape(heads: usize, kv_heads: usize, head_dim: usize, kv_len: usize) -> Shape {
    Shape {
        batch: 1,
        q_len: 1,
        heads,
        kv_heads,
        head_dim,
        kv_capacity: kv_len,
        start_pos: kv_len.saturating_sub(1),
    }
}

/// The prefill call the benchmarks measure: batch 1, a prompt of `len` tokens from position 0
/// into a cache of exactly `len` positions.
pub fn prefill_shape(heads: usize, kv_heads: usize, head_dim: usize, len: usize) -> Shape {
    Shape {
        batch: 1,
        q_len: len,
        heads,
        kv_heads,
        head_dim,
        kv_capacity: len,
        start_pos: 0,
    }
}

/// FLOPs of one attention call: `4 * head_dim` per visible (query, key) pair per head (a dot
/// product and an axpy of `head_dim`), counting only the visible pairs.
pub fn prefill_flops(sh: &Shape, causal: bool) -> f64 {
    let (q, s) = (sh.q_len as f64, sh.start_pos as f64);
    let pairs = if causal {
        // Row i sees s + i + 1 positions.
        q * s + q * (q + 1.0) / 2.0
    } else {
        q * (s + q)
    };
    (sh.batch * sh.heads) as f64 * pairs * 4.0 * sh.head_dim as f64
}

/// Minor page faults of the whole process so far (`getrusage(RUSAGE_SELF)`).
pub fn minor_faults() -> u64 {
    let mut ru = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF is a valid target.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: getrusage succeeded and filled the struct (it was zeroed before, too).
    let ru = unsafe { ru.assume_init() };
    ru.ru_minflt as u64
}

fn status_kib(field: &str) -> Option<u64> {
    let s = fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Resident set size now, bytes.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:").unwrap_or(0) * 1024
}

/// Peak resident set size since the last [`reset_peak_rss`], bytes.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:").unwrap_or(0) * 1024
}

/// Resets the peak-RSS mark to the current RSS (Linux: `echo 5 > /proc/self/clear_refs`).
/// Returns false where that is not possible; peaks then include earlier measurements.
pub fn reset_peak_rss() -> bool {
    fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// glibc's mmap threshold in every allocbench process: the most its dynamic rule reaches
/// (`DEFAULT_MMAP_THRESHOLD_MAX` on 64-bit), the state of a long-running process that has
/// freed a block this big.
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// glibc's trim threshold with it (the dynamic rule's twice the mmap threshold).
pub const TRIM_THRESHOLD: usize = 2 * MMAP_THRESHOLD;

/// Fixes glibc malloc's mmap and trim thresholds at [`MMAP_THRESHOLD`] and
/// [`TRIM_THRESHOLD`], which also turns off their dynamic rule: left to it, every free of a
/// block above the threshold raises both, so one source's frees (or an earlier workload's)
/// decided whether another source's mallocs got fresh, faulting pages or reused heap pages.
/// `exact-cache` on decode measured 48 faults per call alone and none after `scratch-large`.
/// Returns false where there is no glibc to tell.
pub fn pin_malloc_thresholds() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets malloc's tunables; both values are in range for c_int
        // and for glibc (at most HEAP_MAX / DEFAULT_MMAP_THRESHOLD_MAX on 64-bit).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// The machine the figures come from.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Machine {
    /// Logical cores available to the process.
    pub cores: usize,
    /// CPU model name.
    pub cpu: String,
    /// Kernel release.
    pub kernel: String,
    /// Load average (1 min) when the run started: other work on the machine adds noise.
    pub load_avg_1m_at_start: f64,
}

impl std::fmt::Display for Machine {
    /// "2 cores, CPU, Linux release, load average 1.50 at start": the line every run opens with.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cores, {}, Linux {}, load average {:.2} at start",
            self.cores, self.cpu, self.kernel, self.load_avg_1m_at_start
        )
    }
}

impl Machine {
    /// Reads the machine's description.
    pub fn detect() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Machine {
            cores,
            cpu,
            kernel,
            load_avg_1m_at_start: load_avg(),
        }
    }
}

/// The 1-minute load average.
pub fn load_avg() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_fresh_pages_counts_faults() {
        use crate::source::{fresh::FreshPages, PerBlock};
        let len = 1000 * 4096;
        let pages = FreshPages::default();
        let (p, mapping) = pages.take(len, 4096).unwrap();
        let before = minor_faults();
        for i in 0..1000 {
            // SAFETY: the mapping holds 1000 pages; each write is inside it.
            unsafe { p.as_ptr().add(i * 4096).write_volatile(1) };
        }
        let faults = minor_faults() - before;
        // SAFETY: the mapping came from `take` on `pages`, is given back once, not used after.
        unsafe { pages.give_back(mapping) };
        assert!(faults >= 100, "only {faults} faults for 1000 fresh pages");
        assert!(rss_bytes() > 0);
        assert!(peak_rss_bytes() > 0);
    }
}
