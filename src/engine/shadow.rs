//! Engines whose tables live in a DRAM shadow and whose durability is a redo log (DUDETx §3.1
//! *perform*, the MMDB baseline): the shadow is the `volatile` engine (Falcon with durability
//! off) on an in-memory pool, and [`ShadowWorker`] runs each transaction through the shadow's own
//! worker (its concurrency control decides conflicts), keeps the write set as redo ops (whole
//! rows, or for DUDETx the bytes an update wrote), and at commit hands the encoded redo log
//! (`dudetx::log`) to the engine, which hands back an empty buffer for the next one.

use crate::alloc::PAGE_SIZE;
use crate::catalog::{Catalog, CatalogStore, Schema, TableId};
use crate::cc::{CcOptions, Protocol};
use crate::engine::common::BuildWriteKeyHasher;
use crate::engine::dudetx::log;
use crate::engine::falcon::{FalconConfig, FalconEngine};
use crate::engine::wal::ring_meta;
use crate::engine::{DbError, Engine, EngineKind, EngineWorker, FieldWrite, TxError};
use crate::pmem::{PersistenceDomain, Pool, PoolOptions};
use std::collections::HashMap;
use std::sync::Arc;

/// What a shadow engine's worker needs from its engine.
pub(crate) trait ShadowHost: Send + Sync {
    /// The row size of `table`.
    fn row_len(&self, table: TableId) -> Result<usize, TxError>;
    /// Commits the shadow transaction of `inner` whose redo log is `log`; returns its id. The
    /// engine takes the log and leaves an empty buffer (perhaps a spare one) in its place.
    fn commit_logged(
        &self,
        inner: &mut dyn EngineWorker,
        log: &mut Vec<u8>,
    ) -> Result<u64, TxError>;
    /// The id a transaction that wrote nothing reports: the last one committed.
    fn last_committed(&self) -> u64;
    /// Whether the engine's log takes field writes (`dudetx::log::encode_field_write`): an
    /// update then logs the bytes it wrote, not the row's after-image, and needs no read of
    /// the row; every write is logged as it is made, in order (the engine's combination,
    /// `dudetx::log`, folds a key's writes). Otherwise (MMDB) every write is a whole row.
    fn logs_field_writes(&self) -> bool {
        false
    }
}

/// A fresh DRAM shadow for a PM pool of `pm_bytes`: the volatile engine on an in-memory pool,
/// with `slots` worker slots. Its size is virtual room (the memory is touched only as rows
/// arrive): twice the PM pool, plus pages for each worker's own heap and log window.
pub(crate) fn make_shadow(
    protocol: Protocol,
    cc_options: CcOptions,
    slots: usize,
    max_row_bytes: usize,
    pm_bytes: u64,
) -> Result<Arc<FalconEngine>, DbError> {
    let size = 2 * pm_bytes + (4 + 8 * slots as u64) * PAGE_SIZE;
    let pool = Pool::create_in_memory(
        size,
        &PoolOptions::new(EngineKind::Volatile.layout(), PersistenceDomain::Volatile)
            .with_counting(false),
    )?;
    let mut c = FalconConfig::new(EngineKind::Volatile, protocol);
    c.max_threads = slots;
    c.max_row_bytes = max_row_bytes;
    c.hot_tuples = 0;
    c.cc_options = cc_options;
    c.background_sweep = false;
    FalconEngine::create(Arc::new(pool), c)
}

/// The row size of `table` in `catalog`; an error if it is not a live table.
pub(crate) fn row_len(catalog: &Catalog, table: TableId) -> Result<usize, TxError> {
    catalog
        .check_live(table)
        .map(Schema::row_size)
        .map_err(|e| TxError::SchemaMismatch(e.to_string()))
}

