//! DUDETx behind the persistent-object API (`pmtx::ptm`, `PtmEngineKind::Dudetx`; §3, §3.6):
//! transactions *perform* on a DRAM shadow of the object heap (4 KiB shadow pages of the PM heap
//! pages by default, `heap.rs`) under a word-based STM (`worker.rs`, §4.1), producing a thread-local volatile
//! redo log of (word, value) ops and allocation-log ops (§3.5); the *persist* step combines a
//! group of logs (each word's last value), compresses it with LZ4 and persists it in the log
//! ring, then the durable id (§3.3); the *reproduce* step writes the words into the PM
//! heap pages and truncates the log (§3.4). The log ring, the records, the persist and
//! reproduce steps and the replay are the table engine's (`pipeline.rs`, `recovery::replay`,
//! `wal.rs`), applied here to words rather than rows.
//!
//! A handle is `generation << 48 | pool offset` of the object's first byte: the address in the
//! persistent address space (§3.6.1: "the virtual address is logically equal to the persistent
//! memory address"), plus a generation so a stale handle to a reused slot is refused.
//!
//! Durability modes as the table engine's ([`DurabilityMode`]): sync (`run` returns once the
//! transaction is durable) and async (`run` returns at once; [`PtmEngine::durable_id`] says
//! which ids are durable, [`PtmEngine::committed_id`] which id the last commit took).
//!
//! Departures from the paper, and why:
//! - **Shadow paging** (§3.6, software-based as §3.6.2; `heap.rs`): shadow pages of 4 KiB by
//!   default as the paper's (`DudetxPtmOptions::shadow_page_bytes`, up to whole 2 MiB heap
//!   pages), touching ids; eviction is an *approximate* LRU (the least recently used of a
//!   sample of 32 resident frames, the sample moving round the resident list) rather than an
//!   exact one, since sorting every frame per eviction costs O(n log n) with 4 KiB pages; STM
//!   mode only (the lock mode's ids are per chain, so it keeps every page).
//! - **The lock-based mode** (§5, `locks.rs`): locks are taken automatically per word stripe
//!   (strict 2PL; no user-level `txLock`), and its records are not combined across
//!   transactions (a combined record would need a group closed under dependencies and one
//!   position in every chain's order). It runs on the same pipeline core as the STM
//!   (`pipeline::Core`, with `locks::DepOrder` as the sequencer), so it has the core's faults
//!   at each ordering step (log write-back, durable report, heap write-back, truncation)
//!   besides its own three; §5.3's "background thread" that detects is the persist step
//!   (detection runs when records become persistent), not a thread of its own.
//! - **The allocation log rides in the transaction's redo record** instead of a separate
//!   per-thread log (§3.5): one record, one CRC, so the allocation state a crash leaves is
//!   exactly the one the persisted records say, with no second ordering step to get wrong.
//! - **Write-back STM with a commit lock**: TinySTM's write-through mode would need undo in the
//!   shadow; buffered writes and one commit lock (which also orders the ids with the log queue,
//!   as the table engine's) keep abort trivial.
//! - **Size-class slab allocator** (slots of 16 B to 2 MiB, a 2 MiB page per class at least):
//!   §3.5 leaves the allocation algorithm open.

pub mod heap;
pub mod locks;
mod worker;

use super::layout::{kind, meta};
use super::pipeline::Core;
use super::{DudetxConfig, DudetxFault, DurabilityMode};
use crate::cc::Protocol;
use crate::engine::meta::MetaLayout;
use crate::pmem::{Pool, PoolOptions};
use crate::ptm::{PtmConfig, PtmEngine, PtmError, PtmWorker};
use heap::{ObjectApply, Shadow};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A deliberate bug in one ordering step of the DUDETx PTM (test-only): the pipeline core's
/// four (in both perform modes), the allocation log's, and the lock mode's own three.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DudetxPtmFault {
    /// One of the table engine's pipeline faults (log persist, durable id, reproduce).
    Pipeline(DudetxFault),
    /// `pmalloc`/`pfree` are not written to the allocation log (§3.5): the shadow allocates,
    /// PM never learns of it.
    SkipAllocLog,
    /// Lock mode (§5.2): a record is persisted without its dependency list, so reproduce and
    /// recovery may apply a transaction whose lock predecessor was lost.
    LockNoDeps,
    /// Lock mode (§5.3): reproduce and recovery apply reproducible records in ring order
    /// rather than in dependency order.
    LockRingOrder,
    /// Lock mode: reproduce writes the chains' new watermarks over the current slot instead of
    /// the other one, so a crash while it writes leaves some chains' marks new and others old
    /// (recovery then replays a chain's reproduced records over newer writes of another).
    LockWatermarkInPlace,
}

