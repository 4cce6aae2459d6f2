//! MMDB: the main-memory database with a write-ahead log and checkpoints on PM that Zen §4 and
//! FIR §5 compare against: `--engine mmdb`; see docs/ARCHITECTURE.md ("MMDB").
//!
//! # Which description it follows
//!
//! Zen's "MMDB with NVM capacity" (Zen §2.2, Figure 1(a) and §4's setup), in its "ideal MMDB"
//! form (Zen §4, Figure 16: the whole database fits in DRAM): tuples and indexes live in DRAM
//! and transactions run there with ordinary loads and stores; durability is a redo write-ahead
//! log and checkpoints in PM, written with `clwb` and `sfence`; after a crash the DRAM state is
//! lost and recovery loads the most recent checkpoint and applies the redo log up to the crash
//! point (Zen §2.2). As in Zen §4, a transaction's log records are combined into one and written
//! sequentially at commit, with write-backs and a single fence.
//!
//! # How it maps onto the code
//!
//! | piece | code |
//! | --- | --- |
//! | DRAM tuples, indexes, concurrency control | the `volatile` engine (Falcon with durability off), `engine::shadow` (shared with DUDETx) |
//! | redo log: whole-row after-images of a transaction, one frame per transaction | `engine::shadow::ShadowWorker`, `core::frame` |
//! | the log on PM: a ring of CRC'd records | `engine::wal` (shared with DUDETx) |
//! | group commit | `core::Core::writer_loop` (a log-writer thread) |
//! | periodic checkpoints, log truncation | `core::Core::{checkpointer_loop, checkpoint}` |
//! | recovery: last valid checkpoint, then the log | `recovery.rs` |
//!
//! # Commit
//!
//! A worker runs the transaction on the DRAM tables under the configured protocol and keeps its
//! writes as row after-images. At commit it takes the commit lock, commits on the DRAM tables,
//! takes the next id and queues its redo, in that order (ids follow the DRAM commit order), and
//! then waits until its id is durable. **Group commit**: one log-writer thread takes up to
//! [`MmdbConfig::group`] queued transactions (the commits that arrived while it wrote the
//! previous record; optionally after waiting up to [`MmdbConfig::group_wait`] for more), writes
//! them as one record, writes it back and fences once, and acknowledges them all. A commit is acknowledged only when its record is
//! durable. ADR: the record's lines are written back (`clwb`) and fenced; eADR: the same stores,
//! whose write-back is free (the caches are persistent and x86 keeps stores in order).
//!
//! # Checkpoints
//!
//! A checkpointer thread takes one every [`MmdbConfig::checkpoint_interval`] (when anything
//! committed since), and at once when the log is half full. It is a **consistent snapshot at a
//! commit boundary**, not a fuzzy one: under the commit lock it notes the log tail (a record
//! boundary) and the last committed id, and copies every live row of the DRAM tables; then,
//! without the lock, it writes the copy to fresh PM pages, writes them back and fences, writes a
//! descriptor (covered id, log position, length, CRC), and makes the checkpoint valid with one
//! 8-byte store of its generation. Only then is the log before its position truncated (the ring
//! reused) and the previous checkpoint's pages freed. Why consistent rather than fuzzy: a fuzzy
//! snapshot may hold part of a transaction whose record is not yet durable, so it may become
//! valid only after the log reaches every id it could have seen; with a full ring the log writer
//! waits for the checkpoint to make room, and the two would wait for each other. A consistent
//! snapshot depends on nothing in the log. Its cost is the copy under the commit lock: commits
//! pause for a memory copy of the tables (no PM write happens under the lock).
//!
//! # Recovery
//!
//! Load the checkpoint named by the valid word (pages checked against the descriptor's length
//! and CRC), then replay the log from its position: every transaction after the covered id, in
//! id order, up to the first torn, stale or missing record, or a gap in the ids. Records carry
//! the epoch of the open that wrote them, so a record left from before a recovery (beyond the
//! point where the replay stopped) is never taken for a newer one. `pmtx recover` prints the
//! phases ("load checkpoint", "replay log", each with its time).
//!
//! # Protocols
//!
//! Every protocol the volatile engine runs (all of them: OCC, the 2PL variants, TO, MVCC, ...):
//! they run unchanged on the DRAM tables.
//!
//! # Departures, and why
//!
//! - **One shared, group-committed log** instead of Zen §4's decentralized per-thread logs: the
//!   issue asks for group commit (several committing threads share one flush), and a single
//!   log in id order keeps the replay a simple in-order scan.
//! - **No NVM used as volatile memory** (Zen's P = 4, 16 configurations): pmtx's databases fit
//!   in DRAM, which is Zen's "ideal MMDB" (Figure 16).
//! - **Checkpoints are on by default** (Zen §4 disables them for throughput runs): set
//!   `checkpoint_interval` to zero to run without periodic ones (the log still forces one when
//!   it is half full).
//! - **Dropping a table** (issue 21; not in the papers): the DRAM table is dropped under the
//!   commit lock and a checkpoint without its rows frees the previous checkpoint's pages;
//!   recovery skips rows of tables that are not live, in the checkpoint and in the log.
//! - **Inline mode** (`background: false`, for the crash simulator, whose PM events must come
//!   from the threads it drives): the committing thread writes its own record, and a checkpoint
//!   is taken every [`MmdbConfig::checkpoint_every`] commits and when the ring is full.

