//! Per-operation cost of `Db::run` against `Worker::run` (issue 21), in one run: one-row reads
//! and one-row updates on a temporary Falcon database, each way, on the calling thread.
//!
//! `cargo run --example run_cost [ops]` (a few seconds; build with `--release` for real numbers).

use pmtx::prelude::*;
use std::time::Instant;

fn main() -> Result<(), DbError> {
    let ops: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("ops: a number"))
        .unwrap_or(200_000);
    let db = Db::create(DbConfig::temporary().pool_size(64 << 20).max_threads(2))?;
    let t = db.create_table(Schema::new("t", &[("v", ColumnType::U64)]))?;
    let keys = 1024u64;
    db.run(|tx| {
        for k in 0..keys {
            tx.insert(t, k, &[Value::U64(k)])?;
        }
        Ok(())
    })?;
    let per_op = |start: Instant| start.elapsed().as_nanos() as f64 / ops as f64;
    // Rounds alternate the two ways, and each way's best round counts: the machine is shared,
    // and the first round also warms caches up.
    let mut best = [f64::MAX; 4];
    let mut sum = 0u64;
    for _round in 0..3 {
        let start = Instant::now();
        for i in 0..ops {
            sum += db.run(|tx| Ok(tx.get_ref(t, i % keys)?.u64(0)))?;
        }
        best[0] = best[0].min(per_op(start));

        let mut w = db.worker()?;
        let start = Instant::now();
        for i in 0..ops {
            sum += w.run(|tx| Ok(tx.get_ref(t, i % keys)?.u64(0)))?;
        }
        best[1] = best[1].min(per_op(start));
        drop(w);

        let start = Instant::now();
        for i in 0..ops {
            db.run(|tx| tx.update(t, i % keys, &[(0, Value::U64(i))]))?;
        }
        best[2] = best[2].min(per_op(start));

        let mut w = db.worker()?;
        let start = Instant::now();
        for i in 0..ops {
            w.run(|tx| tx.update(t, i % keys, &[(0, Value::U64(i))]))?;
        }
        best[3] = best[3].min(per_op(start));
    }
    let [db_read, worker_read, db_update, worker_update] = best;
    println!("ops per case and round: {ops}, best of 3 rounds (checksum {sum})");
    println!(
        "read:   Db::run {db_read:7.0} ns/op   Worker::run {worker_read:7.0} ns/op   ratio {:.2}",
        db_read / worker_read
    );
    println!(
        "update: Db::run {db_update:7.0} ns/op   Worker::run {worker_update:7.0} ns/op   ratio {:.2}",
        db_update / worker_update
    );
    Ok(())
}
