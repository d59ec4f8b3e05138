//! The GPU timeline as SVG: one row per GPU over time, coloured loading / generating /
//! idle resident / empty. Drawn with plotters' SVG backend.

use std::path::Path;

use plotters::prelude::*;
use thiserror::Error;

use super::gpu::{Category, DeviceTimeline, sweep};

#[derive(Debug, Error)]
#[error("cannot draw timeline {path}: {message}")]
pub struct TimelineError {
    pub path: String,
    pub message: String,
}

const LOADING: RGBColor = RGBColor(230, 126, 34);
const GENERATING: RGBColor = RGBColor(39, 174, 96);
const IDLE: RGBColor = RGBColor(189, 195, 199);

/// Draw `devices` over `[t0, t1]` into `path`.
pub fn write_svg(
    path: &Path,
    title: &str,
    devices: &[DeviceTimeline],
    t0: f64,
    t1: f64,
) -> Result<(), TimelineError> {
    let err = |e: &dyn std::fmt::Display| TimelineError {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let height = 80 + 28 * devices.len() as u32;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let span = (t1 - t0).max(1e-6);
    let n = devices.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..span, 0.0..n)
        .map_err(|e| err(&e))?;
    let names: Vec<String> = devices.iter().enumerate().map(|(i, d)| format!("gpu{i} {}", d.name)).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("virtual seconds")
        .y_labels(0)
        .draw()
        .map_err(|e| err(&e))?;
    for (row, dev) in devices.iter().enumerate() {
        let y_top = n - row as f64 - 0.1;
        let y_bot = n - row as f64 - 0.9;
        // Colour the partition (so the picture shows exactly what the breakdown counts),
        // merging runs of one category separated by gaps under 0.2 % of the span.
        let mut rects: Vec<(f64, f64, RGBColor)> = Vec::new();
        sweep(&dev.segments, t0, t1, |a, b, cat, _| {
            let color = match cat {
                Category::Loading => LOADING,
                Category::Generation => GENERATING,
                Category::IdleResident => IDLE,
                Category::Other => return,
            };
            match rects.last_mut() {
                Some(last) if last.2 == color && a - last.1 < span * 0.002 => last.1 = b,
                _ => rects.push((a, b, color)),
            }
        });
        chart
            .draw_series(rects.into_iter().map(|(a, b, c)| {
                Rectangle::new([(a - t0, y_bot), (b - t0, y_top)], c.filled())
            }))
            .map_err(|e| err(&e))?;
    }
    // Row labels, drawn inside the plot at the left edge of each row.
    chart
        .draw_series(names.iter().enumerate().map(|(row, name)| {
            Text::new(name.clone(), (span * 0.002, n - row as f64 - 0.35), ("sans-serif", 11).into_font().color(&BLACK))
        }))
        .map_err(|e| err(&e))?;
    for (label, color) in [("loading", LOADING), ("generating", GENERATING), ("idle resident", IDLE)] {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
