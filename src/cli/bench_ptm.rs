//! `pmtx bench ptm`: ArchTM §6.1's micro-benchmarks on the persistent-object API (the chained
//! hash table and a B+-tree) and §6.2's New-Order and TATP on a key-value store over it, on
//! ArchTM, DUDETx and PMDK (`--features pmdk`), with write amplification (PM bytes written /
//! bytes the application asked to change: the values updated, or the records put).

use super::CliResult;
use crate::bench::{self, BenchConfig, RunReport};
use crate::pmem::PersistenceDomain;
use crate::ptm::{PObject, Ptm, PtmConfig, PtmEngineKind, PtmRunner};
use crate::workload::ptm_hash::{self, HashDriver, HashRoot};
use crate::workload::ptm_kv::KvRoot;
use crate::workload::ptm_neworder::{self, NewOrderDb, NewOrderDriver};
use crate::workload::ptm_tatp::{self, TatpKv, TatpKvDriver};
use crate::workload::ptm_tree::{self, TreeDriver, TreeRoot};
use crate::workload::tpcc::TpccConfig;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Arguments of `pmtx bench ptm`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// PTM engines, comma-separated: archtm, dudetx, and pmdk (PMDK's libpmemobj under a
    /// pool-wide readers-writer lock, ArchTM §6; needs a build with `--features pmdk`).
    #[arg(long, value_delimiter = ',', default_value = "archtm")]
    pub engine: Vec<BenchEngine>,
    /// The data structure: hash (a chained hash table of 10 240 buckets) or tree (a B+-tree,
    /// leaves of 8 pairs, inner nodes of 16 children; §6.1 runs it with 1 M pairs); or a §6.2
    /// workload on the key-value store over the API: neworder (TPC-C New-Order, each thread
    /// at its own warehouse) or tatp (the seven-transaction mix).
    #[arg(long, default_value = "hash")]
    pub structure: String,
    /// neworder: warehouses (default: the largest thread count, one per thread as in §6.2).
    #[arg(long)]
    pub warehouses: Option<u64>,
    /// neworder: 1/100 of TPC-C's cardinalities (1 000 items, 30 customers per district)
    /// instead of the specification's, for quick runs.
    #[arg(long)]
    pub small: bool,
    /// tatp: subscribers (default 100 000).
    #[arg(long, default_value_t = 100_000)]
    pub subscribers: u64,
    /// Percentage of transactions that update a value (the rest look one up), e.g. 5, 50, 80.
    #[arg(long, value_delimiter = ',', default_value = "50")]
    pub update_pct: Vec<u64>,
    /// Pairs loaded before the run (8-byte keys, 16-byte values); default 100 000 for the hash
    /// table, 1 000 000 for the tree (§6.1).
    #[arg(long)]
    pub pairs: Option<u64>,
    /// Persistence domain (adr, eadr).
    #[arg(long, default_value = "adr")]
    pub domain: PersistenceDomain,
    /// Worker thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub threads: Vec<usize>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Warm-up seconds per run.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Rounds of every configuration.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Write the results as a JSON array to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// DUDETx: sync or async commits.
    #[arg(long, default_value = "sync")]
    pub dudetx_mode: crate::engine::dudetx::DurabilityMode,
    /// DUDETx: transactions combined per log record (§3.3).
    #[arg(long, default_value_t = 64)]
    pub dudetx_group: usize,
    /// DUDETx: LZ4 on the persisted log records (§3.3): `auto` (async mode only), `always`,
    /// `never`.
    #[arg(long, default_value = "auto")]
    pub dudetx_compress: crate::engine::dudetx::LogCompression,
    /// DUDETx, async mode: how long the persist thread waits at most for a group to fill, µs.
    #[arg(long, default_value_t = crate::engine::dudetx::DEFAULT_GROUP_DELAY_US)]
    pub dudetx_group_delay_us: u64,
    /// DUDETx: perform mode (stm, locks, locks-two-round; §4.1, §5).
    #[arg(long, default_value = "stm")]
    pub dudetx_perform: crate::engine::dudetx::ptm::PerformMode,
    /// DUDETx: the shadow size in % of its shadow pages (§3.6 paging; 100: no paging).
    #[arg(long, default_value_t = 100)]
    pub dudetx_shadow_pct: usize,
    /// DUDETx: the shadow page size in bytes (§3.6; a power of two, 4096 to 2 MiB).
    #[arg(long, default_value_t = crate::engine::dudetx::ptm::heap::DEFAULT_SHADOW_PAGE)]
    pub dudetx_shadow_page: usize,
}

