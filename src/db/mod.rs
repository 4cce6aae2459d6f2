//! The public API: open a database (recovering automatically), create tables, run transactions.
//!
//! ```
//! use pmtx::db::{Db, DbConfig, Value};
//! use pmtx::catalog::{ColumnType, Schema};
//!
//! let db = Db::create(DbConfig::temporary().pool_size(16 << 20).max_threads(2)).unwrap();
//! let accounts = db
//!     .create_table(Schema::new("accounts", &[("owner", ColumnType::Bytes(16)), ("balance", ColumnType::I64)]))
//!     .unwrap();
//! db.run(|tx| tx.insert(accounts, 1, &[Value::Bytes(b"ada"), Value::I64(100)])).unwrap();
//! let balance = db.run(|tx| Ok(tx.get(accounts, 1)?.i64(1))).unwrap();
//! assert_eq!(balance, 100);
//! ```

use crate::catalog::{ColumnType, Schema, TableId};
use crate::cc::Protocol;
use crate::engine::dudetx::{DudetxConfig, DudetxEngine, DudetxFault, DurabilityMode};
use crate::engine::falcon::{FalconConfig, FalconEngine};
use crate::engine::fir::{FirConfig, FirEngine, FirFault};
use crate::engine::mmdb::{MmdbConfig, MmdbEngine, MmdbFault};
use crate::engine::zen::{ZenConfig, ZenEngine, ZenFault};
use crate::engine::{
    DbError, Engine, EngineKind, EngineWorker, FieldWrite, RecoveryReport, TxError,
};
use crate::pmem::{platform, PersistenceDomain, Pool, PoolOptions};
use std::path::{Path, PathBuf};

mod bytekey;
mod drop;
mod range;
pub use bytekey::{ByteKeyIndex, ByteRangeIter};
pub use range::{RangeIter, FIRST_BATCH, MAX_BATCH};
mod varlen;
use std::sync::Arc;
pub use varlen::{chunk_table_name, CHUNK_BYTES, CHUNK_TABLE};

/// How to create or open a database.
#[derive(Clone, Debug)]
pub struct DbConfig {
    /// The engine (design).
    pub engine: EngineKind,
    /// The concurrency-control protocol.
    pub protocol: Protocol,
    /// The persistence domain. `None` (the default) is `auto`: a new pool gets the domain that
    /// is honest where it lives ([`platform::detect_domain`]: eADR only where the platform reports
    /// a persistent CPU cache, ADR on other DAX storage, `msync` on an ordinary file system,
    /// eADR for scratch and tmpfs pools), an existing pool the domain it was created for.
    pub domain: Option<PersistenceDomain>,
    /// The pool file. `None` is allowed only for a [`DbConfig::temporary`] database, whose
    /// scratch pool under /dev/shm (or the temp dir) is removed when the database is dropped.
    pub path: Option<PathBuf>,
    /// A scratch pool, removed on drop, is wanted (see [`DbConfig::temporary`]); without it a
    /// missing `path` is an error rather than a database that silently vanishes.
    pub temporary: bool,
    /// Pool size for a new database, in bytes.
    pub pool_size: u64,
    /// For a new database: the size its pool may grow to, in bytes; `None` (the default) makes a
    /// fixed-size pool. Recorded in the pool, so it holds for every later open (this field is
    /// ignored when opening). See [`DbConfig::max_pool_size`].
    pub max_pool_size: Option<u64>,
    /// Worker slots (threads that may run transactions at once).
    pub max_threads: usize,
    /// The tuple size limit: a table whose rows (as stored: fixed-width columns at their size,
    /// variable-length ones as a length word and their inline area) are larger is refused; see
    /// [`DbConfig::max_row_bytes`].
    pub max_row_bytes: usize,
    /// Log window slots per thread (Falcon).
    pub window_slots: Option<usize>,
    /// Bytes per log window slot (Falcon).
    pub window_slot_bytes: Option<usize>,
    /// Hot tuples tracked per thread (Falcon; 0 disables).
    pub hot_tuples: usize,
    /// Conflict aborts `run` retries before giving up.
    pub max_retries: u32,
    /// How long [`Db::worker`], [`Db::run`] and [`Db::begin`] wait for a worker slot when all
    /// [`max_threads`](DbConfig::max_threads) are in use, before failing with
    /// [`DbError::NoWorkerSlot`] (default 10 s; zero fails at once).
    pub worker_wait: std::time::Duration,
    /// Count PM traffic (see `pmem::stats`).
    pub counting: bool,
    /// A deliberate ordering bug, for showing that the crash harness catches it (test-only).
    pub fault: Option<crate::engine::falcon::Fault>,
    /// Options of the concurrency-control protocol (e.g. hstore's partitions).
    pub cc_options: crate::cc::CcOptions,
    /// Zen: P = NVM size / DRAM Met-Cache budget (Zen §4.1 uses 4, 8, 16).
    pub cache_ratio: f64,
    /// Zen: a fixed Met-Cache budget in bytes (overrides `cache_ratio`).
    pub cache_bytes: Option<u64>,
    /// Zen: Met-Cache entries every table gets at least (C_min, §3.2).
    pub cache_min_entries: usize,
    /// Zen: a deliberate ordering bug for the crash harness (test-only).
    pub zen_fault: Option<ZenFault>,
    /// FIR: a deliberate ordering bug for the crash harness (test-only).
    pub fir_fault: Option<FirFault>,
    /// FIR: a background thread takes an index leaf checkpoint every this many milliseconds
    /// (`None`: never; default 1,000).
    pub fir_checkpoint_interval_ms: Option<u64>,
    /// FIR: a committing worker takes a checkpoint after every this many commits (deterministic,
    /// for the crash suite; default `None`).
    pub fir_checkpoint_every_commits: Option<u64>,
    /// FIR: full, incremental, or chosen by the time cost model (§4.3.3; the default).
    pub fir_checkpoint_mode: crate::engine::fir::CheckpointMode,
    /// FIR: a worker runs a garbage collection round after every this many of its commits
    /// (§4.5; `None`: never; default 1,024).
    pub fir_gc_every_commits: Option<u64>,
    /// FIR: slots per block below what fits in a page (test-only: short crash runs collect
    /// blocks; `None`: as many as fit).
    pub fir_block_slots: Option<u64>,
    /// [`Db::open`] takes the engine design from the pool header: when `engine` is of another
    /// design (layout) than the pool's, the pool's design is used (true, the default) or the
    /// open is refused (false: the caller insisted on an engine).
    pub engine_from_pool: bool,
    /// Open a pool created for another persistence domain than `domain` (refused otherwise:
    /// the pool header records the domain it was created for).
    pub allow_domain_change: bool,
    /// A PM media model and NVM latency emulation for the pool ([`crate::pmem::media`]): what the
    /// media would read and write, reported in [`crate::pmem::PmStats`]. Off by default.
    pub media: Option<crate::pmem::MediaOptions>,
    /// Where a new table's primary index goes when its schema does not say
    /// ([`Schema::placed`](crate::catalog::Schema::placed)): DRAM (the default) or PM (Falcon and
    /// its durable variants only; see [`IndexPlacement`](crate::index::IndexPlacement)).
    pub index_placement: crate::index::IndexPlacement,
    /// Falcon: work a recovery leaves to run beside transactions (the heap sweep of tables
    /// with PM indexes) runs in a background thread (true, the default); false leaves it to the
    /// transactions that reach each page and to [`Db::check_structure`] (the crash simulator,
    /// whose PM events must come from the threads it drives).
    pub background_recovery: bool,
    /// DUDETx: when commits return (sync: once durable, the default; async: at once, with
    /// [`Engine::durable_tid`] telling what is durable).
    pub dudetx_mode: DurabilityMode,
    /// DUDETx: transactions combined into one persisted log record at most (§3.3; default 64).
    pub dudetx_group: usize,
    /// DUDETx: whether log records are compressed with LZ4 (§3.3; default
    /// [`LogCompression::Auto`](crate::engine::dudetx::LogCompression::Auto): in async mode
    /// only).
    pub dudetx_compression: crate::engine::dudetx::LogCompression,
    /// DUDETx, async mode: how long the persist thread waits at most for a group of
    /// `dudetx_group` to fill (§3.3), in µs (default 2,000; at most 1,000,000; 0: it takes what
    /// is queued). Sync commits never wait for a group. The table engine's shadow is a whole
    /// DRAM copy of the tables, so it has no shadow page size or shadow size to set (those are
    /// the persistent-object API's, `DudetxPtmOptions`).
    pub dudetx_group_delay_us: u64,
    /// DUDETx: 2 MiB pages of the PM log ring, for a new pool; 0 (the default) sizes it from
    /// the pool: a quarter of its pages, 1 to 8.
    pub dudetx_log_pages: usize,
    /// DUDETx: persist and reproduce in background threads (true, the default) or inline in the
    /// committing thread (the crash simulator's setting).
    pub dudetx_background: bool,
    /// DUDETx: a deliberate ordering bug for the crash harness (test-only).
    pub dudetx_fault: Option<DudetxFault>,
    /// MMDB group commit: transactions written as one log record at most (default 64).
    pub mmdb_group: usize,
    /// MMDB group commit: microseconds the log writer waits for a group to gather (default 0:
    /// a group is what queued while the previous record was written).
    pub mmdb_group_wait_us: u64,
    /// MMDB: 2 MiB pages of the PM log ring, for a new pool; 0 (the default) sizes it from the
    /// pool: a quarter of its pages, 1 to 8.
    pub mmdb_log_pages: usize,
    /// MMDB: milliseconds between periodic checkpoints (default 10,000; 0: only when the log is
    /// half full).
    pub mmdb_checkpoint_ms: u64,
    /// MMDB inline mode: a checkpoint every this many commits (0, the default: only when the
    /// log ring is full).
    pub mmdb_checkpoint_every: u64,
    /// MMDB: the log writer and the checkpointer run in background threads (true, the default)
    /// or inline in the committing thread (the crash simulator's setting).
    pub mmdb_background: bool,
    /// MMDB: a deliberate ordering bug for the crash harness (test-only).
    pub mmdb_fault: Option<MmdbFault>,
}

