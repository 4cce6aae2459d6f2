//! The crash-consistency harness: engine × persistence domain × workload.
//!
//! It runs a small workload under the pmem crash simulator ([`crate::pmem::crashsim`]), fails power
//! before a chosen PM event (sampled from a seed, or every event of the run with `exhaustive`),
//! materialises crash images of that point (under ADR each pending cache line keeps some prefix of
//! its stores; under both domains each unfenced non-temporal store piece survives or not), recovers
//! each image as a pool and checks
//! it ([`checks`]): structure (indexes and heap agree, no leaked or doubly owned slot),
//! durability of every acknowledged commit, atomicity, the workload's invariants, and liveness
//! (the recovered database takes new transactions and still checks out). Every few images it also
//! crashes the recovery itself at one of its PM events and recovers that image again. With
//! [`CrashTestConfig::rounds`] > 1 a crash point starts a chain of crashes across restarts.
//!
//! Real crashes (SIGKILL of a child `pmtx` process) are in [`realkill`].

pub mod bytekey;
pub mod checks;
pub mod drop;
pub mod fault;
pub mod fuzz;
pub mod ptm;
pub mod realkill;
pub mod tpcc;
pub mod varlen;
pub mod workload;

use crate::alloc::PAGE_SIZE;
use crate::catalog::TableId;
use crate::cc::Protocol;
use crate::db::{Db, DbConfig};
use crate::engine::{DbError, EngineKind};
use crate::pmem::{
    CrashImage, CrashSim, CrashTrigger, PersistenceDomain, Pool, PoolOptions, SimulatedCrash,
};
pub use fault::InjectedFault;

