//! The GPU timeline as SVG: one row per GPU over time. Each bar is coloured by the deployment
//! (model) responsible for it and shaded by what the GPU did — generating (full colour), idle
//! resident (light), loading or waking (dark) — exactly the partition the GPU-time breakdown
//! counts; a sleeping replica is a thin line in its model's colour across the row, and runs long
//! enough carry the model's name. The legend sits in a strip below the rows, never on the data.
//! Drawn with plotters' SVG backend.
//!
//! Must not depend on anything of the crate outside `report` (`gpu`'s partition): no shell,
//! planner or engine.

use std::path::Path;

use plotters::prelude::*;
use thiserror::Error;

use super::gpu::{Category, DeviceTimeline, SegmentKind, sweep};

#[derive(Debug, Error)]
#[error("cannot draw timeline {path}: {message}")]
pub struct TimelineError {
    pub path: String,
    pub message: String,
}

/// One colour per deployment id (cycled beyond eight); the bench charts use it too.
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

const WIDTH: u32 = 1100;
const ROW_PX: u32 = 28;
const LEGEND_PX: u32 = 58;

fn colour_of(deployment: u32) -> RGBColor {
    PALETTE[deployment as usize % PALETTE.len()]
}

/// The shade of `base` for a category: generation full, idle resident light, loading dark.
fn shade(base: RGBColor, cat: Category) -> Option<RGBColor> {
    let RGBColor(r, g, b) = base;
    let mix = |c: u8, to: f64, k: f64| (c as f64 * (1.0 - k) + to * k).round() as u8;
    match cat {
        Category::Generation => Some(base),
        Category::IdleResident => Some(RGBColor(mix(r, 255.0, 0.7), mix(g, 255.0, 0.7), mix(b, 255.0, 0.7))),
        Category::Loading => Some(RGBColor(mix(r, 0.0, 0.55), mix(g, 0.0, 0.55), mix(b, 0.0, 0.55))),
        Category::Other => None,
    }
}

