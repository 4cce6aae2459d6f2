//! Schemas, tables and their persistence: what recovery reads first.
//!
//! Tables have a primary key that is either an 8-byte `u64` supplied by the caller (composite
//! keys, such as TPC-C's, are packed into it by the workload) or, declared with
//! [`Schema::with_byte_keys`], an ordered byte string of bounded length, mapped to internal `u64`
//! row ids by a B+-tree kept in a hidden table ([`bytekey`]). A row is the concatenation of its
//! columns in declaration order, each at its stored size, with no padding: the engines see
//! fixed-size rows only. Fixed-width columns (`U64`, `I64`, `F64`, `Bytes(n)`) are stored at
//! their natural size; variable-length columns (`VarBytes(max)`, `Text(max)`) as a length word
//! and an inline area of up to [`INLINE_CAPACITY`] bytes, a longer value's rest going out of
//! line into a hidden chunk table (see [`varlen`] and the `db` module).
//!
//! The catalog is stored in PM as JSON in two alternating slots, each with a sequence number and a
//! CRC: a new version is written to the slot not holding the newest valid one and persisted; open
//! picks the valid slot with the highest sequence number. A crash while writing leaves the previous
//! version in the other slot intact.
//!
//! A write first sets the target slot's sequence number to 0 and persists that, and writes the
//! new sequence number last; so after any crash a slot is either empty (sequence 0) or complete.
//! A slot with a sequence number whose length or CRC is wrong is therefore damage, never a torn
//! write, and `load` reports it rather than quietly falling back to the older catalog (which
//! would silently drop the newest tables).

mod drop;

pub use drop::{live_schema, TableState};

use crate::index::{IndexPlacement, PrimaryIndexKind};
use crate::pmem::Pool;
use serde::{Deserialize, Serialize};

pub mod varlen;
pub use varlen::{INLINE_CAPACITY, LEN_WORD, RESERVED_PREFIX};
pub mod bytekey;
pub use bytekey::{ByteKeys, PrimaryKey};

/// Identifies a table within a database: its position in the catalog.
pub type TableId = u32;

/// A column's type. All take a fixed number of bytes in the row ([`ColumnType::size`]); the
/// variable-length ones store their length and keep a long value's rest out of line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// Exactly this many bytes (shorter values are zero-padded on write).
    Bytes(u32),
    /// Variable-length bytes, at most this many, with a stored length (see [`varlen`]).
    VarBytes(u32),
    /// A UTF-8 string of at most this many bytes, with a stored length (see [`varlen`]).
    Text(u32),
}

impl ColumnType {
    /// The column's size in the row, in bytes (for a variable-length column: its length word
    /// and inline area).
    pub fn size(self) -> usize {
        match self {
            ColumnType::U64 | ColumnType::I64 | ColumnType::F64 => 8,
            ColumnType::Bytes(n) => n as usize,
            ColumnType::VarBytes(_) | ColumnType::Text(_) => LEN_WORD + self.inline_capacity(),
        }
    }
}

/// A named column.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    /// Column name, unique within its table.
    pub name: String,
    /// Column type.
    pub ty: ColumnType,
}

/// A non-unique secondary index over some columns (e.g. TPC-C customer by last name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondaryIndexDef {
    /// Index name, unique within its table.
    pub name: String,
    /// The indexed columns, by position.
    pub columns: Vec<usize>,
}

/// A table's definition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    /// Table name, unique within the database.
    pub name: String,
    /// Columns in row order.
    pub columns: Vec<Column>,
    /// The primary index: hash (point lookups) or ordered (range scans too).
    pub primary_index: PrimaryIndexKind,
    /// Secondary indexes.
    pub secondary: Vec<SecondaryIndexDef>,
    /// Where the primary index lives; `None` takes the database's default when the table is
    /// created, and the engine records the placement it chose (so a later open with another
    /// default does not move the index). Absent in catalogs written before issue 17: DRAM.
    #[serde(default)]
    pub index_placement: Option<IndexPlacement>,
    /// Live, or a dropped table's tombstone (issue 21; see [`TableState`]).
    #[serde(default, skip_serializing_if = "TableState::is_live")]
    pub state: TableState,
    /// How rows are keyed: `u64` (the default, and every catalog written before issue 21) or
    /// byte strings ([`Schema::with_byte_keys`]).
    #[serde(default)]
    pub key: PrimaryKey,
    /// The hidden table that holds this table's out-of-line values (issue 21; see
    /// `db::varlen`), set by `Db::create_table` for a table with a column whose values may
    /// spill, so that dropping the table drops its values too. `None` for other tables and for
    /// such tables in catalogs written before it, which share the database-wide chunk table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_table: Option<TableId>,
}

