//! The PM media model and NVM latency emulation through a database and the CLI (issue 20): a
//! model attached to a pool sees the engine's PM traffic, emulation charges delay, nothing is
//! counted without them, and `pmtx bench --media-model` reports the media fields in its JSON.

use pmtx::bench::plot::{self, Figure, PlotError};
use pmtx::catalog::{ColumnType, Schema};
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::EngineKind;
use pmtx::pmem::{stats, MediaModel, MediaOptions, NvmLatency, PersistenceDomain, PmStats};
use std::process::Command;

/// The calling thread's PM counters after creating a database with `media`, inserting 2,000
/// rows of 256 bytes in batches of 100 and updating each once, minus those before.
fn traffic(engine: EngineKind, domain: PersistenceDomain, media: Option<MediaOptions>) -> PmStats {
    let config = DbConfig::temporary()
        .engine(engine)
        .domain(domain)
        .pool_size(64 << 20)
        .max_threads(2)
        .media(media);
    let db = Db::create(config).unwrap();
    let t = db
        .create_table(Schema::new("t", &[("v", ColumnType::Bytes(256))]))
        .unwrap();
    let mut w = db.worker().unwrap();
    let before = stats::thread_snapshot();
    for batch in 0..20u64 {
        w.run(|tx| {
            for k in batch * 100..(batch + 1) * 100 {
                tx.insert(t, k, &[Value::Bytes(&[k as u8; 256])])?;
            }
            Ok(())
        })
        .unwrap();
    }
    for k in 0..2000u64 {
        w.run(|tx| tx.update(t, k, &[(0, Value::Bytes(&[1; 256]))]))
            .unwrap();
    }
    stats::thread_snapshot() - before
}

fn optane(latency: Option<NvmLatency>) -> Option<MediaOptions> {
    Some(MediaOptions {
        model: MediaModel::optane(),
        latency,
    })
}

#[test]
fn a_model_sees_the_engines_traffic_and_nothing_is_counted_without_one() {
    for engine in [EngineKind::Falcon, EngineKind::Zen] {
        let off = traffic(engine, PersistenceDomain::Adr, None);
        assert_eq!(
            (
                off.media_bytes_written,
                off.media_bytes_read,
                off.emulated_delay_ns
            ),
            (0, 0, 0),
            "{engine:?} without a model"
        );
        let on = traffic(engine, PersistenceDomain::Adr, optane(None));
        // 2,000 rows of 256 bytes written twice (plus logs) must reach the media: at least the
        // rows' bytes once, in whole XPLines.
        assert!(
            on.media_bytes_written >= 2000 * 256,
            "{engine:?}: {} media bytes written",
            on.media_bytes_written
        );
        assert_eq!(on.media_bytes_written % 256, 0);
        assert!(on.media_bytes_read > 0);
        assert_eq!(on.emulated_delay_ns, 0, "no emulation asked for");
    }
}

#[test]
fn emulation_charges_delay_for_persists_under_adr_and_not_under_eadr() {
    // Reads as DRAM, so only persisting fences are charged.
    let persist_only = NvmLatency {
        read_ns: 0,
        persist_ns: 100,
        write_mb_per_s: 0,
        seq_read_ns: 0,
    };
    let adr = traffic(
        EngineKind::Falcon,
        PersistenceDomain::Adr,
        optane(Some(persist_only)),
    );
    // Every one of the 2,020 commits persists its log and its data: two fences of 100 ns at
    // least.
    assert!(
        adr.emulated_delay_ns >= 2 * 2020 * 100,
        "{} ns",
        adr.emulated_delay_ns
    );
    let eadr = traffic(
        EngineKind::Falcon,
        PersistenceDomain::Eadr,
        optane(Some(persist_only)),
    );
    assert_eq!(eadr.emulated_delay_ns, 0, "eADR fences persist nothing");
}

#[test]
fn bench_reports_media_fields_only_with_a_model() {
    let dir = tempfile::tempdir().unwrap();
    for (model, expect) in [("optane", true), ("none", false)] {
        let json = dir.path().join(format!("{model}.json"));
        let out = Command::new(env!("CARGO_BIN_EXE_pmtx"))
            .args([
                "bench",
                "ycsb",
                "--engine",
                "falcon",
                "--records",
                "2000",
                "--duration",
                "0.3",
                "--warmup",
                "0",
                "--media-model",
                model,
                "--compare-volatile",
                "--json",
            ])
            .arg(&json)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.contains("WA"), expect, "{stdout}");
        let runs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        for run in runs.as_array().unwrap() {
            let pm = &run["pm"];
            let volatile = run["engine"] == "volatile";
            for key in ["media_bytes_per_txn", "write_amplification"] {
                assert_eq!(
                    pm[key].is_f64(),
                    expect && !volatile,
                    "{model} {}: pm.{key} = {}",
                    run["engine"],
                    pm[key]
                );
            }
        }
    }
    // The media figure draws the runs that have a model, and refuses files without one.
    let runs = plot::load_runs(&[dir.path().join("optane.json")]).unwrap();
    let svg = dir.path().join("media.svg");
    plot::plot(&runs, &[Figure::Media], &svg).unwrap();
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("media bytes written per transaction"));
    let runs = plot::load_runs(&[dir.path().join("none.json")]).unwrap();
    assert!(matches!(
        plot::plot(&runs, &[Figure::Media], &svg),
        Err(PlotError::Missing { .. })
    ));
    let bad = Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(["bench", "ycsb", "--nvm-latency", "fast"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NVM latency 'fast'"));
}

#[test]
fn reproduce_runs_zens_and_firs_experiments_and_names_what_is_missing_for_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args([
            "reproduce",
            "zen",
            "--duration",
            "0.2",
            "--records",
            "2000",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The command it ran, then one row per engine with a finite ratio.
    assert!(
        stdout.contains("$ pmtx bench ycsb --engine zen,falcon,inp"),
        "{stdout}"
    );
    let zen_row = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("zen "))
        .expect("a row for zen");
    let ratio: f64 = zen_row.split_whitespace().last().unwrap().parse().unwrap();
    assert!(ratio.is_finite() && ratio > 0.0, "{zen_row}");
    assert!(dir.path().join("zen.png").exists() && dir.path().join("zen.json").exists());
    // FIR §5.3: a recovery time per engine, and the recovery figure.
    let fir = Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(["reproduce", "fir", "--duration", "0.2", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&fir.stdout);
    assert!(
        fir.status.success(),
        "{}",
        String::from_utf8_lossy(&fir.stderr)
    );
    for engine in ["fir", "zen", "falcon"] {
        let row = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with(&format!("{engine} ")))
            .unwrap_or_else(|| panic!("a row for {engine}: {stdout}"));
        let recovery_ms: f64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(recovery_ms.is_finite() && recovery_ms > 0.0, "{row}");
    }
    assert!(dir.path().join("fir.png").exists() && dir.path().join("fir.json").exists());
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("fir.json")).unwrap())
            .unwrap();
    assert!(runs
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["recovery_ms"].as_f64().is_some()));
    let archtm = Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(["reproduce", "archtm"])
        .output()
        .unwrap();
    assert!(!archtm.status.success());
    assert!(String::from_utf8_lossy(&archtm.stderr).contains("needs the ArchTM engine"));
}
