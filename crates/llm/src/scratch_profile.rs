//! The scratch profile: per phase (prefill, decode) and kernel name, how many calls ran, the
//! most scratch one call took and the total: the per-kernel high-water marks an
//! ahead-of-time memory planner needs. Each entry also carries the calls' wall time, so the
//! same table says which kernels a token's time goes to.

/// What one kernel name took from the temp allocator in one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KernelScratch {
    /// `prefill` or `decode` (the forward pass the call belonged to).
    pub phase: &'static str,
    /// The kernel name the runtime ran it under.
    pub kernel: &'static str,
    /// Calls.
    pub calls: u64,
    /// The most bytes one call requested.
    pub max_call_bytes: u64,
    /// Bytes requested over all calls.
    pub total_bytes: u64,
    /// Wall time of all calls, in nanoseconds (the kernel and its parallel section, not the
    /// reset after it).
    pub total_nanos: u64,
}

/// Per-(phase, kernel) scratch counters. Recording allocates only the first time a (phase,
/// kernel) pair is seen.
#[derive(Clone, Debug, Default)]
pub struct ScratchProfile {
    entries: Vec<KernelScratch>,
}

impl ScratchProfile {
    /// Adds one call of `kernel` in `phase` that requested `bytes` and ran `nanos`.
    pub fn record(&mut self, phase: &'static str, kernel: &'static str, bytes: u64, nanos: u64) {
        let i = match self
            .entries
            .iter()
            .position(|e| e.phase == phase && e.kernel == kernel)
        {
            Some(i) => i,
            None => {
                self.entries.push(KernelScratch {
                    phase,
                    kernel,
                    ..KernelScratch::default()
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        e.calls += 1;
        e.max_call_bytes = e.max_call_bytes.max(bytes);
        e.total_bytes += bytes;
        e.total_nanos += nanos;
    }

    /// Every (phase, kernel) seen, in first-seen order.
    pub fn entries(&self) -> &[KernelScratch] {
        &self.entries
    }

    /// The profile as JSON: each entry with its bytes per token (`total_bytes` over the
    /// phase's tokens: prompt tokens for prefill, decode steps for decode).
    pub fn to_json(&self, prefill_tokens: usize, decode_tokens: usize) -> serde_json::Value {
        let per = |phase: &str| {
            if phase == "decode" {
                decode_tokens
            } else {
                prefill_tokens
            }
        };
        let kernels: Vec<serde_json::Value> = self
            .entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "phase": e.phase,
                    "kernel": e.kernel,
                    "calls": e.calls,
                    "max_call_bytes": e.max_call_bytes,
                    "total_bytes": e.total_bytes,
                    "bytes_per_token": e.total_bytes as f64 / per(e.phase).max(1) as f64,
                    "total_ms": e.total_nanos as f64 / 1e6,
                    "us_per_token": e.total_nanos as f64 / 1e3 / per(e.phase).max(1) as f64,
                })
            })
            .collect();
        serde_json::json!({
            "prefill_tokens": prefill_tokens,
            "decode_tokens": decode_tokens,
            "max_call_bytes": self.entries.iter().map(|e| e.max_call_bytes).max().unwrap_or(0),
            "kernels": kernels,
        })
    }
}
