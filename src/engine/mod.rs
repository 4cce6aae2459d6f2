//! Durability designs: how a commit becomes durable and how recovery rebuilds state.
//!
//! Every engine implements [`Engine`] (tables, workers, recovery facts) and hands out one
//! [`EngineWorker`] per thread, which executes transactions: reads, writes, inserts, deletes and
//! scans buffered until `commit`. The contract is deliberately narrow so that designs as different
//! as in-place update with a log window (Falcon), out-of-place log-free versions with a DRAM cache
//! (Zen), append-only regions (FIR), copy-on-write objects (ArchTM) and shadow DRAM with background
//! persistence (DUDETx) all fit:
//!
//! - the worker owns everything thread-local (log window, allocators, caches);
//! - writes are buffered until commit, so an engine decides where and when they reach PM;
//! - [`Engine::durable_tid`] tells which commits are durable, for engines whose durability is
//!   asynchronous (DUDETx): for the others it is the last commit that returned.

pub(crate) mod common;
pub mod dudetx;
pub use common::{MAX_HOT_TUPLES, MAX_PARTITIONS};
pub mod falcon;
pub mod fir;
pub(crate) mod meta;
pub mod mmdb;
pub(crate) mod shadow;
pub mod wal;
pub mod zen;

use crate::catalog::{Catalog, CatalogError, Schema, TableId};
use crate::pmem::{PersistenceDomain, Pool, PoolError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Which engine (design) runs the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// Falcon (SOSP'23): in-place updates, small log window, selective data flush.
    Falcon,
    /// Falcon without any data flush (eADR only: data reaches PM by eviction).
    FalconNoflush,
    /// Falcon flushing every updated tuple (no hot-tuple tracking).
    FalconAllflush,
    /// In place with a flushed redo log in PM and no window (Falcon §6.2's "Inp").
    Inp,
    /// Out of place (Falcon §6.2's "Outp"): every update writes a whole new tuple version to a
    /// free PM slot and repoints the index; the old version is reclaimed.
    Outp,
    /// Write-behind logging (Arulraj et al., VLDB'17; Zen §4's WBL baseline): out-of-place
    /// versions flushed at commit, a group-committed commit-timestamp gap instead of a redo log.
    Wbl,
    /// The same code with durability off: the ceiling every design is measured against.
    Volatile,
    /// Zen (VLDB'21): Met-Cache in DRAM, log-free out-of-place commits, one-pass recovery.
    Zen,
    /// FIR (Electronics'25): time-ordered append-only regions on PM, tuple headers in DRAM,
    /// MVTO, a last-committed-transaction table as the commit record.
    Fir,
    /// DUDETx (2017): transactions perform on a DRAM shadow, a redo log is persisted and
    /// reproduced onto the PM heap in the background.
    Dudetx,
    /// A main-memory database (Zen §4's MMDB baseline): tuples and indexes in DRAM, a
    /// group-committed redo log and periodic checkpoints on PM.
    Mmdb,
}

