//! Huge pages for big blocks: a block of at least `Config::huge_page_min_bytes` (2 MiB by
//! default) is allocated 2 MiB-aligned and, on Linux, advised `MADV_HUGEPAGE`, so the kernel
//! may back it with transparent huge pages even when THP runs in `madvise` mode (the common
//! default): one page fault and one TLB entry per 2 MiB instead of 512. Elsewhere (and under
//! Miri) the advice is a no-op; the alignment costs nothing but a little address space.
//!
//! Only the whole 2 MiB pages inside the block are advised, so the advice never reaches memory
//! outside it; the kernel may still refuse (no free huge pages, THP `never`), which costs
//! nothing but the system call.

/// A huge page on x86-64 and AArch64 Linux.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// The whole huge pages inside `[ptr, ptr + len)`: their start and length (0 if none).
pub(crate) fn whole_pages(ptr: *mut u8, len: usize) -> (usize, usize) {
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + len) & !(HUGE_PAGE - 1);
    (start, end.saturating_sub(start))
}

/// Advises the kernel to back the whole huge pages of `[ptr, ptr + len)` with huge pages.
/// Returns the bytes advised (0 where the advice does not exist or the kernel refused it).
pub(crate) fn advise(ptr: *mut u8, len: usize) -> usize {
    match whole_pages(ptr, len) {
        (_, 0) => 0,
        (start, len) => madvise_hugepage(start, len),
    }
}

#[cfg(all(target_os = "linux", not(miri)))]
fn madvise_hugepage(start: usize, len: usize) -> usize {
    // SAFETY: `[start, start + len)` lies inside a block this allocator just took from the
    // system and owns alone; MADV_HUGEPAGE changes how the kernel backs those pages, never
    // their contents or who may access them.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    if r == 0 {
        len
    } else {
        0
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn madvise_hugepage(_start: usize, _len: usize) -> usize {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_huge_pages_inside_the_range_are_advised() {
        // Addresses only: `advise` rounds before it calls the kernel, and below one huge page
        // it never does.
        assert_eq!(advise(HUGE_PAGE as *mut u8, HUGE_PAGE - 1), 0);
        assert_eq!(advise((HUGE_PAGE + 64) as *mut u8, HUGE_PAGE), 0);
        assert_eq!(
            whole_pages((HUGE_PAGE + 64) as *mut u8, 3 * HUGE_PAGE),
            (2 * HUGE_PAGE, 2 * HUGE_PAGE)
        );
        assert_eq!(
            whole_pages(HUGE_PAGE as *mut u8, 3 * HUGE_PAGE),
            (HUGE_PAGE, 3 * HUGE_PAGE)
        );
    }
}