impl DudetxPtmFault {
    /// Every fault.
    pub const ALL: [DudetxPtmFault; 8] = [
        DudetxPtmFault::Pipeline(DudetxFault::SkipLogFlush),
        DudetxPtmFault::Pipeline(DudetxFault::DurableIdFirst),
        DudetxPtmFault::Pipeline(DudetxFault::SkipHeapFlush),
        DudetxPtmFault::Pipeline(DudetxFault::TruncateFirst),
        DudetxPtmFault::SkipAllocLog,
        DudetxPtmFault::LockNoDeps,
        DudetxPtmFault::LockRingOrder,
        DudetxPtmFault::LockWatermarkInPlace,
    ];

    /// The name (the pipeline faults keep theirs).
    pub fn name(self) -> &'static str {
        match self {
            DudetxPtmFault::Pipeline(f) => f.name(),
            DudetxPtmFault::SkipAllocLog => "dudetx-skip-alloc-log",
            DudetxPtmFault::LockNoDeps => "dudetx-lock-no-deps",
            DudetxPtmFault::LockRingOrder => "dudetx-lock-ring-order",
            DudetxPtmFault::LockWatermarkInPlace => "dudetx-lock-watermark-in-place",
        }
    }

    /// What the fault breaks, for `pmtx crashtest --list-faults`.
    pub fn describe(self) -> &'static str {
        match self {
            DudetxPtmFault::Pipeline(_) => "the table engine's pipeline fault of the same name",
            DudetxPtmFault::SkipAllocLog => "pmalloc/pfree are not written to the allocation log",
            DudetxPtmFault::LockNoDeps => "lock mode: a record is persisted without its dependencies",
            DudetxPtmFault::LockRingOrder => {
                "lock mode: reproduce and recovery apply records in ring order, not dependency order"
            }
            DudetxPtmFault::LockWatermarkInPlace => {
                "lock mode: the chains' watermarks are rewritten in place, not double-buffered"
            }
        }
    }

    /// Whether the fault is in a step only the lock-based perform mode (§5) has.
    pub fn lock_mode(self) -> bool {
        matches!(
            self,
            DudetxPtmFault::LockNoDeps
                | DudetxPtmFault::LockRingOrder
                | DudetxPtmFault::LockWatermarkInPlace
        )
    }

    /// Whether the fault only removes a write-back (harmless under eADR).
    pub fn adr_only(self) -> bool {
        match self {
            DudetxPtmFault::Pipeline(f) => f.only_removes_ordinary_flushes(),
            _ => false,
        }
    }
}

impl std::str::FromStr for DudetxPtmFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DudetxPtmFault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = DudetxPtmFault::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown DUDETx PTM fault '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

impl std::fmt::Display for DudetxPtmFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How transactions *perform* on the shadow (§4, §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PerformMode {
    /// The word-based STM (§4.1).
    #[default]
    Stm,
    /// Hardware transactions (§4.2): needs Intel RTM; refused where it is missing.
    Htm,
    /// HTM where the CPU has RTM, else the STM.
    HtmOrStm,
    /// Strict two-phase locks on the shadow's word stripes, the dependency graph from lock
    /// hand-offs, reproduce in dependency order (§5; `locks.rs`), with this detection.
    Locks(locks::Detect),
}

impl std::str::FromStr for PerformMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stm" => Ok(PerformMode::Stm),
            "htm" => Ok(PerformMode::Htm),
            "htm-or-stm" => Ok(PerformMode::HtmOrStm),
            "locks" | "locks-one-round" => Ok(PerformMode::Locks(locks::Detect::OneRound)),
            "locks-two-round" => Ok(PerformMode::Locks(locks::Detect::TwoRound)),
            _ => Err(format!(
                "unknown DUDETx perform mode '{s}' (expected stm, htm, htm-or-stm, locks, \
                 locks-one-round or locks-two-round)"
            )),
        }
    }
}

