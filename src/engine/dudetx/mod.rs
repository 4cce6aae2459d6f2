//! DUDETx (Liu et al., "DUDETM: Building Durable Transactions with Decoupling for Persistent
//! Memory", ASPLOS'17; `shared/papers/004_*.txt`) as a table engine: `--engine dudetx`; see
//! docs/ARCHITECTURE.md ("DUDETx").
//!
//! # How the paper maps onto the code
//!
//! | paper | code |
//! | --- | --- |
//! | §3.1 *perform* on a DRAM shadow with a volatile TM | the shadow: the `volatile` engine (Falcon with durability off) on a DRAM pool, run through the project's protocols; `worker.rs` |
//! | §3.2 thread-local volatile redo log, global transaction id | `engine/shadow.rs` (redo ops: puts, field writes, deletes), `DudetxEngine::commit` (ids in commit order) |
//! | §3.3 *persist* threads flush logs, advance the durable id | `pipeline::Core::{persist_loop, write_records}`, `pipeline::IdOrder` |
//! | §3.4 *reproduce* applies persisted logs to the PM heap in id order, recycles the log | `pipeline::Core::{reproduce_loop, reproduce_records}`, `heap.rs` |
//! | §5 lock-based DUDETx on the same framework | `pipeline::Sequencer`, `ptm::locks::DepOrder` |
//! | §3.3 log combination and LZ4 compression, group size | `log.rs`, `DudetxConfig::group` |
//! | §3.5 recovery: replay persisted, un-reproduced logs, rebuild the shadow | `recovery.rs` |
//! | sync/async durability | [`DurabilityMode`] |
//!
//! A transaction *performs* on the shadow: the shadow engine's worker buffers and validates it
//! under the configured protocol (OCC by default). Its write set is kept as redo ops: a put
//! (an inserted row's image), a field write (the bytes an update wrote, at their offset) or a
//! delete. At commit the worker takes the engine's commit lock, commits on
//! the shadow, takes the next transaction id and queues its redo log, in that order, so ids
//! follow the shadow's commit order (a transaction that read another's write commits after it
//! and gets a larger id). The *persist* step takes up to `group` queued logs, combines them
//! (each row's last write only), compresses the result with LZ4, writes it as one record to the
//! PM log ring, makes it durable, and then stores and persists the durable id (the largest id in
//! it). The *reproduce* step applies persisted records to the PM heap in id order, makes the
//! heap writes durable, and then truncates the log (last reproduced id, then the head position).
//!
//! # Durability modes
//!
//! [`DurabilityMode::Sync`] (the default): `commit` returns once the transaction's id is durable,
//! so every acknowledged transaction survives a crash. [`DurabilityMode::Async`] (the paper's
//! default): `commit` returns as soon as the shadow commit is done; [`Engine::durable_tid`] says
//! which ids are durable, and a crash keeps exactly the transactions up to the durable id
//! persisted last (a prefix in id order: never one after a gap).
//!
//! # Domains
//!
//! ADR: the log record is written back and fenced before the durable id is stored, and the
//! durable id is written back and fenced before a sync commit returns; the heap writes of a
//! reproduce step are written back and fenced before the truncation words. eADR: the same stores
//! in the same order, whose write-backs cost nothing (the caches are persistent and x86 keeps
//! stores in program order).
//!
//! # Departures from the paper, and why
//!
//! - **The shadow is a whole DRAM copy of the tables**, not a page-level shadow of a PM heap with
//!   paging (§3.6): a table engine's rows already live in a DRAM engine (the `volatile` one), so
//!   *perform* reuses it and its protocols.
//! - **Logs are rows and field writes**, not word-level (address, value) pairs: an insert logs
//!   its row, an update the bytes it wrote at their offset in the row (YCSB: 100 of a row's
//!   1,000 bytes; whole after-images, as before, put ten times the bytes through persist and
//!   reproduce and needed a read of the row). Replay from the truncation point in id order ends
//!   in the same rows whatever reproduce had applied (`log.rs`); a field write of a key a
//!   reproduced delete removed is skipped during recovery and refused otherwise.
//! - **One commit lock orders ids**: TinySTM's global clock increments at commit while the write
//!   locks are held; here the commit lock covers the shadow commit and the id, because the
//!   shadow's protocols do not expose their commit point.
//! - **One persist thread and one reproduce thread** (§3.3 allows several persist threads). In
//!   async mode the persist thread waits for a full group (§3.3), at most
//!   [`DudetxConfig::group_delay_us`] from the oldest queued log; in sync mode it takes what is
//!   queued (up to `group`) without waiting: a sync commit cannot return before its group is
//!   persisted, each committing thread has at most one log queued, so a wait would add to every
//!   commit's latency and a group larger than the committing threads could never fill. In
//!   sync mode a waiting committer leads the persist step itself (a committer whose log missed
//!   the running step spins briefly for it, then sleeps) and the persist thread serves only
//!   drains and stops: it is never woken by a commit. The reproduce thread applies records in
//!   batches (1,024, or what is there after 5 ms, or at once for a drain or when the ring needs
//!   room) rather than one wake-up per record: reproduce is off the commit path (§3.1, §3.4),
//!   and per-record wake-ups, fences and truncation words took as much CPU as the workers on a
//!   2-core machine.
//! - **A persist step that needs ring room reproduces itself** (§3.4 reproduces in the
//!   background only): when the ring is full and no reproduce step runs, the step (a sync
//!   committer's or the persist thread's) applies the reproducible records and truncates,
//!   instead of waking the reproduce thread and sleeping until it is done. On two cores that
//!   hand-off cost two context switches while a commit waited, and with it a sync commit
//!   needs neither background thread to become durable (test
//!   `sync_commits_become_durable_in_order_without_the_persist_and_reproduce_threads`). One
//!   reproduce step runs at a time (a flag), so the truncation marks still advance in order.
//! - **No allocation per commit**: a worker's redo log buffer goes to the queue and the
//!   worker gets a spare one back; the persist step keeps its group, combination and record
//!   buffers from one step to the next; reproduce returns the records' buffers to the spares.
//!   The paper's thread-local circular log buffers (§3.2) do the same job; `perf` had put
//!   malloc and free at 3-4 % of a sync commit.
//! - **LZ4 in async mode only, by default, and with a backoff** (§3.3 compresses every group):
//!   a sync commit waits for its record's compression, which cost more than the PM bytes it
//!   saved (see [`LogCompression`]; `--dudetx-compress always` restores §3.3). When LZ4 is on,
//!   a record it did not shrink makes the next 1, 3, 7, ... 63 records skip the attempt, so
//!   incompressible logs (YCSB's random fields) pay for one attempt in 64 on the persist path,
//!   while compressible ones (padded rows, large combined groups) are compressed.
//! - **A group of one transaction is its log**, uncombined: combination removes a row's
//!   earlier writes, which within one transaction the shadow's write set has mostly merged
//!   already, and replaying a log in order is what combination preserves. In sync mode with
//!   one or two workers most groups are single: the sort and decode of combination were 6 %
//!   of a committer's cycles on TPC-C (`perf`, 1 thread).
//! - **No write-back of the log under eADR**: the caches are persistent there, so the record
//!   lines' `clwb`s bought nothing (the fence stays).
//! - **Inline steps in the crash simulator** (`background: false`): the simulator's crash points
//!   are PM events of the threads it drives, so there the committing thread persists (sync: every
//!   commit; async: every `group` commits) and reproduces (when more than two records wait).
//! - **No STM, HTM or lock-based perform modes of their own for tables** (§4, §5): the shadow's
//!   protocols (OCC, 2PL variants, MVCC, ...) are the perform modes. The object API ([`ptm`])
//!   has the STM; HTM needs RTM, which the machine this was built on lacks (detected and
//!   refused) and the lock-based mode (§5, `ptm/locks.rs`): per-chain ids, dependency graph
//!   from lock hand-offs, one/two-round detection. The table engine keeps global ids: its
//!   shadow engines do not expose their lock hand-offs.
//! - **Shadow paging** (§3.6) is the object API's (`ptm/heap.rs`); the table shadow is whole.
//! - **The table heap's allocator is the heap directory** (DRAM, rebuilt from slot state words at
//!   open) rather than §3.5's allocation logs: a slot becomes live only through a reproduced put,
//!   so the logs already say everything an allocation log would. The persistent-object API's
//!   heap ([`ptm`]) does log `pmalloc`/`pfree` (allocation-log ops in the redo record).
//! - **Dropping a table** (issue 21; not in the paper): under the commit lock the pipeline is
//!   drained (nothing of the table is still on its way to the heap), then the DRAM table and the
//!   table's PM heap pages are freed; recovery frees pages a crash left and skips the table's
//!   log records (`heap.rs`).
//!
//! # Cost structure, and what two cores allow
//!
//! The paper measures DUDETx against volatile TinySTM with persist and reproduce on cores of
//! their own (§6.1, a many-core server): there *perform* is the only work on the workers' cores,
//! hence 7.4–24.6 % below volatile (§6.2). On a 2-core machine every byte persisted and
//! reproduced, every wake-up and every context switch of the two background threads is taken
//! from a worker: the ratio to volatile is at most *perform* / (*perform* + persist +
//! reproduce), and with two workers nothing is left over. `perf` of the a7091a6 binary (YCSB-A,
//! 1 M records, θ 0, after the load) showed, besides *perform*: in sync mode the persist
//! thread switching in after every commit (15 % of all samples) and the worker's futex
//! wake-ups (10 %), LZ4 on incompressible logs (4 % of each worker; 9 % in async mode),
//! reproduce (13–16 %: heap writes of whole 1,000-byte rows, decoding copies) and allocations
//! per commit. What remains after this change: *perform* on the shadow plus one redo log per
//! writing transaction (for YCSB a 121-byte field write instead of a 1,017-byte row), the
//! commit lock, the persist step (combination, LZ4, CRC, one copy to the ring: outside the
//! pipeline's state lock, which it takes only to take its group off the queue and to publish
//! the records), the heap write in reproduce. Sync mode adds one persist step per commit (a group is what
//! arrives while the previous step runs), so two sync committers alternate as leaders.
//!
//! Reproduce is bound by memory latency: per op a lookup in the heap directory (key → slot,
//! which §3.4's address-based logs do not need) and the row. `perf` of 7f17aae (TPC-C,
//! 1 thread) put 60 % of the reproduce thread in the directory lookup that the row's prefetch
//! waited for; the directory is now an open-addressing table whose entries reproduce
//! prefetches a stage before the rows (`heap::SlotIndex`, `pipeline::REPRODUCE_CHUNK`), which
//! took the reproduce thread's CPU per transaction down by roughly a third on TPC-C and
//! YCSB-A (1 and 2 threads; measured on a loaded 2-core VM, so only roughly).
//! `perf` of c37a844 (TPC-C, 2 threads) still put about 45 % of the reproduce loop at the
//! directory entry's prefetch (a TLB walk per op: the directories of 2 warehouses are tens of
//! MiB of 4 KiB pages) and much of the rest behind it; half of TPC-C's reproduced ops are
//! order lines, whose keys are consecutive per order. The directory now places a run of 8
//! consecutive keys in consecutive entries (`heap::SlotIndex::home`), so an order's lines share
//! two or three directory lines instead of one page each. The stall left the loop, but on a
//! loaded machine the thread's CPU per transaction did not measurably fall: the rows' page
//! walks (the PM pool in 4 KiB pages) remain (docs/ARCHITECTURE.md, stop 43).
//!
//! # The persistent-object API
//!
//! [`ptm`] runs `pmtx::ptm` on the same pipeline: a word-based STM (§4.1) on a DRAM shadow of
//! the object heap, (word, value) and allocation-log redo ops, the same persist, reproduce and
//! replay (`pipeline::Apply` says what reproduce writes). Its own departures are in its doc.