/// Drops `table` of a shadow engine (issue 21), with no worker alive: the catalog at `store`
/// with the table `dropping`, then `drop_shadow` (the DRAM shadow's table, whose slots any table
/// may then take), then `free_pm` (the engine's PM copy of the rows), then the catalog with the
/// table `dropped`.
/// Recovery ignores a table that is not live wherever its rows come from (a checkpoint, the
/// log, the heap), so a crash anywhere in between leaves it gone.
pub(crate) fn drop_table(
    catalog: &parking_lot::Mutex<Catalog>,
    store: &CatalogStore,
    pool: &Pool,
    table: TableId,
    drop_shadow: impl FnOnce() -> Result<(), DbError>,
    free_pm: impl FnOnce() -> Result<(), DbError>,
) -> Result<(), DbError> {
    let no_slots: &[parking_lot::Mutex<Option<()>>] = &[];
    crate::engine::common::TableDrop {
        catalog,
        slots: no_slots,
        store,
        pool,
        table,
        free_first: false,
    }
    .run(
        || {
            drop_shadow()?;
            free_pm()
        },
        |_| {},
        |_| {},
    )
}

/// Creates a table durably in the catalog at `store` (after `catalog`) and in the DRAM
/// `shadow`, which must number it alike; returns its id and the new catalog, for the caller to
/// install. A table asking for a PM index is refused: `why_dram` says why the engine's indexes
/// are in DRAM.
pub(crate) fn create_table(
    catalog: &Catalog,
    store: &CatalogStore,
    pool: &Pool,
    shadow: &dyn Engine,
    schema: Schema,
    max_row_bytes: usize,
    why_dram: &str,
) -> Result<(TableId, Catalog), DbError> {
    if schema.index_placement == Some(crate::index::IndexPlacement::Pm) {
        return Err(DbError::Config(format!(
            "table '{}': {why_dram}; use --index dram",
            schema.name
        )));
    }
    let mut next = catalog.clone();
    let id = next.add(schema.clone(), max_row_bytes)?;
    store.store(pool, &next)?;
    let shadow_id = shadow.create_table(schema)?;
    if shadow_id != id {
        return Err(DbError::Corrupt(format!(
            "the DRAM tables numbered table {id} as {shadow_id}"
        )));
    }
    Ok((id, next))
}

/// A shadow engine's pool as its meta page describes it.
pub(crate) struct ShadowMeta {
    /// The meta page's offset.
    pub meta_page: u64,
    /// The page manager.
    pub pages: crate::alloc::PageManager,
    /// The catalog, checked against the row size limit.
    pub catalog: Catalog,
}

/// Which engine's meta page, for an engine on a catalog and a log ring (DUDETx, MMDB): the fixed
/// words are at [`ring_meta`]'s offsets in both; the magic, version and page kind are the
/// engine's own.
pub(crate) struct RingMetaPage {
    /// The engine's name in errors.
    pub engine: &'static str,
    /// The page-manager tag kind of the meta page.
    pub page_kind: u8,
    /// The engine's magic.
    pub magic: u64,
    /// The engine's layout version.
    pub version: u64,
}

