//! `pmtx compare`: the `pmtx bench` workloads on pmtx engines and on peers (LMDB, PMDK) in one
//! invocation: the same key generator, record sizes, thread counts and run lengths, results in
//! `pmtx bench`'s table and JSON (so `pmtx plot` reads them) with a ratio column to each peer.
//!
//! The pmtx runs go through `pmtx bench`'s own functions (`bench::ycsb_engine_run`,
//! `bench::bank_engine_run`); the peers through [`crate::peers`].

use super::bench::{self, BankArgs, YcsbArgs};
use super::CliResult;
use crate::bench::{BenchResult, RunReport, TxnDriver};
use crate::peers::{self, PeerKind, PeerStore};

/// `pmtx compare`'s workloads.
#[derive(clap::Subcommand, Debug)]
pub enum CompareCommand {
    /// YCSB (1 or 16 operations per transaction, any record size, uniform or zipfian, any
    /// read/update mix without inserts or scans) on the engines and the peers.
    Ycsb(CompareYcsbArgs),
    /// Bank transfers (a TATP-style key-value read-modify-write of two accounts) on the engines
    /// and the peers; `--check` checks the invariant on every run.
    Bank(CompareBankArgs),
}

/// Arguments of `pmtx compare ycsb`.
#[derive(clap::Args, Debug)]
pub struct CompareYcsbArgs {
    #[command(flatten)]
    ycsb: YcsbArgs,
    #[command(flatten)]
    peers: PeerArgs,
}

/// Arguments of `pmtx compare bank`.
#[derive(clap::Args, Debug)]
pub struct CompareBankArgs {
    #[command(flatten)]
    bank: BankArgs,
    #[command(flatten)]
    peers: PeerArgs,
}

/// The peers to run.
#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    /// Peers to run, comma-separated (default: the durable peers built into this binary):
    /// lmdb, lmdb-writemap, lmdb-nosync, lmdb-mapasync, pmdk. See `pmtx compare --help`.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<PeerKind>,
}

impl PeerArgs {
    /// The peers asked for, or the durable built ones; an error if one is not built, or if
    /// none is.
    fn resolve(&self) -> Result<Vec<PeerKind>, Box<dyn std::error::Error>> {
        if self.peers.is_empty() {
            let built: Vec<PeerKind> = PeerKind::ALL
                .into_iter()
                .filter(|p| p.built() && p.durable())
                .collect();
            if built.is_empty() {
                return Err(
                    "no peer is built into this pmtx: rebuild with `cargo build \
                            --release --features lmdb,pmdk` (scripts/peers.sh installs what \
                            the pmdk feature needs and does it)"
                        .into(),
                );
            }
            return Ok(built);
        }
        let mut peers = Vec::new();
        for &p in &self.peers {
            p.check_built()?;
            if !peers.contains(&p) {
                peers.push(p);
            }
        }
        Ok(peers)
    }
}

/// The text after `pmtx compare --help`: the peers, which are built, how to build the others.
pub fn peers_help() -> String {
    let mut s = String::from("Peers:\n");
    for p in PeerKind::ALL {
        s.push_str(&format!(
            "  {:<14} {} [{}]\n",
            p.name(),
            p.describe(),
            if p.built() {
                "built in".to_string()
            } else {
                format!(
                    "not built: cargo build --release --features {}",
                    p.feature()
                )
            }
        ));
    }
    s.push_str(
        "  rocksdb        not built (its build needs libclang and takes 15-30 minutes)\n\n\
         LMDB runs one write transaction at a time (its writer lock); readers run concurrently.\n\
         scripts/peers.sh installs libpmemobj-dev (apt-get, as root), builds with \
         --features lmdb,pmdk and runs the README's comparison.",
    );
    s
}

pub(crate) fn run(cmd: CompareCommand) -> CliResult {
    match cmd {
        CompareCommand::Ycsb(args) => run_ycsb(args),
        CompareCommand::Bank(args) => run_bank(args),
    }
}

