//! Primary keys that are byte strings (issue 21): the schema side.
//!
//! A table declares byte-string keys with [`Schema::with_byte_keys`]. The engines store rows
//! under `u64` keys only, so such a table is two tables in the catalog: the user's table, whose
//! rows live under internal `u64` row ids, and a hidden table (named [`index_table_name`], with
//! the [`HIDDEN_PREFIX`]) whose rows are the nodes of a B+-tree mapping each key to its row id.
//! The tree is read and written inside the user's transactions (`crate::db`'s byte-key
//! methods), so every engine's recovery and every protocol's validation cover it unchanged.

use super::{CatalogError, Schema, TableId};
use serde::{Deserialize, Serialize};

/// Names of tables the database keeps for itself start with this: `Db::create_table` refuses
/// it in a user's table name and `Db::tables` does not list such tables.
pub const HIDDEN_PREFIX: &str = super::varlen::RESERVED_PREFIX;

/// Longest byte-string key a table may declare.
pub const MAX_BYTE_KEY_LEN: usize = 1024;

/// Bytes of an index node's header (kind, entry count, used bytes, first child).
pub const NODE_HEADER_BYTES: usize = 16;

/// Bytes an index node entry takes besides its key: a 2-byte length and an 8-byte row or child
/// id.
pub const NODE_ENTRY_OVERHEAD: usize = 10;

/// Default index node size, when the schema does not set one ([`Schema::index_node_bytes`]):
/// about 40 entries of 16-byte keys. Each insert or delete rewrites one leaf row whole, so the
/// node size is also the bytes a key write adds to the transaction's write set.
pub const DEFAULT_NODE_BYTES: usize = 1024;

/// How a table's rows are keyed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrimaryKey {
    /// A `u64` supplied by the caller (the default; catalogs written before issue 21).
    #[default]
    U64,
    /// Ordered byte strings, through a B+-tree in a hidden table.
    Bytes(ByteKeys),
}

/// The parameters of a table with byte-string keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteKeys {
    /// Longest key accepted; longer keys are refused with `TxError::RowTooLarge`.
    pub max_len: u32,
    /// Bytes per index node (the hidden table's row size).
    pub node_bytes: u32,
    /// The hidden table holding the index nodes; set when the table is created.
    #[serde(default)]
    pub index_table: Option<TableId>,
}

impl ByteKeys {
    /// The smallest node that holds four entries of `max_len`-byte keys: a split of a node
    /// overflowing by one entry then leaves two halves that each fit (each half holds at most
    /// half the bytes plus one entry) and keep at least one entry.
    pub const fn min_node_bytes(max_len: usize) -> usize {
        NODE_HEADER_BYTES + 4 * (NODE_ENTRY_OVERHEAD + max_len)
    }
}

impl PrimaryKey {
    /// The byte-key parameters, if keys are byte strings.
    pub fn bytes(&self) -> Option<&ByteKeys> {
        match self {
            PrimaryKey::Bytes(b) => Some(b),
            PrimaryKey::U64 => None,
        }
    }

    /// Whether both declare the same keys, wherever their index lives (a schema read back
    /// from the catalog names its index table; the one it was created from does not).
    pub fn same_keys_as(&self, other: &PrimaryKey) -> bool {
        match (self, other) {
            (PrimaryKey::U64, PrimaryKey::U64) => true,
            (PrimaryKey::Bytes(a), PrimaryKey::Bytes(b)) => {
                a.max_len == b.max_len && a.node_bytes == b.node_bytes
            }
            _ => false,
        }
    }
}

/// Whether the table called `name` is one the database keeps for itself.
pub fn is_hidden(name: &str) -> bool {
    name.starts_with(HIDDEN_PREFIX)
}

/// The name of the hidden table holding the index of the byte-key table `table`: the prefix,
/// `bkey_` and the table's name, shortened with a hash when that exceeds the 64-byte limit (so
/// distinct tables get distinct index tables).
pub fn index_table_name(table: &str) -> String {
    hidden_table_name("bkey_", table)
}