use checks::{check_state, observe, Violation, ViolationKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;
use workload::{CrashWorkload, Observed, Oracle, OracleEvent, Recorder, TxCtx, WorkloadKind};

/// FIR takes an index leaf checkpoint after every this many commits under the crash harness, so
/// that crashes hit checkpoints and recoveries start from one.
pub const FIR_CRASH_CHECKPOINT_EVERY: u64 = 5;
/// FIR's slots per block in crash runs (a 2 MiB page holds far more: small blocks make short
/// runs fill blocks and collect them).
pub const FIR_CRASH_BLOCK_SLOTS: u64 = 10;
/// A FIR worker's GC round every this many of its commits in crash runs.
pub const FIR_CRASH_GC_EVERY: u64 = 4;
/// Extra pages per thread for FIR's small blocks in crash runs.
pub const FIR_CRASH_GC_SPARE_BLOCKS: u64 = 6;

/// Engines the suite covers. Adding an engine is one entry here (and, if it is not crash-safe
/// under some domain, one arm in [`supported`]; the protocols it runs come from
/// [`EngineKind::supports`]).
pub const ENGINES: &[EngineKind] = &[
    EngineKind::Falcon,
    EngineKind::FalconAllflush,
    EngineKind::FalconNoflush,
    EngineKind::Inp,
    EngineKind::Outp,
    EngineKind::Wbl,
    EngineKind::Zen,
    EngineKind::Fir,
    EngineKind::Dudetx,
    EngineKind::Mmdb,
];

/// MMDB takes a checkpoint after every this many commits under the crash harness (inline mode),
/// so that crashes hit checkpoints and their truncations, and recoveries start from one.
pub const MMDB_CRASH_CHECKPOINT_EVERY: u64 = 2;

/// DUDETx's group size under the crash harness (async mode persists every this many commits).
pub const DUDETX_CRASH_GROUP: usize = 3;

/// Whether the suite runs `engine` with `protocol` under `domain`; `Err` says why not.
pub fn supported(
    engine: EngineKind,
    domain: PersistenceDomain,
    protocol: Protocol,
) -> Result<(), String> {
    if !engine.supports(protocol) {
        let runs: Vec<&str> = Protocol::ALL
            .iter()
            .filter(|p| engine.supports(**p))
            .map(|p| p.name())
            .collect();
        return Err(format!(
            "engine {engine} does not run the {protocol} protocol (it runs: {})",
            runs.join(", ")
        ));
    }
    if !matches!(domain, PersistenceDomain::Adr | PersistenceDomain::Eadr) {
        return Err(format!(
            "the crash simulator models adr and eadr; {domain} is not crash-tested"
        ));
    }
    match engine {
        EngineKind::Volatile => Err("the volatile engine promises no durability".into()),
        EngineKind::FalconNoflush if domain == PersistenceDomain::Adr => Err(
            "falcon-noflush is not crash-safe under adr by design: it never flushes data and \
             relies on eADR's caches reaching PM; test it under eadr"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// Why a crash test could not run (violations are results, not errors).
#[derive(Debug, thiserror::Error)]
pub enum CrashTestError {
    /// The engine × domain × workload combination is not tested.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The fault-free setup itself failed.
    #[error("crash test setup failed: {0}")]
    Setup(String),
}

/// One crash test.
#[derive(Clone, Debug)]
pub struct CrashTestConfig {
    /// The engine.
    pub engine: EngineKind,
    /// The persistence domain simulated.
    pub domain: PersistenceDomain,
    /// The concurrency-control protocol.
    pub protocol: Protocol,
    /// The workload.
    pub workload: WorkloadKind,
    /// Crash images to check (sampled mode; exhaustive mode checks as many as the run yields).
    pub images: u64,
    /// The seed of crash points, images and workload.
    pub seed: u64,
    /// Worker threads running the workload (with more than one, events interleave and a crash is at
    /// a global event).
    pub threads: usize,
    /// Transactions per thread after the load.
    pub txns_per_thread: usize,
    /// Crash before every PM event of the run instead of sampled ones.
    pub exhaustive: bool,
    /// Crash only before this event (to reproduce a reported failure).
    pub event: Option<u64>,
    /// Images drawn per crash point (at most: under eADR a point has more than one image only
    /// while non-temporal stores are pending).
    pub images_per_point: usize,
    /// Every how many images the recovery itself is crashed and recovered again (0: never).
    pub recovery_crash_every: u64,
    /// Transactions run on each recovered database to check it is live.
    pub liveness_txns: usize,
    /// A deliberate engine bug (the engine's test-only fault knob; it must apply to `engine`).
    pub fault: Option<InjectedFault>,
    /// Crashes per chain (1: each crash point starts from a new pool). With `rounds` > 1 a crash
    /// point starts a chain: crash, recover, check, then run `txns_per_thread` more transactions
    /// on the recovered pool (under the simulator again, recovery included) and crash again at a
    /// random event, `rounds` times; so clocks, free lists and deleted lists carried across a
    /// restart are exercised. With real kills: consecutive kills of children on one pool.
    pub rounds: usize,
    /// Falcon's window slot size in bytes (`None`: the engine's default). A small slot (256, the
    /// minimum) makes most transactions spill their redo to spill pages (Falcon's spill path).
    pub window_slot_bytes: Option<usize>,
    /// Where the tables' primary indexes live (`pm`: Falcon's persistent indexes, issue 17).
    pub index: crate::index::IndexPlacement,
    /// DUDETx: sync (every acknowledged commit must survive) or async (everything up to the
    /// durable id reported after each commit must survive, nothing after a gap may appear).
    pub dudetx_mode: crate::engine::dudetx::DurabilityMode,
}

/// Log-ring slots per thread of an inp database under test (see `CrashTestConfig::db_config`):
/// few enough that the default 24 transactions per thread go round the ring several times.
pub const INP_CRASH_RING_SLOTS: usize = 4;

impl CrashTestConfig {
    /// Defaults: 2000 images, seed 1, one thread, 24 transactions, 4 images per crash point,
    /// a crashed recovery every 16 images, 4 liveness transactions.
    pub fn new(
        engine: EngineKind,
        domain: PersistenceDomain,
        workload: WorkloadKind,
    ) -> CrashTestConfig {
        CrashTestConfig {
            engine,
            domain,
            protocol: engine.default_protocol(),
            workload,
            images: 2000,
            seed: 1,
            threads: 1,
            txns_per_thread: 24,
            exhaustive: false,
            event: None,
            images_per_point: 4,
            recovery_crash_every: 16,
            liveness_txns: 4,
            fault: None,
            rounds: 1,
            window_slot_bytes: None,
            index: crate::index::IndexPlacement::Dram,
            dudetx_mode: crate::engine::dudetx::DurabilityMode::Sync,
        }
    }

    fn db_config(&self, tables: usize) -> DbConfig {
        let mut c = DbConfig::temporary()
            .engine(self.engine)
            .protocol(self.protocol)
            .domain(self.domain)
            .max_threads(self.threads + 1);
        c.counting = false;
        if let Some(f) = self.fault {
            f.apply(&mut c);
        }
        c.max_retries = 100_000;
        c.pool_size = self.pool_size(tables);
        if matches!(self.engine, EngineKind::Inp | EngineKind::Outp) {
            // Inp's 256-slot log ring would not wrap in a run of a few dozen transactions, so no
            // slot would ever be reused: a fault that shows only on a reused slot (commit-mark-first
            // makes a stale payload look committed) would go unseen. A long run reuses every slot;
            // a small ring makes a short one do so too.
            c.window_slots = Some(INP_CRASH_RING_SLOTS);
        }
        c.window_slot_bytes = self.window_slot_bytes;
        c.index_placement = self.index;
        // The simulator's events must come from the threads it drives: the recovery sweep runs
        // in them (as transactions reach pages, and in the structure check).
        c.background_recovery = false;
        if self.engine == EngineKind::Dudetx {
            // Persist and reproduce in the threads the simulator drives; a one-page log ring
            // that the run wraps; async commits persisted in groups of three, so that crashes
            // find committed transactions that are not durable yet.
            c.dudetx_background = false;
            c.dudetx_log_pages = 1;
            c.dudetx_mode = self.dudetx_mode;
            c.dudetx_group = DUDETX_CRASH_GROUP;
        }
        if self.engine == EngineKind::Mmdb {
            // Log and checkpoint in the threads the simulator drives, a checkpoint every few
            // commits, and a one-page ring.
            c.mmdb_background = false;
            c.mmdb_log_pages = 1;
            c.mmdb_checkpoint_every = MMDB_CRASH_CHECKPOINT_EVERY;
        }
        if self.engine == EngineKind::Fir {
            // Checkpoints inside the crash window, at points the run reproduces (a background
            // thread's would land at different events each run).
            c.fir_checkpoint_interval_ms = None;
            c.fir_checkpoint_every_commits = Some(FIR_CRASH_CHECKPOINT_EVERY);
            // Incremental ones after the first full one: the crashes land in both kinds, and
            // recoveries load merged pages.
            c.fir_checkpoint_mode = crate::engine::fir::CheckpointMode::Incremental;
            // Small blocks and a GC round every few commits of a worker: the runs fill blocks,
            // empty them and free them, so crashes land during both stages of GC (§4.5).
            // (Bank and YCSB only: TPC-C's and grow's loads would take a page per few rows.)
            if matches!(self.workload, WorkloadKind::Bank | WorkloadKind::Ycsb) {
                c.fir_block_slots = Some(FIR_CRASH_BLOCK_SLOTS);
            }
            c.fir_gc_every_commits = Some(FIR_CRASH_GC_EVERY);
        }
        c
    }

    /// A pool just large enough: header, meta page, per thread a window and a heap page per table,
    /// and a spare page.
    fn pool_size(&self, tables: usize) -> u64 {
        let extra = self.workload.build().extra_pages_per_thread();
        // FIR's index leaf checkpoint: the valid one and the next one being written.
        let checkpoints = match self.engine {
            // Plus blocks of FIR_CRASH_BLOCK_SLOTS slots per thread: the ones GC has not freed
            // yet (it waits for a checkpoint) and the ones being filled.
            EngineKind::Fir => 2 + FIR_CRASH_GC_SPARE_BLOCKS * self.threads as u64,
            // The valid checkpoint and the next one being written, plus the log ring.
            EngineKind::Mmdb => 3,
            _ => 0,
        };
        let mut pages = 1 + (self.threads as u64) * (1 + tables as u64 + extra) + 1 + checkpoints;
        if self.index == crate::index::IndexPlacement::Pm {
            // Each table's persistent index: its root page, and one to grow into.
            pages += 2 * tables as u64;
        }
        // Never below what `Db::create` accepts for these worker slots.
        ((pages + 1) * PAGE_SIZE).max(crate::db::min_pool_size(self.engine, self.threads + 1))
    }

    fn pool_options(&self) -> PoolOptions {
        PoolOptions::new(self.engine.layout(), self.domain).with_counting(false)
    }

    /// Whether this configuration can run: engine × domain × protocol ([`supported`]), threads,
    /// and a fault that applies to the engine and can break it under the domain.
    pub fn check(&self) -> Result<(), CrashTestError> {
        supported(self.engine, self.domain, self.protocol).map_err(CrashTestError::Unsupported)?;
        if self.index == crate::index::IndexPlacement::Pm
            && matches!(
                self.engine,
                EngineKind::Zen | EngineKind::Volatile | EngineKind::Dudetx | EngineKind::Mmdb
            )
        {
            return Err(CrashTestError::Unsupported(format!(
                "--index pm: engine {} does not support persistent indexes",
                self.engine
            )));
        }
        if self.rounds == 0 || self.rounds > 1000 {
            return Err(CrashTestError::Unsupported(
                "rounds must be between 1 and 1000".into(),
            ));
        }
        if self.threads == 0 || self.threads > 8 {
            return Err(CrashTestError::Unsupported(
                "threads must be between 1 and 8".into(),
            ));
        }
        if let Some(f) = self.fault {
            f.check_under(self.engine, self.domain)
                .map_err(CrashTestError::Unsupported)?;
        }
        if self.images_per_point == 0 || self.txns_per_thread == 0 {
            return Err(CrashTestError::Unsupported(
                "images per crash point and transactions per thread must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The command line that reproduces crash point `event` of this configuration.
    pub fn reproduce(&self, event: u64) -> String {
        let mut s = format!(
            "pmtx crashtest --engine {} --domain {} --workload {} --threads {} --seed {} --event {event}",
            self.engine, self.domain, self.workload, self.threads, self.seed
        );
        if self.protocol != self.engine.default_protocol() {
            s.push_str(&format!(" --cc {}", self.protocol));
        }
        if let Some(f) = self.fault {
            s.push_str(&format!(" --inject-fault {f}"));
        }
        if self.rounds > 1 {
            s.push_str(&format!(" --rounds {}", self.rounds));
        }
        if let Some(b) = self.window_slot_bytes {
            s.push_str(&format!(" --window-slot-bytes {b}"));
        }
        if self.index == crate::index::IndexPlacement::Pm {
            s.push_str(" --index pm");
        }
        if self.engine == EngineKind::Dudetx {
            s.push_str(&format!(" --dudetx-mode {}", self.dudetx_mode));
        }
        s
    }
}

/// A violation found, with what reproduces it.
#[derive(Clone, Debug, Serialize)]
pub struct ViolationRecord {
    /// The kind.
    pub kind: ViolationKind,
    /// What was wrong.
    pub message: String,
    /// The crash point (global PM event before which power failed).
    pub event: u64,
    /// Whether it was found after a crash during recovery (then `recovery_event` is set).
    pub recovery_event: Option<u64>,
    /// The round of its chain (1: the first crash of a new pool; see `CrashTestConfig::rounds`).
    pub round: usize,
    /// Surviving pending stores per cache line of the image (ADR), for the record.
    pub prefixes: Vec<usize>,
    /// The command that reruns this crash point.
    pub reproduce: String,
}

/// Median and maximum of a sample.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    /// The median.
    pub p50: f64,
    /// The maximum.
    pub max: f64,
}

impl Percentiles {
    fn of(mut xs: Vec<f64>) -> Percentiles {
        if xs.is_empty() {
            return Percentiles::default();
        }
        xs.sort_by(f64::total_cmp);
        Percentiles {
            p50: xs[xs.len() / 2],
            max: xs[xs.len() - 1],
        }
    }
}

/// What a crash test found.
#[derive(Clone, Debug, Serialize)]
pub struct CrashTestReport {
    /// The engine.
    pub engine: EngineKind,
    /// The domain.
    pub domain: PersistenceDomain,
    /// The workload.
    pub workload: String,
    /// Worker threads.
    pub threads: usize,
    /// The seed.
    pub seed: u64,
    /// The injected fault, if any.
    pub fault: Option<InjectedFault>,
    /// PM events of one whole (crash-free) run.
    pub events_per_run: u64,
    /// Crash points tried.
    pub crash_points: u64,
    /// Crash images recovered and checked.
    pub images: u64,
    /// Images of a crash before the database was created, refused cleanly by open (not checked).
    pub unformatted: u64,
    /// Recoveries crashed at one of their own PM events.
    pub recovery_crashes: u64,
    /// Images of those crashed recoveries, recovered again and checked.
    pub recovery_crash_images: u64,
    /// Crashes per chain (`CrashTestConfig::rounds`).
    pub rounds: usize,
    /// Images checked in rounds after the first (crashes of a recovered, restarted pool).
    pub restart_images: u64,
    /// The last round any chain reached (a chain stops early at an image that failed a check).
    pub deepest_round: usize,
    /// Violations by kind (0 expected); an image counts once per kind it violates.
    pub violations: BTreeMap<ViolationKind, u64>,
    /// The first violations, with their reproduction.
    pub examples: Vec<ViolationRecord>,
    /// Recovery (open of an image) time in milliseconds.
    pub recovery_ms: Percentiles,
    /// Wall time of the whole test in seconds.
    pub elapsed_s: f64,
}

impl CrashTestReport {
    /// All violations.
    pub fn total_violations(&self) -> u64 {
        self.violations.values().sum()
    }
}

/// How a piece of work under the simulator ended.
enum Caught<T> {
    Done(T),
    Crashed,
    Panicked(String),
}

fn catch<T>(f: impl FnOnce() -> T) -> Caught<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Caught::Done(v),
        Err(p) if SimulatedCrash::is(&*p) => Caught::Crashed,
        Err(p) => Caught::Panicked(panic_message(&*p)),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".into()
    }
}

/// Creates the workload's missing tables and records that they exist.
fn prepare(
    db: &Db,
    workload: &dyn CrashWorkload,
    recorder: &Recorder,
) -> Result<Vec<TableId>, DbError> {
    let mut ids = Vec::new();
    for schema in workload.schemas() {
        let id = match db.table(&schema.name) {
            Some(id) => id,
            None => db.create_table(schema)?,
        };
        ids.push(id);
    }
    recorder.record(OracleEvent::TablesCreated);
    Ok(ids)
}

/// Runs the load (if `load`) and `txns` transactions on each of `threads` threads. A simulated
/// crash in any thread comes back as `Caught::Crashed` (the others stop at their next PM event).
#[allow(clippy::too_many_arguments)]
fn drive(
    db: &Db,
    workload: &dyn CrashWorkload,
    recorder: &Recorder,
    load: bool,
    threads: usize,
    txns: usize,
    seed: u64,
    epoch: u64,
) -> Caught<Result<(), DbError>> {
    let tables = match catch(|| prepare(db, workload, recorder)) {
        Caught::Done(Ok(t)) => t,
        Caught::Done(Err(e)) => return Caught::Done(Err(e)),
        Caught::Crashed => return Caught::Crashed,
        Caught::Panicked(m) => return Caught::Panicked(m),
    };
    let body = |thread: usize| -> Result<(), DbError> {
        let mut ctx = TxCtx::new(db, tables.clone(), recorder, thread, epoch)?;
        if load && thread == 0 {
            workload.load(&mut ctx)?;
        }
        let mut rng = StdRng::seed_from_u64(seed ^ (thread as u64).wrapping_mul(0x9E37_79B9));
        for _ in 0..txns {
            workload.step(&mut ctx, &mut rng)?;
        }
        Ok(())
    };
    if threads <= 1 {
        return catch(|| body(0));
    }
    // The load first (thread 0, on this thread), then the threads together.
    if load {
        match catch(|| -> Result<(), DbError> {
            let mut ctx = TxCtx::new(db, tables.clone(), recorder, 0, epoch)?;
            workload.load(&mut ctx)
        }) {
            Caught::Done(Ok(())) => {}
            other => return other,
        }
    }
    let body = |thread: usize| -> Result<(), DbError> {
        let mut ctx = TxCtx::new(db, tables.clone(), recorder, thread, epoch)?;
        let mut rng = StdRng::seed_from_u64(seed ^ (thread as u64).wrapping_mul(0x9E37_79B9));
        for _ in 0..txns {
            workload.step(&mut ctx, &mut rng)?;
        }
        Ok(())
    };
    let results: Vec<Caught<Result<(), DbError>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || catch(|| body(t))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Caught::Panicked("thread join".into())))
            .collect()
    });
    let mut crashed = false;
    for r in results {
        match r {
            Caught::Done(Ok(())) => {}
            Caught::Crashed => crashed = true,
            other => return other,
        }
    }
    if crashed {
        Caught::Crashed
    } else {
        Caught::Done(Ok(()))
    }
}

/// One run of the workload under the simulator until the crash (or its end, where power then
/// fails).
struct RunResult {
    sim: Arc<CrashSim>,
    oracle: Oracle,
    /// Whether the database was created before the crash.
    created: bool,
}

fn run_to_crash(
    cfg: &CrashTestConfig,
    workload: &dyn CrashWorkload,
    trigger: CrashTrigger,
) -> Result<RunResult, CrashTestError> {
    let tables = workload.schemas().len();
    let opts = cfg.pool_options().with_crash_sim(trigger);
    let pool = Pool::create_in_memory(cfg.pool_size(tables), &opts)
        .map_err(|e| CrashTestError::Setup(e.to_string()))?;
    let sim = pool.crash_sim().expect("attached").clone();
    let recorder = Recorder::new(Oracle::new(tables));
    let mut created = false;
    let outcome = catch(|| -> Result<(), CrashTestError> {
        let db = Db::create_on_pool(pool, cfg.db_config(tables))
            .map_err(|e| CrashTestError::Setup(format!("create: {e}")))?;
        created = true;
        match drive(
            &db,
            workload,
            &recorder,
            true,
            cfg.threads,
            cfg.txns_per_thread,
            cfg.seed,
            0,
        ) {
            Caught::Done(Ok(())) | Caught::Crashed => {}
            Caught::Done(Err(e)) => {
                return Err(CrashTestError::Setup(format!("workload: {e}")));
            }
            Caught::Panicked(m) => {
                return Err(CrashTestError::Setup(format!("workload panicked: {m}")))
            }
        }
        // Power fails at the end of the run if it has not failed yet.
        if let Some(p) = db.engine().pool() {
            p.crash_now();
        }
        Ok(())
    });
    match outcome {
        Caught::Done(r) => r?,
        Caught::Crashed => {}
        Caught::Panicked(m) => return Err(CrashTestError::Setup(format!("panicked: {m}"))),
    }
    Ok(RunResult {
        sim,
        oracle: recorder.snapshot(),
        created,
    })
}

/// The checks of one recovered database: the oracle state, then liveness. Also returns the
/// state read right after recovery (before the liveness transactions) when it checked out, for
/// a next round to start from.
fn check_recovered(
    cfg: &CrashTestConfig,
    workload: &dyn CrashWorkload,
    db: &Db,
    oracle: &Oracle,
    seed: u64,
) -> (Vec<Violation>, Option<Observed>) {
    let checked = catch(|| -> Result<(Vec<Violation>, Observed), Violation> {
        let (observed, live) = observe(db, workload, oracle)?;
        let mut found = check_state(workload, oracle, &observed, &live);
        found.extend(checks::check_database(workload, db));
        Ok((found, observed))
    });
    let observed = match checked {
        Caught::Done(Ok((v, _))) if !v.is_empty() => return (v, None),
        Caught::Done(Ok((_, observed))) => observed,
        Caught::Done(Err(v)) => return (vec![v], None),
        Caught::Crashed => unreachable!("no simulator on a recovered image"),
        Caught::Panicked(m) => {
            return (
                vec![Violation::new(
                    ViolationKind::Panic,
                    format!("checking: {m}"),
                )],
                None,
            )
        }
    };
    if cfg.liveness_txns == 0 {
        return (Vec::new(), Some(observed));
    }
    let live = catch(|| -> Result<Vec<Violation>, String> {
        let recorder = Recorder::new(Oracle::from_state(&observed));
        match drive(
            db,
            workload,
            &recorder,
            observed.iter().all(|t| t.is_empty()),
            1,
            cfg.liveness_txns,
            seed,
            1,
        ) {
            Caught::Done(Ok(())) => {}
            Caught::Done(Err(e)) => return Err(format!("new transactions failed: {e}")),
            Caught::Crashed => unreachable!("no simulator on a recovered image"),
            Caught::Panicked(m) => return Err(format!("new transactions panicked: {m}")),
        }
        let oracle = recorder.snapshot();
        let (observed, live) = observe(db, workload, &oracle).map_err(|v| v.message)?;
        let mut found = check_state(workload, &oracle, &observed, &live);
        found.extend(checks::check_database(workload, db));
        Ok(found)
    });
    let problems = match live {
        Caught::Done(Ok(v)) => v.into_iter().map(|v| v.message).collect(),
        Caught::Done(Err(m)) => vec![m],
        Caught::Crashed => Vec::new(),
        Caught::Panicked(m) => vec![format!("panicked: {m}")],
    };
    let found: Vec<Violation> = problems
        .into_iter()
        .map(|m| {
            Violation::new(
                ViolationKind::Liveness,
                format!("after recovery, new transactions: {m}"),
            )
        })
        .collect();
    let clean = found.is_empty().then_some(observed);
    (found, clean)
}

/// What the recovery of one image found.
struct Recovered {
    /// Open (recovery) time in milliseconds.
    ms: f64,
    violations: Vec<Violation>,
    /// The state right after recovery, when every check passed.
    observed: Option<Observed>,
}

impl Recovered {
    fn failed(ms: f64, v: Violation) -> Recovered {
        Recovered {
            ms,
            violations: vec![v],
            observed: None,
        }
    }
}

/// Recovers `bytes` (timing the open) and checks it. `None` when the image is of a database whose
/// creation never finished and open refused it cleanly.
fn recover_and_check(
    cfg: &CrashTestConfig,
    workload: &dyn CrashWorkload,
    bytes: &[u8],
    oracle: &Oracle,
    created: bool,
    seed: u64,
) -> Option<Recovered> {
    let tables = workload.schemas().len();
    let pool = match Pool::from_image(bytes, &cfg.pool_options()) {
        Ok(p) => p,
        Err(_) if !created => return None,
        Err(e) => {
            return Some(Recovered::failed(
                0.0,
                Violation::new(
                    ViolationKind::Recovery,
                    format!("the image is not a pool: {e}"),
                ),
            ))
        }
    };
    let started = Instant::now();
    let opened = catch(|| Db::open_pool(pool, cfg.db_config(tables)));
    let ms = started.elapsed().as_secs_f64() * 1e3;
    match opened {
        Caught::Done(Ok(db)) => {
            let (violations, observed) = check_recovered(cfg, workload, &db, oracle, seed);
            Some(Recovered {
                ms,
                violations,
                observed,
            })
        }
        Caught::Done(Err(_)) if !created => None,
        Caught::Done(Err(e)) => Some(Recovered::failed(
            ms,
            Violation::new(ViolationKind::Recovery, format!("recovery failed: {e}")),
        )),
        Caught::Crashed => unreachable!("no simulator on a recovered image"),
        Caught::Panicked(m) => Some(Recovered::failed(
            ms,
            Violation::new(ViolationKind::Panic, format!("recovery panicked: {m}")),
        )),
    }
}

/// Crashes the recovery of `image` at a random one of its PM events, then recovers the images of
/// that crash and checks them. Returns (the recovery event, images checked, violations).
fn crash_recovery(
    cfg: &CrashTestConfig,
    workload: &dyn CrashWorkload,
    image: &CrashImage,
    oracle: &Oracle,
    rng: &mut StdRng,
) -> Option<(u64, Vec<Vec<Violation>>)> {
    let tables = workload.schemas().len();
    // `Err`: the recovery panicked for real (not the simulator's crash).
    let open_under = |trigger: CrashTrigger| -> Result<Option<Arc<CrashSim>>, String> {
        let Ok(pool) = Pool::from_image(&image.bytes, &cfg.pool_options().with_crash_sim(trigger))
        else {
            return Ok(None);
        };
        let sim = pool.crash_sim().expect("attached").clone();
        match catch(|| Db::open_pool(pool, cfg.db_config(tables))) {
            Caught::Done(Ok(_)) | Caught::Crashed => Ok(Some(sim)),
            Caught::Done(Err(_)) => Ok(None),
            Caught::Panicked(m) => Err(m),
        }
    };
    // A panic here was already reported by the plain recovery of the same image.
    let events = open_under(CrashTrigger::Never).ok()??.events();
    if events == 0 {
        // This recovery writes nothing to PM (e.g. Zen's, unless it discards a persisting
        // transaction): there is no event to crash it at.
        return None;
    }
    let at = rng.gen_range(0..events);
    let sim = match open_under(CrashTrigger::AtEvent(at)) {
        Ok(sim) => sim?,
        // A recovery stopped by the simulator must unwind as the simulator's crash; anything else
        // (e.g. a scan thread's crash turned into a real panic on join) is a violation.
        Err(m) => {
            return Some((
                at,
                vec![vec![Violation::new(
                    ViolationKind::Panic,
                    format!("recovery crashed at its event {at} panicked: {m}"),
                )]],
            ))
        }
    };
    let state = sim.crash_state()?;
    let found = state
        .images(2, rng.gen())
        .filter_map(|img| {
            recover_and_check(cfg, workload, &img.bytes, oracle, true, at).map(|r| r.violations)
        })
        .collect();
    Some((at, found))
}

/// Rounds 2..=`cfg.rounds` of a chain: each reopens the previous round's image under the
/// simulator (recovery runs again, and may itself be where power fails), runs more transactions
/// on the recovered database from the state `observed` there, and crashes at a random event in
/// `[0, events]` (or at the end). Its images are recovered and checked against an oracle whose
/// acknowledged state is `observed`; the chain goes on from one that checked out. Returns every
/// image checked, with its round and what its recovery found.
fn restart_rounds(
    cfg: &CrashTestConfig,
    workload: &dyn CrashWorkload,
    mut bytes: Vec<u8>,
    mut observed: Observed,
    events: u64,
    rng: &mut StdRng,
) -> Vec<(usize, CrashImage, Recovered)> {
    let tables = workload.schemas().len();
    let mut found = Vec::new();
    for round in 2..=cfg.rounds {
        let at = rng.gen_range(0..=events);
        let opts = cfg.pool_options().with_crash_sim(CrashTrigger::AtEvent(at));
        let Ok(pool) = Pool::from_image(&bytes, &opts) else {
            break; // the previous round's checks opened this image: not reached
        };
        let sim = pool.crash_sim().expect("attached").clone();
        let recorder = Recorder::new(Oracle::from_state(&observed));
        let outcome = catch(|| -> Result<(), String> {
            let db = Db::open_pool(pool, cfg.db_config(tables)).map_err(|e| e.to_string())?;
            // Insert keys of this round differ from earlier rounds' and the liveness check's.
            let epoch = 1 + round as u64;
            match drive(
                &db,
                workload,
                &recorder,
                false,
                cfg.threads,
                cfg.txns_per_thread,
                rng.gen(),
                epoch,
            ) {
                Caught::Done(Ok(())) | Caught::Crashed => {}
                Caught::Done(Err(e)) => return Err(format!("workload: {e}")),
                Caught::Panicked(m) => return Err(format!("workload panicked: {m}")),
            }
            if let Some(p) = db.engine().pool() {
                p.crash_now();
            }
            Ok(())
        });
        let problem = match outcome {
            Caught::Done(Ok(())) | Caught::Crashed => None,
            Caught::Done(Err(m)) | Caught::Panicked(m) => Some(m),
        };
        let Some(state) = sim.crash_state() else {
            break;
        };
        let oracle = recorder.snapshot();
        let mut next = None;
        for image in state.images(cfg.images_per_point.max(1), rng.gen()) {
            let mut recovered =
                recover_and_check(cfg, workload, &image.bytes, &oracle, true, rng.gen())
                    .unwrap_or_else(|| {
                        Recovered::failed(
                            0.0,
                            Violation::new(
                                ViolationKind::Recovery,
                                "a restarted pool's image does not open".to_string(),
                            ),
                        )
                    });
            if let Some(m) = &problem {
                recovered.violations.push(Violation::new(
                    ViolationKind::Liveness,
                    format!("round {round}: the restarted database failed: {m}"),
                ));
                recovered.observed = None;
            }
            if let Some(o) = recovered.observed.take() {
                next = Some((image.bytes.clone(), o));
            }
            found.push((round, image, recovered));
        }
        match next {
            Some((b, o)) => (bytes, observed) = (b, o),
            None => break,
        }
    }
    found
}

/// Runs a crash test.
pub fn run(cfg: &CrashTestConfig) -> Result<CrashTestReport, CrashTestError> {
    run_with_progress(cfg, &mut |_| {})
}

/// [`run`], calling `progress` with the report so far after every crash point (for progress
/// displays on long runs: images checked, violations, elapsed time).
pub fn run_with_progress(
    cfg: &CrashTestConfig,
    progress: &mut dyn FnMut(&CrashTestReport),
) -> Result<CrashTestReport, CrashTestError> {
    cfg.check()?;
    crate::pmem::retain_freed_memory();
    let started = Instant::now();
    let workload = cfg.workload.build();
    let workload = &*workload;
    // A crash-free run counts the events crash points are drawn from.
    let dry = run_to_crash(cfg, workload, CrashTrigger::Never)?;
    let events = dry.sim.crashed_at().unwrap_or_else(|| dry.sim.events());
    drop(dry);
    // Workloads that load outside the crash window (TPC-C) crash only after their load.
    let first_event = workload.crash_window_start().min(events);
    let mut report = CrashTestReport {
        engine: cfg.engine,
        domain: cfg.domain,
        workload: workload.name().to_string(),
        threads: cfg.threads,
        seed: cfg.seed,
        fault: cfg.fault,
        events_per_run: events,
        crash_points: 0,
        images: 0,
        unformatted: 0,
        recovery_crashes: 0,
        recovery_crash_images: 0,
        rounds: cfg.rounds,
        restart_images: 0,
        deepest_round: 1,
        violations: BTreeMap::new(),
        examples: Vec::new(),
        recovery_ms: Percentiles::default(),
        elapsed_s: 0.0,
    };
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut recovery_ms = Vec::new();
    let mut next_exhaustive = first_event;
    let per_point = cfg.images_per_point;
    loop {
        let point = if let Some(e) = cfg.event {
            if report.crash_points > 0 {
                break;
            }
            e
        } else if cfg.exhaustive {
            if next_exhaustive > events {
                break;
            }
            next_exhaustive += 1;
            next_exhaustive - 1
        } else {
            if report.images >= cfg.images {
                break;
            }
            rng.gen_range(first_event..=events)
        };
        report.crash_points += 1;
        let run = run_to_crash(cfg, workload, CrashTrigger::AtEvent(point))?;
        let Some(state) = run.sim.crash_state() else {
            continue;
        };
        let image_seed = cfg.seed ^ point.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // A chain goes on from one image of this point that checked out (the last one).
        let mut chain_start: Option<(Vec<u8>, Observed)> = None;
        for image in state.images(per_point, image_seed) {
            let Some(recovered) = recover_and_check(
                cfg,
                workload,
                &image.bytes,
                &run.oracle,
                run.created,
                image_seed,
            ) else {
                report.unformatted += 1;
                continue;
            };
            report.images += 1;
            recovery_ms.push(recovered.ms);
            report.note(cfg, &image, None, 1, recovered.violations);
            if let Some(observed) = recovered.observed {
                chain_start = Some((image.bytes.clone(), observed));
            }
            if run.created
                && cfg.recovery_crash_every > 0
                && report.images % cfg.recovery_crash_every == 0
            {
                if let Some((at, found)) =
                    crash_recovery(cfg, workload, &image, &run.oracle, &mut rng)
                {
                    report.recovery_crashes += 1;
                    for v in found {
                        report.recovery_crash_images += 1;
                        report.note(cfg, &image, Some(at), 1, v);
                    }
                }
            }
        }
        // Only from an image whose tables were created: the next round's oracle starts from the
        // observed rows with the tables created (`Oracle::from_state`), and a round that has to
        // create them first can crash before they are (found with falcon's PM indexes, whose
        // creation takes more PM events than a catalog store).
        if let Some((bytes, observed)) =
            chain_start.filter(|_| cfg.rounds > 1 && run.oracle.tables_created)
        {
            let mut chain_rng = StdRng::seed_from_u64(image_seed);
            let found = restart_rounds(cfg, workload, bytes, observed, events, &mut chain_rng);
            for (round, image, recovered) in found {
                report.restart_images += 1;
                report.deepest_round = report.deepest_round.max(round);
                recovery_ms.push(recovered.ms);
                report.note(cfg, &image, None, round, recovered.violations);
            }
        }
        report.elapsed_s = started.elapsed().as_secs_f64();
        progress(&report);
    }
    report.recovery_ms = Percentiles::of(recovery_ms);
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

impl CrashTestReport {
    const MAX_EXAMPLES: usize = 16;

    fn note(
        &mut self,
        cfg: &CrashTestConfig,
        image: &CrashImage,
        recovery_event: Option<u64>,
        round: usize,
        found: Vec<Violation>,
    ) {
        let mut kinds: Vec<ViolationKind> = found.iter().map(|v| v.kind).collect();
        kinds.sort();
        kinds.dedup();
        for k in kinds {
            *self.violations.entry(k).or_default() += 1;
        }
        for v in found {
            if self.examples.len() < Self::MAX_EXAMPLES {
                self.examples.push(ViolationRecord {
                    kind: v.kind,
                    message: v.message,
                    event: image.event,
                    recovery_event,
                    round,
                    prefixes: image.prefixes.clone(),
                    reproduce: cfg.reproduce(image.event),
                });
            }
        }
    }

    /// A human-readable summary.
    pub fn render(&self) -> String {
        let mut s = format!(
            "crashtest {} / {} / {} ({} thread{}{}), seed {}\n",
            self.engine,
            self.domain,
            self.workload,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.fault
                .map(|f| format!(", injected fault {f}"))
                .unwrap_or_default(),
            self.seed
        );
        s.push_str(&format!(
            "  PM events per run {}, crash points {}, images {} (+{} of a crash before creation)\n",
            self.events_per_run, self.crash_points, self.images, self.unformatted
        ));
        s.push_str(&format!(
            "  crashed recoveries {}, their images checked {}\n",
            self.recovery_crashes, self.recovery_crash_images
        ));
        if self.rounds > 1 {
            s.push_str(&format!(
                "  rounds per chain {} (deepest reached {}): images of restarted pools checked {}\n",
                self.rounds, self.deepest_round, self.restart_images
            ));
        }
        s.push_str(&format!(
            "  recovery time: p50 {:.3} ms, max {:.3} ms\n",
            self.recovery_ms.p50, self.recovery_ms.max
        ));
        s.push_str(&format!("  violations: {}", self.total_violations()));
        for k in ViolationKind::ALL {
            if let Some(n) = self.violations.get(&k) {
                s.push_str(&format!(", {k} {n}"));
            }
        }
        s.push('\n');
        for e in &self.examples {
            s.push_str(&format!(
                "  - {}{} at event {}{}: {}\n    reproduce: {}\n",
                e.kind,
                if e.round > 1 {
                    format!(" in round {}", e.round)
                } else {
                    String::new()
                },
                e.event,
                e.recovery_event
                    .map(|r| format!(" (then recovery crashed at its event {r})"))
                    .unwrap_or_default(),
                e.message,
                e.reproduce
            ));
        }
        s.push_str(&format!("  elapsed {:.1} s\n", self.elapsed_s));
        s
    }
}
