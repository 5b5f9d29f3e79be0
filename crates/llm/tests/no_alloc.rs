//! After the first token, a decode step (forward of one token + sampling) makes no heap
//! allocation outside the temp allocator: a counting global allocator proves it. Its own test
//! binary, so no other test's allocations are counted. A failure shows where the first counted
//! calls came from (thread and backtrace).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use caching_allocator::{AllocError, TempAllocator, TempReset};
use common::{prompt, Spec};
use llm::{Activations, Llama, ModelOptions, Module, Sampler, Weights};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set while this thread is inside the temp allocator (see `Excluding`).
    static IN_TEMP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set while this thread records where a counted call came from: the recording allocates
    /// itself, and those calls are neither counted nor recorded.
    static RECORDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Where the first counted calls came from (thread and backtrace), for the failure message.
static TRACES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn count() {
    if !COUNTING.load(Ordering::Relaxed) || IN_TEMP.with(|c| c.get()) || RECORDING.with(|c| c.get())
    {
        return;
    }
    CALLS.fetch_add(1, Ordering::Relaxed);
    RECORDING.with(|c| c.set(true));
    let mut traces = TRACES.lock().unwrap_or_else(|e| e.into_inner());
    if traces.len() < 4 {
        let thread = std::thread::current();
        let trace = std::backtrace::Backtrace::force_capture();
        traces.push(format!("on thread {:?}:\n{trace}", thread.name()));
    }
    drop(traces);
    RECORDING.with(|c| c.set(false));
}

/// The recorded origins of counted calls, emptied.
fn traces() -> String {
    RECORDING.with(|c| c.set(true));
    let all = std::mem::take(&mut *TRACES.lock().unwrap_or_else(|e| e.into_inner())).join("\n");
    RECORDING.with(|c| c.set(false));
    all
}

// SAFETY: forwards every call to `System` unchanged; counting has no effect on the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count();
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A temp allocator whose memory comes from one arena allocated up front: its own requests
/// never reach the global allocator, so every counted call comes from elsewhere.
struct Arena {
    base: *mut u8,
    cap: usize,
    used: std::cell::Cell<usize>,
}

impl Arena {
    fn new(cap: usize) -> Arena {
        let layout = Layout::from_size_align(cap, 4096).unwrap();
        // SAFETY: non-zero size.
        let base = unsafe { std::alloc::alloc(layout) };
        assert!(!base.is_null());
        Arena {
            base,
            cap,
            used: std::cell::Cell::new(0),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.base, Layout::from_size_align(self.cap, 4096).unwrap()) }
    }
}

