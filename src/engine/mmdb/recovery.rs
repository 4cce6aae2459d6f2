//! MMDB recovery (Zen §2.2: "loading the most recent checkpoint ... then reading and applying
//! the redo log up to the crash point"): the checkpoint the valid word names, then every
//! transaction after the id it covers, in id order, up to the first torn, stale or missing
//! record or a gap in the ids.

use super::core::{unframe, Checkpointed, Core};
use super::layout::{checkpoint_tag, desc, kind, meta};
use super::{make_tables, MmdbConfig, MmdbEngine, META_PAGE};
use crate::alloc::{PageManager, PAGE_SIZE};
use crate::engine::common::PhaseClock;
use crate::engine::dudetx::log::{decode_ops, Op};
use crate::engine::wal::{parse_record, LogRing};
use crate::engine::{DbError, Engine, EngineKind, EngineWorker, FieldWrite, RecoveryReport};
use crate::pmem::Pool;
use std::sync::Arc;

/// The valid checkpoint as recovery found it.
struct Loaded {
    generation: u64,
    covered: u64,
    pos: u64,
    /// Its pages (page indexes), in order.
    pages: Vec<u64>,
    /// The snapshot's rows.
    ops: Vec<Op>,
}

/// Reads the checkpoint the valid word names (generation 0: none, the tables empty, the log
/// from position 0), checking the descriptor and the snapshot against their CRCs; frees the
/// pages of every other generation (a checkpoint a crash interrupted, or one superseded whose
/// pages were not yet freed).
fn load_checkpoint(pool: &Pool, pages: &PageManager, meta_page: u64) -> Result<Loaded, DbError> {
    let generation = pool.read_u64(meta_page + meta::CURRENT);
    let mut mine = Vec::new();
    for (index, tag) in pages.allocated(pool)? {
        if tag.kind != kind::CHECKPOINT {
            continue;
        }
        if generation > 0 && tag.value >> 16 == checkpoint_tag(generation, 0) >> 16 {
            mine.push((tag.value & 0xFFFF, index));
        } else {
            pages.free(pool, index);
        }
    }
    if generation == 0 {
        return Ok(Loaded {
            generation,
            covered: 0,
            pos: 0,
            pages: Vec::new(),
            ops: Vec::new(),
        });
    }
    let d = meta_page + meta::descriptor(generation);
    let field = |f: u64| pool.read_u64(d + f);
    let mut head = vec![0u8; desc::CRC as usize];
    pool.read_bytes(d, &mut head);
    if field(desc::GENERATION) != generation
        || field(desc::CRC) != u64::from(crc32fast::hash(&head))
    {
        return Err(DbError::Corrupt(format!(
            "the descriptor of MMDB checkpoint {generation} (the valid one) is damaged"
        )));
    }
    mine.sort_unstable();
    let bytes = field(desc::BYTES);
    let count = field(desc::PAGES);
    if mine.len() as u64 != count
        || mine.iter().enumerate().any(|(i, (n, _))| *n != i as u64)
        || bytes.div_ceil(PAGE_SIZE) != count
    {
        return Err(DbError::Corrupt(format!(
            "MMDB checkpoint {generation} should have {count} pages numbered 0.. for {bytes} \
             bytes; the pool holds {} of them",
            mine.len()
        )));
    }
    let mut snapshot = vec![0u8; bytes as usize];
    for (n, index) in &mine {
        let from = (n * PAGE_SIZE) as usize;
        let to = (from + PAGE_SIZE as usize).min(snapshot.len());
        pool.read_bytes(pages.page_offset(*index), &mut snapshot[from..to]);
    }
    if u64::from(crc32fast::hash(&snapshot)) != field(desc::DATA_CRC) {
        return Err(DbError::Corrupt(format!(
            "MMDB checkpoint {generation} fails its CRC: its pages were not all durable when it \
             was made valid"
        )));
    }
    let ops = decode_ops(&snapshot)
        .map_err(|e| DbError::Corrupt(format!("MMDB checkpoint {generation}: {e}")))?;
    Ok(Loaded {
        generation,
        covered: field(desc::COVERED),
        pos: field(desc::LOG_POS),
        pages: mine.into_iter().map(|(_, i)| i).collect(),
        ops,
    })
}

