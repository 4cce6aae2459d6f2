//! ArchTM (Wu et al., FAST'21): a persistent transactional memory with logless copy-on-write
//! objects, behind the [`ptm`](crate::ptm) API.
//!
//! - **Logless CoW (§4.1, Alg. 1):** the first write of an object in a transaction takes the
//!   object's write lock, allocates a block, and copies the committed version there, with a
//!   header annotated with the transaction's id (§4.2); later writes go to that copy. No undo or
//!   redo log. The copy leaves out the bytes the first write is about to store, so each byte
//!   of a new version reaches PM once (on Optane the cache would merge the two stores before
//!   the media; the store count, which is what `pmtx bench ptm`'s write amplification counts,
//!   would not). A version of one cache line is built in DRAM and written with streaming stores
//!   (durable at the commit's fence, like stores and their flushes): its block is cold, and
//!   ordinary stores would first read every line of it.
//! - **DRAM metadata (§4.2, §4.3, §5.1):** the object lookup table (new, old, writer = lock) in
//!   [`table`], per-slot ID lists, and all allocator metadata ([`alloc`]). PM holds only the
//!   objects, the TxState table and the root handle ([`layout`]). Departure (§4.3 has one
//!   array of entries): beside the entries, a dense array of *current words* (the committed
//!   version's offset and generation, 8 bytes an id, cleared while a writer holds the
//!   object), so a read of an object nobody writes (Alg. 1 line 9) costs one load from an
//!   array an eighth of the entries' size, which the cache keeps where the entries missed.
//! - **TxState (§5.1):** per thread slot, `txid << 2 | COMMITTED` in one 8-byte word, stored
//!   and made durable after all the transaction's copies are. Departure: no durable BEGIN
//!   (§5.3 APT_TX_BEGIN stores and fences it before the first copy). A slot's txids only grow
//!   (the clock is monotonic and restarts above every txid on PM), and an aborted
//!   transaction's copies are durably invalid before the slot commits again, so a copy is
//!   committed exactly when its txid is at most the txid its slot's word names; recovery
//!   discards the others (a running transaction's, whose txid is above). That saves a write
//!   transaction one flush and one fence of the three that §5 has it pay.
//! - **Timestamps:** a global atomic counter in place of rdtscp + ORDO (§5.1): it is monotonic
//!   and gap-free on any machine; its single cache line costs little at the 1–2 threads this
//!   machine runs. A txid is `timestamp << 8 | slot` (DESIGN.md); recovery restarts the clock
//!   above every txid on PM.
//! - **Snapshot isolation, lock-free reads (§5.3, Alg. 1 APT_TX_READ):** a reader takes the new
//!   version if its writer committed with a commit id not above the reader's start, else the
//!   old one. Entries change inside a seqlock so a reader sees their fields consistent without
//!   taking a lock. Departure: a committing writer is marked COMMITTING in DRAM while it takes
//!   its commit id, and a reader that sees that waits for the decision; without it a reader that
//!   began just after the commit id was taken could read the old version that post-commit is
//!   about to free.
//! - **Post-commit (Alg. 2):** once no transaction that began before the commit id is still
//!   *executing* (the paper waits for "ongoing" ones; a transaction already in its own
//!   post-commit reads nothing more, and waiting for it could deadlock two committers), turns
//!   the new versions into the old ones and hands the replaced versions to the slot's
//!   deallocation list. Departure (`retire.rs`): a user slot's commit does not wait for that;
//!   it queues the commit, whose entries carry their commit id for readers meanwhile, and the
//!   slot retires it at a later begin (with two threads the wait was the other thread's
//!   remaining execution, at every commit). A freed object's transaction writes a *tombstone* version (a header
//!   with the TOMB flag): the paper does not say how a free survives a crash when the freed
//!   copy's header is still on PM; the tombstone is the latest version, so recovery drops the
//!   object, and garbage collection zeroes it only after the copies it deletes. Each
//!   user slot keeps [`alloc::TOMB_RESERVE`] 64-byte blocks that only a tombstone may take,
//!   once no other block is left, so that a full pool can still free (the paper's frees need
//!   no block). The reserves are set aside when the pool is created and again after recovery
//!   (which finds their blocks free), before any allocation, so a pool full before a restart
//!   still frees after it; a worker taking over a slot tops up what earlier frees used.
//! - **Allocator (§4.4, §5.4):** see [`alloc`]. Departure: 64-byte size classes up to 4 KiB,
//!   one free list per class per slot and one recycle list per class, instead of §4.4's single
//!   free list for all sizes; a slot takes 16 KiB of a class at a time in address order, so
//!   its consecutive allocations of a class are contiguous (the single list fragmented into
//!   holes of every size once blocks were recycled, and each hole cost a search and a
//!   CHKP-diff record). Garbage collection runs on the GC thread
//!   ([`background`]), woken when a committing slot's deallocation list passes a threshold and
//!   every `PtmConfig::gc_interval`; an allocation that finds the free and recycle lists empty
//!   still collects inline (it cannot wait for the thread). Without the thread
//!   (`gc_interval: None`, [`PtmConfig::inline_background`](crate::ptm::PtmConfig::inline_background))
//!   the committing thread collects: the deterministic mode the crash simulator's exhaustive
//!   image sweep runs (the threads are crash-tested at sampled points instead).
//! - **Recovery (§5.5):** `recovery.rs`: TxState → uncommitted txids; a scan of the data pages
//!   for headers whose check word matches; per object id the version with the largest txid
//!   that is not uncommitted; everything else is garbage and is zeroed before the TxState
//!   table is reset.
//! - **ADR and eADR:** under ADR every ordering step is a flush and a fence; under eADR the
//!   flushes are skipped and the fences (and ordered stores) remain. Each step has a fault
//!   ([`ArchtmFault`]) that removes it, for the crash tests.
//!
//! - **Online defragmentation (§4.5):** [`defrag`]: 4 KiB regions less than half used are
//!   emptied by a mock write transaction, on `Ptm::defragment` or the defragmentation thread
//!   ([`background`]). Departure (the policy): the thread runs a pass only when the recycled
//!   blocks of size classes no slot allocated from for 50 ms exceed 25 % of the data area
//!   (such a pass first returns them to the free list); blocks of a class in use are taken
//!   back by its next allocations, so moving objects for them would only add copies.
//!   `PtmConfig::defrag_eager` keeps §4.5's rule (a pass whenever blocks were recycled).
//! - **A reserved internal slot:** the engine's own transactions (defragmentation's mock
//!   transactions, the root's creation) run on a TxState slot past the user slots, so they
//!   never borrow a user's slot and no user waits for one (the paper does not say whose slot
//!   the fragmentation manager's mock transaction uses).
//! - **Incremental checkpoint (§5.6):** [`chkp`]: a persistent copy of the lookup table plus
//!   CHKP-diff (the chunks taken from since), so recovery scans only those. Departures (see
//!   there): two copies alternating by epoch, so a torn checkpoint leaves the last one whole; a
//!   dirty bitmap (a bit per cache line of the copy) set by post-commit instead of
//!   write-protection faults; CHKP-diff records the aligned chunk of `segment_bytes` holding a
//!   take, once per checkpoint period, not every fetch (a record per recycled fragment filled
//!   the diff within a few thousand commits); quiescence by per-slot busy flags; recovery
//!   clears the checkpoint entry of an object freed since before it zeroes the tombstone, as
//!   garbage collection does.
//!
//! - **Large objects (§4.4's regular data path):** `large.rs`: an
//!   object larger than a data page holds ([`layout::MAX_SMALL`], 2 MiB less the header)
//!   takes whole pages of its own, a head page (header, page list, payload) and tail pages, up
//!   to [`MAX_OBJECT`] (about 512 MiB); beyond it `PtmError::TooLarge`. Copy-on-write,
//!   commit, abort, garbage collection and recovery treat a large version like a small one,
//!   except that its pages go back to the page manager; recovery always reads the head pages'
//!   headers (a checkpoint's CHKP-diff records only fetches from the free list) and frees every
//!   large-object page no live version lists. Departure: the paper gives the regular path no
//!   layout; the page list is ours, and a version's pages need not be contiguous.

