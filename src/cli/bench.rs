//! `pmtx bench ycsb`: load, warm up, measure; a table for people and JSON for machines.

use super::CliResult;
use crate::bench::{self, BenchConfig, RunReport};
use crate::cc::Protocol;
use crate::db::{Db, DbConfig};
use crate::engine::EngineKind;
use crate::pmem::PersistenceDomain;
use crate::workload::ycsb::{driver, AcknowledgedCounter, Distribution, Workload};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Arguments shared by every `pmtx bench` workload.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Engines to run, comma-separated (falcon, falcon-noflush, falcon-allflush, inp, volatile).
    #[arg(long, value_delimiter = ',', default_value = "falcon")]
    pub engine: Vec<EngineKind>,
    /// Concurrency-control protocol (occ, no-wait).
    #[arg(long, default_value = "occ")]
    pub cc: Protocol,
    /// Persistence domain (adr, eadr, msync; the volatile engine ignores it).
    #[arg(long, default_value = "eadr")]
    pub domain: PersistenceDomain,
    /// Worker thread counts to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub threads: Vec<usize>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Warm-up seconds per run (not measured).
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Pool file (default: a scratch pool under /dev/shm, removed after the run). Only with one
    /// engine and one thread count; an existing file is refused.
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// Write the results as a JSON array to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also run the volatile engine with the same parameters and report each run's ratio to it.
    #[arg(long)]
    pub compare_volatile: bool,
    /// Hot tuples tracked per thread by falcon (0 disables).
    #[arg(long, default_value_t = 1024)]
    pub hot_tuples: usize,
}

/// Arguments of `pmtx bench ycsb`.
#[derive(clap::Args, Debug)]
pub struct YcsbArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Core workload a–f, or read-only, read-heavy, balanced, write-heavy (Zen §4.1).
    #[arg(long, default_value = "a")]
    pub workload: String,
    /// Zipfian constant; 0 means uniform.
    #[arg(long, default_value_t = 0.99)]
    pub theta: f64,
    /// Operations per transaction (1: plain YCSB; 16: the Zen/FIR style).
    #[arg(long, default_value_t = 1)]
    pub ops_per_txn: usize,
    /// Fields per record.
    #[arg(long, default_value_t = 10)]
    pub field_count: u32,
    /// Bytes per field.
    #[arg(long, default_value_t = 100)]
    pub field_len: usize,
    /// Updates write every field (Falcon §6.2.3 updates all ten).
    #[arg(long)]
    pub write_all_fields: bool,
}

/// Arguments of `pmtx bench bank`.
#[derive(clap::Args, Debug)]
pub struct BankArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Accounts (opened in one transaction).
    #[arg(long, default_value_t = 10_000)]
    pub accounts: u64,
    /// Check the invariant (total balance, no negative balance) after the run.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub check: bool,
}

/// The `bench` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// YCSB core workloads A–F and Zen's read/write mixes.
    Ycsb(YcsbArgs),
    /// Bank transfers between random accounts; checks the total balance afterwards.
    Bank(BankArgs),
}

pub(crate) fn run(cmd: BenchCommand) -> CliResult {
    match cmd {
        BenchCommand::Ycsb(args) => run_ycsb(args),
        BenchCommand::Bank(args) => run_bank(args),
    }
}

fn run_bank(args: BankArgs) -> CliResult {
    let common = args.common.clone();
    check_common(&common)?;
    if args.accounts < 2 {
        return Err("--accounts must be at least 2".into());
    }
    let max_threads = common.threads.iter().copied().max().unwrap_or(1) + 1;
    let pool_size = args.accounts * 64 * 2 + (32 + 8 * max_threads as u64) * (2 << 20);
    let mut engines = common.engine.clone();
    if common.compare_volatile && !engines.contains(&EngineKind::Volatile) {
        engines.push(EngineKind::Volatile);
    }
    let mut reports = Vec::new();
    for &threads in &common.threads {
        let first = reports.len();
        for &engine in &engines {
            let mut config = DbConfig::default()
                .engine(engine)
                .protocol(common.cc)
                .domain(common.domain)
                .pool_size(pool_size)
                .max_threads(max_threads);
            config.hot_tuples = common.hot_tuples;
            if let Some(p) = &common.pool {
                config = config.path(p);
            }
            let db = Db::create(config)?;
            let table = crate::workload::bank::load(&db, args.accounts)?;
            let config = BenchConfig {
                threads,
                warmup: Duration::from_secs_f64(common.warmup),
                duration: Duration::from_secs_f64(common.duration),
                txn_kinds: vec!["transfer".into()],
            };
            let result = bench::run(&config, |t| {
                crate::workload::bank::BankDriver::new(&db, table, args.accounts, 0xba4c + t as u64)
                    .map(|d| Box::new(d) as Box<dyn bench::TxnDriver>)
            })?;
            if args.check {
                crate::workload::bank::check(&db, args.accounts)
                    .map_err(|e| format!("bank invariant violated: {e}"))?;
            }
            let domain = if engine == EngineKind::Volatile {
                PersistenceDomain::Volatile
            } else {
                common.domain
            };
            let params = serde_json::json!({ "accounts": args.accounts, "pool_bytes": pool_size });
            reports.push(RunReport::new(
                engine.name(),
                common.cc.name(),
                domain.name(),
                "bank",
                result,
                params,
            ));
        }
        attach_volatile(&mut reports[first..], common.compare_volatile);
    }
    bench::print_table(&reports, &mut std::io::stdout())?;
    if let Some(path) = &common.json {
        bench::write_json(&reports, path)?;
    }
    Ok(())
}

