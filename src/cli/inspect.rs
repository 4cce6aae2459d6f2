//! `pmtx inspect POOL`: what a pool file is and how it maps here.

use super::{human_bytes, utc_time, CliResult};
use crate::alloc::PageManager;
use crate::pmem::{MappingKind, PersistenceDomain, Pool, PoolError};
use std::path::PathBuf;

/// Arguments of `pmtx inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The pool file.
    pub pool: PathBuf,
    /// The persistence domain to open the pool with; default: the one it was created for.
    #[arg(long)]
    pub domain: Option<PersistenceDomain>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn run(args: InspectArgs) -> CliResult {
    // Open as an engine would (writable, trying MAP_SYNC, taking the lock); if another process
    // holds the lock, fall back to a read-only mapping and say so.
    let domain = match args.domain {
        Some(d) => d,
        None => Pool::read_header(&args.pool)?.domain,
    };
    let (pool, note) = match Pool::open_any_layout(&args.pool, domain) {
        Ok(pool) => (pool, None),
        Err(PoolError::Locked { .. }) => (
            Pool::open_read_only(&args.pool)?,
            Some("in use by another process: mapped read-only, no lock taken"),
        ),
        // A file (or file system) this user may not write: inspecting needs no write access.
        Err(PoolError::Io {
            op: "open", source, ..
        }) if source.kind() == std::io::ErrorKind::PermissionDenied
            || source.raw_os_error() == Some(libc::EROFS) =>
        {
            (
                Pool::open_read_only(&args.pool)?,
                Some("not writable here: mapped read-only, no lock taken"),
            )
        }
        Err(e) => return Err(e.into()),
    };
    let info = pool.info();
    let usage = PageManager::is_formatted(&pool)
        .then(|| PageManager::open(&pool).map(|pm| pm.usage(&pool)))
        .transpose()?;
    // Tables and row counts come from recovery on a private copy-on-write view (no byte written).
    let tables = match super::check::recover_private(&args.pool) {
        Ok(r) => {
            let engine = r.db.engine();
            let mut indexes = engine.index_info().into_iter();
            Ok(engine
                .catalog()
                .tables
                .iter()
                .zip(r.rows)
                .map(|(s, n)| {
                    // An engine that reports no index info keeps DRAM indexes of the schema's kind.
                    let index = indexes.next().unwrap_or(crate::engine::IndexInfo {
                        placement: s.index_placement.unwrap_or_default(),
                        kind: s.primary_index,
                        entries: n,
                        dram_bytes: 0,
                        pm_bytes: 0,
                    });
                    (s, n, index)
                })
                // A dropped table's tombstone keeps its id (issue 21) but is no table.
                .filter(|(s, _, _)| s.is_live())
                .map(|(s, n, index)| (s.name.clone(), s.row_size(), n, index))
                .collect::<Vec<_>>())
        }
        Err(super::check::Failure::Damaged(m) | super::check::Failure::CannotCheck(m)) => Err(m),
    };
    let domain = match (pool.mapping_kind(), note) {
        (MappingKind::ReadOnly, _) => None,
        _ => Some(pool.domain()),
    };
    if args.json {
        let json = serde_json::json!({
            "path": info.path,
            "header": info.header,
            "mapping": info.mapping,
            "dax_map_sync": info.mapping == MappingKind::DaxSync,
            "domain": domain,
            "flush_instruction": info.flush_instruction,
            "root": info.root,
            "space": usage,
            "created_utc": utc_time(info.header.created_unix_ns),
            "tables": tables.as_ref().map(|t| t.iter().map(|(name, row, rows, index)| serde_json::json!({ "table": name, "row_bytes": row, "rows": rows, "index": index })).collect::<Vec<_>>()).ok(),
            "tables_error": tables.as_ref().err(),
            "note": note,
        });
        outln!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let created =
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(info.header.created_unix_ns);
    let age = std::time::SystemTime::now()
        .duration_since(created)
        .unwrap_or_default();
    outln!("pool          {}", args.pool.display());
    outln!("layout        {}", info.header.layout);
    outln!("format        version {}", info.header.version);
    outln!("uuid          {}", info.header.uuid);
    outln!(
        "size          {} ({} bytes)",
        human_bytes(info.header.size),
        info.header.size
    );
    outln!(
        "created       {} ({}s ago)",
        utc_time(info.header.created_unix_ns),
        age.as_secs()
    );
    outln!("created for   {} domain", info.header.domain);
    outln!(
        "mapping       {}",
        match info.mapping {
            MappingKind::DaxSync => "DAX, MAP_SYNC (stores reach the media without the page cache)",
            MappingKind::Shared => "MAP_SHARED, not DAX (the file system refused MAP_SYNC)",
            MappingKind::ReadOnly => "read-only MAP_SHARED",
            MappingKind::Heap => "heap",
            MappingKind::Private => "private copy-on-write view (MAP_PRIVATE)",
        }
    );
    match domain {
        Some(d) => outln!("domain        {d}{}", domain_note(d)),
        None => outln!("domain        none (read-only)"),
    }
    outln!("flush         {}", info.flush_instruction.name());
    outln!(
        "root          {}",
        if info.root == 0 {
            "none".to_string()
        } else {
            format!("offset {}", info.root)
        }
    );
    match usage {
        Some(u) => outln!(
            "space used    {} of {} ({} of {} pages of 2 MiB)",
            human_bytes(u.bytes_used),
            human_bytes(u.bytes_total),
            u.pages_used,
            u.pages_total
        ),
        None => outln!("space used    no page table yet (nothing allocated)"),
    }
    match &tables {
        Ok(t) if t.is_empty() => outln!("tables        none"),
        Ok(t) => {
            outln!("tables        {}", t.len());
            for (name, row, rows, index) in t {
                let size = match index.placement {
                    crate::index::IndexPlacement::Pm => format!(
                        "{} PM + {} DRAM",
                        human_bytes(index.pm_bytes),
                        human_bytes(index.dram_bytes)
                    ),
                    crate::index::IndexPlacement::Dram if index.dram_bytes > 0 => {
                        format!("{} DRAM", human_bytes(index.dram_bytes))
                    }
                    crate::index::IndexPlacement::Dram => "rebuilt at open".to_string(),
                };
                outln!(
                    "  {name:<20} {rows:>12} rows of {row} bytes   index {} {} ({} entries, {size})",
                    index.placement,
                    index.kind,
                    index.entries
                );
            }
        }
        Err(m) => outln!("tables        unreadable: {m} (run `pmtx check`)"),
    }
    if let Some(note) = note {
        outln!("note          {note}");
    }
    Ok(())
}

fn domain_note(d: PersistenceDomain) -> &'static str {
    match d {
        PersistenceDomain::Volatile => " (no durability)",
        PersistenceDomain::Adr => " (durable after flush + fence)",
        PersistenceDomain::Eadr => " (durable once visible; flushes are hints)",
        PersistenceDomain::Msync => " (durable after msync at each fence)",
    }
}
