//! Runs YCSB against a database: the `usertable` schema, a multi-threaded loader, and a
//! `TxnDriver` executing generated operations as transactions.

use super::{
    build_key, deterministic_field, key_to_record, AcknowledgedCounter, Op, OpGenerator, Workload,
};
use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::catalog::{ColumnType, Schema, TableId};
use crate::db::{Db, Value, Worker};
use crate::engine::{DbError, FieldWrite, TxError};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;

/// How YCSB stores a record's fields ([`Workload::value_type`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// `Bytes(field_len)` columns, read and written as raw row bytes (YCSB's usual shape).
    #[default]
    Bytes,
    /// `Text(field_len)` columns holding ASCII strings of `field_len` bytes, inserted, updated
    /// and read through the typed API (`Value::Str`, `RowRef::try_str`): what an application
    /// storing strings pays (issue 21).
    Text,
}

impl std::str::FromStr for ValueType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bytes" => Ok(ValueType::Bytes),
            "text" => Ok(ValueType::Text),
            _ => Err(format!("unknown value type '{s}' (expected bytes or text)")),
        }
    }
}

/// The YCSB table: `field_count` columns of `field_len` bytes (fixed, or text of that length;
/// see [`ValueType`]); an ordered index when the workload scans (E), a hash index otherwise.
pub fn schema(workload: &Workload) -> Schema {
    let names: Vec<String> = (0..workload.field_count)
        .map(|i| format!("field{i}"))
        .collect();
    let ty = match workload.value_type {
        ValueType::Bytes => ColumnType::Bytes(workload.field_len as u32),
        ValueType::Text => ColumnType::Text(workload.field_len as u32),
    };
    let columns: Vec<(&str, ColumnType)> = names.iter().map(|n| (n.as_str(), ty)).collect();
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
                    let text = workload.value_type == ValueType::Text;
                    let mut texts = vec![String::new(); workload.field_count as usize];
                    let (lo, hi) = (records * t / threads, records * (t + 1) / threads);
                    let mut next = lo;
                    while next < hi {
                        let end = (next + BATCH).min(hi);
                        w.run(|tx| {
                            for r in next..end {
                                initial_row(workload, r, &mut row);
                                if text {
                                    insert_text(tx, table, build_key(r), &row, &mut texts)?;
                                } else {
                                    tx.insert_bytes(table, build_key(r), &row)?;
                                }
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
    /// The keys the current transaction reads and then writes (read-modify-writes), prefetched
    /// together.
    keys: Vec<u64>,
    /// The keys it only reads, prefetched together as read-only
    /// ([`crate::db::Tx::prefetch_read_only`]).
    read_keys: Vec<u64>,
    /// The keys it overwrites blindly, prefetched together for an overwrite.
    overwrite_keys: Vec<u64>,
    version: u64,
    field_len: usize,
    field_count: u32,
    last_read_only: bool,
    /// Text fields (see [`ValueType::Text`]): `Some`, with a buffer per field.
    texts: Option<Vec<String>>,
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
            read_keys: Vec::new(),
            overwrite_keys: Vec::new(),
            version: 0,
            field_len: workload.field_len,
            field_count: workload.field_count,
            last_read_only: false,
            texts: (workload.value_type == ValueType::Text)
                .then(|| vec![String::new(); workload.field_count as usize]),
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
        let (keys, read_keys, overwrite_keys) = (
            &mut self.keys,
            &mut self.read_keys,
            &mut self.overwrite_keys,
        );
        keys.clear();
        read_keys.clear();
        overwrite_keys.clear();
        for op in ops {
            match *op {
                Op::Read { key } => read_keys.push(key),
                Op::ReadModifyWrite { key, .. } => keys.push(key),
                Op::Update { key, .. } => overwrite_keys.push(key),
                Op::Insert { .. } | Op::Scan { .. } => {}
            }
        }
        if let Some(texts) = &mut self.texts {
            let outcome = self.worker.run_counted(read_only, |tx| {
                tx.prefetch_read_only(table, read_keys);
                tx.prefetch(table, keys);
                tx.prefetch_for_overwrite(table, overwrite_keys);
                ops.iter()
                    .try_for_each(|op| text_op(tx, table, op, version, row, texts))
            })?;
            self.acknowledge_inserts();
            return Ok(outcome.aborts);
        }
        let outcome = self.worker.run_counted(read_only, |tx| {
            // The transaction's keys are known up front: overlap their misses.
            tx.prefetch_read_only(table, read_keys);
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
        self.acknowledge_inserts();
        Ok(outcome.aborts)
    }

    fn acknowledge_inserts(&self) {
        for op in &self.ops {
            if let Op::Insert { key } = op {
                // Acknowledging makes the record visible to later key choices (YCSB's
                // AcknowledgedCounterGenerator); an error means a duplicate ack, harmless here.
                let _ = self.inserts.acknowledge(key_to_record(*key));
            }
        }
    }
}

/// `out` set to ASCII letters made from `bytes` (a deterministic field, or a version).
fn letters(bytes: impl IntoIterator<Item = u8>, out: &mut String) {
    out.clear();
    out.extend(bytes.into_iter().map(|b| char::from(b'a' + b % 26)));
}

/// Inserts the record `key` whose fixed-shape fields are `row`, as text fields.
fn insert_text(
    tx: &mut crate::db::Tx<'_>,
    table: TableId,
    key: u64,
    row: &[u8],
    texts: &mut [String],
) -> Result<(), TxError> {
    let field_len = row.len() / texts.len().max(1);
    for (text, field) in texts.iter_mut().zip(row.chunks(field_len)) {
        letters(field.iter().copied(), text);
    }
    let values: smallvec::SmallVec<[Value<'_>; 16]> = texts.iter().map(|t| Value::Str(t)).collect();
    tx.insert(table, key, &values)
}

/// One YCSB operation on text fields ([`ValueType::Text`]): reads take every field as a string,
/// updates write strings through [`crate::db::Tx::update`].
fn text_op(
    tx: &mut crate::db::Tx<'_>,
    table: TableId,
    op: &Op,
    version: u64,
    row: &mut [u8],
    texts: &mut [String],
) -> Result<(), TxError> {
    let read_all = |tx: &mut crate::db::Tx<'_>, key: u64| -> Result<(), TxError> {
        let r = tx.get_ref(table, key)?;
        for f in 0..texts.len() {
            std::hint::black_box(r.try_str(f)?);
        }
        Ok(())
    };
    match *op {
        Op::Read { key } => read_all(tx, key),
        Op::Update { key, field } | Op::ReadModifyWrite { key, field } => {
            if matches!(op, Op::ReadModifyWrite { .. }) {
                read_all(tx, key)?;
            }
            let field_len = row.len() / texts.len().max(1);
            let text = &mut texts[0];
            letters((0..field_len).map(|i| (version as usize + i) as u8), text);
            let text = texts[0].as_str();
            match field {
                Some(f) => tx.update(table, key, &[(f as usize, Value::Str(text))]),
                None => {
                    let all: smallvec::SmallVec<[(usize, Value<'_>); 16]> =
                        (0..texts.len()).map(|f| (f, Value::Str(text))).collect();
                    tx.update(table, key, &all)
                }
            }
        }
        Op::Insert { key } => {
            let field_len = row.len() / texts.len().max(1);
            initial_row_for_key(key, field_len, row);
            match insert_text(tx, table, key, row, texts) {
                Ok(()) | Err(TxError::DuplicateKey { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Op::Scan { start_key, len } => {
            tx.scan_with(table, start_key, false, len as usize, &mut |_, _| true)
        }
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
    #[test]
    fn text_values_run_through_the_typed_api() {
        // 100-byte strings stay inline; 300-byte ones spill into the chunk table.
        for (name, field_len) in [("a", 100), ("d", 300), ("e", 100), ("f", 300)] {
            let mut workload = Workload::from_name(name).unwrap().with_ops_per_txn(4);
            workload.field_count = 3;
            workload.field_len = field_len;
            workload.value_type = ValueType::Text;
            let db = Db::create(DbConfig::temporary().pool_size(64 << 20).max_threads(4)).unwrap();
            let table = db.create_table(schema(&workload)).unwrap();
            load(&db, table, &workload, 300, 2, &|_| {}).unwrap();
            let inserts = Arc::new(AcknowledgedCounter::new(300));
            let mut d = YcsbDriver::new(&db, table, &workload, 300, inserts.clone(), 7).unwrap();
            for _ in 0..100 {
                d.run_one().unwrap();
            }
            let field = db
                .run(|tx| Ok(tx.get(table, build_key(0))?.get_str("field2")?.to_string()))
                .unwrap();
            assert_eq!(field.len(), field_len, "workload {name}");
            assert!(field.bytes().all(|b| b.is_ascii_lowercase()), "{field}");
            assert_eq!(
                db.check_structure().unwrap()[table as usize],
                inserts.acknowledged_count()
            );
        }
        assert_eq!("text".parse::<ValueType>(), Ok(ValueType::Text));
        assert!("utf8"
            .parse::<ValueType>()
            .unwrap_err()
            .contains("bytes or text"));
    }
}