/// An engine of `pmtx bench ptm`: a PTM engine of `pmtx::ptm`, or PMDK behind the same API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchEngine {
    /// ArchTM or DUDETx.
    Ptm(PtmEngineKind),
    /// PMDK libpmemobj (`pmtx::peers::pmdk_ptm`).
    Pmdk,
}

impl BenchEngine {
    /// The engine's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            BenchEngine::Ptm(k) => k.name(),
            BenchEngine::Pmdk => "pmdk",
        }
    }

    /// Its isolation in reports: snapshot isolation, or PMDK's readers-writer lock.
    pub fn cc(self) -> &'static str {
        match self {
            BenchEngine::Ptm(_) => "si",
            BenchEngine::Pmdk => "rwlock",
        }
    }
}

impl std::str::FromStr for BenchEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pmdk" if cfg!(feature = "pmdk") => Ok(BenchEngine::Pmdk),
            "pmdk" => Err(
                "engine pmdk is not built in: rebuild with `cargo build --release \
                 --features pmdk` (needs libpmemobj-dev; scripts/peers.sh installs it)"
                    .into(),
            ),
            s => s
                .parse()
                .map(BenchEngine::Ptm)
                .map_err(|e: String| format!("{e}, or pmdk")),
        }
    }
}

/// Creates a pool of `engine` of `size` bytes for `args`' threads with root `R::default()`,
/// behind the runner interface.
fn create_runner<R: PObject + Default>(
    engine: BenchEngine,
    args: &Args,
    size: u64,
) -> Result<Box<dyn PtmRunner<R>>, String> {
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    let mut config = PtmConfig::temporary()
        .size(size)
        .domain(args.domain)
        .max_threads(max_threads);
    config.dudetx.mode = args.dudetx_mode;
    config.dudetx.group = args.dudetx_group;
    config.dudetx.compression = args.dudetx_compress;
    config.dudetx.group_delay_us = args.dudetx_group_delay_us;
    config.dudetx.perform = args.dudetx_perform;
    config.dudetx.shadow_percent = args.dudetx_shadow_pct;
    config.dudetx.shadow_page_bytes = args.dudetx_shadow_page;
    match engine {
        BenchEngine::Ptm(kind) => Ok(Box::new(
            Ptm::<R>::create(config.engine(kind)).map_err(|e| e.to_string())?,
        )),
        #[cfg(feature = "pmdk")]
        BenchEngine::Pmdk => {
            let path = crate::peers::PeerKind::Pmdk.scratch_path();
            // Removed on drop, and by the Ctrl-C handler if the run is interrupted.
            crate::pmem::scratch::register(&path);
            let _ = std::fs::remove_file(&path);
            Ok(Box::new(
                crate::peers::pmdk_ptm::PmdkPtm::<R>::create(
                    &path,
                    config.size,
                    &R::default(),
                    true,
                )
                .map_err(|e| e.to_string())?,
            ))
        }
        #[cfg(not(feature = "pmdk"))]
        BenchEngine::Pmdk => Err("engine pmdk is not built in (feature pmdk)".into()),
    }
}

/// An engine's counters as a JSON object (the `engine_stats` of a report).
fn stats_json<R: PObject>(p: &dyn PtmRunner<R>) -> serde_json::Map<String, serde_json::Value> {
    (p.engine_stats().into_iter())
        .map(|(k, v)| (k.to_string(), v.into()))
        .collect()
}

