//! Huge pages for big blocks (`Config::huge_pages`): 2 MiB alignment, `MADV_HUGEPAGE` on Linux,
//! and what the kernel made of it in `/proc/self/smaps`.

use caching_allocator::{CachingAllocator, Config};

const MIB: usize = 1 << 20;

/// `AnonHugePages` of the mapping that contains `addr`, in bytes, if `/proc/self/smaps` says.
fn anon_huge_pages(addr: usize) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                let kib: usize = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(kib * 1024);
            }
        }
    }
    None
}

/// The kernel's transparent-huge-page mode (`always`, `madvise` or `never`), if it says.
fn thp_mode() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_string())
}

#[test]
fn big_blocks_are_huge_page_aligned_and_advised() {
    let alloc = CachingAllocator::new(64 * MIB);
    let p = alloc.allocate(8 * MIB, 64).unwrap();
    assert_eq!(p.as_ptr() as usize % (2 * MIB), 0, "not 2 MiB-aligned");
    // Below the threshold: ordinary blocks.
    let small = alloc.allocate(MIB, 64).unwrap();
    let s = alloc.stats();
    if cfg!(target_os = "linux") && !cfg!(miri) && thp_mode().is_some_and(|m| m != "never") {
        assert_eq!(s.huge_page_bytes, 8 * MIB, "{s:?}");
        // Touch every page, then ask the kernel what backs the block.
        // SAFETY: a live block of 8 MiB, ours alone.
        unsafe { p.as_ptr().write_bytes(1, 8 * MIB) };
        match anon_huge_pages(p.as_ptr() as usize) {
            Some(0) => eprintln!(
                "skipped the AnonHugePages check: the kernel advised but gave no huge page \
                 (none free, or defragmentation off)"
            ),
            Some(bytes) => assert!(bytes >= 2 * MIB, "AnonHugePages {bytes}"),
            None => eprintln!("skipped the AnonHugePages check: no /proc/self/smaps entry"),
        }
    } else {
        eprintln!("skipped: no transparent huge pages here (not Linux, Miri, or THP never)");
        assert_eq!(s.huge_page_bytes, 0);
    }
    // SAFETY: released once, not used after.
    unsafe {
        alloc.release(p).unwrap();
        alloc.release(small).unwrap();
    }
    // The advice stays with the block while it is cached, and leaves with it.
    let advised = alloc.stats().huge_page_bytes;
    alloc.free_cached();
    let s = alloc.stats();
    assert_eq!(s.huge_page_bytes, 0, "advised {advised}: {s:?}");
}

#[test]
fn huge_pages_can_be_turned_off() {
    let alloc = CachingAllocator::with_config(Config::default().huge_pages(None));
    let blocks: Vec<_> = (0..4)
        .map(|_| alloc.allocate(8 * MIB, 64).unwrap())
        .collect();
    assert_eq!(alloc.stats().huge_page_bytes, 0);
    // Without the forced alignment, glibc's 8 MiB blocks (mmap'd, 16 bytes past a page) are
    // not 2 MiB-aligned; at least one of four shows it.
    assert!(
        blocks
            .iter()
            .any(|p| !(p.as_ptr() as usize).is_multiple_of(2 * MIB)),
        "every block 2 MiB-aligned with huge pages off"
    );
    for p in blocks {
        // SAFETY: released once, not used after.
        unsafe { alloc.release(p) }.unwrap();
    }
}