impl EngineKind {
    /// Every engine, in CLI order.
    pub const ALL: [EngineKind; 11] = [
        EngineKind::Falcon,
        EngineKind::FalconNoflush,
        EngineKind::FalconAllflush,
        EngineKind::Inp,
        EngineKind::Outp,
        EngineKind::Wbl,
        EngineKind::Volatile,
        EngineKind::Zen,
        EngineKind::Fir,
        EngineKind::Dudetx,
        EngineKind::Mmdb,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Falcon => "falcon",
            EngineKind::FalconNoflush => "falcon-noflush",
            EngineKind::FalconAllflush => "falcon-allflush",
            EngineKind::Inp => "inp",
            EngineKind::Outp => "outp",
            EngineKind::Wbl => "wbl",
            EngineKind::Volatile => "volatile",
            EngineKind::Zen => "zen",
            EngineKind::Fir => "fir",
            EngineKind::Dudetx => "dudetx",
            EngineKind::Mmdb => "mmdb",
        }
    }

    /// The pool layout name: variants of one design share a layout, so a pool written by `falcon`
    /// can be reopened by `falcon-allflush`.
    pub fn layout(self) -> &'static str {
        match self {
            EngineKind::Falcon
            | EngineKind::FalconNoflush
            | EngineKind::FalconAllflush
            | EngineKind::Inp
            | EngineKind::Outp => "falcon",
            // Its tuple states and the gap are not Falcon's: a Falcon variant must not open it.
            EngineKind::Wbl => "wbl",
            EngineKind::Volatile => "volatile",
            EngineKind::Zen => "zen",
            EngineKind::Fir => "fir",
            EngineKind::Dudetx => "dudetx",
            EngineKind::Mmdb => "mmdb",
        }
    }

    /// The engine that opens pools of `layout` by default (the design's main variant).
    pub fn for_layout(layout: &str) -> Option<EngineKind> {
        match layout {
            "falcon" => Some(EngineKind::Falcon),
            "zen" => Some(EngineKind::Zen),
            "fir" => Some(EngineKind::Fir),
            "wbl" => Some(EngineKind::Wbl),
            "volatile" => Some(EngineKind::Volatile),
            "dudetx" => Some(EngineKind::Dudetx),
            "mmdb" => Some(EngineKind::Mmdb),
            _ => None,
        }
    }

    /// Whether this engine runs `protocol` (docs/CC.md has the matrix and the reasons).
    pub fn supports(self, protocol: crate::cc::Protocol) -> bool {
        match self {
            EngineKind::Zen => zen::SUPPORTED_PROTOCOLS.contains(&protocol),
            EngineKind::Fir => fir::SUPPORTED_PROTOCOLS.contains(&protocol),
            EngineKind::Outp => falcon::OUTP_PROTOCOLS.contains(&protocol),
            EngineKind::Wbl => falcon::WBL_PROTOCOLS.contains(&protocol),
            _ => true,
        }
    }

    /// The protocol a run of this engine uses when none is asked for: OCC, or the first the
    /// engine supports when it does not run OCC (FIR: MVTO).
    pub fn default_protocol(self) -> crate::cc::Protocol {
        use crate::cc::Protocol;
        if self.supports(Protocol::Occ) {
            Protocol::Occ
        } else {
            Protocol::ALL
                .into_iter()
                .find(|&p| self.supports(p))
                .unwrap_or(Protocol::Occ)
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing an unknown engine name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown engine '{0}' (expected one of: falcon, falcon-noflush, falcon-allflush, inp, outp, wbl, volatile, zen, fir, dudetx, mmdb)")]
pub struct UnknownEngine(pub String);

impl std::str::FromStr for EngineKind {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownEngine(s.to_string()))
    }
}

/// Why a transaction operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// A concurrency conflict: the transaction was aborted and may be retried.
    #[error("transaction aborted by a conflict (retryable)")]
    Conflict,
    /// No row with that key.
    #[error("no row with key {key} in table {table}")]
    NotFound {
        /// The table.
        table: TableId,
        /// The key.
        key: u64,
    },
    /// A row with that key exists already.
    #[error("a row with key {key} already exists in table {table}")]
    DuplicateKey {
        /// The table.
        table: TableId,
        /// The key.
        key: u64,
    },
    /// No row with that byte-string key (a table with byte keys, `Tx::get_by`...).
    #[error("no row with key \"{}\" in table {table}", .key.escape_ascii())]
    ByteKeyNotFound {
        /// The table.
        table: TableId,
        /// The key.
        key: Vec<u8>,
    },
    /// A row with that byte-string key exists already.
    #[error("a row with key \"{}\" already exists in table {table}", .key.escape_ascii())]
    DuplicateByteKey {
        /// The table.
        table: TableId,
        /// The key.
        key: Vec<u8>,
    },
    /// Persistent memory is full.
    #[error("persistent memory is full: {0}")]
    PmFull(String),
    /// A row or value larger than the schema or the configured limit allows.
    #[error("row too large: {0}")]
    RowTooLarge(String),
    /// An operation that does not match the table's schema.
    #[error("schema mismatch: {0}")]
    SchemaMismatch(String),
    /// The transaction called abort.
    #[error("transaction aborted by the caller")]
    UserAbort,
    /// A write in a read-only transaction.
    #[error("write in a read-only transaction")]
    ReadOnly,
    /// The operation needs something the table lacks (e.g. a range scan on a hash index).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The application aborted the transaction with its own error
    /// ([`Tx::abort_with`](crate::db::Tx::abort_with), or `Err(TxError::app(e))` from the
    /// closure): not retried; [`DbError::app_error`] gets the error back by its type.
    #[error("transaction aborted by the application: {0}")]
    Abort(AppError),
    /// Stored rows contradict each other (a variable-length value's out-of-line chunk is
    /// missing, or a chunk id is taken): the transaction is aborted.
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
}

