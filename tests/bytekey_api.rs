//! Byte-string primary keys (issue 21, item 1): the byte-key methods of `Tx` against a
//! `BTreeMap<Vec<u8>, _>` model on every engine, splits at several levels, reopen, phantom
//! protection of byte-key ranges under the serializable protocols, and the error cases.

use pmtx::catalog::ByteKeys;
use pmtx::engine::FieldWrite;
use pmtx::prelude::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::Bound;

const MAX_LEN: usize = 12;

/// A table with byte keys of up to [`MAX_LEN`] bytes and the smallest nodes (four keys), so a
/// few dozen keys make a tree of several levels.
fn small_node_schema(name: &str) -> Schema {
    Schema::new(name, &[("v", ColumnType::U64)])
        .with_byte_keys(MAX_LEN)
        .index_node_bytes(ByteKeys::min_node_bytes(MAX_LEN))
}

mod common;

fn db_of(engine: EngineKind) -> Db {
    common::temp_db(engine, 48 << 20)
}

/// A Falcon database whose small-node table holds `k00`..`k29` (values 0..29).
fn loaded_30() -> (Db, TableId) {
    let db = db_of(EngineKind::Falcon);
    let t = db.create_table(small_node_schema("kv")).unwrap();
    db.run(|tx| {
        (0..30u64)
            .try_for_each(|i| tx.insert_by(t, format!("k{i:02}").as_bytes(), &[Value::U64(i)]))
    })
    .unwrap();
    (db, t)
}

/// Every key with its value, through a forward or reverse range.
fn contents(
    db: &Db,
    t: TableId,
    bounds: (Bound<Vec<u8>>, Bound<Vec<u8>>),
    reverse: bool,
) -> Vec<(Vec<u8>, u64)> {
    db.run(|tx| {
        let it = if reverse {
            tx.range_rev_by(t, bounds.clone())
        } else {
            tx.range_by(t, bounds.clone())
        };
        it.map(|r| r.map(|(k, row)| (k, row.u64(0)))).collect()
    })
    .unwrap()
}

fn model_range(
    model: &BTreeMap<Vec<u8>, u64>,
    bounds: &(Bound<Vec<u8>>, Bound<Vec<u8>>),
    reverse: bool,
) -> Vec<(Vec<u8>, u64)> {
    if common::empty_range(bounds) {
        return Vec::new();
    }
    let mut out: Vec<(Vec<u8>, u64)> = model
        .range(bounds.clone())
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    if reverse {
        out.reverse();
    }
    out
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u8>, u64),
    Update(Vec<u8>, u64),
    Delete(Vec<u8>),
    Range(Bound<Vec<u8>>, Bound<Vec<u8>>, bool),
}

/// Keys from a small alphabet (many share prefixes; the empty key among them) or of the
/// maximum length.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(0u8), Just(255u8)], 0..5),
        1 => prop::collection::vec(any::<u8>(), MAX_LEN..=MAX_LEN),
        1 => Just(Vec::new()),
    ]
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        key().prop_map(Bound::Included),
        key().prop_map(Bound::Excluded),
        Just(Bound::Unbounded),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (key(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => (key(), any::<u64>()).prop_map(|(k, v)| Op::Update(k, v)),
        3 => key().prop_map(Op::Delete),
        2 => (bound(), bound(), any::<bool>()).prop_map(|(a, b, r)| Op::Range(a, b, r)),
    ]
}

