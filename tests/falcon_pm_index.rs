//! Issue 17: Falcon tables whose primary index lives in PM. Placement per table and by the
//! database default, kept across reopen; the data and the structure check after a clean reopen
//! and after a reopen that skipped the clean shutdown; refusals where PM indexes do not apply.

use pmtx::catalog::{ColumnType, Schema};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind, TxError};
use pmtx::index::IndexPlacement;
use pmtx::pmem::PersistenceDomain;

fn config(engine: EngineKind, domain: PersistenceDomain, path: &std::path::Path) -> DbConfig {
    DbConfig::temporary()
        .engine(engine)
        .protocol(Protocol::Occ)
        .domain(domain)
        .pool_size(32 << 20)
        .max_threads(3)
        .path(path)
}

fn kv(name: &str) -> Schema {
    Schema::new(name, &[("v", ColumnType::U64)])
}

/// Inserts keys 0..n into both tables, updates the even ones, deletes multiples of 3.
fn fill(db: &Db, tables: &[u32], n: u64) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        db.run(|tx| {
            for &t in tables {
                for &k in chunk {
                    tx.insert(t, k, &[Value::U64(k)])?;
                }
            }
            Ok(())
        })
        .unwrap();
    }
    db.run(|tx| {
        for &t in tables {
            for k in (0..n).step_by(2) {
                tx.update(t, k, &[(0, Value::U64(k + 1_000_000))])?;
            }
            for k in (0..n).step_by(3) {
                tx.delete(t, k)?;
            }
        }
        Ok(())
    })
    .unwrap();
}

fn expected(k: u64) -> Option<u64> {
    if k % 3 == 0 {
        None
    } else if k % 2 == 0 {
        Some(k + 1_000_000)
    } else {
        Some(k)
    }
}

fn verify(db: &Db, tables: &[u32], n: u64) {
    db.run(|tx| {
        for &t in tables {
            for k in 0..n {
                let got = match tx.get(t, k) {
                    Ok(row) => Some(row.u64(0)),
                    Err(TxError::NotFound { .. }) => None,
                    Err(e) => return Err(e),
                };
                assert_eq!(got, expected(k), "table {t} key {k}");
            }
        }
        Ok(())
    })
    .unwrap();
    let live = (0..n).filter(|&k| expected(k).is_some()).count() as u64;
    let counts = db.check_structure().unwrap();
    for &t in tables {
        assert_eq!(counts[t as usize], live, "table {t}");
    }
}

#[test]
fn pm_tables_keep_their_placement_and_data_across_reopen() {
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool");
        let n = 3000;
        {
            // The database default is PM; one table asks for DRAM explicitly.
            let db = Db::create(
                config(EngineKind::Falcon, domain, &path).index_placement(IndexPlacement::Pm),
            )
            .unwrap();
            let hash = db.create_table(kv("hash")).unwrap();
            let ordered = db.create_table(kv("ordered").ordered()).unwrap();
            let dram = db
                .create_table(kv("dram").placed(IndexPlacement::Dram))
                .unwrap();
            assert_eq!(
                db.schema(hash).unwrap().index_placement,
                Some(IndexPlacement::Pm)
            );
            assert_eq!(
                db.schema(dram).unwrap().index_placement,
                Some(IndexPlacement::Dram)
            );
            fill(&db, &[hash, ordered, dram], n);
            verify(&db, &[hash, ordered, dram], n);
        }
        // Reopened with the DRAM default: the tables keep the placement they were created with.
        let db = Db::open(config(EngineKind::Falcon, domain, &path)).unwrap();
        let (hash, ordered, dram) = (
            db.table("hash").unwrap(),
            db.table("ordered").unwrap(),
            db.table("dram").unwrap(),
        );
        assert_eq!(
            db.schema(ordered).unwrap().index_placement,
            Some(IndexPlacement::Pm)
        );
        verify(&db, &[hash, ordered, dram], n);
        // Range scans on the PM ordered index, both directions.
        let keys: Vec<u64> = db
            .run(|tx| {
                Ok(tx
                    .scan(ordered, 100, 10)?
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect())
            })
            .unwrap();
        let want: Vec<u64> = (100..).filter(|k| k % 3 != 0).take(10).collect();
        assert_eq!(keys, want, "{domain}");
        let err = db.run(|tx| tx.scan(hash, 0, 1)).unwrap_err();
        assert!(err.to_string().contains("ordered"), "{err}");
        let report = db.recovery_report().unwrap();
        let phases: Vec<&str> = report.phases.iter().map(|(p, _)| p.as_str()).collect();
        assert!(
            phases.contains(&"catalog") && phases.contains(&"index recovery"),
            "{phases:?}"
        );
    }
}

#[test]
fn engines_without_pm_indexes_refuse_them_clearly() {
    let dir = tempfile::tempdir().unwrap();
    for (engine, name) in [(EngineKind::Zen, "zen"), (EngineKind::Fir, "fir")] {
        let with = |file: &str| {
            config(engine, PersistenceDomain::Eadr, &dir.path().join(file))
                .protocol(engine.default_protocol())
        };
        match Db::create(with(&format!("{name}-default")).index_placement(IndexPlacement::Pm)) {
            Err(DbError::Config(m)) => assert!(m.contains(name) && m.contains("DRAM"), "{m}"),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("{name} accepted a PM index default"),
        }
        let db = Db::create(with(&format!("{name}-table"))).unwrap();
        let err = db
            .create_table(kv("t").placed(IndexPlacement::Pm))
            .unwrap_err();
        assert!(
            matches!(&err, DbError::Config(m) if m.contains(name)),
            "{err}"
        );
    }
    let volatile = Db::create(
        DbConfig::temporary()
            .engine(EngineKind::Volatile)
            .pool_size(32 << 20)
            .max_threads(2),
    )
    .unwrap();
    let err = volatile
        .create_table(kv("t").placed(IndexPlacement::Pm))
        .unwrap_err();
    assert!(
        matches!(&err, DbError::Config(m) if m.contains("volatile")),
        "{err}"
    );
    assert_eq!("PM".parse::<IndexPlacement>(), Ok(IndexPlacement::Pm));
    assert!("nvm"
        .parse::<IndexPlacement>()
        .unwrap_err()
        .contains("dram"));
}
