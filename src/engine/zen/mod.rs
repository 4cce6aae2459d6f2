//! The Zen engine (Liu et al., VLDB 2021, §3): a **Met-Cache** of tuples with their
//! concurrency-control metadata in DRAM, **log-free persistent transactions** (new versions are
//! written out of place to free NVM-tuple slots and the *last persisted* (LP) bit of the last one
//! is the commit mark, Algorithm 1), **lightweight NVM space management** (per-thread allocators,
//! free lists and garbage queues in DRAM; the page table is the only persisted allocation
//! metadata) and **one-pass parallel recovery** (Algorithm 2).
//!
//! Files: `layout.rs` (NVM layout), `cache.rs` (Met-Cache, CLOCK, knapsack split), `worker.rs`
//! (execution in the Met-Cache, garbage collection), `commit.rs` (the commit's steps in order,
//! Persist with Algorithm 1), `recovery.rs` (Algorithm 2 and the structure check).
//!
//! **Departures from the paper, and why** (also in `docs/ZEN.md`):
//! - *Recovery regions are per thread slot.* Every NVM-tuple page belongs to one thread slot
//!   (its page-table owner) and a thread writes new versions only into its own pages, so all
//!   tuples of a transaction lie in one region and per-region Tx-CTS order is commit order, which
//!   Algorithm 2's correctness argument needs. A superseded version in another thread's region
//!   is zeroed by the thread that superseded it and then handed to the owner's free list through a
//!   small per-thread inbox, rather than waiting for the owner to evict a copied entry (§3.3.1,
//!   "Maintenance"): that rule alone would let a thread reuse a slot in a region it does not own.
//! - *An idle region is adopted.* The superseded versions of a region whose worker is gone (a
//!   loader thread, a pool reopened with fewer threads) pile up in its inbox, and the rule above
//!   lets nobody else reuse them, so the running threads would take new pages while that space
//!   stays stranded. A worker that had to take a new page and finds an idle region with at least
//!   `ADOPT_FREED_SLOTS` freed slots waiting swaps its whole thread state (allocators, garbage
//!   queues, last tid, Met-Cache region) for that region's between two transactions and carries
//!   on as its thread (`ZenWorker::adopt_idle_region`); a new worker takes its own slot's state,
//!   or any free one if its own was adopted. A region still has one writer at a time and keeps
//!   its last tid, so its Tx-CTS order is still commit order, and its slots are still reused
//!   only by its own writer.
//! - *Deletes are tombstones* (a new version with the deleted bit). Algorithm 2 frees deleted
//!   tuples without consulting the index, which would let an older, not yet overwritten version of
//!   the key win after a crash; pmtx lets tombstones take part in "newest Tx-CTS wins" and drops
//!   the key afterwards.
//! - *Slot reuse rules.* A superseded version is reclaimed once its superseding commit is older
//!   than every running transaction (§3.3.1), and its header word is then zeroed (one 8-byte store,
//!   plus a `clwb` under ADR ordered by the next commit's fence) so that a free slot never looks
//!   like a committed version. A tombstone is reclaimed only after every thread has durably zeroed
//!   all versions superseded up to its commit (a per-thread watermark), so no older version can
//!   resurface. The LP tuple of a thread's latest commit is never zeroed: it is the evidence that
//!   the region's earlier tuples committed (reclaiming it would make Algorithm 2 discard them).
//!   The paper persists nothing on free; this costs one store per superseded version.
//! - *ADR acknowledgement.* Algorithm 1 ends with an un-fenced `clwb` and relies on a later fence.
//!   Under ADR pmtx issues that fence before `commit` returns (a commit must be durable when it
//!   is acknowledged); under eADR it does not.
//! - *Writes are buffered* in transaction-private data (the engine contract) and applied to the
//!   Met-Cache at commit, so entries are never dirty; a write to an entry of another region makes
//!   the copy in the writer's region at commit (the original gets the copy bit).
//! - *Blind overwrites skip the fetch (§3.3.1).* The paper brings every accessed NVM-tuple into
//!   the Met-Cache. An update that replaces a whole uncached row, under OCC or Silo, in a table
//!   without secondary indexes, takes an entry only at commit: published locked, with the
//!   NVM-tuple's header but not its row, which commit then stores (a rollback loads the old row
//!   before unlocking). Readers of these protocols wait on a locked entry, so none sees the
//!   unloaded row; the 1 KB rows of YCSB's blind updates are no longer read from NVM and copied
//!   twice for nothing (issue 13).
//! - *Blind overwrites write around the Met-Cache (§3.3.1).* The paper installs every new
//!   version in the cache; the entry of a blind overwrite is here only its write lock: commit
//!   points the index at the new NVM-tuple, supersedes the entry and keeps it for this worker's
//!   next claim (`ZenWorker::lock_entries`), so such an overwrite evicts no cached row and
//!   copies the row once, to NVM (issue 13). Rows that are read are still cached.
//! - *Reads of uncached rows are admitted one in eight (§3.3.1).* Under OCC or Silo, a read of a
//!   row not in the Met-Cache that the transaction will not write (a read-only transaction, or a
//!   key declared with `prefetch_read_only`) reads its NVM-tuple in place (`read_uncached`); every eighth such
//!   read loads the row into the cache, so rows read often are still cached. Validation
//!   requires the key to still lead to that version, through the index or an unlocked entry
//!   loaded from it (issue 13: uniform reads over a table larger than the cache paid a CLOCK
//!   claim, an eviction and two 1 KB copies per read).
//! - *Long-running transactions (§3.3.4).* Detected when a region has to grow past its budget
//!   because every entry is pinned, or a garbage queue passes a threshold; the transaction with
//!   the largest footprint gets G-EX, the others abort (retryably) at their next operation and
//!   wait in `begin`, and it waits for them to finish before going on. Departure: the region
//!   keeps growing past its budget for the long transaction (up to a hard limit, then `PmFull`)
//!   instead of running out, and the wait for the others is bounded (exclusivity is a
//!   performance mode here: correctness never depends on it, the protocol still runs).
//! - Protocols (§3.3.2, §4.4): every protocol of the CC layer, with its per-tuple metadata in
//!   the Met-Cache entry's CC-Meta word and Tx-CTS and its per-transaction context in the worker
//!   (`txcc.rs`); old versions of the multi-version protocols in a DRAM version store per table,
//!   keyed by primary key. Of Zen's ten methods only Cicada is missing (no engine has it yet).
//! - *Dropping a table* (issue 21; the paper has no drop): the LP evidence of a region's latest
//!   commit may lie in the dropped table's pages, so before they are freed each region's latest
//!   commit tid is persisted as a commit watermark in the meta page, where Algorithm 2's
//!   `ts-commit` then starts instead of at 0 (`drop.rs`).

