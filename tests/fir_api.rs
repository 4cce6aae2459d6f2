//! FIR (issue 14) through the `Db` API: MVTO's versions (an older transaction reads the version of
//! its time), deletes and re-inserts across clean reopens (tombstones), aborted transactions
//! leaving no hole in a region, refused configurations and a damaged LCTT.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind, FieldWrite, TxError};
use pmtx::pmem::PersistenceDomain;

mod common;

fn config(domain: PersistenceDomain) -> DbConfig {
    DbConfig::temporary()
        .engine(EngineKind::Fir)
        .protocol(Protocol::Mvto)
        .domain(domain)
        .pool_size(32 << 20)
        .max_threads(4)
}

#[test]
fn only_mvto_is_accepted() {
    for protocol in Protocol::ALL {
        let r = Db::create(config(PersistenceDomain::Eadr).protocol(protocol));
        if protocol == Protocol::Mvto {
            assert!(r.is_ok());
        } else {
            assert!(
                matches!(
                    r,
                    Err(DbError::UnsupportedProtocol {
                        engine: EngineKind::Fir,
                        ..
                    })
                ),
                "{protocol}"
            );
        }
    }
    assert_eq!(EngineKind::Fir.default_protocol(), Protocol::Mvto);
}

/// MVTO (§4.2.1): a transaction that began before a committed update still reads the old
/// version through the chain of tuple headers, and cannot then overwrite the newer version.
#[test]
fn an_older_transaction_reads_the_version_of_its_time() {
    let db = Db::create(config(PersistenceDomain::Adr)).unwrap();
    let t = db
        .create_table(Schema::new("kv", &[("v", ColumnType::U64)]))
        .unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::U64(10)])).unwrap();
    let mut old = db.engine().clone().worker(0).unwrap();
    let mut new = db.engine().clone().worker(1).unwrap();
    let mut row = [0u8; 8];
    old.begin(false);
    new.begin(false);
    let twenty = 20u64.to_le_bytes();
    new.update(
        t,
        1,
        &[FieldWrite {
            offset: 0,
            bytes: &twenty,
        }],
    )
    .unwrap();
    new.commit().unwrap();
    old.read(t, 1, &mut row).unwrap();
    assert_eq!(
        u64::from_le_bytes(row),
        10,
        "the version older than the update"
    );
    let thirty = 30u64.to_le_bytes();
    assert_eq!(
        old.update(
            t,
            1,
            &[FieldWrite {
                offset: 0,
                bytes: &thirty
            }]
        ),
        Err(TxError::Conflict),
        "a write below a newer version aborts"
    );
    old.abort();
    new.begin(false);
    new.read(t, 1, &mut row).unwrap();
    assert_eq!(u64::from_le_bytes(row), 20);
    new.commit().unwrap();
    drop((old, new));
    assert_eq!(db.check_structure().unwrap(), vec![1]);
}

#[test]
fn deleted_rows_stay_deleted_across_reopens_and_aborts_leave_no_hole() {
    let dir = common::pool_dir();
    let path = dir.path().join("fir.pool");
    let cfg = config(PersistenceDomain::Adr).path(&path);
    let t;
    {
        let db = Db::create(cfg.clone()).unwrap();
        t = db
            .create_table(Schema::new("kv", &[("v", ColumnType::U64)]).ordered())
            .unwrap();
        for round in 0..10u64 {
            db.run(|tx| (0..100u64).try_for_each(|k| tx.insert(t, k, &[Value::U64(round)])))
                .unwrap();
            // An aborted transaction's slots are given back (§4.2.1): the next one reuses them.
            let aborted = db.run(|tx| {
                tx.update(t, 5, &[(0, Value::U64(1000))])?;
                tx.insert(t, 1000 + round, &[Value::U64(1)])?;
                Err::<(), _>(TxError::UserAbort)
            });
            assert!(aborted.is_err());
            db.run(|tx| (0..100u64).try_for_each(|k| tx.delete(t, k)))
                .unwrap();
        }
        db.run(|tx| (0..50u64).try_for_each(|k| tx.insert(t, k, &[Value::U64(99)])))
            .unwrap();
        db.run(|tx| (0..50u64).step_by(2).try_for_each(|k| tx.delete(t, k)))
            .unwrap();
        assert_eq!(db.check_structure().unwrap(), vec![25]);
    }
    for reopen in 0..2u64 {
        let db = Db::open(cfg.clone()).unwrap();
        let report = db.recovery_report().unwrap();
        assert!(report.phases.iter().any(|(p, _)| p.contains("undo/redo")));
        assert_eq!(report.rows, 25 + reopen);
        let rows = db.run(|tx| tx.scan(t, 0, usize::MAX)).unwrap();
        let keys: Vec<u64> = rows.iter().map(|(k, _)| *k).collect();
        let mut expected: Vec<u64> = (1..50).step_by(2).collect();
        if reopen == 1 {
            expected.push(500);
        }
        assert_eq!(keys, expected);
        assert!(rows.iter().take(25).all(|(_, r)| r.u64(0) == 99));
        assert_eq!(db.check_structure().unwrap(), vec![25 + reopen]);
        // The clock restarts above every txnId: new inserts of deleted keys commit and outrank
        // the tombstones at the next recovery.
        if reopen == 0 {
            db.run(|tx| tx.insert(t, 500, &[Value::U64(7)])).unwrap();
            db.run(|tx| tx.insert(t, 0, &[Value::U64(7)])).unwrap();
            db.run(|tx| tx.delete(t, 0)).unwrap();
        }
    }
}

#[test]
fn a_damaged_lctt_is_refused() {
    let dir = common::pool_dir();
    let path = dir.path().join("fir.pool");
    let cfg = config(PersistenceDomain::Eadr).path(&path);
    {
        let db = Db::create(cfg.clone()).unwrap();
        let t = db
            .create_table(Schema::new("kv", &[("v", ColumnType::U64)]))
            .unwrap();
        db.run(|tx| tx.insert(t, 1, &[Value::U64(1)])).unwrap();
        let pool = db.engine().pool().unwrap().clone();
        // Thread slot 0's LCTT word (meta page + 1 MiB): a value no txnId can have.
        pool.write_u64(
            pool.root() + pmtx::engine::fir::layout::meta::LCTT_AT,
            u64::MAX >> 1,
        );
        pool.persist(pool.root() + pmtx::engine::fir::layout::meta::LCTT_AT, 8);
    }
    match Db::open(cfg) {
        Err(DbError::Corrupt(m)) => assert!(m.contains("LCTT"), "{m}"),
        Err(e) => panic!("expected a corrupt-database error, got {e}"),
        Ok(_) => panic!("a damaged LCTT was accepted"),
    }
}