/// The name of a hidden table holding the out-of-line values of table `table`, made when the
/// catalog has `tables` entries: the prefix, `vchunks_`, that count and the table's name
/// (shortened as in [`index_table_name`]). The count makes it unique, so a chunk table that a
/// crash left behind is never taken over by a new table of the name.
pub fn chunk_table_name(tables: usize, table: &str) -> String {
    hidden_table_name(&format!("vchunks_{tables}_"), table)
}

/// The name of a hidden table serving table `table` in the role `role`: the prefix, the role and
/// the table's name, shortened with a hash when that exceeds the 64-byte limit (so distinct
/// tables get distinct hidden tables).
fn hidden_table_name(role: &str, table: &str) -> String {
    let name = format!("{HIDDEN_PREFIX}{role}{table}");
    if name.len() <= 64 {
        return name;
    }
    // FNV-1a: stable across builds, unlike std's hasher.
    let hash = crate::index::fnv1a_64(table.as_bytes());
    let mut cut = 64 - 17;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{hash:016x}", &name[..cut])
}

impl Schema {
    /// Keys the table by byte strings of at most `max_len` bytes (1 to [`MAX_BYTE_KEY_LEN`]),
    /// ordered bytewise (the empty key first, a prefix before its extensions), instead of
    /// `u64`s. Rows are then read and written with the `_by` methods of `Tx` (`get_by`,
    /// `insert_by`, `range_by`...). The index nodes are [`DEFAULT_NODE_BYTES`] bytes, or the
    /// smallest size that holds four longest keys if that is larger; see
    /// [`Schema::index_node_bytes`].
    pub fn with_byte_keys(mut self, max_len: usize) -> Schema {
        let max = max_len.min(u32::MAX as usize);
        let node = DEFAULT_NODE_BYTES.max(ByteKeys::min_node_bytes(max.min(MAX_BYTE_KEY_LEN)));
        self.key = PrimaryKey::Bytes(ByteKeys {
            max_len: max as u32,
            node_bytes: node as u32,
            index_table: None,
        });
        self
    }

    /// Sets the index node size of a table with byte keys (at least
    /// [`ByteKeys::min_node_bytes`] of its key length, at most the row size limit): smaller
    /// nodes make a deeper tree with cheaper writes. Ignored for `u64` keys.
    pub fn index_node_bytes(mut self, bytes: usize) -> Schema {
        if let PrimaryKey::Bytes(b) = &mut self.key {
            b.node_bytes = bytes.min(u32::MAX as usize) as u32;
        }
        self
    }

    /// Checks the key declaration; `max_row` is the tuple size limit (index nodes are rows).
    pub(super) fn validate_key(&self, max_row: usize) -> Result<(), CatalogError> {
        let bad = |reason: String| CatalogError::InvalidSchema {
            table: self.name.clone(),
            reason,
        };
        let Some(keys) = self.key.bytes() else {
            return Ok(());
        };
        let (max_len, node) = (keys.max_len as usize, keys.node_bytes as usize);
        if max_len == 0 || max_len > MAX_BYTE_KEY_LEN {
            return Err(bad(format!(
                "byte keys of at most {max_len} bytes: the limit must be 1 to {MAX_BYTE_KEY_LEN}"
            )));
        }
        let min = ByteKeys::min_node_bytes(max_len);
        if node < min {
            return Err(bad(format!(
                "index nodes of {node} bytes cannot hold four keys of {max_len} bytes: they \
                 need at least {min}"
            )));
        }
        if node > max_row {
            return Err(bad(format!(
                "index nodes of {node} bytes (for keys of up to {max_len} bytes) exceed the \
                 tuple size limit of {max_row} bytes: use shorter keys, smaller nodes \
                 (Schema::index_node_bytes) or a larger limit (DbConfig::max_row_bytes)"
            )));
        }
        if !self.secondary.is_empty() {
            return Err(bad(
                "secondary indexes map to u64 primary keys: a table with byte keys has none".into(),
            ));
        }
        Ok(())
    }
}