mod heap;
pub mod layout;
pub mod log;
mod pipeline;
pub mod ptm;
mod recovery;

pub use pipeline::LogStats;

use crate::alloc::PAGE_SIZE;
use crate::catalog::{Catalog, CatalogStore, Schema, TableId};
use crate::cc::{CcOptions, Protocol, MAX_THREADS};
use crate::engine::shadow::RingMetaPage;
use crate::engine::{DbError, Engine, EngineKind, EngineWorker, RecoveryReport, TxError};
use crate::pmem::{PersistenceDomain, Pool};
use layout::{kind, meta};
use parking_lot::Mutex;
use pipeline::Core;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// When a DUDETx commit returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DurabilityMode {
    /// Once the transaction is durable (its redo record and the durable id persisted). The
    /// persist thread never waits here for a group to fill (§3.3): each committing thread has
    /// at most one log queued while it waits, so a group larger than the threads committing
    /// could never fill, and every microsecond of waiting is added to every commit's latency;
    /// a group is what arrives while the previous record is written.
    Sync,
    /// At once; [`Engine::durable_tid`] tells what is durable. The persist thread waits up to
    /// [`DudetxConfig::group_delay_us`] for a full group, so durability lags commit by up to
    /// that delay more, and combination (§3.3) sees whole groups.
    Async,
}

