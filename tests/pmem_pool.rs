//! The pool file: creation, reopening, locking, and the refusal of every kind of bad pool without
//! writing a byte of it.

use pmtx::pmem::{header, MappingKind, PersistenceDomain, Pool, PoolError, PoolOptions};
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn opts(layout: &str) -> PoolOptions {
    PoolOptions::new(layout, PersistenceDomain::Adr)
}

fn new_pool(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let pool = Pool::create(Some(&path), 2 * MIB, &opts("falcon")).unwrap();
    pool.write_u64(pool.first_usable(), 0xfeed);
    pool.persist(pool.first_usable(), 8);
    path
}

/// Opens `path` and asserts it is refused with an error matching `check`, and that the file's
/// bytes are exactly what they were before the attempt.
fn assert_refused_untouched(path: &Path, layout: &str, check: impl Fn(&PoolError) -> bool) {
    let before = std::fs::read(path).ok();
    let err = Pool::open(path, &opts(layout)).expect_err("a bad pool must be refused");
    assert!(check(&err), "unexpected error: {err}");
    assert!(!err.to_string().is_empty());
    assert_eq!(
        std::fs::read(path).ok(),
        before,
        "refusing a pool must not change it"
    );
}

#[test]
fn create_write_reopen_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.pool");
    let uuid;
    {
        let pool = Pool::create(Some(&path), 3 * MIB + 1, &opts("falcon")).unwrap();
        assert_eq!(pool.len(), 3 * MIB + 4096, "size is rounded up to 4 KiB");
        assert_eq!(pool.header().layout, "falcon");
        assert_ne!(pool.mapping_kind(), MappingKind::Heap);
        uuid = pool.header().uuid;
        let off = pool.first_usable() + 64;
        pool.write_bytes(off, b"hello pm");
        pool.persist(off, 8);
        pool.set_root(off).unwrap();
    }
    let pool = Pool::open(&path, &opts("falcon")).unwrap();
    assert_eq!(pool.header().uuid, uuid);
    assert_eq!(pool.root(), pool.first_usable() + 64);
    assert_eq!(pool.read_vec(pool.root(), 8), b"hello pm");
    let info = pool.info();
    assert_eq!(info.domain, PersistenceDomain::Adr);
    assert_eq!(info.root, pool.root());
}