/// DUDETx's options for a PTM pool (the `dudetx` field of [`PtmConfig`]).
#[derive(Clone, Debug)]
pub struct DudetxPtmOptions {
    /// When `run` returns.
    pub mode: DurabilityMode,
    /// Transactions combined into one log record at most (§3.3).
    pub group: usize,
    /// Whether log records are compressed with LZ4 (§3.3; `DudetxConfig::compression`).
    pub compression: super::LogCompression,
    /// Async mode: how long the persist thread waits at most for a group to fill, in µs
    /// (`DudetxConfig::group_delay_us`).
    pub group_delay_us: u64,
    /// 2 MiB pages of the log ring at creation (0: a quarter of the pool, 1 to 8).
    pub log_pages: usize,
    /// Persist and reproduce in background threads (ignored under the crash simulator, whose
    /// PM events must come from the thread it drives: there the committing thread does them).
    pub background: bool,
    /// The perform mode.
    pub perform: PerformMode,
    /// Shadow paging (§3.6): the bytes of a shadow page (a frame): a power of two from 4 KiB
    /// (the default, the paper's) to a 2 MiB heap page.
    pub shadow_page_bytes: usize,
    /// Shadow paging (§3.6): frames the DRAM shadow holds at most (0: every shadow page, no
    /// paging). Not with the lock-based mode.
    pub shadow_frames: usize,
    /// Shadow paging by size: the shadow holds at most this percentage of the shadow pages
    /// (1 to 99; 0 or 100: every page), when `shadow_frames` is 0.
    pub shadow_percent: usize,
    /// A deliberate ordering bug (test-only).
    pub fault: Option<DudetxPtmFault>,
}

impl Default for DudetxPtmOptions {
    fn default() -> Self {
        DudetxPtmOptions {
            mode: DurabilityMode::Sync,
            group: 64,
            compression: super::LogCompression::Auto,
            group_delay_us: super::DEFAULT_GROUP_DELAY_US,
            log_pages: 0,
            background: true,
            perform: PerformMode::Stm,
            shadow_page_bytes: heap::DEFAULT_SHADOW_PAGE,
            shadow_frames: 0,
            shadow_percent: 0,
            fault: None,
        }
    }
}

/// Whether this CPU has Intel RTM (restricted transactional memory, TSX), which the HTM
/// perform mode (§4.2) needs.
pub fn cpu_has_rtm() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("rtm")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Resolves the perform mode: the STM, or a clear refusal of HTM.
pub fn resolve_perform(mode: PerformMode) -> Result<PerformMode, PtmError> {
    match mode {
        PerformMode::Locks(d) => Ok(PerformMode::Locks(d)),
        PerformMode::Stm | PerformMode::HtmOrStm if !cpu_has_rtm() => Ok(PerformMode::Stm),
        PerformMode::Stm => Ok(PerformMode::Stm),
        PerformMode::Htm | PerformMode::HtmOrStm => Err(PtmError::Pool(if cpu_has_rtm() {
            "the DUDETx HTM perform mode (§4.2) needs the RTM instructions (xbegin/xend), which \
             stable Rust does not expose: use PerformMode::Stm"
                .into()
        } else {
            "the DUDETx HTM perform mode (§4.2) needs Intel RTM (TSX: CPUID leaf 7, EBX bit 11), \
             which this CPU does not have: use PerformMode::Stm, or PerformMode::HtmOrStm to fall \
             back to it"
                .into()
        })),
    }
}

/// Meta fields of a DUDETx PTM pool (the table engine's durable id and truncation words sit
/// at the same offsets: the pipeline writes them).
mod pmeta {
    /// Magic.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PMTXDUP1");
    /// Layout version.
    pub const VERSION: u64 = 1;
    pub const F_VERSION: u64 = 8;
    pub const F_ROOT_SIZE: u64 = 16;
    pub const F_LOG_PAGES: u64 = 32;
    /// The log format: 0 the id-ordered pipeline (STM), 1 the lock mode's (§5).
    pub const F_LOCKS: u64 = 48;
    /// The root object's handle (own cache line after the truncation words).
    pub const ROOT: u64 = super::meta::HEAD_POS + 64;
}

