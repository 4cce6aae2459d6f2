//! Variable-length values (issue 21, item 1): `VarBytes(max)` and `Text(max)` columns, inline and
//! out of line, on every engine: random insert/update/delete against a `HashMap` model, boundary
//! lengths, typed getters and their errors, chunks freed on update and delete, values surviving
//! a reopen, the tuple size limit.

use pmtx::catalog::INLINE_CAPACITY;
use pmtx::db::CHUNK_BYTES;
use pmtx::prelude::*;
use proptest::prelude::*;
use std::collections::HashMap;

/// A blob column that spills (max well beyond the inline area), a short text column that never
/// does, and a fixed column.
const BLOB_MAX: usize = 3000;
const NAME_MAX: usize = 100;

fn schema() -> Schema {
    Schema::new(
        "docs",
        &[
            ("n", ColumnType::U64),
            ("name", ColumnType::Text(NAME_MAX as u32)),
            ("blob", ColumnType::VarBytes(BLOB_MAX as u32)),
            ("note", ColumnType::Text(BLOB_MAX as u32)),
        ],
    )
    .ordered()
}

fn config(engine: EngineKind) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .protocol(engine.default_protocol())
        .pool_size(48 << 20)
        .max_threads(2)
}

fn db_of(engine: EngineKind) -> Db {
    Db::create(config(engine)).unwrap()
}

/// A row's content in the model.
#[derive(Clone, Debug, PartialEq)]
struct Doc {
    n: u64,
    name: String,
    blob: Vec<u8>,
    note: String,
}

impl Doc {
    fn values(&self) -> [Value<'_>; 4] {
        [
            Value::U64(self.n),
            Value::Str(&self.name),
            Value::Bytes(&self.blob),
            Value::Str(&self.note),
        ]
    }
}

fn read_doc(row: &Row) -> Doc {
    Doc {
        n: row.get_u64("n").unwrap(),
        name: row.get_str("name").unwrap().to_string(),
        blob: row.get_bytes("blob").unwrap().to_vec(),
        note: row.get_str("note").unwrap().to_string(),
    }
}

/// Chunk rows the values of `docs` take.
fn expected_chunks<'a>(docs: impl IntoIterator<Item = &'a Doc>) -> u64 {
    let chunks = |len: usize| len.saturating_sub(INLINE_CAPACITY).div_ceil(CHUNK_BYTES) as u64;
    docs.into_iter()
        .map(|d| chunks(d.blob.len()) + chunks(d.note.len()))
        .sum()
}

/// Rows in the live tables' chunk tables.
fn chunk_rows(db: &Db) -> u64 {
    let tables: Vec<u32> = (db.engine().catalog().live_tables())
        .filter_map(|(_, s)| s.chunk_table)
        .collect();
    db.release_idle_workers();
    let counts = db.check_structure().unwrap();
    tables.iter().map(|&t| counts[t as usize]).sum()
}

fn doc_strategy() -> impl Strategy<Value = Doc> {
    // Lengths cluster at the edges that matter: empty, inline, one byte over, several chunks.
    let len = prop_oneof![
        Just(0usize),
        Just(INLINE_CAPACITY),
        Just(INLINE_CAPACITY + 1),
        Just(INLINE_CAPACITY + CHUNK_BYTES),
        Just(BLOB_MAX),
        0..=BLOB_MAX,
    ];
    (any::<u64>(), 0..=NAME_MAX, len.clone(), len, any::<u8>()).prop_map(
        |(n, name_len, blob_len, note_len, seed)| Doc {
            n,
            name: "é".repeat(name_len / 2),
            blob: (0..blob_len)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect(),
            note: (0..note_len)
                .map(|i| char::from(b'a' + ((i + seed as usize) % 26) as u8))
                .collect(),
        },
    )
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, Doc),
    Update(u64, Doc),
    /// Sets only the note (a spilling column) and n.
    SetNote(u64, String),
    Delete(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let key = 0u64..6;
    prop_oneof![
        (key.clone(), doc_strategy()).prop_map(|(k, d)| Op::Insert(k, d)),
        (key.clone(), doc_strategy()).prop_map(|(k, d)| Op::Update(k, d)),
        (key.clone(), doc_strategy()).prop_map(|(k, d)| Op::SetNote(k, d.note)),
        key.prop_map(Op::Delete),
    ]
}

