//! The public transaction API on the Falcon engine: every operation, every typed error, recovery
//! after a clean shutdown, and each engine variant × protocol.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind, TxError};
use pmtx::pmem::PersistenceDomain;

mod common;

fn accounts() -> Schema {
    Schema::new(
        "accounts",
        &[
            ("owner", ColumnType::Bytes(16)),
            ("balance", ColumnType::I64),
            ("n", ColumnType::U64),
        ],
    )
    .ordered()
    .with_secondary("by_owner", &["owner"])
}

fn config(engine: EngineKind, protocol: Protocol, domain: PersistenceDomain) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .protocol(protocol)
        .domain(domain)
        .pool_size(20 << 20)
        .max_threads(4)
}

fn all_configs() -> Vec<DbConfig> {
    let mut out = Vec::new();
    for protocol in Protocol::ALL {
        for engine in EngineKind::ALL {
            for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
                if engine == EngineKind::FalconNoflush && domain == PersistenceDomain::Adr {
                    continue;
                }
                if engine == EngineKind::Volatile && domain == PersistenceDomain::Adr {
                    continue;
                }
                if !engine.supports(protocol) {
                    continue;
                }
                out.push(config(engine, protocol, domain));
            }
        }
    }
    out
}

#[test]
fn crud_scan_and_secondary_on_every_engine_and_protocol() {
    for cfg in all_configs() {
        let label = format!("{} {} {:?}", cfg.engine, cfg.protocol, cfg.domain);
        let db = Db::create(cfg).unwrap();
        let t = db.create_table(accounts()).unwrap();
        assert_eq!(db.table("accounts"), Some(t));
        db.run(|tx| {
            for k in 1..=20u64 {
                let owner = format!("owner{}", k % 3);
                tx.insert(
                    t,
                    k,
                    &[
                        Value::Bytes(owner.as_bytes()),
                        Value::I64(100),
                        Value::U64(k),
                    ],
                )?;
            }
            Ok(())
        })
        .unwrap();
        let row = db.run(|tx| tx.get(t, 7)).unwrap();
        assert_eq!((row.i64(1), row.u64(2)), (100, 7), "{label}");
        assert_eq!(&row.bytes_at(0)[..6], b"owner1", "{label}");
        db.run(|tx| {
            let b = tx.get(t, 7)?.i64(1);
            tx.update(t, 7, &[(1, Value::I64(b - 30))])?;
            tx.update(t, 8, &[(1, Value::I64(130))])?;
            // Read your own writes.
            assert_eq!(tx.get(t, 7)?.i64(1), 70);
            tx.delete(t, 9)?;
            assert!(matches!(tx.get(t, 9), Err(TxError::NotFound { .. })));
            Ok(())
        })
        .unwrap();
        let (b7, b8, gone) = db
            .run(|tx| Ok((tx.get(t, 7)?.i64(1), tx.get(t, 8)?.i64(1), tx.exists(t, 9)?)))
            .unwrap();
        assert_eq!((b7, b8, gone), (70, 130, false), "{label}");
        let scanned = db.run(|tx| tx.scan(t, 5, 4)).unwrap();
        assert_eq!(
            scanned.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec![5, 6, 7, 8],
            "{label}"
        );
        let rev = db.run(|tx| tx.scan_rev(t, 10, 3)).unwrap();
        assert_eq!(
            rev.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec![10, 8, 7],
            "{label}: 9 was deleted"
        );
        // The borrowed-view scan sees what `scan` does, and stops when the visitor declines.
        let mut seen = Vec::new();
        db.run(|tx| {
            seen.clear();
            tx.scan_refs(t, 5, false, 10, &mut |k, row| {
                seen.push((k, row.u64(2), row.i64(1)));
                k < 8
            })
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![(5, 5, 100), (6, 6, 100), (7, 7, 70), (8, 8, 130)],
            "{label}"
        );
        let mut rev_refs = Vec::new();
        db.run(|tx| {
            rev_refs.clear();
            tx.scan_refs(t, 10, true, 3, &mut |k, row| {
                rev_refs.push((k, row.u64(2)));
                true
            })
        })
        .unwrap();
        assert_eq!(rev_refs, vec![(10, 10), (8, 8), (7, 7)], "{label}");
        let mut by_owner = db
            .run(|tx| tx.lookup_secondary(t, 0, &[Value::Bytes(b"owner0")]))
            .unwrap();
        by_owner.sort();
        assert_eq!(by_owner, vec![3, 6, 12, 15, 18], "{label}: 9 was deleted");
        db.run(|tx| tx.update(t, 3, &[(0, Value::Bytes(b"renamed"))]))
            .unwrap();
        let moved = db
            .run(|tx| tx.lookup_secondary(t, 0, &[Value::Bytes(b"renamed")]))
            .unwrap();
        assert_eq!(moved, vec![3], "{label}");
        // Reinsert a deleted key.
        db.run(|tx| tx.insert(t, 9, &[Value::Bytes(b"back"), Value::I64(1), Value::U64(9)]))
            .unwrap();
        assert_eq!(db.check_structure().unwrap(), vec![20], "{label}");
    }
}

#[test]
fn every_typed_error() {
    let db = Db::create(config(
        EngineKind::Falcon,
        Protocol::Occ,
        PersistenceDomain::Eadr,
    ))
    .unwrap();
    let t = db.create_table(accounts()).unwrap();
    let hashed = db
        .create_table(Schema::new("h", &[("v", ColumnType::U64)]))
        .unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::Bytes(b"a"), Value::I64(1), Value::U64(1)]))
        .unwrap();
    let err = |r: Result<(), DbError>| match r {
        Err(DbError::Tx(e)) => e,
        other => panic!("expected a transaction error, got {other:?}"),
    };
    assert!(matches!(
        err(db.run(|tx| tx.get(t, 99).map(|_| ()))),
        TxError::NotFound { key: 99, .. }
    ));
    assert!(matches!(
        err(db.run(|tx| tx.update(t, 99, &[(1, Value::I64(0))]))),
        TxError::NotFound { .. }
    ));
    assert!(matches!(
        err(db.run(|tx| tx.delete(t, 99))),
        TxError::NotFound { .. }
    ));
    assert!(matches!(
        err(db.run(|tx| tx.insert(t, 1, &[Value::Bytes(b"a"), Value::I64(1), Value::U64(1)]))),
        TxError::DuplicateKey { key: 1, .. }
    ));
    assert!(matches!(
        err(db.run(|tx| tx.insert(
            t,
            2,
            &[Value::Bytes(&[0u8; 17]), Value::I64(1), Value::U64(1)]
        ))),
        TxError::RowTooLarge(_)
    ));
    assert!(matches!(
        err(db.run(|tx| tx.insert(t, 2, &[Value::I64(1)]))),
        TxError::SchemaMismatch(_)
    ));
    assert!(matches!(
        err(db.run(|tx| tx.update(t, 1, &[(1, Value::U64(5))]))),
        TxError::SchemaMismatch(_)
    ));
    assert!(matches!(
        err(db.run(|tx| tx.get(77, 1).map(|_| ()))),
        TxError::SchemaMismatch(_)
    ));
    assert!(matches!(
        err(db.run(|tx| tx.scan(hashed, 0, 10).map(|_| ()))),
        TxError::Unsupported(_)
    ));
    assert!(matches!(
        err(db.run(|tx| tx.abort::<()>())),
        TxError::UserAbort
    ));
    let mut w = db.worker().unwrap();
    assert!(matches!(
        w.run_read_only(|tx| tx.update(t, 1, &[(1, Value::I64(0))])),
        Err(DbError::Tx(TxError::ReadOnly))
    ));
    drop(w);
    // A user abort leaves nothing behind.
    let _ = db.run(|tx| {
        tx.update(t, 1, &[(1, Value::I64(-5))])?;
        tx.abort::<()>()
    });
    assert_eq!(db.run(|tx| Ok(tx.get(t, 1)?.i64(1))).unwrap(), 1);
    // Oversized schema and duplicate table.
    let big = Schema::new("big", &[("b", ColumnType::Bytes(5000))]);
    assert!(matches!(db.create_table(big), Err(DbError::Catalog(_))));
    assert!(matches!(
        db.create_table(accounts()),
        Err(DbError::Catalog(_))
    ));
    // Out of worker slots.
    let held: Vec<_> = (0..4).map(|_| db.worker().unwrap()).collect();
    assert!(matches!(db.worker(), Err(DbError::NoWorkerSlot(4))));
    drop(held);
    assert!(db.worker().is_ok());
}