impl std::str::FromStr for DurabilityMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sync" => Ok(DurabilityMode::Sync),
            "async" => Ok(DurabilityMode::Async),
            _ => Err(format!(
                "unknown DUDETx durability mode '{s}' (expected sync or async)"
            )),
        }
    }
}

impl std::fmt::Display for DurabilityMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DurabilityMode::Sync => "sync",
            DurabilityMode::Async => "async",
        })
    }
}

/// Whether a persist step compresses its records with LZ4 (§3.3).
///
/// §3.3 compresses every combined group, to save PM write bandwidth: with many threads a PM
/// device's write bandwidth is what limits the persist threads. A sync commit, though, waits for
/// its own record's compression: on this project's 2-core machine LZ4 was 11 % of a sync
/// committer's cycles on TPC-C (`perf`, 1 thread), which saved ~750 of 2,250 PM bytes per
/// transaction, a write that costs far less than the compression on DRAM or one Optane DIMM at
/// one or two threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogCompression {
    /// `Always` in [`DurabilityMode::Async`] (the persist thread compresses off the commit
    /// path, whole groups), `Never` in [`DurabilityMode::Sync`] (a commit would wait for it).
    Auto,
    /// Every record is tried, as §3.3 does (a record LZ4 does not shrink is stored as it is,
    /// and makes the next few skip the attempt).
    Always,
    /// Records are stored as combined, uncompressed.
    Never,
}