impl Default for DbConfig {
    fn default() -> Self {
        DbConfig {
            engine: EngineKind::Falcon,
            protocol: Protocol::Occ,
            domain: None,
            path: None,
            pool_size: 256 << 20,
            max_pool_size: None,
            max_threads: 16,
            max_row_bytes: 4096,
            window_slots: None,
            window_slot_bytes: None,
            hot_tuples: 1024,
            max_retries: 1000,
            worker_wait: std::time::Duration::from_secs(10),
            counting: true,
            fault: None,
            cc_options: crate::cc::CcOptions::default(),
            cache_ratio: 4.0,
            cache_bytes: None,
            cache_min_entries: 1024,
            zen_fault: None,
            fir_fault: None,
            fir_checkpoint_interval_ms: Some(1000),
            fir_checkpoint_every_commits: None,
            fir_gc_every_commits: Some(crate::engine::fir::DEFAULT_GC_EVERY_COMMITS),
            fir_block_slots: None,
            fir_checkpoint_mode: crate::engine::fir::CheckpointMode::CostModel,
            engine_from_pool: true,
            allow_domain_change: false,
            media: None,
            temporary: false,
            index_placement: crate::index::IndexPlacement::Dram,
            background_recovery: true,
            dudetx_mode: DurabilityMode::Sync,
            dudetx_group: 64,
            dudetx_compression: crate::engine::dudetx::LogCompression::Auto,
            dudetx_group_delay_us: crate::engine::dudetx::DEFAULT_GROUP_DELAY_US,
            dudetx_log_pages: 0,
            dudetx_background: true,
            dudetx_fault: None,
            mmdb_group: 64,
            mmdb_group_wait_us: 0,
            mmdb_log_pages: 0,
            mmdb_checkpoint_ms: 10_000,
            mmdb_checkpoint_every: 0,
            mmdb_background: true,
            mmdb_fault: None,
        }
    }
}

impl DbConfig {
    /// The default configuration for a temporary database: its pool is a scratch file under
    /// /dev/shm (or the temp dir, or `$PMTX_SCRATCH_DIR`), removed when the database is dropped,
    /// and also when SIGINT or SIGTERM stops the `pmtx` command. For a database that outlives
    /// the process give a [`DbConfig::path`] instead (which makes it non-temporary).
    pub fn temporary() -> DbConfig {
        DbConfig {
            temporary: true,
            ..DbConfig::default()
        }
    }
    /// Sets the engine.
    pub fn engine(mut self, engine: EngineKind) -> Self {
        self.engine = engine;
        self
    }
    /// Sets the protocol.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }
    /// Sets the domain (instead of `auto`, see [`DbConfig::domain`]).
    pub fn domain(mut self, domain: PersistenceDomain) -> Self {
        self.domain = Some(domain);
        self
    }
    /// Lets the domain be chosen from where the pool lives (the default; see
    /// [`DbConfig::domain`]).
    pub fn auto_domain(mut self) -> Self {
        self.domain = None;
        self
    }
    /// Allows opening a pool created for another persistence domain (see
    /// [`DbConfig::allow_domain_change`]).
    pub fn allow_domain_change(mut self, allow: bool) -> Self {
        self.allow_domain_change = allow;
        self
    }
    /// Sets the pool path (the database is then not [temporary](DbConfig::temporary)).
    pub fn path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self.temporary = false;
        self
    }
    /// Sets the pool size of a new database.
    pub fn pool_size(mut self, bytes: u64) -> Self {
        self.pool_size = bytes;
        self
    }
    /// Lets the pool of a new database grow, when every page is in use, up to `bytes` (at least
    /// `pool_size`, at most about 510 GiB: what the page table can describe). Growth extends the
    /// pool file and maps the extension in place, crash-safely (a crash during growth leaves a
    /// pool that opens with all committed rows); past the maximum, inserts fail with
    /// [`TxError::PmFull`]. Not for in-memory pools.
    pub fn max_pool_size(mut self, bytes: u64) -> Self {
        self.max_pool_size = Some(bytes);
        self
    }
    /// Sets the tuple size limit (default 4,096 bytes): [`Db::create_table`] refuses a table
    /// whose stored row is larger, with an error naming both sizes. A stored row counts each
    /// fixed-width column at its size and each variable-length column (`VarBytes(max)`,
    /// `Text(max)`) as its 4-byte length word and inline area (`min(max, INLINE_CAPACITY)`
    /// bytes): the out-of-line part of a long value is not in the row, so a value is limited
    /// by its column's maximum, not by this. The out-of-line chunks are rows of at most
    /// [`CHUNK_BYTES`] (less if this limit is smaller). Engines size their log records and
    /// heap slots from it, so a larger limit costs space per row.
    pub fn max_row_bytes(mut self, bytes: usize) -> Self {
        self.max_row_bytes = bytes;
        self
    }
    /// Sets the number of worker slots.
    pub fn max_threads(mut self, n: usize) -> Self {
        self.max_threads = n;
        self
    }
    /// Sets how long a thread waits for a worker slot (see [`DbConfig::worker_wait`]).
    pub fn worker_wait(mut self, wait: std::time::Duration) -> Self {
        self.worker_wait = wait;
        self
    }
    /// Sets how many conflict aborts `run` retries (see [`DbConfig::max_retries`]).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }
    /// Sets where new tables' primary indexes go by default (see [`DbConfig::index_placement`]).
    pub fn index_placement(mut self, placement: crate::index::IndexPlacement) -> Self {
        self.index_placement = placement;
        self
    }
    /// Attaches a PM media model (and latency emulation) to the pool; see [`DbConfig::media`].
    pub fn media(mut self, media: Option<crate::pmem::MediaOptions>) -> Self {
        self.media = media;
        self
    }

    fn falcon(&self) -> FalconConfig {
        let mut c = FalconConfig::new(self.engine, self.protocol);
        c.max_threads = self.max_threads;
        c.max_row_bytes = self.max_row_bytes;
        c.hot_tuples = self.hot_tuples;
        c.fault = self.fault;
        c.cc_options = self.cc_options;
        c.index_placement = self.index_placement;
        c.background_sweep = self.background_recovery;
        if let Some(n) = self.window_slots {
            c.window_slots = n;
        }
        if let Some(n) = self.window_slot_bytes {
            c.window_slot_bytes = n;
        }
        c
    }

    fn zen(&self) -> ZenConfig {
        let mut c = ZenConfig::new(self.protocol);
        c.max_threads = self.max_threads;
        c.max_row_bytes = self.max_row_bytes;
        c.cache_ratio = self.cache_ratio;
        c.cache_bytes = self.cache_bytes;
        c.cache_min_entries = self.cache_min_entries;
        c.fault = self.zen_fault;
        c.cc_options = self.cc_options;
        c
    }

    fn fir(&self) -> FirConfig {
        let mut c = FirConfig::new(self.protocol);
        c.max_threads = self.max_threads;
        c.max_row_bytes = self.max_row_bytes;
        c.fault = self.fir_fault;
        c.checkpoint_interval = self
            .fir_checkpoint_interval_ms
            .map(std::time::Duration::from_millis);
        c.checkpoint_every_commits = self.fir_checkpoint_every_commits;
        c.checkpoint_mode = self.fir_checkpoint_mode;
        c.gc_every_commits = self.fir_gc_every_commits;
        c.block_slots = self.fir_block_slots;
        c
    }

    fn dudetx(&self) -> DudetxConfig {
        let mut c = DudetxConfig::new(self.protocol);
        c.cc_options = self.cc_options;
        c.max_threads = self.max_threads;
        c.max_row_bytes = self.max_row_bytes;
        c.mode = self.dudetx_mode;
        c.group = self.dudetx_group;
        c.compression = self.dudetx_compression;
        c.group_delay_us = self.dudetx_group_delay_us;
        c.log_pages = self.dudetx_log_pages;
        c.background = self.dudetx_background;
        c.fault = self.dudetx_fault;
        c
    }

    fn mmdb(&self) -> MmdbConfig {
        let mut c = MmdbConfig::new(self.protocol);
        c.cc_options = self.cc_options;
        c.max_threads = self.max_threads;
        c.max_row_bytes = self.max_row_bytes;
        c.group = self.mmdb_group;
        c.group_wait = std::time::Duration::from_micros(self.mmdb_group_wait_us);
        c.log_pages = self.mmdb_log_pages;
        c.checkpoint_interval = std::time::Duration::from_millis(self.mmdb_checkpoint_ms);
        c.checkpoint_every = self.mmdb_checkpoint_every;
        c.background = self.mmdb_background;
        c.fault = self.mmdb_fault;
        c
    }

    fn pool_options(&self, crash_sim: Option<crate::pmem::CrashTrigger>) -> PoolOptions {
        let domain = if self.engine == EngineKind::Volatile {
            PersistenceDomain::Volatile
        } else {
            self.domain
                .unwrap_or_else(|| platform::detect_domain(self.path.as_deref()).domain)
        };
        let mut o = PoolOptions::new(self.engine.layout(), domain)
            .with_counting(self.counting)
            .allowing_domain_change(self.allow_domain_change)
            .growable_to(self.max_pool_size)
            .with_media(self.media);
        if let Some(t) = crash_sim {
            o = o.with_crash_sim(t);
        }
        if self.path.is_none() {
            o = o.removing_on_drop();
        }
        o
    }
}

/// The smallest pool in which `engine` can run `max_threads` worker threads that each commit an
/// insert into one table, in bytes; [`Db::create`] refuses a smaller one.
///
/// Computed from the layout: the page manager's 2 MiB metadata region (pool header, page table),
/// the engine's 2 MiB meta page (parameters and catalog), and per worker thread the 2 MiB pages
/// it takes for itself on its first commit: Falcon and its variants a log window and a heap page
/// (a thread inserts only into its own pages), Zen a heap page (no log). Each further table a
/// thread inserts into takes another heap page of that thread, and a Falcon transaction whose
/// redo log does not fit in a window slot takes spill pages; see README ("Pool size").
pub fn min_pool_size(engine: EngineKind, max_threads: usize) -> u64 {
    (2 + pages_per_thread(engine) * max_threads as u64) * crate::alloc::PAGE_SIZE
}

/// 2 MiB pages a worker thread takes for itself on its first committed insert (see
/// [`min_pool_size`]).
fn pages_per_thread(engine: EngineKind) -> u64 {
    match engine {
        EngineKind::Zen | EngineKind::Fir => 1,
        _ => 2,
    }
}

fn check_pool_size(engine: EngineKind, max_threads: usize, size: u64) -> Result<(), DbError> {
    let min = min_pool_size(engine, max_threads);
    if size < min {
        let mib = crate::alloc::mib;
        let per_thread = if matches!(engine, EngineKind::Zen | EngineKind::Fir) {
            "a heap page"
        } else {
            "a log window and a heap page"
        };
        return Err(DbError::Config(format!(
            "a pool of {} is too small for the {engine} engine with {max_threads} worker threads: \
             the minimum is {} (2 MiB of metadata, a 2 MiB meta page, and per thread {per_thread} \
             of 2 MiB each); give a larger pool (DbConfig::pool_size, --pool-size) or fewer \
             threads (DbConfig::max_threads, --threads)",
            mib(size),
            mib(min)
        )));
    }
    Ok(())
}

/// A database: one engine over one pool.
pub struct Db {
    engine: Arc<dyn Engine>,
    config: DbConfig,
    slots: SlotPool,
    /// Tells this database's workers apart in a thread's [`AFFINITY`].
    id: u64,
    /// Tables in the catalog: workers refresh their schema copies when it grows.
    table_count: std::sync::atomic::AtomicUsize,
    /// See [`Db::durability_warning`].
    durability_warning: Option<String>,
    /// One drop at a time (`drop.rs`): two drops each holding part of the slots would wait for
    /// each other until both time out.
    drops: parking_lot::Mutex<()>,
}

