//! FIR (Electronics 2025, `shared/papers/003_*.txt`): time-ordered append-only storage on PM,
//! tuple headers in DRAM, MVTO, a last-committed-transaction table (LCTT) as the only commit
//! record. `--engine fir`; see docs/ARCHITECTURE.md ("FIR").
//!
//! # How the paper maps onto the code
//!
//! | paper | code |
//! | --- | --- |
//! | §4.1 tuple_content in blocks, regions per table and thread | [`layout`]: block pages tagged (thread, table, sequence); `storage::Region` appends |
//! | §4.1 tuple_header in tiles, update_map, logical address | `storage::{Tile, Header, logical}` |
//! | §4.1 index value = logical address of the newest version | the table's DRAM `PrimaryIndex` |
//! | §4.1 LCTT, §4.2.1 group commit | `layout::meta::LCTT_AT`: a word per thread, eight per line |
//! | §4.2.1 lifetime: MVTO, write lock, end_ts, new header, w_set | `worker.rs` |
//! | §4.2.1 Algorithm 1 `Persist` | `worker::FirWorker::persist` |
//! | §4.2.1 abort resets the regions' empty-slot positions | `worker::FirWorker::abort` |
//! | §4.3 index leaf checkpoint (full), CT, §4.3.2 consistency, the checkpoint thread | `checkpoint.rs`, `FirEngine::start_checkpointer` |
//! | §4.3.1 Algorithm 2: MarkNode, GetIncrement, FlushChpt, MergeAndPersist | `checkpoint::LeafMarks::mark`, `FirEngine::{get_increment, merge_and_write}` |
//! | §4.3.3 time cost model (eqs. 1–4) | `cost.rs` |
//! | §4.4.1 undo/redo: committed = txnId ≤ LCTT of the region's thread, from CT on | `recovery.rs` (binary search per region) |
//! | §4.4.2 index rebuild from the checkpoint, bottom up, in parallel | `recovery::load_checkpoint` (one thread per core over the pages), `PrimaryIndex::from_sorted_by` (bulk build), `recovery::install_headers` (one thread per core, blocks split), `recovery::redo_part` (one thread per core, keys split) |
//! | §4.5 GC: gc_array, redistribution, checkpoint, free | `worker::FirWorker::collect_garbage`, `gc.rs` (free record) |
//!
//! A transaction runs on one worker thread, which is bound to one region of every table (its
//! thread slot). A write takes the newest version's latch, checks MVTO's rules (the newest
//! version is committed, began at or before the transaction and was not read by a younger one),
//! takes the next empty slot of the thread's region (logical address = region, block, offset),
//! writes a pending header there (begin_ts = txnId, prev = the old version) and points the index
//! at it. Commit persists the new tuple contents with Algorithm 1 (copy, then `clwb` + `sfence`
//! per line), then stores txnId in the thread's LCTT word and persists it: that store is the
//! commit point. Only then do the pending headers become committed (so no transaction ever reads
//! a version that a crash could take away), old versions get their end_ts and update_map bit.
//!
//! Because a thread's transactions run one after another and every write of a transaction goes
//! to that thread's regions, each region's slots are in commit order, and everything a
//! transaction wrote is in the regions of one thread. So a version is committed exactly when its
//! txnId is at most its thread's LCTT word, committed versions form a prefix of every region,
//! and the versions a crash interrupted are at the region's end (§4.4.1).
//!
//! # Protocols
//!
//! MVTO only ([`SUPPORTED_PROTOCOLS`]). FIR's tuple headers carry exactly MVTO's metadata
//! (begin_ts, end_ts, read_ts, version chain, §4.2.1), and recovery's "largest txnId wins" and
//! "txnId ≤ LCTT" rules need txnIds that are fixed when the transaction starts (so that a
//! thread's txnIds grow in its commit order) and that order every key's versions: MVTO gives
//! both. The single-version protocols would need the CC words FIR does not keep, and OCC-style
//! commit timestamps are taken after the slots are written.
//!
//! # Durability domains
//!
//! The paper assumes ADR: Algorithm 1's `clwb` and `sfence` per line, then the LCTT word's
//! `clwb` and `sfence`. Under eADR the caches are persistent and x86 stores reach them in program
//! order, so FIR stores the contents (one copy per tuple) and then the LCTT word with no flush and
//! no fence: a crash keeps a prefix of the stores, and the LCTT word is last. The ADR cost over
//! eADR is one `clwb` and one `sfence` per cache line of new content, plus one of each per commit
//! for the LCTT.
//!
//! # Departures from the paper, and why
//!
//! - **A block is a 2 MiB page** of the page manager (the paper: 2,048 slots), so the page table
//!   is the only allocation metadata on PM and freeing a block frees a page. A block holds up to
//!   65,536 slots (the 16-bit offset of a logical address).
//! - **One region per table per thread slot**, never shared: the paper binds each thread to a
//!   region too; here the region *is* the thread slot.
//! - **The update_map is in DRAM** (with the tile); recovery does not need it (the newest
//!   committed version of a key wins, §4.4.1) and rebuilds it.
//! - **Deletes are tombstones** (a tuple_content with the TOMBSTONE bit): recovery must know that
//!   a key was deleted after the version it finds. A committed delete removes the key from the
//!   index; the table keeps the largest committed-delete txnId, an insert below it aborts (so a
//!   re-inserted key always outranks its tombstone), and a miss of an older transaction is a
//!   retryable conflict (`resolve_miss`), as in Zen and Falcon.
//! - **Group commit** (§4.2.1): the LCTT words of eight threads share a cache line, and each
//!   committing thread writes back that line, so commits of several threads in flight at once
//!   reach PM in one line write. The thread acknowledges its commit only once its own word is
//!   durable (pmtx's contract: acknowledged = durable), rather than from a commit queue.
//! - **Algorithm 1 per run of contiguous slots**: the contents of a transaction's consecutive
//!   slots of one region are copied together and their lines flushed once each (`clwb`; `sfence`
//!   per line, as written), so a line shared by two new tuples is not written back twice.
//! - **Incremental checkpoints keep their marks in FIR's own leaf map** (Algorithm 2): pmtx's
//!   `PrimaryIndex` is shared with other engines, so MarkNode marks a FIR-side *leaf* (64
//!   consecutive keys of a table: the paper's `t_access` and a bitmap of the written keys) rather
//!   than the index's nodes; the map holds only the leaves marked since the previous checkpoint,
//!   which is the paper's skip of every subtree whose `t_access < t_p`. A worker marks after
//!   installing its versions (the paper: on the access path during the write), so that draining the
//!   marks after CT cannot miss a transaction below CT. MergeAndPersist is page-level
//!   copy-on-write: the checkpoint is a directory of pages of sorted entries, and only the pages
//!   whose key range holds a marked key are read, merged and rewritten. Each entry also records
//!   its version's txnId, so that recovery can order it against the versions it redoes.
//! - **The time cost model** (`cost.rs`) uses equations 1, 3 and 4 with the node count of an
//!   `M`-ary tree, `(M^(h+1) − 1)/(M − 1)` (the paper omits the `/(M − 1)`), and `α` = the share
//!   of the index no marked key falls in, measured from the marks; the paper's equation 2 (a
//!   Gini–Simpson index over sampled records) grows as writes spread out, the opposite of what its
//!   equation 3 needs, so it is only reported (`CheckpointStats::gini_simpson`). The constants are
//!   configurable (`FirConfig::cost_model`), not measured at start.
//! - **CT is not the checkpoint's start time but the oldest running txnId** (or the clock + 1):
//!   §4.3.2 resolves uncommitted versions by walking to the last committed one, which leaves out
//!   a transaction running during the scan whose txnId is below the start time and that commits
//!   after; recovery redoes from CT, so that transaction is redone (test:
//!   `fir_api::a_transaction_running_during_a_checkpoint_survives_recovery`).
//! - **Recovery finds CT in each region by binary search** (the paper walks back from the last
//!   block), reads on to the first uncommitted slot, and zeroes and persists the words of the
//!   uncommitted slots after it (the transaction the crash interrupted), so that a later LCTT
//!   value above their txnId cannot make them look committed; this makes recovery idempotent
//!   (a crash during recovery is recovered again). Redo applies versions in txnId order, in
//!   parallel (§4.4.2 builds the index in parallel): the versions are split over the cores by
//!   key, so every version of a key is applied by one thread in txnId order and no two threads
//!   meet on a key. The indexes redo works on are built from the checkpoint with room for the
//!   versions redo may insert (the paper's bottom-up build never rebalances; a growing hash
//!   index would rehash its entries several times). The update_map is rebuilt
//!   without a pass over the versions: every used slot of a block starts obsolete (one word per
//!   64 slots) and installing a version from the checkpoint or by redo marks it live. What the
//!   scan reads of PM is counted (`region slots read`: the binary search's probes, the versions
//!   from CT on, the non-empty slots after the committed prefix) so that a test can hold it to
//!   O(m + log n). What stays proportional to the data rather than to m: loading the checkpoint
//!   (every live key, as in the paper) and making a tile per block (its DRAM headers). The tiles
//!   are made in parallel, and the checkpoint's headers are written block by block (a counting
//!   sort; in key order they scattered over the tiles), each thread over its own range of blocks
//!   (split by key range, both threads wrote into every tile and its cache lines moved between
//!   the cores). Each table's primary index is built from
//!   the checkpoint's sorted entries at once, where they were read, not key by key (§4.4.2's
//!   bottom-up build): `PrimaryIndex::from_sorted_by` builds an ordered index leaves first, then each inner level,
//!   and a hash index (which the paper does not have: pmtx's tables may choose one) shard by
//!   shard in parallel, each shard's table sized for its own entries plus the versions redo may
//!   insert and filled with no lock or seqlock bump per key, in home-bucket order (front to back,
//!   not one cache and TLB miss per key). The checkpoint's pages are read straight into one
//!   array sized from their headers, each thread into its own part. Inserting key by key into the shared
//!   index cost about 1 µs per key at 1 GiB (a lock and a cache miss into a table the size of
//!   the whole index per key). The header install clears the update_map one word per 64 slots.
//!   Redo then applies the versions since CT to the built indexes with ordinary operations,
//!   loading the index bucket and header of a version a few ahead while it applies one.
//! - **Secondary indexes are rebuilt from the rows** after the primary index (the paper
//!   checkpoints every index; pmtx's secondary indexes map to primary keys and are rebuilt by
//!   reading the live rows).
//! - **Long transactions (§4.2.2)** need no region of their own here: a region is written only
//!   at commit (in one run), so a long transaction blocks nothing but its own thread.
//! - **Garbage collection** (§4.5, `gc.rs`) is run by each worker (every `gc_every_commits` of
//!   its commits), not by a GC thread: over its own regions, and over those of every slot that
//!   stopped writing (its commit count did not change since the previous round looked), which
//!   nothing else would collect. A worker holds its slot's state only while a transaction or a
//!   round runs and parks it in its slot (`FirEngine::slots`, the state's one home) between
//!   transactions; a round takes another slot's state with `try_lock` only (no lock order to
//!   keep) and takes no checkpoint while it holds it (a table drop holds the checkpoint lock
//!   while it locks the slots).
//!   Redistribution copies a live version by superseding it in an MVTO transaction of the
//!   collecting worker (the copy gets a new txnId and lands in that worker's region), where the
//!   paper copies into a `gc_region`: recovery then needs no rule for copies (the newest
//!   committed version of a key wins). The copies go in transactions of 32 versions: one
//!   transaction over every live version of 8 blocks kept thousands of versions pending while it
//!   copied (readers waited, then aborted) and lost the whole round to one conflict; uniform
//!   16-op YCSB at 2 threads aborted 1.8–2.7 % with it and 0.4–1.3 % with batches (at θ 0.99
//!   the ~5 % that stays is MVTO conflicts between the workers on the hot keys)
//!   (`worker::tests::gc_collects_the_regions_of_a_worker_that_stopped_writing`). The paper's `gc_array` / recycle
//!   queue is found when a round runs (full blocks at least `gc_threshold` obsolete). A block is
//!   freed after the checkpoint that follows (the paper's second stage), once that checkpoint's
//!   CT and every running transaction are past the end of stage 1; the free is made crash-safe
//!   by a free record in the meta page that recovery finishes. The paper takes that checkpoint
//!   "immediately"; here, while the background checkpointer runs, the round leaves the blocks to
//!   its next checkpoint and a later round frees them, because the worker that runs the round
//!   would wait for the whole checkpoint: with rounds every 128 commits under pool pressure, a
//!   2-thread YCSB run over 1 M keys in a 4 GiB pool all but stopped after 20 s (issue 14: its
//!   checkpoint CT moved 249,550 → 253,651 from the 20 s to the 60 s kill). The round still
//!   takes it itself without a background checkpointer (the crash suite's deterministic runs)
//!   and once region blocks hold 85 % of the pool, where the wait is the back-pressure that
//!   keeps the writers from filling it
//!   (`worker::tests::gc_leaves_its_checkpoint_to_the_background_checkpointer`). After a crash, recovery rebuilds
//!   the update_map from the index and the next round collects again. A page GC freed keeps its
//!   DRAM tile; a block allocation that gets a page last used by another table or slot size
//!   takes another page (a few tries, then `PmFull`).
//! - **The GC threshold adapts to pool pressure** (the paper's is fixed): once region blocks
//!   hold 60 % of the pool, a block is collected at a lower obsolete share (down to half of
//!   `gc_threshold` at 85 %), the most obsolete first, and rounds come 8× as often. Under uniform
//!   updates a fixed 90 % lets the regions grow to about 2.6× the live data, which filled the
//!   auto-sized pool of a 2-thread, 16-op YCSB within seconds
//!   (`fir_api::gc_keeps_uniform_random_updates_in_a_pool_twice_the_live_data`).
//! - **Dropping a table** (issue 21; the paper has no drop, `drop.rs`): the table's blocks are
//!   freed at once, without GC's two stages or its free record, because recovery reads no block
//!   and installs no checkpoint entry of a table the catalog says is not live; the next
//!   checkpoint is full, so that it stops naming the table's keys. The freed blocks' tiles become
//!   unowned, so that another table of the same slot size can take the pages (a page of another
//!   slot size waits for a restart, as after GC).
//! - **Checkpoints in the crash suite** (incremental ones, after the first full one) are taken
//!   by the committing worker every `checkpoint_every_commits` commits (a background thread's would land at other PM events in
//!   each run of the simulator); real kills run the background checkpointer every 20 ms.

