//! `pmtx reproduce <paper>`: a small version of a paper's headline experiment, run with the PM
//! media model and NVM latency emulation on (docs/MEDIA.md), printed beside the paper's figure
//! and drawn (issue 20, item 3; docs/REPRODUCE.md keeps the results).
//!
//! Each experiment is a list of `pmtx bench` command lines, printed before they run so that
//! anyone can rerun one alone; their JSON goes to the output folder, the comparison to stdout and
//! the figure to `<out>/<paper>.png`.

use super::{Cli, CliResult, Command};
use crate::bench::plot::{self, Figure};
use crate::cc::Protocol;
use crate::db::{Db, DbConfig};
use crate::pmem::PersistenceDomain;
use clap::Parser;
use serde_json::Value;
use std::path::PathBuf;

/// A paper whose headline result `pmtx reproduce` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Paper {
    /// Falcon (SOSP'23) §6.2.3: selective flush and the small log window against in-place
    /// updates, YCSB-A with every field updated, uniform and Zipfian.
    Falcon,
    /// Zen (VLDB'21) §3–4: a tuple write costs PM the tuple and nothing else.
    Zen,
    /// FIR (Electronics'25) §5.3: recovery time against a full scan.
    Fir,
    /// ArchTM (FAST'21) §6.2: write amplification of copy-on-write transactions.
    Archtm,
    /// DUDETx (TOS'18) §6.4: log combination's savings of PM writes.
    Dudetx,
}

/// Arguments of `pmtx reproduce`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The paper.
    pub paper: Paper,
    /// Folder for the runs' JSON and the figure (created if missing).
    #[arg(long, default_value = "target/reproduce")]
    pub out: PathBuf,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// YCSB records loaded before each run.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
}

pub(crate) fn run(args: Args) -> CliResult {
    let missing = |engine: &str, issue: u32| -> CliResult {
        Err(format!(
            "`pmtx reproduce {}` needs the {engine} engine, which is not built yet (issue \
             {issue}); the papers that can be reproduced today are falcon, zen and fir",
            args.paper.name()
        )
        .into())
    };
    match args.paper {
        Paper::Falcon => falcon(&args),
        Paper::Zen => zen(&args),
        Paper::Fir => fir(&args),
        Paper::Archtm => missing("ArchTM", 15),
        Paper::Dudetx => missing("DUDETx", 16),
    }
}

impl Paper {
    fn name(self) -> &'static str {
        match self {
            Paper::Falcon => "falcon",
            Paper::Zen => "zen",
            Paper::Fir => "fir",
            Paper::Archtm => "archtm",
            Paper::Dudetx => "dudetx",
        }
    }
}

/// One experiment: its label (the figure's group), the `pmtx bench` arguments, where its JSON
/// goes.
struct Step {
    label: &'static str,
    args: Vec<String>,
    json: PathBuf,
}

/// Runs `steps` (printing each command first) and returns their runs, each labelled, after
/// writing them together to `<out>/<paper>.json` and drawing `<out>/<paper>.png`.
fn run_steps(args: &Args, steps: &[Step]) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    run_steps_then(args, steps, Figure::Media, |_| Ok(()))
}

