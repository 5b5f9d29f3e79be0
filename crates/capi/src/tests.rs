//! Unit tests of the C ABI, calling the `extern "C"` functions as C does.
