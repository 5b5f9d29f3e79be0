//! Every workload, with tiny sizes, through every source, the model comparison on a tiny
//! model and a short soak; and the contract every source's worker promises (aligned, disjoint, writable
//! blocks; a working temp allocator).

use std::collections::HashMap;
use std::ptr::NonNull;

use std::time::Instant;

use allocbench::harness::{measure_all, RunConfig};
use allocbench::llm::{llm_sources, LlmConfig};
use allocbench::measure::Machine;
use allocbench::report::RunInfo;
use allocbench::source::{
    AllocError, Block, Call, ScratchSource, SourceConfig, SourceKind, TempReset, SOURCES,
};
use allocbench::workload::{Decode, Mix, Scratch, Workload};

fn all() -> Vec<&'static SourceKind> {
    SOURCES.iter().collect()
}

fn small_config() -> SourceConfig {
    SourceConfig {
        exact_cap: 64 * 1024,
        caching_cap: 8 << 20,
    }
}

#[test]
fn every_workload_runs_on_every_source() {
    let cfg = RunConfig::smoke();
    let mut tiny = Scratch::new(Mix::Small);
    tiny.sizes = vec![64, 100, 5000, 70_000];
    let workloads: Vec<(Box<dyn Workload>, usize)> = vec![
        (Box::new(tiny.clone()), 1),
        (Box::new(Decode::new(6, 2, 1)), 1),
        (Box::new(tiny), 2), // the `threads` workload: scratch on several threads
    ];
    for (w, threads) in &workloads {
        let ms = measure_all(w.as_ref(), &all(), &small_config(), *threads, &cfg, &|| {});
        assert_eq!(ms.len(), SOURCES.len());
        for m in &ms {
            assert_eq!(m.error, None, "{} on {}", m.source, m.workload);
            assert!(m.ns_per_call.median > 0.0, "{} on {}", m.source, m.workload);
            assert!(m.calls_total > 0);
            assert_eq!(m.threads, *threads);
        }
        let get = |name: &str| ms.iter().find(|m| m.source == name).unwrap();
        // Sources that allocate from the system on every call say so.
        assert!(get("system").sys_allocs_per_call.unwrap() >= 1.0);
        assert!(get("fresh-pages").faults_per_call >= 1.0);
        // After warm-up, the floor allocates nothing.
        assert_eq!(get("static").sys_allocs_per_call, Some(0.0));
    }
}

#[test]
fn decode_observation_counts_exact_cache_misses_and_caching_classes() {
    let d = Decode::new(20, 3, 2);
    let kinds: Vec<&SourceKind> = ["exact-cache", "caching", "caching-scope", "static"]
        .iter()
        .map(|n| allocbench::source::find(n).unwrap())
        .collect();
    let ms = measure_all(
        &d,
        &kinds,
        &SourceConfig::default(),
        1,
        &RunConfig::smoke(),
        &|| {},
    );
    let exact = &ms[0];
    let o = exact
        .observation
        .as_ref()
        .expect("decode observes its first round");
    // Sizes change every token, so an exact-size cache misses on every one of them.
    assert_eq!(o.tokens_below_512, 20);
    assert_eq!(o.tokens_below_512_with_miss, 20);
    assert_eq!(o.distinct_size_classes, d.distinct_size_classes());
    for m in &ms[1..3] {
        // A size-class cache allocates at most once per class over the whole run.
        let allocs = m.whole_run.system_allocs.unwrap();
        assert!(
            allocs > 0 && allocs <= d.distinct_size_classes() as u64,
            "{}: {allocs}",
            m.source
        );
    }
}

/// Fills every block with its own pattern, then checks none was overwritten by another.
fn check_blocks(blocks: &[Block], sizes: &[usize], align: usize) {
    assert_eq!(blocks.len(), sizes.len());
    for (i, (b, &size)) in blocks.iter().zip(sizes).enumerate() {
        assert_eq!(b.len, size);
        assert_eq!(b.ptr.as_ptr() as usize % align, 0, "block {i} misaligned");
        // SAFETY: ScratchWorker's contract: each block is valid for writes of len bytes
        // during the kernel callback.
        unsafe { b.ptr.as_ptr().write_bytes(i as u8 + 1, b.len) };
    }
    for (i, b) in blocks.iter().enumerate() {
        // SAFETY: as above, valid for reads of len bytes (and now initialised).
        let s = unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.len) };
        assert!(
            s.iter().all(|&x| x == i as u8 + 1),
            "block {i} overlaps another"
        );
    }
}