fn workload_of(args: &YcsbArgs) -> Result<Workload, Box<dyn std::error::Error>> {
    let mut w = Workload::from_name(&args.workload)?;
    if args.theta == 0.0 {
        w.request_distribution = Distribution::Uniform;
    } else if matches!(w.request_distribution, Distribution::Zipfian { .. }) {
        w = w.with_theta(args.theta)?;
    }
    w.field_count = args.field_count;
    w.field_len = args.field_len;
    w.write_all_fields = args.write_all_fields;
    w.ops_per_txn = args.ops_per_txn;
    w.validate()?;
    Ok(w)
}

/// DRAM of the process not backed by the pool (anonymous memory), in bytes, from /proc.
pub(crate) fn rss_anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn run_ycsb(args: YcsbArgs) -> CliResult {
    let common = args.common.clone();
    check_common(&common)?;
    let workload = workload_of(&args)?;
    let row = workload.field_count as u64 * workload.field_len as u64;
    let slot = crate::engine::falcon::layout::tuple::slot_size(row as usize);
    // Room for the records, YCSB-D/E inserts, per-thread pages and windows.
    let max_threads = common.threads.iter().copied().max().unwrap_or(1) + 1;
    let pool_size = (args.records * slot) * 3 / 2 + (64 + 8 * max_threads as u64) * (2 << 20);
    let mut engines = common.engine.clone();
    if common.compare_volatile && !engines.contains(&EngineKind::Volatile) {
        engines.push(EngineKind::Volatile);
    }
    let mut reports: Vec<RunReport> = Vec::new();
    for &threads in &common.threads {
        let first = reports.len();
        for &engine in &engines {
            let mut config = DbConfig::default()
                .engine(engine)
                .protocol(common.cc)
                .domain(common.domain)
                .pool_size(pool_size)
                .max_threads(max_threads);
            config.hot_tuples = common.hot_tuples;
            config.max_row_bytes = config.max_row_bytes.max(row as usize);
            if let Some(p) = &common.pool {
                config = config.path(p);
            }
            let dram_before = rss_anon_bytes();
            let db = Db::create(config)?;
            let table = db.create_table(driver::schema(&workload))?;
            let bar = bench::loading_bar(args.records, &format!("loading {engine}"));
            let loaded = AtomicU64::new(0);
            driver::load(&db, table, &workload, args.records, 2, &|n| {
                bar.set_position(loaded.fetch_add(n, Ordering::Relaxed) + n);
            })?;
            bar.finish_and_clear();
            let dram_after_load = rss_anon_bytes();
            let inserts = Arc::new(AcknowledgedCounter::new(args.records));
            let config = BenchConfig {
                threads,
                warmup: Duration::from_secs_f64(common.warmup),
                duration: Duration::from_secs_f64(common.duration),
                txn_kinds: vec!["ycsb".into()],
            };
            let result = bench::run(&config, |t| {
                driver::YcsbDriver::new(
                    &db,
                    table,
                    &workload,
                    args.records,
                    inserts.clone(),
                    0x5eed + t as u64,
                )
                .map(|d| Box::new(d) as Box<dyn bench::TxnDriver>)
            })?;
            let dram_per_record = match (dram_before, dram_after_load) {
                (Some(b), Some(a)) if engine != EngineKind::Volatile => {
                    Some(a.saturating_sub(b) as f64 / args.records as f64)
                }
                _ => None,
            };
            let params = serde_json::json!({
                "records": args.records,
                "theta": args.theta,
                "ops_per_txn": workload.ops_per_txn,
                "field_count": workload.field_count,
                "field_len": workload.field_len,
                "write_all_fields": workload.write_all_fields,
                "hot_tuples": common.hot_tuples,
                "pool_bytes": pool_size,
                "dram_bytes_per_record_after_load": dram_per_record,
                "peak_rss_bytes": peak_rss_bytes(),
            });
            let domain = if engine == EngineKind::Volatile {
                PersistenceDomain::Volatile
            } else {
                common.domain
            };
            reports.push(RunReport::new(
                engine.name(),
                common.cc.name(),
                domain.name(),
                format!("ycsb-{}", workload.name),
                result,
                params,
            ));
        }
        attach_volatile(&mut reports[first..], common.compare_volatile);
    }
    bench::print_table(&reports, &mut std::io::stdout())?;
    if let Some(path) = &common.json {
        bench::write_json(&reports, path)?;
    }
    Ok(())
}

pub(crate) fn check_common(common: &CommonArgs) -> CliResult {
    if common.pool.is_some()
        && (common.engine.len() > 1 || common.threads.len() > 1 || common.compare_volatile)
    {
        return Err("--pool names one pool: use it with a single engine, a single thread count and no --compare-volatile".into());
    }
    if let Some(p) = &common.pool {
        if p.exists() {
            return Err(format!(
                "--pool {}: the file exists; benchmarks load a fresh pool",
                p.display()
            )
            .into());
        }
    }
    if common.threads.iter().any(|&t| t == 0 || t > 255) {
        return Err("--threads must be between 1 and 255".into());
    }
    if common.duration.is_nan()
        || common.duration <= 0.0
        || common.warmup.is_nan()
        || common.warmup < 0.0
    {
        return Err("--duration must be positive and --warmup not negative".into());
    }
    Ok(())
}

/// Sets every report's ratio to the volatile run among them (same thread count).
pub(crate) fn attach_volatile(reports: &mut [RunReport], wanted: bool) {
    let volatile = reports
        .iter()
        .find(|r| r.engine == EngineKind::Volatile.name())
        .map(|r| r.result.throughput_tps);
    if let (true, Some(v)) = (wanted, volatile) {
        for r in reports.iter_mut() {
            r.with_volatile(v);
        }
    }
}