fn layout(fields: &[(u64, u64)]) -> MetaLayout<'_> {
    MetaLayout {
        page_kind: kind::META,
        magic_at: meta::F_MAGIC,
        magic: pmeta::MAGIC,
        catalog_at: meta::CATALOG_AT,
        catalog_slot_bytes: meta::CATALOG_SLOT_BYTES,
        fields,
        crc_at: meta::F_CRC,
    }
}

/// The engine's state shared with its workers.
pub(super) struct Inner {
    core: Arc<Core<ObjectApply>>,
    shadow: Arc<Shadow>,
    /// Versioned locks of the STM.
    locks: Box<[AtomicU64]>,
    /// The STM's clock: the id of the last commit.
    clock: AtomicU64,
    /// Orders shadow commits with ids and the log queue.
    commit_lock: Mutex<()>,
    /// Live objects (the root included).
    live: AtomicU64,
    /// Workers handed out.
    workers: AtomicUsize,
    max_threads: usize,
    root: u64,
    fault: Option<DudetxPtmFault>,
    /// The perform mode is the lock-based one (§5): the core's sequencer is `locks::DepOrder`.
    lock_mode: bool,
    /// Lock mode: each stripe's holder (its chain + 1; 0: free).
    owners: Box<[AtomicU64]>,
    /// Lock mode: the id of the last transaction that released each stripe (§5.2).
    released_by: Box<[AtomicU64]>,
    /// Lock mode: chains not used by a worker.
    free_chains: Mutex<Vec<usize>>,
    /// Lock mode: each chain's last seq.
    chain_seq: Box<[AtomicU64]>,
}