mod checkpoint;
pub mod cost;
mod drop;
mod gc;
pub mod layout;
mod recovery;
pub mod storage;
mod worker;

use crate::alloc::{PageManager, PAGE_SIZE};
use crate::catalog::{Catalog, CatalogStore, Schema, TableId};
use crate::cc::{Protocol, MAX_THREADS};
use crate::engine::{DbError, Engine, EngineKind, EngineWorker, RecoveryReport};
use crate::index::{PrimaryIndex, SecondaryIndex};
use crate::pmem::{PersistenceDomain, Pool};
use crossbeam_utils::CachePadded;
use layout::{kind, meta, tuple};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use storage::{Region, Tile};

pub use checkpoint::CheckpointStats;
pub use cost::{CheckpointKind, CheckpointMode, CostModel};

/// Why FIR refuses persistent indexes: its design keeps the index in DRAM and makes recovery fast
/// with leaf checkpoints instead (§4.3).
pub(crate) const FIR_INDEX_IN_DRAM: &str =
    "engine fir keeps its index in DRAM and checkpoints its leaves to PM (FIR §4.3), so it takes \
     no persistent index: use --index dram, or falcon for persistent indexes";

/// A deliberate bug in one ordering step, for showing that the crash-consistency harness catches
/// it (test-only: no production configuration sets one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FirFault {
    /// Algorithm 1 without its `clwb`s (lines 8–9): the new contents may not be durable when the
    /// LCTT says they are committed.
    SkipTupleFlush,
    /// Algorithm 1 without its `sfence`s (line 10): the write-backs are not ordered before the
    /// LCTT store.
    SkipTupleFence,
    /// The LCTT word is stored before the tuple contents are copied (Persist after the commit
    /// point): breaks under eADR too.
    LcttFirst,
    /// Commit returns before the LCTT word is durable (ADR): an acknowledged commit can be lost.
    SkipLcttFlush,
    /// A checkpoint names its generation in the meta page before writing its pages.
    CheckpointGenFirst,
    /// A checkpoint's CT is the clock alone, ignoring running transactions (§4.3.2): a
    /// transaction below CT that commits after the scan is neither in the checkpoint nor redone.
    CheckpointCtIgnoresRunning,
    /// A checkpoint frees the pages it replaces before its directory is named: a crash in
    /// between leaves the valid directory naming freed pages.
    CheckpointFreeFirst,
    /// A checkpoint's directory slot is not written back before the generation word names it
    /// (ADR).
    CheckpointSkipDirectoryFlush,
    /// GC frees the blocks it emptied right after redistributing their live versions, without
    /// waiting for an index checkpoint that no longer names them (§4.5's second stage).
    GcFreeBeforeCheckpoint,
    /// GC frees blocks without first listing them in the meta page's free record: a crash
    /// while a block is being zeroed leaves a half-empty block in the middle of a region.
    GcSkipFreeRecord,
    /// A table drop frees the table's blocks before the catalog says `dropping` (`drop.rs`): a
    /// crash in between leaves a live table whose rows are gone.
    DropFreeBeforeTombstone,
}

