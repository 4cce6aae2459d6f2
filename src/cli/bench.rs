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
    /// Engines to run, comma-separated (falcon, falcon-noflush, falcon-allflush, inp, outp, wbl, volatile, zen, fir, dudetx, mmdb).
    #[arg(long, value_delimiter = ',', default_value = "falcon")]
    pub engine: Vec<EngineKind>,
    /// Concurrency-control protocol: no-wait, wait-die, dl-detect, to, occ, silo, tictoc, mvocc,
    /// mvto, mv2pl, si (snapshot isolation: not serializable), hstore (partition locks).
    #[arg(long, default_value = "occ")]
    pub cc: Protocol,
    /// Partitions for `--cc hstore` (a key's partition is key mod partitions).
    #[arg(long, default_value_t = crate::cc::CcOptions::default().partitions)]
    pub partitions: usize,
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
    /// Bytes per log-window slot (falcon); a transaction whose redo exceeds it spills.
    #[arg(long)]
    pub window_slot_bytes: Option<usize>,
    /// Rounds: every engine × thread count runs this many times, interleaved, and a summary gives
    /// the median ratio to volatile (use ≥ 3 on a noisy machine).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Zen: P = NVM size / DRAM Met-Cache budget (Zen §4.1 uses 4, 8 and 16).
    #[arg(long, default_value_t = 4.0)]
    pub cache_ratio: f64,
    /// Pool size (bytes, or with a K, M, G or T suffix: 64M), instead of one computed from the
    /// data (never below the engine's minimum for the thread count, see README "Pool size").
    #[arg(long, value_parser = parse_bytes)]
    pub pool_size: Option<u64>,
    /// Let the pool grow, when full, up to this size (bytes or with a suffix: 4G); default: a
    /// fixed-size pool.
    #[arg(long, value_parser = parse_bytes)]
    pub max_pool_size: Option<u64>,
    /// PM media model (`none`, `optane`, or CACHE_BYTES,WAYS,XPBUFFER_LINES such as 4M,16,64):
    /// reports the bytes PM media would write and read per transaction and the write
    /// amplification (docs/MEDIA.md). Not for the volatile engine.
    #[arg(long, default_value = "none", value_parser = parse_media_model)]
    pub media_model: MediaModelArg,
    /// NVM latency emulation: `none`, `optane`, `dudetx`, or
    /// READ_NS,PERSIST_NS[,WRITE_MB_PER_S[,SEQ_READ_NS]]
    /// (delays added per PM line a read misses and per persisting fence; docs/MEDIA.md). Implies
    /// the media model (`optane` unless --media-model says otherwise).
    #[arg(long, default_value = "none", value_parser = parse_nvm_latency)]
    pub nvm_latency: NvmLatencyArg,
    /// Where the tables' primary indexes live: `dram` (rebuilt by a heap scan at recovery) or
    /// `pm` (persistent, recovered without a heap scan; falcon, falcon-allflush, falcon-noflush
    /// and inp only).
    #[arg(long, default_value = "dram")]
    pub index: crate::index::IndexPlacement,
    /// DUDETx: `sync` (a commit returns once durable) or `async` (it returns at once; the
    /// persist thread makes it durable later).
    #[arg(long, default_value = "sync")]
    pub dudetx_mode: crate::engine::dudetx::DurabilityMode,
    /// DUDETx: transactions combined into one persisted log record at most (§3.3).
    #[arg(long, default_value_t = 64)]
    pub dudetx_group: usize,
    /// DUDETx: LZ4 on the persisted log records (§3.3): `auto` (async mode only), `always`,
    /// `never`.
    #[arg(long, default_value = "auto")]
    pub dudetx_compress: crate::engine::dudetx::LogCompression,
    /// DUDETx, async mode: how long the persist thread waits at most for a group to fill (§3.3),
    /// in µs (at most 1 000 000; 0: it takes what is queued).
    #[arg(long, default_value_t = crate::engine::dudetx::DEFAULT_GROUP_DELAY_US)]
    pub dudetx_group_delay_us: u64,
    /// MMDB group commit: transactions written as one log record at most.
    #[arg(long, default_value_t = 64)]
    pub mmdb_group: usize,
    /// MMDB group commit: microseconds the log writer waits for a group to gather.
    #[arg(long, default_value_t = 0)]
    pub mmdb_group_wait_us: u64,
    /// MMDB: milliseconds between checkpoints (0: only when the log is half full).
    #[arg(long, default_value_t = 10_000)]
    pub mmdb_checkpoint_ms: u64,
    /// FIR: milliseconds between the background checkpointer's index leaf checkpoints (§4.3; 0:
    /// no background checkpoints, so recovery redoes everything since the pool was created).
    #[arg(long, default_value_t = 1000)]
    pub fir_checkpoint_ms: u64,
}

