//! Byte-string primary keys (issue 21): a B+-tree whose nodes are rows of a hidden table.
//!
//! Every engine stores rows under `u64` keys. A table declared with
//! [`Schema::with_byte_keys`](crate::catalog::Schema::with_byte_keys) keeps its rows under
//! internal `u64` row ids, and a B+-tree maps each key to its row id. The tree's nodes are the
//! rows of a hidden table (`__pmtx_bkey_<table>`, not listed by [`Db::tables`]), one node per
//! row, the node id its `u64` key; the root is row [`ROOT`]. The tree is read and written with
//! the engine's ordinary operations inside the caller's transaction, so:
//!
//! - **crash safety** is the engine's: a node split or a key removal commits or vanishes with
//!   the transaction that made it, on every engine and persistence domain, and recovery needs
//!   no tree-specific step;
//! - **serializability** is the protocol's: a lookup, a miss and a range scan read the nodes on
//!   their path, so they enter the read set (OCC, Silo, TicToc...) or take read locks (2PL);
//!   an insert or delete writes the leaf whose key interval holds the key, and a split writes
//!   the parent too. A concurrent insert into a scanned range therefore writes a node the
//!   scanner read, and the engine aborts one of the two, as Silo's node-set validation does
//!   for its index (Tu et al., SOSP'13, §4.6) but with rows as nodes. Under the multi-version
//!   protocols a node is read at the snapshot like any row (SI admits phantoms; two inserts
//!   into one leaf still conflict as writes of one row).
//!
//! **Row ids** are a hash of the key (FNV-1a), probing the next ids when one is taken: no
//! counter row that every insert would write (and conflict on), and a key that is deleted and
//! inserted again gets its old id back.
//!
//! **Nodes** are fixed-size rows (the schema's node size): a 16-byte header (kind, entry
//! count, bytes used, and for an inner node its first child) and entries of a 2-byte key
//! length, the key and an 8-byte id (a leaf: the row id; an inner node: the child holding
//! keys at or above the entry's separator). Keys within a node are scanned in place from the
//! row bytes read with [`Tx::read_into`]-style zero-copy reads; only a node that changes is
//! decoded. Leaves have no sibling links: a range iterator descends again from the root for
//! the next leaf, seeking the fence (the separator bounding the leaf it finished), so a split
//! writes only the split leaf, the new one and the parent.
//!
//! **Deletes** remove the key from its leaf; a leaf that becomes empty is removed from its
//! parent (and an inner node left without children from its own parent). Nodes are never
//! merged with siblings, and the root never shrinks in height: a tree that grew and then lost
//! most keys keeps sparse nodes (the space of emptied ones is freed). Departure from a textbook
//! B+-tree, documented in docs/ARCHITECTURE.md ("Byte-string keys").

use super::{Db, Row, RowRef, Tx, Value};
use crate::catalog::bytekey::{NODE_ENTRY_OVERHEAD, NODE_HEADER_BYTES};
use crate::catalog::{ByteKeys, ColumnType, PrimaryKey, Schema, TableId};
use crate::engine::{DbError, FieldWrite, TxError};
use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};

/// The node id of every tree's root.
pub const ROOT: u64 = 1;

/// Deepest tree a descent follows: a longer path can only come from a view made inconsistent by
/// concurrent splits (which validation will reject), never from a real tree.
const MAX_DEPTH: usize = 48;

const LEAF: u8 = 1;
const INNER: u8 = 2;

/// A byte-key table's tree, as a transaction uses it.
#[derive(Clone, Copy, Debug)]
struct Tree {
    /// The user's table (rows under row ids).
    rows: TableId,
    /// The hidden table of nodes.
    nodes: TableId,
    node_bytes: usize,
    max_len: usize,
}

/// An index node read from its row and decoded (for nodes that change).
#[derive(Clone, Debug, PartialEq)]
struct Node {
    leaf: bool,
    /// An inner node's first child (keys below its first separator).
    first: u64,
    /// Sorted (key, row id) of a leaf, or (separator, child) of an inner node.
    entries: Vec<(Vec<u8>, u64)>,
}

/// A node in place in its row's bytes, validated once, scanned without copying.
struct View<'a> {
    kind: u8,
    first: u64,
    count: usize,
    body: &'a [u8],
}

/// A malformed node is either a view made inconsistent by a concurrent change (the node read
/// was freed and its id reused) or damage: retrying settles the first; the second fails after
/// the retries with this conflict, and [`Db::check_byte_keys`] names the node.
fn corrupt() -> TxError {
    TxError::Conflict
}