mod cache;
mod commit;
mod drop;
pub mod layout;
mod recovery;
mod txcc;
mod worker;

pub use cache::{split_budget, TableDemand};

use crate::alloc::PageManager;
use crate::catalog::{Catalog, CatalogStore, Schema, TableId};
use crate::cc::{CcOptions, CcShared, Protocol, TidClock, VersionStore, MAX_THREADS};
use crate::engine::{DbError, Engine, EngineKind, EngineWorker, RecoveryReport};
use crate::index::{PrimaryIndex, PrimaryIndexKind, SecondaryIndex};
use crate::pmem::{PersistenceDomain, Pool};
use cache::MetCache;
use crossbeam_utils::CachePadded;
use layout::{kind, meta, tuple};
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A deliberate bug, for showing that the crash-consistency harness catches it (test-only: no
/// production configuration sets one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ZenFault {
    /// Algorithm 1 without the `sfence` before the LP bit: LP can be durable before the tuples.
    SkipFence,
    /// Algorithm 1 without the `clwb` of the tuples: the fence orders nothing.
    SkipTupleFlush,
    /// No fence before `commit` returns under ADR: an acknowledged commit can be lost.
    SkipCommitFence,
    /// A table drop frees the table's pages without first persisting the regions' commit
    /// watermarks (`drop.rs`): a region whose latest LP tuple was in the dropped table loses the
    /// evidence that its later tuples of other tables committed.
    DropSkipWatermark,
}