/// A parsed `--media-model`.
#[derive(Clone, Copy, Debug)]
pub struct MediaModelArg(pub Option<crate::pmem::MediaModel>);

/// A parsed `--nvm-latency`.
#[derive(Clone, Copy, Debug)]
pub struct NvmLatencyArg(pub Option<crate::pmem::NvmLatency>);

fn parse_media_model(s: &str) -> Result<MediaModelArg, String> {
    crate::pmem::MediaModel::parse(s).map(MediaModelArg)
}

fn parse_nvm_latency(s: &str) -> Result<NvmLatencyArg, String> {
    crate::pmem::NvmLatency::parse(s).map(NvmLatencyArg)
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
    /// Field storage: bytes (fixed `Bytes(field_len)` columns, raw row writes) or text
    /// (`Text(field_len)` string columns through the typed API; issue 21).
    #[arg(long, default_value = "bytes")]
    pub value_type: crate::workload::ycsb::driver::ValueType,
    /// Take a checkpoint right after the load, for engines that keep one (FIR's index leaf
    /// checkpoint, §4.3): with `--fir-checkpoint-ms 0` the work since the last checkpoint is
    /// then exactly the run so far (scripts/fir_recovery.sh's `work` experiment).
    #[arg(long)]
    pub checkpoint_after_load: bool,
}

/// Arguments of `pmtx bench bank`.
#[derive(clap::Args, Debug)]
pub struct BankArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Accounts (opened in batches; the load counts only once complete, see `workload::bank`).
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
    /// TPC-C: the five transactions, with its consistency checks.
    Tpcc(super::bench_tpcc::Args),
    /// TPC-C-NP: New-Order and Payment only.
    TpccNp(super::bench_tpcc::Args),
    /// TATP: the seven telecom transactions.
    Tatp(super::bench_tatp::Args),
    /// Persistent-object (PTM) micro-benchmarks: ArchTM §6.1's hash table.
    Ptm(super::bench_ptm::Args),
}

pub(crate) fn run(cmd: BenchCommand) -> CliResult {
    match cmd {
        BenchCommand::Ycsb(args) => run_ycsb(args),
        BenchCommand::Bank(args) => run_bank(args),
        BenchCommand::Tpcc(args) => super::bench_tpcc::run(args),
        BenchCommand::TpccNp(mut args) => {
            args.new_order_payment_only = true;
            super::bench_tpcc::run(args)
        }
        BenchCommand::Tatp(args) => super::bench_tatp::run(args),
        BenchCommand::Ptm(args) => super::bench_ptm::run(args),
    }
}

impl CommonArgs {
    /// The database configuration for one run of `engine` on `threads` threads.
    pub(crate) fn db_config(&self, engine: EngineKind, threads: usize, pool_size: u64) -> DbConfig {
        let mut config = DbConfig::temporary()
            .engine(engine)
            .protocol(self.cc)
            .domain(self.domain)
            .pool_size(self.pool_size.unwrap_or_else(|| {
                data_pool_size(engine, pool_size).max(crate::db::min_pool_size(engine, threads + 1))
            }))
            .max_threads(threads + 1);
        config.max_pool_size = self.max_pool_size;
        config.hot_tuples = self.hot_tuples;
        config.window_slot_bytes = self.window_slot_bytes;
        config.cc_options.partitions = self.partitions;
        // A benchmark measures aborts rather than failing on them: on a shared machine a thread
        // preempted while holding a hot lock can make a no-wait transaction abort more than the
        // API default (1000) times in a row.
        config.max_retries = 1_000_000;
        config.cache_ratio = self.cache_ratio;
        config.dudetx_mode = self.dudetx_mode;
        config.dudetx_group = self.dudetx_group;
        config.dudetx_compression = self.dudetx_compress;
        config.dudetx_group_delay_us = self.dudetx_group_delay_us;
        config.mmdb_group = self.mmdb_group;
        config.mmdb_group_wait_us = self.mmdb_group_wait_us;
        config.mmdb_checkpoint_ms = self.mmdb_checkpoint_ms;
        config.fir_checkpoint_interval_ms =
            (self.fir_checkpoint_ms > 0).then_some(self.fir_checkpoint_ms);
        // The --compare-volatile baseline keeps DRAM indexes (check_common refuses an explicit
        // volatile engine with --index pm).
        if engine != EngineKind::Volatile {
            config.index_placement = self.index;
        }
        if engine != EngineKind::Volatile {
            config.media = self.media();
        }
        if let Some(p) = &self.pool {
            config = config.path(p);
        }
        config
    }

