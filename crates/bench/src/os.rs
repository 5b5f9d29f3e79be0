//! What the operating system can tell about the process: page faults, resident memory, the
//! machine.

use std::fs;

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
