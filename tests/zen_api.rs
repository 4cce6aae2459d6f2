//! The public API on the Zen engine beyond what `db_api.rs` runs on every engine: a Met-Cache
//! far smaller than the data (evictions, reloads, cross-region copies under contention), deletes
//! and re-inserts across clean reopens (tombstones), the knapsack split, and refused configs.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::zen::{split_budget, TableDemand};
use pmtx::engine::{DbError, EngineKind};
use pmtx::pmem::PersistenceDomain;
use pmtx::workload::bank;
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;

fn config(protocol: Protocol, domain: PersistenceDomain) -> DbConfig {
    let mut c = DbConfig::temporary()
        .engine(EngineKind::Zen)
        .protocol(protocol)
        .domain(domain)
        .pool_size(64 << 20)
        .max_threads(4);
    c.cache_bytes = Some(64 * 1024);
    c.cache_min_entries = 8;
    c
}

#[test]
fn transfers_through_a_tiny_cache_keep_the_total_under_every_protocol() {
    for protocol in pmtx::engine::zen::SUPPORTED_PROTOCOLS {
        tiny_cache_transfers(EngineKind::Zen, protocol);
    }
}

/// The SI lost update of issue 19 (item 1) and issue 22 (item 4): a snapshot reader that found a
/// tuple write-locked took "no retired version in the chain" for "the writer has not retired it
/// yet", when the writer had in fact finished and the version (replaced at or below the snapshot)
/// had been pruned; it returned the overwritten balance, and first-committer-wins let the
/// transfer overwrite the new one. This is `pmtx bench bank --cc si --accounts 8 --threads 2`,
/// bounded, on both engines with fixed seeds. The race needs a prune to land in a window of a
/// few instructions, so this test catches it only sometimes (the release CLI lost a transfer in
/// most 1-second runs; this debug-build test passed the unfixed code in the one run tried): the
/// deterministic regression test is the loom model `snapshot_reads_never_miss_a_committed_write`
/// in `tests/cc_model.rs`, which finds the lost read without the fix.
#[test]
fn si_transfers_keep_the_total() {
    const SI_ROUNDS: u64 = 4;
    const SI_TRANSFERS: u64 = 20_000;
    const ACCOUNTS: u64 = 8;
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        for round in 0..SI_ROUNDS {
            let db =
                Db::create(config(Protocol::Si, PersistenceDomain::Eadr).engine(engine)).unwrap();
            let table = bank::load(&db, ACCOUNTS).unwrap();
            std::thread::scope(|s| {
                for thread in 0..2u64 {
                    let db = &db;
                    s.spawn(move || {
                        let mut w = db.worker().unwrap();
                        let mut rng = StdRng::seed_from_u64(round << 8 | thread);
                        for _ in 0..SI_TRANSFERS {
                            bank::transfer(&mut w, table, ACCOUNTS, &mut rng).unwrap();
                        }
                    });
                }
            });
            if let Err(e) = bank::check(&db, ACCOUNTS) {
                panic!("{engine} si, round {round}: {e}");
            }
        }
    }
}