#[test]
fn pm_exhaustion_fails_the_transaction_cleanly_and_the_database_stays_usable() {
    let db = Db::create(
        config(EngineKind::Falcon, Protocol::Occ, PersistenceDomain::Adr)
            .pool_size(8 << 20)
            .max_threads(1),
    )
    .unwrap();
    let t = db
        .create_table(Schema::new("blob", &[("b", ColumnType::Bytes(2000))]))
        .unwrap();
    let mut inserted = 0u64;
    let err = loop {
        match db.run(|tx| tx.insert(t, inserted, &[Value::Bytes(&[7u8; 2000])])) {
            Ok(()) => inserted += 1,
            Err(e) => break e,
        }
        assert!(inserted < 100_000, "the pool never filled");
    };
    assert!(matches!(err, DbError::Tx(TxError::PmFull(_))), "{err}");
    // Still usable: reads, updates and deletes work; a delete frees room for an insert.
    db.run(|tx| tx.update(t, 0, &[(0, Value::Bytes(b"still here"))]))
        .unwrap();
    db.run(|tx| tx.delete(t, 1)).unwrap();
    db.run(|tx| tx.insert(t, 1_000_000, &[Value::Bytes(b"fits again")]))
        .unwrap();
    assert_eq!(db.check_structure().unwrap(), vec![inserted]);
}