impl TxError {
    /// Whether retrying the transaction may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, TxError::Conflict)
    }

    /// An abort carrying the application's own error (see [`TxError::Abort`]).
    pub fn app<E: std::error::Error + Send + Sync + 'static>(error: E) -> TxError {
        TxError::Abort(AppError(Arc::new(error)))
    }

    /// The application's error of type `E`, if the transaction was aborted with one.
    pub fn app_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            TxError::Abort(e) => e.downcast_ref(),
            _ => None,
        }
    }
}

/// An application's error carried through a transaction abort ([`TxError::Abort`]). Shared (so
/// that [`TxError`] stays `Clone`); two are equal when they are the same error value.
#[derive(Clone)]
pub struct AppError(Arc<dyn std::error::Error + Send + Sync>);

impl AppError {
    /// The error, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref()
    }
    /// The error as a trait object.
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl PartialEq for AppError {
    fn eq(&self, other: &AppError) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for AppError {}

impl std::fmt::Debug for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

/// Why a database could not be created, opened or configured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The pool underneath.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Space management.
    #[error(transparent)]
    Alloc(#[from] crate::alloc::AllocError),
    /// Schemas and the catalog.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A transaction that failed for good (not retryable, or out of retries).
    #[error(transparent)]
    Tx(#[from] TxError),
    /// A configuration that cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An operation the engine does not implement (e.g. dropping a table).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The pool's engine metadata is damaged.
    #[error("corrupt database: {0}")]
    Corrupt(String),
    /// The engine does not implement the requested concurrency-control protocol.
    #[error("engine {engine} does not support the {protocol} protocol")]
    UnsupportedProtocol {
        /// The engine.
        engine: EngineKind,
        /// The protocol asked for.
        protocol: crate::cc::Protocol,
    },
    /// Every worker slot stayed taken for as long as the database waits for one
    /// ([`DbConfig::worker_wait`](crate::db::DbConfig::worker_wait)).
    #[error("all {0} worker slots are in use (raise max_threads, or worker_wait to wait longer)")]
    NoWorkerSlot(usize),
    /// A transaction given up after conflicts because its run is stopping
    /// ([`crate::cc::stop_requested`]): nothing of it committed.
    #[error("transaction abandoned after {aborts} conflict aborts: the run is stopping")]
    Interrupted {
        /// The conflict aborts it had seen.
        aborts: u32,
    },
}

impl DbError {
    /// The transaction error, if this is one: matches one level instead of two
    /// (`e.tx_error() == Some(&TxError::Conflict)`).
    pub fn tx_error(&self) -> Option<&TxError> {
        match self {
            DbError::Tx(e) => Some(e),
            _ => None,
        }
    }

    /// The application's error of type `E`, if a transaction was aborted with one
    /// ([`TxError::Abort`]).
    pub fn app_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.tx_error()?.app_error()
    }
}

/// A column write: `bytes` replace the row's bytes at `offset`.
#[derive(Clone, Copy, Debug)]
pub struct FieldWrite<'a> {
    /// Byte offset within the row.
    pub offset: usize,
    /// The new bytes.
    pub bytes: &'a [u8],
}

