//! Random sequences of allocator calls, checked against the model in
//! `crates/caching-allocator/tests/common/ops.rs` after every call.
//!
//! `cargo +nightly fuzz run ops` from this directory; interesting inputs land in
//! `corpus/ops/`, which `cargo test -p caching-allocator --test fuzz_ops` replays on stable.
#![no_main]

#[path = "../../crates/caching-allocator/tests/common/books.rs"]
mod books;
#[path = "../../crates/caching-allocator/tests/common/counting.rs"]
mod counting;
#[path = "../../crates/caching-allocator/tests/common/ops.rs"]
mod ops;

libfuzzer_sys::fuzz_target!(|data: &[u8]| ops::run_bytes(data));