#[test]
fn every_worker_hands_out_aligned_disjoint_writable_blocks() {
    let sizes = [64, 1, 4096, 100_000, 3000, 64, 2 << 20];
    for kind in SOURCES {
        let source: Box<dyn ScratchSource> = (kind.build)(&small_config());
        let mut w = source.worker();
        let mut blocks = vec![Block::EMPTY; sizes.len()];
        for align in [64, 128, 4096] {
            for _ in 0..3 {
                let mut ran = false;
                w.call(Call {
                    sizes: &sizes,
                    align,
                    blocks: &mut blocks,
                    kernel: &mut |bs| {
                        check_blocks(bs, &sizes, align);
                        ran = true;
                    },
                })
                .unwrap_or_else(|e| panic!("{}: {e}", kind.name));
                assert!(ran, "{}: kernel not run", kind.name);
            }
        }
        assert!(
            w.call(Call {
                sizes: &sizes,
                align: 48,
                blocks: &mut blocks,
                kernel: &mut |_| {},
            })
            .is_err(),
            "{}: alignment 48 accepted",
            kind.name
        );
    }
}

#[test]
fn every_worker_is_a_temp_allocator() {
    for kind in SOURCES {
        let source = (kind.build)(&small_config());
        let w = source.worker();
        let temp: &dyn TempReset = w.as_ref();
        for round in 0..3u8 {
            let mut live: HashMap<usize, (NonNull<u8>, usize)> = HashMap::new();
            for (i, (size, align)) in [(64, 64), (5000, 128), (300_000, 4096), (10, 64)]
                .into_iter()
                .enumerate()
            {
                let p = temp
                    .allocate(size, align)
                    .unwrap_or_else(|e| panic!("{}: {e}", kind.name));
                assert_eq!(p.as_ptr() as usize % align, 0, "{}", kind.name);
                // SAFETY: `p` is valid for `size` bytes until the reset.
                unsafe { p.as_ptr().write_bytes(round * 16 + i as u8, size) };
                live.insert(i, (p, size));
            }
            for (i, (p, size)) in &live {
                // SAFETY: still valid (no reset yet).
                let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), *size) };
                assert!(
                    s.iter().all(|&x| x == round * 16 + *i as u8),
                    "{}: block {i} overwritten",
                    kind.name
                );
            }
            let z = temp.allocate(0, 256).unwrap();
            assert_eq!(z.as_ptr() as usize % 256, 0, "{}: zero-size", kind.name);
            // SAFETY: nothing allocated above is used after this.
            unsafe { temp.reset_unchecked() };
        }
        if kind.name != "exact-cache" {
            // (exact-cache follows ExecuTorch: it clamps, and only rejects non-powers of two.)
            assert!(matches!(
                temp.allocate(64, allocbench::source::MAX_ALIGN * 2),
                Err(AllocError::InvalidAlignment { .. })
            ));
        }
        assert!(
            matches!(
                temp.allocate(64, 12),
                Err(AllocError::InvalidAlignment { align: 12 })
            ),
            "{}",
            kind.name
        );
    }
}