pub mod alloc;
pub mod background;
pub mod chkp;
pub mod defrag;
mod large;
pub mod layout;
mod recovery;
mod retire;
pub mod table;
mod worker;

use crate::alloc::{PageManager, PAGE_SIZE};
use crate::engine::meta::{self as meta_page, MetaLayout};
use crate::pmem::{Pool, PoolOptions};
use crate::ptm::{PtmConfig, PtmEngine, PtmError, PtmWorker};
use crossbeam_utils::CachePadded;
use layout::meta;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use table::{LookupTable, SlotState};

/// The largest object payload: objects up to [`layout::MAX_SMALL`] take the locality-aware
/// path (a block within one data page), larger ones the large-object pages (§4.4's regular
/// path), up to a head page and 255 tail pages (about 512 MiB).
pub const MAX_OBJECT: u64 = layout::MAX_LARGE;

/// A deliberate ordering bug, for showing that the crash tests catch it. Each names the ordering
/// step (the fault-injection point) it removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ArchtmFault {
    /// `archtm-copy-flush`: commit does not flush the new copies (ADR).
    SkipCopyFlush,
    /// `archtm-copy-fence`: no fence between the copies' flushes and the COMMITTED store (ADR).
    SkipCopyFence,
    /// `archtm-commit-persist`: commit returns before COMMITTED is durable (ADR).
    SkipCommitPersist,
    /// `archtm-abort-invalidate`: an abort leaves its copies' headers on PM (ADR and eADR).
    AbortKeepsCopies,
    /// `archtm-gc-zero-fence`: garbage collection zeroes tombstones without first making the
    /// zeroed headers of the copies they delete durable (ADR).
    GcSkipFence,
    /// `archtm-diff-persist`: a fetched segment's CHKP-diff record is not flushed and fenced
    /// before the thread writes copies there (ADR).
    DiffPersist,
    /// `archtm-chkp-persist`: the checkpoint copy and its diff are not flushed and fenced
    /// before the epoch switch (ADR).
    ChkpPersist,
    /// `archtm-chkp-list-diff`: a checkpoint does not record the segments the allocation lists
    /// still hold in the new epoch's CHKP-diff (ADR and eADR).
    ChkpSkipListDiff,
    /// `archtm-gc-chkp-forget`: garbage collection zeroes a tombstone without clearing the
    /// freed object's checkpoint entry (ADR and eADR).
    GcKeepsChkpEntry,
}

