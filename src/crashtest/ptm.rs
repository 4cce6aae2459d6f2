//! The crash suite for the persistent-object API (`pmtx crashtest --engine archtm`): a
//! workload of transfers between account objects, list pushes and pops (alloc and free), object
//! replacement (the free of a committed object: a tombstone), aborted transactions, online
//! defragmentation and lookup-table checkpoints (§5.6), with garbage collection every few frees
//! (inline, or with `background` on ArchTM's GC and defragmentation threads), crashed under the
//! simulator before PM events (every one, or a sample), each crash image recovered and checked: recovery succeeds; the state is the
//! one after the last acknowledged step or after the step in flight (so every acknowledged
//! transaction survives and no uncommitted version is visible); no object is live but
//! unreachable (leaked); the allocator's invariants hold (nothing leaked or owned twice); and
//! the recovered pool keeps working.

use crate::engine::dudetx::ptm::DudetxPtmFault;
use crate::engine::dudetx::ptm::PerformMode;
use crate::engine::dudetx::DurabilityMode;
use crate::pmem::{CrashTrigger, PersistenceDomain, SimulatedCrash};
use crate::ptm::archtm::ArchtmFault;
use crate::ptm::{run_on_worker, PPtr, PTx, Ptm, PtmConfig, PtmEngineKind, PtmError, PtmWorker};

crate::pobject! {
    /// A list node.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub struct Node {
        /// The node's value.
        pub value: u64,
        /// The next node.
        pub next: PPtr<Node>,
    }
}

crate::pobject! {
    /// The workload's root.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub struct Root {
        /// Eight account objects.
        pub accounts: [PPtr<u64>; 8],
        /// The list.
        pub head: PPtr<Node>,
        /// Nodes in the list.
        pub len: u64,
    }
}

/// The logical contents the root reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// Account values.
    pub accounts: Vec<u64>,
    /// List values, head first.
    pub list: Vec<u64>,
}

/// Reads the state and counts the reachable objects (the root included).
pub fn state_of(ptm: &Ptm<Root>) -> Result<(State, usize), PtmError> {
    ptm.run(|tx| {
        let r = tx.read(tx.root())?;
        let mut accounts = Vec::new();
        let mut objects = 1;
        for a in r.accounts {
            if !a.is_null() {
                accounts.push(tx.read(a)?);
                objects += 1;
            }
        }
        let mut list = Vec::new();
        let mut p = r.head;
        while !p.is_null() {
            let n = tx.read(p)?;
            list.push(n.value);
            objects += 1;
            p = n.next;
            if list.len() as u64 > r.len {
                return Err(PtmError::Pool(format!(
                    "the list is longer than its len {}",
                    r.len
                )));
            }
        }
        if list.len() as u64 != r.len {
            return Err(PtmError::Pool(format!(
                "list of {} nodes, len {}",
                list.len(),
                r.len
            )));
        }
        Ok((State { accounts, list }, objects))
    })
}

/// A small deterministic generator.
pub struct Lcg(pub u64);

impl Lcg {
    /// A number below `n`.
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Allocates the eight accounts (100 each).
pub fn setup(ptm: &Ptm<Root>) -> Result<(), PtmError> {
    ptm.run(|tx| {
        let mut r = tx.read(tx.root())?;
        for a in r.accounts.iter_mut() {
            *a = tx.alloc(&100u64)?;
        }
        let root = tx.root();
        tx.write(root, &r)
    })
}

/// A transfer of up to `max` between two random accounts.
pub fn transfer(ptm: &Ptm<Root>, rng: &mut Lcg, max: u64) -> Result<(), PtmError> {
    Runner::new(ptm).transfer(rng, max)
}

/// Step `i` of the workload. Returns whether it committed (step kinds 4 abort on purpose);
/// adds the objects defragmentation moved to `moved`.
pub fn step(ptm: &Ptm<Root>, i: u64, rng: &mut Lcg, moved: &mut u64) -> Result<bool, PtmError> {
    Runner::new(ptm).step(i, rng, moved)
}

/// Runs the workload's transactions: through [`Ptm::run`], or on a few workers of their own in
/// turn (DUDETx's lock-based mode, §5: each worker is a chain, so lock hand-offs make
/// dependencies between chains, and the log ring holds the chains' records out of dependency
/// order). Taking turns, every transaction that commits also adds 1 to account 7: a word every
/// step writes, so any two steps applied out of order leave a state no step leads to.
pub struct Runner<'a> {
    ptm: &'a Ptm<Root>,
    workers: Vec<Box<dyn PtmWorker>>,
    turn: usize,
    /// Conflict retries per transaction on its own workers ([`Ptm::run`]'s default).
    retries: u32,
}