/// Three threads of transfers over 2,000 accounts (half of them among 8 hot ones) through a
/// Met-Cache far smaller than the table; the total must hold.
fn tiny_cache_transfers(engine: EngineKind, protocol: Protocol) {
    {
        let db = Db::create(config(protocol, PersistenceDomain::Adr).engine(engine)).unwrap();
        let t = db
            .create_table(Schema::new(
                "acct",
                &[
                    ("balance", ColumnType::I64),
                    ("pad", ColumnType::Bytes(200)),
                ],
            ))
            .unwrap();
        const N: u64 = 2000;
        db.run(|tx| {
            (0..N).try_for_each(|k| tx.insert(t, k, &[Value::I64(1000), Value::Bytes(b"x")]))
        })
        .unwrap();
        std::thread::scope(|s| {
            for seed in 0..3u64 {
                let db = &db;
                s.spawn(move || {
                    let mut w = db.worker().unwrap();
                    let mut x = seed + 1;
                    for i in 0..1500u64 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        // Half the transfers hit 8 hot accounts, so entries of other regions are
                        // copied and contended; the rest spread over all (misses, evictions).
                        let range = if i % 2 == 0 { 8 } else { N };
                        let (a, b) = ((x >> 33) % range, (x >> 45) % range);
                        if a == b {
                            continue;
                        }
                        w.run(|tx| {
                            let ba = tx.get(t, a)?.i64(0);
                            let bb = tx.get(t, b)?.i64(0);
                            tx.update(t, a, &[(0, Value::I64(ba - 7))])?;
                            tx.update(t, b, &[(0, Value::I64(bb + 7))])
                        })
                        .unwrap();
                    }
                });
            }
        });
        let total: i64 = db
            .run(|tx| (0..N).map(|k| Ok(tx.get(t, k)?.i64(0))).sum())
            .unwrap();
        assert_eq!(total, 1000 * N as i64, "{engine} {protocol}");
        assert_eq!(
            db.check_structure().unwrap(),
            vec![N],
            "{engine} {protocol}"
        );
    }
}

#[test]
fn deleted_rows_stay_deleted_across_reopens_and_slots_are_reused() {
    let dir = common::pool_dir();
    let path = dir.path().join("zen.pool");
    let cfg = config(Protocol::Occ, PersistenceDomain::Adr).path(&path);
    let t;
    {
        let db = Db::create(cfg.clone()).unwrap();
        t = db
            .create_table(Schema::new("kv", &[("v", ColumnType::U64)]).ordered())
            .unwrap();
        for round in 0..20u64 {
            db.run(|tx| (0..100u64).try_for_each(|k| tx.insert(t, k, &[Value::U64(round)])))
                .unwrap();
            db.run(|tx| {
                (0..100u64)
                    .filter(|k| k % 10 != 0)
                    .try_for_each(|k| tx.delete(t, k))
            })
            .unwrap();
            db.run(|tx| {
                (0..100u64)
                    .filter(|k| k % 10 == 0)
                    .try_for_each(|k| tx.delete(t, k))
            })
            .unwrap();
        }
        db.run(|tx| (0..50u64).try_for_each(|k| tx.insert(t, k, &[Value::U64(99)])))
            .unwrap();
        db.run(|tx| (0..50u64).step_by(2).try_for_each(|k| tx.delete(t, k)))
            .unwrap();
    }
    for _ in 0..2 {
        let db = Db::open(cfg.clone()).unwrap();
        let report = db.recovery_report().unwrap();
        assert!(report.phases.iter().any(|(p, _)| p.contains("Algorithm 2")));
        let rows = db.run(|tx| tx.scan(t, 0, usize::MAX)).unwrap();
        let keys: Vec<u64> = rows.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, (1..50).step_by(2).collect::<Vec<u64>>());
        assert!(rows.iter().all(|(_, r)| r.u64(0) == 99));
        assert_eq!(db.check_structure().unwrap(), vec![25]);
        // Churn after recovery: garbage and tombstones found by recovery get reclaimed and
        // reused, so space stays bounded.
        for round in 0..30u64 {
            db.run(|tx| (100..160u64).try_for_each(|k| tx.insert(t, k, &[Value::U64(round)])))
                .unwrap();
            db.run(|tx| (100..160u64).try_for_each(|k| tx.delete(t, k)))
                .unwrap();
        }
        let pool = db.engine().pool().unwrap().clone();
        let pages = pmtx::alloc::PageManager::open(&pool).unwrap().usage(&pool);
        assert!(
            pages.pages_used <= 4,
            "churn of 60 rows should fit in a few pages, not {pages:?}"
        );
    }
}

