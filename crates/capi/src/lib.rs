//! C ABI for `caching-allocator`: `libcaching_allocator.{so,a}` with the header
//! `include/caching_allocator.h` (generated from this file by cbindgen; `tests/header.rs`
//! fails when the checked-in copy is out of date).
//!
//! # Model
//! - `ca_create` makes an allocator from a `CaConfig`; `ca_destroy` frees it and every block
//!   it holds.
//! - `ca_allocate` returns NULL on failure; every other call returns a `CaStatus`.
//!   `ca_last_error(a)` gives the code and a message of the calling thread's last failure on
//!   `a`; failures without a handle (`ca_create`, a NULL handle, `ca_destroy`) are read with
//!   `ca_last_error(NULL)`.
//! - NULL handles and bad arguments give a status code, never a crash. Rust panics never cross
//!   the boundary: they come back as `CA_STATUS_INTERNAL` (or `CA_STATUS_CORRUPTED` when debug
//!   checks found an overrun during `ca_reset`), and print nothing unless the program opts in
//!   (`ca_set_panic_output`, `panic_output.rs`).
//!
//! # Temp plan
//! `ca_plan_start` records the scratch high-water mark of every reset interval (every kernel
//! call, under ExecuTorch) into a bounded buffer that `ca_plan_read` returns, with the maximum:
//! the temp memory a program needs, to size a fixed buffer from (`temp_plan.rs`). Off by
//! default; it never touches `ca_allocate`.
//!
//! # Threads
//! Any thread may call `ca_allocate`, `ca_release`, `ca_reset`, `ca_free_cached`, `ca_trim`,
//! `ca_stats`, `ca_last_error` and the temp plan's `ca_plan_start`, `ca_plan_stop` and
//! `ca_plan_read` at the same time as other threads call them on the same handle, as ExecuTorch's own thread-safety test does with its allocator's `reset()`. A block
//! may be released on another thread than the one that allocated it.
//!
//! No block handed out before a `ca_reset` may be used or released after it; a block allocated
//! on another thread *while* the reset runs may or may not be reset, so a runtime orders such
//! allocations after the reset (this is the contract of the Rust
//! `CachingAllocator::reset_unchecked`). `ca_destroy` needs **exclusive access**: no other call
//! on the handle may run concurrently or after it.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::ptr::NonNull;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ca::{CachingAllocator, Config, Stats};

mod last_error;
mod messages;
mod panic_output;
mod temp_plan;
#[cfg(test)]
mod tests;

/// The largest alignment `ca_allocate` serves: 2 MiB.
pub const CA_MAX_ALIGN: usize = 2 << 20;
/// Every block `ca_allocate` hands out is aligned to at least this (one cache line).
pub const CA_MIN_ALIGN: usize = 64;

const _: () = assert!(CA_MAX_ALIGN == ca::MAX_ALIGN && CA_MIN_ALIGN == ca::MIN_ALIGN);

/// What a call did: `CA_STATUS_OK`, or why it failed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaStatus {
    /// Success (also what `ca_last_error` reports before any failure).
    Ok = 0,
    /// The allocator handle was NULL.
    NullHandle = 1,
    /// A pointer argument was NULL: the config of `ca_create`, the block of `ca_release`, the
    /// output of `ca_stats`.
    NullArgument = 2,
    /// The alignment is 0, not a power of two, or larger than `CA_MAX_ALIGN` (2 MiB; see
    /// `ca_allocate` for how to get larger ones).
    InvalidAlignment = 3,
    /// The size, rounded up to its size class (plus the debug canary), exceeds `PTRDIFF_MAX`.
    SizeOverflow = 4,
    /// The allocation would push live + cached bytes over `limit_bytes`, even with the idle
    /// cache given back.
    LimitExceeded = 5,
    /// The system allocator refused the memory, even after the idle cache was given back.
    OutOfMemory = 6,
    /// `ca_release` got a pointer that is not live in this allocator: never handed out by it,
    /// already released, or taken back by `ca_reset`. Nothing changed.
    UnknownPointer = 7,
    /// Debug checks found a block written past its requested size (by `ca_release` or
    /// `ca_reset`). The block went back to the system; with `ca_reset`, every other block was
    /// still reset.
    Corrupted = 8,
    /// A bug inside the library: a Rust panic was caught at the boundary, or the core library
    /// reported an error this version of the C API does not know. The message says which (for
    /// a panic: its message and source location). Nothing is printed unless the program opted
    /// in with `ca_set_panic_output`.
    Internal = 9,
}

