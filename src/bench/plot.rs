//! Figures from the JSON that `pmtx bench ... --json FILE` writes (an array of
//! [`RunReport`](super::RunReport)s), in the style of the papers' evaluation figures: lines with
//! markers per engine, a light grid, a legend.
//!
//! | figure | x | y | series |
//! | --- | --- | --- | --- |
//! | [`Figure::Throughput`] | threads | committed tx/s (median over rounds) | workload × engine |
//! | [`Figure::Ratio`] | threads | throughput ÷ volatile, same round (median) | workload × non-volatile engine |
//! | [`Figure::Cdf`] | latency (µs, log scale, cut at 2 × the largest p99.9) | fraction of transactions ≤ x | workload × engine × threads (first round) |
//! | [`Figure::Kinds`] | per transaction type: throughput (left), p50 latency (right), median over rounds | type | engine (largest thread count) |
//!
//! PNG (bitmap) or SVG, chosen by the output's extension. Text is drawn with DejaVu Sans, shipped
//! in `assets/fonts` and compiled in, so no system font configuration is needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

/// DejaVu Sans (Bitstream Vera licence, see `assets/fonts/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
/// The family name the figures use; registered once from [`FONT`].
const FAMILY: &str = "sans-serif";

/// Why plotting failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// An input file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An input file is not the JSON `pmtx bench --json` writes.
    #[error("{path} is not a pmtx bench JSON file (an array of runs): {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// An input value makes no sense (negative or non-finite figures).
    #[error("{path}: run {index} ({engine}): {reason}")]
    BadRun {
        /// The file.
        path: PathBuf,
        /// Position of the run in the file.
        index: usize,
        /// Its engine.
        engine: String,
        /// What is wrong.
        reason: String,
    },
    /// The inputs hold no run.
    #[error("no runs to plot: the input files hold empty arrays")]
    NoRuns,
    /// The inputs lack what a figure needs (e.g. ratios without `--compare-volatile`).
    #[error("cannot draw the {figure} figure: {reason}")]
    Missing {
        /// The figure.
        figure: &'static str,
        /// What is missing.
        reason: String,
    },
    /// The output's extension names no supported format.
    #[error("output {0}: the file name must end in .png or .svg")]
    Format(PathBuf),
    /// Drawing or writing the image failed.
    #[error("cannot draw {path}: {message}")]
    Draw {
        /// The output.
        path: PathBuf,
        /// The backend's error.
        message: String,
    },
}

/// Latency percentiles of a run or kind, as in the JSON (µs).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
pub struct PlotLatency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// One transaction kind of a run, as in the JSON.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct PlotKind {
    /// Kind name.
    pub name: String,
    /// Committed tx/s.
    pub throughput_tps: f64,
    /// Latency percentiles.
    pub latency_us: PlotLatency,
    /// Share of expected failures (absent in older files: 0).
    #[serde(default)]
    pub fail_rate: f64,
}

/// The fields of one run the figures use; other fields of the JSON are ignored.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct PlotRun {
    /// Engine name.
    pub engine: String,
    /// Workload name.
    pub workload: String,
    /// Driver threads.
    pub threads: usize,
    /// Committed tx/s.
    pub throughput_tps: f64,
    /// Ratio to the volatile run of the same round, when measured.
    #[serde(default)]
    pub ratio_to_volatile: Option<f64>,
    /// Latency CDF points `(µs, fraction)` (absent in older files: empty).
    #[serde(default)]
    pub latency_cdf_us: Vec<(f64, f64)>,
    /// Per transaction kind.
    #[serde(default)]
    pub per_kind: Vec<PlotKind>,
    /// Run parameters (`round` is used).
    #[serde(default)]
    pub params: serde_json::Value,
    /// PM traffic per transaction; only the media model's bytes are drawn.
    #[serde(default)]
    pub pm: PlotPm,
    /// Milliseconds to recover the run's pool afterwards (median of the recoveries measured;
    /// written by `pmtx reproduce fir`).
    #[serde(default)]
    pub recovery_ms: Option<f64>,
}

/// The part of a run's `pm` object the media figure draws.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
pub struct PlotPm {
    /// Bytes the PM media model wrote per transaction (`null` without a model).
    #[serde(default)]
    pub media_bytes_per_txn: Option<f64>,
}

impl PlotRun {
    fn round(&self) -> u64 {
        self.params
            .get("round")
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    }

