//! `allocbench`: side-by-side scratch-memory benchmarks of this project's caching allocator
//! against every allocator a kernel author would otherwise pick.
//!
//! The binary (`cargo run --release`) parses its arguments and hands over to [`command`];
//! this library holds the pieces, so that tests and examples reuse them:
//!
//! - [`suite`]: what a command runs, as [`suite::Suite`]s; [`parts`]: each in a fresh process;
//! - [`command`]: one command from start to end (suites, summary, details, files);
//! - [`summary`]: the table a user reads first; [`output`]: the JSON and plot files;
//! - [`source`]: the scratch sources behind one trait ([`source::ScratchSource`] /
//!   [`source::ScratchWorker`]), each also a [`caching_allocator::TempAllocator`];
//! - [`workload`]: the scratch patterns (`scratch` mixes, SDPA `decode`);
//! - [`harness`]: the scratch workloads' rounds on threads;
//! - [`steps`]: the interleaved-steps run loop of the kernel benchmarks (`sdpa`, `llm`);
//! - [`measure`]: statistics, timing in turns, the machine's limits (streaming read, sgemm),
//!   page faults, RSS, malloc settings, the thread pools and the machine;
//! - [`report`]: a report is made of [`report::Section`]s, one per benchmark (tables, targets,
//!   JSON), and [`plot`] draws their rows; [`scratch_report`]: the scratch workloads' section;
//! - [`sdpa`]: the attention kernel over a model with every source, and its efficiency;
//! - [`llm`]: a whole Llama-family model generating with every temp-memory source, and its
//!   kernels' scratch profile;
//! - [`soak`]: random kernel-like traffic on one shared allocator, every block's tag checked.

pub mod command;
pub mod harness;
pub mod llm;
pub mod measure;
pub mod output;
pub mod parts;
pub mod plot;
pub mod report;
pub mod scratch_report;
pub mod sdpa;
pub mod soak;
pub mod source;
pub mod steps;
pub mod suite;
pub mod summary;
pub mod workload;