impl<'a> Runner<'a> {
    /// Transactions through [`Ptm::run`].
    pub fn new(ptm: &'a Ptm<Root>) -> Runner<'a> {
        Runner {
            ptm,
            workers: Vec::new(),
            turn: 0,
            retries: PtmConfig::temporary().max_retries,
        }
    }

    /// Transactions on `n` workers of their own, one after the other.
    pub fn taking_turns(ptm: &'a Ptm<Root>, n: usize) -> Result<Runner<'a>, PtmError> {
        let workers = (0..n)
            .map(|_| ptm.engine().worker())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Runner {
            workers,
            ..Runner::new(ptm)
        })
    }

    fn run<T>(
        &mut self,
        f: impl FnMut(&mut PTx<'_, Root>) -> Result<T, PtmError>,
    ) -> Result<T, PtmError> {
        if self.workers.is_empty() {
            return self.ptm.run(f);
        }
        let n = self.workers.len();
        let w = &mut self.workers[self.turn % n];
        self.turn += 1;
        let mut f = f;
        let stamped = |tx: &mut PTx<'_, Root>| {
            let v = f(tx)?;
            let r = tx.read(tx.root())?;
            let c = tx.read(r.accounts[7])?;
            tx.write(r.accounts[7], &(c + 1))?;
            Ok(v)
        };
        run_on_worker(&mut **w, self.ptm.engine().root(), self.retries, stamped).map(|(v, _)| v)
    }

    /// A transfer of up to `max` between two random accounts.
    pub fn transfer(&mut self, rng: &mut Lcg, max: u64) -> Result<(), PtmError> {
        let (a, b, amount) = (rng.next(8) as usize, rng.next(8) as usize, rng.next(max));
        self.run(|tx| {
            let r = tx.read(tx.root())?;
            let (x, y) = (tx.read(r.accounts[a])?, tx.read(r.accounts[b])?);
            if a != b && x >= amount {
                tx.write(r.accounts[a], &(x - amount))?;
                tx.write(r.accounts[b], &(y + amount))?;
            }
            Ok(())
        })
    }

    /// Step `i` of the workload (see [`step`]).
    pub fn step(&mut self, i: u64, rng: &mut Lcg, moved: &mut u64) -> Result<bool, PtmError> {
        let ptm = self.ptm;
        match i % 5 {
            0 => self.transfer(rng, 20).map(|()| true),
            3 => {
                if i % 10 == 8 {
                    // Online defragmentation (mock transactions that change no value): crashes
                    // during it must leave the same state.
                    *moved += ptm.defragment()?.1;
                }
                self.transfer(rng, 20).map(|()| true)
            }
            1 => {
                if i % 10 == 6 {
                    // An incremental lookup-table checkpoint (§5.6): crashes during it, and
                    // recoveries from it and its CHKP-diff, must keep the same state.
                    ptm.checkpoint()?;
                }
                self.run(|tx| {
                    let root = tx.root();
                    let r = tx.read(root)?;
                    let n = tx.alloc(&Node {
                        value: i,
                        next: r.head,
                    })?;
                    tx.update(root, |r| {
                        r.head = n;
                        r.len += 1;
                    })
                })
                .map(|()| true)
            }
            2 => {
                let pop = rng.next(2) == 0;
                self.run(|tx| {
                    let root = tx.root();
                    let r = tx.read(root)?;
                    if pop && !r.head.is_null() {
                        let n = tx.read(r.head)?;
                        tx.free(r.head)?;
                        tx.update(root, |r| {
                            r.head = n.next;
                            r.len -= 1;
                        })
                    } else {
                        // Replace an account object: alloc a copy, free the old one.
                        let k = (i % 8) as usize;
                        let v = tx.read(r.accounts[k])?;
                        let fresh = tx.alloc(&v)?;
                        tx.free(r.accounts[k])?;
                        tx.update(root, |r| r.accounts[k] = fresh)
                    }
                })
                .map(|()| true)
            }
            _ => {
                let k = rng.next(8) as usize;
                match self.run(|tx| {
                    let r = tx.read(tx.root())?;
                    tx.write(r.accounts[k], &1_000_000)?;
                    tx.alloc(&Node::default())?;
                    tx.abort::<()>()
                }) {
                    Err(PtmError::UserAbort) => Ok(false),
                    Err(e) => Err(e),
                    Ok(()) => Err(PtmError::Pool("an aborted transaction committed".into())),
                }
            }
        }
    }
}

/// What to crash.
#[derive(Clone, Debug)]
pub struct PtmCrashConfig {
    /// The domain simulated.
    pub domain: PersistenceDomain,
    /// A deliberate ordering bug.
    pub fault: Option<ArchtmFault>,
    /// The engine (ArchTM by default).
    pub engine: PtmEngineKind,
    /// DUDETx: a deliberate ordering bug.
    pub dudetx_fault: Option<DudetxPtmFault>,
    /// DUDETx: sync or async commits (async: a crash must keep exactly the transactions up to
    /// the recovered durable id, which is at least the one reported before the crash).
    pub dudetx_mode: DurabilityMode,
    /// DUDETx: shadow frames (§3.6 paging; 0: every page).
    pub dudetx_shadow_frames: usize,
    /// DUDETx: the perform mode. With the lock-based one (§5) the workload's transactions take
    /// turns on two workers (two chains, see [`Runner`]), and async crashes are checked against
    /// the steps (ids are per chain, so no id order says which survive): the recovered state
    /// is the one after some step from the last reported durable to the one in flight.
    pub dudetx_perform: PerformMode,
    /// Workload steps after setup.
    pub steps: u64,
    /// Crash before every `stride`-th PM event of the run (1: every event).
    pub stride: u64,
    /// Crash before this event only.
    pub event: Option<u64>,
    /// At most this many crash points, spread evenly over the run (overrides `stride`).
    pub points: Option<u64>,
    /// Images recovered per crash point.
    pub images_per_point: usize,
    /// Stop at the first violation.
    pub stop_at_first: bool,
    /// ArchTM: run the GC and defragmentation threads (every millisecond) instead of the
    /// inline collection. Their PM events interleave with the workload's differently on every
    /// run, so crash points are samples (use `points`), not an exhaustive sweep.
    pub background: bool,
}

impl PtmCrashConfig {
    /// Every event of a 60-step run, two images per point.
    pub fn new(domain: PersistenceDomain) -> PtmCrashConfig {
        PtmCrashConfig {
            domain,
            fault: None,
            engine: PtmEngineKind::Archtm,
            dudetx_fault: None,
            dudetx_mode: DurabilityMode::Sync,
            dudetx_shadow_frames: 0,
            dudetx_perform: PerformMode::Stm,
            steps: 60,
            stride: 1,
            event: None,
            points: None,
            images_per_point: 2,
            stop_at_first: true,
            background: false,
        }
    }