impl RingMetaPage {
    fn layout<'a>(&self, fields: &'a [(u64, u64)]) -> crate::engine::meta::MetaLayout<'a> {
        crate::engine::meta::MetaLayout {
            page_kind: self.page_kind,
            magic_at: ring_meta::F_MAGIC,
            magic: self.magic,
            catalog_at: ring_meta::CATALOG_AT,
            catalog_slot_bytes: ring_meta::CATALOG_SLOT_BYTES,
            fields,
            crc_at: ring_meta::F_CRC,
        }
    }

    /// Formats a fresh pool's page manager and meta page for rows of up to `max_row_bytes` and a
    /// log ring of `log_pages` pages; returns the page manager and the meta page's offset.
    pub fn format(
        &self,
        pool: &Pool,
        max_row_bytes: usize,
        log_pages: usize,
    ) -> Result<(crate::alloc::PageManager, u64), DbError> {
        crate::engine::meta::format(
            pool,
            &self.layout(&[
                (ring_meta::F_VERSION, self.version),
                (ring_meta::F_MAX_ROW, max_row_bytes as u64),
                (ring_meta::F_CATALOG_SLOT, ring_meta::CATALOG_SLOT_BYTES),
                (ring_meta::F_LOG_PAGES, log_pages as u64),
            ]),
        )
    }

    /// Where the catalog of the meta page at `meta_page` is kept.
    pub fn catalog_store(meta_page: u64) -> CatalogStore {
        CatalogStore {
            base: meta_page + ring_meta::CATALOG_AT,
            slot_bytes: ring_meta::CATALOG_SLOT_BYTES,
        }
    }

    /// Opens the meta page of an existing pool: checks magic, version and CRC, hands the row
    /// size limit and the log ring's pages to `configure` (which sets and validates the engine's
    /// configuration), checks the catalog slot size, and loads the catalog.
    pub fn open(
        &self,
        pool: &Pool,
        configure: impl FnOnce(usize, usize) -> Result<(), DbError>,
    ) -> Result<ShadowMeta, DbError> {
        let engine = self.engine;
        let meta_page = crate::engine::meta::open(
            pool,
            &self.layout(&[(ring_meta::F_VERSION, self.version)]),
            engine,
        )?;
        let pages = crate::alloc::PageManager::open(pool)?;
        let r = |f: u64| pool.read_u64(meta_page + f);
        let max_row_bytes = r(ring_meta::F_MAX_ROW) as usize;
        configure(max_row_bytes, r(ring_meta::F_LOG_PAGES) as usize)
            .map_err(|e| DbError::Corrupt(format!("the {engine} meta page: {e}")))?;
        crate::engine::meta::check_catalog_slot(
            r(ring_meta::F_CATALOG_SLOT),
            ring_meta::CATALOG_SLOT_BYTES,
        )?;
        let catalog = Self::catalog_store(meta_page).load(pool)?;
        catalog.validate(max_row_bytes).map_err(|e| {
            DbError::Corrupt(format!("the catalog does not fit the row size limit: {e}"))
        })?;
        Ok(ShadowMeta {
            meta_page,
            pages,
            catalog,
        })
    }
}

/// One thread's executor on a DRAM shadow.
pub(crate) struct ShadowWorker<H: ShadowHost> {
    engine: Arc<H>,
    /// The shadow engine's worker: *perform* (§3.1) runs there.
    inner: Box<dyn EngineWorker>,
    /// [`ShadowHost::logs_field_writes`], asked once.
    field_log: bool,
    /// The transaction's redo log (DUDETx §3.2's thread-local volatile log): with field-write
    /// logs every write is encoded here as it is made; with whole-row logs, at commit from
    /// `writes`. The buffer is reused (the engine swaps it for a spare at commit): `perf` put
    /// malloc and free at 3-4 % of a sync commit when each write and log had its own.
    redo: Vec<u8>,
    /// Whole-row logs: the row each written key ends with (`None`: deleted), and the keys'
    /// order.
    writes: HashMap<(TableId, u64), Option<Vec<u8>>, BuildWriteKeyHasher>,
    order: Vec<(TableId, u64)>,
    /// Scratch for a row before an update.
    row: Vec<u8>,
}

impl<H: ShadowHost> ShadowWorker<H> {
    pub fn new(engine: Arc<H>, inner: Box<dyn EngineWorker>) -> ShadowWorker<H> {
        ShadowWorker {
            field_log: engine.logs_field_writes(),
            engine,
            inner,
            redo: Vec::new(),
            writes: HashMap::default(),
            order: Vec::new(),
            row: Vec::new(),
        }
    }

    /// Whole-row logs: notes the row `key` ends with.
    fn note(&mut self, table: TableId, key: u64, row: Option<Vec<u8>>) {
        if self.writes.insert((table, key), row).is_none() {
            self.order.push((table, key));
        }
    }

    fn clear(&mut self) {
        self.redo.clear();
        self.writes.clear();
        self.order.clear();
    }

    /// Whole-row logs: encodes each written key's row into `redo`, in the order the keys were
    /// first written (one allocation of the exact size when the buffer is new).
    fn encode_rows(&mut self) {
        let bytes: usize = self
            .order
            .iter()
            .map(|k| log::encoded_len(self.writes[k].as_ref().map_or(0, Vec::len)))
            .sum();
        self.redo.reserve(bytes);
        for &(table, key) in &self.order {
            log::encode_op(
                &mut self.redo,
                table,
                key,
                self.writes[&(table, key)].as_deref(),
            );
        }
    }
}