#[test]
fn creation_never_overwrites_and_rejects_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    let before = std::fs::read(&path).unwrap();
    assert!(matches!(
        Pool::create(Some(&path), 2 * MIB, &opts("falcon")),
        Err(PoolError::AlreadyExists { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let other = dir.path().join("q.pool");
    assert!(matches!(
        Pool::create(Some(&other), 1000, &opts("x")),
        Err(PoolError::InvalidArgument(_))
    ));
    assert!(matches!(
        Pool::create(Some(&other), 2 * MIB, &opts(&"y".repeat(40))),
        Err(PoolError::InvalidArgument(_))
    ));
    assert!(!other.exists(), "a refused creation leaves no file behind");
    assert!(matches!(
        Pool::create(
            Some(&dir.path().join("no/such/dir.pool")),
            2 * MIB,
            &opts("x")
        ),
        Err(PoolError::Io { .. })
    ));
}

#[test]
fn no_space_is_a_typed_error_and_leaves_no_file() {
    // tmpfs refuses at once a fallocate larger than the whole file system.
    if !Path::new("/dev/shm").is_dir() {
        return;
    }
    let path = PathBuf::from(format!(
        "/dev/shm/pmtx-test-nospace-{}.pool",
        std::process::id()
    ));
    let err = Pool::create(Some(&path), 1 << 44, &opts("x")).unwrap_err();
    assert!(matches!(err, PoolError::NoSpace { .. }), "{err}");
    assert!(!path.exists());
}

#[test]
fn default_path_is_under_dev_shm_or_temp() {
    let pool = Pool::create(None, 2 * MIB, &opts("falcon").removing_on_drop()).unwrap();
    let path = pool.path().unwrap().to_path_buf();
    assert!(path.starts_with("/dev/shm") || path.starts_with(std::env::temp_dir()));
    assert!(path.exists());
    drop(pool);
    assert!(!path.exists(), "removing_on_drop deletes the file");
}

#[test]
fn a_second_open_is_refused_while_the_first_holds_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    let first = Pool::open(&path, &opts("falcon")).unwrap();
    assert_refused_untouched(&path, "falcon", |e| matches!(e, PoolError::Locked { .. }));
    assert!(
        Pool::open_read_only(&path).is_ok(),
        "read-only inspection needs no lock"
    );
    drop(first);
    assert!(Pool::open(&path, &opts("falcon")).is_ok());
}

#[test]
fn a_missing_path_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let err = Pool::open(&dir.path().join("absent.pool"), &opts("falcon")).unwrap_err();
    assert!(matches!(err, PoolError::NotFound { .. }));
    assert!(err.to_string().contains("absent.pool"));
}

#[test]
fn a_directory_or_a_foreign_file_is_not_a_pool() {
    let dir = tempfile::tempdir().unwrap();
    // Named for what it is (issue 22): not "not a pmtx pool".
    let err = Pool::open(dir.path(), &opts("falcon")).unwrap_err();
    assert!(matches!(err, PoolError::IsADirectory { .. }), "{err}");
    assert!(err.to_string().contains("is a directory"), "{err}");
    let path = dir.path().join("notes.txt");
    std::fs::write(
        &path,
        b"just some text, long enough to hold a header or two",
    )
    .unwrap();
    assert_refused_untouched(&path, "falcon", |e| matches!(e, PoolError::NotAPool { .. }));
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_refused_untouched(&empty, "falcon", |e| {
        matches!(e, PoolError::NotAPool { .. })
    });
}

#[test]
fn a_truncated_pool_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..MIB as usize]).unwrap();
    assert_refused_untouched(
        &path,
        "falcon",
        |e| matches!(e, PoolError::Truncated { expected, actual, .. } if *expected == 2 * MIB && *actual == MIB),
    );
    std::fs::write(&path, &bytes[..100]).unwrap();
    assert_refused_untouched(&path, "falcon", |e| {
        matches!(e, PoolError::Truncated { .. })
    });
}

#[test]
fn a_grown_file_disagrees_with_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(3 * MIB)
        .unwrap();
    assert_refused_untouched(&path, "falcon", |e| {
        matches!(e, PoolError::SizeMismatch { .. })
    });
}

fn corrupt(path: &Path, at: usize, xor: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= xor;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_bad_header_checksum_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    corrupt(&path, 20, 0xff); // inside the UUID
    assert_refused_untouched(&path, "falcon", |e| {
        matches!(e, PoolError::BadChecksum { .. })
    });
}

#[test]
fn an_unknown_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    corrupt(&path, 8, 0x02);
    assert_refused_untouched(&path, "falcon", |e| {
        matches!(e, PoolError::UnsupportedVersion { found, supported, .. }
            if *found == header::FORMAT_VERSION ^ 2 && *supported == header::FORMAT_VERSION)
    });
}

#[test]
fn a_pool_of_another_engine_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    assert_refused_untouched(
        &path,
        "zen",
        |e| matches!(e, PoolError::LayoutMismatch { expected, found, .. } if expected == "zen" && found == "falcon"),
    );
    let pool = Pool::open_any_layout(&path, PersistenceDomain::Eadr).unwrap();
    assert_eq!(pool.header().layout, "falcon");
}

#[test]
fn a_half_created_pool_is_not_a_pool() {
    // Creation writes the magic last: a pool whose magic never reached the file is refused as
    // "not a pool" rather than trusted.
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].fill(0);
    std::fs::write(&path, bytes).unwrap();
    assert_refused_untouched(&path, "falcon", |e| matches!(e, PoolError::NotAPool { .. }));
}

#[test]
#[should_panic(expected = "read-only")]
fn writing_a_read_only_pool_panics_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path(), "p.pool");
    let pool = Pool::open_read_only(&path).unwrap();
    assert_eq!(pool.read_u64(pool.first_usable()), 0xfeed);
    pool.write_u64(pool.first_usable(), 1);
}