    /// A DUDETx run with `fault`.
    pub fn dudetx(
        domain: PersistenceDomain,
        mode: DurabilityMode,
        fault: Option<DudetxPtmFault>,
    ) -> PtmCrashConfig {
        PtmCrashConfig {
            engine: PtmEngineKind::Dudetx,
            dudetx_fault: fault,
            dudetx_mode: mode,
            ..PtmCrashConfig::new(domain)
        }
    }

    fn ptm_config(&self, faulty: bool, trigger: Option<CrashTrigger>) -> PtmConfig {
        // ArchTM: the meta page, a data page and a page per checkpoint copy. DUDETx: a page per
        // size class and one for its log ring.
        let size = match self.engine {
            PtmEngineKind::Archtm => 10 << 20,
            PtmEngineKind::Dudetx => 16 << 20,
        };
        let mut c = PtmConfig::temporary()
            .size(size)
            .domain(self.domain)
            .max_threads(2)
            .engine(self.engine)
            .inline_background();
        if self.background && self.engine == PtmEngineKind::Archtm {
            c.gc_interval = Some(std::time::Duration::from_millis(1));
            c.defrag_interval = Some(std::time::Duration::from_millis(1));
            // §4.5's rule: passes whenever blocks were recycled, so that crashes hit them.
            c.defrag_eager = true;
        }
        c.gc_threshold = 4;
        // Small segments, so fetches (and their CHKP-diff records) happen between checkpoints.
        c.segment_bytes = 1024;
        c.checkpoint_every = 0;
        c.archtm_fault = self.fault.filter(|_| faulty);
        c.dudetx.fault = self.dudetx_fault.filter(|_| faulty);
        c.dudetx.mode = self.dudetx_mode;
        c.dudetx.group = 3;
        c.dudetx.shadow_frames = self.dudetx_shadow_frames;
        c.dudetx.perform = self.dudetx_perform;
        if self.lock_mode() {
            // The two chains of the workload and `Ptm::run`'s worker (setup, reads).
            c.max_threads = 3;
        }
        c.crash_sim = trigger;
        c
    }