    /// The media model and latency emulation asked for, if any.
    pub(crate) fn media(&self) -> Option<crate::pmem::MediaOptions> {
        let latency = self.nvm_latency.0;
        let model = self
            .media_model
            .0
            .or_else(|| latency.map(|_| crate::pmem::MediaModel::optane()))?;
        Some(crate::pmem::MediaOptions { model, latency })
    }

    /// The engines to run: the requested ones, plus volatile with `--compare-volatile`.
    pub(crate) fn engines(&self) -> Vec<EngineKind> {
        let mut engines = self.engine.clone();
        if self.compare_volatile && !engines.contains(&EngineKind::Volatile) {
            engines.push(EngineKind::Volatile);
        }
        engines
    }

    /// `(round, threads, engine)` in run order: rounds outermost, so repeats interleave.
    pub(crate) fn plan(&self) -> Vec<(usize, usize, EngineKind)> {
        let mut plan = Vec::new();
        for round in 0..self.repeat {
            for &threads in &self.threads {
                for engine in self.engines() {
                    plan.push((round, threads, engine));
                }
            }
        }
        plan
    }

    /// The domain a run of `engine` reports.
    pub(crate) fn domain_of(&self, engine: EngineKind) -> PersistenceDomain {
        if engine == EngineKind::Volatile {
            PersistenceDomain::Volatile
        } else {
            self.domain
        }
    }

    /// The harness configuration for `threads` threads and these transaction kinds.
    pub(crate) fn bench_config(&self, threads: usize, kinds: &[&str]) -> BenchConfig {
        BenchConfig {
            threads,
            warmup: Duration::from_secs_f64(self.warmup),
            duration: Duration::from_secs_f64(self.duration),
            txn_kinds: kinds.iter().map(|k| k.to_string()).collect(),
        }
    }
}

/// Sets ratios within each (round, threads) group, prints the table, the median ratio per engine
/// and thread count when there are several rounds, and writes the JSON.
pub(crate) fn finish(common: &CommonArgs, reports: &mut [RunReport]) -> CliResult {
    if let Some(media) = common.media() {
        for r in reports
            .iter_mut()
            .filter(|r| r.engine != EngineKind::Volatile.name())
        {
            let committed = r.result.committed;
            r.result
                .pm
                .account_media(committed, media.latency.is_some());
        }
    }
    let mut groups: std::collections::BTreeMap<(u64, usize), Vec<usize>> = Default::default();
    for (i, r) in reports.iter().enumerate() {
        let round = r.params.get("round").and_then(|v| v.as_u64()).unwrap_or(0);
        groups.entry((round, r.result.threads)).or_default().push(i);
    }
    for idx in groups.values() {
        let mut group: Vec<RunReport> = idx.iter().map(|&i| reports[i].clone()).collect();
        attach_volatile(&mut group, common.compare_volatile);
        for (&i, r) in idx.iter().zip(group) {
            reports[i] = r;
        }
    }
    bench::print_table(reports, &mut std::io::stdout())?;
    if common.repeat > 1 {
        print_medians(reports, common.repeat);
    }
    if let Some(path) = &common.json {
        bench::write_json(reports, path)
            .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
    }
    Ok(())
}

