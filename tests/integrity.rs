//! Damage to what recovery trusts is reported, never accepted (issue 22 item 6); `pmtx check`
//! finds it without writing a byte (issue 19 item 9); the pool header records the engine and the
//! persistence domain, and opening with another domain is refused unless overridden (issue 19
//! item 7). A clean pool passes.

mod common;

use pmtx::catalog::{ColumnType, Schema};
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::{DbError, EngineKind};
use pmtx::pmem::{PersistenceDomain, PoolError};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const PAGE: u64 = 2 << 20;
const ROWS: u64 = 50;

/// A pool of `engine` with one table of `ROWS` rows (key k, value k * 10), closed.
fn make_pool(dir: &Path, engine: EngineKind) -> PathBuf {
    let path = dir.join(format!("{engine}.pool"));
    let db = Db::create(
        DbConfig::temporary()
            .engine(engine)
            .domain(PersistenceDomain::Adr)
            .pool_size(32 << 20)
            .max_threads(2)
            .path(&path),
    )
    .unwrap();
    let t = db
        .create_table(Schema::new("t", &[("v", ColumnType::U64)]))
        .unwrap();
    db.run(|tx| {
        for k in 1..=ROWS {
            tx.insert(t, k, &[Value::U64(k * 10)])?;
        }
        Ok(())
    })
    .unwrap();
    path
}

fn open(path: &Path) -> Result<Db, DbError> {
    Db::open(
        DbConfig::temporary()
            .domain(PersistenceDomain::Adr)
            .path(path),
    )
}

fn read_u64(path: &Path, at: u64) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    u64::from_le_bytes(b)
}

fn write_u64(path: &Path, at: u64, v: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_le_bytes(), at).unwrap();
}

/// The offset of the first heap page (page-table descriptor kind 2 in both layouts).
fn heap_page(path: &Path) -> u64 {
    let pages = read_u64(path, 4096 + 16);
    (0..pages)
        .find(|&i| read_u64(path, 8192 + 8 * i) >> 56 == 2)
        .map(|i| (i + 1) * PAGE)
        .expect("a heap page")
}

/// Runs `pmtx check`; returns its exit status and stderr.
fn check(path: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .arg("check")
        .arg(path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "check panicked: {stderr}");
    (out.status.code().expect("exited"), stderr)
}

/// Damages `path` with `damage`, then asserts that opening fails with a corruption error naming
/// `expect`, and that `pmtx check` exits 1 without changing a byte.
fn assert_detected(path: &Path, damage: impl FnOnce(&Path), expect: &str) {
    damage(path);
    let before = std::fs::read(path).unwrap();
    let (status, stderr) = check(path);
    assert_eq!(status, 1, "check must find it: {stderr}");
    assert!(stderr.contains(expect), "check names {expect:?}: {stderr}");
    assert!(
        std::fs::read(path).unwrap() == before,
        "check wrote to the pool"
    );
    match open(path) {
        Err(e @ (DbError::Corrupt(_) | DbError::Catalog(_) | DbError::Alloc(_))) => {
            assert!(e.to_string().contains(expect), "{e}")
        }
        Err(e) => panic!("expected a corruption error naming {expect:?}, got {e}"),
        Ok(db) => panic!(
            "damage accepted: {:?} rows",
            db.check_structure().unwrap_or_default()
        ),
    }
}

#[test]
fn clean_pools_pass_check_and_check_writes_nothing_even_on_a_pool_in_use() {
    let dir = common::pool_dir();
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        let path = make_pool(dir.path(), engine);
        let before = std::fs::read(&path).unwrap();
        let (status, stderr) = check(&path);
        assert_eq!(status, 0, "{engine}: {stderr}");
        assert!(std::fs::read(&path).unwrap() == before, "{engine}");
        // While another handle holds the pool open (and its lock), check still runs.
        let db = open(&path).unwrap();
        assert_eq!(db.check_structure().unwrap(), vec![ROWS]);
        let (status, stderr) = check(&path);
        assert_eq!(status, 0, "{engine} in use: {stderr}");
        drop(db);
    }
    let (status, _) = check(&dir.path().join("missing.pool"));
    assert_eq!(status, 2, "no such file: cannot check");
}

#[test]
fn falcon_tuple_header_damage_is_detected() {
    let dir = common::pool_dir();
    // Slots of 48 bytes (32-byte header + 8-byte row, rounded to 16): cc 0, write_ts 8, key 16,
    // flags 24. Slot 0 holds a live row; slot ROWS + 5 was never used.
    let path = make_pool(dir.path(), EngineKind::Falcon);
    let heap = heap_page(&path);
    let pristine = std::fs::read(&path).unwrap();
    let restore = |p: &Path| std::fs::write(p, &pristine).unwrap();
    assert_detected(&path, |p| write_u64(p, heap + 24, 0x41), "flags 0x41");
    restore(&path);
    // A phantom: an unused slot flipped to LIVE (the old binary recovered ROWS + 1 rows).
    let unused = heap + (ROWS + 5) * 48;
    assert_detected(&path, |p| write_u64(p, unused + 24, 1), "no write_ts");
    restore(&path);
    assert_detected(&path, |p| write_u64(p, unused + 16, 77), "unused slot");
    restore(&path);
    // A lost row: flags of a live row cleared (the old binary recovered ROWS - 1 rows).
    assert_detected(&path, |p| write_u64(p, heap + 24, 0), "unused slot");
    restore(&path);
    let ts = read_u64(&path, heap + 8);
    assert_detected(&path, |p| write_u64(p, heap + 8, ts | 0x7f), "names thread");
    restore(&path);
    assert_detected(
        &path,
        |p| write_u64(p, heap + 8, ts ^ (0x40 << 56)),
        "beyond any commit tid",
    );
    restore(&path);
    assert_eq!(check(&path).0, 0);
}