impl CaStatus {
    /// The C name of the code, as a constant C string.
    fn name(self) -> &'static CStr {
        match self {
            CaStatus::Ok => c"CA_STATUS_OK",
            CaStatus::NullHandle => c"CA_STATUS_NULL_HANDLE",
            CaStatus::NullArgument => c"CA_STATUS_NULL_ARGUMENT",
            CaStatus::InvalidAlignment => c"CA_STATUS_INVALID_ALIGNMENT",
            CaStatus::SizeOverflow => c"CA_STATUS_SIZE_OVERFLOW",
            CaStatus::LimitExceeded => c"CA_STATUS_LIMIT_EXCEEDED",
            CaStatus::OutOfMemory => c"CA_STATUS_OUT_OF_MEMORY",
            CaStatus::UnknownPointer => c"CA_STATUS_UNKNOWN_POINTER",
            CaStatus::Corrupted => c"CA_STATUS_CORRUPTED",
            CaStatus::Internal => c"CA_STATUS_INTERNAL",
        }
    }

    /// Every code, in numeric order.
    const ALL: [CaStatus; 10] = [
        CaStatus::Ok,
        CaStatus::NullHandle,
        CaStatus::NullArgument,
        CaStatus::InvalidAlignment,
        CaStatus::SizeOverflow,
        CaStatus::LimitExceeded,
        CaStatus::OutOfMemory,
        CaStatus::UnknownPointer,
        CaStatus::Corrupted,
        CaStatus::Internal,
    ];
}

/// The reason of a failure, from `ca_last_error`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CaError {
    /// The status code of the failing call (`CA_STATUS_OK` if there was no failure).
    pub code: CaStatus,
    /// What went wrong and what to do about it; never NULL. Owned by the library: valid on the
    /// calling thread until its next failing call on the same handle (for `ca_last_error(NULL)`:
    /// its next failing call without a handle), until the handle is destroyed, or until the
    /// thread exits (a thread's last errors go with it).
    pub message: *const c_char,
}

/// How an allocator behaves; start from `ca_config_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CaConfig {
    /// At most this many idle bytes stay cached (over all threads); past it the least recently
    /// used idle blocks go back to the system. Default 64 MiB.
    pub max_cached_bytes: usize,
    /// A hard limit on live + cached bytes; 0 means no limit (the default).
    pub limit_bytes: usize,
    /// Fill every block with 0xFF when handed out and check a canary behind its requested end
    /// when it comes back (`CA_STATUS_CORRUPTED`). Costs a memset per allocation. Default off.
    pub debug_checks: bool,
    /// Keep the working set, for a temp allocator reset after every kernel: after every block
    /// from the system, idle blocks are evicted until live + cached bytes are at most this
    /// many times the peak of the bytes live blocks asked for, and a miss may take any larger
    /// idle block within that budget. 1.25 is recommended (the ExecuTorch adapter uses it);
    /// 0 (the default) turns it off; values between 0 and 1 count as 1.
    pub working_set_slack: f64,
    /// Requests of up to this many bytes (alignment up to 4 KiB) are bumped through the
    /// calling thread's arena, which a reset takes back in one atomic step; 0 turns it off.
    /// `ca_config_default()` gives 32 KiB. Off with `debug_checks`.
    pub arena_max_bytes: usize,
    /// Larger requests, up to 2 MiB, go to the arena too while the thread's last reset
    /// interval fit one chunk (an attention decode step: two buffers and a reset); the size
    /// classes serve them otherwise. `ca_config_default()` gives true.
    pub arena_adaptive: bool,
}