/// Applies `ops` to the table and the model, a few per transaction, checking every result.
fn run_model(db: &Db, t: TableId, ops: &[Op], model: &mut BTreeMap<Vec<u8>, u64>) {
    for chunk in ops.chunks(4) {
        let mut next = model.clone();
        db.run(|tx| {
            next = model.clone();
            for op in chunk {
                match op {
                    Op::Insert(k, v) => {
                        let r = tx.insert_by(t, k, &[Value::U64(*v)]);
                        if next.contains_key(k) {
                            assert!(
                                matches!(&r, Err(TxError::DuplicateByteKey { key, .. }) if key == k),
                                "{r:?}"
                            );
                        } else {
                            r?;
                            next.insert(k.clone(), *v);
                        }
                    }
                    Op::Update(k, v) => match tx.update_by(t, k, &[(0, Value::U64(*v))]) {
                        Ok(()) => assert!(next.insert(k.clone(), *v).is_some()),
                        Err(TxError::ByteKeyNotFound { key, .. }) => {
                            assert_eq!(&key, k);
                            assert!(!next.contains_key(k));
                        }
                        Err(e) => return Err(e),
                    },
                    Op::Delete(k) => match tx.delete_by(t, k) {
                        Ok(()) => assert!(next.remove(k).is_some()),
                        Err(TxError::ByteKeyNotFound { .. }) => assert!(!next.contains_key(k)),
                        Err(e) => return Err(e),
                    },
                    Op::Range(a, b, rev) => {
                        let bounds = (a.clone(), b.clone());
                        let it = if *rev {
                            tx.range_rev_by(t, bounds.clone())
                        } else {
                            tx.range_by(t, bounds.clone())
                        };
                        let got: Vec<(Vec<u8>, u64)> = it
                            .map(|r| r.map(|(k, row)| (k, row.u64(0))))
                            .collect::<Result<_, _>>()?;
                        assert_eq!(got, model_range(&next, &bounds, *rev), "{bounds:?} rev {rev}");
                    }
                }
            }
            for (k, v) in &next {
                assert_eq!(tx.get_by(t, k)?.u64(0), *v);
            }
            Ok(())
        })
        .unwrap();
        *model = next;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 44, ..ProptestConfig::default() })]

    /// Random operations against the model, on an engine drawn per case (about four cases per
    /// engine; the fixed sequence below runs on each engine for sure).
    #[test]
    fn byte_keys_match_a_btreemap(
        engine in prop::sample::select(EngineKind::ALL.to_vec()),
        ops in prop::collection::vec(op(), 1..160),
    ) {
        let db = db_of(engine);
        let t = db.create_table(small_node_schema("kv")).unwrap();
        let mut model = BTreeMap::new();
        run_model(&db, t, &ops, &mut model);
        let index = db.check_byte_keys(t).unwrap();
        let keys: Vec<Vec<u8>> = index.entries.into_iter().map(|(k, _)| k).collect();
        prop_assert_eq!(keys, model.keys().cloned().collect::<Vec<_>>(), "{}", engine);
    }
}

/// A deterministic mixed sequence: inserts of every key of a universe with prefixes, the empty
/// key and maximum-length keys, then updates, deletes of most, and ranges.
fn fixed_ops() -> Vec<Op> {
    let mut keys: Vec<Vec<u8>> = vec![Vec::new(), vec![0], vec![255; MAX_LEN]];
    for i in 0u32..150 {
        let mut k = format!("{:x}", i.wrapping_mul(2654435761) % 100_000).into_bytes();
        k.truncate(1 + (i as usize % MAX_LEN));
        keys.push(k);
    }
    let mut ops: Vec<Op> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| Op::Insert(k.clone(), i as u64))
        .collect();
    ops.push(Op::Range(Bound::Unbounded, Bound::Unbounded, false));
    ops.push(Op::Range(Bound::Unbounded, Bound::Unbounded, true));
    ops.extend(keys.iter().step_by(3).map(|k| Op::Update(k.clone(), 7)));
    ops.push(Op::Range(
        Bound::Included(b"3".to_vec()),
        Bound::Excluded(b"8".to_vec()),
        false,
    ));
    ops.push(Op::Range(
        Bound::Excluded(b"3".to_vec()),
        Bound::Included(b"8".to_vec()),
        true,
    ));
    ops.extend(
        keys.iter()
            .filter(|k| k.len() % 4 != 1)
            .map(|k| Op::Delete(k.clone())),
    );
    ops.push(Op::Range(Bound::Unbounded, Bound::Unbounded, false));
    ops.push(Op::Range(Bound::Unbounded, Bound::Unbounded, true));
    ops.extend(keys.iter().take(40).map(|k| Op::Insert(k.clone(), 1)));
    ops.push(Op::Range(Bound::Unbounded, Bound::Unbounded, true));
    ops
}

