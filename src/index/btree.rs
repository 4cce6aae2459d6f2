//! A concurrent B+-tree with optimistic lock coupling over keys of `W` 64-bit words, the engine
//! of [`OrderedIndex`](super::OrderedIndex) (W = 1) and
//! [`SecondaryIndex`](super::SecondaryIndex) (W = 2: secondary key, primary key).
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

use std::sync::OnceLock;

use smallvec::SmallVec;

use super::sync::{fence, spin, AtomicU64, Mutex, Ordering};

/// Keys per node. A node is 512 bytes: two 8-byte words, 30 keys and 31 slots. The loom model
/// uses tiny nodes, so that a few keys split them.
#[cfg(not(loom))]
const CAP: usize = 30;
#[cfg(loom)]
const CAP: usize = 4;
/// Version bit 1: a writer holds the node.
const LOCKED: u64 = 0b10;
/// The entries of one leaf as [`BTree::read_leaf`] copies them out: on the stack, so that a scan
/// allocates nothing (issue 13).
pub(super) type LeafBatch<const W: usize> = SmallVec<[([u64; W], u64); CAP]>;
/// Version bit 0: the node was unlinked from the tree.
const OBSOLETE: u64 = 0b01;
/// `meta` bit: the node is a leaf (slots hold values) rather than an inner node (slots hold child
/// node ids). The low bits hold the key count.
const LEAF: u64 = 1 << 32;
const COUNT_MASK: u64 = LEAF - 1;

/// One node of the tree. Every field is atomic because optimistic readers read nodes that a
/// writer may be changing; they discard what they read when the version moved.
#[repr(align(64))]
struct Node<const W: usize> {
    version: AtomicU64,
    meta: AtomicU64,
    keys: [[AtomicU64; W]; CAP],
    /// Leaf: `count` values. Inner: `count + 1` child node ids; child `i` holds the keys in
    /// `[keys[i - 1], keys[i])`.
    slots: [AtomicU64; CAP + 1],
}

