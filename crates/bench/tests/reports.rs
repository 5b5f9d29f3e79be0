//! What a run reports from its measurements: the scratch workloads' and the attention
//! kernel's goals met and missed as measured, their JSON's units; the summary's line per
//! workload; where the files go.

use allocbench::measure::Machine;
use allocbench::report::RunInfo;

/// A run's info on a machine of 2 cores.
fn info() -> RunInfo {
    let machine = Machine {
        cores: 2,
        ..Machine::detect()
    };
    RunInfo::new(machine, "test".into(), true, 2, std::time::Instant::now())
}

/// The scratch workloads' section: goals, scaling, JSON.
mod scratch {
    use allocbench::harness::{median_ratios, Measurement, RunConfig};
    use allocbench::measure::Spread;
    use allocbench::scratch_report::ScratchRun;
    use allocbench::source::SourceConfig;

    use super::info;

    fn m(workload: &str, source: &str, ns: f64, faults: f64) -> Measurement {
        Measurement {
            workload: workload.into(),
            source: source.into(),
            unit: "call".into(),
            threads: 1,
            ns_per_call: Spread {
                median: ns,
                min: ns,
                max: ns,
            },
            calls_per_sec: 1e9 / ns,
            faults_per_call: faults,
            ..Measurement::default()
        }
    }

    /// A report of `ms` (each workload's measurements given together), ratios as the harness
    /// computes them, workload by workload.
    fn report(mut ms: Vec<Measurement>) -> ScratchRun {
        for one in ms.chunk_by_mut(|a, b| a.workload == b.workload) {
            median_ratios(one);
        }
        ScratchRun {
            run: RunConfig::smoke(),
            sources: SourceConfig::default(),
            workloads: vec![],
            measurements: ms,
        }
    }

    #[test]
    fn targets_are_met_and_missed_as_measured() {
        let r = report(vec![
            m("scratch-medium", "static", 100.0, 0.0),
            m("scratch-medium", "caching", 104.0, 0.0),
            m("scratch-medium", "system", 150.0, 0.0),
            m("scratch-large", "static", 100.0, 0.0),
            m("scratch-large", "caching", 120.0, 0.0),
            m("scratch-large", "mimalloc", 110.0, 5.0),
        ]);
        let t = r.targets(2);
        let find = |s: &str| t.iter().find(|c| c.target.contains(s)).unwrap().met;
        assert_eq!(
            find("caching within 1.05x of static on scratch-medium"),
            Some(true)
        );
        assert_eq!(
            find("caching within 1.05x of static on scratch-large"),
            Some(false)
        );
        assert_eq!(find("zeropool, orthotope on scratch-medium"), Some(true));
        assert_eq!(find("zeropool, orthotope on scratch-large"), Some(false));
        assert_eq!(r.measurements[1].x_static, Some(1.04));
        // A failed caching misses; without static the check is not measured.
        let mut failed = m("scratch-small", "caching", 100.0, 0.0);
        failed.error = Some("out of memory".into());
        let t = report(vec![failed, m("decode", "caching", 1.0, 0.0)]).targets(2);
        assert_eq!((t[0].met, t[1].met), (Some(false), None), "{t:?}");
    }

    #[test]
    fn faults_miss_the_floor_target() {
        let r = report(vec![
            m("scratch-small", "static", 100.0, 0.0),
            m("scratch-small", "caching", 100.0, 0.5),
        ]);
        assert_eq!(r.targets(2)[0].met, Some(false));
    }

    #[test]
    fn scaling_is_rate_over_rate() {
        let mut two = m("threads x2", "caching", 100.0, 0.0);
        two.threads = 2;
        two.calls_per_sec = 1.9e7;
        let r = report(vec![m("threads x1", "caching", 100.0, 0.0), two]);
        let s = r.scaling("caching").unwrap();
        assert!((s - 1.9).abs() < 1e-9);
        let t = r.targets(2);
        assert_eq!(t.last().unwrap().met, Some(true));
    }

    #[test]
    fn json_has_units_and_cores() {
        let r = report(vec![m("scratch-small", "static", 100.0, 0.0)]);
        let j = r.section(&info(), &[]).json.unwrap().1;
        assert_eq!(j["cores"], 2);
        assert_eq!(
            j["measurements"][0]["time_per_call"]["median"]["unit"],
            "ns/call"
        );
        assert_eq!(j["measurements"][0]["ratio_to_static"]["value"], 1.0);
    }
}

