//! `pmtx check POOL`: a read-only integrity check, like `pmempool check`.
//!
//! The file is opened read-only and mapped private (copy-on-write): no byte can reach it, no lock
//! is taken, so a pool in use by another process can be checked too (it is then seen as a crash
//! image of that moment). In order: the header (magic, version, checksum, size), the page table
//! (superblock, every descriptor's check, every free page all zero), then the engine's own
//! recovery on the private view, which verifies the meta page checksum, the catalog slots, the
//! log windows and every tuple header it scans; last, indexes against the heap (every index entry
//! names a live slot of its table holding its key, and every live slot is indexed).
//!
//! Exit status: 0 clean, 1 damage found, 2 the check could not run (no such file, not a pool,
//! an I/O error, a format version this build does not read, bad arguments).

use super::human_bytes;
use crate::alloc::PageManager;
use crate::db::{Db, DbConfig};
use crate::engine::{DbError, EngineKind};
use crate::pmem::{Pool, PoolError};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `pmtx check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The pool file.
    pub pool: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Exit status: no damage found.
pub const CLEAN: u8 = 0;
/// Exit status: damage found.
pub const DAMAGED: u8 = 1;
/// Exit status: the check could not run.
pub const CANNOT_CHECK: u8 = 2;

/// Why a check did not pass.
pub(crate) enum Failure {
    /// The pool is damaged: what was found.
    Damaged(String),
    /// The check could not run.
    CannotCheck(String),
}

impl Failure {
    /// The message, whichever the kind.
    pub(crate) fn message(self) -> String {
        match self {
            Failure::Damaged(m) => format!("damaged: {m}"),
            Failure::CannotCheck(m) => format!("cannot check: {m}"),
        }
    }

    fn from_pool(e: PoolError) -> Failure {
        match e {
            PoolError::BadChecksum { .. }
            | PoolError::Truncated { .. }
            | PoolError::SizeMismatch { .. } => Failure::Damaged(e.to_string()),
            other => Failure::CannotCheck(other.to_string()),
        }
    }

    fn from_db(e: DbError) -> Failure {
        match e {
            DbError::Pool(p) => Failure::from_pool(p),
            DbError::Corrupt(_) | DbError::Catalog(_) | DbError::Alloc(_) => {
                Failure::Damaged(e.to_string())
            }
            other => Failure::CannotCheck(other.to_string()),
        }
    }
}

/// A pool recovered on a private view: the database (for its catalog) and live rows per table.
pub(crate) struct Recovered {
    /// The database over the private view.
    pub db: Db,
    /// Live rows per table, from the structure check.
    pub rows: Vec<u64>,
    /// Pages in use and in the pool.
    pub pages: (u64, u64),
}

/// Opens `path` as a private view and checks it: page table, then the engine's recovery, then
/// indexes against the heap. Nothing is written to the file.
pub(crate) fn recover_private(path: &Path) -> Result<Recovered, Failure> {
    let pool = Pool::open_private_view(path).map_err(Failure::from_pool)?;
    check_pool(pool, path)
}

/// The checks of [`recover_private`] on a pool already mapped (a private view of a file, or an
/// image in memory, as the fuzz targets give it; `path` names it in messages). Recovery writes
/// to `pool`, never to where its bytes came from.
pub(crate) fn check_pool(pool: Pool, path: &Path) -> Result<Recovered, Failure> {
    let header = pool.header().clone();
    let engine = EngineKind::for_layout(&header.layout).ok_or_else(|| {
        Failure::CannotCheck(format!(
            "pool {} has layout '{}', which this build does not know",
            path.display(),
            header.layout
        ))
    })?;
    check_pool_as(pool, engine)
}

/// [`check_pool`] recovering with `engine` (a variant of the pool's design, e.g. `inp`).
pub(crate) fn check_pool_as(pool: Pool, engine: EngineKind) -> Result<Recovered, Failure> {
    let header = pool.header().clone();
    if pool.root() == 0 {
        return Err(Failure::Damaged(
            "the pool has a header but no root: it was never formatted (or creation crashed)"
                .into(),
        ));
    }
    let pages = PageManager::open(&pool).map_err(|e| Failure::Damaged(e.to_string()))?;
    let used = pages
        .allocated(&pool)
        .map_err(|e| Failure::Damaged(e.to_string()))?
        .len() as u64;
    let dirty = pages.dirty_free_pages(&pool);
    if let Some(&(page, at)) = dirty.first() {
        return Err(Failure::Damaged(format!(
            "{} free page(s) are not all zero (page {page}: byte at offset {at}); a free page must be, or its next owner reads the damage as data",
            dirty.len()
        )));
    }
    let config = DbConfig {
        counting: false,
        ..DbConfig::temporary()
    }
    .engine(engine)
    .protocol(engine.default_protocol())
    .domain(header.domain);
    let db = Db::open_pool(pool, config).map_err(Failure::from_db)?;
    let rows = db
        .check_structure()
        .map_err(|e| Failure::Damaged(format!("after recovery, indexes and heap disagree: {e}")))?;
    Ok(Recovered {
        db,
        rows,
        pages: (used, pages.page_count()),
    })
}

pub(crate) fn run(args: CheckArgs) -> ExitCode {
    let result = recover_private(&args.pool);
    let (status, verdict) = match &result {
        Ok(_) => (CLEAN, "clean".to_string()),
        Err(Failure::Damaged(m)) => (DAMAGED, format!("DAMAGED: {m}")),
        Err(Failure::CannotCheck(m)) => (CANNOT_CHECK, format!("cannot check: {m}")),
    };
    if args.json {
        let tables = match &result {
            Ok(r) => {
                r.db.engine()
                    .catalog()
                    .tables
                    .iter()
                    .zip(&r.rows)
                    .map(|(s, n)| serde_json::json!({ "table": s.name, "rows": n }))
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        let json = serde_json::json!({
            "pool": args.pool,
            "status": status,
            "verdict": verdict,
            "tables": tables,
        });
        outln!(
            "{}",
            serde_json::to_string_pretty(&json).unwrap_or_default()
        );
        return ExitCode::from(status);
    }
    match result {
        Ok(r) => {
            let header = match r.db.engine().pool() {
                Some(pool) => pool.header().clone(),
                None => return ExitCode::from(CANNOT_CHECK),
            };
            outln!("pool          {}", args.pool.display());
            outln!(
                "header        ok (format {}, layout {}, domain {}, {})",
                header.version,
                header.layout,
                header.domain,
                human_bytes(header.size)
            );
            outln!(
                "page table    ok ({} of {} pages in use, every descriptor's check holds, free pages all zero)",
                r.pages.0,
                r.pages.1
            );
            outln!("meta page     ok (checksum), catalog ok (CRC)");
            if let Some(report) = r.db.recovery_report() {
                outln!(
                    "recovery      ok in {:.1} ms on a private view (tuple headers and log windows verified)",
                    report.total_ms
                );
            }
            outln!("indexes       ok (every entry names a live slot holding its key; every live slot indexed)");
            let catalog = r.db.engine().catalog();
            for (schema, n) in catalog
                .tables
                .iter()
                .zip(&r.rows)
                .filter(|(s, _)| s.is_live())
            {
                outln!("  table {:<20} {n} rows", schema.name);
            }
            outln!("clean");
        }
        Err(_) => eprintln!("pmtx check {}: {verdict}", args.pool.display()),
    }
    ExitCode::from(status)
}