#[test]
fn sdpa_runs_on_every_source_with_tiny_shapes() {
    use allocbench::sdpa::{run, section, SdpaConfig};
    let cfg = SdpaConfig::smoke();
    let kinds = all();
    let r = run(&cfg, &kinds, &small_config(), &|| {});
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let (rows, decode_eff, prefill_eff) = (&r.rows, &r.decode_eff, &r.prefill_eff);
    // One row per source and dtype for decode and for each prefill length.
    assert_eq!(
        rows.len(),
        SOURCES.len() * (1 + cfg.prefill.len()) * cfg.dtypes.len()
    );
    for m in rows {
        assert_eq!(m.error, None, "{} on {}", m.source, m.workload);
        assert!(m.ns_per_call.median > 0.0, "{} on {}", m.source, m.workload);
        assert!(m.calls_total > 0, "{} on {}", m.source, m.workload);
        assert!(m.x_static.is_some_and(|x| x > 0.0), "{}", m.source);
        if m.source == "static" {
            assert_eq!(m.x_static, Some(1.0));
            // Warm-up saw every shape: the floor allocates nothing while measured.
            assert_eq!(m.sys_allocs_per_call, Some(0.0), "{}", m.workload);
        }
        if m.source == "system" || m.source == "fresh-pages" {
            // The kernel asks for exactly one scratch buffer per call.
            assert_eq!(
                m.sys_allocs_per_call,
                Some(1.0),
                "{} {}",
                m.source,
                m.workload
            );
        }
        if m.source == "fresh-pages" {
            // Fresh pages fault when the kernel writes its scratch.
            assert!(m.faults_per_call >= 1.0, "{}", m.workload);
        }
    }
    assert_eq!(
        decode_eff.len(),
        cfg.eff_decode_kvs.len() * cfg.dtypes.len()
    );
    assert!(decode_eff
        .iter()
        .all(|e| e.kernel_gbs > 0.0 && e.stream_gbs > 0.0 && e.ms_per_call > 0.0));
    assert_eq!(prefill_eff.len(), cfg.prefill.len() * cfg.dtypes.len());
    assert!(prefill_eff
        .iter()
        .all(|e| e.kernel_gflops > 0.0 && e.sgemm_gflops > 0.0));
    // A round times enough calls for the smallest sgemm's FLOPs (2 * 16^3 = 8192): a causal
    // 7-token call is 4 heads x 4 x 16 x 28 visible pairs = 7168 FLOPs (2 calls), 12 tokens
    // 19968 (1 call).
    for e in prefill_eff {
        assert_eq!(e.calls, if e.len == 7 { 2 } else { 1 }, "{e:?}");
    }

    let info = RunInfo::new(Machine::detect(), "test".into(), true, 1, Instant::now());
    let report = section(&cfg, r.clone(), &info);
    // Every target gets a verdict (no source was left out).
    let targets = &report.targets;
    assert!(!targets.is_empty());
    assert!(targets.iter().all(|t| t.met.is_some()), "{targets:?}");
    let j = &report.json.as_ref().unwrap().1;
    assert_eq!(
        j["measurements"].as_array().map(Vec::len),
        Some(SOURCES.len() * 3 * 3)
    );
    let table = report.details().unwrap();
    assert!(table.contains("| sdpa-prefill-12 "), "{table}");
    assert!(table.contains("sdpa-prefill-12-int8-kv"), "{table}");
    assert!(table.contains("sdpa-decode-bf16"), "{table}");
    let svg = allocbench::plot::render_svg(&info, &report.rows).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("sdpa-prefill-12-int8-kv"),
        "{svg}"
    );
}

