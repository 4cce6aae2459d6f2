//! Variable-length columns (issue 21): how a `VarBytes(max)` or `Text(max)` column sits in a row.
//!
//! The engines keep fixed-size rows (their logs, version chains and heaps are built on them), so a
//! variable-length column takes a fixed slot: a little-endian `u32` length word, then an inline
//! area of `min(max, INLINE_CAPACITY)` bytes. A value that fits is stored there whole (the rest of
//! the area zeroed); a longer one keeps its first `INLINE_CAPACITY` bytes inline and the rest in
//! chunk rows of a hidden table that the `db` layer writes in the same engine transaction as the
//! row (see `db::varlen`). A column whose maximum fits inline never goes out of line.
//!
//! ```
//! use pmtx::prelude::*;
//!
//! let db = Db::create(DbConfig::temporary().pool_size(32 << 20).max_threads(1))?;
//! let t = db.create_table(Schema::new(
//!     "notes",
//!     &[("title", ColumnType::Text(64)), ("body", ColumnType::VarBytes(1 << 16))],
//! ))?;
//! let body = vec![7u8; 5000]; // longer than the inline area: out of line
//! db.run(|tx| tx.insert(t, 1, &[Value::Str("groceries"), Value::Bytes(&body)]))?;
//! db.run(|tx| {
//!     let row = tx.get(t, 1)?;
//!     assert_eq!(row.get_str("title")?, "groceries");
//!     assert_eq!(row.get_bytes("body")?.len(), 5000);
//!     assert!(row.get_str("body").is_err()); // not a Text column
//!     Ok(())
//! })?;
//! # Ok::<(), DbError>(())
//! ```

use super::{ColumnType, Schema};

/// Bytes of the length word at the start of a variable-length column's slot.
pub const LEN_WORD: usize = 4;

/// Most bytes of a variable-length value kept inline in the row; a longer value's rest goes out
/// of line. 128 keeps common short values (names, YCSB's 100-byte fields) in the row, read with
/// it at no extra cost, while a row with a few such columns stays well under the default
/// 4 KiB tuple limit.
pub const INLINE_CAPACITY: usize = 128;

/// Table names starting with this are the database's own (hidden from `Db::tables`, refused for
/// user tables).
pub const RESERVED_PREFIX: &str = "__pmtx_";

impl ColumnType {
    /// Whether the column stores a length (`VarBytes`, `Text`).
    pub fn is_varlen(self) -> bool {
        matches!(self, ColumnType::VarBytes(_) | ColumnType::Text(_))
    }

    /// The longest value a variable-length column holds (`None` for fixed-width columns).
    pub fn max_len(self) -> Option<usize> {
        match self {
            ColumnType::VarBytes(m) | ColumnType::Text(m) => Some(m as usize),
            _ => None,
        }
    }

    /// Bytes of a variable-length column's value kept in the row (0 for fixed-width columns).
    pub fn inline_capacity(self) -> usize {
        self.max_len().map_or(0, |m| m.min(INLINE_CAPACITY))
    }

    /// Whether some values of the column go out of line (its maximum exceeds the inline area).
    pub fn spills(self) -> bool {
        self.max_len().is_some_and(|m| m > INLINE_CAPACITY)
    }
}

/// Refuses a secondary index over a column whose values may go out of line: the engines index
/// the bytes in the row, which for such a value are only its first [`INLINE_CAPACITY`] bytes.
pub(super) fn validate_secondary(schema: &Schema) -> Result<(), String> {
    for s in &schema.secondary {
        for &c in &s.columns {
            if let Some(col) = schema.columns.get(c).filter(|col| col.ty.spills()) {
                return Err(format!(
                    "secondary index '{}' covers column '{}', whose values may be stored out of \
                     line (its maximum {} exceeds the inline {INLINE_CAPACITY} bytes): index \
                     columns must be fixed-width or have a maximum of at most {INLINE_CAPACITY}",
                    s.name,
                    col.name,
                    col.ty.max_len().unwrap_or(0)
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_sizes_and_serialised_names() {
        assert_eq!(ColumnType::Text(10).size(), LEN_WORD + 10);
        assert_eq!(
            ColumnType::VarBytes(1 << 20).size(),
            LEN_WORD + INLINE_CAPACITY
        );
        assert!(ColumnType::VarBytes(INLINE_CAPACITY as u32 + 1).spills());
        assert!(!ColumnType::Text(INLINE_CAPACITY as u32).spills());
        assert!(!ColumnType::Bytes(1000).is_varlen());
        // New variants only: catalogs written before them still parse, and these read well.
        let json = serde_json::to_string(&[ColumnType::Text(5), ColumnType::VarBytes(6)]).unwrap();
        assert_eq!(json, r#"[{"text":5},{"varbytes":6}]"#);
        let s = Schema::new("t", &[("a", ColumnType::Text(0))]);
        assert!(s.validate(4096).is_err());
        let s = Schema::new("t", &[("a", ColumnType::Text(1000))]).with_secondary("i", &["a"]);
        let err = s.validate(4096).unwrap_err().to_string();
        assert!(err.contains("out of line"), "{err}");
        let s = Schema::new("t", &[("a", ColumnType::Text(100))]).with_secondary("i", &["a"]);
        assert!(s.validate(4096).is_ok());
    }
}