    /// Whether DUDETx runs its lock-based perform mode (§5).
    fn lock_mode(&self) -> bool {
        self.engine == PtmEngineKind::Dudetx && matches!(self.dudetx_perform, PerformMode::Locks(_))
    }

    /// The workload's runner on `ptm`: two chains taking turns in lock mode.
    fn runner<'a>(&self, ptm: &'a Ptm<Root>) -> Result<Runner<'a>, PtmError> {
        if self.lock_mode() {
            Runner::taking_turns(ptm, 2)
        } else {
            Ok(Runner::new(ptm))
        }
    }

    /// With the background threads: a pause after each step, so that their passes (every
    /// millisecond) fall within the run however fast the steps are, and crashes can hit them.
    fn let_threads_run(&self) {
        if self.background {
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
    }

    fn fault_name(&self) -> &'static str {
        match (self.fault, self.dudetx_fault) {
            (Some(f), _) => f.name(),
            (None, Some(f)) => f.name(),
            (None, None) => "no fault",
        }
    }
}

/// What a crash sweep found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PtmCrashReport {
    /// Crash points tried.
    pub points: u64,
    /// Images recovered and checked.
    pub images: u64,
    /// PM events of the whole run (after setup).
    pub events: u64,
    /// Objects online defragmentation moved in the run (so crashes hit it).
    pub defrag_moved: u64,
    /// Garbage collections and defragmentation passes the background threads ran in the
    /// reference run (engine stats `thread_gc_runs`, `thread_defrag_passes`; the workload's own
    /// `Ptm::defragment` calls and inline collections not counted): the work crashes can hit.
    pub background_work: (u64, u64),
    /// Violations (each names the point, image and what broke).
    pub violations: Vec<String>,
}

/// The reference run: the state after each step (`states[k]`: after k steps), the commit id
/// after each step (engines that number commits), the first and last PM event numbers of the
/// steps, and the objects defragmentation moved.
struct Reference {
    states: Vec<State>,
    ids: Vec<Option<u64>>,
    start: u64,
    end: u64,
    moved: u64,
    work: (u64, u64),
}

