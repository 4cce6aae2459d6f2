//! The embedding API of issue 21: explicit transactions, application errors, worker slots that
//! wait, the per-thread cached worker of `Db::run`, and the catalog (list, drop, columns by name,
//! checked getters), on every engine.

use pmtx::prelude::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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

fn value(db: &Db, t: TableId, key: u64) -> Option<u64> {
    db.run(|tx| match tx.get(t, key) {
        Ok(row) => Ok(Some(row.u64(0))),
        Err(TxError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })
    .unwrap()
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
        assert_eq!(value(&db, t, 2), Some(20), "{engine}: dropped = rolled back");

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
    for cfg in every_engine() {
        let engine = cfg.engine;
        let db = Db::create(cfg).unwrap();
        let t = db.create_table(kv()).unwrap();
        db.run(|tx| tx.insert(t, 1, &[Value::U64(5)])).unwrap();
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
    let db = Db::create(
        DbConfig::temporary()
            .pool_size(24 << 20)
            .max_threads(1)
            .worker_wait(Duration::from_secs(20)),
    )
    .unwrap();
    let t = db.create_table(kv()).unwrap();
    let held = db.worker().unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            db.run(|tx| tx.insert(t, 1, &[Value::U64(1)])).unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "the second thread must wait for the slot");
        drop(held);
        let waited = waiter.join().unwrap();
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
    });
    assert_eq!(value(&db, t, 1), Some(1));
}

#[test]
fn the_wait_for_a_slot_is_bounded_by_worker_wait() {
    let db = Db::create(
        DbConfig::temporary()
            .pool_size(24 << 20)
            .max_threads(1)
            .worker_wait(Duration::from_millis(100)),
    )
    .unwrap();
    let _held = db.worker().unwrap();
    let start = Instant::now();
    let err = std::thread::scope(|s| s.spawn(|| db.worker().err()).join().unwrap()).unwrap();
    assert!(matches!(err, DbError::NoWorkerSlot(1)), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(err.to_string().contains("worker_wait"), "{err}");
}

#[test]
fn db_run_keeps_its_worker_and_lends_it_to_a_thread_that_finds_no_free_slot() {
    let db = Db::create(
        DbConfig::temporary()
            .pool_size(24 << 20)
            .max_threads(2)
            .worker_wait(Duration::ZERO),
    )
    .unwrap();
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
    let db = Db::create(
        DbConfig::temporary()
            .pool_size(24 << 20)
            .max_threads(2)
            .worker_wait(Duration::from_secs(20)),
    )
    .unwrap();
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
