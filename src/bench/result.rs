//! Figures of one run: per-thread recording and the merged, serialisable result.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::run::TxnOutcome;
use crate::pmem::stats::PmStats;

/// An empty latency histogram: nanoseconds, 3 significant digits, growing as needed.
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

fn record_ns(hist: &mut Histogram<u64>, nanos: u64) {
    if hist.record(nanos).is_err() {
        hist.saturating_record(nanos);
    }
}

fn merge(into: &mut Histogram<u64>, from: &Histogram<u64>) {
    into.add(from)
        .expect("an auto-resizing histogram accepts any addend");
}

/// `num / den`, or 0 when that is not a finite number (no NaN or infinity reaches the JSON).
fn ratio(num: f64, den: f64) -> f64 {
    let r = num / den;
    if den > 0.0 && r.is_finite() {
        r
    } else {
        0.0
    }
}

/// One kind's counters in one thread.
#[derive(Clone, Debug)]
pub(crate) struct KindStats {
    committed: u64,
    aborted: u64,
    user_aborted: u64,
    expected_failures: u64,
    latency: Histogram<u64>,
}

/// One thread's recording of the measured phase.
#[derive(Clone, Debug)]
pub(crate) struct ThreadStats {
    latency: Histogram<u64>,
    kinds: Vec<KindStats>,
}

impl ThreadStats {
    pub(crate) fn new(n_kinds: usize) -> Self {
        ThreadStats {
            latency: new_histogram(),
            kinds: (0..n_kinds)
                .map(|_| KindStats {
                    committed: 0,
                    aborted: 0,
                    user_aborted: 0,
                    expected_failures: 0,
                    latency: new_histogram(),
                })
                .collect(),
        }
    }

    /// Records one outcome (`expected_failure`: see
    /// [`TxnDriver::last_was_expected_failure`](super::TxnDriver::last_was_expected_failure));
    /// `outcome.kind` must be in range.
    pub(crate) fn record(&mut self, outcome: &TxnOutcome, expected_failure: bool, nanos: u64) {
        let kind = &mut self.kinds[outcome.kind];
        if outcome.committed {
            kind.committed += 1;
        } else {
            kind.user_aborted += 1;
        }
        if expected_failure {
            kind.expected_failures += 1;
        }
        kind.aborted += u64::from(outcome.aborts);
        record_ns(&mut kind.latency, nanos);
        record_ns(&mut self.latency, nanos);
    }
}

/// Latency percentiles in microseconds (0 when nothing was recorded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest latency recorded.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl LatencySummary {
    /// Summarises a histogram of nanoseconds.
    pub fn from_histogram(hist: &Histogram<u64>) -> Self {
        if hist.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        LatencySummary {
            p50: us(hist.value_at_quantile(0.5)),
            p90: us(hist.value_at_quantile(0.9)),
            p99: us(hist.value_at_quantile(0.99)),
            p999: us(hist.value_at_quantile(0.999)),
            max: us(hist.max()),
            mean: finite(hist.mean() / 1000.0),
        }
    }
}

/// PM traffic of the measured phase, per committed transaction (0 when none committed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PmPerTxn {
    /// Bytes stored to PM.
    pub bytes_per_txn: f64,
    /// Cache lines flushed.
    pub flushes_per_txn: f64,
    /// Store fences.
    pub fences_per_txn: f64,
    /// Store operations on PM.
    pub writes_per_txn: f64,
    /// Bytes the PM media model wrote to the media (256-byte XPLines; `None` without a model,
    /// see [`crate::pmem::media`]).
    pub media_bytes_per_txn: Option<f64>,
    /// Bytes the media model read from the media (cache misses, read-modify-writes).
    pub media_read_bytes_per_txn: Option<f64>,
    /// Media bytes written / bytes stored to PM (`None` without a model, or when nothing was
    /// stored).
    pub write_amplification: Option<f64>,
    /// Microseconds of delay NVM latency emulation added (`None` without emulation).
    pub emulated_delay_us_per_txn: Option<f64>,
    /// The totals over the measured phase (process-wide: see [`run()`](super::run())).
    pub total: PmStats,
}

impl PmPerTxn {
    fn new(total: PmStats, committed: u64) -> Self {
        let per = |v: u64| ratio(v as f64, committed as f64);
        PmPerTxn {
            bytes_per_txn: per(total.bytes_written),
            flushes_per_txn: per(total.lines_flushed),
            fences_per_txn: per(total.fences),
            writes_per_txn: per(total.writes),
            media_bytes_per_txn: None,
            media_read_bytes_per_txn: None,
            write_amplification: None,
            emulated_delay_us_per_txn: None,
            total,
        }
    }

