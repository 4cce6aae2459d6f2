//! `pmtx compare`: the command line in the default build (peers named, a peer not built refused
//! with the feature to build), and, with the `lmdb` / `pmdk` features, each peer's results
//! (committed transactions, values read back after a reopen) and a tiny comparison run.

use std::process::{Command, Output};

fn pmtx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(args)
        .output()
        .expect("run pmtx")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `pmtx compare ycsb` on 100 records for 0.1 s, with `extra` arguments.
fn tiny_ycsb(extra: &[&str]) -> Output {
    let mut args = vec![
        "compare",
        "ycsb",
        "--records",
        "100",
        "--duration",
        "0.1",
        "--warmup",
        "0",
    ];
    args.extend_from_slice(extra);
    pmtx(&args)
}

#[test]
fn compare_help_names_every_peer_and_how_to_build_it() {
    let o = pmtx(&["compare", "--help"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for peer in [
        "lmdb",
        "lmdb-writemap",
        "lmdb-nosync",
        "lmdb-mapasync",
        "pmdk",
        "rocksdb",
    ] {
        assert!(out.contains(peer), "--help does not name {peer}:\n{out}");
    }
    assert!(out.contains("scripts/peers.sh"), "{out}");
    assert!(out.contains("one write transaction at a time"), "{out}");
    for (peer, built) in [
        ("lmdb", cfg!(feature = "lmdb")),
        ("pmdk", cfg!(feature = "pmdk")),
    ] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{peer} ")))
            .unwrap_or_else(|| panic!("no line for {peer}:\n{out}"));
        if built {
            assert!(line.contains("built in"), "{line}");
        } else {
            assert!(line.contains(&format!("--features {peer}")), "{line}");
        }
    }
}

/// Several rounds end with one line per engine and thread count: the median throughput and the
/// median of each ratio measured within a round, each with its range.
#[test]
fn repeated_rounds_end_with_medians_of_throughput_and_ratios() {
    let o = pmtx(&[
        "bench",
        "ycsb",
        "--engine",
        "falcon",
        "--records",
        "200",
        "--duration",
        "0.1",
        "--warmup",
        "0",
        "--repeat",
        "3",
        "--compare-volatile",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let medians = out
        .split("median over 3 rounds")
        .nth(1)
        .unwrap_or_else(|| panic!("no median block: {out}"));
    let line = |engine: &str| {
        medians
            .lines()
            .find(|l| l.trim_start().starts_with(engine))
            .unwrap_or_else(|| panic!("no median line for {engine}: {medians}"))
    };
    let falcon = line("falcon");
    assert!(
        falcon.contains("tx/s [") && falcon.contains("×volatile "),
        "{falcon}"
    );
    assert!(!line("volatile").contains('×'), "{medians}");
}

#[test]
fn a_peer_not_built_is_refused_with_the_feature_to_build() {
    for (peer, built) in [
        ("lmdb", cfg!(feature = "lmdb")),
        ("pmdk", cfg!(feature = "pmdk")),
    ] {
        if built {
            continue;
        }
        let o = tiny_ycsb(&["--peers", peer]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("peer {peer} is not built"))
                && err.contains(&format!("--features {peer}")),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn an_unknown_peer_is_refused_with_the_list() {
    let o = pmtx(&["compare", "bank", "--peers", "rocksdb"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("unknown peer 'rocksdb'") && err.contains("pmdk"),
        "{err}"
    );
}

#[test]
fn a_workload_with_inserts_is_refused_for_the_peers() {
    if !cfg!(any(feature = "lmdb", feature = "pmdk")) {
        return;
    }
    let o = tiny_ycsb(&["--workload", "d"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("inserts or scans"), "{err}");
}

#[cfg(any(feature = "lmdb", feature = "pmdk"))]
mod peers {
    use super::*;
    use pmtx::peers::{self, Access, PeerKind, PeerYcsbDriver};
    use pmtx::workload::ycsb::{build_key, Workload};

    fn built() -> Vec<PeerKind> {
        PeerKind::ALL.into_iter().filter(|p| p.built()).collect()
    }

    struct Scratch(std::path::PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Each peer: load, run YCSB transactions (every one commits), reopen, and find every
    /// record with loaded or updated fields, and the last update of a record visible.
    #[test]
    fn each_peer_commits_ycsb_transactions_and_keeps_them_across_a_reopen() {
        let workload = Workload::from_name("a").unwrap().with_ops_per_txn(16);
        let records = 500;
        let row_len = workload.field_count as usize * workload.field_len;
        for peer in built() {
            let path = Scratch(peer.scratch_path());
            let store = peer.create(&path.0, records, row_len).unwrap();
            peers::load_ycsb(&*store, &workload, records).unwrap();
            assert_eq!(store.len().unwrap(), records, "{peer}");
            let mut d = PeerYcsbDriver::new(&*store, &workload, records, 7).unwrap();
            let mut writers = 0;
            for _ in 0..200 {
                writers += u32::from(!d.run_one().unwrap());
            }
            assert!(
                writers > 150,
                "{peer}: {writers} of 200 16-op transactions wrote"
            );
            // A known write (a whole field, as an update writes it), read back after the reopen.
            let mut field = vec![0u8; workload.field_len];
            field[..8].copy_from_slice(&42u64.to_le_bytes());
            let mut a = Access::default();
            a.add(build_key(3), true);
            a.seal();
            store
                .run(&a, &mut |tx| {
                    tx.write(build_key(3), workload.field_len, &field)
                })
                .unwrap();
            drop(store);
            let store = peer.open(&path.0, records, row_len).unwrap();
            assert_eq!(store.len().unwrap(), records, "{peer}");
            let updated = peers::check_ycsb(&*store, &workload, records).unwrap();
            assert!(updated > 100, "{peer}: only {updated} records updated");
            let mut row = vec![0u8; row_len];
            a.clear();
            a.add(build_key(3), false);
            a.seal();
            store
                .run(&a, &mut |tx| tx.read(build_key(3), &mut row))
                .unwrap();
            assert_eq!(
                &row[workload.field_len..2 * workload.field_len],
                &field[..],
                "{peer}"
            );
            // A transaction whose body fails leaves nothing.
            a.clear();
            a.add(build_key(4), true);
            a.seal();
            let e = store.run(&a, &mut |tx| {
                tx.write(build_key(4), 0, &[0xee; 8])?;
                Err(peers::PeerError::Config("user abort".into()))
            });
            assert!(e.is_err());
            store
                .run(&a, &mut |tx| tx.read(build_key(4), &mut row))
                .unwrap();
            assert_ne!(&row[..8], &[0xee; 8], "{peer}: an aborted write stayed");
            // Unknown keys are errors, not panics.
            a.clear();
            a.add(build_key(records + 5), false);
            a.seal();
            let e = store
                .run(&a, &mut |tx| tx.read(build_key(records + 5), &mut row))
                .unwrap_err();
            assert!(matches!(e, peers::PeerError::Missing(_)), "{peer}: {e}");
        }
    }

    /// Each peer: concurrent bank transfers keep the total and count every transfer.
    #[test]
    fn each_peer_keeps_the_bank_invariant_under_concurrent_transfers() {
        let accounts = 64;
        for peer in built() {
            let path = Scratch(peer.scratch_path());
            let store = peer.create(&path.0, accounts, peers::BANK_ROW).unwrap();
            peers::load_bank(&*store, accounts).unwrap();
            std::thread::scope(|s| {
                for t in 0..2 {
                    let store = &*store;
                    s.spawn(move || {
                        let mut d = peers::PeerBankDriver::new(store, accounts, t);
                        for _ in 0..300 {
                            d.run_one().unwrap();
                        }
                    });
                }
            });
            drop(store);
            let store = peer.open(&path.0, accounts, peers::BANK_ROW).unwrap();
            let transfers = peers::check_bank(&*store, accounts).unwrap();
            // 600 transfers, each counted on both accounts; few are refused for lack of funds
            // with 1000 per account and at most 100 moved.
            assert!(
                transfers % 2 == 0 && transfers / 2 > 500 && transfers / 2 <= 600,
                "{peer}: {transfers}"
            );
        }
    }

    /// The command: a tiny run of the engines and every built peer, with the ratio columns and
    /// the JSON `pmtx plot` reads.
    #[test]
    fn a_tiny_comparison_reports_every_run_with_ratios() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("c.json");
        let peers: Vec<&str> = built().iter().map(|p| p.name()).collect();
        let peer_list = peers.join(",");
        let o = pmtx(&[
            "compare",
            "ycsb",
            "--engine",
            "falcon",
            "--domain",
            "adr",
            "--records",
            "2000",
            "--ops-per-txn",
            "16",
            "--threads",
            "1,2",
            "--duration",
            "0.3",
            "--warmup",
            "0",
            "--peers",
            &peer_list,
            "--repeat",
            "2",
            "--json",
            json.to_str().unwrap(),
        ]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        let medians = out.split("median over 2 rounds").nth(1).unwrap_or("");
        for p in &peers {
            assert!(out.contains(&format!("×{p}")), "{out}");
            assert!(medians.contains(&format!("×{p} ")), "{out}");
            assert!(err.contains(&format!("{p}, 2 thr: reopened")), "{err}");
        }
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let runs = v.as_array().unwrap();
        assert_eq!(runs.len(), 2 * 2 * (1 + peers.len()));
        for r in runs {
            assert!(r["committed"].as_u64().unwrap() > 0, "{r}");
            if r["engine"] == "falcon" {
                for p in &peers {
                    assert!(r["ratio_to_peers"][p].as_f64().unwrap() > 0.0, "{r}");
                }
            }
        }
        let o = pmtx(&[
            "compare",
            "bank",
            "--accounts",
            "200",
            "--duration",
            "0.2",
            "--warmup",
            "0",
            "--threads",
            "2",
            "--peers",
            &peer_list,
        ]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        assert!(err.contains("bank check passed"), "{err}");
    }
}