pub(crate) fn run(args: Args) -> CliResult {
    let tree = match args.structure.as_str() {
        "hash" => false,
        "tree" => true,
        "neworder" | "tatp" => return run_kv(args),
        s => return Err(format!("--structure {s}: expected hash, tree, neworder or tatp").into()),
    };
    let pairs = args.pairs.unwrap_or(if tree { 1_000_000 } else { 100_000 });
    if let Some(&p) = args.update_pct.iter().find(|&&p| p > 100) {
        return Err(format!("--update-pct {p}: a percentage is at most 100").into());
    }
    if pairs == 0 || args.threads.contains(&0) || args.repeat == 0 {
        return Err("--pairs, --threads and --repeat must be at least 1".into());
    }
    if !args.domain.is_durable() {
        return Err(format!("--domain {}: ArchTM needs adr or eadr", args.domain).into());
    }
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    // Hash nodes are 64-byte blocks, tree leaves 256 bytes per 8 pairs (and inner nodes); room
    // for copies awaiting collection, per-thread lists and checkpoint copies.
    let per_pair = if tree { 48 } else { 64 };
    let pool_size =
        (pairs * per_pair * 4 + (16 + 4 * max_threads as u64) * (2 << 20)).max(16 << 20);
    let mut reports = Vec::new();
    for round in 0..args.repeat {
        for &engine in &args.engine {
            let bar =
                bench::loading_bar(pairs, &format!("loading {pairs} pairs ({})", engine.name()));
            let (hash, treep) = if tree {
                let p = create_runner::<TreeRoot>(engine, &args, pool_size)?;
                ptm_tree::load(&*p, pairs)?;
                (None, Some(p))
            } else {
                let p = create_runner::<HashRoot>(engine, &args, pool_size)?;
                ptm_hash::load(&*p, pairs)?;
                (Some(p), None)
            };
            bar.finish_and_clear();
            for &threads in &args.threads {
                for &pct in &args.update_pct {
                    let app_bytes = AtomicU64::new(0);
                    let config = BenchConfig {
                        threads,
                        warmup: Duration::from_secs_f64(args.warmup),
                        duration: Duration::from_secs_f64(args.duration),
                        txn_kinds: vec!["update".into(), "lookup".into()],
                    };
                    let app = &app_bytes;
                    let seed =
                        |t: usize| 0x5eed ^ (round as u64) << 40 ^ (t as u64 + 1) << 20 ^ pct;
                    let result = bench::run(&config, |t| {
                        Ok::<_, String>(match (&hash, &treep) {
                            (Some(p), _) => {
                                Box::new(HashDriver::new(&**p, pairs, pct, seed(t), app))
                                    as Box<dyn bench::TxnDriver>
                            }
                            (_, Some(p)) => {
                                Box::new(TreeDriver::new(&**p, pairs, pct, seed(t), app))
                            }
                            _ => unreachable!("one structure is loaded"),
                        })
                    })?;
                    // Bytes asked to change during the measured window: the update share of
                    // the committed transactions times the value size.
                    let updates: u64 = result
                        .per_kind
                        .iter()
                        .find(|k| k.name == "update")
                        .map_or(0, |k| k.committed);
                    let app_measured = updates * ptm_tree::VALUE_BYTES;
                    let pm_bytes = result.pm.total.bytes_written;
                    let wa = (app_measured > 0).then(|| pm_bytes as f64 / app_measured as f64);
                    let engine_stats = match (&hash, &treep) {
                        (Some(p), _) => stats_json(&**p),
                        (_, Some(p)) => stats_json(&**p),
                        _ => serde_json::Map::new(),
                    };
                    let params = serde_json::json!({
                        "structure": args.structure,
                        "update_pct": pct,
                        "pairs": pairs,
                        "buckets": (!tree).then_some(ptm_hash::BUCKETS),
                        "tree": tree.then_some("B+-tree, leaves of 8 pairs, fanout 16"),
                        "round": round,
                        "app_bytes_per_txn": app_measured as f64 / result.committed.max(1) as f64,
                        "pm_bytes_per_txn": result.pm.bytes_per_txn,
                        "write_amplification": wa,
                        "app_bytes_all_windows": app.load(Ordering::Relaxed),
                        "engine_stats": engine_stats,
                    });
                    reports.push(RunReport::new(
                        engine.name(),
                        engine.cc(),
                        args.domain.name(),
                        format!("ptm-{}-u{pct}", args.structure),
                        result,
                        params,
                    ));
                }
            }
        }
    }
    finish(&args, &reports)
}