fn run_ycsb(args: CompareYcsbArgs) -> CliResult {
    let peers = args.peers.resolve()?;
    let ycsb = &args.ycsb;
    let plan = bench::ycsb_plan(ycsb)?;
    peers::check_ycsb_workload(&plan.workload)?;
    let row_len = plan.workload.field_count as usize * plan.workload.field_len;
    let mut reports = Vec::new();
    for (round, threads, engine) in ycsb.common.plan() {
        reports.push(bench::ycsb_engine_run(ycsb, &plan, round, threads, engine)?);
        if engine != *ycsb.common.engines().last().expect("at least one engine") {
            continue;
        }
        for &peer in &peers {
            let workload = &plan.workload;
            let result = run_peer(
                peer,
                &ycsb.common,
                threads,
                &crate::workload::ycsb::driver::TXN_KINDS,
                ycsb.records,
                row_len,
                &|store| peers::load_ycsb(store, workload, ycsb.records),
                &|store, t| {
                    peers::PeerYcsbDriver::new(store, workload, ycsb.records, 0x5eed + t as u64)
                        .map(|d| Box::new(d) as Box<dyn TxnDriver + '_>)
                },
                &|store| {
                    let updated = peers::check_ycsb(store, workload, ycsb.records)?;
                    Ok(format!(
                        "{updated} records updated, every field loaded or updated"
                    ))
                },
            )?;
            reports.push(peer_report(
                peer,
                format!("ycsb-{}", workload.name),
                result,
                bench::ycsb_params(ycsb, workload, round),
            ));
        }
    }
    finish(&ycsb.common, &peers, &mut reports)
}

fn run_bank(args: CompareBankArgs) -> CliResult {
    let peers = args.peers.resolve()?;
    let bank = &args.bank;
    let pool_size = bench::bank_pool_size(bank)?;
    let mut reports = Vec::new();
    for (round, threads, engine) in bank.common.plan() {
        reports.push(bench::bank_engine_run(
            bank, pool_size, round, threads, engine,
        )?);
        if engine != *bank.common.engines().last().expect("at least one engine") {
            continue;
        }
        for &peer in &peers {
            let accounts = bank.accounts;
            let result = run_peer(
                peer,
                &bank.common,
                threads,
                &["transfer"],
                accounts,
                peers::BANK_ROW,
                &|store| peers::load_bank(store, accounts),
                &|store, t| {
                    Ok::<_, peers::PeerError>(Box::new(peers::PeerBankDriver::new(
                        store,
                        accounts,
                        0xba4c + t as u64,
                    )) as Box<dyn TxnDriver + '_>)
                },
                &|store| {
                    let transfers = peers::check_bank(store, accounts)?;
                    Ok(format!(
                        "bank check passed ({accounts} accounts, total unchanged, none \
                         negative, {} transfers)",
                        transfers / 2
                    ))
                },
            )?;
            let params = serde_json::json!({ "accounts": accounts, "round": round });
            reports.push(peer_report(peer, "bank".into(), result, params));
        }
    }
    finish(&bank.common, &peers, &mut reports)
}

type Factory<'a> = dyn for<'s> Fn(&'s dyn PeerStore, usize) -> Result<Box<dyn TxnDriver + 's>, peers::PeerError>
    + Sync
    + 'a;

/// One run of a peer: a fresh store in /dev/shm, loaded on one thread, measured with the
/// harness's run loop, then reopened and checked (every record present, contents valid), and
/// removed.
#[allow(clippy::too_many_arguments)]
fn run_peer(
    peer: PeerKind,
    common: &bench::CommonArgs,
    threads: usize,
    kinds: &[&str],
    records: u64,
    row_len: usize,
    load: &(dyn Fn(&dyn PeerStore) -> Result<(), peers::PeerError> + Sync),
    driver: &Factory<'_>,
    check: &(dyn Fn(&dyn PeerStore) -> Result<String, String> + Sync),
) -> Result<BenchResult, Box<dyn std::error::Error>> {
    let path = peer.scratch_path();
    crate::pmem::scratch::register(&path);
    let outcome = (|| -> Result<BenchResult, Box<dyn std::error::Error>> {
        let store = peer.create(&path, records, row_len)?;
        load(&*store)?;
        let result =
            crate::bench::run(common.bench_config(threads, kinds), |t| driver(&*store, t))?;
        drop(store);
        let store = peer.open(&path, records, row_len)?;
        let stored = store.len()?;
        if stored != records {
            return Err(format!("{peer}: {stored} records after the run, {records} loaded").into());
        }
        let note = check(&*store).map_err(|e| format!("{peer}: check after reopen: {e}"))?;
        eprintln!("{peer}, {threads} thr: reopened, {note}");
        Ok(result)
    })();
    let removed = if path.is_dir() {
        std::fs::remove_dir_all(&path)
    } else {
        std::fs::remove_file(&path)
    };
    crate::pmem::scratch::unregister(&path);
    if let Err(e) = removed {
        eprintln!("pmtx: warning: cannot remove {}: {e}", path.display());
    }
    outcome
}

fn peer_report(
    peer: PeerKind,
    workload: String,
    result: BenchResult,
    mut params: serde_json::Value,
) -> RunReport {
    if let Some(p) = params.as_object_mut() {
        p.insert("peer".into(), peer.describe().into());
        p.insert("durable".into(), peer.durable().into());
    }
    RunReport::new(
        peer.name(),
        peer.isolation(),
        peer.durability(),
        workload,
        result,
        params,
    )
}

/// Sets each pmtx run's ratio to each peer in the same round and thread count, then prints and
/// writes as `pmtx bench` does, and says what each peer's mode is.
fn finish(common: &bench::CommonArgs, peers: &[PeerKind], reports: &mut [RunReport]) -> CliResult {
    set_peer_ratios(reports, peers);
    bench::finish(common, reports)?;
    outln!();
    for p in peers {
        outln!("{:<14} {}", p.name(), p.describe());
    }
    if peers.iter().any(|p| p.feature() == "lmdb") && common.threads.iter().any(|&t| t > 1) {
        outln!("LMDB runs one write transaction at a time: its writers do not scale with threads.");
    }
    Ok(())
}

/// `×peer` ratios: each non-peer report's throughput over the peer's in its (round, threads).
fn set_peer_ratios(reports: &mut [RunReport], peers: &[PeerKind]) {
    let names: Vec<&str> = peers.iter().map(|p| p.name()).collect();
    let key = |r: &RunReport| {
        (
            r.params.get("round").and_then(|v| v.as_u64()).unwrap_or(0),
            r.result.threads,
        )
    };
    let peer_tps: Vec<((u64, usize), String, f64)> = reports
        .iter()
        .filter(|r| names.contains(&r.engine.as_str()))
        .map(|r| (key(r), r.engine.clone(), r.result.throughput_tps))
        .collect();
    for r in reports
        .iter_mut()
        .filter(|r| !names.contains(&r.engine.as_str()))
    {
        for (k, name, tps) in &peer_tps {
            if *k == key(r) && *tps > 0.0 {
                r.ratio_to_peers
                    .insert(name.clone(), r.result.throughput_tps / tps);
            }
        }
    }
}