impl LogCompression {
    /// Whether records are compressed under `mode`.
    pub fn compresses(self, mode: DurabilityMode) -> bool {
        match self {
            LogCompression::Auto => mode == DurabilityMode::Async,
            LogCompression::Always => true,
            LogCompression::Never => false,
        }
    }
}

impl std::str::FromStr for LogCompression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(LogCompression::Auto),
            "always" => Ok(LogCompression::Always),
            "never" => Ok(LogCompression::Never),
            _ => Err(format!(
                "unknown DUDETx log compression '{s}' (expected auto, always or never)"
            )),
        }
    }
}

impl std::fmt::Display for LogCompression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogCompression::Auto => "auto",
            LogCompression::Always => "always",
            LogCompression::Never => "never",
        })
    }
}

/// A deliberate bug in one ordering step, for showing that the crash harness catches it
/// (test-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DudetxFault {
    /// The log record is not written back before the durable id (ADR).
    SkipLogFlush,
    /// The durable id is stored and persisted before the log record is written.
    DurableIdFirst,
    /// Reproduce does not write back the heap before truncating the log (ADR).
    SkipHeapFlush,
    /// The log is truncated before its records are reproduced onto the heap.
    TruncateFirst,
}

impl DudetxFault {
    /// Every fault.
    pub const ALL: [DudetxFault; 4] = [
        DudetxFault::SkipLogFlush,
        DudetxFault::DurableIdFirst,
        DudetxFault::SkipHeapFlush,
        DudetxFault::TruncateFirst,
    ];

    /// The command-line name (unique over every engine's faults).
    pub fn name(self) -> &'static str {
        match self {
            DudetxFault::SkipLogFlush => "dudetx-skip-log-flush",
            DudetxFault::DurableIdFirst => "dudetx-durable-id-first",
            DudetxFault::SkipHeapFlush => "dudetx-skip-heap-flush",
            DudetxFault::TruncateFirst => "dudetx-truncate-first",
        }
    }

    /// What the fault breaks.
    pub fn describe(self) -> &'static str {
        match self {
            DudetxFault::SkipLogFlush => {
                "persist does not write back the log record before the durable id"
            }
            DudetxFault::DurableIdFirst => {
                "the durable id is advanced before the log record is written"
            }
            DudetxFault::SkipHeapFlush => {
                "reproduce does not write back the heap before truncating the log"
            }
            DudetxFault::TruncateFirst => "the log is truncated before its records are reproduced",
        }
    }

    /// Whether the fault only removes a write-back (harmless under eADR).
    pub fn only_removes_ordinary_flushes(self) -> bool {
        matches!(self, DudetxFault::SkipLogFlush | DudetxFault::SkipHeapFlush)
    }
}