#[test]
fn a_clean_reopen_recovers_everything_on_every_durable_variant() {
    let dir = tempfile::tempdir().unwrap();
    for (i, cfg) in all_configs()
        .into_iter()
        .filter(|c| c.engine != EngineKind::Volatile)
        .enumerate()
    {
        let path = dir.path().join(format!("db{i}.pool"));
        let cfg = cfg.path(&path);
        let label = format!("{} {} {:?}", cfg.engine, cfg.protocol, cfg.domain);
        let last_tid_before;
        {
            let db = Db::create(cfg.clone()).unwrap();
            let t = db.create_table(accounts()).unwrap();
            for k in 0..50u64 {
                db.run(|tx| {
                    tx.insert(
                        t,
                        k,
                        &[Value::Bytes(b"x"), Value::I64(k as i64), Value::U64(k)],
                    )
                })
                .unwrap();
            }
            for k in 0..50u64 {
                db.run(|tx| tx.update(t, k, &[(1, Value::I64(k as i64 * 10))]))
                    .unwrap();
            }
            for k in 40..50u64 {
                db.run(|tx| tx.delete(t, k)).unwrap();
            }
            let mut w = db.worker().unwrap();
            let update = |tx: &mut pmtx::db::Tx<'_>| tx.update(t, 0, &[(2, Value::U64(1))]);
            last_tid_before = w.run_counted(false, update).unwrap().tid;
        }
        let db = Db::open(cfg).unwrap();
        let report = db.recovery_report().expect("open recovers");
        assert_eq!(report.rows, 40, "{label}");
        let t = db.table("accounts").unwrap();
        for k in 0..40u64 {
            assert_eq!(
                db.run(|tx| Ok(tx.get(t, k)?.i64(1))).unwrap(),
                k as i64 * 10,
                "{label} key {k}"
            );
        }
        assert!(!db.run(|tx| tx.exists(t, 45)).unwrap());
        assert_eq!(
            db.run(|tx| tx.lookup_secondary(t, 0, &[Value::Bytes(b"x")]))
                .unwrap()
                .len(),
            40
        );
        // New transactions get larger tids than any before the restart (Falcon §5.2.1 footnote).
        let mut w = db.worker().unwrap();
        let row = [Value::Bytes(b"new"), Value::I64(0), Value::U64(0)];
        let tid = w
            .run_counted(false, |tx| tx.insert(t, 100, &row))
            .unwrap()
            .tid;
        assert!(
            tid > last_tid_before,
            "{label}: tid {tid} after restart <= {last_tid_before}"
        );
        drop(w);
        assert_eq!(db.check_structure().unwrap(), vec![41], "{label}");
    }
}

