//! DUDETx (issue 16) through the `Db` API: sync and async commits against the durable id, clean
//! reopens replaying the heap into the DRAM shadow, concurrent transfers under several
//! protocols with the heap checked against the shadow, log combination's savings, and refused
//! configurations.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::dudetx::{DudetxConfig, DudetxEngine, DurabilityMode, LogCompression};
use pmtx::engine::{DbError, Engine, EngineKind, FieldWrite};
use pmtx::pmem::{PersistenceDomain, Pool, PoolOptions};
use std::sync::Arc;

mod common;

fn config(domain: PersistenceDomain) -> DbConfig {
    let mut c = DbConfig::temporary()
        .engine(EngineKind::Dudetx)
        .domain(domain)
        .pool_size(48 << 20)
        .max_threads(4);
    c.dudetx_log_pages = 2;
    c
}

fn kv() -> Schema {
    Schema::new(
        "kv",
        &[("v", ColumnType::U64), ("pad", ColumnType::Bytes(24))],
    )
}

/// An engine on a new in-memory ADR pool whose persist and reproduce steps run inline in the
/// committing thread, so that groups fill deterministically (every `group` commits).
fn inline_engine(
    mode: DurabilityMode,
    group: usize,
    compression: LogCompression,
) -> Arc<DudetxEngine> {
    let mut c = DudetxConfig::new(Protocol::Occ);
    c.mode = mode;
    c.group = group;
    c.compression = compression;
    c.max_threads = 2;
    c.log_pages = 2;
    c.background = false;
    let pool = Pool::create_in_memory(
        32 << 20,
        &PoolOptions::new("dudetx", PersistenceDomain::Adr).with_counting(false),
    )
    .unwrap();
    DudetxEngine::create(Arc::new(pool), c).unwrap()
}

/// Sync mode: every commit returns with its id already durable.
#[test]
fn a_sync_commit_returns_durable() {
    let db = Db::create(config(PersistenceDomain::Adr)).unwrap();
    let t = db.create_table(kv()).unwrap();
    let mut w = db.worker().unwrap();
    for k in 0..50u64 {
        let tid = w
            .run_counted(false, |tx| {
                tx.insert(t, k, &[Value::U64(k), Value::Bytes(b"x")])
            })
            .unwrap()
            .tid;
        assert!(
            db.engine().durable_tid() >= tid,
            "commit {tid} returned before durable"
        );
    }
}

/// Async mode: commits return at once; the durable id catches up, and a clean close leaves
/// everything on PM, which a reopen loads into the shadow.
#[test]
fn async_commits_become_durable_and_survive_a_clean_reopen() {
    let dir = common::pool_dir();
    let path = dir.path().join("d.pool");
    let mut c = config(PersistenceDomain::Eadr).path(&path);
    c.temporary = false;
    c.dudetx_mode = DurabilityMode::Async;
    c.dudetx_group = 16;
    let last = {
        let db = Db::create(c.clone()).unwrap();
        let t = db.create_table(kv()).unwrap();
        let mut last = 0;
        for k in 0..300u64 {
            last = db
                .worker()
                .unwrap()
                .run_counted(false, |tx| {
                    tx.insert(t, k, &[Value::U64(k), Value::Bytes(b"a")])
                })
                .unwrap()
                .tid;
        }
        for k in (0..300u64).step_by(3) {
            db.run(|tx| tx.delete(t, k)).unwrap();
        }
        db.run(|tx| tx.update(t, 1, &[(0, Value::U64(1000))]))
            .unwrap();
        // The structure check drains the pipeline (persist, reproduce) and compares the PM heap
        // with the shadow.
        assert_eq!(db.check_structure().unwrap(), vec![200]);
        assert!(db.engine().durable_tid() >= last);
        last
    };
    let db = Db::open(c).unwrap();
    let t = db.table("kv").unwrap();
    let report = db.recovery_report().unwrap();
    assert_eq!(report.rows, 200);
    assert!(db.engine().durable_tid() >= last);
    assert_eq!(db.run(|tx| Ok(tx.get(t, 1)?.u64(0))).unwrap(), 1000);
    assert!(!db.run(|tx| tx.exists(t, 3)).unwrap());
    assert_eq!(db.run(|tx| Ok(tx.get(t, 299)?.u64(0))).unwrap(), 299);
    // New commits continue the ids.
    let tid = db
        .worker()
        .unwrap()
        .run_counted(false, |tx| {
            tx.insert(t, 1000, &[Value::U64(1), Value::Bytes(b"n")])
        })
        .unwrap()
        .tid;
    assert!(tid > last);
    assert_eq!(db.check_structure().unwrap(), vec![201]);
}