    fn check(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if self.threads == 0 {
            return Err("threads is 0".into());
        }
        if !ok(self.throughput_tps) || !self.ratio_to_volatile.map_or(true, ok) {
            return Err("throughput or ratio is negative or not finite".into());
        }
        if self
            .latency_cdf_us
            .iter()
            .any(|&(x, y)| !ok(x) || !(0.0..=1.0).contains(&y))
        {
            return Err("a latency CDF point is out of range".into());
        }
        if !self.pm.media_bytes_per_txn.map_or(true, ok) {
            return Err("media bytes per transaction is negative or not finite".into());
        }
        if !self.recovery_ms.map_or(true, ok) {
            return Err("recovery time is negative or not finite".into());
        }
        if self
            .per_kind
            .iter()
            .any(|k| !ok(k.throughput_tps) || !ok(k.latency_us.p50) || !ok(k.latency_us.p99))
        {
            return Err("a per-kind figure is negative or not finite".into());
        }
        Ok(())
    }
}

/// Reads and validates the runs of every file in `paths`, in order.
pub fn load_runs(paths: &[impl AsRef<Path>]) -> Result<Vec<PlotRun>, PlotError> {
    let mut runs = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| PlotError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file: Vec<PlotRun> =
            serde_json::from_str(&text).map_err(|source| PlotError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        for (index, run) in file.iter().enumerate() {
            run.check().map_err(|reason| PlotError::BadRun {
                path: path.to_path_buf(),
                index,
                engine: run.engine.clone(),
                reason,
            })?;
        }
        runs.extend(file);
    }
    if runs.is_empty() {
        return Err(PlotError::NoRuns);
    }
    Ok(runs)
}

/// A figure `pmtx plot` can draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Figure {
    /// Throughput against threads.
    Throughput,
    /// Ratio to volatile against threads.
    Ratio,
    /// Latency CDFs.
    Cdf,
    /// Per-transaction-type throughput and latency bars.
    Kinds,
    /// Throughput and PM media bytes written per transaction, a bar per run (runs with a media
    /// model, `--media-model`).
    Media,
    /// Throughput and the time to recover the run's pool, a bar per run (runs with
    /// `recovery_ms`, as `pmtx reproduce fir` writes them).
    Recovery,
}

impl Figure {
    /// Every figure, in drawing order.
    pub const ALL: [Figure; 6] = [
        Figure::Throughput,
        Figure::Ratio,
        Figure::Cdf,
        Figure::Kinds,
        Figure::Media,
        Figure::Recovery,
    ];

    /// Its name (also the suffix of its file when several are drawn).
    pub fn name(self) -> &'static str {
        match self {
            Figure::Throughput => "throughput",
            Figure::Ratio => "ratio",
            Figure::Cdf => "cdf",
            Figure::Kinds => "kinds",
            Figure::Media => "media",
            Figure::Recovery => "recovery",
        }
    }

    /// Whether `runs` hold what this figure needs.
    pub fn applies_to(self, runs: &[PlotRun]) -> Result<(), PlotError> {
        let missing = |reason: &str| {
            Err(PlotError::Missing {
                figure: self.name(),
                reason: reason.to_string(),
            })
        };
        match self {
            Figure::Throughput => Ok(()),
            Figure::Ratio if !runs.iter().any(|r| r.ratio_to_volatile.is_some()) => missing(
                "no run has a ratio to volatile (run the benchmark with --compare-volatile)",
            ),
            Figure::Cdf if runs.iter().all(|r| r.latency_cdf_us.is_empty()) => {
                missing("no run has a latency CDF (latency_cdf_us)")
            }
            Figure::Kinds if runs.iter().all(|r| r.per_kind.len() < 2) => {
                missing("no run has more than one transaction type")
            }
            Figure::Media if runs.iter().all(|r| r.pm.media_bytes_per_txn.is_none()) => {
                missing("no run has media figures (run the benchmark with --media-model)")
            }
            Figure::Recovery if runs.iter().all(|r| r.recovery_ms.is_none()) => {
                missing("no run has a recovery time (recovery_ms, from `pmtx reproduce fir`)")
            }
            _ => Ok(()),
        }
    }
}

/// Where figure `figure` goes when `out` names the output: `out` itself when it is the only
/// figure, else `out` with `-<figure>` before the extension.
pub fn output_path(out: &Path, figure: Figure, only_one: bool) -> PathBuf {
    if only_one {
        return out.to_path_buf();
    }
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = out
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!("{stem}-{}.{ext}", figure.name()))
}

