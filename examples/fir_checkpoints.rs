//! FIR's Fig. 13 (issue 14): index leaf checkpoint time and size, full vs incremental vs the
//! time cost model (§4.3.3), for YCSB-style updates of Zipfian skew θ from 0 (uniform) to 0.99.
//!
//! One database per checkpoint mode, loaded with the same records and checkpointed once (full);
//! then for each θ the same number of single-key updates, drawn from a Zipfian over the key
//! ranks (rank = key, not scrambled as YCSB's keys are, so that skew concentrates the writes in a
//! part of the index, which is what the cost model's α measures), followed by a timed checkpoint
//! of the mode. Every mode sees the same update sequence (same seed). The cost model's goal: never
//! more than 10 % slower than the better of full and incremental.
//!
//! `cargo run --release --example fir_checkpoints [records] [updates per θ] [rounds]`
//! (defaults 1,000,000, 20,000 and 3; each round is a new update batch and checkpoint per θ,
//! and the median time counts: the machine is shared).

use pmtx::engine::fir::{CheckpointKind, CheckpointMode, CheckpointStats};
use pmtx::prelude::*;
use pmtx::workload::ycsb::ZipfianGenerator;
use rand::{Rng, SeedableRng};

const THETAS: [f64; 6] = [0.0, 0.5, 0.7, 0.8, 0.9, 0.99];

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(default)
}

/// Runs every θ's rounds against a fresh database checkpointing in `mode`; returns, per θ, the
/// stats of each round's checkpoint.
fn run(
    mode: CheckpointMode,
    records: u64,
    updates: u64,
    rounds: u64,
) -> Result<Vec<Vec<CheckpointStats>>, DbError> {
    let mut cfg = DbConfig::temporary()
        .engine(EngineKind::Fir)
        .protocol(Protocol::Mvto)
        .pool_size((records * 160 + (512 << 20)).next_multiple_of(2 << 20))
        .max_threads(2);
    cfg.fir_checkpoint_interval_ms = None;
    cfg.fir_checkpoint_mode = mode;
    let db = Db::create(cfg)?;
    let t = db.create_table(Schema::new("kv", &[("v", ColumnType::U64)]))?;
    let keys: Vec<u64> = (0..records).collect();
    for chunk in keys.chunks(10_000) {
        db.run(|tx| {
            chunk
                .iter()
                .try_for_each(|&k| tx.insert(t, k, &[Value::U64(k)]))
        })?;
    }
    let checkpoint = |db: &Db| db.checkpoint().expect("a FIR database");
    checkpoint(&db)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut out = Vec::new();
    for theta in THETAS {
        let mut zipf = (theta > 0.0).then(|| {
            ZipfianGenerator::with_theta(0, records, theta).expect("0 < θ < 1 and records > 0")
        });
        let mut stats = Vec::new();
        for _ in 0..rounds {
            let picks: Vec<u64> = (0..updates)
                .map(|_| match zipf.as_mut() {
                    Some(z) => z.next(&mut rng),
                    None => rng.gen_range(0..records),
                })
                .collect();
            for chunk in picks.chunks(16) {
                db.run(|tx| {
                    chunk
                        .iter()
                        .try_for_each(|&k| tx.update(t, k, &[(0, Value::U64(k + 1))]))
                })?;
            }
            stats.push(checkpoint(&db)?);
        }
        out.push(stats);
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), DbError> {
    let records = arg(1, 1_000_000);
    let updates = arg(2, 20_000);
    let rounds = arg(3, 3).max(1);
    let modes = [
        CheckpointMode::Full,
        CheckpointMode::Incremental,
        CheckpointMode::CostModel,
    ];
    let results: Vec<_> = modes
        .iter()
        .map(|&m| run(m, records, updates, rounds))
        .collect::<Result<_, _>>()?;
    println!(
        "{records} records, {updates} single-key updates per θ and round, {rounds} rounds (median ms)"
    );
    println!(
        "{:>5} | {:>9} {:>9} | {:>9} {:>9} {:>7} | {:>9} {:>9} {:>11} | {:>8} {:>6}",
        "θ",
        "full ms",
        "full MiB",
        "incr ms",
        "incr MiB",
        "α",
        "model ms",
        "model MiB",
        "model chose",
        "vs best",
        "goal"
    );
    let mib = |s: &[CheckpointStats]| {
        s.iter().map(|s| s.entries_written).sum::<u64>() as f64 * 32.0
            / s.len() as f64
            / (1 << 20) as f64
    };
    let ms = |s: &[CheckpointStats]| median(s.iter().map(|s| s.ms).collect());
    let mut misses = 0;
    for (i, theta) in THETAS.iter().enumerate() {
        let (full, inc, model) = (&results[0][i], &results[1][i], &results[2][i]);
        let best = ms(full).min(ms(inc));
        let ratio = ms(model) / best;
        let chose: Vec<&str> = model
            .iter()
            .map(|s| match s.kind {
                CheckpointKind::Full => "F",
                CheckpointKind::Incremental => "I",
            })
            .collect();
        let ok = ratio <= 1.10;
        misses += usize::from(!ok);
        println!(
            "{theta:>5} | {:>9.2} {:>9.1} | {:>9.2} {:>9.1} {:>7.3} | {:>9.2} {:>9.1} {:>11} | {:>7.2}x {:>6}",
            ms(full),
            mib(full),
            ms(inc),
            mib(inc),
            median(inc.iter().map(|s| s.alpha).collect()),
            ms(model),
            mib(model),
            chose.join(""),
            ratio,
            if ok { "met" } else { "MISSED" }
        );
    }
    println!(
        "cost model within 10 % of the better mode at {} of {} θ",
        THETAS.len() - misses,
        THETAS.len()
    );
    Ok(())
}
