//! Labelled results and their output: an aligned table, JSON, and a loading progress bar.

use std::io::{self, Write};
use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::result::{BenchResult, RUN_CDF_POINTS};

/// One run's result labelled with what ran, as printed and serialised.
///
/// JSON: the labels, the [`BenchResult`] fields flattened in, then `volatile_throughput_tps` and
/// `ratio_to_volatile` (absent unless [`RunReport::with_volatile`] was called), then
/// `latency_cdf_us`, then `params`. `pmtx plot` reads this format.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Engine name (e.g. "falcon").
    pub engine: String,
    /// Concurrency control (e.g. "occ").
    pub cc: String,
    /// Persistence domain (e.g. "adr", "eadr").
    pub domain: String,
    /// Workload name (e.g. "ycsb-a").
    pub workload: String,
    /// The figures.
    #[serde(flatten)]
    pub result: BenchResult,
    /// Throughput of the same workload on the volatile baseline, when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volatile_throughput_tps: Option<f64>,
    /// `result.throughput_tps / volatile_throughput_tps` (0 when the baseline is 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_volatile: Option<f64>,
    /// `result.throughput_tps` over each peer's throughput in the same round and thread count
    /// (`pmtx compare`), by peer name; empty (and absent from the JSON) otherwise.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ratio_to_peers: std::collections::BTreeMap<String, f64>,
    /// Points `(latency in µs, fraction of outcomes at or below it)` of the run's latency CDF
    /// ([`RUN_CDF_POINTS`] of them, none when nothing was recorded): see
    /// [`BenchResult::latency_cdf`]. Serialised as `[[µs, fraction], ...]`.
    pub latency_cdf_us: Vec<(f64, f64)>,
    /// Free-form run parameters (record count, distribution, ...).
    pub params: serde_json::Value,
}

impl RunReport {
    /// Labels `result`; no volatile baseline.
    pub fn new(
        engine: impl Into<String>,
        cc: impl Into<String>,
        domain: impl Into<String>,
        workload: impl Into<String>,
        result: BenchResult,
        params: serde_json::Value,
    ) -> Self {
        let latency_cdf_us = result.latency_cdf(RUN_CDF_POINTS);
        RunReport {
            engine: engine.into(),
            cc: cc.into(),
            domain: domain.into(),
            workload: workload.into(),
            result,
            volatile_throughput_tps: None,
            ratio_to_volatile: None,
            ratio_to_peers: Default::default(),
            latency_cdf_us,
            params,
        }
    }

    /// Sets the volatile baseline's throughput and this run's ratio to it. A baseline that is not
    /// a positive finite number is stored as 0 with a ratio of 0 (the JSON stays valid).
    pub fn with_volatile(&mut self, volatile_tps: f64) -> &mut Self {
        let volatile = if volatile_tps.is_finite() && volatile_tps > 0.0 {
            volatile_tps
        } else {
            0.0
        };
        let ratio = if volatile > 0.0 {
            let r = self.result.throughput_tps / volatile;
            if r.is_finite() {
                r
            } else {
                0.0
            }
        } else {
            0.0
        };
        self.volatile_throughput_tps = Some(volatile);
        self.ratio_to_volatile = Some(ratio);
        self
    }
}

