//! `llm`: generate text with a Llama-family checkpoint on the CPU, or benchmark a named shape
//! with random weights. See `llm --help`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use llm::safetensors::DType;
use llm::tokenizer::{TextStream, Tokenizer};
use llm::{
    caching_temp, generate, Activations, GenerateOptions, GenerationStats, Llama, LlmError,
    ModelOptions, Module, Sampler, Weights,
};

/// A Llama-family CPU text generator whose kernels take their scratch from a caching temp
/// allocator.
#[derive(Parser, Debug)]
#[command(name = "llm", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate from a GGUF file (FILE.gguf: weights, tokenizer and chat template) or a
    /// checkpoint directory (config.json, *.safetensors, tokenizer.json). Only the generated
    /// text goes to stdout; timings go to stderr.
    Generate {
        /// The model: a .gguf file or a directory.
        #[arg(long, value_name = "FILE.gguf|DIR")]
        model: PathBuf,
        /// Write the kernels' scratch profile (per phase and kernel: calls, largest call,
        /// total, per token, and wall time) to this JSON file, and print it as a table on
        /// stderr.
        #[arg(long, value_name = "FILE.json")]
        scratch_profile: Option<PathBuf>,
        /// Treat the prompt as one user message of a chat: render the model's chat template
        /// (GGUF `tokenizer.chat_template`) with the generation prompt.
        #[arg(long)]
        chat: bool,
        /// The prompt text (needs tokenizer.json).
        #[arg(long, value_name = "TEXT", conflicts_with = "prompt_ids")]
        prompt: Option<String>,
        /// The prompt as comma-separated token ids (output is ids too, comma-separated).
        #[arg(long, value_name = "IDS", value_delimiter = ',')]
        prompt_ids: Option<Vec<u32>>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Prefill and decode tokens/s on random prompt ids: real weights (--model FILE.gguf or
    /// DIR), or a named shape with random weights (seeded).
    Bench {
        /// Real weights: a .gguf file or a checkpoint directory (instead of --shape).
        #[arg(long, value_name = "FILE.gguf|DIR")]
        model: Option<PathBuf>,
        /// smollm2-135m or llama-3.2-1b.
        #[arg(long, default_value = "smollm2-135m")]
        shape: String,
        /// Prompt length.
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        /// Weight dtype: bf16, f16 or f32.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        #[command(flatten)]
        run: RunArgs,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling threshold (1 keeps every token).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Sampling (and, for bench, weight) seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// KV-cache positions (default: min(max_position_embeddings, 4096)).
    #[arg(long)]
    context: Option<usize>,
    /// Cap of the caching temp allocator, in MiB (ExecuTorch's runner: 10).
    #[arg(long, default_value_t = 10)]
    temp_cap_mib: usize,
    /// What the 4-bit decode matvecs multiply: `f32` (exact, the default) or `int8`
    /// (opt-in and inexact: `x` quantized per block of 32, as llama.cpp does; greedy text may
    /// differ from the exact model's).
    #[arg(long, default_value = "f32")]
    activations: Activations,
}

fn print_stats(st: &GenerationStats) {
    eprintln!(
        "prefill: {} tokens in {:.3} s = {:.1} tok/s; time to first token {:.1} ms; decode: {} \
         tokens in {:.3} s = {:.2} tok/s; stop: {:?}",
        st.prompt_tokens,
        st.prefill_s,
        st.prefill_tok_s(),
        st.time_to_first_token_s * 1e3,
        st.decode_steps,
        st.decode_s,
        st.decode_tok_s(),
        st.stop
    );
}

/// Writes the scratch profile as JSON to `path` and as a table to stderr.
fn write_profile(
    path: &Path,
    p: &llm::scratch_profile::ScratchProfile,
    st: &GenerationStats,
) -> Result<(), LlmError> {
    // The decode phase's tokens: every single-token forward (the first sample follows the
    // prefill, so decode steps = forward passes of one token).
    let json = p.to_json(st.prompt_tokens, st.decode_steps);
    std::fs::write(path, format!("{json:#}\n")).map_err(|source| LlmError::Io {
        path: path.into(),
        source,
    })?;
    eprintln!("scratch profile ({}):", path.display());
    eprintln!(
        "{:<8} {:<18} {:>8} {:>14} {:>16} {:>12} {:>7}",
        "phase", "kernel", "calls", "max call B", "per token B", "per token us", "time %"
    );
    // A kernel's share of the time of all kernel calls of its phase (what runs between the
    // calls is in no share).
    let phase_nanos = |phase: &str| -> u64 {
        p.entries()
            .iter()
            .filter(|e| e.phase == phase)
            .map(|e| e.total_nanos)
            .sum()
    };
    for e in p.entries() {
        let tokens = if e.phase == "decode" {
            st.decode_steps
        } else {
            st.prompt_tokens
        };
        eprintln!(
            "{:<8} {:<18} {:>8} {:>14} {:>16.0} {:>12.1} {:>6.1}%",
            e.phase,
            e.kernel,
            e.calls,
            e.max_call_bytes,
            e.total_bytes as f64 / tokens.max(1) as f64,
            e.total_nanos as f64 / 1e3 / tokens.max(1) as f64,
            100.0 * e.total_nanos as f64 / phase_nanos(e.phase).max(1) as f64
        );
    }
    Ok(())
}

/// A chat template with the BOS and EOS token texts.
type Template = (String, String, String);

/// The weights, the tokenizer (if the model has one) and the chat template (GGUF only) of
/// `model`: a `.gguf` file or a checkpoint directory.
fn load(model: &Path) -> Result<(Weights, Option<Tokenizer>, Option<Template>), LlmError> {
    if llm::gguf::is_gguf_path(model) {
        let f = llm::gguf::GgufFile::open(model)?;
        let weights = llm::gguf::weights_from(&f)?;
        // A file without a vocabulary runs on token ids (--prompt-ids), as a directory
        // without tokenizer.json does.
        let tokenizer = match f.get("tokenizer.ggml.model") {
            Some(_) => Some(llm::gguf_tokenizer::from_gguf(&f)?),
            None => None,
        };
        let template = llm::gguf_tokenizer::chat_template(&f).map(|t| {
            let text = |k| {
                llm::gguf_tokenizer::token_text(&f, k)
                    .unwrap_or("")
                    .to_string()
            };
            (
                t.to_string(),
                text("tokenizer.ggml.bos_token_id"),
                text("tokenizer.ggml.eos_token_id"),
            )
        });
        return Ok((weights, tokenizer, template));
    }
    let weights = Weights::load(model)?;
    let tok_path = model.join("tokenizer.json");
    let tokenizer = if tok_path.exists() {
        Some(Tokenizer::from_file(&tok_path)?)
    } else {
        None
    };
    Ok((weights, tokenizer, None))
}

fn run(cli: Cli) -> Result<(), LlmError> {
    match cli.command {
        Command::Generate {
            model,
            scratch_profile,
            chat,
            prompt,
            prompt_ids,
            run,
        } => {
            let (weights, tokenizer, template) = load(&model)?;
            let weights = Arc::new(weights);
            let prompt = match (chat, prompt) {
                (true, Some(text)) => {
                    let (t, bos, eos) = template.ok_or_else(|| LlmError::InvalidArgument {
                        message: format!("{} has no chat template: drop --chat", model.display()),
                    })?;
                    Some(llm::chat::render_user_prompt(&t, &text, &bos, &eos)?)
                }
                (_, p) => p,
            };
            let (ids, as_text) = match (&prompt, prompt_ids) {
                (Some(text), None) => match &tokenizer {
                    Some(t) => (t.encode(text)?, true),
                    None => {
                        return Err(LlmError::InvalidArgument {
                            message: format!(
                                "{} has no {}: pass --prompt-ids instead of --prompt",
                                model.display(),
                                if llm::gguf::is_gguf_path(&model) {
                                    "tokenizer (tokenizer.ggml.* metadata)"
                                } else {
                                    "tokenizer.json"
                                }
                            ),
                        })
                    }
                },
                (None, Some(ids)) => (ids, false),
                _ => {
                    return Err(LlmError::InvalidArgument {
                        message: "give --prompt TEXT or --prompt-ids 1,2,3".into(),
                    })
                }
            };
            let stop = weights.config.eos_token_ids.clone();
            let temp = caching_temp(run.temp_cap_mib << 20);
            let mut m = Llama::new(
                weights,
                temp,
                &ModelOptions {
                    context: run.context,
                    activations: run.activations,
                },
            )?;
            if scratch_profile.is_some() {
                m.enable_scratch_profile();
            }
            let mut sampler = Sampler::new(run.temperature, run.top_p, run.seed)?;
            let opts = GenerateOptions {
                max_new_tokens: run.max_new_tokens,
                stop_tokens: stop,
            };
            let mut stream = tokenizer.as_ref().map(TextStream::new);
            let stdout = std::io::stdout();
            let io = |e: std::io::Error| LlmError::Io {
                path: "<stdout>".into(),
                source: e,
            };
            // Ids go out as they came in: comma-separated, so the output can be passed back.
            let mut id_separator = "";
            // Run on a rayon worker, so kernels' parallel sections start from inside the pool.
            let st = rayon::scope(|_| {
                generate(&mut m, &ids, &mut sampler, &opts, |t| {
                    let mut out = stdout.lock();
                    match (&mut stream, as_text) {
                        (Some(s), true) => write!(out, "{}", s.push(t)?).map_err(io)?,
                        _ => {
                            write!(out, "{id_separator}{t}").map_err(io)?;
                            id_separator = ",";
                        }
                    }
                    out.flush().map_err(io)
                })
            })?;
            println!();
            print_stats(&st);
            if let (Some(path), Some(p)) = (scratch_profile, m.scratch_profile()) {
                write_profile(&path, p, &st)?;
            }
            Ok(())
        }
        Command::Bench {
            model: Some(model),
            prompt_tokens,
            run,
            ..
        } => bench_model(&model, prompt_tokens, &run),
        Command::Bench {
            model: None,
            shape,
            prompt_tokens,
            dtype,
            run,
        } => {
            let config = llm::shapes::named(&shape).ok_or_else(|| LlmError::InvalidArgument {
                message: format!("unknown shape `{shape}`; known: {:?}", llm::shapes::NAMES),
            })?;
            let dtype = match dtype.as_str() {
                "bf16" => DType::BF16,
                "f16" => DType::F16,
                "f32" => DType::F32,
                d => {
                    return Err(LlmError::InvalidArgument {
                        message: format!("dtype `{d}`: use bf16, f16 or f32"),
                    })
                }
            };
            let t0 = std::time::Instant::now();
            let weights = Arc::new(Weights::random(config, dtype, run.seed)?);
            let wbytes = weights.decode_weight_bytes();
            eprintln!(
                "{shape}: random {dtype:?} weights ({:.1} MiB read per decode step) generated in \
                 {:.1} s; {} rayon threads",
                wbytes as f64 / (1 << 20) as f64,
                t0.elapsed().as_secs_f64(),
                rayon::current_num_threads()
            );
            let BenchRun {
                mut m,
                ids,
                mut sampler,
                opts,
            } = BenchRun::new(weights, prompt_tokens, &run)?;
            let st = rayon::scope(|_| generate(&mut m, &ids, &mut sampler, &opts, |_| Ok(())))?;
            print_stats(&st);
            println!(
                "{shape} {dtype:?}: prefill {:.1} tok/s, decode {:.2} tok/s ({:.2} GB/s of \
                 weights), time to first token {:.1} ms",
                st.prefill_tok_s(),
                st.decode_tok_s(),
                wbytes as f64 * st.decode_tok_s() / 1e9,
                st.time_to_first_token_s * 1e3
            );
            Ok(())
        }
    }
}

/// What `llm bench` runs: the model over a caching temp allocator, a seeded random prompt, the
/// sampler and the generation options, from the command's arguments.
struct BenchRun {
    m: Llama<caching_allocator::CachingAllocator>,
    ids: Vec<u32>,
    sampler: Sampler,
    opts: GenerateOptions,
}

impl BenchRun {
    fn new(weights: Arc<Weights>, prompt_tokens: usize, run: &RunArgs) -> Result<Self, LlmError> {
        let vocab = weights.config.vocab_size;
        let context = run
            .context
            .unwrap_or(prompt_tokens + run.max_new_tokens + 1);
        let m = Llama::new(
            weights,
            caching_temp(run.temp_cap_mib << 20),
            &ModelOptions {
                context: Some(context),
                activations: run.activations,
            },
        )?;
        let mut rng = llm::sample::Rng::new(run.seed ^ 0x5eed);
        let ids = (0..prompt_tokens)
            .map(|_| (rng.next_u64() % vocab as u64) as u32)
            .collect();
        Ok(BenchRun {
            m,
            ids,
            sampler: Sampler::new(run.temperature, run.top_p, run.seed)?,
            opts: GenerateOptions {
                max_new_tokens: run.max_new_tokens,
                stop_tokens: Vec::new(),
            },
        })
    }
}

/// `llm bench --model`: real weights, a random prompt, and the same-run weight-streaming
/// bound the decode rate is compared against.
fn bench_model(model: &Path, prompt_tokens: usize, run: &RunArgs) -> Result<(), LlmError> {
    let t0 = std::time::Instant::now();
    let weights = Arc::new(Weights::load(model)?);
    let load_s = t0.elapsed().as_secs_f64();
    let wbytes = weights.decode_weight_bytes();
    let BenchRun {
        mut m,
        ids,
        mut sampler,
        opts,
    } = BenchRun::new(weights.clone(), prompt_tokens, run)?;
    let (st, stream_s) = rayon::scope(|_| {
        let st = generate(&mut m, &ids, &mut sampler, &opts, |_| Ok(()));
        (st, llm::bandwidth::weight_stream_seconds(&weights, 10))
    });
    let st = st?;
    print_stats(&st);
    let bound = 1.0 / stream_s;
    println!(
        "{}: loaded in {:.2} s; {} rayon threads; {} activations; prefill {:.1} tok/s, decode {:.2} tok/s, \
         time to first token {:.1} ms; weight-streaming bound {:.1} tok/s ({:.1} MB in {:.2} ms, \
         {:.1} GB/s): decode at {:.0}% of it",
        model.display(),
        load_s,
        rayon::current_num_threads(),
        run.activations.name(),
        st.prefill_tok_s(),
        st.decode_tok_s(),
        st.time_to_first_token_s * 1e3,
        bound,
        wbytes as f64 / 1e6,
        stream_s * 1e3,
        wbytes as f64 / stream_s / 1e9,
        100.0 * st.decode_tok_s() / bound
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llm: {e}");
            ExitCode::FAILURE
        }
    }
}
