//! `pmtx plot` and `bench::plot`: figures from real benchmark JSON, and clear errors for bad input.

use pmtx::bench::plot::{self, Figure, PlotError};
use std::path::{Path, PathBuf};
use std::process::Command;

fn pmtx(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(args)
        .output()
        .unwrap()
}

/// A short TATP run of two engines at 1 and 2 threads with a volatile baseline, as JSON.
fn bench_json(dir: &Path) -> PathBuf {
    let json = dir.join("runs.json");
    let out = pmtx(&[
        "bench",
        "tatp",
        "--subscribers",
        "1000",
        "--engine",
        "falcon",
        "--compare-volatile",
        "--threads",
        "1,2",
        "--duration",
        "0.1",
        "--warmup",
        "0",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json
}

fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn plot_writes_every_figure_as_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let json = bench_json(dir.path());
    let out = dir.path().join("fig.png");
    let run = pmtx(&[
        "plot",
        json.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for figure in ["throughput", "ratio", "cdf", "kinds"] {
        let path = dir.path().join(format!("fig-{figure}.png"));
        assert!(stdout.contains(path.to_str().unwrap()), "{stdout}");
        assert_eq!(png_size(&path), plot::SIZE);
        // A drawn figure, not a blank canvas: well above the size of a white PNG.
        assert!(std::fs::metadata(&path).unwrap().len() > 10_000, "{figure}");
    }

    // One figure: written under the name given; SVG by extension, with its text.
    let svg = dir.path().join("cdf.svg");
    let run = pmtx(&[
        "plot",
        json.to_str().unwrap(),
        "--out",
        svg.to_str().unwrap(),
        "--figure",
        "cdf",
    ]);
    assert!(run.status.success());
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("latency CDF"));
    assert!(text.contains("falcon") && text.contains("volatile"));

    // The library API on the same file, and several inputs plotted together.
    let runs = plot::load_runs(&[&json, &json]).unwrap();
    assert_eq!(runs.len(), 8);
    let written = plot::plot(&runs, &[Figure::Throughput], &dir.path().join("t.png")).unwrap();
    assert_eq!(written, vec![dir.path().join("t.png")]);
}

#[test]
fn bad_input_is_rejected_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let out = dir.path().join("fig.png");

    let broken = write("broken.json", "[{\"engine\": \"falcon\",");
    let err = plot::load_runs(&[&broken]).unwrap_err();
    assert!(matches!(err, PlotError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("is not a pmtx bench JSON file"));

    let object = write("object.json", "{\"engine\": \"falcon\"}");
    assert!(matches!(
        plot::load_runs(&[&object]).unwrap_err(),
        PlotError::Parse { .. }
    ));
    let missing_field = write("nofield.json", "[{\"engine\": \"falcon\", \"threads\": 1}]");
    let err = plot::load_runs(&[&missing_field]).unwrap_err().to_string();
    assert!(err.contains("missing field"), "{err}");

    let negative = write(
        "negative.json",
        r#"[{"engine": "falcon", "workload": "tatp", "threads": 1, "throughput_tps": -5.0}]"#,
    );
    let err = plot::load_runs(&[&negative]).unwrap_err();
    assert!(matches!(err, PlotError::BadRun { index: 0, .. }), "{err}");

    let empty = write("empty.json", "[]");
    assert!(matches!(
        plot::load_runs(&[&empty]).unwrap_err(),
        PlotError::NoRuns
    ));
    let absent = dir.path().join("absent.json");
    assert!(matches!(
        plot::load_runs(&[&absent]).unwrap_err(),
        PlotError::Read { .. }
    ));

    // A run without a baseline, CDF or kinds: only the throughput figure can be drawn.
    let bare = write(
        "bare.json",
        r#"[{"engine": "falcon", "workload": "ycsb-a", "threads": 1, "throughput_tps": 5.0}]"#,
    );
    let runs = plot::load_runs(&[&bare]).unwrap();
    let err = plot::plot(&runs, &[Figure::Ratio], &out).unwrap_err();
    assert!(err.to_string().contains("--compare-volatile"), "{err}");
    assert!(matches!(
        plot::plot(&runs, &[Figure::Throughput], &dir.path().join("fig.jpg")).unwrap_err(),
        PlotError::Format(_)
    ));
    plot::plot(&runs, &[Figure::Throughput], &out).unwrap();
    png_size(&out);

    // Through the command line: non-zero exit, the file named, nothing written.
    let fig = dir.path().join("never.png");
    let run = pmtx(&[
        "plot",
        broken.to_str().unwrap(),
        "--out",
        fig.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("broken.json") && stderr.contains("not a pmtx bench JSON"),
        "{stderr}"
    );
    assert!(!dir.path().join("never-throughput.png").exists());
    let run = pmtx(&[
        "plot",
        bare.to_str().unwrap(),
        "--out",
        fig.to_str().unwrap(),
    ]);
    assert!(run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("skipping"));
    assert!(dir.path().join("never-throughput.png").exists());
}

/// The recovery figure draws runs that carry `recovery_ms` (as `pmtx reproduce fir` writes them)
/// and is refused, saying why, for runs without it.
#[test]
fn the_recovery_figure_needs_recovery_times() {
    let dir = tempfile::tempdir().unwrap();
    let json = bench_json(dir.path());
    let runs = plot::load_runs(&[&json]).unwrap();
    let err = plot::plot(&runs, &[Figure::Recovery], &dir.path().join("r.png")).unwrap_err();
    assert!(err.to_string().contains("recovery"), "{err}");

    let mut values: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for (i, v) in values.iter_mut().enumerate() {
        v["recovery_ms"] = serde_json::Value::from(100.0 * (i + 1) as f64);
    }
    let with = dir.path().join("with-recovery.json");
    std::fs::write(&with, serde_json::to_string(&values).unwrap()).unwrap();
    let runs = plot::load_runs(&[&with]).unwrap();
    assert!(runs.iter().all(|r| r.recovery_ms.is_some()));
    let svg = dir.path().join("r.svg");
    plot::plot(&runs, &[Figure::Recovery], &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("recovery time (ms)") && text.contains("falcon"));

    values[0]["recovery_ms"] = serde_json::Value::from(-1.0);
    std::fs::write(&with, serde_json::to_string(&values).unwrap()).unwrap();
    assert!(
        plot::load_runs(&[&with]).is_err(),
        "a negative time is refused"
    );
}