impl ArchtmFault {
    /// Every fault.
    pub const ALL: [ArchtmFault; 9] = [
        ArchtmFault::SkipCopyFlush,
        ArchtmFault::SkipCopyFence,
        ArchtmFault::SkipCommitPersist,
        ArchtmFault::AbortKeepsCopies,
        ArchtmFault::GcSkipFence,
        ArchtmFault::DiffPersist,
        ArchtmFault::ChkpPersist,
        ArchtmFault::ChkpSkipListDiff,
        ArchtmFault::GcKeepsChkpEntry,
    ];

    /// The fault-injection name.
    pub fn name(self) -> &'static str {
        match self {
            ArchtmFault::SkipCopyFlush => "archtm-copy-flush",
            ArchtmFault::SkipCopyFence => "archtm-copy-fence",
            ArchtmFault::SkipCommitPersist => "archtm-commit-persist",
            ArchtmFault::AbortKeepsCopies => "archtm-abort-invalidate",
            ArchtmFault::GcSkipFence => "archtm-gc-zero-fence",
            ArchtmFault::DiffPersist => "archtm-diff-persist",
            ArchtmFault::ChkpPersist => "archtm-chkp-persist",
            ArchtmFault::ChkpSkipListDiff => "archtm-chkp-list-diff",
            ArchtmFault::GcKeepsChkpEntry => "archtm-gc-chkp-forget",
        }
    }

    /// What the fault breaks.
    pub fn describe(self) -> &'static str {
        match self {
            ArchtmFault::SkipCopyFlush => "commit does not flush the new copies (ADR)",
            ArchtmFault::SkipCopyFence => {
                "no fence between the copies' flushes and COMMITTED (ADR)"
            }
            ArchtmFault::SkipCommitPersist => "commit returns before COMMITTED is durable (ADR)",
            ArchtmFault::AbortKeepsCopies => "an abort leaves its copies' headers valid on PM",
            ArchtmFault::GcSkipFence => "GC zeroes tombstones before the copies they delete (ADR)",
            ArchtmFault::DiffPersist => {
                "a fetched segment's CHKP-diff record is not durable before its use (ADR)"
            }
            ArchtmFault::ChkpPersist => {
                "the checkpoint epoch switches before its copy is durable (ADR)"
            }
            ArchtmFault::ChkpSkipListDiff => {
                "a checkpoint leaves the allocation lists' segments out of CHKP-diff"
            }
            ArchtmFault::GcKeepsChkpEntry => {
                "GC zeroes a tombstone but keeps the freed object's checkpoint entry"
            }
        }
    }

    /// Whether the step it removes is only a flush or fence of ordinary stores, which eADR does
    /// not need (so the fault cannot break ArchTM under eADR).
    pub fn adr_only(self) -> bool {
        !matches!(
            self,
            ArchtmFault::AbortKeepsCopies
                | ArchtmFault::ChkpSkipListDiff
                | ArchtmFault::GcKeepsChkpEntry
        )
    }
}

impl std::fmt::Display for ArchtmFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ArchtmFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        crate::engine::common::parse_named(s, &ArchtmFault::ALL, ArchtmFault::name, "archtm fault")
    }
}