#[test]
fn every_engine_keeps_byte_keys_through_splits_deletes_and_reopen() {
    for engine in EngineKind::ALL {
        let dir = common::pool_dir();
        let path = dir.path().join(format!("pmtx-bytekey-{engine}.pool"));
        let config = DbConfig::default()
            .path(&path)
            .engine(engine)
            .protocol(engine.default_protocol())
            .pool_size(48 << 20)
            .max_threads(2);
        let mut model = BTreeMap::new();
        let ops = fixed_ops();
        let (split_at, rest) = ops.split_at(153);
        {
            let db = Db::create(config.clone()).unwrap();
            let t = db.create_table(small_node_schema("kv")).unwrap();
            run_model(&db, t, split_at, &mut model);
            let index = db
                .check_byte_keys(t)
                .unwrap_or_else(|e| panic!("{engine}: {e}"));
            assert!(index.depth >= 3, "{engine}: {} levels", index.depth);
            assert_eq!(index.entries.len(), model.len());
        }
        if engine == EngineKind::Volatile {
            // Nothing survives a volatile database.
            continue;
        }
        let db = Db::open(config).unwrap();
        let t = db.table("kv").unwrap();
        assert_eq!(
            contents(&db, t, (Bound::Unbounded, Bound::Unbounded), false),
            model
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect::<Vec<_>>(),
            "{engine}: after reopen"
        );
        run_model(&db, t, rest, &mut model);
        db.check_byte_keys(t)
            .unwrap_or_else(|e| panic!("{engine}: {e}"));
        assert_eq!(
            db.tables()
                .into_iter()
                .map(|(_, s)| s.name)
                .collect::<Vec<_>>(),
            ["kv"],
            "{engine}: the index table is hidden"
        );
    }
}

#[test]
fn deleting_every_key_frees_the_nodes_and_the_tree_takes_keys_again() {
    let db = db_of(EngineKind::Falcon);
    let t = db.create_table(small_node_schema("kv")).unwrap();
    let keys: Vec<Vec<u8>> = (0u32..120)
        .map(|i| format!("k{i:03}").into_bytes())
        .collect();
    db.run(|tx| {
        keys.iter()
            .try_for_each(|k| tx.insert_by(t, k, &[Value::U64(1)]))
    })
    .unwrap();
    let full = db.check_byte_keys(t).unwrap();
    assert!(full.depth >= 3 && full.nodes > 20, "{full:?}");
    for chunk in keys.chunks(7) {
        db.run(|tx| chunk.iter().try_for_each(|k| tx.delete_by(t, k)))
            .unwrap();
    }
    let empty = db.check_byte_keys(t).unwrap();
    assert!(empty.entries.is_empty());
    assert_eq!(empty.nodes, 1, "only the root is left: {empty:?}");
    db.run(|tx| tx.insert_by(t, b"again", &[Value::U64(2)]))
        .unwrap();
    assert_eq!(db.run(|tx| Ok(tx.get_by(t, b"again")?.u64(0))).unwrap(), 2);
}

#[test]
fn the_index_check_reports_a_damaged_tree() {
    // The crash suite trusts Db::check_byte_keys to find a broken index: it must.
    let damage = |harm: &dyn Fn(&Db, TableId), what: &str| {
        let (db, t) = loaded_30();
        db.check_byte_keys(t).unwrap();
        let nodes = db.table("__pmtx_bkey_kv").expect("the hidden index table");
        harm(&db, nodes);
        let e = db.check_byte_keys(t).unwrap_err();
        assert!(e.contains(what), "{e}");
    };
    let node_bytes = ByteKeys::min_node_bytes(MAX_LEN);
    damage(
        &|db, nodes| {
            let junk = vec![7u8; node_bytes];
            db.run(|tx| tx.insert_bytes(nodes, 12345, &junk)).unwrap();
        },
        "node rows",
    );
    damage(
        &|db, nodes| {
            let junk = vec![9u8; node_bytes];
            db.run(|tx| {
                tx.update_bytes(
                    nodes,
                    1,
                    &[FieldWrite {
                        offset: 0,
                        bytes: &junk,
                    }],
                )
            })
            .unwrap();
        },
        "malformed",
    );
    damage(
        &|db, nodes| {
            // The root's first separator moved past its keys: they are outside its fences.
            let mut root = db.run(|tx| Ok(tx.get(nodes, 1)?.bytes().to_vec())).unwrap();
            let at = 16 + 2;
            root[at] = b'z';
            db.run(|tx| {
                tx.update_bytes(
                    nodes,
                    1,
                    &[FieldWrite {
                        offset: 0,
                        bytes: &root,
                    }],
                )
            })
            .unwrap();
        },
        "outside its fences",
    );
}

