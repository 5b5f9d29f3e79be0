//! Scaled dot-product attention (SDPA) on the CPU, f32, flash-attention style, taking its
//! scratch memory from a [`TempAllocator`].
//!
//! One entry point, [`attention`], computes for every batch `b`, query row `i` and head `h`
//!
//! ```text
//! out[b, i, h, :] = softmax_t( scale * q[b, i, h, :] . k[b, t, h / g, :] ) . v[b, t, h / g, :]
//! ```
//!
//! over the visible key/value positions `t` (`g = heads / kv_heads`, grouped-query attention).
//! Layouts follow ExecuTorch's LLM attention: `q` and `out` are `[batch, q_len, heads,
//! head_dim]`, `k` and `v` are a KV cache `[batch, kv_capacity, kv_heads, head_dim]` of which the
//! first `start_pos + q_len` positions are used. Causal attention lets query row `i` see the
//! positions `0..=start_pos + i`; non-causal attention lets every row see all
//! `start_pos + q_len` positions. A sliding window of `w` positions ([`Params::window`],
//! causal only) narrows row `i` to the last `w` of them: positions in
//! `(start_pos + i - w, start_pos + i]`, as llama.cpp's standard sliding window (Gemma 3's
//! local layers) defines it; the call then reads only the positions some row sees.
//!
//! Each call takes exactly one scratch buffer from `temp.allocate` (alignment
//! [`SCRATCH_ALIGN`]), of [`scratch_bytes_with`] bytes, before it enters rayon; the buffer holds one
//! slice per worker thread (and, for decode, one partial result per KV chunk). The kernel never
//! reads scratch it has not written, so poisoned (0xFF) scratch gives the same results. The owner
//! of `temp` calls `reset` after the call returns; the kernel never does.
//!
//! Two code paths (chosen from the shape alone, see [`Plan`]):
//! - **decode / short queries** (`q_len <= ROW_PATH_MAX_Q_LEN`): the KV range is split into
//!   chunks processed in parallel (flash-decoding); each chunk walks its positions in order and
//!   handles *all heads of a position row together*, so K and V are read as long contiguous runs
//!   of `kv_heads * head_dim` floats; partial softmax states are merged at the end.
//! - **prefill** (longer queries): work items `(batch, head, q-block)` run in parallel; each
//!   walks KV tiles with an online softmax, packing Q, K and V tiles into its scratch slice and
//!   multiplying them with AVX-512 or AVX2/FMA register-blocked micro-kernels (NEON on
//!   aarch64; a portable scalar fallback is used on other CPUs).

use core::fmt;
use core::num::NonZeroUsize;

pub use caching_allocator::{AllocError, TempAllocator};

mod decode;
mod dynamic;
mod elem;
mod inputs;
mod kernels;
mod mask;
mod plan;
mod prefill;
mod quant;
mod simd;
mod sync;

pub use dynamic::{attention_dyn, KvRef, TensorMut, TensorRef};
pub use elem::{Bf16, Dtype, Element, F16};
pub use kernels::simd_enabled;
pub use plan::{Path, Plan};
pub use quant::{quantize_kv, QuantizedKv, QuantizedKvMut};
pub use simd::{available_simd_levels, set_max_simd, simd_level, with_max_simd, SimdLevel};

use inputs::Kv;
use mask::Mask;

/// How K and V are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvCache {
    /// In the call's element type, like Q.
    Dense,
    /// int8 with a scale and zero point per position and KV head ([`QuantizedKv`]).
    Int8,
}

/// Alignment of the scratch buffer a call requests from its temp allocator.
pub const SCRATCH_ALIGN: usize = 64;

/// Queries this short (decode, speculative verification) take the KV-chunked row path; longer
/// ones the tiled prefill path.
pub const ROW_PATH_MAX_Q_LEN: usize = 5;