/// What recovery did, phase by phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecoveryReport {
    /// Phases in order: name and duration in milliseconds.
    pub phases: Vec<(String, f64)>,
    /// Log entries replayed.
    pub replayed_entries: u64,
    /// Committed transactions found in logs.
    pub committed_in_log: u64,
    /// Uncommitted transactions discarded.
    pub discarded_in_log: u64,
    /// Rows found live.
    pub rows: u64,
    /// Stale locks cleared.
    pub locks_cleared: u64,
    /// Total milliseconds.
    pub total_ms: f64,
    /// Engine-specific counts worth reporting (name, value), e.g. Zen's pending-list revisits.
    #[serde(default)]
    pub facts: Vec<(String, u64)>,
}

/// An engine: one design's storage and durability, shared by all threads.
pub trait Engine: Send + Sync {
    /// The engine's name.
    fn kind(&self) -> EngineKind;
    /// The persistence domain it runs under.
    fn domain(&self) -> PersistenceDomain;
    /// The tables.
    fn catalog(&self) -> Catalog;
    /// Creates a table, durably.
    fn create_table(&self, schema: Schema) -> Result<TableId, DbError>;
    /// A worker for thread slot `thread` (each slot used by one thread at a time).
    fn worker(self: Arc<Self>, thread: usize) -> Result<Box<dyn EngineWorker>, DbError>;
    /// What the last recovery did (None for a new database).
    fn recovery_report(&self) -> Option<RecoveryReport>;
    /// The pool, for engines that have one.
    fn pool(&self) -> Option<&Arc<Pool>>;
    /// The largest transaction id known durable (synchronous engines: the last committed).
    fn durable_tid(&self) -> u64;
    /// Checks that indexes and storage agree and space accounting is consistent; returns the
    /// number of live rows per table, or a description of the first inconsistency.
    fn check_structure(&self) -> Result<Vec<u64>, String>;
    /// Each table's primary index, in table order, for `pmtx inspect` (empty: the engine does not
    /// report them, and every index is a DRAM one of the schema's kind).
    fn index_info(&self) -> Vec<IndexInfo> {
        Vec::new()
    }
    /// Waits for (helping) the work recovery left to run in the background while transactions
    /// already run, and says what it was; `None` when there was none.
    fn finish_background(&self) -> Option<BackgroundWork> {
        None
    }
    /// Takes a checkpoint now, for engines that keep one (FIR's index leaf checkpoint, §4.3;
    /// MMDB's snapshot of the tables); `None` for the others.
    fn checkpoint(&self) -> Option<Result<fir::CheckpointStats, DbError>> {
        None
    }
    /// Drops `table` and frees its rows' space for any table to reuse, crash-safely (catalog
    /// `dropping`, space freed, catalog `dropped`; see `catalog::TableState`). The caller makes
    /// sure no worker of the engine is alive (`Db::drop_table` holds every slot). Every engine
    /// of [`EngineKind::ALL`] implements it; the default refuses, so that an engine added later
    /// drops nothing until it has a crash-safe order of its own.
    fn drop_table(&self, table: TableId) -> Result<(), DbError> {
        let _ = table;
        Err(DbError::Unsupported(format!(
            "engine {} does not drop tables: it has no crash-safe order for freeing a dropped \
             table's space (see docs/ARCHITECTURE.md, \"The embedding API\")",
            self.kind()
        )))
    }
}

/// Work a recovery left to the background ([`Engine::finish_background`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct BackgroundWork {
    /// What it did.
    pub what: String,
    /// Milliseconds from the end of recovery until it finished.
    pub finished_ms: f64,
}

