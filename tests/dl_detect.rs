//! Liveness of deadlock detection and of the benchmark harness (issue 22, item 3): dl-detect at
//! more threads than cores must detect its deadlocks (including two readers of one tuple that
//! both upgrade, whose cycle runs through reader edges) and keep committing, and a run must end
//! when its duration is over even while a transaction waits on a lock held past that end.

use pmtx::bench::{self, BenchConfig, BenchResult, TxnDriver};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::EngineKind;
use pmtx::workload::bank::{self, BankDriver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn bank_db(engine: EngineKind, accounts: u64) -> (Db, u32) {
    let mut config = DbConfig::temporary()
        .engine(engine)
        .protocol(Protocol::DlDetect)
        .pool_size(64 << 20)
        .max_threads(8);
    // As `pmtx bench` does: a transaction retries until it commits.
    config.max_retries = 1_000_000;
    let db = Db::create(config).unwrap();
    let table = bank::load(&db, accounts).unwrap();
    (db, table)
}

/// Runs `threads` bank drivers for `duration`; panics if the run does not return within `limit`.
fn run_bank(
    db: &Db,
    table: u32,
    accounts: u64,
    threads: usize,
    duration: Duration,
    limit: Duration,
) -> BenchResult {
    let config = BenchConfig {
        threads,
        warmup: Duration::ZERO,
        duration,
        txn_kinds: vec!["transfer".into()],
    };
    let (done, finished) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            let result = bench::run(&config, |thread| {
                BankDriver::new(db, table, accounts, 7 + thread as u64)
                    .map(|d| Box::new(d) as Box<dyn TxnDriver>)
            });
            let _ = done.send(result);
        });
        match finished.recv_timeout(limit) {
            Ok(result) => result.unwrap(),
            // The scope would wait for the stuck run forever: end the test process instead.
            Err(_) => {
                eprintln!("a {duration:?} run is still going after {limit:?}");
                std::process::exit(1)
            }
        }
    })
}

#[test]
fn dl_detect_bank_at_eight_threads_commits_and_ends_in_time() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        let accounts = 64;
        let (db, table) = bank_db(engine, accounts);
        let started = Instant::now();
        let result = run_bank(
            &db,
            table,
            accounts,
            8,
            Duration::from_millis(800),
            Duration::from_secs(60),
        );
        let took = started.elapsed();
        // Before the fix, readers upgrading one hot account waited out time-outs in lockstep and
        // the run never ended (5 threads on 2 cores already hung; 4 managed ~4 k tx/s).
        assert!(
            result.committed > 500,
            "{engine:?}: {} committed",
            result.committed
        );
        assert!(took < Duration::from_secs(20), "{engine:?}: took {took:?}");
        bank::check(&db, accounts).unwrap();
    }
}

#[test]
fn a_run_ends_while_a_transaction_waits_on_a_lock_held_past_its_end() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        // Two accounts: every transfer writes account 0, which the holder keeps locked.
        let (db, table) = bank_db(engine, 2);
        let release = AtomicBool::new(false);
        let held = AtomicBool::new(false);
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                db.run(|tx| {
                    tx.update(table, 0, &[(1, Value::U64(1))])?;
                    held.store(true, Ordering::Release);
                    // Holds the write lock until the run is over (or, without the fix, for long
                    // enough that the run's overrun shows).
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while !release.load(Ordering::Acquire) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Ok(())
                })
                .unwrap();
            });
            while !held.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let result = run_bank(
                &db,
                table,
                2,
                2,
                Duration::from_millis(300),
                Duration::from_secs(60),
            );
            let took = started.elapsed();
            release.store(true, Ordering::Release);
            assert_eq!(result.committed, 0, "{engine:?}: account 0 was locked");
            assert!(
                took < Duration::from_secs(10),
                "{engine:?}: the run took {took:?}"
            );
        });
        bank::check(&db, 2).unwrap();
    }
}