/// The engine's shared state.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) pages: PageManager,
    pub(crate) meta: u64,
    pub(crate) salt: u64,
    pub(crate) max_threads: usize,
    pub(crate) table: LookupTable,
    pub(crate) slots: Vec<SlotState>,
    pub(crate) free_slots: Mutex<Vec<usize>>,
    pub(crate) id_lists: Vec<Mutex<Vec<u32>>>,
    /// Per slot, its commits awaiting retirement (`retire`).
    pub(crate) retirements: Vec<retire::Retirements>,
    pub(crate) alloc: alloc::Allocator,
    /// The global timestamp (§5.1), on a cache line of its own: every begin and commit
    /// writes it, and the fields beside it are read by every operation of every thread.
    pub(crate) clock: CachePadded<AtomicU64>,
    /// ADR: flush before fence. eADR: fences only.
    pub(crate) flushing: bool,
    pub(crate) fault: Option<ArchtmFault>,
    pub(crate) gc_threshold: usize,
    /// Bytes of a segment fetched from the global free list (§5.4) for blocks above 4 KiB, the
    /// most a slot takes of a size class, and the CHKP-diff chunk: a power of two, 64 B to a
    /// data page.
    pub(crate) segment: u64,
    pub(crate) root: u64,
    pub(crate) root_size: usize,
    /// §5.6's checkpoint state.
    pub(crate) chkp: chkp::Chkp,
    /// What the recovery that opened the pool read.
    pub(crate) recovered: chkp::RecoveryCounts,
    /// Wakes and stops the background threads.
    pub(crate) signal: background::Signal,
    /// What garbage collection and defragmentation did.
    pub(crate) counters: background::Counters,
    /// One defragmentation pass at a time (the thread's or [`Ptm::defragment`]'s); an
    /// invariant check holds it so that no pass is half done.
    ///
    /// [`Ptm::defragment`]: crate::ptm::Ptm::defragment
    pub(crate) defrag_lock: Mutex<()>,
}

impl Inner {
    /// The slot the engine's own transactions run on (defragmentation's mock transactions,
    /// the root's creation): one past the user slots, so that they never take a user's slot
    /// and a user never waits for one of them to give a slot back.
    pub(crate) fn internal_slot(&self) -> usize {
        self.max_threads
    }

    /// Whether `slot` keeps a tombstone reserve ([`alloc::TOMB_RESERVE`]): every user slot.
    /// The engine's own transactions free nothing, so its slot keeps none (and its takes of
    /// 64-byte blocks, e.g. defragmentation's moves, serve its allocations whole).
    pub(crate) fn keeps_tomb_reserve(&self, slot: usize) -> bool {
        slot != self.internal_slot()
    }

    /// Sets every user slot's tombstone reserve aside, at creation and after recovery, before
    /// any worker allocates: §4.4 gives each thread a dedicated portion of the free list, and
    /// the reserves are that portion for frees. Recovery finds the reserves' blocks free (they
    /// hold no object), so a pool that was full before a restart is full after it for
    /// allocations, yet every slot can still free.
    fn fill_tomb_reserves(&self) {
        for slot in 0..self.max_threads {
            self.fill_tomb_reserve(slot);
        }
    }

    /// The PM TxState word of `slot`.
    pub(crate) fn txstate_at(&self, slot: usize) -> u64 {
        self.meta + meta::TXSTATE + slot as u64 * meta::TXSTATE_STRIDE
    }

    /// Persists `[off, off + len)`: flush (ADR) and fence.
    pub(crate) fn persist(&self, off: u64, len: u64) {
        if self.flushing {
            self.pool.flush(off, len);
        }
        self.pool.fence();
    }
}

/// The ArchTM engine: create or open a pool, then [`PtmEngine::worker`] per thread.
pub struct ArchTm {
    /// The GC and defragmentation threads (stopped and joined first on drop).
    background: Option<background::Background>,
    inner: Arc<Inner>,
}

fn layout_of(fields: &[(u64, u64)]) -> MetaLayout<'_> {
    MetaLayout {
        page_kind: layout::kind::META,
        magic_at: meta::F_MAGIC,
        magic: meta::MAGIC,
        catalog_at: meta::CATALOG_AT,
        catalog_slot_bytes: meta::CATALOG_SLOT_BYTES,
        fields,
        crc_at: meta::F_CRC,
    }
}

fn pool_options(config: &PtmConfig) -> PoolOptions {
    let mut o = PoolOptions::new("archtm", config.domain).with_counting(config.counting);
    if let Some(t) = config.crash_sim {
        o = o.with_crash_sim(t);
    }
    if config.remove_on_drop {
        o = o.removing_on_drop();
    }
    o
}