/// The CDF figure's x axis ends at twice the latency where the slowest series reaches this
/// fraction (when the recorded maximum lies further out).
pub const CDF_CUT_FRACTION: f64 = 0.999;

/// Image size in pixels.
pub const SIZE: (u32, u32) = (960, 600);

/// Draws `figures` from `runs`: one file each, named by [`output_path`] (so `out` itself when
/// there is one figure). Returns the files written.
pub fn plot(runs: &[PlotRun], figures: &[Figure], out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let mut written = Vec::new();
    for &figure in figures {
        let path = output_path(out, figure, figures.len() == 1);
        draw_figure(runs, figure, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// Draws `figure` from `runs` into `path`, PNG or SVG after its extension.
pub fn draw_figure(runs: &[PlotRun], figure: Figure, path: &Path) -> Result<(), PlotError> {
    let svg = match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("png") => false,
        Some("svg") => true,
        _ => return Err(PlotError::Format(path.to_path_buf())),
    };
    if runs.is_empty() {
        return Err(PlotError::NoRuns);
    }
    figure.applies_to(runs)?;
    register_font();
    let drawn = if svg {
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        draw(&root, runs, figure).and_then(|()| root.present().map_err(|e| e.to_string()))
    } else {
        let root = BitMapBackend::new(path, SIZE).into_drawing_area();
        draw(&root, runs, figure).and_then(|()| root.present().map_err(|e| e.to_string()))
    };
    drawn.map_err(|message| PlotError::Draw {
        path: path.to_path_buf(),
        message,
    })
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The font is compiled in and known to parse; a failure would show as missing text.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[PlotRun],
    figure: Figure,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    match figure {
        Figure::Throughput => draw_by_threads(root, runs, false),
        Figure::Ratio => draw_by_threads(root, runs, true),
        Figure::Cdf => draw_cdf(root, runs),
        Figure::Kinds => draw_kinds(root, runs),
        Figure::Media => draw_bars(
            root,
            runs,
            "throughput and PM media writes (media model)",
            "media bytes written per transaction",
            |r| r.pm.media_bytes_per_txn,
        ),
        Figure::Recovery => draw_bars(
            root,
            runs,
            "throughput and recovery time",
            "recovery time (ms)",
            |r| r.recovery_ms,
        ),
    }
    .map_err(|e| e.to_string())
}

/// Colour of an engine: fixed for the known ones so figures agree with each other.
fn engine_color(engine: &str, fallback: usize) -> RGBColor {
    match engine {
        "falcon" => RGBColor(31, 119, 180),
        "falcon-noflush" => RGBColor(23, 190, 207),
        "falcon-allflush" => RGBColor(148, 103, 189),
        "inp" => RGBColor(255, 127, 14),
        "volatile" => RGBColor(90, 90, 90),
        _ => {
            const OTHERS: [RGBColor; 5] = [
                RGBColor(44, 160, 44),
                RGBColor(214, 39, 40),
                RGBColor(140, 86, 75),
                RGBColor(227, 119, 194),
                RGBColor(188, 189, 34),
            ];
            OTHERS[fallback % OTHERS.len()]
        }
    }
}

/// A series label: the engine, prefixed by the workload when several are plotted.
fn series_name(run: &PlotRun, many_workloads: bool) -> String {
    if many_workloads {
        format!("{} {}", run.workload, run.engine)
    } else {
        run.engine.clone()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    super::median_and_range(&mut v).0
}

fn workloads(runs: &[PlotRun]) -> Vec<&str> {
    let mut w: Vec<&str> = runs.iter().map(|r| r.workload.as_str()).collect();
    w.dedup();
    w.sort_unstable();
    w.dedup();
    w
}

fn title_style() -> TextStyle<'static> {
    TextStyle::from((FAMILY, 22).into_font())
}

fn caption(runs: &[PlotRun], what: &str) -> String {
    format!("{}: {what}", workloads(runs).join(", "))
}

/// A line: its label, its engine (for the colour) and its points.
type Series = (String, String, Vec<(f64, f64)>);

/// One panel of the per-kind figure: where, the axis description, the value, whether it shows
/// the kind names and legend.
type KindPanel<'a, DB> = (
    &'a DrawingArea<DB, Shift>,
    &'a str,
    fn(&PlotKind) -> f64,
    bool,
);

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Throughput (or ratio to volatile) against thread count, median over rounds.
fn draw_by_threads<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[PlotRun],
    ratio: bool,
) -> DrawResult<DB> {
    let many = workloads(runs).len() > 1;
    // series → threads → values over rounds; BTreeMap keeps a stable order.
    let mut series: BTreeMap<(String, String), BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    for r in runs {
        let value = if ratio {
            if r.engine == "volatile" {
                continue;
            }
            match r.ratio_to_volatile {
                Some(v) => v,
                None => continue,
            }
        } else {
            r.throughput_tps
        };
        series
            .entry((series_name(r, many), r.engine.clone()))
            .or_default()
            .entry(r.threads)
            .or_default()
            .push(value);
    }
    let points: Vec<Series> = series
        .into_iter()
        .map(|((name, engine), by_threads)| {
            let pts = by_threads
                .into_iter()
                .map(|(t, v)| (t as f64, median(v)))
                .collect();
            (name, engine, pts)
        })
        .collect();
    let max_threads = runs.iter().map(|r| r.threads).max().unwrap_or(1) as f64;
    let max_y = points
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|&(_, y)| y))
        .fold(0.0, f64::max);
    let (scale, unit) = if ratio {
        (1.0, "")
    } else if max_y >= 1e6 {
        (1e6, "M")
    } else if max_y >= 1e3 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let top = if ratio {
        (max_y * 1.15).max(1.1)
    } else {
        (max_y / scale * 1.15).max(1e-9)
    };
    let what = if ratio {
        "throughput relative to volatile (median over rounds)"
    } else {
        "throughput by thread count (median over rounds)"
    };
    let mut chart = ChartBuilder::on(root)
        .caption(caption(runs, what), title_style())
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.5..max_threads + 0.5, 0.0..top)?;
    let y_desc = if ratio {
        "× volatile".to_string()
    } else {
        format!("throughput ({unit}tx/s)")
    };
    let x_fmt = |x: &f64| {
        if (x - x.round()).abs() < 1e-9 && *x >= 1.0 {
            format!("{}", x.round() as u64)
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc(y_desc)
        .x_labels((max_threads as usize + 1).min(16))
        .x_label_formatter(&x_fmt)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    if ratio {
        chart.draw_series(LineSeries::new(
            [(0.5, 1.0), (max_threads + 0.5, 1.0)],
            ShapeStyle::from(&RGBColor(150, 150, 150)).stroke_width(1),
        ))?;
    }
    for (i, (name, engine, pts)) in points.iter().enumerate() {
        let color = engine_color(engine, i);
        let scaled: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (x, y / scale)).collect();
        chart
            .draw_series(LineSeries::new(
                scaled.clone(),
                ShapeStyle::from(&color).stroke_width(3),
            ))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], color.stroke_width(3)));
        chart.draw_series(scaled.iter().map(|&p| Circle::new(p, 5, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Latency CDFs on a log x axis, one per engine and thread count (round 0 of each).
fn draw_cdf<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, runs: &[PlotRun]) -> DrawResult<DB> {
    let many = workloads(runs).len() > 1;
    let min_round = runs.iter().map(PlotRun::round).min().unwrap_or(0);
    let chosen: Vec<&PlotRun> = runs
        .iter()
        .filter(|r| r.round() == min_round && !r.latency_cdf_us.is_empty())
        .collect();
    let positive = chosen
        .iter()
        .flat_map(|r| r.latency_cdf_us.iter().map(|&(x, _)| x))
        .filter(|&x| x > 0.0);
    let lo = positive.clone().fold(f64::INFINITY, f64::min);
    let max = positive.fold(0.0, f64::max);
    // Rare stalls (the scheduler, page faults) stretch the axis far past where the curves are; as
    // in the papers' figures, cut it a little past the slowest series' 99.9th percentile.
    let p999 = chosen
        .iter()
        .filter_map(|r| {
            r.latency_cdf_us
                .iter()
                .find(|&&(_, y)| y >= CDF_CUT_FRACTION)
                .map(|&(x, _)| x)
        })
        .fold(0.0, f64::max);
    let cut = p999 > 0.0 && p999 * 2.0 < max;
    let hi = if cut { p999 * 2.0 } else { max * 1.25 };
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo * 0.8, hi)
    } else {
        (0.1, 10.0)
    };
    let what = if cut {
        "latency CDF (first round; x axis cut at 2 × the largest p99.9)"
    } else {
        "latency CDF (first round)"
    };
    let mut chart = ChartBuilder::on(root)
        .caption(caption(runs, what), title_style())
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.02)?;
    let x_fmt = |x: &f64| {
        if *x >= 100.0 {
            format!("{x:.0}")
        } else if *x >= 1.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    };
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("fraction of transactions ≤ x")
        .x_label_formatter(&x_fmt)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let thread_counts: Vec<usize> = {
        let mut t: Vec<usize> = chosen.iter().map(|r| r.threads).collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    for (i, r) in chosen.iter().enumerate() {
        let color = engine_color(&r.engine, i);
        // Engines keep their colour; thread counts differ by dash pattern (solid for the fewest).
        let rank = thread_counts
            .iter()
            .position(|&t| t == r.threads)
            .unwrap_or(0) as i32;
        let mut pts: Vec<(f64, f64)> = r
            .latency_cdf_us
            .iter()
            .filter(|&&(x, _)| x > 0.0)
            .copied()
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Past the cut, the curve continues flat at the height it reached.
        if let Some(last_in) = pts.iter().rposition(|&(x, _)| x <= hi) {
            if last_in + 1 < pts.len() {
                let y = pts[last_in].1;
                pts.truncate(last_in + 1);
                pts.push((hi, y));
            }
        }
        let style = ShapeStyle::from(&color).stroke_width(3);
        let label = format!("{} · {} thr", series_name(r, many), r.threads);
        let gap = if rank == 0 { 0 } else { 4 + 2 * rank };
        let legend = move |(x, y): (i32, i32)| {
            EmptyElement::at((x, y))
                + PathElement::new([(0, 0), (10, 0)], style)
                + PathElement::new([(10 + gap.min(8), 0), (26, 0)], style)
        };
        if rank == 0 {
            chart
                .draw_series(LineSeries::new(pts, style))?
                .label(label)
                .legend(legend);
        } else {
            chart
                .draw_series(DashedLineSeries::new(pts, 10 - 2 * rank.min(3), gap, style))?
                .label(label)
                .legend(legend);
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Per-kind bars: throughput (left) and p50 latency (right), one bar per engine, for the runs
/// with the largest thread count (median over rounds).
fn draw_kinds<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[PlotRun],
) -> DrawResult<DB> {
    let with_kinds: Vec<&PlotRun> = runs.iter().filter(|r| r.per_kind.len() > 1).collect();
    let threads = with_kinds.iter().map(|r| r.threads).max().unwrap_or(1);
    let at_threads: Vec<&PlotRun> = with_kinds
        .into_iter()
        .filter(|r| r.threads == threads)
        .collect();
    // One bar series per workload × engine, over all its rounds (first-seen order).
    let mut chosen: Vec<Vec<&PlotRun>> = Vec::new();
    for r in at_threads {
        match chosen
            .iter_mut()
            .find(|g| g[0].engine == r.engine && g[0].workload == r.workload)
        {
            Some(group) => group.push(r),
            None => chosen.push(vec![r]),
        }
    }
    let many = workloads(runs).len() > 1;
    // Kinds in first-seen order, labelled with the workload when several are plotted.
    let mut kinds: Vec<String> = Vec::new();
    for r in chosen.iter().flatten() {
        for k in &r.per_kind {
            let label = if many {
                format!("{}/{}", r.workload, k.name)
            } else {
                k.name.clone()
            };
            if !kinds.contains(&label) {
                kinds.push(label);
            }
        }
    }
    let title = format!(
        "{}: per transaction type, {threads} thread{} (median over rounds)",
        workloads(runs).join(", "),
        if threads == 1 { "" } else { "s" }
    );
    let root = root.titled(&title, title_style())?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2 + 110);
    let n = kinds.len();
    let bar = |group: &[&PlotRun], kind: &str, value: fn(&PlotKind) -> f64| -> Option<f64> {
        let values: Vec<f64> = group
            .iter()
            .filter_map(|r| {
                r.per_kind
                    .iter()
                    .find(|k| {
                        if many {
                            format!("{}/{}", r.workload, k.name) == kind
                        } else {
                            k.name == kind
                        }
                    })
                    .map(value)
            })
            .collect();
        (!values.is_empty()).then(|| median(values))
    };
    let panels: [KindPanel<'_, DB>; 2] = [
        (
            &left,
            "throughput (ktx/s)",
            |k| k.throughput_tps / 1e3,
            true,
        ),
        (&right, "p50 latency (µs)", |k| k.latency_us.p50, false),
    ];
    for (area, desc, value, with_names) in panels {
        let max_x = chosen
            .iter()
            .flat_map(|r| kinds.iter().filter_map(|k| bar(r, k, value)))
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.12;
        let names = if with_names { &kinds[..] } else { &[] };
        let mut chart = bar_chart(area, desc, max_x, n, names, 190)?;
        let engines = chosen.len().max(1) as f64;
        let band = 0.8 / engines;
        for (e, r) in chosen.iter().enumerate() {
            let color = engine_color(&r[0].engine, e);
            let rects = kinds.iter().enumerate().filter_map(|(i, kind)| {
                let v = bar(r, kind, value)?;
                let y0 = i as f64 - 0.4 + e as f64 * band;
                Some(Rectangle::new(
                    [(0.0, y0), (v, y0 + band * 0.9)],
                    color.filled(),
                ))
            });
            let s = chart.draw_series(rects)?;
            if with_names {
                s.label(series_name(r[0], many)).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled())
                });
            }
        }
        if with_names {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .label_font((FAMILY, 14))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }
    }
    Ok(())
}

