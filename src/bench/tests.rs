//! Behaviour of the harness with fake drivers (no test asserts a speed).

use std::time::Duration;

use serde_json::Value;

use super::*;

/// Sleeps ~50 µs per transaction, reports one conflict abort on every 4th outcome, alternates
/// between two kinds, and stores 64 bytes to "PM" per transaction (counters only).
struct FakeDriver {
    n: u64,
    fail_after: Option<u64>,
}

impl TxnDriver for FakeDriver {
    fn run_txn(&mut self) -> Result<TxnOutcome, Box<dyn std::error::Error + Send + Sync>> {
        self.n += 1;
        if self.fail_after.is_some_and(|limit| self.n > limit) {
            return Err("disk on fire".into());
        }
        std::thread::sleep(Duration::from_micros(50));
        crate::pmem::stats::count_write(64);
        Ok(TxnOutcome {
            kind: (self.n % 2) as usize,
            committed: true,
            aborts: u32::from(self.n % 4 == 0),
        })
    }
}

fn config(warmup_ms: u64, duration_ms: u64) -> BenchConfig {
    BenchConfig {
        threads: 2,
        warmup: Duration::from_millis(warmup_ms),
        duration: Duration::from_millis(duration_ms),
        txn_kinds: vec!["read".into(), "update".into()],
    }
}

fn fake(fail_after: Option<u64>) -> Result<Box<dyn TxnDriver>, String> {
    Ok(Box::new(FakeDriver { n: 0, fail_after }))
}

fn all_numbers_finite(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_f64().is_some_and(f64::is_finite),
        Value::Array(items) => items.iter().all(all_numbers_finite),
        Value::Object(map) => map.values().all(all_numbers_finite),
        _ => true,
    }
}

fn report(engine: &str, result: BenchResult) -> RunReport {
    RunReport::new(
        engine,
        "occ",
        "adr",
        "ycsb-a",
        result,
        serde_json::json!({ "records": 1000 }),
    )
}

/// A fixed amount of CPU work: its CPU time does not depend on how busy the machine is.
fn spin(iterations: u64) -> u64 {
    let mut x = 0u64;
    for _ in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
    x
}

/// Does [`spin`]'s fixed work, then commits.
struct SpinningDriver {
    iterations: u64,
}

impl TxnDriver for SpinningDriver {
    fn run_txn(&mut self) -> Result<TxnOutcome, Box<dyn std::error::Error + Send + Sync>> {
        std::hint::black_box(spin(self.iterations));
        Ok(TxnOutcome {
            kind: 0,
            committed: true,
            aborts: 0,
        })
    }
}