#[test]
fn errors_name_the_key_and_the_wrong_kind_of_key_is_refused() {
    let db = db_of(EngineKind::Falcon);
    let bk = db
        .create_table(Schema::new("users", &[("age", ColumnType::U64)]).with_byte_keys(8))
        .unwrap();
    let u = db
        .create_table(Schema::new("plain", &[("v", ColumnType::U64)]))
        .unwrap();
    db.run(|tx| tx.insert_by(bk, b"ada", &[Value::U64(36)]))
        .unwrap();
    let mut txn = db.begin().unwrap();
    let dup = txn.insert_by(bk, b"ada", &[Value::U64(1)]).unwrap_err();
    assert_eq!(
        dup.to_string(),
        format!("a row with key \"ada\" already exists in table {bk}")
    );
    let missing = txn.get_by(bk, b"bob\n").unwrap_err();
    assert_eq!(
        missing.to_string(),
        format!("no row with key \"bob\\n\" in table {bk}")
    );
    assert!(matches!(
        txn.delete_by(bk, b"bob"),
        Err(TxError::ByteKeyNotFound { .. })
    ));
    assert!(matches!(
        txn.update_by(bk, b"bob", &[(0, Value::U64(1))]),
        Err(TxError::ByteKeyNotFound { .. })
    ));
    assert!(!txn.exists_by(bk, b"bob").unwrap());
    assert!(txn.exists_by(bk, b"ada").unwrap());
    let long = txn
        .insert_by(bk, b"123456789", &[Value::U64(1)])
        .unwrap_err();
    assert!(
        matches!(&long, TxError::RowTooLarge(m) if m.contains("at most 8")),
        "{long}"
    );
    // u64 methods on a byte-key table, byte-key methods on a u64 table: SchemaMismatch.
    for e in [
        txn.get(bk, 1).map(|_| ()).unwrap_err(),
        txn.insert(bk, 1, &[Value::U64(1)]).unwrap_err(),
        txn.update(bk, 1, &[(0, Value::U64(1))]).unwrap_err(),
        txn.delete(bk, 1).unwrap_err(),
        txn.exists(bk, 1).unwrap_err(),
        txn.range(bk, ..).next().unwrap().map(|_| ()).unwrap_err(),
        txn.get_by(u, b"x").map(|_| ()).unwrap_err(),
        txn.insert_by(u, b"x", &[Value::U64(1)]).unwrap_err(),
        txn.range_by::<&[u8]>(u, ..)
            .next()
            .unwrap()
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert!(matches!(e, TxError::SchemaMismatch(_)), "{e}");
    }
    // None of those ended the transaction: it still commits its earlier work.
    txn.insert_by(bk, b"bob", &[Value::U64(2)]).unwrap();
    txn.commit().unwrap();
    assert_eq!(db.run(|tx| Ok(tx.get_by(bk, b"bob")?.u64(0))).unwrap(), 2);
}

#[test]
fn bad_byte_key_schemas_are_refused_with_a_reason() {
    let db = db_of(EngineKind::Falcon);
    let refuse = |schema: Schema, what: &str| {
        let e = db.create_table(schema).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    };
    let base = || Schema::new("t", &[("v", ColumnType::U64)]);
    refuse(base().with_byte_keys(0), "1 to 1024");
    refuse(base().with_byte_keys(5000), "1 to 1024");
    refuse(
        base().with_byte_keys(16).index_node_bytes(64),
        "need at least",
    );
    refuse(
        base().with_byte_keys(1024),
        "exceed the tuple size limit of 4096",
    );
    refuse(
        Schema::new("__pmtx_mine", &[("v", ColumnType::U64)]),
        "database's own",
    );
    refuse(
        Schema::new("s", &[("v", ColumnType::U64)])
            .with_secondary("by_v", &["v"])
            .with_byte_keys(8),
        "secondary",
    );
    assert!(db.tables().is_empty(), "no refused schema left a table");
}

/// The serializable setups of tests/range_api.rs: every protocol but SI, whose read-write
/// transactions validate their scans (`Protocol::validates_scans`).
fn serializable_dbs() -> impl Iterator<Item = (EngineKind, Protocol, Db, TableId)> {
    [EngineKind::Falcon, EngineKind::Zen]
        .into_iter()
        .flat_map(|engine| {
            Protocol::ALL
                .into_iter()
                .filter(move |&p| p.validates_scans(false) && engine.supports(p))
                .map(move |p| (engine, p))
        })
        .map(|(engine, protocol)| {
            let db = Db::create(
                DbConfig::temporary()
                    .engine(engine)
                    .protocol(protocol)
                    .pool_size(32 << 20)
                    .max_threads(2)
                    // A writer refused by the open reader's locks gives up soon.
                    .max_retries(3),
            )
            .unwrap();
            let t = db.create_table(small_node_schema("kv")).unwrap();
            db.run(|tx| {
                for i in 0..40u64 {
                    tx.insert_by(t, format!("k{i:02}").as_bytes(), &[Value::U64(i)])?;
                }
                Ok(())
            })
            .unwrap();
            (engine, protocol, db, t)
        })
}

