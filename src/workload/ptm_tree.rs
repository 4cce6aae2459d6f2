//! ArchTM §6.1's tree micro-benchmark on the persistent-object API: a **B+-tree** (not a
//! red-black tree: a node object holds many pairs, so a lookup reads few objects), leaves of
//! [`LEAF_CAP`] pairs (8-byte keys, 16-byte values) and inner nodes of [`FANOUT`] children,
//! each node one object. The tree is bulk-loaded with keys `0..pairs` in sorted order (full
//! leaves, then each level above), in transactions of about 1 000 pairs; the measured mix, as
//! for the hash table, is lookups and updates of existing keys' values (an update writes the
//! 16-byte value in its leaf: copy-on-write copies the leaf). No inserts or deletes in the mix,
//! so the tree has no split or merge code.

use super::ptm_hash::{value_of, MixDriver};
use crate::ptm::{PPtr, PTx, PtmError, PtmRunner};
use std::sync::atomic::AtomicU64;

/// Pairs per leaf.
pub const LEAF_CAP: usize = 8;
/// Children per inner node.
pub const FANOUT: usize = 16;
/// Bytes an update asks to change (the value).
pub const VALUE_BYTES: u64 = 16;

crate::pobject! {
    /// A leaf: `n` sorted keys and their values.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Leaf {
        /// Pairs in use.
        pub n: u64,
        /// Keys.
        pub keys: [u64; LEAF_CAP],
        /// Values.
        pub values: [[u8; 16]; LEAF_CAP],
    }
}

/// Byte offset of value `i` in a [`Leaf`].
fn value_at(i: usize) -> usize {
    8 + 8 * LEAF_CAP + 16 * i
}

crate::pobject! {
    /// An inner node: `n` children (leaves or inner nodes, by level) and `n - 1` separator
    /// keys (child `i + 1` holds the keys from `keys[i]` on).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Node {
        /// Children in use.
        pub n: u64,
        /// Separators.
        pub keys: [u64; FANOUT - 1],
        /// Children's handles (a `PPtr<Node>` or `PPtr<Leaf>` by level).
        pub kids: [u64; FANOUT],
    }
}

crate::pobject! {
    /// The root: the top node and the tree's height.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct TreeRoot {
        /// The top node (a leaf when `height` is 0).
        pub top: u64,
        /// Inner levels above the leaves.
        pub height: u64,
        /// Pairs in the tree.
        pub pairs: u64,
    }
}

/// The leaf that holds `key` (if present) and its index there.
pub fn find(tx: &mut PTx<'_, TreeRoot>, key: u64) -> Result<Option<(PPtr<Leaf>, usize)>, PtmError> {
    let r = tx.read(tx.root())?;
    let mut at = r.top;
    for _ in 0..r.height {
        let node: Node = tx.read(PPtr::from_raw(at))?;
        let n = node.n as usize;
        let i = node.keys[..n.saturating_sub(1)].partition_point(|&k| k <= key);
        at = node.kids[i];
    }
    let leaf = PPtr::<Leaf>::from_raw(at);
    let l: Leaf = tx.read(leaf)?;
    Ok(l.keys[..l.n as usize]
        .binary_search(&key)
        .ok()
        .map(|i| (leaf, i)))
}