#[test]
fn cpu_time_per_transaction_counts_the_work_of_a_transaction() {
    const ITERATIONS: u64 = 300_000;
    // The work's CPU time: the quickest of several timed runs is one that kept its core.
    let work_us = (0..20)
        .map(|_| {
            let start = std::time::Instant::now();
            std::hint::black_box(spin(ITERATIONS));
            start.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::INFINITY, f64::min);
    let config = BenchConfig {
        threads: 1,
        ..config(0, 200)
    };
    let result = run(config, |_| {
        Ok::<_, String>(Box::new(SpinningDriver {
            iterations: ITERATIONS,
        }) as Box<dyn TxnDriver>)
    })
    .unwrap();
    let cpu_us = result
        .cpu_us_per_txn
        .expect("CPU time is reported on Linux");
    // Process-wide, so other tests running meanwhile only add to it; a lost core does not take
    // from it (a transaction's work costs the same CPU time however long it waited).
    assert!(
        cpu_us.is_finite() && cpu_us >= 0.3 * work_us,
        "{cpu_us} µs of CPU per transaction whose work takes {work_us} µs"
    );
    assert_eq!(BenchResult::default().cpu_us_per_txn, None);
}

#[test]
fn measures_a_fake_driver() {
    let result = run(config(50, 200), |_| fake(None)).unwrap();
    assert_eq!(result.threads, 2);
    assert!(result.committed > 0);
    assert!(result.duration_s >= 0.2 && result.duration_s.is_finite());
    assert!(
        (result.abort_rate - 0.2).abs() < 0.05,
        "abort rate {}",
        result.abort_rate
    );
    assert_eq!(result.user_aborted, 0);
    let p50 = result.latency_us.p50;
    assert!((40.0..=5000.0).contains(&p50), "p50 {p50} µs");
    assert!(result.latency_us.p50 <= result.latency_us.p99);
    assert!(result.latency_us.p99 <= result.latency_us.max);
    assert!(result.latency_us.mean > 0.0);
    assert!((result.throughput_tps - result.committed as f64 / result.duration_s).abs() < 1e-6);
    assert!(result.pm.total.bytes_written > 0 && result.pm.bytes_per_txn > 0.0);

    // Per-kind figures add up to the totals.
    assert_eq!(result.per_kind.len(), 2);
    assert_eq!(result.per_kind[0].name, "read");
    let sum = |f: fn(&KindResult) -> u64| result.per_kind.iter().map(f).sum::<u64>();
    assert_eq!(sum(|k| k.committed), result.committed);
    assert_eq!(sum(|k| k.aborted), result.aborted);
    assert_eq!(sum(|k| k.user_aborted), result.user_aborted);
    let kind_count: u64 = result.per_kind.iter().map(|k| k.latency_hist.len()).sum();
    assert_eq!(kind_count, result.latency_hist.len());
    assert_eq!(result.latency_hist.len(), result.committed);

    // The CDF is monotone and ends at 1.
    let cdf = result.latency_cdf(50);
    assert_eq!(cdf.len(), 50);
    assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    assert_eq!(cdf.last().unwrap().1, 1.0);
    assert!(cdf[0].1 > 0.0);
    assert!(result.latency_cdf(0).is_empty());
    assert_eq!(result.latency_cdf(1).len(), 1);

    // JSON: every required field, no ratio without a baseline.
    let mut rep = report("falcon", result);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.json");
    write_json(std::slice::from_ref(&rep), &path).unwrap();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let obj = &json.as_array().unwrap()[0];
    for key in [
        "engine",
        "cc",
        "domain",
        "workload",
        "threads",
        "duration_s",
        "committed",
        "aborted",
        "throughput_tps",
        "abort_rate",
        "cpu_us_per_txn",
        "params",
    ] {
        assert!(obj.get(key).is_some(), "missing {key}");
    }
    for key in ["p50", "p90", "p99", "p999", "max", "mean"] {
        assert!(obj["latency_us"][key].is_f64(), "missing latency_us.{key}");
    }
    for key in [
        "bytes_per_txn",
        "flushes_per_txn",
        "fences_per_txn",
        "writes_per_txn",
    ] {
        assert!(obj["pm"][key].is_f64(), "missing pm.{key}");
    }
    let kinds = obj["per_kind"].as_array().unwrap();
    assert_eq!(kinds.len(), 2);
    for key in [
        "name",
        "committed",
        "aborted",
        "throughput_tps",
        "abort_rate",
        "latency_us",
    ] {
        assert!(kinds[1].get(key).is_some(), "missing per_kind.{key}");
    }
    assert!(kinds[1]["latency_us"]["p50"].is_f64());
    assert!(obj.get("ratio_to_volatile").is_none());
    assert!(obj.get("volatile_throughput_tps").is_none());
    assert!(obj.get("latency_hist").is_none());
    assert_eq!(obj["params"]["records"], 1000);

    // With a baseline.
    let tput = rep.result.throughput_tps;
    rep.with_volatile(tput * 4.0);
    let json = serde_json::to_value(&rep).unwrap();
    assert_eq!(
        json["volatile_throughput_tps"].as_f64().unwrap(),
        tput * 4.0
    );
    assert!((json["ratio_to_volatile"].as_f64().unwrap() - 0.25).abs() < 1e-9);
}

#[test]
fn a_driver_error_stops_the_run_and_names_the_thread() {
    let err = run(config(10_000, 10_000), |thread| {
        fake(if thread == 1 { Some(5) } else { None })
    })
    .unwrap_err();
    match &err {
        BenchError::Driver { thread, message } => {
            assert_eq!(*thread, 1);
            assert!(message.contains("disk on fire"));
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("thread 1"));
}

#[test]
fn factory_errors_panics_and_bad_kinds_are_reported() {
    let err = run(config(10_000, 10_000), |thread| {
        if thread == 0 {
            Err("no worker".to_string())
        } else {
            fake(None)
        }
    })
    .unwrap_err();
    assert!(
        matches!(&err, BenchError::Factory { thread: 0, message } if message == "no worker"),
        "{err:?}"
    );

    struct Panics;
    impl TxnDriver for Panics {
        fn run_txn(&mut self) -> Result<TxnOutcome, Box<dyn std::error::Error + Send + Sync>> {
            panic!("driver bug")
        }
    }
    let err = run(config(10_000, 10_000), |thread| -> Result<_, String> {
        if thread == 1 {
            Ok(Box::new(Panics))
        } else {
            fake(None)
        }
    })
    .unwrap_err();
    assert!(
        matches!(&err, BenchError::Panicked { thread: 1, message } if message == "driver bug"),
        "{err:?}"
    );

    struct BadKind;
    impl TxnDriver for BadKind {
        fn run_txn(&mut self) -> Result<TxnOutcome, Box<dyn std::error::Error + Send + Sync>> {
            Ok(TxnOutcome {
                kind: 7,
                committed: true,
                aborts: 0,
            })
        }
    }
    let err = run(config(10_000, 10_000), |_| -> Result<_, String> {
        Ok(Box::new(BadKind))
    })
    .unwrap_err();
    assert!(matches!(err, BenchError::Driver { .. }), "{err:?}");

    let mut bad = config(0, 0);
    bad.threads = 0;
    assert!(matches!(
        run(&bad, |_| fake(None)),
        Err(BenchError::Config(_))
    ));
    bad.threads = 1;
    bad.txn_kinds.clear();
    assert!(matches!(
        run(bad, |_| fake(None)),
        Err(BenchError::Config(_))
    ));
}

#[test]
fn zero_commits_give_finite_figures() {
    struct UserAborts;
    impl TxnDriver for UserAborts {
        fn run_txn(&mut self) -> Result<TxnOutcome, Box<dyn std::error::Error + Send + Sync>> {
            std::thread::sleep(Duration::from_micros(200));
            Ok(TxnOutcome {
                kind: 0,
                committed: false,
                aborts: 0,
            })
        }
    }
    let result = run(config(10, 40), |_| -> Result<_, String> {
        Ok(Box::new(UserAborts))
    })
    .unwrap();
    assert_eq!(result.committed, 0);
    assert!(result.user_aborted > 0);
    assert_eq!(result.throughput_tps, 0.0);
    assert_eq!(result.abort_rate, 0.0);
    assert_eq!(result.pm.bytes_per_txn, 0.0);

    let mut reports = vec![
        report("falcon", result),
        report("zen", BenchResult::default()),
    ];
    reports[1].with_volatile(0.0);
    reports[0].with_volatile(f64::NAN);
    for rep in &reports {
        let text = serde_json::to_string(rep).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert!(all_numbers_finite(&value), "{text}");
    }
    assert!(BenchResult::default().latency_cdf(10).is_empty());
}

#[test]
fn table_has_a_header_a_row_per_report_and_a_per_kind_table() {
    let single = BenchResult {
        threads: 4,
        throughput_tps: 1_234_567.0,
        committed: 100,
        per_kind: Vec::new(),
        ..BenchResult::default()
    };
    let multi = run(config(0, 20), |_| fake(None)).unwrap();
    let mut reports = vec![report("falcon", single), report("zen", multi)];
    reports[0].with_volatile(2_469_134.0);

    let mut out = Vec::new();
    print_table(&reports, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("engine"), "{text}");
    for col in [
        "thr",
        "tput",
        "abort%",
        "p99 µs",
        "cpu µs/tx",
        "PM B/tx",
        "×volatile",
    ] {
        assert!(lines[0].contains(col), "missing column {col}: {text}");
    }
    assert!(lines[2].starts_with("falcon") && lines[2].contains("1,234,567"));
    assert!(lines[2].contains("0.500"));
    assert!(lines[3].starts_with("zen"));
    assert!(text.contains("per transaction kind"));
    assert!(text.contains("update"));
    // Aligned: every line of the main table has the same length up to the last column.
    assert_eq!(lines[0].chars().count(), lines[1].chars().count());

    let mut out = Vec::new();
    print_table(&[], &mut out).unwrap();
    assert!(String::from_utf8(out).unwrap().starts_with("engine"));
}

#[test]
fn loading_bar_works_without_a_terminal() {
    let bar = loading_bar(100, "loading");
    bar.inc(60);
    bar.inc(40);
    assert_eq!(bar.position(), 100);
    bar.finish_and_clear();
}

/// Every third outcome is an expected failure; every sixth also does not commit.
struct FailingDriver {
    n: u64,
}

impl TxnDriver for FailingDriver {
    fn run_txn(&mut self) -> Result<TxnOutcome, Box<dyn std::error::Error + Send + Sync>> {
        self.n += 1;
        std::thread::sleep(Duration::from_micros(20));
        Ok(TxnOutcome {
            kind: usize::from(self.n % 3 == 0),
            committed: self.n % 6 != 0,
            aborts: 0,
        })
    }

    fn last_was_expected_failure(&self) -> bool {
        self.n % 3 == 0
    }
}

#[test]
fn expected_failures_mix_and_cdfs_are_reported_per_kind() {
    let result = run(config(10, 150), |_| {
        Ok::<_, String>(Box::new(FailingDriver { n: 0 }) as Box<dyn TxnDriver>)
    })
    .unwrap();
    let (ok, failing) = (&result.per_kind[0], &result.per_kind[1]);
    assert_eq!(ok.expected_failures, 0);
    assert_eq!(ok.fail_rate, 0.0);
    assert!(failing.expected_failures > 0);
    assert_eq!(
        failing.expected_failures,
        failing.committed + failing.user_aborted
    );
    assert_eq!(failing.fail_rate, 1.0);
    // Half of the failing kind's outcomes (n % 6 == 0) did not commit.
    let half = failing.user_aborted as f64 / failing.expected_failures as f64;
    assert!((half - 0.5).abs() < 0.1, "{half}");
    assert_eq!(result.expected_failures, failing.expected_failures);
    // The measured mix: one outcome in three is of kind 1.
    assert!((failing.mix_share - 1.0 / 3.0).abs() < 0.05);
    assert!((ok.mix_share + failing.mix_share - 1.0).abs() < 1e-9);
    for kind in &result.per_kind {
        assert_eq!(kind.latency_cdf_us.len(), KINDS_CDF_POINTS);
        assert_eq!(kind.latency_cdf_us.last().unwrap().1, 1.0);
    }

    let rep = report("falcon", result);
    assert_eq!(rep.latency_cdf_us.len(), RUN_CDF_POINTS);
    let json = serde_json::to_value(&rep).unwrap();
    assert!(all_numbers_finite(&json));
    assert_eq!(
        json["latency_cdf_us"].as_array().unwrap().len(),
        RUN_CDF_POINTS
    );
    assert_eq!(json["latency_cdf_us"][RUN_CDF_POINTS - 1][1], 1.0);
    let kinds = json["per_kind"].as_array().unwrap();
    for key in [
        "expected_failures",
        "fail_rate",
        "mix_share",
        "latency_cdf_us",
    ] {
        assert!(kinds[1].get(key).is_some(), "missing per_kind.{key}");
    }

    let mut out = Vec::new();
    print_table(std::slice::from_ref(&rep), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let header = text
        .lines()
        .find(|l| l.contains(" kind "))
        .expect("a per-kind table");
    for col in ["mix%", "fail%", "p90 µs"] {
        assert!(header.contains(col), "missing column {col}: {text}");
    }
    assert!(text.contains("100.00"), "kind 1 fails every time: {text}");
}
