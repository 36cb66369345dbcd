//! Plots of a run, PNG and SVG, drawn with `plotters`: a line per series through the medians,
//! with min-max bars, against message size; both axes logarithmic. Text is drawn with
//! `plotters`' pure-Rust font support (`ab_glyph`) from DejaVu Sans, which `cargo xtask setup`
//! installs (`fonts-dejavu-core`).

use crate::results::Spread;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// The font file, from Debian's `fonts-dejavu-core` (in `dmabuf_testbed::setup::PACKAGES`).
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

const SIZE: (u32, u32) = (960, 600);

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Line {
    /// Its legend.
    pub label: String,
    /// (message size, spread) in size order.
    pub points: Vec<(u64, Spread)>,
    /// Drawn dashed (a second figure of the same series, e.g. deregistration).
    pub dashed: bool,
}

/// A chart.
#[derive(Clone, Debug)]
pub struct Chart {
    /// Its caption.
    pub title: String,
    /// The y axis' description.
    pub y_label: String,
    /// Its lines.
    pub lines: Vec<Line>,
    /// A horizontal line at this value (e.g. a ratio of 1).
    pub reference: Option<f64>,
}

/// Loads the font once.
fn font() -> Result<(), String> {
    static LOADED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT).map_err(|e| {
                format!("{FONT}: {e} (Debian's fonts-dejavu-core: run `cargo xtask setup`)")
            })?;
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{FONT} is not a font plotters can read"))
        })
        .clone()
}

/// Draws `chart` into `base`.png and `base`.svg; returns their paths.
///
/// # Errors
/// No font, no point to draw, or a file cannot be written.
pub fn draw(chart: &Chart, base: &Path) -> Result<Vec<PathBuf>, String> {
    let sizes = Axis {
        desc: "message size, bytes",
        label: size_label,
    };
    draw_against(chart, base, &sizes)
}

/// The x axis of a chart: its description and how a value is labelled.
pub struct Axis {
    /// Its description.
    pub desc: &'static str,
    /// A value's label.
    pub label: fn(f64) -> String,
}

/// As [`draw`], against the x axis `x` (a count, rather than message sizes).
pub fn draw_against(chart: &Chart, base: &Path, x: &Axis) -> Result<Vec<PathBuf>, String> {
    font()?;
    let png = base.with_extension("png");
    let svg = base.with_extension("svg");
    render(BitMapBackend::new(&png, SIZE).into_drawing_area(), chart, x)
        .map_err(|e| format!("{}: {e}", png.display()))?;
    render(SVGBackend::new(&svg, SIZE).into_drawing_area(), chart, x)
        .map_err(|e| format!("{}: {e}", svg.display()))?;
    Ok(vec![png, svg])
}

/// `10`, `1000`, `100000`: a count as it is (rounded).
pub fn count_label(x: f64) -> String {
    format!("{}", x.round() as u64)
}

/// `2`, `64`, `4K`, `1M`: the power of two nearest `x`.
fn size_label(x: f64) -> String {
    let p = x.max(1.0).log2().round() as u32;
    match p {
        0..=9 => format!("{}", 1u64 << p),
        10..=19 => format!("{}K", 1u64 << (p - 10)),
        _ => format!("{}M", 1u64 << (p - 20)),
    }
}

/// The range of the y axis: all mins and maxes with a margin (a log axis needs it positive).
fn y_range(chart: &Chart) -> Option<(f64, f64)> {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    // A log axis has no room for 0 (perftest prints 0.00 MB/s for its smallest messages):
    // the floor is the smallest positive figure, and lower ones are drawn on it.
    for (_, s) in chart.lines.iter().flat_map(|l| &l.points) {
        for x in [s.min, s.median, s.max].into_iter().filter(|x| *x > 0.0) {
            lo = lo.min(x);
        }
        hi = hi.max(s.max);
    }
    if let Some(r) = chart.reference {
        lo = lo.min(r);
        hi = hi.max(r);
    }
    (lo.is_finite() && hi.is_finite() && lo > 0.0).then_some((lo / 1.5, hi * 1.5))
}

