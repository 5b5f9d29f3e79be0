//! `allocbench` (work in progress).
fn main() {}