/// [`run_steps`], with `annotate` adding to the runs (e.g. measurements taken after them) before
/// they are written and drawn as `figure`.
fn run_steps_then(
    args: &Args,
    steps: &[Step],
    figure: Figure,
    annotate: impl FnOnce(&mut [Value]) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    if !(args.duration > 0.0 && args.duration <= 600.0) {
        return Err(format!(
            "--duration must be more than 0 and at most 600 seconds, not {}",
            args.duration
        )
        .into());
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let mut all = Vec::new();
    for step in steps {
        let mut line = vec!["pmtx".to_string(), "bench".to_string()];
        line.extend(step.args.iter().cloned());
        line.push("--json".into());
        line.push(step.json.display().to_string());
        outln!("\n$ {}", line.join(" "));
        let cli = Cli::try_parse_from(&line).map_err(|e| e.to_string())?;
        let Command::Bench(bench) = cli.command else {
            unreachable!("the line starts with `pmtx bench`")
        };
        super::bench::run(bench)?;
        let text = std::fs::read_to_string(&step.json)
            .map_err(|e| format!("cannot read {}: {e}", step.json.display()))?;
        let runs: Vec<Value> = serde_json::from_str(&text)?;
        for mut r in runs {
            if let Some(params) = r.get_mut("params").and_then(Value::as_object_mut) {
                params.insert("label".into(), Value::from(step.label));
            }
            all.push(r);
        }
    }
    annotate(&mut all)?;
    let name = args.paper.name();
    let json = args.out.join(format!("{name}.json"));
    std::fs::write(&json, serde_json::to_string_pretty(&all)?)
        .map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    let figure_path = args.out.join(format!("{name}.png"));
    let runs = plot::load_runs(&[&json])?;
    plot::draw_figure(&runs, figure, &figure_path)?;
    outln!(
        "\nruns: {}\nfigure: {}",
        json.display(),
        figure_path.display()
    );
    Ok(all)
}

/// The common `pmtx bench ycsb` arguments of an experiment: one thread, the media model and
/// Optane latency emulation, a warm-up of half the duration (at most 1 s).
fn ycsb(args: &Args, engines: &str, domain: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "ycsb",
        "--engine",
        engines,
        "--domain",
        domain,
        "--threads",
        "1",
        "--media-model",
        "optane",
        "--nvm-latency",
        "optane",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend([
        "--warmup".to_string(),
        (args.duration / 2.0).min(1.0).to_string(),
        "--duration".to_string(),
        args.duration.to_string(),
        "--records".to_string(),
        args.records.to_string(),
    ]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn field<'a>(run: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(run, |v, k| v.get(*k))
}

fn number(run: &Value, path: &[&str]) -> f64 {
    field(run, path).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn find<'a>(runs: &'a [Value], label: &str, engine: &str) -> Option<&'a Value> {
    runs.iter().find(|r| {
        field(r, &["params", "label"]).and_then(Value::as_str) == Some(label)
            && r["engine"].as_str() == Some(engine)
    })
}

/// Falcon §6.2.3 (Figure 9): YCSB with all ten fields updated, OCC, eADR. "Falcon and Falcon
/// (All Flush) use small log windows to avoid logging overhead, increasing throughput by
/// 1.71×~2.01× under YCSB-A and YCSB-F Uniform workloads. For [...] Zipfian workloads with hot
/// tuples, Falcon also uses selective flush [...], achieving a throughput improvement of 3.14×
/// over Inp and 1.75× over Falcon (All Flush)."
fn falcon(args: &Args) -> CliResult {
    let engines = "falcon,falcon-allflush,inp";
    let all_fields = ["--write-all-fields"];
    let steps = [("uniform", "0"), ("zipfian", "0.99")].map(|(label, theta)| {
        let mut extra = all_fields.to_vec();
        extra.extend(["--theta", theta]);
        Step {
            label,
            args: ycsb(args, engines, "eadr", &extra),
            json: args.out.join(format!("falcon-{label}.json")),
        }
    });
    let runs = run_steps(args, &steps)?;
    outln!(
        "\nFalcon §6.2.3, YCSB-A, all ten fields updated, OCC, eADR, 1 thread, optane model and \
         latency; throughput relative to inp:"
    );
    outln!(
        "{:<9} {:<16} {:>10} {:>11} {:>16} {:>13} {:>6}",
        "keys",
        "engine",
        "tx/s",
        "×inp pmtx",
        "×inp paper",
        "media W B/tx",
        "WA"
    );
    for (label, paper) in [
        ("uniform", ["1.71–2.01", "1.71–2.01", "1"]),
        ("zipfian", ["3.14", "1.79 (3.14/1.75)", "1"]),
    ] {
        let inp = find(&runs, label, "inp").map_or(f64::NAN, |r| number(r, &["throughput_tps"]));
        for (engine, paper) in ["falcon", "falcon-allflush", "inp"].iter().zip(paper) {
            let Some(r) = find(&runs, label, engine) else {
                continue;
            };
            let tps = number(r, &["throughput_tps"]);
            outln!(
                "{:<9} {:<16} {:>10.0} {:>11.2} {:>16} {:>13.1} {:>6.2}",
                label,
                engine,
                tps,
                tps / inp,
                paper,
                number(r, &["pm", "media_bytes_per_txn"]),
                number(r, &["pm", "write_amplification"])
            );
        }
    }
    outln!(
        "(the paper's machine: Optane DC PM with eADR, 48 threads; here: DRAM with the model; see \
         docs/REPRODUCE.md for where and why they differ)"
    );
    Ok(())
}

/// Zen §3–4: "for every tuple write, the only NVM write is for the modified tuple itself" (no
/// log, no checkpoint, no metadata write for reads). Measured as the media bytes written per
/// tuple write, relative to the tuple's bytes, against Falcon (a log window) and Inp (a log).
fn zen(args: &Args) -> CliResult {
    let steps = [Step {
        label: "ycsb-a",
        args: ycsb(args, "zen,falcon,inp", "eadr", &["--theta", "0"]),
        json: args.out.join("zen-ycsb-a.json"),
    }];
    let runs = run_steps(args, &steps)?;
    // The default YCSB record: 10 fields of 100 bytes; an update rewrites one field.
    let tuple = 1000.0;
    outln!(
        "\nZen §3: PM media bytes written per tuple write (YCSB-A, 1,000-byte records, one field \
         updated, eADR, 1 thread, optane model and latency):"
    );
    outln!(
        "{:<8} {:>10} {:>13} {:>20} {:>22}",
        "engine",
        "tx/s",
        "media W B/tx",
        "per tuple write, B",
        "÷ tuple (paper: zen 1)"
    );
    for engine in ["zen", "falcon", "inp"] {
        let Some(r) = find(&runs, "ycsb-a", engine) else {
            continue;
        };
        let writes = r["per_kind"]
            .as_array()
            .and_then(|kinds| {
                kinds
                    .iter()
                    .find(|k| k["name"] == "read-write")
                    .map(|k| number(k, &["mix_share"]))
            })
            .unwrap_or(f64::NAN);
        let per_write = number(r, &["pm", "media_bytes_per_txn"]) / writes;
        outln!(
            "{:<8} {:>10.0} {:>13.1} {:>20.0} {:>22.2}",
            engine,
            number(r, &["throughput_tps"]),
            number(r, &["pm", "media_bytes_per_txn"]),
            per_write,
            per_write / tuple
        );
    }
    outln!(
        "(Zen's throughput claims, up to 10.1× over MMDB, WBL and FOEDUS, need those baselines: \
         issue 18)"
    );
    Ok(())
}

/// FIR §5.3 (Figure 11, "Unplanned Crash"): "the recovery speed of FIR is 43.6×–54.5× faster"
/// than engines that rebuild their DRAM indexes by scanning the data, Zen among them (its
/// recovery is "only 1.8–5.4 % of FIR"), because FIR loads its indexes' leaf checkpoint and
/// redoes only what was written after it (§4.3–4.4). Here: TPC-C on each engine with its pool
/// kept, then that pool recovered [`RECOVERIES`] times (median).
///
/// Two differences from the paper, printed with the result: the pools are recovered after the run
/// ends (a kill mid-run is `scripts/recovery_sizes.sh`), and they are small (2 warehouses).
fn fir(args: &Args) -> CliResult {
    // Engine, its protocol (FIR runs MVTO only), the pool file.
    let engines: Vec<(&str, Protocol, PathBuf)> = [
        ("fir", Protocol::Mvto),
        ("zen", Protocol::Occ),
        ("falcon", Protocol::Occ),
    ]
    .into_iter()
    .map(|(engine, cc)| {
        let pool = crate::pmem::default_pool_path(&format!("reproduce-fir-{engine}"));
        (engine, cc, pool)
    })
    .collect();
    for (_, _, pool) in &engines {
        crate::pmem::scratch::register(pool);
    }
    let steps: Vec<Step> = engines
        .iter()
        .map(|(engine, cc, pool)| Step {
            label: "tpcc",
            args: [
                "tpcc",
                "--engine",
                engine,
                "--cc",
                cc.name(),
                "--domain",
                "adr",
                "--threads",
                "1",
                "--warehouses",
                "2",
                "--media-model",
                "optane",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([
                "--warmup".into(),
                (args.duration / 2.0).min(1.0).to_string(),
                "--duration".into(),
                args.duration.to_string(),
                "--pool".into(),
                pool.display().to_string(),
            ])
            .collect(),
            json: args.out.join(format!("fir-{engine}.json")),
        })
        .collect();
    let measured = run_steps_then(args, &steps, Figure::Recovery, |runs| {
        for run in runs.iter_mut() {
            let engine = run["engine"].as_str().unwrap_or_default().to_string();
            let Some((_, cc, pool)) = engines.iter().find(|e| e.0 == engine) else {
                continue;
            };
            let ms = median_recovery_ms(pool, *cc)?;
            if let Some(obj) = run.as_object_mut() {
                obj.insert("recovery_ms".into(), Value::from(ms));
            }
        }
        Ok(())
    });
    for (_, _, pool) in &engines {
        let _ = std::fs::remove_file(pool);
        crate::pmem::scratch::unregister(pool);
    }
    let runs = measured?;
    outln!(
        "\nFIR §5.3: recovery of a TPC-C pool (2 warehouses, ADR, 1 thread, {} s), median of {} \
         recoveries after the run ended:",
        args.duration,
        RECOVERIES
    );
    outln!(
        "{:<8} {:>10} {:>13} {:>17} {:>22}",
        "engine",
        "tx/s",
        "recovery ms",
        "÷ fir's (pmtx)",
        "÷ fir's (paper)"
    );
    let fir_ms = find(&runs, "tpcc", "fir").map_or(f64::NAN, |r| number(r, &["recovery_ms"]));
    for (engine, paper) in [("fir", "1"), ("zen", "18.5–55.6"), ("falcon", "—")] {
        let Some(r) = find(&runs, "tpcc", engine) else {
            continue;
        };
        let ms = number(r, &["recovery_ms"]);
        outln!(
            "{:<8} {:>10.0} {:>13.2} {:>17.2} {:>22}",
            engine,
            number(r, &["throughput_tps"]),
            ms,
            ms / fir_ms,
            paper
        );
    }
    outln!(
        "(the paper's figure is Zen at 1.8–5.4 % of FIR's recovery speed, at 128 and 2,048 \
         warehouses after a crash mid-run; Falcon's PM indexes, `--index pm`, are not in it. \
         docs/REPRODUCE.md says where and why pmtx differs)"
    );
    Ok(())
}

/// How many times [`fir`] recovers each pool.
const RECOVERIES: usize = 3;

/// Opens (recovers) `pool` [`RECOVERIES`] times and returns the median recovery time.
fn median_recovery_ms(
    pool: &std::path::Path,
    protocol: Protocol,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut times = Vec::with_capacity(RECOVERIES);
    for _ in 0..RECOVERIES {
        let config = DbConfig::temporary()
            .protocol(protocol)
            .domain(PersistenceDomain::Adr)
            .path(pool);
        let db = Db::open(config)?;
        let report = db.recovery_report().ok_or("the engine ran no recovery")?;
        times.push(report.total_ms);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[RECOVERIES / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn papers_without_an_engine_say_what_is_missing() {
        for (paper, engine) in [(Paper::Archtm, "ArchTM"), (Paper::Dudetx, "DUDETx")] {
            let e = run(Args {
                paper,
                out: PathBuf::from("/nonexistent/never-created"),
                duration: 1.0,
                records: 10,
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains(engine) && e.contains("not built yet"), "{e}");
        }
    }
}