/// A value for a column, by position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    /// For `U64` columns.
    U64(u64),
    /// For `I64` columns.
    I64(i64),
    /// For `F64` columns.
    F64(f64),
    /// For `Bytes(n)` columns: at most n bytes, zero-padded; for `VarBytes(max)` columns: at
    /// most `max` bytes, stored with their length.
    Bytes(&'a [u8]),
    /// For `Text(max)` (and `VarBytes(max)`) columns: at most `max` bytes of UTF-8.
    Str(&'a str),
}

impl Db {
    /// Creates a new database (and its pool).
    pub fn create(mut config: DbConfig) -> Result<Db, DbError> {
        if config.path.is_none() && !config.temporary {
            return Err(DbError::Config(
                "no pool path: give DbConfig::path(...) for a database that outlives the \
                 process, or start from DbConfig::temporary() for a scratch pool removed when \
                 the database is dropped"
                    .into(),
            ));
        }
        if config.domain.is_none() {
            config.domain = Some(platform::detect_domain(config.path.as_deref()).domain);
        }
        // A pool file this call creates is removed again if the engine refuses it, so a failed
        // create leaves nothing behind (an unformatted file would later read as "never
        // formatted", and a retry with a corrected configuration as "the file exists").
        let created_here = config.path.as_deref().is_some_and(|p| !p.exists());
        let engine = match Self::make_engine(&config, None, true) {
            Ok(engine) => engine,
            Err(e) => {
                if let Some(path) = config.path.as_deref().filter(|_| created_here) {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e);
            }
        };
        Ok(Self::assemble(engine, config))
    }

    /// Opens an existing database, recovering it; see [`Db::recovery_report`]. The engine design
    /// comes from the pool header (see [`DbConfig::engine_from_pool`]); a pool created for another
    /// persistence domain than `config.domain` is refused unless
    /// [`DbConfig::allow_domain_change`] is set.
    pub fn open(mut config: DbConfig) -> Result<Db, DbError> {
        let Some(path) = config.path.clone() else {
            return Err(DbError::Config(
                "opening a database needs the path of its pool".into(),
            ));
        };
        let header = Pool::read_header(&path)?;
        config.domain.get_or_insert(header.domain);
        if config.engine.layout() != header.layout {
            match EngineKind::for_layout(&header.layout) {
                Some(pool_engine) if config.engine_from_pool => config.engine = pool_engine,
                _ => {
                    return Err(DbError::Config(format!(
                        "pool {} was created by the '{}' engine design; engine {} (design '{}') cannot open it",
                        path.display(),
                        header.layout,
                        config.engine,
                        config.engine.layout()
                    )))
                }
            }
        }
        let engine = Self::make_engine(&config, None, false)?;
        Self::assemble(engine, config).with_orphans_dropped()
    }

    /// Opens the database at `config.path` if it exists, else creates it.
    pub fn open_or_create(config: DbConfig) -> Result<Db, DbError> {
        match &config.path {
            Some(p) if p.exists() => Self::open(config),
            _ => Self::create(config),
        }
    }

    /// Opens a pool that is already mapped (e.g. a crash image), recovering it.
    pub fn open_pool(pool: Pool, mut config: DbConfig) -> Result<Db, DbError> {
        config.domain.get_or_insert(pool.domain());
        let engine = Self::engine_on(Arc::new(pool), &config, false)?;
        Self::assemble(engine, config).with_orphans_dropped()
    }

    /// Creates a database on a pool the caller made (e.g. one with a crash simulator attached).
    pub fn create_on_pool(pool: Pool, mut config: DbConfig) -> Result<Db, DbError> {
        config.domain.get_or_insert(pool.domain());
        let engine = Self::engine_on(Arc::new(pool), &config, true)?;
        Ok(Self::assemble(engine, config))
    }

    fn make_engine(
        config: &DbConfig,
        crash_sim: Option<crate::pmem::CrashTrigger>,
        create: bool,
    ) -> Result<Arc<dyn Engine>, DbError> {
        let opts = config.pool_options(crash_sim);
        // The volatile engine gets a /dev/shm pool like the others (with durability off), so that
        // ratios against it measure durability alone, not a different kind of memory.
        let pool = if create {
            // Refused before the file is made, so a refused create leaves nothing behind.
            check_pool_size(config.engine, config.max_threads, config.pool_size)?;
            let usable = crate::alloc::PageManager::max_pool_size();
            if config.max_pool_size.is_some_and(|m| m > usable) {
                return Err(DbError::Config(format!(
                    "max_pool_size {} is beyond what the page table can describe ({usable} bytes)",
                    config.max_pool_size.unwrap_or(0)
                )));
            }
            Pool::create(config.path.as_deref(), config.pool_size, &opts)?
        } else {
            Pool::open(config.path.as_deref().expect("checked by open"), &opts)
                .map_err(|e| Self::name_the_engines(e, config.engine))?
        };
        Self::engine_on(Arc::new(pool), config, create)
    }

    /// A layout mismatch named in engines, not layouts: "--engine inp" on a Zen pool must not
    /// say that 'falcon' was requested.
    fn name_the_engines(e: crate::pmem::PoolError, requested: EngineKind) -> DbError {
        match e {
            crate::pmem::PoolError::LayoutMismatch { path, found, .. } => {
                let engines_of = |layout: &str| {
                    EngineKind::ALL
                        .into_iter()
                        .filter(|k| k.layout() == layout)
                        .map(EngineKind::name)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let written_by = engines_of(&found);
                DbError::Config(format!(
                    "pool {} was created with the {found} layout (engines: {}); engine {requested} \
                     opens {} pools only",
                    path.display(),
                    if written_by.is_empty() { "none of this build" } else { &written_by },
                    requested.layout()
                ))
            }
            other => other.into(),
        }
    }

    fn engine_on(
        pool: Arc<Pool>,
        config: &DbConfig,
        create: bool,
    ) -> Result<Arc<dyn Engine>, DbError> {
        if create {
            check_pool_size(config.engine, config.max_threads, pool.len())?;
        }
        if config.engine == EngineKind::Fir {
            if config.index_placement == crate::index::IndexPlacement::Pm {
                return Err(DbError::Config(
                    crate::engine::fir::FIR_INDEX_IN_DRAM.into(),
                ));
            }
            let fir = config.fir();
            return Ok(if create {
                FirEngine::create(pool, fir)?
            } else {
                FirEngine::open(pool, fir)?
            });
        }
        if config.engine == EngineKind::Dudetx {
            if config.index_placement == crate::index::IndexPlacement::Pm {
                return Err(DbError::Config(
                    "engine dudetx keeps its indexes in the DRAM shadow (DUDETx §3.1): use \
                     --index dram, or falcon for persistent indexes"
                        .into(),
                ));
            }
            let dudetx = config.dudetx();
            return Ok(if create {
                DudetxEngine::create(pool, dudetx)?
            } else {
                DudetxEngine::open(pool, dudetx)?
            });
        }
        if config.engine == EngineKind::Mmdb {
            if config.index_placement == crate::index::IndexPlacement::Pm {
                return Err(DbError::Config(
                    "engine mmdb keeps its indexes in DRAM (Zen §2.2): use --index dram, or \
                     falcon for persistent indexes"
                        .into(),
                ));
            }
            let mmdb = config.mmdb();
            return Ok(if create {
                MmdbEngine::create(pool, mmdb)?
            } else {
                MmdbEngine::open(pool, mmdb)?
            });
        }
        if config.engine == EngineKind::Zen {
            if config.index_placement == crate::index::IndexPlacement::Pm {
                return Err(DbError::Config(
                    "engine zen keeps its indexes in DRAM (it updates out of place, so a PM index \
                     would be rewritten on every update, Falcon §2.1): use --index dram, or \
                     falcon for persistent indexes"
                        .into(),
                ));
            }
            let zen = config.zen();
            return Ok(if create {
                ZenEngine::create(pool, zen)?
            } else {
                ZenEngine::open(pool, zen)?
            });
        }
        let falcon = config.falcon();
        let engine = if create {
            FalconEngine::create(pool, falcon)?
        } else {
            FalconEngine::open(pool, falcon)?
        };
        Ok(engine)
    }

    fn assemble(engine: Arc<dyn Engine>, config: DbConfig) -> Db {
        let slots = SlotPool::new(config.max_threads);
        let table_count = std::sync::atomic::AtomicUsize::new(engine.catalog().tables.len());
        let durability_warning = match (engine.pool(), config.engine) {
            (_, EngineKind::Volatile) | (None, _) => None,
            // A DAX mapping keeps its promise whatever the file system looked like.
            (Some(pool), _) if pool.mapping_kind() == crate::pmem::MappingKind::DaxSync => None,
            // Scratch pools (no path) are removed on drop: nothing to warn about.
            (Some(pool), _) => platform::durability_warning(pool.domain(), config.path.as_deref()),
        };
        Db {
            engine,
            config,
            slots,
            id: NEXT_DB_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            table_count,
            durability_warning,
            drops: parking_lot::Mutex::new(()),
        }
    }

    /// Why the pool's persistence domain does not hold where the pool lives, if it does not:
    /// ADR or eADR on a file system without DAX (flushes stop at the page cache; a power loss can
    /// lose acknowledged commits) or on tmpfs (nothing survives power loss). `None` for scratch
    /// pools, DAX mappings and the `msync` domain. The CLI prints it as a warning.
    pub fn durability_warning(&self) -> Option<&str> {
        self.durability_warning.as_deref()
    }

    /// The persistence domain the database runs under (resolved from `auto` or the pool).
    pub fn domain(&self) -> PersistenceDomain {
        match self.engine.pool() {
            Some(pool) => pool.domain(),
            None => PersistenceDomain::Volatile,
        }
    }

    /// The engine underneath (for tools and tests).
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Takes an index checkpoint now, for engines that keep one (FIR, §4.3); `None` for the
    /// others.
    pub fn checkpoint(&self) -> Option<Result<crate::engine::fir::CheckpointStats, DbError>> {
        self.engine.checkpoint()
    }

    /// The configuration the database was opened with.
    pub fn config(&self) -> &DbConfig {
        &self.config
    }

    /// What recovery did when the database was opened (None for a new one).
    pub fn recovery_report(&self) -> Option<RecoveryReport> {
        self.engine.recovery_report()
    }

    /// Creates a table, durably, and returns its id.
    pub fn create_table(&self, schema: Schema) -> Result<TableId, DbError> {
        let schema = varlen::prepare_table(self, schema)?;
        let id = match schema.key {
            crate::catalog::PrimaryKey::U64 => self.engine.create_table(schema)?,
            crate::catalog::PrimaryKey::Bytes(_) => self.create_byte_key_table(schema)?,
        };
        self.table_count
            .fetch_max(id as usize + 1, std::sync::atomic::Ordering::Release);
        Ok(id)
    }

    /// The id of the table called `name`.
    pub fn table(&self, name: &str) -> Option<TableId> {
        self.engine.catalog().table_id(name)
    }

    /// The schema of table `id` (`None` for a dropped table).
    pub fn schema(&self, id: TableId) -> Option<Schema> {
        self.engine.catalog().check_live(id).ok().cloned()
    }

    /// Every table, with its id, in creation order (dropped tables and the database's own
    /// hidden tables, such as [`CHUNK_TABLE`], left out).
    pub fn tables(&self) -> Vec<(TableId, Schema)> {
        let catalog = self.engine.catalog();
        catalog
            .live_tables()
            .filter(|(_, s)| !varlen::is_hidden(&s.name))
            .map(|(id, s)| (id, s.clone()))
            .collect()
    }

    /// The position of column `column` of table `table`, resolved once for the fast getters by
    /// position ([`Row::u64`]...) and for [`Tx::update`]; an error naming what is missing.
    pub fn column(&self, table: TableId, column: &str) -> Result<usize, DbError> {
        let catalog = self.engine.catalog();
        let schema = catalog
            .check_live(table)
            .map_err(|e| TxError::SchemaMismatch(e.to_string()))?;
        Ok(schema.column_index(column).ok_or_else(|| {
            TxError::SchemaMismatch(format!("table {} has no column '{column}'", schema.name))
        })?)
    }

    /// Drops table `table` and frees its rows' space for any table to reuse. Its name is free
    /// at once for a new table (with a new id); its id stays taken, and using it is an error
    /// that says the table was dropped. The drop runs alone: it waits (up to
    /// [`DbConfig::worker_wait`]) until no other worker is in use, discarding the idle ones
    /// [`Db::run`] keeps, and fails with [`CatalogError::Busy`](crate::catalog::CatalogError)
    /// if some stay in use. Crash-safe: after a crash the table is either intact or gone, its
    /// space freed (docs/ARCHITECTURE.md, "The embedding API").
    pub fn drop_table(&self, table: TableId) -> Result<(), DbError> {
        let schema = self.engine.catalog().check_live(table)?.clone();
        if schema.columns.iter().any(|c| c.ty.spills()) && schema.chunk_table.is_none() {
            return Err(DbError::Unsupported(format!(
                "table '{}' keeps its long values in the chunk table '{CHUNK_TABLE}' that every \
                 table of a database made before tables had chunk tables of their own shares: \
                 its chunks cannot be told apart, so it cannot be dropped (deleting its rows \
                 frees their values)",
                schema.name
            )));
        }
        self.drop_table_alone(table)?;
        // Its hidden tables go after it: a crash in between leaves them unreferenced, and the
        // next open drops them (`drop_orphans`).
        for hidden in drop::hidden_tables_of(&schema) {
            self.drop_table_alone(hidden)?;
        }
        Ok(())
    }

    /// Claims a worker slot for the calling thread; released when the worker drops. When all
    /// [`max_threads`](DbConfig::max_threads) slots are in use, waits up to
    /// [`DbConfig::worker_wait`] for one to be released, then fails with
    /// [`DbError::NoWorkerSlot`].
    pub fn worker(&self) -> Result<Worker<'_>, DbError> {
        self.claim_worker(false)
    }

    fn claim_worker(&self, cached: bool) -> Result<Worker<'_>, DbError> {
        let (slot, core) = self
            .slots
            .claim(self.config.worker_wait)
            .ok_or(DbError::NoWorkerSlot(self.config.max_threads))?;
        let core = match core {
            Some(core) => core,
            None => match self.engine.clone().worker(slot) {
                Ok(inner) => Box::new(WorkerCore::new(inner)),
                Err(e) => {
                    self.slots.release(slot);
                    return Err(e);
                }
            },
        };
        Ok(Worker::new(self, slot, core, cached))
    }

    /// The calling thread's cached worker: the one its last [`Db::run`] left idle in its slot,
    /// if no other thread took it meanwhile, else a newly claimed one that will be left so.
    fn cached_worker(&self) -> Result<Worker<'_>, DbError> {
        let (db, slot) = AFFINITY.try_with(|a| a.get()).unwrap_or((0, 0));
        if db == self.id {
            if let Some(core) = self.slots.take_idle(slot) {
                return Ok(Worker::new(self, slot, core, true));
            }
        }
        let worker = self.claim_worker(true)?;
        let _ = AFFINITY.try_with(|a| a.set((self.id, worker.slot)));
        Ok(worker)
    }

    /// Runs `f` as a read-write transaction, retrying conflicts: see [`Worker::run`], whose
    /// retry contract (**the closure may run several times**) holds here too.
    ///
    /// As cheap as [`Worker::run`]: the calling thread keeps its worker between calls (idle in
    /// its slot, where a thread that finds every slot taken may take it over), so a call does
    /// not set up an engine worker. Waits for a slot as [`Db::worker`] does.
    pub fn run<T>(&self, f: impl FnMut(&mut Tx<'_>) -> Result<T, TxError>) -> Result<T, DbError> {
        self.cached_worker()?.run(f)
    }

    /// Runs `f` as a read-only transaction on the thread's cached worker (see [`Db::run`]).
    ///
    /// **Snapshot readers.** Under the multi-version protocols that keep old versions
    /// ([`Protocol::Si`], [`Protocol::Mvocc`], [`Protocol::Mv2pl`]) a read-only transaction reads
    /// the snapshot of its start: it takes no locks and never blocks or aborts a writer. It never
    /// aborts itself either, with one exception: a range scan of a table in which a delete
    /// committed after the snapshot fails with [`TxError::Conflict`] (and `run_read_only`
    /// retries it at a new snapshot), because the index it walks no longer holds the deleted row
    /// the snapshot still sees. Under [`Protocol::Mvto`] (and FIR) it takes a timestamp and may wait briefly
    /// for an older writer in flight. The single-version protocols keep no old versions: there a
    /// read-only transaction is validated (OCC family: it may abort and be retried, but never
    /// blocks a writer) or takes read locks (2PL, TO: writers of the rows it read wait or abort).
    /// docs/CC.md has the details.
    pub fn run_read_only<T>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, TxError>,
    ) -> Result<T, DbError> {
        self.cached_worker()?.run_read_only(f)
    }

    /// Begins an explicit read-write transaction on the thread's cached worker (see
    /// [`Transaction`]; not retried on conflicts). The worker is held until the transaction is
    /// committed, rolled back or dropped.
    pub fn begin(&self) -> Result<Transaction<'_>, DbError> {
        self.begin_with(false)
    }

    /// Begins an explicit read-only transaction (see [`Db::begin`]); a snapshot reader under the
    /// multi-version protocols (see [`Db::run_read_only`]).
    pub fn begin_read_only(&self) -> Result<Transaction<'_>, DbError> {
        self.begin_with(true)
    }

    fn begin_with(&self, read_only: bool) -> Result<Transaction<'_>, DbError> {
        let mut worker = self.cached_worker()?;
        worker.refresh_schemas();
        Ok(Transaction::start(
            Tx {
                held: Held::Owned(worker),
                doomed: None,
            },
            read_only,
        ))
    }

    /// Drops the engine workers that [`Db::run`] keeps idle between calls, freeing their slots
    /// (for tools that drive the engine's workers directly by slot).
    pub fn release_idle_workers(&self) {
        while let Some((slot, core)) = self.slots.steal_idle() {
            drop(core);
            self.slots.release(slot);
        }
    }

    /// Checks that indexes and storage agree; returns live rows per table.
    pub fn check_structure(&self) -> Result<Vec<u64>, String> {
        self.engine.check_structure()
    }
}