impl ZenFault {
    /// Every fault.
    pub const ALL: [ZenFault; 4] = [
        ZenFault::SkipFence,
        ZenFault::SkipTupleFlush,
        ZenFault::SkipCommitFence,
        ZenFault::DropSkipWatermark,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ZenFault::SkipFence => "skip-fence",
            ZenFault::SkipTupleFlush => "skip-tuple-flush",
            ZenFault::SkipCommitFence => "skip-commit-fence",
            ZenFault::DropSkipWatermark => "zen-drop-skip-watermark",
        }
    }

    /// What the fault breaks.
    pub fn describe(self) -> &'static str {
        match self {
            ZenFault::SkipFence => "no sfence between the tuple clwbs and the LP bit",
            ZenFault::SkipTupleFlush => "the new tuples are not flushed before the LP bit",
            ZenFault::SkipCommitFence => "commit returns before the LP bit is durable (ADR)",
            ZenFault::DropSkipWatermark => {
                "a table drop frees its pages before persisting the regions' commit watermarks"
            }
        }
    }
}

impl std::fmt::Display for ZenFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ZenFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::engine::common::parse_named(s, &ZenFault::ALL, ZenFault::name, "zen fault")
    }
}

/// Parameters of a Zen database.
#[derive(Clone, Debug)]
pub struct ZenConfig {
    /// Concurrency control (any of [`Protocol::ALL`], §3.3.2).
    pub protocol: Protocol,
    /// Worker slots (threads, and NVM/Met-Cache regions), at most 256.
    pub max_threads: usize,
    /// Largest row, in bytes.
    pub max_row_bytes: usize,
    /// P = NVM size / DRAM cache budget (§4.1: 4, 8 or 16); the NVM size is the tables' heap
    /// bytes (live rows × slot size), so the budget follows the database as it grows.
    pub cache_ratio: f64,
    /// A fixed DRAM budget in bytes for all Met-Caches (overrides `cache_ratio`).
    pub cache_bytes: Option<u64>,
    /// C_min: entries every table gets whatever the split (§3.2).
    pub cache_min_entries: usize,
    /// A deliberate ordering bug for the crash-consistency harness (never set in production).
    pub fault: Option<ZenFault>,
    /// Options of the concurrency-control protocols (waiting, H-Store partitions).
    pub cc_options: CcOptions,
}

impl ZenConfig {
    /// Defaults: 16 threads, rows up to 4 KiB, P = 4, 1,024 entries minimum per table.
    pub fn new(protocol: Protocol) -> ZenConfig {
        ZenConfig {
            protocol,
            max_threads: 16,
            max_row_bytes: 4096,
            cache_ratio: 4.0,
            cache_bytes: None,
            cache_min_entries: 1024,
            fault: None,
            cc_options: CcOptions::default(),
        }
    }
}

/// Garbage-queue length beyond which a thread reports a long-running transaction (§3.3.4: "the
/// NVM space is about to be used up"): old versions that cannot be reclaimed while it runs.
const GARBAGE_THRESHOLD: usize = 1 << 16;

/// Commits between two re-runs of the knapsack split by one thread.
const REBALANCE_EVERY: u64 = 256;

/// A table at run time: schema, slot geometry, DRAM indexes and its Met-Cache.
pub(crate) struct TableRt {
    pub id: TableId,
    pub schema: Schema,
    pub row: usize,
    pub slot: u64,
    pub index: PrimaryIndex,
    pub secondary: Vec<SecondaryIndex>,
    pub cache: MetCache,
    /// Tuples accessed (f_i numerator), summed from the workers now and then.
    pub accesses: AtomicU64,
    /// Old versions for the multi-version protocols, keyed by primary key (DRAM only).
    pub versions: VersionStore,
    /// The largest tid of a committed delete: an insert commits above it, so that an insert
    /// of a key deleted by another thread outranks the tombstone in recovery's "newest Tx-CTS
    /// wins" (Algorithm 2), whatever the protocol's tids.
    pub deleted_up_to: AtomicU64,
    /// The largest tid of a TO or MVTO transaction that scanned this table: an older
    /// transaction's insert published after that scan would be a row the younger scan missed
    /// though the timestamp order puts it first, so it fails at commit (as Falcon's
    /// `TableRt::scanned_up_to`; conservative: the whole table, not the range).
    pub scanned_up_to: AtomicU64,
}

