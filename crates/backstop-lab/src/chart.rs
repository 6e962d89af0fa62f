//! The SVG chart: per second, the load the dependency sees, the answers users got in time
//! (goodput) and the latency users saw, one line per variant, each named at its right end in
//! its colour, the fault shaded.

use crate::scenario::Phase;
use plotters::{
    coord::types::RangedCoordf64,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};
use std::path::Path;

/// One variant's per-second series.
#[derive(Debug, Clone)]
pub struct Series {
    /// The variant's name.
    pub name: String,
    /// Attempts reaching the dependency, per second.
    pub attempts: Vec<f64>,
    /// p99 latency of the user requests of each second (ms), failures included.
    pub p99_ms: Vec<f64>,
    /// User requests of each second answered with a 2xx in time.
    pub goodput: Vec<f64>,
    /// User requests sent in each second.
    pub sent: Vec<f64>,
    /// What the variant's client measured of the dependency, once a second (empty for
    /// variants that measure nothing).
    pub measured: Vec<crate::MeasuredPoint>,
}

/// What the chart draws besides the variants' lines.
#[derive(Debug, Clone)]
pub struct Frame<'a> {
    /// The title, above the first panel.
    pub title: &'a str,
    /// The run's phases (the middle one is shaded).
    pub phases: &'a [Phase],
    /// User requests offered in each second.
    pub offered: &'a [f64],
    /// What the dependency could serve in each second, where its capacity is finite.
    pub capacity: Option<&'a [f64]>,
}

/// One panel of the chart.
type Panel<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
/// A panel's chart.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
/// Which series a panel draws.
type Pick = fn(&Series) -> &[f64];

/// Width of the whole chart, and the room on the right of each panel for the line names.
const WIDTH: u32 = 1100;
const LABEL_ROOM: u32 = 220;
/// Height of each of the three main panels, and of the measured-latency panel.
const PANEL: u32 = 330;
/// The line names' font size (px); labels are kept this many px apart, and a little more.
const LABEL_PX: f64 = 14.0;

/// The colour of a variant's lines and name: fixed per variant, so a chart of some variants
/// only keeps them.
pub fn color(name: &str) -> RGBColor {
    match name {
        "none" => RGBColor(120, 120, 120),
        "naive" => RGBColor(214, 39, 40),
        "tower" => RGBColor(255, 127, 14),
        "tower-resilience" => RGBColor(148, 103, 189),
        "backstop" => RGBColor(31, 119, 180),
        _ => RGBColor(44, 160, 44),
    }
}

/// Writes the chart to `path`.
///
/// # Errors
///
/// When the file cannot be written.
pub fn draw(
    path: &Path,
    frame: &Frame<'_>,
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    let svg = render(frame, series)?;
    std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(())
}