impl FirFault {
    /// Every fault.
    pub const ALL: [FirFault; 11] = [
        FirFault::SkipTupleFlush,
        FirFault::SkipTupleFence,
        FirFault::LcttFirst,
        FirFault::SkipLcttFlush,
        FirFault::CheckpointGenFirst,
        FirFault::CheckpointCtIgnoresRunning,
        FirFault::CheckpointFreeFirst,
        FirFault::CheckpointSkipDirectoryFlush,
        FirFault::GcFreeBeforeCheckpoint,
        FirFault::GcSkipFreeRecord,
        FirFault::DropFreeBeforeTombstone,
    ];

    /// The command-line name (unique over every engine's faults).
    pub fn name(self) -> &'static str {
        match self {
            FirFault::SkipTupleFlush => "fir-skip-tuple-flush",
            FirFault::SkipTupleFence => "fir-skip-tuple-fence",
            FirFault::LcttFirst => "fir-lctt-first",
            FirFault::SkipLcttFlush => "fir-skip-lctt-flush",
            FirFault::CheckpointGenFirst => "fir-checkpoint-gen-first",
            FirFault::CheckpointCtIgnoresRunning => "fir-checkpoint-ct-ignores-running",
            FirFault::CheckpointFreeFirst => "fir-checkpoint-free-first",
            FirFault::CheckpointSkipDirectoryFlush => "fir-checkpoint-skip-directory-flush",
            FirFault::GcFreeBeforeCheckpoint => "fir-gc-free-before-checkpoint",
            FirFault::GcSkipFreeRecord => "fir-gc-skip-free-record",
            FirFault::DropFreeBeforeTombstone => "fir-drop-free-before-tombstone",
        }
    }

    /// What the fault breaks.
    pub fn describe(self) -> &'static str {
        match self {
            FirFault::SkipTupleFlush => "Algorithm 1 does not clwb the new tuple contents",
            FirFault::SkipTupleFence => "Algorithm 1 does not sfence after each clwb",
            FirFault::LcttFirst => "the LCTT word is written before the tuple contents",
            FirFault::SkipLcttFlush => "commit returns before the LCTT word is durable (ADR)",
            FirFault::CheckpointGenFirst => {
                "a checkpoint is named valid before its pages are written"
            }
            FirFault::CheckpointCtIgnoresRunning => {
                "a checkpoint's CT ignores the transactions running during it"
            }
            FirFault::CheckpointFreeFirst => {
                "a checkpoint frees the pages it replaces before it is named valid"
            }
            FirFault::CheckpointSkipDirectoryFlush => {
                "a checkpoint's directory is not written back before it is named valid"
            }
            FirFault::GcFreeBeforeCheckpoint => {
                "GC frees emptied blocks before a checkpoint stops naming their versions"
            }
            FirFault::GcSkipFreeRecord => {
                "GC frees blocks without recording them for recovery to finish"
            }
            FirFault::DropFreeBeforeTombstone => {
                "a table drop frees its blocks before the catalog says the table is dropping"
            }
        }
    }
}