/// Sums `k10..k20` in one transaction, lets another insert `key` and commit, then commits the
/// first (which also wrote the sum to `k00`); returns the writer's and the reader's results.
fn sum_then_insert(db: &Db, t: TableId, key: &[u8]) -> (Result<(), DbError>, Result<(), DbError>) {
    let mut reader = db.begin().unwrap();
    let sum: u64 = reader
        .range_by(t, "k10".."k20")
        .map(|r| r.map(|(_, row)| row.u64(0)))
        .sum::<Result<u64, _>>()
        .unwrap();
    assert_eq!(sum, (10..20).sum::<u64>());
    reader
        .update_by(t, b"k00", &[(0, Value::U64(sum))])
        .unwrap();
    let mut writer = db.worker().unwrap();
    let inserted = writer.run(|tx| tx.insert_by(t, key, &[Value::U64(1000)]));
    drop(writer);
    (inserted, reader.commit().map(|_| ()))
}

#[test]
fn an_insert_into_a_scanned_byte_key_range_aborts_one_of_the_two() {
    let mut runs = 0;
    for (engine, protocol, db, t) in serializable_dbs() {
        let what = format!("{engine}/{protocol:?}");
        match sum_then_insert(&db, t, b"k15x") {
            // 2PL refuses the writer (the reader holds the leaf's read lock), the optimistic
            // protocols the reader (the leaf it read changed).
            (Ok(()), Err(DbError::Tx(TxError::Conflict)))
            | (Err(DbError::Tx(TxError::Conflict)), Ok(())) => {}
            // Timestamp ordering (TO, MVTO) serialises the older reader first: the younger
            // writer's insert into a leaf the reader read is allowed, and both committing is the
            // serial order reader, writer (the reader's sum rightly lacks the insert).
            (Ok(()), Ok(())) if matches!(protocol, Protocol::To | Protocol::Mvto) => {}
            other => panic!("{what}: {other:?}"),
        }
        runs += 1;
    }
    assert!(runs >= 9, "only {runs} setups");
}

#[test]
fn a_split_by_a_concurrent_insert_aborts_a_transaction_that_read_the_leaf() {
    // OCC: a lookup reads the path to a leaf; another transaction's inserts split that leaf
    // (rewriting it and its parent); the first fails validation at commit.
    let (db, t) = loaded_30();
    let before = db.check_byte_keys(t).unwrap();
    let mut reader = db.begin().unwrap();
    assert!(!reader.exists_by(t, b"k05a").unwrap());
    reader.update_by(t, b"k29", &[(0, Value::U64(0))]).unwrap();
    let mut writer = db.worker().unwrap();
    writer
        .run(|tx| {
            for s in ["k05a", "k05b", "k05c", "k05d", "k05e"] {
                tx.insert_by(t, s.as_bytes(), &[Value::U64(5)])?;
            }
            Ok(())
        })
        .unwrap();
    drop(writer);
    assert!(
        db.check_byte_keys(t).unwrap().nodes > before.nodes,
        "the leaf split"
    );
    assert!(matches!(
        reader.commit(),
        Err(DbError::Tx(TxError::Conflict))
    ));
}

#[test]
fn concurrent_writers_on_byte_keys_leave_a_well_formed_tree() {
    for engine in [
        EngineKind::Falcon,
        EngineKind::Zen,
        EngineKind::Fir,
        EngineKind::Mmdb,
    ] {
        let db = db_of(engine);
        let t = db.create_table(small_node_schema("kv")).unwrap();
        std::thread::scope(|s| {
            for thread in 0..2u64 {
                let db = &db;
                s.spawn(move || {
                    for i in 0..150u64 {
                        let key = format!("{:02}{thread}", (i * 7919) % 97).into_bytes();
                        db.run(|tx| {
                            if tx.exists_by(t, &key)? {
                                tx.delete_by(t, &key)
                            } else {
                                tx.insert_by(t, &key, &[Value::U64(i)])
                            }
                        })
                        .unwrap_or_else(|e| panic!("{engine}: {e}"));
                    }
                });
            }
        });
        let index = db
            .check_byte_keys(t)
            .unwrap_or_else(|e| panic!("{engine}: {e}"));
        let scanned = contents(&db, t, (Bound::Unbounded, Bound::Unbounded), false);
        assert_eq!(scanned.len(), index.entries.len(), "{engine}");
    }
}