/// The sizes of one attention call. All counts are elements, not bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Number of independent sequences.
    pub batch: usize,
    /// Number of query rows (new tokens) per sequence; 1 for decode.
    pub q_len: usize,
    /// Number of query heads; a multiple of `kv_heads`.
    pub heads: usize,
    /// Number of key/value heads (`heads` for multi-head attention, fewer for GQA/MQA).
    pub kv_heads: usize,
    /// Size of one head vector.
    pub head_dim: usize,
    /// Positions allocated in the KV cache (the second dimension of `k` and `v`).
    pub kv_capacity: usize,
    /// Position of the first query row in the sequence: the number of cached positions before
    /// this call. Positions `0..start_pos + q_len` of the cache are used.
    pub start_pos: usize,
}

impl Shape {
    /// Number of key/value positions a call uses: `start_pos + q_len`.
    pub fn kv_len(&self) -> usize {
        self.start_pos.saturating_add(self.q_len)
    }

    /// Checks the shape on its own (everything [`attention`] checks except slice lengths and
    /// the scale), returning the error [`attention`] would return.
    pub fn validate(&self) -> Result<(), SdpaError> {
        if self.head_dim == 0 {
            return Err(SdpaError::ZeroHeadDim);
        }
        if self.kv_heads == 0 || self.heads == 0 {
            return Err(SdpaError::ZeroHeads {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(SdpaError::HeadsNotMultiple {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        match self.start_pos.checked_add(self.q_len) {
            Some(end) if end <= self.kv_capacity => {}
            _ => {
                return Err(SdpaError::KvOverflow {
                    start_pos: self.start_pos,
                    q_len: self.q_len,
                    kv_capacity: self.kv_capacity,
                })
            }
        }
        self.q_elems()?;
        self.kv_elems()?;
        Ok(())
    }

    /// Elements of `q` (and `out`): `batch * q_len * heads * head_dim`.
    pub fn q_elems(&self) -> Result<usize, SdpaError> {
        self.elems([self.q_len, self.heads, self.head_dim], Tensor::Q)
    }

    /// Elements of `k` (and `v`): `batch * kv_capacity * kv_heads * head_dim`.
    pub fn kv_elems(&self) -> Result<usize, SdpaError> {
        self.elems([self.kv_capacity, self.kv_heads, self.head_dim], Tensor::K)
    }

    /// `batch * dims[0] * dims[1] * dims[2]`, or the overflow error naming `tensor` if that
    /// many f32 (4 bytes each) exceed `isize::MAX` bytes.
    fn elems(&self, dims: [usize; 3], tensor: Tensor) -> Result<usize, SdpaError> {
        dims.iter()
            .try_fold(self.batch, |acc, &x| acc.checked_mul(x))
            .filter(|&n| n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or(SdpaError::ShapeOverflow { tensor })
    }
}

/// Options of an attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// Causal masking: query row `i` sees positions `0..=start_pos + i`. When false, every row
    /// sees all `start_pos + q_len` positions.
    pub causal: bool,
    /// Multiplier of the scores; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Sliding-window attention: `Some(w)` lets query row `i` (at position `p = start_pos + i`)
    /// see only the last `w` positions up to its own, `(p - w, p]` (`max(0, p + 1 - w)..=p`);
    /// `None` (the default) sets no limit. This is llama.cpp's standard sliding window
    /// (`LLAMA_SWA_TYPE_STANDARD`: key `p0` is masked for query `p1` when `p1 - p0 >= w`),
    /// used by Gemma 3's local layers with `w = gemma3.attention.sliding_window` (512). A
    /// window needs `causal`; a window of at least `start_pos + q_len` changes nothing.
    /// Positions before the first row's window are never read, and the scratch request is
    /// sized to the positions the window reads ([`scratch_bytes_with`]).
    pub window: Option<NonZeroUsize>,
}

impl Default for Params {
    /// Causal, scale `1 / sqrt(head_dim)`, no window.
    fn default() -> Self {
        Params {
            causal: true,
            scale: None,
            window: None,
        }
    }
}

impl Params {
    /// These options with a sliding window of `window` positions (see [`Params::window`]);
    /// `0` means no window.
    pub fn with_window(self, window: usize) -> Params {
        Params {
            window: NonZeroUsize::new(window),
            ..self
        }
    }

    /// Checks the options on their own, returning the error [`attention`] would return, or
    /// the scale the call uses (`1 / sqrt(head_dim)` when none is given).
    fn checked_scale(&self, head_dim: usize) -> Result<f32, SdpaError> {
        if let Some(window) = self.window.filter(|_| !self.causal) {
            return Err(SdpaError::WindowNotCausal {
                window: window.get(),
            });
        }
        match self.scale {
            Some(s) if !s.is_finite() => Err(SdpaError::InvalidScale { scale: s }),
            Some(s) => Ok(s),
            None => Ok(1.0 / (head_dim as f32).sqrt()),
        }
    }
}

/// Names one of the tensors of a call, in errors. Non-exhaustive: new inputs (such as the
/// int8 cache's scales) add names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Tensor {
    /// The queries.
    Q,
    /// The key cache.
    K,
    /// The value cache.
    V,
    /// The output.
    Out,
    /// The scales of the int8 K cache.
    KScales,
    /// The zero points of the int8 K cache.
    KZeroPoints,
    /// The scales of the int8 V cache.
    VScales,
    /// The zero points of the int8 V cache.
    VZeroPoints,
    /// The values of the cache written by [`quantize_kv`].
    CacheValues,
    /// The scales of the cache written by [`quantize_kv`].
    CacheScales,
    /// The zero points of the cache written by [`quantize_kv`].
    CacheZeroPoints,
    /// The new rows passed to [`quantize_kv`].
    NewRows,
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tensor::Q => "q",
            Tensor::K => "k",
            Tensor::V => "v",
            Tensor::Out => "out",
            Tensor::KScales => "k scales",
            Tensor::KZeroPoints => "k zero points",
            Tensor::VScales => "v scales",
            Tensor::VZeroPoints => "v zero points",
            Tensor::CacheValues => "cache values",
            Tensor::CacheScales => "cache scales",
            Tensor::CacheZeroPoints => "cache zero points",
            Tensor::NewRows => "new rows",
        })
    }
}

/// Why [`attention`] refused or failed a call. No variant is returned after `out` was written.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SdpaError {
    /// `head_dim` is 0.
    ZeroHeadDim,
    /// `heads` or `kv_heads` is 0.
    ZeroHeads {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// `heads` is not a multiple of `kv_heads`.
    HeadsNotMultiple {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// `start_pos + q_len` exceeds `kv_capacity`: the cache has no room for the new positions.
    KvOverflow {
        /// First query position.
        start_pos: usize,
        /// Query rows.
        q_len: usize,
        /// Positions in the cache.
        kv_capacity: usize,
    },
    /// The element count of a tensor implied by the shape overflows `usize` (or `isize::MAX`
    /// bytes).
    ShapeOverflow {
        /// The tensor whose size overflows (`Q` stands for `q` and `out`, `K` for `k` and `v`).
        tensor: Tensor,
    },
    /// A slice's length does not match the shape.
    LenMismatch {
        /// The tensor whose slice is wrong.
        tensor: Tensor,
        /// The length the shape implies.
        expected: usize,
        /// The slice's length.
        actual: usize,
    },
    /// The scale is not finite (NaN or infinite).
    InvalidScale {
        /// The scale that was passed.
        scale: f32,
    },
    /// A sliding window was given for non-causal attention (the window is defined for causal
    /// attention only).
    WindowNotCausal {
        /// The window that was passed.
        window: usize,
    },
    /// A tensor passed to [`attention_dyn`] has another dtype than `q` (or one of K and V is
    /// an int8 cache and the other is not).
    DtypeMismatch {
        /// The tensor whose dtype is wrong.
        tensor: Tensor,
        /// The dtype it must have (`None`: an int8 cache, like the other of K and V).
        expected: Option<Dtype>,
        /// Its dtype (`None`: an int8 cache).
        actual: Option<Dtype>,
    },
    /// The temp allocator could not provide the scratch buffer.
    Scratch(AllocError),
    /// The temp allocator returned a pointer that is not aligned as requested (a broken
    /// `TempAllocator` implementation); the kernel refuses to use it.
    MisalignedScratch {
        /// The address returned.
        addr: usize,
        /// The alignment requested ([`SCRATCH_ALIGN`]).
        align: usize,
    },
}

impl fmt::Display for SdpaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SdpaError::ZeroHeadDim => write!(f, "sdpa: head_dim is 0"),
            SdpaError::ZeroHeads { heads, kv_heads } => write!(
                f,
                "sdpa: heads ({heads}) and kv_heads ({kv_heads}) must both be at least 1"
            ),
            SdpaError::HeadsNotMultiple { heads, kv_heads } => write!(
                f,
                "sdpa: heads ({heads}) is not a multiple of kv_heads ({kv_heads})"
            ),
            SdpaError::KvOverflow {
                start_pos,
                q_len,
                kv_capacity,
            } => write!(
                f,
                "sdpa: start_pos ({start_pos}) + q_len ({q_len}) exceeds kv_capacity \
                 ({kv_capacity})"
            ),
            SdpaError::ShapeOverflow { tensor } => {
                write!(f, "sdpa: the element count of `{tensor}` overflows")
            }
            SdpaError::LenMismatch {
                tensor,
                expected,
                actual,
            } => write!(
                f,
                "sdpa: `{tensor}` has {actual} elements but the shape implies {expected}"
            ),
            SdpaError::InvalidScale { scale } => {
                write!(f, "sdpa: scale {scale} is not a finite number")
            }
            SdpaError::WindowNotCausal { window } => write!(
                f,
                "sdpa: a sliding window ({window}) needs causal attention: set `causal: true` \
                 or `window: None`"
            ),
            SdpaError::DtypeMismatch {
                tensor,
                expected,
                actual,
            } => {
                let name =
                    |d: &Option<Dtype>| d.map_or("an int8 cache".to_string(), |d| d.to_string());
                write!(
                    f,
                    "sdpa: `{tensor}` is {} where {} was expected: pass `out` and dense `k`/`v` \
                     in q's dtype, and `k` and `v` both dense or both int8",
                    name(actual),
                    name(expected)
                )
            }
            SdpaError::Scratch(e) => write!(f, "sdpa: scratch allocation failed: {e}"),
            SdpaError::MisalignedScratch { addr, align } => write!(
                f,
                "sdpa: the temp allocator returned scratch at {addr:#x}, not aligned to {align} \
                 bytes as requested: the allocator is broken"
            ),
        }
    }
}