// SAFETY: bump allocation inside one arena: aligned (align_up), in bounds (checked), never
// overlapping (monotonic offset) until `reset` rewinds it.
unsafe impl TempAllocator for Arena {
    fn allocate(&self, size: usize, align: usize) -> Result<std::ptr::NonNull<u8>, AllocError> {
        let start =
            (self.base as usize + self.used.get()).next_multiple_of(align) - self.base as usize;
        if start + size > self.cap {
            return Err(AllocError::SizeOverflow { size, align });
        }
        self.used.set(start + size);
        // SAFETY: start + size <= cap: inside the arena.
        Ok(unsafe { std::ptr::NonNull::new_unchecked(self.base.add(start)) })
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for Arena {
    unsafe fn reset_unchecked(&self) {
        self.used.set(0);
    }
}

/// Wraps a temp allocator so that the global-allocator calls it makes itself (its own
/// bookkeeping) are not counted: what is left comes from outside the temp allocator.
struct Excluding<A>(A);

// SAFETY: forwards both calls unchanged.
unsafe impl<A: TempReset> TempAllocator for Excluding<A> {
    fn allocate(&self, size: usize, align: usize) -> Result<std::ptr::NonNull<u8>, AllocError> {
        IN_TEMP.with(|c| c.set(true));
        let r = self.0.allocate(size, align);
        IN_TEMP.with(|c| c.set(false));
        r
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl<A: TempReset> TempReset for Excluding<A> {
    unsafe fn reset_unchecked(&self) {
        IN_TEMP.with(|c| c.set(true));
        // SAFETY: the caller's guarantees are passed on.
        unsafe { self.0.reset_unchecked() };
        IN_TEMP.with(|c| c.set(false));
    }
}

fn count_decode_steps<A: TempReset>(model: &mut Llama<A>, sampler: &mut Sampler) -> u64 {
    let p = prompt(model.config().vocab_size, 16, 4);
    model.clear();
    model.forward(&p).unwrap();
    let mut t = model.sample(sampler).unwrap();
    // The first token's step: may size buffers, warm caches, register threads.
    model.forward(&[t]).unwrap();
    t = model.sample(sampler).unwrap();
    CALLS.store(0, Ordering::SeqCst);
    traces();
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..20 {
        model.forward(&[t]).unwrap();
        t = model.sample(sampler).unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    CALLS.load(Ordering::SeqCst)
}

#[test]
fn decode_steps_make_no_heap_allocation_outside_the_temp_allocator() {
    let spec = Spec {
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 96,
        vocab: 300,
        dtype: llm::safetensors::DType::BF16,
        ..Spec::default()
    };
    let dir = spec.checkpoint("noalloc");
    let weights = Arc::new(Weights::load(dir.path()).unwrap());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    // Every worker started before anything is counted. `build` returns once the threads are
    // spawned, not once they run: on a loaded machine a worker may first run during the
    // measured steps, and a starting thread frees its start-up state (std's `ThreadInit`, seen
    // as one counted `dealloc` on an unnamed thread in 2 of 100 runs under a parallel CPU
    // load). That is the pool's set-up, not a decode step's allocation; a job on every worker
    // returns only once each has started.
    pool.broadcast(|_| ());
    // Driven from inside the pool, as `llm generate` does (see the crate docs on rayon's
    // injector).
    pool.install(|| {
        // The arena: counted calls can only come from outside the temp allocator.
        let mut m = Llama::new(
            weights.clone(),
            Arena::new(16 << 20),
            &ModelOptions::default(),
        )
        .unwrap();
        let mut s = Sampler::new(0.8, 0.9, 1).unwrap();
        let n = count_decode_steps(&mut m, &mut s);
        assert_eq!(
            n,
            0,
            "{n} global-allocator calls in 20 decode steps (arena temp), from:\n{}",
            traces()
        );
        assert!(
            m.temp_usage().bytes > 0,
            "the kernels did use the temp allocator"
        );

        // The runner's default, a CachingAllocator capped at 10 MiB: nothing outside it
        // allocates either (its own bookkeeping, if any, is excluded from the count).
        let temp = Excluding(llm::caching_temp(llm::DEFAULT_TEMP_CAP));
        let mut m = Llama::new(weights.clone(), temp, &ModelOptions::default()).unwrap();
        let n = count_decode_steps(&mut m, &mut Sampler::new(0.8, 0.9, 2).unwrap());
        assert_eq!(
            n,
            0,
            "{n} global-allocator calls in 20 decode steps (caching temp), from:\n{}",
            traces()
        );

        // Quantized weights (a tiny Q4_1 GGUF model; its head in Q8_0 like SmolLM2's).
        let (mut w, _) = common::gguf::tiny_model(&spec, Some(llm::quant::format::QType::Q4_1));
        let (_, head) = common::gguf::tiny_model(&spec, Some(llm::quant::format::QType::Q8_0));
        let head = head.iter().find(|t| t.0 == "lm_head.weight").unwrap();
        let bytes: Vec<u8> = head
            .2
            .chunks(spec.hidden)
            .flat_map(|r| {
                llm::quant::format::quantize_row(llm::quant::format::QType::Q8_0, r).unwrap()
            })
            .collect();
        let t = w
            .tensors
            .iter_mut()
            .find(|t| t.name == "output.weight")
            .unwrap();
        t.ggml_type = common::gguf::Q8_0;
        t.data = bytes;
        let path = dir.path().join("q.gguf");
        w.write(&path);
        let qweights = Arc::new(Weights::load(&path).unwrap());
        // Both activation modes: int8 quantizes `x` into scratch too.
        for activations in [Activations::F32, Activations::Int8] {
            let temp = Excluding(llm::caching_temp(llm::DEFAULT_TEMP_CAP));
            let opts = ModelOptions {
                activations,
                ..Default::default()
            };
            let mut m = Llama::new(qweights.clone(), temp, &opts).unwrap();
            let n = count_decode_steps(&mut m, &mut Sampler::new(0.8, 0.9, 3).unwrap());
            assert_eq!(
                n,
                0,
                "{n} global-allocator calls in 20 decode steps (Q4_1 GGUF, {activations:?} \
                 activations, caching temp), from:\n{}",
                traces()
            );
        }

        // Gemma 3 (a tiny gemma3 GGUF: q/k norms, post-norms, GELU gating, local layers
        // whose window of 4 is shorter than the 38 positions decoded).
        let gspec = common::gemma3::GemmaSpec {
            quant: Some(llm::quant::format::QType::Q8_0),
            ..Default::default()
        };
        let (gw, _) = common::gemma3::tiny_gemma3(&gspec);
        let gpath = dir.path().join("gemma3.gguf");
        gw.write(&gpath);
        let gweights = Arc::new(Weights::load(&gpath).unwrap());
        let temp = Excluding(llm::caching_temp(llm::DEFAULT_TEMP_CAP));
        let mut m = Llama::new(gweights, temp, &ModelOptions::default()).unwrap();
        let n = count_decode_steps(&mut m, &mut Sampler::new(0.8, 0.9, 4).unwrap());
        assert_eq!(
            n,
            0,
            "{n} global-allocator calls in 20 decode steps (gemma3 GGUF, caching temp), \
             from:\n{}",
            traces()
        );
    });
    // The counter works: an allocation while counting is seen.
    COUNTING.store(true, Ordering::SeqCst);
    let v = std::hint::black_box(vec![1u8; 100]);
    COUNTING.store(false, Ordering::SeqCst);
    drop(v);
    assert!(CALLS.load(Ordering::SeqCst) >= 1);
}