impl<'a> View<'a> {
    fn parse(bytes: &'a [u8]) -> Result<View<'a>, TxError> {
        if bytes.len() < NODE_HEADER_BYTES {
            return Err(corrupt());
        }
        let kind = bytes[0];
        let count = u16::from_le_bytes([bytes[2], bytes[3]]) as usize;
        let used = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        let first = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        if !(kind == LEAF || kind == INNER) || used < NODE_HEADER_BYTES || used > bytes.len() {
            return Err(corrupt());
        }
        let view = View {
            kind,
            first,
            count,
            body: &bytes[NODE_HEADER_BYTES..used],
        };
        // Every entry lies within the used bytes: later walks slice without checks failing.
        let mut at = 0;
        for _ in 0..count {
            let len = view
                .body
                .get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
                .ok_or_else(corrupt)?;
            at += 2 + len + 8;
            if at > view.body.len() {
                return Err(corrupt());
            }
        }
        Ok(view)
    }

    fn entries(&self) -> impl Iterator<Item = (&'a [u8], u64)> + 'a {
        let body = self.body;
        let mut at = 0;
        (0..self.count).map(move |_| {
            let len = u16::from_le_bytes([body[at], body[at + 1]]) as usize;
            let key = &body[at + 2..at + 2 + len];
            let id = u64::from_le_bytes(body[at + 2 + len..at + 10 + len].try_into().expect("8"));
            at += NODE_ENTRY_OVERHEAD + len;
            (key, id)
        })
    }

    fn decode(&self) -> Node {
        Node {
            leaf: self.kind == LEAF,
            first: self.first,
            entries: self.entries().map(|(k, id)| (k.to_vec(), id)).collect(),
        }
    }
}

impl Node {
    fn empty_leaf() -> Node {
        Node {
            leaf: true,
            first: 0,
            entries: Vec::new(),
        }
    }

    fn size(&self) -> usize {
        NODE_HEADER_BYTES
            + self
                .entries
                .iter()
                .map(|(k, _)| NODE_ENTRY_OVERHEAD + k.len())
                .sum::<usize>()
    }

    /// The node's row (exactly `node_bytes`; the caller checked that it fits).
    fn encode(&self, node_bytes: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(node_bytes);
        out.push(if self.leaf { LEAF } else { INNER });
        out.push(0);
        out.extend_from_slice(&(self.entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.size() as u32).to_le_bytes());
        out.extend_from_slice(&self.first.to_le_bytes());
        for (k, id) in &self.entries {
            out.extend_from_slice(&(k.len() as u16).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(&id.to_le_bytes());
        }
        out.resize(node_bytes, 0);
        out
    }

    /// The child an inner node's slot `i` points to (0: `first`).
    fn child(&self, i: usize) -> u64 {
        if i == 0 {
            self.first
        } else {
            self.entries[i - 1].1
        }
    }

    /// Splits an overflowing node in two by bytes; returns the separator and the right half.
    /// A leaf's separator is the right half's first key (kept in the leaf); an inner node's
    /// middle separator moves up, its child becoming the right half's first.
    fn split(&mut self) -> (Vec<u8>, Node) {
        let total: usize = self.size() - NODE_HEADER_BYTES;
        let mut cum = 0;
        let mut mid = self.entries.len() - 1;
        for (i, (k, _)) in self.entries.iter().enumerate() {
            cum += NODE_ENTRY_OVERHEAD + k.len();
            if cum > total / 2 {
                mid = i;
                break;
            }
        }
        if self.leaf {
            // The left half keeps the entry that crossed the middle: both halves are non-empty
            // because no entry is more than a quarter of a node (ByteKeys::min_node_bytes).
            let at = (mid + 1).min(self.entries.len() - 1).max(1);
            let right = self.entries.split_off(at);
            let sep = right[0].0.clone();
            (
                sep,
                Node {
                    leaf: true,
                    first: 0,
                    entries: right,
                },
            )
        } else {
            let mut right = self.entries.split_off(mid);
            let (sep, first) = right.remove(0);
            (
                sep,
                Node {
                    leaf: false,
                    first,
                    entries: right,
                },
            )
        }
    }
}

/// Which leaf a descent looks for.
#[derive(Clone, Copy)]
enum Seek<'k> {
    /// The leaf whose interval holds this key.
    Holding(&'k [u8]),
    /// The leaf holding the largest keys below this one.
    Below(&'k [u8]),
    /// The last leaf.
    Last,
}

impl Seek<'_> {
    /// The slot of an inner node to follow, given its separators.
    fn slot<'a>(self, seps: impl Iterator<Item = &'a [u8]>) -> usize {
        match self {
            Seek::Holding(k) => seps.take_while(|s| *s <= k).count(),
            Seek::Below(k) => seps.take_while(|s| *s < k).count(),
            Seek::Last => seps.count(),
        }
    }
}

/// FNV-1a of the key: the first row id tried for it.
fn key_hash(key: &[u8]) -> u64 {
    crate::index::fnv1a_64(key)
}

/// Row ids tried for a key before giving up (a run of taken ids this long means a broken table).
const MAX_PROBES: u64 = 64;

thread_local! {
    /// Seed of new node ids (xorshift), per thread so that threads splitting at once pick
    /// different ids without sharing a counter.
    static NODE_IDS: std::cell::Cell<u64> = std::cell::Cell::new({
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x9e37_79b9_7f4a_7c15);
        h.finish() | 1
    });
}

/// A random node id (never 0 or the root).
fn new_node_id() -> u64 {
    NODE_IDS.with(|s| {
        let mut x = s.get();
        loop {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x > ROOT {
                s.set(x);
                return x;
            }
        }
    })
}

/// The tree of byte-key table `table` in `schemas`, or why `table` has none.
fn tree_of(schemas: &[Schema], table: TableId) -> Result<Tree, TxError> {
    let schema = super::schema_of(schemas, table)?;
    match schema.key {
        PrimaryKey::Bytes(ByteKeys {
            max_len,
            node_bytes,
            index_table: Some(nodes),
        }) => Ok(Tree {
            rows: table,
            nodes,
            node_bytes: node_bytes as usize,
            max_len: max_len as usize,
        }),
        PrimaryKey::Bytes(_) => Err(TxError::SchemaMismatch(format!(
            "table {} has byte keys but no index table in the catalog",
            schema.name
        ))),
        PrimaryKey::U64 => Err(TxError::SchemaMismatch(format!(
            "table {} has u64 keys: use get, insert, update, delete, exists and range with a \
             u64 key (the _by methods are for tables with byte keys)",
            schema.name
        ))),
    }
}

/// `Err` unless `table` has `u64` keys: the u64 methods of [`Tx`] on a byte-key table would
/// address its internal row ids.
pub(super) fn check_u64_keys(schemas: &[Schema], table: TableId) -> Result<(), TxError> {
    match schemas.get(table as usize) {
        Some(s) if s.key != PrimaryKey::U64 => Err(TxError::SchemaMismatch(format!(
            "table {} has byte-string keys: use get_by, insert_by, update_by, delete_by, \
             exists_by and range_by with a &[u8] key",
            s.name
        ))),
        _ => Ok(()),
    }
}

/// The path of a descent for a change: per level the node id, the node, and the slot taken.
type Path = Vec<(u64, Node, usize)>;

impl<'w> Tx<'w> {
    fn tree(&mut self, table: TableId) -> Result<Tree, TxError> {
        tree_of(&self.live()?.schemas, table)
    }