impl From<CaConfig> for Config {
    fn from(c: CaConfig) -> Config {
        // NaN and values <= 0 are off (NaN: `0.0 < NaN` is false).
        let slack = (c.working_set_slack > 0.0).then_some(c.working_set_slack);
        let config = Config::new()
            .max_cached_bytes(c.max_cached_bytes)
            .debug_checks(c.debug_checks)
            .working_set_slack(slack)
            .arena_max_bytes(c.arena_max_bytes)
            .arena_adaptive(c.arena_adaptive);
        if c.limit_bytes == 0 {
            config
        } else {
            config.limit_bytes(c.limit_bytes)
        }
    }
}

/// A snapshot of an allocator's counters, from `ca_stats`. Byte counts of blocks are class
/// sizes (what the blocks hold), except `requested_bytes`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaStats {
    /// Requests served by an idle cached block.
    pub hits: u64,
    /// Requests that needed a new block from the system.
    pub misses: u64,
    /// Bytes of the blocks live now.
    pub live_bytes: usize,
    /// How many blocks are live now.
    pub live_blocks: usize,
    /// Bytes of idle cached blocks, in every thread's cache.
    pub cached_bytes: usize,
    /// How many idle blocks are cached.
    pub cached_blocks: usize,
    /// The most live bytes there have been (with several threads allocating: never below the
    /// true peak).
    pub peak_live_bytes: usize,
    /// Bytes taken from the system and not given back: live + cached.
    pub reserved_bytes: usize,
    /// The most bytes there have been taken from the system at once.
    pub peak_reserved_bytes: usize,
    /// The sizes requested for the live blocks (`live_bytes - requested_bytes` is rounding
    /// waste, plus debug canaries).
    pub requested_bytes: usize,
    /// Blocks taken from the system.
    pub system_allocs: u64,
    /// Blocks given back to the system.
    pub system_frees: u64,
    /// Idle blocks given back to the system because of the cap, the limit or a trim.
    pub evictions: u64,
    /// Times the system refused memory and the allocator retried after freeing its cache.
    pub oom_retries: u64,
    /// Blocks found written past their requested end (debug checks).
    pub corrupted_blocks: u64,
    /// Hits served by an idle block of a larger class, none of the request's own being idle
    /// (best fit, up to twice the class). Counted in `hits` too.
    pub oversize_hits: u64,
    /// Bytes of the blocks held now that the kernel accepted huge-page advice for (blocks of
    /// 2 MiB and more; Linux).
    pub huge_page_bytes: usize,
    /// The working-set budget (`CaConfig::working_set_slack`) has evicted: wide fit is on.
    pub working_set_mode: bool,
    /// Blocks live in the threads' arenas (counted in `live_blocks` too).
    pub arena_live_blocks: usize,
    /// Chunks the threads' arenas hold (each one block from the system).
    pub arena_chunks: usize,
    /// The most bytes live at once since the last `ca_reset`, summed over threads.
    pub interval_peak_bytes: usize,
    /// The most bytes live at once between the last two `ca_reset`s: the scratch high-water
    /// mark of the kernel call the last reset ended.
    pub last_interval_peak_bytes: usize,
}

impl From<Stats> for CaStats {
    fn from(s: Stats) -> CaStats {
        CaStats {
            hits: s.hits,
            misses: s.misses,
            live_bytes: s.live_bytes,
            live_blocks: s.live_blocks,
            cached_bytes: s.cached_bytes,
            cached_blocks: s.cached_blocks,
            peak_live_bytes: s.peak_live_bytes,
            reserved_bytes: s.reserved_bytes,
            peak_reserved_bytes: s.peak_reserved_bytes,
            requested_bytes: s.requested_bytes,
            system_allocs: s.system_allocs,
            system_frees: s.system_frees,
            evictions: s.evictions,
            oom_retries: s.oom_retries,
            corrupted_blocks: s.corrupted_blocks,
            oversize_hits: s.oversize_hits,
            huge_page_bytes: s.huge_page_bytes,
            working_set_mode: s.working_set_mode,
            arena_live_blocks: s.arena_live_blocks,
            arena_chunks: s.arena_chunks,
            interval_peak_bytes: s.interval_peak_bytes,
            last_interval_peak_bytes: s.last_interval_peak_bytes,
        }
    }
}

