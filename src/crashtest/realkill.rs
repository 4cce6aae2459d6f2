//! Real crashes: a child `pmtx crashtest --child-pool PATH` process runs a workload on a /dev/shm
//! pool and streams its oracle events (write sets before each commit, tids after) to the parent as
//! JSON lines; the parent SIGKILLs it at a random moment, reopens the pool, recovers it and runs
//! the same checks as for simulated crashes. A SIGKILL loses no store that reached the shared
//! mapping, so this is an eADR crash of real threads and real timing (the simulator covers ADR).

use super::checks::{Violation, ViolationKind};
use super::workload::{Oracle, OracleEvent, Recorder, WorkloadKind};
use super::{check_recovered, drive, Caught, CrashTestConfig, CrashTestError, Percentiles};
use crate::db::{Db, DbConfig};
use crate::engine::EngineKind;
use crate::pmem::PersistenceDomain;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Real-kill rounds.
#[derive(Clone, Debug)]
pub struct RealKillConfig {
    /// What runs in the child (engine, domain, workload, threads, seed).
    pub test: CrashTestConfig,
    /// SIGKILLs (one child each).
    pub kills: u32,
    /// The `pmtx` binary to spawn.
    pub pmtx: PathBuf,
    /// Where the pools go (e.g. a temporary directory under /dev/shm).
    pub dir: PathBuf,
    /// Kill delays are drawn from `[min_delay_ms, max_delay_ms)`.
    pub min_delay_ms: u64,
    /// See `min_delay_ms`.
    pub max_delay_ms: u64,
}

/// What the kills found.
#[derive(Clone, Debug, Serialize)]
pub struct RealKillReport {
    /// The engine.
    pub engine: EngineKind,
    /// The domain the child ran under.
    pub domain: PersistenceDomain,
    /// Children killed.
    pub kills: u32,
    /// Kills that landed after the load, while transactions ran.
    pub mid_run: u32,
    /// Kills that landed before the tables existed (pool refused or empty: nothing to check).
    pub before_setup: u32,
    /// Kills of a child that had reopened a pool an earlier kill left (`CrashTestConfig::rounds`).
    pub restarts: u32,
    /// Transactions acknowledged to the parent over all rounds.
    pub acknowledged: u64,
    /// Violations by kind.
    pub violations: BTreeMap<ViolationKind, u64>,
    /// The first violations.
    pub examples: Vec<String>,
    /// Recovery time (open of the killed pool) in milliseconds.
    pub recovery_ms: Percentiles,
}

impl RealKillReport {
    /// All violations.
    pub fn total_violations(&self) -> u64 {
        self.violations.values().sum()
    }
}

fn child_db_config(test: &CrashTestConfig, path: &Path) -> DbConfig {
    let mut c = test.db_config(test.workload.build().schemas().len());
    c.pool_size = 64 << 20;
    c.path = Some(path.to_path_buf());
    c.background_recovery = true;
    if test.engine == crate::engine::EngineKind::Fir {
        // Real kills land in the background checkpointer too.
        c.fir_checkpoint_interval_ms = Some(20);
    }
    c
}

/// The child's side: creates the pool at `path`, runs the workload (load, then transactions
/// until killed or `txns_per_thread` per thread are done) and prints every oracle event as a JSON
/// line on stdout. With `restart` > 0 it instead reopens (recovers) the pool a killed child left
/// and runs more transactions on it, inserting keys of its own range (epoch `1 + restart`).
pub fn child_main(test: &CrashTestConfig, path: &Path, restart: u64) -> Result<(), CrashTestError> {
    let db = if restart == 0 {
        Db::create(child_db_config(test, path))
            .map_err(|e| CrashTestError::Setup(format!("child: create {}: {e}", path.display())))?
    } else {
        Db::open(child_db_config(test, path))
            .map_err(|e| CrashTestError::Setup(format!("child: reopen {}: {e}", path.display())))?
    };
    let workload = test.workload.build();
    let stdout = std::sync::Mutex::new(std::io::stdout());
    let recorder = Recorder::new(Oracle::new(workload.schemas().len())).with_sink(Box::new(
        move |event: &OracleEvent| {
            let mut line = serde_json::to_string(event).expect("events serialise");
            line.push('\n');
            let out = stdout.lock().unwrap_or_else(|p| p.into_inner());
            let mut out = out.lock();
            // The parent may be gone; nothing to do about it then.
            let _ = out.write_all(line.as_bytes());
            let _ = out.flush();
        },
    ));
    match drive(
        &db,
        &*workload,
        &recorder,
        restart == 0,
        test.threads,
        test.txns_per_thread,
        test.seed,
        if restart == 0 { 0 } else { 1 + restart },
    ) {
        Caught::Done(r) => r.map_err(|e| CrashTestError::Setup(format!("child workload: {e}"))),
        Caught::Crashed => Ok(()),
        Caught::Panicked(m) => Err(CrashTestError::Setup(format!("child panicked: {m}"))),
    }
}