/// Where a database's worker slots are (issue 21): free, in use, or idle with a cached engine
/// worker. [`Db::run`] leaves its worker idle in its slot for the same thread's next call (the
/// thread remembers the slot in [`AFFINITY`]), so that a call costs what [`Worker::run`] does; a
/// thread that finds no free slot takes an idle worker over, and one that finds neither waits.
struct SlotPool {
    free: parking_lot::Mutex<Vec<usize>>,
    /// Signalled when a slot is freed or a worker left idle while threads wait.
    freed: parking_lot::Condvar,
    /// Threads waiting in `claim`: parking a worker idle notifies only when there are some, so
    /// that `Db::run` does not touch the shared `free` lock.
    waiters: std::sync::atomic::AtomicUsize,
    /// Per slot: the idle worker `Db::run` left there. Padded: each is its thread's. Its
    /// thread takes and parks it with one atomic swap each (a boxed core is one pointer, so the
    /// cell is lock-free): that is what makes `Db::run` about as cheap as [`Worker::run`].
    idle: Box<[crossbeam_utils::CachePadded<IdleCell>]>,
}

type IdleCell = crossbeam_utils::atomic::AtomicCell<Option<Box<WorkerCore>>>;

/// Longest sleep of a waiting thread between looks at the slots: bounds the cost of a
/// notification that raced with the thread starting to wait.
const SLOT_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(10);

impl SlotPool {
    fn new(slots: usize) -> SlotPool {
        SlotPool {
            free: parking_lot::Mutex::new((0..slots).rev().collect()),
            freed: parking_lot::Condvar::new(),
            waiters: std::sync::atomic::AtomicUsize::new(0),
            idle: (0..slots).map(|_| Default::default()).collect(),
        }
    }

    /// A free slot, or an idle slot with its worker, waiting up to `wait` for one.
    fn claim(&self, wait: std::time::Duration) -> Option<(usize, Option<Box<WorkerCore>>)> {
        use std::sync::atomic::Ordering::SeqCst;
        let start = std::time::Instant::now();
        let mut free = self.free.lock();
        loop {
            if let Some(slot) = free.pop() {
                return Some((slot, None));
            }
            if let Some((slot, core)) = self.steal_idle() {
                return Some((slot, Some(core)));
            }
            let left = wait.saturating_sub(start.elapsed());
            if left.is_zero() {
                return None;
            }
            self.waiters.fetch_add(1, SeqCst);
            // Looked at again after announcing the wait: a worker parked before the
            // announcement is found here, one parked after it notifies.
            let stolen = self.steal_idle();
            if stolen.is_none() {
                self.freed.wait_for(&mut free, left.min(SLOT_WAIT_SLICE));
            }
            self.waiters.fetch_sub(1, SeqCst);
            if let Some((slot, core)) = stolen {
                return Some((slot, Some(core)));
            }
        }
    }

    /// Some idle worker, taken out of its slot (which the caller now holds).
    fn steal_idle(&self) -> Option<(usize, Box<WorkerCore>)> {
        (self.idle.iter().enumerate()).find_map(|(slot, cell)| Some((slot, cell.take()?)))
    }

    /// The idle worker of `slot`, if it is still there.
    fn take_idle(&self, slot: usize) -> Option<Box<WorkerCore>> {
        self.idle.get(slot)?.take()
    }

    /// Leaves `core` idle in `slot` (still claimed) for its thread's next `Db::run`.
    fn park_idle(&self, slot: usize, core: Box<WorkerCore>) {
        self.idle[slot].store(Some(core));
        if self.waiters.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            let _free = self.free.lock();
            self.freed.notify_one();
        }
    }

    /// Frees `slot`.
    fn release(&self, slot: usize) {
        self.free.lock().push(slot);
        self.freed.notify_one();
    }
}

