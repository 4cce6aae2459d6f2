//! `pmtx bench tatp`: load TATP once per engine and round, run each thread count on it, report
//! per transaction type (mix, throughput, expected failures, latency).

use super::bench::{check_common, finish, CommonArgs};
use super::CliResult;
use crate::bench::{self, RunReport};
use crate::db::Db;
use crate::workload::tatp::driver::{kind_names, TatpDriver, TxnType};
use crate::workload::tatp::{self, Tatp};
use std::sync::atomic::{AtomicU64, Ordering};

/// Arguments of `pmtx bench tatp`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Subscribers (the scale factor). 1 M needs about 1 GiB of pool and 2 GiB of DRAM per
    /// engine and loads in tens of seconds on this machine (see docs/WORKLOADS.md).
    #[arg(long, default_value_t = 1_000_000)]
    pub subscribers: u64,
    /// Run only this transaction type (e.g. get_subscriber_data, insert_call_forwarding).
    #[arg(long)]
    pub only: Option<String>,
    /// Check the population invariants after every run (see `workload::tatp::check`).
    #[arg(long)]
    pub check: bool,
    /// Seed of the population and of the drivers (each run and thread draws its own stream from
    /// it, so a later run on the same database does not replay an earlier one's inserts).
    #[arg(long, default_value_t = 0x7a7b)]
    pub seed: u64,
}

pub(crate) fn run(args: Args) -> CliResult {
    let common = args.common.clone();
    check_common(&common)?;
    if args.subscribers == 0 || args.subscribers > tatp::MAX_SUBSCRIBERS {
        return Err(format!(
            "--subscribers must be between 1 and {}",
            tatp::MAX_SUBSCRIBERS
        )
        .into());
    }
    let only = args.only.as_deref().map(TxnType::from_name).transpose()?;
    let kinds = kind_names(only);
    let max_threads = common.threads.iter().copied().max().unwrap_or(1);
    // Tuples, inserted call forwardings, and a tuple page per table per thread (loaders too).
    let pool_size = tatp::data_bytes(args.subscribers) * 3 / 2
        + (64 + 16 * (max_threads as u64 + 2)) * (2 << 20);
    let workload = match only {
        Some(t) => format!("tatp-{}", t.name()),
        None => "tatp".to_string(),
    };
    let mut reports: Vec<RunReport> = Vec::new();
    // One load per (round, engine), shared by its thread counts: TATP's inserts and deletes of
    // call forwardings balance, so the database stays statistically the same run after run.
    let mut plan: Vec<(usize, crate::engine::EngineKind)> = Vec::new();
    for (round, _, engine) in common.plan() {
        if !plan.contains(&(round, engine)) {
            plan.push((round, engine));
        }
    }
    for (round, engine) in plan {
        let db = Db::create(common.db_config(engine, max_threads.max(2), pool_size))?;
        super::warn_durability(&db);
        let bar = bench::loading_bar(args.subscribers, &format!("loading TATP ({engine})"));
        let loaded = AtomicU64::new(0);
        let tatp = tatp::load(&db, args.subscribers, args.seed, 2, &|n| {
            bar.set_position(loaded.fetch_add(n, Ordering::Relaxed) + n);
        })?;
        bar.finish_and_clear();
        for (run_no, &threads) in common.threads.iter().enumerate() {
            let run_seed = args.seed ^ ((round as u64) << 48) ^ ((run_no as u64 + 1) << 32);
            let result = bench::run(common.bench_config(threads, &kinds), |t| {
                TatpDriver::new(&db, tatp, run_seed.wrapping_add(t as u64), only)
                    .map(|d| Box::new(d) as Box<dyn bench::TxnDriver>)
            })?;
            let checked = if args.check {
                Some(check(&db, &tatp)?)
            } else {
                None
            };
            let params = serde_json::json!({
                "subscribers": args.subscribers,
                "only": only.map(TxnType::name),
                "seed": args.seed,
                "pool_bytes": pool_size,
                "hot_tuples": common.hot_tuples,
                "window_slot_bytes": common.window_slot_bytes,
                "checked": checked.is_some(),
                "call_forwarding_rows_after": checked.map(|c| c.call_forwarding),
                "round": round,
            });
            reports.push(RunReport::new(
                engine.name(),
                common.cc.name(),
                common.domain_of(engine).name(),
                workload.clone(),
                result,
                params,
            ));
        }
    }
    // Reports in plan order (round, threads, engine), as the other workloads print them.
    reports.sort_by_key(|r| {
        (
            r.params.get("round").and_then(|v| v.as_u64()).unwrap_or(0),
            r.result.threads,
        )
    });
    finish(&common, &mut reports)
}

fn check(db: &Db, tatp: &Tatp) -> Result<tatp::CheckReport, Box<dyn std::error::Error>> {
    let report = tatp::check(db, tatp)?;
    eprintln!(
        "TATP check passed: {} subscribers, {} access_info, {} special_facility, {} call_forwarding rows ({} changed by the run)",
        report.subscribers,
        report.access_info,
        report.special_facility,
        report.call_forwarding,
        report.call_forwarding_changed
    );
    Ok(report)
}