/// An allocator: opaque to C, made by `ca_create`, freed by `ca_destroy`.
pub struct CaAllocator {
    inner: CachingAllocator,
    errors: last_error::PerThread,
    plan: temp_plan::TempPlan,
}

/// What a temp plan holds, from `ca_plan_read`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaPlanInfo {
    /// Entries stored in the plan's buffer (at most the capacity given to `ca_plan_start`).
    pub stored: usize,
    /// Reset intervals recorded since `ca_plan_start`, stored or not.
    pub intervals: u64,
    /// Intervals not stored because the buffer was full (they still count in `max_bytes`).
    pub dropped: u64,
    /// The largest interval peak recorded: the temp memory the program needs at most, in the
    /// allocator's block bytes (`CaStats::last_interval_peak_bytes`).
    pub max_bytes: usize,
    /// Whether resets are being recorded now.
    pub recording: bool,
}

/// Why a call failed, before it is recorded.
struct Failure {
    code: CaStatus,
    message: String,
}

impl Failure {
    fn new(code: CaStatus, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    fn panicked(payload: &(dyn Any + Send), location: Option<String>) -> Self {
        let at = location.map(|l| format!(" at {l}")).unwrap_or_default();
        Failure::new(
            CaStatus::Internal,
            format!(
                "panicked{at}: {} (a bug in caching-allocator: please report it with this message)",
                panic_message(payload)
            ),
        )
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic with a non-string payload"
    }
}

/// Runs `f`, turning a panic into a failure; the panic prints nothing unless the host opted in
/// (`ca_set_panic_output`, see `panic_output.rs`).
fn catching<T>(f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    let inside = panic_output::Inside::enter();
    // `AssertUnwindSafe`: after a panic the allocator may hold inconsistent *counters*, never
    // unsafe state (the core keeps its memory safety across panics); the caller is told by
    // `CA_STATUS_INTERNAL`.
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|payload| Err(Failure::panicked(&*payload, inside.panic_location())))
}

impl CaAllocator {
    /// Runs `f` on the allocator, catching panics; a failure is recorded for this thread.
    fn call<T>(
        &self,
        function: &str,
        f: impl FnOnce(&CachingAllocator) -> Result<T, Failure>,
    ) -> Result<T, CaStatus> {
        catching(|| f(&self.inner)).map_err(|e| {
            self.errors
                .set(e.code, format!("{function}: {}", e.message));
            e.code
        })
    }
}

/// Records a failure that has no handle to go to and returns its code.
fn fail_without_handle(function: &str, e: Failure) -> CaStatus {
    last_error::set_without_handle(e.code, format!("{function}: {}", e.message));
    e.code
}

fn null_handle(function: &str) -> CaStatus {
    fail_without_handle(
        function,
        Failure::new(
            CaStatus::NullHandle,
            "the allocator handle is NULL: pass the handle ca_create returned",
        ),
    )
}

fn status(result: Result<(), CaStatus>) -> CaStatus {
    result.err().unwrap_or(CaStatus::Ok)
}

/// The default configuration: 64 MiB cached, no limit, no debug checks.
#[no_mangle]
pub extern "C" fn ca_config_default() -> CaConfig {
    let d = Config::default();
    CaConfig {
        max_cached_bytes: d.get_max_cached_bytes(),
        limit_bytes: d.get_limit_bytes().unwrap_or(0),
        debug_checks: d.get_debug_checks(),
        working_set_slack: d.get_working_set_slack().unwrap_or(0.0),
        arena_max_bytes: d.get_arena_max_bytes(),
        arena_adaptive: d.get_arena_adaptive(),
    }
}

