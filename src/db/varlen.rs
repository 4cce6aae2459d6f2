//! Variable-length values (issue 21): `VarBytes(max)` and `Text(max)` columns over engines that
//! keep fixed-size rows.
//!
//! A value sits in its column's slot ([`crate::catalog::varlen`]): a length word and up to
//! [`INLINE_CAPACITY`] bytes. The rest of a longer value goes **out of line** into chunk rows of
//! a hidden table of the table's own (named by [`chunk_table_name`], unique, recorded as the
//! schema's `chunk_table`; one fixed-size column of [`CHUNK_BYTES`], or the tuple limit if smaller),
//! created with the table when it has a column whose values may spill, and dropped with it.
//! Tables created before each had its own share the database-wide [`CHUNK_TABLE`]; such a table
//! cannot be dropped (its chunks cannot be told from other tables' without a scan). Chunks are
//! written, replaced and deleted by the `db` layer **in the same engine transaction as their row**,
//! so each engine's own logging, recovery and concurrency control cover them: no persistence code
//! of its own, and a crash leaves a value whole or not at all.
//!
//! Chunk `n` of column `c` of the row with key `k` of table `t` has the key
//! `chunk_key(t, k, c, n)`, a 64-bit mix of the four: derived, not drawn from a counter, so that
//! writers of different rows never touch a shared row (a counter would serialise every insert)
//! and a reader finds the chunks from the row alone. Replacing a value updates the chunks both
//! old and new values have in place, inserts the extra ones and deletes the surplus, so nothing
//! leaks. Two chunks with one key (a 64-bit collision) abort the transaction with
//! [`TxError::Corrupt`] rather than mixing values.
//!
//! Reads: [`Tx::get`], [`Tx::get_ref`], scans and range iterators of a table with spilling columns
//! read the chunks of its long values with the row (the chunk reads enter the transaction's read
//! set like any other), so a row's getters return every value whole. Rows of tables without such
//! columns take the path they took before plus one test of the layout's `spills` flag (no
//! allocation, no chunk read; measured in the issue-21 note: fixed rows 0.99× the previous main).

use super::{layout_of, RowLayout, Tx, Value};
use crate::catalog::{CatalogError, Column, ColumnType, Schema, TableId};
use crate::catalog::{INLINE_CAPACITY, LEN_WORD, RESERVED_PREFIX};
use crate::engine::{DbError, FieldWrite, TxError};

/// The hidden table that held the out-of-line chunks of every table's long values in databases
/// made before each table had its own (see [`chunk_table_name`]); still read for their tables.
pub const CHUNK_TABLE: &str = "__pmtx_varlen_chunks";

pub use crate::catalog::bytekey::chunk_table_name;

/// Bytes of value per chunk row (less when the tuple limit is smaller).
pub const CHUNK_BYTES: usize = 1024;

/// Whether `name` is one of the database's own tables (hidden from [`super::Db::tables`]).
pub(super) use crate::catalog::bytekey::is_hidden;

/// Run by [`super::Db::create_table`] before the engine sees `schema`: refuses reserved names and,
/// if `schema` has a column whose values may spill, creates its chunk table and returns the
/// schema that names it.
pub(super) fn prepare_table(db: &super::Db, mut schema: Schema) -> Result<Schema, DbError> {
    let invalid = |reason: String| CatalogError::InvalidSchema {
        table: schema.name.clone(),
        reason,
    };
    if is_hidden(&schema.name) {
        return Err(invalid(format!(
            "table names starting with '{RESERVED_PREFIX}' are reserved for the database's own tables"
        ))
        .into());
    }
    if !schema.columns.iter().any(|c| c.ty.spills()) {
        return Ok(schema);
    }
    // Checked first, so that a refused schema does not leave a chunk table behind.
    schema.validate(db.config.max_row_bytes)?;
    if db.table(&schema.name).is_some() {
        return Err(CatalogError::DuplicateTable(schema.name).into());
    }
    let chunk = CHUNK_BYTES.min(db.config.max_row_bytes) as u32;
    let id = loop {
        let name = chunk_table_name(db.engine.catalog().tables.len(), &schema.name);
        match (db.engine).create_table(Schema::new(&name, &[("data", ColumnType::Bytes(chunk))])) {
            Ok(id) => break id,
            // Another create took the count meanwhile: the next name.
            Err(DbError::Catalog(CatalogError::DuplicateTable(_))) => continue,
            Err(e) => return Err(e),
        }
    };
    db.table_count
        .fetch_max(id as usize + 1, std::sync::atomic::Ordering::Release);
    schema.chunk_table = Some(id);
    Ok(schema)
}

