//! Dropping tables (issue 21, item 4): the name is free at once and the id stays taken, the
//! drop survives a reopen, its space is reused by other tables (a create/drop loop in a small
//! pool never runs out), and every misuse is a clear error; on every engine.

use common::value;
use pmtx::catalog::CatalogError;
use pmtx::prelude::*;
use std::path::PathBuf;
use std::time::Duration;

mod common;

/// The engines that drop tables: every one.
fn dropping() -> impl Iterator<Item = EngineKind> {
    EngineKind::ALL.into_iter()
}

fn config(engine: EngineKind) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .protocol(engine.default_protocol())
        .pool_size(24 << 20)
        .max_threads(2)
        .worker_wait(Duration::from_millis(50))
}

fn kv(name: &str) -> Schema {
    Schema::new(name, &[("v", ColumnType::U64)])
}

fn fill(db: &Db, t: TableId, keys: std::ops::Range<u64>, v: u64) {
    for chunk in keys.collect::<Vec<_>>().chunks(500) {
        db.run(|tx| {
            for &k in chunk {
                tx.insert(t, k, &[Value::U64(v + k)])?;
            }
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn a_dropped_table_is_gone_its_name_reusable_and_its_id_an_error() {
    for engine in dropping() {
        let db = Db::create(config(engine)).unwrap();
        let keep = db.create_table(kv("keep")).unwrap();
        let t = db
            .create_table(kv("t").with_secondary("by_v", &["v"]))
            .unwrap();
        fill(&db, keep, 0..50, 1000);
        fill(&db, t, 0..300, 0);
        db.drop_table(t).unwrap();
        assert_eq!(db.table("t"), None, "{engine}");
        assert_eq!(db.schema(t), None, "{engine}");
        let names: Vec<String> = db.tables().into_iter().map(|(_, s)| s.name).collect();
        assert_eq!(names, ["keep"], "{engine}");
        // Use after drop: every operation names the dropped table.
        let err = db.run(|tx| tx.get(t, 1)).unwrap_err();
        assert!(
            err.to_string().contains("'t' (id 1) was dropped"),
            "{engine}: {err}"
        );
        for op in 0..4 {
            let err = db
                .run(|tx| match op {
                    0 => tx.insert(t, 9999, &[Value::U64(1)]),
                    1 => tx.delete(t, 1),
                    2 => tx.insert_bytes(t, 9999, &[0; 8]),
                    _ => tx.read_into(t, 1, &mut [0; 8]),
                })
                .unwrap_err();
            assert!(
                err.to_string().contains("was dropped"),
                "{engine} op {op}: {err}"
            );
        }
        assert!(db
            .column(t, "v")
            .unwrap_err()
            .to_string()
            .contains("dropped"));
        // Drop twice, an unknown id.
        let err = db.drop_table(t).unwrap_err();
        assert!(
            matches!(
                err,
                DbError::Catalog(CatalogError::TableDropped { id: 1, .. })
            ),
            "{engine}: {err}"
        );
        let err = db.drop_table(42).unwrap_err();
        assert!(
            matches!(err, DbError::Catalog(CatalogError::NoSuchTable(42))),
            "{engine}: {err}"
        );
        // The name again: a new, empty table with a new id, and the same keys insert anew.
        let t2 = db.create_table(kv("t")).unwrap();
        assert_eq!(t2, 2, "{engine}");
        assert_eq!(db.table("t"), Some(t2));
        assert_eq!(value(&db, t2, 5), None, "{engine}");
        fill(&db, t2, 0..300, 7);
        assert_eq!(value(&db, t2, 5), Some(12), "{engine}");
        assert_eq!(value(&db, keep, 5), Some(1005), "{engine}");
        let rows = db.check_structure().unwrap();
        assert_eq!(rows[keep as usize], 50, "{engine}");
        assert_eq!(rows[t as usize], 0, "{engine}");
        assert_eq!(rows[t2 as usize], 300, "{engine}");
    }
}

#[test]
fn a_drop_waits_for_other_workers_and_fails_clearly_if_they_stay() {
    for engine in [EngineKind::Falcon, EngineKind::Inp] {
        let db = Db::create(config(engine)).unwrap();
        let t = db.create_table(kv("t")).unwrap();
        fill(&db, t, 0..10, 0);
        let held = db.worker().unwrap();
        let err = db.drop_table(t).unwrap_err();
        assert!(
            matches!(
                &err,
                DbError::Catalog(CatalogError::Busy { workers: 1, .. })
            ),
            "{engine}: {err}"
        );
        assert_eq!(value(&db, t, 3), Some(3), "the failed drop changed nothing");
        drop(held);
        // The worker `Db::run` keeps idle in its slot does not hold a drop up.
        db.drop_table(t).unwrap();
        assert_eq!(db.tables().len(), 0);
    }
}

/// A pool file under /dev/shm for this test, removed on drop.
struct PoolFile(PathBuf);

impl PoolFile {
    fn new(what: &str, engine: EngineKind) -> PoolFile {
        let path = PathBuf::from(format!(
            "/dev/shm/pmtx-droptest-{}-{what}-{engine}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        PoolFile(path)
    }
}

impl Drop for PoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn on_file(engine: EngineKind, file: &PoolFile) -> DbConfig {
    DbConfig::default()
        .engine(engine)
        .protocol(engine.default_protocol())
        .pool_size(24 << 20)
        .max_threads(2)
        .path(&file.0)
}

#[test]
fn a_drop_survives_a_reopen() {
    for engine in dropping().filter(|&e| e != EngineKind::Volatile) {
        let file = PoolFile::new("reopen", engine);
        let (keep, t) = {
            let db = Db::create(on_file(engine, &file)).unwrap();
            let keep = db.create_table(kv("keep")).unwrap();
            let t = db.create_table(kv("t")).unwrap();
            fill(&db, keep, 0..40, 100);
            fill(&db, t, 0..400, 0);
            // Updates leave the table's entries in the log windows, which recovery must skip.
            // The last transaction writes the kept table, then the dropped one: Zen's commit mark
            // (the LP bit of its last tuple) lies in the dropped table's pages.
            db.run(|tx| {
                tx.insert(keep, 40, &[Value::U64(140)])?;
                tx.update(t, 3, &[(0, Value::U64(77))])
            })
            .unwrap();
            // FIR and MMDB: a checkpoint that names the table's rows, which recovery must skip.
            if let Some(r) = db.engine().checkpoint() {
                r.unwrap();
            }
            db.drop_table(t).unwrap();
            (keep, t)
        };
        let db = Db::open(on_file(engine, &file)).unwrap();
        assert_eq!(db.table("t"), None, "{engine}");
        assert_eq!(db.table("keep"), Some(keep), "{engine}");
        assert_eq!(value(&db, keep, 39), Some(139), "{engine}");
        assert_eq!(value(&db, keep, 40), Some(140), "{engine}");
        let err = db.run(|tx| tx.get(t, 3)).unwrap_err();
        assert!(err.to_string().contains("was dropped"), "{engine}: {err}");
        let t2 = db.create_table(kv("t")).unwrap();
        assert_eq!(value(&db, t2, 3), None, "{engine}");
        fill(&db, t2, 0..10, 5);
        drop(db);
        let db = Db::open(on_file(engine, &file)).unwrap();
        let rows = db.check_structure().unwrap();
        assert_eq!((rows[t as usize], rows[t2 as usize]), (0, 10), "{engine}");
        assert_eq!(value(&db, t2, 3), Some(8), "{engine}");
    }
}

/// 50 rounds of a table that fills a good part of a 24 MiB pool (about 6 MiB of rows), created,
/// filled and dropped, while another table keeps its rows: without reclaimed space the pool
/// would be full after a few rounds.
#[test]
fn create_and_drop_in_a_loop_never_fills_a_small_pool() {
    let big = |name: &str| {
        Schema::new(
            name,
            &[("v", ColumnType::U64), ("pad", ColumnType::Bytes(992))],
        )
    };
    for engine in dropping() {
        let db = Db::create(config(engine)).unwrap();
        let keep = db.create_table(kv("keep")).unwrap();
        fill(&db, keep, 0..20, 0);
        for round in 0..50u64 {
            let t = db.create_table(big("big")).unwrap();
            for chunk in (0..6000u64).collect::<Vec<_>>().chunks(500) {
                db.run(|tx| {
                    for &k in chunk {
                        tx.insert(t, k, &[Value::U64(round), Value::Bytes(&[7; 992])])?;
                    }
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{engine}, round {round}: {e}"));
            }
            db.drop_table(t).unwrap();
        }
        assert_eq!(value(&db, keep, 19), Some(19), "{engine}");
        assert_eq!(db.tables().len(), 1);
    }
}

#[test]
fn a_table_with_persistent_indexes_drops_and_its_index_pages_are_reused() {
    use pmtx::index::IndexPlacement;
    let file = PoolFile::new("pmindex", EngineKind::Falcon);
    let cfg = || on_file(EngineKind::Falcon, &file).index_placement(IndexPlacement::Pm);
    {
        let db = Db::create(cfg()).unwrap();
        let keep = db.create_table(kv("keep").ordered()).unwrap();
        fill(&db, keep, 0..30, 0);
        for round in 0..20 {
            let t = db
                .create_table(kv("t").ordered().with_secondary("by_v", &["v"]))
                .unwrap();
            fill(&db, t, 0..2000, round);
            db.drop_table(t).unwrap();
        }
    }
    let db = Db::open(cfg()).unwrap();
    assert_eq!(db.tables().len(), 1);
    assert_eq!(value(&db, 0, 29), Some(29));
    db.check_structure().unwrap();
    let t = db.create_table(kv("t").ordered()).unwrap();
    fill(&db, t, 0..100, 1);
    assert_eq!(value(&db, t, 99), Some(100));
}

#[test]
fn pmtx_inspect_lists_no_dropped_table() {
    let file = PoolFile::new("inspect", EngineKind::Falcon);
    {
        let db = Db::create(on_file(EngineKind::Falcon, &file)).unwrap();
        let gone = db.create_table(kv("gone_table")).unwrap();
        let kept = db.create_table(kv("kept_table")).unwrap();
        fill(&db, gone, 0..10, 0);
        fill(&db, kept, 0..3, 0);
        db.drop_table(gone).unwrap();
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(["inspect", "--json", file.0.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let tables = json["tables"].as_array().expect("tables");
    assert_eq!(tables.len(), 1, "{stdout}");
    assert_eq!(tables[0]["table"], "kept_table");
    assert_eq!(tables[0]["rows"], 3);
    // `pmtx check` and `pmtx recover` list the live tables only.
    for command in ["check", "recover"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pmtx"))
            .args([command, file.0.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "pmtx {command}: {stdout}");
        assert!(stdout.contains("kept_table"), "pmtx {command}: {stdout}");
        assert!(!stdout.contains("gone_table"), "pmtx {command}: {stdout}");
    }
}
