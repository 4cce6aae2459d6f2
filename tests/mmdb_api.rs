//! MMDB (issue 18) through the `Db` API: group commit returns durable, clean reopens replay the
//! log into the DRAM tables, a checkpoint followed by more commits recovers both, a corrupt log
//! tail is cut at the first bad CRC, a full log ring takes a checkpoint instead of losing data,
//! concurrent transfers under several protocols, and refused configurations.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::mmdb::{MmdbConfig, MmdbEngine};
use pmtx::engine::{DbError, Engine, EngineKind};
use pmtx::pmem::{PersistenceDomain, Pool, PoolOptions};
use std::sync::Arc;

mod common;

fn config(domain: PersistenceDomain) -> DbConfig {
    let mut c = DbConfig::temporary()
        .engine(EngineKind::Mmdb)
        .domain(domain)
        .pool_size(48 << 20)
        .max_threads(4);
    c.mmdb_log_pages = 2;
    c
}

fn kv() -> Schema {
    Schema::new(
        "kv",
        &[("v", ColumnType::U64), ("pad", ColumnType::Bytes(24))],
    )
}

fn on_file(domain: PersistenceDomain, path: &std::path::Path) -> DbConfig {
    let mut c = config(domain).path(path);
    c.temporary = false;
    c
}

fn fact(db: &Db, name: &str) -> u64 {
    let r = db.recovery_report().expect("a recovered database");
    r.facts
        .iter()
        .find(|f| f.0 == name)
        .unwrap_or_else(|| panic!("no fact {name} in {r:?}"))
        .1
}

/// Group commit: every commit returns with its id durable, and concurrent committers share
/// log records (fewer records than transactions).
#[test]
fn commits_return_durable_and_threads_share_log_records() {
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        let mut c = MmdbConfig::new(Protocol::Occ);
        c.max_threads = 4;
        c.log_pages = 2;
        c.group_wait = std::time::Duration::from_micros(300);
        let pool = Pool::create_in_memory(
            32 << 20,
            &PoolOptions::new("mmdb", domain).with_counting(false),
        )
        .unwrap();
        let engine = MmdbEngine::create(Arc::new(pool), c).unwrap();
        let t = engine.create_table(kv()).unwrap();
        std::thread::scope(|s| {
            for th in 0..3usize {
                let engine = engine.clone();
                s.spawn(move || {
                    let mut w = engine.clone().worker(th).unwrap();
                    for k in 0..100u64 {
                        w.begin(false);
                        w.insert(t, th as u64 * 1000 + k, &[7u8; 32]).unwrap();
                        let tid = w.commit().unwrap();
                        assert!(
                            engine.durable_tid() >= tid,
                            "commit {tid} returned before durable"
                        );
                    }
                });
            }
        });
        let stats = engine.stats();
        assert_eq!(stats.txns, 300, "{domain}");
        assert!(
            stats.records < stats.txns,
            "{domain}: no group formed ({stats:?})"
        );
        assert_eq!(engine.check_structure().unwrap(), vec![300]);
    }
}

/// A clean close and reopen keeps every committed row (from the log alone: no checkpoint).
#[test]
fn reopen_keeps_committed_data() {
    let dir = common::pool_dir();
    let path = dir.path().join("m.pool");
    let mut c = on_file(PersistenceDomain::Adr, &path);
    c.mmdb_checkpoint_ms = 0;
    let last = {
        let db = Db::create(c.clone()).unwrap();
        let t = db.create_table(kv()).unwrap();
        for k in 0..200u64 {
            db.run(|tx| tx.insert(t, k, &[Value::U64(k), Value::Bytes(b"a")]))
                .unwrap();
        }
        for k in (0..200u64).step_by(4) {
            db.run(|tx| tx.delete(t, k)).unwrap();
        }
        db.run(|tx| tx.update(t, 1, &[(0, Value::U64(77))]))
            .unwrap();
        db.engine().durable_tid()
    };
    let db = Db::open(c).unwrap();
    let t = db.table("kv").unwrap();
    let report = db.recovery_report().unwrap();
    assert_eq!(report.rows, 150);
    assert_eq!(fact(&db, "checkpoint_generation"), 0);
    let phases: Vec<&str> = report.phases.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(phases, ["load checkpoint", "replay log"]);
    assert_eq!(db.engine().durable_tid(), last);
    assert_eq!(db.run(|tx| Ok(tx.get(t, 1)?.u64(0))).unwrap(), 77);
    assert!(!db.run(|tx| tx.exists(t, 4)).unwrap());
    let tid = db
        .worker()
        .unwrap()
        .run_counted(false, |tx| {
            tx.insert(t, 5000, &[Value::U64(1), Value::Bytes(b"n")])
        })
        .unwrap()
        .tid;
    assert_eq!(tid, last + 1, "ids continue after recovery");
    assert_eq!(db.check_structure().unwrap(), vec![151]);
}

