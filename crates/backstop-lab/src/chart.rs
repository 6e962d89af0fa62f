//! The SVG chart: downstream load and user latency over time, one line per variant, each
//! labelled where it ends, the fault shaded.

use crate::scenario::Phase;
use plotters::prelude::*;
use std::path::Path;

/// One variant's per-second series.
#[derive(Debug, Clone)]
pub struct Series {
    /// The variant's name.
    pub name: String,
    /// Attempts reaching the dependency, per second.
    pub attempts: Vec<f64>,
    /// p99 latency of the user requests of each second (ms).
    pub p99_ms: Vec<f64>,
}

const COLORS: [RGBColor; 4] = [
    RGBColor(120, 120, 120),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(31, 119, 180),
];

/// Writes the chart to `path`.
///
/// # Errors
///
/// When the file cannot be written.
pub fn draw(
    path: &Path,
    title: &str,
    phases: &[Phase],
    offered_rps: f64,
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(390);
    let seconds = series.iter().map(|s| s.attempts.len()).max().unwrap_or(1) as f64;
    let fault = &phases[1];
    let (fault_start, fault_end) = (fault.start.as_secs_f64(), fault.end.as_secs_f64());

    let panels: [(&DrawingArea<SVGBackend<'_>, _>, &str, fn(&Series) -> &[f64]); 2] = [
        (&top, "attempts reaching the dependency per second", |s| {
            &s.attempts
        }),
        (&bottom, "user p99 latency per second (ms)", |s| &s.p99_ms),
    ];
    for (i, (area, caption, pick)) in panels.into_iter().enumerate() {
        let max = series
            .iter()
            .flat_map(|s| pick(s).iter().copied())
            .fold(if i == 0 { offered_rps } else { 1.0 }, f64::max)
            * 1.15;
        let caption = if i == 0 {
            format!("{title}: {caption}")
        } else {
            caption.to_owned()
        };
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .margin_right(90)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..seconds, 0f64..max)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(fault_start, 0.0), (fault_end, max)],
            RGBColor(255, 200, 200).mix(0.35).filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            fault.name.to_owned(),
            (fault_start + 0.3, max * 0.95),
            ("sans-serif", 14).into_font().color(&RGBColor(180, 0, 0)),
        )))?;
        if i == 0 {
            chart.draw_series(LineSeries::new(
                [(0.0, offered_rps), (seconds, offered_rps)],
                BLACK.mix(0.4).stroke_width(1),
            ))?;
            chart.draw_series(std::iter::once(Text::new(
                "offered".to_owned(),
                (seconds * 0.01, offered_rps * 1.03),
                ("sans-serif", 12).into_font().color(&BLACK.mix(0.6)),
            )))?;
        }
        for (n, s) in series.iter().enumerate() {
            let color = COLORS[n % COLORS.len()];
            let values = pick(s);
            chart.draw_series(LineSeries::new(
                values.iter().enumerate().map(|(t, v)| (t as f64 + 0.5, *v)),
                color.stroke_width(2),
            ))?;
            // The name where the line ends, so no legend is needed.
            if let Some((t, v)) = values.iter().enumerate().next_back() {
                chart.draw_series(std::iter::once(Text::new(
                    s.name.clone(),
                    (t as f64 + 0.8, *v),
                    ("sans-serif", 14).into_font().color(&color),
                )))?;
            }
        }
    }
    root.present()?;
    Ok(())
}
