//! DUDETx recovery (§3.5): load the PM heap's directory, replay the persisted records the
//! reproduce step had not truncated, in id order, up to the durable id (stopping at the first
//! gap: a torn, stale or missing record), truncate, and rebuild the DRAM shadow and its indexes
//! from the heap.

use super::heap::Heap;
use super::layout::{kind, meta};
use super::pipeline::{Apply, Core};
use super::{make_shadow, DudetxConfig, DudetxEngine, META_PAGE};
use crate::alloc::PageManager;
use crate::engine::common::PhaseClock;
use crate::engine::shadow::RingMetaPage;
use crate::engine::wal::{parse_record, LogRing};
use crate::engine::{DbError, EngineKind, RecoveryReport};
use crate::pmem::Pool;
use std::sync::Arc;

/// The log ring's pages (`wal::ring_pages`); `create` allocates them.
pub(super) fn log_ring(
    pool: &Pool,
    pages: &PageManager,
    count: usize,
    create: bool,
) -> Result<LogRing, DbError> {
    crate::engine::wal::ring_pages(pool, pages, kind::LOG, count, create, "DUDETx")
}

/// What [`replay`] did.
pub(crate) struct Replayed {
    /// The durable id (§3.3).
    pub durable: u64,
    /// The log position after the last replayed record (the new truncation point).
    pub pos: u64,
    /// Records replayed.
    pub records: u64,
    /// Ops replayed.
    pub entries: u64,
}

