//! `pmtx crashtest`: crash a workload at PM events under the simulator (or SIGKILL real child
//! processes), recover every crash image and check it; exit status 1 on any violation.

use super::CliResult;
use crate::cc::Protocol;
use crate::crashtest::realkill::{self, RealKillConfig};
use crate::crashtest::workload::WorkloadKind;
use crate::crashtest::{self, CrashTestConfig, InjectedFault};
use crate::engine::EngineKind;
use crate::pmem::PersistenceDomain;
use std::path::PathBuf;

/// Arguments of `pmtx crashtest`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The engine: a table engine, or archtm or dudetx-ptm (the persistent-object API's crash
    /// workload, see `crashtest::ptm`; one thread, --txns steps, every PM event with
    /// --exhaustive, else --images crash points spread over the run).
    #[arg(long, default_value = "falcon")]
    pub engine: CrashEngine,
    /// The persistence domain simulated (adr or eadr).
    #[arg(long, default_value = "adr")]
    pub domain: PersistenceDomain,
    /// The workload: bank, ycsb, tpcc (a tiny TPC-C loaded before the crash window), grow
    /// (4000-byte rows until the heap needs more than one page per thread) or ycsb-ordered
    /// (ycsb under an ordered primary index, insert-heavy: with `--index pm`, PM leaf splits),
    /// secondary (rows moved between the keys of a secondary index: with `--index pm`, the PM
    /// secondary index's steps) or bytekeys (a table with byte-string keys: index node splits
    /// and removals).
    #[arg(long, default_value = "bank")]
    pub workload: WorkloadKind,
    /// The concurrency-control protocol (default: the engine's, occ; mvto for fir).
    #[arg(long)]
    pub cc: Option<Protocol>,
    /// Crash images to recover and check (sampled crash points).
    #[arg(long, default_value_t = 2000)]
    pub images: u64,
    /// Seed of crash points, images and workload (a failure prints the seed and event to rerun).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads running the workload (crash points are global events).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Transactions per thread in each run.
    #[arg(long, default_value_t = 24)]
    pub txns: usize,
    /// Crash before every PM event of the run instead of sampled events.
    #[arg(long)]
    pub exhaustive: bool,
    /// Crash only before this PM event (reproduces a reported violation).
    #[arg(long)]
    pub event: Option<u64>,
    /// Images drawn per crash point (under eADR only pending non-temporal stores give a point
    /// more than one).
    #[arg(long, default_value_t = 4)]
    pub images_per_point: usize,
    /// Crash the recovery itself every N images (0: never).
    #[arg(long, default_value_t = 16)]
    pub recovery_crash_every: u64,
    /// Crashes per chain: crash, recover, run --txns more transactions on the recovered pool,
    /// crash again, N times (1: every crash point starts from a new pool). With --real-kills:
    /// consecutive kills of children on one pool.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Falcon's window slot size in bytes (at least 256): a small slot makes transactions spill
    /// their redo to spill pages, so the spill path is crash-tested.
    #[arg(long)]
    pub window_slot_bytes: Option<usize>,
    /// Where the tables' primary indexes live: `dram`, or `pm` (Falcon's persistent indexes,
    /// recovered without a heap scan; falcon, falcon-allflush, falcon-noflush and inp only).
    #[arg(long, default_value = "dram")]
    pub index: crate::index::IndexPlacement,
    /// DUDETx: `sync` (commits return once durable) or `async` (commits return at once; the
    /// check is that everything up to the durable id reported survives).
    #[arg(long, default_value = "sync")]
    pub dudetx_mode: crate::engine::dudetx::DurabilityMode,
    /// DUDETx's persistent-object API (`--engine dudetx-ptm`): the perform mode, `stm` or the
    /// lock-based `locks` / `locks-two-round` (§5: the workload's steps take turns on two
    /// workers, so their chains depend on each other).
    #[arg(long, default_value = "stm")]
    pub dudetx_perform: crate::engine::dudetx::ptm::PerformMode,
    /// Instead of the simulator: SIGKILL this many child `pmtx` processes mid-workload.
    #[arg(long)]
    pub real_kills: Option<u32>,
    /// Write the summary as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Turn on one deliberate engine bug (test-only; see --list-faults; it must be one of the
    /// engine's own faults).
    #[arg(long)]
    pub inject_fault: Option<String>,
    /// List the injectable faults (with the engines each applies to) and exit.
    #[arg(long)]
    pub list_faults: bool,
    /// Internal: run as the child of a real-kill round on this pool.
    #[arg(long, hide = true)]
    pub child_pool: Option<PathBuf>,
    /// Internal: a real-kill child reopens the pool a killed child left (restart number N > 0).
    #[arg(long, hide = true, default_value_t = 0)]
    pub child_restart: u64,
    /// Internal: transactions per thread of a real-kill child.
    #[arg(long, hide = true, default_value_t = 1_000_000)]
    pub child_txns: usize,
}

/// The engine a crash test drives.
#[derive(Clone, Copy, Debug)]
pub enum CrashEngine {
    /// A table engine (the `Db` API).
    Table(EngineKind),
    /// A persistent-object engine (the `ptm` API).
    Ptm(crate::ptm::PtmEngineKind),
}