/// Writes `reports` as an aligned table, one row per report, then (if any report has more than
/// one transaction kind, or expected failures) a per-kind table of those reports: each kind's share of the outcomes
/// (`mix%`), throughput, conflict aborts, expected failures (`fail%`, see
/// [`super::KindResult::fail_rate`]) and latency percentiles.
pub fn print_table(reports: &[RunReport], out: &mut impl Write) -> io::Result<()> {
    let with_volatile = reports.iter().any(|r| r.ratio_to_volatile.is_some());
    let with_media = reports
        .iter()
        .any(|r| r.result.pm.media_bytes_per_txn.is_some());
    let mut headers = vec![
        "engine",
        "cc",
        "domain",
        "workload",
        "thr",
        "tput tx/s",
        "abort%",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "cpu µs/tx",
        "PM B/tx",
        "flush/tx",
        "fence/tx",
    ];
    if with_media {
        headers.extend(["media W B/tx", "media R B/tx", "WA"]);
    }
    if with_volatile {
        headers.push("×volatile");
    }
    let peers: std::collections::BTreeSet<&str> = reports
        .iter()
        .flat_map(|r| r.ratio_to_peers.keys().map(String::as_str))
        .collect();
    let peer_headers: Vec<String> = peers.iter().map(|p| format!("×{p}")).collect();
    headers.extend(peer_headers.iter().map(String::as_str));
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let res = &r.result;
            let mut row = vec![
                r.engine.clone(),
                r.cc.clone(),
                r.domain.clone(),
                r.workload.clone(),
                res.threads.to_string(),
                fmt_count(res.throughput_tps),
                fmt_pct(res.abort_rate),
                fmt_us(res.latency_us.p50),
                fmt_us(res.latency_us.p99),
                fmt_us(res.latency_us.p999),
                res.cpu_us_per_txn.map_or("-".into(), |v| fmt_fixed(v, 1)),
                fmt_fixed(res.pm.bytes_per_txn, 1),
                fmt_fixed(res.pm.flushes_per_txn, 2),
                fmt_fixed(res.pm.fences_per_txn, 2),
            ];
            if with_media {
                let opt = |v: Option<f64>, digits| v.map_or("-".into(), |v| fmt_fixed(v, digits));
                row.push(opt(res.pm.media_bytes_per_txn, 1));
                row.push(opt(res.pm.media_read_bytes_per_txn, 1));
                row.push(opt(res.pm.write_amplification, 2));
            }
            if with_volatile {
                row.push(match r.ratio_to_volatile {
                    Some(ratio) => format!("{ratio:.3}"),
                    None => "-".to_string(),
                });
            }
            for p in &peers {
                row.push(match r.ratio_to_peers.get(*p) {
                    Some(ratio) => format!("{ratio:.2}"),
                    None => "-".to_string(),
                });
            }
            row
        })
        .collect();
    write_table(out, &headers, 4, &rows)?;

    let multi: Vec<&RunReport> = reports
        .iter()
        .filter(|r| r.result.per_kind.len() > 1 || r.result.expected_failures > 0)
        .collect();
    if multi.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "per transaction kind:")?;
    let headers = [
        "engine",
        "cc",
        "domain",
        "workload",
        "kind",
        "thr",
        "mix%",
        "tput tx/s",
        "abort%",
        "fail%",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p999 µs",
    ];
    let rows: Vec<Vec<String>> = multi
        .iter()
        .flat_map(|r| {
            r.result.per_kind.iter().map(move |k| {
                vec![
                    r.engine.clone(),
                    r.cc.clone(),
                    r.domain.clone(),
                    r.workload.clone(),
                    k.name.clone(),
                    r.result.threads.to_string(),
                    fmt_pct(k.mix_share),
                    fmt_count(k.throughput_tps),
                    fmt_pct(k.abort_rate),
                    fmt_pct(k.fail_rate),
                    fmt_us(k.latency_us.p50),
                    fmt_us(k.latency_us.p90),
                    fmt_us(k.latency_us.p99),
                    fmt_us(k.latency_us.p999),
                ]
            })
        })
        .collect();
    write_table(out, &headers, 5, &rows)
}

/// Writes `reports` to `path` as a pretty-printed JSON array.
pub fn write_json(reports: &[RunReport], path: impl AsRef<Path>) -> io::Result<()> {
    let mut file = io::BufWriter::new(std::fs::File::create(path)?);
    serde_json::to_writer_pretty(&mut file, reports)?;
    writeln!(file)?;
    file.flush()
}

/// A progress bar for loading `total` records, labelled `what`, drawn on stderr. Hidden when
/// stderr is not a terminal (pipes, CI), where updating it costs next to nothing.
pub fn loading_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{msg} [{bar:40}] {human_pos}/{human_len} ({per_sec}, eta {eta})",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// Writes an aligned table: the first `text_cols` columns left-aligned, the rest right-aligned.
fn write_table(
    out: &mut impl Write,
    headers: &[&str],
    text_cols: usize,
    rows: &[Vec<String>],
) -> io::Result<()> {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = headers.iter().map(|h| width(h)).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(width(cell));
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = " ".repeat(w.saturating_sub(width(cell)));
            if i < text_cols {
                s.push_str(cell);
                s.push_str(&pad);
            } else {
                s.push_str(&pad);
                s.push_str(cell);
            }
        }
        s.trim_end().to_string()
    };
    writeln!(out, "{}", line(&mut headers.iter().copied()))?;
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    writeln!(out, "{}", line(&mut rule.iter().map(String::as_str)))?;
    for row in rows {
        writeln!(out, "{}", line(&mut row.iter().map(String::as_str)))?;
    }
    Ok(())
}

/// A non-negative figure rounded to an integer with thousands separators: `1,234,567`.
fn fmt_count(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_string();
    }
    let digits = format!("{:.0}", v.abs());
    let mut s = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if v < 0.0 && digits != "0" {
        s.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            s.push(',');
        }
        s.push(c);
    }
    s
}

fn fmt_pct(rate: f64) -> String {
    format!("{:.2}", rate * 100.0)
}

/// Microseconds with precision that suits the magnitude.
fn fmt_us(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 1000.0 {
        format!("{v:.1}")
    } else {
        fmt_count(v)
    }
}

fn fmt_fixed(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_get_thousands_separators() {
        assert_eq!(fmt_count(0.0), "0");
        assert_eq!(fmt_count(999.4), "999");
        assert_eq!(fmt_count(1000.0), "1,000");
        assert_eq!(fmt_count(1234567.8), "1,234,568");
        assert_eq!(fmt_count(f64::NAN), "-");
    }
}