#[test]
fn opening_with_a_wrong_configuration_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pool");
    assert!(matches!(
        Db::open(DbConfig::temporary().path(&path)),
        Err(DbError::Pool(_))
    ));
    assert!(matches!(
        Db::open(DbConfig::temporary()),
        Err(DbError::Config(_))
    ));
    let noflush_adr = config(
        EngineKind::FalconNoflush,
        Protocol::Occ,
        PersistenceDomain::Adr,
    );
    assert!(matches!(Db::create(noflush_adr), Err(DbError::Config(_))));
    let falcon_volatile = config(
        EngineKind::Falcon,
        Protocol::Occ,
        PersistenceDomain::Volatile,
    );
    assert!(matches!(
        Db::create(falcon_volatile),
        Err(DbError::Config(_))
    ));
    let mut one_slot = config(EngineKind::Falcon, Protocol::Occ, PersistenceDomain::Eadr);
    one_slot.window_slots = Some(1);
    assert!(matches!(Db::create(one_slot), Err(DbError::Config(_))));
}

#[test]
fn a_transaction_larger_than_its_window_slot_spills_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        let path = dir.path().join(format!("spill-{domain}.pool"));
        let cfg = config(EngineKind::Falcon, Protocol::Occ, domain).path(&path);
        {
            let db = Db::create(cfg.clone()).unwrap();
            let t = db
                .create_table(Schema::new("wide", &[("b", ColumnType::Bytes(1000))]))
                .unwrap();
            // 40 rows of 1000 bytes: about 41 KB of redo, ten times a 4 KiB slot.
            db.run(|tx| {
                for k in 0..40u64 {
                    tx.insert(t, k, &[Value::Bytes(&[k as u8; 1000])])?;
                }
                Ok(())
            })
            .unwrap();
            db.run(|tx| {
                for k in 0..40u64 {
                    tx.update(t, k, &[(0, Value::Bytes(&[k as u8 + 1; 1000]))])?;
                }
                Ok(())
            })
            .unwrap();
        }
        let db = Db::open(cfg).unwrap();
        let t = db.table("wide").unwrap();
        for k in 0..40u64 {
            assert_eq!(
                db.run(|tx| tx.get(t, k)).unwrap().bytes()[999],
                k as u8 + 1,
                "{domain}"
            );
        }
    }
}

#[test]
fn concurrent_transfers_keep_the_total_under_every_protocol() {
    for protocol in Protocol::ALL {
        let db = Db::create(config(
            EngineKind::Falcon,
            protocol,
            PersistenceDomain::Eadr,
        ))
        .unwrap();
        common::concurrent_transfers(&db, 10, 2000, protocol.name());
    }
}

/// An insert whose key a concurrent transaction inserted after this one checked it is a conflict
/// (retryable), not a duplicate: on retry the transaction re-reads the counter and picks a fresh
/// key. This is TPC-C New-Order's pattern (read the district's next order id, insert that order).
#[test]
fn an_insert_raced_by_a_committed_insert_is_a_conflict_and_the_retry_succeeds() {
    let db = Db::create(config(
        EngineKind::Falcon,
        Protocol::Occ,
        PersistenceDomain::Eadr,
    ))
    .unwrap();
    let counter = db
        .create_table(Schema::new("counter", &[("next", ColumnType::U64)]))
        .unwrap();
    let orders = db
        .create_table(Schema::new("orders", &[("by", ColumnType::U64)]))
        .unwrap();
    db.run(|tx| tx.insert(counter, 0, &[Value::U64(0)]))
        .unwrap();
    let new_order = |tx: &mut pmtx::db::Tx<'_>, by: u64| -> Result<u64, TxError> {
        let id = tx.get(counter, 0)?.u64(0);
        tx.insert(orders, id, &[Value::U64(by)])?;
        tx.update(counter, 0, &[(0, Value::U64(id + 1))])?;
        Ok(id)
    };
    let mut first = db.worker().unwrap();
    let mut second = db.worker().unwrap();
    let mut attempts = 0;
    let outcome = first
        .run_counted(false, |tx| {
            attempts += 1;
            let id = new_order(tx, 1)?;
            if attempts == 1 {
                // Another transaction takes the same order id and commits first.
                assert_eq!(second.run(|tx2| new_order(tx2, 2)).unwrap(), id);
            }
            Ok(id)
        })
        .unwrap();
    assert_eq!(
        outcome.aborts, 1,
        "the raced attempt must abort as a conflict"
    );
    assert_eq!(outcome.value, 1);
    let owners: Vec<u64> = db
        .run(|tx| (0..2u64).map(|k| Ok(tx.get(orders, k)?.u64(0))).collect())
        .unwrap();
    assert_eq!(owners, vec![2, 1]);
}