/// Creates an allocator configured by `*config`. Returns NULL on failure; then
/// `ca_last_error(NULL)` says why (`CA_STATUS_NULL_ARGUMENT` if `config` is NULL).
///
/// # Safety
/// `config` is NULL or points to a readable, initialised `CaConfig` (in particular
/// `debug_checks` holds 0 or 1, as a C `bool` does).
#[no_mangle]
pub unsafe extern "C" fn ca_create(config: *const CaConfig) -> *mut CaAllocator {
    const FUNCTION: &str = "ca_create";
    if config.is_null() {
        fail_without_handle(
            FUNCTION,
            Failure::new(
                CaStatus::NullArgument,
                "config is NULL: pass a CaConfig, e.g. from ca_config_default()",
            ),
        );
        return core::ptr::null_mut();
    }
    // SAFETY: non-null, and the caller guarantees it points to an initialised `CaConfig`;
    // `read_unaligned` asks no more of the pointer than that.
    let config = unsafe { config.read_unaligned() };
    match catching(|| {
        Ok(Box::new(CaAllocator {
            inner: CachingAllocator::with_config(config.into()),
            errors: last_error::PerThread::default(),
            plan: temp_plan::TempPlan::default(),
        }))
    }) {
        Ok(handle) => Box::into_raw(handle),
        Err(e) => {
            fail_without_handle(FUNCTION, e);
            core::ptr::null_mut()
        }
    }
}

/// Destroys an allocator: every block it holds, live or cached, goes back to the system, and
/// the handle must not be used again. Returns `CA_STATUS_NULL_HANDLE` for NULL (and does
/// nothing); failures are read with `ca_last_error(NULL)`.
///
/// # Safety
/// `a` is NULL or a handle from `ca_create` not yet destroyed. Exclusive access: no other call
/// on `a` runs concurrently or afterwards, and no block from `a` (nor a message from
/// `ca_last_error(a)`) is used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ca_destroy(a: *mut CaAllocator) -> CaStatus {
    const FUNCTION: &str = "ca_destroy";
    if a.is_null() {
        return null_handle(FUNCTION);
    }
    // SAFETY: `a` came from `Box::into_raw` in `ca_create` and is destroyed only once, with no
    // other access running or to come (the caller's contract), so we may take the box back.
    let handle = unsafe { Box::from_raw(a) };
    match catching(|| {
        drop(handle);
        Ok(())
    }) {
        Ok(()) => CaStatus::Ok,
        Err(e) => fail_without_handle(FUNCTION, e),
    }
}

/// Runs `f` on the allocator behind `a` for `function`: a NULL handle, a failure or a panic
/// comes back as its code, recorded where `ca_last_error` finds it.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`, not destroyed while the call runs.
unsafe fn call_on<T>(
    a: *const CaAllocator,
    function: &str,
    f: impl FnOnce(&CachingAllocator) -> Result<T, Failure>,
) -> Result<T, CaStatus> {
    // SAFETY: by the caller's contract a non-null `a` points to a live `CaAllocator`, which is
    // `Sync`, so a shared borrow is sound while other threads use it too.
    let a = unsafe { a.as_ref() }.ok_or_else(|| null_handle(function))?;
    a.call(function, f)
}