impl<const W: usize> Node<W> {
    fn new() -> Self {
        Node {
            version: AtomicU64::new(0),
            meta: AtomicU64::new(LEAF),
            keys: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Starts loading the cache lines of the node's version, count and keys. A descent reads the
    /// version, then binary-searches keys spread over several lines, each load depending on the
    /// one before: issued together, the misses of a cold node overlap instead of queueing (Chen
    /// et al., "Improving index performance through prefetching", SIGMOD'01). The slots are left
    /// out: the search reads one slot line of four, and every prefetch holds a fill buffer.
    #[inline]
    fn prefetch(&self) {
        #[cfg(not(loom))]
        {
            let start = (self as *const Self).cast::<u8>();
            for line in (0..std::mem::offset_of!(Self, slots)).step_by(64) {
                crate::pmem::prefetch(start.wrapping_add(line));
            }
        }
    }

    /// The version if no writer holds the node and it is linked; `None` means restart.
    #[inline]
    fn read_lock(&self) -> Option<u64> {
        let v = self.version.load(Ordering::Acquire);
        if v & (LOCKED | OBSOLETE) == 0 {
            Some(v)
        } else {
            spin();
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

    /// The version [`unlock`](Self::unlock) leaves on a node locked from version `v` by
    /// [`upgrade`](Self::upgrade).
    #[inline]
    fn version_after_unlock(v: u64) -> u64 {
        (v | LOCKED) + LOCKED
    }

    /// Unlocks and marks the node unlinked.
    fn unlock_obsolete(&self) {
        self.version.fetch_add(LOCKED | OBSOLETE, Ordering::Release);
    }

    #[inline]
    fn key(&self, i: usize) -> [u64; W] {
        std::array::from_fn(|w| self.keys[i][w].load(Ordering::Relaxed))
    }

    #[inline]
    fn set_key(&self, i: usize, key: [u64; W]) {
        for (word, value) in self.keys[i].iter().zip(key) {
            word.store(value, Ordering::Relaxed);
        }
    }

    #[inline]
    fn slot(&self, i: usize) -> u64 {
        self.slots[i].load(Ordering::Relaxed)
    }

    /// The first position whose key is `>= key`, and whether it equals `key`.
    ///
    /// Halving without a data-dependent branch: the compare selects the half (a conditional
    /// move), and the loop runs a number of times that depends on `count` only. A searched key
    /// falls left or right of a node's middle at random, so the branchy search mispredicted about
    /// one step in two (issue 13: the B-tree's search compares were its hottest instructions).
    #[inline]
    fn lower_bound(&self, count: usize, key: [u64; W]) -> (usize, bool) {
        let (mut base, mut size) = (0, count);
        while size > 1 {
            let half = size / 2;
            let mid = base + half;
            base = if self.key(mid) < key { mid } else { base };
            size -= half;
        }
        let pos = base + usize::from(size == 1 && self.key(base) < key);
        (pos, pos < count && self.key(pos) == key)
    }

    /// The child of an inner node that covers `key`: the number of separators `<= key`.
    #[inline]
    fn child_index(&self, count: usize, key: [u64; W]) -> usize {
        let (pos, exact) = self.lower_bound(count, key);
        pos + usize::from(exact)
    }

    fn set_meta(&self, leaf: bool, count: usize) {
        let flag = if leaf { LEAF } else { 0 };
        self.meta.store(flag | count as u64, Ordering::Relaxed);
    }

    /// Copies keys `from..from + n` of `src` to positions `to..` of `self`.
    fn copy_from(&self, src: &Self, from: usize, to: usize, n: usize) {
        for i in 0..n {
            self.set_key(to + i, src.key(from + i));
        }
    }

    /// Copies slots `from..from + n` of `src` to positions `to..` of `self`.
    fn copy_slots_from(&self, src: &Self, from: usize, to: usize, n: usize) {
        for i in 0..n {
            self.slots[to + i].store(src.slot(from + i), Ordering::Relaxed);
        }
    }

    /// Shifts keys `at..count` one place right (the caller then writes position `at`).
    fn shift_keys_right(&self, at: usize, count: usize) {
        for i in (at..count).rev() {
            self.set_key(i + 1, self.key(i));
        }
    }

    fn shift_slots_right(&self, at: usize, end: usize) {
        for i in (at..end).rev() {
            self.slots[i + 1].store(self.slot(i), Ordering::Relaxed);
        }
    }

    fn shift_keys_left(&self, at: usize, count: usize) {
        for i in at..count - 1 {
            self.set_key(i, self.key(i + 1));
        }
    }

    fn shift_slots_left(&self, at: usize, end: usize) {
        for i in at..end - 1 {
            self.slots[i].store(self.slot(i + 1), Ordering::Relaxed);
        }
    }
}

/// Whether a node's `meta` word marks a leaf.
#[inline]
fn is_leaf(meta: u64) -> bool {
    meta & LEAF != 0
}

/// The key count from a node's `meta` word, clamped so that a torn optimistic read never indexes
/// out of bounds (the version check discards it anyway).
#[inline]
fn key_count(meta: u64) -> usize {
    ((meta & COUNT_MASK) as usize).min(CAP)
}

/// Node ids below this go to chunk 0; chunk `c` holds `FIRST_CHUNK << c` nodes.
const FIRST_CHUNK: u64 = 16;
const FIRST_CHUNK_BITS: u32 = FIRST_CHUNK.trailing_zeros();
/// Chunks of geometrically growing size: 16 × (2^40 − 1) nodes in all, more than memory holds.
const CHUNKS: usize = 40;

/// Type-stable node storage: chunks are allocated on demand and freed only with the tree.
struct Arena<const W: usize> {
    chunks: [OnceLock<Box<[Node<W>]>>; CHUNKS],
    /// Ids below this have been handed out at least once.
    next: AtomicU64,
    /// Unlinked nodes ready for reuse.
    free: Mutex<Vec<u64>>,
}

impl<const W: usize> Arena<W> {
    fn new() -> Self {
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
    fn get(&self, id: u64) -> Option<&Node<W>> {
        if id >= self.next.load(Ordering::Acquire) {
            return None;
        }
        let (chunk, at) = Self::locate(id);
        self.chunks.get(chunk)?.get()?.get(at)
    }

    /// A node ready to be filled and linked: a reused one, or a new one. Its version is clean and
    /// unlike any version it had before, so readers that held it restart.
    fn alloc(&self) -> (u64, &Node<W>) {
        let reused = self.free.lock().pop();
        let id = reused.unwrap_or_else(|| {
            // Writers splitting under different parents may allocate at once: the fetch_add
            // hands each its own id. Until its chunk exists, `get` reports the id as absent,
            // which only a reader holding a stale slot value can ask for.
            let id = self.next.fetch_add(1, Ordering::AcqRel);
            let (chunk, _) = Self::locate(id);
            self.chunks[chunk].get_or_init(|| {
                super::slice_on_huge_pages((FIRST_CHUNK << chunk) as usize, Node::new)
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
        self.free.lock().push(id);
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
struct Step<'a, const W: usize> {
    id: u64,
    node: &'a Node<W>,
    version: u64,
    child: usize,
}

/// The deepest path a tree can have is far below this (30-way fanout).
const MAX_DEPTH: usize = 24;

/// Where a lookup ended: a leaf and the version it was validated at. Opaque outside the index;
/// [`OrderedIndex::insert_new_at`](super::OrderedIndex::insert_new_at) uses it to skip the
/// descent while the leaf is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafHint {
    leaf: u64,
    version: u64,
}

/// The hints of one batch of inserts (a transaction's, published at its commit), followed from
/// insert to insert: each lookup read its leaf before any of them was published, so the hints of
/// keys bound for one leaf name the same version, which the batch's first insert there moves on.
/// The chain remembers that move, so the next insert into that leaf still takes the shortcut when
/// nobody else changed the leaf in between (TPC-C New-Order's order lines share a leaf).
#[derive(Clone, Copy, Debug, Default)]
pub struct HintChain {
    /// (hint as the lookups observed it, the version this batch's own inserts left).
    moved: Option<(LeafHint, LeafHint)>,
}

impl HintChain {
    /// The hint to use for an insert whose lookup observed `observed`.
    #[inline]
    pub fn current(&self, observed: LeafHint) -> LeafHint {
        match self.moved {
            Some((from, to)) if from == observed => to,
            _ => observed,
        }
    }

    /// Records that the insert that observed `observed` left its leaf at `after`.
    #[inline]
    pub fn advance(&mut self, observed: LeafHint, after: Option<LeafHint>) {
        if let Some(after) = after {
            self.moved = Some((observed, after));
        }
    }
}

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

/// A concurrent ordered map from `W`-word keys (compared word by word) to 8-byte values, with
/// ascending and descending scans: a B+-tree with optimistic lock coupling (see the module
/// documentation).
///
/// Point reads and scans take no lock and write nothing shared. Every mutation locks the one leaf
/// it changes (plus a parent when a node splits or an empty leaf is unlinked), so conditional
/// mutations (`insert_new`, `remove_if`, `replace_if`) are atomic with respect to every other
/// operation on the same key.
pub(super) struct BTree<const W: usize> {
    arena: Arena<W>,
    root: AtomicU64,
    counts: Box<[Stripe]>,
}

impl<const W: usize> BTree<W> {
    /// Creates an empty index: one empty leaf.
    pub(super) fn new() -> Self {
        let arena = Arena::new();
        let (root, node) = arena.alloc();
        node.set_meta(true, 0);
        Self {
            arena,
            root: AtomicU64::new(root),
            counts: (0..COUNT_STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    /// Builds a tree of `entries`, whose keys must be strictly ascending, bottom up (FIR §4.4.2:
    /// leaves filled in key order, each inner level built over the one below): O(n), no
    /// descent, split or lock per key. Leaves are full (as ascending inserts leave them), and
    /// each level's nodes share its children evenly, so no inner node is left with a single
    /// child. Returns the first key that is not above its predecessor as the error.
    pub(super) fn from_sorted(
        entries: impl IntoIterator<Item = ([u64; W], u64)>,
    ) -> Result<Self, [u64; W]> {
        let tree = Self::new();
        // The level being built: (node id, its smallest key), in key order.
        let mut level: Vec<(u64, [u64; W])> = Vec::new();
        let mut leaf: Option<(u64, &Node<W>, usize)> = None;
        let mut last: Option<[u64; W]> = None;
        for (key, value) in entries {
            if last.is_some_and(|l| l >= key) {
                return Err(key);
            }
            last = Some(key);
            let (id, node, count) = match leaf {
                Some(open) if open.2 < CAP => open,
                _ => {
                    if let Some((id, node, count)) = leaf {
                        node.set_meta(true, count);
                        tree.add_count(id, count as i64);
                    }
                    // The empty root leaf of `new` is the first leaf.
                    let (id, node) = if level.is_empty() {
                        let id = tree.root.load(Ordering::Relaxed);
                        (id, tree.arena.get(id).expect("the root exists"))
                    } else {
                        tree.arena.alloc()
                    };
                    level.push((id, key));
                    (id, node, 0)
                }
            };
            node.set_key(count, key);
            node.slots[count].store(value, Ordering::Relaxed);
            leaf = Some((id, node, count + 1));
        }
        if let Some((id, node, count)) = leaf {
            node.set_meta(true, count);
            tree.add_count(id, count as i64);
        }
        while level.len() > 1 {
            let parents = level.len().div_ceil(CAP + 1);
            let mut above = Vec::with_capacity(parents);
            for p in 0..parents {
                let children = &level[level.len() * p / parents..level.len() * (p + 1) / parents];
                let (id, node) = tree.arena.alloc();
                for (i, &(child, first)) in children.iter().enumerate() {
                    node.slots[i].store(child, Ordering::Relaxed);
                    if i > 0 {
                        node.set_key(i - 1, first);
                    }
                }
                node.set_meta(false, children.len() - 1);
                above.push((id, children[0].1));
            }
            level = above;
        }
        if let Some(&(root, _)) = level.first() {
            // Release: a thread that receives the tree sees every node stored above.
            tree.root.store(root, Ordering::Release);
        }
        Ok(tree)
    }

    /// The root, read-locked, or `None` (restart) if it is locked or was replaced meanwhile.
    #[inline]
    fn read_root(&self) -> Option<(u64, &Node<W>, u64)> {
        let id = self.root.load(Ordering::Acquire);
        let node = self.arena.get(id)?;
        let v = node.read_lock()?;
        (self.root.load(Ordering::Acquire) == id).then_some((id, node, v))
    }

    /// Steps from a validated inner node to its child `child`, read-locked; `None` to restart.
    #[inline]
    fn descend(&self, node: &Node<W>, v: u64, child: usize) -> Option<(u64, &Node<W>, u64)> {
        let id = node.slot(child);
        if !node.validate(v) {
            return None;
        }
        let next = self.arena.get(id)?;
        next.prefetch();
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
    pub(super) fn get(&self, key: [u64; W]) -> Option<u64> {
        // The same descent as an insert's lookup; the hint it also returns costs a register.
        self.get_for_insert(key).0
    }

    /// [`get`](Self::get) for a caller about to insert `key` if it is absent: also returns where
    /// the descent ended (the leaf and the version it was validated at), so that the insert can
    /// go straight to that leaf (`insert_new_at`) instead of descending again.
    #[inline]
    pub(super) fn get_for_insert(&self, key: [u64; W]) -> (Option<u64>, LeafHint) {
        'restart: loop {
            let Some((mut id, mut node, mut v)) = self.read_root() else {
                continue;
            };
            loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = key_count(meta);
                if is_leaf(meta) {
                    let (pos, found) = node.lower_bound(count, key);
                    let value = if found { node.slot(pos) } else { 0 };
                    if !node.validate(v) {
                        continue 'restart;
                    }
                    let hint = LeafHint {
                        leaf: id,
                        version: v,
                    };
                    return (found.then_some(value), hint);
                }
                let child = node.child_index(count, key);
                match self.descend(node, v, child) {
                    Some((next_id, next, nv)) => (id, node, v) = (next_id, next, nv),
                    None => continue 'restart,
                }
            }
        }
    }

    /// [`insert_new`](Self::insert_new) starting at the leaf of `hint`, from
    /// [`get_for_insert`](Self::get_for_insert) (or from an earlier `insert_new_at`). Also returns
    /// the hint this insert leaves behind when it took the shortcut, for the caller's next insert
    /// that observed the same leaf version ([`HintChain`]).
    ///
    /// Why the shortcut is safe: it is taken only if the leaf's version is still exactly the
    /// hint's (the lock is taken by a compare-and-swap from that version). The version moves on
    /// every change under the leaf's lock, and a leaf stops covering a key only through its own
    /// split or unlinking (both locked), whereas a neighbour's split or unlinking only moves the
    /// separators around it or widens its range. So at an unchanged version the leaf still covers
    /// every key it covered when the hint was read, and holds exactly the keys it held then. A
    /// full leaf, or any change since, takes the ordinary descent.
    pub(super) fn insert_new_at(
        &self,
        key: [u64; W],
        addr: u64,
        hint: LeafHint,
    ) -> (Result<(), u64>, Option<LeafHint>) {
        if let Some(node) = self.arena.get(hint.leaf) {
            let meta = node.meta.load(Ordering::Relaxed);
            let count = key_count(meta);
            if is_leaf(meta) && count < CAP && node.upgrade(hint.version) {
                // Locked at the hinted version: `meta` read before the lock is current (a change
                // to it would have moved the version).
                let (pos, found) = node.lower_bound(count, key);
                let outcome =
                    Self::apply(node, count, pos, found, key, &LeafWrite::InsertNew(addr));
                node.unlock();
                if outcome.changed {
                    self.add_count(hint.leaf, 1);
                }
                let after = LeafHint {
                    leaf: hint.leaf,
                    version: Node::<W>::version_after_unlock(hint.version),
                };
                return match outcome.previous {
                    Some(existing) => (Err(existing), Some(after)),
                    None => (Ok(()), Some(after)),
                };
            }
        }
        (self.insert_new(key, addr), None)
    }

    /// Inserts `key → addr` only if `key` is absent; otherwise leaves the index unchanged and
    /// returns the address already stored.
    pub(super) fn insert_new(&self, key: [u64; W], addr: u64) -> Result<(), u64> {
        match self.write(key, LeafWrite::InsertNew(addr)).previous {
            Some(existing) => Err(existing),
            None => Ok(()),
        }
    }

    /// Stores `key → addr` whether or not `key` is present, returning the previous address.
    pub(super) fn upsert(&self, key: [u64; W], addr: u64) -> Option<u64> {
        self.write(key, LeafWrite::Upsert(addr)).previous
    }

    /// Removes `key`, returning its address.
    pub(super) fn remove(&self, key: [u64; W]) -> Option<u64> {
        self.write(key, LeafWrite::Remove(None)).previous
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    ///
    /// Lets a transaction delete the version it saw without clobbering a newer one.
    pub(super) fn remove_if(&self, key: [u64; W], addr: u64) -> bool {
        self.write(key, LeafWrite::Remove(Some(addr))).changed
    }

    /// Replaces the address of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    ///
    /// Out-of-place engines use it to swing a key to a new tuple version, compare-and-swap style.
    pub(super) fn replace_if(&self, key: [u64; W], expected: u64, new: u64) -> bool {
        self.write(key, LeafWrite::Replace { expected, new })
            .changed
    }

    /// Descends to the leaf for `key`, splitting full nodes on the way when the write may insert,
    /// locks the leaf and applies `op`. A leaf emptied by a removal is unlinked afterwards.
    fn write(&self, key: [u64; W], op: LeafWrite) -> WriteOutcome {
        let may_insert = matches!(op, LeafWrite::InsertNew(_) | LeafWrite::Upsert(_));
        'restart: loop {
            let Some((mut id, mut node, mut v)) = self.read_root() else {
                continue;
            };
            let mut parent: Option<Step<'_, W>> = None;
            loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = key_count(meta);
                let leaf = is_leaf(meta);
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
        node: &Node<W>,
        count: usize,
        pos: usize,
        found: bool,
        key: [u64; W],
        op: &LeafWrite,
    ) -> WriteOutcome {
        let previous = found.then(|| node.slot(pos));
        let changed = match (*op, found) {
            (LeafWrite::InsertNew(value) | LeafWrite::Upsert(value), false) => {
                node.shift_keys_right(pos, count);
                node.shift_slots_right(pos, count);
                node.set_key(pos, key);
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
    fn split(&self, parent: Option<Step<'_, W>>, id: u64, node: &Node<W>, v: u64, key: [u64; W]) {
        if let Some(p) = parent {
            if !p.node.upgrade(p.version) {
                return;
            }
            let pcount = key_count(p.node.meta.load(Ordering::Relaxed));
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
        let (count, leaf) = (key_count(meta), is_leaf(meta));
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
                let pcount = key_count(p.node.meta.load(Ordering::Relaxed));
                p.node.shift_keys_right(p.child, pcount);
                p.node.shift_slots_right(p.child + 1, pcount + 1);
                p.node.set_key(p.child, separator);
                p.node.slots[p.child + 1].store(right_id, Ordering::Relaxed);
                p.node.set_meta(false, pcount + 1);
                node.unlock();
                p.node.unlock();
            }
            None => {
                let (root_id, root) = self.arena.alloc();
                root.set_key(0, separator);
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
    fn unlink_empty_leaf(&self, key: [u64; W]) {
        for _attempt in 0..8 {
            let mut path = [None::<Step<'_, W>>; MAX_DEPTH];
            let Some((mut id, mut node, mut v)) = self.read_root() else {
                continue;
            };
            let mut depth = 0;
            let leaf_count = loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = key_count(meta);
                if is_leaf(meta) {
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
                key_count(step.node.meta.load(Ordering::Relaxed)) > 0
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
                for step in path[keep_at..keep_at + locked].iter().flatten() {
                    step.node.unlock();
                }
                continue;
            }
            let keeper = path[keep_at].expect("path step");
            let kcount = key_count(keeper.node.meta.load(Ordering::Relaxed));
            // Child i sits between keys i-1 and i: drop it with the separator on its left (the
            // one on its right for child 0).
            let key_at = keeper.child.saturating_sub(1);
            keeper.node.shift_keys_left(key_at, kcount);
            keeper.node.shift_slots_left(keeper.child, kcount + 1);
            keeper.node.set_meta(false, kcount - 1);
            for step in path[keep_at + 1..depth].iter().flatten() {
                step.node.unlock_obsolete();
                self.arena.release(step.id);
            }
            node.unlock_obsolete();
            self.arena.release(id);
            keeper.node.unlock();
            return;
        }
    }

    /// The entry with the largest key `<= key`, read consistently, copying nothing else (the
    /// PM ordered index's inner-map lookup: one per point operation, so no batch copy as in
    /// [`read_leaf`](Self::read_leaf)).
    pub(super) fn floor(&self, key: [u64; W]) -> Option<([u64; W], u64)> {
        let mut from = key;
        'restart: loop {
            let Some((_, mut node, mut v)) = self.read_root() else {
                continue;
            };
            // The tightest separator at or below the path: the leaf holds keys `>= low`.
            let mut low = None;
            loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = key_count(meta);
                if is_leaf(meta) {
                    let (pos, found) = node.lower_bound(count, from);
                    let end = pos + usize::from(found);
                    let hit = (end > 0).then(|| (node.key(end - 1), node.slot(end - 1)));
                    if !node.validate(v) {
                        continue 'restart;
                    }
                    if hit.is_some() {
                        return hit;
                    }
                    // Nothing at or below `from` here: the answer is in a leaf to the left.
                    match low.and_then(predecessor) {
                        Some(k) => {
                            from = k;
                            continue 'restart;
                        }
                        None => return None,
                    }
                }
                let child = node.child_index(count, from);
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

    /// Copies the entries of the leaf covering `from` that are `>= from` (ascending) or `<= from`
    /// (descending) into `out`, consistently, and returns the key where the next leaf in that
    /// direction starts (`None` at the end of the tree).
    pub(super) fn read_leaf(
        &self,
        from: [u64; W],
        descending: bool,
        out: &mut LeafBatch<W>,
    ) -> Option<[u64; W]> {
        'restart: loop {
            out.clear();
            let Some((_, mut node, mut v)) = self.read_root() else {
                continue;
            };
            // The tightest separators around the path: the leaf holds keys in [low, high).
            let (mut low, mut high) = (None, None);
            loop {
                let meta = node.meta.load(Ordering::Relaxed);
                let count = key_count(meta);
                if is_leaf(meta) {
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
                        low.and_then(predecessor)
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
    pub(super) fn walk(
        &self,
        from: [u64; W],
        descending: bool,
        limit: usize,
        in_range: impl Fn([u64; W]) -> bool,
        mut f: impl FnMut([u64; W], u64) -> bool,
    ) -> usize {
        let mut visited = 0;
        let mut batch = LeafBatch::new();
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
    pub(super) fn len(&self) -> usize {
        let total = self
            .counts
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add);
        // Stripes are read one by one while others move: clamp a transiently negative sum.
        (total as i64).max(0) as usize
    }

    /// DRAM bytes used by the index: every node allocated (linked, or free for reuse) plus the
    /// fixed part.
    pub(super) fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + COUNT_STRIPES * std::mem::size_of::<Stripe>()
            + self.arena.allocated_nodes() * std::mem::size_of::<Node<W>>()
    }
}

/// The largest key below `key` in word-by-word order, if any.
fn predecessor<const W: usize>(mut key: [u64; W]) -> Option<[u64; W]> {
    for word in key.iter_mut().rev() {
        if *word > 0 {
            *word -= 1;
            return Some(key);
        }
        *word = u64::MAX;
    }
    None
}

#[cfg(test)]
impl<const W: usize> BTree<W> {
    /// Checks the tree's shape: keys sorted within and across leaves, inner separators bounding
    /// their children, no node locked or obsolete, the entry counter equal to the entries.
    /// Single-threaded use only.
    pub(super) fn check_invariants(&self) {
        fn walk<const W: usize>(
            tree: &BTree<W>,
            id: u64,
            low: Option<[u64; W]>,
            high: Option<[u64; W]>,
            keys: &mut Vec<[u64; W]>,
        ) {
            let node = tree.arena.get(id).expect("linked node exists");
            let v = node.version.load(Ordering::Relaxed);
            assert_eq!(v & (LOCKED | OBSOLETE), 0, "node {id} locked or obsolete");
            let meta = node.meta.load(Ordering::Relaxed);
            let count = (meta & COUNT_MASK) as usize;
            assert!(count <= CAP);
            for i in 0..count {
                let k = node.key(i);
                assert!(
                    low.map_or(true, |l| k >= l),
                    "key {k:?} below fence {low:?}"
                );
                assert!(
                    high.map_or(true, |h| k < h),
                    "key {k:?} above fence {high:?}"
                );
                if i > 0 {
                    assert!(node.key(i - 1) < k, "keys out of order in node {id}");
                }
            }
            if is_leaf(meta) {
                keys.extend((0..count).map(|i| node.key(i)));
                return;
            }
            for c in 0..=count {
                let lo = if c == 0 { low } else { Some(node.key(c - 1)) };
                let hi = if c == count { high } else { Some(node.key(c)) };
                walk(tree, node.slot(c), lo, hi, keys);
            }
        }
        let mut keys = Vec::new();
        walk(
            self,
            self.root.load(Ordering::Relaxed),
            None,
            None,
            &mut keys,
        );
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(keys.len(), self.len(), "entry counter");
    }
}
