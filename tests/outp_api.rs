//! Outp (Falcon §6.2's out-of-place baseline, issue 18) through the `Db` API: an update writes a
//! whole new version, superseded versions are reclaimed, a reader of a superseded version follows
//! the index or aborts, secondary indexes follow the new version, and the pool reopens (by outp
//! and by falcon, which share the layout). The crash suite covers crashes (`outp_adr`,
//! `outp_eadr`, `outp-keep-old-live`).

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind, FieldWrite, TxError};
use pmtx::index::IndexPlacement;
use pmtx::pmem::PersistenceDomain;

mod common;

fn config(engine: EngineKind, domain: PersistenceDomain) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .protocol(Protocol::Occ)
        .domain(domain)
        .pool_size(32 << 20)
        .max_threads(4)
}

fn kv() -> Schema {
    Schema::new(
        "kv",
        &[("pad", ColumnType::Bytes(1000)), ("v", ColumnType::U64)],
    )
}

fn value(db: &Db, t: u32, key: u64) -> u64 {
    db.run(|tx| tx.get(t, key).map(|r| r.u64(1))).unwrap()
}

#[test]
fn only_single_version_protocols_and_dram_indexes_are_accepted() {
    for protocol in Protocol::ALL {
        let r = Db::create(config(EngineKind::Outp, PersistenceDomain::Adr).protocol(protocol));
        if protocol.is_multi_version() {
            assert!(
                matches!(
                    r,
                    Err(DbError::UnsupportedProtocol {
                        engine: EngineKind::Outp,
                        ..
                    })
                ),
                "{protocol}"
            );
        } else {
            assert!(r.is_ok(), "{protocol}");
        }
    }
    let r = Db::create(
        config(EngineKind::Outp, PersistenceDomain::Adr).index_placement(IndexPlacement::Pm),
    );
    match r {
        Err(DbError::Config(m)) => assert!(m.contains("outp keeps its indexes in DRAM"), "{m}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("outp accepted a persistent index"),
    }
}

/// The PM bytes one 8-byte update of a 1008-byte row stores, on `engine`.
fn bytes_per_update(engine: EngineKind) -> u64 {
    let db = Db::create(config(engine, PersistenceDomain::Adr)).unwrap();
    let t = db.create_table(kv()).unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::Bytes(&[7; 1000]), Value::U64(0)]))
        .unwrap();
    let mut w = db.worker().unwrap();
    let before = pmtx::pmem::stats::thread_snapshot();
    for i in 1..=100u64 {
        w.run(|tx| tx.update(t, 1, &[(1, Value::U64(i))])).unwrap();
    }
    let written = pmtx::pmem::stats::thread_snapshot() - before;
    drop(w);
    assert_eq!(value(&db, t, 1), 100);
    assert_eq!(db.check_structure().unwrap(), vec![1]);
    written.bytes_written / 100
}

/// Falcon §6.2.2: an out-of-place engine copies the whole tuple on every update (here it is also
/// in the log), where an in-place one writes the changed bytes (in its log and in place).
#[test]
fn an_update_writes_a_whole_new_version() {
    let outp = bytes_per_update(EngineKind::Outp);
    let inp = bytes_per_update(EngineKind::Inp);
    assert!(outp >= 2 * 1008, "outp stores {outp} bytes per update");
    assert!(inp < 500, "inp stores {inp} bytes per update");
}

/// Superseded versions are reclaimed (§5.4's deleted-tuple reuse): 4000 updates of 4 KiB rows
/// (16 MiB of new versions) fit a pool of 10 MiB that may not grow.
#[test]
fn superseded_versions_are_reclaimed() {
    let size = 10 << 20;
    let db = Db::create(
        config(EngineKind::Outp, PersistenceDomain::Eadr)
            .max_threads(1)
            .pool_size(size)
            .max_pool_size(size),
    )
    .unwrap();
    let t = db
        .create_table(Schema::new(
            "big",
            &[("pad", ColumnType::Bytes(4000)), ("v", ColumnType::U64)],
        ))
        .unwrap();
    db.run(|tx| {
        (0..2u64).try_for_each(|k| tx.insert(t, k, &[Value::Bytes(&[1; 4000]), Value::U64(0)]))
    })
    .unwrap();
    let mut w = db.worker().unwrap();
    for i in 1..=2000u64 {
        for k in 0..2u64 {
            w.run(|tx| tx.update(t, k, &[(1, Value::U64(i))])).unwrap();
        }
    }
    drop(w);
    assert_eq!(value(&db, t, 0), 2000);
    assert_eq!(value(&db, t, 1), 2000);
    assert_eq!(db.check_structure().unwrap(), vec![2]);
}