impl std::fmt::Display for FirFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FirFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::engine::common::parse_named(s, &FirFault::ALL, FirFault::name, "fir fault")
    }
}

/// Parameters of a FIR database.
#[derive(Clone, Debug)]
pub struct FirConfig {
    /// Concurrency control: [`Protocol::Mvto`] (see [`SUPPORTED_PROTOCOLS`]).
    pub protocol: Protocol,
    /// Worker slots (threads, and regions of every table), at most 256.
    pub max_threads: usize,
    /// Largest row, in bytes.
    pub max_row_bytes: usize,
    /// A deliberate ordering bug for the crash-consistency harness (never set in production).
    pub fault: Option<FirFault>,
    /// A background thread takes an index leaf checkpoint this often (§4.3; `None`: never).
    pub checkpoint_interval: Option<std::time::Duration>,
    /// A committing worker takes a checkpoint after every this many commits of the engine
    /// (deterministic, for the crash-consistency suite; `None`: never).
    pub checkpoint_every_commits: Option<u64>,
    /// Full, incremental, or chosen by the time cost model (§4.3.3; the default).
    pub checkpoint_mode: CheckpointMode,
    /// The constants of the time cost model.
    pub cost_model: CostModel,
    /// A worker runs a garbage collection round over its own regions after every this many of
    /// its commits (§4.5; `None`: never).
    pub gc_every_commits: Option<u64>,
    /// GC collects a full block once at least this share of its versions is obsolete (§4.5:
    /// 90 %).
    pub gc_threshold: f64,
    /// Slots per block, fewer than fit in a 2 MiB page (test-only: makes short crash-test runs
    /// fill and collect blocks; `None`: as many as fit). Recorded in the pool when it is made.
    pub block_slots: Option<u64>,
}