/// Returns a block of at least `size` bytes aligned to `align`, or NULL on failure (then
/// `ca_last_error(a)` says why: `CA_STATUS_NULL_HANDLE` (read with `ca_last_error(NULL)`),
/// `CA_STATUS_INVALID_ALIGNMENT`, `CA_STATUS_SIZE_OVERFLOW`, `CA_STATUS_LIMIT_EXCEEDED`,
/// `CA_STATUS_OUT_OF_MEMORY`).
///
/// `align` is a power of two up to `CA_MAX_ALIGN` (2 MiB); every block is at least
/// `CA_MIN_ALIGN` aligned. **Larger alignments are refused** with `CA_STATUS_INVALID_ALIGNMENT`
/// (ExecuTorch's allocators serve any power of two): ask for `size + align - CA_MAX_ALIGN` bytes
/// at `CA_MAX_ALIGN` and align the pointer up yourself, as the C++ adapter
/// `caching_allocator::ExecuTorchTempAllocator` does (`caching_allocator_executorch.hpp`).
///
/// The memory is not zeroed (with debug checks it is filled with 0xFF). It stays valid until
/// `ca_release`, `ca_reset` or `ca_destroy`. Thread-safe.
///
/// **`size == 0`** takes no memory: it returns a non-NULL pointer aligned to `align` that must
/// not be dereferenced, and **may be the same pointer for every such call** (releasing it is
/// allowed and does nothing). ExecuTorch's `CPUCachingAllocator` returns distinct blocks
/// instead; `ExecuTorchTempAllocator` does too (it asks for 1 byte).
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`.
#[no_mangle]
pub unsafe extern "C" fn ca_allocate(
    a: *mut CaAllocator,
    size: usize,
    align: usize,
) -> *mut c_void {
    const FUNCTION: &str = "ca_allocate";
    let allocate = |inner: &CachingAllocator| {
        inner
            .allocate(size, align)
            .map_err(|e| messages::failure(&e, inner, FUNCTION))
    };
    // SAFETY: `a` is NULL or live, by this function's contract.
    unsafe { call_on(a, FUNCTION, allocate) }.map_or(core::ptr::null_mut(), |p| p.as_ptr().cast())
}

/// Gives one block from `ca_allocate` back to the cache. Thread-safe, from any thread.
///
/// The pointer is checked against the allocator's books without reading the memory behind it:
/// a pointer that is not live (never handed out by `a`, released twice, taken back by
/// `ca_reset`) gives `CA_STATUS_UNKNOWN_POINTER` and changes nothing. NULL gives
/// `CA_STATUS_NULL_ARGUMENT`. With debug checks, a block written past its requested size gives
/// `CA_STATUS_CORRUPTED` (it goes back to the system, not to the cache).
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`. If `ptr` is live in `a`, nothing uses the
/// memory behind it after this call.
#[no_mangle]
pub unsafe extern "C" fn ca_release(a: *mut CaAllocator, ptr: *mut c_void) -> CaStatus {
    const FUNCTION: &str = "ca_release";
    let release = |inner: &CachingAllocator| {
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| {
            Failure::new(
                CaStatus::NullArgument,
                "ptr is NULL: pass a block from ca_allocate",
            )
        })?;
        // SAFETY: the caller promises nothing uses the block after this call if it is live;
        // the core checks the pointer against its books without dereferencing it otherwise.
        unsafe { inner.release(ptr) }.map_err(|e| messages::failure(&e, inner, FUNCTION))
    };
    // SAFETY: `a` is NULL or live, by this function's contract.
    status(unsafe { call_on(a, FUNCTION, release) })
}

/// Every live block, handed out on any thread, goes back to the cache (ExecuTorch's temp
/// allocator `reset()`). With debug checks, if blocks were written past their requested size,
/// they go back to the system, every other block is still reset, and the result is
/// `CA_STATUS_CORRUPTED`.
///
/// Other threads may be inside any call on `a` meanwhile (see the crate docs for which of
/// their concurrent allocations survive).
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`. No block handed out before this call is
/// used or released after it.
#[no_mangle]
pub unsafe extern "C" fn ca_reset(a: *mut CaAllocator) -> CaStatus {
    const FUNCTION: &str = "ca_reset";
    let reset = |inner: &CachingAllocator| {
        // SAFETY: the caller guarantees that no block handed out before is used or released
        // after: `reset_unchecked`'s contract. An overrun found by debug checks comes back as
        // `Corrupted`, after every other block was reset.
        unsafe { inner.try_reset_unchecked() }.map_err(|e| messages::failure(&e, inner, FUNCTION))
    };
    // SAFETY: by this function's contract a non-null `a` points to a live `CaAllocator`, which
    // is `Sync`, so a shared borrow is sound while other threads use it too.
    let Some(handle) = (unsafe { a.cast_const().as_ref() }) else {
        return null_handle(FUNCTION);
    };
    let result = handle.call(FUNCTION, reset);
    // The temp plan (off by default: then this is one relaxed load). The interval ended even
    // if debug checks found an overrun, so it is recorded either way.
    if handle.plan.is_recording() {
        let _ = handle.call(FUNCTION, |inner| {
            handle.plan.record(inner.stats().last_interval_peak_bytes);
            Ok(())
        });
    }
    status(result)
}

/// Starts a temp plan: from the next `ca_reset` on, the high-water mark of every reset
/// interval (`CaStats::last_interval_peak_bytes`; with ExecuTorch, whose runtime resets the
/// temp allocator after every kernel: the scratch of every kernel call) is recorded, in the
/// order of the resets, keeping the first `capacity` entries (later ones count in
/// `CaPlanInfo::max_bytes` and `dropped`). Clears an earlier plan. The buffer is allocated
/// here, once: recording allocates nothing. `CA_STATUS_OUT_OF_MEMORY` if it cannot be.
///
/// Off by default; `ca_allocate` is never affected, and while no plan records, `ca_reset`
/// costs one atomic load more. With resets on several threads at once, entries follow the
/// order the resets finished in.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`.
#[no_mangle]
pub unsafe extern "C" fn ca_plan_start(a: *mut CaAllocator, capacity: usize) -> CaStatus {
    const FUNCTION: &str = "ca_plan_start";
    // SAFETY: `a` is NULL or live, by this function's contract.
    let Some(handle) = (unsafe { a.cast_const().as_ref() }) else {
        return null_handle(FUNCTION);
    };
    status(handle.call(FUNCTION, |_| {
        handle.plan.start(capacity).map_err(|_| {
            Failure::new(
                CaStatus::OutOfMemory,
                format!(
                    "no memory for a plan of {capacity} entries: pass a smaller capacity \
                     (the maximum is kept whatever the capacity)"
                ),
            )
        })
    }))
}