/// Applies `ops` (each its own transaction) to `db` and to the model, checking every outcome.
fn apply(db: &Db, t: TableId, ops: &[Op], model: &mut HashMap<u64, Doc>) {
    for op in ops {
        match op {
            Op::Insert(k, d) => {
                let r = db.run(|tx| tx.insert(t, *k, &d.values()));
                match model.contains_key(k) {
                    true => assert!(r.is_err(), "duplicate insert of {k} succeeded"),
                    false => {
                        r.unwrap();
                        model.insert(*k, d.clone());
                    }
                }
            }
            Op::Update(k, d) => {
                let r = db.run(|tx| {
                    tx.update(
                        t,
                        *k,
                        &[
                            (0, Value::U64(d.n)),
                            (1, Value::Str(&d.name)),
                            (2, Value::Bytes(&d.blob)),
                            (3, Value::Str(&d.note)),
                        ],
                    )
                });
                match model.get_mut(k) {
                    Some(m) => {
                        r.unwrap();
                        *m = d.clone();
                    }
                    None => assert!(r.is_err(), "update of missing {k} succeeded"),
                }
            }
            Op::SetNote(k, note) => {
                let r = db.run(|tx| tx.update(t, *k, &[(3, Value::Str(note))]));
                match model.get_mut(k) {
                    Some(m) => {
                        r.unwrap();
                        m.note = note.clone();
                    }
                    None => assert!(r.is_err(), "update of missing {k} succeeded"),
                }
            }
            Op::Delete(k) => {
                let r = db.run(|tx| tx.delete(t, *k));
                assert_eq!(r.is_ok(), model.remove(k).is_some(), "delete of {k}");
            }
        }
    }
}