impl ArchTm {
    /// Creates a pool and its root object holding `root`.
    pub fn create(config: &PtmConfig, root: &[u8]) -> Result<ArchTm, PtmError> {
        if config.max_threads == 0 || config.max_threads > 255 {
            return Err(PtmError::Pool(format!(
                "max_threads must be 1..=255, not {}",
                config.max_threads
            )));
        }
        if root.len() as u64 > MAX_OBJECT {
            return Err(PtmError::TooLarge(format!(
                "a root object of {} bytes is larger than the largest object ({MAX_OBJECT} bytes)",
                root.len()
            )));
        }
        let opts = pool_options(config);
        let pool = match &config.path {
            Some(p) => Pool::create(Some(p), config.size, &opts)?,
            None => Pool::create_in_memory(config.size, &opts)?,
        };
        let salt = u64::from_le_bytes(pool.header().uuid.as_bytes()[..8].try_into().unwrap()) | 1;
        let fields = [
            (meta::F_VERSION, meta::VERSION),
            (meta::F_MAX_THREADS, config.max_threads as u64),
            (meta::F_SALT, salt),
            (meta::F_ROOT_SIZE, root.len() as u64),
            (meta::F_CATALOG_SLOT, meta::CATALOG_SLOT_BYTES),
        ];
        let (pages, meta_off) = meta_page::format(&pool, &layout_of(&fields))?;
        let inner = Inner::new(pool, pages, meta_off, salt, config, root.len());
        let mut eng = ArchTm {
            background: None,
            inner: Arc::new(inner),
        };
        // The root object is created by an ordinary transaction (on the engine's own slot),
        // then its handle recorded.
        let h = {
            let mut w = worker::ArchtmWorker::internal(Arc::clone(&eng.inner));
            w.begin();
            let h = w.alloc(root)?;
            w.commit()?;
            h
        };
        let at = eng.inner.meta + meta::ROOT_HANDLE;
        eng.inner.pool.write_u64(at, h);
        eng.inner.persist(at, 8);
        Arc::get_mut(&mut eng.inner)
            .expect("no worker outlives creation")
            .root = h;
        eng.inner.fill_tomb_reserves();
        eng.start_background(config)?;
        Ok(eng)
    }

    /// Opens a pool (file or, with `image`, bytes of a crash image) and recovers it (§5.5).
    pub fn open(config: &PtmConfig) -> Result<ArchTm, PtmError> {
        let opts = pool_options(config);
        let path = config
            .path
            .as_ref()
            .ok_or_else(|| PtmError::Pool("opening a PTM pool needs its path".into()))?;
        let pool = Pool::open(path, &opts)?;
        Self::recover(pool, config)
    }

    /// Opens a pool held in memory (a crash image) and recovers it.
    pub fn open_image(bytes: &[u8], config: &PtmConfig) -> Result<ArchTm, PtmError> {
        let pool = Pool::from_image(bytes, &pool_options(config))?;
        Self::recover(pool, config)
    }

    fn recover(pool: Pool, config: &PtmConfig) -> Result<ArchTm, PtmError> {
        let fields = [(meta::F_VERSION, meta::VERSION)];
        let meta_off = meta_page::open(&pool, &layout_of(&fields), "archtm")?;
        let word = |f: u64| pool.read_u64(meta_off + f);
        meta_page::check_catalog_slot(word(meta::F_CATALOG_SLOT), meta::CATALOG_SLOT_BYTES)?;
        let max_threads = word(meta::F_MAX_THREADS) as usize;
        if max_threads == 0 || max_threads > 255 {
            return Err(PtmError::Pool(format!(
                "the archtm meta page records {max_threads} thread slots (expected 1..=255)"
            )));
        }
        let salt = word(meta::F_SALT);
        let root_size = word(meta::F_ROOT_SIZE) as usize;
        let root = pool.read_u64(meta_off + meta::ROOT_HANDLE);
        if root == 0 {
            return Err(PtmError::Pool(
                "the pool's creation did not finish (it has no root object): create it again"
                    .into(),
            ));
        }
        let pages = PageManager::open(&pool)?;
        let mut config = config.clone();
        config.max_threads = max_threads;
        let mut inner = Inner::new(pool, pages, meta_off, salt, &config, root_size);
        inner.root = root;
        recovery::recover(&mut inner)?;
        inner.fill_tomb_reserves();
        let mut eng = ArchTm {
            background: None,
            inner: Arc::new(inner),
        };
        eng.start_background(&config)?;
        Ok(eng)
    }

    /// Starts the GC and defragmentation threads the configuration asks for.
    fn start_background(&mut self, config: &PtmConfig) -> Result<(), PtmError> {
        if config.gc_interval.is_some() || config.defrag_interval.is_some() {
            let bg = background::Background::start(
                &self.inner,
                config.gc_interval,
                config.defrag_interval.map(|p| (p, config.defrag_eager)),
            )
            .map_err(|e| {
                PtmError::Pool(format!("cannot start archtm's background threads: {e}"))
            })?;
            self.background = Some(bg);
        }
        Ok(())
    }
}

