//! Write-behind logging (`wbl`, issue 18) through the `Db` API: the protocols and placements it
//! takes, no log (fewer PM bytes per update than `outp`, which logs each new version), the
//! fences of its ordering, deletes and re-inserts across reopens, its own pool layout, and
//! concurrent commits sharing group commits. Crashes: `crash_suite::wbl_adr`/`wbl_eadr` and the
//! `wbl-*` faults.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind};
use pmtx::index::IndexPlacement;
use pmtx::pmem::PersistenceDomain;

mod common;

fn config(engine: EngineKind) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .protocol(Protocol::Occ)
        .domain(PersistenceDomain::Adr)
        .pool_size(32 << 20)
        .max_threads(4)
}

#[test]
fn only_clock_stamped_protocols_and_dram_indexes_are_accepted() {
    for protocol in Protocol::ALL {
        let r = Db::create(config(EngineKind::Wbl).protocol(protocol));
        let clock_stamped = matches!(
            protocol,
            Protocol::Occ
                | Protocol::NoWait
                | Protocol::WaitDie
                | Protocol::DlDetect
                | Protocol::Hstore
        );
        match r {
            Ok(_) => assert!(clock_stamped, "{protocol} accepted"),
            Err(DbError::UnsupportedProtocol {
                engine: EngineKind::Wbl,
                ..
            }) => assert!(!clock_stamped, "{protocol} refused"),
            Err(other) => panic!("{protocol}: {other}"),
        }
    }
    match Db::create(config(EngineKind::Wbl).index_placement(IndexPlacement::Pm)) {
        Err(DbError::Config(m)) => assert!(m.contains("wbl keeps its indexes in DRAM"), "{m}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("wbl accepted a persistent index"),
    }
}

/// PM bytes stored and fences issued per update of one 8-byte column of a 1008-byte row.
fn per_update(engine: EngineKind) -> (u64, u64) {
    let db = Db::create(config(engine)).unwrap();
    let t = db
        .create_table(Schema::new(
            "kv",
            &[("pad", ColumnType::Bytes(1000)), ("v", ColumnType::U64)],
        ))
        .unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::Bytes(&[3; 1000]), Value::U64(0)]))
        .unwrap();
    let mut w = db.worker().unwrap();
    let before = pmtx::pmem::stats::thread_snapshot();
    for i in 1..=100u64 {
        w.run(|tx| tx.update(t, 1, &[(1, Value::U64(i))])).unwrap();
    }
    let d = pmtx::pmem::stats::thread_snapshot() - before;
    drop(w);
    assert_eq!(db.run(|tx| tx.get(t, 1).map(|r| r.u64(1))).unwrap(), 100);
    assert_eq!(db.check_structure().unwrap(), vec![1]);
    (d.bytes_written / 100, d.fences / 100)
}

/// WBL writes each new version once and no log: fewer bytes than Outp (which also logs it),
/// and at least three fences per writing commit (the versions' commit tids, their data, the
/// group commit of c_p led by this, the only, thread): Zen §4.2 measures WBL's many sfences.
#[test]
fn a_commit_writes_its_versions_once_and_no_log() {
    let (wbl_bytes, wbl_fences) = per_update(EngineKind::Wbl);
    let (outp_bytes, _) = per_update(EngineKind::Outp);
    assert!(wbl_bytes >= 1008, "wbl stores {wbl_bytes} bytes per update");
    assert!(
        wbl_bytes + 900 < outp_bytes,
        "wbl {wbl_bytes} bytes per update, outp {outp_bytes}"
    );
    assert!(wbl_fences >= 3, "wbl issues {wbl_fences} fences per update");
}

/// Deletes (tombstone versions), re-inserts and updates survive reopens; the reopened engine
/// keeps committing; a Falcon-layout engine refuses the pool (its tuple states are WBL's).
#[test]
fn deletes_reinserts_and_updates_survive_reopens() {
    let dir = common::pool_dir();
    let path = dir.path().join("wbl.pool");
    let t;
    {
        let db = Db::create(config(EngineKind::Wbl).path(&path)).unwrap();
        t = db
            .create_table(Schema::new("kv", &[("v", ColumnType::U64)]).ordered())
            .unwrap();
        db.run(|tx| (0..100u64).try_for_each(|k| tx.insert(t, k, &[Value::U64(k)])))
            .unwrap();
        db.run(|tx| (0..100u64).step_by(2).try_for_each(|k| tx.delete(t, k)))
            .unwrap();
        db.run(|tx| {
            (0..20u64)
                .step_by(4)
                .try_for_each(|k| tx.insert(t, k, &[Value::U64(k + 1000)]))
        })
        .unwrap();
        db.run(|tx| {
            (1..100u64)
                .step_by(2)
                .try_for_each(|k| tx.update(t, k, &[(0, Value::U64(k * 3))]))
        })
        .unwrap();
    }
    let expect = |k: u64| -> Option<u64> {
        if k % 2 == 1 {
            Some(k * 3)
        } else if k < 20 && k % 4 == 0 {
            Some(k + 1000)
        } else {
            None
        }
    };
    for round in 0..2 {
        let db = Db::open(config(EngineKind::Wbl).path(&path)).unwrap();
        let rows: Vec<(u64, u64)> = db
            .run(|tx| {
                Ok(tx
                    .scan(t, 0, 1000)?
                    .into_iter()
                    .map(|(k, r)| (k, r.u64(0)))
                    .collect())
            })
            .unwrap();
        let want: Vec<(u64, u64)> = (0..100u64)
            .filter_map(|k| expect(k).map(|v| (k, v)))
            .collect();
        assert_eq!(rows, want, "round {round}");
        assert_eq!(db.check_structure().unwrap(), vec![want.len() as u64]);
        // Rewrite the same values: the next reopen must find them again.
        db.run(|tx| {
            want.iter()
                .try_for_each(|&(k, v)| tx.update(t, k, &[(0, Value::U64(v))]))
        })
        .unwrap();
    }
    // Asked for falcon, the pool's own engine opens it (the default); told to insist, it is
    // refused: a Falcon-layout engine does not know WBL's tuple states.
    let db = Db::open(config(EngineKind::Falcon).path(&path)).unwrap();
    assert_eq!(db.engine().kind(), EngineKind::Wbl);
    drop(db);
    let mut strict = config(EngineKind::Falcon).path(&path);
    strict.engine_from_pool = false;
    match Db::open(strict) {
        Err(DbError::Config(m)) => assert!(m.contains("'wbl'"), "{m}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("falcon opened a wbl pool"),
    }
}

/// Two threads commit transfers at once, so commits wait on each other's group commits (one
/// leads while the other's tid is still open), and read-only transactions wait for what they
/// read to be durable: the total holds and the structure is sound.
#[test]
fn concurrent_transfers_share_group_commits() {
    for protocol in [Protocol::Occ, Protocol::NoWait] {
        let db = Db::create(config(EngineKind::Wbl).protocol(protocol)).unwrap();
        common::concurrent_transfers(&db, 6, 1500, protocol.name());
    }
}