/// Per engine and thread count over the rounds: the median throughput with its range, and the
/// median of each ratio measured within a round (to volatile, to each peer) with its range.
fn print_medians(reports: &[RunReport], rounds: usize) {
    #[derive(Default)]
    struct Runs {
        tps: Vec<f64>,
        ratios: std::collections::BTreeMap<String, Vec<f64>>,
    }
    let mut by_engine: std::collections::BTreeMap<(usize, String), Runs> = Default::default();
    for r in reports {
        let runs = by_engine
            .entry((r.result.threads, r.engine.clone()))
            .or_default();
        runs.tps.push(r.result.throughput_tps);
        let ratios = r
            .ratio_to_volatile
            .filter(|_| r.engine != EngineKind::Volatile.name())
            .map(|v| ("volatile".to_string(), v))
            .into_iter()
            .chain(r.ratio_to_peers.iter().map(|(p, &v)| (p.clone(), v)));
        for (to, v) in ratios {
            runs.ratios.entry(to).or_default().push(v);
        }
    }
    outln!("\nmedian over {rounds} rounds [min–max]; each ratio is measured within a round:");
    for ((threads, engine), mut runs) in by_engine {
        let (tps, lo, hi) = bench::median_and_range(&mut runs.tps);
        let mut line = format!("  {engine:<16} {threads} thr  {tps:>12.0} tx/s [{lo:.0}–{hi:.0}]");
        for (to, mut v) in runs.ratios {
            let (m, lo, hi) = bench::median_and_range(&mut v);
            line.push_str(&format!("  ×{to} {m:.3} [{lo:.3}–{hi:.3}]"));
        }
        outln!("{line}");
    }
}

fn run_bank(args: BankArgs) -> CliResult {
    let common = args.common.clone();
    let pool_size = bank_pool_size(&args)?;
    let mut reports = Vec::new();
    for (round, threads, engine) in common.plan() {
        reports.push(bank_engine_run(&args, pool_size, round, threads, engine)?);
    }
    finish(&common, &mut reports)
}

/// Checks `pmtx bench bank`'s arguments and returns the pool size of its runs.
pub(crate) fn bank_pool_size(args: &BankArgs) -> Result<u64, Box<dyn std::error::Error>> {
    let common = &args.common;
    check_common(common)?;
    if args.accounts < 2 || args.accounts > crate::workload::bank::MAX_ACCOUNTS {
        return Err(format!(
            "--accounts must be between 2 and {}",
            crate::workload::bank::MAX_ACCOUNTS
        )
        .into());
    }
    let max_threads = common.threads.iter().copied().max().unwrap_or(1) + 1;
    Ok(pool_size_for(
        &format!("--accounts {}", args.accounts),
        args.accounts
            .checked_mul(64 * 2)
            .and_then(|b| b.checked_add((32 + 8 * max_threads as u64) * crate::alloc::PAGE_SIZE)),
    )?)
}

/// One bank run of a pmtx engine: a fresh pool, the accounts loaded, transfers measured, the
/// invariant checked with `--check`. `pmtx compare bank` calls it too.
pub(crate) fn bank_engine_run(
    args: &BankArgs,
    pool_size: u64,
    round: usize,
    threads: usize,
    engine: EngineKind,
) -> Result<RunReport, Box<dyn std::error::Error>> {
    let common = &args.common;
    let db = Db::create(common.db_config(engine, threads, pool_size))?;
    super::warn_durability(&db);
    let table = crate::workload::bank::load(&db, args.accounts)?;
    let result = bench::run(common.bench_config(threads, &["transfer"]), |t| {
        crate::workload::bank::BankDriver::new(&db, table, args.accounts, 0xba4c + t as u64)
            .map(|d| Box::new(d) as Box<dyn bench::TxnDriver>)
    })?;
    if args.check {
        crate::workload::bank::check(&db, args.accounts)
            .map_err(|e| format!("bank invariant violated: {e}"))?;
        eprintln!(
            "{engine}, {threads} thr: bank check passed ({} accounts, total balance {}, none negative)",
            args.accounts,
            i128::from(args.accounts) * i128::from(crate::workload::bank::INITIAL_BALANCE)
        );
    }
    let params =
        serde_json::json!({ "accounts": args.accounts, "pool_bytes": pool_size, "round": round });
    let domain = common.domain_of(engine);
    Ok(RunReport::new(
        engine.name(),
        common.cc.name(),
        domain.name(),
        "bank",
        result,
        params,
    ))
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
    w.value_type = args.value_type;
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
    let plan = ycsb_plan(&args)?;
    let mut reports: Vec<RunReport> = Vec::new();
    for (round, threads, engine) in args.common.plan() {
        reports.push(ycsb_engine_run(&args, &plan, round, threads, engine)?);
    }
    finish(&args.common, &mut reports)
}