/// Applies one transaction's ops (or a chunk of the snapshot) to the DRAM tables as one
/// transaction: a put replaces the row or inserts it, a delete removes the key if present.
fn apply(w: &mut dyn EngineWorker, ops: &[Op], row_len: &[Option<usize>]) -> Result<(), String> {
    w.begin(false);
    let mut scratch = Vec::new();
    for op in ops {
        let len = *row_len
            .get(op.table as usize)
            .ok_or_else(|| format!("an op names table {}, which does not exist", op.table))?;
        // A dropped table's rows (in a checkpoint taken before the drop, or in the log) are
        // gone (issue 21).
        let Some(len) = len else { continue };
        scratch.resize(len, 0);
        let exists = match w.read(op.table, op.key, &mut scratch) {
            Ok(()) => true,
            Err(crate::engine::TxError::NotFound { .. }) => false,
            Err(e) => {
                w.abort();
                return Err(e.to_string());
            }
        };
        let done = match (&op.row, exists) {
            (Some(row), true) => w.update(
                op.table,
                op.key,
                &[FieldWrite {
                    offset: 0,
                    bytes: row,
                }],
            ),
            (Some(row), false) => w.insert(op.table, op.key, row),
            (None, true) => w.delete(op.table, op.key),
            (None, false) => Ok(()),
        };
        if let Err(e) = done {
            w.abort();
            return Err(format!("table {} key {}: {e}", op.table, op.key));
        }
    }
    w.commit().map(|_| ()).map_err(|e| e.to_string())
}

/// Opens and recovers an MMDB pool.
pub(super) fn open(pool: Arc<Pool>, mut config: MmdbConfig) -> Result<Arc<MmdbEngine>, DbError> {
    crate::engine::common::require_durable_domain(EngineKind::Mmdb, pool.domain())?;
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
    let r = |f: u64| pool.read_u64(meta_page + f);
    let ring =
        crate::engine::wal::ring_pages(&pool, &pages, kind::LOG, config.log_pages, false, "MMDB")?;

    // Phase 1: the checkpoint, into fresh DRAM tables.
    let tables = make_tables(&config, pool.len())?;
    for schema in &catalog.tables {
        tables.create_table(schema.clone())?;
    }
    let row_len: Vec<Option<usize>> = catalog
        .tables
        .iter()
        .map(|s| s.is_live().then(|| s.row_size()))
        .collect();
    let loaded = load_checkpoint(&pool, &pages, meta_page)?;
    let mut w = tables.clone().worker(config.max_threads)?;
    for chunk in loaded.ops.chunks(512) {
        apply(&mut *w, chunk, &row_len)
            .map_err(|e| DbError::Corrupt(format!("loading the MMDB checkpoint: {e}")))?;
    }
    timer.lap(&mut report, "load checkpoint");

    // Phase 2: the log from the checkpoint's position.
    let epoch = r(meta::EPOCH);
    let (end, last, records, entries, applied) = replay(&pool, &ring, &loaded, epoch, |ops| {
        apply(&mut *w, ops, &row_len).map_err(|e| DbError::Corrupt(format!("replaying: {e}")))
    })?;
    drop(w);
    // Later records are written in a new epoch: a record of this one left beyond `end` is
    // never taken for a newer one.
    pool.write_u64(meta_page + meta::EPOCH, epoch + 1);
    pool.persist(meta_page + meta::EPOCH, 8);
    timer.lap(&mut report, "replay log");

    report.replayed_entries = entries;
    report.committed_in_log = applied;
    report.rows = tables
        .check_structure()
        .map_err(DbError::Corrupt)?
        .iter()
        .sum();
    report
        .facts
        .push(("checkpoint_generation".into(), loaded.generation));
    report
        .facts
        .push(("checkpoint_covered_id".into(), loaded.covered));
    report
        .facts
        .push(("checkpoint_rows".into(), loaded.ops.len() as u64));
    report.facts.push(("log_records".into(), records));
    report.facts.push(("durable_id".into(), last));
    report.total_ms = report.phases.iter().map(|p| p.1).sum();
    let checkpointed = Checkpointed {
        generation: loaded.generation,
        pages: loaded.pages,
        covered: loaded.covered,
    };
    let core = Core::new(
        pool,
        pages,
        meta_page,
        ring,
        config,
        tables,
        checkpointed,
        last,
        end,
        epoch + 1,
    );
    // The head stays at the checkpoint's position: the log from there is still needed.
    core.state.lock().head = loaded.pos;
    let interrupted = !catalog.dropping_ids().is_empty();
    let engine = MmdbEngine::assemble(core, catalog, Some(report))?;
    if interrupted {
        // A drop a crash interrupted: a checkpoint without the table's rows frees the older
        // one's pages, then the drop is recorded as finished.
        engine.take_checkpoint()?;
        let mut catalog = engine.catalog.lock();
        if let Some(done) = engine
            .catalog_store
            .store_drops_finished(&engine.core.pool, &catalog)?
        {
            *catalog = done;
        }
    }
    Ok(engine)
}