crate::engine::common::named_fault!(DudetxFault, "dudetx fault");

/// DUDETx's parameters.
#[derive(Clone, Debug)]
pub struct DudetxConfig {
    /// The shadow's concurrency-control protocol (the *perform* mode).
    pub protocol: Protocol,
    /// Options of the protocol.
    pub cc_options: CcOptions,
    /// Worker slots.
    pub max_threads: usize,
    /// The row size limit.
    pub max_row_bytes: usize,
    /// When commits return.
    pub mode: DurabilityMode,
    /// Transactions combined into one log record at most (§3.3; 1: no combination).
    pub group: usize,
    /// Whether records are compressed with LZ4 (§3.3).
    pub compression: LogCompression,
    /// Async mode, background persist thread: how long it waits at most for a group to fill
    /// (§3.3: a larger group combines more), in microseconds; 0: it takes what is queued. Sync
    /// commits never wait for a group to fill (see [`DurabilityMode::Sync`]).
    pub group_delay_us: u64,
    /// 2 MiB pages of the log ring (fixed when the pool is formatted); 0: a quarter of the
    /// pool's pages, 1 to [`DEFAULT_LOG_PAGES`], so that a small pool keeps room for its heap.
    pub log_pages: usize,
    /// Persist and reproduce in background threads (true) or inline in the committing thread
    /// (false: for the crash simulator).
    pub background: bool,
    /// A deliberate ordering bug (test-only).
    pub fault: Option<DudetxFault>,
}

/// The default bound on the persist thread's wait for a group to fill (async mode), in µs.
pub const DEFAULT_GROUP_DELAY_US: u64 = 2_000;

/// The longest wait for a group to fill the configuration accepts (1 s), in µs.
pub const MAX_GROUP_DELAY_US: u64 = 1_000_000;

/// The most pages an automatically sized log ring takes ([`DudetxConfig::log_pages`] 0).
pub const DEFAULT_LOG_PAGES: usize = 8;

impl DudetxConfig {
    /// Defaults: sync mode, groups of up to 64 transactions, LZ4 by mode
    /// ([`LogCompression::Auto`]), a log ring sized from the pool
    /// (up to 8 pages, 16 MiB),
    /// background threads, 16 threads, rows up to 4 KiB.
    pub fn new(protocol: Protocol) -> DudetxConfig {
        DudetxConfig {
            protocol,
            cc_options: CcOptions::default(),
            max_threads: 16,
            max_row_bytes: 4096,
            mode: DurabilityMode::Sync,
            group: 64,
            compression: LogCompression::Auto,
            group_delay_us: DEFAULT_GROUP_DELAY_US,
            log_pages: 0,
            background: true,
            fault: None,
        }
    }

    fn validate(&self) -> Result<(), DbError> {
        if self.max_threads == 0 || self.max_threads >= MAX_THREADS {
            return Err(DbError::Config(format!(
                "max_threads must be 1 to {} for dudetx (one slot is its own)",
                MAX_THREADS - 1
            )));
        }
        if self.group == 0 || self.group > 1 << 20 {
            return Err(DbError::Config(format!(
                "the DUDETx group size must be 1 to {} transactions, not {}",
                1 << 20,
                self.group
            )));
        }
        if self.group_delay_us > MAX_GROUP_DELAY_US {
            return Err(DbError::Config(format!(
                "the DUDETx group delay must be at most {MAX_GROUP_DELAY_US} µs, not {}",
                self.group_delay_us
            )));
        }
        crate::engine::wal::check_ring_pages(self.log_pages, "DUDETx")?;
        if self.max_row_bytes == 0 || layout::slot::size(self.max_row_bytes) > PAGE_SIZE {
            return Err(DbError::Config(
                "max_row_bytes must be between 1 byte and a 2 MiB page".into(),
            ));
        }
        Ok(())
    }
}

/// The DUDETx engine.
pub struct DudetxEngine {
    pub(crate) core: Arc<Core>,
    /// The DRAM shadow (§3.1): the volatile engine.
    shadow: Arc<dyn Engine>,
    catalog_store: CatalogStore,
    catalog: Mutex<Catalog>,
    /// Orders ids with shadow commits.
    commit_lock: Mutex<()>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    report: Option<RecoveryReport>,
}

/// The DUDETx meta page.
const META_PAGE: RingMetaPage = RingMetaPage {
    engine: "DUDETx",
    page_kind: kind::META,
    magic: meta::MAGIC,
    version: meta::VERSION,
};

