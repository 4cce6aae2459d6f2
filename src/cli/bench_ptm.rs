//! `pmtx bench ptm`: ArchTM §6.1's micro-benchmarks on the persistent-object API (the chained
//! hash table and a B+-tree), with write amplification (PM bytes written / bytes the
//! application asked to change).

use super::CliResult;
use crate::bench::{self, BenchConfig, RunReport};
use crate::pmem::PersistenceDomain;
use crate::ptm::{Ptm, PtmConfig, PtmEngineKind};
use crate::workload::ptm_hash::{self, HashDriver, HashRoot};
use crate::workload::ptm_tree::{self, TreeDriver, TreeRoot};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Arguments of `pmtx bench ptm`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// PTM engines, comma-separated (archtm, dudetx; pmdk is not built yet).
    #[arg(long, value_delimiter = ',', default_value = "archtm")]
    pub engine: Vec<PtmEngineKind>,
    /// The data structure: hash (a chained hash table of 10 240 buckets) or tree (a B+-tree,
    /// leaves of 8 pairs, inner nodes of 16 children; §6.1 runs it with 1 M pairs).
    #[arg(long, default_value = "hash")]
    pub structure: String,
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
    /// DUDETx: perform mode (stm, locks, locks-two-round; §4.1, §5).
    #[arg(long, default_value = "stm")]
    pub dudetx_perform: crate::engine::dudetx::ptm::PerformMode,
    /// DUDETx: the shadow's size in % of the heap pages (§3.4 paging; 100: no paging).
    #[arg(long, default_value_t = 100)]
    pub dudetx_shadow_pct: usize,
}

pub(crate) fn run(args: Args) -> CliResult {
    let tree = match args.structure.as_str() {
        "hash" => false,
        "tree" => true,
        s => return Err(format!("--structure {s}: expected hash or tree").into()),
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
            let mut config = PtmConfig::temporary()
                .size(pool_size)
                .domain(args.domain)
                .max_threads(max_threads + 1);
            config.engine = engine;
            config.dudetx.mode = args.dudetx_mode;
            config.dudetx.group = args.dudetx_group;
            config.dudetx.perform = args.dudetx_perform;
            config.dudetx.shadow_percent = args.dudetx_shadow_pct;
            let bar =
                bench::loading_bar(pairs, &format!("loading {pairs} pairs ({})", engine.name()));
            let (hash, treep) = if tree {
                let p = Ptm::<TreeRoot>::create(config)?;
                ptm_tree::load(&p, pairs)?;
                (None, Some(p))
            } else {
                let p = Ptm::<HashRoot>::create(config)?;
                ptm_hash::load(&p, pairs)?;
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
                            (Some(p), _) => Box::new(HashDriver::new(p, pairs, pct, seed(t), app))
                                as Box<dyn bench::TxnDriver>,
                            (_, Some(p)) => Box::new(TreeDriver::new(p, pairs, pct, seed(t), app)),
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
                    let engine_stats: serde_json::Map<String, serde_json::Value> =
                        match (&hash, &treep) {
                            (Some(p), _) => p.stats(),
                            (_, Some(p)) => p.stats(),
                            _ => Vec::new(),
                        }
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.into()))
                        .collect();
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
                        "si",
                        args.domain.name(),
                        format!("ptm-{}-u{pct}", args.structure),
                        result,
                        params,
                    ));
                }
            }
        }
    }
    bench::print_table(&reports, &mut std::io::stdout())?;
    outln!("\nwrite amplification (PM bytes written / bytes the application asked to change):");
    for r in &reports {
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
        bench::write_json(&reports, path)
            .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
    }
    Ok(())
}