impl Inner {
    fn new(
        pool: Pool,
        pages: PageManager,
        meta: u64,
        salt: u64,
        config: &PtmConfig,
        root_size: usize,
    ) -> Inner {
        let n = config.max_threads;
        // The user slots, then the engine's reserved one (`internal_slot`).
        let all = n + 1;
        let capacity = (pool.len() / layout::BLOCK).min(u64::from(u32::MAX));
        let domain = pool.domain();
        Inner {
            pages,
            meta,
            salt,
            max_threads: n,
            table: LookupTable::new(capacity),
            slots: (0..all).map(|_| SlotState::default()).collect(),
            free_slots: Mutex::new((0..n).rev().collect()),
            id_lists: (0..all).map(|_| Mutex::new(Vec::new())).collect(),
            retirements: (0..all).map(|_| retire::Retirements::default()).collect(),
            alloc: alloc::Allocator::new(all),
            clock: CachePadded::new(AtomicU64::new(1)),
            flushing: domain.needs_flush(),
            fault: config.archtm_fault,
            gc_threshold: config.gc_threshold,
            segment: config
                .segment_bytes
                .clamp(layout::BLOCK, PAGE_SIZE)
                .next_power_of_two(),
            root: 0,
            root_size,
            chkp: chkp::Chkp::new(capacity, config.checkpoint_every),
            recovered: chkp::RecoveryCounts::default(),
            signal: background::Signal::default(),
            counters: background::Counters::default(),
            defrag_lock: Mutex::new(()),
            pool,
        }
    }

    /// Checks the allocator's and the lookup table's invariants: every live object's committed
    /// version holds a valid header naming it; live blocks, free space (the slots' class lists
    /// and extents, the free list, the recycle lists) and blocks awaiting collection are
    /// disjoint and tile the data pages exactly (nothing leaked, nothing owned twice). Call it
    /// while no transaction runs; it waits for a background collection or defragmentation
    /// pass to finish.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        // Commits awaiting retirement are committed: retire them first (nothing executes).
        self.retire_all();
        let _d = self.defrag_lock.lock();
        let _g = self.alloc.gc.lock();
        let mut extents: Vec<(u64, u64, String)> = Vec::new();
        let mut large_owner = std::collections::BTreeMap::new();
        for (id, e) in self.table.iter() {
            let v = e.view();
            if v.writer != 0 || v.new != 0 {
                return Err(format!("object {id} is still locked or has a new version"));
            }
            // The current word names the committed version exactly (a read takes it from there).
            if e.current() != table::current_word(v.gen, v.old) {
                return Err(format!(
                    "object {id}'s current word {:#x} does not name its committed version \
                     (generation {}, offset {})",
                    e.current(),
                    v.gen,
                    v.old
                ));
            }
            if v.gen == 0 {
                if v.old != 0 {
                    return Err(format!("free id {id} has a version"));
                }
                continue;
            }
            let mut b = [0u8; 32];
            self.pool.read_bytes(v.old, &mut b);
            let h = layout::Header::decode(&b, v.old, self.salt, MAX_OBJECT)
                .ok_or_else(|| format!("object {id}'s version at {} has no valid header", v.old))?;
            if u64::from(h.id) != id || u64::from(h.gen) != v.gen || h.tomb || h.size != v.size {
                return Err(format!("object {id}'s header at {} names {h:?}", v.old));
            }
            if layout::is_large(v.size) {
                for p in self.large_pages_of(v.old) {
                    if large_owner.insert(p, format!("object {id}")).is_some() {
                        return Err(format!("large-object page {p} is owned twice"));
                    }
                }
            } else {
                extents.push((v.old, layout::block_bytes(v.size), format!("object {id}")));
            }
        }
        let a = &self.alloc;
        for (s, l) in a.slots.iter().enumerate() {
            extents.extend(
                l.lock()
                    .extents_held()
                    .map(|(o, n)| (o, n, format!("slot {s} list"))),
            );
        }
        for (c, r) in a.recycled.iter().enumerate() {
            let size = alloc::class_bytes(c);
            extents.extend(
                r.lock()
                    .iter()
                    .map(|&o| (o, size, format!("recycle list of {size}-byte blocks"))),
            );
        }
        extents.extend(
            a.free
                .lock()
                .iter()
                .map(|&(o, n)| (o, n, "free list".into())),
        );
        extents.extend(
            a.recycle
                .lock()
                .iter()
                .map(|&(o, n)| (o, n, "recycle list".into())),
        );
        for d in &a.dealloc {
            for b in d.lock().iter() {
                if b.large {
                    for p in self.large_pages_of(b.off) {
                        if large_owner.insert(p, "a deallocation".into()).is_some() {
                            return Err(format!("large-object page {p} is owned twice"));
                        }
                    }
                } else {
                    extents.push((b.off, b.len, "deallocation list".into()));
                }
            }
        }
        // Every large-object page belongs to exactly one version (nothing leaked).
        let large_pages: std::collections::BTreeSet<u64> = self
            .pages
            .allocated(&self.pool)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|(_, t)| t.kind == layout::kind::LARGE)
            .map(|(i, _)| self.pages.page_offset(i))
            .collect();
        if let Some(p) = large_pages.iter().find(|p| !large_owner.contains_key(p)) {
            return Err(format!(
                "large-object page {p} belongs to no version (leaked)"
            ));
        }
        if let Some((p, who)) = large_owner.iter().find(|(p, _)| !large_pages.contains(p)) {
            return Err(format!(
                "{who} names page {p}, which is no large-object page"
            ));
        }
        extents.sort_by_key(|e| e.0);
        let mut pages = a.pages.lock().clone();
        pages.sort_unstable();
        let mut pi = 0;
        let mut cursor: Option<u64> = None;
        for (off, len, what) in &extents {
            let page = off / PAGE_SIZE * PAGE_SIZE;
            if (off + len - 1) / PAGE_SIZE * PAGE_SIZE != page {
                return Err(format!("{what} at {off} (+{len}) crosses a page boundary"));
            }
            if off % PAGE_SIZE == 0 {
                if let Some(c) = cursor.filter(|c| c % PAGE_SIZE != 0) {
                    return Err(format!(
                        "bytes from {c} to the end of their page belong to nothing (leaked)"
                    ));
                }
                if pages.get(pi) != Some(off) {
                    return Err(format!(
                        "{what} at {off}: expected the data page {:?} to start here",
                        pages.get(pi)
                    ));
                }
                pi += 1;
            } else {
                match cursor {
                    Some(c) if c == *off => {}
                    Some(c) if c > *off => {
                        return Err(format!(
                            "{what} at {off} overlaps what ends at {c} (double-owned)"
                        ))
                    }
                    c => return Err(format!("bytes {c:?}..{off} belong to nothing (leaked)")),
                }
            }
            cursor = Some(off + len);
        }
        if cursor.is_some_and(|c| c % PAGE_SIZE != 0) || pi != pages.len() {
            return Err(format!(
                "the data pages are not tiled: {pi} of {} covered, last end {cursor:?}",
                pages.len()
            ));
        }
        Ok(())
    }
}

