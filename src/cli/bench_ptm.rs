//! `pmtx bench ptm`: ArchTM §6.1's micro-benchmarks on the persistent-object API (the hash
//! table; the tree is not built yet), with write amplification (PM bytes written / bytes the
//! application asked to change).

use super::CliResult;
use crate::bench::{self, BenchConfig, RunReport};
use crate::pmem::PersistenceDomain;
use crate::ptm::{Ptm, PtmConfig, PtmEngineKind};
use crate::workload::ptm_hash::{self, HashDriver, HashRoot};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Arguments of `pmtx bench ptm`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// PTM engines, comma-separated (archtm, dudetx; pmdk is not built yet).
    #[arg(long, value_delimiter = ',', default_value = "archtm")]
    pub engine: Vec<PtmEngineKind>,
    /// The data structure: hash (a chained hash table of 10 240 buckets); tree is not built yet.
    #[arg(long, default_value = "hash")]
    pub structure: String,
    /// Percentage of transactions that update a value (the rest look one up), e.g. 5, 50, 80.
    #[arg(long, value_delimiter = ',', default_value = "50")]
    pub update_pct: Vec<u64>,
    /// Pairs loaded before the run (8-byte keys, 16-byte values).
    #[arg(long, default_value_t = 100_000)]
    pub pairs: u64,
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
}

pub(crate) fn run(args: Args) -> CliResult {
    if args.structure != "hash" {
        return Err(format!(
            "--structure {}: only 'hash' is built (the tree of ArchTM §6.1 is not yet; issue 15)",
            args.structure
        )
        .into());
    }
    if let Some(&p) = args.update_pct.iter().find(|&&p| p > 100) {
        return Err(format!("--update-pct {p}: a percentage is at most 100").into());
    }
    if args.pairs == 0 || args.threads.contains(&0) || args.repeat == 0 {
        return Err("--pairs, --threads and --repeat must be at least 1".into());
    }
    if !args.domain.is_durable() {
        return Err(format!("--domain {}: ArchTM needs adr or eadr", args.domain).into());
    }
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    // Nodes are 64-byte blocks; room for copies awaiting collection and per-thread lists.
    let pool_size = (args.pairs * 64 * 4 + (16 + 4 * max_threads as u64) * (2 << 20)).max(16 << 20);
    let mut reports = Vec::new();
    for round in 0..args.repeat {
        for &engine in &args.engine {
            let mut config = PtmConfig::temporary()
                .size(pool_size)
                .domain(args.domain)
                .max_threads(max_threads + 1);
            config.engine = engine;
            let ptm = Ptm::<HashRoot>::create(config)?;
            let bar = bench::loading_bar(
                args.pairs,
                &format!("loading {} pairs ({})", args.pairs, engine.name()),
            );
            ptm_hash::load(&ptm, args.pairs)?;
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
                    let result = bench::run(&config, |t| {
                        Ok::<_, String>(Box::new(HashDriver::new(
                            &ptm,
                            args.pairs,
                            pct,
                            0x5eed ^ (round as u64) << 40 ^ (t as u64 + 1) << 20 ^ pct,
                            app,
                        )) as Box<dyn bench::TxnDriver>)
                    })?;
                    // Bytes asked to change during the measured window: the update share of
                    // the committed transactions times the value size.
                    let updates: u64 = result
                        .per_kind
                        .iter()
                        .find(|k| k.name == "update")
                        .map_or(0, |k| k.committed);
                    let app_measured = updates * ptm_hash::VALUE_BYTES;
                    let pm_bytes = result.pm.total.bytes_written;
                    let wa = (app_measured > 0).then(|| pm_bytes as f64 / app_measured as f64);
                    let params = serde_json::json!({
                        "structure": "hash",
                        "update_pct": pct,
                        "pairs": args.pairs,
                        "buckets": ptm_hash::BUCKETS,
                        "round": round,
                        "app_bytes_per_txn": app_measured as f64 / result.committed.max(1) as f64,
                        "pm_bytes_per_txn": result.pm.bytes_per_txn,
                        "write_amplification": wa,
                        "app_bytes_all_windows": app.load(Ordering::Relaxed),
                    });
                    reports.push(RunReport::new(
                        engine.name(),
                        "si",
                        args.domain.name(),
                        format!("ptm-hash-u{pct}"),
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
    if let Some(path) = &args.json {
        bench::write_json(&reports, path)
            .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
    }
    Ok(())
}