/// A checkpoint followed by more commits: recovery loads the checkpoint and replays the later
/// commits on top, across two reopens (the second one after more commits in a new epoch).
#[test]
fn a_checkpoint_then_more_commits_recovers_both() {
    let dir = common::pool_dir();
    let path = dir.path().join("c.pool");
    let mut c = on_file(PersistenceDomain::Eadr, &path);
    c.mmdb_checkpoint_ms = 0;
    {
        let db = Db::create(c.clone()).unwrap();
        let t = db.create_table(kv()).unwrap();
        for k in 0..100u64 {
            db.run(|tx| tx.insert(t, k, &[Value::U64(k), Value::Bytes(b"c")]))
                .unwrap();
        }
        let s = db.engine().checkpoint().unwrap().unwrap();
        assert_eq!((s.generation, s.entries), (1, 100));
        for k in 0..50u64 {
            db.run(|tx| tx.update(t, k, &[(0, Value::U64(k + 1000))]))
                .unwrap();
        }
        db.run(|tx| tx.delete(t, 99)).unwrap();
    }
    {
        let db = Db::open(c.clone()).unwrap();
        let t = db.table("kv").unwrap();
        let r = db.recovery_report().unwrap();
        assert_eq!(r.rows, 99);
        assert_eq!(r.committed_in_log, 51, "{r:?}");
        assert_eq!(fact(&db, "checkpoint_generation"), 1);
        assert_eq!(db.run(|tx| Ok(tx.get(t, 3)?.u64(0))).unwrap(), 1003);
        assert_eq!(db.run(|tx| Ok(tx.get(t, 60)?.u64(0))).unwrap(), 60);
        db.run(|tx| tx.insert(t, 99, &[Value::U64(9), Value::Bytes(b"n")]))
            .unwrap();
    }
    let db = Db::open(c).unwrap();
    let t = db.table("kv").unwrap();
    assert_eq!(db.recovery_report().unwrap().rows, 100);
    assert_eq!(db.run(|tx| Ok(tx.get(t, 99)?.u64(0))).unwrap(), 9);
    assert_eq!(db.run(|tx| Ok(tx.get(t, 49)?.u64(0))).unwrap(), 1049);
}

/// A damaged log record (a flipped byte, as a torn write would leave) ends the replay: the
/// transactions before it are there, it and every later one are not.
#[test]
fn a_corrupt_log_tail_is_cut_at_the_first_bad_crc() {
    let dir = common::pool_dir();
    let path = dir.path().join("t.pool");
    let mut c = on_file(PersistenceDomain::Adr, &path);
    c.mmdb_checkpoint_ms = 0;
    c.mmdb_group_wait_us = 0;
    let marker = |k: u64| format!("MARK{k:04}").into_bytes();
    {
        let db = Db::create(c.clone()).unwrap();
        let t = db.create_table(kv()).unwrap();
        for k in 0..20u64 {
            db.run(|tx| tx.insert(t, k, &[Value::U64(k), Value::Bytes(&marker(k))]))
                .unwrap();
        }
    }
    // Transaction 12's record (one record per commit: one thread, no group wait).
    let mut image = std::fs::read(&path).unwrap();
    let m = marker(12);
    let at = image
        .windows(m.len())
        .position(|w| w == m.as_slice())
        .expect("the record is in the pool file");
    image[at] ^= 0x40;
    std::fs::write(&path, &image).unwrap();
    let db = Db::open(c).unwrap();
    let t = db.table("kv").unwrap();
    assert_eq!(db.recovery_report().unwrap().rows, 12);
    assert!(db.run(|tx| tx.exists(t, 11)).unwrap());
    for k in 12..20 {
        assert!(!db.run(|tx| tx.exists(t, k)).unwrap(), "key {k}");
    }
    // The log continues after the cut, and a reopen takes the new records, not the old ones.
    db.run(|tx| tx.insert(t, 500, &[Value::U64(5), Value::Bytes(b"new")]))
        .unwrap();
    drop(db);
    let db = Db::open(on_file(PersistenceDomain::Adr, &path)).unwrap();
    assert_eq!(db.recovery_report().unwrap().rows, 13);
}

