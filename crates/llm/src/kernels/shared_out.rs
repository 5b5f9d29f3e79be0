//! A raw output pointer that the tasks of one parallel section share, each writing its own
//! disjoint elements.

/// A `*mut f32` shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: only used by `prefill` and `row_jobs::run`, whose tasks write disjoint elements
// (distinct output columns or row chunks) of buffers that outlive the parallel section.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the `Send` wrapper, not the raw field).
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}
