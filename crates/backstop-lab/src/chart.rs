//! The SVG chart: downstream load and user latency over time, one line per variant, each
//! labelled where it ends, the fault shaded.

use crate::scenario::Phase;
use plotters::{coord::types::RangedCoordf64, prelude::*};
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
    /// What the variant's client measured of the dependency, once a second (empty for
    /// variants that measure nothing).
    pub measured: Vec<crate::MeasuredPoint>,
}

/// One panel of the chart.
type Panel<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
/// Which series a panel draws.
type Pick = fn(&Series) -> &[f64];

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
    let measured = series.iter().any(|s| !s.measured.is_empty());
    let height = if measured { 1100 } else { 760 };
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, rest) = root.split_vertically(390);
    let (bottom, third) = rest.split_vertically(370);
    let seconds = series.iter().map(|s| s.attempts.len()).max().unwrap_or(1) as f64;
    let fault = &phases[1];
    let fault_start = fault.start.as_secs_f64();

    let panels: [(&Panel<'_>, &str, Pick); 2] = [
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
        let mut chart = framed(area, caption, seconds, max, fault)?;
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
        }
        // Each name where its line ends, so no legend is needed; names of lines that end
        // close together are spread apart.
        let ends: Vec<f64> = series
            .iter()
            .map(|s| pick(s).last().copied().unwrap_or(0.0))
            .collect();
        for (n, y) in spread(&ends, max * 0.07, max).into_iter().enumerate() {
            let color = COLORS[n % COLORS.len()];
            chart.draw_series(std::iter::once(Text::new(
                series[n].name.clone(),
                (seconds + 0.4, y),
                ("sans-serif", 14).into_font().color(&color),
            )))?;
        }
    }
    if measured {
        draw_measured(&third, phases, seconds, series)?;
    }
    root.present()?;
    Ok(())
}

/// A panel's chart: its caption, axes from 0 to `seconds` and to `max`, the mesh, and the
/// fault's time shaded.
fn framed<'a, 'b>(
    area: &'a Panel<'b>,
    caption: String,
    seconds: f64,
    max: f64,
    fault: &Phase,
) -> Result<
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    Box<dyn std::error::Error>,
> {
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
        [
            (fault.start.as_secs_f64(), 0.0),
            (fault.end.as_secs_f64(), max),
        ],
        RGBColor(255, 200, 200).mix(0.35).filled(),
    )))?;
    Ok(chart)
}

/// The third panel: the dependency's latency as each variant's client measured it (p99
/// solid, p50 thin), once a second.
fn draw_measured(
    area: &Panel<'_>,
    phases: &[Phase],
    seconds: f64,
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    let max = series
        .iter()
        .flat_map(|s| s.measured.iter())
        .flat_map(|p| [p.p50_ms, p.p99_ms])
        .flatten()
        .fold(1.0, f64::max)
        * 1.15;
    let caption = "the dependency's latency as the client measured it (ms): p99 thick, p50 thin";
    let mut chart = framed(area, caption.to_owned(), seconds, max, &phases[1])?;
    for (n, s) in series.iter().enumerate() {
        let color = COLORS[n % COLORS.len()];
        type Pick = fn(&crate::MeasuredPoint) -> Option<f64>;
        let lines: [(Pick, u32); 2] = [(|p| p.p99_ms, 2), (|p| p.p50_ms, 1)];
        for (pick, width) in lines {
            chart.draw_series(LineSeries::new(
                s.measured
                    .iter()
                    .filter_map(|p| pick(p).map(|v| (p.t_s, v))),
                color.stroke_width(width),
            ))?;
        }
        if let Some(last) = s.measured.iter().rev().find_map(|p| p.p99_ms) {
            chart.draw_series(std::iter::once(Text::new(
                s.name.clone(),
                (seconds + 0.4, last),
                ("sans-serif", 14).into_font().color(&color),
            )))?;
        }
    }
    Ok(())
}

/// Label heights for lines ending at `ends`: each as close to its line's end as it can be,
/// at least `gap` apart, within `0..=max`.
fn spread(ends: &[f64], gap: f64, max: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..ends.len()).collect();
    order.sort_by(|&a, &b| ends[a].total_cmp(&ends[b]).then(a.cmp(&b)));
    let mut placed = vec![0.0; ends.len()];
    let mut floor = f64::MIN;
    for &i in &order {
        let y = ends[i].max(floor + gap).max(gap / 2.0);
        placed[i] = y;
        floor = y;
    }
    // Pushed past the top: shift the whole stack down.
    let overflow = floor - (max - gap / 2.0);
    if overflow > 0.0 {
        for y in &mut placed {
            *y -= overflow;
        }
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn labels_keep_apart() {
        let ys = spread(&[1000.0, 1000.0, 1000.0, 0.0], 70.0, 1150.0);
        let mut sorted = ys.clone();
        sorted.sort_by(f64::total_cmp);
        for pair in sorted.windows(2) {
            assert!(pair[1] - pair[0] >= 70.0 - 1e-9, "{ys:?}");
        }
        assert!(ys.iter().all(|&y| (0.0..=1150.0).contains(&y)), "{ys:?}");
        assert_eq!(spread(&[10.0, 500.0], 70.0, 1000.0), vec![35.0, 500.0]);
    }
}