/// Stops recording the temp plan; what it holds stays readable with `ca_plan_read`.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`.
#[no_mangle]
pub unsafe extern "C" fn ca_plan_stop(a: *mut CaAllocator) -> CaStatus {
    const FUNCTION: &str = "ca_plan_stop";
    // SAFETY: `a` is NULL or live, by this function's contract.
    let Some(handle) = (unsafe { a.cast_const().as_ref() }) else {
        return null_handle(FUNCTION);
    };
    status(handle.call(FUNCTION, |_| {
        handle.plan.stop();
        Ok(())
    }))
}

/// Reads the temp plan: fills `*info`, and copies the first `min(peaks_len, info->stored)`
/// interval peaks (bytes, in the order run) into `peaks`. `peaks` may be NULL when
/// `peaks_len` is 0 (to read `info` only). `CA_STATUS_NULL_ARGUMENT` if `info` is NULL, or
/// `peaks` is NULL with `peaks_len` > 0. Thread-safe.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`; `info` is NULL or valid for writing a
/// `CaPlanInfo`; `peaks` is NULL or valid for writing `peaks_len` `size_t`s.
#[no_mangle]
pub unsafe extern "C" fn ca_plan_read(
    a: *const CaAllocator,
    peaks: *mut usize,
    peaks_len: usize,
    info: *mut CaPlanInfo,
) -> CaStatus {
    const FUNCTION: &str = "ca_plan_read";
    // SAFETY: `a` is NULL or live, by this function's contract.
    let Some(handle) = (unsafe { a.as_ref() }) else {
        return null_handle(FUNCTION);
    };
    status(handle.call(FUNCTION, |_| {
        if info.is_null() || (peaks.is_null() && peaks_len > 0) {
            return Err(Failure::new(
                CaStatus::NullArgument,
                "info is NULL, or peaks is NULL with peaks_len > 0: pass a CaPlanInfo to fill \
                 (and an array of peaks_len size_t, or peaks_len 0)",
            ));
        }
        let out: &mut [usize] = if peaks_len == 0 {
            &mut []
        } else {
            // SAFETY: non-null, and the caller guarantees it is valid for writing `peaks_len`
            // `size_t`s (`usize` has `size_t`'s size and alignment: `usize_is_size_t`).
            unsafe { core::slice::from_raw_parts_mut(peaks, peaks_len) }
        };
        let s = handle.plan.read(out);
        let filled = CaPlanInfo {
            stored: s.stored,
            intervals: s.intervals,
            dropped: s.dropped,
            max_bytes: s.max_bytes,
            recording: s.recording,
        };
        // SAFETY: non-null, and the caller guarantees it is valid for writing a `CaPlanInfo`;
        // `write_unaligned` needs no alignment and drops nothing (plain data).
        unsafe { info.write_unaligned(filled) };
        Ok(())
    }))
}