/// What every run of one `pmtx bench ycsb` (or `pmtx compare ycsb`) invocation shares.
pub(crate) struct YcsbPlan {
    /// The workload, with the command line's record shape and mix.
    pub workload: Workload,
    /// Pool size of each run.
    pub pool_size: u64,
}

/// Checks `pmtx bench ycsb`'s arguments and sizes the pools.
pub(crate) fn ycsb_plan(args: &YcsbArgs) -> Result<YcsbPlan, Box<dyn std::error::Error>> {
    let common = &args.common;
    check_common(common)?;
    let workload = workload_of(args)?;
    let row = workload.field_count as u64 * workload.field_len as u64;
    let slot = crate::engine::falcon::layout::tuple::slot_size(row as usize);
    // Room for the records, YCSB-D/E inserts, per-thread pages and windows.
    let max_threads = common.threads.iter().copied().max().unwrap_or(1) + 1;
    if args.records == 0 {
        return Err("--records must be at least 1".into());
    }
    let pool_size = pool_size_for(
        &format!("--records {}", args.records),
        args.records
            .checked_mul(slot)
            .and_then(|b| b.checked_mul(3))
            .map(|b| b / 2)
            .and_then(|b| b.checked_add((64 + 8 * max_threads as u64) * crate::alloc::PAGE_SIZE)),
    )?;
    Ok(YcsbPlan {
        workload,
        pool_size,
    })
}

/// The JSON `params` of a YCSB run (pmtx engine or peer).
pub(crate) fn ycsb_params(args: &YcsbArgs, workload: &Workload, round: usize) -> serde_json::Value {
    serde_json::json!({
        "records": args.records,
        "theta": args.theta,
        "ops_per_txn": workload.ops_per_txn,
        "field_count": workload.field_count,
        "field_len": workload.field_len,
        "write_all_fields": workload.write_all_fields,
        "value_type": workload.value_type,
        "round": round,
    })
}