/// Identifies databases in [`AFFINITY`] (never reused, unlike addresses).
static NEXT_DB_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

thread_local! {
    /// The database (by id) and slot whose idle worker this thread's last [`Db::run`] left.
    static AFFINITY: std::cell::Cell<(u64, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// A thread's handle for running transactions.
pub struct Worker<'db> {
    db: &'db Db,
    slot: usize,
    /// Boxed, so that parking and taking it moves a pointer (see [`IdleCell`]); `None` only
    /// while the worker drops.
    core: Option<Box<WorkerCore>>,
    /// Taken for [`Db::run`] or [`Db::begin`]: on drop the worker stays in its slot, idle, for
    /// the next `Db::run` of this thread (see [`SlotPool`]), instead of freeing the slot.
    cached: bool,
    rng: u64,
}

/// What a worker keeps between transactions: the engine worker, the schemas, scratch buffers.
struct WorkerCore {
    inner: Box<dyn EngineWorker>,
    schemas: Vec<Schema>,
    /// Per table: its column offsets, shared by the rows this worker reads. Built per worker so
    /// that cloning one into a row touches a counter no other thread writes.
    layouts: Vec<Arc<RowLayout>>,
    buffers: TxBuffers,
}

impl WorkerCore {
    fn new(inner: Box<dyn EngineWorker>) -> WorkerCore {
        WorkerCore {
            inner,
            schemas: Vec::new(),
            layouts: Vec::new(),
            buffers: TxBuffers::default(),
        }
    }
}

/// Scratch space a worker lends each transaction, so that typed access encodes without
/// allocating per call.
#[derive(Default)]
struct TxBuffers {
    /// Encoded column values of an update or insert.
    row: Vec<u8>,
    /// The row read by [`Tx::get_ref`].
    read: Vec<u8>,
    /// Per updated column: (row offset, start in `row`, length).
    spans: Vec<(usize, usize, usize)>,
    /// The out-of-line values of the row read by [`Tx::get_ref`].
    large: Vec<(usize, Vec<u8>)>,
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        let Some(core) = self.core.take() else {
            return;
        };
        // A worker dropped by a panic may be inside a transaction: it is not kept.
        if self.cached && !std::thread::panicking() {
            self.db.slots.park_idle(self.slot, core);
        } else {
            // Drop the engine worker (which hands its state back) before freeing the slot.
            drop(core);
            self.db.slots.release(self.slot);
        }
    }
}

/// The result of one call of [`Worker::run`]: the value and the conflict aborts it took.
pub struct RunOutcome<T> {
    /// What the transaction returned.
    pub value: T,
    /// Conflict aborts before it committed.
    pub aborts: u32,
    /// Its commit tid.
    pub tid: u64,
}

impl<'db> Worker<'db> {
    fn new(db: &'db Db, slot: usize, core: Box<WorkerCore>, cached: bool) -> Worker<'db> {
        Worker {
            db,
            slot,
            core: Some(core),
            cached,
            // Backoff jitter seed, distinct per slot.
            rng: slot as u64 * 7919 + 1,
        }
    }

    /// The worker's slot (its thread id in transaction ids).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The worker's state (present until the worker drops).
    fn core(&mut self) -> &mut WorkerCore {
        self.core
            .as_deref_mut()
            .expect("a worker holds its core until it drops")
    }

    /// Picks up tables created since the worker last looked.
    fn refresh_schemas(&mut self) {
        let tables = (self.db.table_count).load(std::sync::atomic::Ordering::Acquire);
        if self.core().schemas.len() < tables {
            let catalog = self.db.engine.catalog();
            let core = self.core();
            core.schemas = catalog.tables;
            let schemas = &core.schemas;
            core.layouts = (schemas.iter())
                .map(|s| RowLayout::of(s, varlen::chunks_of(s, schemas)))
                .collect();
        }
    }

    /// Begins an explicit read-write transaction on this worker (see [`Transaction`]): for
    /// applications that cannot put the transaction in a closure. Not retried on conflicts.
    pub fn begin(&mut self) -> Transaction<'_> {
        self.begin_with(false)
    }

    /// Begins an explicit read-only transaction (writes fail with `TxError::ReadOnly`).
    pub fn begin_read_only(&mut self) -> Transaction<'_> {
        self.begin_with(true)
    }

    fn begin_with(&mut self, read_only: bool) -> Transaction<'_> {
        self.refresh_schemas();
        Transaction::start(
            Tx {
                held: Held::Borrowed(self.core()),
                doomed: None,
            },
            read_only,
        )
    }

    /// Runs `f` as a read-write transaction, retrying conflict aborts with randomised exponential
    /// backoff up to the configured limit ([`DbConfig::max_retries`]). Any other error aborts
    /// and is returned: the application's own through [`Tx::abort_with`].
    ///
    /// **The closure may run several times**: once per attempt, and only the last attempt's
    /// writes take effect. It must therefore have no side effects outside the transaction
    /// (sending a message, appending to a vector declared outside, incrementing a counter) other
    /// than ones that are harmless when repeated; compute such effects from the value `run`
    /// returns instead. Reads inside the closure see a consistent state for that attempt only.
    pub fn run<T>(
        &mut self,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, TxError>,
    ) -> Result<T, DbError> {
        self.run_counted(false, f).map(|o| o.value)
    }

    /// Runs `f` as a read-only transaction (writes fail with `TxError::ReadOnly`).
    pub fn run_read_only<T>(
        &mut self,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, TxError>,
    ) -> Result<T, DbError> {
        self.run_counted(true, f).map(|o| o.value)
    }

    /// As [`Worker::run`], also reporting the aborts it took and the commit tid. On a thread whose
    /// run asked it to stop ([`crate::cc::set_stop_flag`]), a conflict abort is not retried:
    /// the result is [`DbError::Interrupted`].
    pub fn run_counted<T>(
        &mut self,
        read_only: bool,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<T, TxError>,
    ) -> Result<RunOutcome<T>, DbError> {
        let max_retries = self.db.config.max_retries;
        let mut aborts = 0u32;
        loop {
            self.refresh_schemas();
            self.core().inner.begin(read_only);
            let mut tx = Tx {
                held: Held::Borrowed(self.core()),
                doomed: None,
            };
            // A closure that swallowed the error that ended the engine transaction (a conflict)
            // and returned Ok must not commit: the error is the attempt's result.
            let result = f(&mut tx).and_then(|v| match tx.doomed.take() {
                Some(e) => Err(e),
                None => tx.core().inner.commit().map(|tid| (v, tid)),
            });
            drop(tx);
            match result {
                Ok((value, tid)) => return Ok(RunOutcome { value, aborts, tid }),
                Err(e) => {
                    self.core().inner.abort();
                    self.stop_if_power_failed();
                    if !e.is_retryable() || aborts >= max_retries {
                        return Err(DbError::Tx(e));
                    }
                    aborts += 1;
                    if crate::cc::stop_requested() {
                        // Contention can keep a transaction aborting for longer than its run
                        // lasts: a stopping run must not wait for it (issue 22).
                        return Err(DbError::Interrupted { aborts });
                    }
                    self.backoff(aborts);
                }
            }
        }
    }

    /// Under the crash simulator, a worker whose transaction aborted after the simulated power
    /// failure stops here (unwinding with [`crate::pmem::SimulatedCrash`]), as it would at its
    /// next PM event: an engine whose concurrency control lives in DRAM (Zen's Met-Cache) can
    /// otherwise retry forever against a lock that a crashed thread held, without touching PM.
    fn stop_if_power_failed(&self) {
        if let Some(sim) = self.db.engine().pool().and_then(|p| p.crash_sim()) {
            if let Some(event) = sim.crashed_at() {
                std::panic::resume_unwind(Box::new(crate::pmem::SimulatedCrash { event }));
            }
        }
    }

    fn backoff(&mut self, aborts: u32) {
        // xorshift: a cheap per-worker random spin, growing with consecutive aborts.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let cap = 1u64 << aborts.min(10);
        for _ in 0..(self.rng % cap) * 16 {
            std::hint::spin_loop();
        }
        if aborts > 10 {
            std::thread::yield_now();
        }
    }
}

/// A transaction in progress: the argument of the closure given to `run`, and what a
/// [`Transaction`] dereferences to.
pub struct Tx<'w> {
    held: Held<'w>,
    /// The error that ended the engine transaction (a conflict, PM full...): later operations
    /// return it and commit refuses, instead of running outside a transaction.
    doomed: Option<TxError>,
}

/// The worker a transaction runs on: borrowed (`run`, [`Worker::begin`]) or owned
/// ([`Db::begin`], which takes the thread's cached worker and gives it back on drop).
enum Held<'w> {
    Borrowed(&'w mut WorkerCore),
    Owned(Worker<'w>),
}

/// A table's rows as [`Row`] and [`RowRef`] read them: where each column is, and the schema
/// (for access by name and type checks).
#[derive(Debug, PartialEq)]
struct RowLayout {
    /// Column `i` is `bounds[i]..bounds[i + 1]`.
    bounds: Box<[usize]>,
    schema: Schema,
    /// Some column's values may be stored out of line (see [`varlen`]).
    spills: bool,
    /// The table's chunk table of out-of-line values and its chunk size (`spills` only).
    chunks: Option<(TableId, usize)>,
}

impl RowLayout {
    fn of(schema: &Schema, chunks: Option<(TableId, usize)>) -> Arc<RowLayout> {
        let bounds = (0..schema.columns.len())
            .map(|i| schema.column_offset(i))
            .chain(std::iter::once(schema.row_size()))
            .collect();
        Arc::new(RowLayout {
            bounds,
            schema: schema.clone(),
            spills: schema.columns.iter().any(|c| c.ty.spills()),
            chunks,
        })
    }

    fn row_size(&self) -> usize {
        self.bounds.last().copied().unwrap_or(0)
    }

    /// Where column `i` is in a row (`i` must be a column): precomputed, where
    /// `Schema::column_offset` sums the sizes of the columns before it.
    #[inline]
    fn column(&self, i: usize) -> std::ops::Range<usize> {
        self.bounds[i]..self.bounds[i + 1]
    }
}

/// Most row buffers a thread keeps for reuse (see [`Row`]'s `Drop`).
const SPARE_ROW_BUFFERS: usize = 64;
/// Larger buffers are freed rather than kept.
const SPARE_ROW_BUFFER_MAX_BYTES: usize = 16 << 10;

thread_local! {
    /// Buffers of dropped rows, reused by the next reads on this thread: a transaction that reads
    /// rows allocates nothing once the thread has warmed up.
    static SPARE_ROWS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A zeroed buffer of `len` bytes, reusing a dropped row's when there is one.
fn row_buffer(len: usize) -> Vec<u8> {
    let spare = SPARE_ROWS
        .try_with(|spare| spare.borrow_mut().pop())
        .ok()
        .flatten();
    match spare {
        Some(mut bytes) => {
            bytes.clear();
            bytes.resize(len, 0);
            bytes
        }
        None => vec![0; len],
    }
}

/// A row read by a transaction, with typed accessors by column position.
///
/// Owns a copy of the row's bytes (taken consistently under the protocol). Dropped rows hand
/// their buffer back to a small per-thread pool, so reading rows costs no allocation in steady
/// state; [`Tx::get_ref`] avoids even that by lending the transaction's own buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    bytes: Vec<u8>,
    layout: Arc<RowLayout>,
    /// The out-of-line variable-length values read with the row, (column, whole value); empty
    /// (no allocation) for rows without any.
    large: Vec<(usize, Vec<u8>)>,
}

impl Drop for Row {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        if bytes.capacity() == 0 || bytes.capacity() > SPARE_ROW_BUFFER_MAX_BYTES {
            return;
        }
        // `try_with`: a row dropped while the thread exits just frees its buffer.
        let _ = SPARE_ROWS.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < SPARE_ROW_BUFFERS {
                spare.push(bytes);
            }
        });
    }
}