/// The chart as an SVG document.
///
/// # Errors
///
/// When plotters cannot draw it (a panel too small for its axes).
pub fn render(frame: &Frame<'_>, series: &[Series]) -> Result<String, Box<dyn std::error::Error>> {
    let mut svg = String::new();
    {
        let measured = series.iter().any(|s| !s.measured.is_empty());
        let height = PANEL * 3 + if measured { 340 } else { 0 };
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (attempts, rest) = root.split_vertically(PANEL);
        let (goodput, rest) = rest.split_vertically(PANEL);
        let (latency, last) = rest.split_vertically(PANEL);
        let seconds = series
            .iter()
            .map(|s| s.attempts.len())
            .max()
            .unwrap_or(1)
            .max(1) as f64;

        let panels: [(&Panel<'_>, String, Pick); 3] = [
            (
                &attempts,
                format!(
                    "{}: attempts reaching the dependency per second",
                    frame.title
                ),
                |s| &s.attempts,
            ),
            (
                &goodput,
                "goodput: user requests answered in time, per second sent".to_owned(),
                |s| &s.goodput,
            ),
            (
                &latency,
                "user p99 latency per second (ms), refusals included: read it with goodput"
                    .to_owned(),
                |s| &s.p99_ms,
            ),
        ];
        for (i, (area, caption, pick)) in panels.into_iter().enumerate() {
            let reference = if i < 2 {
                frame.offered.iter().copied().fold(1.0, f64::max)
            } else {
                1.0
            };
            let max = series
                .iter()
                .flat_map(|s| pick(s).iter().copied())
                .filter(|v| v.is_finite())
                .fold(reference, f64::max)
                * 1.15;
            let mut chart = framed(area, caption, seconds, max, &frame.phases[1])?;
            if i < 2 {
                reference_line(&mut chart, frame.offered, "offered", BLACK.mix(0.45))?;
            }
            if let (1, Some(capacity)) = (i, frame.capacity) {
                reference_line(
                    &mut chart,
                    capacity,
                    "capacity",
                    RGBColor(0, 130, 0).mix(0.8),
                )?;
            }
            let mut labels = Vec::new();
            for s in series {
                let values = pick(s);
                chart.draw_series(LineSeries::new(
                    values.iter().enumerate().map(|(t, v)| (t as f64 + 0.5, *v)),
                    color(&s.name).stroke_width(2),
                ))?;
                let label = if i == 2 {
                    // Latency alone flatters a caller that refuses fast: the name carries its
                    // success over the run.
                    format!("{} · {} ok", s.name, percent(overall_success(s)))
                } else {
                    s.name.clone()
                };
                labels.push((label, values.last().copied().unwrap_or(0.0), color(&s.name)));
            }
            name_line_ends(&mut chart, seconds, max, &labels)?;
        }
        if measured {
            draw_measured(&last, frame.phases, seconds, series)?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// A panel's chart: its caption, axes from 0 to `seconds` and to `max`, the mesh, and the
/// fault's time shaded and named.
fn framed<'a, 'b>(
    area: &'a Panel<'b>,
    caption: String,
    seconds: f64,
    max: f64,
    fault: &Phase,
) -> Result<Chart<'a, 'b>, Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .margin_right(LABEL_ROOM)
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
    chart.draw_series(std::iter::once(Text::new(
        fault.name.to_owned(),
        (fault.start.as_secs_f64() + 0.3, max * 0.97),
        ("sans-serif", 14).into_font().color(&RGBColor(180, 0, 0)),
    )))?;
    Ok(chart)
}

/// A thin step line of `values` (one per second), named `name` at its left end.
fn reference_line(
    chart: &mut Chart<'_, '_>,
    values: &[f64],
    name: &str,
    style: RGBAColor,
) -> Result<(), Box<dyn std::error::Error>> {
    let steps = values
        .iter()
        .enumerate()
        .flat_map(|(t, v)| [(t as f64, *v), (t as f64 + 1.0, *v)]);
    chart.draw_series(LineSeries::new(steps, style.stroke_width(1)))?;
    if let Some(first) = values.first() {
        let max = chart.y_range().end;
        chart.draw_series(std::iter::once(Text::new(
            name.to_owned(),
            (0.2, first + max * 0.02),
            ("sans-serif", 12)
                .into_font()
                .color(&style)
                .pos(Pos::new(HPos::Left, VPos::Bottom)),
        )))?;
    }
    Ok(())
}

/// Each `(label, value at the line's end, colour)` written just right of the panel's right
/// edge, level with its line's end, in its line's colour; labels of lines that end close
/// together are nudged apart so they do not overlap.
fn name_line_ends(
    chart: &mut Chart<'_, '_>,
    seconds: f64,
    max: f64,
    labels: &[(String, f64, RGBColor)],
) -> Result<(), Box<dyn std::error::Error>> {
    let (_, height_px) = chart.plotting_area().dim_in_pixel();
    let gap = max * (LABEL_PX + 2.0) / f64::from(height_px.max(1));
    let ends: Vec<f64> = labels
        .iter()
        .map(|l| if l.1.is_finite() { l.1 } else { 0.0 })
        .collect();
    for ((label, _, color), y) in labels.iter().zip(spread(&ends, gap, max)) {
        chart.draw_series(std::iter::once(Text::new(
            label.clone(),
            (seconds + seconds * 0.008, y),
            ("sans-serif", LABEL_PX)
                .into_font()
                .color(color)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        )))?;
    }
    Ok(())
}

/// The share of a variant's user requests that succeeded over the run.
fn overall_success(s: &Series) -> f64 {
    let sent: f64 = s.sent.iter().sum();
    let ok: f64 = s.goodput.iter().sum();
    if sent > 0.0 { ok / sent } else { 0.0 }
}

/// `share` as a whole percentage (one decimal under 10 %).
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p < 10.0 && p > 0.0 {
        format!("{p:.1} %")
    } else {
        format!("{p:.0} %")
    }
}

/// The fourth panel: the dependency's latency as each variant's client measured it (p99
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
    let mut labels = Vec::new();
    for s in series {
        let color = color(&s.name);
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
            labels.push((s.name.clone(), last, color));
        }
    }
    name_line_ends(&mut chart, seconds, max, &labels)?;
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
    use super::*;
    use crate::scenario::Scenario;
    use std::time::Duration;

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

    /// A `<text>` element of the SVG: where, in what colour, what it says.
    #[derive(Debug)]
    struct Label {
        x: f64,
        y: f64,
        fill: String,
        text: String,
    }

    fn attr(tag: &str, name: &str) -> Option<String> {
        let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        let end = start + tag[start..].find('"')?;
        Some(tag[start..end].to_owned())
    }

    fn texts(svg: &str) -> Vec<Label> {
        svg.split("<text")
            .skip(1)
            .filter_map(|rest| {
                let (tag, body) = rest.split_once('>')?;
                let text = body.split("</text>").next()?.trim().to_owned();
                Some(Label {
                    x: attr(tag, "x")?.parse().ok()?,
                    y: attr(tag, "y")?.parse().ok()?,
                    fill: attr(tag, "fill")?,
                    text,
                })
            })
            .collect()
    }

    /// The last point of each polyline of colour `fill` drawn 2 px wide (the variants' lines).
    fn line_ends(svg: &str, fill: &str) -> Vec<(f64, f64)> {
        svg.split("<polyline")
            .skip(1)
            .filter_map(|rest| {
                let tag = rest.split('>').next()?;
                if attr(tag, "stroke")? != fill || attr(tag, "stroke-width")? != "2" {
                    return None;
                }
                let points = attr(tag, "points")?;
                let last = points.split_whitespace().last()?;
                let (x, y) = last.split_once(',')?;
                Some((x.parse().ok()?, y.parse().ok()?))
            })
            .collect()
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    /// Five variants whose lines end at the same height in every panel, the worst case for
    /// the labels.
    fn series(seconds: usize) -> Vec<Series> {
        ["none", "naive", "tower", "tower-resilience", "backstop"]
            .into_iter()
            .enumerate()
            .map(|(n, name)| Series {
                name: name.to_owned(),
                attempts: (0..seconds).map(|t| (t * 10 + n) as f64).collect(),
                p99_ms: vec![10.0; seconds],
                goodput: vec![300.0; seconds],
                sent: vec![300.0; seconds],
                measured: Vec::new(),
            })
            .collect()
    }

    /// Each variant's name is written once per panel, in its line's colour, just right of
    /// where its line ends and level with it (or nudged by at most the labels' stack), and
    /// no two names overlap.
    #[test]
    fn each_line_is_named_once_at_its_end_in_its_colour() {
        let duration = Duration::from_secs(12);
        let scenario = Scenario::CapacityDrop;
        let phases = scenario.phases(duration);
        let offered = scenario.offered_per_second(1000, duration);
        let capacity = scenario
            .capacity_per_second(duration, crate::backend::SERVICE_TIME)
            .expect("capacity-drop has a capacity");
        let frame = Frame {
            title: "capacity-drop (sim, 1000 req/s)",
            phases: &phases,
            offered: &offered,
            capacity: Some(&capacity),
        };
        let series = series(12);
        let svg = render(&frame, &series).expect("renders");
        let labels = texts(&svg);
        for s in &series {
            let fill = hex(color(&s.name));
            let named: Vec<&Label> = labels
                .iter()
                .filter(|l| l.text == s.name || l.text.starts_with(&format!("{} · ", s.name)))
                .collect();
            assert_eq!(named.len(), 3, "{}: {named:?}", s.name);
            let ends = line_ends(&svg, &fill);
            assert_eq!(ends.len(), 3, "{}: one line per panel", s.name);
            for (label, (x, y)) in named.iter().zip(ends) {
                assert_eq!(label.fill, fill, "{}", s.name);
                assert!(
                    label.x > x && label.x - x < 40.0,
                    "{}: {label:?} vs {x}",
                    s.name
                );
                // Five labels stacked 16 px apart at most: within 4 gaps of the line.
                assert!(
                    (label.y - y).abs() <= 4.0 * 16.0 + 2.0,
                    "{}: {label:?} vs {y}",
                    s.name
                );
            }
        }
        // No two names of one panel overlap (the panels are PANEL px apart).
        let mut names: Vec<&Label> = labels
            .iter()
            .filter(|l| series.iter().any(|s| hex(color(&s.name)) == l.fill))
            .collect();
        names.sort_by(|a, b| a.y.total_cmp(&b.y));
        for pair in names.windows(2) {
            assert!(pair[1].y - pair[0].y >= LABEL_PX, "{pair:?}");
        }
        // The latency panel's names carry the success, so a fast refusal does not look best.
        assert!(
            labels.iter().any(|l| l.text == "backstop · 100 % ok"),
            "{labels:?}"
        );
        assert!(labels.iter().any(|l| l.text == "capacity"));
    }
}
