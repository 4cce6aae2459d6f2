//! Helpers shared by the integration tests (`mod common;` in each test file that uses them).

#[allow(dead_code)] // only the persistent-object API tests use it
pub mod ptm_model;

/// Polls `f` every 5 ms for up to ten seconds; fails naming `what` if it never holds.
#[allow(dead_code)] // only some of the test files that include this module call it
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !f() {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A scratch directory for pool files: under /dev/shm when it exists (DRAM standing in for PM,
/// as the project's default pools), else the system temp dir. Removed when dropped.
#[allow(dead_code)] // only some of the test files that include this module call it
pub fn pool_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Two threads each run `per_thread` random transfers between `accounts` accounts (a new table
/// on `db`, 1000 each), with a read-only transaction every 100; then the total must be intact
/// and the structure check pass. `label` names the configuration in a failure.
#[allow(dead_code)] // only some of the test files that include this module call it
pub fn concurrent_transfers(db: &pmtx::db::Db, accounts: u64, per_thread: u64, label: &str) {
    use pmtx::catalog::{ColumnType, Schema};
    use pmtx::db::Value;
    let t = db
        .create_table(Schema::new("acct", &[("balance", ColumnType::I64)]))
        .unwrap();
    db.run(|tx| (0..accounts).try_for_each(|k| tx.insert(t, k, &[Value::I64(1000)])))
        .unwrap();
    std::thread::scope(|s| {
        for seed in 0..2u64 {
            s.spawn(move || {
                let mut w = db.worker().unwrap();
                let mut x = seed + 1;
                for i in 0..per_thread {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let (a, b) = ((x >> 33) % accounts, (x >> 40) % accounts);
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
                    if i % 100 == 0 {
                        w.run_read_only(|tx| tx.get(t, a).map(|_| ())).unwrap();
                    }
                }
            });
        }
    });
    let total: i64 = db
        .run(|tx| (0..accounts).map(|k| Ok(tx.get(t, k)?.i64(0))).sum())
        .unwrap();
    assert_eq!(total, 1000 * accounts as i64, "{label}");
    assert_eq!(db.check_structure().unwrap(), vec![accounts], "{label}");
}

/// The `u64` in column 0 of row `key` of table `t`, or `None` when there is no such row.
#[allow(dead_code)] // only some of the test files that include this module call it
pub fn value(db: &pmtx::db::Db, t: pmtx::catalog::TableId, key: u64) -> Option<u64> {
    db.run(|tx| match tx.get(t, key) {
        Ok(row) => Ok(Some(row.u64(0))),
        Err(pmtx::engine::TxError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })
    .unwrap()
}

/// A temporary database of `engine` under its default protocol, with two worker slots and a
/// pool of `pool_bytes`.
#[allow(dead_code)] // only some of the test files that include this module call it
pub fn temp_db(engine: pmtx::engine::EngineKind, pool_bytes: u64) -> pmtx::db::Db {
    pmtx::db::Db::create(
        pmtx::db::DbConfig::temporary()
            .engine(engine)
            .protocol(engine.default_protocol())
            .pool_size(pool_bytes)
            .max_threads(2),
    )
    .unwrap()
}

/// Whether `bounds` is inverted, or empty with an excluded bound: `BTreeMap::range` panics on
/// it, where the range iterators read nothing.
#[allow(dead_code)] // only some of the test files that include this module call it
pub fn empty_range<T: Ord>(bounds: &(std::ops::Bound<T>, std::ops::Bound<T>)) -> bool {
    use std::ops::Bound;
    match bounds {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
        _ => false,
    }
}
