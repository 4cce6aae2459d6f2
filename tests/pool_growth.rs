//! Pool growth (issue 19, item 11): a pool created small grows when full, up to its maximum,
//! keeps every row across a reopen, stops at the maximum with `PmFull`, and opens after a crash
//! at any point of a growth (the durable states between its steps are built exactly: file
//! extended but size not recorded; size recorded but page count not).

use pmtx::alloc::PAGE_SIZE;
use pmtx::catalog::{ColumnType, Schema};
use pmtx::db::{min_pool_size, Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind, TxError};
use pmtx::pmem::{header, PersistenceDomain, Pool, PoolError, PoolOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("pmtx-grow-{name}-{}.pool", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config(engine: EngineKind, path: &Path, threads: usize, max: u64) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .domain(PersistenceDomain::Adr)
        .path(path)
        .pool_size(min_pool_size(engine, threads))
        .max_pool_size(max)
        .max_threads(threads)
}

fn items() -> Schema {
    Schema::new(
        "items",
        &[("v", ColumnType::U64), ("pad", ColumnType::Bytes(1000))],
    )
}

fn insert(db: &Db, t: u32, key: u64) -> Result<(), DbError> {
    db.run(|tx| {
        tx.insert(
            t,
            key,
            &[Value::U64(key ^ 0xabc), Value::Bytes(&[key as u8; 100])],
        )
    })
}

fn check_rows(db: &Db, t: u32, keys: impl IntoIterator<Item = u64> + Clone) {
    let n = keys.clone().into_iter().count() as u64;
    db.run(|tx| {
        for k in keys.clone() {
            assert_eq!(tx.get(t, k)?.u64(0), k ^ 0xabc, "row {k}");
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(db.check_structure().unwrap(), vec![n]);
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn a_small_pool_grows_past_its_first_size_and_keeps_every_row_across_a_reopen() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        let scratch = Scratch::new(&format!("reopen-{engine}"));
        let initial = min_pool_size(engine, 2);
        let db = Db::create(config(engine, &scratch.0, 2, 256 << 20)).unwrap();
        let t = db.create_table(items()).unwrap();
        // About 20 MiB of rows: several growths past the first size.
        let rows = 20_000u64;
        std::thread::scope(|s| {
            for part in 0..2u64 {
                let db = &db;
                s.spawn(move || {
                    for k in (part..rows).step_by(2) {
                        insert(db, t, k).unwrap();
                    }
                });
            }
        });
        let grown = pool_len(&db);
        assert!(
            grown > initial + 8 * PAGE_SIZE,
            "{engine}: {grown} <= {initial}"
        );
        check_rows(&db, t, 0..rows);
        drop(db);
        assert_eq!(file_len(&scratch.0), grown);
        let header = Pool::read_header(&scratch.0).unwrap();
        assert_eq!((header.size, header.initial_size), (grown, initial));
        assert_eq!(header.max_size, Some(256 << 20));
        let db = Db::open(
            DbConfig::temporary()
                .path(&scratch.0)
                .domain(PersistenceDomain::Adr),
        )
        .unwrap();
        check_rows(&db, t, 0..rows);
        // And it keeps growing after the reopen.
        let mut k = rows;
        while pool_len(&db) == grown {
            insert(&db, t, k).unwrap();
            k += 1;
            assert!(k < 10 * rows, "{engine}: no growth after the reopen");
        }
        check_rows(&db, t, 0..k);
    }
}

#[test]
fn growth_stops_at_the_maximum_with_pm_full() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        let scratch = Scratch::new(&format!("max-{engine}"));
        let max = min_pool_size(engine, 1) + 5 * PAGE_SIZE;
        let db = Db::create(config(engine, &scratch.0, 1, max)).unwrap();
        let t = db.create_table(items()).unwrap();
        let mut n = 0;
        let err = loop {
            match insert(&db, t, n) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
            assert!(n < 1_000_000);
        };
        let msg = err.to_string();
        assert!(matches!(err, DbError::Tx(TxError::PmFull(_))), "{msg}");
        assert!(msg.contains("grown to its maximum"), "{msg}");
        assert_eq!(pool_len(&db), max);
        check_rows(&db, t, 0..n);
        drop(db);
        assert_eq!(file_len(&scratch.0), max);
    }
}

/// The page-table superblock's page count (see `alloc::pages`): offset 4096 + 16.
const PAGE_COUNT_AT: u64 = 4096 + 16;

#[test]
fn a_crash_at_any_step_of_a_growth_leaves_a_pool_that_opens_with_every_row() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        let scratch = Scratch::new(&format!("crash-{engine}"));
        let db = Db::create(config(engine, &scratch.0, 1, 64 << 20)).unwrap();
        let t = db.create_table(items()).unwrap();
        let first = pool_len(&db);
        let mut n = 0;
        while pool_len(&db) == first {
            insert(&db, t, n).unwrap();
            n += 1;
        }
        assert!(pool_len(&db) > first);
        drop(db);
        let file = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&scratch.0)
                .unwrap()
        };

        // Step 1 done, step 3 not: the file was extended but the size word still says `first`
        // (as if that growth had not happened; the bytes past it were never written). On a copy:
        // this pool's rows are in those bytes.
        let saved = std::fs::read(&scratch.0).unwrap();
        let f = file();
        f.write_all_at(&0u64.to_le_bytes(), header::SIZE_WORD)
            .unwrap();
        drop(f);
        let pool = Pool::open(
            &scratch.0,
            &PoolOptions::new(engine.layout(), PersistenceDomain::Adr),
        )
        .unwrap();
        assert_eq!(pool.len(), first, "the header's size wins");
        drop(pool);
        assert_eq!(
            file_len(&scratch.0),
            first,
            "the extra bytes are cut off at open"
        );
        // Put the pool back as it was (its rows in the pages past `first`) for the next state.
        std::fs::write(&scratch.0, &saved).unwrap();

        // Step 3 done, the page count not: the superblock still has the old page count.
        let f = file();
        let old_pages = first / PAGE_SIZE - 1;
        f.write_all_at(&old_pages.to_le_bytes(), PAGE_COUNT_AT)
            .unwrap();
        drop(f);
        let db = Db::open(
            DbConfig::temporary()
                .path(&scratch.0)
                .domain(PersistenceDomain::Adr),
        )
        .unwrap();
        check_rows(&db, t, 0..n);
        for k in n..n + 3_000 {
            insert(&db, t, k).unwrap();
        }
        check_rows(&db, t, 0..n + 3_000);
        drop(db);
        let mut count = [0u8; 8];
        file().read_exact_at(&mut count, PAGE_COUNT_AT).unwrap();
        assert!(
            u64::from_le_bytes(count) > old_pages,
            "the page count was repaired"
        );

        // A crash right after the file was extended, before anything else: a fresh pool whose
        // file is longer than its header says opens, at its recorded size.
        let before = file_len(&scratch.0);
        file().set_len(before + 4 * PAGE_SIZE).unwrap();
        let db = Db::open(
            DbConfig::temporary()
                .path(&scratch.0)
                .domain(PersistenceDomain::Adr),
        )
        .unwrap();
        assert_eq!(pool_len(&db), before);
        check_rows(&db, t, 0..n + 3_000);
    }
}

