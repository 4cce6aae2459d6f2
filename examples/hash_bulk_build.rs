//! The bulk build of a hash index (`HashIndex::from_entries`), which FIR's recovery runs on its
//! checkpoint's entries (§4.4.2, the "index build" phase of `pmtx recover`): time per build of
//! `entries` random keys, median and range over `rounds` builds.
//!
//! `cargo run --release --example hash_bulk_build [entries] [rounds]` (defaults 1,000,000 and
//! 7). To compare two builds of the library, run each binary in turn, a few times, interleaved:
//! the machine is shared.

use pmtx::index::HashIndex;
use std::time::Instant;

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(default)
}

fn main() {
    let (n, rounds) = (arg(1, 1_000_000), arg(2, 7).max(1));
    // Distinct keys in no order (a checkpoint's keys are sorted, but the build hashes them).
    let entries: Vec<(u64, u64)> = (0..n)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5eed, i))
        .collect();
    let mut ms: Vec<f64> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            let index = HashIndex::from_entries(&entries, 0).expect("distinct keys");
            let took = started.elapsed().as_secs_f64() * 1e3;
            assert_eq!(index.len() as u64, n);
            drop(index);
            took
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "from_entries of {n} entries: median {:.1} ms, range {:.1}-{:.1} ({rounds} builds)",
        ms[ms.len() / 2],
        ms[0],
        ms[ms.len() - 1]
    );
}