/// The y axis's labelled values between `lo` and `hi`: 1, 2 and 5 times each power of ten
/// over up to three decades (so that an axis spanning a decade, such as instructions per
/// write, 150 to 1,200, is labelled at more than one value), 1 and 3 times over up to six,
/// the powers of ten alone over more.
fn y_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let steps: &[f64] = match last - first {
        ..=3 => &[1.0, 2.0, 5.0],
        4..=6 => &[1.0, 3.0],
        _ => &[1.0],
    };
    (first..=last)
        .flat_map(|p| steps.iter().map(move |m| m * 10f64.powi(p)))
        .filter(|y| (lo..=hi).contains(y))
        .collect()
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    c: &Chart,
    x: &Axis,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (y0, y1) = y_range(c).ok_or_else(|| format!("{}: nothing to draw", c.title))?;
    let on = |y: f64| y.max(y0);
    let sizes = c
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|(s, _)| *s as f64));
    let (x0, x1) = sizes.fold((f64::INFINITY, 0f64), |(a, b), s| (a.min(s), b.max(s)));
    root.fill(&WHITE).map_err(e)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0 / 1.5..x1 * 1.5).log_scale().base(2.0),
            (y0..y1).log_scale().with_key_points(y_ticks(y0, y1)),
        )
        .map_err(e)?;
    ch.configure_mesh()
        .x_desc(x.desc)
        .y_desc(&c.y_label)
        .x_label_formatter(&|v| (x.label)(*v))
        .y_label_formatter(&|y| crate::units::num(*y))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    if let Some(r) = c.reference {
        ch.draw_series(LineSeries::new(
            [(x0 / 1.5, r), (x1 * 1.5, r)],
            BLACK.mix(0.6),
        ))
        .map_err(e)?;
    }
    for (i, l) in c.lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = l.points.iter().map(|(s, sp)| (*s as f64, on(sp.median)));
        let style = color.stroke_width(2);
        let drawn = if l.dashed {
            ch.draw_series(DashedLineSeries::new(points, 8, 5, style))
        } else {
            ch.draw_series(LineSeries::new(points, style))
        }
        .map_err(e)?;
        drawn.label(&l.label).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        ch.draw_series(
            l.points
                .iter()
                .filter(|(_, sp)| sp.max > sp.min)
                .map(|(s, sp)| {
                    let (min, med, max) = (on(sp.min), on(sp.median), on(sp.max));
                    ErrorBar::new_vertical(*s as f64, min, med, max, color, 6)
                }),
        )
        .map_err(e)?;
        ch.draw_series(
            l.points
                .iter()
                .map(|(s, sp)| Circle::new((*s as f64, on(sp.median)), 3, color.filled())),
        )
        .map_err(e)?;
    }
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_narrow_log_axis_is_labelled_at_several_values() {
        assert_eq!(y_ticks(110.0, 1800.0), vec![200.0, 500.0, 1000.0]);
        assert_eq!(y_ticks(0.5, 30.0), vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0]);
        assert_eq!(y_ticks(0.02, 900.0).len(), 9);
        assert_eq!(y_ticks(0.002, 90_000.0).len(), 7);
    }

    #[test]
    fn size_labels_are_powers_of_two() {
        assert_eq!(size_label(2.0), "2");
        assert_eq!(size_label(4100.0), "4K");
        assert_eq!(size_label(8.0 * 1048576.0), "8M");
    }

    #[test]
    fn a_chart_is_drawn_as_png_and_svg() {
        let sp = |m: f64| Spread {
            min: m * 0.9,
            median: m,
            max: m * 1.1,
            n: 3,
        };
        let chart = Chart {
            title: "test".into(),
            y_label: "MiB/s".into(),
            lines: vec![Line {
                label: "perftest".into(),
                points: vec![(2, sp(0.1)), (1 << 20, sp(50.0))],
                dashed: false,
            }],
            reference: Some(1.0),
        };
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = draw(&chart, &dir.join("bw")).unwrap();
        let svg = std::fs::read_to_string(&files[1]).unwrap();
        assert!(svg.contains("perftest") && svg.contains("<svg"), "{svg}");
        assert!(std::fs::metadata(&files[0]).unwrap().len() > 1000);
        let empty = Chart {
            lines: vec![],
            reference: None,
            ..chart
        };
        assert!(draw(&empty, &dir.join("none")).is_err());
        // A zero (perftest's 0.00 MB/s) sits on the axis' floor.
        let zero = Chart {
            lines: vec![Line {
                label: "zero".into(),
                points: vec![(2, sp(0.0)), (8, sp(1.0))],
                dashed: false,
            }],
            reference: None,
            ..empty
        };
        assert_eq!(y_range(&zero).map(|r| r.0), Some(0.9 / 1.5));
        draw(&zero, &dir.join("zero")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