impl TableRt {
    fn new(id: TableId, schema: Schema, config: &ZenConfig) -> TableRt {
        let row = schema.row_size();
        let index = match schema.primary_index {
            PrimaryIndexKind::Hash => PrimaryIndex::Hash(crate::index::HashIndex::new()),
            PrimaryIndexKind::Ordered => PrimaryIndex::Ordered(crate::index::OrderedIndex::new()),
        };
        let secondary = schema
            .secondary
            .iter()
            .map(|_| SecondaryIndex::new())
            .collect();
        let threads = config.max_threads;
        let entry = row as u64 + cache::ENTRY_OVERHEAD;
        let per_region_min = config.cache_min_entries.div_ceil(threads).max(16);
        // The hard limit per region, reached only when every entry is pinned (a long-running
        // transaction, e.g. a bulk load in one transaction): at least 1 Mi entries or the whole
        // budget. Chunks are allocated lazily, so a high limit costs only its pointer array.
        let hard = (config.cache_bytes.unwrap_or(0) / entry).max(1 << 20);
        let cache = MetCache::new(
            row,
            threads,
            per_region_min,
            (hard as usize).max(per_region_min * 4),
        );
        TableRt {
            id,
            row,
            slot: tuple::slot_size(row),
            index,
            secondary,
            cache,
            accesses: AtomicU64::new(0),
            versions: VersionStore::new(),
            deleted_up_to: AtomicU64::new(0),
            scanned_up_to: AtomicU64::new(0),
            schema,
        }
    }

    /// The secondary key of `row` for index `i`.
    pub fn secondary_key(&self, i: usize, row: &[u8]) -> u64 {
        let parts: Vec<&[u8]> = self.schema.secondary[i]
            .columns
            .iter()
            .map(|&c| {
                let at = self.schema.column_offset(c);
                &row[at..at + self.schema.columns[c].ty.size()]
            })
            .collect();
        crate::index::secondary_key(&parts)
    }
}

/// A superseded NVM-tuple (or a tombstone) waiting to be reclaimed, with the commit tid that
/// made it garbage.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Garbage {
    pub table: TableId,
    pub slot: u64,
    pub tid: u64,
    /// The slot may be reused once every running transaction began after this timestamp: the
    /// superseding commit's timestamp, or the clock at its install when that is later (TO, Silo
    /// and TicToc commit tids need not follow the clock).
    pub reuse: u64,
    /// The slot's NVM header word (LP, DELETED, Tx-CTS) as the version was persisted, kept in
    /// DRAM so that reclamation need not read the cold NVM line to apply the LP-evidence rule;
    /// 0 when not known (recovery), and then read from NVM. A slot's header word does not change
    /// between the commit that persisted it and its reclamation.
    pub header: u64,
}

/// Slots freed into a region by other threads: (table, slot).
pub(crate) type FreedSlots = Vec<(TableId, u64)>;

/// A thread's NVM-tuple allocator for one table (DRAM only; rebuilt by recovery).
#[derive(Default)]
pub(crate) struct TableAlloc {
    pub bump: u64,
    pub end: u64,
    pub free: Vec<u64>,
    /// The CLOCK hand of this thread's Met-Cache region.
    pub hand: usize,
}

/// A thread slot's state (its NVM-tuple managers and garbage queues), handed to the worker that
/// claims the slot.
#[derive(Default)]
pub(crate) struct ThreadState {
    pub tables: Vec<TableAlloc>,
    /// Superseded versions, in tid order.
    pub garbage: VecDeque<Garbage>,
    /// Tombstones, in tid order.
    pub tombs: VecDeque<Garbage>,
    /// Garbage that must wait: the LP evidence of its region's latest commit.
    pub deferred: Vec<Garbage>,
    pub last_tid: u64,
    pub commits: u64,
}

