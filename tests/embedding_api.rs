//! The embedding API of issue 21: explicit transactions, application errors, worker slots that
//! wait, the per-thread cached worker of `Db::run`, and the catalog (list, drop, columns by name,
//! checked getters), on every engine.

use common::value;
use pmtx::prelude::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod common;

fn kv() -> Schema {
    Schema::new("kv", &[("v", ColumnType::U64)])
}

/// A small temporary database of every engine, with the engine's default protocol.
fn every_engine() -> impl Iterator<Item = DbConfig> {
    EngineKind::ALL.into_iter().map(|engine| {
        DbConfig::temporary()
            .engine(engine)
            .protocol(engine.default_protocol())
            .pool_size(24 << 20)
            .max_threads(2)
    })
}

/// Per engine: a database whose table "kv" holds row 1 with `v`.
fn every_engine_with_row_1(v: u64) -> impl Iterator<Item = (EngineKind, Db, TableId)> {
    every_engine().map(move |cfg| {
        let engine = cfg.engine;
        let db = Db::create(cfg).unwrap();
        let t = db.create_table(kv()).unwrap();
        db.run(|tx| tx.insert(t, 1, &[Value::U64(v)])).unwrap();
        (engine, db, t)
    })
}

/// A small temporary database whose threads wait up to `wait` for one of `slots` worker slots.
fn waiting_db(slots: usize, wait: Duration) -> Db {
    let cfg = DbConfig::temporary().pool_size(24 << 20);
    Db::create(cfg.max_threads(slots).worker_wait(wait)).unwrap()
}

#[test]
fn explicit_transactions_commit_roll_back_and_roll_back_on_drop_on_every_engine() {
    for cfg in every_engine() {
        let engine = cfg.engine;
        let db = Db::create(cfg).unwrap();
        let t = db.create_table(kv()).unwrap();

        let mut txn = db.begin().unwrap();
        txn.insert(t, 1, &[Value::U64(10)]).unwrap();
        txn.insert(t, 2, &[Value::U64(20)]).unwrap();
        assert_eq!(txn.get(t, 1).unwrap().u64(0), 10, "{engine}: own write");
        txn.commit().unwrap();
        assert_eq!(value(&db, t, 1), Some(10), "{engine}");

        let mut txn = db.begin().unwrap();
        txn.update(t, 1, &[(0, Value::U64(11))]).unwrap();
        txn.insert(t, 3, &[Value::U64(30)]).unwrap();
        txn.rollback();
        assert_eq!(value(&db, t, 1), Some(10), "{engine}: rolled back");
        assert_eq!(value(&db, t, 3), None, "{engine}: rolled back");

        {
            let mut txn = db.begin().unwrap();
            txn.delete(t, 2).unwrap();
        } // dropped: rolled back
        assert_eq!(
            value(&db, t, 2),
            Some(20),
            "{engine}: dropped = rolled back"
        );

        // On a worker the application holds, alternating with closures.
        let mut w = db.worker().unwrap();
        let mut txn = w.begin();
        txn.update(t, 2, &[(0, Value::U64(21))]).unwrap();
        txn.commit().unwrap();
        let mut txn = w.begin_read_only();
        assert_eq!(txn.get(t, 2).unwrap().u64(0), 21, "{engine}");
        assert_eq!(
            txn.insert(t, 9, &[Value::U64(9)]),
            Err(TxError::ReadOnly),
            "{engine}"
        );
        drop(txn);
        assert_eq!(w.run(|tx| Ok(tx.get(t, 2)?.u64(0))).unwrap(), 21);
        drop(w);
        // A failed operation that leaves the transaction open (a duplicate key) does not end it.
        let mut txn = db.begin().unwrap();
        assert!(matches!(
            txn.insert(t, 1, &[Value::U64(0)]),
            Err(TxError::DuplicateKey { .. })
        ));
        txn.insert(t, 4, &[Value::U64(40)]).unwrap();
        txn.commit().unwrap();
        assert_eq!(value(&db, t, 4), Some(40), "{engine}");
        assert_eq!(db.check_structure().unwrap(), vec![3], "{engine}");
    }
}

#[test]
fn a_conflict_ends_an_explicit_transaction_and_is_not_retried() {
    let db = Db::create(
        DbConfig::temporary()
            .engine(EngineKind::Falcon)
            .protocol(Protocol::Occ)
            .pool_size(24 << 20)
            .max_threads(2),
    )
    .unwrap();
    let t = db.create_table(kv()).unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::U64(1)])).unwrap();
    let mut mine = db.worker().unwrap();
    let mut theirs = db.worker().unwrap();
    let mut txn = mine.begin();
    let seen = txn.get(t, 1).unwrap().u64(0);
    theirs
        .run(|tx| tx.update(t, 1, &[(0, Value::U64(100))]))
        .unwrap();
    txn.update(t, 1, &[(0, Value::U64(seen + 1))]).unwrap();
    let err = txn.commit().unwrap_err();
    assert_eq!(err.tx_error(), Some(&TxError::Conflict), "{err}");
    assert!(err.tx_error().unwrap().is_retryable());
    drop(theirs);
    assert_eq!(mine.run(|tx| Ok(tx.get(t, 1)?.u64(0))).unwrap(), 100);
}

