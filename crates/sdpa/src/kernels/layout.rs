//! How the kernels address their operands: strided rows, and the query heads' grouping over
//! the KV heads. A module of its own (it imports nothing) so that every kernel file can use
//! it without importing another kernel file.

/// The rows of a matrix in memory: where row 0 starts and the row stride in elements (row `r`
/// starts `r * stride` elements after row 0). The tile kernels take a pointer to row 0; the
/// row kernels take a slice from row 0 on, which they check holds every row they touch.
#[derive(Clone, Copy)]
pub(crate) struct Strided<P>(pub P, pub usize);

/// How the query heads of a row call share the KV heads: `d` lanes per head vector, `group`
/// query heads per KV head (query head `h` reads KV head `h / group`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupedHeads {
    pub d: usize,
    pub group: usize,
}
