//! [`OrderedIndex`]: a concurrent ordered u64 → u64 map with range scans, as a B+-tree with
//! optimistic lock coupling.
//!
//! # Why a B+-tree, and how it synchronises
//!
//! The index sits on every read of a range-scanned table (TPC-C ORDER-LINE grows by millions of
//! rows a minute), so a lookup must cost a few cache misses. A B+-tree with 30 keys per node has
//! height 4–5 at 10^7 keys, and its upper levels stay in the CPU cache; the skiplist it replaces
//! cost one miss per level of ~log2(n) levels plus an epoch pin and a node reference count per
//! call (issue 13 measured 20 % of TPC-C cycles there).
//!
//! Synchronisation is optimistic lock coupling (Leis et al., "The ART of practical
//! synchronization", DaMoN'16): every node carries a version word whose bit 1 is a write lock.
//! Readers take no lock: they read a node's version, read what they need, and check that the
//! version is unchanged; if not, they restart from the root. Writers descend the same way and
//! lock only the nodes they change, upgrading the version they read with a CAS (so a node changed
//! since is never modified on stale knowledge), always parent before child, so no deadlock forms.
//! A full node is split on the way down, so a parent always has room for the separator of a
//! splitting child.
//!
//! # Memory: type-stable nodes, no epochs
//!
//! Nodes live in an arena of atomics that is never deallocated while the tree lives; a node is
//! addressed by its index. A node unlinked from the tree (a leaf emptied by removals, and the
//! chain of single-child inner nodes above it) is marked obsolete and later reused for another
//! node. A reader still inside it sees the obsolete bit, or a version that has moved on, and
//! restarts; since every field is an atomic in live memory, such a reader reads stale values but
//! never freed memory, so no epoch-based reclamation (and no pin per operation) is needed, and
//! the module is safe Rust.
//!
//! Empty leaves are unlinked, so a queue-like table (TPC-C NEW-ORDER: insert at the high end,
//! delete at the low end) keeps no trail of empty leaves for scans to walk over. Leaves that are
//! merely underfull are not merged (as in most OLC B-trees); a leaf split at the right end of a
//! node leaves the left node full, so keys inserted in ascending order fill leaves completely.
//!
//! Scans copy one leaf's entries at a time (validated) and call the visitor outside the
//! optimistic section, so the visitor may do anything, including modifying the index. Leaves have
//! no sibling links: the next leaf is found by a fresh descent to the separator that bounds the
//! current leaf, which keeps splits and unlinking to a parent and a child.

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Keys per node. A node is 512 bytes: two 8-byte words, 30 keys and 31 slots.
const CAP: usize = 30;
/// Version bit 1: a writer holds the node.
const LOCKED: u64 = 0b10;
/// Version bit 0: the node was unlinked from the tree.
const OBSOLETE: u64 = 0b01;
/// `meta` bit: the node is a leaf (slots hold values) rather than an inner node (slots hold child
/// node ids). The low bits hold the key count.
const LEAF: u64 = 1 << 32;
const COUNT_MASK: u64 = LEAF - 1;

/// One node of the tree. Every field is atomic because optimistic readers read nodes that a
/// writer may be changing; they discard what they read when the version moved.
#[repr(align(64))]
struct Node {
    version: AtomicU64,
    meta: AtomicU64,
    keys: [AtomicU64; CAP],
    /// Leaf: `count` values. Inner: `count + 1` child node ids; child `i` holds the keys in
    /// `[keys[i - 1], keys[i])`.
    slots: [AtomicU64; CAP + 1],
}

