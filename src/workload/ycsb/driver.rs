//! Runs YCSB against a database: the `usertable` schema, a multi-threaded loader, and a
//! `TxnDriver` executing generated operations as transactions.

use super::{
    build_key, deterministic_field, key_to_record, AcknowledgedCounter, Op, OpGenerator, Workload,
};
use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::catalog::{ColumnType, Schema, TableId};
use crate::db::{Db, Worker};
use crate::engine::{DbError, FieldWrite, TxError};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;

/// The YCSB table: `field_count` columns of `field_len` bytes; an ordered index when the workload
/// scans (E), a hash index otherwise.
pub fn schema(workload: &Workload) -> Schema {
    let names: Vec<String> = (0..workload.field_count)
        .map(|i| format!("field{i}"))
        .collect();
    let columns: Vec<(&str, ColumnType)> = names
        .iter()
        .map(|n| (n.as_str(), ColumnType::Bytes(workload.field_len as u32)))
        .collect();
    let s = Schema::new("usertable", &columns);
    if workload.scan_proportion > 0.0 {
        s.ordered()
    } else {
        s
    }
}

/// The row a record starts with: every field from [`deterministic_field`] at version 0.
pub fn initial_row(workload: &Workload, record: u64, row: &mut [u8]) {
    let key = build_key(record);
    for (f, field) in row.chunks_mut(workload.field_len).enumerate() {
        deterministic_field(key, f as u32, 0, field);
    }
}

/// Loads records `0..records` on `threads` threads, 64 rows per transaction, calling `progress`
/// with the number of rows loaded so far (from any thread).
pub fn load(
    db: &Db,
    table: TableId,
    workload: &Workload,
    records: u64,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), DbError> {
    const BATCH: u64 = 64;
    let threads = threads.max(1) as u64;
    let row_len = workload.field_count as usize * workload.field_len;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<(), DbError> {
                    let mut w = db.worker()?;
                    let mut row = vec![0u8; row_len];
                    let (lo, hi) = (records * t / threads, records * (t + 1) / threads);
                    let mut next = lo;
                    while next < hi {
                        let end = (next + BATCH).min(hi);
                        w.run(|tx| {
                            for r in next..end {
                                initial_row(workload, r, &mut row);
                                tx.insert_bytes(table, build_key(r), &row)?;
                            }
                            Ok(())
                        })?;
                        progress(end - next);
                        next = end;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("loader thread panicked"))
    })
}

/// One thread's YCSB transactions.
pub struct YcsbDriver<'db> {
    worker: Worker<'db>,
    generator: OpGenerator,
    inserts: Arc<AcknowledgedCounter>,
    rng: StdRng,
    table: TableId,
    ops: Vec<Op>,
    row: Vec<u8>,
    field: Vec<u8>,
    /// A whole record of `field` copies, for whole-record updates.
    whole: Vec<u8>,
    /// The keys the current transaction reads (reads and read-modify-writes), prefetched
    /// together.
    keys: Vec<u64>,
    /// The keys it overwrites blindly, prefetched together for an overwrite.
    overwrite_keys: Vec<u64>,
    version: u64,
    field_len: usize,
    field_count: u32,
    last_read_only: bool,
}

/// The transaction kinds a [`YcsbDriver`] reports, by [`TxnOutcome::kind`].
pub const TXN_KINDS: [&str; 2] = ["read-write", "read-only"];

impl<'db> YcsbDriver<'db> {
    /// Whether the last transaction ran as read-only.
    pub fn last_was_read_only(&self) -> bool {
        self.last_read_only
    }