#[test]
fn zen_tuple_header_damage_is_detected() {
    let dir = common::pool_dir();
    // Slots of 32 bytes (16-byte header + 8-byte row): word 0 (LP, DELETED, Tx-CTS), key 8.
    let path = make_pool(dir.path(), EngineKind::Zen);
    let heap = heap_page(&path);
    let pristine = std::fs::read(&path).unwrap();
    let restore = |p: &Path| std::fs::write(p, &pristine).unwrap();
    // A phantom built from garbage in an empty slot (the old binary recovered it as a row).
    let empty = heap + (ROWS + 5) * 32;
    assert_detected(
        &path,
        |p| write_u64(p, empty, 0x0000_4567_89ab_cd42),
        "names thread",
    );
    restore(&path);
    let word = read_u64(&path, heap);
    assert_detected(
        &path,
        |p| write_u64(p, heap, word ^ (0x20 << 56)),
        "beyond any commit tid",
    );
    restore(&path);
    assert_detected(&path, |p| write_u64(p, heap, 1 << 62), "no Tx-CTS");
    restore(&path);
    assert_eq!(check(&path).0, 0);
}

#[test]
fn metadata_damage_is_detected() {
    let dir = common::pool_dir();
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        let path = make_pool(dir.path(), engine);
        let pristine = std::fs::read(&path).unwrap();
        let restore = |p: &Path| std::fs::write(p, &pristine).unwrap();
        // Meta page (page 0, at 2 MiB): the thread count.
        let threads = read_u64(&path, PAGE + 16);
        assert_detected(&path, |p| write_u64(p, PAGE + 16, threads + 1), "checksum");
        restore(&path);
        // The newest catalog slot's JSON.
        let (a, b) = (PAGE + 4096, PAGE + 4096 + 256 * 1024);
        let newest = if read_u64(&path, a) > read_u64(&path, b) {
            a
        } else {
            b
        };
        let json = read_u64(&path, newest + 24);
        assert_detected(&path, |p| write_u64(p, newest + 24, json ^ 0x20), "CRC");
        restore(&path);
        // A page-table descriptor.
        let heap_index = heap_page(&path) / PAGE - 1;
        let d = 8192 + 8 * heap_index;
        let tag = read_u64(&path, d);
        assert_detected(
            &path,
            |p| write_u64(p, d, tag ^ (1 << 48)),
            "fails its check",
        );
        restore(&path);
        // The root word, misaligned: an error, not a panic.
        write_u64(&path, 192, PAGE + 1);
        match open(&path) {
            Err(DbError::Corrupt(m)) => assert!(m.contains("root"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("misaligned root accepted"),
        }
        assert_eq!(check(&path).0, 1);
        restore(&path);
        // A free page holding anything: recovery does not read it, check reports it.
        let last_page = read_u64(&path, 4096 + 16);
        write_u64(&path, last_page * PAGE + 4096, 0xdead);
        let (status, stderr) = check(&path);
        assert_eq!(status, 1, "{engine}");
        assert!(stderr.contains("not all zero"), "{stderr}");
        restore(&path);
        assert_eq!(check(&path).0, 0, "{engine}");
    }
}

#[test]
fn the_header_records_engine_and_domain() {
    let dir = common::pool_dir();
    let path = make_pool(dir.path(), EngineKind::Zen);
    // The engine comes from the header: the default config (falcon) opens a Zen pool as Zen.
    let db = open(&path).unwrap();
    assert_eq!(db.config().engine, EngineKind::Zen);
    assert_eq!(db.check_structure().unwrap(), vec![ROWS]);
    drop(db);
    // An engine of another design, insisted on, is refused with a message naming both.
    let mut insist = DbConfig::temporary()
        .engine(EngineKind::Inp)
        .domain(PersistenceDomain::Adr)
        .path(&path);
    insist.engine_from_pool = false;
    let err = Db::open(insist).err().expect("refused").to_string();
    assert!(err.contains("inp") && err.contains("zen"), "{err}");
    // Another domain is refused unless overridden.
    let eadr = DbConfig::temporary()
        .domain(PersistenceDomain::Eadr)
        .path(&path);
    match Db::open(eadr.clone()) {
        Err(DbError::Pool(PoolError::DomainMismatch {
            recorded,
            requested,
            ..
        })) => {
            assert_eq!(recorded, PersistenceDomain::Adr);
            assert_eq!(requested, PersistenceDomain::Eadr);
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("domain mismatch accepted"),
    }
    Db::open(eadr.allow_domain_change(true)).unwrap();
    // `pmtx recover` reads engine and domain from the header (it used to default to falcon).
    let out = Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .arg("recover")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("with zen"));
    // A version-1 pool (no domain, unchecked page table) is refused with a clear message.
    let mut header = [0u8; 4];
    header.copy_from_slice(&1u32.to_le_bytes());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(&header, 8)
        .unwrap();
    let err = open(&path).err().expect("refused").to_string();
    assert!(
        err.contains("format version 1") && err.contains("recreate"),
        "{err}"
    );
}