/// Replays the log (§3.5): from the truncation point, every intact record in id order up to the
/// durable id, stopping at the first gap (a torn, stale or missing record), each op through
/// `apply`; then truncates what was replayed, in the order the reproduce step does. Whatever
/// part of the records the reproduce step had applied, replaying them all in order ends in the
/// same rows (or words): every byte an op writes ends as the last op left it (`log.rs`). Shared
/// by the table engine and the persistent-object API.
pub(crate) fn replay(
    pool: &Pool,
    ring: &LogRing,
    meta_page: u64,
    mut apply: impl FnMut(super::log::OpRef<'_>) -> Result<(), String>,
) -> Result<Replayed, DbError> {
    let r = |f: u64| pool.read_u64(meta_page + f);
    let durable = r(meta::DURABLE);
    let head_seq = r(meta::HEAD_SEQ);
    let mut pos = r(meta::HEAD_POS);
    // A crash between the two truncation words leaves HEAD_SEQ past the records at HEAD_POS:
    // they are replayed again (harmlessly), so continuity is checked against the previous
    // record, not against HEAD_SEQ.
    let mut prev_last = head_seq;
    let (mut records, mut entries) = (0u64, 0u64);
    while let Some(rec) = parse_record(ring, pool, pos) {
        let Ok(ops) = super::log::ops_of(&rec.raw) else {
            break;
        };
        let continues = if records == 0 {
            rec.first <= head_seq + 1
        } else {
            rec.first == prev_last + 1
        };
        if !continues || rec.last > durable || rec.last < rec.first {
            break;
        }
        for &op in &ops {
            apply(op).map_err(|e| {
                DbError::Corrupt(format!(
                    "replaying log record {}..{}: {e}",
                    rec.first, rec.last
                ))
            })?;
        }
        entries += ops.len() as u64;
        records += 1;
        prev_last = rec.last;
        pos += rec.len;
    }
    let upto = prev_last.max(head_seq);
    if upto < durable {
        return Err(DbError::Corrupt(format!(
            "the durable id is {durable}, but the log holds transactions only up to {upto}: \
             persisted log records were lost"
        )));
    }
    // The replayed ops' write-backs are fenced by the first truncation word's persist.
    pool.write_u64(meta_page + meta::HEAD_SEQ, durable);
    pool.persist(meta_page + meta::HEAD_SEQ, 8);
    pool.write_u64(meta_page + meta::HEAD_POS, pos);
    pool.persist(meta_page + meta::HEAD_POS, 8);
    Ok(Replayed {
        durable,
        pos,
        records,
        entries,
    })
}

/// Opens and recovers a DUDETx pool.
pub(super) fn open(
    pool: Arc<Pool>,
    mut config: DudetxConfig,
) -> Result<Arc<DudetxEngine>, DbError> {
    crate::engine::common::require_durable_domain(EngineKind::Dudetx, pool.domain())?;
    let mut timer = PhaseClock::start();
    let mut report = RecoveryReport::default();
    let crate::engine::shadow::ShadowMeta {
        meta_page,
        pages,
        catalog,
    } = META_PAGE.open(&pool, |max_row, log_pages| {
        config.max_row_bytes = max_row;
        config.log_pages = log_pages;
        config.validate()
    })?;
    let ring = log_ring(&pool, &pages, config.log_pages, false)?;
    let mut heap = Heap::load(&pool, &pages, &catalog)?;
    timer.lap(&mut report, "load heap");

    heap.replaying = true;
    let replayed = replay(&pool, &ring, meta_page, |op| {
        heap.apply(&pool, &pages, op, None)
    })?;
    heap.replaying = false;
    let (durable, pos, records, entries) = (
        replayed.durable,
        replayed.pos,
        replayed.records,
        replayed.entries,
    );
    timer.lap(&mut report, "replay log");

    // Rebuild the DRAM shadow (§3.5) from the heap: tables, rows, indexes.
    let shadow = make_shadow(&config, pool.len())?;
    for schema in &catalog.tables {
        shadow.create_table(schema.clone())?;
    }
    let mut rows = 0u64;
    {
        let mut w = shadow.clone().worker(config.max_threads)?;
        for (table, _) in catalog.live_tables() {
            for chunk in heap.rows(&pool, table).chunks(512) {
                w.begin(false);
                for (key, row) in chunk {
                    if let Err(e) = w.insert(table, *key, row) {
                        w.abort();
                        return Err(DbError::Corrupt(format!(
                            "loading table {table} into the DRAM shadow: {e}"
                        )));
                    }
                }
                w.commit()?;
                rows += chunk.len() as u64;
            }
        }
    }
    timer.lap(&mut report, "rebuild shadow");
    report.replayed_entries = entries;
    report.committed_in_log = records;
    report.rows = rows;
    report.facts.push(("durable_id".into(), durable));
    report.total_ms = report.phases.iter().map(|p| p.1).sum();
    // Interrupted drops are finished: `Heap::load` freed their pages, the replay skipped them.
    let store = RingMetaPage::catalog_store(meta_page);
    let catalog = store
        .store_drops_finished(&pool, &catalog)?
        .unwrap_or(catalog);
    let order = Box::new(super::pipeline::IdOrder::default());
    let core = Core::new(
        pool, pages, meta_page, ring, config, heap, durable, pos, order,
    );
    DudetxEngine::assemble(core, shadow, catalog, Some(report))
}

/// Checks that the PM heap holds exactly the shadow's rows (everything committed having been
/// reproduced): the same count per table, and each heap row in the shadow with the same bytes.
pub(super) fn compare_heap_with_shadow(
    engine: &DudetxEngine,
    counts: &[u64],
) -> Result<(), String> {
    let heap = engine.core.heap.lock();
    let pool = &engine.core.pool;
    let mut w = engine
        .shadow
        .clone()
        .worker(engine.core.config.max_threads)
        .map_err(|e| e.to_string())?;
    for (table, &count) in counts.iter().enumerate() {
        let rows = heap.rows(pool, table as u32);
        if rows.len() as u64 != count {
            return Err(format!(
                "table {table}: the PM heap holds {} rows, the DRAM shadow {count}",
                rows.len()
            ));
        }
        w.begin(true);
        let mut buf = Vec::new();
        for (key, row) in rows {
            buf.resize(row.len(), 0);
            if let Err(e) = w.read(table as u32, key, &mut buf) {
                w.abort();
                return Err(format!(
                    "table {table}: heap key {key} is not in the shadow: {e}"
                ));
            }
            if buf != row {
                w.abort();
                return Err(format!(
                    "table {table}: key {key} differs between heap and shadow"
                ));
            }
        }
        let _ = w.commit();
    }
    Ok(())
}