/// Every key's row (or its absence) as in `model`, by point reads, `get_ref` and a range scan.
fn check_against(db: &Db, t: TableId, model: &HashMap<u64, Doc>) {
    for k in 0..6u64 {
        let got = db
            .run(|tx| match tx.get(t, k) {
                Ok(row) => Ok(Some(read_doc(&row))),
                Err(TxError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            })
            .unwrap();
        assert_eq!(got.as_ref(), model.get(&k), "key {k}");
        let by_ref = db
            .run(|tx| match tx.get_ref(t, k) {
                Ok(row) => Ok(Some(row.get_bytes("blob")?.to_vec())),
                Err(TxError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            })
            .unwrap();
        assert_eq!(by_ref, model.get(&k).map(|d| d.blob.clone()), "key {k}");
    }
    let scanned: HashMap<u64, Doc> = db
        .run(|tx| {
            tx.range(t, ..)
                .map(|r| r.map(|(k, row)| (k, read_doc(&row))))
                .collect()
        })
        .unwrap();
    assert_eq!(&scanned, model);
    // Borrowed views of a scan carry the out-of-line values too.
    let mut blobs = HashMap::new();
    db.run(|tx| {
        blobs.clear();
        tx.scan_refs(t, 0, false, usize::MAX, &mut |k, row| {
            blobs.insert(k, row.get_bytes("blob").unwrap().to_vec());
            true
        })
    })
    .unwrap();
    let model_blobs: HashMap<u64, Vec<u8>> =
        model.iter().map(|(k, d)| (*k, d.blob.clone())).collect();
    assert_eq!(blobs, model_blobs);
    assert_eq!(
        chunk_rows(db),
        expected_chunks(model.values()),
        "chunk rows"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn random_values_match_a_hashmap_on_every_engine(
        ops in proptest::collection::vec(op_strategy(), 1..24)
    ) {
        for engine in EngineKind::ALL {
            let db = db_of(engine);
            let t = db.create_table(schema()).unwrap();
            let mut model = HashMap::new();
            apply(&db, t, &ops, &mut model);
            check_against(&db, t, &model);
        }
    }
}

#[test]
fn boundary_lengths_on_every_engine() {
    for engine in EngineKind::ALL {
        let db = db_of(engine);
        let t = db.create_table(schema()).unwrap();
        let lens = [0, INLINE_CAPACITY, INLINE_CAPACITY + 1, BLOB_MAX];
        for (k, &len) in lens.iter().enumerate() {
            let blob: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let note = "x".repeat(len);
            db.run(|tx| {
                tx.insert(
                    t,
                    k as u64,
                    &[
                        Value::U64(1),
                        Value::Str(""),
                        Value::Bytes(&blob),
                        Value::Str(&note),
                    ],
                )
            })
            .unwrap();
            let (b, n) = db
                .run(|tx| {
                    let row = tx.get(t, k as u64)?;
                    Ok((
                        row.get_bytes("blob")?.to_vec(),
                        row.get_str("note")?.to_string(),
                    ))
                })
                .unwrap();
            assert_eq!((b.len(), n.len()), (len, len), "{engine}: length {len}");
            assert_eq!((b, n), (blob, note), "{engine}: length {len}");
        }
        // One past the maximum: refused with the sizes named, the transaction still usable.
        let too_long = vec![7u8; BLOB_MAX + 1];
        let err = db
            .run(|tx| {
                let e = tx
                    .update(t, 0, &[(2, Value::Bytes(&too_long))])
                    .unwrap_err();
                tx.update(t, 0, &[(0, Value::U64(2))])?;
                Ok(e)
            })
            .unwrap();
        assert!(matches!(err, TxError::RowTooLarge(_)), "{engine}: {err}");
        assert!(err.to_string().contains("at most 3000"), "{err}");
        let name = "n".repeat(NAME_MAX + 1);
        let err = db
            .run(|tx| {
                tx.insert(
                    t,
                    9,
                    &[
                        Value::U64(0),
                        Value::Str(&name),
                        Value::Bytes(b""),
                        Value::Str(""),
                    ],
                )
            })
            .unwrap_err();
        assert!(err.to_string().contains("'name'"), "{engine}: {err}");
        let n = db.run(|tx| tx.get(t, 0).map(|r| r.u64(0))).unwrap();
        assert_eq!(n, 2, "{engine}");
        assert_eq!(
            chunk_rows(&db),
            2 * (1 + (BLOB_MAX - INLINE_CAPACITY).div_ceil(CHUNK_BYTES)) as u64
        );
    }
}

#[test]
fn getters_refuse_wrong_types_and_invalid_utf8() {
    let db = db_of(EngineKind::Falcon);
    let t = db.create_table(schema()).unwrap();
    db.run(|tx| {
        tx.insert(
            t,
            1,
            &[
                Value::U64(5),
                Value::Str("ada"),
                Value::Bytes(&[0xff; 200]),
                Value::Str("hi"),
            ],
        )
    })
    .unwrap();
    db.run(|tx| {
        let row = tx.get(t, 1)?;
        assert_eq!(row.get_str("name")?, "ada");
        assert!(matches!(
            row.get_str("blob"),
            Err(TxError::SchemaMismatch(_))
        ));
        assert!(matches!(row.get_str("n"), Err(TxError::SchemaMismatch(_))));
        assert!(matches!(
            row.get_u64("name"),
            Err(TxError::SchemaMismatch(_))
        ));
        assert!(matches!(
            row.get_str("nope"),
            Err(TxError::SchemaMismatch(_))
        ));
        assert!(row.try_str(9).is_err());
        // A VarBytes column takes bytes or a string, a Text column only a string.
        assert!(matches!(
            tx.update(t, 1, &[(1, Value::Bytes(b"raw"))]),
            Err(TxError::SchemaMismatch(_))
        ));
        tx.update(t, 1, &[(2, Value::Str("text as bytes"))])?;
        assert_eq!(tx.get(t, 1)?.get_bytes("blob")?, b"text as bytes");
        // Raw writes cannot keep chunks in step: refused on a table whose values may spill.
        assert!(matches!(
            tx.insert_bytes(t, 2, &[0; 8]),
            Err(TxError::Unsupported(_))
        ));
        Ok(())
    })
    .unwrap();
    // Invalid UTF-8 can only come from raw bytes (allowed where nothing spills): reported.
    let short = db
        .create_table(Schema::new("short", &[("s", ColumnType::Text(8))]))
        .unwrap();
    let mut raw = vec![0u8; 12];
    raw[..4].copy_from_slice(&2u32.to_le_bytes());
    raw[4..6].copy_from_slice(&[0xc3, 0x28]);
    db.run(|tx| tx.insert_bytes(short, 1, &raw)).unwrap();
    let err = db
        .run(|tx| tx.get(short, 1)?.get_str("s").map(str::len))
        .unwrap_err();
    assert!(err.to_string().contains("invalid UTF-8"), "{err}");
    raw[..4].copy_from_slice(&9u32.to_le_bytes());
    db.run(|tx| {
        tx.update_bytes(
            short,
            1,
            &[pmtx::engine::FieldWrite {
                offset: 0,
                bytes: &raw[..4],
            }],
        )
    })
    .unwrap();
    let err = db
        .run(|tx| tx.get(short, 1)?.get_str("s").map(str::len))
        .unwrap_err();
    assert!(err.to_string().contains("beyond its maximum"), "{err}");
}

#[test]
fn updates_and_deletes_free_chunks_on_every_engine() {
    for engine in EngineKind::ALL {
        let db = db_of(engine);
        let t = db.create_table(schema()).unwrap();
        assert_eq!(chunk_rows(&db), 0);
        let big = vec![1u8; BLOB_MAX];
        let note = "y".repeat(INLINE_CAPACITY + 2 * CHUNK_BYTES);
        db.run(|tx| {
            tx.insert(
                t,
                1,
                &[
                    Value::U64(0),
                    Value::Str(""),
                    Value::Bytes(&big),
                    Value::Str(&note),
                ],
            )
        })
        .unwrap();
        assert_eq!(chunk_rows(&db), 3 + 2, "{engine}");
        // Shrinking keeps the common chunks, frees the rest.
        db.run(|tx| tx.update(t, 1, &[(2, Value::Bytes(&big[..INLINE_CAPACITY + 1]))]))
            .unwrap();
        assert_eq!(chunk_rows(&db), 1 + 2, "{engine}");
        // Back inline: no chunk left for the column.
        db.run(|tx| tx.update(t, 1, &[(2, Value::Bytes(b"small"))]))
            .unwrap();
        assert_eq!(chunk_rows(&db), 2, "{engine}");
        // The same column twice in one update: the last value wins, nothing leaks.
        db.run(|tx| {
            tx.update(
                t,
                1,
                &[(2, Value::Bytes(&big)), (2, Value::Bytes(&big[..500]))],
            )
        })
        .unwrap();
        assert_eq!(chunk_rows(&db), 1 + 2, "{engine}");
        // Updating only columns that never spill leaves the chunks alone.
        db.run(|tx| tx.update(t, 1, &[(0, Value::U64(4)), (1, Value::Str("short"))]))
            .unwrap();
        assert_eq!(chunk_rows(&db), 1 + 2, "{engine}");
        let doc = db.run(|tx| Ok(read_doc(&tx.get(t, 1)?))).unwrap();
        assert_eq!(
            (doc.n, doc.name.as_str(), doc.blob.len()),
            (4, "short", 500)
        );
        assert_eq!(doc.note, note, "{engine}");
        // A rolled-back update changes nothing.
        let mut txn = db.begin().unwrap();
        txn.update(t, 1, &[(3, Value::Str(""))]).unwrap();
        txn.rollback();
        assert_eq!(chunk_rows(&db), 1 + 2, "{engine}");
        db.run(|tx| tx.delete(t, 1)).unwrap();
        assert_eq!(chunk_rows(&db), 0, "{engine}");
        // The hidden table is not listed.
        assert_eq!(db.tables().len(), 1, "{engine}");
        assert!(db.tables().iter().all(|(_, s)| s.name == "docs"));
    }
}

#[test]
fn values_survive_reopen() {
    for engine in EngineKind::ALL
        .into_iter()
        .filter(|&e| e != EngineKind::Volatile)
    {
        let path = std::path::Path::new("/dev/shm").join(format!(
            "pmtx-varlen-reopen-{}-{engine}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let note = "é".repeat(1200);
        let blob: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
        {
            let mut cfg = config(engine).path(&path);
            // eADR: the one domain every durable engine runs under (falcon-noflush needs it).
            cfg.domain = Some(PersistenceDomain::Eadr);
            let db = Db::create(cfg).unwrap();
            let t = db.create_table(schema()).unwrap();
            db.run(|tx| {
                tx.insert(
                    t,
                    3,
                    &[
                        Value::U64(9),
                        Value::Str("x"),
                        Value::Bytes(&blob),
                        Value::Str(&note),
                    ],
                )
            })
            .unwrap();
        }
        let db = Db::open(config(engine).path(&path)).unwrap();
        let t = db.table("docs").unwrap();
        let doc = db.run(|tx| Ok(read_doc(&tx.get(t, 3)?))).unwrap();
        assert_eq!(
            doc,
            Doc {
                n: 9,
                name: "x".into(),
                blob,
                note
            },
            "{engine}"
        );
        drop(db);
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn row_size_limit_and_reserved_names() {
    let db = Db::create(config(EngineKind::Falcon).max_row_bytes(256)).unwrap();
    // 8 + (4 + 128) + 200 = 340 bytes stored: over the limit, whatever the values.
    let err = db
        .create_table(Schema::new(
            "wide",
            &[
                ("a", ColumnType::U64),
                ("t", ColumnType::Text(5000)),
                ("b", ColumnType::Bytes(200)),
            ],
        ))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("340") && err.contains("256") && err.contains("max_row_bytes"),
        "{err}"
    );
    // A refused schema leaves no chunk table behind.
    assert!(db.engine().catalog().tables.is_empty());
    // Long values do not count against the limit: chunks are rows of at most the limit.
    let t = db
        .create_table(Schema::new("ok", &[("t", ColumnType::Text(5000))]))
        .unwrap();
    let long = "z".repeat(5000);
    db.run(|tx| tx.insert(t, 1, &[Value::Str(&long)])).unwrap();
    assert_eq!(
        db.run(|tx| Ok(tx.get(t, 1)?.get_str("t")?.len())).unwrap(),
        5000
    );
    let chunk_table = db.schema(t).unwrap().chunk_table.unwrap();
    assert_eq!(db.schema(chunk_table).unwrap().row_size(), 256);
    assert_eq!(
        chunk_rows(&db),
        (5000 - INLINE_CAPACITY).div_ceil(256) as u64
    );
    let err = db
        .create_table(Schema::new("__pmtx_mine", &[("a", ColumnType::U64)]))
        .unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
}

/// Long values in a table with byte-string keys (issue 21 items 1a and 1b together): the values
/// go out of line under the row ids the key index hands out, and update and delete by key keep
/// the chunk table exact.
#[test]
fn long_values_in_a_byte_key_table() {
    for engine in [EngineKind::Falcon, EngineKind::Zen, EngineKind::Mmdb] {
        let db = Db::create(
            DbConfig::temporary()
                .engine(engine)
                .protocol(engine.default_protocol())
                .max_threads(2)
                .pool_size(64 << 20),
        )
        .unwrap();
        let t = db
            .create_table(
                Schema::new("docs", &[("body", ColumnType::Text(5000))]).with_byte_keys(32),
            )
            .unwrap();
        let long = "x".repeat(3000);
        let longer = "y".repeat(4500);
        db.run(|tx| {
            tx.insert_by(t, b"alpha", &[Value::Str(&long)])?;
            tx.insert_by(t, b"beta", &[Value::Str("short")])
        })
        .unwrap();
        let chunks_of = |len: usize| (len - INLINE_CAPACITY).div_ceil(CHUNK_BYTES) as u64;
        assert_eq!(chunk_rows(&db), chunks_of(3000), "{engine}");
        db.run(|tx| tx.update_by(t, b"alpha", &[(0, Value::Str(&longer))]))
            .unwrap();
        assert_eq!(chunk_rows(&db), chunks_of(4500), "{engine}");
        let (a, b) = db
            .run(|tx| {
                let a = tx.get_by(t, b"alpha")?.get_str("body")?.to_string();
                let b = tx.get_by(t, b"beta")?.get_str("body")?.to_string();
                Ok((a, b))
            })
            .unwrap();
        assert_eq!(
            (a.as_str(), b.as_str()),
            (longer.as_str(), "short"),
            "{engine}"
        );
        let rows: Vec<String> = db
            .run(|tx| {
                tx.range_by::<&[u8]>(t, ..)
                    .map(|r| r.and_then(|(_, row)| Ok(row.get_str("body")?.len().to_string())))
                    .collect()
            })
            .unwrap();
        assert_eq!(rows, vec!["4500".to_string(), "5".to_string()], "{engine}");
        db.run(|tx| tx.delete_by(t, b"alpha")).unwrap();
        assert_eq!(chunk_rows(&db), 0, "{engine}: chunks freed with the row");
    }
}

/// A table with long values has a chunk table of its own, dropped with it: forty rounds of
/// creating, filling (each round's chunks take most of a heap page) and dropping the table in a
/// pool with room for three such rounds never run out of space, and no hidden table is left.
#[test]
fn a_table_with_long_values_drops_its_chunks_and_their_space_is_reused() {
    for engine in EngineKind::ALL {
        let pool = pmtx::db::min_pool_size(engine, 2) + 6 * pmtx::alloc::PAGE_SIZE;
        let db = Db::create(config(engine).pool_size(pool)).unwrap();
        let body = "x".repeat(INLINE_CAPACITY + 2 * CHUNK_BYTES);
        for round in 0..40u64 {
            let t = db
                .create_table(Schema::new("docs", &[("body", ColumnType::Text(4000))]))
                .unwrap();
            for keys in (0..700u64).collect::<Vec<_>>().chunks(50) {
                db.run(|tx| {
                    keys.iter()
                        .try_for_each(|&k| tx.insert(t, k, &[Value::Str(&body)]))
                })
                .unwrap_or_else(|e| panic!("{engine}, round {round}: {e}"));
            }
            assert_eq!(chunk_rows(&db), 1400, "{engine}");
            let chunks = db.schema(t).unwrap().chunk_table.unwrap();
            db.drop_table(t).unwrap();
            assert!(
                db.schema(chunks).is_none(),
                "{engine}: the chunk table is dropped"
            );
        }
        let hidden = (db.engine().catalog().live_tables()).count();
        assert_eq!(hidden, 0, "{engine}: tables left behind");
    }
}

/// A crash between a table's drop and its hidden tables' leaves them unreferenced: the next open
/// drops them, so their rows do not stay for good and a new table of the name starts empty.
#[test]
fn hidden_tables_left_by_an_interrupted_drop_are_dropped_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orphans.pool");
    let cfg = || config(EngineKind::Falcon).path(&path);
    let schema = || Schema::new("docs", &[("body", ColumnType::Text(4000))]).with_byte_keys(16);
    let body = "y".repeat(3000);
    let (index, chunks) = {
        let db = Db::create(cfg()).unwrap();
        let t = db.create_table(schema()).unwrap();
        db.run(|tx| tx.insert_by(t, b"k", &[Value::Str(&body)]))
            .unwrap();
        let s = db.schema(t).unwrap();
        let index = match s.key {
            pmtx::catalog::PrimaryKey::Bytes(k) => k.index_table.unwrap(),
            _ => unreachable!(),
        };
        // The owner's drop alone, as a crash right after it leaves things.
        db.release_idle_workers();
        db.engine().drop_table(t).unwrap();
        assert!(db.schema(index).is_some() && db.schema(chunks_of(&s)).is_some());
        (index, chunks_of(&s))
    };
    let db = Db::open(cfg()).unwrap();
    assert!(
        db.schema(index).is_none(),
        "the index table was dropped at open"
    );
    assert!(
        db.schema(chunks).is_none(),
        "the chunk table was dropped at open"
    );
    let t = db.create_table(schema()).unwrap();
    assert!(!db.run(|tx| tx.exists_by(t, b"k")).unwrap());
    assert_eq!(chunk_rows(&db), 0);
}

fn chunks_of(s: &Schema) -> u32 {
    s.chunk_table.unwrap()
}

/// Databases made before each table had its own chunk table keep the shared one: their tables'
/// long values are read and written there, and dropping such a table is refused with a reason
/// (its chunks cannot be told from the other tables').
#[test]
fn an_older_database_shares_one_chunk_table_and_refuses_its_tables_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("older.pool");
    let cfg = || config(EngineKind::Falcon).path(&path);
    {
        // The catalog an older version wrote: the shared chunk table, then a table without a
        // chunk table of its own (made through the engine, as `Db::create_table` now adds one).
        let db = Db::create(cfg()).unwrap();
        let engine = db.engine();
        let shared = Schema::new(pmtx::db::CHUNK_TABLE, &[("data", ColumnType::Bytes(1024))]);
        engine.create_table(shared).unwrap();
        engine
            .create_table(Schema::new("old", &[("body", ColumnType::Text(4000))]))
            .unwrap();
    }
    let db = Db::open(cfg()).unwrap();
    let t = db.table("old").unwrap();
    assert_eq!(db.schema(t).unwrap().chunk_table, None);
    let body = "z".repeat(INLINE_CAPACITY + 3 * CHUNK_BYTES);
    db.run(|tx| tx.insert(t, 1, &[Value::Str(&body)])).unwrap();
    assert_eq!(
        db.run(|tx| Ok(tx.get(t, 1)?.get_str("body")?.to_string()))
            .unwrap(),
        body
    );
    db.release_idle_workers();
    let counts = db.check_structure().unwrap();
    assert_eq!(counts[0], 3, "the chunks are in the shared table");
    let err = db.drop_table(t).unwrap_err().to_string();
    assert!(err.contains("cannot be dropped"), "{err}");
    assert!(db.schema(t).is_some(), "a refused drop changes nothing");
    // A table made now gets its own.
    let new = db
        .create_table(Schema::new("new", &[("body", ColumnType::Text(4000))]))
        .unwrap();
    assert!(db.schema(new).unwrap().chunk_table.is_some());
}