/// The chunk table of `schema`'s out-of-line values and its chunk size, from a worker's copy of
/// the catalog: its own, or the database-wide one of older databases (`None` for a table
/// without spilling columns).
pub(super) fn chunks_of(schema: &Schema, schemas: &[Schema]) -> Option<(TableId, usize)> {
    if !schema.columns.iter().any(|c| c.ty.spills()) {
        return None;
    }
    let id = match schema.chunk_table {
        Some(id) => id as usize,
        None => schemas.iter().position(|s| s.name == CHUNK_TABLE)?,
    };
    Some((id as TableId, schemas.get(id)?.row_size()))
}

/// The key of chunk `n` of column `column` of the row `key` of `table` (see the module doc).
fn chunk_key(table: TableId, key: u64, column: usize, n: usize) -> u64 {
    // A full-avalanche finaliser: every input bit reaches every output bit.
    use crate::index::mix64 as mix;
    let h = mix(u64::from(table) ^ 0x9e37_79b9_7f4a_7c15);
    let h = mix(h ^ key);
    mix(h ^ ((column as u64) << 32 | n as u64))
}

/// Chunk rows a value of `len` bytes takes (beyond its inline part).
fn chunk_count(len: usize, chunk: usize) -> usize {
    len.saturating_sub(INLINE_CAPACITY).div_ceil(chunk)
}

/// The length stored in a variable-length column's slot.
fn stored_len(slot: &[u8]) -> usize {
    let mut word = [0u8; LEN_WORD];
    word.copy_from_slice(&slot[..LEN_WORD]);
    u32::from_le_bytes(word) as usize
}

/// The bytes `value` gives a variable-length column of type `ty` (`None`: the wrong kind):
/// `Text` takes `Value::Str`, `VarBytes` takes `Value::Bytes` or `Value::Str`.
pub(super) fn value_bytes<'v>(ty: ColumnType, value: &Value<'v>) -> Option<&'v [u8]> {
    match (ty, *value) {
        (ColumnType::Text(_), Value::Str(s)) | (ColumnType::VarBytes(_), Value::Str(s)) => {
            Some(s.as_bytes())
        }
        (ColumnType::VarBytes(_), Value::Bytes(b)) => Some(b),
        _ => None,
    }
}

/// Writes `bytes` into the slot `out` of variable-length `column`: the length word and the inline
/// part (the rest zeroed); refuses a value longer than the column's maximum.
pub(super) fn encode_slot(
    schema: &Schema,
    column: &Column,
    bytes: &[u8],
    out: &mut [u8],
) -> Result<(), TxError> {
    let max = column.ty.max_len().unwrap_or(0);
    if bytes.len() > max {
        return Err(TxError::RowTooLarge(format!(
            "a value of {} bytes for column '{}' of table {}, which holds at most {max}",
            bytes.len(),
            column.name,
            schema.name
        )));
    }
    let inline = bytes.len().min(column.ty.inline_capacity());
    out[..LEN_WORD].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    out[LEN_WORD..LEN_WORD + inline].copy_from_slice(&bytes[..inline]);
    out[LEN_WORD + inline..].fill(0);
    Ok(())
}

/// The value of variable-length column `i` whose slot is `slot`: inline, or among `large` (the
/// row's out-of-line values read with it).
pub(super) fn decode<'a>(
    layout: &RowLayout,
    i: usize,
    slot: &'a [u8],
    large: &'a [(usize, Vec<u8>)],
) -> Result<&'a [u8], TxError> {
    let column = &layout.schema.columns[i];
    let len = stored_len(slot);
    let max = column.ty.max_len().unwrap_or(0);
    if len > max {
        return Err(TxError::Corrupt(format!(
            "column '{}' of table {} stores a length of {len}, beyond its maximum {max}",
            column.name, layout.schema.name
        )));
    }
    if len <= column.ty.inline_capacity() {
        return Ok(&slot[LEN_WORD..LEN_WORD + len]);
    }
    match large.iter().find(|(c, _)| *c == i) {
        Some((_, value)) => Ok(value),
        None => Err(TxError::Unsupported(format!(
            "the {len}-byte value of column '{}' of table {} is stored out of line and this row \
             was read without it (raw reads such as Tx::scan_with and Tx::read_into read the \
             row's own bytes only): read the row with Tx::get, Tx::get_ref or a range iterator",
            column.name, layout.schema.name
        ))),
    }
}