/// Runs the workload to the end.
fn reference(cfg: &PtmCrashConfig) -> Result<Reference, PtmError> {
    let ptm = Ptm::<Root>::create(cfg.ptm_config(false, Some(CrashTrigger::Never)))?;
    setup(&ptm)?;
    // Everything of the setup durable (DUDETx async: persisted and reproduced) before the
    // crash points start.
    ptm.check_invariants().map_err(PtmError::Pool)?;
    let events = || ptm.engine().pool().crash_sim().map_or(0, |s| s.events());
    let start = events();
    let mut rng = Lcg(7);
    let mut states = vec![state_of(&ptm)?.0];
    let mut ids = vec![ptm.committed_id()];
    let mut moved = 0;
    let mut runner = cfg.runner(&ptm)?;
    for i in 0..cfg.steps {
        runner.step(i, &mut rng, &mut moved)?;
        cfg.let_threads_run();
        states.push(state_of(&ptm)?.0);
        ids.push(ptm.committed_id());
    }
    let stat = |name| ptm.stats().iter().find(|s| s.0 == name).map_or(0, |s| s.1);
    Ok(Reference {
        states,
        ids,
        start,
        end: events(),
        moved,
        work: (stat("thread_gc_runs"), stat("thread_defrag_passes")),
    })
}

