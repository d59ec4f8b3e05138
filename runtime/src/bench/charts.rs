//! The bench's SVG bar charts (plotters, SVG backend), one per figure of paper 003 §4:
//! Figure 5 (makespan and p95 per policy, per arrival and completion scope, with the lower
//! bound), Figure 6 (GPU-seconds per completed session per workflow, stacked by category) and
//! Figure 7 (ablations and predictor substitutions). Reads a [`BenchReport`]; writes files.
//! Depends on the report types of `bench`, `markdown.rs`'s choice of Figure 6's arrival and the
//! timeline palette of `report`; must not depend on the simulator, the planner, the shells or the
//! CLI: it draws what a report holds and runs nothing.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use super::markdown::figure6_arrival;
use super::{BenchError, BenchReport, BenchRun, VariantKind};

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// One bar (or one segment of a stacked bar).
struct Bar {
    value: f64,
    color: RGBColor,
}

/// The bars of one x position.
struct Group {
    label: String,
    bars: Vec<Bar>,
}

use crate::report::timeline::PALETTE;
const IDLE: RGBColor = RGBColor(189, 195, 199);
const LOADING: RGBColor = RGBColor(230, 126, 34);
const OTHER: RGBColor = RGBColor(236, 240, 241);

/// A lighter shade of `c` (the p95 bar next to a makespan bar).
fn light(c: RGBColor) -> RGBColor {
    let f = |x: u8| x + ((255 - x) as f64 * 0.55) as u8;
    RGBColor(f(c.0), f(c.1), f(c.2))
}

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn draw_err(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> BenchError + '_ {
    move |e| BenchError::Chart { path: path.to_path_buf(), message: e.to_string() }
}

/// One panel of grouped (side by side) or stacked bars, with an optional horizontal bound.
fn panel(
    area: &Area,
    title: &str,
    groups: &[Group],
    stacked: bool,
    bound: Option<f64>,
    legend: &[(String, RGBColor)],
) -> Result<(), String> {
    let s = |e: &dyn std::fmt::Display| e.to_string();
    let n = groups.len().max(1);
    let top = groups
        .iter()
        .map(|g| if stacked { g.bars.iter().map(|b| b.value).sum() } else { g.bars.iter().map(|b| b.value).fold(0.0, f64::max) })
        .fold(bound.unwrap_or(0.0), f64::max);
    let ymax = if top > 0.0 { top * 1.25 } else { 1.0 };
    let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(48)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..ymax)
        .map_err(|e| s(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_style(("sans-serif", 10))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() { labels[i as usize].clone() } else { String::new() }
        })
        .y_desc("seconds")
        .draw()
        .map_err(|e| s(&e))?;
    let mut rects = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let c = i as f64;
        if stacked {
            let mut y = 0.0;
            for b in &g.bars {
                rects.push(Rectangle::new([(c - 0.3, y), (c + 0.3, y + b.value)], b.color.filled()));
                y += b.value;
            }
        } else {
            let w = 0.8 / g.bars.len().max(1) as f64;
            for (j, b) in g.bars.iter().enumerate() {
                let x0 = c - 0.4 + j as f64 * w;
                rects.push(Rectangle::new([(x0, 0.0), (x0 + 0.92 * w, b.value)], b.color.filled()));
            }
        }
    }
    chart.draw_series(rects).map_err(|e| s(&e))?;
    if let Some(b) = bound {
        chart
            .draw_series(LineSeries::new([(-0.5, b), (n as f64 - 0.5, b)], BLACK.stroke_width(2)))
            .map_err(|e| s(&e))?
            .label("lower bound")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK.stroke_width(2)));
    }
    for (label, c) in legend {
        let c = *c;
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(|e| s(&e))?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    if bound.is_some() || !legend.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 10))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| s(&e))?;
    }
    Ok(())
}

/// Makespan and p95 bars for `rows`, coloured by position.
fn completion_groups(rows: &[(&str, Option<(f64, f64)>)]) -> Vec<Group> {
    rows.iter()
        .enumerate()
        .filter_map(|(i, (label, m))| {
            m.map(|(makespan, p95)| Group {
                label: label.to_string(),
                bars: vec![Bar { value: makespan, color: color(i) }, Bar { value: p95, color: light(color(i)) }],
            })
        })
        .collect()
}

fn policies(report: &BenchReport) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in report.runs.iter().filter(|r| r.kind == VariantKind::Policy) {
        if !v.contains(&r.variant) {
            v.push(r.variant.clone());
        }
    }
    v
}

fn legend_makespan_p95() -> Vec<(String, RGBColor)> {
    vec![("makespan (solid)".into(), color(0)), ("p95 latency (light)".into(), light(color(0)))]
}

