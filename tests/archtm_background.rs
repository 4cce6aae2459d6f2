//! ArchTM's background threads (§4.4, §4.5, §5.4: the GC thread and the fragmentation manager)
//! and real kills of processes running PTM transactions (ArchTM and DUDETx): the threads do the
//! work the inline mode does, stop on drop, survive simulated power failures during their
//! work, and a SIGKILLed process's pool recovers to the state after its last acknowledged
//! transaction (or the one in flight) with the allocator's invariants intact.

use pmtx::crashtest::ptm::{setup, state_of, step, sweep, Lcg, PtmCrashConfig, Root, State};
use pmtx::pmem::PersistenceDomain;
use pmtx::ptm::{PPtr, Ptm, PtmConfig, PtmEngineKind};
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::eventually;
use common::ptm_model::stat;

/// The tests of this file count the process's threads: one at a time.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end().starts_with(prefix))
        .count()
}

#[test]
fn the_gc_thread_collects_for_the_committers_and_stops_on_drop() {
    let _s = SERIAL.lock();
    let mut c = PtmConfig::temporary().size(16 << 20);
    c.gc_threshold = 8;
    c.gc_interval = Some(Duration::from_secs(3600)); // woken by the threshold only
    c.defrag_interval = None;
    let ptm = Ptm::<Root>::create(c).unwrap();
    // A thread names itself once it runs.
    eventually("the GC thread's start", || threads_named("archtm-gc") == 1);
    assert_eq!(threads_named("archtm-defrag"), 0);
    assert_eq!(stat(&ptm, "gc_thread"), 1);
    let h: PPtr<u64> = ptm.run(|tx| tx.alloc(&0)).unwrap();
    for i in 1..=200u64 {
        ptm.run(|tx| tx.write(h, &i)).unwrap();
    }
    // 200 replaced versions passed the threshold many times: the thread collected them,
    // without any commit doing it (the period is an hour).
    eventually("the GC thread", || stat(&ptm, "gc_runs") > 0);
    eventually("the recycled bytes", || {
        stat(&ptm, "recycled_bytes") >= 150 * 64
    });
    assert_eq!(ptm.run(|tx| tx.read(h)).unwrap(), 200);
    ptm.check_invariants().unwrap();
    drop(ptm);
    assert_eq!(threads_named("archtm-"), 0, "the threads stop on drop");
}

#[test]
fn inline_mode_starts_no_thread_and_collects_on_commit() {
    let _s = SERIAL.lock();
    let mut c = PtmConfig::temporary().size(16 << 20).inline_background();
    c.gc_threshold = 8;
    let ptm = Ptm::<Root>::create(c).unwrap();
    assert_eq!(threads_named("archtm-"), 0);
    let h: PPtr<u64> = ptm.run(|tx| tx.alloc(&0)).unwrap();
    for i in 1..=20u64 {
        ptm.run(|tx| tx.write(h, &i)).unwrap();
    }
    assert!(stat(&ptm, "gc_runs") >= 2, "the commits collected");
    assert_eq!(stat(&ptm, "gc_thread"), 0);
    ptm.check_invariants().unwrap();
}

#[test]
fn the_defragmentation_thread_empties_underused_regions() {
    let _s = SERIAL.lock();
    let mut c = PtmConfig::temporary().size(16 << 20);
    c.defrag_interval = Some(Duration::from_millis(2));
    c.defrag_eager = true;
    let ptm = Ptm::<Root>::create(c).unwrap();
    eventually("the defragmentation thread's start", || {
        threads_named("archtm-defrag") == 1
    });
    let handles: Vec<PPtr<u64>> = ptm
        .run(|tx| (0..2048u64).map(|i| tx.alloc(&i)).collect())
        .unwrap();
    let before = stat(&ptm, "used_regions_4k");
    // Free three of every four: every region a quarter used, in one transaction so the
    // thread sees the result whole.
    ptm.run(|tx| {
        for (i, &h) in handles.iter().enumerate() {
            if i % 4 != 0 {
                tx.free(h)?;
            }
        }
        Ok(())
    })
    .unwrap();
    eventually("the defragmentation thread", || {
        stat(&ptm, "defrag_moved") >= 500 && stat(&ptm, "used_regions_4k") * 2 < before
    });
    for (i, &h) in handles.iter().enumerate().step_by(4) {
        assert_eq!(ptm.run(|tx| tx.read(h)).unwrap(), i as u64, "moved intact");
    }
    ptm.check_invariants().unwrap();
    drop(ptm);
    assert_eq!(threads_named("archtm-"), 0);
}

/// Runs `f` on a thread of its own and fails with a message if it has not finished within
/// `limit` (a thread spinning on a peer that is gone would otherwise hang the test binary).
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("watched".into())
        .spawn(move || {
            // A panic drops `tx` unsent: reported below as a failure, not a timeout.
            let _ = tx.send(f());
        })
        .unwrap();
    match rx.recv_timeout(limit) {
        Ok(v) => {
            worker.join().unwrap();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => panic!("{what}: the watched thread ended without a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
            "{what} did not finish within {} s: a thread is probably waiting on a peer that \
             crashed (a wait or retry loop that does not check for the simulated crash)",
            limit.as_secs()
        ),
    }
}

/// Power failures while the threads work (the crash simulator, ADR and eADR): random crash
/// points (the threads make every run's PM events differ, so this samples rather than sweeps;
/// the inline mode is swept exhaustively by `ptm_api`), each image recovered to an
/// acknowledged state with the allocator's invariants and no leak. Under a watchdog: a hang
/// fails the test with a message.
#[test]
fn power_failures_during_background_gc_and_defragmentation_recover() {
    let _s = SERIAL.lock();
    within(
        Duration::from_secs(300),
        "the background crash sweep",
        background_crash_sweep,
    );
}