/// Crashes before event `at` and checks the images; returns images checked or a violation.
fn crash_at(cfg: &PtmCrashConfig, at: u64, reference: &Reference) -> Result<u64, String> {
    let states = &reference.states;
    let ptm = Ptm::<Root>::create(cfg.ptm_config(true, Some(CrashTrigger::AtEvent(at))))
        .map_err(|e| e.to_string())?;
    // A fault can shift the PM events, so the crash may come during the setup: that point
    // tests nothing (the sweep's others do).
    let ready = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        setup(&ptm).map_err(|e| e.to_string())?;
        ptm.check_invariants()
    }));
    match ready {
        Err(p) if SimulatedCrash::is(p.as_ref()) => return Ok(0),
        Err(p) => std::panic::resume_unwind(p),
        Ok(r) => r?,
    }
    let done = std::cell::Cell::new(0usize);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut rng = Lcg(7);
        let mut moved = 0;
        let mut runner = cfg.runner(&ptm)?;
        for i in 0..cfg.steps {
            runner.step(i, &mut rng, &mut moved)?;
            done.set(done.get() + 1);
            cfg.let_threads_run();
        }
        Ok::<(), PtmError>(())
    }));
    match r {
        Err(p) if !SimulatedCrash::is(p.as_ref()) => std::panic::resume_unwind(p),
        Ok(Err(e))
            if ptm
                .engine()
                .pool()
                .crash_sim()
                .is_some_and(|s| !s.has_crashed()) =>
        {
            return Err(format!("the workload failed before the crash: {e}"))
        }
        _ => {}
    }
    let sim = ptm
        .engine()
        .pool()
        .crash_sim()
        .cloned()
        .expect("a simulator");
    let Some(cs) = sim.crash_state() else {
        // The run ended before the event; the close (which drains the pipeline) may still
        // reach it (DUDETx paging shifts the events): that crash tests nothing.
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(ptm)));
        if let Err(p) = closed {
            if !SimulatedCrash::is(p.as_ref()) {
                std::panic::resume_unwind(p);
            }
        }
        return Ok(0);
    };
    let durable_before = ptm.durable_id();
    drop(ptm);
    let acked = done.get();
    let asynchronous =
        cfg.engine == PtmEngineKind::Dudetx && cfg.dudetx_mode == DurabilityMode::Async;
    let mut images = 0;
    for img in cs.images(cfg.images_per_point, at) {
        images += 1;
        let ctx = format!(
            "{} {}: crash before event {at} after {acked} steps, image {:?}",
            cfg.domain,
            cfg.fault_name(),
            img.prefixes
        );
        let ptm = Ptm::<Root>::open_image(&img.bytes, cfg.ptm_config(false, None))
            .map_err(|e| format!("{ctx}: recovery failed: {e}"))?;
        let (s, reachable) = state_of(&ptm).map_err(|e| format!("{ctx}: {e}"))?;
        if asynchronous && cfg.lock_mode() {
            // Per-chain ids: the step that committed the id reported durable last bounds the
            // survivors from below (each step reads the root, so it depends on the one before:
            // a durable step's predecessors are durable), the step in flight from above.
            let kd = durable_before
                .and_then(|b| reference.ids.iter().position(|id| *id == Some(b)))
                .unwrap_or(0);
            if !(kd..=acked + 1).any(|k| states.get(k) == Some(&s)) {
                return Err(format!(
                    "{ctx}: recovered {s:?}, which is the state after no step from {kd} (the \
                     last reported durable) to {}",
                    acked + 1
                ));
            }
        } else if asynchronous {
            // Async commits: exactly the transactions up to the recovered durable id survive
            // (a prefix: never one after a gap), and that id is at least the one reported
            // durable before the crash.
            let d = ptm.durable_id().unwrap_or(0);
            if durable_before.is_some_and(|b| d < b) {
                return Err(format!(
                    "{ctx}: recovered durable id {d}, but {durable_before:?} was reported durable"
                ));
            }
            let k = reference
                .ids
                .iter()
                .rposition(|id| id.is_some_and(|id| id <= d))
                .unwrap_or(0);
            if s != states[k] {
                return Err(format!(
                    "{ctx}: recovered {s:?} at durable id {d}, expected {:?} (step {k})",
                    states[k]
                ));
            }
        } else if s != states[acked] && states.get(acked + 1) != Some(&s) {
            return Err(format!(
                "{ctx}: recovered {s:?}, expected {:?} or {:?}",
                states[acked],
                states.get(acked + 1)
            ));
        }
        ptm.check_invariants().map_err(|e| format!("{ctx}: {e}"))?;
        let live = ptm
            .stats()
            .iter()
            .find(|s| s.0 == "live_objects")
            .map_or(0, |s| s.1) as usize;
        if live != reachable {
            return Err(format!(
                "{ctx}: {live} live objects, {reachable} reachable (leaked)"
            ));
        }
        // The recovered pool keeps working, and its allocator stays sound.
        let mut rng = Lcg(at);
        for i in 0..6 {
            step(&ptm, i, &mut rng, &mut 0).map_err(|e| format!("{ctx}: after recovery: {e}"))?;
        }
        ptm.check_invariants()
            .map_err(|e| format!("{ctx}: after more steps: {e}"))?;
    }
    Ok(images)
}

/// Crashes the workload at every `stride`-th event (or `event`) and checks every image.
pub fn sweep(cfg: &PtmCrashConfig) -> Result<PtmCrashReport, PtmError> {
    let reference = reference(cfg)?;
    let (start, end) = (reference.start, reference.end);
    let mut report = PtmCrashReport {
        events: end - start,
        defrag_moved: reference.moved,
        background_work: reference.work,
        ..Default::default()
    };
    let points: Vec<u64> = match cfg.event {
        Some(e) => vec![e],
        None => {
            let stride = match cfg.points {
                Some(n) => (end - start).div_ceil(n.max(1)).max(1),
                None => cfg.stride.max(1),
            };
            (start..end).step_by(stride as usize).collect()
        }
    };
    for at in points {
        report.points += 1;
        match crash_at(cfg, at, &reference) {
            Ok(n) => report.images += n,
            Err(v) => {
                report.violations.push(v);
                if cfg.stop_at_first {
                    break;
                }
            }
        }
    }
    Ok(report)
}