/// Figure 5: rows overall and each model path, columns arrival processes.
pub(super) fn figure5(report: &BenchReport, path: &Path) -> Result<PathBuf, BenchError> {
    let err = draw_err(path);
    let mut scopes: Vec<Option<String>> = vec![None];
    let mut models: Vec<String> = report.runs.iter().flat_map(|r| r.paths.keys().cloned()).collect();
    models.sort();
    models.dedup();
    scopes.extend(models.into_iter().map(Some));
    let arrivals = &report.setup.arrivals;
    let (rows, cols) = (scopes.len(), arrivals.len().max(1));
    let root = SVGBackend::new(path, (420 * cols as u32, 300 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let pols = policies(report);
    let areas = root.split_evenly((rows, cols));
    for (r, scope) in scopes.iter().enumerate() {
        for (c, a) in arrivals.iter().enumerate() {
            let metric = |run: &BenchRun| match scope {
                // A row with no completed session has no bar.
                None => run.latency_s.is_known().then_some((run.makespan_s, run.latency_s.p95)),
                Some(m) => run.paths.get(m).filter(|p| p.latency_s.is_known()).map(|p| (p.makespan_s, p.latency_s.p95)),
            };
            let rows: Vec<(&str, Option<(f64, f64)>)> =
                pols.iter().map(|p| (p.as_str(), report.row(p, a).and_then(metric))).collect();
            let bound = report.lower_bounds.get(a).and_then(|b| match scope {
                None => Some(b.makespan_s),
                Some(m) => b.paths.get(m).copied(),
            });
            let title = format!("{} — {a}", scope.as_deref().map(|m| format!("{m} path")).unwrap_or("overall".into()));
            let legend = if r == 0 && c == 0 { legend_makespan_p95() } else { Vec::new() };
            panel(&areas[r * cols + c], &title, &completion_groups(&rows), false, bound, &legend).map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(path.to_path_buf())
}

/// Figure 6: one panel per workflow, a stacked bar per policy.
pub(super) fn figure6(report: &BenchReport, path: &Path) -> Result<PathBuf, BenchError> {
    let err = draw_err(path);
    let workflows = &report.setup.workflows;
    let cols = workflows.len().max(1);
    let root = SVGBackend::new(path, (380 * cols as u32, 340)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, cols));
    let pols = policies(report);
    let arrival = figure6_arrival(report).cloned().unwrap_or_default();
    for (k, w) in workflows.iter().enumerate() {
        let groups: Vec<Group> = pols
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let g = report.row(p, &arrival)?.workflows.get(w)?.gpu_seconds_per_session;
                Some(Group {
                    label: p.clone(),
                    bars: vec![
                        Bar { value: g.generation, color: color(i) },
                        Bar { value: g.idle_resident, color: IDLE },
                        Bar { value: g.loading, color: LOADING },
                        Bar { value: g.other, color: OTHER },
                    ],
                })
            })
            .collect();
        let legend = if k == 0 {
            vec![
                ("generation (policy colour)".to_string(), color(0)),
                ("idle resident".to_string(), IDLE),
                ("loading".to_string(), LOADING),
                ("other".to_string(), OTHER),
            ]
        } else {
            Vec::new()
        };
        let title = format!("{w}: GPU-s per completed session ({arrival})");
        panel(&areas[k], &title, &groups, true, None, &legend).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(path.to_path_buf())
}

/// Figure 7: one panel per arrival, makespan and p95 per variant (full policy first).
pub(super) fn figure7(report: &BenchReport, path: &Path) -> Result<PathBuf, BenchError> {
    let err = draw_err(path);
    let mut variants: Vec<String> = Vec::new();
    if report.runs.iter().any(|r| r.variant == "joint") {
        variants.push("joint".into());
    }
    for r in report.runs.iter().filter(|r| matches!(r.kind, VariantKind::Ablation | VariantKind::Predictor)) {
        if !variants.contains(&r.variant) {
            variants.push(r.variant.clone());
        }
    }
    let arrivals = &report.setup.arrivals;
    let cols = arrivals.len().max(1);
    let root = SVGBackend::new(path, ((120 * variants.len().max(3)) as u32 * cols as u32, 340)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, cols));
    for (c, a) in arrivals.iter().enumerate() {
        let rows: Vec<(&str, Option<(f64, f64)>)> = variants
            .iter()
            .map(|v| (v.as_str(), report.row(v, a).filter(|r| r.latency_s.is_known()).map(|r| (r.makespan_s, r.latency_s.p95))))
            .collect();
        let legend = if c == 0 { legend_makespan_p95() } else { Vec::new() };
        let bound = report.lower_bound_s.get(a).copied();
        panel(&areas[c], &format!("ablations — {a}"), &completion_groups(&rows), false, bound, &legend)
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(path.to_path_buf())
}