#[test]
fn the_cache_split_follows_size_and_access_frequency() {
    let db = Db::create(config(Protocol::Occ, PersistenceDomain::Eadr)).unwrap();
    let big = db
        .create_table(Schema::new("big", &[("v", ColumnType::Bytes(200))]))
        .unwrap();
    let small = db
        .create_table(Schema::new("small", &[("v", ColumnType::Bytes(200))]))
        .unwrap();
    db.run(|tx| (0..3000u64).try_for_each(|k| tx.insert(big, k, &[Value::Bytes(b"b")])))
        .unwrap();
    db.run(|tx| (0..100u64).try_for_each(|k| tx.insert(small, k, &[Value::Bytes(b"s")])))
        .unwrap();
    let mut w = db.worker().unwrap();
    for i in 0..600u64 {
        w.run(|tx| {
            tx.get(big, i % 3000)?;
            tx.get(small, i % 100)
        })
        .unwrap();
    }
    drop(w);
    let demands = [
        TableDemand {
            entry_bytes: 264,
            nvm_bytes: 3000 * 224,
            rows: 3000,
            accesses_per_txn: 1.0,
        },
        TableDemand {
            entry_bytes: 264,
            nvm_bytes: 100 * 224,
            rows: 100,
            accesses_per_txn: 1.0,
        },
    ];
    let split = split_budget(64 * 1024, &demands, 8);
    assert_eq!(split[1], 100, "the small, dense table is cached whole");
    assert_eq!(
        split[0],
        (64 * 1024 - 100 * 264) / 264,
        "the big one gets the rest"
    );
    assert_eq!(db.check_structure().unwrap(), vec![3000, 100]);
}

#[test]
fn bad_zen_configurations_are_refused() {
    let mut c = config(Protocol::Occ, PersistenceDomain::Eadr);
    c.cache_ratio = 0.5;
    c.cache_bytes = None;
    assert!(matches!(Db::create(c), Err(DbError::Config(m)) if m.contains("cache_ratio")));
    let mut c = config(Protocol::Occ, PersistenceDomain::Eadr);
    c.cache_min_entries = 0;
    assert!(matches!(Db::create(c), Err(DbError::Config(_))));
    let c = config(Protocol::Occ, PersistenceDomain::Volatile);
    assert!(matches!(Db::create(c), Err(DbError::Config(m)) if m.contains("durable")));
    // Zen runs every protocol of the CC layer (§3.3.2).
    for protocol in Protocol::ALL {
        assert!(
            Db::create(config(protocol, PersistenceDomain::Eadr)).is_ok(),
            "{protocol} refused"
        );
    }
}

