//! Replays fuzz inputs through the op model of `common/ops.rs` on stable `cargo test`: a
//! deterministic set of seeded random inputs, and the committed corpus of inputs the `cargo
//! fuzz` target (`fuzz/`) found interesting (`fuzz/corpus/ops/`). Also runs under Miri
//! (`cargo +nightly miri test -p caching-allocator --test fuzz_ops`) with fewer inputs: the
//! seeded ones and the few corpus files embedded below (Miri's isolation forbids reading
//! directories).

#[path = "common/ops.rs"]
mod ops;

#[path = "common/counting.rs"]
mod counting;

#[path = "common/books.rs"]
mod books;

use std::path::Path;

// The seeded inputs come from this generator, so they never change.
#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// Runs an input in every arena mode; if it fails, prints it (ops numbered as in the failure
/// message) first.
fn run_verbose(input: &ops::Input) {
    for &mode in ops::modes(input) {
        if let Err(panic) = std::panic::catch_unwind(|| ops::run(input, mode)) {
            eprintln!("failing input: {:?}, arena {mode:?}", input.config);
            for (i, op) in input.ops.iter().enumerate() {
                eprintln!("  op {i}: {op:?}");
            }
            std::panic::resume_unwind(panic);
        }
    }
}

/// How many seeded inputs, and how long each is in bytes; fewer under Miri and under the
/// sanitizers (`scripts/sanitizers.sh` sets `CA_SANITIZER`).
fn seeded() -> (usize, usize) {
    if cfg!(miri) {
        // Each input runs in three arena modes: two inputs are six runs, as many as six
        // inputs were when it ran in one.
        (2, 160)
    } else if std::env::var_os("CA_SANITIZER").is_some() {
        (40, 1500)
    } else {
        (300, 1500)
    }
}

#[test]
fn seeded_random_inputs() {
    let seeded = seeded();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut ops = 0;
    for _ in 0..seeded.0 {
        let len = 16 + rng.next() as usize % seeded.1;
        let data = rng.bytes(len);
        let input = ops::Input::from_bytes(&data).expect("long enough");
        ops += input.ops.len();
        run_verbose(&input);
    }
    // The generator must actually produce work, or this test checks nothing.
    assert!(
        ops > seeded.0 * 4,
        "seeded inputs decoded to only {ops} ops"
    );
}

/// Corpus files small enough for Miri, embedded so Miri needs no file system access: four
/// fuzzer-found inputs that between them use every op (with and without debug checks and a
/// limit), copied from `fuzz/corpus/ops/`.
const EMBEDDED: &[&[u8]] = &[
    include_bytes!("corpus/miri-1.bin"),
    include_bytes!("corpus/miri-2.bin"),
    include_bytes!("corpus/miri-3.bin"),
    include_bytes!("corpus/miri-4.bin"),
];

#[test]
fn embedded_corpus() {
    for data in EMBEDDED {
        let input = ops::Input::from_bytes(data).expect("a corpus file decodes");
        assert!(input.ops.len() >= 10);
        run_verbose(&input);
    }
}

#[test]
#[cfg_attr(miri, ignore = "Miri's isolation forbids reading the corpus directory")]
fn committed_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/ops");
    // The corpus (3 MB) lives in the repository, not in the published crate; a packaged crate's
    // tests still replay the embedded inputs above.
    if !dir.is_dir()
        && !Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz")
            .exists()
    {
        eprintln!(
            "skipped: no fuzz corpus at {} (a packaged crate ships without it; run the tests \
             from the repository to replay it)",
            dir.display()
        );
        return;
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "the corpus at {} is empty",
        dir.display()
    );
    for path in files {
        let data = std::fs::read(&path).unwrap();
        eprintln!("replaying {}", path.display());
        if let Some(input) = ops::Input::from_bytes(&data) {
            run_verbose(&input);
        }
    }
}