/// Concurrent transfers under several protocols (the shadow's concurrency control is the
/// perform mode): the total is kept, and the PM heap equals the shadow row for row.
#[test]
fn concurrent_transfers_keep_the_total_under_several_protocols() {
    for protocol in [
        Protocol::Occ,
        Protocol::NoWait,
        Protocol::Mvto,
        Protocol::Tictoc,
    ] {
        for mode in [DurabilityMode::Sync, DurabilityMode::Async] {
            let mut c = config(PersistenceDomain::Adr).protocol(protocol);
            c.dudetx_mode = mode;
            c.max_retries = 100_000;
            let db = Db::create(c).unwrap();
            let t = db.create_table(kv()).unwrap();
            db.run(|tx| {
                (0..16u64).try_for_each(|k| tx.insert(t, k, &[Value::U64(100), Value::Bytes(b"")]))
            })
            .unwrap();
            std::thread::scope(|s| {
                for th in 0..3u64 {
                    let db = &db;
                    s.spawn(move || {
                        let mut w = db.worker().unwrap();
                        for i in 0..150u64 {
                            let (a, b) = ((i * 7 + th) % 16, (i * 3 + th + 1) % 16);
                            if a == b {
                                continue;
                            }
                            w.run(|tx| {
                                let va = tx.get(t, a)?.u64(0);
                                let vb = tx.get(t, b)?.u64(0);
                                if va > 0 {
                                    tx.update(t, a, &[(0, Value::U64(va - 1))])?;
                                    tx.update(t, b, &[(0, Value::U64(vb + 1))])?;
                                }
                                Ok(())
                            })
                            .unwrap();
                        }
                    });
                }
            });
            let total: u64 = db
                .run(|tx| (0..16u64).map(|k| Ok(tx.get(t, k)?.u64(0))).sum())
                .unwrap();
            assert_eq!(total, 1600, "{protocol} {mode:?}");
            // Drains the pipeline and compares the heap with the shadow.
            assert_eq!(
                db.check_structure().unwrap(),
                vec![16],
                "{protocol} {mode:?}"
            );
        }
    }
}

/// §3.3: with groups, a hot row written by many transactions is persisted far fewer times than
/// it is written; with groups of one, every transaction is its own record.
#[test]
fn log_combination_persists_a_hot_row_once_per_group() {
    let mut saved = Vec::new();
    for group in [1usize, 100] {
        let engine = inline_engine(DurabilityMode::Async, group, LogCompression::Auto);
        let t = engine.create_table(kv()).unwrap();
        let mut w = engine.clone().worker(0).unwrap();
        w.begin(false);
        w.insert(t, 1, &[0u8; 32]).unwrap();
        w.commit().unwrap();
        for i in 0..1000u64 {
            w.begin(false);
            let v = i.to_le_bytes();
            w.update(
                t,
                1,
                &[FieldWrite {
                    offset: 0,
                    bytes: &v,
                }],
            )
            .unwrap();
            w.commit().unwrap();
        }
        drop(w);
        engine.drain().unwrap();
        assert_eq!(engine.durable_tid(), 1001);
        let s = engine.log_stats();
        assert_eq!(s.txns, 1001);
        if group == 1 {
            assert_eq!(s.records, 1001);
            assert_eq!(s.combined_bytes, s.raw_bytes);
        } else {
            assert!(s.records <= 12, "{s:?}");
            assert!(s.combined_bytes * 50 < s.raw_bytes, "{s:?}");
        }
        saved.push(1.0 - s.stored_bytes as f64 / s.raw_bytes as f64);
        assert_eq!(engine.check_structure().unwrap(), vec![1]);
    }
    assert!(saved[1] > saved[0] && saved[1] > 0.9, "{saved:?}");
}