/// Draw `devices` over `[t0, t1]` into `path`; `deployments[id]` names deployment `id` (its
/// model) in the labels and the legend.
pub fn write_svg(
    path: &Path,
    title: &str,
    devices: &[DeviceTimeline],
    deployments: &[String],
    t0: f64,
    t1: f64,
) -> Result<(), TimelineError> {
    let err = |e: &dyn std::fmt::Display| TimelineError { path: path.display().to_string(), message: e.to_string() };
    let height = 80 + ROW_PX * devices.len() as u32 + LEGEND_PX;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (plot, legend) = root.split_vertically(height - LEGEND_PX);
    let span = (t1 - t0).max(1e-6);
    let n = devices.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..span, 0.0..n)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().disable_y_mesh().x_desc("virtual seconds").y_labels(0).draw().map_err(|e| err(&e))?;
    let name_of = |d: u32| deployments.get(d as usize).cloned().unwrap_or_else(|| format!("deployment {d}"));
    let mut used: Vec<u32> = Vec::new();
    for (row, dev) in devices.iter().enumerate() {
        let y_top = n - row as f64 - 0.1;
        let y_bot = n - row as f64 - 0.9;
        // The partition (so the picture shows exactly what the breakdown counts), merging runs
        // of one shade separated by gaps under 0.2 % of the span.
        let mut rects: Vec<(f64, f64, RGBColor, u32)> = Vec::new();
        sweep(&dev.segments, t0, t1, |a, b, cat, dep| {
            let Some(dep) = dep else { return };
            let Some(colour) = shade(colour_of(dep), cat) else { return };
            match rects.last_mut() {
                Some(last) if last.2 == colour && a - last.1 < span * 0.002 => last.1 = b,
                _ => rects.push((a, b, colour, dep)),
            }
        });
        for r in &rects {
            if !used.contains(&r.3) {
                used.push(r.3);
            }
        }
        chart
            .draw_series(rects.iter().map(|&(a, b, c, _)| Rectangle::new([(a - t0, y_bot), (b - t0, y_top)], c.filled())))
            .map_err(|e| err(&e))?;
        // Sleepers: a thin line in the model's colour across the middle of the row.
        let y_mid = n - row as f64 - 0.5;
        let asleep: Vec<(f64, f64, u32)> = dev
            .segments
            .iter()
            .filter(|s| s.kind == SegmentKind::Asleep)
            .filter_map(|s| {
                let (a, b) = (s.start.max(t0), s.end.min(t1));
                (b > a).then_some((a, b, s.deployment))
            })
            .collect();
        for s in &asleep {
            if !used.contains(&s.2) {
                used.push(s.2);
            }
        }
        chart
            .draw_series(asleep.iter().map(|&(a, b, d)| {
                Rectangle::new([(a - t0, y_mid - 0.06), (b - t0, y_mid + 0.06)], colour_of(d).filled())
            }))
            .map_err(|e| err(&e))?;
        // The model's name on every run wide enough to hold it (about 7 px per character).
        let px_per_s = (WIDTH as f64 - 40.0) / span;
        chart
            .draw_series(
                rects
                    .iter()
                    .filter(|r| (r.1 - r.0) * px_per_s > 7.0 * name_of(r.3).len() as f64 + 8.0)
                    .map(|r| Text::new(name_of(r.3), (r.0 - t0 + 3.0 / px_per_s, y_top - 0.25), ("sans-serif", 10).into_font().color(&BLACK))),
            )
            .map_err(|e| err(&e))?;
        let label = format!("gpu{row} {}", dev.name);
        chart
            .draw_series(std::iter::once(Text::new(label, (span * 0.002, y_bot + 0.08), ("sans-serif", 9).into_font().color(&BLACK))))
            .map_err(|e| err(&e))?;
    }
    // The legend strip: models by colour, then the shades.
    used.sort_unstable();
    let font = ("sans-serif", 11).into_font().color(&BLACK);
    let mut x = 20i32;
    for d in &used {
        legend.draw(&Rectangle::new([(x, 10), (x + 12, 22)], colour_of(*d).filled())).map_err(|e| err(&e))?;
        let name = name_of(*d);
        legend.draw(&Text::new(name.clone(), (x + 16, 10), font.clone())).map_err(|e| err(&e))?;
        x += 30 + 7 * name.len() as i32;
    }
    let key = [
        (Category::Generation, "generating"),
        (Category::IdleResident, "idle resident"),
        (Category::Loading, "loading / waking"),
    ];
    let mut x = 20i32;
    for (cat, label) in key {
        if let Some(c) = shade(PALETTE[0], cat) {
            legend.draw(&Rectangle::new([(x, 32), (x + 12, 44)], c.filled())).map_err(|e| err(&e))?;
        }
        legend.draw(&Text::new(label, (x + 16, 32), font.clone())).map_err(|e| err(&e))?;
        x += 40 + 7 * label.len() as i32;
    }
    legend.draw(&Rectangle::new([(x, 37), (x + 12, 39)], PALETTE[0].filled())).map_err(|e| err(&e))?;
    legend.draw(&Text::new("asleep (vLLM sleep mode)", (x + 16, 32), font.clone())).map_err(|e| err(&e))?;
    x += 40 + 7 * 24;
    legend.draw(&Text::new("white: empty GPU", (x, 32), font)).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Segment;

    #[test]
    fn bars_are_named_by_model_and_the_legend_is_below_the_rows() {
        let dir = std::env::temp_dir().join(format!("switchyard-timeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("t.svg");
        let seg = |start, end, kind, deployment| Segment { start, end, kind, deployment };
        let devices = vec![
            DeviceTimeline {
                name: "A100-40GB".into(),
                segments: vec![
                    seg(0.0, 30.0, SegmentKind::Loading, 0),
                    seg(30.0, 100.0, SegmentKind::Resident, 0),
                    seg(30.0, 90.0, SegmentKind::Generating, 0),
                    seg(100.0, 160.0, SegmentKind::Asleep, 0),
                ],
                folded: None,
            },
            DeviceTimeline { segments: vec![seg(0.0, 160.0, SegmentKind::Resident, 1)], ..DeviceTimeline::new("V100-32GB") },
        ];
        let names = vec!["Qwen3-4B".to_string(), "Qwen3-8B".to_string()];
        write_svg(&path, "test", &devices, &names, 0.0, 160.0).expect("drawn");
        let svg = std::fs::read_to_string(&path).expect("written");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(svg.contains("Qwen3-4B") && svg.contains("Qwen3-8B"), "models named");
        assert!(svg.contains("asleep (vLLM sleep mode)"));
        // Every legend entry is drawn below the last row's bottom (y of the plot area's end).
        let legend_y = 80 + ROW_PX * 2;
        // (label, y) of every text element.
        let texts: Vec<(String, f64)> = svg
            .split("<text")
            .skip(1)
            .filter_map(|chunk| {
                let y = chunk.split("y=\"").nth(1)?.split('"').next()?.parse().ok()?;
                let body = chunk.split_once('>')?.1.split("</text>").next()?.trim().to_string();
                Some((body, y))
            })
            .collect();
        for label in ["generating", "idle resident", "loading / waking"] {
            let y = texts.iter().find(|t| t.0 == label).map(|t| t.1).unwrap_or_else(|| panic!("{label} in the legend"));
            assert!(y >= legend_y as f64, "{label} at y = {y}, inside the rows");
        }
    }
}
