//! The runtime's side of the temp allocator: run one kernel, then reset, as ExecuTorch's
//! executor does after every kernel call.

use core::cell::Cell;
use core::ptr::NonNull;

use caching_allocator::{AllocError, TempAllocator, TempReset};

use crate::error::{LlmError, Result};

/// Alignment of every scratch buffer the kernels request (ExecuTorch's default).
pub const SCRATCH_ALIGN: usize = 64;

/// Counters of what the kernels asked of the temp allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TempUsage {
    /// Kernel calls run (each followed by one `reset`).
    pub kernel_calls: u64,
    /// `allocate` calls.
    pub allocations: u64,
    /// Bytes requested.
    pub bytes: u64,
}

/// What the decode matvecs of 4-bit (Q4_0 / Q4_1) weights multiply: the activations as they
/// are, or quantized to int8.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// f32 activations (the default): every kernel computes the model's exact arithmetic up
    /// to f32 rounding, so greedy output equals an f64 forward pass of the same weights.
    #[default]
    F32,
    /// Opt-in and **inexact**: each decode matvec over 4-bit rows quantizes `x` to int8 per
    /// block of 32 (scale: the block's largest magnitude over 127) and sums integer products,
    /// as llama.cpp does. Fewer instructions per weight where the f32 kernel is compute-bound,
    /// but each activation moves by up to half its block's step (1/254 of the block's
    /// largest), so greedy text may leave the exact model's within a few tokens. Q8_0 rows
    /// and the prefill matmul keep f32 activations.
    Int8,
}

impl Activations {
    /// The name the command line uses (`f32`, `int8`).
    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Int8 => "int8",
        }
    }
}

impl core::str::FromStr for Activations {
    type Err = LlmError;

    fn from_str(s: &str) -> Result<Self> {
        [Activations::F32, Activations::Int8]
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| LlmError::InvalidArgument {
                message: format!("activations {s:?}: use f32 (exact, the default) or int8"),
            })
    }
}

/// Owns the temp allocator; runs kernels and resets the allocator after each.
pub struct Runtime<A> {
    temp: A,
    usage: TempUsage,
    activations: Activations,
    phase: &'static str,
    profile: Option<crate::scratch_profile::ScratchProfile>,
}

impl<A: TempReset> Runtime<A> {
    /// A runtime over `temp`.
    pub fn new(temp: A) -> Self {
        Runtime {
            temp,
            usage: TempUsage::default(),
            activations: Activations::F32,
            phase: "prefill",
            profile: None,
        }
    }

    /// What the kernels' 4-bit decode matvecs multiply from now on.
    pub fn set_activations(&mut self, activations: Activations) {
        self.activations = activations;
    }

    /// What the kernels' 4-bit decode matvecs multiply.
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// Names the phase the next kernel calls belong to (for the scratch profile).
    pub fn set_phase(&mut self, phase: &'static str) {
        self.phase = phase;
    }

    /// Starts recording a scratch profile (per phase and kernel name), empty.
    pub fn enable_profile(&mut self) {
        self.profile = Some(Default::default());
    }

    /// The scratch profile, when enabled.
    pub fn profile(&self) -> Option<&crate::scratch_profile::ScratchProfile> {
        self.profile.as_ref()
    }

    /// The temp allocator (for its statistics).
    pub fn temp(&self) -> &A {
        &self.temp
    }

    /// What the kernels have asked of the allocator so far.
    pub fn usage(&self) -> TempUsage {
        self.usage
    }

    /// Runs one kernel call named `kernel` with scratch from the temp allocator, then resets
    /// the allocator (also when the kernel fails).
    pub fn run<R>(
        &mut self,
        kernel: &'static str,
        f: impl for<'t> FnOnce(&Scratch<'t, A>) -> Result<R>,
    ) -> Result<R> {
        let scratch = Scratch {
            temp: &self.temp,
            kernel,
            activations: self.activations,
            allocations: Cell::new(0),
            bytes: Cell::new(0),
        };
        // Timed only while profiling: a clock read is not free on every VM.
        let start = self.profile.as_ref().map(|_| std::time::Instant::now());
        let r = f(&scratch);
        self.usage.kernel_calls += 1;
        self.usage.allocations += scratch.allocations.get();
        self.usage.bytes += scratch.bytes.get();
        if let Some(p) = &mut self.profile {
            let nanos = start.map_or(0, |t| t.elapsed().as_nanos());
            let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
            p.record(self.phase, kernel, scratch.bytes.get(), nanos);
        }
        // SAFETY: every block handed out since the last reset was handed out through a
        // `Scratch` borrowed for one `f` call only: slices from it carry the `'t` lifetime,
        // which `f`'s higher-ranked signature keeps from escaping, so nothing refers to them
        // now; `&mut self` guarantees no other call on the allocator runs concurrently.
        unsafe { self.temp.reset_unchecked() };
        r
    }
}