impl FirConfig {
    /// Defaults: 16 threads, rows up to 4 KiB, a checkpoint every second.
    pub fn new(protocol: Protocol) -> FirConfig {
        FirConfig {
            protocol,
            max_threads: 16,
            max_row_bytes: 4096,
            fault: None,
            checkpoint_interval: Some(std::time::Duration::from_secs(1)),
            checkpoint_every_commits: None,
            checkpoint_mode: CheckpointMode::CostModel,
            cost_model: CostModel::default(),
            gc_every_commits: Some(DEFAULT_GC_EVERY_COMMITS),
            gc_threshold: 0.9,
            block_slots: None,
        }
    }
}

/// A worker's GC round runs after every this many of its commits, by default.
pub const DEFAULT_GC_EVERY_COMMITS: u64 = 1024;

/// Protocols FIR runs: MVTO, the paper's (§4.2.1; the module documentation says why only it).
pub const SUPPORTED_PROTOCOLS: [Protocol; 1] = [Protocol::Mvto];

/// A table at run time: schema, slot geometry, DRAM indexes.
pub(crate) struct TableRt {
    pub schema: Schema,
    pub row: usize,
    pub slot: u64,
    pub index: PrimaryIndex,
    pub secondary: Vec<SecondaryIndex>,
    /// The largest txnId of a committed delete: an insert must be younger (see the departures).
    pub deleted_up_to: AtomicU64,
    /// The largest txnId of a transaction that scanned this table. An older transaction's
    /// insert published after that scan would be a row the younger scan missed though MVTO's
    /// order puts it first (an absent key has no version to carry a read timestamp), so such an
    /// insert fails at commit (`FirWorker::inserts_follow_younger_scans`; conservative: the whole
    /// table, not the range; docs/CC.md, "Phantoms").
    pub scanned_up_to: AtomicU64,
}

impl TableRt {
    fn new(schema: Schema) -> TableRt {
        let index = PrimaryIndex::new(schema.primary_index);
        TableRt::with_index(schema, index)
    }