/// `--structure neworder|tatp`: ArchTM §6.2's workloads on the key-value store.
fn run_kv(args: Args) -> CliResult {
    if args.threads.contains(&0) || args.repeat == 0 {
        return Err("--threads and --repeat must be at least 1".into());
    }
    if !args.domain.is_durable() {
        return Err(format!("--domain {}: the PTM engines need adr or eadr", args.domain).into());
    }
    let neworder = args.structure == "neworder";
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    let tpcc = {
        let w = args.warehouses.unwrap_or(max_threads as u64);
        if args.small {
            TpccConfig::tiny(w)
        } else {
            TpccConfig::standard(w)
        }
    };
    tpcc.validate()?;
    if args.subscribers == 0 {
        return Err("--subscribers must be at least 1".into());
    }
    // The loaded records with their node and allocation headers, twice over (copies awaiting
    // collection), plus the run's inserts (New-Order adds about 1.5 KB a transaction).
    let data = if neworder {
        tpcc.items * 128
            + tpcc.warehouses * (tpcc.items * 384 + 30 * tpcc.customers_per_district * 768)
    } else {
        args.subscribers * 640
    };
    let run_growth = if neworder { 1u64 << 30 } else { 64 << 20 };
    let pool_size = 2 * data + run_growth + (16 + 4 * max_threads as u64) * (2 << 20);
    let mut reports = Vec::new();
    for round in 0..args.repeat {
        for &engine in &args.engine {
            let p = create_runner::<KvRoot>(engine, &args, pool_size)?;
            let seed = 0x7a7 ^ round as u64;
            let bar = bench::loading_bar(
                0,
                &format!("loading {} ({})", args.structure, engine.name()),
            );
            let (no, tatp) = if neworder {
                (Some(NewOrderDb::load(&*p, tpcc, seed)?), None)
            } else {
                (None, Some(TatpKv::load(&*p, args.subscribers, seed)?))
            };
            bar.finish_and_clear();
            for &threads in &args.threads {
                let app = [AtomicU64::new(0), AtomicU64::new(0)];
                let config = BenchConfig {
                    threads,
                    warmup: Duration::from_secs_f64(args.warmup),
                    duration: Duration::from_secs_f64(args.duration),
                    txn_kinds: if neworder {
                        ptm_neworder::KINDS.iter().map(|k| k.to_string()).collect()
                    } else {
                        ptm_tatp::kinds()
                    },
                };
                let (app_ref, p_ref) = (&app, &*p);
                let result = bench::run(&config, |t| {
                    let s = seed ^ (t as u64 + 1) << 24 ^ (threads as u64) << 40;
                    Ok::<_, String>(match (&no, &tatp) {
                        (Some(db), _) => Box::new(NewOrderDriver::new(
                            p_ref,
                            db,
                            t as u64 % db.config.warehouses + 1,
                            s,
                            app_ref,
                        )) as Box<dyn bench::TxnDriver>,
                        (_, Some(db)) => Box::new(TatpKvDriver::new(p_ref, db, s, app_ref)),
                        _ => unreachable!("one workload is loaded"),
                    })
                })?;
                // The records committed transactions put, per transaction over every window,
                // times the measured window's transactions.
                let (put, txns) = (
                    app[0].load(Ordering::Relaxed),
                    app[1].load(Ordering::Relaxed),
                );
                let per_txn = put as f64 / txns.max(1) as f64;
                let app_measured = per_txn * result.committed as f64;
                let pm_bytes = result.pm.total.bytes_written;
                let wa = (app_measured > 0.0).then(|| pm_bytes as f64 / app_measured);
                let params = serde_json::json!({
                    "structure": args.structure,
                    "warehouses": neworder.then_some(tpcc.warehouses),
                    "items": neworder.then_some(tpcc.items),
                    "subscribers": (!neworder).then_some(args.subscribers),
                    "round": round,
                    "app_bytes_per_txn": per_txn,
                    "pm_bytes_per_txn": result.pm.bytes_per_txn,
                    "write_amplification": wa,
                    "engine_stats": stats_json(&*p),
                });
                reports.push(RunReport::new(
                    engine.name(),
                    engine.cc(),
                    args.domain.name(),
                    format!("ptm-{}", args.structure),
                    result,
                    params,
                ));
            }
            if let Some(db) = &no {
                // The run left the database consistent (TPC-C's conditions; TATP's population).
                ptm_neworder::check(&*p, db).map_err(|e| format!("after the run: {e}"))?;
            }
            if let Some(db) = &tatp {
                ptm_tatp::check(&*p, db).map_err(|e| format!("after the run: {e}"))?;
            }
        }
    }
    finish(&args, &reports)
}

fn finish(args: &Args, reports: &[RunReport]) -> CliResult {
    bench::print_table(reports, &mut std::io::stdout())?;
    outln!("\nwrite amplification (PM bytes written / bytes the application asked to change):");
    for r in reports {
        outln!(
            "  {:<8} {:<16} {} thr  {:>10.0} tx/s  {:>7.1} PM B/tx  WA {}",
            r.engine,
            r.workload,
            r.result.threads,
            r.result.throughput_tps,
            r.result.pm.bytes_per_txn,
            r.params["write_amplification"]
                .as_f64()
                .map_or("-".to_string(), |w| format!("{w:.2}"))
        );
    }
    for r in reports.iter().filter(|r| r.engine == "dudetx") {
        let st = &r.params["engine_stats"];
        let n = |k: &str| st[k].as_u64().unwrap_or(0);
        outln!(
            "  dudetx {} thr: log raw {} B, combined {} B, stored {} B (saved {:.1} %, lz4 {:.2}); \
             pages loaded {}, evicted {}, waits {}; latency p50 {:.1} us",
            r.result.threads,
            n("log_raw_bytes"),
            n("log_combined_bytes"),
            n("log_stored_bytes"),
            100.0 * (1.0 - n("log_stored_bytes") as f64 / n("log_raw_bytes").max(1) as f64),
            n("log_stored_bytes") as f64 / n("log_combined_bytes").max(1) as f64,
            n("page_loads"),
            n("page_evictions"),
            n("page_waits"),
            r.result.latency_us.p50,
        );
    }
    if let Some(path) = &args.json {
        bench::write_json(reports, path)
            .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
    }
    Ok(())
}
