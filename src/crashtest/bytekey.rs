//! A crash workload with byte-string keys (issue 21): inserts that split index nodes at several
//! levels, updates and deletes that empty leaves, all meeting crash points.
//!
//! The byte-key table's rows live under row ids the oracle cannot predict, so each transaction
//! also writes a *ledger*: a `u64`-keyed table with one row per key of a fixed universe (key
//! number → the key and its value), changed in the same transaction as the byte-key table. The
//! oracle checks the ledger (durability and atomicity, as for any table), and
//! [`CrashWorkload::check_db`] checks that the recovered index is well-formed
//! ([`Db::check_byte_keys`]) and maps exactly the keys of the ledger to their values: so the
//! tree maps exactly the committed keys.
//!
//! With `long_values` (workload `bytekeys-long`) the byte-key table has a variable-length
//! column as well, whose value is a function of the row's value (`crashtest::varlen`'s blob: empty,
//! inline, one past the 128-byte inline part, one past a chunk, three chunks...), so most
//! versions go out of line into the hidden chunk table; the check then also reads every value
//! back whole and requires the chunk table to hold exactly the chunks they need.

use super::workload::{CrashWorkload, Observed, TxCtx};
use crate::catalog::{ByteKeys, ColumnType, Schema, TableId};
use crate::db::{Db, Value};
use crate::engine::{DbError, TxError};
use rand::rngs::StdRng;
use rand::Rng;

/// The byte-key table (created by the load, inside the crash window).
pub const TABLE: &str = "bkeys";
/// The ledger (the workload's one table for the harness).
pub const LEDGER: &str = "bkeys_ledger";
/// Longest key of the universe.
pub const MAX_LEN: usize = 16;

/// Byte keys under crash: a universe of `keys` keys (key number `i` is [`key_of`]`(i)`),
/// half loaded, then transactions of three random keys each inserting, updating or deleting.
/// Index nodes are as small as the key length allows (four keys), so 48 keys need a tree of
/// three levels and a short run splits leaves and inner nodes and empties leaves.
pub struct ByteKeyCrash {
    /// The key universe.
    pub keys: u64,
    /// Rows carry a long variable-length value too (see the module doc).
    pub long_values: bool,
}

/// Key number `i`: its bijective base-3 numeral over `a`, `b`, `c` (0 is the empty key; the
/// numerals are all the strings over the three letters, many of them prefixes of others),
/// then `3 * (i % 5)` dashes (at most 16 bytes below 120). Distinct for distinct `i`: the letters before
/// the first dash are the numeral.
pub fn key_of(i: u64) -> Vec<u8> {
    let mut digits = Vec::new();
    let mut n = i;
    while n > 0 {
        n -= 1;
        digits.push(b'a' + (n % 3) as u8);
        n /= 3;
    }
    digits.reverse();
    digits.extend(std::iter::repeat(b'-').take(3 * (i % 5) as usize));
    digits
}

fn ledger_row(value: u64, key: &[u8]) -> Vec<u8> {
    let mut row = value.to_le_bytes().to_vec();
    row.push(key.len() as u8);
    row.extend_from_slice(key);
    row.resize(8 + 1 + MAX_LEN, 0);
    row
}

fn ledger_value(row: &[u8]) -> u64 {
    u64::from_le_bytes(
        row[..8]
            .try_into()
            .expect("ledger rows are longer than 8 bytes"),
    )
}

/// The byte-key table's schema: one value column (and with `long_values` a blob column of up
/// to three chunks), nodes of the smallest size.
pub fn table_schema(long_values: bool) -> Schema {
    let value = ("value", ColumnType::U64);
    let blob = ("blob", ColumnType::VarBytes(super::varlen::BLOB_MAX as u32));
    let columns: &[(&str, ColumnType)] = if long_values {
        &[value, blob]
    } else {
        &[value]
    };
    Schema::new(TABLE, columns)
        .with_byte_keys(MAX_LEN)
        .index_node_bytes(ByteKeys::min_node_bytes(MAX_LEN))
}

impl ByteKeyCrash {
    fn table(db: &Db) -> Option<TableId> {
        db.table(TABLE)
    }