/// A blind update or delete (of a row the transaction did not read) whose row a concurrent
/// transaction deletes and commits first. Under the protocols that lock only at commit nothing
/// else validates such a write, so the commit must find the row gone (a conflict, then
/// `NotFound` on retry) instead of writing into the dead slot and acknowledging a write to a
/// row that no longer exists.
#[test]
fn a_blind_write_to_a_row_deleted_meanwhile_is_not_acknowledged() {
    let commit_time_locking = [
        Protocol::Occ,
        Protocol::Silo,
        Protocol::Tictoc,
        Protocol::Mvocc,
        Protocol::Si,
    ];
    for config in all_configs()
        .into_iter()
        .filter(|c| commit_time_locking.contains(&c.protocol))
    {
        let label = format!("{} {}", config.engine.name(), config.protocol.name());
        let db = Db::create(config).unwrap();
        let t = db
            .create_table(Schema::new("t", &[("v", ColumnType::U64)]))
            .unwrap();
        db.run(|tx| {
            tx.insert(t, 1, &[Value::U64(10)])?;
            tx.insert(t, 2, &[Value::U64(20)])
        })
        .unwrap();
        let mut first = db.worker().unwrap();
        let mut second = db.worker().unwrap();
        for (key, delete) in [(1u64, false), (2u64, true)] {
            let mut attempts = 0;
            let outcome = first.run_counted(false, |tx| {
                attempts += 1;
                if delete {
                    tx.delete(t, key)?;
                } else {
                    tx.update(t, key, &[(0, Value::U64(99))])?;
                }
                if attempts == 1 {
                    second
                        .run(|tx2| tx2.delete(t, key))
                        .unwrap_or_else(|e| panic!("{label}: the concurrent delete: {e}"));
                }
                Ok(())
            });
            match outcome {
                Err(DbError::Tx(TxError::NotFound { .. })) => {}
                Ok(_) => panic!("{label}: a write to deleted key {key} was acknowledged"),
                Err(e) => panic!("{label}: key {key}: {e}"),
            }
            assert!(!db.run(|tx| tx.exists(t, key)).unwrap(), "{label}");
        }
        db.check_structure()
            .unwrap_or_else(|e| panic!("{label}: {e}"));
    }
}

/// Issue 21, item 6: a database without a pool path is refused unless asked for as temporary,
/// whose scratch pool goes with it; a path makes it persistent.
#[test]
fn a_missing_path_is_an_error_unless_the_database_is_asked_for_as_temporary() {
    let e = Db::create(DbConfig::default().pool_size(16 << 20))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("DbConfig::temporary()"), "{e}");
    let e = Db::open_or_create(DbConfig::default())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("no pool path"), "{e}");
    let db = Db::create(DbConfig::temporary().pool_size(16 << 20).max_threads(2)).unwrap();
    let scratch = db
        .engine()
        .pool()
        .and_then(|p| p.path().map(|p| p.to_path_buf()));
    let scratch = scratch.expect("a scratch pool file");
    assert!(scratch.exists());
    drop(db);
    assert!(!scratch.exists(), "the scratch pool is removed on drop");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kept.pool");
    let db = Db::create(
        DbConfig::temporary()
            .path(&path)
            .pool_size(16 << 20)
            .max_threads(2),
    )
    .unwrap();
    drop(db);
    assert!(path.exists(), "a pool with a path is kept");
}

/// Every durable engine refuses the volatile domain, naming itself and the engine to use.
#[test]
fn durable_engines_refuse_the_volatile_domain() {
    for engine in [
        EngineKind::Falcon,
        EngineKind::Inp,
        EngineKind::Outp,
        EngineKind::Zen,
        EngineKind::Fir,
    ] {
        let config = config(
            engine,
            engine.default_protocol(),
            PersistenceDomain::Volatile,
        );
        match Db::create(config) {
            Err(DbError::Config(m)) => assert!(
                m.contains(engine.name()) && m.contains("volatile engine"),
                "{m}"
            ),
            Err(other) => panic!("{engine:?}: {other}"),
            Ok(_) => panic!("{engine:?} accepted the volatile domain"),
        }
    }
}