mod core;
pub mod layout;
mod recovery;

pub use self::core::MmdbStats;

use self::core::Core;
use crate::alloc::PAGE_SIZE;
use crate::catalog::{Catalog, CatalogStore, Schema, TableId};
use crate::cc::{CcOptions, Protocol, MAX_THREADS};
use crate::engine::falcon::FalconEngine;
use crate::engine::shadow::{RingMetaPage, ShadowHost, ShadowWorker};
use crate::engine::{DbError, Engine, EngineKind, EngineWorker, RecoveryReport, TxError};
use crate::pmem::{PersistenceDomain, Pool};
use layout::{kind, meta};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A deliberate bug in one ordering step, for showing that the crash harness catches it
/// (test-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MmdbFault {
    /// The log record is not written back before its commits are acknowledged (ADR).
    SkipLogFlush,
    /// A commit is acknowledged before its log record is written.
    AckBeforeLog,
    /// The checkpoint pages are not written back before the valid word (ADR).
    SkipCheckpointFlush,
    /// The valid word is stored before the checkpoint pages are written.
    ValidBeforePages,
    /// The log is truncated and the previous checkpoint freed before the new one is valid.
    TruncateBeforeValid,
}

impl MmdbFault {
    /// Every fault.
    pub const ALL: [MmdbFault; 5] = [
        MmdbFault::SkipLogFlush,
        MmdbFault::AckBeforeLog,
        MmdbFault::SkipCheckpointFlush,
        MmdbFault::ValidBeforePages,
        MmdbFault::TruncateBeforeValid,
    ];

    /// The command-line name (unique over every engine's faults).
    pub fn name(self) -> &'static str {
        match self {
            MmdbFault::SkipLogFlush => "mmdb-skip-log-flush",
            MmdbFault::AckBeforeLog => "mmdb-ack-before-log",
            MmdbFault::SkipCheckpointFlush => "mmdb-skip-checkpoint-flush",
            MmdbFault::ValidBeforePages => "mmdb-valid-before-pages",
            MmdbFault::TruncateBeforeValid => "mmdb-truncate-before-valid",
        }
    }

    /// What the fault breaks.
    pub fn describe(self) -> &'static str {
        match self {
            MmdbFault::SkipLogFlush => {
                "the log record is not written back before its commits are acknowledged"
            }
            MmdbFault::AckBeforeLog => "a commit is acknowledged before its log record is written",
            MmdbFault::SkipCheckpointFlush => {
                "the checkpoint pages are not written back before the valid word"
            }
            MmdbFault::ValidBeforePages => {
                "the checkpoint's valid word is stored before its pages are written"
            }
            MmdbFault::TruncateBeforeValid => {
                "the previous checkpoint is freed and the log truncated before the new checkpoint \
                 is valid"
            }
        }
    }

    /// Whether the fault only removes a write-back (harmless under eADR).
    pub fn only_removes_ordinary_flushes(self) -> bool {
        matches!(
            self,
            MmdbFault::SkipLogFlush | MmdbFault::SkipCheckpointFlush
        )
    }
}