    /// Reads node `id` into `buf` (zero-copy: the engine's read into a reused buffer). A node
    /// that is gone was freed by a change this transaction's view is older than: a conflict.
    fn read_node(&mut self, tree: Tree, id: u64, buf: &mut Vec<u8>) -> Result<(), TxError> {
        buf.resize(tree.node_bytes, 0);
        let read = self.live()?.inner.read(tree.nodes, id, buf);
        match self.settle(read) {
            Err(TxError::NotFound { .. }) => {
                self.doomed = Some(TxError::Conflict);
                Err(TxError::Conflict)
            }
            other => other,
        }
    }

    fn write_node(&mut self, tree: Tree, id: u64, node: &Node) -> Result<(), TxError> {
        let bytes = node.encode(tree.node_bytes);
        let write = self.live()?.inner.update(
            tree.nodes,
            id,
            &[FieldWrite {
                offset: 0,
                bytes: &bytes,
            }],
        );
        self.settle(write)
    }

    /// Stores `node` under a new random id (retrying an id that is taken).
    fn add_node(&mut self, tree: Tree, node: &Node) -> Result<u64, TxError> {
        let bytes = node.encode(tree.node_bytes);
        loop {
            let id = new_node_id();
            let insert = self.live()?.inner.insert(tree.nodes, id, &bytes);
            match self.settle(insert) {
                Err(TxError::DuplicateKey { .. }) => continue,
                other => return other.map(|()| id),
            }
        }
    }

    fn free_node(&mut self, tree: Tree, id: u64) -> Result<(), TxError> {
        let delete = self.live()?.inner.delete(tree.nodes, id);
        self.settle(delete)
    }

    /// A miss (absent key, or a duplicate) about to reach the caller: under an optimistic
    /// protocol the path that produced it may have gone stale (a concurrent split moved the
    /// key), and the engine turns that into a conflict, as it does for `u64` misses.
    fn miss(&mut self, tree: Tree, error: TxError) -> TxError {
        let probe = TxError::NotFound {
            table: tree.nodes,
            key: 0,
        };
        if self.core().inner.resolve_miss(probe) == TxError::Conflict {
            self.doomed = Some(TxError::Conflict);
            return TxError::Conflict;
        }
        error
    }

    fn check_key(tree: Tree, key: &[u8]) -> Result<(), TxError> {
        if key.len() > tree.max_len {
            return Err(TxError::RowTooLarge(format!(
                "a key of {} bytes for table {}, whose keys hold at most {}",
                key.len(),
                tree.rows,
                tree.max_len
            )));
        }
        Ok(())
    }

