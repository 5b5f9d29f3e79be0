//! Chat prompts: a model's Jinja chat template (`tokenizer.chat_template`) rendered with
//! `minijinja` for one user message and the generation prompt, as HF's
//! `apply_chat_template(..., add_generation_prompt=True)` does.

use crate::error::{LlmError, Result};

/// Renders `template` for one user message `user`, with `add_generation_prompt` true and the
/// model's `bos_token` / `eos_token` texts.
pub fn render_user_prompt(template: &str, user: &str, bos: &str, eos: &str) -> Result<String> {
    let bad = |e: minijinja::Error| LlmError::Tokenizer {
        message: format!("chat template: {e}"),
    };
    let mut env = minijinja::Environment::new();
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template("chat", template).map_err(bad)?;
    let t = env.get_template("chat").map_err(bad)?;
    t.render(minijinja::context! {
        messages => vec![minijinja::context! { role => "user", content => user }],
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(bad)
}