crate::engine::common::named_fault!(MmdbFault, "mmdb fault");

/// MMDB's parameters.
#[derive(Clone, Debug)]
pub struct MmdbConfig {
    /// The concurrency-control protocol the DRAM tables run.
    pub protocol: Protocol,
    /// Options of the protocol.
    pub cc_options: CcOptions,
    /// Worker slots.
    pub max_threads: usize,
    /// The row size limit.
    pub max_row_bytes: usize,
    /// Group commit: transactions written as one log record at most.
    pub group: usize,
    /// Group commit: how long the log writer waits for a group to gather when fewer than
    /// `group` transactions are queued (zero: write what is queued at once).
    pub group_wait: Duration,
    /// 2 MiB pages of the log ring (fixed when the pool is formatted); 0: a quarter of the
    /// pool's pages, 1 to [`DEFAULT_LOG_PAGES`].
    pub log_pages: usize,
    /// Time between periodic checkpoints (zero: only when the log is half full).
    pub checkpoint_interval: Duration,
    /// Inline mode: a checkpoint every this many commits (0: only when the ring is full).
    pub checkpoint_every: u64,
    /// The log writer and the checkpointer run in background threads (true) or inline in the
    /// committing thread (false: for the crash simulator).
    pub background: bool,
    /// A deliberate ordering bug (test-only).
    pub fault: Option<MmdbFault>,
}

/// The most pages an automatically sized log ring takes ([`MmdbConfig::log_pages`] 0).
pub const DEFAULT_LOG_PAGES: usize = 256;

impl MmdbConfig {
    /// Defaults: groups of up to 64 transactions, no extra gathering wait (a group is what
    /// queued while the previous record was written: a timed wait of a few microseconds costs
    /// tens of them in the scheduler, measured 100 µs per commit at one thread), a log ring sized
    /// from the pool (up to 512 MiB), a checkpoint every 10 s, background threads, 16 threads,
    /// rows up to 4 KiB. A checkpoint copies every table: with a 16 MiB ring and one a second,
    /// checkpoints were nearly all of TPC-C's cost (7.5k tx/s against 67k for falcon, 2
    /// warehouses, 1 thread); main-memory engines checkpoint every tens of seconds.
    pub fn new(protocol: Protocol) -> MmdbConfig {
        MmdbConfig {
            protocol,
            cc_options: CcOptions::default(),
            max_threads: 16,
            max_row_bytes: 4096,
            group: 64,
            group_wait: Duration::ZERO,
            log_pages: 0,
            checkpoint_interval: Duration::from_secs(10),
            checkpoint_every: 0,
            background: true,
            fault: None,
        }
    }

    fn validate(&self) -> Result<(), DbError> {
        if self.max_threads == 0 || self.max_threads >= MAX_THREADS {
            return Err(DbError::Config(format!(
                "max_threads must be 1 to {} for mmdb (one slot is its own)",
                MAX_THREADS - 1
            )));
        }
        if self.group == 0 || self.group > 1 << 20 {
            return Err(DbError::Config(format!(
                "the MMDB group commit size must be 1 to {} transactions, not {}",
                1 << 20,
                self.group
            )));
        }
        if self.group_wait > Duration::from_secs(1) {
            return Err(DbError::Config(format!(
                "the MMDB group commit wait must be at most 1 s, not {:?}",
                self.group_wait
            )));
        }
        crate::engine::wal::check_ring_pages(self.log_pages, "MMDB")?;
        if self.max_row_bytes == 0 || self.max_row_bytes as u64 > PAGE_SIZE / 4 {
            return Err(DbError::Config(
                "max_row_bytes must be between 1 byte and a quarter of a 2 MiB page".into(),
            ));
        }
        Ok(())
    }
}