/// Formats `pool`'s meta page and log ring (of `config.log_pages` pages) for `config`.
fn format_pool(
    pool: &Pool,
    config: &DudetxConfig,
) -> Result<(crate::alloc::PageManager, u64, crate::engine::wal::LogRing), DbError> {
    let (pages, meta_page) = META_PAGE.format(pool, config.max_row_bytes, config.log_pages)?;
    let ring = recovery::log_ring(pool, &pages, config.log_pages, true)?;
    Ok((pages, meta_page, ring))
}

/// A fresh DRAM shadow (§3.1), with one worker slot more than the engine's for loading and
/// checking.
fn make_shadow(config: &DudetxConfig, pm_bytes: u64) -> Result<Arc<dyn Engine>, DbError> {
    let shadow: Arc<dyn Engine> = crate::engine::shadow::make_shadow(
        config.protocol,
        config.cc_options,
        config.max_threads + 1,
        config.max_row_bytes,
        pm_bytes,
    )?;
    Ok(shadow)
}

impl DudetxEngine {
    /// Formats a fresh pool for DUDETx.
    pub fn create(pool: Arc<Pool>, config: DudetxConfig) -> Result<Arc<DudetxEngine>, DbError> {
        let mut config = config;
        config.validate()?;
        crate::engine::common::require_durable_domain(EngineKind::Dudetx, pool.domain())?;
        config.log_pages =
            crate::engine::wal::ring_size(&pool, config.log_pages, DEFAULT_LOG_PAGES);
        let (pages, meta_page, ring) = format_pool(&pool, &config)?;
        let catalog = Catalog::default();
        let heap = heap::Heap::new(&catalog);
        let shadow = make_shadow(&config, pool.len())?;
        let order = Box::new(pipeline::IdOrder::default());
        let core = Core::new(pool, pages, meta_page, ring, config, heap, 0, 0, order);
        Self::assemble(core, shadow, catalog, None)
    }

    /// Opens a DUDETx pool, recovering it (§3.5).
    pub fn open(pool: Arc<Pool>, config: DudetxConfig) -> Result<Arc<DudetxEngine>, DbError> {
        recovery::open(pool, config)
    }

    fn assemble(
        core: Core,
        shadow: Arc<dyn Engine>,
        catalog: Catalog,
        report: Option<RecoveryReport>,
    ) -> Result<Arc<DudetxEngine>, DbError> {
        let core = Arc::new(core);
        let threads = if core.config.background {
            core.start().map_err(DbError::Config)?
        } else {
            Vec::new()
        };
        Ok(Arc::new(DudetxEngine {
            catalog_store: RingMetaPage::catalog_store(core.meta_page),
            core,
            shadow,
            catalog: Mutex::new(catalog),
            commit_lock: Mutex::new(()),
            threads: Mutex::new(threads),
            report,
        }))
    }

    /// What log combination and compression did so far (§3.3).
    pub fn log_stats(&self) -> LogStats {
        self.core.stats()
    }

    /// The durability mode.
    pub fn mode(&self) -> DurabilityMode {
        self.core.config.mode
    }

    /// Persists and reproduces everything committed so far.
    pub fn drain(&self) -> Result<(), DbError> {
        self.core
            .drain()
            .map_err(|e| DbError::Tx(TxError::PmFull(e)))
    }
}

impl crate::engine::shadow::ShadowHost for DudetxEngine {
    fn row_len(&self, table: TableId) -> Result<usize, TxError> {
        crate::engine::shadow::row_len(&self.catalog.lock(), table)
    }

    fn last_committed(&self) -> u64 {
        self.core.committed.load(Ordering::Acquire)
    }

    /// Updates log the bytes they wrote (`log.rs`).
    fn logs_field_writes(&self) -> bool {
        true
    }