impl std::error::Error for SdpaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SdpaError::Scratch(e) => Some(e),
            _ => None,
        }
    }
}

impl From<AllocError> for SdpaError {
    fn from(e: AllocError) -> Self {
        SdpaError::Scratch(e)
    }
}

/// Bytes of scratch an f32 call with this shape and no sliding window requests from its temp
/// allocator when it runs on a rayon pool of `threads` threads (see [`attention`]; the kernel
/// uses `rayon::current_num_threads()`). Zero when the call has nothing to compute (`batch` or
/// `q_len` is 0): then no scratch is requested at all. A call with a window:
/// [`scratch_bytes_with`].
pub fn scratch_bytes(shape: &Shape, threads: usize) -> Result<usize, SdpaError> {
    scratch_bytes_for(shape, threads, Dtype::F32, KvCache::Dense)
}

/// [`scratch_bytes`] for a call with element type `dtype` and KV storage `kv`: the f32 figure
/// plus the conversion buffers of each worker slice (converted Q rows, one K and four V
/// position rows on the decode path; one K tile on the prefill path, whose V tile is converted
/// straight into its packed form).
pub fn scratch_bytes_for(
    shape: &Shape,
    threads: usize,
    dtype: Dtype,
    kv: KvCache,
) -> Result<usize, SdpaError> {
    Ok(Plan::for_call(shape, threads, dtype, kv)?.total_bytes)
}