#[test]
fn a_long_running_transaction_gets_the_exclusive_mode_and_short_ones_resume() {
    use pmtx::engine::zen::{ZenConfig, ZenEngine};
    use pmtx::engine::{Engine, FieldWrite};
    use pmtx::pmem::{Pool, PoolOptions};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let pool = Pool::create_in_memory(64 << 20, &PoolOptions::new("zen", PersistenceDomain::Eadr))
        .unwrap();
    let mut cfg = ZenConfig::new(Protocol::Occ);
    cfg.max_threads = 2;
    cfg.cache_bytes = Some(32 * 1024);
    cfg.cache_min_entries = 16;
    let engine = ZenEngine::create(Arc::new(pool), cfg).unwrap();
    let t = engine
        .create_table(Schema::new("t", &[("v", ColumnType::U64)]))
        .unwrap();
    const N: u64 = 4000;
    {
        let mut w = engine.clone().worker(0).unwrap();
        for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
            w.begin(false);
            for &k in chunk {
                w.insert(t, k, &0u64.to_le_bytes()).unwrap();
            }
            w.commit().unwrap();
        }
    }
    let done = AtomicBool::new(false);
    let short_commits = std::thread::scope(|s| {
        let short = s.spawn(|| {
            let mut w = engine.clone().worker(1).unwrap();
            let mut commits = 0u64;
            let mut i = 0u64;
            while !done.load(Ordering::Acquire) || commits < 10 {
                i += 1;
                w.begin(false);
                let k = i % 16;
                let mut row = [0u8; 8];
                let r = w.read(t, k, &mut row).and_then(|()| {
                    let v = u64::from_le_bytes(row) + 1;
                    w.update(
                        t,
                        k,
                        &[FieldWrite {
                            offset: 0,
                            bytes: &v.to_le_bytes(),
                        }],
                    )
                });
                match r.and_then(|()| w.commit()) {
                    Ok(_) => commits += 1,
                    Err(e) => {
                        assert!(e.is_retryable(), "{e}");
                        w.abort();
                    }
                }
            }
            commits
        });
        // The long transaction touches every row: far more than its region's budget.
        let mut w = engine.clone().worker(0).unwrap();
        loop {
            w.begin(false);
            let mut row = [0u8; 8];
            let r = (16..N).try_for_each(|k| {
                w.read(t, k, &mut row)?;
                w.update(
                    t,
                    k,
                    &[FieldWrite {
                        offset: 0,
                        bytes: &7u64.to_le_bytes(),
                    }],
                )
            });
            match r.and_then(|()| w.commit()) {
                Ok(_) => break,
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    w.abort();
                }
            }
        }
        done.store(true, Ordering::Release);
        short.join().unwrap()
    });
    assert!(
        engine.exclusive_runs() > 0,
        "the long transaction was never detected"
    );
    let mut w = engine.clone().worker(0).unwrap();
    w.begin(true);
    let mut total = 0;
    let mut row = [0u8; 8];
    for k in 0..N {
        w.read(t, k, &mut row).unwrap();
        let v = u64::from_le_bytes(row);
        if k >= 16 {
            assert_eq!(v, 7);
        } else {
            total += v;
        }
    }
    w.commit().unwrap();
    assert_eq!(total, short_commits, "every short commit counted once");
    assert_eq!(engine.check_structure().unwrap(), vec![N]);
}