/// The label of a run's bar in the media figure: the engine, after the run's `label` parameter
/// (set by `pmtx reproduce`) or its workload.
fn bar_label(run: &PlotRun) -> String {
    let group = run
        .params
        .get("label")
        .and_then(|v| v.as_str())
        .unwrap_or(&run.workload);
    format!("{group}: {}", run.engine)
}

/// A bar of the two-panel figures: label, engine, throughput, the second panel's value.
type Bar = (String, String, f64, f64);

/// One panel of a two-panel figure: where, the axis description, the value, whether it shows
/// the bar names.
type Panel<'a, DB> = (&'a DrawingArea<DB, Shift>, &'a str, fn(&Bar) -> f64, bool);

/// Throughput beside `second` (described by `desc`), one bar per run that has it (median over
/// rounds), in first-seen order: the media and recovery figures.
fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[PlotRun],
    what: &str,
    desc: &str,
    second: fn(&PlotRun) -> Option<f64>,
) -> DrawResult<DB> {
    let mut bars: Vec<(String, String, Vec<f64>, Vec<f64>)> = Vec::new();
    for r in runs {
        let Some(value) = second(r) else {
            continue;
        };
        let label = bar_label(r);
        match bars.iter_mut().find(|b| b.0 == label) {
            Some(b) => {
                b.2.push(r.throughput_tps);
                b.3.push(value);
            }
            None => bars.push((label, r.engine.clone(), vec![r.throughput_tps], vec![value])),
        }
    }
    let bars: Vec<Bar> = bars
        .into_iter()
        .map(|(label, engine, t, v)| (label, engine, median(t), median(v)))
        .collect();
    let title = format!("{}: {what}", workloads(runs).join(", "));
    let root = root.titled(&title, title_style())?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2 + 110);
    let n = bars.len();
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let panels: [Panel<'_, DB>; 2] = [
        (&left, "throughput (ktx/s)", |b| b.2 / 1e3, true),
        (&right, desc, |b| b.3, false),
    ];
    for (area, desc, value, with_names) in panels {
        let max_x = bars.iter().map(value).fold(0.0, f64::max).max(1e-9) * 1.12;
        let shown = if with_names { &names[..] } else { &[] };
        let mut chart = bar_chart(area, desc, max_x, n, shown, 230)?;
        chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
            let color = engine_color(&b.1, i);
            Rectangle::new(
                [(0.0, i as f64 - 0.35), (value(b), i as f64 + 0.35)],
                color.filled(),
            )
        }))?;
    }
    Ok(())
}

/// A chart with a linear x and y axis.
type BarChart<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A horizontal bar chart on `area`: `n` rows (top to bottom), x from 0 to `max_x` described by
/// `desc`, the row `names` on the left when given (in a label area `names_width` wide).
fn bar_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    desc: &str,
    max_x: f64,
    n: usize,
    names: &[String],
    names_width: u32,
) -> Result<BarChart<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    let y_fmt = |y: &f64| {
        let i = y.round();
        if (y - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };
    let mut chart = ChartBuilder::on(area)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(if names.is_empty() { 10 } else { names_width })
        .build_cartesian_2d(0.0..max_x, (n as f64 - 0.5)..-0.5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(desc)
        .y_labels(n)
        .y_label_formatter(&y_fmt)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    Ok(chart)
}