    /// Commits the shadow transaction of `inner` with redo log `log` (§3.2): under the commit
    /// lock the shadow commit, the next id and the log's place in the queue (`log` gets a
    /// spare buffer in exchange); then, in sync mode, the wait until the id is durable.
    fn commit_logged(
        &self,
        inner: &mut dyn EngineWorker,
        log: &mut Vec<u8>,
    ) -> Result<u64, TxError> {
        if let Some(why) = self.core.failed() {
            inner.abort();
            return Err(TxError::PmFull(why));
        }
        let limit = pipeline::max_record_raw(self.core.ring.capacity());
        if log.len() > limit {
            inner.abort();
            return Err(TxError::RowTooLarge(format!(
                "the transaction's redo log of {} bytes exceeds a quarter of the DUDETx log ring \
                 ({limit} bytes): split the transaction or format the pool with a larger log \
                 (DbConfig::dudetx_log_pages)",
                log.len()
            )));
        }
        let id = {
            let _order = self.commit_lock.lock();
            inner.commit()?;
            let id = self.core.committed.load(Ordering::Relaxed) + 1;
            self.core.committed.store(id, Ordering::Release);
            *log = self
                .core
                .enqueue(id, std::mem::take(log))
                .map_err(TxError::PmFull)?;
            id
        };
        if self.core.config.mode == DurabilityMode::Sync {
            self.core.wait_durable(id).map_err(TxError::PmFull)?;
        }
        Ok(id)
    }
}

impl Drop for DudetxEngine {
    fn drop(&mut self) {
        // A clean close persists and reproduces what is queued (the threads finish the queue
        // before they stop); after a simulated power failure nothing more may touch PM.
        let crashed = self.core.pool.crash_sim().is_some_and(|s| s.has_crashed());
        if crashed {
            return;
        }
        if !self.core.config.background {
            // Inline steps: an async run's last partial group is persisted here. A failure
            // (a full heap) leaves the records in the log, for recovery to replay.
            let _ = self.core.drain();
        }
        self.core.stop();
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }
}