#[test]
fn growth_is_refused_clearly_where_it_cannot_happen() {
    let opts = PoolOptions::new("t", PersistenceDomain::Adr);
    // Fixed-size pools.
    let scratch = Scratch::new("fixed");
    let fixed = Pool::create(Some(&scratch.0), 8 << 20, &opts).unwrap();
    let err = fixed.grow(16 << 20).unwrap_err();
    assert!(
        matches!(err, PoolError::GrowFailed { .. }) && err.to_string().contains("fixed-size"),
        "{err}"
    );
    assert_eq!(fixed.len(), 8 << 20);
    drop(fixed);
    // In-memory pools cannot be growable at all.
    let err =
        Pool::create_in_memory(8 << 20, &opts.clone().growable_to(Some(16 << 20))).unwrap_err();
    assert!(
        err.to_string().contains("in-memory pool cannot grow"),
        "{err}"
    );
    // Beyond the maximum; and a maximum below the size.
    let scratch = Scratch::new("beyond");
    let pool = Pool::create(
        Some(&scratch.0),
        8 << 20,
        &opts.clone().growable_to(Some(12 << 20)),
    )
    .unwrap();
    assert!(pool
        .grow(16 << 20)
        .unwrap_err()
        .to_string()
        .contains("maximum"));
    pool.grow(12 << 20).unwrap();
    assert_eq!(pool.len(), 12 << 20);
    // A crash image of a grown pool opens, and refuses to grow.
    let image = std::fs::read(&scratch.0).unwrap();
    let copy = Pool::from_image(&image, &opts).unwrap();
    assert_eq!(copy.len(), 12 << 20);
    drop(pool);
    let scratch2 = Scratch::new("small-max");
    assert!(Pool::create(Some(&scratch2.0), 8 << 20, &opts.growable_to(Some(4 << 20))).is_err());
    assert!(!scratch2.0.exists());
}

#[test]
fn readers_and_writers_keep_working_while_the_pool_grows() {
    let scratch = Scratch::new("concurrent");
    let opts = PoolOptions::new("t", PersistenceDomain::Adr).growable_to(Some(64 << 20));
    let pool = Pool::create(Some(&scratch.0), 4 << 20, &opts).unwrap();
    let at = pool.first_usable();
    pool.write_u64(at, 7);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(pool.read_u64(at), i - 1);
                pool.write_u64(at, i);
                i += 1;
            }
        });
        for mib in (8..=64).step_by(4) {
            pool.grow(mib << 20).unwrap();
            // The new bytes are there, zero and writable, right after the grow.
            let last = (mib << 20) - 8;
            assert_eq!(pool.read_u64(last), 0);
            pool.write_u64(last, mib);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    for mib in (8..=64).step_by(4) {
        assert_eq!(pool.read_u64((mib << 20) - 8), mib);
    }
    drop(pool);
    let pool = Pool::open(&scratch.0, &PoolOptions::new("t", PersistenceDomain::Adr)).unwrap();
    assert_eq!(pool.len(), 64 << 20);
    assert_eq!(pool.read_u64((20u64 << 20) - 8), 20);
}

fn pool_len(db: &Db) -> u64 {
    db.engine().pool().expect("a pool").len()
}