/// DUDETx as a [`PtmEngine`].
pub struct DudetxPtm {
    inner: Arc<Inner>,
    root_size: usize,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

fn pool_options(config: &PtmConfig) -> PoolOptions {
    let mut o = PoolOptions::new("dudetx", config.domain).with_counting(config.counting);
    if let Some(t) = config.crash_sim {
        o = o.with_crash_sim(t);
    }
    if config.remove_on_drop {
        o = o.removing_on_drop();
    }
    o
}

fn core_config(config: &PtmConfig, log_pages: usize) -> Result<DudetxConfig, PtmError> {
    let o = &config.dudetx;
    if config.max_threads == 0 || config.max_threads > 255 {
        return Err(PtmError::Pool(format!(
            "max_threads must be 1..=255, not {}",
            config.max_threads
        )));
    }
    resolve_perform(o.perform)?;
    if o.shadow_percent > 100 {
        return Err(PtmError::Pool(format!(
            "the shadow can hold at most 100 % of the heap, not {} %",
            o.shadow_percent
        )));
    }
    heap::check_shadow_page(o.shadow_page_bytes).map_err(PtmError::Pool)?;
    let paging = heap::Shadow::pages(o.shadow_frames, o.shadow_percent);
    if paging && matches!(o.perform, PerformMode::Locks(_)) {
        return Err(PtmError::Pool(
            "shadow paging (shadow_frames > 0) needs the id-ordered touching ids of the STM \
             perform mode: the lock-based mode keeps every heap page in the shadow"
                .into(),
        ));
    }
    let mut c = DudetxConfig::new(Protocol::Occ);
    c.mode = o.mode;
    c.group = o.group;
    c.compression = o.compression;
    c.group_delay_us = o.group_delay_us;
    c.log_pages = log_pages;
    c.background = o.background && config.crash_sim.is_none();
    c.fault = match o.fault {
        Some(DudetxPtmFault::Pipeline(f)) => Some(f),
        _ => None,
    };
    c.max_threads = config.max_threads.min(crate::cc::MAX_THREADS - 1);
    c.validate()?;
    Ok(c)
}

impl DudetxPtm {
    /// Creates a pool whose root object holds `root`.
    pub fn create(config: &PtmConfig, root: &[u8]) -> Result<DudetxPtm, PtmError> {
        if root.len() > heap::MAX_OBJECT {
            return Err(PtmError::TooLarge(format!(
                "a root object of {} bytes is larger than the largest object ({} bytes)",
                root.len(),
                heap::MAX_OBJECT
            )));
        }
        let mut core_cfg = core_config(config, config.dudetx.log_pages)?;
        let opts = pool_options(config);
        let pool = Arc::new(match &config.path {
            Some(p) => Pool::create(Some(p), config.size, &opts)?,
            None => Pool::create_in_memory(config.size, &opts)?,
        });
        crate::engine::common::require_durable_domain(
            crate::engine::EngineKind::Dudetx,
            pool.domain(),
        )?;
        core_cfg.log_pages =
            crate::engine::wal::ring_size(&pool, core_cfg.log_pages, super::DEFAULT_LOG_PAGES);
        let (pages, meta_page) = crate::engine::meta::format(
            &pool,
            &layout(&[
                (pmeta::F_VERSION, pmeta::VERSION),
                (pmeta::F_ROOT_SIZE, root.len() as u64),
                (pmeta::F_LOG_PAGES, core_cfg.log_pages as u64),
                (pmeta::F_LOCKS, u64::from(lock_detect(config).is_some())),
            ]),
        )?;
        let ring = super::recovery::log_ring(&pool, &pages, core_cfg.log_pages, true)?;
        let shadow = Arc::new(Shadow::with_capacity(
            config.dudetx.shadow_frames,
            config.dudetx.shadow_percent,
            config.dudetx.shadow_page_bytes,
        ));
        let apply = ObjectApply {
            shadow: shadow.clone(),
        };
        let seq = sequencer(&pool, meta_page, config, vec![0; locks::CHAINS]);
        let core = Core::new(pool, pages, meta_page, ring, core_cfg, apply, 0, 0, seq);
        let mut eng = Self::assemble(
            config,
            core,
            shadow,
            0,
            0,
            root.len(),
            vec![0; locks::CHAINS],
        )?;
        // The root is allocated by an ordinary transaction, made durable and reproduced, and
        // only then named in the meta page: a pool without it is one whose creation a crash
        // interrupted.
        let h = {
            let mut w = eng.worker()?;
            w.begin();
            let h = w.alloc(root)?;
            w.commit()?;
            h
        };
        let core = &eng.inner.core;
        core.drain().map_err(PtmError::Pool)?;
        core.pool.write_u64(meta_page + pmeta::ROOT, h);
        core.pool.persist(meta_page + pmeta::ROOT, 8);
        Arc::get_mut(&mut eng.inner)
            .expect("no worker outlives creation")
            .root = h;
        Ok(eng)
    }

    /// Opens a pool file and recovers it (§3.5).
    pub fn open(config: &PtmConfig) -> Result<DudetxPtm, PtmError> {
        let path = config
            .path
            .as_ref()
            .ok_or_else(|| PtmError::Pool("opening a PTM pool needs its path".into()))?;
        let pool = Pool::open(path, &pool_options(config))?;
        Self::recover(pool, config)
    }

    /// Opens a crash image held in memory and recovers it.
    pub fn open_image(bytes: &[u8], config: &PtmConfig) -> Result<DudetxPtm, PtmError> {
        let pool = Pool::from_image(bytes, &pool_options(config))?;
        Self::recover(pool, config)
    }