#[test]
#[should_panic(expected = "outside the writable range")]
fn the_header_cannot_be_overwritten_through_the_api() {
    let pool = Pool::create_in_memory(MIB, &opts("x")).unwrap();
    pool.write_bytes(16, &[0; 8]);
}

#[test]
#[should_panic(expected = "outside the pool")]
fn reads_past_the_end_panic_clearly() {
    let pool = Pool::create_in_memory(MIB, &opts("x")).unwrap();
    pool.read_u64(MIB);
}

#[test]
fn check_range_validates_offsets_read_from_pm() {
    let pool = Pool::create_in_memory(MIB, &opts("x")).unwrap();
    assert!(pool.check_range(pool.first_usable(), 8).is_ok());
    assert!(pool.check_range(0, 8).is_err());
    assert!(pool.check_range(MIB - 4, 8).is_err());
    assert!(pool.check_range(u64::MAX - 2, 8).is_err());
    assert!(pool.set_root(MIB + 1).is_err());
}

#[test]
fn atomics_and_copies_behave() {
    let pool = Pool::create_in_memory(MIB, &opts("x")).unwrap();
    let a = pool.first_usable();
    pool.write_u64(a, 5);
    assert_eq!(pool.cas_u64(a, 5, 9), Ok(5));
    assert_eq!(pool.cas_u64(a, 5, 1), Err(9));
    assert_eq!(pool.fetch_add_u64(a, 3), 9);
    assert_eq!(pool.fetch_or_u64(a, 0x100), 12);
    assert_eq!(pool.fetch_and_u64(a, 0xff), 0x10c);
    assert_eq!(pool.read_u64(a), 12);
    pool.write_bytes(a + 64, b"abcdefgh");
    pool.copy(a + 64, a + 68, 8);
    assert_eq!(pool.read_vec(a + 64, 12), b"abcdabcdefgh");
    pool.fill(a + 64, b'z', 4);
    assert_eq!(pool.read_vec(a + 64, 6), b"zzzzab");
}

#[test]
fn every_domain_runs_the_primitives_and_counts_what_it_issues() {
    use pmtx::pmem::stats::thread_snapshot;
    let dir = tempfile::tempdir().unwrap();
    for domain in PersistenceDomain::ALL {
        let path = dir.path().join(format!("{domain}.pool"));
        let pool = Pool::create(Some(&path), MIB, &PoolOptions::new("x", domain)).unwrap();
        let off = pool.first_usable();
        let before = thread_snapshot();
        pool.write_bytes(off, &[1u8; 100]);
        pool.persist(off, 100);
        pool.flush(off, 1);
        pool.fence();
        let d = thread_snapshot() - before;
        assert_eq!(d.bytes_written, 100, "{domain}");
        let (lines, fences) = match domain {
            PersistenceDomain::Volatile => (0, 0),
            // eADR: persist needs nothing; the explicit flush is still issued (a hint).
            PersistenceDomain::Eadr => (1, 1),
            PersistenceDomain::Adr | PersistenceDomain::Msync => (2 + 1, 2),
        };
        assert_eq!((d.lines_flushed, d.fences), (lines, fences), "{domain}");
        assert_eq!(pool.read_vec(off, 100), vec![1u8; 100]);
        drop(pool);
        let again = Pool::open(&path, &PoolOptions::new("x", domain)).unwrap();
        assert_eq!(
            again.read_vec(off, 100),
            vec![1u8; 100],
            "{domain}: the file keeps the data"
        );
    }
}

#[test]
fn counting_can_be_turned_off() {
    use pmtx::pmem::stats::thread_snapshot;
    let pool = Pool::create_in_memory(MIB, &opts("x").with_counting(false)).unwrap();
    let before = thread_snapshot();
    pool.write_u64(pool.first_usable(), 1);
    pool.persist(pool.first_usable(), 8);
    assert_eq!(thread_snapshot() - before, Default::default());
}

#[test]
fn msync_needs_a_file() {
    let err =
        Pool::create_in_memory(MIB, &PoolOptions::new("x", PersistenceDomain::Msync)).unwrap_err();
    assert!(matches!(err, PoolError::InvalidArgument(_)));
}
