//! Hostile input to the `pmtx` binary (issue 22, items 5, 7 and 9): bad numbers, corrupt pool
//! words, wrong paths and signals give a clear error (or a clean exit), never a panic, a silent
//! no-op or a scratch pool left behind.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

fn pmtx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("pmtx runs")
}

/// Runs pmtx and expects exit status 1 with `needle` in its error, and no panic.
fn refused(args: &[&str], needle: &str) -> String {
    let out = pmtx(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected {needle:?} in {stderr}"
    );
    stderr
}

fn succeeded(args: &[&str]) -> String {
    let out = pmtx(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{args:?}: {stderr}");
    stderr
}

/// A small bank pool at `path`, written by `engine`.
fn bank_pool(path: &Path, engine: &str) {
    let p = path.to_str().unwrap();
    succeeded(&[
        "bench",
        "bank",
        "--engine",
        engine,
        "--accounts",
        "100",
        "--duration",
        "0.1",
        "--warmup",
        "0",
        "--pool",
        p,
    ]);
}

fn set_word(path: &Path, offset: u64, value: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_le_bytes(), offset).unwrap();
}

#[test]
fn out_of_range_numbers_are_refused_not_panicked_on() {
    let bank = ["bench", "bank", "--accounts", "100"];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        let mut v: Vec<&str> = bank.to_vec();
        v.extend_from_slice(extra);
        v
    };
    refused(&with(&["--duration", "inf"]), "--duration");
    refused(&with(&["--duration", "1e300"]), "--duration");
    refused(&with(&["--warmup", "1e300"]), "--warmup");
    refused(&with(&["--warmup", "nan"]), "--warmup");
    let quick = |extra: &[&'static str]| -> Vec<&str> {
        let mut v = with(&["--duration", "0.1", "--warmup", "0"]);
        v.extend_from_slice(extra);
        v
    };
    refused(
        &quick(&["--hot-tuples", "18446744073709551615"]),
        "--hot-tuples",
    );
    refused(
        &quick(&["--partitions", "18446744073709551615"]),
        "--partitions",
    );
    refused(&quick(&["--repeat", "0"]), "--repeat must be at least 1");
    refused(
        &[
            "bench",
            "bank",
            "--duration",
            "0.1",
            "--accounts",
            "1152921504606846976",
        ],
        "--accounts",
    );
    let ycsb = |records: &'static str| {
        vec![
            "bench",
            "ycsb",
            "--duration",
            "0.1",
            "--warmup",
            "0",
            "--records",
            records,
        ]
    };
    refused(&ycsb("18446744073709551615"), "the largest pmtx can use");
    refused(&ycsb("4611686018427387904"), "the largest pmtx can use");
    refused(
        &["bench", "tpcc", "--pool-mib", "18446744073709551615"],
        "the largest pmtx can use",
    );
}

#[test]
fn crashtest_refuses_counts_that_would_test_nothing() {
    refused(
        &["crashtest", "--images", "0"],
        "--images must be at least 1",
    );
    refused(
        &["crashtest", "--real-kills", "0"],
        "--real-kills must be at least 1",
    );
    refused(
        &["crashtest", "--images-per-point", "0"],
        "--images-per-point must be at least 1",
    );
    refused(&["crashtest", "--txns", "0"], "--txns must be at least 1");
}

/// DUDETx's persistent-object crash sweep takes the perform mode: a lock-mode fault is refused
/// without it (naming the option), and a short lock-mode sweep in async mode runs clean.
#[test]
fn the_dudetx_ptm_crash_sweep_runs_the_lock_mode() {
    refused(
        &[
            "crashtest",
            "--engine",
            "dudetx-ptm",
            "--inject-fault",
            "dudetx-lock-no-deps",
            "--images",
            "1",
        ],
        "--dudetx-perform locks",
    );
    refused(
        &[
            "crashtest",
            "--engine",
            "dudetx-ptm",
            "--dudetx-perform",
            "htm",
        ],
        "RTM",
    );
    succeeded(&[
        "crashtest",
        "--engine",
        "dudetx-ptm",
        "--dudetx-perform",
        "locks-two-round",
        "--dudetx-mode",
        "async",
        "--txns",
        "6",
        "--images",
        "8",
    ]);
}

/// `--list-faults` names every fault `--inject-fault` takes, the persistent-object engines' too.
#[test]
fn list_faults_names_the_ptm_engines_faults() {
    let out = pmtx(&["crashtest", "--list-faults"]);
    assert!(out.status.success());
    let listed = String::from_utf8_lossy(&out.stdout);
    for name in [
        "archtm-copy-fence",
        "dudetx-skip-alloc-log",
        "dudetx-lock-no-deps",
        "dudetx-lock-ring-order",
        "dudetx-lock-watermark-in-place",
    ] {
        assert!(listed.contains(name), "{name} missing from:\n{listed}");
    }
}