    /// Recovery (§3.5): replay the persisted, un-reproduced records up to the first gap
    /// (words and allocation log alike) onto the PM heap, then load the shadow from it and
    /// rebuild the free lists from the slot headers.
    fn recover(pool: Pool, config: &PtmConfig) -> Result<DudetxPtm, PtmError> {
        let pool = Arc::new(pool);
        crate::engine::common::require_durable_domain(
            crate::engine::EngineKind::Dudetx,
            pool.domain(),
        )?;
        let meta_page = crate::engine::meta::open(
            &pool,
            &layout(&[(pmeta::F_VERSION, pmeta::VERSION)]),
            "DUDETx PTM",
        )?;
        let word = |f: u64| pool.read_u64(meta_page + f);
        let core_cfg = core_config(config, word(pmeta::F_LOG_PAGES) as usize)?;
        let root = word(pmeta::ROOT);
        if root == 0 {
            return Err(PtmError::Pool(
                "the pool's creation did not finish (it has no root object): create it again"
                    .into(),
            ));
        }
        let pages = crate::alloc::PageManager::open(&pool)?;
        let ring = super::recovery::log_ring(&pool, &pages, core_cfg.log_pages, false)?;
        let shadow = Arc::new(Shadow::with_capacity(
            config.dudetx.shadow_frames,
            config.dudetx.shadow_percent,
            config.dudetx.shadow_page_bytes,
        ));
        for (index, tag) in pages.allocated(&pool)? {
            if tag.kind == heap::HEAP_KIND {
                if tag.value as usize >= heap::CLASSES {
                    return Err(PtmError::Pool(format!(
                        "heap page {index} has the size class {}, which does not exist",
                        tag.value
                    )));
                }
                shadow.add_page(tag.value as usize, pages.page_offset(index));
            }
        }
        let mut apply = ObjectApply {
            shadow: shadow.clone(),
        };
        let pool_locks = word(pmeta::F_LOCKS) == 1;
        if pool_locks != lock_detect(config).is_some() {
            return Err(PtmError::Pool(format!(
                "the pool was created with the {} perform mode, whose log format differs: open \
                 it with {}",
                if pool_locks {
                    "lock-based (§5)"
                } else {
                    "STM/HTM"
                },
                if pool_locks {
                    "PerformMode::Locks"
                } else {
                    "PerformMode::Stm"
                }
            )));
        }
        let (replayed, chain_seqs) = match lock_detect(config) {
            None => (
                super::recovery::replay(&pool, &ring, meta_page, |op| {
                    super::pipeline::Apply::apply(&mut apply, &pool, &pages, op, None)
                })?,
                vec![0; locks::CHAINS],
            ),
            Some(d) => {
                let ring_order = config.dudetx.fault == Some(DudetxPtmFault::LockRingOrder);
                let r = locks::recover(&pool, &ring, meta_page, d, ring_order, |op| {
                    super::pipeline::Apply::apply(&mut apply, &pool, &pages, op.borrowed(), None)
                })
                .map_err(PtmError::Pool)?;
                let replayed = super::recovery::Replayed {
                    durable: 0,
                    pos: r.pos,
                    records: r.replayed,
                    entries: 0,
                };
                (replayed, r.reproduced)
            }
        };
        let live = shadow.load(&pool).map_err(PtmError::Pool)?;
        let root_size = word(pmeta::F_ROOT_SIZE) as usize;
        let seq = sequencer(&pool, meta_page, config, chain_seqs.clone());
        let core = Core::new(
            pool,
            pages,
            meta_page,
            ring,
            core_cfg,
            apply,
            replayed.durable,
            replayed.pos,
            seq,
        );
        Self::assemble(config, core, shadow, root, live, root_size, chain_seqs)
    }

    fn assemble(
        config: &PtmConfig,
        core: Core<ObjectApply>,
        shadow: Arc<Shadow>,
        root: u64,
        live: u64,
        root_size: usize,
        chain_seqs: Vec<u64>,
    ) -> Result<DudetxPtm, PtmError> {
        let core = Arc::new(core);
        shadow.attach(&core);
        let threads = if core.config.background {
            core.start().map_err(PtmError::Pool)?
        } else {
            Vec::new()
        };
        let clock = core.committed.load(Ordering::Acquire);
        let lock_mode = lock_detect(config).is_some();
        let stripes = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        let lock_stripes = if lock_mode { worker::STRIPES } else { 0 };
        Ok(DudetxPtm {
            inner: Arc::new(Inner {
                core,
                shadow,
                locks: (0..worker::STRIPES).map(|_| AtomicU64::new(0)).collect(),
                clock: AtomicU64::new(clock),
                commit_lock: Mutex::new(()),
                live: AtomicU64::new(live),
                workers: AtomicUsize::new(0),
                max_threads: config.max_threads,
                root,
                fault: config.dudetx.fault,
                lock_mode,
                owners: stripes(lock_stripes),
                released_by: stripes(lock_stripes),
                free_chains: Mutex::new((0..config.max_threads.min(locks::CHAINS)).rev().collect()),
                chain_seq: chain_seqs.into_iter().map(AtomicU64::new).collect(),
            }),
            root_size,
            threads: Mutex::new(threads),
        })
    }