impl Node {
    fn new() -> Node {
        Node {
            version: AtomicU64::new(0),
            meta: AtomicU64::new(LEAF),
            keys: std::array::from_fn(|_| AtomicU64::new(0)),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The version if no writer holds the node and it is linked; `None` means restart.
    #[inline]
    fn read_lock(&self) -> Option<u64> {
        let v = self.version.load(Ordering::Acquire);
        if v & (LOCKED | OBSOLETE) == 0 {
            Some(v)
        } else {
            std::hint::spin_loop();
            None
        }
    }

    /// Whether the node is unchanged since `read_lock` returned `v`: everything read in between
    /// is a consistent view (the seqlock reader's acquire fence orders those reads before this
    /// check).
    #[inline]
    fn validate(&self, v: u64) -> bool {
        fence(Ordering::Acquire);
        self.version.load(Ordering::Relaxed) == v
    }

    /// Locks the node if it is still at version `v`.
    #[inline]
    fn upgrade(&self, v: u64) -> bool {
        let locked = self
            .version
            .compare_exchange(v, v | LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        // The seqlock writer's release fence: a reader that sees any store made under the lock
        // then sees the locked version at its validation (free on x86).
        fence(Ordering::Release);
        locked
    }

    /// Unlocks, moving the version on (bit 1 carries into the counter).
    #[inline]
    fn unlock(&self) {
        self.version.fetch_add(LOCKED, Ordering::Release);
    }

    /// Unlocks and marks the node unlinked.
    fn unlock_obsolete(&self) {
        self.version.fetch_add(LOCKED | OBSOLETE, Ordering::Release);
    }

    #[inline]
    fn is_leaf(meta: u64) -> bool {
        meta & LEAF != 0
    }

    /// The key count from `meta`, clamped so that a torn optimistic read never indexes out of
    /// bounds (the version check discards it anyway).
    #[inline]
    fn count(meta: u64) -> usize {
        ((meta & COUNT_MASK) as usize).min(CAP)
    }

    #[inline]
    fn key(&self, i: usize) -> u64 {
        self.keys[i].load(Ordering::Relaxed)
    }

    #[inline]
    fn slot(&self, i: usize) -> u64 {
        self.slots[i].load(Ordering::Relaxed)
    }

    /// The first position whose key is `>= key`, and whether it equals `key`.
    #[inline]
    fn lower_bound(&self, count: usize, key: u64) -> (usize, bool) {
        let (mut lo, mut hi) = (0, count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.key(mid) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo, lo < count && self.key(lo) == key)
    }

    /// The child of an inner node that covers `key`: the number of separators `<= key`.
    #[inline]
    fn child_index(&self, count: usize, key: u64) -> usize {
        let (pos, exact) = self.lower_bound(count, key);
        pos + usize::from(exact)
    }

    fn set_meta(&self, leaf: bool, count: usize) {
        let flag = if leaf { LEAF } else { 0 };
        self.meta.store(flag | count as u64, Ordering::Relaxed);
    }

    /// Copies keys `from..from + n` of `src` to positions `to..` of `self`.
    fn copy_from(&self, src: &Node, from: usize, to: usize, n: usize) {
        for i in 0..n {
            self.keys[to + i].store(src.key(from + i), Ordering::Relaxed);
        }
    }

    /// Copies slots `from..from + n` of `src` to positions `to..` of `self`.
    fn copy_slots_from(&self, src: &Node, from: usize, to: usize, n: usize) {
        for i in 0..n {
            self.slots[to + i].store(src.slot(from + i), Ordering::Relaxed);
        }
    }

    /// Shifts keys `at..count` one place right (the caller then writes position `at`).
    fn shift_keys_right(&self, at: usize, count: usize) {
        for i in (at..count).rev() {
            self.keys[i + 1].store(self.key(i), Ordering::Relaxed);
        }
    }

    fn shift_slots_right(&self, at: usize, end: usize) {
        for i in (at..end).rev() {
            self.slots[i + 1].store(self.slot(i), Ordering::Relaxed);
        }
    }

    fn shift_keys_left(&self, at: usize, count: usize) {
        for i in at..count - 1 {
            self.keys[i].store(self.key(i + 1), Ordering::Relaxed);
        }
    }

    fn shift_slots_left(&self, at: usize, end: usize) {
        for i in at..end - 1 {
            self.slots[i].store(self.slot(i + 1), Ordering::Relaxed);
        }
    }
}

/// Node ids below this go to chunk 0; chunk `c` holds `FIRST_CHUNK << c` nodes.
const FIRST_CHUNK: u64 = 16;
const FIRST_CHUNK_BITS: u32 = FIRST_CHUNK.trailing_zeros();
/// Chunks of geometrically growing size: 16 × (2^40 − 1) nodes in all, more than memory holds.
const CHUNKS: usize = 40;

/// Type-stable node storage: chunks are allocated on demand and freed only with the tree.
struct Arena {
    chunks: [OnceLock<Box<[Node]>>; CHUNKS],
    /// Ids below this have been handed out at least once.
    next: AtomicU64,
    /// Unlinked nodes ready for reuse.
    free: Mutex<Vec<u64>>,
}

impl Arena {
    fn new() -> Arena {
        Arena {
            chunks: std::array::from_fn(|_| OnceLock::new()),
            next: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
        }
    }

    #[inline]
    fn locate(id: u64) -> (usize, usize) {
        let n = id + FIRST_CHUNK;
        let chunk = 63 - n.leading_zeros() - FIRST_CHUNK_BITS;
        (chunk as usize, (n - (FIRST_CHUNK << chunk)) as usize)
    }

    /// The node with `id`, or `None` for an id that no node has (an optimistic reader may hold a
    /// stale slot value; it restarts).
    #[inline]
    fn get(&self, id: u64) -> Option<&Node> {
        if id >= self.next.load(Ordering::Acquire) {
            return None;
        }
        let (chunk, at) = Self::locate(id);
        self.chunks.get(chunk)?.get()?.get(at)
    }

    /// A node ready to be filled and linked: a reused one, or a new one. Its version is clean and
    /// unlike any version it had before, so readers that held it restart.
    fn alloc(&self) -> (u64, &Node) {
        let reused = self.free.lock().expect("free list lock").pop();
        let id = reused.unwrap_or_else(|| {
            // Writers splitting under different parents may allocate at once: the fetch_add
            // hands each its own id. Until its chunk exists, `get` reports the id as absent,
            // which only a reader holding a stale slot value can ask for.
            let id = self.next.fetch_add(1, Ordering::AcqRel);
            let (chunk, _) = Self::locate(id);
            self.chunks[chunk].get_or_init(|| {
                (0..FIRST_CHUNK << chunk)
                    .map(|_| Node::new())
                    .collect::<Vec<_>>()
                    .into_boxed_slice()
            });
            id
        });
        let node = self.get(id).expect("allocated node exists");
        let v = node.version.load(Ordering::Relaxed);
        node.version
            .store((v & !(LOCKED | OBSOLETE)) + 4, Ordering::Release);
        (id, node)
    }

    fn release(&self, id: u64) {
        self.free.lock().expect("free list lock").push(id);
    }

    fn allocated_nodes(&self) -> usize {
        self.chunks
            .iter()
            .filter_map(OnceLock::get)
            .map(|chunk| chunk.len())
            .sum()
    }
}

/// Stripes of the entry counter, so that threads inserting into different leaves do not bounce
/// one counter line; a power of two.
const COUNT_STRIPES: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// One step of a descent: a node, the version it was read at, and the child taken from it.
#[derive(Clone, Copy)]
struct Step<'a> {
    id: u64,
    node: &'a Node,
    version: u64,
    child: usize,
}

/// The deepest path a tree can have is far below this (30-way fanout).
const MAX_DEPTH: usize = 24;

/// What a write does at the leaf that holds (or would hold) its key.
#[derive(Clone, Copy)]
enum LeafWrite {
    /// Insert `value` if the key is absent; report the present value otherwise.
    InsertNew(u64),
    /// Store `value` whether or not the key is present; report the previous value.
    Upsert(u64),
    /// Remove the key if it maps to `Some(expected)` (or to anything, for `None`).
    Remove(Option<u64>),
    /// Replace the value if it is `expected`.
    Replace { expected: u64, new: u64 },
}

/// What a [`LeafWrite`] found: the key's value before the write, and whether it changed the leaf.
struct WriteOutcome {
    previous: Option<u64>,
    changed: bool,
}

/// A concurrent ordered map from an 8-byte primary key to an 8-byte tuple address, with
/// ascending and descending range scans: a B+-tree with optimistic lock coupling (see the module
/// documentation).
///
/// Point reads and scans take no lock and write nothing shared. Every mutation locks the one leaf
/// it changes (plus a parent when a node splits or an empty leaf is unlinked), so conditional
/// mutations (`insert_new`, `remove_if`, `replace_if`) are atomic with respect to every other
/// operation on the same key.
pub struct OrderedIndex {
    arena: Arena,
    root: AtomicU64,
    counts: Box<[Stripe]>,
}

impl OrderedIndex {
    /// Creates an empty index: one empty leaf.
    pub fn new() -> Self {
        let arena = Arena::new();
        let (root, node) = arena.alloc();
        node.set_meta(true, 0);
        Self {
            arena,
            root: AtomicU64::new(root),
            counts: (0..COUNT_STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    /// The root, read-locked, or `None` (restart) if it is locked or was replaced meanwhile.
    #[inline]
    fn read_root(&self) -> Option<(u64, &Node, u64)> {
        let id = self.root.load(Ordering::Acquire);
        let node = self.arena.get(id)?;
        let v = node.read_lock()?;
        (self.root.load(Ordering::Acquire) == id).then_some((id, node, v))
    }

    /// Steps from a validated inner node to its child `child`, read-locked; `None` to restart.
    #[inline]
    fn descend(&self, node: &Node, v: u64, child: usize) -> Option<(u64, &Node, u64)> {
        let id = node.slot(child);
        if !node.validate(v) {
            return None;
        }
        let next = self.arena.get(id)?;
        let nv = next.read_lock()?;
        // The child was still linked from `node` after its version was read.
        node.validate(v).then_some((id, next, nv))
    }

    fn add_count(&self, leaf: u64, delta: i64) {
        let stripe = &self.counts[leaf as usize & (COUNT_STRIPES - 1)].0;
        stripe.fetch_add(delta as u64, Ordering::Relaxed);
    }

    /// Returns the address stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        'restart: loop {
            let Some((_, mut node, mut v)) = self.read_root() else {
                continue;
            };
            loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = Node::count(meta);
                if Node::is_leaf(meta) {
                    let (pos, found) = node.lower_bound(count, key);
                    let value = if found { node.slot(pos) } else { 0 };
                    if !node.validate(v) {
                        continue 'restart;
                    }
                    return found.then_some(value);
                }
                let child = node.child_index(count, key);
                match self.descend(node, v, child) {
                    Some((_, next, nv)) => (node, v) = (next, nv),
                    None => continue 'restart,
                }
            }
        }
    }

    /// Inserts `key → addr` only if `key` is absent; otherwise leaves the index unchanged and
    /// returns the address already stored.
    pub fn insert_new(&self, key: u64, addr: u64) -> Result<(), u64> {
        match self.write(key, LeafWrite::InsertNew(addr)).previous {
            Some(existing) => Err(existing),
            None => Ok(()),
        }
    }

    /// Stores `key → addr` whether or not `key` is present, returning the previous address.
    pub fn upsert(&self, key: u64, addr: u64) -> Option<u64> {
        self.write(key, LeafWrite::Upsert(addr)).previous
    }

    /// Removes `key`, returning its address.
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.write(key, LeafWrite::Remove(None)).previous
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    ///
    /// Lets a transaction delete the version it saw without clobbering a newer one.
    pub fn remove_if(&self, key: u64, addr: u64) -> bool {
        self.write(key, LeafWrite::Remove(Some(addr))).changed
    }

    /// Replaces the address of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    ///
    /// Out-of-place engines use it to swing a key to a new tuple version, compare-and-swap style.
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        self.write(key, LeafWrite::Replace { expected, new })
            .changed
    }

    /// Descends to the leaf for `key`, splitting full nodes on the way when the write may insert,
    /// locks the leaf and applies `op`. A leaf emptied by a removal is unlinked afterwards.
    fn write(&self, key: u64, op: LeafWrite) -> WriteOutcome {
        let may_insert = matches!(op, LeafWrite::InsertNew(_) | LeafWrite::Upsert(_));
        'restart: loop {
            let Some((mut id, mut node, mut v)) = self.read_root() else {
                continue;
            };
            let mut parent: Option<Step<'_>> = None;
            loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = Node::count(meta);
                let leaf = Node::is_leaf(meta);
                if leaf {
                    let (pos, found) = node.lower_bound(count, key);
                    if !found && !may_insert {
                        // Nothing to remove or replace: a validated miss needs no lock.
                        if !node.validate(v) {
                            continue 'restart;
                        }
                        return WriteOutcome {
                            previous: None,
                            changed: false,
                        };
                    }
                    if found && matches!(op, LeafWrite::InsertNew(_)) {
                        let existing = node.slot(pos);
                        if !node.validate(v) {
                            continue 'restart;
                        }
                        return WriteOutcome {
                            previous: Some(existing),
                            changed: false,
                        };
                    }
                    if !found && count == CAP {
                        // No room: split, then retry from the root.
                        self.split(parent, id, node, v, key);
                        continue 'restart;
                    }
                    if !node.upgrade(v) {
                        continue 'restart;
                    }
                    let outcome = Self::apply(node, count, pos, found, key, &op);
                    let removed = outcome.changed && matches!(op, LeafWrite::Remove(_));
                    node.unlock();
                    if removed {
                        self.add_count(id, -1);
                        if count == 1 {
                            self.unlink_empty_leaf(key);
                        }
                    } else if outcome.changed && !found {
                        self.add_count(id, 1);
                    }
                    return outcome;
                }
                if may_insert && count == CAP {
                    self.split(parent, id, node, v, key);
                    continue 'restart;
                }
                let child = node.child_index(count, key);
                let Some((next_id, next, nv)) = self.descend(node, v, child) else {
                    continue 'restart;
                };
                parent = Some(Step {
                    id,
                    node,
                    version: v,
                    child,
                });
                (id, node, v) = (next_id, next, nv);
            }
        }
    }

    /// Applies `op` to a locked leaf holding `count` keys, where `pos` is `key`'s lower bound.
    fn apply(
        node: &Node,
        count: usize,
        pos: usize,
        found: bool,
        key: u64,
        op: &LeafWrite,
    ) -> WriteOutcome {
        let previous = found.then(|| node.slot(pos));
        let changed = match (*op, found) {
            (LeafWrite::InsertNew(value) | LeafWrite::Upsert(value), false) => {
                node.shift_keys_right(pos, count);
                node.shift_slots_right(pos, count);
                node.keys[pos].store(key, Ordering::Relaxed);
                node.slots[pos].store(value, Ordering::Relaxed);
                node.set_meta(true, count + 1);
                true
            }
            (LeafWrite::Upsert(value), true) => {
                node.slots[pos].store(value, Ordering::Relaxed);
                true
            }
            (LeafWrite::InsertNew(_), true) => false,
            (LeafWrite::Remove(expected), true) => {
                if expected.is_some_and(|e| Some(e) != previous) {
                    false
                } else {
                    node.shift_keys_left(pos, count);
                    node.shift_slots_left(pos, count);
                    node.set_meta(true, count - 1);
                    true
                }
            }
            (LeafWrite::Replace { expected, new }, true) => {
                if previous == Some(expected) {
                    node.slots[pos].store(new, Ordering::Relaxed);
                    true
                } else {
                    false
                }
            }
            (LeafWrite::Remove(_) | LeafWrite::Replace { .. }, false) => false,
        };
        WriteOutcome { previous, changed }
    }

    /// Splits the full `node` (read at version `v`) under `parent`, or grows a new root above it.
    /// Gives up quietly when either version moved: the caller restarts anyway.
    fn split(&self, parent: Option<Step<'_>>, id: u64, node: &Node, v: u64, key: u64) {
        if let Some(p) = parent {
            if !p.node.upgrade(p.version) {
                return;
            }
            let pcount = Node::count(p.node.meta.load(Ordering::Relaxed));
            if pcount == CAP {
                // Filled since it was read (cannot happen: its version was current), but never
                // overflow a node.
                p.node.unlock();
                return;
            }
        }
        if !node.upgrade(v) {
            if let Some(p) = parent {
                p.node.unlock();
            }
            return;
        }
        let meta = node.meta.load(Ordering::Relaxed);
        let (count, leaf) = (Node::count(meta), Node::is_leaf(meta));
        let (right_id, right) = self.arena.alloc();
        let separator = if leaf {
            // Appending past the last key (ascending inserts): keep the left leaf full.
            let keep = if key > node.key(count - 1) {
                count - 1
            } else {
                count / 2
            };
            let moved = count - keep;
            right.copy_from(node, keep, 0, moved);
            right.copy_slots_from(node, keep, 0, moved);
            right.set_meta(true, moved);
            node.set_meta(true, keep);
            // The moved entries' count stripe follows their leaf.
            self.add_count(id, -(moved as i64));
            self.add_count(right_id, moved as i64);
            right.key(0)
        } else {
            let mid = count / 2;
            let separator = node.key(mid);
            let moved = count - mid - 1;
            right.copy_from(node, mid + 1, 0, moved);
            right.copy_slots_from(node, mid + 1, 0, moved + 1);
            right.set_meta(false, moved);
            node.set_meta(false, mid);
            separator
        };
        match parent {
            Some(p) => {
                let pcount = Node::count(p.node.meta.load(Ordering::Relaxed));
                p.node.shift_keys_right(p.child, pcount);
                p.node.shift_slots_right(p.child + 1, pcount + 1);
                p.node.keys[p.child].store(separator, Ordering::Relaxed);
                p.node.slots[p.child + 1].store(right_id, Ordering::Relaxed);
                p.node.set_meta(false, pcount + 1);
                node.unlock();
                p.node.unlock();
            }
            None => {
                let (root_id, root) = self.arena.alloc();
                root.keys[0].store(separator, Ordering::Relaxed);
                root.slots[0].store(id, Ordering::Relaxed);
                root.slots[1].store(right_id, Ordering::Relaxed);
                root.set_meta(false, 1);
                self.root.store(root_id, Ordering::Release);
                node.unlock();
            }
        }
    }

    /// Unlinks the leaf holding `key` if it is empty, together with the chain of inner nodes
    /// above it that would be left with no child, so that scans do not walk empty leaves.
    /// Best effort: if a node on the path changes meanwhile, it tries again a few times and
    /// otherwise leaves the empty leaf for a later removal to unlink.
    fn unlink_empty_leaf(&self, key: u64) {
        for _attempt in 0..8 {
            let mut path = [None::<Step<'_>>; MAX_DEPTH];
            let Some((mut id, mut node, mut v)) = self.read_root() else {
                continue;
            };
            let mut depth = 0;
            let leaf_count = loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = Node::count(meta);
                if Node::is_leaf(meta) {
                    break Some(count);
                }
                if depth == MAX_DEPTH {
                    break None;
                }
                let child = node.child_index(count, key);
                let Some((next_id, next, nv)) = self.descend(node, v, child) else {
                    break None;
                };
                path[depth] = Some(Step {
                    id,
                    node,
                    version: v,
                    child,
                });
                depth += 1;
                (id, node, v) = (next_id, next, nv);
            };
            match leaf_count {
                None => continue,
                Some(count) if count > 0 || depth == 0 => return,
                Some(_) => {}
            }
            if !node.validate(v) {
                continue;
            }
            // The lowest ancestor with another child keeps that child; everything between it
            // and the leaf has this leaf as its only descendant.
            let Some(keep_at) = (0..depth).rev().find(|&d| {
                let step = path[d].expect("path step");
                Node::count(step.node.meta.load(Ordering::Relaxed)) > 0
            }) else {
                return; // The whole tree is this one empty leaf under single-child nodes.
            };
            let mut locked = 0;
            let all_locked = (keep_at..depth).all(|d| {
                let step = path[d].expect("path step");
                let ok = step.node.upgrade(step.version);
                locked += usize::from(ok);
                ok
            }) && node.upgrade(v);
            if !all_locked {
                for d in keep_at..keep_at + locked {
                    path[d].expect("path step").node.unlock();
                }
                continue;
            }
            let keeper = path[keep_at].expect("path step");
            let kcount = Node::count(keeper.node.meta.load(Ordering::Relaxed));
            // Child i sits between keys i-1 and i: drop it with the separator on its left (the
            // one on its right for child 0).
            let key_at = keeper.child.saturating_sub(1);
            keeper.node.shift_keys_left(key_at, kcount);
            keeper.node.shift_slots_left(keeper.child, kcount + 1);
            keeper.node.set_meta(false, kcount - 1);
            for d in keep_at + 1..depth {
                let step = path[d].expect("path step");
                step.node.unlock_obsolete();
                self.arena.release(step.id);
            }
            node.unlock_obsolete();
            self.arena.release(id);
            keeper.node.unlock();
            return;
        }
    }

    /// Copies the entries of the leaf covering `from` that are `>= from` (ascending) or `<= from`
    /// (descending) into `out`, consistently, and returns the key where the next leaf in that
    /// direction starts (`None` at the end of the tree).
    fn read_leaf(&self, from: u64, descending: bool, out: &mut Vec<(u64, u64)>) -> Option<u64> {
        'restart: loop {
            out.clear();
            let Some((_, mut node, mut v)) = self.read_root() else {
                continue;
            };
            // The tightest separators around the path: the leaf holds keys in [low, high).
            let (mut low, mut high) = (None, None);
            loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = Node::count(meta);
                if Node::is_leaf(meta) {
                    if descending {
                        let (pos, found) = node.lower_bound(count, from);
                        let end = pos + usize::from(found);
                        out.extend((0..end).rev().map(|i| (node.key(i), node.slot(i))));
                    } else {
                        let (pos, _) = node.lower_bound(count, from);
                        out.extend((pos..count).map(|i| (node.key(i), node.slot(i))));
                    }
                    if !node.validate(v) {
                        continue 'restart;
                    }
                    return if descending {
                        low.and_then(|l: u64| l.checked_sub(1))
                    } else {
                        high
                    };
                }
                let child = node.child_index(count, from);
                if child < count {
                    high = Some(node.key(child));
                }
                if child > 0 {
                    low = Some(node.key(child - 1));
                }
                match self.descend(node, v, child) {
                    Some((_, next, nv)) => (node, v) = (next, nv),
                    None => continue 'restart,
                }
            }
        }
    }

    /// Visits entries from `from` in one direction, a leaf at a time, until `f` declines, `limit`
    /// entries were visited or a key fails `in_range`. Returns the number of calls to `f`.
    fn walk(
        &self,
        from: u64,
        descending: bool,
        limit: usize,
        in_range: impl Fn(u64) -> bool,
        mut f: impl FnMut(u64, u64) -> bool,
    ) -> usize {
        let mut visited = 0;
        let mut batch = Vec::with_capacity(CAP);
        let mut next = Some(from);
        while let Some(start) = next {
            if visited >= limit {
                break;
            }
            next = self.read_leaf(start, descending, &mut batch);
            for &(key, addr) in &batch {
                if visited >= limit || !in_range(key) {
                    return visited;
                }
                visited += 1;
                if !f(key, addr) {
                    return visited;
                }
            }
        }
        visited
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        let total = self
            .counts
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add);
        // Stripes are read one by one while others move: clamp a transiently negative sum.
        (total as i64).max(0) as usize
    }

    /// Whether the index holds no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.first_at_or_after(0).is_none()
    }

    /// Removes every entry.
    pub fn clear(&self) {
        let mut keys = Vec::new();
        self.for_each(|key, _| keys.push(key));
        for key in keys {
            self.remove(key);
        }
    }

    /// Calls `f(key, addr)` for every entry in ascending key order.
    ///
    /// Takes no lock, so `f` may modify the index. Not a snapshot: each visited entry was present
    /// at some moment during the walk, and entries changed concurrently may or may not be seen.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        self.walk(
            0,
            false,
            usize::MAX,
            |_| true,
            |k, a| {
                f(k, a);
                true
            },
        );
    }

    /// Visits entries with keys `>= from` in ascending order, calling `f(key, addr)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    ///
    /// Same consistency as [`for_each`](Self::for_each): not a snapshot.
    pub fn scan(&self, from: u64, limit: usize, f: impl FnMut(u64, u64) -> bool) -> usize {
        self.walk(from, false, limit, |_| true, f)
    }

    /// Visits the entries whose keys fall in `range` in ascending order, calling `f(key, addr)`
    /// until it returns `false`. Returns the number of calls to `f`. An inverted range (start
    /// after end) visits nothing rather than panicking.
    pub fn scan_range(
        &self,
        range: impl RangeBounds<u64>,
        f: impl FnMut(u64, u64) -> bool,
    ) -> usize {
        if range_is_empty(&range) {
            return 0;
        }
        let from = match range.start_bound() {
            Bound::Included(&start) => start,
            Bound::Excluded(&start) => start + 1, // Not u64::MAX: the range is not empty.
            Bound::Unbounded => 0,
        };
        let end = range.end_bound().cloned();
        let in_range = move |key: u64| match end {
            Bound::Included(end) => key <= end,
            Bound::Excluded(end) => key < end,
            Bound::Unbounded => true,
        };
        self.walk(from, false, usize::MAX, in_range, f)
    }

    /// Visits entries with keys `<= upto` in descending order, calling `f(key, addr)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    ///
    /// For "latest first" reads such as TPC-C Order-Status finding a customer's newest order.
    pub fn scan_rev(&self, upto: u64, limit: usize, f: impl FnMut(u64, u64) -> bool) -> usize {
        self.walk(upto, true, limit, |_| true, f)
    }

    /// The entry with the smallest key `>= key`.
    pub fn first_at_or_after(&self, key: u64) -> Option<(u64, u64)> {
        let mut first = None;
        self.scan(key, 1, |k, a| {
            first = Some((k, a));
            false
        });
        first
    }

    /// The entry with the largest key `<= key`.
    pub fn last_at_or_before(&self, key: u64) -> Option<(u64, u64)> {
        let mut last = None;
        self.scan_rev(key, 1, |k, a| {
            last = Some((k, a));
            false
        });
        last
    }

    /// DRAM bytes used by the index: every node allocated (linked, or free for reuse) plus the
    /// fixed part.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + COUNT_STRIPES * std::mem::size_of::<Stripe>()
            + self.arena.allocated_nodes() * std::mem::size_of::<Node>()
    }
}

