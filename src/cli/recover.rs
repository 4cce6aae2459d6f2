//! `pmtx recover POOL`: open a pool, run recovery, report each phase.

use super::CliResult;
use crate::cc::Protocol;
use crate::db::{Db, DbConfig};
use crate::engine::EngineKind;
use crate::pmem::{PersistenceDomain, Pool};
use std::path::PathBuf;

/// Arguments of `pmtx recover`.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The pool file.
    pub pool: PathBuf,
    /// The engine to recover with; default: the one recorded in the pool header. Naming an
    /// engine of another design than the pool's is refused.
    #[arg(long)]
    pub engine: Option<EngineKind>,
    /// Concurrency-control protocol the database runs (any of `pmtx bench --cc`): recovery
    /// resets each tuple word to that protocol's idle format. Default: the engine's default
    /// (occ; mvto for fir).
    #[arg(long)]
    pub cc: Option<Protocol>,
    /// The persistence domain; default: the one the pool was created for (recorded in its
    /// header). Another domain is refused unless `--allow-domain-change` is given.
    #[arg(long)]
    pub domain: Option<PersistenceDomain>,
    /// Open the pool even though `--domain` differs from the domain it was created for (after
    /// moving it to hardware with another persistence domain).
    #[arg(long)]
    pub allow_domain_change: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn run(args: RecoverArgs) -> CliResult {
    let header = Pool::read_header(&args.pool)?;
    let protocol = args.cc.unwrap_or_else(|| {
        args.engine
            .or_else(|| EngineKind::for_layout(&header.layout))
            .map_or(Protocol::Occ, EngineKind::default_protocol)
    });
    let mut config = DbConfig::temporary()
        .protocol(protocol)
        .domain(args.domain.unwrap_or(header.domain))
        .allow_domain_change(args.allow_domain_change)
        .path(&args.pool);
    // No background FIR checkpoint while the structure is checked: the pool keeps the image it
    // was recovered from, so recovering it again repeats the same work (the scripts time several
    // recoveries of one killed pool; a checkpoint taken during the check left the next one
    // nothing to redo).
    config.fir_checkpoint_interval_ms = None;
    if let Some(engine) = args.engine {
        config = config.engine(engine);
        config.engine_from_pool = false;
    }
    let db = Db::open(config)?;
    super::warn_durability(&db);
    let engine = db.config().engine;
    let report = db.recovery_report().ok_or("the engine ran no recovery")?;
    // Transactions could run from the end of `report`; what recovery left to the background
    // runs on (helped by this thread) until here.
    let background = db.engine().finish_background();
    let rows = db
        .check_structure()
        .map_err(|e| format!("after recovery: {e}"))?;
    if args.json {
        let json = serde_json::json!({
            "report": report,
            "ready_ms": report.total_ms,
            "background": background,
            "rows_per_table": rows,
        });
        outln!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    outln!("recovered {} with {}", args.pool.display(), engine);
    for (phase, ms) in &report.phases {
        outln!("  {phase:<32} {ms:>10.3} ms");
    }
    outln!(
        "  {:<32} {:>10.3} ms",
        "total (transactions can run)",
        report.total_ms
    );
    match &background {
        Some(work) => outln!(
            "  {:<32} {:>10.3} ms after recovery: {}",
            "background work pending, done",
            work.finished_ms,
            work.what
        ),
        None => outln!("  {:<32} {:>10}", "background work pending", "none"),
    }
    if engine.layout() == "falcon" {
        outln!(
            "log: {} committed transactions ({} entries replayed), {} discarded; {} rows; {} stale locks cleared",
            report.committed_in_log, report.replayed_entries, report.discarded_in_log, report.rows, report.locks_cleared
        );
    } else {
        outln!("{} rows", report.rows);
    }
    for (fact, n) in &report.facts {
        outln!("  {fact:<32} {n:>10}");
    }
    let catalog = db.engine().catalog();
    for (schema, n) in catalog.tables.iter().zip(rows).filter(|(s, _)| s.is_live()) {
        outln!("  table {:<20} {n} rows", schema.name);
    }
    Ok(())
}