/// Why a schema or catalog was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// The schema is not valid.
    #[error("invalid schema for table '{table}': {reason}")]
    InvalidSchema {
        /// The table.
        table: String,
        /// What is wrong.
        reason: String,
    },
    /// A table of that name exists already.
    #[error("table '{0}' already exists")]
    DuplicateTable(String),
    /// The catalog's serialised form outgrew its slot.
    #[error("the catalog needs {needed} bytes but its slot holds {capacity}")]
    Full {
        /// Bytes needed.
        needed: usize,
        /// Slot capacity.
        capacity: usize,
    },
    /// No table has that id.
    #[error("no table with id {0}")]
    NoSuchTable(TableId),
    /// The table was dropped.
    #[error("table '{name}' (id {id}) was dropped")]
    TableDropped {
        /// Its id.
        id: TableId,
        /// Its name.
        name: String,
    },
    /// A drop could not run alone (see `Db::drop_table`).
    #[error(
        "cannot drop table '{table}': {workers} worker(s) stayed in use for as long as the \
         database waits for a slot (a drop runs alone: end the other workers' transactions \
         and drop the workers first)"
    )]
    Busy {
        /// The table.
        table: String,
        /// Workers still in use.
        workers: usize,
    },
    /// Neither catalog slot holds a valid catalog.
    #[error("catalog is corrupt: {0}")]
    Corrupt(String),
}

impl Schema {
    /// Whether `other` describes the same table (name, columns, indexes), wherever its primary
    /// index lives: the engine records the placement it chose at creation, so a table read back
    /// from the catalog can differ from the schema it was created from in that alone.
    pub fn same_table_as(&self, other: &Schema) -> bool {
        self.name == other.name
            && self.columns == other.columns
            && self.primary_index == other.primary_index
            && self.secondary == other.secondary
            && self.key.same_keys_as(&other.key)
    }

    /// A schema with a hash primary index and no secondary index.
    pub fn new(name: &str, columns: &[(&str, ColumnType)]) -> Schema {
        Schema {
            name: name.to_string(),
            columns: columns
                .iter()
                .map(|(n, ty)| Column {
                    name: n.to_string(),
                    ty: *ty,
                })
                .collect(),
            primary_index: PrimaryIndexKind::Hash,
            secondary: Vec::new(),
            index_placement: None,
            state: TableState::Live,
            key: PrimaryKey::U64,
            chunk_table: None,
        }
    }

    /// Places the primary index in DRAM or PM (see [`IndexPlacement`]) instead of the
    /// database's default.
    pub fn placed(mut self, placement: IndexPlacement) -> Schema {
        self.index_placement = Some(placement);
        self
    }

    /// Uses an ordered primary index (needed for range scans).
    pub fn ordered(mut self) -> Schema {
        self.primary_index = PrimaryIndexKind::Ordered;
        self
    }

    /// Adds a secondary index over the named columns.
    pub fn with_secondary(mut self, name: &str, columns: &[&str]) -> Schema {
        let cols = columns
            .iter()
            .map(|c| self.column_index(c).unwrap_or(usize::MAX))
            .collect();
        self.secondary.push(SecondaryIndexDef {
            name: name.to_string(),
            columns: cols,
        });
        self
    }

