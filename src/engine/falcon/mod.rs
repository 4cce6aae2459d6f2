//! The Falcon engine (Falcon, SOSP'23, §4–5) and its variants: in-place updates of a single
//! version on PM, a per-thread **small log window** of redo entries, and **selective data flush**
//! (hinted flush + hot-tuple tracking). The variants `falcon-noflush`, `falcon-allflush`, `inp`
//! (§6.2's baseline: in place with a flushed redo log and no window), `outp` (§6.2's out-of-place
//! baseline, below) and `volatile` (durability off) share this code and differ only in their
//! commit policy (`Policy`, derived from the kind and domain).
//!
//! **`outp`** (Falcon §2.1.2 and §6.2, "a pure out-of-place update engine"): at commit every
//! updated row is copied whole, with the transaction's changes, into a free slot of the heap (a
//! new version); the index is repointed to it and the old version is marked deleted and reclaimed
//! like a deleted tuple (§5.4: once no running transaction is older). It is a variant of this
//! engine rather than its own folder because an out-of-place update is exactly "insert the new
//! version + delete the old one" in one transaction, which Falcon's commit, log and recovery
//! already make atomic; a separate engine would duplicate all of them. Where it departs from the
//! paper: the paper does not say how Outp makes a multi-tuple commit atomic; pmtx's Outp keeps
//! Inp's flushed redo log (a 256-slot ring) as its commit record, so its log carries each new
//! version whole (the paper's log-as-data would need a second commit protocol, Zen's LP bit, which
//! `zen` already measures). Indexes are DRAM only (a PM index rewritten on every update is what
//! §2.1 warns against; `outp` refuses `--index pm`), and only the single-version protocols run
//! ([`OUTP_PROTOCOLS`]): Falcon's DRAM version chains are keyed by tuple address, which an
//! out-of-place update changes.
//!
//! **`wbl`** (write-behind logging, Arulraj et al., VLDB'17; the baseline of Zen §4 and FIR §5):
//! `outp`'s out-of-place versions, flushed at commit, with no redo log at all; durability is the
//! group commit of a commit-timestamp gap (`wbl.rs`): `c_p`, persisted by a group-commit leader
//! once every commit below it has flushed its data, and `c_d`, Falcon's persisted tid lease.
//! Recovery discards the versions in the gap and keeps each key's newest version, with no redo
//! pass. Where it departs from the WBL paper: one `(c_p, c_d)` pair instead of a log of them
//! (recovery frees the gap's versions at once, so no later transaction needs to skip older gaps);
//! versions live in Falcon's heap slots with their commit tid in the header (WBL's tuple
//! header holds its commit timestamp too); a delete writes a tombstone version; the group commit
//! runs when a committer waits instead of on a 100 µs timer (Zen §4.1 configures WBL's log
//! record "roughly every 100us": a waiting committer is the same trigger, without the idle
//! delay). Its ordering costs two fences per writing transaction (the new versions' commit tids,
//! then their data: a reused slot must not look like an older committed version) plus the
//! group commit's, and one more for deletes. Protocols: [`WBL_PROTOCOLS`], those whose commit
//! tid is taken from the clock at commit (the gap's lower bound must not be passed by a commit
//! still in flight). DRAM indexes only, as `outp`. Its pools have their own layout (`wbl`): its
//! tuple states are not Falcon's.
//!
//! Commit (`commit.rs`, Algorithm 1, one function per step): lock (OCC: at commit; 2PL: during execution), validate, take
//! a commit tid, write the redo entries and the COMMITTED mark to the window slot, apply the
//! after-images in place, set each tuple's `write_ts` and release its lock, then the selective flush.
//!
//! **Departures from the paper, and why.**
//! - *ADR.* The paper assumes eADR. Under ADR the window slot (entries + mark, with a CRC so a torn
//!   slot is detected) is flushed and fenced before any in-place store, so the mark is durable
//!   before the data it covers changes; the updated lines are flushed and fenced before each
//!   tuple's `write_ts` is set and its lock released, so a durable `write_ts` implies durable data
//!   (recovery's replay filter relies on it). Hot-tuple tracking and `falcon-noflush` are refused
//!   under ADR: skipping the flush of committed data whose log slot will be reused loses it. Cost:
//!   two fences per writing transaction instead of none.
//! - *Replay filter.* A tuple's `write_ts` (the commit tid of its last writer) is written after its
//!   data; recovery replays a committed entry only if its tid exceeds the tuple's `write_ts`, in
//!   tid order across threads. Without it, replaying an older window entry could overwrite a newer
//!   durable update by another thread whose own slot was already reused.
//! - *Streamed stores.* Algorithm 1 stores the after-images in place and `clwb`s them. Where a
//!   line would be flushed anyway (every applied line under ADR; a tuple outside the hot set
//!   under eADR) a range of 256 bytes or more is written with non-temporal stores instead, and
//!   under ADR the redo payload too (its CRC covers it): the cold destination lines are not read
//!   first and need no flush; one fence before `write_ts` orders them, as it does the flushes
//!   (issue 13; the measurement is in docs/ARCHITECTURE.md, "Third round").
//! - *Spill.* A transaction whose redo does not fit its window slot writes the redo to a per-thread
//!   chain of spill pages and marks the slot SPILLED; after applying it fences and frees the slot
//!   at once, so the chain can be reused by the next large transaction.
//! - *Deleted tuples* (§5.4) are kept in a per-thread DRAM queue ordered by delete tid and reused
//!   once no running transaction is older; the paper persists this list in the heap, pmtx finds
//!   deleted slots again after a restart (as free slots: no transaction can still see them) by
//!   the heap scan (DRAM-index tables) or the lazy heap sweep (PM-index tables, `sweep.rs`).
//! - *Indexes* are in DRAM (rebuilt by a heap scan at recovery) or, per table, in PM (`tindex.rs`,
//!   issue 17): recovered by their own recovery functions, with no heap scan; stale locks and free
//!   slots are then found lazily while transactions run, and the clock restarts above a persisted
//!   tid lease (`sweep.rs`), where Falcon clears locks from the write sets in its window.
//! - *Dropping a table* (issue 21, not in the paper; `drop.rs`): with no worker alive, the
//!   catalog says `dropping`, the table's heap and index pages are freed, the catalog says
//!   `dropped`; recovery finishes an interrupted drop and skips window entries of tables that
//!   are not live.