    /// Fills the media fields from the totals, for a run with a media model (and, if
    /// `emulated`, latency emulation) attached to its pool.
    pub fn account_media(&mut self, committed: u64, emulated: bool) {
        let per = |v: u64| ratio(v as f64, committed as f64);
        let t = &self.total;
        self.media_bytes_per_txn = Some(per(t.media_bytes_written));
        self.media_read_bytes_per_txn = Some(per(t.media_bytes_read));
        self.write_amplification =
            (t.bytes_written > 0).then(|| t.media_bytes_written as f64 / t.bytes_written as f64);
        self.emulated_delay_us_per_txn = emulated.then(|| per(t.emulated_delay_ns) / 1e3);
    }
}

/// Points of each kind's latency CDF kept in [`KindResult::latency_cdf_us`].
pub const KINDS_CDF_POINTS: usize = 40;

/// Points of the whole run's latency CDF kept in
/// [`RunReport::latency_cdf_us`](super::RunReport::latency_cdf_us).
pub const RUN_CDF_POINTS: usize = 80;

/// The figures of one transaction kind.
#[derive(Clone, Debug, Serialize)]
pub struct KindResult {
    /// Name of the kind (from [`super::BenchConfig::txn_kinds`]).
    pub name: String,
    /// Committed transactions.
    pub committed: u64,
    /// Conflict aborts (retried by the driver).
    pub aborted: u64,
    /// Outcomes that did not commit (user aborts, or the driver gave up).
    pub user_aborted: u64,
    /// Outcomes (committed or not) that were the workload's expected failures, such as a TATP
    /// lookup finding no row: see
    /// [`TxnDriver::last_was_expected_failure`](super::TxnDriver::last_was_expected_failure).
    pub expected_failures: u64,
    /// `committed / duration_s`.
    pub throughput_tps: f64,
    /// `aborted / (aborted + committed)`, 0 when both are 0.
    pub abort_rate: f64,
    /// `expected_failures / (committed + user_aborted)`: the share of this kind's outcomes that
    /// were expected failures (0 when there were no outcomes).
    pub fail_rate: f64,
    /// This kind's share of all outcomes of the run, `(committed + user_aborted) / outcomes`:
    /// the measured transaction mix.
    pub mix_share: f64,
    /// Latency of this kind's outcomes.
    pub latency_us: LatencySummary,
    /// Points `(µs, fraction)` of this kind's latency CDF ([`KINDS_CDF_POINTS`] of them, or none
    /// when nothing was recorded): see [`BenchResult::latency_cdf`].
    pub latency_cdf_us: Vec<(f64, f64)>,
    /// This kind's latency histogram (nanoseconds), not serialised.
    #[serde(skip)]
    pub latency_hist: Histogram<u64>,
}

impl KindResult {
    /// Points of the latency CDF: see [`BenchResult::latency_cdf`].
    pub fn latency_cdf(&self, points: usize) -> Vec<(f64, f64)> {
        cdf(&self.latency_hist, points)
    }
}

/// The figures of one run: see [`run()`](super::run()) for what is measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    /// Number of driver threads.
    pub threads: usize,
    /// Measured wall time in seconds.
    pub duration_s: f64,
    /// Committed transactions.
    pub committed: u64,
    /// Conflict aborts (retried by the drivers).
    pub aborted: u64,
    /// Outcomes that did not commit (user aborts, or a driver gave up).
    pub user_aborted: u64,
    /// Outcomes that were the workload's expected failures (sum of
    /// [`KindResult::expected_failures`]).
    pub expected_failures: u64,
    /// `committed / duration_s` (0 when the duration is 0).
    pub throughput_tps: f64,
    /// `aborted / (aborted + committed)`, 0 when both are 0.
    pub abort_rate: f64,
    /// Latency of all recorded outcomes.
    pub latency_us: LatencySummary,
    /// PM traffic per committed transaction.
    pub pm: PmPerTxn,
    /// The same figures per transaction kind, in the order of the configuration.
    pub per_kind: Vec<KindResult>,
    /// CPU time (user + system) of the whole process over the measured phase per committed
    /// transaction, in µs: the drivers and the engine's background threads. `None` where the
    /// platform does not report CPU time or nothing committed. Steadier than throughput on a
    /// shared or virtualised machine, since waiting for a core costs no CPU time; on 2 cores
    /// with 2 drivers it is about 2 / throughput when nothing else runs.
    pub cpu_us_per_txn: Option<f64>,
    /// The merged latency histogram (nanoseconds), not serialised.
    #[serde(skip)]
    pub latency_hist: Histogram<u64>,
}