/// The checked getters, delegated from [`Row`] to its [`RowRef`].
macro_rules! checked_getters {
    () => {
        /// The position of the column called `name` (resolve it once, then use the fast
        /// getters by position).
        pub fn column(&self, name: &str) -> Result<usize, TxError> {
            self.as_ref().column(name)
        }
        /// Column `i` as u64; an error unless it is a `U64` column.
        pub fn try_u64(&self, i: usize) -> Result<u64, TxError> {
            self.as_ref().try_u64(i)
        }
        /// Column `i` as i64; an error unless it is an `I64` column.
        pub fn try_i64(&self, i: usize) -> Result<i64, TxError> {
            self.as_ref().try_i64(i)
        }
        /// Column `i` as f64; an error unless it is an `F64` column.
        pub fn try_f64(&self, i: usize) -> Result<f64, TxError> {
            self.as_ref().try_f64(i)
        }
        /// Column `i`'s bytes; an error if there is no column `i`.
        pub fn try_bytes_at(&self, i: usize) -> Result<&[u8], TxError> {
            self.as_ref().try_bytes_at(i)
        }
        /// The `U64` column called `name`.
        pub fn get_u64(&self, name: &str) -> Result<u64, TxError> {
            self.as_ref().get_u64(name)
        }
        /// The `I64` column called `name`.
        pub fn get_i64(&self, name: &str) -> Result<i64, TxError> {
            self.as_ref().get_i64(name)
        }
        /// The `F64` column called `name`.
        pub fn get_f64(&self, name: &str) -> Result<f64, TxError> {
            self.as_ref().get_f64(name)
        }
        /// The bytes of the column called `name` (a `Bytes(n)` column: all n bytes, zero-padded;
        /// a `VarBytes` or `Text` column: the value, at its length).
        pub fn get_bytes(&self, name: &str) -> Result<&[u8], TxError> {
            self.as_ref().get_bytes(name)
        }
        /// Column `i` as a string; an error unless it is a `Text` column holding UTF-8.
        pub fn try_str(&self, i: usize) -> Result<&str, TxError> {
            self.as_ref().try_str(i)
        }
        /// The `Text` column called `name`.
        pub fn get_str(&self, name: &str) -> Result<&str, TxError> {
            self.as_ref().get_str(name)
        }
    };
}

impl Row {
    /// A borrowed view with the same accessors.
    pub fn as_ref(&self) -> RowRef<'_> {
        RowRef {
            bytes: &self.bytes,
            layout: &self.layout,
            large: &self.large,
        }
    }
    /// The row's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// Column `i` as u64 (fast: checks the width only).
    ///
    /// # Panics
    /// If there is no column `i` or it is not 8 bytes wide; [`Row::try_u64`] and
    /// [`Row::get_u64`] return errors instead.
    pub fn u64(&self, i: usize) -> u64 {
        self.as_ref().u64(i)
    }
    /// Column `i` as i64 (fast: checks the width only).
    ///
    /// # Panics
    /// As [`Row::u64`]; [`Row::try_i64`] returns an error instead.
    pub fn i64(&self, i: usize) -> i64 {
        self.as_ref().i64(i)
    }
    /// Column `i` as f64 (fast: checks the width only).
    ///
    /// # Panics
    /// As [`Row::u64`]; [`Row::try_f64`] returns an error instead.
    pub fn f64(&self, i: usize) -> f64 {
        self.as_ref().f64(i)
    }
    /// Column `i`'s bytes as stored in the row (for a variable-length column: its length word
    /// and inline area; [`Row::try_bytes_at`] gives the value).
    ///
    /// # Panics
    /// If there is no column `i`; [`Row::try_bytes_at`] returns an error instead.
    pub fn bytes_at(&self, i: usize) -> &[u8] {
        self.as_ref().bytes_at(i)
    }
    checked_getters!();
}

/// A row borrowed from a transaction ([`Tx::get_ref`]) or from a [`Row`], with typed accessors
/// by column position (fast, panicking on a wrong column) and checked ones by position or name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowRef<'a> {
    bytes: &'a [u8],
    layout: &'a RowLayout,
    /// See [`Row`]'s field.
    large: &'a [(usize, Vec<u8>)],
}

impl<'a> RowRef<'a> {
    /// The row's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// Column `i`'s bytes as stored in the row (see [`Row::bytes_at`]).
    ///
    /// # Panics
    /// If there is no column `i`; [`RowRef::try_bytes_at`] returns an error instead.
    pub fn bytes_at(&self, i: usize) -> &'a [u8] {
        let b = &self.layout.bounds;
        &self.bytes[b[i]..b[i + 1]]
    }
    fn word(&self, i: usize) -> [u8; 8] {
        self.bytes_at(i).try_into().expect("column is 8 bytes")
    }
    /// Column `i` as u64 (fast: checks the width only).
    ///
    /// # Panics
    /// If there is no column `i` or it is not 8 bytes wide; [`RowRef::try_u64`] and
    /// [`RowRef::get_u64`] return errors instead.
    pub fn u64(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.word(i))
    }
    /// Column `i` as i64 (fast; panics as [`RowRef::u64`]).
    pub fn i64(&self, i: usize) -> i64 {
        i64::from_le_bytes(self.word(i))
    }
    /// Column `i` as f64 (fast; panics as [`RowRef::u64`]).
    pub fn f64(&self, i: usize) -> f64 {
        f64::from_le_bytes(self.word(i))
    }

    /// The position of the column called `name`.
    pub fn column(&self, name: &str) -> Result<usize, TxError> {
        let schema = &self.layout.schema;
        schema.column_index(name).ok_or_else(|| {
            TxError::SchemaMismatch(format!(
                "table {} has no column '{name}' (its columns: {})",
                schema.name,
                schema
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// Column `i`'s bytes, if it is of type `want` (any type when `None`).
    fn checked(&self, i: usize, want: Option<ColumnType>) -> Result<&'a [u8], TxError> {
        let schema = &self.layout.schema;
        let column = schema.columns.get(i).ok_or_else(|| {
            TxError::SchemaMismatch(format!(
                "table {} has {} columns, not a column {i}",
                schema.name,
                schema.columns.len()
            ))
        })?;
        if let Some(want) = want.filter(|&w| w != column.ty) {
            return Err(TxError::SchemaMismatch(format!(
                "column '{}' of table {} is {:?}, not {want:?}",
                column.name, schema.name, column.ty
            )));
        }
        let b = &self.layout.bounds;
        Ok(&self.bytes[b[i]..b[i + 1]])
    }

    fn checked_word(&self, i: usize, want: ColumnType) -> Result<[u8; 8], TxError> {
        let bytes = self.checked(i, Some(want))?;
        bytes
            .try_into()
            .map_err(|_| TxError::SchemaMismatch(format!("column {i} is not 8 bytes")))
    }

    /// Column `i` as u64; an error unless it is a `U64` column.
    pub fn try_u64(&self, i: usize) -> Result<u64, TxError> {
        self.checked_word(i, ColumnType::U64)
            .map(u64::from_le_bytes)
    }
    /// Column `i` as i64; an error unless it is an `I64` column.
    pub fn try_i64(&self, i: usize) -> Result<i64, TxError> {
        self.checked_word(i, ColumnType::I64)
            .map(i64::from_le_bytes)
    }
    /// Column `i` as f64; an error unless it is an `F64` column.
    pub fn try_f64(&self, i: usize) -> Result<f64, TxError> {
        self.checked_word(i, ColumnType::F64)
            .map(f64::from_le_bytes)
    }
    /// Column `i`'s bytes (a `VarBytes` or `Text` column: its value, at its length); an error
    /// if there is no column `i`.
    pub fn try_bytes_at(&self, i: usize) -> Result<&'a [u8], TxError> {
        let bytes = self.checked(i, None)?;
        if self.layout.schema.columns[i].ty.is_varlen() {
            return varlen::decode(self.layout, i, bytes, self.large);
        }
        Ok(bytes)
    }
    /// Column `i` as a string; an error unless it is a `Text` column holding UTF-8.
    pub fn try_str(&self, i: usize) -> Result<&'a str, TxError> {
        let bytes = self.checked(i, None)?;
        let column = &self.layout.schema.columns[i];
        if !matches!(column.ty, ColumnType::Text(_)) {
            return Err(TxError::SchemaMismatch(format!(
                "column '{}' of table {} is {:?}, not Text",
                column.name, self.layout.schema.name, column.ty
            )));
        }
        let value = varlen::decode(self.layout, i, bytes, self.large)?;
        std::str::from_utf8(value).map_err(|e| {
            TxError::Corrupt(format!(
                "column '{}' of table {} holds invalid UTF-8 ({e})",
                column.name, self.layout.schema.name
            ))
        })
    }
    /// The `Text` column called `name`.
    pub fn get_str(&self, name: &str) -> Result<&'a str, TxError> {
        self.try_str(self.column(name)?)
    }
    /// The `U64` column called `name`.
    pub fn get_u64(&self, name: &str) -> Result<u64, TxError> {
        self.try_u64(self.column(name)?)
    }
    /// The `I64` column called `name`.
    pub fn get_i64(&self, name: &str) -> Result<i64, TxError> {
        self.try_i64(self.column(name)?)
    }
    /// The `F64` column called `name`.
    pub fn get_f64(&self, name: &str) -> Result<f64, TxError> {
        self.try_f64(self.column(name)?)
    }
    /// The bytes of the column called `name` (a `Bytes(n)` column: all n bytes, zero-padded;
    /// a `VarBytes` or `Text` column: the value, at its length).
    pub fn get_bytes(&self, name: &str) -> Result<&'a [u8], TxError> {
        self.try_bytes_at(self.column(name)?)
    }
}