mod commit;
mod drop;
pub mod layout;
mod recovery;
mod sweep;
mod tindex;
mod txcc;
mod wbl;
pub mod window;
mod worker;

use crate::alloc::PageManager;
use crate::catalog::{Catalog, CatalogStore, Schema, TableId};
use crate::cc::{CcOptions, CcShared, Protocol, TidClock, MAX_THREADS};
use crate::engine::{DbError, Engine, EngineKind, EngineWorker, RecoveryReport};
use crate::index::pm::PmSecondaryIndex;
use crate::index::{IndexPlacement, SecondaryIndex};
use crate::pmem::{PersistenceDomain, Pool};
use crossbeam_utils::CachePadded;
use layout::{kind, meta, tuple};
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tindex::{TableIndex, TableSecondary};

/// The protocols `outp` runs: the single-version ones. The multi-version protocols keep old
/// images in DRAM chains keyed by the tuple's address, which an out-of-place update changes.
pub const OUTP_PROTOCOLS: [Protocol; 8] = [
    Protocol::Occ,
    Protocol::NoWait,
    Protocol::WaitDie,
    Protocol::DlDetect,
    Protocol::To,
    Protocol::Silo,
    Protocol::Tictoc,
    Protocol::Hstore,
];

/// The protocols `wbl` runs: those whose commit tid is a clock reading taken at commit (OCC, the
/// 2PL family, H-Store), so a commit in flight never takes a tid below the group-committed `c_p`.
pub const WBL_PROTOCOLS: [Protocol; 5] = [
    Protocol::Occ,
    Protocol::NoWait,
    Protocol::WaitDie,
    Protocol::DlDetect,
    Protocol::Hstore,
];