/// Builds the tree with keys `0..pairs`.
pub fn load(ptm: &dyn PtmRunner<TreeRoot>, pairs: u64) -> Result<(), PtmError> {
    const BATCH: usize = 1000 / LEAF_CAP;
    // (first key, handle) of each node of the level being built.
    let mut level: Vec<(u64, u64)> = Vec::new();
    let leaves = pairs.div_ceil(LEAF_CAP as u64);
    let mut li = 0;
    while li < leaves {
        let end = (li + BATCH as u64).min(leaves);
        let made = ptm.run(|tx| {
            (li..end)
                .map(|l| {
                    let first = l * LEAF_CAP as u64;
                    let n = (pairs - first).min(LEAF_CAP as u64);
                    let mut leaf = Leaf {
                        n,
                        ..Default::default()
                    };
                    for i in 0..n as usize {
                        leaf.keys[i] = first + i as u64;
                        leaf.values[i] = value_of(first + i as u64, 0);
                    }
                    Ok((first, tx.alloc(&leaf)?.raw()))
                })
                .collect::<Result<Vec<_>, PtmError>>()
        })?;
        level.extend(made);
        li = end;
    }
    let mut height = 0;
    while level.len() > 1 {
        let mut up = Vec::with_capacity(level.len().div_ceil(FANOUT));
        for batch in level.chunks(FANOUT * BATCH) {
            let made = ptm.run(|tx| {
                batch
                    .chunks(FANOUT)
                    .map(|kids| {
                        let mut node = Node {
                            n: kids.len() as u64,
                            ..Default::default()
                        };
                        for (i, &(first, h)) in kids.iter().enumerate() {
                            node.kids[i] = h;
                            if i > 0 {
                                node.keys[i - 1] = first;
                            }
                        }
                        Ok((kids[0].0, tx.alloc(&node)?.raw()))
                    })
                    .collect::<Result<Vec<_>, PtmError>>()
            })?;
            up.extend(made);
        }
        level = up;
        height += 1;
    }
    let top = level.first().map_or(0, |&(_, h)| h);
    ptm.run(|tx| {
        let top = if top == 0 {
            tx.alloc(&Leaf::default())?.raw()
        } else {
            top
        };
        let root = tx.root();
        tx.write(root, &TreeRoot { top, height, pairs })
    })
}

/// The tree's driver (see [`MixDriver`]).
pub type TreeDriver<'a> = MixDriver<'a, TreeRoot>;

impl<'a> MixDriver<'a, TreeRoot> {
    /// A driver over a loaded tree of `pairs` keys.
    pub fn new(
        ptm: &'a dyn PtmRunner<TreeRoot>,
        pairs: u64,
        update_pct: u64,
        seed: u64,
        app_bytes: &'a AtomicU64,
    ) -> Self {
        Self::with_op(ptm, pairs, update_pct, seed, app_bytes, tree_op)
    }
}

fn tree_op(tx: &mut PTx<'_, TreeRoot>, key: u64, update: bool, round: u64) -> Result<(), PtmError> {
    let (leaf, i) =
        find(tx, key)?.ok_or_else(|| PtmError::Pool(format!("key {key} is missing")))?;
    if update {
        tx.write_at(leaf, value_at(i), &value_of(key, round))
    } else {
        let v: [u8; 16] = tx.read_at::<Leaf, [u8; 16]>(leaf, value_at(i))?;
        if v[..8] != key.to_le_bytes() {
            return Err(PtmError::Pool(format!(
                "key {key} holds another key's value"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::TxnDriver;
    use crate::ptm::{Ptm, PtmConfig};
    use std::sync::atomic::Ordering;

    #[test]
    fn the_loaded_tree_finds_every_key_and_updates_in_place() {
        for pairs in [1u64, 7, 8, 9, 300, 5000] {
            let ptm = Ptm::<TreeRoot>::create(PtmConfig::temporary().size(16 << 20)).unwrap();
            load(&ptm, pairs).unwrap();
            let r = ptm.run(|tx| tx.read(tx.root())).unwrap();
            assert_eq!(r.pairs, pairs);
            let expect_height = match pairs {
                0..=8 => 0,
                9..=128 => 1,
                129..=2048 => 2,
                _ => 3,
            };
            assert_eq!(r.height, expect_height, "{pairs} pairs");
            for k in 0..pairs {
                let (leaf, i) = ptm.run(|tx| find(tx, k)).unwrap().expect("present");
                let v: [u8; 16] = ptm
                    .run(|tx| tx.read_at::<Leaf, _>(leaf, value_at(i)))
                    .unwrap();
                assert_eq!(v, value_of(k, 0));
            }
            assert!(ptm.run(|tx| find(tx, pairs)).unwrap().is_none());
            let app = AtomicU64::new(0);
            let mut d = TreeDriver::new(&ptm, pairs, 100, 5, &app);
            for _ in 0..50 {
                d.run_txn().unwrap();
            }
            assert_eq!(app.load(Ordering::Relaxed), 50 * VALUE_BYTES);
            // Updated values carry their key; every key is still found.
            for k in 0..pairs {
                let (leaf, i) = ptm.run(|tx| find(tx, k)).unwrap().expect("present");
                let v: [u8; 16] = ptm
                    .run(|tx| tx.read_at::<Leaf, _>(leaf, value_at(i)))
                    .unwrap();
                assert_eq!(v[..8], k.to_le_bytes());
            }
            ptm.check_invariants().unwrap();
        }
    }
}