#[test]
fn bad_configurations_are_refused_with_a_reason() {
    let refused = |c: DbConfig, what: &str| match Db::create(c) {
        Err(DbError::Config(m)) => assert!(m.contains(what), "{m}"),
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    let mut c = config(PersistenceDomain::Adr);
    c.dudetx_group = 0;
    refused(c, "group size");
    let mut c = config(PersistenceDomain::Adr);
    c.dudetx_log_pages = 5000;
    refused(c, "log ring");
    let mut c = config(PersistenceDomain::Adr);
    c.dudetx_group_delay_us = 1_000_001;
    refused(c, "group delay");
    refused(
        config(PersistenceDomain::Adr).index_placement(pmtx::index::IndexPlacement::Pm),
        "DRAM shadow",
    );
    assert_eq!(
        "fast".parse::<DurabilityMode>().unwrap_err(),
        "unknown DUDETx durability mode 'fast' (expected sync or async)"
    );
    let mut c = config(PersistenceDomain::Adr);
    c.domain = Some(PersistenceDomain::Volatile);
    refused(c, "durable domain");
}

/// A transaction whose redo log cannot fit a log record is refused before it commits, and
/// nothing of it is visible.
#[test]
fn a_transaction_too_large_for_the_log_is_refused_whole() {
    let mut c = config(PersistenceDomain::Adr);
    c.dudetx_log_pages = 1;
    let db = Db::create(c).unwrap();
    let t = db
        .create_table(Schema::new("big", &[("b", ColumnType::Bytes(4000))]))
        .unwrap();
    let err = db
        .run(|tx| (0..200u64).try_for_each(|k| tx.insert(t, k, &[Value::Bytes(b"z")])))
        .unwrap_err();
    assert!(err.to_string().contains("log ring"), "{err}");
    assert!(!db.run(|tx| tx.exists(t, 0)).unwrap());
    db.run(|tx| tx.insert(t, 0, &[Value::Bytes(b"ok")]))
        .unwrap();
}

/// `DbConfig::dudetx_group_delay_us` reaches the table engine's persist thread (§3.3): with a
/// group that cannot fill and a delay of 1 s, async commits stay volatile well past the
/// default 2 ms delay, and a drain (the structure check) still makes them durable at once.
#[test]
fn the_group_delay_is_set_through_the_db_config() {
    let mut c = config(PersistenceDomain::Adr);
    c.dudetx_mode = DurabilityMode::Async;
    c.dudetx_group = 1 << 20;
    c.dudetx_group_delay_us = 1_000_000;
    let db = Db::create(c).unwrap();
    let t = db.create_table(kv()).unwrap();
    let start = std::time::Instant::now();
    let mut w = db.worker().unwrap();
    let mut last = 0;
    for k in 0..20u64 {
        last = w
            .run_counted(false, |tx| {
                tx.insert(t, k, &[Value::U64(k), Value::Bytes(b"x")])
            })
            .unwrap()
            .tid;
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let durable = db.engine().durable_tid();
    if start.elapsed() < std::time::Duration::from_millis(900) {
        assert!(
            durable < last,
            "commit {last} became durable (durable id {durable}) within 50 ms of a 1 s group delay"
        );
    }
    db.check_structure().unwrap();
    assert_eq!(db.engine().durable_tid(), last);
}

/// §3.3's LZ4 by mode: `Auto` compresses in async mode only (a sync commit would wait for it),
/// `Always` and `Never` in both. Rows of zeros shrink under LZ4, so a compressed record stores
/// far fewer bytes than it combined.
#[test]
fn lz4_compresses_log_records_in_async_mode_unless_configured_otherwise() {
    let cases = [
        (DurabilityMode::Sync, LogCompression::Auto, false),
        (DurabilityMode::Sync, LogCompression::Always, true),
        (DurabilityMode::Async, LogCompression::Auto, true),
        (DurabilityMode::Async, LogCompression::Never, false),
    ];
    for (mode, compression, compressed) in cases {
        let engine = inline_engine(mode, 4, compression);
        let wide = Schema::new(
            "wide",
            &[("v", ColumnType::U64), ("pad", ColumnType::Bytes(1000))],
        );
        let t = engine.create_table(wide).unwrap();
        let mut w = engine.clone().worker(0).unwrap();
        for key in 0..40u64 {
            w.begin(false);
            w.insert(t, key, &[0u8; 1008]).unwrap();
            w.commit().unwrap();
        }
        drop(w);
        engine.drain().unwrap();
        let s = engine.log_stats();
        let case = format!("{mode} {compression}: {s:?}");
        assert_eq!(s.txns, 40, "{case}");
        if compressed {
            assert!(s.stored_bytes * 4 < s.combined_bytes, "{case}");
        } else {
            assert!(s.stored_bytes >= s.combined_bytes, "{case}");
        }
        assert_eq!(engine.check_structure().unwrap(), vec![40], "{case}");
    }
}

/// A group of one transaction is persisted as its own log, uncombined, and reproduces to the
/// same rows: a row inserted and then updated twice in one transaction, and a row updated twice
/// in another, end as the transactions left them, in the PM heap as in the shadow, and after a
/// clean reopen.
#[test]
fn a_single_transaction_group_replays_its_repeated_writes_in_order() {
    let dir = common::pool_dir();
    let path = dir.path().join("single.pool");
    let mut c = config(PersistenceDomain::Adr).path(&path);
    c.temporary = false;
    {
        let db = Db::create(c.clone()).unwrap();
        let t = db.create_table(kv()).unwrap();
        db.run(|tx| {
            tx.insert(t, 1, &[Value::U64(10), Value::Bytes(b"a")])?;
            tx.update(t, 1, &[(0, Value::U64(11))])?;
            tx.update(t, 1, &[(0, Value::U64(12))])?;
            tx.insert(t, 2, &[Value::U64(20), Value::Bytes(b"b")])
        })
        .unwrap();
        db.run(|tx| {
            tx.update(t, 2, &[(0, Value::U64(21))])?;
            tx.update(t, 2, &[(0, Value::U64(22))])
        })
        .unwrap();
        // Drains the pipeline and compares the PM heap with the shadow.
        assert_eq!(db.check_structure().unwrap(), vec![2]);
    }
    let db = Db::open(c).unwrap();
    let t = db.table("kv").unwrap();
    assert_eq!(db.run(|tx| Ok(tx.get(t, 1)?.u64(0))).unwrap(), 12);
    assert_eq!(db.run(|tx| Ok(tx.get(t, 2)?.u64(0))).unwrap(), 22);
    assert_eq!(db.check_structure().unwrap(), vec![2]);
}
