//! Scaled dot-product attention on the CPU (work in progress).