    /// A table whose primary index is `index` (recovery builds it from the checkpoint).
    fn with_index(schema: Schema, index: PrimaryIndex) -> TableRt {
        let row = schema.row_size();
        let secondary = schema
            .secondary
            .iter()
            .map(|_| SecondaryIndex::new())
            .collect();
        TableRt {
            row,
            slot: tuple::slot_size(row),
            index,
            secondary,
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

/// A thread slot's regions (one per table), handed to the worker that claims the slot.
#[derive(Default)]
pub(crate) struct ThreadState {
    pub regions: Vec<Region>,
    /// The slot's commits, for `gc_every_commits`.
    pub commits: u64,
    /// Blocks emptied by GC's stage 1, waiting for stage 2 (§4.5): (table, block, the clock
    /// when they became wholly obsolete).
    pub gc_waiting: Vec<(TableId, u64, u64)>,
    /// `commits` when another worker's GC round last looked at this slot: unchanged at the next
    /// look means the slot stopped writing, and that worker collects its regions (§4.5).
    pub gc_seen_commits: u64,
    /// A live worker owns the slot (the state waits in `FirEngine::slots` between its
    /// transactions); no second worker may claim it, and a table drop waits for none.
    pub owned: bool,
}

/// Whether a worker is alive in a slot: it holds the state (`None`) or owns it while parked.
pub(crate) fn slot_in_use(slot: &Option<ThreadState>) -> bool {
    slot.as_ref().map_or(true, |st| st.owned)
}

/// The FIR engine, shared by its workers.
pub struct FirEngine {
    pub(crate) domain: PersistenceDomain,
    pub(crate) pool: Arc<Pool>,
    pub(crate) pages: PageManager,
    pub(crate) config: FirConfig,
    /// ADR-like domain: flushes and fences are needed for durability.
    pub(crate) flushing: bool,
    catalog_store: CatalogStore,
    catalog: Mutex<Catalog>,
    pub(crate) tables: RwLock<Vec<Arc<TableRt>>>,
    /// Tiles by block (page index); a tile is made when its block is first used.
    pub(crate) tiles: Box<[OnceLock<Box<Tile>>]>,
    /// The MVTO timestamp (txnId) source.
    pub(crate) clock: AtomicU64,
    /// Per thread: the txnId of its running transaction, or `u64::MAX`.
    pub(crate) active: Box<[CachePadded<AtomicU64>]>,
    /// Pool offset of the LCTT.
    pub(crate) lctt: u64,
    /// Per thread slot, its state's one home: there while no worker owns the slot and while
    /// its worker is between transactions (`ThreadState::owned`), where another worker's GC
    /// reaches an idle worker's regions (§4.5); `None` while the worker holds it (a transaction
    /// or a GC round runs).
    pub(crate) slots: Box<[Mutex<Option<ThreadState>>]>,
    pub(crate) last_commit: AtomicU64,
    report: Option<RecoveryReport>,
    /// One checkpoint at a time.
    checkpoint_lock: Mutex<()>,
    /// The valid checkpoint's directory (its pages are freed when the next one is in place).
    pub(crate) ckpt: Mutex<checkpoint::CkptDir>,
    /// Pool offset of the meta page's checkpoint generation word.
    pub(crate) ckpt_gen_at: u64,
    /// Pool offset of the two checkpoint directory slots.
    pub(crate) dir_base: u64,
    /// The update-time marks of Algorithm 2 (MarkNode).
    pub(crate) marks: checkpoint::LeafMarks,
    /// The next checkpoint must be full (a failed one lost its drained marks).
    pub(crate) need_full: std::sync::atomic::AtomicBool,
    checkpoints: AtomicU64,
    /// Checkpoints that could not be taken (a full pool) or a checkpointer that did not start.
    pub(crate) checkpoint_failures: AtomicU64,
    /// The background checkpointer runs (`checkpoint_interval`): GC's stage 2 then waits for
    /// its next checkpoint instead of taking one on the worker, unless room is nearly gone
    /// (`worker::FirWorker::collect_garbage`).
    pub(crate) checkpointer_running: std::sync::atomic::AtomicBool,
    /// Commits, for `checkpoint_every_commits`.
    pub(crate) commits: AtomicU64,
    /// Slots per block (the meta page's field; 0: as many as fit).
    pub(crate) block_slots: u64,
    /// Pool offset of the GC free record.
    pub(crate) gc_at: u64,
    /// Garbage collection counters.
    pub(crate) gc: GcCounters,
    /// One GC free at a time (there is one free record).
    pub(crate) gc_free_lock: Mutex<()>,
}

/// What garbage collection (§4.5) has done since the engine started.
#[derive(Debug, Default)]
pub(crate) struct GcCounters {
    /// Region blocks allocated and not yet freed: the pool pressure that lowers the GC
    /// threshold (`worker::FirWorker::gc_threshold_now`).
    pub blocks_in_use: AtomicU64,
    pub rounds: AtomicU64,
    pub moved: AtomicU64,
    pub freed: AtomicU64,
    pub failures: AtomicU64,
    pub finished_at_recovery: AtomicU64,
    pub adopted: AtomicU64,
}

/// What garbage collection (§4.5) has done since the engine started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcStats {
    /// GC rounds that found blocks to collect.
    pub rounds: u64,
    /// Live versions copied out of collected blocks (redistribution, stage 1).
    pub versions_moved: u64,
    /// Blocks freed (stage 2, after a checkpoint).
    pub blocks_freed: u64,
    /// Rounds that gave up (a conflict with a running transaction, or a full pool).
    pub failures: u64,
    /// Blocks whose freeing a crash interrupted, finished by recovery.
    pub finished_at_recovery: u64,
    /// Rounds that collected the regions of a slot whose worker stopped writing (§4.5).
    pub idle_slot_rounds: u64,
}

impl FirEngine {
    fn validate(config: &FirConfig) -> Result<(), DbError> {
        if !EngineKind::Fir.supports(config.protocol) {
            return Err(DbError::UnsupportedProtocol {
                engine: EngineKind::Fir,
                protocol: config.protocol,
            });
        }
        if config.max_threads == 0 || config.max_threads > MAX_THREADS.min(256) {
            return Err(DbError::Config(format!(
                "max_threads must be 1 to {}",
                MAX_THREADS.min(256)
            )));
        }
        if config.max_row_bytes == 0 || tuple::slot_size(config.max_row_bytes) > PAGE_SIZE {
            return Err(DbError::Config(
                "max_row_bytes must be between 1 byte and a 2 MiB page".into(),
            ));
        }
        config.cost_model.validate().map_err(DbError::Config)?;
        if !(config.gc_threshold > 0.0 && config.gc_threshold <= 1.0)
            || config.gc_every_commits == Some(0)
        {
            return Err(DbError::Config(
                "the FIR GC threshold must be in (0, 1] and its interval positive (or none)".into(),
            ));
        }
        if config
            .block_slots
            .is_some_and(|n| !(2..=storage::MAX_SLOTS).contains(&n))
        {
            return Err(DbError::Config(format!(
                "FIR blocks hold 2 to {} slots",
                storage::MAX_SLOTS
            )));
        }
        if config.checkpoint_interval.is_some_and(|d| d.is_zero())
            || config.checkpoint_every_commits == Some(0)
        {
            return Err(DbError::Config(
                "a FIR checkpoint interval must be positive (or none)".into(),
            ));
        }
        Ok(())
    }

    /// Formats a fresh pool for FIR.
    pub fn create(pool: Arc<Pool>, config: FirConfig) -> Result<Arc<FirEngine>, DbError> {
        Self::validate(&config)?;
        crate::engine::common::require_durable_domain(EngineKind::Fir, pool.domain())?;
        let (pages, meta_page) = crate::engine::meta::format(
            &pool,
            &meta_layout(&[
                (meta::F_VERSION, meta::VERSION),
                (meta::F_MAX_THREADS, config.max_threads as u64),
                (meta::F_MAX_ROW, config.max_row_bytes as u64),
                (meta::F_CATALOG_SLOT, meta::CATALOG_SLOT_BYTES),
                (meta::F_BLOCK_SLOTS, config.block_slots.unwrap_or(0)),
            ]),
        )?;
        let engine = Arc::new(Self::assemble(
            pool,
            pages,
            meta_page,
            config,
            Catalog::default(),
        ));
        engine.start_checkpointer();
        Ok(engine)
    }

    /// Starts the background checkpointer (`checkpoint_interval`): it holds only a weak reference
    /// and ends once the engine is dropped.
    fn start_checkpointer(self: &Arc<Self>) {
        let Some(interval) = self.config.checkpoint_interval else {
            return;
        };
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("fir-checkpoint".into())
            .spawn(move || loop {
                let due = std::time::Instant::now() + interval;
                while std::time::Instant::now() < due {
                    if weak.strong_count() == 0 {
                        return;
                    }
                    std::thread::sleep(interval.min(std::time::Duration::from_millis(10)));
                }
                let Some(engine) = weak.upgrade() else {
                    return;
                };
                if engine.checkpoint().is_err() {
                    // A full pool: the previous checkpoint stays valid; recovery redoes more.
                    engine.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
                }
            });
        match spawned {
            Ok(_) => self.checkpointer_running.store(true, Ordering::Release),
            Err(_) => {
                self.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Opens a FIR pool, running recovery (§4.4). The row limit and the thread count come from
    /// the pool (the LCTT has one word per thread slot it was formatted with).
    pub fn open(pool: Arc<Pool>, mut config: FirConfig) -> Result<Arc<FirEngine>, DbError> {
        crate::engine::common::require_durable_domain(EngineKind::Fir, pool.domain())?;
        let meta_page = crate::engine::meta::open(
            &pool,
            &meta_layout(&[(meta::F_VERSION, meta::VERSION)]),
            "FIR",
        )?;
        let pages = PageManager::open(&pool)?;
        let r = |f: u64| pool.read_u64(meta_page + f);
        let formatted_threads = r(meta::F_MAX_THREADS) as usize;
        if formatted_threads == 0 || formatted_threads > 256 {
            return Err(DbError::Corrupt(format!(
                "the FIR meta page records {formatted_threads} thread slots (1 to 256)"
            )));
        }
        config.max_threads = formatted_threads;
        config.max_row_bytes = r(meta::F_MAX_ROW) as usize;
        config.block_slots = match r(meta::F_BLOCK_SLOTS) {
            0 => None,
            n => Some(n),
        };
        Self::validate(&config)?;
        crate::engine::meta::check_catalog_slot(r(meta::F_CATALOG_SLOT), meta::CATALOG_SLOT_BYTES)?;
        let catalog_store = CatalogStore {
            base: meta_page + meta::CATALOG_AT,
            slot_bytes: meta::CATALOG_SLOT_BYTES,
        };
        let catalog = catalog_store.load(&pool)?;
        catalog.validate(config.max_row_bytes).map_err(|e| {
            DbError::Corrupt(format!(
                "the catalog does not fit the meta page's row size limit: {e}"
            ))
        })?;
        let mut engine = Self::assemble(pool, pages, meta_page, config, catalog);
        let report = recovery::recover(&mut engine)?;
        engine.report = Some(report);
        let engine = Arc::new(engine);
        engine.start_checkpointer();
        Ok(engine)
    }

    fn assemble(
        pool: Arc<Pool>,
        pages: PageManager,
        meta_page: u64,
        config: FirConfig,
        catalog: Catalog,
    ) -> FirEngine {
        let tables = catalog
            .tables
            .iter()
            .map(|s| Arc::new(TableRt::new(s.clone())))
            .collect();
        let n = config.max_threads;
        let max_pages = (pool.max_size().unwrap_or(0).max(pool.len()) / PAGE_SIZE) as usize + 1;
        FirEngine {
            domain: pool.domain(),
            flushing: pool.domain().needs_flush(),
            catalog_store: CatalogStore {
                base: meta_page + meta::CATALOG_AT,
                slot_bytes: meta::CATALOG_SLOT_BYTES,
            },
            catalog: Mutex::new(catalog),
            tables: RwLock::new(tables),
            tiles: (0..max_pages).map(|_| OnceLock::new()).collect(),
            clock: AtomicU64::new(0),
            active: (0..n)
                .map(|_| CachePadded::new(AtomicU64::new(u64::MAX)))
                .collect(),
            lctt: meta_page + meta::LCTT_AT,
            slots: (0..n)
                .map(|_| Mutex::new(Some(ThreadState::default())))
                .collect(),
            last_commit: AtomicU64::new(0),
            report: None,
            checkpoint_lock: Mutex::new(()),
            ckpt: Mutex::new(checkpoint::CkptDir::default()),
            ckpt_gen_at: meta_page + meta::CKPT_GEN,
            dir_base: meta_page + meta::DIR_AT,
            marks: checkpoint::LeafMarks::new(),
            need_full: std::sync::atomic::AtomicBool::new(false),
            checkpoints: AtomicU64::new(0),
            checkpoint_failures: AtomicU64::new(0),
            checkpointer_running: std::sync::atomic::AtomicBool::new(false),
            commits: AtomicU64::new(0),
            block_slots: config.block_slots.unwrap_or(0),
            gc_at: meta_page + meta::GC_AT,
            gc: GcCounters::default(),
            gc_free_lock: Mutex::new(()),
            pages,
            config,
            pool,
        }
    }

    /// Slots of a block of `slot_bytes`-byte tuple contents.
    #[inline]
    pub(crate) fn slots(&self, slot_bytes: u64) -> u64 {
        storage::slots_per_block(slot_bytes, self.block_slots)
    }

    /// The tile of block `block` (made on first use for `table`); `None` if the page had a tile
    /// of another table or slot size before GC freed it (tiles live as long as the engine). A
    /// tile a table drop left [`storage::UNOWNED`] serves any table of its slot size.
    pub(crate) fn tile(&self, block: u64, table: TableId, slot_bytes: u64) -> Option<&Tile> {
        let mut fresh = false;
        let tile = self.tiles[block as usize].get_or_init(|| {
            fresh = true;
            Box::new(Tile::new(
                table,
                self.pages.page_offset(block),
                slot_bytes,
                self.slots(slot_bytes),
            ))
        });
        if fresh {
            return Some(tile);
        }
        let owner = tile.table();
        if (owner != table && owner != storage::UNOWNED) || tile.slot_bytes != slot_bytes {
            return None;
        }
        tile.reset();
        tile.table.store(table, Ordering::Release);
        Some(tile)
    }

    /// The txnId (or its published lower bound) of the oldest running transaction, or
    /// `u64::MAX` if none runs (a checkpoint's CT and GC's stage 2 wait for it, §4.3.2, §4.5).
    pub(crate) fn oldest_active(&self) -> u64 {
        self.active
            .iter()
            .map(|a| a.load(Ordering::SeqCst))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// What garbage collection has done since the engine started.
    pub fn gc_stats(&self) -> GcStats {
        let g = &self.gc;
        GcStats {
            rounds: g.rounds.load(Ordering::Relaxed),
            versions_moved: g.moved.load(Ordering::Relaxed),
            blocks_freed: g.freed.load(Ordering::Relaxed),
            failures: g.failures.load(Ordering::Relaxed),
            finished_at_recovery: g.finished_at_recovery.load(Ordering::Relaxed),
            idle_slot_rounds: g.adopted.load(Ordering::Relaxed),
        }
    }

    /// The tile of an existing block (one that holds a version some header or index names).
    #[inline]
    pub(crate) fn tile_of(&self, addr: u64) -> &Tile {
        self.tiles[storage::block_of(addr) as usize]
            .get()
            .expect("a logical address names a block with a tile")
    }

    /// The header of the version at `addr`.
    #[inline]
    pub(crate) fn header(&self, addr: u64) -> &storage::Header {
        &self.tile_of(addr).headers[storage::offset_of(addr) as usize]
    }

    /// The pool offset of the tuple_content at `addr`.
    #[inline]
    pub(crate) fn content_at(&self, addr: u64) -> u64 {
        self.tile_of(addr).slot_at(storage::offset_of(addr))
    }

    /// The LCTT word of `thread`.
    pub(crate) fn lctt_word(&self, thread: usize) -> u64 {
        self.lctt + 8 * thread as u64
    }

    /// The tag of a new block for `table`'s region of `thread`, the `seq`-th of the region.
    pub(crate) fn block_tag(
        thread: usize,
        table: TableId,
        seq: usize,
    ) -> Result<crate::alloc::PageTag, String> {
        if seq >= 1 << layout::SEQ_BITS || u64::from(table) >= 1 << (32 - layout::SEQ_BITS) {
            return Err(format!(
                "region of table {table}, thread {thread} has too many blocks ({seq})"
            ));
        }
        Ok(crate::alloc::PageTag {
            kind: kind::BLOCK,
            owner: thread as u8,
            value: (u64::from(table) << layout::SEQ_BITS) | seq as u64,
        })
    }
}

impl Engine for FirEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Fir
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
                "table '{}': {FIR_INDEX_IN_DRAM}",
                schema.name
            )));
        }
        let mut catalog = self.catalog.lock();
        let mut next = catalog.clone();
        let id = next.add(schema.clone(), self.config.max_row_bytes)?;
        if u64::from(id) >= 1 << (32 - layout::SEQ_BITS) {
            return Err(DbError::Config(format!(
                "FIR keeps at most {} tables",
                1u64 << (32 - layout::SEQ_BITS)
            )));
        }
        self.catalog_store.store(&self.pool, &next)?;
        *catalog = next;
        self.tables.write().push(Arc::new(TableRt::new(schema)));
        Ok(id)
    }

