//! The `varlen` crash workload (issue 21): rows with variable-length values, many of them long
//! enough to go out of line into the hidden chunk table, inserted, replaced (growing, shrinking,
//! going inline and back) and deleted, while the simulator crashes the run.
//!
//! Every value is a function of the row's `seed` column: its length (drawn from the lengths at
//! the edges: empty, inline capacity, one past it, one past a chunk, the maximum) and its bytes.
//! The oracle compares the rows themselves (seed, length words, inline parts) with committed
//! after-images; [`CrashWorkload::check_db`] then reads every row with its out-of-line parts and
//! requires each value to be exactly the one its seed gives (length and bytes), and the chunk
//! table to hold exactly the chunks those values need: a chunk lost, torn, left from an older
//! value or leaked by a delete is a violation.

use super::workload::{CrashWorkload, Observed, TxCtx};
use crate::catalog::{ColumnType, Schema, INLINE_CAPACITY, LEN_WORD};
use crate::db::{Db, Value, CHUNK_BYTES};
use crate::engine::{DbError, TxError};
use rand::rngs::StdRng;
use rand::Rng;

/// Longest blob: the inline part and three chunks.
pub(super) const BLOB_MAX: usize = INLINE_CAPACITY + 2 * CHUNK_BYTES + 300;
/// Longest text: the inline part and two chunks.
const TEXT_MAX: usize = INLINE_CAPACITY + CHUNK_BYTES + 100;
const TABLE: &str = "varlen_crash";

/// The workload: `records` rows loaded, then updates, inserts and deletes.
pub struct VarlenCrash {
    /// Rows loaded before the transactions.
    pub records: u64,
}

/// A length for a value of at most `max` bytes, picked by `pick` among the interesting ones.
fn length(pick: u64, max: usize) -> usize {
    let lens = [
        0,
        1,
        INLINE_CAPACITY,
        INLINE_CAPACITY + 1,
        INLINE_CAPACITY + CHUNK_BYTES,
        INLINE_CAPACITY + CHUNK_BYTES + 1,
        max,
    ];
    match pick % 9 {
        i @ 0..=6 => lens[i as usize].min(max),
        _ => (pick >> 8) as usize % (max + 1),
    }
}

fn stream(seed: u64) -> impl Iterator<Item = u8> {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    })
}

/// The blob a row with `seed` holds.
pub(super) fn blob(seed: u64) -> Vec<u8> {
    stream(seed).take(length(seed, BLOB_MAX)).collect()
}

/// The text a row with `seed` holds (ASCII letters).
fn text(seed: u64) -> String {
    stream(seed.rotate_left(17))
        .take(length(seed >> 16, TEXT_MAX))
        .map(|b| char::from(b'a' + b % 26))
        .collect()
}

/// Chunk rows a value of `len` bytes takes, for chunks of `chunk` bytes.
fn chunks_of(len: usize, chunk: usize) -> u64 {
    len.saturating_sub(INLINE_CAPACITY).div_ceil(chunk) as u64
}

/// Chunk rows the values of a row with `seed` take.
fn chunks(seed: u64, chunk: usize) -> u64 {
    chunks_of(length(seed, BLOB_MAX), chunk) + chunks_of(length(seed >> 16, TEXT_MAX), chunk)
}

/// Chunk rows [`blob`]`(seed)` takes.
pub(super) fn blob_chunks(seed: u64, chunk: usize) -> u64 {
    chunks_of(length(seed, BLOB_MAX), chunk)
}

/// Checks that table `table`'s chunk table holds exactly the chunks the rows with `seeds` need
/// (`need(seed, chunk bytes)` each), and the structure check passes: a chunk lost or leaked is
/// a problem. Nothing to check before the table exists.
pub(super) fn check_chunks(
    db: &Db,
    table: &str,
    seeds: impl IntoIterator<Item = u64>,
    need: impl Fn(u64, usize) -> u64,
) -> Vec<String> {
    let catalog = db.engine().catalog();
    let Some(owner) = catalog.table_id(table) else {
        return Vec::new();
    };
    let Some(chunk_table) = catalog.tables[owner as usize].chunk_table else {
        return vec![format!("table {table} has long values but no chunk table")];
    };
    let chunk = catalog.tables[chunk_table as usize].row_size();
    let want: u64 = seeds.into_iter().map(|s| need(s, chunk)).sum();
    match db.check_structure() {
        Ok(counts) if counts[chunk_table as usize] == want => Vec::new(),
        Ok(counts) => vec![format!(
            "the chunk table holds {} rows, the values need {want}: chunks lost or leaked",
            counts[chunk_table as usize]
        )],
        Err(e) => vec![e],
    }
}

/// Writes the row of `key` for `seed` (an insert, or an update of every column).
fn write(
    tx: &mut crate::db::Tx<'_>,
    t: u32,
    key: u64,
    seed: u64,
    insert: bool,
) -> Result<(), TxError> {
    let (b, s) = (blob(seed), text(seed));
    if insert {
        tx.insert(
            t,
            key,
            &[Value::U64(seed), Value::Bytes(&b), Value::Str(&s)],
        )
    } else {
        tx.update(
            t,
            key,
            &[
                (0, Value::U64(seed)),
                (1, Value::Bytes(&b)),
                (2, Value::Str(&s)),
            ],
        )
    }
}