/// The MMDB engine.
pub struct MmdbEngine {
    core: Arc<Core>,
    catalog_store: CatalogStore,
    catalog: Mutex<Catalog>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    report: Option<RecoveryReport>,
}

/// The MMDB meta page.
const META_PAGE: RingMetaPage = RingMetaPage {
    engine: "MMDB",
    page_kind: kind::META,
    magic: meta::MAGIC,
    version: meta::VERSION,
};

/// Fresh DRAM tables, with one worker slot more than the engine's for loading.
fn make_tables(config: &MmdbConfig, pm_bytes: u64) -> Result<Arc<FalconEngine>, DbError> {
    crate::engine::shadow::make_shadow(
        config.protocol,
        config.cc_options,
        config.max_threads + 1,
        config.max_row_bytes,
        pm_bytes,
    )
}

impl MmdbEngine {
    /// Formats a fresh pool for MMDB.
    pub fn create(pool: Arc<Pool>, config: MmdbConfig) -> Result<Arc<MmdbEngine>, DbError> {
        let mut config = config;
        config.validate()?;
        crate::engine::common::require_durable_domain(EngineKind::Mmdb, pool.domain())?;
        if !config.protocol_supported() {
            return Err(DbError::UnsupportedProtocol {
                engine: EngineKind::Mmdb,
                protocol: config.protocol,
            });
        }
        config.log_pages =
            crate::engine::wal::ring_size(&pool, config.log_pages, DEFAULT_LOG_PAGES);
        let (pages, meta_page) = META_PAGE.format(&pool, config.max_row_bytes, config.log_pages)?;
        let ring = crate::engine::wal::ring_pages(
            &pool,
            &pages,
            kind::LOG,
            config.log_pages,
            true,
            "MMDB",
        )?;
        pool.write_u64(meta_page + meta::EPOCH, 1);
        pool.persist(meta_page + meta::EPOCH, 8);
        let tables = make_tables(&config, pool.len())?;
        let core = Core::new(
            pool,
            pages,
            meta_page,
            ring,
            config,
            tables,
            Default::default(),
            0,
            0,
            1,
        );
        Self::assemble(core, Catalog::default(), None)
    }

    /// Opens an MMDB pool, recovering it: the last valid checkpoint, then the log.
    pub fn open(pool: Arc<Pool>, config: MmdbConfig) -> Result<Arc<MmdbEngine>, DbError> {
        recovery::open(pool, config)
    }

    fn assemble(
        core: Core,
        catalog: Catalog,
        report: Option<RecoveryReport>,
    ) -> Result<Arc<MmdbEngine>, DbError> {
        let core = Arc::new(core);
        let threads = if core.config.background {
            core.start().map_err(DbError::Config)?
        } else {
            Vec::new()
        };
        Ok(Arc::new(MmdbEngine {
            catalog_store: RingMetaPage::catalog_store(core.meta_page),
            core,
            catalog: Mutex::new(catalog),
            threads: Mutex::new(threads),
            report,
        }))
    }

    /// What the log and the checkpoints did so far.
    pub fn stats(&self) -> MmdbStats {
        self.core.stats()
    }

    /// Takes a checkpoint now (the checkpointer takes them periodically).
    pub fn take_checkpoint(&self) -> Result<crate::engine::fir::CheckpointStats, DbError> {
        let done = self.core.checkpoint().map_err(|e| {
            self.core.state.lock().failed = Some(e.clone());
            DbError::Tx(TxError::PmFull(e))
        })?;
        Ok(crate::engine::fir::CheckpointStats {
            generation: done.generation,
            ct: done.covered + 1,
            entries: done.rows,
            pages: done.pages,
            ms: done.ms,
            // A full snapshot every time: the incremental fields stay at their defaults.
            ..Default::default()
        })
    }
}