impl Engine for DudetxEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Dudetx
    }

    fn domain(&self) -> PersistenceDomain {
        self.core.pool.domain()
    }

    fn catalog(&self) -> Catalog {
        self.catalog.lock().clone()
    }

    fn create_table(&self, schema: Schema) -> Result<TableId, DbError> {
        let mut catalog = self.catalog.lock();
        let (id, next) = crate::engine::shadow::create_table(
            &catalog,
            &self.catalog_store,
            &self.core.pool,
            &*self.shadow,
            schema,
            self.core.config.max_row_bytes,
            "engine dudetx keeps its indexes in the DRAM shadow (§3.1)",
        )?;
        self.core.heap.lock().sync_tables(&next);
        *catalog = next;
        Ok(id)
    }

    fn worker(self: Arc<Self>, thread: usize) -> Result<Box<dyn EngineWorker>, DbError> {
        if thread >= self.core.config.max_threads {
            return Err(DbError::NoWorkerSlot(self.core.config.max_threads));
        }
        let inner = self.shadow.clone().worker(thread)?;
        Ok(Box::new(crate::engine::shadow::ShadowWorker::new(
            self, inner,
        )))
    }

    fn recovery_report(&self) -> Option<RecoveryReport> {
        self.report.clone()
    }

    fn pool(&self) -> Option<&Arc<Pool>> {
        Some(&self.core.pool)
    }

    fn durable_tid(&self) -> u64 {
        self.core.durable.load(Ordering::Acquire)
    }

    fn check_structure(&self) -> Result<Vec<u64>, String> {
        let counts = self.shadow.check_structure()?;
        let _order = self.commit_lock.lock();
        self.core.drain()?;
        recovery::compare_heap_with_shadow(self, &counts)?;
        Ok(counts)
    }

    /// Drops `table` (issue 21): under the commit lock, once everything committed is
    /// reproduced (so no record of the table is still on its way to the heap), the DRAM table
    /// and then the table's PM heap pages are freed; recovery skips the table's log records.
    fn drop_table(&self, table: TableId) -> Result<(), DbError> {
        let _order = self.commit_lock.lock();
        self.drain()?;
        crate::engine::shadow::drop_table(
            &self.catalog,
            &self.catalog_store,
            &self.core.pool,
            table,
            || self.shadow.drop_table(table),
            || {
                let freed = self.core.heap.lock().drop_table(table);
                for page in freed {
                    let index = self.core.pages.page_of(page).expect("a heap page");
                    self.core.pages.free(&self.core.pool, index);
                }
                Ok(())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ColumnType;
    use crate::pmem::PoolOptions;
    use std::time::Duration;

    /// A sync-mode pipeline with background steps (`background: true`) whose persist and
    /// reproduce threads are never started, over a fresh ADR pool with a one-page (2 MiB) log
    /// ring and one table of `row`-byte rows.
    fn pipeline_without_threads(row: usize) -> (Arc<Core>, TableId) {
        let pool = Pool::create_in_memory(
            64 << 20,
            &PoolOptions::new(EngineKind::Dudetx.layout(), PersistenceDomain::Adr),
        )
        .unwrap();
        let mut config = DudetxConfig::new(Protocol::Occ);
        config.log_pages = 1;
        let (pages, meta_page, ring) = format_pool(&pool, &config).unwrap();
        let mut catalog = Catalog::default();
        let table = catalog
            .add(
                Schema::new("rows", &[("v", ColumnType::Bytes(row as u32))]),
                config.max_row_bytes,
            )
            .unwrap();
        let heap = heap::Heap::new(&catalog);
        let order = Box::new(pipeline::IdOrder::default());
        let core = Core::new(
            Arc::new(pool),
            pages,
            meta_page,
            ring,
            config,
            heap,
            0,
            0,
            order,
        );
        (Arc::new(core), table)
    }

    /// Transaction `id`'s row.
    fn row_of(id: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (id as usize * 31 + i) as u8).collect()
    }

    /// A persist step that unwound at a simulated crash never put its buffers back; in the
    /// crash suite another thread of the dead process may still run a step before its own next
    /// PM event unwinds it. That step takes fresh buffers (they carry nothing from one step to
    /// the next) and its commit becomes durable; it used to panic ("the persist step's buffers
    /// are home while no persist step runs", 1 crash-suite run in 3 under load).
    #[test]
    fn a_persist_step_after_one_that_kept_its_buffers_takes_fresh_ones() {
        const ROW: usize = 100;
        let (core, table) = pipeline_without_threads(ROW);
        for id in 1..=3 {
            core.lose_persist_buffers();
            let mut redo = Vec::new();
            log::encode_op(&mut redo, table, id, Some(&row_of(id, ROW)));
            core.enqueue(id, redo).unwrap();
            core.wait_durable(id).unwrap();
            assert_eq!(core.durable.load(Ordering::Acquire), id);
            assert!(core.has_persist_buffers(), "the step put its buffers back");
        }
    }

    /// Sync commits lead their own persist step (`Core::wait_durable`) and, when the ring is
    /// full, reproduce to make room (`Core::persist_step`): with neither background thread
    /// running, six rings' worth of sync commits each return with their own id durable, and
    /// the heap holds what the reproduced prefix of ids wrote, in id order. Without either
    /// helping path a commit would wait for a thread that never comes (the test allows 60 s).
    #[test]
    fn sync_commits_become_durable_in_order_without_the_persist_and_reproduce_threads() {
        const ROW: usize = 1000;
        const KEYS: u64 = 50;
        // ~1,060 ring bytes per commit: about six 2 MiB rings.
        const COMMITS: u64 = 12_000;
        let (core, table) = pipeline_without_threads(ROW);
        let (done, finished) = std::sync::mpsc::channel();
        let committer = {
            let core = core.clone();
            std::thread::spawn(move || {
                let result = (1..=COMMITS).try_for_each(|id| {
                    let mut redo = Vec::new();
                    log::encode_op(&mut redo, table, id % KEYS, Some(&row_of(id, ROW)));
                    core.enqueue(id, redo)?;
                    core.wait_durable(id)?;
                    let durable = core.durable.load(Ordering::Acquire);
                    if durable != id {
                        return Err(format!("commit {id} returned with durable id {durable}"));
                    }
                    Ok::<(), String>(())
                });
                let _ = done.send(result);
            })
        };
        let result = finished.recv_timeout(Duration::from_secs(60)).expect(
            "sync commits stalled with no persist or reproduce thread: nobody persisted or \
             reproduced for them",
        );
        result.unwrap();
        committer.join().unwrap();
        let reproduced = core.reproduced.load(Ordering::Acquire);
        assert!(
            reproduced > 0,
            "the ring filled, so a commit must have reproduced to make room"
        );
        let rows = core.heap.lock().rows(&core.pool, table);
        assert_eq!(rows.len() as u64, KEYS.min(reproduced));
        for (key, row) in rows {
            // The last reproduced id that wrote this key.
            let last = (1..=reproduced).rev().find(|id| id % KEYS == key).unwrap();
            assert!(
                row == row_of(last, ROW),
                "key {key}: not the row of id {last}"
            );
        }
    }
}