/// A deliberate bug, for showing that the crash-consistency harness catches it (test-only: no
/// production configuration sets one). Each removes one ordering step that ADR needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Do not flush the window slot before its fence: the mark can be durable without its entries.
    SkipLogFlush,
    /// Do not fence after flushing the window slot: in-place stores can reach PM before the log.
    SkipLogFence,
    /// Make the COMMITTED mark durable first (without a CRC), then write the entries.
    CommitMarkFirst,
    /// Do not flush the updated lines before setting `write_ts` and releasing the locks.
    SkipDataFlush,
    /// Do not fence between the data flush and the `write_ts` stores.
    SkipDataFence,
    /// `outp` only: do not mark the old version of an updated row deleted (in the log or in the
    /// heap), so after a crash two versions of the row are live.
    OutpKeepOldLive,
    /// `wbl` only: no fence between the new versions' commit tids and their data, so a reused
    /// slot can hold new data under an older, committed tid.
    WblSkipTidFence,
    /// `wbl` only: acknowledge a commit without waiting for the group commit of `c_p`.
    WblAckBeforeCp,
    /// `wbl` only: free the superseded versions before the group commit covers the commit.
    WblFreeBeforeCp,
    /// Drop table (issue 21): free the table's pages before the catalog says `dropping`, so a
    /// crash in between leaves a live table with rows missing (`crashtest::drop` catches it).
    DropFreeBeforeTombstone,
    /// PM secondary indexes: do not log the old secondary keys a commit replaces
    /// (`SecondaryOld` entries), so a crash between the commit mark and the index changes
    /// leaves a stale pair that recovery cannot find.
    SecondarySkipOldLog,
    /// PM secondary indexes: remove the old pairs a commit replaces before its log entries and
    /// mark, so a crash before the mark leaves a row of a transaction that never committed
    /// without its pair.
    SecondaryRemoveBeforeLog,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 12] = [
        Fault::SkipLogFlush,
        Fault::SkipLogFence,
        Fault::CommitMarkFirst,
        Fault::SkipDataFlush,
        Fault::SkipDataFence,
        Fault::OutpKeepOldLive,
        Fault::WblSkipTidFence,
        Fault::WblAckBeforeCp,
        Fault::WblFreeBeforeCp,
        Fault::DropFreeBeforeTombstone,
        Fault::SecondarySkipOldLog,
        Fault::SecondaryRemoveBeforeLog,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Fault::SkipLogFlush => "skip-log-flush",
            Fault::SkipLogFence => "skip-log-fence",
            Fault::CommitMarkFirst => "commit-mark-first",
            Fault::SkipDataFlush => "skip-data-flush",
            Fault::SkipDataFence => "skip-data-fence",
            Fault::OutpKeepOldLive => "outp-keep-old-live",
            Fault::WblSkipTidFence => "wbl-skip-tid-fence",
            Fault::WblAckBeforeCp => "wbl-ack-before-cp",
            Fault::WblFreeBeforeCp => "wbl-free-before-cp",
            Fault::DropFreeBeforeTombstone => "drop-free-before-tombstone",
            Fault::SecondarySkipOldLog => "secondary-skip-old-log",
            Fault::SecondaryRemoveBeforeLog => "secondary-remove-before-log",
        }
    }

    /// What the fault breaks, for `--list-faults`.
    pub fn describe(self) -> &'static str {
        match self {
            Fault::SkipLogFlush => "the log window slot is not flushed before its fence",
            Fault::SkipLogFence => "no fence between the log flush and the in-place stores",
            Fault::CommitMarkFirst => "the COMMITTED mark is made durable before the redo entries",
            Fault::SkipDataFlush => {
                "updated lines are not flushed before write_ts and lock release"
            }
            Fault::SkipDataFence => "no fence between the data flush and the write_ts stores",
            Fault::OutpKeepOldLive => {
                "outp: the old version of an updated row is not marked deleted"
            }
            Fault::WblSkipTidFence => {
                "wbl: no fence between the new versions' commit tids and their data"
            }
            Fault::WblAckBeforeCp => "wbl: a commit returns before c_p covers it",
            Fault::WblFreeBeforeCp => {
                "wbl: superseded versions are freed before c_p covers their replacement"
            }
            Fault::DropFreeBeforeTombstone => {
                "drop table: the table's pages are freed before the catalog says it is dropping"
            }
            Fault::SecondarySkipOldLog => {
                "pm secondary indexes: the old keys a commit replaces are not logged"
            }
            Fault::SecondaryRemoveBeforeLog => {
                "pm secondary indexes: old pairs are removed before the commit is logged"
            }
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::engine::common::parse_named(s, &Fault::ALL, Fault::name, "fault")
    }
}

/// Parameters of a Falcon database.
#[derive(Clone, Debug)]
pub struct FalconConfig {
    /// Which variant.
    pub kind: EngineKind,
    /// Concurrency control.
    pub protocol: Protocol,
    /// Worker slots (threads), at most 256.
    pub max_threads: usize,
    /// Redo slots per thread window (Falcon: 2–3 transactions).
    pub window_slots: usize,
    /// Bytes per window slot, header included.
    pub window_slot_bytes: usize,
    /// Largest row, in bytes.
    pub max_row_bytes: usize,
    /// Hot tuples tracked per thread (0 disables hot-tuple tracking).
    pub hot_tuples: usize,
    /// A deliberate ordering bug for the crash-consistency harness (never set in production).
    pub fault: Option<Fault>,
    /// Options of the concurrency-control protocol (e.g. hstore's partitions).
    pub cc_options: CcOptions,
    /// Where the primary index of a table goes when its schema does not say (issue 17).
    pub index_placement: IndexPlacement,
    /// After a recovery that left heap pages to the lazy sweep (tables with PM indexes), sweep
    /// them in a background thread (true), or only as transactions reach them and when the
    /// structure check runs (false: the crash simulator, whose events must come from one thread).
    pub background_sweep: bool,
}