    /// A driver for `table` on its own worker, with a per-thread seed.
    pub fn new(
        db: &'db Db,
        table: TableId,
        workload: &Workload,
        records: u64,
        inserts: Arc<AcknowledgedCounter>,
        seed: u64,
    ) -> Result<YcsbDriver<'db>, DbError> {
        let generator = OpGenerator::new(workload.clone(), records, inserts.clone())
            .map_err(|e| DbError::Config(e.to_string()))?;
        let row_len = workload.field_count as usize * workload.field_len;
        Ok(YcsbDriver {
            worker: db.worker()?,
            generator,
            inserts,
            rng: StdRng::seed_from_u64(seed),
            table,
            ops: Vec::new(),
            row: vec![0u8; row_len],
            field: vec![0u8; workload.field_len],
            whole: Vec::with_capacity(row_len),
            keys: Vec::new(),
            overwrite_keys: Vec::new(),
            version: 0,
            field_len: workload.field_len,
            field_count: workload.field_count,
            last_read_only: false,
        })
    }

    /// Runs one generated transaction; returns the conflict aborts it took. A transaction whose
    /// operations are all reads or scans runs as read-only (so multi-version protocols serve it
    /// from a snapshot, Falcon §5.2.3); see [`YcsbDriver::last_was_read_only`].
    pub fn run_one(&mut self) -> Result<u32, DbError> {
        self.generator.next_txn(&mut self.rng, &mut self.ops);
        let read_only = self
            .ops
            .iter()
            .all(|op| matches!(op, Op::Read { .. } | Op::Scan { .. }));
        self.last_read_only = read_only;
        self.version += 1;
        let (table, field_len, field_count, version) =
            (self.table, self.field_len, self.field_count, self.version);
        let ops = &self.ops;
        let row = &mut self.row;
        let field = &mut self.field;
        let whole = &mut self.whole;
        let (keys, overwrite_keys) = (&mut self.keys, &mut self.overwrite_keys);
        keys.clear();
        overwrite_keys.clear();
        for op in ops {
            match *op {
                Op::Read { key } | Op::ReadModifyWrite { key, .. } => keys.push(key),
                Op::Update { key, .. } => overwrite_keys.push(key),
                Op::Insert { .. } | Op::Scan { .. } => {}
            }
        }
        let outcome = self.worker.run_counted(read_only, |tx| {
            // The transaction's keys are known up front: overlap their misses.
            tx.prefetch(table, keys);
            tx.prefetch_for_overwrite(table, overwrite_keys);
            for op in ops {
                match *op {
                    Op::Read { key } => tx.read_into(table, key, row)?,
                    Op::Update { key, field: f } | Op::ReadModifyWrite { key, field: f } => {
                        if matches!(op, Op::ReadModifyWrite { .. }) {
                            tx.read_into(table, key, row)?;
                        }
                        match f {
                            Some(f) => {
                                field.fill(0);
                                field[..8].copy_from_slice(&version.to_le_bytes());
                                let w = FieldWrite {
                                    offset: f as usize * field_len,
                                    bytes: field,
                                };
                                tx.update_bytes(table, key, &[w])?;
                            }
                            None => {
                                // The whole record, every field set to `field`: one write.
                                whole.clear();
                                for _ in 0..field_count {
                                    whole.extend_from_slice(field);
                                }
                                let w = FieldWrite {
                                    offset: 0,
                                    bytes: whole,
                                };
                                tx.update_bytes(table, key, &[w])?;
                            }
                        }
                    }
                    Op::Insert { key } => {
                        initial_row_for_key(key, field_len, row);
                        match tx.insert_bytes(table, key, row) {
                            Ok(()) | Err(TxError::DuplicateKey { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Op::Scan { start_key, len } => {
                        tx.scan_with(table, start_key, false, len as usize, &mut |_, _| true)?;
                    }
                }
            }
            Ok(())
        })?;
        for op in &self.ops {
            if let Op::Insert { key } = op {
                // Acknowledging makes the record visible to later key choices (YCSB's
                // AcknowledgedCounterGenerator); an error means a duplicate ack, harmless here.
                let _ = self.inserts.acknowledge(key_to_record(*key));
            }
        }
        Ok(outcome.aborts)
    }
}

fn initial_row_for_key(key: u64, field_len: usize, row: &mut [u8]) {
    for (f, field) in row.chunks_mut(field_len).enumerate() {
        deterministic_field(key, f as u32, 0, field);
    }
}

impl TxnDriver for YcsbDriver<'_> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        let aborts = self.run_one().map_err(|e| Box::new(e) as DriverError)?;
        Ok(TxnOutcome {
            kind: usize::from(self.last_read_only),
            committed: true,
            aborts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::DbConfig;

    #[test]
    fn every_core_workload_runs_and_keeps_the_structure() {
        for name in ["a", "b", "c", "d", "e", "f"] {
            let workload = Workload::from_name(name).unwrap().with_ops_per_txn(4);
            let db = Db::create(DbConfig::temporary().pool_size(64 << 20).max_threads(4)).unwrap();
            let table = db.create_table(schema(&workload)).unwrap();
            load(&db, table, &workload, 2000, 2, &|_| {}).unwrap();
            let inserts = Arc::new(AcknowledgedCounter::new(2000));
            let mut d = YcsbDriver::new(&db, table, &workload, 2000, inserts.clone(), 7).unwrap();
            for _ in 0..300 {
                d.run_one().unwrap();
            }
            let rows = db.check_structure().unwrap()[0];
            assert_eq!(
                rows,
                2000 + inserts.acknowledged_count() - 2000,
                "workload {name}"
            );
            if matches!(name, "d" | "e") {
                assert!(rows > 2000, "workload {name} inserts");
            }
        }
    }
}