impl MmdbConfig {
    /// Whether the DRAM tables run the protocol (every protocol the volatile engine runs).
    fn protocol_supported(&self) -> bool {
        EngineKind::Volatile.supports(self.protocol)
    }
}

impl ShadowHost for MmdbEngine {
    fn row_len(&self, table: TableId) -> Result<usize, TxError> {
        crate::engine::shadow::row_len(&self.catalog.lock(), table)
    }

    fn last_committed(&self) -> u64 {
        self.core.committed.load(Ordering::Acquire)
    }

    /// Under the commit lock: the DRAM commit, the next id and the redo's place in the queue;
    /// then the wait until the id's record is durable (group commit).
    fn commit_logged(
        &self,
        inner: &mut dyn EngineWorker,
        log: &mut Vec<u8>,
    ) -> Result<u64, TxError> {
        let log = std::mem::take(log);
        let core = &self.core;
        if let Some(why) = core.state.lock().failed.clone() {
            inner.abort();
            return Err(TxError::PmFull(why));
        }
        let limit = core.max_payload() - 32;
        if log.len() > limit {
            inner.abort();
            return Err(TxError::RowTooLarge(format!(
                "the transaction's redo log of {} bytes exceeds a quarter of the MMDB log ring \
                 ({limit} bytes): split the transaction or format the pool with a larger log \
                 (DbConfig::mmdb_log_pages)",
                log.len()
            )));
        }
        let id = {
            let _order = core.commit_lock.lock();
            inner.commit()?;
            let id = core.committed.load(Ordering::Relaxed) + 1;
            core.committed.store(id, Ordering::Release);
            core.enqueue(id, log);
            id
        };
        if core.config.background {
            core.wait_durable(id).map_err(TxError::PmFull)?;
        } else {
            core.log_inline().map_err(TxError::PmFull)?;
            let every = core.config.checkpoint_every;
            if every > 0 && id % every == 0 {
                self.take_checkpoint()
                    .map_err(|e| TxError::PmFull(e.to_string()))?;
            }
        }
        Ok(id)
    }
}

impl Drop for MmdbEngine {
    fn drop(&mut self) {
        // After a simulated power failure nothing more may touch PM.
        let crashed = self.core.pool.crash_sim().is_some_and(|s| s.has_crashed());
        if crashed {
            return;
        }
        // A clean close: the log writer logs what is queued before it stops.
        self.core.stop();
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }
}

impl Engine for MmdbEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Mmdb
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
            &*self.core.shadow,
            schema,
            self.core.config.max_row_bytes,
            "engine mmdb keeps its indexes in DRAM (Zen §2.2)",
        )?;
        *catalog = next;
        Ok(id)
    }

    fn worker(self: Arc<Self>, thread: usize) -> Result<Box<dyn EngineWorker>, DbError> {
        if thread >= self.core.config.max_threads {
            return Err(DbError::NoWorkerSlot(self.core.config.max_threads));
        }
        let inner = self.core.shadow.clone().worker(thread)?;
        Ok(Box::new(ShadowWorker::new(self, inner)))
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
        let counts = self.core.shadow.check_structure()?;
        recovery::check_log(&self.core)?;
        Ok(counts)
    }

    fn checkpoint(&self) -> Option<Result<crate::engine::fir::CheckpointStats, DbError>> {
        Some(self.take_checkpoint())
    }

    /// Drops `table` (issue 21): the DRAM table goes under the commit lock (a checkpoint copies
    /// the tables under it), then a checkpoint without the table's rows frees the pages of the
    /// previous one (its log records are skipped by recovery, `recovery.rs`).
    fn drop_table(&self, table: TableId) -> Result<(), DbError> {
        crate::engine::shadow::drop_table(
            &self.catalog,
            &self.catalog_store,
            &self.core.pool,
            table,
            || {
                let _order = self.core.commit_lock.lock();
                self.core.shadow.drop_table(table)
            },
            || {
                self.take_checkpoint()?;
                Ok(())
            },
        )
    }
}