impl PtmEngine for ArchTm {
    fn name(&self) -> &'static str {
        "archtm"
    }

    fn worker(&self) -> Result<Box<dyn PtmWorker>, PtmError> {
        let slot = self.inner.free_slots.lock().pop();
        let slot = slot.ok_or(PtmError::TooManyThreads(self.inner.max_threads))?;
        Ok(Box::new(worker::ArchtmWorker::new(
            Arc::clone(&self.inner),
            slot,
        )))
    }

    fn root(&self) -> u64 {
        self.inner.root
    }

    fn root_size(&self) -> usize {
        self.inner.root_size
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let i = &self.inner;
        let c = &i.counters;
        let live = i.table.iter().filter(|(_, e)| e.view().gen != 0).count() as u64;
        let free = i.alloc.free_bytes();
        let large = i
            .table
            .iter()
            .filter(|(_, e)| {
                let v = e.view();
                v.gen != 0 && layout::is_large(v.size)
            })
            .count() as u64;
        vec![
            ("live_objects", live),
            ("large_objects", large),
            ("data_pages", i.alloc.pages.lock().len() as u64),
            ("free_bytes", free),
            ("used_regions_4k", i.region_usage().len() as u64),
            ("clock", i.clock.load(Ordering::Relaxed)),
            ("chkp_epoch", i.chkp.epoch.load(Ordering::Relaxed)),
            ("checkpoints", i.chkp.taken.load(Ordering::Relaxed)),
            (
                "recovery_from_checkpoint",
                u64::from(i.recovered.from_checkpoint),
            ),
            ("recovery_chkp_entries", i.recovered.chkp_entries),
            ("recovery_scanned_bytes", i.recovered.scanned_bytes),
            ("recovery_data_bytes", i.recovered.data_bytes),
            ("recovery_segments", i.recovered.segments),
            ("gc_runs", c.gc_runs.load(Ordering::Relaxed)),
            ("recycled_bytes", c.recycled_bytes.load(Ordering::Relaxed)),
            ("defrag_passes", c.defrag_passes.load(Ordering::Relaxed)),
            ("defrag_moved", c.defrag_moved.load(Ordering::Relaxed)),
            (
                "defrag_released_bytes",
                c.defrag_released.load(Ordering::Relaxed),
            ),
            ("recycled_class_bytes", i.alloc.recycled_class_bytes()),
            ("thread_gc_runs", c.thread_gc_runs.load(Ordering::Relaxed)),
            (
                "thread_defrag_passes",
                c.thread_defrag_passes.load(Ordering::Relaxed),
            ),
            (
                "gc_thread",
                u64::from(i.signal.gc_thread.load(Ordering::Relaxed)),
            ),
        ]
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.inner.check_invariants()
    }

    fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    fn checkpoint(&self) -> Result<(), PtmError> {
        self.inner.checkpoint(None).map(|_| ())
    }

    fn defragment(&self) -> Result<(u64, u64), PtmError> {
        let mut w = worker::ArchtmWorker::internal(Arc::clone(&self.inner));
        let r = self.inner.defragment(&mut w, None)?;
        Ok((r.regions, r.moved))
    }
}