#[derive(Debug, PartialEq)]
struct Overdrawn {
    balance: u64,
}

impl std::fmt::Display for Overdrawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "balance {} is too low", self.balance)
    }
}

impl std::error::Error for Overdrawn {}

#[test]
fn an_application_error_aborts_once_and_comes_back_typed_on_every_engine() {
    for (engine, db, t) in every_engine_with_row_1(5) {
        let attempts = AtomicU32::new(0);
        let err = db
            .run(|tx| {
                attempts.fetch_add(1, Ordering::Relaxed);
                tx.insert(t, 2, &[Value::U64(1)])?;
                let balance = tx.get(t, 1)?.u64(0);
                if balance < 10 {
                    return tx.abort_with(Overdrawn { balance });
                }
                Ok(())
            })
            .unwrap_err();
        assert_eq!(attempts.load(Ordering::Relaxed), 1, "{engine}: not retried");
        assert_eq!(
            err.app_error::<Overdrawn>(),
            Some(&Overdrawn { balance: 5 }),
            "{engine}: {err}"
        );
        assert_eq!(err.app_error::<std::fmt::Error>(), None);
        assert_eq!(
            err.to_string(),
            "transaction aborted by the application: balance 5 is too low"
        );
        assert_eq!(value(&db, t, 2), None, "{engine}: the insert was discarded");
        // The same through `Err(TxError::app(..))` and on an explicit transaction.
        let err = db
            .run(|_| Err::<(), _>(TxError::app(Overdrawn { balance: 1 })))
            .unwrap_err();
        assert_eq!(err.app_error(), Some(&Overdrawn { balance: 1 }));
    }
}

#[test]
fn a_thread_waits_for_a_worker_slot_and_gets_one_when_it_is_freed() {
    let db = waiting_db(1, Duration::from_secs(20));
    let t = db.create_table(kv()).unwrap();
    let held = db.worker().unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            db.run(|tx| tx.insert(t, 1, &[Value::U64(1)])).unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !waiter.is_finished(),
            "the second thread must wait for the slot"
        );
        drop(held);
        let waited = waiter.join().unwrap();
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
    });
    assert_eq!(value(&db, t, 1), Some(1));
}