/// The Zen engine, shared by its workers.
pub struct ZenEngine {
    pub(crate) domain: PersistenceDomain,
    pub(crate) protocol: Protocol,
    pub(crate) pool: Arc<Pool>,
    pub(crate) pages: PageManager,
    pub(crate) config: ZenConfig,
    /// ADR-like domain: flushes and fences are needed for durability.
    pub(crate) flushing: bool,
    /// The meta page (its per-region commit watermarks, `drop.rs`).
    meta_page: u64,
    catalog_store: CatalogStore,
    catalog: Mutex<Catalog>,
    pub(crate) tables: RwLock<Vec<Arc<TableRt>>>,
    pub(crate) clock: TidClock,
    /// Per thread: start timestamp of its running transaction, or `u64::MAX`.
    pub(crate) active: Box<[CachePadded<AtomicU64>]>,
    /// The protocols' shared context (waits-for, partitions, epoch, snapshot clock).
    pub(crate) cc: CcShared,
    /// Per thread: the snapshot its running multi-version transaction reads at, or `u64::MAX`
    /// (bounds version-chain pruning).
    pub(crate) snap_active: Box<[CachePadded<AtomicU64>]>,
    /// Per region: the tid of its thread's latest durable commit (whose LP tuple must stay).
    pub(crate) region_commit: Box<[CachePadded<AtomicU64>]>,
    /// Per thread: every version it superseded with a tid below this is durably zeroed.
    pub(crate) gc_done: Box<[CachePadded<AtomicU64>]>,
    /// Per region: free slots handed over by other threads (table, slot).
    pub(crate) inbox: Box<[Mutex<FreedSlots>]>,
    pub(crate) threads: Box<[Mutex<Option<ThreadState>>]>,
    /// Serialises the hand-over of thread states between workers (a new worker's claim, and the
    /// adoption of an idle region), so that a worker never finds every state taken while one is
    /// only changing hands.
    pub(crate) handover: Mutex<()>,
    pub(crate) last_commit: crate::engine::common::LastCommits,
    pub(crate) txns: AtomicU64,
    /// Workers alive: the cache budget is split over the regions of threads that process
    /// transactions (§3.2), not over every configured slot.
    pub(crate) workers: std::sync::atomic::AtomicUsize,
    /// G-EX (§3.3.4): 0, or 1 + the thread whose long-running transaction runs exclusively.
    pub(crate) exclusive: std::sync::atomic::AtomicUsize,
    /// Per thread: tuples its running transaction has accessed (to pick the long one).
    pub(crate) footprint: Box<[CachePadded<AtomicU64>]>,
    /// Times the exclusive mode was entered.
    pub(crate) exclusive_runs: AtomicU64,
    report: Option<RecoveryReport>,
}

/// Protocols Zen runs over the Met-Cache's CC-Meta word (§3.3.2, §4.4): every protocol of the CC
/// layer. Of Zen's ten, Cicada is the one pmtx does not implement (no engine has it yet).
pub const SUPPORTED_PROTOCOLS: [Protocol; 12] = Protocol::ALL;

