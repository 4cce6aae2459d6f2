//! Benchmark harness, engine-agnostic.
//!
//! `pmtx bench <workload>` runs one [`TxnDriver`] per thread for a warm-up and then a measured
//! duration, and reports figures. This module knows nothing about engines or workloads: a caller
//! hands [`run`] a factory that builds each thread's driver (on that thread, so a driver may hold
//! thread-local engine workers), and gets back a [`BenchResult`].
//!
//! - [`run`] drives the threads and collects per-thread latency histograms and counters, merged
//!   into a [`BenchResult`] (overall and per transaction kind, plus PM traffic per transaction).
//! - [`RunReport`] labels a result with engine, concurrency control, persistence domain and
//!   workload (plus a volatile baseline), for [`print_table`] and [`write_json`].
//! - [`loading_bar`] is a progress bar for the loading phase, hidden when stderr is not a terminal.
//! - [`plot`] draws figures (PNG, SVG) from the JSON that [`write_json`] writes.

#[cfg(feature = "plot")]
pub mod plot;
mod report;
mod result;
mod run;

pub use report::{loading_bar, print_table, write_json, RunReport};
pub use result::{
    BenchResult, KindResult, LatencySummary, PmPerTxn, KINDS_CDF_POINTS, RUN_CDF_POINTS,
};
pub use run::{run, BenchConfig, BenchError, DriverError, TxnDriver, TxnOutcome};

/// The median (the upper one of an even count), minimum and maximum of `v`, sorted in place
/// (zeros when empty): every summary over rounds (`pmtx bench --repeat`, the plots) uses it.
pub(crate) fn median_and_range(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    (at(v.len() / 2), at(0), at(v.len().saturating_sub(1)))
}

#[cfg(test)]
mod tests;