    /// Descends to the leaf `seek` names without decoding: calls `at_leaf` with its view and,
    /// when `fences` is asked for (range iterators), its fences: the tightest separators below
    /// and above it on the path. Point lookups pass `false` and copy no separator.
    fn descend<T>(
        &mut self,
        tree: Tree,
        seek: Seek<'_>,
        fences: bool,
        at_leaf: impl FnOnce(&View<'_>, Option<&[u8]>, Option<&[u8]>) -> T,
    ) -> Result<T, TxError> {
        let mut buf = take_buffer();
        let mut low: Option<Vec<u8>> = None;
        let mut high: Option<Vec<u8>> = None;
        let mut id = ROOT;
        for _ in 0..MAX_DEPTH {
            if let Err(e) = self.read_node(tree, id, &mut buf) {
                give_buffer(buf);
                return Err(e);
            }
            let view = match View::parse(&buf) {
                Ok(v) => v,
                Err(e) => {
                    give_buffer(buf);
                    self.doomed = Some(e.clone());
                    return Err(e);
                }
            };
            if view.kind == LEAF {
                let out = at_leaf(&view, low.as_deref(), high.as_deref());
                give_buffer(buf);
                return Ok(out);
            }
            let slot = seek.slot(view.entries().map(|(k, _)| k));
            let mut entries = view.entries();
            if slot > 0 {
                let (sep, child) = entries.nth(slot - 1).expect("slot within the node");
                if fences {
                    low = Some(sep.to_vec());
                }
                id = child;
            } else {
                id = view.first;
            }
            if fences {
                if let Some((sep, _)) = entries.next() {
                    high = Some(sep.to_vec());
                }
            }
        }
        give_buffer(buf);
        self.doomed = Some(TxError::Conflict);
        Err(TxError::Conflict)
    }

    /// Descends to the leaf holding `key`, decoding the path for a change.
    fn descend_for_change(&mut self, tree: Tree, key: &[u8]) -> Result<Path, TxError> {
        let mut buf = take_buffer();
        let mut path: Path = Vec::new();
        let mut id = ROOT;
        let result = loop {
            if path.len() == MAX_DEPTH {
                self.doomed = Some(TxError::Conflict);
                break Err(TxError::Conflict);
            }
            if let Err(e) = self.read_node(tree, id, &mut buf) {
                break Err(e);
            }
            let node = match View::parse(&buf) {
                Ok(view) => view.decode(),
                Err(e) => {
                    self.doomed = Some(e.clone());
                    break Err(e);
                }
            };
            if node.leaf {
                let slot = node.entries.partition_point(|(k, _)| k.as_slice() < key);
                path.push((id, node, slot));
                break Ok(path);
            }
            let slot = Seek::Holding(key).slot(node.entries.iter().map(|(k, _)| k.as_slice()));
            let child = node.child(slot);
            path.push((id, node, slot));
            id = child;
        };
        give_buffer(buf);
        result
    }

    /// The row id of `key` in a byte-key table, `None` if absent.
    fn row_id(&mut self, tree: Tree, key: &[u8]) -> Result<Option<u64>, TxError> {
        Self::check_key(tree, key)?;
        self.descend(tree, Seek::Holding(key), false, |leaf, _, _| {
            leaf.entries().find(|(k, _)| *k == key).map(|(_, id)| id)
        })
    }

    fn found(&mut self, tree: Tree, key: &[u8]) -> Result<u64, TxError> {
        match self.row_id(tree, key)? {
            Some(id) => Ok(id),
            None => Err(self.miss(
                tree,
                TxError::ByteKeyNotFound {
                    table: tree.rows,
                    key: key.to_vec(),
                },
            )),
        }
    }

    /// Reads the row with byte key `key` (a table declared with
    /// [`Schema::with_byte_keys`](crate::catalog::Schema::with_byte_keys)); the byte-key
    /// counterpart of [`Tx::get`]. `TxError::ByteKeyNotFound` names a missing key.
    pub fn get_by(&mut self, table: TableId, key: &[u8]) -> Result<Row, TxError> {
        let tree = self.tree(table)?;
        let id = self.found(tree, key)?;
        self.read_row(table, id)
    }

    /// Reads the row with byte key `key` into the transaction's own buffer (see [`Tx::get_ref`]).
    pub fn get_ref_by(&mut self, table: TableId, key: &[u8]) -> Result<RowRef<'_>, TxError> {
        let tree = self.tree(table)?;
        let id = self.found(tree, key)?;
        self.read_row_ref(table, id)
    }

    /// Whether a row with byte key `key` exists.
    pub fn exists_by(&mut self, table: TableId, key: &[u8]) -> Result<bool, TxError> {
        let tree = self.tree(table)?;
        Ok(self.row_id(tree, key)?.is_some())
    }