/// A transaction that read a version an update has since superseded finds the new version on
/// its next read (following the index), and cannot commit on the stale read (OCC validation).
#[test]
fn a_reader_of_a_superseded_version_follows_the_index_and_then_aborts() {
    let db = Db::create(config(EngineKind::Outp, PersistenceDomain::Adr)).unwrap();
    let t = db
        .create_table(Schema::new("kv", &[("v", ColumnType::U64)]))
        .unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::U64(10)])).unwrap();
    // `Db::run` keeps this thread's worker idle in slot 0: give the slot back to drive it here.
    db.release_idle_workers();
    let mut reader = db.engine().clone().worker(0).unwrap();
    let mut writer = db.engine().clone().worker(1).unwrap();
    let mut row = [0u8; 8];
    reader.begin(false);
    reader.read(t, 1, &mut row).unwrap();
    assert_eq!(u64::from_le_bytes(row), 10);
    writer.begin(false);
    let twenty = 20u64.to_le_bytes();
    writer
        .update(
            t,
            1,
            &[FieldWrite {
                offset: 0,
                bytes: &twenty,
            }],
        )
        .unwrap();
    writer.commit().unwrap();
    reader.read(t, 1, &mut row).unwrap();
    assert_eq!(u64::from_le_bytes(row), 20, "the new version, not NotFound");
    assert_eq!(reader.commit(), Err(TxError::Conflict));
    // A blind update by a transaction that located the old version before it was superseded
    // is a conflict (retried), not a write into the dead version.
    reader.begin(false);
    reader.read(t, 1, &mut row).unwrap();
    writer.begin(false);
    let thirty = 30u64.to_le_bytes();
    writer
        .update(
            t,
            1,
            &[FieldWrite {
                offset: 0,
                bytes: &thirty,
            }],
        )
        .unwrap();
    writer.commit().unwrap();
    let forty = 40u64.to_le_bytes();
    reader
        .update(
            t,
            1,
            &[FieldWrite {
                offset: 0,
                bytes: &forty,
            }],
        )
        .unwrap();
    assert_eq!(reader.commit(), Err(TxError::Conflict));
    drop((reader, writer));
    assert_eq!(value_u64(&db, t), 30);
    assert_eq!(db.check_structure().unwrap(), vec![1]);
}

fn value_u64(db: &Db, t: u32) -> u64 {
    db.run(|tx| tx.get(t, 1).map(|r| r.u64(0))).unwrap()
}

/// Secondary indexes follow the new version: after an update of the indexed column the row is
/// found by its new value only, and after an update of another column it is still found.
#[test]
fn secondary_indexes_follow_the_new_version() {
    let db = Db::create(config(EngineKind::Outp, PersistenceDomain::Adr)).unwrap();
    let t = db
        .create_table(
            Schema::new(
                "people",
                &[("owner", ColumnType::U64), ("n", ColumnType::U64)],
            )
            .with_secondary("by_owner", &["owner"]),
        )
        .unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::U64(5), Value::U64(0)]))
        .unwrap();
    db.run(|tx| tx.update(t, 1, &[(0, Value::U64(7))])).unwrap();
    db.run(|tx| tx.update(t, 1, &[(1, Value::U64(9))])).unwrap();
    let by = |owner: u64| {
        db.run(|tx| tx.lookup_secondary(t, 0, &[Value::U64(owner)]))
            .unwrap()
    };
    assert_eq!(by(7), vec![1]);
    assert!(by(5).is_empty(), "{:?}", by(5));
    assert_eq!(db.check_structure().unwrap(), vec![1]);
}

/// Concurrent transfers under a lock-based protocol (2PL no-wait: locks taken during execution,
/// on versions other threads supersede) and OCC: the total is preserved and the structure is
/// sound.
#[test]
fn concurrent_transfers_keep_the_total_under_2pl_and_occ() {
    for protocol in [Protocol::NoWait, Protocol::Occ] {
        let db = Db::create(config(EngineKind::Outp, PersistenceDomain::Adr).protocol(protocol))
            .unwrap();
        common::concurrent_transfers(&db, 8, 2000, protocol.name());
    }
}

/// An outp pool reopens with its values, by outp and by falcon (one layout, Falcon's).
#[test]
fn values_survive_reopens_by_outp_and_falcon() {
    let dir = common::pool_dir();
    let path = dir.path().join("outp.pool");
    let t;
    {
        let db = Db::create(config(EngineKind::Outp, PersistenceDomain::Adr).path(&path)).unwrap();
        t = db.create_table(kv()).unwrap();
        db.run(|tx| {
            (0..50u64).try_for_each(|k| tx.insert(t, k, &[Value::Bytes(&[1; 1000]), Value::U64(k)]))
        })
        .unwrap();
        for round in 1..=3u64 {
            db.run(|tx| {
                (0..50u64).try_for_each(|k| tx.update(t, k, &[(1, Value::U64(k * 10 + round))]))
            })
            .unwrap();
        }
        db.run(|tx| tx.delete(t, 0)).unwrap();
    }
    let mut expected: fn(u64) -> u64 = |k| k * 10 + 3;
    for (i, engine) in [EngineKind::Outp, EngineKind::Falcon]
        .into_iter()
        .enumerate()
    {
        let db = Db::open(config(engine, PersistenceDomain::Adr).path(&path)).unwrap();
        assert_eq!(db.check_structure().unwrap(), vec![49], "{engine}");
        for k in 1..50u64 {
            assert_eq!(value(&db, t, k), expected(k), "{engine} key {k}");
        }
        // A write after the reopen, seen by the next one.
        db.run(|tx| tx.update(t, 7, &[(1, Value::U64(1000 + i as u64))]))
            .unwrap();
        expected = if i == 0 {
            |k| if k == 7 { 1000 } else { k * 10 + 3 }
        } else {
            expected
        };
    }
}