/// One YCSB run of a pmtx engine: a fresh pool, the records loaded, the workload measured.
/// `pmtx compare ycsb` calls it too.
pub(crate) fn ycsb_engine_run(
    args: &YcsbArgs,
    plan: &YcsbPlan,
    round: usize,
    threads: usize,
    engine: EngineKind,
) -> Result<RunReport, Box<dyn std::error::Error>> {
    let common = &args.common;
    let (workload, pool_size) = (&plan.workload, plan.pool_size);
    let row = driver::schema(workload).row_size();
    let mut config = common.db_config(engine, threads, pool_size);
    config.max_row_bytes = config.max_row_bytes.max(row);
    let dram_before = rss_anon_bytes();
    let db = Db::create(config)?;
    super::warn_durability(&db);
    let table = db.create_table(driver::schema(workload))?;
    let bar = bench::loading_bar(args.records, &format!("loading {engine}"));
    let loaded = AtomicU64::new(0);
    let load_started = std::time::Instant::now();
    driver::load(&db, table, workload, args.records, 2, &|n| {
        bar.set_position(loaded.fetch_add(n, Ordering::Relaxed) + n);
    })?;
    bar.finish_and_clear();
    // On stderr, where a script that kills the run mid-way waits for it (fir_recovery.sh).
    eprintln!(
        "{engine}: loaded {} records in {:.2} s",
        args.records,
        load_started.elapsed().as_secs_f64()
    );
    if args.checkpoint_after_load {
        match db.checkpoint() {
            Some(stats) => {
                let stats = stats.map_err(|e| format!("the checkpoint after the load: {e}"))?;
                eprintln!(
                    "{engine}: checkpoint after the load: {} entries in {:.1} ms",
                    stats.entries, stats.ms
                );
            }
            None => {
                return Err(
                    format!("--checkpoint-after-load: engine {engine} keeps no checkpoint").into(),
                )
            }
        }
    }
    let dram_after_load = rss_anon_bytes();
    let inserts = Arc::new(AcknowledgedCounter::new(args.records));
    let result = bench::run(common.bench_config(threads, &driver::TXN_KINDS), |t| {
        driver::YcsbDriver::new(
            &db,
            table,
            workload,
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
    let mut params = ycsb_params(args, workload, round);
    let extra = serde_json::json!({
        "hot_tuples": common.hot_tuples,
        "window_slot_bytes": common.window_slot_bytes,
        "index": common.index.as_str(),
        "pool_bytes": pool_size,
        "dram_bytes_per_record_after_load": dram_per_record,
        "peak_rss_bytes": peak_rss_bytes(),
    });
    if let (Some(p), serde_json::Value::Object(extra)) = (params.as_object_mut(), extra) {
        p.extend(extra);
    }
    let domain = common.domain_of(engine);
    Ok(RunReport::new(
        engine.name(),
        common.cc.name(),
        domain.name(),
        format!("ycsb-{}", workload.name),
        result,
        params,
    ))
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
    if common.index == crate::index::IndexPlacement::Pm {
        if let Some(e) = common
            .engine
            .iter()
            .find(|e| matches!(e, EngineKind::Zen | EngineKind::Volatile))
        {
            return Err(format!(
                "--index pm: engine {e} does not support persistent indexes (zen updates out of \
                 place, volatile keeps no durable state); run it with --index dram"
            )
            .into());
        }
    }
    // Finite and at most a day: `Duration::from_secs_f64` panics on inf or 1e300, and pool sizes
    // grow with the run time.
    if !(common.duration > 0.0 && common.duration <= MAX_RUN_SECONDS) {
        return Err(format!(
            "--duration must be more than 0 and at most {MAX_RUN_SECONDS} seconds, not {:?}",
            common.duration
        )
        .into());
    }
    if !(common.warmup >= 0.0 && common.warmup <= MAX_RUN_SECONDS) {
        return Err(format!(
            "--warmup must be 0 to {MAX_RUN_SECONDS} seconds, not {:?}",
            common.warmup
        )
        .into());
    }
    if common.repeat == 0 {
        return Err("--repeat must be at least 1".into());
    }
    if common.hot_tuples > crate::engine::MAX_HOT_TUPLES {
        return Err(format!(
            "--hot-tuples must be at most {}",
            crate::engine::MAX_HOT_TUPLES
        )
        .into());
    }
    if common.partitions == 0 || common.partitions > crate::engine::MAX_PARTITIONS {
        return Err(format!(
            "--partitions must be between 1 and {}",
            crate::engine::MAX_PARTITIONS
        )
        .into());
    }
    if let Some(path) = &common.json {
        check_output_path(path, "--json")?;
    }
    Ok(())
}

/// Longest `--duration` and `--warmup`: one day.
pub(crate) const MAX_RUN_SECONDS: f64 = 86_400.0;

/// Checks before a long run that `path` can be written at its end: its directory exists, and it
/// is not itself a directory.
pub(crate) fn check_output_path(path: &std::path::Path, flag: &str) -> CliResult {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            dir.display()
        )
        .into());
    }
    if path.is_dir() {
        return Err(format!("{flag} {}: is a directory", path.display()).into());
    }
    Ok(())
}

/// A byte count: digits, optionally followed by K, M, G or T (powers of 1024; "MiB" and "MB"
/// are read as M too).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("'{s}': expected bytes, e.g. 67108864, 64M or 4G")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("'{s}': expected bytes, e.g. 67108864, 64M or 4G"))
}

/// The pool `engine` needs where an engine keeping its rows in PM needs `rows_in_pm` bytes (the
/// size each bench computes from its data). MMDB keeps its rows in DRAM, but its checkpoint is a
/// copy of every table, and two coexist while one is taken (the previous is freed only once the
/// new one is valid): 1 M YCSB records of 1 KB filled the single-copy size at the first
/// checkpoint.
fn data_pool_size(engine: EngineKind, rows_in_pm: u64) -> u64 {
    match engine {
        EngineKind::Mmdb => rows_in_pm.saturating_mul(2),
        _ => rows_in_pm,
    }
}

/// A pool size computed from command-line numbers: checked arithmetic, and no larger than the
/// page manager can use (larger pools would only end in "persistent memory is full").
pub(crate) fn pool_size_for(what: &str, bytes: Option<u64>) -> Result<u64, String> {
    let max = crate::alloc::PageManager::max_pool_size().min(crate::pmem::MAX_POOL_SIZE);
    match bytes {
        Some(b) if b <= max => Ok(b),
        _ => Err(format!(
            "{what} needs a pool of more than {} ({max} bytes), the largest pmtx can use",
            super::human_bytes(max)
        )),
    }
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

#[cfg(test)]
mod parse_bytes_tests {
    use super::parse_bytes;

    #[test]
    fn sizes_with_and_without_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("8MiB"), Ok(8 << 20));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