impl Tx<'_> {
    /// The id and chunk size of `table`'s chunk table.
    fn chunk_table(&mut self, table: TableId) -> Result<(TableId, usize), TxError> {
        let layout = layout_of(&self.live()?.layouts, table)?;
        layout.chunks.ok_or_else(|| {
            TxError::Corrupt(format!(
                "table {} has out-of-line values but no chunk table",
                layout.schema.name
            ))
        })
    }

    /// [`Tx::settle`] for an operation on a chunk: a chunk missing (unless the engine tells a
    /// stale read) or a chunk id taken is inconsistent data, which ends the transaction.
    fn chunk_result<T>(&mut self, result: Result<T, TxError>) -> Result<T, TxError> {
        let e = match self.settle(result) {
            Err(TxError::NotFound { key, .. }) => TxError::Corrupt(format!(
                "out-of-line chunk {key:#018x} of a variable-length value is missing"
            )),
            Err(TxError::DuplicateKey { key, .. }) => TxError::Corrupt(format!(
                "out-of-line chunk id {key:#018x} is taken by another value (a 64-bit \
                 collision of chunk ids)"
            )),
            other => return other,
        };
        self.doomed = Some(e.clone());
        Err(e)
    }

    /// Reads the out-of-line parts of the long values of the row `key` of `table` (whose bytes are
    /// `bytes`) into `large`, as (column, whole value) pairs.
    pub(super) fn materialise(
        &mut self,
        table: TableId,
        key: u64,
        bytes: &[u8],
        layout: &RowLayout,
        large: &mut Vec<(usize, Vec<u8>)>,
    ) -> Result<(), TxError> {
        large.clear();
        for (i, column) in layout.schema.columns.iter().enumerate() {
            if !column.ty.spills() {
                continue;
            }
            let slot = &bytes[layout.bounds[i]..layout.bounds[i + 1]];
            let len = stored_len(slot);
            if len <= INLINE_CAPACITY || len > column.ty.max_len().unwrap_or(0) {
                continue; // inline, or refused by `decode` when read
            }
            let (chunks, chunk) = self.chunk_table(table)?;
            let mut value = Vec::with_capacity(len + chunk);
            value.extend_from_slice(&slot[LEN_WORD..]);
            for n in 0..chunk_count(len, chunk) {
                let at = value.len();
                value.resize(at + chunk, 0);
                let read =
                    self.live()?
                        .inner
                        .read(chunks, chunk_key(table, key, i, n), &mut value[at..]);
                self.chunk_result(read)?;
            }
            value.truncate(len);
            large.push((i, value));
        }
        Ok(())
    }

    /// Writes the out-of-line part of `value` for column `column` of the row `key` of `table`,
    /// which had `old` chunks: updates the common ones in place, inserts the extra, deletes the
    /// surplus.
    fn put_chunks(
        &mut self,
        table: TableId,
        key: u64,
        column: usize,
        value: &[u8],
        old: usize,
    ) -> Result<(), TxError> {
        if value.len() <= INLINE_CAPACITY && old == 0 {
            return Ok(());
        }
        let (chunks, chunk) = self.chunk_table(table)?;
        let tail = value.get(INLINE_CAPACITY..).unwrap_or(&[]);
        let mut buf = vec![0u8; chunk];
        for (n, piece) in tail.chunks(chunk).enumerate() {
            buf[..piece.len()].copy_from_slice(piece);
            buf[piece.len()..].fill(0);
            let k = chunk_key(table, key, column, n);
            let inner = &mut self.live()?.inner;
            let result = if n < old {
                inner.update(
                    chunks,
                    k,
                    &[FieldWrite {
                        offset: 0,
                        bytes: &buf,
                    }],
                )
            } else {
                inner.insert(chunks, k, &buf)
            };
            self.chunk_result(result)?;
        }
        for n in tail.len().div_ceil(chunk)..old {
            let result = self
                .live()?
                .inner
                .delete(chunks, chunk_key(table, key, column, n));
            self.chunk_result(result)?;
        }
        Ok(())
    }

    /// After the row `key` of `table` was inserted with `values`: the out-of-line parts.
    pub(super) fn insert_chunks(
        &mut self,
        table: TableId,
        key: u64,
        values: &[Value<'_>],
    ) -> Result<(), TxError> {
        let layout = layout_of(&self.live()?.layouts, table)?.clone();
        for (i, column) in layout.schema.columns.iter().enumerate() {
            if let Some(bytes) = column
                .ty
                .spills()
                .then(|| value_bytes(column.ty, &values[i]))
                .flatten()
            {
                self.put_chunks(table, key, i, bytes, 0)?;
            }
        }
        Ok(())
    }

    /// [`Tx::update`] of a table with spilling columns: reads the row for the old values' chunk
    /// counts, writes the row, then replaces the chunks.
    pub(super) fn update_varlen(
        &mut self,
        table: TableId,
        key: u64,
        values: &[(usize, Value<'_>)],
    ) -> Result<(), TxError> {
        let layout = layout_of(&self.live()?.layouts, table)?.clone();
        let schema = &layout.schema;
        // Everything is encoded (and refused) before anything is written.
        let (mut encoded, mut spans) = (Vec::new(), Vec::new());
        super::encode_updates(&layout, values, &mut encoded, &mut spans)?;
        let mut old = vec![0u8; layout.row_size()];
        let read = self.live()?.inner.read(table, key, &mut old);
        self.settle(read)?;
        let writes = super::field_writes(&encoded, &spans);
        // The real chunk size (smaller than CHUNK_BYTES under a small row limit), known before
        // anything is written.
        let (_, chunk) = self.chunk_table(table)?;
        let result = self.live()?.inner.update(table, key, &writes);
        self.settle(result)?;
        // Per spilling column: its chunk count now (a column may be given twice).
        let mut current: Vec<(usize, usize)> = Vec::new();
        for (col, value) in values {
            let ty = schema.columns[*col].ty;
            let Some(bytes) = ty.spills().then(|| value_bytes(ty, value)).flatten() else {
                continue;
            };
            let was = match current.iter().find(|(c, _)| c == col) {
                Some(&(_, n)) => n,
                None => chunk_count(
                    stored_len(&old[layout.bounds[*col]..layout.bounds[*col + 1]]),
                    chunk,
                ),
            };
            self.put_chunks(table, key, *col, bytes, was)?;
            current.retain(|(c, _)| c != col);
            current.push((*col, chunk_count(bytes.len(), chunk)));
        }
        Ok(())
    }

    /// [`Tx::delete`] of a table with spilling columns: deletes the row and its chunks.
    pub(super) fn delete_varlen(&mut self, table: TableId, key: u64) -> Result<(), TxError> {
        let layout = layout_of(&self.live()?.layouts, table)?.clone();
        let mut old = vec![0u8; layout.row_size()];
        let read = self.live()?.inner.read(table, key, &mut old);
        self.settle(read)?;
        let result = self.live()?.inner.delete(table, key);
        self.settle(result)?;
        for (i, column) in layout.schema.columns.iter().enumerate() {
            if column.ty.spills() {
                let len = stored_len(&old[layout.bounds[i]..layout.bounds[i + 1]]);
                let old = chunk_count_of(self, table, len)?;
                self.put_chunks(table, key, i, &[], old)?;
            }
        }
        Ok(())
    }
}

/// Chunk rows of a value of `len` bytes in `table`, with its chunk size.
fn chunk_count_of(tx: &mut Tx<'_>, table: TableId, len: usize) -> Result<usize, TxError> {
    if len <= INLINE_CAPACITY {
        return Ok(0);
    }
    Ok(chunk_count(len, tx.chunk_table(table)?.1))
}

/// Refuses a raw write ([`Tx::insert_bytes`], [`Tx::update_bytes`]) to a table with spilling
/// columns: raw bytes cannot keep the chunks in step.
pub(super) fn refuse_raw_write(layout: &RowLayout) -> Result<(), TxError> {
    if layout.spills {
        return Err(TxError::Unsupported(format!(
            "table {} has variable-length columns whose values may be stored out of line: \
             write it with Tx::insert and Tx::update, not with raw bytes",
            layout.schema.name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_keys_differ_by_every_part() {
        let base = chunk_key(1, 2, 3, 4);
        let others = [
            chunk_key(0, 2, 3, 4),
            chunk_key(1, 3, 3, 4),
            chunk_key(1, 2, 4, 4),
            chunk_key(1, 2, 3, 5),
        ];
        assert!(others.iter().all(|&k| k != base));
        assert_eq!(chunk_count(INLINE_CAPACITY, 1024), 0);
        assert_eq!(chunk_count(INLINE_CAPACITY + 1, 1024), 1);
        assert_eq!(chunk_count(INLINE_CAPACITY + 1024, 1024), 1);
        assert_eq!(chunk_count(INLINE_CAPACITY + 1025, 1024), 2);
    }
}
