//! Range iterators (`Tx::range`, `Tx::range_rev`; issue 21, item 2): every bound shape against
//! `BTreeMap::range`, batches longer than one scan, the edges of the key space, errors that end
//! the iteration, rows read through the protocol, on every engine.

use pmtx::db::{FIRST_BATCH, MAX_BATCH};
use pmtx::prelude::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::Bound;

fn ordered_kv() -> Schema {
    Schema::new("kv", &[("v", ColumnType::U64)]).ordered()
}

mod common;

fn db_of(engine: EngineKind) -> Db {
    common::temp_db(engine, 32 << 20)
}

/// A database of `engine` whose ordered table holds `keys`, each with value `key ^ 7`.
fn loaded(engine: EngineKind, keys: &[u64]) -> (Db, TableId) {
    let db = db_of(engine);
    let t = db.create_table(ordered_kv()).unwrap();
    for chunk in keys.chunks(200) {
        db.run(|tx| {
            for &k in chunk {
                tx.insert(t, k, &[Value::U64(k ^ 7)])?;
            }
            Ok(())
        })
        .unwrap();
    }
    (db, t)
}

/// The keys `range`/`range_rev` return for `(start, end)`, each row's value checked.
fn keys_in(db: &Db, t: TableId, bounds: (Bound<u64>, Bound<u64>), reverse: bool) -> Vec<u64> {
    db.run(|tx| {
        let rows: Vec<_> = if reverse {
            tx.range_rev(t, bounds).collect::<Result<_, _>>()?
        } else {
            tx.range(t, bounds).collect::<Result<_, _>>()?
        };
        Ok(rows
            .into_iter()
            .map(|(k, row)| {
                assert_eq!(row.u64(0), k ^ 7, "row of key {k}");
                k
            })
            .collect())
    })
    .unwrap()
}

fn model(keys: &[u64], bounds: (Bound<u64>, Bound<u64>), reverse: bool) -> Vec<u64> {
    let map: BTreeMap<u64, ()> = keys.iter().map(|&k| (k, ())).collect();
    if common::empty_range(&bounds) {
        return Vec::new();
    }
    let mut out: Vec<u64> = map.range(bounds).map(|(&k, _)| k).collect();
    if reverse {
        out.reverse();
    }
    out
}

