//! The summary a user reads first: per workload, what the cache buys, against the fastest
//! other allocator and against ExecuTorch's design (`exact-cache`). Plain text, one line per
//! workload, at most 100 columns; every figure and goal is behind `--details`.

use crate::harness::Measurement;
use crate::report::{find, fmt_median, labels};
use crate::source::{CACHING, CACHING_SCOPE, FLOOR};

/// Sources that are not rivals: this project's own and the floor. `exact-cache` has its
/// own column.
const NOT_RIVALS: [&str; 5] = [CACHING, CACHING_SCOPE, "caching-unbounded", FLOOR, EXACT];

/// ExecuTorch's allocator design.
const EXACT: &str = "exact-cache";

/// The explanation printed under the table (each line at most 100 columns); `--help` says
/// the same.
pub const FOOTNOTES: &str = "\
caching      this project's allocator (allocate + reset): median time per call, token or prefill
over static  caching's time over static's, buffers allocated once and reused: the floor of what
             scratch memory costs. Below 0% is noise: both ran in turns on a shared machine,
             and a few percent either way is common when it is busy.
best rival   the fastest other allocator measured (system, mimalloc, jemalloc, fresh-pages,
             bumpalo, zeropool, orthotope) and its time over caching's: above 1.00x the cache
             is faster; exact-cache: ExecuTorch's CPUCachingAllocator design, the same ratio
*            from fewer than 5 measured rounds or steps (quick runs time few long prefills):
             a rough figure, which one busy moment can move by tens of percent";

/// Figures from fewer measured rounds or steps than this are marked `*` (rough figures).
pub const FEW_SAMPLES: usize = 5;

/// Column widths of the summary.
const WIDTHS: [usize; 6] = [25, 17, 11, 11, 9, 11];

/// One line of the summary: workload, caching's time, over static, best rival and its ratio,
/// exact-cache's ratio.
fn line(cells: [&str; 6]) -> String {
    let mut out = format!("{:<w$}", cells[0], w = WIDTHS[0]);
    for (c, w) in cells[1..].iter().zip(&WIDTHS[1..]) {
        out += &format!("  {c:>w$}");
    }
    out.trim_end().to_string()
}

/// The summary table of `rows` (every part's measurements), workloads in run order.
pub fn table(rows: &[Measurement]) -> String {
    let mut out = vec![
        line([
            "workload",
            "caching",
            "over static",
            "best rival",
            "its time",
            "exact-cache",
        ]),
        "-".repeat(WIDTHS.iter().sum::<usize>() + 2 * (WIDTHS.len() - 1)),
    ];
    let x = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
    for w in labels(rows) {
        let get = |s: &str| find(rows, &w, s);
        let caching = get(CACHING);
        let time = caching.map_or("-".to_string(), fmt_median);
        let over = caching.map_or("-".to_string(), |m| {
            let few = if m.rounds < FEW_SAMPLES { "*" } else { "" };
            m.x_static.map_or("-".to_string(), |x| {
                format!("{:+.0}%{few}", 100.0 * (x - 1.0))
            })
        });
        let rival = rows
            .iter()
            .filter(|m| m.workload == w && m.error.is_none() && !NOT_RIVALS.contains(&&*m.source))
            .filter_map(|m| m.x_caching.map(|x| (m.source.as_str(), x)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let exact = get(EXACT).and_then(|m| m.x_caching);
        out.push(line([
            &w,
            &time,
            &over,
            rival.map_or("-", |r| r.0),
            &x(rival.map(|r| r.1)),
            &x(exact),
        ]));
    }
    out.join("\n")
}