#[test]
fn json_into_a_missing_directory_is_refused_before_the_run() {
    let started = Instant::now();
    let err = refused(
        &[
            "bench",
            "bank",
            "--duration",
            "60",
            "--json",
            "/nonexistent-pmtx-dir/out.json",
        ],
        "/nonexistent-pmtx-dir/out.json",
    );
    assert!(err.contains("does not exist"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the 60 s run went ahead"
    );
    refused(
        &[
            "crashtest",
            "--json",
            "/nonexistent-pmtx-dir/out.json",
            "--images",
            "1",
        ],
        "/nonexistent-pmtx-dir",
    );
}

#[test]
fn pool_path_mistakes_are_named_for_what_they_are() {
    let dir = common::pool_dir();
    let d = dir.path().to_str().unwrap();
    let err = refused(&["inspect", d], "is a directory");
    assert!(!err.contains("not a pmtx pool"), "{err}");
    refused(&["recover", d], "is a directory");

    let zen = dir.path().join("zen.pool");
    bank_pool(&zen, "zen");
    let z = zen.to_str().unwrap();
    let err = refused(&["recover", "--engine", "inp", z], "engine inp");
    assert!(err.contains("zen"), "{err}");
    assert!(!err.contains("'falcon' was requested"), "{err}");
}

#[test]
fn corrupt_root_and_meta_words_are_errors_not_panics() {
    let dir = common::pool_dir();
    for engine in ["falcon", "zen"] {
        let pool = dir.path().join(format!("{engine}.pool"));
        bank_pool(&pool, engine);
        let p = pool.to_str().unwrap();
        let root = 2 << 20;
        // The case: the root word (offset 192) one byte into the meta page.
        set_word(&pool, 192, root + 1);
        refused(&["recover", "--engine", engine, p], "root");
        set_word(&pool, 192, u64::MAX - 7);
        refused(&["recover", "--engine", engine, p], "root");
        set_word(&pool, 192, root);
        // The catalog slot size recorded in the meta page: the meta page's checksum catches any
        // damaged word before its value is used (the values are also range-checked).
        let catalog_slot = if engine == "falcon" { 48 } else { 32 };
        set_word(&pool, root + catalog_slot, u64::MAX);
        refused(&["recover", "--engine", engine, p], "checksum");
        set_word(&pool, root + catalog_slot, 256 * 1024);
        if engine == "falcon" {
            // Window geometry whose product overflows.
            set_word(&pool, root + 24, 1 << 62);
            refused(&["recover", "--engine", engine, p], "checksum");
        } else {
            succeeded(&["recover", "--engine", engine, p]);
        }
    }
}

#[test]
fn a_tiny_pool_with_a_valid_header_is_refused() {
    // A header that checksums and matches its file, but leaves no room for the root word.
    let dir = common::pool_dir();
    let pool = dir.path().join("f.pool");
    bank_pool(&pool, "falcon");
    let mut header = std::fs::read(&pool).unwrap();
    header.truncate(128);
    header[32..40].copy_from_slice(&128u64.to_le_bytes());
    let crc = u64::from(crc32fast::hash(&header[..120]));
    header[120..128].copy_from_slice(&crc.to_le_bytes());
    let tiny = dir.path().join("tiny.pool");
    std::fs::write(&tiny, &header).unwrap();
    refused(&["recover", tiny.to_str().unwrap()], "truncated");
    refused(&["inspect", tiny.to_str().unwrap()], "truncated");
}

#[test]
fn inspect_maps_a_file_it_may_not_write_read_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::pool_dir();
    let pool = dir.path().join("ro.pool");
    bank_pool(&pool, "falcon");
    std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = pool.to_str().unwrap();
    // Root may write any file: run as nobody then.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let out = if is_root {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_pmtx"))
            .args(["inspect", p])
            .output()
            .expect("setpriv runs (util-linux)")
    } else {
        Command::new(env!("CARGO_BIN_EXE_pmtx"))
            .args(["inspect", p])
            .output()
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("read-only"), "{stdout}");
    assert!(stdout.contains("layout        falcon"), "{stdout}");
}

#[test]
fn bench_bank_reports_its_check() {
    let err = succeeded(&[
        "bench",
        "bank",
        "--accounts",
        "3000",
        "--duration",
        "0.1",
        "--warmup",
        "0",
    ]);
    assert!(
        err.contains("bank check passed (3000 accounts, total balance 3000000"),
        "{err}"
    );
}

#[test]
fn a_signal_removes_the_scratch_pool() {
    for signal in ["TERM", "INT"] {
        let scratch = common::pool_dir();
        let child = Command::new(env!("CARGO_BIN_EXE_pmtx"))
            .args(["bench", "bank", "--duration", "60", "--warmup", "0"])
            .env("PMTX_SCRATCH_DIR", scratch.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let pool_made = || std::fs::read_dir(scratch.path()).unwrap().count() > 0;
        while !pool_made() && started.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(pool_made(), "no scratch pool appeared");
        std::thread::sleep(Duration::from_millis(300));
        let killed = Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "SIG{signal}: {stderr}");
        let left: Vec<_> = std::fs::read_dir(scratch.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(left.is_empty(), "SIG{signal} left {left:?}");
    }
}