    /// Inserts (or, with `insert` false, updates) the row of `key` with `value` (and its blob).
    fn write(
        &self,
        tx: &mut crate::db::Tx<'_>,
        t: TableId,
        key: &[u8],
        value: u64,
        insert: bool,
    ) -> Result<(), TxError> {
        let blob = self.long_values.then(|| super::varlen::blob(value));
        let mut values = vec![Value::U64(value)];
        values.extend(blob.as_deref().map(Value::Bytes));
        if insert {
            tx.insert_by(t, key, &values)
        } else {
            let columns: Vec<(usize, Value<'_>)> = values.into_iter().enumerate().collect();
            tx.update_by(t, key, &columns)
        }
    }
}

impl CrashWorkload for ByteKeyCrash {
    fn name(&self) -> &'static str {
        if self.long_values {
            "bytekeys-long"
        } else {
            "bytekeys"
        }
    }

    fn schemas(&self) -> Vec<Schema> {
        vec![Schema::new(
            LEDGER,
            &[
                ("value", ColumnType::U64),
                ("key", ColumnType::Bytes(1 + MAX_LEN as u32)),
            ],
        )]
    }

    fn load(&self, ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError> {
        let t = match Self::table(ctx.db) {
            Some(t) => t,
            None => ctx.db.create_table(table_schema(self.long_values))?,
        };
        for chunk in (0..self.keys / 2).collect::<Vec<_>>().chunks(8) {
            ctx.run(|tx| {
                for &i in chunk {
                    let key = key_of(i);
                    self.write(tx.tx(), t, &key, i, true)?;
                    tx.insert(0, i, &ledger_row(i, &key))?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError> {
        let Some(t) = Self::table(ctx.db) else {
            return Ok(()); // a crash before the table's creation: nothing to run on
        };
        let picks: Vec<(u64, u32, u64)> = (0..3)
            .map(|_| {
                (
                    rng.gen_range(0..self.keys),
                    rng.gen_range(0..100),
                    rng.gen_range(1..1000),
                )
            })
            .collect();
        let scan_from = key_of(rng.gen_range(0..self.keys));
        ctx.run(|tx| {
            for &(i, op, bump) in &picks {
                let key = key_of(i);
                match tx.get(0, i)? {
                    None => {
                        self.write(tx.tx(), t, &key, bump, true)?;
                        tx.insert(0, i, &ledger_row(bump, &key))?;
                    }
                    Some(row) if op < 45 => {
                        tx.tx().delete_by(t, &key)?;
                        tx.delete(0, i)?;
                        let _ = row;
                    }
                    Some(row) => {
                        let value = ledger_value(&row) + bump;
                        self.write(tx.tx(), t, &key, value, false)?;
                        tx.put(0, i, &ledger_row(value, &key))?;
                    }
                }
            }
            // A short range read: iterators meet the crash points (and the splits) too.
            let seen = tx.tx().range_by(t, scan_from.as_slice()..).take(4).count();
            let _ = seen;
            Ok(())
        })?;
        Ok(())
    }

    fn check(&self, rows: &Observed) -> Vec<String> {
        rows[0]
            .iter()
            .filter(|(i, row)| {
                let key = key_of(**i);
                row.len() != 9 + MAX_LEN
                    || row[8] as usize != key.len()
                    || &row[9..9 + key.len()] != key.as_slice()
            })
            .map(|(i, _)| format!("ledger row {i} does not hold key {i}"))
            .collect()
    }

    fn check_db(&self, db: &Db) -> Vec<String> {
        let Some(ledger) = db.table(LEDGER) else {
            return Vec::new();
        };
        let keys = self.keys;
        let committed = db.run_read_only(|tx| {
            let mut out = Vec::new();
            for i in 0..keys {
                match tx.get(ledger, i) {
                    Ok(row) => out.push((key_of(i), ledger_value(row.bytes()))),
                    Err(TxError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        });
        let mut committed = match committed {
            Ok(c) => c,
            Err(e) => return vec![format!("reading the ledger: {e}")],
        };
        committed.sort();
        let Some(t) = Self::table(db) else {
            return if committed.is_empty() {
                Vec::new()
            } else {
                vec![format!(
                    "the ledger holds {} keys but table {TABLE} is gone",
                    committed.len()
                )]
            };
        };
        let index = match db.check_byte_keys(t) {
            Ok(index) => index,
            Err(e) => return vec![format!("the byte-key index is malformed: {e}")],
        };
        let long = self.long_values;
        let in_tree = db.run_read_only(|tx| {
            let (mut out, mut problems) = (Vec::new(), Vec::new());
            for (key, _) in &index.entries {
                let row = tx.get_by(t, key)?;
                let value = row.u64(0);
                if long && row.get_bytes("blob")? != super::varlen::blob(value).as_slice() {
                    problems.push(format!(
                        "key \"{}\": the blob is not the one of value {value}",
                        key.escape_ascii()
                    ));
                }
                out.push((key.clone(), value));
            }
            Ok((out, problems))
        });
        let in_tree = match in_tree {
            Ok((found, mut problems)) => {
                if long {
                    let values = found.iter().map(|&(_, v)| v);
                    problems.extend(super::varlen::check_chunks(
                        db,
                        TABLE,
                        values,
                        super::varlen::blob_chunks,
                    ));
                }
                if !problems.is_empty() {
                    return problems;
                }
                Ok(found)
            }
            Err(e) => Err(e),
        };
        match in_tree {
            Ok(found) if found == committed => Vec::new(),
            Ok(found) => vec![format!(
                "the index maps {} keys, the ledger holds {}: index {:?}, ledger {:?}",
                found.len(),
                committed.len(),
                found,
                committed
            )],
            Err(e) => vec![format!("reading the byte-key table: {e}")],
        }
    }

    fn extra_pages_per_thread(&self) -> u64 {
        // The byte-key table and its hidden index table beyond the ledger, and a second
        // worker's window and three heap pages: `Db::create_table` inserts the root on a
        // worker of another slot than the load's, and the liveness check after a recovery
        // runs on another slot again; with long values, the chunk table's pages as for the
        // `varlen` workload.
        if self.long_values {
            14
        } else {
            8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::DbConfig;
    use crate::engine::EngineKind;

    /// `bytekeys-long` puts values out of line, and its check sees a value that is not its row's.
    #[test]
    fn long_values_go_out_of_line_and_a_wrong_blob_is_seen() {
        let db = Db::create(
            DbConfig::temporary()
                .engine(EngineKind::Falcon)
                .pool_size(64 << 20)
                .max_threads(2),
        )
        .unwrap();
        let w = ByteKeyCrash {
            keys: 48,
            long_values: true,
        };
        let ledger = db.create_table(w.schemas().remove(0)).unwrap();
        let t = db.create_table(table_schema(true)).unwrap();
        db.run(|tx| {
            for i in 0..12 {
                let key = key_of(i);
                w.write(tx, t, &key, i, true)?;
                tx.insert_bytes(ledger, i, &ledger_row(i, &key))?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(w.check_db(&db), Vec::<String>::new());
        let chunks = (db.schema(t))
            .and_then(|s| s.chunk_table)
            .expect("a chunk table");
        assert!(db.check_structure().unwrap()[chunks as usize] >= 6);
        let other = super::super::varlen::blob(6);
        db.run(|tx| tx.update_by(t, &key_of(4), &[(1, Value::Bytes(&other))]))
            .unwrap();
        let problems = w.check_db(&db);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("the blob is not the one of value 4")),
            "{problems:?}"
        );
    }

    #[test]
    fn the_key_universe_is_distinct_with_prefixes_and_the_empty_key() {
        // Numerals of up to four letters (keys below 120) leave room for the 12 dashes.
        let keys: Vec<Vec<u8>> = (0..120).map(key_of).collect();
        let set: std::collections::BTreeSet<&Vec<u8>> = keys.iter().collect();
        assert_eq!(set.len(), keys.len());
        assert!(keys[0].is_empty());
        assert!(keys.iter().all(|k| k.len() <= MAX_LEN));
        assert!(keys.iter().any(|k| keys
            .iter()
            .any(|o| o != k && o.starts_with(k) && !k.is_empty())));
    }
}