impl Default for BenchResult {
    fn default() -> Self {
        BenchResult {
            threads: 0,
            duration_s: 0.0,
            committed: 0,
            aborted: 0,
            user_aborted: 0,
            expected_failures: 0,
            throughput_tps: 0.0,
            abort_rate: 0.0,
            latency_us: LatencySummary::default(),
            pm: PmPerTxn::default(),
            per_kind: Vec::new(),
            cpu_us_per_txn: None,
            latency_hist: new_histogram(),
        }
    }
}

impl BenchResult {
    /// Merges the threads' recordings.
    pub(crate) fn from_threads(
        threads: usize,
        measured: Duration,
        kind_names: &[String],
        per_thread: Vec<ThreadStats>,
        pm: PmStats,
    ) -> Self {
        let duration_s = measured.as_secs_f64();
        let mut latency_hist = new_histogram();
        let mut per_kind: Vec<KindResult> = kind_names
            .iter()
            .map(|name| KindResult {
                name: name.clone(),
                committed: 0,
                aborted: 0,
                user_aborted: 0,
                expected_failures: 0,
                throughput_tps: 0.0,
                abort_rate: 0.0,
                fail_rate: 0.0,
                mix_share: 0.0,
                latency_us: LatencySummary::default(),
                latency_cdf_us: Vec::new(),
                latency_hist: new_histogram(),
            })
            .collect();
        for thread in &per_thread {
            merge(&mut latency_hist, &thread.latency);
            for (kind, stats) in per_kind.iter_mut().zip(&thread.kinds) {
                kind.committed += stats.committed;
                kind.aborted += stats.aborted;
                kind.user_aborted += stats.user_aborted;
                kind.expected_failures += stats.expected_failures;
                merge(&mut kind.latency_hist, &stats.latency);
            }
        }
        let outcomes: u64 = per_kind.iter().map(|k| k.committed + k.user_aborted).sum();
        for kind in &mut per_kind {
            let own = kind.committed + kind.user_aborted;
            kind.throughput_tps = ratio(kind.committed as f64, duration_s);
            kind.abort_rate = ratio(kind.aborted as f64, (kind.aborted + kind.committed) as f64);
            kind.fail_rate = ratio(kind.expected_failures as f64, own as f64);
            kind.mix_share = ratio(own as f64, outcomes as f64);
            kind.latency_us = LatencySummary::from_histogram(&kind.latency_hist);
            kind.latency_cdf_us = cdf(&kind.latency_hist, KINDS_CDF_POINTS);
        }
        let committed: u64 = per_kind.iter().map(|k| k.committed).sum();
        let aborted: u64 = per_kind.iter().map(|k| k.aborted).sum();
        let user_aborted: u64 = per_kind.iter().map(|k| k.user_aborted).sum();
        let expected_failures: u64 = per_kind.iter().map(|k| k.expected_failures).sum();
        BenchResult {
            threads,
            duration_s,
            committed,
            aborted,
            user_aborted,
            expected_failures,
            throughput_tps: ratio(committed as f64, duration_s),
            abort_rate: ratio(aborted as f64, (aborted + committed) as f64),
            latency_us: LatencySummary::from_histogram(&latency_hist),
            pm: PmPerTxn::new(pm, committed),
            per_kind,
            cpu_us_per_txn: None,
            latency_hist,
        }
    }

    /// Records the process's CPU time over the measured phase as [`Self::cpu_us_per_txn`].
    pub(crate) fn set_cpu_time(&mut self, cpu: Option<Duration>) {
        self.cpu_us_per_txn = cpu
            .filter(|_| self.committed > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / self.committed as f64);
    }

    /// Points `(latency in µs, fraction of outcomes at or below it)` of the latency CDF, at
    /// `points` latencies spaced logarithmically from the smallest to the largest recorded (the
    /// last point has fraction 1). Empty when nothing was recorded or `points` is 0.
    pub fn latency_cdf(&self, points: usize) -> Vec<(f64, f64)> {
        cdf(&self.latency_hist, points)
    }
}

fn cdf(hist: &Histogram<u64>, points: usize) -> Vec<(f64, f64)> {
    let total = hist.len();
    if total == 0 || points == 0 {
        return Vec::new();
    }
    let hi = hist.max().max(1);
    let lo = hist.min_nz().clamp(1, hi);
    let at = |ns: u64| {
        let ns = hist.highest_equivalent(ns).min(hi);
        let fraction = (hist.count_between(0, ns) as f64 / total as f64).min(1.0);
        (ns as f64 / 1000.0, fraction)
    };
    if points == 1 || lo == hi {
        return vec![at(hi)];
    }
    let (lo_f, hi_f) = (lo as f64, hi as f64);
    let steps = (points - 1) as f64;
    (0..points)
        .map(|i| {
            if i + 1 == points {
                (hi as f64 / 1000.0, 1.0)
            } else {
                at((lo_f * (hi_f / lo_f).powf(i as f64 / steps)).round() as u64)
            }
        })
        .collect()
}