/// The cost of a byte-key lookup next to a u64 one: node reads per lookup (the depth) at 100k
/// keys with the default node size. Prints the numbers; `cargo test --release --test
/// bytekey_api -- --ignored --nocapture lookup_cost` (a few seconds).
#[test]
#[ignore]
fn lookup_cost() {
    let db = common::temp_db(EngineKind::Falcon, 1 << 30);
    let bk = db
        .create_table(Schema::new("bk", &[("v", ColumnType::U64)]).with_byte_keys(16))
        .unwrap();
    let u = db
        .create_table(Schema::new("u", &[("v", ColumnType::U64)]))
        .unwrap();
    let n = 100_000u64;
    let key = |i: u64| format!("user{:010}", i.wrapping_mul(2654435761) % 10_000_000_000);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        db.run(|tx| {
            for &i in chunk {
                tx.insert_by(bk, key(i).as_bytes(), &[Value::U64(i)])?;
                tx.insert(u, i, &[Value::U64(i)])?;
            }
            Ok(())
        })
        .unwrap();
    }
    let index = db.check_byte_keys(bk).unwrap();
    let time = |f: &dyn Fn(u64)| {
        let start = std::time::Instant::now();
        for i in 0..20_000 {
            f(i * 5 % n);
        }
        start.elapsed().as_nanos() as f64 / 20_000.0
    };
    let by_bytes = time(&|i| {
        db.run(|tx| tx.get_ref_by(bk, key(i).as_bytes()).map(|r| r.u64(0)))
            .unwrap();
    });
    let by_u64 = time(&|i| {
        db.run(|tx| tx.get_ref(u, i).map(|r| r.u64(0))).unwrap();
    });
    println!(
        "{n} keys: depth {} ({} nodes, {} leaves): a byte-key lookup reads {} node rows + the \
         row; {by_bytes:.0} ns vs {by_u64:.0} ns per u64 lookup (one transaction each)",
        index.depth, index.nodes, index.leaves, index.depth
    );
}

/// Dropping a byte-key table drops its hidden index table too (issue 21), and a table whose
/// values may go out of line is refused with a reason rather than leaking its chunks.
#[test]
fn dropping_a_byte_key_table_drops_its_index_and_chunk_tables() {
    use pmtx::catalog::{ColumnType, Schema};
    let db = common::temp_db(pmtx::engine::EngineKind::Falcon, 64 << 20);
    let t = db
        .create_table(Schema::new("names", &[("v", ColumnType::U64)]).with_byte_keys(32))
        .unwrap();
    db.run(|tx| tx.insert_by(t, b"alice", &[pmtx::db::Value::U64(1)]))
        .unwrap();
    let hidden = |db: &pmtx::db::Db| {
        db.engine()
            .catalog()
            .live_tables()
            .filter(|(_, s)| s.name.starts_with("__pmtx_bkey_"))
            .count()
    };
    assert_eq!(hidden(&db), 1);
    db.drop_table(t).unwrap();
    assert_eq!(hidden(&db), 0, "the index table went with the table");
    let t = db
        .create_table(Schema::new("names", &[("v", ColumnType::U64)]).with_byte_keys(32))
        .unwrap();
    assert!(db
        .run(|tx| tx.exists_by(t, b"alice"))
        .is_ok_and(|present| !present));
    // A byte-key table with long values: its chunk table goes too.
    let docs = db
        .create_table(Schema::new("docs", &[("body", ColumnType::Text(4000))]).with_byte_keys(32))
        .unwrap();
    let body = "b".repeat(4000);
    db.run(|tx| tx.insert_by(docs, b"readme", &[pmtx::db::Value::Str(&body)]))
        .unwrap();
    let chunks = db.schema(docs).unwrap().chunk_table.expect("a chunk table");
    let name = &db.engine().catalog().tables[chunks as usize].name;
    assert!(
        name.starts_with("__pmtx_vchunks_") && name.ends_with("_docs"),
        "{name}"
    );
    assert_eq!(hidden(&db), 2);
    db.drop_table(docs).unwrap();
    assert_eq!(hidden(&db), 1, "the index table went with the table");
    assert!(
        db.schema(chunks).is_none(),
        "the chunk table went with the table"
    );
}
