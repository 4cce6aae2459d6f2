//! `pmtx reproduce <paper>`: a small version of a paper's headline experiment, run with the PM
//! media model and NVM latency emulation on (docs/MEDIA.md), printed beside the paper's figure
//! and drawn (issue 20, item 3; docs/REPRODUCE.md keeps the results).
//!
//! Each experiment is a list of `pmtx bench` command lines, printed before they run so that
//! anyone can rerun one alone; their JSON goes to the output folder, the comparison to stdout and
//! the figure to `<out>/<paper>.png`.

use super::{Cli, CliResult, Command};
use crate::bench::plot::{self, Figure};
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
             {issue}); the papers that can be reproduced today are falcon and zen",
            args.paper.name()
        )
        .into())
    };
    match args.paper {
        Paper::Falcon => falcon(&args),
        Paper::Zen => zen(&args),
        Paper::Fir => missing("FIR", 14),
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
    let name = args.paper.name();
    let json = args.out.join(format!("{name}.json"));
    std::fs::write(&json, serde_json::to_string_pretty(&all)?)
        .map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    let figure = args.out.join(format!("{name}.png"));
    let runs = plot::load_runs(&[&json])?;
    plot::draw_figure(&runs, Figure::Media, &figure)?;
    outln!("\nruns: {}\nfigure: {}", json.display(), figure.display());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn papers_without_an_engine_say_what_is_missing() {
        for (paper, engine) in [
            (Paper::Fir, "FIR"),
            (Paper::Archtm, "ArchTM"),
            (Paper::Dudetx, "DUDETx"),
        ] {
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
