//! The SVG plot: median time per call (log scale) by source, one panel per workload, with
//! min-max whiskers.

use std::error::Error;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::harness::Measurement;
use crate::report::{fmt_ns, labels, RunInfo};
use crate::source::{CACHING, CACHING_SCOPE, FLOOR};

fn color_of(source: &str) -> RGBColor {
    match source {
        CACHING => RGBColor(0x1f, 0x77, 0xb4),
        CACHING_SCOPE => RGBColor(0x6b, 0xae, 0xd6),
        FLOOR => RGBColor(0x7f, 0x7f, 0x7f),
        "exact-cache" => RGBColor(0xd6, 0x27, 0x28),
        "fresh-pages" => RGBColor(0x8c, 0x56, 0x4b),
        _ => RGBColor(0xff, 0x9f, 0x40),
    }
}

/// The plot of `measurements` (of the run `info`) as SVG text.
pub fn render_svg(info: &RunInfo, measurements: &[Measurement]) -> Result<String, Box<dyn Error>> {
    let mut svg = String::new();
    draw(info, measurements, &mut svg)?;
    Ok(svg)
}

fn draw(
    info: &RunInfo,
    measurements: &[Measurement],
    svg: &mut String,
) -> Result<(), Box<dyn Error>> {
    let labels = labels(measurements);
    let cols = 2usize;
    let rows = labels.len().div_ceil(cols).max(1);
    let width = 1200u32;
    let panel_h = 360u32;
    let root =
        SVGBackend::with_string(svg, (width, 60 + panel_h * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(60);
    title.draw(&Text::new(
        format!(
            "allocbench: median time per call (log scale), whiskers min-max; {} cores, {} run",
            info.machine.cores, info.mode
        ),
        (20, 12),
        ("sans-serif", 20).into_font(),
    ))?;
    title.draw(&Text::new(
        "blue: caching (this project), grey: static (floor), red: exact-cache (ExecuTorch design), brown: fresh-pages (iOS-like), orange: others",
        (20, 38),
        ("sans-serif", 13).into_font().color(&RGBColor(0x44, 0x44, 0x44)),
    ))?;
    for (area, w) in body.split_evenly((rows, cols)).iter().zip(&labels) {
        // The y axis counts upwards: reverse so the first source is at the top, as in the table.
        let bars: Vec<Bar<'_>> = measurements
            .iter()
            .filter(|m| &m.workload == w && m.error.is_none() && m.ns_per_call.median > 0.0)
            .map(|m| Bar {
                source: &m.source,
                median: m.ns_per_call.median,
                min: m.ns_per_call.min.max(1e-3),
                max: m.ns_per_call.max,
            })
            .rev()
            .collect();
        if !bars.is_empty() {
            panel(area, w, &bars)?;
        }
    }
    root.present()?;
    Ok(())
}

/// One source's bar in a workload's panel: its median time and its whisker, nanoseconds.
struct Bar<'a> {
    source: &'a str,
    median: f64,
    min: f64,
    max: f64,
}

/// The panel of workload `title`: a bar per source (from the bottom up) with its whisker and
/// its median written beside it, on a log time axis.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    bars: &[Bar<'_>],
) -> Result<(), Box<dyn Error>> {
    let lo = bars.iter().map(|b| b.min).fold(f64::INFINITY, f64::min) / 2.0;
    let hi = bars.iter().map(|b| b.max).fold(0.0, f64::max) * 2.0;
    let n = bars.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(100)
        .build_cartesian_2d((lo..hi).log_scale(), (0..n).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => bars.get(*i).map_or("", |b| b.source).to_string(),
            _ => String::new(),
        })
        .x_labels(6)
        .x_label_formatter(&|x| fmt_ns(*x))
        .draw()?;
    let at = SegmentValue::CenterOf;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let (from, to) = (
            (lo, SegmentValue::Exact(i)),
            (b.median, SegmentValue::Exact(i + 1)),
        );
        let mut r = Rectangle::new([from, to], color_of(b.source).filled());
        r.set_margin(3, 3, 0, 0);
        r
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        PathElement::new(vec![(b.min, at(i)), (b.max, at(i))], BLACK.stroke_width(1))
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        Text::new(
            fmt_ns(b.median),
            (b.median, at(i)),
            ("sans-serif", 11).into_font(),
        )
    }))?;
    Ok(())
}
