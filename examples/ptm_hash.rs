//! A chained hash table on the persistent-object API (`pmtx::ptm`), the structure of ArchTM's
//! §6.1 micro-benchmark: 8-byte keys, 16-byte values, a bucket array object of handles, one node
//! object per pair.
//!
//! `cargo run --release --example ptm_hash [POOL_PATH]`: without a path the pool lives in
//! memory; with one, a second run recovers the table and checks it.

use pmtx::ptm::{PPtr, PTx, Ptm, PtmConfig, PtmError};

const BUCKETS: usize = 1024;
const PAIRS: u64 = 20_000;

pmtx::pobject! {
    /// A key-value pair and the next node of its bucket's chain.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Node { pub key: u64, pub value: [u64; 2], pub next: PPtr<Node> }
}

pmtx::pobject! {
    /// The root: the bucket array and the number of pairs.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Root { pub buckets: PPtr<[PPtr<Node>; BUCKETS]>, pub pairs: u64 }
}

fn bucket_of(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % BUCKETS
}

/// Inserts or updates `key`; returns whether it was new.
fn put(tx: &mut PTx<'_, Root>, key: u64, value: [u64; 2]) -> Result<bool, PtmError> {
    let root = tx.root();
    let r = tx.read(root)?;
    let b = bucket_of(key);
    let slot_offset = b * 8;
    let head: PPtr<Node> = tx.read_at(r.buckets, slot_offset)?;
    let mut p = head;
    while !p.is_null() {
        let n = tx.read(p)?;
        if n.key == key {
            // Only the value field (bytes 8..24) changes.
            tx.write_at(p, 8, &value)?;
            return Ok(false);
        }
        p = n.next;
    }
    let node = tx.alloc(&Node {
        key,
        value,
        next: head,
    })?;
    tx.write_at(r.buckets, slot_offset, &node)?;
    tx.update(root, |r| r.pairs += 1)?;
    Ok(true)
}

fn get(tx: &mut PTx<'_, Root>, key: u64) -> Result<Option<[u64; 2]>, PtmError> {
    let r = tx.read(tx.root())?;
    let mut p: PPtr<Node> = tx.read_at(r.buckets, bucket_of(key) * 8)?;
    while !p.is_null() {
        let n = tx.read(p)?;
        if n.key == key {
            return Ok(Some(n.value));
        }
        p = n.next;
    }
    Ok(None)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = PtmConfig::temporary().size(256 << 20);
    if let Some(path) = std::env::args().nth(1) {
        config = config.path(path);
    }
    let ptm = Ptm::<Root>::open_or_create(config)?;
    let pairs = ptm.run(|tx| tx.read(tx.root()))?.pairs;
    if pairs > 0 {
        // A reopened pool: check what the previous run left.
        for key in 0..PAIRS {
            let v = ptm.run(|tx| get(tx, key))?;
            assert_eq!(v, Some([key, key + 1]), "key {key} after recovery");
        }
        println!("recovered a table of {pairs} pairs; all present");
        return Ok(());
    }
    ptm.run(|tx| {
        let buckets = tx.alloc(&[PPtr::<Node>::null(); BUCKETS])?;
        let root = tx.root();
        tx.update(root, |r| r.buckets = buckets)
    })?;
    let start = std::time::Instant::now();
    for key in 0..PAIRS {
        ptm.run(|tx| put(tx, key, [key, 0]))?;
    }
    for key in 0..PAIRS {
        ptm.run(|tx| put(tx, key, [key, key + 1]))?;
    }
    let secs = start.elapsed().as_secs_f64();
    for key in 0..PAIRS {
        assert_eq!(ptm.run(|tx| get(tx, key))?, Some([key, key + 1]));
    }
    println!(
        "{} inserts and {} updates in {:.3} s ({:.0} transactions/s); {} pairs; {:?}",
        PAIRS,
        PAIRS,
        secs,
        2.0 * PAIRS as f64 / secs,
        ptm.run(|tx| tx.read(tx.root()))?.pairs,
        ptm.stats()
    );
    ptm.check_invariants()?;
    Ok(())
}