fn bound() -> impl Strategy<Value = Bound<u64>> {
    let key = prop_oneof![0u64..600, Just(0), Just(u64::MAX), Just(u64::MAX - 1)];
    prop_oneof![
        key.clone().prop_map(Bound::Included),
        key.prop_map(Bound::Excluded),
        Just(Bound::Unbounded),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every bound shape, both directions, over key sets that need several batches.
    #[test]
    fn ranges_match_btreemap(
        keys in prop::collection::btree_set(prop_oneof![0u64..600, Just(0), Just(u64::MAX)], 0..400),
        start in bound(),
        end in bound(),
        reverse in any::<bool>(),
    ) {
        let keys: Vec<u64> = keys.into_iter().collect();
        let (db, t) = loaded(EngineKind::Volatile, &keys);
        prop_assert_eq!(keys_in(&db, t, (start, end), reverse), model(&keys, (start, end), reverse));
    }
}

#[test]
fn every_engine_iterates_ranges_across_several_batches_both_ways() {
    let n = (FIRST_BATCH + 2 * MAX_BATCH) as u64 + 5;
    let keys: Vec<u64> = (0..n).map(|k| k * 3).collect();
    for engine in EngineKind::ALL {
        let (db, t) = loaded(engine, &keys);
        let all = (Bound::Unbounded, Bound::Unbounded);
        assert_eq!(keys_in(&db, t, all, false), keys, "{engine}: forward");
        let mut rev = keys.clone();
        rev.reverse();
        assert_eq!(keys_in(&db, t, all, true), rev, "{engine}: reverse");
        let inner = (Bound::Excluded(30), Bound::Included(900));
        assert_eq!(
            keys_in(&db, t, inner, false),
            model(&keys, inner, false),
            "{engine}: (30, 900]"
        );
        assert_eq!(
            keys_in(&db, t, inner, true),
            model(&keys, inner, true),
            "{engine}: (30, 900] reversed"
        );
    }
}

#[test]
fn a_range_stops_reading_at_its_end_bound() {
    // Under 2PL every row read is locked until commit: a row past the end must not be read, or a
    // writer of that row would wait for (or conflict with) a transaction that never used it.
    let db = Db::create(
        DbConfig::temporary()
            .protocol(Protocol::NoWait)
            .pool_size(32 << 20)
            .max_threads(2),
    )
    .unwrap();
    let t = db.create_table(ordered_kv()).unwrap();
    db.run(|tx| {
        for k in 0..10 {
            tx.insert(t, k, &[Value::U64(k)])?;
        }
        Ok(())
    })
    .unwrap();
    let mut reader = db.begin().unwrap();
    let seen: Vec<u64> = reader
        .range(t, 2..5)
        .map(|r| r.map(|(k, _)| k))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(seen, [2, 3, 4]);
    let mut writer = db.worker().unwrap();
    writer
        .run(|tx| tx.update(t, 6, &[(0, Value::U64(60))]))
        .expect("row 6 lies past the range's end: the reader holds no lock on it");
    let mut txn = writer.begin();
    assert!(
        matches!(
            txn.update(t, 3, &[(0, Value::U64(30))]),
            Err(TxError::Conflict)
        ),
        "row 3 was read by the open range: no-wait 2PL refuses the writer"
    );
    drop(txn);
    drop(writer);
    reader.commit().unwrap();
}

#[test]
fn rows_read_by_a_range_are_validated_at_commit() {
    // Under OCC a row the range returned is in the read set: a concurrent update of it aborts
    // the reader at commit.
    let (db, t) = loaded(EngineKind::Falcon, &(0..100).collect::<Vec<_>>());
    let mut reader = db.begin().unwrap();
    let sum: u64 = reader
        .range(t, 40..60)
        .map(|r| r.map(|(_, row)| row.u64(0)))
        .sum::<Result<u64, _>>()
        .unwrap();
    assert_eq!(sum, (40..60).map(|k| k ^ 7).sum::<u64>());
    reader.update(t, 1, &[(0, Value::U64(sum))]).unwrap();
    let mut writer = db.worker().unwrap();
    writer
        .run(|tx| tx.update(t, 50, &[(0, Value::U64(0))]))
        .unwrap();
    drop(writer);
    assert!(matches!(
        reader.commit(),
        Err(DbError::Tx(TxError::Conflict))
    ));
    assert_eq!(
        db.run(|tx| Ok(tx.get(t, 1)?.u64(0))).unwrap(),
        1 ^ 7,
        "the aborted reader's write is not visible"
    );
}

#[test]
fn a_range_over_a_hash_table_yields_one_error_and_ends() {
    let db = db_of(EngineKind::Falcon);
    let t = db
        .create_table(Schema::new("h", &[("v", ColumnType::U64)]))
        .unwrap();
    db.run(|tx| tx.insert(t, 1, &[Value::U64(1)])).unwrap();
    let mut txn = db.begin().unwrap();
    let mut it = txn.range(t, ..);
    assert!(
        matches!(it.next(), Some(Err(_))),
        "a hash index has no order"
    );
    assert!(it.next().is_none(), "nothing after the error");
}

#[test]
fn empty_and_inverted_ranges_read_nothing() {
    let (db, t) = loaded(EngineKind::Volatile, &[0, 5, u64::MAX]);
    let none = |b: (Bound<u64>, Bound<u64>)| {
        assert!(keys_in(&db, t, b, false).is_empty(), "{b:?}");
        assert!(keys_in(&db, t, b, true).is_empty(), "{b:?} reversed");
    };
    none((Bound::Included(6), Bound::Excluded(6)));
    none((Bound::Included(9), Bound::Included(3)));
    none((Bound::Excluded(u64::MAX), Bound::Unbounded));
    none((Bound::Unbounded, Bound::Excluded(0)));
    let edges = (Bound::Included(u64::MAX), Bound::Unbounded);
    assert_eq!(keys_in(&db, t, edges, false), [u64::MAX]);
    assert_eq!(
        keys_in(&db, t, (Bound::Unbounded, Bound::Included(0)), true),
        [0]
    );
}

/// Falcon and Zen (the volatile, MMDB and DUDETx engines run Falcon's protocol code) under every
/// single-version protocol they support.
fn single_version_dbs() -> impl Iterator<Item = (EngineKind, Protocol, Db, TableId)> {
    dbs_under(|p| !p.is_multi_version())
}

/// Falcon, Zen and FIR under every protocol that claims serializability for read-write
/// transactions: the single-version ones and MVOCC, MV2PL and MVTO (not SI).
fn serializable_dbs() -> impl Iterator<Item = (EngineKind, Protocol, Db, TableId)> {
    dbs_under(|p| p != Protocol::Si)
}

/// Falcon, Zen and FIR under the protocols `chosen` admits (FIR runs MVTO only), each with the
/// table of even keys 0..=40.
fn dbs_under(
    chosen: impl Fn(Protocol) -> bool + Copy + 'static,
) -> impl Iterator<Item = (EngineKind, Protocol, Db, TableId)> {
    [EngineKind::Falcon, EngineKind::Zen, EngineKind::Fir]
        .into_iter()
        .flat_map(move |engine| {
            Protocol::ALL
                .into_iter()
                .filter(move |&p| chosen(p) && engine.supports(p))
                .map(move |p| (engine, p))
        })
        .map(|(engine, protocol)| {
            let db = Db::create(
                DbConfig::temporary()
                    .engine(engine)
                    .protocol(protocol)
                    .pool_size(32 << 20)
                    .max_threads(2),
            )
            .unwrap();
            let t = db.create_table(ordered_kv()).unwrap();
            db.run(|tx| {
                for k in (0..=40).step_by(2) {
                    tx.insert(t, k, &[Value::U64(k)])?;
                }
                Ok(())
            })
            .unwrap();
            (engine, protocol, db, t)
        })
}

/// Opens a transaction that sums the range `10..20` (keys 10, 12, ..., 18; the scan also reads
/// 20, the first key past the end) and writes the sum to row 0; lets another worker insert `key`
/// and commit; then commits the first. Returns the first's result.
fn sum_then_concurrent_insert(
    db: &Db,
    t: TableId,
    key: u64,
    read_only: bool,
) -> Result<(), DbError> {
    let mut reader = if read_only {
        db.begin_read_only().unwrap()
    } else {
        db.begin().unwrap()
    };
    let sum: u64 = reader
        .range(t, 10..20)
        .map(|r| r.map(|(_, row)| row.u64(0)))
        .sum::<Result<u64, _>>()
        .unwrap();
    assert_eq!(sum, 10 + 12 + 14 + 16 + 18);
    if !read_only {
        reader.update(t, 0, &[(0, Value::U64(sum))]).unwrap();
    }
    let mut writer = db.worker().unwrap();
    writer
        .run(|tx| tx.insert(t, key, &[Value::U64(key)]))
        .expect("the insert of a key no one read takes no lock a reader holds");
    drop(writer);
    reader.commit().map(|_| ())
}

#[test]
fn an_insert_into_a_scanned_range_aborts_the_scanner_under_serializable_protocols() {
    for (engine, protocol, db, t) in serializable_dbs() {
        if engine == EngineKind::Fir {
            // FIR's MVTO orders the younger insert after the older scanner, which needs no
            // abort; the other direction is `an_older_insert_behind_a_younger_scan_fails_...`.
            continue;
        }
        let phantom = sum_then_concurrent_insert(&db, t, 15, false);
        assert!(
            matches!(phantom, Err(DbError::Tx(TxError::Conflict))),
            "{engine}/{protocol:?}: key 15 appeared in a range the transaction summed: {phantom:?}"
        );
        assert_eq!(
            db.run(|tx| Ok(tx.get(t, 0)?.u64(0))).unwrap(),
            0,
            "{engine}/{protocol:?}: the aborted sum was not written"
        );
    }
}

#[test]
fn a_read_only_scan_is_validated_against_phantoms_too() {
    for (engine, protocol, db, t) in single_version_dbs() {
        let phantom = sum_then_concurrent_insert(&db, t, 11, true);
        assert!(
            matches!(phantom, Err(DbError::Tx(TxError::Conflict))),
            "{engine}/{protocol:?}: {phantom:?}"
        );
    }
}

#[test]
fn inserts_outside_the_scanned_interval_do_not_abort_the_scanner() {
    for (engine, protocol, db, t) in serializable_dbs() {
        // 21 lies past 20, the last key the scan read; 9 before its start.
        for key in [21, 9] {
            sum_then_concurrent_insert(&db, t, key, false)
                .unwrap_or_else(|e| panic!("{engine}/{protocol:?}: insert of {key}: {e}"));
        }
        assert_eq!(db.run(|tx| Ok(tx.get(t, 0)?.u64(0))).unwrap(), 70);
    }
}

#[test]
fn a_transactions_own_inserts_in_its_scanned_range_do_not_abort_it() {
    for (engine, protocol, db, t) in serializable_dbs() {
        db.run(|tx| {
            let before = tx.range(t, 10..20).count();
            tx.insert(t, 13, &[Value::U64(13)])?;
            tx.insert(t, 17, &[Value::U64(17)])?;
            assert_eq!(before, 5);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{engine}/{protocol:?}: {e}"));
        let after = db
            .run(|tx| {
                tx.range(t, 10..20)
                    .map(|r| r.map(|(k, _)| k))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap();
        assert_eq!(after, [10, 12, 13, 14, 16, 17, 18], "{engine}/{protocol:?}");
    }
}

/// A snapshot (multi-version read-only transactions, SI, MVTO) must not miss a row that a delete
/// committed after it took out of the index: the scan sees the row or fails with `Conflict`.
#[test]
fn a_snapshot_scan_never_misses_a_row_deleted_since_the_snapshot() {
    for (engine, protocol, db, t) in dbs_under(|p| p.is_multi_version()) {
        for read_only in [true, false] {
            db.run(|tx| {
                if !tx.exists(t, 12)? {
                    tx.insert(t, 12, &[Value::U64(12)])?;
                }
                Ok(())
            })
            .unwrap();
            let mut reader = if read_only {
                db.begin_read_only().unwrap()
            } else {
                db.begin().unwrap()
            };
            // The snapshot is taken: the reader has read a row.
            assert_eq!(reader.get(t, 40).unwrap().u64(0), 40);
            let mut writer = db.worker().unwrap();
            writer.run(|tx| tx.delete(t, 12)).unwrap();
            drop(writer);
            let keys: Result<Vec<u64>, _> =
                reader.range(t, 10..20).map(|r| r.map(|(k, _)| k)).collect();
            // MVOCC's and MV2PL's read-write transactions read the current rows, the others a
            // snapshot from before the delete.
            let at_snapshot = read_only || matches!(protocol, Protocol::Si | Protocol::Mvto);
            let expected: &[u64] = if at_snapshot {
                &[10, 12, 14, 16, 18]
            } else {
                &[10, 14, 16, 18]
            };
            match keys {
                Ok(keys) => assert_eq!(
                    keys, expected,
                    "{engine}/{protocol:?} read-only {read_only}: the rows 10..20 it reads"
                ),
                Err(e) => assert!(
                    matches!(e, TxError::Conflict),
                    "{engine}/{protocol:?} read-only {read_only}: {e}"
                ),
            }
        }
    }
}

/// Timestamp ordering (TO, MVTO; FIR is MVTO): an older transaction's insert into a range that a younger one
/// scanned and committed would be a row the younger missed though the order puts it first; the
/// older one fails at commit instead.
#[test]
fn an_older_insert_behind_a_younger_scan_fails_under_timestamp_ordering() {
    for (engine, protocol, db, t) in dbs_under(|p| matches!(p, Protocol::To | Protocol::Mvto)) {
        let mut older = db.begin().unwrap();
        assert_eq!(older.get(t, 40).unwrap().u64(0), 40);
        let mut younger = db.worker().unwrap();
        let seen = younger
            .run(|tx| {
                tx.range(t, 10..20)
                    .map(|r| r.map(|(k, _)| k))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap();
        drop(younger);
        assert_eq!(seen, [10, 12, 14, 16, 18], "{engine}/{protocol:?}");
        // FIR publishes the insert now (pending), Falcon and Zen at commit.
        let late = match older.insert(t, 15, &[Value::U64(15)]) {
            Ok(()) => older.commit().map(|_| ()),
            Err(e) => Err(e.into()),
        };
        assert!(
            matches!(late, Err(DbError::Tx(TxError::Conflict))),
            "{engine}/{protocol:?}: the older insert committed behind the younger scan: {late:?}"
        );
        // Outside any scan, inserts by older transactions go on as before.
        let mut older = db.begin().unwrap();
        older.insert(t, 1015, &[Value::U64(1015)]).unwrap();
        let mut other = db.worker().unwrap();
        other.run(|tx| tx.get(t, 40).map(|_| ())).unwrap();
        drop(other);
        older
            .commit()
            .unwrap_or_else(|e| panic!("{engine}/{protocol:?}: {e}"));
    }
}