fn table_id(ctx: &TxCtx<'_, '_>) -> Result<u32, DbError> {
    ctx.db
        .table(TABLE)
        .ok_or_else(|| DbError::Config(format!("table {TABLE} is missing")))
}

impl CrashWorkload for VarlenCrash {
    fn name(&self) -> &'static str {
        "varlen"
    }

    fn schemas(&self) -> Vec<Schema> {
        vec![Schema::new(
            TABLE,
            &[
                ("seed", ColumnType::U64),
                ("blob", ColumnType::VarBytes(BLOB_MAX as u32)),
                ("text", ColumnType::Text(TEXT_MAX as u32)),
            ],
        )
        .ordered()]
    }

    fn load(&self, ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError> {
        let t = table_id(ctx)?;
        let records = self.records;
        ctx.run(|otx| {
            for k in 0..records {
                write(otx.tx(), t, k, k * 0x1_0001 + 3, true)?;
                otx.record(0, k)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError> {
        let t = table_id(ctx)?;
        let op = rng.gen_range(0..100u32);
        if op < 55 {
            // Replace the values of two loaded rows (a read-modify-write of each).
            let keys = [
                rng.gen_range(0..self.records),
                rng.gen_range(0..self.records),
            ];
            let seeds: [u64; 2] = [rng.gen(), rng.gen()];
            ctx.run(|otx| {
                for (i, &k) in keys.iter().enumerate() {
                    if otx.tx().exists(t, k)? {
                        write(otx.tx(), t, k, seeds[i], false)?;
                        otx.record(0, k)?;
                    }
                }
                Ok(())
            })?;
        } else if op < 80 || ctx.own_keys.is_empty() {
            let seed: u64 = rng.gen();
            ctx.insert_own_with(|otx, key| {
                write(otx.tx(), t, key, seed, true)?;
                otx.record(0, key)
            })?;
        } else {
            ctx.delete_own_with(rng, |otx, key| {
                otx.tx().delete(t, key)?;
                otx.record(0, key)
            })?;
        }
        Ok(())
    }

    fn check(&self, rows: &Observed) -> Vec<String> {
        // The row itself: the seed's lengths in the length words, its prefixes inline.
        let mut problems = Vec::new();
        for (k, row) in &rows[0] {
            let seed = u64::from_le_bytes(row[..8].try_into().expect("8-byte seed"));
            let mut at = 8;
            for (name, value, max) in [
                ("blob", blob(seed), BLOB_MAX),
                ("text", text(seed).into_bytes(), TEXT_MAX),
            ] {
                let slot = &row[at..at + LEN_WORD + max.min(INLINE_CAPACITY)];
                at += slot.len();
                let len = u32::from_le_bytes(slot[..LEN_WORD].try_into().expect("4 bytes"));
                let inline = value.len().min(INLINE_CAPACITY);
                if len as usize != value.len()
                    || slot[LEN_WORD..LEN_WORD + inline] != value[..inline]
                {
                    problems.push(format!(
                        "row {k:#x}: the {name} slot does not hold the value of seed {seed:#x}"
                    ));
                }
            }
        }
        problems
    }

    fn check_db(&self, db: &Db) -> Vec<String> {
        let Some(t) = db.table(TABLE) else {
            return Vec::new();
        };
        let rows = db.run_read_only(|tx| {
            let mut problems = Vec::new();
            let mut seeds = Vec::new();
            for row in tx.range(t, ..) {
                let (k, row) = row?;
                let seed = row.get_u64("seed")?;
                seeds.push(seed);
                if row.get_bytes("blob")? != blob(seed).as_slice() {
                    problems.push(format!(
                        "row {k:#x}: the blob is not the one of seed {seed:#x}"
                    ));
                }
                if row.get_str("text")? != text(seed) {
                    problems.push(format!(
                        "row {k:#x}: the text is not the one of seed {seed:#x}"
                    ));
                }
            }
            Ok((problems, seeds))
        });
        let (mut problems, seeds) = match rows {
            Ok(found) => found,
            Err(e) => return vec![format!("reading the values back: {e}")],
        };
        problems.extend(check_chunks(db, TABLE, seeds, chunks));
        problems
    }

    fn extra_pages_per_thread(&self) -> u64 {
        // The hidden chunk table's heap pages, and spill pages for redo logs of up to ten chunks
        // (more than a log window slot holds), for the threads and the liveness check's.
        6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_cover_inline_spilled_and_edge_lengths() {
        let lens: std::collections::BTreeSet<usize> =
            (0..200u64).map(|s| length(s, BLOB_MAX)).collect();
        for want in [0, INLINE_CAPACITY, INLINE_CAPACITY + 1, BLOB_MAX] {
            assert!(lens.contains(&want), "{want}");
        }
        assert!(text(5).len() <= TEXT_MAX && blob(5).len() <= BLOB_MAX);
        assert_eq!(blob(77), blob(77));
    }
}