/// Whether `range` can hold no key, detected up front because callers may compute inverted
/// bounds (e.g. `from..to` with `from > to`) and such a range should simply be empty.
fn range_is_empty(range: &impl RangeBounds<u64>) -> bool {
    match (range.start_bound(), range.end_bound()) {
        (Bound::Included(&start), Bound::Included(&end)) => start > end,
        (Bound::Included(&start), Bound::Excluded(&end))
        | (Bound::Excluded(&start), Bound::Included(&end)) => start >= end,
        (Bound::Excluded(&start), Bound::Excluded(&end)) => start >= end || start + 1 == end,
        (Bound::Excluded(&start), Bound::Unbounded) => start == u64::MAX,
        (Bound::Unbounded, Bound::Excluded(&end)) => end == 0,
        _ => false,
    }
}

impl Default for OrderedIndex {
    fn default() -> Self {
        Self::new()
    }
}

// Summarise instead of printing every entry.
impl fmt::Debug for OrderedIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrderedIndex")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Keys 10, 20, ..., 100 mapping to key + 1.
    fn tens() -> OrderedIndex {
        let index = OrderedIndex::new();
        for key in (10..=100).step_by(10) {
            index.insert_new(key, key + 1).unwrap();
        }
        index
    }

    fn collect_scan(index: &OrderedIndex, from: u64, limit: usize) -> Vec<u64> {
        let mut keys = Vec::new();
        let visited = index.scan(from, limit, |key, addr| {
            assert_eq!(addr, key + 1);
            keys.push(key);
            true
        });
        assert_eq!(visited, keys.len());
        keys
    }

    fn collect_range(index: &OrderedIndex, range: impl RangeBounds<u64>) -> Vec<u64> {
        let mut keys = Vec::new();
        index.scan_range(range, |key, _| {
            keys.push(key);
            true
        });
        keys
    }

    fn collect_rev(index: &OrderedIndex, upto: u64, limit: usize) -> Vec<u64> {
        let mut keys = Vec::new();
        index.scan_rev(upto, limit, |key, _| {
            keys.push(key);
            true
        });
        keys
    }

    #[test]
    fn insert_new_refuses_duplicates_and_reports_the_existing_addr() {
        let index = OrderedIndex::new();
        assert_eq!(index.insert_new(7, 100), Ok(()));
        assert_eq!(index.insert_new(7, 200), Err(100));
        assert_eq!(index.get(7), Some(100));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn upsert_remove_remove_if_replace_if() {
        let index = OrderedIndex::new();
        assert_eq!(index.upsert(1, 10), None);
        assert_eq!(index.upsert(1, 11), Some(10));
        assert_eq!(index.get(1), Some(11));
        assert!(
            !index.remove_if(1, 10),
            "wrong expected addr must not remove"
        );
        assert!(
            !index.replace_if(1, 10, 12),
            "wrong expected addr must not replace"
        );
        assert_eq!(index.get(1), Some(11));
        assert!(index.replace_if(1, 11, 12));
        assert_eq!(index.get(1), Some(12));
        assert!(
            !index.replace_if(2, 0, 20),
            "absent key must not be inserted"
        );
        assert_eq!(index.get(2), None);
        assert!(index.remove_if(1, 12));
        assert!(!index.remove_if(1, 12));
        assert_eq!(index.remove(1), None);
        index.upsert(3, 30);
        assert_eq!(index.remove(3), Some(30));
        assert!(index.is_empty());
    }

    #[test]
    fn scan_visits_ascending_from_a_key_between_entries_up_to_the_limit() {
        let index = tens();
        assert_eq!(collect_scan(&index, 0, 3), [10, 20, 30]);
        assert_eq!(collect_scan(&index, 35, 3), [40, 50, 60]);
        assert_eq!(collect_scan(&index, 40, 2), [40, 50]);
        assert_eq!(collect_scan(&index, 85, 10), [90, 100]);
        assert_eq!(collect_scan(&index, 101, 10), Vec::<u64>::new());
        assert_eq!(collect_scan(&index, 0, 0), Vec::<u64>::new());
    }

    #[test]
    fn scan_stops_when_f_returns_false() {
        let index = tens();
        let mut keys = Vec::new();
        let visited = index.scan(0, 100, |key, _| {
            keys.push(key);
            key < 30
        });
        assert_eq!(keys, [10, 20, 30]);
        assert_eq!(visited, 3);
    }

    #[test]
    fn scan_rev_visits_descending_from_keys_at_or_before() {
        let index = tens();
        assert_eq!(collect_rev(&index, 55, 2), [50, 40]);
        assert_eq!(collect_rev(&index, 50, 2), [50, 40]);
        assert_eq!(collect_rev(&index, u64::MAX, 3), [100, 90, 80]);
        assert_eq!(collect_rev(&index, 25, 10), [20, 10]);
        assert_eq!(collect_rev(&index, 9, 10), Vec::<u64>::new());
        let mut keys = Vec::new();
        let visited = index.scan_rev(100, 10, |key, _| {
            keys.push(key);
            key > 80
        });
        assert_eq!((keys, visited), (vec![100, 90, 80], 3));
    }

    #[test]
    fn scan_range_honours_every_bound_kind() {
        let index = tens();
        assert_eq!(collect_range(&index, 20..=40), [20, 30, 40]);
        assert_eq!(collect_range(&index, 20..40), [20, 30]);
        assert_eq!(
            collect_range(&index, (Bound::Excluded(20), Bound::Included(40))),
            [30, 40]
        );
        assert_eq!(
            collect_range(&index, (Bound::Excluded(20), Bound::Excluded(40))),
            [30]
        );
        assert_eq!(collect_range(&index, ..30), [10, 20]);
        assert_eq!(collect_range(&index, ..=30), [10, 20, 30]);
        assert_eq!(collect_range(&index, 85..), [90, 100]);
        assert_eq!(collect_range(&index, ..).len(), 10);
        assert_eq!(collect_range(&index, 15..25), [20]);
        // Inverted and degenerate ranges are empty, not a panic.
        let (high, low) = (50, 20); // through variables, as callers compute them
        assert!(collect_range(&index, high..low).is_empty());
        assert!(collect_range(&index, 30..30).is_empty());
        assert!(collect_range(&index, (Bound::Excluded(30), Bound::Excluded(31))).is_empty());
        assert!(collect_range(&index, (Bound::Excluded(u64::MAX), Bound::Unbounded)).is_empty());
        assert!(collect_range(&index, ..0).is_empty());
        let mut keys = Vec::new();
        let visited = index.scan_range(.., |key, _| {
            keys.push(key);
            keys.len() < 4
        });
        assert_eq!((keys, visited), (vec![10, 20, 30, 40], 4));
    }

    #[test]
    fn range_is_empty_agrees_with_btreemap_on_valid_ranges() {
        let model: std::collections::BTreeMap<u64, ()> = (0..8).map(|k| (k, ())).collect();
        let bounds = |v: u64| [Bound::Included(v), Bound::Excluded(v), Bound::Unbounded];
        for start in (0..8).flat_map(bounds) {
            for end in (0..8).flat_map(bounds) {
                let range = (start, end);
                let empty = range_is_empty(&range);
                // BTreeMap panics on inverted ranges, exactly the ones reported empty up front.
                let model_len = std::panic::catch_unwind(|| model.range(range).count());
                match model_len {
                    Ok(len) => assert!(!empty || len == 0, "{range:?}"),
                    Err(_) => assert!(empty, "{range:?} should be empty"),
                }
            }
        }
    }

    #[test]
    fn first_at_or_after_and_last_at_or_before() {
        let index = tens();
        assert_eq!(index.first_at_or_after(35), Some((40, 41)));
        assert_eq!(index.first_at_or_after(40), Some((40, 41)));
        assert_eq!(index.first_at_or_after(101), None);
        assert_eq!(index.last_at_or_before(35), Some((30, 31)));
        assert_eq!(index.last_at_or_before(30), Some((30, 31)));
        assert_eq!(index.last_at_or_before(9), None);
    }

    #[test]
    fn clear_and_for_each() {
        let index = tens();
        let mut keys = Vec::new();
        index.for_each(|key, _| keys.push(key));
        assert_eq!(keys, (10..=100).step_by(10).collect::<Vec<_>>());
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.first_at_or_after(0), None);
    }

    #[test]
    fn readers_never_see_a_present_key_as_absent_while_it_is_updated() {
        let index = OrderedIndex::new();
        index.insert_new(1, 0).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for addr in 1..20_000 {
                    assert!(index.replace_if(1, addr - 1, addr));
                    index.upsert(1, addr);
                }
                done.store(true, Ordering::Release);
            });
            while !done.load(Ordering::Acquire) {
                assert!(index.get(1).is_some());
            }
        });
    }

    #[test]
    fn memory_bytes_grows_with_entries_within_a_sane_range() {
        let index = OrderedIndex::new();
        let empty = index.memory_bytes();
        for key in 0..100_000u64 {
            index.upsert(key, key);
        }
        let full = index.memory_bytes();
        let per_entry = full as f64 / 100_000.0;
        assert!(full > empty);
        assert!(
            (16.0..40.0).contains(&per_entry),
            "{per_entry} bytes per entry"
        );
    }

    /// Checks the tree's shape: keys sorted within and across leaves, inner separators bounding
    /// their children, no empty leaf below an inner node with other children, the counter equal
    /// to the entries. Single-threaded use only.
    fn check_invariants(index: &OrderedIndex) {
        fn walk(
            index: &OrderedIndex,
            id: u64,
            low: Option<u64>,
            high: Option<u64>,
            keys: &mut Vec<u64>,
        ) {
            let node = index.arena.get(id).expect("linked node exists");
            let v = node.version.load(Ordering::Relaxed);
            assert_eq!(v & (LOCKED | OBSOLETE), 0, "node {id} locked or obsolete");
            let meta = node.meta.load(Ordering::Relaxed);
            let count = (meta & COUNT_MASK) as usize;
            assert!(count <= CAP);
            for i in 0..count {
                let k = node.key(i);
                assert!(low.map_or(true, |l| k >= l), "key {k} below fence {low:?}");
                assert!(high.map_or(true, |h| k < h), "key {k} above fence {high:?}");
                if i > 0 {
                    assert!(node.key(i - 1) < k, "keys out of order in node {id}");
                }
            }
            if Node::is_leaf(meta) {
                keys.extend((0..count).map(|i| node.key(i)));
                return;
            }
            for c in 0..=count {
                let lo = if c == 0 { low } else { Some(node.key(c - 1)) };
                let hi = if c == count { high } else { Some(node.key(c)) };
                walk(index, node.slot(c), lo, hi, keys);
            }
        }
        let mut keys = Vec::new();
        walk(
            index,
            index.root.load(Ordering::Relaxed),
            None,
            None,
            &mut keys,
        );
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(keys.len(), index.len(), "entry counter");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Upsert(u64, u64),
        Remove(u64),
        RemoveIf(u64, u64),
        ReplaceIf(u64, u64, u64),
        RemoveRange(u64, u64),
        Scan(u64, usize),
        ScanRev(u64, usize),
    }

    fn op_strategy(keys: u64) -> impl Strategy<Value = Op> {
        let key = 0..keys;
        let addr = 0u64..3;
        prop_oneof![
            4 => key.clone().prop_map(Op::Insert),
            2 => (key.clone(), addr.clone()).prop_map(|(k, a)| Op::Upsert(k, a)),
            2 => key.clone().prop_map(Op::Remove),
            1 => (key.clone(), addr.clone()).prop_map(|(k, a)| Op::RemoveIf(k, a)),
            1 => (key.clone(), addr.clone(), addr).prop_map(|(k, e, n)| Op::ReplaceIf(k, e, n)),
            1 => (key.clone(), 0u64..200).prop_map(|(k, n)| Op::RemoveRange(k, n)),
            1 => (key.clone(), 0usize..80).prop_map(|(k, l)| Op::Scan(k, l)),
            1 => (key, 0usize..80).prop_map(|(k, l)| Op::ScanRev(k, l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Enough keys and operations to split leaves and inner nodes, empty leaves and unlink
        /// them, and scan across leaf boundaries, against a `BTreeMap`.
        #[test]
        fn matches_a_btreemap_through_splits_and_unlinks(
            ops in proptest::collection::vec(op_strategy(3_000), 1..1_500)
        ) {
            let index = OrderedIndex::new();
            let mut model = std::collections::BTreeMap::new();
            for op in &ops {
                match *op {
                    Op::Insert(k) => {
                        let expected = model.get(&k).copied();
                        prop_assert_eq!(index.insert_new(k, k % 3).err(), expected);
                        model.entry(k).or_insert(k % 3);
                    }
                    Op::Upsert(k, a) => prop_assert_eq!(index.upsert(k, a), model.insert(k, a)),
                    Op::Remove(k) => prop_assert_eq!(index.remove(k), model.remove(&k)),
                    Op::RemoveIf(k, a) => {
                        let hit = model.get(&k) == Some(&a);
                        if hit {
                            model.remove(&k);
                        }
                        prop_assert_eq!(index.remove_if(k, a), hit);
                    }
                    Op::ReplaceIf(k, e, n) => {
                        let hit = model.get(&k) == Some(&e);
                        if hit {
                            model.insert(k, n);
                        }
                        prop_assert_eq!(index.replace_if(k, e, n), hit);
                    }
                    Op::RemoveRange(k, n) => {
                        for key in k..k + n {
                            prop_assert_eq!(index.remove(key), model.remove(&key));
                        }
                    }
                    Op::Scan(k, limit) => {
                        let mut seen = Vec::new();
                        index.scan(k, limit, |key, a| {
                            seen.push((key, a));
                            true
                        });
                        let expected: Vec<_> =
                            model.range(k..).take(limit).map(|(&k, &a)| (k, a)).collect();
                        prop_assert_eq!(seen, expected);
                    }
                    Op::ScanRev(k, limit) => {
                        let mut seen = Vec::new();
                        index.scan_rev(k, limit, |key, a| {
                            seen.push((key, a));
                            true
                        });
                        let expected: Vec<_> =
                            model.range(..=k).rev().take(limit).map(|(&k, &a)| (k, a)).collect();
                        prop_assert_eq!(seen, expected);
                    }
                }
            }
            check_invariants(&index);
            let mut all = Vec::new();
            index.for_each(|k, a| all.push((k, a)));
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn ascending_inserts_fill_leaves_and_a_drained_prefix_leaves_no_empty_leaves() {
        let index = OrderedIndex::new();
        for key in 0..30_000u64 {
            index.insert_new(key, key).unwrap();
        }
        check_invariants(&index);
        // Ascending inserts keep leaves full (29–30 keys per 512-byte node); the arena's chunks
        // grow geometrically, so up to half of what it holds is not handed out yet.
        let per_entry = index.memory_bytes() as f64 / 30_000.0;
        assert!(per_entry < 40.0, "{per_entry} bytes per entry");
        // A queue: drain the low end (TPC-C NEW-ORDER). The emptied leaves are unlinked, so a
        // scan from the start reaches the first live key through one descent per leaf at most.
        for key in 0..29_000u64 {
            assert_eq!(index.remove(key), Some(key));
        }
        check_invariants(&index);
        let mut leaves = 0;
        let mut next = Some(0);
        let mut batch = Vec::new();
        while let Some(from) = next {
            next = index.read_leaf(from, false, &mut batch);
            leaves += 1;
            if !batch.is_empty() {
                break;
            }
        }
        assert_eq!(
            leaves, 1,
            "the scan walked {leaves} leaves to its first key"
        );
        assert_eq!(index.first_at_or_after(0), Some((29_000, 29_000)));
        // Reused nodes: refilling does not grow the arena.
        let before = index.memory_bytes();
        for key in 30_000..50_000u64 {
            index.insert_new(key, key).unwrap();
        }
        assert_eq!(index.memory_bytes(), before);
        check_invariants(&index);
    }

    /// Writers insert and remove their own keys while readers check that keys no writer touches
    /// are always found, and that scans see strictly ascending keys containing every stable key in
    /// their range.
    #[test]
    fn concurrent_writers_and_scanners_keep_every_stable_key_visible() {
        const STABLE_EVERY: u64 = 7;
        const KEYS: u64 = 40_000;
        let index = OrderedIndex::new();
        for key in (0..KEYS).step_by(STABLE_EVERY as usize) {
            index.insert_new(key, key).unwrap();
        }
        let done = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for writer in 0..2u64 {
                let (index, done) = (&index, &done);
                scope.spawn(move || {
                    for round in 0..3u64 {
                        // Writer w owns keys ≡ 1 + w (mod 7), other than the stable ones.
                        let mine = (0..KEYS).filter(|k| k % STABLE_EVERY == 1 + writer);
                        for key in mine.clone() {
                            index.insert_new(key, key + round).unwrap();
                        }
                        for key in mine {
                            assert_eq!(index.remove(key), Some(key + round));
                        }
                    }
                    done.fetch_add(1, Ordering::AcqRel);
                });
            }
            let (index, done) = (&index, &done);
            scope.spawn(move || {
                let mut probe = 0u64;
                while done.load(Ordering::Acquire) < 2 {
                    probe = (probe + 7 * 101) % KEYS;
                    let stable = probe - probe % STABLE_EVERY;
                    assert_eq!(index.get(stable), Some(stable), "stable key lost");
                    let mut last = None;
                    let mut stable_seen = 0;
                    index.scan(stable, 300, |key, _| {
                        assert!(last.map_or(true, |l| l < key), "scan out of order");
                        last = Some(key);
                        stable_seen += u64::from(key % STABLE_EVERY == 0);
                        true
                    });
                    if let Some(last) = last {
                        assert_eq!(stable_seen, (last - stable) / STABLE_EVERY + 1);
                    }
                }
            });
        });
        check_invariants(&index);
        assert_eq!(index.len() as u64, KEYS.div_ceil(STABLE_EVERY));
    }
}