/// A tiny model through the whole run: rows for every (phase, source), ratios against
/// static, zero system allocations per token for the cache in steady state (greedy and
/// sampled decode), the scratch profile with the sampler's scratch, JSON units.
#[test]
fn llm_runs_on_a_tiny_model() {
    let cfg = LlmConfig::tiny();
    let kinds: Vec<&SourceKind> = llm_sources()
        .into_iter()
        .filter(|k| ["caching", "static", "system"].contains(&k.name))
        .collect();
    assert_eq!(kinds.len(), 3);
    let s = allocbench::llm::run_part(&cfg, true, &kinds);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(s.rows.len(), 9);
    let get = |phase: &str, source: &str| {
        s.rows
            .iter()
            .find(|m| m.workload == phase && m.source == source)
            .unwrap()
    };
    let caching = get("llm-decode", "caching");
    assert_eq!(caching.sys_allocs_per_call, Some(0.0));
    assert!(caching.x_static.is_some() && caching.calls_per_sec > 0.0);
    assert!(caching.temp_bytes_per_call.is_some_and(|b| b > 0.0));
    let system = get("llm-decode", "system");
    assert!(
        system.sys_allocs_per_call.unwrap() > 0.0,
        "system mallocs every kernel's scratch"
    );
    assert!(get("llm-prefill", "static").ns_per_call.median > 0.0);
    // Sampled decode: top-p's probabilities and sorted ids (8 bytes per vocabulary entry)
    // on top of the greedy step's scratch (whose attention reads a little more at the later
    // positions), still no system allocation for the cache.
    let sampled = get("llm-decode-sampled", "caching");
    assert_eq!(sampled.sys_allocs_per_call, Some(0.0));
    let vocab = 300.0; // LlmConfig::tiny's
    let temp = |m: &allocbench::harness::Measurement| m.temp_bytes_per_call.unwrap();
    let extra = temp(sampled) - temp(caching);
    assert!((8.0 * vocab..9.0 * vocab).contains(&extra), "{extra}");
    let (key, j) = s.json.clone().unwrap();
    assert_eq!(key, "llm");
    assert_eq!(
        j["measurements"][0]["time_per_call"]["median"]["unit"],
        "ns/prefill"
    );
    let efficiency = &j["efficiency"];
    assert!(efficiency["decode"].is_object() && efficiency["prefill"].is_object());
    let tok_s = j["measurements"][0]["tokens_per_second"].as_f64().unwrap();
    assert!(tok_s > 0.0, "{tok_s}");
    assert!(s
        .targets
        .iter()
        .any(|c| c.target.contains("within 1.01x of static on llm-decode")));
    assert!(j["headline"][0].as_str().unwrap().contains("system takes"));
    // The scratch profile: one prefill and `decode_tokens` decode steps, every kernel's
    // largest call no more than its total, and a table row per (phase, kernel).
    let kernels = j["scratch_profile"]["kernels"].as_array().unwrap();
    assert!(!kernels.is_empty(), "{j}");
    for phase in ["prefill", "decode"] {
        assert!(kernels.iter().any(|k| k["phase"] == phase), "{phase}");
    }
    for k in kernels {
        let (max, total) = (k["max_call_bytes"].as_u64(), k["total_bytes"].as_u64());
        assert!(k["calls"].as_u64() > Some(0) && max <= total, "{k}");
    }
    let attention = |phase: &str| {
        let k = kernels
            .iter()
            .find(|k| k["phase"] == phase && k["kernel"] == "attention");
        k.and_then(|k| k["max_call_bytes"].as_u64())
    };
    // Prefill's attention scores cover the prompt; decode's one row.
    assert!(attention("prefill") > attention("decode"), "{j}");
    assert!(attention("decode") > Some(0), "{j}");
    let decode_calls = kernels
        .iter()
        .filter(|k| k["phase"] == "decode")
        .map(|k| k["calls"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(decode_calls % cfg.decode_tokens as u64, 0, "{j}");
    let details = s.details().unwrap();
    assert!(details.contains("Scratch profile"), "{details}");
    let rows = details
        .lines()
        .filter(|l| l.starts_with("| decode"))
        .count();
    let decode_kernels = kernels.iter().filter(|k| k["phase"] == "decode").count();
    assert_eq!(rows, decode_kernels + 1, "{details}"); // + the efficiency table's row
                                                       // The profile samples as the sampled row does: its top-p scratch in both phases.
    for phase in ["prefill", "decode"] {
        let sample = kernels
            .iter()
            .find(|k| k["phase"] == phase && k["kernel"] == "sample_top_p");
        let max = sample.and_then(|k| k["max_call_bytes"].as_u64());
        assert_eq!(max, Some(8 * 300), "{phase}: {j}");
    }
    assert!(details.contains("| decode  | sample_top_p"), "{details}");
}

#[test]
fn short_soak_has_no_violations() {
    let report = allocbench::soak::run(0.2, 2, allocbench::soak::Policy::default());
    assert!(report.passed(), "{report}");
    assert!(report.ops > 0, "{report}");
    assert!(report.peak_live_bytes > 0, "{report}");
    assert_eq!(report.threads, 2);
    assert!(report.peak_held_bytes > 0, "{report}");
    let x = report.reserved_over_held();
    let want = report.peak_reserved_bytes as f64 / report.peak_held_bytes as f64;
    assert!((x - want).abs() < 1e-9, "{x} vs {want}");
    assert!(report.target().measured.starts_with(&format!("{x:.2}x")));
}