impl ZenEngine {
    fn validate(config: &ZenConfig) -> Result<(), DbError> {
        if !EngineKind::Zen.supports(config.protocol) {
            return Err(DbError::UnsupportedProtocol {
                engine: EngineKind::Zen,
                protocol: config.protocol,
            });
        }
        if config.max_threads == 0 || config.max_threads > MAX_THREADS {
            return Err(DbError::Config(format!(
                "max_threads must be 1 to {MAX_THREADS}"
            )));
        }
        if config.max_row_bytes == 0
            || tuple::slot_size(config.max_row_bytes) > crate::alloc::PAGE_SIZE
        {
            return Err(DbError::Config(
                "max_row_bytes must be between 1 byte and a 2 MiB page".into(),
            ));
        }
        if !(config.cache_ratio.is_finite() && config.cache_ratio >= 1.0) {
            return Err(DbError::Config(format!(
                "cache_ratio (P = NVM size / DRAM budget) must be a number >= 1, not {}",
                config.cache_ratio
            )));
        }
        crate::engine::common::check_partitions(config.cc_options.partitions)?;
        if config.cache_min_entries == 0 {
            return Err(DbError::Config(
                "cache_min_entries must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Formats a fresh pool for Zen.
    pub fn create(pool: Arc<Pool>, config: ZenConfig) -> Result<Arc<ZenEngine>, DbError> {
        Self::validate(&config)?;
        crate::engine::common::require_durable_domain(EngineKind::Zen, pool.domain())?;
        let (pages, meta_page) = crate::engine::meta::format(
            &pool,
            &meta_layout(&[
                (meta::F_VERSION, meta::VERSION),
                (meta::F_MAX_THREADS, config.max_threads as u64),
                (meta::F_MAX_ROW, config.max_row_bytes as u64),
                (meta::F_CATALOG_SLOT, meta::CATALOG_SLOT_BYTES),
            ]),
        )?;
        Ok(Arc::new(Self::assemble(
            pool,
            pages,
            meta_page,
            config,
            Catalog::default(),
        )))
    }

    /// Opens a Zen pool, running recovery (Algorithm 2). The row limit comes from the pool; the
    /// thread count is at least the pool's (each thread slot is a region).
    pub fn open(pool: Arc<Pool>, mut config: ZenConfig) -> Result<Arc<ZenEngine>, DbError> {
        crate::engine::common::require_durable_domain(EngineKind::Zen, pool.domain())?;
        let meta_page = crate::engine::meta::open(
            &pool,
            &meta_layout(&[(meta::F_VERSION, meta::VERSION)]),
            "Zen",
        )?;
        let pages = PageManager::open(&pool)?;
        let r = |f: u64| pool.read_u64(meta_page + f);
        config.max_threads = config.max_threads.max(r(meta::F_MAX_THREADS) as usize);
        config.max_row_bytes = r(meta::F_MAX_ROW) as usize;
        Self::validate(&config)?;
        let catalog_store = CatalogStore {
            base: meta_page + meta::CATALOG_AT,
            slot_bytes: meta::CATALOG_SLOT_BYTES,
        };
        crate::engine::meta::check_catalog_slot(r(meta::F_CATALOG_SLOT), meta::CATALOG_SLOT_BYTES)?;
        let catalog = catalog_store.load(&pool)?;
        catalog.validate(config.max_row_bytes).map_err(|e| {
            DbError::Corrupt(format!(
                "the catalog does not fit the meta page's row size limit: {e}"
            ))
        })?;
        let mut engine = Self::assemble(pool, pages, meta_page, config, catalog);
        let (report, floor) = recovery::recover(&mut engine)?;
        engine.clock = TidClock::new(floor);
        engine.cc.snapshots.raise_to(floor);
        engine.report = Some(report);
        engine.rebalance();
        Ok(Arc::new(engine))
    }

    fn assemble(
        pool: Arc<Pool>,
        pages: PageManager,
        meta_page: u64,
        config: ZenConfig,
        catalog: Catalog,
    ) -> ZenEngine {
        let tables = catalog
            .tables
            .iter()
            .enumerate()
            .map(|(i, s)| Arc::new(TableRt::new(i as TableId, s.clone(), &config)))
            .collect();
        let n = config.max_threads;
        let padded = |v: u64| -> Box<[CachePadded<AtomicU64>]> {
            (0..n)
                .map(|_| CachePadded::new(AtomicU64::new(v)))
                .collect()
        };
        ZenEngine {
            domain: pool.domain(),
            protocol: config.protocol,
            flushing: pool.domain().needs_flush(),
            meta_page,
            catalog_store: CatalogStore {
                base: meta_page + meta::CATALOG_AT,
                slot_bytes: meta::CATALOG_SLOT_BYTES,
            },
            catalog: Mutex::new(catalog),
            tables: RwLock::new(tables),
            clock: TidClock::new(0),
            active: padded(u64::MAX),
            cc: CcShared::new(n, config.cc_options),
            snap_active: padded(u64::MAX),
            region_commit: padded(0),
            gc_done: padded(u64::MAX),
            inbox: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            threads: (0..n)
                .map(|_| Mutex::new(Some(ThreadState::default())))
                .collect(),
            handover: Mutex::new(()),
            last_commit: crate::engine::common::LastCommits::new(n),
            txns: AtomicU64::new(0),
            workers: std::sync::atomic::AtomicUsize::new(0),
            exclusive: std::sync::atomic::AtomicUsize::new(0),
            footprint: padded(0),
            exclusive_runs: AtomicU64::new(0),
            report: None,
            pages,
            config,
            pool,
        }
    }

    /// Re-runs the knapsack split of the cache budget over the tables (§3.2) with their current
    /// sizes and access frequencies.
    pub(crate) fn rebalance(&self) {
        let tables = self.tables.read().clone();
        if tables.is_empty() {
            return;
        }
        let txns = self.txns.load(Ordering::Relaxed).max(1) as f64;
        let demands: Vec<TableDemand> = tables
            .iter()
            .map(|t| {
                let rows = t.index.len() as u64;
                TableDemand {
                    entry_bytes: t.row as u64 + cache::ENTRY_OVERHEAD,
                    nvm_bytes: rows * t.slot,
                    rows,
                    accesses_per_txn: t.accesses.load(Ordering::Relaxed) as f64 / txns,
                }
            })
            .collect();
        let budget = self.config.cache_bytes.unwrap_or_else(|| {
            let nvm: u64 = demands.iter().map(|d| d.nvm_bytes).sum();
            (nvm as f64 / self.config.cache_ratio) as u64
        });
        let split = split_budget(budget, &demands, self.config.cache_min_entries as u64);
        let regions = self.workers.load(Ordering::Relaxed).max(1) as u64;
        for (t, entries) in tables.iter().zip(split) {
            t.cache.set_capacity(entries.div_ceil(regions) as usize);
        }
    }

    /// The oldest start timestamp of running transactions other than `thread`'s own.
    pub(crate) fn oldest_active_excluding(&self, thread: usize) -> u64 {
        crate::engine::common::oldest_active_excluding(&self.active, thread)
    }

    /// The region (thread slot) that owns the NVM-tuple at `slot`.
    pub(crate) fn region_of_slot(&self, slot: u64) -> usize {
        self.pages
            .page_of(slot)
            .and_then(|p| self.pages.tag(&self.pool, p))
            .map_or(0, |t| t.owner as usize)
    }

    /// Detects a long-running transaction (§3.3.4): picks the running transaction that has
    /// accessed the most tuples and sets G-EX for it, unless G-EX is already set.
    pub(crate) fn request_exclusive(&self) {
        if self.exclusive.load(Ordering::Acquire) != 0 {
            return;
        }
        let longest = (0..self.config.max_threads)
            .filter(|&t| self.active[t].load(Ordering::Acquire) != u64::MAX)
            .max_by_key(|&t| self.footprint[t].load(Ordering::Relaxed));
        if let Some(t) = longest {
            if self
                .exclusive
                .compare_exchange(0, t + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.exclusive_runs.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// How many times a long-running transaction was run in the exclusive mode (§3.3.4).
    pub fn exclusive_runs(&self) -> u64 {
        self.exclusive_runs.load(Ordering::Relaxed)
    }

    /// Met-Cache entries allocated per table (for tools and tests).
    pub fn cache_entries(&self) -> Vec<usize> {
        self.tables
            .read()
            .iter()
            .map(|t| t.cache.allocated())
            .collect()
    }

    /// Met-Cache capacity per region, per table (the knapsack split's current answer).
    pub fn cache_capacity(&self) -> Vec<usize> {
        self.tables
            .read()
            .iter()
            .map(|t| t.cache.capacity())
            .collect()
    }
}

impl Engine for ZenEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Zen
    }

    fn domain(&self) -> PersistenceDomain {
        self.domain
    }

    fn catalog(&self) -> Catalog {
        self.catalog.lock().clone()
    }

    fn create_table(&self, schema: Schema) -> Result<TableId, DbError> {
        if schema.index_placement == Some(crate::index::IndexPlacement::Pm) {
            return Err(DbError::Config(format!(
                "table '{}': engine zen keeps its indexes in DRAM (it updates out of place, so a \
                 PM index would be rewritten on every update, Falcon §2.1); persistent indexes \
                 need falcon",
                schema.name
            )));
        }
        let mut catalog = self.catalog.lock();
        let mut next = catalog.clone();
        let id = next.add(schema.clone(), self.config.max_row_bytes)?;
        self.catalog_store.store(&self.pool, &next)?;
        *catalog = next;
        self.tables
            .write()
            .push(Arc::new(TableRt::new(id, schema, &self.config)));
        drop(catalog);
        self.rebalance();
        Ok(id)
    }

    fn worker(self: Arc<Self>, thread: usize) -> Result<Box<dyn EngineWorker>, DbError> {
        Ok(Box::new(worker::ZenWorker::new(self, thread)?))
    }

    fn recovery_report(&self) -> Option<RecoveryReport> {
        self.report.clone()
    }

    fn pool(&self) -> Option<&Arc<Pool>> {
        Some(&self.pool)
    }

    fn durable_tid(&self) -> u64 {
        self.last_commit.max()
    }

    fn check_structure(&self) -> Result<Vec<u64>, String> {
        recovery::check_structure(self)
    }

    fn drop_table(&self, table: TableId) -> Result<(), DbError> {
        self.drop_table_now(table)
    }
}

/// The Zen meta page's layout, with the `fields` a format writes or an open checks.
fn meta_layout(fields: &[(u64, u64)]) -> crate::engine::meta::MetaLayout<'_> {
    crate::engine::meta::MetaLayout {
        page_kind: kind::META,
        magic_at: meta::F_MAGIC,
        magic: meta::MAGIC,
        catalog_at: meta::CATALOG_AT,
        catalog_slot_bytes: meta::CATALOG_SLOT_BYTES,
        fields,
        crc_at: meta::F_CRC,
    }
}