#[test]
fn the_wait_for_a_slot_is_bounded_by_worker_wait() {
    let db = waiting_db(1, Duration::from_millis(100));
    let _held = db.worker().unwrap();
    let start = Instant::now();
    let err = std::thread::scope(|s| s.spawn(|| db.worker().err()).join().unwrap()).unwrap();
    assert!(matches!(err, DbError::NoWorkerSlot(1)), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(err.to_string().contains("worker_wait"), "{err}");
}

#[test]
fn db_run_keeps_its_worker_and_lends_it_to_a_thread_that_finds_no_free_slot() {
    let db = waiting_db(2, Duration::ZERO);
    let t = db.create_table(kv()).unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::U64(1)])).unwrap();
    // This thread's worker stays idle in its slot: two explicit workers still fit (the second
    // takes the idle one over, without waiting).
    let a = db.worker().unwrap();
    let b = db.worker().unwrap();
    assert_ne!(a.slot(), b.slot());
    assert!(matches!(db.worker(), Err(DbError::NoWorkerSlot(2))));
    drop((a, b));
    // 8 threads on 2 slots, each with many `Db::run`s, waiting for slots: all commit.
    let db = waiting_db(2, Duration::from_secs(20));
    let t2 = db.create_table(kv()).unwrap();
    std::thread::scope(|s| {
        for i in 0..8u64 {
            let db = &db;
            s.spawn(move || {
                for j in 0..50 {
                    db.run(|tx| tx.insert(t2, i * 100 + j, &[Value::U64(j)]))
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(db.check_structure().unwrap(), vec![400]);
}

/// One column of each type.
const ACCOUNT_COLUMNS: [(&str, ColumnType); 4] = [
    ("owner", ColumnType::Bytes(8)),
    ("balance", ColumnType::I64),
    ("visits", ColumnType::U64),
    ("rate", ColumnType::F64),
];

fn accounts() -> Schema {
    Schema::new("accounts", &ACCOUNT_COLUMNS)
}

#[test]
fn tables_are_listed_in_creation_order_with_their_ids() {
    let db = Db::create(DbConfig::temporary().pool_size(24 << 20).max_threads(1)).unwrap();
    assert!(db.tables().is_empty());
    let a = db.create_table(accounts()).unwrap();
    let k = db.create_table(kv()).unwrap();
    let listed: Vec<(TableId, String)> = db
        .tables()
        .into_iter()
        .map(|(id, schema)| (id, schema.name))
        .collect();
    assert_eq!(listed, vec![(a, "accounts".into()), (k, "kv".into())]);
}

#[test]
fn columns_by_name_and_checked_getters_return_errors_instead_of_panicking() {
    let db = Db::create(DbConfig::temporary().pool_size(24 << 20).max_threads(1)).unwrap();
    let t = db.create_table(accounts()).unwrap();
    db.run(|tx| {
        tx.insert(
            t,
            1,
            &[
                Value::Bytes(b"ada"),
                Value::I64(-5),
                Value::U64(3),
                Value::F64(0.5),
            ],
        )
    })
    .unwrap();
    let balance = db.column(t, "balance").unwrap();
    assert_eq!(balance, 1);
    assert!(db
        .column(t, "nope")
        .unwrap_err()
        .to_string()
        .contains("no column 'nope'"));
    let row = db.run(|tx| tx.get(t, 1)).unwrap();
    assert_eq!(row.get_i64("balance"), Ok(-5));
    assert_eq!(row.get_u64("visits"), Ok(3));
    assert_eq!(row.get_f64("rate"), Ok(0.5));
    assert_eq!(row.get_bytes("owner"), Ok(&b"ada\0\0\0\0\0"[..]));
    assert_eq!(row.i64(balance), -5);
    // Wrong type, wrong name, out of range: errors that say what is wrong.
    let wrong_type = row.get_u64("balance").unwrap_err();
    assert!(
        wrong_type.to_string().contains("'balance'") && wrong_type.to_string().contains("I64"),
        "{wrong_type}"
    );
    assert!(matches!(
        row.get_u64("owner"),
        Err(TxError::SchemaMismatch(_))
    ));
    let missing = row.get_i64("balanse").unwrap_err().to_string();
    assert!(
        missing.contains("owner, balance, visits, rate"),
        "{missing}"
    );
    assert!(row
        .try_u64(9)
        .unwrap_err()
        .to_string()
        .contains("4 columns"));
    assert!(row.try_bytes_at(4).is_err());
    assert_eq!(row.try_bytes_at(2), Ok(&3u64.to_le_bytes()[..]));
    // The same on a borrowed row, inside a transaction, with `?`.
    let (visits, err) = db
        .run(|tx| {
            let r = tx.get_ref(t, 1)?;
            Ok((r.get_u64("visits")?, r.try_f64(0).unwrap_err()))
        })
        .unwrap();
    assert_eq!(visits, 3);
    assert!(err.to_string().contains("Bytes(8)"), "{err}");
    // An application that misreads a column gets the error out of `run`, no panic.
    let err = db.run(|tx| tx.get(t, 1)?.get_f64("balance")).unwrap_err();
    assert!(
        matches!(err.tx_error(), Some(TxError::SchemaMismatch(_))),
        "{err}"
    );
}

#[test]
fn read_only_transactions_under_snapshot_protocols_read_a_snapshot_and_never_block_writers() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        for protocol in [Protocol::Si, Protocol::Mvocc, Protocol::Mv2pl] {
            if !engine.supports(protocol) {
                continue;
            }
            let db = Db::create(
                DbConfig::temporary()
                    .engine(engine)
                    .protocol(protocol)
                    .pool_size(24 << 20)
                    .max_threads(2),
            )
            .unwrap();
            let t = db.create_table(kv().ordered()).unwrap();
            db.run(|tx| {
                for k in [1, 2, 4] {
                    tx.insert(t, k, &[Value::U64(k * 10)])?;
                }
                Ok(())
            })
            .unwrap();
            let keys = |txn: &mut Transaction<'_>| -> Vec<u64> {
                txn.range(t, ..)
                    .map(|r| r.map(|(k, _)| k))
                    .collect::<Result<_, _>>()
                    .unwrap()
            };
            let mut reader = db.begin_read_only().unwrap();
            assert_eq!(reader.get(t, 1).unwrap().u64(0), 10);
            assert_eq!(keys(&mut reader), [1, 2, 4]);
            let mut writer = db.worker().unwrap();
            writer
                .run(|tx| {
                    tx.update(t, 1, &[(0, Value::U64(11))])?;
                    tx.insert(t, 3, &[Value::U64(30)])
                })
                .unwrap_or_else(|e| {
                    panic!("{engine}/{protocol:?}: a snapshot reader blocked a writer: {e}")
                });
            drop(writer);
            assert_eq!(
                reader.get(t, 1).unwrap().u64(0),
                10,
                "{engine}/{protocol:?}: the snapshot keeps the old row"
            );
            assert_eq!(
                keys(&mut reader),
                [1, 2, 4],
                "{engine}/{protocol:?}: nor the new key"
            );
            reader
                .commit()
                .unwrap_or_else(|e| panic!("{engine}/{protocol:?}: snapshot reader aborted: {e}"));
            assert_eq!(value(&db, t, 1), Some(11));
        }
    }
}