/// [`scratch_bytes_for`] for a call with the options `params`: with a sliding window
/// ([`Params::window`]) the decode path splits, and sizes its scratch for, only the positions
/// the window reads.
///
/// # Errors
/// The shape's or the options' error (see [`Shape::validate`], [`SdpaError::InvalidScale`],
/// [`SdpaError::WindowNotCausal`]).
pub fn scratch_bytes_with(
    shape: &Shape,
    params: &Params,
    threads: usize,
    dtype: Dtype,
    kv: KvCache,
) -> Result<usize, SdpaError> {
    Ok(Plan::for_params(shape, params, threads, dtype, kv)?.total_bytes)
}

/// Computes scaled dot-product attention in f32; see the [crate documentation](crate) for the
/// layouts and the masking rule. Same as [`attention_typed`] with `T = f32`.
///
/// `q` and `out` hold `batch * q_len * heads * head_dim` floats, `k` and `v`
/// `batch * kv_capacity * kv_heads * head_dim`. Only the first `start_pos + q_len` positions of
/// the cache are read (under a sliding window, only those inside some row's window); their
/// values must be finite.
///
/// The call requests one buffer of [`scratch_bytes_with`]`(shape, params,
/// rayon::current_num_threads(), Dtype::F32, KvCache::Dense)` bytes ([`scratch_bytes`] without
/// a window) from `temp` (none when there is nothing to compute) before it runs in parallel on
/// the current rayon pool, and never resets `temp`. Call it from a worker of that pool when
/// latency matters (a model's forward pass inside `rayon::scope`): from any other thread each
/// call hands its work to the pool and waits to be woken, tens of microseconds.
///
/// # Errors
/// A shape or slice-length error ([`SdpaError`] says which) before anything is read or written;
/// [`SdpaError::Scratch`] when `temp` refuses the scratch, in which case `out` is untouched.
pub fn attention<A: TempAllocator + ?Sized>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    shape: &Shape,
    params: &Params,
    temp: &A,
) -> Result<(), SdpaError> {
    attention_typed(q, k, v, out, shape, params, temp)
}