/// Walks the log from the checkpoint's position, handing each transaction after the covered id
/// to `f` in id order; stops at the first record that is torn, stale, of an older epoch or
/// breaks the id sequence. Returns (end position, last id, records, ops, transactions applied).
fn replay(
    pool: &Pool,
    ring: &LogRing,
    loaded: &Loaded,
    epoch: u64,
    mut f: impl FnMut(&[Op]) -> Result<(), DbError>,
) -> Result<(u64, u64, u64, u64, u64), DbError> {
    let mut pos = loaded.pos;
    let mut last = loaded.covered;
    let mut prev_epoch = 0;
    let (mut records, mut entries, mut applied) = (0u64, 0u64, 0u64);
    while let Some(rec) = parse_record(ring, pool, pos) {
        let Ok((rec_epoch, txns)) = unframe(&rec.raw) else {
            break;
        };
        if rec_epoch < prev_epoch || rec_epoch > epoch || txns.is_empty() {
            break;
        }
        // Ids ≤ `last` are in the checkpoint (or replayed); the next must follow at once.
        let fresh: Vec<&(u64, &[u8])> = txns.iter().filter(|(id, _)| *id > last).collect();
        if fresh
            .iter()
            .enumerate()
            .any(|(i, (id, _))| *id != last + 1 + i as u64)
            || txns.windows(2).any(|p| p[1].0 != p[0].0 + 1)
        {
            break;
        }
        let mut decoded = Vec::with_capacity(fresh.len());
        for (id, bytes) in &fresh {
            match decode_ops(bytes) {
                Ok(ops) => decoded.push((*id, ops)),
                Err(_) => break,
            }
        }
        if decoded.len() != fresh.len() {
            break;
        }
        for (id, ops) in decoded {
            f(&ops)?;
            entries += ops.len() as u64;
            applied += 1;
            last = id;
        }
        prev_epoch = rec_epoch;
        records += 1;
        pos += rec.len;
    }
    Ok((pos, last, records, entries, applied))
}

/// Checks that the log from the valid checkpoint reads back as an unbroken sequence of records
/// up to the durable id (`pmtx check`).
pub(super) fn check_log(core: &Core) -> Result<(), String> {
    let _one = core.checkpoint_lock.lock();
    let _order = core.commit_lock.lock();
    let (generation, covered) = {
        let c = core.checkpointed.lock();
        (c.generation, c.covered)
    };
    let pos = if generation == 0 {
        0
    } else {
        core.pool
            .read_u64(core.meta_page + meta::descriptor(generation) + desc::LOG_POS)
    };
    let durable = core.durable.load(std::sync::atomic::Ordering::Acquire);
    let loaded = Loaded {
        generation,
        covered,
        pos,
        pages: Vec::new(),
        ops: Vec::new(),
    };
    let epoch = core.pool.read_u64(core.meta_page + meta::EPOCH);
    let (_, last, _, _, _) =
        replay(&core.pool, &core.ring, &loaded, epoch, |_| Ok(())).map_err(|e| e.to_string())?;
    if last < durable && covered < durable {
        return Err(format!(
            "the MMDB log from checkpoint {generation} reads back only up to transaction {last}, \
             but {durable} are acknowledged as durable"
        ));
    }
    Ok(())
}