/// Every protocol, through a Met-Cache far smaller than the table (misses, evictions, copies of
/// other regions' entries): two threads run read-modify-write transactions and read-only scans,
/// and the committed history (row versions named by their writer) must be conflict-serializable
/// (SI: free of the anomalies SI forbids).
#[test]
fn histories_through_a_tiny_cache_are_serializable_under_every_protocol() {
    use pmtx::cc::history::{History, TxnRecord};
    const ROWS: u64 = 400;
    for protocol in Protocol::ALL {
        let mut c = config(protocol, PersistenceDomain::Eadr);
        c.cc_options.partitions = 4;
        let db = Db::create(c).unwrap();
        let t = db
            .create_table(Schema::new(
                "objs",
                &[
                    ("value", ColumnType::I64),
                    ("writer", ColumnType::U64),
                    ("pad", ColumnType::Bytes(300)),
                ],
            ))
            .unwrap();
        db.run(|tx| {
            (0..ROWS).try_for_each(|k| {
                tx.insert(t, k, &[Value::I64(0), Value::U64(0), Value::Bytes(b"p")])
            })
        })
        .unwrap();
        let histories: Vec<History> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u64)
                .map(|thread| {
                    let db = &db;
                    s.spawn(move || {
                        let mut w = db.worker().unwrap();
                        let mut h = History::new();
                        let mut x = thread * 7919 + 3;
                        for n in 1..=300u64 {
                            let id = (thread + 1) << 32 | n;
                            let mut keys = [0u64; 3];
                            for k in &mut keys {
                                x = x
                                    .wrapping_mul(6364136223846793005)
                                    .wrapping_add(1442695040888963407);
                                // Half the keys among 6 hot rows, the rest anywhere.
                                *k = (x >> 33) % if (x >> 20) & 1 == 0 { 6 } else { ROWS };
                            }
                            let read_only = n % 5 == 0;
                            let mut rec = TxnRecord::default();
                            w.run_counted(read_only, |tx| {
                                rec = TxnRecord {
                                    id,
                                    ..TxnRecord::default()
                                };
                                let mut seen = Vec::new();
                                for &k in &keys {
                                    if seen.iter().any(|&(s, _)| s == k) {
                                        continue;
                                    }
                                    let r = tx.get(t, k)?;
                                    rec.reads.push((k, r.u64(1)));
                                    seen.push((k, r.i64(0)));
                                }
                                if read_only {
                                    return Ok(());
                                }
                                // Widen the window between reads and writes so the threads'
                                // transactions overlap even on a loaded machine.
                                std::thread::yield_now();
                                for &(k, v) in seen.iter().take(2) {
                                    tx.update(
                                        t,
                                        k,
                                        &[(0, Value::I64(v + 1)), (1, Value::U64(id))],
                                    )?;
                                    let before = rec.reads.iter().find(|r| r.0 == k).unwrap().1;
                                    rec.writes.push((k, before));
                                }
                                Ok(())
                            })
                            .unwrap_or_else(|e| panic!("{protocol}: {e}"));
                            h.record(rec.clone());
                        }
                        h
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all = History::new();
        for h in histories {
            all.extend(h);
        }
        let checked = if protocol.is_serializable() {
            all.check_serializable()
        } else {
            all.check_snapshot_isolation()
        };
        assert!(checked.is_ok(), "{protocol}: {checked:?}");
        assert_eq!(db.check_structure().unwrap(), vec![ROWS], "{protocol}");
    }
}

/// A key deleted by one thread and inserted again by another must survive recovery: Algorithm 2
/// keeps the version with the newest Tx-CTS, so the insert must commit above the tombstone even
/// when its protocol's tids do not follow commit order (TO fixes its tid at begin; OCC tids may
/// trail another thread's). Under TO the older inserter is refused instead.
#[test]
fn a_key_deleted_by_one_thread_and_reinserted_by_another_survives_recovery() {
    use pmtx::engine::TxError;
    for protocol in Protocol::ALL {
        let dir = common::pool_dir();
        let path = dir.path().join("zen.pool");
        let cfg = config(protocol, PersistenceDomain::Adr).path(&path);
        let (t, inserted) = {
            let db = Db::create(cfg.clone()).unwrap();
            let t = db
                .create_table(Schema::new("kv", &[("v", ColumnType::U64)]).ordered())
                .unwrap();
            db.run(|tx| tx.insert(t, 7, &[Value::U64(1)])).unwrap();
            // The inserter begins first (the older timestamp under TO), the deleter commits
            // first, then the inserter inserts the now absent key and commits.
            // `Db::run` keeps its worker in a slot; the engine workers below take slots 0 and 1.
            db.release_idle_workers();
            let mut inserter = db.engine().clone().worker(0).unwrap();
            let mut deleter = db.engine().clone().worker(1).unwrap();
            inserter.begin(false);
            deleter.begin(false);
            deleter.delete(t, 7).unwrap();
            deleter.commit().unwrap();
            let row = 2u64.to_le_bytes();
            let inserted = inserter
                .insert(t, 7, &row)
                .and_then(|()| inserter.commit().map(|_| ()));
            match inserted {
                Ok(()) => {}
                Err(TxError::Conflict) => {
                    assert!(
                        matches!(protocol, Protocol::To | Protocol::Mvto),
                        "{protocol}: refused the insert"
                    );
                    inserter.abort();
                }
                Err(e) => panic!("{protocol}: {e}"),
            }
            (t, inserted.is_ok())
        };
        let db = Db::open(cfg).unwrap();
        let rows = db.run(|tx| tx.scan(t, 0, usize::MAX)).unwrap();
        if inserted {
            assert_eq!(
                rows.len(),
                1,
                "{protocol}: the acknowledged insert was lost"
            );
            assert_eq!(rows[0].1.u64(0), 2, "{protocol}");
        } else {
            assert!(rows.is_empty(), "{protocol}");
        }
    }
}

/// Issue 22, item 1: Zen TPC-C under TicToc and MVOCC failed with DuplicateKey on ORDER and
/// ORDER-LINE. Cause: a New-Order saw, at `insert`, a key that a concurrent New-Order with the same
/// (not yet committed) order id had published at commit; that commit then failed validation on an
/// unrelated read and rolled back, restoring the district's version word and removing the key.
/// The first transaction's read set still validated and the key was gone again, yet its miss was
/// reported as a duplicate. This is the pattern, with more contention: two threads take order ids
/// from one counter and insert many lines each, after reading a row that a third thread keeps
/// updating, so that commits fail after publishing their inserts. Every transaction must commit
/// (`run` retries conflicts); a DuplicateKey fails the test. Inserts that collide with a commit in
/// flight happen in every run; the rollback landing between the collision and its judgement is
/// rare, so the deterministic regression test is the unit test
/// `an_insert_that_collided_with_a_rolled_back_insert_is_a_conflict` in `engine/zen/worker.rs`,
/// which fails without the fix.
#[test]
fn an_insert_that_saw_a_rolled_back_insert_is_a_conflict_not_a_duplicate() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const LINES: u64 = 15;
    const TXNS: u64 = 4000;
    const HOT: u64 = 16;
    for protocol in [
        Protocol::Tictoc,
        Protocol::Mvocc,
        Protocol::Occ,
        Protocol::Silo,
    ] {
        let mut c = config(protocol, PersistenceDomain::Eadr).pool_size(256 << 20);
        c.cache_bytes = Some(16 << 20);
        let db = Db::create(c).unwrap();
        let u64_table = |name| {
            db.create_table(Schema::new(name, &[("v", ColumnType::U64)]))
                .unwrap()
        };
        let (counter, hot, lines) = (u64_table("counter"), u64_table("hot"), u64_table("line"));
        db.run(|tx| {
            tx.insert(counter, 0, &[Value::U64(0)])?;
            (0..HOT).try_for_each(|h| tx.insert(hot, h, &[Value::U64(0)]))
        })
        .unwrap();
        let done = AtomicBool::new(false);
        let hot_writes = std::thread::scope(|s| {
            let (db, done) = (&db, &done);
            let writer = s.spawn(move || {
                let mut w = db.worker().unwrap();
                let mut writes = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let h = writes % HOT;
                    w.run(|tx| {
                        let v = tx.get(hot, h)?.u64(0);
                        tx.update(hot, h, &[(0, Value::U64(v + 1))])
                    })
                    .unwrap();
                    writes += 1;
                    // Often enough to fail some commits, not so often that none succeeds.
                    std::thread::yield_now();
                }
                writes
            });
            let orders: Vec<_> = (0..2u64)
                .map(|thread| {
                    s.spawn(move || {
                        let mut w = db.worker().unwrap();
                        for n in 0..TXNS {
                            w.run(|tx| {
                                tx.get(hot, (n * 7 + thread) % HOT)?;
                                let id = tx.get(counter, 0)?.u64(0);
                                tx.update(counter, 0, &[(0, Value::U64(id + 1))])?;
                                (0..LINES).try_for_each(|n| {
                                    tx.insert(lines, (id << 4) | n, &[Value::U64(thread)])
                                })
                            })
                            .unwrap_or_else(|e| panic!("{protocol}: {e}"));
                        }
                    })
                })
                .collect();
            orders.into_iter().for_each(|t| t.join().unwrap());
            done.store(true, Ordering::Relaxed);
            writer.join().unwrap()
        });
        let (ids, hits) = db
            .run(|tx| {
                let hits = (0..HOT)
                    .map(|h| Ok(tx.get(hot, h)?.u64(0)))
                    .sum::<Result<u64, _>>()?;
                Ok((tx.get(counter, 0)?.u64(0), hits))
            })
            .unwrap();
        assert_eq!((ids, hits), (2 * TXNS, hot_writes), "{protocol}");
        assert_eq!(
            db.check_structure().unwrap(),
            vec![1, HOT, 2 * TXNS * LINES],
            "{protocol}"
        );
    }
}

/// A table of `N` rows of eight equal `u64` words (so a torn or garbage row shows), small enough
/// next to the tiny Met-Cache of [`config`] that most rows are not cached.
fn overwrite_table(db: &Db) -> pmtx::catalog::TableId {
    let t = db
        .create_table(Schema::new("words", &[("w", ColumnType::Bytes(64))]))
        .unwrap();
    // Small transactions, so that each claims entries the cache can evict: the first rows are
    // no longer cached at the end (one transaction of all the inserts would pin them all and
    // grow the cache to hold them).
    for chunk in 0..OVERWRITE_ROWS / 10 {
        db.run(|tx| {
            (chunk * 10..chunk * 10 + 10).try_for_each(|k| tx.insert_bytes(t, k, &row_of(k)))
        })
        .unwrap();
    }
    t
}

const OVERWRITE_ROWS: u64 = 2000;

fn row_of(value: u64) -> [u8; 64] {
    let mut row = [0u8; 64];
    for w in row.chunks_exact_mut(8) {
        w.copy_from_slice(&value.to_le_bytes());
    }
    row
}

/// Replaces the whole row of `key` with `row_of(value)` (a blind overwrite).
fn overwrite(
    tx: &mut pmtx::db::Tx<'_>,
    t: pmtx::catalog::TableId,
    key: u64,
    value: u64,
) -> Result<(), pmtx::engine::TxError> {
    let row = row_of(value);
    tx.update_bytes(
        t,
        key,
        &[pmtx::engine::FieldWrite {
            offset: 0,
            bytes: &row,
        }],
    )
}

fn value_of(row: &[u8]) -> u64 {
    let first = u64::from_le_bytes(row[..8].try_into().unwrap());
    for w in row.chunks_exact(8) {
        assert_eq!(
            u64::from_le_bytes(w.try_into().unwrap()),
            first,
            "a torn row"
        );
    }
    first
}

/// The blind-overwrite path (a whole-row update of an uncached row claims its entry only at
/// commit, without loading the row): a commit that fails after claiming it (a read validated
/// after another worker changed it) must leave the old row in the entry, not the unloaded one.
#[test]
fn a_failed_blind_overwrite_leaves_the_old_row() {
    for protocol in [Protocol::Occ, Protocol::Silo] {
        let db = Db::create(config(protocol, PersistenceDomain::Adr)).unwrap();
        let t = overwrite_table(&db);
        let (mut w1, mut w2) = (db.worker().unwrap(), db.worker().unwrap());
        // Key 1 was inserted first, so the later inserts evicted it from the tiny cache.
        let (hot, blind) = (OVERWRITE_ROWS - 1, 1);
        let mut attempts = 0;
        w1.run(|tx| {
            attempts += 1;
            if attempts == 2 {
                // The first attempt's commit failed after claiming `blind`'s entry.
                let mut row = [0u8; 64];
                tx.read_into(t, blind, &mut row)?;
                assert_eq!(value_of(&row), blind, "{protocol}: the rolled-back row");
            }
            let mut row = [0u8; 64];
            tx.read_into(t, hot, &mut row)?;
            overwrite(tx, t, blind, 7_000)?;
            if attempts == 1 {
                // Another worker changes the row this transaction read: its validation fails.
                w2.run(|tx2| overwrite(tx2, t, hot, 9_000)).unwrap();
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(
            attempts, 2,
            "{protocol}: the first commit must fail validation"
        );
        let mut row = [0u8; 64];
        db.run(|tx| tx.read_into(t, blind, &mut row)).unwrap();
        assert_eq!(value_of(&row), 7_000, "{protocol}");
    }
}

/// Writers overwrite whole rows blindly while readers read them, all through a Met-Cache far
/// smaller than the table: no reader sees an entry claimed for an overwrite before its row is
/// stored (a torn or foreign row), and every row ends with a value some writer wrote last.
#[test]
fn blind_overwrites_through_a_tiny_cache_never_show_an_unloaded_row() {
    const OPS: u64 = 8;
    for protocol in [Protocol::Occ, Protocol::Silo] {
        let db = Db::create(config(protocol, PersistenceDomain::Eadr)).unwrap();
        let t = overwrite_table(&db);
        std::thread::scope(|s| {
            for thread in 0..3u64 {
                let db = &db;
                s.spawn(move || {
                    let mut w = db.worker().unwrap();
                    let mut x = thread + 11;
                    let mut row = [0u8; 64];
                    for i in 0..2000u64 {
                        w.run(|tx| {
                            for op in 0..OPS {
                                x = x
                                    .wrapping_mul(6364136223846793005)
                                    .wrapping_add(1442695040888963407);
                                let key = (x >> 33) % OVERWRITE_ROWS;
                                if thread == 0 {
                                    // Readers see a row's loaded value or a writer's.
                                    tx.read_into(t, key, &mut row)?;
                                    let seen = value_of(&row);
                                    assert!(
                                        seen == key || seen >= 1_000_000,
                                        "{protocol}: key {key} shows {seen}"
                                    );
                                } else {
                                    let value = 1_000_000 * thread + i * OPS + op;
                                    overwrite(tx, t, key, value)?;
                                }
                            }
                            Ok(())
                        })
                        .unwrap();
                    }
                });
            }
        });
        let mut row = [0u8; 64];
        for k in 0..OVERWRITE_ROWS {
            db.run(|tx| tx.read_into(t, k, &mut row)).unwrap();
            let v = value_of(&row);
            assert!(v == k || v >= 1_000_000, "{protocol}: key {k} holds {v}");
        }
        assert_eq!(db.check_structure().unwrap(), vec![OVERWRITE_ROWS]);
    }
}

/// Under OCC and Silo a read of an uncached row reads its NVM-tuple in place, without loading it
/// into the Met-Cache (most of the time): a commit must still fail validation when another
/// worker wrote that row after the read, whether the writer overwrote it blindly (an entry
/// claimed locked at commit) or read it first (an entry loaded by `locate`).
#[test]
fn a_read_of_an_uncached_row_fails_validation_after_another_worker_writes_it() {
    for protocol in [Protocol::Occ, Protocol::Silo] {
        for writer_reads_first in [false, true] {
            let db = Db::create(config(protocol, PersistenceDomain::Adr)).unwrap();
            let t = overwrite_table(&db);
            let (mut w1, mut w2) = (db.worker().unwrap(), db.worker().unwrap());
            // Keys 1 and 2 were inserted first: the later inserts evicted them from the cache.
            let (read, written) = (1, 2);
            let mut attempts = 0;
            let mut seen = 0;
            w1.run(|tx| {
                attempts += 1;
                let mut row = [0u8; 64];
                // Declared read-only: the uncached row is read in place.
                tx.prefetch_read_only(t, &[read]);
                tx.read_into(t, read, &mut row)?;
                seen = value_of(&row);
                if attempts == 1 {
                    w2.run(|tx2| {
                        if writer_reads_first {
                            let mut old = [0u8; 64];
                            tx2.read_into(t, read, &mut old)?;
                        }
                        overwrite(tx2, t, read, 9_000)
                    })
                    .unwrap();
                }
                overwrite(tx, t, written, seen + 1)
            })
            .unwrap();
            let case = format!("{protocol}, writer reads first: {writer_reads_first}");
            assert_eq!(attempts, 2, "{case}: the stale read must fail validation");
            assert_eq!(seen, 9_000, "{case}");
            let mut row = [0u8; 64];
            db.run(|tx| tx.read_into(t, written, &mut row)).unwrap();
            assert_eq!(value_of(&row), 9_001, "{case}");
        }
    }
}
