//! The `llm` section of the report: the comparison, efficiency and scratch-profile tables, the
//! headline, the developers' targets and the JSON.

use comfy_table::Table;
use serde_json::json;

use super::{LlmConfig, LlmRun, SAMPLED_TEMPERATURE, SAMPLED_TOP_P};
use crate::harness::Measurement;
use crate::report::{
    comparison_table, efficiency_check, find, goal, pct, table, within_static, Column, RunInfo,
    Section, TargetCheck, CACHING,
};
use llm::scratch_profile::ScratchProfile;

/// What ran, as the report describes it.
pub(super) struct Setup<'a> {
    pub(super) cfg: &'a LlmConfig,
    pub(super) arch: String,
    pub(super) isa: String,
    pub(super) threads: usize,
}

/// Tokens per second of a row, from its median step.
fn tok_s(cfg: &LlmConfig, m: &Measurement) -> f64 {
    let tokens = if m.unit == "prefill" {
        cfg.prompt_tokens as f64
    } else {
        1.0
    };
    tokens * m.calls_per_sec
}

/// The report's section of run `r` and its scratch `profile`: the comparison, efficiency and
/// scratch-profile tables, the targets and the JSON; the weights took `ready_s` seconds to
/// load or generate.
pub(super) fn section(
    s: &Setup<'_>,
    r: LlmRun,
    profile: Option<&ScratchProfile>,
    info: &RunInfo,
    ready_s: f64,
) -> Section {
    let cfg = s.cfg;
    let rate = |m: &Measurement| format!("{:.1}", tok_s(cfg, m));
    let temp = |m: &Measurement| format!("{:.0}", m.temp_bytes_per_call.unwrap_or(0.0));
    let comparison = comparison_table(
        &r.rows,
        &[Column::new("tok/s", &rate)],
        &[Column::new("temp B/token", &temp)],
    );
    let headline = headline(&r.rows);
    let sampling = format!(
        "temperature {SAMPLED_TEMPERATURE}, top-p {SAMPLED_TOP_P}, seed {}",
        cfg.seed
    );
    let mut blocks = vec![
        format!(
            "{} measured rounds after 1 warm-up; {} rayon threads, kernels {}; weights ready in \
             {ready_s:.1} s\nmodel: {}\nround: prefill of {} tokens, then {} decode tokens \
             greedy (llm-decode) and {} more sampled ({sampling}: llm-decode-sampled), \
             interleaved across sources",
            cfg.rounds,
            s.threads,
            s.isa,
            s.arch,
            cfg.prompt_tokens,
            cfg.decode_tokens,
            cfg.decode_tokens,
        ),
        format!(
            "Allocator comparison (median step; x static / x caching: median of step-by-step \
             ratios over the same interleaved steps; temp bytes, faults and system allocations \
             per token):\n\n{comparison}"
        ),
        headline.join("\n"),
        format!(
            "Efficiency (caching source, alternating turns with the baseline):\n\n{}",
            efficiency_table(&r, cfg.prompt_tokens)
        ),
    ];
    if let Some(p) = profile {
        blocks.push(format!(
            "Scratch profile (caching source; one prefill of {} tokens and {} decode tokens, \
             every token sampled ({sampling}); greedy sampling takes no scratch; per token: \
             over the prompt's tokens for prefill, per decode step):\n\n{}",
            cfg.prompt_tokens,
            cfg.decode_tokens,
            profile_table(p, cfg.prompt_tokens, cfg.decode_tokens)
        ));
    }
    blocks.extend(r.errors.iter().map(|e| format!("not measured: {e}")));
    let workloads = [
        (
            "llm-prefill",
            format!(
                "{}: prefill of {} tokens + sampling",
                cfg.model, cfg.prompt_tokens
            ),
        ),
        (
            "llm-decode",
            format!(
                "{}: one decode token (forward + greedy sampling), {} per round",
                cfg.model, cfg.decode_tokens
            ),
        ),
        (
            "llm-decode-sampled",
            format!(
                "{}: one decode token (forward + sampling: {sampling}), {} per round after \
                 llm-decode's",
                cfg.model, cfg.decode_tokens
            ),
        ),
    ];
    let fields = json!({
        "sgemm_threads": crate::measure::sgemm_threads(),
        "kernels": s.isa,
        "config": cfg,
        "sampled": {"temperature": SAMPLED_TEMPERATURE, "top_p": SAMPLED_TOP_P, "seed": cfg.seed},
        "architecture": s.arch,
        "workloads": workloads.iter().map(|(n, d)| json!({"name": n, "step": d})).collect::<Vec<_>>(),
        "headline": headline,
        "efficiency": r.efficiency_json(),
        "scratch_profile": profile.map(|p| p.to_json(cfg.prompt_tokens, cfg.decode_tokens)),
    });
    let mut out = Section {
        title: "llm: a whole model generating".into(),
        blocks,
        targets: targets(&r, s.threads),
        rows: r.rows,
        ..Section::default()
    }
    .with_json("llm", info, fields);
    if let Some((_, j)) = &mut out.json {
        for (k, m) in out.rows.iter().enumerate() {
            j["measurements"][k]["tokens_per_second"] = json!(tok_s(cfg, m));
        }
    }
    out
}

