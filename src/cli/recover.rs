//! `pmtx recover POOL`: open a pool, run recovery, report each phase.

use super::CliResult;
use crate::cc::Protocol;
use crate::db::{Db, DbConfig};
use crate::engine::EngineKind;
use crate::pmem::PersistenceDomain;
use std::path::PathBuf;

/// Arguments of `pmtx recover`.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The pool file.
    pub pool: PathBuf,
    /// The engine the pool was written by.
    #[arg(long, default_value = "falcon")]
    pub engine: EngineKind,
    /// Concurrency-control protocol the database runs (any of `pmtx bench --cc`): recovery
    /// resets each tuple word to that protocol's idle format.
    #[arg(long, default_value = "occ")]
    pub cc: Protocol,
    /// The persistence domain.
    #[arg(long, default_value = "eadr")]
    pub domain: PersistenceDomain,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn run(args: RecoverArgs) -> CliResult {
    let config = DbConfig::default()
        .engine(args.engine)
        .protocol(args.cc)
        .domain(args.domain)
        .path(&args.pool);
    let db = Db::open(config)?;
    let report = db.recovery_report().ok_or("the engine ran no recovery")?;
    let rows = db
        .check_structure()
        .map_err(|e| format!("after recovery: {e}"))?;
    if args.json {
        let json = serde_json::json!({ "report": report, "rows_per_table": rows });
        outln!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    outln!("recovered {} with {}", args.pool.display(), args.engine);
    for (phase, ms) in &report.phases {
        outln!("  {phase:<32} {ms:>10.3} ms");
    }
    outln!("  {:<32} {:>10.3} ms", "total", report.total_ms);
    if args.engine.layout() == "falcon" {
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
    for (schema, n) in catalog.tables.iter().zip(rows) {
        outln!("  table {:<20} {n} rows", schema.name);
    }
    Ok(())
}
