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
    let panels = body.split_evenly((rows, cols));
    for (panel, w) in panels.iter().zip(&labels) {
        let data: Vec<(&str, f64, f64, f64)> = measurements
            .iter()
            .filter(|m| &m.workload == w && m.error.is_none() && m.ns_per_call.median > 0.0)
            .map(|m| {
                (
                    m.source.as_str(),
                    m.ns_per_call.median,
                    m.ns_per_call.min.max(1e-3),
                    m.ns_per_call.max,
                )
            })
            .collect();
        if data.is_empty() {
            continue;
        }
        // The y axis counts upwards: reverse so the first source is at the top, as in the table.
        let data: Vec<_> = data.into_iter().rev().collect();
        let lo = data.iter().map(|d| d.2).fold(f64::INFINITY, f64::min) / 2.0;
        let hi = data.iter().map(|d| d.3).fold(0.0, f64::max) * 2.0;
        let n = data.len();
        let mut chart = ChartBuilder::on(panel)
            .caption(w.as_str(), ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(100)
            .build_cartesian_2d((lo..hi).log_scale(), (0..n).into_segmented())?;
        let names: Vec<&str> = data.iter().map(|d| d.0).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(*i).copied().unwrap_or("").to_string(),
                _ => String::new(),
            })
            .x_labels(6)
            .x_label_formatter(&|x| fmt_ns(*x))
            .draw()?;
        chart.draw_series(data.iter().enumerate().map(|(i, d)| {
            let mut r = Rectangle::new(
                [
                    (lo, SegmentValue::Exact(i)),
                    (d.1, SegmentValue::Exact(i + 1)),
                ],
                color_of(d.0).filled(),
            );
            r.set_margin(3, 3, 0, 0);
            r
        }))?;
        chart.draw_series(data.iter().enumerate().map(|(i, d)| {
            PathElement::new(
                vec![
                    (d.2, SegmentValue::CenterOf(i)),
                    (d.3, SegmentValue::CenterOf(i)),
                ],
                BLACK.stroke_width(1),
            )
        }))?;
        chart.draw_series(data.iter().enumerate().map(|(i, d)| {
            Text::new(
                fmt_ns(d.1),
                (d.1, SegmentValue::CenterOf(i)),
                ("sans-serif", 11).into_font(),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}
