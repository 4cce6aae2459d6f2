//! Fragmentation of ArchTM's allocator on a long mixed run, with and without the online
//! defragmentation thread (§4.5; issue 15's "fragmentation with and without defragmentation").
//!
//! `cargo run --example archtm_fragmentation -- on|off [OPS] [OBJECTS]`: grows a population of
//! `OBJECTS` objects of mixed sizes (16, 48, 200 and 1000 bytes), then runs `OPS` transactions,
//! each one of: free a random object and allocate one of a random size (40 %), update a random
//! object (copy-on-write: it moves; 60 %). Every tenth of the run it prints the 4 KiB regions
//! holding live objects (the footprint), the bytes of the live blocks, their ratio (1.0 = no
//! fragmentation) and the data pages taken. Counts, not timings: a debug build gives the same
//! numbers as a release one.

use pmtx::ptm::{PPtr, PTx, Ptm, PtmConfig, PtmError};
use std::time::Duration;

/// A handle of one of the four object sizes.
#[derive(Clone, Copy)]
enum Obj {
    S16(PPtr<[u8; 16]>),
    S48(PPtr<[u8; 48]>),
    S200(PPtr<[u8; 200]>),
    S1000(PPtr<[u8; 1000]>),
}

/// Bytes of the 64-byte-aligned block of an object of `payload` bytes (32-byte header).
fn block(payload: u64) -> u64 {
    (32 + payload).div_ceil(64) * 64
}

impl Obj {
    fn alloc(tx: &mut PTx<'_, u64>, kind: u64, fill: u8) -> Result<Obj, PtmError> {
        Ok(match kind % 4 {
            0 => Obj::S16(tx.alloc(&[fill; 16])?),
            1 => Obj::S48(tx.alloc(&[fill; 48])?),
            2 => Obj::S200(tx.alloc(&[fill; 200])?),
            _ => Obj::S1000(tx.alloc(&[fill; 1000])?),
        })
    }
    fn bytes(self) -> u64 {
        block(match self {
            Obj::S16(_) => 16,
            Obj::S48(_) => 48,
            Obj::S200(_) => 200,
            Obj::S1000(_) => 1000,
        })
    }
    fn free(self, tx: &mut PTx<'_, u64>) -> Result<(), PtmError> {
        match self {
            Obj::S16(p) => tx.free(p),
            Obj::S48(p) => tx.free(p),
            Obj::S200(p) => tx.free(p),
            Obj::S1000(p) => tx.free(p),
        }
    }
    /// Rewrites the first byte (the whole object is copied: copy-on-write).
    fn touch(self, tx: &mut PTx<'_, u64>, v: u8) -> Result<(), PtmError> {
        match self {
            Obj::S16(p) => tx.write_at(p, 0, &v),
            Obj::S48(p) => tx.write_at(p, 0, &v),
            Obj::S200(p) => tx.write_at(p, 0, &v),
            Obj::S1000(p) => tx.write_at(p, 0, &v),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let defrag = match args.first().map(String::as_str) {
        Some("on") => true,
        Some("off") => false,
        _ => return Err("usage: archtm_fragmentation on|off [OPS] [OBJECTS]".into()),
    };
    let ops: u64 = args.get(1).map_or(Ok(200_000), |s| s.parse())?;
    let objects: u64 = args.get(2).map_or(Ok(20_000), |s| s.parse())?;
    let mut config = PtmConfig::temporary().size(256 << 20).max_threads(4);
    config.defrag_interval = defrag.then_some(Duration::from_millis(20));
    // §4.5's rule (a pass whenever blocks were recycled), as the table in ARCHITECTURE.md ran.
    config.defrag_eager = true;
    let ptm = Ptm::<u64>::create(config)?;
    let stat = |name: &str| ptm.stats().iter().find(|s| s.0 == name).map_or(0, |s| s.1);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<Obj> = Vec::with_capacity(objects as usize);
    while (live.len() as u64) < objects {
        let batch: Vec<u64> = (0..100).map(|_| next()).collect();
        live.extend(ptm.run(|tx| {
            batch
                .iter()
                .map(|&k| Obj::alloc(tx, k, 1))
                .collect::<Result<Vec<_>, _>>()
        })?);
    }
    println!(
        "defragmentation thread {}; {objects} objects of 16/48/200/1000 bytes, {ops} transactions",
        if defrag { "on" } else { "off" }
    );
    println!(
        "{:>9} {:>12} {:>12} {:>10} {:>6} {:>8}",
        "ops", "regions_4k", "live_bytes", "footprint", "pages", "moved"
    );
    let report = |done: u64, live: &[Obj]| {
        let bytes: u64 = live.iter().map(|o| o.bytes()).sum();
        let regions = stat("used_regions_4k");
        println!(
            "{done:>9} {regions:>12} {bytes:>12} {:>10.2} {:>6} {:>8}",
            (regions * 4096) as f64 / bytes as f64,
            stat("data_pages"),
            stat("defrag_moved")
        );
    };
    report(0, &live);
    for op in 1..=ops {
        let r = next();
        let i = (r >> 8) as usize % live.len();
        if r % 10 < 4 {
            let old = live[i];
            live[i] = ptm.run(|tx| {
                old.free(tx)?;
                Obj::alloc(tx, r >> 32, 2)
            })?;
        } else {
            ptm.run(|tx| live[i].touch(tx, op as u8))?;
        }
        if op % (ops / 10).max(1) == 0 {
            // Let a pending pass finish, so samples compare like with like.
            std::thread::sleep(Duration::from_millis(60));
            report(op, &live);
        }
    }
    ptm.check_invariants()?;
    Ok(())
}