/// The summary a user reads first.
mod summary {
    use allocbench::harness::Measurement;
    use allocbench::measure::Spread;
    use allocbench::summary::{table, FEW_SAMPLES, FOOTNOTES};

    fn m(w: &str, s: &str, ns: f64, x_static: f64, x_caching: f64) -> Measurement {
        Measurement {
            workload: w.into(),
            source: s.into(),
            unit: "call".into(),
            ns_per_call: Spread {
                median: ns,
                min: ns,
                max: ns,
            },
            x_static: Some(x_static),
            x_caching: Some(x_caching),
            rounds: FEW_SAMPLES,
            ..Measurement::default()
        }
    }

    #[test]
    fn each_workload_shows_the_fastest_rival_and_exact_cache() {
        let rows = vec![
            m("decode", "system", 30.0, 3.0, 1.5),
            m("decode", "mimalloc", 25.0, 2.5, 1.25),
            m("decode", "exact-cache", 400.0, 40.0, 20.0),
            m("decode", "caching", 20.0, 1.1, 1.0),
            m("decode", "static", 18.0, 1.0, 0.9),
            Measurement {
                rounds: 2,
                ..m("scratch-small", "caching", 20.0, 0.97, 1.0)
            },
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        let decode: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            decode,
            ["decode", "20", "ns", "+10%", "mimalloc", "1.25x", "20.00x"]
        );
        // No rival measured: dashes, not a made-up figure; below the floor is shown as is,
        // and a figure from few rounds is marked.
        let small: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(small, ["scratch-small", "20", "ns", "-3%*", "-", "-", "-"]);
        assert!(t
            .lines()
            .chain(FOOTNOTES.lines())
            .all(|l| l.chars().count() <= 100));
    }
}

/// The JSON and plot files.
mod files {
    use allocbench::output::open;