    /// Sets some columns of the row with byte key `key` (see [`Tx::update`]). The index is
    /// not written: an update conflicts only with transactions that use the row itself.
    pub fn update_by(
        &mut self,
        table: TableId,
        key: &[u8],
        values: &[(usize, Value<'_>)],
    ) -> Result<(), TxError> {
        let tree = self.tree(table)?;
        let id = self.found(tree, key)?;
        self.update_values(table, id, values)
    }

    /// Inserts a row with byte key `key`, one value per column (see [`Tx::insert`]);
    /// `TxError::DuplicateByteKey` if the key exists, `TxError::RowTooLarge` if it is longer
    /// than the table's key limit.
    pub fn insert_by(
        &mut self,
        table: TableId,
        key: &[u8],
        values: &[Value<'_>],
    ) -> Result<(), TxError> {
        let tree = self.tree(table)?;
        Self::check_key(tree, key)?;
        let mut path = self.descend_for_change(tree, key)?;
        let (_, leaf, slot) = path.last().expect("a descent ends at a leaf");
        if leaf.entries.get(*slot).is_some_and(|(k, _)| k == key) {
            return Err(self.miss(
                tree,
                TxError::DuplicateByteKey {
                    table: tree.rows,
                    key: key.to_vec(),
                },
            ));
        }
        let start = key_hash(key);
        let mut id = None;
        for probe in 0..MAX_PROBES {
            let candidate = start.wrapping_add(probe);
            match self.insert_values(table, candidate, values) {
                Ok(()) => {
                    id = Some(candidate);
                    break;
                }
                // The id is taken (by a key of the same hash): the next one.
                Err(TxError::DuplicateKey { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        let Some(id) = id else {
            return Err(TxError::SchemaMismatch(format!(
                "table {table}: {MAX_PROBES} row ids after the hash of key \"{}\" are all taken",
                key.escape_ascii()
            )));
        };
        let (_, leaf, slot) = path.last_mut().expect("a descent ends at a leaf");
        leaf.entries.insert(*slot, (key.to_vec(), id));
        self.store_path(tree, &mut path)
    }

    /// Writes the changed leaf at the end of `path`, splitting nodes that overflow up the path
    /// (a root that splits stays at [`ROOT`], its halves moving to new nodes).
    fn store_path(&mut self, tree: Tree, path: &mut Path) -> Result<(), TxError> {
        while let Some((id, mut node, _)) = path.pop() {
            if node.size() <= tree.node_bytes {
                return self.write_node(tree, id, &node);
            }
            let (sep, right) = node.split();
            if id == ROOT {
                let left = self.add_node(tree, &node)?;
                let right = self.add_node(tree, &right)?;
                let root = Node {
                    leaf: false,
                    first: left,
                    entries: vec![(sep, right)],
                };
                return self.write_node(tree, ROOT, &root);
            }
            self.write_node(tree, id, &node)?;
            let right = self.add_node(tree, &right)?;
            let (_, parent, slot) = path.last_mut().expect("a non-root node has a parent");
            parent.entries.insert(*slot, (sep, right));
        }
        Ok(())
    }

    /// Deletes the row with byte key `key`; `TxError::ByteKeyNotFound` if there is none.
    pub fn delete_by(&mut self, table: TableId, key: &[u8]) -> Result<(), TxError> {
        let tree = self.tree(table)?;
        Self::check_key(tree, key)?;
        let mut path = self.descend_for_change(tree, key)?;
        let (_, leaf, slot) = path.last_mut().expect("a descent ends at a leaf");
        if leaf.entries.get(*slot).map_or(true, |(k, _)| k != key) {
            return Err(self.miss(
                tree,
                TxError::ByteKeyNotFound {
                    table,
                    key: key.to_vec(),
                },
            ));
        }
        let (_, row) = leaf.entries.remove(*slot);
        // A row with values out of line takes its chunks with it (`varlen.rs`).
        if super::layout_of(&self.live()?.layouts, table)?.spills {
            self.delete_varlen(table, row)?;
        } else {
            let delete = self.live()?.inner.delete(table, row);
            self.settle(delete)?;
        }
        // Remove emptied nodes bottom-up; the first node that keeps children is written.
        while let Some((id, node, _)) = path.pop() {
            let empty = if node.leaf {
                node.entries.is_empty()
            } else {
                node.first == 0
            };
            if !empty || id == ROOT {
                let node = if empty { Node::empty_leaf() } else { node };
                return self.write_node(tree, id, &node);
            }
            self.free_node(tree, id)?;
            let (_, parent, slot) = path.last_mut().expect("a non-root node has a parent");
            if *slot == 0 {
                parent.first = if parent.entries.is_empty() {
                    0
                } else {
                    parent.entries.remove(0).1
                };
            } else {
                parent.entries.remove(*slot - 1);
            }
        }
        Ok(())
    }

    /// Rows with byte keys in `range`, in ascending key order, read lazily (see
    /// [`ByteRangeIter`]); the byte-key counterpart of [`Tx::range`]. Bounds are anything that
    /// gives bytes: `tx.range_by(t, "a".."m")`, `tx.range_by(t, &b"k"[..]..)`,
    /// `tx.range_by::<&[u8]>(t, ..)`.
    pub fn range_by<'t, K: AsRef<[u8]>>(
        &'t mut self,
        table: TableId,
        range: impl RangeBounds<K>,
    ) -> ByteRangeIter<'t, 'w> {
        ByteRangeIter::new(self, table, false, &range)
    }

    /// Rows with byte keys in `range`, in descending key order (see [`Tx::range_by`]).
    pub fn range_rev_by<'t, K: AsRef<[u8]>>(
        &'t mut self,
        table: TableId,
        range: impl RangeBounds<K>,
    ) -> ByteRangeIter<'t, 'w> {
        ByteRangeIter::new(self, table, true, &range)
    }
}

thread_local! {
    /// A node buffer reused by this thread's descents.
    static NODE_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

fn take_buffer() -> Vec<u8> {
    NODE_BUFFER.try_with(|b| b.take()).unwrap_or_default()
}

fn give_buffer(buf: Vec<u8>) {
    let _ = NODE_BUFFER.try_with(|b| b.set(buf));
}

fn owned(bound: Bound<&impl AsRef<[u8]>>) -> Bound<Vec<u8>> {
    match bound {
        Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Whether `key` is on the near side of `stop` (the end going up, the start going down).
fn within(stop: &Bound<Vec<u8>>, reverse: bool, key: &[u8]) -> bool {
    match (stop, reverse) {
        (Bound::Unbounded, _) => true,
        (Bound::Included(s), false) => key <= s.as_slice(),
        (Bound::Excluded(s), false) => key < s.as_slice(),
        (Bound::Included(s), true) => key >= s.as_slice(),
        (Bound::Excluded(s), true) => key > s.as_slice(),
    }
}

/// Where the next leaf of an iteration is sought.
enum Next {
    /// The first leaf: by the range's start (or end, going down).
    First,
    /// The leaf beyond this fence.
    Fence(Vec<u8>),
    Done,
}

/// Rows of a byte-key range, in ascending ([`Tx::range_by`]) or descending
/// ([`Tx::range_rev_by`]) key order, read a leaf at a time through the transaction. Each item
/// is `(key, row)` or the error that ended the iteration (nothing follows an error).
///
/// Each leaf is reached by a descent from the root, seeking the fence of the previous one, and
/// every node read is in the transaction's read set: under the single-version protocols an
/// insert into the range by another transaction writes a leaf the iterator read, so one of the
/// two aborts. The iteration reads the leaves whose intervals meet the range, no further.
///
/// ```
/// use pmtx::prelude::*;
/// # fn main() -> Result<(), DbError> {
/// let db = Db::create(DbConfig::temporary().pool_size(16 << 20).max_threads(1))?;
/// let users = db.create_table(
///     Schema::new("users", &[("age", ColumnType::U64)]).with_byte_keys(32),
/// )?;
/// db.run(|tx| {
///     tx.insert_by(users, b"ada", &[Value::U64(36)])?;
///     tx.insert_by(users, b"alan", &[Value::U64(41)])?;
///     tx.insert_by(users, b"grace", &[Value::U64(85)])
/// })?;
/// assert_eq!(db.run(|tx| Ok(tx.get_by(users, b"alan")?.u64(0)))?, 41);
/// let a_names: Vec<Vec<u8>> = db.run(|tx| {
///     tx.range_by(users, "a".."b").map(|r| r.map(|(key, _row)| key)).collect()
/// })?;
/// assert_eq!(a_names, [b"ada".to_vec(), b"alan".to_vec()]);
/// # Ok(())
/// # }
/// ```
pub struct ByteRangeIter<'t, 'w> {
    tx: &'t mut Tx<'w>,
    table: TableId,
    reverse: bool,
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    next: Next,
    /// Entries of the current leaf still to hand out, in iteration order.
    pending: VecDeque<(Vec<u8>, u64)>,
    /// The error to report first (an unusable table or bound).
    failed: Option<TxError>,
}

impl<'t, 'w> ByteRangeIter<'t, 'w> {
    fn new<K: AsRef<[u8]>>(
        tx: &'t mut Tx<'w>,
        table: TableId,
        reverse: bool,
        range: &impl RangeBounds<K>,
    ) -> ByteRangeIter<'t, 'w> {
        let failed = tx.tree(table).err();
        ByteRangeIter {
            tx,
            table,
            reverse,
            start: owned(range.start_bound()),
            end: owned(range.end_bound()),
            next: Next::First,
            pending: VecDeque::new(),
            failed,
        }
    }

    /// Reads the next leaf meeting the range into `pending`.
    fn fetch(&mut self) -> Result<(), TxError> {
        let tree = self.tx.tree(self.table)?;
        let (reverse, start, end) = (self.reverse, &self.start, &self.end);
        let fence = match std::mem::replace(&mut self.next, Next::Done) {
            Next::Done => return Ok(()),
            Next::First => None,
            Next::Fence(f) => Some(f),
        };
        let seek = match (&fence, reverse) {
            (Some(f), false) => Seek::Holding(f),
            (Some(f), true) => Seek::Below(f),
            (None, false) => match start {
                Bound::Included(k) | Bound::Excluded(k) => Seek::Holding(k),
                Bound::Unbounded => Seek::Holding(&[]),
            },
            (None, true) => match end {
                Bound::Included(k) => Seek::Holding(k),
                Bound::Excluded(k) => Seek::Below(k),
                Bound::Unbounded => Seek::Last,
            },
        };
        let (near, far) = if reverse { (end, start) } else { (start, end) };
        let (entries, next) = self.tx.descend(tree, seek, true, |leaf, low, high| {
            let mut entries: Vec<(Vec<u8>, u64)> = leaf
                .entries()
                .filter(|(k, _)| within(near, !reverse, k) && within(far, reverse, k))
                .map(|(k, id)| (k.to_vec(), id))
                .collect();
            if reverse {
                entries.reverse();
            }
            // The next leaf holds keys at or above `high` (below `low` going down): sought
            // only if some of those can lie in the range.
            let fence = if reverse { low } else { high };
            let more = fence.is_some_and(|f| {
                if reverse {
                    // Keys below `f` and in the range exist only if the start is below `f`.
                    matches!(far, Bound::Unbounded) || f > far_key(far)
                } else {
                    within(far, false, f)
                }
            });
            let next = match fence {
                Some(f) if more => Next::Fence(f.to_vec()),
                _ => Next::Done,
            };
            (entries, next)
        })?;
        // Fences advance strictly (each leaf's interval lies beyond the previous one's) in any
        // consistent tree; a view made inconsistent by concurrent splits could otherwise send
        // the iteration round in circles before validation rejects it.
        if let (Some(prev), Next::Fence(new)) = (&fence, &next) {
            if (new <= prev) != reverse || new == prev {
                self.tx.doomed = Some(TxError::Conflict);
                return Err(TxError::Conflict);
            }
        }
        self.pending.extend(entries);
        self.next = next;
        Ok(())
    }
}

/// The key of a bound (empty for `Unbounded`, where it is not compared).
fn far_key(bound: &Bound<Vec<u8>>) -> &[u8] {
    match bound {
        Bound::Included(k) | Bound::Excluded(k) => k,
        Bound::Unbounded => &[],
    }
}

impl Iterator for ByteRangeIter<'_, '_> {
    type Item = Result<(Vec<u8>, Row), TxError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            self.next = Next::Done;
            self.pending.clear();
            return Some(Err(e));
        }
        while self.pending.is_empty() {
            if matches!(self.next, Next::Done) {
                return None;
            }
            if let Err(e) = self.fetch() {
                self.next = Next::Done;
                return Some(Err(e));
            }
        }
        let (key, id) = self.pending.pop_front()?;
        match self.tx.read_row(self.table, id) {
            Ok(row) => Some(Ok((key, row))),
            Err(e) => {
                self.next = Next::Done;
                self.pending.clear();
                Some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for ByteRangeIter<'_, '_> {}

/// What [`Db::check_byte_keys`] found in a well-formed byte-key index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByteKeyIndex {
    /// Every key with its row id, in key order.
    pub entries: Vec<(Vec<u8>, u64)>,
    /// Nodes on a root-to-leaf path: the node reads of a lookup (every leaf is at this depth).
    pub depth: usize,
    /// Nodes in the tree.
    pub nodes: u64,
    /// Leaves in the tree.
    pub leaves: u64,
}

impl Db {
    /// Creates a table with byte keys: its hidden index table (or the one a crashed earlier
    /// attempt left), the root node, then the table itself naming the index. Each step is
    /// durable before the next, so a crash leaves at most an unused index table that the next
    /// attempt takes over.
    pub(super) fn create_byte_key_table(&self, mut schema: Schema) -> Result<TableId, DbError> {
        let PrimaryKey::Bytes(mut keys) = schema.key else {
            unreachable!("called for byte-key schemas only");
        };
        // Checked before the index table exists, so that a refused schema leaves nothing.
        schema.validate(self.config.max_row_bytes)?;
        if self.table(&schema.name).is_some() {
            return Err(crate::catalog::CatalogError::DuplicateTable(schema.name).into());
        }
        let name = crate::catalog::bytekey::index_table_name(&schema.name);
        let node_bytes = keys.node_bytes as usize;
        let nodes = match self.table(&name) {
            Some(id) => id,
            None => self.engine.create_table(Schema::new(
                &name,
                &[("node", ColumnType::Bytes(keys.node_bytes))],
            ))?,
        };
        self.table_count
            .fetch_max(nodes as usize + 1, std::sync::atomic::Ordering::Release);
        let root = Node::empty_leaf().encode(node_bytes);
        self.run(|tx| match tx.insert_bytes(nodes, ROOT, &root) {
            Err(TxError::DuplicateKey { .. }) => Ok(()),
            other => other,
        })?;
        keys.index_table = Some(nodes);
        schema.key = PrimaryKey::Bytes(keys);
        self.engine.create_table(schema)
    }

    /// Checks the index of byte-key table `table` and returns its contents: keys strictly
    /// ascending within their nodes' fences, every leaf at one depth, each key's row present,
    /// no row without a key, no node outside the tree. `Err` says what is wrong. Reads in one
    /// read-only transaction (run it on a quiet database).
    pub fn check_byte_keys(&self, table: TableId) -> Result<ByteKeyIndex, String> {
        let schema = self
            .schema(table)
            .ok_or_else(|| format!("no table with id {table}"))?;
        let tree = tree_of(std::slice::from_ref(&schema), 0)
            .map(|t| Tree { rows: table, ..t })
            .map_err(|e| e.to_string())?;
        let counts = self.check_structure()?;
        let walked = self
            .run_read_only(|tx| {
                let mut out = Walk::default();
                tx.walk(tree, ROOT, 1, None, None, &mut out)?;
                for (key, id) in &out.index.entries {
                    match tx.read_row_ref(table, *id) {
                        Ok(_) => {}
                        Err(TxError::NotFound { .. }) => out.problems.push(format!(
                            "key \"{}\" maps to row {id:#x}, which does not exist",
                            key.escape_ascii()
                        )),
                        Err(e) => return Err(e),
                    }
                }
                Ok(out)
            })
            .map_err(|e| format!("walking the index of {}: {e}", schema.name))?;
        let mut problems = walked.problems;
        let index = walked.index;
        let rows = counts.get(table as usize).copied().unwrap_or(0);
        if rows != index.entries.len() as u64 {
            problems.push(format!(
                "table {} has {rows} rows but its index {} keys",
                schema.name,
                index.entries.len()
            ));
        }
        let node_rows = counts.get(tree.nodes as usize).copied().unwrap_or(0);
        if node_rows != index.nodes {
            problems.push(format!(
                "the index of {} has {node_rows} node rows but {} nodes in the tree",
                schema.name, index.nodes
            ));
        }
        let mut ids: Vec<u64> = index.entries.iter().map(|(_, id)| *id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            problems.push(format!("two keys of {} share a row id", schema.name));
        }
        if problems.is_empty() {
            Ok(index)
        } else {
            Err(problems.join("; "))
        }
    }
}

/// What a check's walk of a tree collected.
#[derive(Default)]
struct Walk {
    index: ByteKeyIndex,
    problems: Vec<String>,
}

impl Tx<'_> {
    /// Walks the subtree of node `id` at `depth`, whose keys must lie in `[low, high)`.
    fn walk(
        &mut self,
        tree: Tree,
        id: u64,
        depth: usize,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        out: &mut Walk,
    ) -> Result<(), TxError> {
        if depth > MAX_DEPTH {
            out.problems
                .push(format!("node {id:#x} is deeper than {MAX_DEPTH} levels"));
            return Ok(());
        }
        let mut buf = vec![0; tree.node_bytes];
        let read = self.live()?.inner.read(tree.nodes, id, &mut buf);
        match self.settle(read) {
            Err(TxError::NotFound { .. }) => {
                out.problems.push(format!("node {id:#x} is missing"));
                return Ok(());
            }
            other => other?,
        }
        let node = match View::parse(&buf) {
            Ok(view) => view.decode(),
            Err(_) => {
                out.problems.push(format!("node {id:#x} is malformed"));
                return Ok(());
            }
        };
        out.index.nodes += 1;
        let keys: Vec<&[u8]> = node.entries.iter().map(|(k, _)| k.as_slice()).collect();
        if keys.windows(2).any(|w| w[0] >= w[1])
            || keys.first().is_some_and(|k| low.is_some_and(|l| *k < l))
            || keys.last().is_some_and(|k| high.is_some_and(|h| *k >= h))
        {
            out.problems.push(format!(
                "node {id:#x}: keys out of order or outside its fences"
            ));
        }
        if keys.iter().any(|k| k.len() > tree.max_len) || node.size() > tree.node_bytes {
            out.problems.push(format!(
                "node {id:#x}: a key over the limit or an overfull node"
            ));
        }
        if node.leaf {
            out.index.leaves += 1;
            if out.index.depth == 0 {
                out.index.depth = depth;
            } else if out.index.depth != depth {
                out.problems.push(format!(
                    "leaf {id:#x} at depth {depth}, another at {}",
                    out.index.depth
                ));
            }
            out.index.entries.extend(node.entries);
            return Ok(());
        }
        if node.first == 0 {
            out.problems
                .push(format!("inner node {id:#x} has no child"));
            return Ok(());
        }
        for slot in 0..=node.entries.len() {
            let lo = if slot == 0 {
                low
            } else {
                Some(node.entries[slot - 1].0.as_slice())
            };
            let hi = node.entries.get(slot).map(|(k, _)| k.as_slice()).or(high);
            self.walk(tree, node.child(slot), depth + 1, lo, hi, out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(keys: &[&[u8]]) -> Node {
        Node {
            leaf: true,
            first: 0,
            entries: keys.iter().map(|k| (k.to_vec(), k.len() as u64)).collect(),
        }
    }

    #[test]
    fn nodes_round_trip_through_their_rows() {
        let n = leaf(&[b"", b"a", b"ab", b"b"]);
        let bytes = n.encode(128);
        assert_eq!(bytes.len(), 128);
        assert_eq!(View::parse(&bytes).unwrap().decode(), n);
        let inner = Node {
            leaf: false,
            first: 9,
            entries: vec![(b"m".to_vec(), 10)],
        };
        assert_eq!(View::parse(&inner.encode(64)).unwrap().decode(), inner);
    }

    #[test]
    fn malformed_rows_are_refused_not_sliced_past() {
        let mut bytes = leaf(&[b"abc"]).encode(64);
        bytes[16] = 200; // the entry's key length runs past the node
        assert!(View::parse(&bytes).is_err());
        assert!(View::parse(&[0u8; 64]).is_err(), "kind 0");
        assert!(View::parse(&[1u8; 8]).is_err(), "short");
    }

    #[test]
    fn splits_leave_two_fitting_halves() {
        let max_len = 20;
        let node_bytes = ByteKeys::min_node_bytes(max_len);
        for lens in [[20usize; 5], [0, 20, 20, 20, 20], [20, 20, 20, 20, 0]] {
            let mut n = Node {
                leaf: true,
                first: 0,
                entries: lens
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (vec![b'a' + i as u8; l.max(1)], i as u64))
                    .collect(),
            };
            n.entries.sort();
            let (sep, right) = n.split();
            assert!(!n.entries.is_empty() && !right.entries.is_empty());
            assert!(n.size() <= node_bytes && right.size() <= node_bytes);
            assert_eq!(sep, right.entries[0].0);
            let mut inner = Node {
                leaf: false,
                first: 99,
                entries: n.entries.iter().chain(&right.entries).cloned().collect(),
            };
            let before = inner.entries.len();
            let (_, r) = inner.split();
            assert_eq!(inner.entries.len() + r.entries.len() + 1, before);
            assert!(inner.size() <= node_bytes && r.size() <= node_bytes);
        }
    }

    #[test]
    fn index_table_names_fit_and_differ() {
        use crate::catalog::bytekey::index_table_name;
        let long_a = "a".repeat(64);
        let long_b = format!("{}b", "a".repeat(63));
        assert_eq!(index_table_name("users"), "__pmtx_bkey_users");
        let (a, b) = (index_table_name(&long_a), index_table_name(&long_b));
        assert!(a.len() <= 64 && b.len() <= 64);
        assert_ne!(a, b);
    }
}