/// [`attention`] with Q, K, V and the output in `T` ([`f32`], [`Bf16`] or [`F16`]),
/// accumulating in f32. Non-f32 inputs are converted to f32 tile by tile in the call's one
/// scratch buffer of [`scratch_bytes_with`]`(shape, params, threads, T::DTYPE, KvCache::Dense)`
/// bytes;
/// the output is rounded to `T` (nearest, ties to even) once, at the end.
///
/// # Errors
/// As [`attention`].
pub fn attention_typed<T: Element, A: TempAllocator + ?Sized>(
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    shape: &Shape,
    params: &Params,
    temp: &A,
) -> Result<(), SdpaError> {
    shape.validate()?;
    let kv_elems = shape.kv_elems()?;
    for (tensor, actual) in [(Tensor::K, k.len()), (Tensor::V, v.len())] {
        if actual != kv_elems {
            return Err(SdpaError::LenMismatch {
                tensor,
                expected: kv_elems,
                actual,
            });
        }
    }
    run(q, Kv::Dense(k), Kv::Dense(v), out, shape, params, temp)
}

/// [`attention_typed`] over an int8-quantized KV cache ([`QuantizedKv`], filled by
/// [`quantize_kv`]): each K and V position row is dequantized to f32 in scratch as the kernel
/// reaches it, so a decode step reads about a quarter of the bytes of an f32 cache. Scratch:
/// [`scratch_bytes_with`]`(shape, params, threads, T::DTYPE, KvCache::Int8)` bytes, one
/// request.
/// Scales of the used positions must be finite.
///
/// # Errors
/// As [`attention`]; a wrong cache slice length names `K`/`V` (values), `KScales`,
/// `KZeroPoints`, `VScales` or `VZeroPoints`.
pub fn attention_quantized<T: Element, A: TempAllocator + ?Sized>(
    q: &[T],
    k: QuantizedKv<'_>,
    v: QuantizedKv<'_>,
    out: &mut [T],
    shape: &Shape,
    params: &Params,
    temp: &A,
) -> Result<(), SdpaError> {
    shape.validate()?;
    quant::check_lens(
        shape,
        [k.values.len(), k.scales.len(), k.zero_points.len()],
        [Tensor::K, Tensor::KScales, Tensor::KZeroPoints],
    )?;
    quant::check_lens(
        shape,
        [v.values.len(), v.scales.len(), v.zero_points.len()],
        [Tensor::V, Tensor::VScales, Tensor::VZeroPoints],
    )?;
    run(q, Kv::Int8(k), Kv::Int8(v), out, shape, params, temp)
}