/// The state word of a TxState entry.
pub(crate) fn txstate_word(txid: u64, st: u64) -> u64 {
    txid << 2 | st
}

/// Splits a TxState word.
pub(crate) fn txstate_split(w: u64) -> (u64, u64) {
    (w >> 2, w & 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No BEGIN is stored (`TxState` above): a running transaction's copy that reached PM
    /// (here flushed and fenced by hand) carries a txid above its slot's last committed one,
    /// so recovery discards it and keeps the committed version; after recovery the slot
    /// commits again (its txids restart above the discarded one) and that commit survives.
    /// Crashes `pool` now and returns what survived.
    fn crash_now(pool: &crate::pmem::Pool) -> crate::pmem::CrashImage {
        pool.crash_now();
        pool.crash_sim()
            .unwrap()
            .crash_state()
            .unwrap()
            .durable_image()
    }

    #[test]
    fn a_durable_copy_of_an_unfinished_transaction_is_discarded_by_recovery() {
        let mut config = PtmConfig::temporary().size(16 << 20).inline_background();
        config.crash_sim = Some(crate::pmem::CrashTrigger::Never);
        let eng = ArchTm::create(&config, &[0; 8]).unwrap();
        let mut w = eng.worker().unwrap();
        w.begin();
        let h = w.alloc(&[1; 40]).unwrap();
        w.commit().unwrap();
        w.begin();
        w.write(h, 0, &[2; 40]).unwrap();
        let pool = &eng.inner.pool;
        pool.flush(0, pool.len());
        pool.fence();
        let image = crash_now(pool);
        drop(w);
        let read = |image: &[u8]| {
            let eng = ArchTm::open_image(image, &config).unwrap();
            let mut w = eng.worker().unwrap();
            w.begin();
            let mut v = [0u8; 40];
            w.read(h, 0, &mut v).unwrap();
            w.commit().unwrap();
            drop(w);
            eng.check_invariants().unwrap();
            v
        };
        assert_eq!(
            read(&image.bytes),
            [1; 40],
            "the unfinished write is discarded"
        );
        let eng = ArchTm::open_image(&image.bytes, &config).unwrap();
        let mut w = eng.worker().unwrap();
        w.begin();
        w.write(h, 0, &[3; 40]).unwrap();
        w.commit().unwrap();
        drop(w);
        let pool = &eng.inner.pool;
        let image = crash_now(pool);
        assert_eq!(
            read(&image.bytes),
            [3; 40],
            "an acknowledged commit survives"
        );
    }

    /// Layout version 4 (TxState names the last committed txid; no BEGIN): a pool of an
    /// older layout is refused with both versions named, not misread (version 3's recovery
    /// would take a running transaction's copies for committed ones).
    #[test]
    fn a_pool_of_an_older_layout_is_refused_with_the_versions_named() {
        let config = PtmConfig::temporary().size(16 << 20).inline_background();
        let eng = ArchTm::create(&config, &[0; 8]).unwrap();
        let pool = &eng.inner.pool;
        let mut image = pool.read_vec(0, pool.len() as usize);
        let at = (eng.inner.meta + meta::F_VERSION) as usize;
        assert_eq!(image[at..at + 8], meta::VERSION.to_le_bytes());
        let ok = ArchTm::open_image(&image, &config);
        assert!(ok.is_ok(), "the image itself opens");
        image[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
        let err = ArchTm::open_image(&image, &config).err().expect("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("layout version 3") && msg.contains("reads 4"),
            "{msg}"
        );
    }
}