impl std::str::FromStr for CrashEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        // `dudetx` names the table engine; its persistent-object API is `dudetx-ptm`.
        if let Ok(k) = s.parse::<EngineKind>() {
            return Ok(CrashEngine::Table(k));
        }
        if s == "dudetx-ptm" {
            return Ok(CrashEngine::Ptm(crate::ptm::PtmEngineKind::Dudetx));
        }
        s.parse::<crate::ptm::PtmEngineKind>()
            .map(CrashEngine::Ptm)
            .map_err(|e| {
                format!("{e} (or a table engine; dudetx-ptm: DUDETx's persistent-object API)")
            })
    }
}

pub(crate) fn run(args: Args) -> CliResult {
    if args.list_faults {
        outln!("{:<24} {:<42} WHAT IT BREAKS", "FAULT", "ENGINES");
        for f in InjectedFault::all() {
            let engines: Vec<&str> = f.engines().iter().map(|e| e.name()).collect();
            outln!(
                "{:<24} {:<42} {}",
                f.name(),
                engines.join(","),
                f.describe()
            );
        }
        for f in crate::ptm::archtm::ArchtmFault::ALL {
            outln!("{:<24} {:<42} {}", f.name(), "archtm", f.describe());
        }
        // The pipeline's faults are listed above for the table engine; the persistent-object
        // API takes them too, under `--engine dudetx-ptm`.
        for f in crate::engine::dudetx::ptm::DudetxPtmFault::ALL {
            if !matches!(f, crate::engine::dudetx::ptm::DudetxPtmFault::Pipeline(_)) {
                outln!("{:<24} {:<42} {}", f.name(), "dudetx-ptm", f.describe());
            }
        }
        return Ok(());
    }
    check_counts(&args)?;
    let engine = match args.engine {
        CrashEngine::Ptm(k) => return run_ptm(&args, k),
        CrashEngine::Table(e) => e,
    };
    let inject_fault: Option<InjectedFault> =
        args.inject_fault.as_deref().map(str::parse).transpose()?;
    if let Some(path) = &args.json {
        super::bench::check_output_path(path, "--json")?;
    }
    let mut cfg = CrashTestConfig::new(engine, args.domain, args.workload);
    cfg.protocol = args.cc.unwrap_or(engine.default_protocol());
    cfg.images = args.images;
    cfg.seed = args.seed;
    cfg.threads = args.threads;
    cfg.txns_per_thread = args.txns;
    cfg.exhaustive = args.exhaustive;
    cfg.event = args.event;
    cfg.images_per_point = args.images_per_point;
    cfg.recovery_crash_every = args.recovery_crash_every;
    cfg.fault = inject_fault;
    cfg.rounds = args.rounds;
    cfg.window_slot_bytes = args.window_slot_bytes;
    cfg.index = args.index;
    cfg.dudetx_mode = args.dudetx_mode;
    if let Some(path) = args.child_pool {
        cfg.txns_per_thread = args.child_txns;
        realkill::child_main(&cfg, &path, args.child_restart)?;
        return Ok(());
    }
    if let Some(kills) = args.real_kills {
        let dir = tempfile_dir()?;
        crate::pmem::scratch::register(&dir);
        let report = realkill::run(&RealKillConfig {
            test: cfg,
            kills,
            pmtx: std::env::current_exe()?,
            dir: dir.clone(),
            min_delay_ms: 30,
            max_delay_ms: 600,
        });
        let _ = std::fs::remove_dir_all(&dir);
        crate::pmem::scratch::unregister(&dir);
        let report = report?;
        out!("{}", report.render());
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report)?)
                .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
        }
        if report.total_violations() > 0 {
            return Err(format!(
                "{} violation(s) after real kills",
                report.total_violations()
            )
            .into());
        }
        return Ok(());
    }
    let report = crashtest::run_with_progress(&cfg, &mut progress_display(&cfg))?;
    out!("{}", report.render());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
    }
    if report.total_violations() > 0 {
        return Err(format!(
            "{} violation(s) in {} images",
            report.total_violations(),
            report.images
        )
        .into());
    }
    Ok(())
}