/// How long a kill waits for the child's first event before it counts its delay anyway.
const FIRST_EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `cfg.kills` rounds: spawn, kill, recover, check. With `cfg.test.rounds` = R > 1, R
/// consecutive kills share one pool: after a kill is recovered and checked, the next child
/// reopens that pool and goes on from its recovered state (the liveness transactions run only
/// after the last kill of a pool, since their writes would be unknown to the next oracle).
pub fn run(cfg: &RealKillConfig) -> Result<RealKillReport, CrashTestError> {
    let test = &cfg.test;
    test.check()?;
    if test.workload == WorkloadKind::Tpcc {
        // A kill lands anywhere, the load included, and TPC-C's load is outside its oracle.
        return Err(CrashTestError::Unsupported(
            "real kills run bank and ycsb; tpcc loads outside its crash window, which a kill \
             cannot respect (use the simulator)"
                .into(),
        ));
    }
    let workload = test.workload.build();
    let mut rng = StdRng::seed_from_u64(test.seed);
    let mut report = RealKillReport {
        engine: test.engine,
        domain: test.domain,
        kills: 0,
        mid_run: 0,
        before_setup: 0,
        restarts: 0,
        acknowledged: 0,
        violations: BTreeMap::new(),
        examples: Vec::new(),
        recovery_ms: Percentiles::default(),
    };
    let mut recovery_ms = Vec::new();
    let rounds = test.rounds.max(1) as u32;
    // The state the last kill of the current pool recovered to, when it checked out.
    let mut base: Option<super::workload::Observed> = None;
    let mut restart = 0u64;
    let mut path = PathBuf::new();
    for round in 0..cfg.kills {
        if round % rounds == 0 || base.is_none() {
            let _ = std::fs::remove_file(&path);
            path = cfg.dir.join(format!(
                "crashtest-{}-{}-{round}.pool",
                test.engine,
                std::process::id()
            ));
            let _ = std::fs::remove_file(&path);
            restart = 0;
        } else {
            restart += 1;
        }
        let last_of_pool = (round + 1) % rounds == 0 || round + 1 == cfg.kills;
        let mut child = Command::new(&cfg.pmtx)
            .args(["crashtest", "--engine", test.engine.name()])
            .args(["--domain", test.domain.name()])
            .args(["--workload", test.workload.name()])
            .args(["--cc", test.protocol.name()])
            .args(["--threads", &test.threads.to_string()])
            .args(["--seed", &(test.seed + u64::from(round)).to_string()])
            .args(["--child-txns", "1000000"])
            .args(["--child-restart", &restart.to_string()])
            .args(
                test.window_slot_bytes
                    .map(|b| vec!["--window-slot-bytes".to_string(), b.to_string()])
                    .unwrap_or_default(),
            )
            .args(["--index", test.index.as_str()])
            .args(
                test.fault
                    .map(|f| vec!["--inject-fault".to_string(), f.to_string()])
                    .unwrap_or_default(),
            )
            .arg("--child-pool")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| CrashTestError::Setup(format!("spawn {}: {e}", cfg.pmtx.display())))?;
        let stdout = child.stdout.take().expect("piped");
        let tables = workload.schemas().len();
        let start_oracle = match (&base, restart) {
            (Some(rows), r) if r > 0 => Oracle::from_state(rows),
            _ => Oracle::new(tables),
        };
        base = None;
        let (first_line_tx, first_line) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut oracle = start_oracle;
            // A line cut by the kill does not parse and is ignored: its event never happened
            // as far as the parent knows (conservative: an unacknowledged commit may go either way).
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = first_line_tx.send(());
                if let Ok(event) = serde_json::from_str::<OracleEvent>(&line) {
                    oracle.apply(&event);
                }
            }
            oracle
        });
        let delay = rng.gen_range(cfg.min_delay_ms..cfg.max_delay_ms.max(cfg.min_delay_ms + 1));
        // Most kills count their delay from the child's first event (its run has begun), so that
        // they land mid-run however long the process takes to start and set up on a loaded
        // machine; every fourth counts from the spawn, to crash set-up (pool creation, recovery)
        // too.
        if report.kills % 4 != 3 {
            let _ = first_line.recv_timeout(FIRST_EVENT_TIMEOUT);
        }
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill(); // SIGKILL (it may have finished already)
        let _ = child.wait();
        let oracle = reader.join().expect("reader thread");
        report.kills += 1;
        if restart > 0 {
            report.restarts += 1;
        }
        report.acknowledged += oracle.commits;
        let mut found: Vec<Violation> = Vec::new();
        if !path.exists() {
            report.before_setup += 1;
            continue;
        }
        let started = Instant::now();
        match Db::open(child_db_config(test, &path)) {
            Err(_) if !oracle.tables_created => report.before_setup += 1,
            Err(e) => found.push(Violation::new(
                ViolationKind::Recovery,
                format!("reopening after the kill: {e}"),
            )),
            Ok(db) => {
                recovery_ms.push(started.elapsed().as_secs_f64() * 1e3);
                if oracle.commits > 1 {
                    report.mid_run += 1;
                }
                if !oracle.tables_created {
                    report.before_setup += 1;
                }
                let mut check_cfg = test.clone();
                if !last_of_pool {
                    check_cfg.liveness_txns = 0;
                }
                let (violations, observed) =
                    check_recovered(&check_cfg, &*workload, &db, &oracle, u64::from(round));
                found.extend(violations);
                if oracle.tables_created && !last_of_pool {
                    base = observed;
                }
            }
        }
        if base.is_none() {
            let _ = std::fs::remove_file(&path);
        }
        let mut kinds: Vec<ViolationKind> = found.iter().map(|v| v.kind).collect();
        kinds.sort();
        kinds.dedup();
        for k in kinds {
            *report.violations.entry(k).or_default() += 1;
        }
        for v in found {
            if report.examples.len() < 16 {
                report.examples.push(format!(
                    "round {round}{} (kill after {delay} ms, {} acknowledged): {}: {}",
                    if restart > 0 {
                        format!(", restart {restart} of its pool")
                    } else {
                        String::new()
                    },
                    oracle.commits,
                    v.kind,
                    v.message
                ));
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    report.recovery_ms = Percentiles::of(recovery_ms);
    Ok(report)
}

impl RealKillReport {
    /// A human-readable summary.
    pub fn render(&self) -> String {
        let mut s = format!(
            "real kills {} / {}: {} kills ({} mid-run, {} before setup, {} of a restarted pool), {} transactions acknowledged\n",
            self.engine, self.domain, self.kills, self.mid_run, self.before_setup, self.restarts, self.acknowledged
        );
        s.push_str(&format!(
            "  recovery time: p50 {:.3} ms, max {:.3} ms\n  violations: {}",
            self.recovery_ms.p50,
            self.recovery_ms.max,
            self.total_violations()
        ));
        for (k, n) in &self.violations {
            s.push_str(&format!(", {k} {n}"));
        }
        s.push('\n');
        for e in &self.examples {
            s.push_str(&format!("  - {e}\n"));
        }
        s
    }
}

/// The workload names, for messages.
pub fn workload_names() -> Vec<&'static str> {
    WorkloadKind::ALL.iter().map(|w| w.name()).collect()
}