fn background_crash_sweep() {
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        let mut cfg = PtmCrashConfig::new(domain);
        cfg.background = true;
        cfg.steps = 60;
        cfg.points = Some(60);
        cfg.images_per_point = 1;
        let r = sweep(&cfg).unwrap();
        assert!(r.violations.is_empty(), "{domain}: {:?}", r.violations);
        assert!(r.images >= 30, "{domain}: only {} images", r.images);
        // Counted from the threads alone (the workload's own defragment calls and inline
        // collections would meet any bar without them); how many depends on the scheduler.
        let (gcs, passes) = r.background_work;
        assert!(
            gcs >= 1 && passes >= 1,
            "{domain}: the threads ran {gcs} collections and {passes} defragmentation passes"
        );
    }
}

const CHILD_POOL: &str = "PMTX_PTM_KILL_POOL";
const CHILD_ENGINE: &str = "PMTX_PTM_KILL_ENGINE";

fn kill_config(path: &std::path::Path, engine: PtmEngineKind) -> PtmConfig {
    let mut c = PtmConfig::temporary()
        .size(16 << 20)
        .path(path)
        .domain(PersistenceDomain::Eadr)
        .engine(engine)
        .max_threads(3);
    c.gc_threshold = 4;
    c.gc_interval = Some(Duration::from_millis(1));
    c.defrag_interval = Some(Duration::from_millis(5));
    c.defrag_eager = true;
    c
}

/// The child of the kill test (runs only when the parent sets `PMTX_PTM_KILL_POOL`): creates
/// the pool, sets up the accounts, then runs the crash workload's steps (transfers, pushes,
/// pops, replacements, aborts, defragmentation, checkpoints) with the background threads on,
/// printing each acknowledged step's number, until killed.
#[test]
#[ignore]
fn kill_child() {
    let Ok(path) = std::env::var(CHILD_POOL) else {
        return;
    };
    let engine: PtmEngineKind = std::env::var(CHILD_ENGINE).unwrap().parse().unwrap();
    let ptm = Ptm::<Root>::create(kill_config(path.as_ref(), engine)).unwrap();
    setup(&ptm).unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    let mut rng = Lcg(11);
    for i in 0.. {
        step(&ptm, i, &mut rng, &mut 0).unwrap();
        writeln!(out, "{i}").unwrap();
        out.flush().unwrap();
    }
}

/// The states after 0..=n steps of the child's workload (a reference run in memory).
fn reference(n: usize) -> Vec<State> {
    let ptm =
        Ptm::<Root>::create(PtmConfig::temporary().size(16 << 20).inline_background()).unwrap();
    setup(&ptm).unwrap();
    let mut rng = Lcg(11);
    let mut states = vec![state_of(&ptm).unwrap().0];
    for i in 0..n as u64 {
        step(&ptm, i, &mut rng, &mut 0).unwrap();
        states.push(state_of(&ptm).unwrap().0);
    }
    states
}

fn kill_and_recover(engine: PtmEngineKind, kills: u64) {
    let dir = common::pool_dir();
    let mut mid_run = 0;
    for round in 0..kills {
        let path = dir.path().join(format!("ptm-{round}.pool"));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "kill_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_POOL, &path)
            .env(CHILD_ENGINE, engine.name())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let reader = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
        // Random moments: 30..330 ms after the start (debug build: the setup takes some).
        let delay = 30 + (round * 7919 + 13) % 300;
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().unwrap();
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        // The test harness prints "test kill_child ... " before the child's first line.
        let Some(ready) = lines.iter().position(|l| l.ends_with("ready")) else {
            continue; // killed before the setup finished: nothing acknowledged
        };
        let acked = lines.len() - ready - 1;
        for (k, l) in lines[ready + 1..].iter().enumerate() {
            assert_eq!(l, &k.to_string(), "the child's acknowledgements");
        }
        let ptm = Ptm::<Root>::open(kill_config(&path, engine))
            .unwrap_or_else(|e| panic!("{engine:?} round {round}: recovery failed: {e}"));
        let (s, reachable) = state_of(&ptm).unwrap();
        let states = reference(acked + 1);
        assert!(
            s == states[acked] || s == states[acked + 1],
            "{engine:?} round {round}: recovered {s:?} after {acked} acknowledged steps, \
             expected {:?} or {:?}",
            states[acked],
            states[acked + 1]
        );
        assert_eq!(
            s.accounts.iter().sum::<u64>(),
            800,
            "transfers keep the total"
        );
        ptm.check_invariants()
            .unwrap_or_else(|e| panic!("{engine:?} round {round}: {e}"));
        if engine == PtmEngineKind::Archtm {
            assert_eq!(
                stat(&ptm, "live_objects") as usize,
                reachable,
                "leaked objects"
            );
        }
        // The recovered pool keeps working.
        let mut rng = Lcg(round);
        for i in 0..20 {
            step(&ptm, i, &mut rng, &mut 0).unwrap();
        }
        ptm.check_invariants().unwrap();
        if acked > 0 {
            mid_run += 1;
        }
    }
    assert!(
        mid_run * 2 >= kills,
        "only {mid_run} of {kills} kills landed while transactions ran"
    );
}

#[test]
fn sigkilled_archtm_processes_recover_with_sound_allocators() {
    let _s = SERIAL.lock();
    kill_and_recover(PtmEngineKind::Archtm, 6);
}

#[test]
fn sigkilled_dudetx_processes_recover() {
    let _s = SERIAL.lock();
    kill_and_recover(PtmEngineKind::Dudetx, 4);
}