impl FalconConfig {
    /// Defaults for `kind`: 3 window slots of 4 KiB (Inp, Outp: a 1 MiB log ring per thread),
    /// 16 threads, rows up to 4 KiB, 1024 hot tuples.
    pub fn new(kind: EngineKind, protocol: Protocol) -> FalconConfig {
        let inp = matches!(kind, EngineKind::Inp | EngineKind::Outp | EngineKind::Wbl);
        FalconConfig {
            kind,
            protocol,
            max_threads: 16,
            window_slots: if inp { 256 } else { 3 },
            window_slot_bytes: 4096,
            max_row_bytes: 4096,
            hot_tuples: 1024,
            fault: None,
            cc_options: CcOptions::default(),
            index_placement: IndexPlacement::Dram,
            background_sweep: true,
        }
    }
}

/// What the variant does at commit, derived from the kind and the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Write redo entries at all (false: volatile).
    pub log: bool,
    /// Flush the window slot and fence before applying (ADR/msync always; Inp always).
    pub persist_log: bool,
    /// Flush the updated lines and fence before setting `write_ts` (ADR/msync; Inp).
    pub persist_data: bool,
    /// After release, `sfence` then `clwb` of the updated lines (Falcon's hinted flush, eADR).
    pub hinted_flush: bool,
    /// Skip the hinted flush of tuples in the hot set.
    pub track_hot: bool,
    /// Store a CRC in the slot (when one fence covers payload and mark).
    pub crc: bool,
    /// Outp, WBL: an update writes a new version to a free slot and repoints the index.
    pub out_of_place: bool,
    /// WBL: no log; new versions' commit tids are fenced before their data, deletes write
    /// tombstones, and a commit waits for the group commit of `c_p` (`wbl.rs`).
    pub wbl: bool,
}

impl Policy {
    fn new(
        kind: EngineKind,
        domain: PersistenceDomain,
        hot_tuples: usize,
    ) -> Result<Policy, DbError> {
        let flushing = domain.needs_flush();
        if kind == EngineKind::Volatile {
            return Ok(Policy {
                log: false,
                persist_log: false,
                persist_data: false,
                hinted_flush: false,
                track_hot: false,
                crc: false,
                out_of_place: false,
                wbl: false,
            });
        }
        crate::engine::common::require_durable_domain(kind, domain)?;
        if kind == EngineKind::FalconNoflush && flushing {
            return Err(DbError::Config(format!(
                "falcon-noflush is crash-consistent only under eADR (data must reach PM by eviction); \
                 under {domain} use falcon or falcon-allflush"
            )));
        }
        // Outp flushes its log and data as Inp does (Falcon §6.2: both baselines use clwb).
        let wbl = kind == EngineKind::Wbl;
        let out_of_place = kind == EngineKind::Outp || wbl;
        let inp = kind == EngineKind::Inp || out_of_place;
        Ok(Policy {
            log: !wbl,
            persist_log: (flushing || inp) && !wbl,
            persist_data: flushing || inp,
            hinted_flush: !flushing
                && matches!(kind, EngineKind::Falcon | EngineKind::FalconAllflush),
            track_hot: !flushing && kind == EngineKind::Falcon && hot_tuples > 0,
            crc: (flushing || inp) && !wbl,
            out_of_place,
            wbl,
        })
    }
}

/// A table at run time: its schema, slot geometry and indexes.
pub(crate) struct TableRt {
    pub id: TableId,
    pub schema: Schema,
    pub row: usize,
    pub slot: u64,
    pub index: TableIndex,
    pub secondary: Vec<TableSecondary>,
    /// The largest commit tid of a delete in this table (raised before the key leaves the
    /// index): a snapshot or MVTO transaction older than it that misses a key may have missed
    /// it because of that delete (`FalconWorker::resolve_miss`).
    pub deleted_up_to: std::sync::atomic::AtomicU64,
    /// The largest tid of a TO or MVTO transaction that scanned this table. An older
    /// transaction's insert committed after that scan would be a row the younger scan missed
    /// though the timestamp order puts it first (a phantom its read timestamps cannot catch: an
    /// absent key has no tuple to stamp), so such an insert fails at commit
    /// (`FalconWorker::inserts_follow_younger_scans`). Conservative: the whole table, not the
    /// range.
    pub scanned_up_to: std::sync::atomic::AtomicU64,
}