/// Encodes the (column, value) pairs of an update into `row` (cleared first), with one span per
/// value in `spans`: (offset in the stored row, start in `row`, size). Refuses a column the table
/// lacks and a value its column cannot hold, before anything is written.
fn encode_updates(
    layout: &RowLayout,
    values: &[(usize, Value<'_>)],
    row: &mut Vec<u8>,
    spans: &mut Vec<(usize, usize, usize)>,
) -> Result<(), TxError> {
    let schema = &layout.schema;
    row.clear();
    spans.clear();
    for (col, value) in values {
        if *col >= schema.columns.len() {
            return Err(TxError::SchemaMismatch(format!(
                "table {} has no column {col}",
                schema.name
            )));
        }
        let column = layout.column(*col);
        let start = row.len();
        row.resize(start + column.len(), 0);
        encode_value(schema, *col, value, &mut row[start..])?;
        spans.push((column.start, start, column.len()));
    }
    Ok(())
}

/// The engine writes of an update [`encode_updates`] encoded.
fn field_writes<'r>(
    row: &'r [u8],
    spans: &[(usize, usize, usize)],
) -> smallvec::SmallVec<[FieldWrite<'r>; 8]> {
    spans
        .iter()
        .map(|&(offset, start, size)| FieldWrite {
            offset,
            bytes: &row[start..start + size],
        })
        .collect()
}

/// Encodes `value` for column `i` of `schema` into `out` (which must hold the column).
fn encode_value(
    schema: &Schema,
    i: usize,
    value: &Value<'_>,
    out: &mut [u8],
) -> Result<(), TxError> {
    let column = schema.columns.get(i).ok_or_else(|| {
        TxError::SchemaMismatch(format!("table {} has no column {i}", schema.name))
    })?;
    let mismatch = || {
        TxError::SchemaMismatch(format!(
            "column '{}' of table {} is {:?}, the value is {value:?}",
            column.name, schema.name, column.ty
        ))
    };
    match (column.ty, value) {
        (ColumnType::U64, Value::U64(v)) => out.copy_from_slice(&v.to_le_bytes()),
        (ColumnType::I64, Value::I64(v)) => out.copy_from_slice(&v.to_le_bytes()),
        (ColumnType::F64, Value::F64(v)) => out.copy_from_slice(&v.to_le_bytes()),
        (ColumnType::Bytes(n), Value::Bytes(b)) => {
            if b.len() > n as usize {
                return Err(TxError::RowTooLarge(format!(
                    "{} bytes for column '{}' of table {}, which holds {n}",
                    b.len(),
                    column.name,
                    schema.name
                )));
            }
            out[..b.len()].copy_from_slice(b);
            out[b.len()..].fill(0);
        }
        (ty @ (ColumnType::VarBytes(_) | ColumnType::Text(_)), _) => {
            let bytes = varlen::value_bytes(ty, value).ok_or_else(mismatch)?;
            varlen::encode_slot(schema, column, bytes, out)?;
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// Whether the engine transaction is still open after `error` (the [`EngineWorker`] contract):
/// after any other error the transaction must be aborted, so a [`Tx`] refuses further operations.
fn leaves_transaction_open(error: &TxError) -> bool {
    matches!(
        error,
        TxError::NotFound { .. }
            | TxError::DuplicateKey { .. }
            | TxError::RowTooLarge(_)
            | TxError::SchemaMismatch(_)
    )
}

fn schema_of(schemas: &[Schema], table: TableId) -> Result<&Schema, TxError> {
    crate::engine::common::live_schema_in_tx(schemas.get(table as usize), table)
}

fn layout_of(layouts: &[Arc<RowLayout>], table: TableId) -> Result<&Arc<RowLayout>, TxError> {
    let layout = layouts.get(table as usize);
    crate::engine::common::live_schema_in_tx(layout.map(|l| &l.schema), table)?;
    Ok(layout.expect("checked"))
}

impl<'w> Tx<'w> {
    /// The worker state, whatever the transaction's error.
    fn core(&mut self) -> &mut WorkerCore {
        match &mut self.held {
            Held::Borrowed(core) => core,
            Held::Owned(worker) => worker.core(),
        }
    }

    /// The worker state, or the error that already ended the engine transaction: an operation
    /// after it would run outside any transaction (see [`leaves_transaction_open`]).
    fn live(&mut self) -> Result<&mut WorkerCore, TxError> {
        if let Some(e) = &self.doomed {
            return Err(e.clone());
        }
        Ok(self.core())
    }

    /// [`live`](Self::live), for an operation on `table`, which must be a live table (the raw
    /// operations reach the engine without a schema lookup otherwise).
    fn live_table(&mut self, table: TableId) -> Result<&mut WorkerCore, TxError> {
        let c = self.live()?;
        schema_of(&c.schemas, table)?;
        Ok(c)
    }

    /// Lets the engine turn a miss caused by a stale read into a conflict
    /// ([`EngineWorker::resolve_miss`](crate::engine::EngineWorker::resolve_miss)), and remembers
    /// an error that ended the engine transaction.
    fn settle<T>(&mut self, result: Result<T, TxError>) -> Result<T, TxError> {
        let e = match result {
            Ok(v) => return Ok(v),
            Err(e @ (TxError::NotFound { .. } | TxError::DuplicateKey { .. })) => {
                self.core().inner.resolve_miss(e)
            }
            Err(e) => e,
        };
        if !leaves_transaction_open(&e) {
            self.doomed = Some(e.clone());
        }
        Err(e)
    }

    /// Reads the row with `key`.
    pub fn get(&mut self, table: TableId, key: u64) -> Result<Row, TxError> {
        bytekey::check_u64_keys(&self.live()?.schemas, table)?;
        self.read_row(table, key)
    }

    fn read_row(&mut self, table: TableId, key: u64) -> Result<Row, TxError> {
        let c = self.live()?;
        let layout = layout_of(&c.layouts, table)?.clone();
        let mut row = Row {
            bytes: row_buffer(layout.row_size()),
            layout,
            large: Vec::new(),
        };
        let read = c.inner.read(table, key, &mut row.bytes);
        self.settle(read)?;
        if row.layout.spills {
            let layout = row.layout.clone();
            self.materialise(table, key, &row.bytes, &layout, &mut row.large)?;
        }
        Ok(row)
    }

    /// Reads the row with `key` into the transaction's own buffer and lends it: no allocation
    /// and no copy beyond the consistent read itself. The view lives until the next call on this
    /// transaction; use [`get`](Self::get) for a row to keep.
    pub fn get_ref(&mut self, table: TableId, key: u64) -> Result<RowRef<'_>, TxError> {
        bytekey::check_u64_keys(&self.live()?.schemas, table)?;
        self.read_row_ref(table, key)
    }

    fn read_row_ref(&mut self, table: TableId, key: u64) -> Result<RowRef<'_>, TxError> {
        let c = self.live()?;
        let size = layout_of(&c.layouts, table)?.row_size();
        let mut bytes = std::mem::take(&mut c.buffers.read);
        bytes.resize(size, 0);
        let read = c.inner.read(table, key, &mut bytes);
        c.buffers.read = bytes;
        self.settle(read)?;
        let c = self.core();
        let spills = layout_of(&c.layouts, table)?.spills;
        if spills {
            let layout = layout_of(&c.layouts, table)?.clone();
            let bytes = std::mem::take(&mut c.buffers.read);
            let mut large = std::mem::take(&mut c.buffers.large);
            let read = self.materialise(table, key, &bytes, &layout, &mut large);
            let c = self.core();
            (c.buffers.read, c.buffers.large) = (bytes, large);
            read?;
        }
        let c = self.core();
        Ok(RowRef {
            bytes: &c.buffers.read,
            layout: layout_of(&c.layouts, table)?,
            large: if spills {
                c.buffers.large.as_slice()
            } else {
                &[]
            },
        })
    }

    /// Reads the row with `key` into `out` (exactly the row size); no allocation.
    pub fn read_into(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError> {
        bytekey::check_u64_keys(&self.live_table(table)?.schemas, table)?;
        let read = self.live_table(table)?.inner.read(table, key, out);
        self.settle(read)
    }

    /// Hints that this transaction will read or write the rows with `keys` of `table` soon. A
    /// transaction that knows several keys up front (a New-Order's items, a YCSB batch) calls it
    /// first, so that the engine overlaps their cache misses instead of taking them one after
    /// another. Changes nothing and cannot fail: an unknown table or key is ignored.
    pub fn prefetch(&mut self, table: TableId, keys: &[u64]) {
        if let Ok(c) = self.live() {
            c.inner.prefetch(table, keys);
        }
    }

    /// Like [`prefetch`](Tx::prefetch), for rows this transaction will overwrite without reading
    /// them (blind [`update`](Tx::update)s of whole fields): the engine may skip loading the bytes
    /// it is about to replace.
    pub fn prefetch_for_overwrite(&mut self, table: TableId, keys: &[u64]) {
        if let Ok(c) = self.live() {
            c.inner.prefetch_for_overwrite(table, keys);
        }
    }

    /// Like [`prefetch`](Tx::prefetch), for rows this transaction will read and not write (a
    /// New-Order's items, a YCSB batch's reads): the engine may read them without caching them.
    /// Only a hint: writing such a row afterwards is still correct, only slower on some engines.
    pub fn prefetch_read_only(&mut self, table: TableId, keys: &[u64]) {
        if let Ok(c) = self.live() {
            c.inner.prefetch_read_only(table, keys);
        }
    }

    /// Whether a row with `key` exists.
    pub fn exists(&mut self, table: TableId, key: u64) -> Result<bool, TxError> {
        match self.get_ref(table, key) {
            Ok(_) => Ok(true),
            Err(TxError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sets some columns of the row with `key`: `(column position, value)` pairs.
    pub fn update(
        &mut self,
        table: TableId,
        key: u64,
        values: &[(usize, Value<'_>)],
    ) -> Result<(), TxError> {
        bytekey::check_u64_keys(&self.live()?.schemas, table)?;
        self.update_values(table, key, values)
    }

    fn update_values(
        &mut self,
        table: TableId,
        key: u64,
        values: &[(usize, Value<'_>)],
    ) -> Result<(), TxError> {
        let WorkerCore {
            inner,
            buffers: buf,
            layouts,
            ..
        } = self.live()?;
        let layout = layout_of(layouts, table)?;
        let schema = &layout.schema;
        // A column whose old value may have chunks needs the old row (see `varlen`).
        if layout.spills
            && values
                .iter()
                .any(|(c, _)| schema.columns.get(*c).is_some_and(|c| c.ty.spills()))
        {
            return self.update_varlen(table, key, values);
        }
        encode_updates(layout, values, &mut buf.row, &mut buf.spans)?;
        let writes = field_writes(&buf.row, &buf.spans);
        let result = inner.update(table, key, &writes);
        drop(writes);
        self.settle(result)
    }

    /// Replaces raw byte ranges of the row with `key` (for workloads that manage their own layout).
    pub fn update_bytes(
        &mut self,
        table: TableId,
        key: u64,
        writes: &[FieldWrite<'_>],
    ) -> Result<(), TxError> {
        let result = self.raw_writer(table)?.inner.update(table, key, writes);
        self.settle(result)
    }

    /// Inserts a row given one value per column.
    pub fn insert(
        &mut self,
        table: TableId,
        key: u64,
        values: &[Value<'_>],
    ) -> Result<(), TxError> {
        bytekey::check_u64_keys(&self.live()?.schemas, table)?;
        self.insert_values(table, key, values)
    }

    fn insert_values(
        &mut self,
        table: TableId,
        key: u64,
        values: &[Value<'_>],
    ) -> Result<(), TxError> {
        let WorkerCore {
            inner,
            buffers,
            layouts,
            ..
        } = self.live()?;
        let layout = layout_of(layouts, table)?;
        let (spills, schema) = (layout.spills, &layout.schema);
        if values.len() != schema.columns.len() {
            return Err(TxError::SchemaMismatch(format!(
                "table {} has {} columns, the insert gives {}",
                schema.name,
                schema.columns.len(),
                values.len()
            )));
        }
        let row = &mut buffers.row;
        row.clear();
        row.resize(layout.row_size(), 0);
        for (i, v) in values.iter().enumerate() {
            encode_value(schema, i, v, &mut row[layout.column(i)])?;
        }
        let result = inner.insert(table, key, row);
        self.settle(result)?;
        if spills {
            return self.insert_chunks(table, key, values);
        }
        Ok(())
    }

    /// Inserts a row given as raw bytes (exactly the row size).
    pub fn insert_bytes(&mut self, table: TableId, key: u64, row: &[u8]) -> Result<(), TxError> {
        let result = self.raw_writer(table)?.inner.insert(table, key, row);
        self.settle(result)
    }

    /// The worker for a raw write to `table`, resolved once: a live table with `u64` keys whose
    /// values never go out of line.
    fn raw_writer(&mut self, table: TableId) -> Result<&mut WorkerCore, TxError> {
        let c = self.live()?;
        bytekey::check_u64_keys(&c.schemas, table)?;
        varlen::refuse_raw_write(layout_of(&c.layouts, table)?)?;
        Ok(c)
    }

    /// Deletes the row with `key`.
    pub fn delete(&mut self, table: TableId, key: u64) -> Result<(), TxError> {
        let c = self.live()?;
        bytekey::check_u64_keys(&c.schemas, table)?;
        if layout_of(&c.layouts, table)?.spills {
            return self.delete_varlen(table, key);
        }
        let result = c.inner.delete(table, key);
        self.settle(result)
    }

    /// Rows with keys `>= from`, ascending, at most `limit` (needs an ordered primary index).
    /// [`Tx::range`] iterates a range with bounds instead.
    pub fn scan(
        &mut self,
        table: TableId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Row)>, TxError> {
        self.scan_dir(table, from, false, limit)
    }

    /// Rows with keys `<= from`, descending, at most `limit`.
    pub fn scan_rev(
        &mut self,
        table: TableId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Row)>, TxError> {
        self.scan_dir(table, from, true, limit)
    }

    fn scan_dir(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(u64, Row)>, TxError> {
        bytekey::check_u64_keys(&self.live()?.schemas, table)?;
        let c = self.live()?;
        let layout = layout_of(&c.layouts, table)?;
        let mut rows = Vec::new();
        let result = c.inner.scan(table, from, reverse, limit, &mut |k, r| {
            let mut bytes = row_buffer(0);
            bytes.extend_from_slice(r);
            rows.push((
                k,
                Row {
                    bytes,
                    layout: layout.clone(),
                    large: Vec::new(),
                },
            ));
            true
        });
        self.settle(result)?;
        for (key, row) in rows.iter_mut().filter(|(_, r)| r.layout.spills) {
            let layout = row.layout.clone();
            self.materialise(table, *key, &row.bytes, &layout, &mut row.large)?;
        }
        Ok(rows)
    }

    /// Visits rows with keys `>= from` (or `<= from` when `reverse`) until `f` returns false.
    pub fn scan_with(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), TxError> {
        bytekey::check_u64_keys(&self.live_table(table)?.schemas, table)?;
        let result = self
            .live_table(table)?
            .inner
            .scan(table, from, reverse, limit, f);
        self.settle(result)
    }

    /// Visits rows with keys `>= from` (or `<= from` when `reverse`), at most `limit`, as typed
    /// views, until `f` returns false: [`scan`](Self::scan) without copying each row into an
    /// owned [`Row`] (the views borrow the engine's consistent copy, valid during the call).
    pub fn scan_refs(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        f: &mut dyn FnMut(u64, RowRef<'_>) -> bool,
    ) -> Result<(), TxError> {
        let c = self.live()?;
        bytekey::check_u64_keys(&c.schemas, table)?;
        let WorkerCore { inner, layouts, .. } = c;
        let layout = layout_of(layouts, table)?;
        if layout.spills {
            // Out-of-line values are read after the scan: views of owned rows.
            for (key, row) in self.scan_dir(table, from, reverse, limit)? {
                if !f(key, row.as_ref()) {
                    break;
                }
            }
            return Ok(());
        }
        let result = inner.scan(table, from, reverse, limit, &mut |key, bytes| {
            f(
                key,
                RowRef {
                    bytes,
                    layout,
                    large: &[],
                },
            )
        });
        self.settle(result)
    }

    /// Primary keys whose secondary index `index` maps `values` (one per indexed column); callers
    /// re-check the rows, since distinct values can share a secondary key.
    pub fn lookup_secondary(
        &mut self,
        table: TableId,
        index: usize,
        values: &[Value<'_>],
    ) -> Result<Vec<u64>, TxError> {
        let WorkerCore { inner, schemas, .. } = self.live()?;
        let schema = schema_of(schemas, table)?;
        let def = schema.secondary.get(index).ok_or_else(|| {
            TxError::SchemaMismatch(format!(
                "table {} has no secondary index {index}",
                schema.name
            ))
        })?;
        if def.columns.len() != values.len() {
            return Err(TxError::SchemaMismatch(format!(
                "secondary index '{}' has {} columns",
                def.name,
                def.columns.len()
            )));
        }
        let mut parts = Vec::new();
        for (&c, v) in def.columns.iter().zip(values) {
            let mut b = vec![0u8; schema.columns[c].ty.size()];
            encode_value(schema, c, v, &mut b)?;
            parts.push(b);
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let mut out = Vec::new();
        let result =
            inner.lookup_secondary(table, index, crate::index::secondary_key(&refs), &mut out);
        self.settle(result)?;
        Ok(out)
    }

    /// Aborts the transaction: `run` returns `TxError::UserAbort` without retrying.
    pub fn abort<T>(&mut self) -> Result<T, TxError> {
        Err(TxError::UserAbort)
    }

    /// Aborts the transaction with the application's own error: `run` returns
    /// `DbError::Tx(TxError::Abort(..))` without retrying, and [`DbError::app_error`] gives the
    /// error back by its type.
    ///
    /// ```
    /// use pmtx::prelude::*;
    ///
    /// #[derive(Debug, PartialEq)]
    /// struct Insufficient { balance: i64 }
    /// impl std::fmt::Display for Insufficient {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         write!(f, "balance {} is too low", self.balance)
    ///     }
    /// }
    /// impl std::error::Error for Insufficient {}
    ///
    /// let db = Db::create(DbConfig::temporary().pool_size(16 << 20).max_threads(1))?;
    /// let t = db.create_table(Schema::new("accounts", &[("balance", ColumnType::I64)]))?;
    /// db.run(|tx| tx.insert(t, 1, &[Value::I64(5)]))?;
    /// let err = db
    ///     .run(|tx| {
    ///         let balance = tx.get(t, 1)?.i64(0);
    ///         if balance < 10 {
    ///             return tx.abort_with(Insufficient { balance });
    ///         }
    ///         tx.update(t, 1, &[(0, Value::I64(balance - 10))])
    ///     })
    ///     .unwrap_err();
    /// assert_eq!(err.app_error::<Insufficient>(), Some(&Insufficient { balance: 5 }));
    /// # Ok::<(), DbError>(())
    /// ```
    pub fn abort_with<T, E>(&mut self, error: E) -> Result<T, TxError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Err(TxError::app(error))
    }
}

/// A transaction begun explicitly ([`Db::begin`], [`Worker::begin`]), for applications that
/// cannot put a transaction in a closure: every operation of [`Tx`] (through `Deref`), then
/// [`commit`](Transaction::commit) or [`rollback`](Transaction::rollback). Dropping it without
/// committing rolls it back.
///
/// Unlike [`Worker::run`], nothing is retried: a conflict surfaces as
/// `TxError::Conflict` (from an operation or from `commit`), after which the transaction is over
/// (later operations return the same error) and the application begins a new one if it wants
/// to try again ([`TxError::is_retryable`] tells).
///
/// ```
/// use pmtx::prelude::*;
///
/// let db = Db::create(DbConfig::temporary().pool_size(16 << 20).max_threads(1))?;
/// let t = db.create_table(Schema::new("kv", &[("v", ColumnType::U64)]))?;
/// let mut txn = db.begin()?;
/// txn.insert(t, 1, &[Value::U64(7)])?;
/// txn.commit()?;
///
/// let mut txn = db.begin()?;
/// txn.update(t, 1, &[(0, Value::U64(8))])?;
/// txn.rollback(); // or just drop it
/// assert_eq!(db.run(|tx| Ok(tx.get(t, 1)?.u64(0)))?, 7);
/// # Ok::<(), DbError>(())
/// ```
pub struct Transaction<'w> {
    tx: Tx<'w>,
    /// Begun in the engine and neither committed nor rolled back.
    open: bool,
}

impl<'w> Transaction<'w> {
    fn start(mut tx: Tx<'w>, read_only: bool) -> Transaction<'w> {
        tx.core().inner.begin(read_only);
        Transaction { tx, open: true }
    }

    /// Commits, returning the commit's transaction id. On an error nothing of the transaction
    /// took effect; `TxError::Conflict` means that trying again (a new transaction) may succeed.
    pub fn commit(mut self) -> Result<u64, DbError> {
        self.open = false;
        let result = match self.tx.doomed.take() {
            Some(e) => Err(e),
            None => self.tx.core().inner.commit(),
        };
        result.map_err(|e| {
            self.tx.core().inner.abort();
            DbError::Tx(e)
        })
    }

    /// Discards every write of the transaction.
    pub fn rollback(mut self) {
        self.open = false;
        self.tx.core().inner.abort();
    }
}

impl<'w> std::ops::Deref for Transaction<'w> {
    type Target = Tx<'w>;
    fn deref(&self) -> &Tx<'w> {
        &self.tx
    }
}

impl<'w> std::ops::DerefMut for Transaction<'w> {
    fn deref_mut(&mut self) -> &mut Tx<'w> {
        &mut self.tx
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.open {
            self.tx.core().inner.abort();
        }
    }
}

/// Whether `path` names an existing pool file.
pub fn pool_exists(path: &Path) -> bool {
    path.is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slots_idle_cell_is_lock_free() {
        // Otherwise crossbeam falls back to a global lock table, and `Db::run` pays for it.
        assert!(IdleCell::is_lock_free());
    }
}