/// `pmtx crashtest --engine archtm`: the persistent-object crash workload (`crashtest::ptm`).
fn run_ptm(args: &Args, kind: crate::ptm::PtmEngineKind) -> CliResult {
    use crate::crashtest::ptm::{sweep, PtmCrashConfig};
    use crate::ptm::archtm::ArchtmFault;
    if args.threads != 1 || args.real_kills.is_some() || args.rounds != 1 {
        return Err(
            "persistent-object (archtm, dudetx-ptm) crash tests run one thread, under the \
             simulator, one round (--threads 1, no --real-kills, --rounds 1)"
                .into(),
        );
    }
    if !matches!(
        args.domain,
        PersistenceDomain::Adr | PersistenceDomain::Eadr
    ) {
        return Err(format!(
            "--domain {}: the simulator models adr and eadr",
            args.domain
        )
        .into());
    }
    if let Some(path) = &args.json {
        super::bench::check_output_path(path, "--json")?;
    }
    let mut cfg = PtmCrashConfig::new(args.domain);
    if kind == crate::ptm::PtmEngineKind::Dudetx {
        let fault = args
            .inject_fault
            .as_deref()
            .map(str::parse::<crate::engine::dudetx::ptm::DudetxPtmFault>)
            .transpose()?;
        let lock_mode = matches!(
            args.dudetx_perform,
            crate::engine::dudetx::ptm::PerformMode::Locks(_)
        );
        if fault.is_some_and(|f| f.lock_mode()) && !lock_mode {
            return Err(
                "that fault is in a step of the lock-based perform mode (§5): add \
                 --dudetx-perform locks (or locks-two-round)"
                    .into(),
            );
        }
        if fault.is_some_and(|f| f.adr_only()) && args.domain == PersistenceDomain::Eadr {
            return Err(
                "that fault removes a write-back, which eadr does not need: test it under adr"
                    .into(),
            );
        }
        cfg = PtmCrashConfig::dudetx(args.domain, args.dudetx_mode, fault);
        crate::engine::dudetx::ptm::resolve_perform(args.dudetx_perform)
            .map_err(|e| e.to_string())?;
        cfg.dudetx_perform = args.dudetx_perform;
    } else {
        cfg.fault = args
            .inject_fault
            .as_deref()
            .map(str::parse::<ArchtmFault>)
            .transpose()?;
    }
    if let Some(f) = cfg.fault {
        if f.adr_only() && args.domain == PersistenceDomain::Eadr {
            return Err(format!(
                "fault {f} removes a flush or fence of ordinary stores, which eadr does not need: \
                 it cannot break archtm under eadr; test it under adr"
            )
            .into());
        }
    }
    cfg.steps = args.txns as u64;
    cfg.event = args.event;
    cfg.images_per_point = args.images_per_point;
    cfg.stop_at_first = false;
    if !args.exhaustive && args.event.is_none() {
        cfg.points = Some(args.images.max(1));
    }
    let report = sweep(&cfg)?;
    outln!(
        "{} crash test ({}{}): {} crash points over {} PM events (defragmentation moved {} objects), {} images checked, {} violation(s)",
        kind.name(),
        args.domain,
        args.inject_fault
            .as_deref()
            .map_or(String::new(), |f| format!(", fault {f}")),
        report.points,
        report.events,
        report.defrag_moved,
        report.images,
        report.violations.len()
    );
    for v in report.violations.iter().take(10) {
        outln!("  {v}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
    }
    if !report.violations.is_empty() {
        return Err(format!(
            "{} violation(s) in {} images",
            report.violations.len(),
            report.images
        )
        .into());
    }
    Ok(())
}

/// Progress of a crash test on stderr: a bar on a terminal; otherwise (a script, a log file) a
/// line every [`PROGRESS_EVERY`] once a run takes longer than that. Short runs print nothing.
fn progress_display(cfg: &CrashTestConfig) -> impl FnMut(&crashtest::CrashTestReport) {
    use std::io::IsTerminal;
    let total = if cfg.exhaustive || cfg.event.is_some() {
        None
    } else {
        Some(cfg.images)
    };
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = crate::bench::loading_bar(total.unwrap_or(0), "crash images");
        if total.is_none() {
            bar.set_length(0);
        }
        bar
    });
    let mut last_line = std::time::Instant::now();
    move |r: &crashtest::CrashTestReport| {
        let done = r.images + r.restart_images;
        let violations: u64 = r.violations.values().sum();
        if let Some(bar) = &bar {
            bar.set_position(r.images.min(total.unwrap_or(u64::MAX)));
            bar.set_message(format!("crash images ({violations} with violations)"));
            if total.is_some_and(|t| r.images >= t) {
                bar.finish_and_clear();
            }
        } else if last_line.elapsed() >= PROGRESS_EVERY {
            last_line = std::time::Instant::now();
            let rate = done as f64 / r.elapsed_s.max(1e-9);
            let eta = total
                .filter(|&t| t > r.images && rate > 0.0)
                .map(|t| format!(", eta {:.0} s", (t - r.images) as f64 / rate))
                .unwrap_or_default();
            eprintln!(
                "crashtest: {done} images ({} crash points) in {:.0} s, {rate:.0} images/s, \
                 {violations} with violations{eta}",
                r.crash_points, r.elapsed_s
            );
        }
    }
}

/// Interval between progress lines when stderr is not a terminal.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Refuses counts that would test nothing (and exit 0 as if all were well).
fn check_counts(args: &Args) -> CliResult {
    if args.real_kills == Some(0) {
        return Err("--real-kills must be at least 1".into());
    }
    if args.images == 0 && args.event.is_none() && !args.exhaustive {
        return Err("--images must be at least 1".into());
    }
    if args.images_per_point == 0 {
        return Err("--images-per-point must be at least 1".into());
    }
    if args.txns == 0 {
        return Err("--txns must be at least 1".into());
    }
    Ok(())
}

/// A fresh directory for real-kill pools, under /dev/shm when it exists.
fn tempfile_dir() -> std::io::Result<PathBuf> {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("pmtx-crashtest-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