impl TableRt {
    fn new(
        id: TableId,
        schema: Schema,
        index: TableIndex,
        secondary: Vec<TableSecondary>,
    ) -> TableRt {
        let row = schema.row_size();
        TableRt {
            id,
            row,
            slot: tuple::slot_size(row),
            index,
            secondary,
            schema,
            deleted_up_to: std::sync::atomic::AtomicU64::new(0),
            scanned_up_to: std::sync::atomic::AtomicU64::new(0),
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

/// A thread slot's allocation state for one table (DRAM only; rebuilt at recovery).
#[derive(Default)]
pub(crate) struct TableAlloc {
    /// Next never-used slot in the current page, and the page's end.
    pub bump: u64,
    pub end: u64,
    /// Free slots (from recovery, aborted inserts, reclaimed deletes).
    pub free: Vec<u64>,
    /// Deleted slots with their delete tid, oldest first (Falcon §5.4).
    pub deleted: VecDeque<(u64, u64)>,
}

/// A thread slot's state, handed to the worker that claims the slot.
#[derive(Default)]
pub(crate) struct ThreadState {
    pub window: Option<u64>,
    pub cursor: usize,
    pub spill_pages: Vec<u64>,
    pub tables: Vec<TableAlloc>,
    pub last_tid: u64,
}

/// The Falcon engine, shared by its workers.
pub struct FalconEngine {
    pub(crate) kind: EngineKind,
    pub(crate) domain: PersistenceDomain,
    pub(crate) protocol: Protocol,
    pub(crate) policy: Policy,
    pub(crate) pool: Arc<Pool>,
    pub(crate) pages: Arc<PageManager>,
    pub(crate) config: FalconConfig,
    catalog_store: CatalogStore,
    /// The meta page's offset (PM index roots, the tid lease).
    pub(crate) meta_page: u64,
    catalog: Mutex<Catalog>,
    pub(crate) tables: RwLock<Vec<Arc<TableRt>>>,
    pub(crate) clock: TidClock,
    /// Per thread: start timestamp of its running transaction, or `u64::MAX`.
    pub(crate) active: Box<[CachePadded<AtomicU64>]>,
    pub(crate) threads: Box<[Mutex<Option<ThreadState>>]>,
    pub(crate) last_commit: crate::engine::common::LastCommits,
    /// The protocols' shared context (waits-for, partitions, epoch, DRAM versions).
    pub(crate) cc: CcShared,
    report: Option<RecoveryReport>,
    /// The heap pages recovery left to the lazy sweep, if any (`sweep.rs`).
    pub(crate) sweep: Option<sweep::Sweep>,
    /// The persisted tid lease: every commit tid's timestamp is below it.
    pub(crate) lease: AtomicU64,
    lease_lock: Mutex<()>,
    /// WBL: the group commit of `c_p` (`wbl.rs`).
    pub(crate) group: Option<wbl::GroupCommit>,
}

impl FalconEngine {
    /// Visits every committed row of table `table` as `(key, row bytes)`, in no particular
    /// order. Not a snapshot by itself: a caller that needs one holds off commits meanwhile
    /// (MMDB's checkpoint does, under its commit lock). A row whose slot is not `LIVE` (an
    /// uncommitted insert, a committed delete) is skipped.
    pub(crate) fn for_each_committed_row(&self, table: TableId, mut f: impl FnMut(u64, &[u8])) {
        let Some(t) = self.tables.read().get(table as usize).cloned() else {
            return;
        };
        let mut row = vec![0u8; t.row];
        t.index.for_each(|key, slot| {
            if self.pool.read_u64(slot + tuple::FLAGS) == tuple::LIVE
                && self.pool.read_u64(slot + tuple::KEY) == key
            {
                self.pool.read_bytes(slot + tuple::HEADER, &mut row);
                f(key, &row);
            }
        });
    }

    /// Refuses a protocol the variant does not run (Outp: the multi-version ones).
    fn check_protocol(config: &FalconConfig) -> Result<(), DbError> {
        if !config.kind.supports(config.protocol) {
            return Err(DbError::UnsupportedProtocol {
                engine: config.kind,
                protocol: config.protocol,
            });
        }
        Ok(())
    }

    fn validate(config: &FalconConfig) -> Result<(), DbError> {
        if config.max_threads == 0 || config.max_threads > MAX_THREADS {
            return Err(DbError::Config(format!(
                "max_threads must be 1 to {MAX_THREADS}"
            )));
        }
        if config.window_slots < 2 {
            return Err(DbError::Config(
                "the log window needs at least 2 slots: a slot is reused only after the next \
                 transaction's fence has made the previous one's data durable"
                    .into(),
            ));
        }
        // Checked: on open both numbers come from the pool's meta page.
        let window_bytes = config
            .window_slots
            .checked_mul(config.window_slot_bytes)
            .map_or(u64::MAX, |b| b as u64);
        if config.window_slot_bytes < 256 || window_bytes > crate::alloc::PAGE_SIZE {
            return Err(DbError::Config(format!(
                "window slots of {} bytes × {} must be at least 256 bytes each and fit in one 2 MiB page",
                config.window_slot_bytes, config.window_slots
            )));
        }
        crate::engine::common::check_partitions(config.cc_options.partitions)?;
        if config.hot_tuples > crate::engine::common::MAX_HOT_TUPLES {
            return Err(DbError::Config(format!(
                "hot_tuples must be at most {}, not {}",
                crate::engine::common::MAX_HOT_TUPLES,
                config.hot_tuples
            )));
        }
        if config.max_row_bytes == 0
            || tuple::slot_size(config.max_row_bytes) > crate::alloc::PAGE_SIZE
        {
            return Err(DbError::Config(
                "max_row_bytes must be between 1 byte and a 2 MiB page".into(),
            ));
        }
        Ok(())
    }

    /// Formats a fresh pool for Falcon.
    pub fn create(pool: Arc<Pool>, config: FalconConfig) -> Result<Arc<FalconEngine>, DbError> {
        Self::check_protocol(&config)?;
        Self::validate(&config)?;
        let policy = Policy::new(config.kind, pool.domain(), config.hot_tuples)?;
        check_placement(config.kind, config.index_placement)?;
        let (pages, meta_page) = crate::engine::meta::format(
            &pool,
            &meta_layout(&[
                (meta::F_VERSION, meta::VERSION),
                (meta::F_MAX_THREADS, config.max_threads as u64),
                (meta::F_WINDOW_SLOTS, config.window_slots as u64),
                (meta::F_WINDOW_SLOT_BYTES, config.window_slot_bytes as u64),
                (meta::F_MAX_ROW, config.max_row_bytes as u64),
                (meta::F_CATALOG_SLOT, meta::CATALOG_SLOT_BYTES),
            ]),
        )?;
        Ok(Arc::new(Self::assemble(
            pool,
            Arc::new(pages),
            meta_page,
            config,
            policy,
            Catalog::default(),
            Vec::new(),
            None,
        )))
    }

    /// Opens a Falcon pool, running recovery (§5.3). The window geometry and row limit come from
    /// the pool; `config` supplies the variant, protocol and thread count (which must not be
    /// smaller than the pool's).
    pub fn open(pool: Arc<Pool>, mut config: FalconConfig) -> Result<Arc<FalconEngine>, DbError> {
        let started = std::time::Instant::now();
        Self::check_protocol(&config)?;
        check_placement(config.kind, config.index_placement)?;
        let meta_page = crate::engine::meta::open(
            &pool,
            &meta_layout(&[(meta::F_VERSION, meta::VERSION)]),
            "Falcon",
        )?;
        let pages = Arc::new(PageManager::open(&pool)?);
        let r = |f: u64| pool.read_u64(meta_page + f);
        let stored_threads = r(meta::F_MAX_THREADS) as usize;
        config.max_threads = config.max_threads.max(stored_threads);
        config.window_slots = r(meta::F_WINDOW_SLOTS) as usize;
        config.window_slot_bytes = r(meta::F_WINDOW_SLOT_BYTES) as usize;
        config.max_row_bytes = r(meta::F_MAX_ROW) as usize;
        Self::validate(&config)
            .map_err(|e| DbError::Corrupt(format!("meta page parameters: {e}")))?;
        let policy = Policy::new(config.kind, pool.domain(), config.hot_tuples)?;
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
        for schema in &catalog.tables {
            if let Some(placement) = schema.index_placement {
                check_placement(config.kind, placement).map_err(|e| {
                    DbError::Config(format!("table '{}' of this pool: {e}", schema.name))
                })?;
            }
        }
        let (catalog, dropped_pages) =
            drop::finish_drops(&pool, &pages, meta_page, catalog, &catalog_store)?;
        let catalog_ms = started.elapsed().as_secs_f64() * 1e3;
        let index_started = std::time::Instant::now();
        let (indexes, index_facts) = recovery::recover_indexes(&pool, &pages, meta_page, &catalog)?;
        let index_ms = index_started.elapsed().as_secs_f64() * 1e3;
        let mut engine = Self::assemble(
            pool, pages, meta_page, config, policy, catalog, indexes, None,
        );
        let (mut report, floor) = recovery::recover(&mut engine)?;
        report.phases.splice(
            0..0,
            [
                ("catalog".to_string(), catalog_ms),
                ("index recovery".to_string(), index_ms),
            ],
        );
        report.facts.extend(index_facts);
        if dropped_pages > 0 {
            report
                .facts
                .push(("pages of dropped tables freed".into(), dropped_pages));
        }
        report.total_ms += catalog_ms + index_ms;
        engine.clock = TidClock::new(floor);
        engine.cc.snapshots.raise_to(floor);
        engine.report = Some(report);
        let background =
            engine.config.background_sweep && engine.sweep.as_ref().is_some_and(|s| s.pending());
        let engine = Arc::new(engine);
        if background {
            sweep::spawn(&engine);
        }
        Ok(engine)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        meta_page: u64,
        config: FalconConfig,
        policy: Policy,
        catalog: Catalog,
        indexes: Vec<(TableIndex, Vec<TableSecondary>)>,
        report: Option<RecoveryReport>,
    ) -> FalconEngine {
        let floor = 0;
        let tables = catalog
            .tables
            .iter()
            .zip(indexes)
            .enumerate()
            .map(|(i, (s, (index, secondary)))| {
                Arc::new(TableRt::new(i as TableId, s.clone(), index, secondary))
            })
            .collect();
        let threads = (0..config.max_threads)
            .map(|_| Mutex::new(Some(ThreadState::default())))
            .collect();
        let group = policy.wbl.then(|| {
            wbl::GroupCommit::new(
                config.max_threads,
                meta_page,
                pool.read_u64(meta_page + wbl::CP_AT),
            )
        });
        FalconEngine {
            kind: config.kind,
            domain: pool.domain(),
            protocol: config.protocol,
            policy,
            catalog_store: CatalogStore {
                base: meta_page + meta::CATALOG_AT,
                slot_bytes: meta::CATALOG_SLOT_BYTES,
            },
            meta_page,
            catalog: Mutex::new(catalog),
            tables: RwLock::new(tables),
            clock: TidClock::new(floor),
            active: (0..config.max_threads)
                .map(|_| CachePadded::new(AtomicU64::new(u64::MAX)))
                .collect(),
            threads,
            last_commit: crate::engine::common::LastCommits::new(config.max_threads),
            cc: CcShared::new(config.max_threads, config.cc_options),
            report,
            pages,
            config,
            pool,
            sweep: None,
            lease: AtomicU64::new(0),
            lease_lock: Mutex::new(()),
            group,
        }
    }

    /// Makes sure the persisted tid lease exceeds `tid`'s timestamp before `tid` is written
    /// anywhere in PM (a window slot, a `write_ts`, a lock word), so that recovery can start the
    /// clock above every tid without reading the heap (`sweep.rs`). One load on the fast path;
    /// a persisted 8-byte store once per `LEASE_SPAN` µs of clock.
    #[inline]
    pub(crate) fn ensure_lease(&self, tid: u64) {
        let ts = crate::cc::tid_timestamp(tid);
        if ts < self.lease.load(Ordering::Acquire) || !(self.policy.log || self.policy.wbl) {
            return;
        }
        let _one = self.lease_lock.lock();
        if ts < self.lease.load(Ordering::Acquire) {
            return;
        }
        let lease = ts + sweep::LEASE_SPAN;
        let at = self.meta_page + meta::TID_LEASE_AT;
        self.pool.write_u64_ordered(at, lease);
        self.pool.persist(at, 8);
        self.lease.store(lease, Ordering::Release);
    }

    /// Makes the page of tuple `t` safe to touch (`sweep.rs`): a no-op unless the lazy sweep
    /// is still running.
    #[inline]
    pub(crate) fn gate(&self, t: u64) {
        if let Some(sweep) = &self.sweep {
            sweep.gate(self, t);
        }
    }
}

impl FalconEngine {
    /// Creates table `id`'s persistent indexes, primary and secondary, each in pages of its own
    /// tag (owner 0: the primary; `1 + i`: secondary `i`), and records their roots. Crash order:
    /// the indexes' pages, then their root words, then (the caller) the catalog naming the
    /// table; a crash before the catalog leaves pages and roots of a table id the catalog does
    /// not have, which recovery frees.
    fn create_pm_indexes(
        &self,
        id: TableId,
        schema: &Schema,
    ) -> Result<(TableIndex, Vec<TableSecondary>), DbError> {
        if u64::from(id) >= meta::MAX_ROOTS {
            return Err(DbError::Config(format!(
                "a persistent index needs a root word in the meta page: at most {} tables",
                meta::MAX_ROOTS
            )));
        }
        if schema.secondary.len() as u64 > meta::SECONDARY_ROOTS {
            return Err(DbError::Config(format!(
                "table '{}': {} secondary indexes, but a table with persistent (pm) indexes has \
                 at most {}",
                schema.name,
                schema.secondary.len(),
                meta::SECONDARY_ROOTS
            )));
        }
        let tag = |owner: u8| crate::alloc::PageTag {
            kind: kind::INDEX,
            owner,
            value: u64::from(id),
        };
        let failed = |what: String, e: String| {
            DbError::Config(format!(
                "table '{}': cannot create its persistent {what}: {e}",
                schema.name
            ))
        };
        let index = TableIndex::create_pm(schema.primary_index, &self.pool, &self.pages, tag(0))
            .map_err(|e| failed("index".into(), e))?;
        let mut roots = vec![(meta::primary_root_at(u64::from(id)), index.root())];
        let mut secondary = Vec::with_capacity(schema.secondary.len());
        for (i, def) in schema.secondary.iter().enumerate() {
            let sec =
                PmSecondaryIndex::create(self.pool.clone(), self.pages.clone(), tag(1 + i as u8))
                    .map_err(|e| failed(format!("secondary index '{}'", def.name), e.to_string()))?;
            roots.push((meta::secondary_root_at(u64::from(id), i as u64), sec.root()));
            secondary.push(TableSecondary::Pm(sec));
        }
        for (at, root) in roots {
            self.pool.write_u64_ordered(self.meta_page + at, root);
            self.pool.persist(self.meta_page + at, 8);
        }
        Ok((index, secondary))
    }
}

impl Engine for FalconEngine {
    fn kind(&self) -> EngineKind {
        self.kind
    }

    fn domain(&self) -> PersistenceDomain {
        self.domain
    }

    fn catalog(&self) -> Catalog {
        self.catalog.lock().clone()
    }

    fn create_table(&self, mut schema: Schema) -> Result<TableId, DbError> {
        // The placement is resolved now and recorded, so that a later open with another default
        // finds the index where it is.
        let placement = *schema
            .index_placement
            .get_or_insert(self.config.index_placement);
        check_placement(self.kind, placement)?;
        let mut catalog = self.catalog.lock();
        let mut next = catalog.clone();
        let id = next.add(schema.clone(), self.config.max_row_bytes)?;
        let (index, secondary) = match placement {
            IndexPlacement::Dram => (
                TableIndex::dram(schema.primary_index),
                schema
                    .secondary
                    .iter()
                    .map(|_| TableSecondary::Dram(SecondaryIndex::new()))
                    .collect(),
            ),
            IndexPlacement::Pm => self.create_pm_indexes(id, &schema)?,
        };
        self.catalog_store.store(&self.pool, &next)?;
        *catalog = next;
        self.tables
            .write()
            .push(Arc::new(TableRt::new(id, schema, index, secondary)));
        Ok(id)
    }

    fn worker(self: Arc<Self>, thread: usize) -> Result<Box<dyn EngineWorker>, DbError> {
        Ok(Box::new(worker::FalconWorker::new(self, thread)?))
    }

    fn drop_table(&self, table: TableId) -> Result<(), DbError> {
        self.drop_table_now(table)
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
        if let Some(sweep) = &self.sweep {
            sweep.finish(self);
            if let Some(problem) = sweep.problems().into_iter().next() {
                return Err(problem);
            }
        }
        recovery::check_structure(self)
    }

    fn finish_background(&self) -> Option<crate::engine::BackgroundWork> {
        let sweep = self.sweep.as_ref()?;
        let pending_pages = sweep.pages();
        sweep.finish(self);
        let (locks_cleared, dangling, ms) = sweep.stats();
        Some(crate::engine::BackgroundWork {
            what: format!(
                "heap sweep of {pending_pages} pages: {locks_cleared} stale locks cleared, \
                 {dangling} index entries of uncommitted inserts withdrawn"
            ),
            finished_ms: ms.unwrap_or(0.0),
        })
    }

    fn index_info(&self) -> Vec<crate::engine::IndexInfo> {
        self.tables
            .read()
            .iter()
            .map(|t| crate::engine::IndexInfo {
                placement: t.index.placement(),
                kind: t.schema.primary_index,
                entries: t.index.len() as u64,
                // The secondary indexes count too: they follow the table's placement.
                dram_bytes: (t.index.memory_bytes()
                    + t.secondary.iter().map(|s| s.memory_bytes()).sum::<usize>())
                    as u64,
                pm_bytes: t.index.pm_bytes()
                    + t.secondary.iter().map(|s| s.pm_bytes()).sum::<u64>(),
            })
            .collect()
    }
}

/// Refuses a PM index where the variant cannot keep one: `volatile` has no durable pool state
/// to find it in.
fn check_placement(kind: EngineKind, placement: IndexPlacement) -> Result<(), DbError> {
    if placement == IndexPlacement::Pm && matches!(kind, EngineKind::Outp | EngineKind::Wbl) {
        return Err(DbError::Config(format!(
            "{kind} keeps its indexes in DRAM: an out-of-place update repoints the index on every \
             update (Falcon §2.1); persistent (pm) indexes need falcon, falcon-allflush, \
             falcon-noflush or inp"
        )));
    }
    if placement == IndexPlacement::Pm && kind == EngineKind::Volatile {
        return Err(DbError::Config(
            "the volatile engine keeps no durable state: persistent (pm) indexes need falcon,              falcon-allflush, falcon-noflush or inp"
                .into(),
        ));
    }
    Ok(())
}

/// The Falcon meta page's layout, with the `fields` a format writes or an open checks.
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