/// Gives every idle cached block back to the system. Thread-safe.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`.
#[no_mangle]
pub unsafe extern "C" fn ca_free_cached(a: *mut CaAllocator) -> CaStatus {
    const FUNCTION: &str = "ca_free_cached";
    let free_cached = |inner: &CachingAllocator| {
        inner.free_cached();
        Ok(())
    };
    // SAFETY: `a` is NULL or live, by this function's contract.
    status(unsafe { call_on(a, FUNCTION, free_cached) })
}

/// Gives least recently used idle blocks back to the system until at most `keep_bytes` stay
/// cached. Thread-safe.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`.
#[no_mangle]
pub unsafe extern "C" fn ca_trim(a: *mut CaAllocator, keep_bytes: usize) -> CaStatus {
    const FUNCTION: &str = "ca_trim";
    let trim = |inner: &CachingAllocator| {
        inner.trim(keep_bytes);
        Ok(())
    };
    // SAFETY: `a` is NULL or live, by this function's contract.
    status(unsafe { call_on(a, FUNCTION, trim) })
}

/// Fills `*out` with a snapshot of the allocator's counters. Thread-safe (while other threads
/// allocate, the counters are not all of one instant). `CA_STATUS_NULL_ARGUMENT` if `out` is
/// NULL.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`; `out` is NULL or valid for writing a
/// `CaStats`.
#[no_mangle]
pub unsafe extern "C" fn ca_stats(a: *const CaAllocator, out: *mut CaStats) -> CaStatus {
    const FUNCTION: &str = "ca_stats";
    let fill = |inner: &CachingAllocator| {
        if out.is_null() {
            return Err(Failure::new(
                CaStatus::NullArgument,
                "out is NULL: pass a CaStats to fill",
            ));
        }
        let stats = CaStats::from(inner.stats());
        // SAFETY: non-null, and the caller guarantees it is valid for writing a `CaStats`;
        // `write_unaligned` needs no alignment and drops nothing (the type is plain data).
        unsafe { out.write_unaligned(stats) };
        Ok(())
    };
    // SAFETY: `a` is NULL or live, by this function's contract.
    status(unsafe { call_on(a, FUNCTION, fill) })
}

/// The calling thread's last failure on `a` (with `a == NULL`: its last failure that had no
/// handle: `ca_create`, `ca_destroy`, or any call given a NULL handle). `code` is
/// `CA_STATUS_OK` if there was none.
///
/// Like `errno`, a successful call does not clear it: read it right after a call that failed.
/// Each thread has its own last error on each handle, so threads never see each other's.
///
/// # Safety
/// `a` is NULL or a live handle from `ca_create`.
#[no_mangle]
pub unsafe extern "C" fn ca_last_error(a: *const CaAllocator) -> CaError {
    // SAFETY: `a` is NULL or live, by this function's contract.
    let (code, message) = match unsafe { a.as_ref() } {
        Some(a) => a.errors.get(),
        None => last_error::get_without_handle(),
    };
    CaError { code, message }
}

/// Whether a Rust panic caught inside a `ca_*` call is also printed to stderr (with a backtrace
/// if `RUST_BACKTRACE` is set), as Rust prints panics. Off by default: the panic reaches the
/// caller only as `CA_STATUS_INTERNAL` and its message in `ca_last_error`. Without a call to
/// this function the environment decides: `CA_PANIC_OUTPUT=1` turns printing on.
///
/// Only panics raised while the calling thread is inside a `ca_*` call are affected; panics of
/// the host's own Rust code print as before. The library installs its panic hook (which passes
/// every other panic on to the hook installed before it) on the first `ca_*` call that can
/// panic; a hook the host installs after that replaces it, and caught panics print again.
/// Thread-safe; applies to the whole process.
#[no_mangle]
pub extern "C" fn ca_set_panic_output(print: bool) {
    panic_output::set_print(print);
}

/// The name of a status code, e.g. `"CA_STATUS_LIMIT_EXCEEDED"`, as a constant string; for a
/// value that is no `CaStatus`, `"CA_STATUS_UNKNOWN"`. Never NULL.
#[no_mangle]
pub extern "C" fn ca_status_name(code: c_int) -> *const c_char {
    CaStatus::ALL
        .iter()
        .find(|s| **s as c_int == code)
        .map_or(c"CA_STATUS_UNKNOWN", |s| s.name())
        .as_ptr()
}