/// A kernel call's view of the temp allocator: typed, zeroed buffers valid for the call.
pub struct Scratch<'t, A: ?Sized> {
    temp: &'t A,
    kernel: &'static str,
    activations: Activations,
    allocations: Cell<u64>,
    bytes: Cell<u64>,
}

impl<'t, A: TempAllocator + ?Sized> Scratch<'t, A> {
    fn raw(&self, bytes: usize) -> Result<NonNull<u8>> {
        let p = self
            .temp
            .allocate(bytes, SCRATCH_ALIGN)
            .map_err(|source| LlmError::Scratch {
                kernel: self.kernel,
                source,
            })?;
        if !(p.as_ptr() as usize).is_multiple_of(SCRATCH_ALIGN) {
            return Err(LlmError::Scratch {
                kernel: self.kernel,
                source: AllocError::InvalidAlignment {
                    align: SCRATCH_ALIGN,
                },
            });
        }
        self.allocations.set(self.allocations.get() + 1);
        self.bytes.set(self.bytes.get() + bytes as u64);
        Ok(p)
    }

    /// `n` zeroed floats, valid until the kernel call ends.
    pub fn f32s(&self, n: usize) -> Result<&'t mut [f32]> {
        if n == 0 {
            return Ok(&mut []);
        }
        let bytes = n
            .checked_mul(4)
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(LlmError::Scratch {
                kernel: self.kernel,
                source: AllocError::SizeOverflow {
                    size: n,
                    align: SCRATCH_ALIGN,
                },
            })?;
        let p = self.raw(bytes)?;
        // SAFETY: the TempAllocator contract: `p` is valid for writes of `bytes` bytes,
        // overlaps no other block handed out since the last reset, and stays valid until the
        // next reset, which `Runtime::run` calls only after the kernel (holding `'t`) returned.
        // It is aligned to 64 (checked) >= align_of::<f32>(); zeroing makes every element an
        // initialised f32 before the slice is formed.
        unsafe {
            core::ptr::write_bytes(p.as_ptr(), 0, bytes);
            Ok(core::slice::from_raw_parts_mut(p.as_ptr().cast::<f32>(), n))
        }
    }

    /// What the 4-bit decode matvecs multiply (the runtime's setting).
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// `n` zeroed `i8`s, valid until the kernel call ends.
    pub fn i8s(&self, n: usize) -> Result<&'t mut [i8]> {
        let f = self.f32s(n.div_ceil(4))?;
        // SAFETY: the block holds `4 * f.len() >= n` zeroed bytes, aligned to 64, and every
        // byte is a valid i8; the f32 view is consumed, so the memory has one user.
        Ok(unsafe { core::slice::from_raw_parts_mut(f.as_mut_ptr().cast::<i8>(), n) })
    }

    /// `n` zeroed `u32`s, valid until the kernel call ends.
    pub fn u32s(&self, n: usize) -> Result<&'t mut [u32]> {
        let f = self.f32s(n)?;
        // SAFETY: same size and alignment as f32, and the zeroed bytes are a valid u32; the
        // f32 view is consumed, so the memory has one user.
        Ok(unsafe { core::slice::from_raw_parts_mut(f.as_mut_ptr().cast::<u32>(), f.len()) })
    }

    /// The allocator itself, as a temp allocator for kernels that allocate on their own
    /// (attention); their requests are counted too.
    pub fn allocator(&self) -> Counting<'_, 't, A> {
        Counting { scratch: self }
    }
}

/// A [`TempAllocator`] that forwards to a [`Scratch`]'s allocator and counts the requests.
pub struct Counting<'s, 't, A: ?Sized> {
    scratch: &'s Scratch<'t, A>,
}

// SAFETY: `allocate` forwards to the underlying allocator (whose contract it inherits) and
// only adds counting. It has no `TempReset`: only the runtime resets, after the kernel returns.
unsafe impl<A: TempAllocator + ?Sized> TempAllocator for Counting<'_, '_, A> {
    fn allocate(&self, size: usize, align: usize) -> core::result::Result<NonNull<u8>, AllocError> {
        let p = self.scratch.temp.allocate(size, align)?;
        let s = self.scratch;
        s.allocations.set(s.allocations.get() + 1);
        s.bytes.set(s.bytes.get() + size as u64);
        Ok(p)
    }
}

/// Lets a borrowed temp allocator (for example a benchmark source's `&dyn TempAllocator`) be
/// the model's: forwards both calls.
pub struct TempRef<'a, T: ?Sized>(pub &'a T);

// SAFETY: forwards both calls unchanged to `T`, which keeps the contract.
unsafe impl<T: TempAllocator + ?Sized> TempAllocator for TempRef<'_, T> {
    fn allocate(&self, size: usize, align: usize) -> core::result::Result<NonNull<u8>, AllocError> {
        self.0.allocate(size, align)
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl<T: TempReset + ?Sized> TempReset for TempRef<'_, T> {
    unsafe fn reset_unchecked(&self) {
        // SAFETY: the caller's guarantees are passed on unchanged.
        unsafe { self.0.reset_unchecked() }
    }
}