    fn worker(self: Arc<Self>, thread: usize) -> Result<Box<dyn EngineWorker>, DbError> {
        Ok(Box::new(worker::FirWorker::new(self, thread)?))
    }

    fn recovery_report(&self) -> Option<RecoveryReport> {
        self.report.clone()
    }

    fn pool(&self) -> Option<&Arc<Pool>> {
        Some(&self.pool)
    }

    fn durable_tid(&self) -> u64 {
        self.last_commit.load(Ordering::Acquire)
    }

    fn check_structure(&self) -> Result<Vec<u64>, String> {
        recovery::check_structure(self)
    }

    fn checkpoint(&self) -> Option<Result<CheckpointStats, DbError>> {
        Some(FirEngine::checkpoint(self))
    }

    fn drop_table(&self, table: TableId) -> Result<(), DbError> {
        self.drop_table_now(table)
    }
}

/// The FIR meta page's layout, with the `fields` a format writes or an open checks.
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

/// A FIR engine for unit tests: a 64 MiB in-memory ADR pool, `max_threads` slots, no
/// background checkpointer, whatever `configure` changes, and a table `kv` of one u64 column
/// (`ordered`: an ordered primary index, else a hash index).
#[cfg(test)]
pub(crate) fn test_engine(
    max_threads: usize,
    ordered: bool,
    configure: impl FnOnce(&mut FirConfig),
) -> (Arc<FirEngine>, TableId) {
    let opts = crate::pmem::PoolOptions::new("fir", PersistenceDomain::Adr);
    let pool = Arc::new(Pool::create_in_memory(64 << 20, &opts).expect("a 64 MiB pool in memory"));
    let mut config = FirConfig::new(Protocol::Mvto);
    config.max_threads = max_threads;
    config.checkpoint_interval = None;
    configure(&mut config);
    let engine = FirEngine::create(pool, config).expect("a FIR engine");
    let schema = Schema::new("kv", &[("v", crate::catalog::ColumnType::U64)]);
    let table = engine
        .create_table(if ordered { schema.ordered() } else { schema })
        .expect("table kv");
    (engine, table)
}