    /// Checks names, sizes and index definitions; `max_row` is the configured tuple size limit.
    pub fn validate(&self, max_row: usize) -> Result<(), CatalogError> {
        let bad = |reason: String| CatalogError::InvalidSchema {
            table: self.name.clone(),
            reason,
        };
        if self.name.is_empty() || self.name.len() > 64 {
            return Err(bad("the table name must be 1 to 64 bytes".into()));
        }
        if self.columns.is_empty() {
            return Err(bad("a table needs at least one column".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &self.columns {
            if !seen.insert(c.name.as_str()) {
                return Err(bad(format!("column '{}' appears twice", c.name)));
            }
            if c.ty.size() == 0 || c.ty.max_len() == Some(0) {
                return Err(bad(format!("column '{}' has size 0", c.name)));
            }
        }
        varlen::validate_secondary(self).map_err(bad)?;
        if self.row_size() > max_row {
            return Err(bad(format!(
                "rows of {} bytes exceed the tuple size limit of {max_row} bytes \
                 (DbConfig::max_row_bytes; a variable-length column takes {LEN_WORD} + up to \
                 {INLINE_CAPACITY} bytes of the row)",
                self.row_size()
            )));
        }
        self.validate_key(max_row)?;
        for s in &self.secondary {
            if s.columns.is_empty() || s.columns.iter().any(|&c| c >= self.columns.len()) {
                return Err(bad(format!(
                    "secondary index '{}' names an unknown column",
                    s.name
                )));
            }
        }
        Ok(())
    }

    /// Bytes in a row.
    pub fn row_size(&self) -> usize {
        self.columns.iter().map(|c| c.ty.size()).sum()
    }

    /// Byte offset of column `index` within a row.
    pub fn column_offset(&self, index: usize) -> usize {
        self.columns[..index].iter().map(|c| c.ty.size()).sum()
    }

    /// The position of the column called `name`.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

/// Every table of a database, in creation order (a table's id is its position).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// The tables.
    pub tables: Vec<Schema>,
}

impl Catalog {
    /// The id of the live table called `name` (a dropped table's tombstone has none).
    pub fn table_id(&self, name: &str) -> Option<TableId> {
        self.tables
            .iter()
            .position(|t| t.name == name && t.is_live())
            .map(|i| i as TableId)
    }

    /// Checks every table as [`Catalog::add`] would have (a valid schema within `max_row`, names
    /// unique): a catalog read from PM passed its CRC, but the CRC says only that the bytes are
    /// the ones written, not that what was written holds together.
    pub fn validate(&self, max_row: usize) -> Result<(), CatalogError> {
        let mut rebuilt = Catalog::default();
        for schema in &self.tables {
            rebuilt.add(schema.clone(), max_row)?;
        }
        Ok(())
    }

    /// Adds `schema` (validated against `max_row`) and returns its id.
    pub fn add(&mut self, schema: Schema, max_row: usize) -> Result<TableId, CatalogError> {
        schema.validate(max_row)?;
        if self.table_id(&schema.name).is_some() {
            return Err(CatalogError::DuplicateTable(schema.name));
        }
        self.tables.push(schema);
        Ok(self.tables.len() as TableId - 1)
    }
}

/// Where a catalog lives in PM: two slots of `slot_bytes` each, starting at `base`.
#[derive(Clone, Copy, Debug)]
pub struct CatalogStore {
    /// Offset of the first slot.
    pub base: u64,
    /// Bytes per slot, header included.
    pub slot_bytes: u64,
}

/// Slot header: sequence number, payload length, CRC-32 of (sequence, length, payload).
const SLOT_HEADER: u64 = 24;

impl CatalogStore {
    fn slot(&self, i: u64) -> u64 {
        self.base + i * self.slot_bytes
    }

    /// Slot `i`: `None` if empty (sequence 0), an error if it has a sequence number but is
    /// damaged.
    fn read_slot(&self, pool: &Pool, i: u64) -> Result<Option<(u64, Catalog)>, CatalogError> {
        let at = self.slot(i);
        let name = ["A", "B"][i as usize];
        let seq = pool.read_u64(at);
        if seq == 0 {
            return Ok(None);
        }
        let damaged = |what: &str| {
            CatalogError::Corrupt(format!(
                "catalog slot {name} (sequence {seq}) is damaged: {what}"
            ))
        };
        let len = pool.read_u64(at + 8);
        if len > self.slot_bytes - SLOT_HEADER {
            return Err(damaged(&format!("length {len} exceeds the slot")));
        }
        let payload = pool.read_vec(at + SLOT_HEADER, len as usize);
        let crc = pool.read_u64(at + 16);
        if crc != Self::crc(seq, &payload) {
            return Err(damaged("its CRC does not match"));
        }
        let catalog: Catalog = serde_json::from_slice(&payload)
            .map_err(|e| damaged(&format!("its JSON does not parse ({e})")))?;
        // The engines check rows against their size limit; here, that the schemas hold together
        // (a secondary index naming a missing column made the first insert index out of bounds).
        catalog
            .validate(usize::MAX)
            .map_err(|e| damaged(&format!("its tables are not valid ({e})")))?;
        Ok(Some((seq, catalog)))
    }

    fn check_bounds(&self, pool: &Pool) -> Result<(), CatalogError> {
        if self.slot_bytes <= SLOT_HEADER
            || self.base % 8 != 0
            || self.slot_bytes % 8 != 0
            || pool
                .check_range(self.base, self.slot_bytes.saturating_mul(2))
                .is_err()
        {
            return Err(CatalogError::Corrupt(format!(
                "catalog slots of {} bytes at offset {} do not fit the pool",
                self.slot_bytes, self.base
            )));
        }
        Ok(())
    }

    fn crc(seq: u64, payload: &[u8]) -> u64 {
        let mut h = crc32fast::Hasher::new();
        h.update(&seq.to_le_bytes());
        h.update(&(payload.len() as u64).to_le_bytes());
        h.update(payload);
        u64::from(h.finalize())
    }

    /// Loads the newest valid catalog.
    pub fn load(&self, pool: &Pool) -> Result<Catalog, CatalogError> {
        self.check_bounds(pool)?;
        let a = self.read_slot(pool, 0)?;
        let b = self.read_slot(pool, 1)?;
        match (a, b) {
            (Some((sa, ca)), Some((sb, cb))) => Ok(if sa > sb { ca } else { cb }),
            (Some((_, c)), None) | (None, Some((_, c))) => Ok(c),
            (None, None) => Err(CatalogError::Corrupt(
                "neither catalog slot holds a valid catalog".into(),
            )),
        }
    }

    /// Durably stores `catalog` as the newest version (crash-safe: the older slot is overwritten).
    pub fn store(&self, pool: &Pool, catalog: &Catalog) -> Result<(), CatalogError> {
        let payload = serde_json::to_vec(catalog).expect("a catalog always serialises");
        let capacity = (self.slot_bytes - SLOT_HEADER) as usize;
        if payload.len() > capacity {
            return Err(CatalogError::Full {
                needed: payload.len(),
                capacity,
            });
        }
        // A damaged slot counts as empty here: the new version goes over it or beside it.
        let seqs = [0, 1].map(|i| self.read_slot(pool, i).ok().flatten().map_or(0, |(s, _)| s));
        let (target, seq) = if seqs[0] <= seqs[1] {
            (0, seqs[1] + 1)
        } else {
            (1, seqs[0] + 1)
        };
        let at = self.slot(target);
        // Invalidate the target first so that a torn write is never mistaken for a valid slot even
        // if the CRC were to collide; then payload, header, and one persist of the whole slot.
        pool.write_u64(at, 0);
        pool.persist(at, 8);
        pool.write_bytes(at + SLOT_HEADER, &payload);
        pool.write_u64(at + 8, payload.len() as u64);
        pool.write_u64(at + 16, Self::crc(seq, &payload));
        pool.persist(at + 8, SLOT_HEADER - 8 + payload.len() as u64);
        pool.write_u64(at, seq);
        pool.persist(at, 8);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::{PersistenceDomain, PoolOptions};

    fn schema() -> Schema {
        Schema::new(
            "usertable",
            &[("f0", ColumnType::Bytes(100)), ("n", ColumnType::U64)],
        )
    }

    #[test]
    fn row_layout_and_validation() {
        let s = schema();
        assert_eq!(s.row_size(), 108);
        assert_eq!(s.column_offset(1), 100);
        assert!(s.validate(1000).is_ok());
        assert!(matches!(
            s.validate(64),
            Err(CatalogError::InvalidSchema { .. })
        ));
        let dup = Schema::new("t", &[("a", ColumnType::U64), ("a", ColumnType::U64)]);
        assert!(dup.validate(100).is_err());
        let bad_sec = schema().with_secondary("by_x", &["x"]);
        assert!(bad_sec.validate(1000).is_err());
        let mut c = Catalog::default();
        assert_eq!(c.add(schema(), 1000).unwrap(), 0);
        assert!(matches!(
            c.add(schema(), 1000),
            Err(CatalogError::DuplicateTable(_))
        ));
    }

    #[test]
    fn store_and_load_alternate_slots_and_survive_a_torn_slot() {
        let pool = Pool::create_in_memory(1 << 20, &PoolOptions::new("t", PersistenceDomain::Adr))
            .unwrap();
        let store = CatalogStore {
            base: 8192,
            slot_bytes: 16384,
        };
        assert!(store.load(&pool).is_err());
        let mut c = Catalog::default();
        c.add(schema(), 1000).unwrap();
        store.store(&pool, &c).unwrap();
        assert_eq!(store.load(&pool).unwrap(), c);
        let mut c2 = c.clone();
        c2.add(Schema::new("other", &[("v", ColumnType::I64)]), 1000)
            .unwrap();
        store.store(&pool, &c2).unwrap();
        assert_eq!(store.load(&pool).unwrap(), c2);
        // A torn write leaves the target slot with sequence 0: the previous version is used.
        let newest = if pool.read_u64(8192) > pool.read_u64(8192 + 16384) {
            8192
        } else {
            8192 + 16384
        };
        let seq = pool.read_u64(newest);
        pool.write_u64(newest, 0);
        assert_eq!(store.load(&pool).unwrap(), c);
        // Damage to a complete slot is reported, not hidden by falling back to the older one.
        pool.write_u64(newest, seq);
        pool.write_u64(newest + SLOT_HEADER, 0xdead);
        let err = store.load(&pool).unwrap_err();
        assert!(err.to_string().contains("CRC"), "{err}");
        pool.write_u64(newest, 0);
        let huge = Catalog {
            tables: vec![schema(); 200],
        };
        assert!(matches!(
            store.store(&pool, &huge),
            Err(CatalogError::Full { .. })
        ));
    }
}