/// A table's primary index as [`Engine::index_info`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IndexInfo {
    /// DRAM or PM.
    pub placement: crate::index::IndexPlacement,
    /// Hash or ordered.
    pub kind: crate::index::PrimaryIndexKind,
    /// Entries.
    pub entries: u64,
    /// DRAM bytes the index uses (for a PM index: its DRAM directory or inner nodes), with the
    /// table's secondary indexes where the engine counts them (Falcon).
    pub dram_bytes: u64,
    /// PM bytes the index owns (0 for a DRAM index), likewise.
    pub pm_bytes: u64,
}

/// One thread's transaction executor. Operations between `begin` and `commit`/`abort` form a
/// transaction; after an error other than `NotFound`/`DuplicateKey`/`RowTooLarge`/`SchemaMismatch`
/// the caller must `abort`.
pub trait EngineWorker: Send {
    /// Starts a transaction.
    fn begin(&mut self, read_only: bool);
    /// Copies the row with `key` into `out` (exactly the row size).
    fn read(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError>;
    /// Replaces byte ranges of the row with `key`.
    fn update(
        &mut self,
        table: TableId,
        key: u64,
        writes: &[FieldWrite<'_>],
    ) -> Result<(), TxError>;
    /// Inserts a row.
    fn insert(&mut self, table: TableId, key: u64, row: &[u8]) -> Result<(), TxError>;
    /// Deletes the row with `key`.
    fn delete(&mut self, table: TableId, key: u64) -> Result<(), TxError>;
    /// Hints that the transaction will read or write the rows with `keys` soon: the engine may
    /// start loading their index entries and tuples so that the misses overlap instead of
    /// following one another. No effect on the transaction's result; the default does nothing.
    fn prefetch(&mut self, table: TableId, keys: &[u64]) {
        let _ = (table, keys);
    }
    /// Like [`prefetch`](EngineWorker::prefetch), for rows the transaction will overwrite without
    /// reading them (blind updates): an engine that stores such writes without reading the old
    /// lines (Falcon's streamed apply under ADR) loads only what the write itself needs. The
    /// default prefetches as for a read.
    fn prefetch_for_overwrite(&mut self, table: TableId, keys: &[u64]) {
        self.prefetch(table, keys);
    }
    /// Like [`prefetch`](EngineWorker::prefetch), for rows the transaction will read and not
    /// write: an engine that can serve such a read without caching the row (Zen reads an
    /// uncached row in place) may do so. Only a hint: a transaction that writes such a row
    /// after all is still correct. The default prefetches as for a read.
    fn prefetch_read_only(&mut self, table: TableId, keys: &[u64]) {
        self.prefetch(table, keys);
    }
    /// Visits rows with keys `>= from` (or `<= from` when `reverse`) in key order, at most `limit`,
    /// until `f` returns false. Needs an ordered primary index.
    fn scan(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), TxError>;
    /// Primary keys of rows whose secondary index `index` has key `secondary` (callers re-check
    /// the columns: distinct values can share a secondary key).
    fn lookup_secondary(
        &mut self,
        table: TableId,
        index: usize,
        secondary: u64,
        out: &mut Vec<u64>,
    ) -> Result<(), TxError>;
    /// Commits; on `Err(Conflict)` the transaction was aborted.
    fn commit(&mut self) -> Result<u64, TxError>;
    /// Aborts, discarding every buffered write.
    fn abort(&mut self);
    /// Explains a `NotFound` or `DuplicateKey` about to reach the caller. Under optimistic
    /// protocols the key may come from a read that has since gone stale (TPC-C Delivery deletes
    /// the new-order row a concurrent Delivery already took; New-Order inserts an order id a
    /// concurrent New-Order already used): an engine that can tell returns `Conflict` then, so the
    /// transaction is retried instead of failing with an error that only a stale view produced.
    fn resolve_miss(&mut self, error: TxError) -> TxError {
        error
    }
}