    #[test]
    fn the_plot_goes_next_to_the_json_and_bad_paths_fail_at_once() {
        let dir = std::env::temp_dir().join(format!("allocbench-out-{}", std::process::id()));
        let (j, p) = open(None, None, Some(&dir), "all").unwrap();
        assert_eq!(
            (j.path.clone(), p.path.clone()),
            (dir.join("all.json"), dir.join("all.svg"))
        );
        assert!(j.write(b"{}") && dir.join("all.json").is_file());
        let missing = dir.join("no-such-dir/x.json");
        let e = open(Some(&missing), None, None, "all").unwrap_err();
        assert!(e.contains("--json") && e.contains("no-such-dir"), "{e}");
        let e = open(Some(&dir.join("y.json")), Some(&missing), None, "all").unwrap_err();
        assert!(e.contains("--plot"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The attention kernel's section: goals, JSON.
mod sdpa {
    use allocbench::harness::Measurement;
    use allocbench::measure::{Ratios, Spread};
    use allocbench::report::{goal, TargetCheck};
    use allocbench::sdpa::baseline::{DecodeEfficiency, PrefillEfficiency};
    use allocbench::sdpa::{sample_tokens, section, SdpaConfig, SdpaDtype, SdpaRun};

    use super::info;

    /// The goals `section` checks on `r`.
    fn targets(r: &SdpaRun) -> Vec<TargetCheck> {
        section(&SdpaConfig::smoke(), r.clone(), &info()).targets
    }

    fn row(w: &str, s: &str, ns: f64, x: Option<f64>) -> Measurement {
        Measurement {
            workload: w.into(),
            source: s.into(),
            unit: if w.contains("decode") {
                "token"
            } else {
                "prefill"
            }
            .into(),
            ns_per_call: Spread {
                median: ns,
                min: ns,
                max: ns,
            },
            x_static: x,
            ..Measurement::default()
        }
    }

    /// Decode efficiency of `dtype` at `kv_len`: `ratio` of a 10 GB/s read, `ms` per call.
    fn decode_at(dtype: SdpaDtype, kv_len: usize, ratio: f64, ms: f64) -> DecodeEfficiency {
        DecodeEfficiency {
            dtype,
            kv_len,
            layers: 1,
            span_bytes: 1,
            stream_gbs: 10.0,
            kernel_gbs: 10.0 * ratio,
            ratios: Ratios {
                ratio_best: ratio,
                ratio_median: ratio,
            },
            ms_per_call: ms,
        }
    }

    fn report(rows: Vec<Measurement>) -> SdpaRun {
        SdpaRun {
            rows,
            decode_eff: vec![
                decode_at(SdpaDtype::F32, 512, 0.1, 1.0),
                decode_at(SdpaDtype::F32, 1024, 0.74, 1.0),
            ],
            prefill_eff: vec![PrefillEfficiency {
                dtype: SdpaDtype::F32,
                len: 128,
                causal: true,
                calls: 16,
                sgemm_gflops: 100.0,
                kernel_gflops: 61.0,
                ratios: Ratios {
                    ratio_best: 0.61,
                    ratio_median: 0.6,
                },
                ms_per_call: 1.0,
            }],
            errors: vec![],
        }
    }

    #[test]
    fn targets_are_met_and_missed_as_measured() {
        let r = report(vec![
            row("sdpa-decode", "static", 100.0, Some(1.0)),
            row("sdpa-decode", "caching", 101.0, Some(1.019)),
            row("sdpa-decode", "caching-scope", 103.0, Some(1.03)),
        ]);
        let t = targets(&r);
        let find = |s: &str| {
            t.iter()
                .find(|c| c.target.contains(s))
                .unwrap_or_else(|| panic!("{s}"))
                .met
        };
        assert_eq!(
            find("caching within 1.02x of static on sdpa-decode"),
            Some(true)
        );
        assert_eq!(
            find("caching-scope within 1.02x of static on sdpa-decode"),
            Some(false)
        );
        // kv 512 is below the target's range; kv 1024 misses on the median ratio.
        assert!(!t.iter().any(|c| c.target.contains("kv 512")));
        assert_eq!(find("at kv 1024"), Some(false));
        assert_eq!(find("prefill 128 >= 60%"), Some(true));
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn int8_speedup_is_checked_against_f32_at_the_same_kv() {
        let mut r = report(vec![]);
        let at = |dtype, ms| decode_at(dtype, goal::SDPA_INT8_KV, 0.9, ms);
        r.decode_eff = vec![at(SdpaDtype::F32, 3.0), at(SdpaDtype::Int8Kv, 1.1)];
        r.prefill_eff[0].dtype = SdpaDtype::Int8Kv; // reported, not a target
        let t = targets(&r);
        let speed = t.iter().find(|c| c.target.contains("3x faster")).unwrap();
        assert_eq!(speed.met, Some(false), "{speed:?}");
        assert!(speed.measured.starts_with("2.73x"), "{speed:?}");
        assert!(t
            .iter()
            .any(|c| c.target.starts_with("int8-kv decode >= 85%")));
        assert!(!t.iter().any(|c| c.target.contains("prefill")));
        r.decode_eff[1].ms_per_call = 1.0;
        let t = targets(&r);
        assert_eq!(
            t.iter()
                .find(|c| c.target.contains("3x faster"))
                .unwrap()
                .met,
            Some(true)
        );
    }

    #[test]
    fn a_failed_source_misses_and_json_has_units() {
        let mut failed = row("sdpa-prefill-7", "caching", 0.0, None);
        failed.error = Some("out of memory".into());
        let r = report(vec![
            row("sdpa-prefill-7", "static", 100.0, Some(1.0)),
            failed,
        ]);
        assert_eq!(targets(&r)[0].met, Some(false));
        let j = section(&SdpaConfig::smoke(), r, &info()).json.unwrap().1;
        assert_eq!(
            j["measurements"][0]["time_per_call"]["median"]["unit"],
            "ns/prefill"
        );
        assert_eq!(j["efficiency"]["decode"][1]["stream_gbs"], 10.0);
        assert_eq!(j["cores"], 2);
    }

    #[test]
    fn token_samples() {
        assert_eq!(sample_tokens(5, 0), vec![1, 2, 3, 4, 5]);
        assert_eq!(sample_tokens(1024, 16).len(), 16);
        assert_eq!(sample_tokens(1024, 16)[0], 1);
        assert_eq!(*sample_tokens(1024, 16).last().unwrap(), 1024);
        assert_eq!(sample_tokens(1024, 16)[1], 69);
        assert_eq!(sample_tokens(3, 10), vec![1, 2, 3]);
    }
}
