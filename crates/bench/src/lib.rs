//! `allocbench`: side-by-side scratch-memory benchmarks of this project's caching allocator
//! against every allocator a kernel author would otherwise pick.
//!
//! The binary (`cargo run --release`) is the front end; this library holds the pieces so that
//! tests and later subcommands can reuse them:
//!
//! - [`source`]: the scratch sources behind one trait ([`source::ScratchSource`] /
//!   [`source::ScratchWorker`]), each also a [`caching_allocator::TempAllocator`];
//! - [`workload`]: the scratch patterns (`scratch` mixes, SDPA `decode`);
//! - [`harness`]: timing, page faults, system allocations, peak RSS;
//! - [`suite`]: which (workload, threads) runs a subcommand makes, and running them;
//! - [`steps`]: the interleaved-steps run loop of the kernel benchmarks (`sdpa`, `llm`);
//! - [`report`] and [`plot`]: tables, targets, JSON and SVG, one path for every benchmark;
//! - [`sdpa`]: the attention kernel over a model with every source, and its efficiency;
//! - [`llm`]: a whole Llama-family model generating with every temp-memory source;
//! - [`soak`]: random kernel-like traffic on one shared allocator, every block's tag checked.

pub mod command;
pub mod harness;
pub mod llm;
pub mod os;
pub mod output;
pub mod parts;
pub mod plot;
pub mod report;
pub mod sdpa;
pub mod soak;
pub mod source;
pub mod steps;
pub mod suite;
pub mod summary;
pub mod workload;