/// The common body of the entry points, after K and V were checked (both in the cache kind
/// of `k`).
fn run<T: Element, A: TempAllocator + ?Sized>(
    q: &[T],
    k: Kv<'_, T>,
    v: Kv<'_, T>,
    out: &mut [T],
    shape: &Shape,
    params: &Params,
    temp: &A,
) -> Result<(), SdpaError> {
    let kv = k.cache();
    let q_elems = shape.q_elems()?;
    for (tensor, expected, actual) in [
        (Tensor::Q, q_elems, q.len()),
        (Tensor::Out, q_elems, out.len()),
    ] {
        if expected != actual {
            return Err(SdpaError::LenMismatch {
                tensor,
                expected,
                actual,
            });
        }
    }
    let scale = params.checked_scale(shape.head_dim)?;
    if shape.batch == 0 || shape.q_len == 0 {
        return Ok(());
    }
    let mask = Mask::new(shape, params.causal, params.window);
    let plan = Plan::new(
        shape,
        &mask,
        rayon::current_num_threads().max(1),
        plan::Conv::of(T::DTYPE, kv),
    );
    let scratch = temp.allocate(plan.total_bytes, SCRATCH_ALIGN)?;
    if !(scratch.as_ptr() as usize).is_multiple_of(SCRATCH_ALIGN) {
        return Err(SdpaError::MisalignedScratch {
            addr: scratch.as_ptr() as usize,
            align: SCRATCH_ALIGN,
        });
    }
    let kernels = kernels::Kernels::detect();
    let args = Args {
        q,
        k,
        v,
        shape: *shape,
        mask,
        // Scores are kept in the log2 domain: exp(x * scale) = exp2(x * scale * log2(e)).
        c: scale * core::f32::consts::LOG2_E,
        kernels,
    };
    // SAFETY: `scratch` points to `plan.total_bytes` bytes (the `TempAllocator` contract),
    // aligned to SCRATCH_ALIGN (checked above), valid until the owner resets `temp`, which
    // cannot happen before this call returns (the owner calls `reset` after the kernel; `reset`
    // is unsafe and requires that no memory from `allocate` is used afterwards, and we hold
    // `&A` for the whole call).
    let scratch = unsafe { sync::Scratch::new(scratch, &plan) };
    match plan.path {
        Path::Rows { .. } => decode::run(&args, &plan, &scratch, out),
        Path::Tiled { .. } => prefill::run(&args, &plan, &scratch, out),
    }
    Ok(())
}

/// Validated inputs of one call, shared by the two paths.
struct Args<'a, T> {
    q: &'a [T],
    k: Kv<'a, T>,
    v: Kv<'a, T>,
    shape: Shape,
    /// Which positions each query row sees.
    mask: Mask,
    /// `scale * log2(e)`: the multiplier taking a raw dot product to the exp2 domain.
    c: f32,
    kernels: kernels::Kernels,
}