    /// What log combination and compression did so far (§3.3).
    pub fn log_stats(&self) -> super::LogStats {
        self.inner.core.stats()
    }

    /// (committed, durable) ids: the STM's global ids, or in lock mode the last id committed
    /// and the last made durable (ids are per chain there, `locks.rs`).
    fn ids(&self) -> (u64, u64) {
        (
            self.inner.core.committed.load(Ordering::Acquire),
            self.inner.core.durable.load(Ordering::Acquire),
        )
    }
}

/// The core's sequencer for `config`'s perform mode: the global id order (STM), or the lock
/// mode's dependency order (§5) with its chains reproduced up to `reproduced`.
fn sequencer(
    pool: &Pool,
    meta_page: u64,
    config: &PtmConfig,
    reproduced: Vec<u64>,
) -> Box<dyn super::pipeline::Sequencer> {
    match lock_detect(config) {
        None => Box::new(super::pipeline::IdOrder::default()),
        Some(d) => Box::new(locks::DepOrder::new(
            pool,
            meta_page,
            config.max_threads,
            d,
            config.dudetx.fault,
            reproduced,
        )),
    }
}

/// The lock mode's detection, when the perform mode is the lock-based one.
fn lock_detect(config: &PtmConfig) -> Option<locks::Detect> {
    match config.dudetx.perform {
        PerformMode::Locks(d) => Some(d),
        _ => None,
    }
}

impl PtmEngine for DudetxPtm {
    fn name(&self) -> &'static str {
        "dudetx"
    }

    fn worker(&self) -> Result<Box<dyn PtmWorker>, PtmError> {
        let n = self.inner.workers.fetch_add(1, Ordering::Relaxed);
        if n >= self.inner.max_threads {
            self.inner.workers.fetch_sub(1, Ordering::Relaxed);
            return Err(PtmError::TooManyThreads(self.inner.max_threads));
        }
        let chain = if self.inner.lock_mode {
            match self.inner.free_chains.lock().pop() {
                Some(c) => Some(c),
                None => {
                    self.inner.workers.fetch_sub(1, Ordering::Relaxed);
                    return Err(PtmError::TooManyThreads(self.inner.max_threads));
                }
            }
        } else {
            None
        };
        Ok(Box::new(worker::StmWorker::new(self.inner.clone(), chain)))
    }

    fn root(&self) -> u64 {
        self.inner.root
    }

    fn root_size(&self) -> usize {
        self.root_size
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = self.log_stats();
        let p = self.inner.shadow.paging_stats();
        let (committed, durable) = self.ids();
        vec![
            ("live_objects", self.inner.live.load(Ordering::Relaxed)),
            ("heap_pages", self.inner.shadow.page_count() as u64),
            ("shadow_resident", p.resident),
            ("page_loads", p.loads),
            ("page_evictions", p.evictions),
            ("page_waits", p.waits),
            ("committed_id", committed),
            ("durable_id", durable),
            ("log_txns", s.txns),
            ("log_records", s.records),
            ("log_raw_bytes", s.raw_bytes),
            ("log_combined_bytes", s.combined_bytes),
            ("log_stored_bytes", s.stored_bytes),
        ]
    }

    fn pool(&self) -> &Pool {
        &self.inner.core.pool
    }

    fn durable_id(&self) -> Option<u64> {
        Some(self.ids().1)
    }

    fn committed_id(&self) -> Option<u64> {
        Some(self.ids().0)
    }

    /// Persists and reproduces everything committed, then checks the heap (see
    /// [`Shadow::check`]).
    fn check_invariants(&self) -> Result<(), String> {
        let _order = self.inner.commit_lock.lock();
        self.inner.core.drain()?;
        self.inner.shadow.check(
            &self.inner.core.pool,
            self.inner.live.load(Ordering::Relaxed),
        )
    }
}

impl Drop for DudetxPtm {
    fn drop(&mut self) {
        let core = &self.inner.core;
        // A clean close persists and reproduces what is queued; after a simulated power
        // failure nothing more may touch PM.
        if core.pool.crash_sim().is_some_and(|s| s.has_crashed()) {
            return;
        }
        if !core.config.background {
            let _ = core.drain();
        }
        core.stop();
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }
}