/// The efficiency table, as Markdown.
fn efficiency_table(r: &LlmRun, prompt_tokens: usize) -> Table {
    let decode = r.decode_eff.as_ref().map(|d| {
        let mib = d.weight_bytes as f64 / (1 << 20) as f64;
        let cells = vec![
            "decode".into(),
            format!("{:.2} GB/s of weights ({mib:.1} MiB/token)", d.decode_gbs),
            format!("streaming read {:.2} GB/s", d.stream_gbs),
        ];
        (cells, d.ratios)
    });
    let prefill = r.prefill_eff.as_ref().map(|p| {
        let (m, k, n) = p.sgemm_shape;
        let cells = vec![
            format!("prefill {prompt_tokens}"),
            format!("{:.1} GFLOP/s", p.prefill_gflops),
            format!("sgemm {m}x{k}x{n} {:.1} GFLOP/s", p.sgemm_gflops),
        ];
        (cells, p.ratios)
    });
    let header = ["phase", "model", "baseline"];
    crate::report::efficiency_table(&header, decode.into_iter().chain(prefill), 5)
}

/// The scratch profile as a table: per phase and kernel name, the calls, the largest scratch
/// one call took and the scratch per token (the phase's prompt or decode tokens).
pub fn profile_table(p: &ScratchProfile, prefill_tokens: usize, decode_tokens: usize) -> Table {
    let rows = p.entries().iter().map(|e| {
        let tokens = if e.phase == "decode" {
            decode_tokens
        } else {
            prefill_tokens
        };
        vec![
            e.phase.to_string(),
            e.kernel.to_string(),
            e.calls.to_string(),
            e.max_call_bytes.to_string(),
            format!("{:.0}", e.total_bytes as f64 / tokens.max(1) as f64),
        ]
    });
    let header = ["phase", "kernel", "calls", "max call B", "B/token"];
    table(&header, rows, 2)
}

/// The headline: what `caching` buys against `system`, `fresh-pages` and `exact-cache`, per
/// phase (their time over `caching`'s, median over the same steps).
fn headline(rows: &[Measurement]) -> Vec<String> {
    let mut out = Vec::new();
    for phase in ["llm-decode", "llm-decode-sampled", "llm-prefill"] {
        for rival in ["system", "fresh-pages", "exact-cache"] {
            if let Some(x) = find(rows, phase, rival).and_then(|r| r.x_caching) {
                out.push(format!(
                    "{phase}: {rival} takes {x:.3}x caching's time (median of step-by-step \
                     ratios)"
                ));
            }
        }
    }
    out
}

/// The developers' targets, met or missed as measured on `threads` threads.
fn targets(r: &LlmRun, threads: usize) -> Vec<TargetCheck> {
    let mut out = within_static(&r.rows, goal::LLM_WITHIN_STATIC, &[CACHING], false);
    for phase in ["llm-decode", "llm-decode-sampled", "llm-prefill"] {
        let Some(m) = r
            .rows
            .iter()
            .find(|m| m.workload == phase && m.source == CACHING)
        else {
            continue;
        };
        out.push(TargetCheck {
            target: format!("caching: 0 page faults and 0 system allocations per token on {phase}"),
            measured: format!(
                "{:.3} faults/token, {} system allocations/token",
                m.faults_per_call,
                m.sys_allocs_per_call
                    .map_or_else(|| "?".into(), |x| format!("{x:.3}"))
            ),
            met: Some(m.faults_per_call == 0.0 && m.sys_allocs_per_call == Some(0.0)),
        });
    }
    if let Some(d) = &r.decode_eff {
        let goal = goal::LLM_DECODE_STREAM;
        let target = format!("decode >= {} of the weight-streaming bound", pct(goal));
        let figures = [d.decode_gbs, d.stream_gbs].map(|x| format!("{x:.2} GB/s"));
        out.push(efficiency_check(
            format!("{target} ({threads} threads)"),
            figures,
            d.ratios,
            goal,
        ));
    }
    if let Some(p) = &r.prefill_eff {
        let goal = goal::LLM_PREFILL_SGEMM;
        let target = format!(
            "prefill >= {} of sgemm GFLOP/s ({threads} threads)",
            pct(goal)
        );
        let figures = [p.prefill_gflops, p.sgemm_gflops].map(|x| format!("{x:.1} GFLOP/s"));
        out.push(efficiency_check(target, figures, p.ratios, goal));
    }
    out
}
