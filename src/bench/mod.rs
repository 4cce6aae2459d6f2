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

#[cfg(test)]
mod tests;