impl<H: ShadowHost + 'static> EngineWorker for ShadowWorker<H> {
    fn begin(&mut self, read_only: bool) {
        self.clear();
        self.inner.begin(read_only);
    }

    fn read(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError> {
        self.inner.read(table, key, out)
    }

    fn update(
        &mut self,
        table: TableId,
        key: u64,
        writes: &[FieldWrite<'_>],
    ) -> Result<(), TxError> {
        if self.field_log {
            // Only the bytes written (§3.2 logs the words a transaction writes): no read of the
            // row, and a tenth of a row's bytes to persist and reproduce for YCSB's updates.
            self.inner.update(table, key, writes)?;
            for w in writes {
                log::encode_field_write(&mut self.redo, table, key, w.offset, w.bytes);
            }
            return Ok(());
        }
        if let Some(Some(row)) = self.writes.get_mut(&(table, key)) {
            // A row this transaction wrote before: its image.
            self.inner.update(table, key, writes)?;
            for w in writes {
                row[w.offset..w.offset + w.bytes.len()].copy_from_slice(w.bytes);
            }
            return Ok(());
        }
        // The after-image: the row as this transaction sees it (read through the shadow's
        // protocol, so the read is validated like any other), with the writes applied.
        let len = self.engine.row_len(table)?;
        self.row.resize(len, 0);
        self.inner.read(table, key, &mut self.row)?;
        let mut row = self.row.clone();
        self.inner.update(table, key, writes)?;
        for w in writes {
            row[w.offset..w.offset + w.bytes.len()].copy_from_slice(w.bytes);
        }
        self.note(table, key, Some(row));
        Ok(())
    }

    fn insert(&mut self, table: TableId, key: u64, row: &[u8]) -> Result<(), TxError> {
        self.inner.insert(table, key, row)?;
        if self.field_log {
            log::encode_op(&mut self.redo, table, key, Some(row));
        } else {
            self.note(table, key, Some(row.to_vec()));
        }
        Ok(())
    }

    fn delete(&mut self, table: TableId, key: u64) -> Result<(), TxError> {
        self.inner.delete(table, key)?;
        if self.field_log {
            log::encode_op(&mut self.redo, table, key, None);
        } else {
            self.note(table, key, None);
        }
        Ok(())
    }

    fn prefetch(&mut self, table: TableId, keys: &[u64]) {
        self.inner.prefetch(table, keys);
    }

    fn prefetch_for_overwrite(&mut self, table: TableId, keys: &[u64]) {
        self.inner.prefetch_for_overwrite(table, keys);
    }

    fn prefetch_read_only(&mut self, table: TableId, keys: &[u64]) {
        self.inner.prefetch_read_only(table, keys);
    }

    fn scan(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), TxError> {
        self.inner.scan(table, from, reverse, limit, f)
    }

    fn lookup_secondary(
        &mut self,
        table: TableId,
        index: usize,
        secondary: u64,
        out: &mut Vec<u64>,
    ) -> Result<(), TxError> {
        self.inner.lookup_secondary(table, index, secondary, out)
    }

    fn commit(&mut self) -> Result<u64, TxError> {
        if !self.field_log {
            self.encode_rows();
        }
        if self.redo.is_empty() {
            self.clear();
            self.inner.commit()?;
            return Ok(self.engine.last_committed());
        }
        // The thread-local volatile redo log (DUDETx §3.2) leaves with the transaction (the
        // pipeline keeps it until it is persisted); a spare buffer takes its place.
        let committed = self.engine.commit_logged(&mut *self.inner, &mut self.redo);
        self.clear();
        committed
    }

    fn abort(&mut self) {
        self.clear();
        self.inner.abort();
    }

    fn resolve_miss(&mut self, error: TxError) -> TxError {
        self.inner.resolve_miss(error)
    }
}
