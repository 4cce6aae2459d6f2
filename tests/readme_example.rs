//! The README's embedding example, run as written (with a temporary pool path), twice: the second
//! run reopens the pool, recovers it, and finds the first run's transfer.

use pmtx::prelude::*;

fn readme_example(path: &std::path::Path) -> Result<(i64, i64), Box<dyn std::error::Error>> {
    let config = DbConfig::temporary()
        .engine(EngineKind::Falcon) // the domain is auto (see "Persistence domains")
        .path(path);
    let db = Db::open_or_create(config)?; // opening runs recovery
    if let Some(warning) = db.durability_warning() {
        eprintln!("warning: {warning}");
    }
    let accounts = match db.table("accounts") {
        Some(t) => t,
        None => db.create_table(Schema::new("accounts", &[("balance", ColumnType::I64)]))?,
    };
    db.run(|tx| {
        if !tx.exists(accounts, 1)? {
            tx.insert(accounts, 1, &[Value::I64(100)])?;
            tx.insert(accounts, 2, &[Value::I64(0)])?;
        }
        let a = tx.get(accounts, 1)?.i64(0);
        let b = tx.get(accounts, 2)?.i64(0);
        tx.update(accounts, 1, &[(0, Value::I64(a - 10))])?;
        tx.update(accounts, 2, &[(0, Value::I64(b + 10))])
    })?;
    Ok(db.run(|tx| Ok((tx.get(accounts, 1)?.i64(0), tx.get(accounts, 2)?.i64(0))))?)
}

#[test]
fn the_readme_example_runs_and_survives_a_reopen() {
    // Under /dev/shm (auto: eADR, with the tmpfs warning) as in the README, and on the disk file
    // system of the temp dir (auto: msync, no warning).
    for dir in [
        tempfile::tempdir_in("/dev/shm").unwrap(),
        tempfile::tempdir().unwrap(),
    ] {
        let path = dir.path().join("bank.pool");
        assert_eq!(readme_example(&path).unwrap(), (90, 10));
        assert_eq!(readme_example(&path).unwrap(), (80, 20));
        let db = Db::open(DbConfig::temporary().path(&path)).unwrap();
        let detected = pmtx::pmem::platform::detect_domain(Some(&path));
        assert_eq!(db.domain(), detected.domain, "{}", detected.reason);
        let expected_warning = matches!(
            detected.storage,
            pmtx::pmem::platform::Storage::Memory | pmtx::pmem::platform::Storage::PageCache
        ) && db.domain() != PersistenceDomain::Msync;
        assert_eq!(db.durability_warning().is_some(), expected_warning);
    }
}

/// The README's persistent-object example ("Persistent objects"), as written but for the pool
/// path; run twice, the second run recovers the pool and finds the first run's node.
fn ptm_readme_example(path: &std::path::Path) -> Result<(u64, u64, u64), pmtx::ptm::PtmError> {
    use pmtx::ptm::{PPtr, Ptm, PtmConfig};

    pmtx::pobject! {
        #[derive(Clone, Copy, Debug, Default)]
        pub struct Node { pub key: u64, pub value: u64, pub next: PPtr<Node> }
    }
    pmtx::pobject! {
        #[derive(Clone, Copy, Debug, Default)]
        pub struct Root { pub head: PPtr<Node>, pub count: u64 }
    }

    let config = PtmConfig::temporary().path(path);
    let ptm = Ptm::<Root>::open_or_create(config)?; // opening runs recovery
    ptm.run(|tx| {
        let root = tx.root();
        let r = tx.read(root)?;
        let node = tx.alloc(&Node {
            key: r.count,
            value: 10 * r.count,
            next: r.head,
        })?;
        tx.write(
            root,
            &Root {
                head: node,
                count: r.count + 1,
            },
        )
    })?; // durable when run returns; conflicts are retried
    let newest = ptm.run(|tx| {
        let r = tx.read(tx.root())?;
        tx.read(r.head)
    })?;
    let count = ptm.run(|tx| tx.read(tx.root()))?.count;
    Ok((newest.key, newest.value, count))
}

#[test]
fn the_readme_ptm_example_runs_and_survives_a_reopen() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("list.pool");
    assert_eq!(ptm_readme_example(&path).unwrap(), (0, 0, 1));
    assert_eq!(ptm_readme_example(&path).unwrap(), (1, 10, 2));
}
