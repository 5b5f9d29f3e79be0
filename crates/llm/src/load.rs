//! [`Weights::load`], the one entry point for both checkpoint formats. It lives here, not in
//! `weights`, because the GGUF reader builds [`Weights`]: `weights` importing `gguf` as well
//! would make the two import each other.

use std::path::Path;

use crate::error::Result;
use crate::weights::Weights;

impl Weights {
    /// Loads a model: a `.gguf` file ([`crate::gguf`]), or a directory with `config.json` and
    /// safetensors weights.
    pub fn load(path: &Path) -> Result<Weights> {
        if crate::gguf::is_gguf_path(path) {
            return crate::gguf::load_weights(path);
        }
        Self::load_dir(path)
    }
}