/// A log ring filled many times over: checkpoints make room (no commit fails, nothing is lost),
/// and a reopen finds every row.
#[test]
fn a_full_log_ring_takes_a_checkpoint_not_data() {
    let dir = common::pool_dir();
    let path = dir.path().join("f.pool");
    let mut c = on_file(PersistenceDomain::Adr, &path);
    c.mmdb_log_pages = 1;
    c.mmdb_checkpoint_ms = 0;
    let big = Schema::new(
        "big",
        &[("v", ColumnType::U64), ("b", ColumnType::Bytes(2000))],
    );
    {
        let db = Db::create(c.clone()).unwrap();
        let t = db.create_table(big.clone()).unwrap();
        // 4000 commits of 2 KB rows: about 4 laps of a 2 MiB ring.
        for i in 0..4000u64 {
            let k = i % 300;
            db.run(|tx| {
                if tx.exists(t, k)? {
                    tx.update(t, k, &[(0, Value::U64(i))])
                } else {
                    tx.insert(t, k, &[Value::U64(i), Value::Bytes(b"b")])
                }
            })
            .unwrap();
        }
    }
    let db = Db::open(c).unwrap();
    let t = db.table("big").unwrap();
    assert_eq!(db.recovery_report().unwrap().rows, 300);
    assert!(
        fact(&db, "checkpoint_generation") >= 2,
        "the full ring took checkpoints"
    );
    for k in [0u64, 150, 299] {
        let last = (0..4000u64).rev().find(|i| i % 300 == k).unwrap();
        assert_eq!(db.run(|tx| Ok(tx.get(t, k)?.u64(0))).unwrap(), last);
    }
}

/// Concurrent transfers under several protocols (each runs unchanged on the DRAM tables), with
/// periodic checkpoints running meanwhile: the total is kept, also after a reopen.
#[test]
fn concurrent_transfers_keep_the_total_under_several_protocols() {
    for protocol in [
        Protocol::Occ,
        Protocol::NoWait,
        Protocol::Mvto,
        Protocol::Tictoc,
    ] {
        let dir = common::pool_dir();
        let path = dir.path().join("b.pool");
        let mut c = on_file(PersistenceDomain::Adr, &path).protocol(protocol);
        c.max_retries = 100_000;
        c.mmdb_checkpoint_ms = 5;
        {
            let db = Db::create(c.clone()).unwrap();
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
            assert_eq!(db.check_structure().unwrap(), vec![16], "{protocol}");
        }
        let db = Db::open(c).unwrap();
        let t = db.table("kv").unwrap();
        let total: u64 = db
            .run(|tx| (0..16u64).map(|k| Ok(tx.get(t, k)?.u64(0))).sum())
            .unwrap();
        assert_eq!(total, 1600, "{protocol}");
    }
}

#[test]
fn bad_configurations_are_refused_with_a_reason() {
    let refused = |c: DbConfig, what: &str| match Db::create(c) {
        Err(DbError::Config(m)) => assert!(m.contains(what), "{m}"),
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    let mut c = config(PersistenceDomain::Adr);
    c.mmdb_group = 0;
    refused(c, "group commit size");
    let mut c = config(PersistenceDomain::Adr);
    c.mmdb_group_wait_us = 5_000_000;
    refused(c, "group commit wait");
    let mut c = config(PersistenceDomain::Adr);
    c.mmdb_log_pages = 5000;
    refused(c, "log ring");
    refused(
        config(PersistenceDomain::Adr).index_placement(pmtx::index::IndexPlacement::Pm),
        "indexes in DRAM",
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
    c.mmdb_log_pages = 1;
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
