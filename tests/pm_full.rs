//! A full pool (issue 19, item 10): the error says once what is full and what to do, every
//! committed row survives it, the database stays usable, and deletes free room that later
//! inserts reuse, also after a reopen; a pool too small for its engine and thread count is
//! refused at creation, naming the minimum.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::db::{min_pool_size, Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind, TxError};
use pmtx::pmem::PersistenceDomain;
use std::path::{Path, PathBuf};

/// A pool file removed when the test ends (also when it fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p =
            std::env::temp_dir().join(format!("pmtx-pmfull-{name}-{}.pool", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config(engine: EngineKind, path: &Path, bytes: u64, threads: usize) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .domain(PersistenceDomain::Adr)
        .path(path)
        .pool_size(bytes)
        .max_threads(threads)
}

fn items() -> Schema {
    Schema::new(
        "items",
        &[("v", ColumnType::U64), ("pad", ColumnType::Bytes(200))],
    )
}

fn insert(db: &Db, t: u32, key: u64) -> Result<(), DbError> {
    db.run(|tx| tx.insert(t, key, &[Value::U64(key * 3), Value::Bytes(b"x")]))
}

fn check_rows(db: &Db, t: u32, keys: &[u64]) {
    db.run(|tx| {
        for &k in keys {
            assert_eq!(tx.get(t, k)?.u64(0), k * 3, "row {k}");
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(db.check_structure().unwrap(), vec![keys.len() as u64]);
}

fn fill_check_delete_reuse(engine: EngineKind) {
    let scratch = Scratch::new(engine.name());
    let size = min_pool_size(engine, 1);
    let db = Db::create(config(engine, &scratch.0, size, 1)).unwrap();
    let t = db.create_table(items()).unwrap();
    let mut keys = Vec::new();
    let err = loop {
        let k = keys.len() as u64;
        match insert(&db, t, k) {
            Ok(()) => keys.push(k),
            Err(e) => break e,
        }
        assert!(keys.len() < 1_000_000, "the pool never filled");
    };
    // The message says once what is full, how big the pool is, and what to do.
    let msg = err.to_string();
    assert!(matches!(err, DbError::Tx(TxError::PmFull(_))), "{err}");
    assert_eq!(msg.matches("full").count(), 1, "{msg}");
    for needed in [
        "table 'items'",
        "thread 0",
        "pool_size",
        "max_threads",
        "max_pool_size",
    ] {
        assert!(msg.contains(needed), "'{needed}' missing from: {msg}");
    }
    assert!(msg.contains(&format!("{} MiB", size >> 20)), "{msg}");
    // A multi-row transaction fails the same way and leaves nothing behind.
    let err = db
        .run(|tx| {
            for k in 0..10 {
                tx.insert(t, 10_000_000 + k, &[Value::U64(k), Value::Bytes(b"y")])?;
            }
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(err, DbError::Tx(TxError::PmFull(_))), "{err}");
    check_rows(&db, t, &keys);
    // Deletes free slots that later inserts reuse.
    let deleted: Vec<u64> = keys.iter().copied().filter(|k| k % 4 == 1).collect();
    for &k in &deleted {
        db.run(|tx| tx.delete(t, k)).unwrap();
    }
    keys.retain(|k| k % 4 != 1);
    let fresh: Vec<u64> = (0..deleted.len() as u64).map(|i| 5_000_000 + i).collect();
    for &k in &fresh {
        insert(&db, t, k).unwrap_or_else(|e| panic!("insert {k} into freed room: {e}"));
    }
    keys.extend(&fresh);
    assert!(matches!(
        insert(&db, t, 9_999_999),
        Err(DbError::Tx(TxError::PmFull(_)))
    ));
    check_rows(&db, t, &keys);
    // The same after a reopen: recovery finds every row, and freed room is found again.
    drop(db);
    let db = Db::open(config(engine, &scratch.0, size, 1)).unwrap();
    check_rows(&db, t, &keys);
    for &k in &fresh[..10] {
        db.run(|tx| tx.delete(t, k)).unwrap();
    }
    keys.retain(|k| !fresh[..10].contains(k));
    for k in 0..10 {
        insert(&db, t, 7_000_000 + k).unwrap();
        keys.push(7_000_000 + k);
    }
    check_rows(&db, t, &keys);
}

#[test]
fn falcon_full_pool_keeps_every_row_and_reuses_deleted_room() {
    fill_check_delete_reuse(EngineKind::Falcon);
}

#[test]
fn zen_full_pool_keeps_every_row_and_reuses_deleted_room() {
    fill_check_delete_reuse(EngineKind::Zen);
}

#[test]
fn a_pool_too_small_for_its_engine_and_threads_is_refused_naming_the_minimum() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        for threads in [1, 4] {
            let min = min_pool_size(engine, threads);
            let scratch = Scratch::new(&format!("small-{engine}-{threads}"));
            let err = Db::create(config(engine, &scratch.0, min - (1 << 20), threads))
                .err()
                .expect("refused");
            let msg = err.to_string();
            assert!(matches!(err, DbError::Config(_)), "{msg}");
            assert!(msg.contains(&format!("{} MiB", min >> 20)), "{msg}");
            assert!(!scratch.0.exists(), "a refused create leaves no file");
            let db = Db::create(config(engine, &scratch.0, min, threads)).unwrap();
            // Every thread can insert into the table at the minimum size.
            let t = db.create_table(items()).unwrap();
            let workers: Vec<_> = (0..threads).map(|_| db.worker().unwrap()).collect();
            for (i, mut w) in workers.into_iter().enumerate() {
                w.run(|tx| tx.insert(t, i as u64, &[Value::U64(i as u64 * 3), Value::Bytes(b"")]))
                    .unwrap();
            }
        }
    }
    assert_eq!(min_pool_size(EngineKind::Falcon, 1), 8 << 20);
    assert_eq!(min_pool_size(EngineKind::Zen, 1), 6 << 20);
    assert_eq!(min_pool_size(EngineKind::Falcon, 16), 68 << 20);
}
