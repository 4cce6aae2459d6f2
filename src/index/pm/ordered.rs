//! [`PmOrderedIndex`]: a persistent ordered u64 → u64 index with range scans, in the spirit of
//! NBTree (Zhang et al., VLDB'22) and FPTree (Oukid et al., SIGMOD'16): leaves in PM, inner nodes
//! in DRAM rebuilt from the leaves at recovery, so recovery costs O(leaves) and never scans the
//! heap (Falcon §4 and §6.5: instant recovery).
//!
//! The design is documented on [`PmOrderedIndex`].

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::alloc::{AllocError, PageManager, PageTag, PAGE_SIZE};
use crate::index::btree::BTree;
use crate::index::mix64;

use super::seqlock;
use crate::pmem::Pool;

/// Entries per leaf: one bit each in the 8-byte bitmap (the low 32), one fingerprint byte each.
const CAPACITY: usize = 32;
/// The bitmap bits of real entries.
const FULL_MASK: u64 = (1 << CAPACITY) - 1;
/// The header line of a leaf.
const HEADER: u64 = 64;
/// One (key, value) entry.
const ENTRY: u64 = 16;
/// Bytes per leaf.
const LEAF_SIZE: u64 = HEADER + CAPACITY as u64 * ENTRY;
/// Leaf slots in a 2 MiB page.
const MAX_LEAVES_PER_PAGE: u64 = PAGE_SIZE / LEAF_SIZE;

// Leaf header words.
const BITMAP: u64 = 0;
const NEXT: u64 = 8;
const LOW: u64 = 16;
const STATE: u64 = 24;
const FINGERPRINTS: u64 = 32;
/// The upper half of a leaf's state word ("PMOL"): tells a leaf from garbage at recovery.
const LEAF_MAGIC: u64 = 0x504D_4F4C;
const STATE_CLEAN: u64 = LEAF_MAGIC << 32;

// Index header words (at the root, the first leaf slot of the root page).
const INDEX_MAGIC: u64 = u64::from_le_bytes(*b"PMOIDX01");
const H_MAGIC: u64 = 0;
const H_TAG: u64 = 8;
const H_FIRST: u64 = 16;
const H_LEAF_SIZE: u64 = 24;
const H_LEAVES_PER_PAGE: u64 = 32;

/// Directory of per-leaf DRAM metadata: `DIR_FANOUT` chunks of `DIR_FANOUT` pages, indexed by
/// the pool's page index (enough for the largest page table).
const DIR_FANOUT: usize = 512;
/// Stripes of the entry counter.
const COUNT_STRIPES: usize = 8;

/// Errors of the persistent ordered index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PmOrderedError {
    /// The page manager could not provide a page: [`AllocError::PmFull`] when PM is full, or
    /// damage in its page table.
    #[error("persistent ordered index: {0}")]
    Alloc(#[from] AllocError),
    /// The index found at recovery is damaged: nothing was changed.
    #[error("persistent ordered index at {root:#x} is corrupt: {detail}")]
    Corrupt {
        /// The root offset given to recovery.
        root: u64,
        /// What is wrong.
        detail: String,
    },
    /// `create` was given a tag whose pages exist already (recovery frees every page of the tag
    /// not linked into the index, so two structures must never share one).
    #[error("page tag {0:?} already owns pages: each persistent index needs a tag of its own")]
    TagInUse(PageTag),
    /// An invalid argument to `create`.
    #[error("persistent ordered index: {0}")]
    InvalidArgument(String),
}

impl PmOrderedError {
    /// Whether the error is PM being full (an insert needed a new page and none was left).
    pub fn is_pm_full(&self) -> bool {
        matches!(self, PmOrderedError::Alloc(AllocError::PmFull { .. }))
    }
}

/// What [`PmOrderedIndex::recover`] did and found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OrderedRecoveryStats {
    /// Leaves on the chain.
    pub leaves: u64,
    /// Entries (set bits) counted.
    pub entries: u64,
    /// Pages the index owns after recovery.
    pub pages: u64,
    /// Pages of the tag holding no linked leaf, freed.
    pub pages_reclaimed: u64,
    /// Interrupted splits whose link was durable, finished.
    pub splits_finished: u64,
    /// Interrupted splits whose link was not durable, undone.
    pub splits_undone: u64,
    /// Wall time of the recovery.
    #[serde(serialize_with = "micros")]
    pub elapsed: Duration,
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

/// The DRAM side of one leaf: its version (bit 0: a writer holds it), its high key (the `low`
/// of the next leaf; meaningless for the last leaf) and whether it was unlinked from the chain.
#[derive(Default)]
struct LeafMeta {
    /// The leaf's seqlock (`seqlock.rs`).
    version: crate::index::sync::AtomicU64,
    high: AtomicU64,
    /// Set (under the leaf's lock) when an emptied leaf leaves the chain; a reader or writer
    /// that reaches it through a stale inner-map entry or `next` starts over from the map.
    /// Cleared when a split reuses the slot.
    unlinked: AtomicBool,
}

impl LeafMeta {
    /// The version if no writer holds the leaf; `None`: spin and try again.
    #[inline]
    fn read_begin(&self) -> Option<u64> {
        let v = seqlock::read_begin(&self.version);
        if v & 1 == 0 {
            Some(v)
        } else {
            std::hint::spin_loop();
            None
        }
    }

    /// Whether nothing changed since `read_begin` returned `v` (seqlock reader).
    #[inline]
    fn validate(&self, v: u64) -> bool {
        seqlock::read_validate(&self.version, v)
    }

    fn lock(&self) -> LeafGuard<'_> {
        loop {
            let v = self.version.load(Ordering::Relaxed);
            if v & 1 == 0
                && self
                    .version
                    .compare_exchange_weak(v, v | 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // Seqlock writer: a reader that sees any store made under the lock sees the
                // locked version when it validates.
                seqlock::write_begun();
                return LeafGuard { meta: self };
            }
            std::hint::spin_loop();
        }
    }
}

/// A locked leaf; unlocking moves the version on.
struct LeafGuard<'a> {
    meta: &'a LeafMeta,
}

impl Drop for LeafGuard<'_> {
    fn drop(&mut self) {
        self.meta.version.fetch_add(1, Ordering::Release);
    }
}

type DirChunk = Box<[OnceLock<Box<[LeafMeta]>>]>;

/// Free leaf slots (DRAM only: rebuilt at recovery from the slots not on the chain).
struct Slots {
    free: Vec<u64>,
    pages: u64,
}

/// What a write does to the leaf covering its key.
#[derive(Clone, Copy)]
enum Op {
    InsertNew(u64),
    Upsert(u64),
    Remove(Option<u64>),
    Replace { expected: u64, new: u64 },
}

/// A persistent, concurrent ordered map from an 8-byte key to an 8-byte value (a tuple address),
/// with ascending and descending range scans. The API mirrors
/// [`OrderedIndex`](crate::index::OrderedIndex), except that operations that may need a new leaf
/// (`insert_new`, `upsert`) return an error when PM is full.
///
/// # Leaf layout (576 bytes, 9 cache lines, carved from 2 MiB pages of the page manager)
///
/// | bytes   | field                                                                     |
/// | ------- | ------------------------------------------------------------------------- |
/// | 0..8    | validity bitmap: bit `i` set ⇔ entry `i` holds a live key                |
/// | 8..16   | `next`: the pool offset of the next leaf in key order (0: the last leaf)  |
/// | 16..24  | `low`: the smallest key the leaf may hold; immutable once linked          |
/// | 24..32  | state: a 32-bit leaf magic, and the mask of entries a split is moving out |
/// | 32..64  | one fingerprint byte per entry (a hash of its key)                        |
/// | 64..576 | 32 entries of (key, value), unsorted                                      |
///
/// A lookup reads two PM cache lines beyond the DRAM descent: the header line (bitmap and
/// fingerprints) and the line of the one entry whose fingerprint matches (FPTree §4.1).
///
/// The root page starts with the index header (magic, tag, first leaf, format) in its first leaf
/// slot; the first leaf (low key 0) follows it and is never moved, so the chain always starts
/// there. [`PmOrderedIndex::root`] is the header's offset.
///
/// # Persistence (ADR: flush + fence; eADR: store order only)
///
/// `pool.persist` is flush + fence under ADR and a compiler fence under eADR, where stores persist
/// in program order; commit words are stored with `write_u64_ordered`. Every single-key
/// operation is atomic with respect to a power failure:
///
/// - **insert**: write the entry (key, value) in a free slot and its fingerprint, persist the
///   entry's line, then set the slot's bit with one 8-byte store and persist it. The fingerprint
///   lies in the bitmap's line and is stored first, so it is durable whenever the bit is (a line
///   reaches PM as a whole, in program order).
/// - **remove**: clear the bit (one store), persist.
/// - **update** (`upsert` of a present key, `replace_if`): store the value word, persist.
/// - **split** of a full leaf L into L and a new leaf N (FPTree/NBTree: the new leaf is written
///   fully before one atomic pointer store publishes it): (1) write N completely (the upper half
///   of L's entries, bitmap, `next` = L's next, `low` = the split key) and persist it; (2) store
///   the mask of the moving entries in L's state word, then L's `next` = N, persist (both in L's
///   header line, so the mask is durable whenever the link is); (3) clear the moved bits in L's
///   bitmap, then clear the mask, persist. Recovery finds a leaf whose mask is set and decides by
///   one comparison whether the link was made: L's next leaf's `low` is at most the key of a moved
///   entry only when that next leaf is N (L's old successor starts above every key of L). Linked:
///   recovery clears the moved bits (finishing the split); not linked: it clears the mask (N was
///   never reachable: undone). Either way every key is in exactly one leaf. A split that moves
///   nothing (the new key lies above every key of L: an append, which then fills leaves
///   completely) only links an empty N.
///
/// # Concurrency
///
/// Each leaf has a version word in DRAM (bit 0: locked), so PM holds no lock to reset at
/// recovery. Readers take no lock: they read the version, the leaf, and validate the version.
/// Writers lock the one leaf they change; a split happens under the leaf's lock. Leaves are never
/// merged, and a linked leaf's `low` never changes, so whatever linked leaf the DRAM inner map
/// returns for a key covers it or precedes the one that does: operations move right along `next`
/// while the key is at or above the leaf's high key (a B-link tree, Lehman and Yao), so a reader
/// never restarts because of a split. An emptied leaf is unlinked under its predecessor's lock and
/// its own, then marked in DRAM; a reader or writer that reaches a marked leaf, or a reused slot
/// starting above its key, starts over from the inner map (which no longer holds the leaf).
///
/// The inner nodes are the crate's DRAM B+-tree (`index::btree`, optimistic lock coupling)
/// mapping each leaf's `low` to its offset; a split adds one separator after the leaf is linked.
///
/// # Recovery
///
/// [`PmOrderedIndex::recover`] walks the leaf chain from the root, reading each leaf's header
/// line (bitmap, next, low, state): it validates every offset against the pages the index's tag
/// owns (a corrupt chain is an error, as are a cycle and low keys out of order), finishes or
/// undoes an interrupted split, counts the set bits (`len`), rebuilds the inner map, puts the
/// leaf slots not on the chain on the free list, and frees pages of the tag that hold no linked
/// leaf (allocated just before a crash). Cost: one PM line per leaf plus one inner-map insert per
/// leaf; no key is read.
///
/// # Departures from NBTree
///
/// - Writers lock a leaf (a DRAM version word, optimistic readers) instead of NBTree's lock-free
///   CAS protocol on PM words; readers are lock-free, as in NBTree.
/// - Inner nodes are always in DRAM and rebuilt eagerly at recovery (NBTree can keep them in PM
///   and rebuild lazily); the rebuild is O(leaves).
/// - Underfull leaves are not merged, but an emptied leaf leaves the chain (`unlink_if_empty`:
///   one persisted store of its predecessor's `next`), so a queue-like workload (TPC-C
///   NEW-ORDER) leaves no trail of empty leaves for scans to walk over, and the slot is reused.
/// - A split records its moving entries in the leaf's state word (a micro-log in the header line)
///   so that recovery can finish it without reading keys.
pub struct PmOrderedIndex {
    pool: Arc<Pool>,
    pages: Arc<PageManager>,
    tag: PageTag,
    root: u64,
    first_leaf: u64,
    leaves_per_page: u64,
    /// `low` → leaf offset for every leaf.
    inner: BTree<1>,
    directory: Box<[OnceLock<DirChunk>]>,
    slots: Mutex<Slots>,
    counts: Box<[CachePadded<AtomicI64>]>,
}

impl PmOrderedIndex {
    /// Entries per leaf.
    pub const LEAF_CAPACITY: usize = CAPACITY;
    /// Bytes per leaf.
    pub const LEAF_BYTES: u64 = LEAF_SIZE;

    /// Creates an empty index whose pages carry `tag` (which must own no page yet: recovery
    /// reclaims every page of the tag that the index does not link). Returns once the index is
    /// durable; the caller then records [`root`](Self::root) (e.g. in its meta page). A crash in
    /// between leaves a page of the tag that no one refers to: the caller frees the pages of a
    /// tag it has no root for.
    pub fn create(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        tag: PageTag,
    ) -> Result<Self, PmOrderedError> {
        Self::create_with_leaves_per_page(pool, pages, tag, MAX_LEAVES_PER_PAGE)
    }

    /// [`create`](Self::create), carving only `leaves_per_page` leaves from each page (at least
    /// 2: the root page holds the header and the first leaf), so that tests reach page allocation
    /// after a few splits. Recorded in the header, so recovery carves the same way.
    #[doc(hidden)]
    pub fn create_with_leaves_per_page(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        tag: PageTag,
        leaves_per_page: u64,
    ) -> Result<Self, PmOrderedError> {
        if !(2..=MAX_LEAVES_PER_PAGE).contains(&leaves_per_page) {
            return Err(PmOrderedError::InvalidArgument(format!(
                "{leaves_per_page} leaves per page: expected 2..={MAX_LEAVES_PER_PAGE}"
            )));
        }
        if pages.allocated(&pool)?.iter().any(|&(_, t)| t == tag) {
            return Err(PmOrderedError::TagInUse(tag));
        }
        let page = pages.allocate(&pool, tag)?;
        let root = pages.page_offset(page);
        let first = root + LEAF_SIZE;
        // The page is all zero: the first leaf needs only its state word; then the header, its
        // magic last, so a crash leaves either no index or a complete one.
        pool.write_u64(first + STATE, STATE_CLEAN);
        pool.persist(first, HEADER);
        pool.write_u64(root + H_TAG, encode_tag(tag));
        pool.write_u64(root + H_FIRST, first);
        pool.write_u64(root + H_LEAF_SIZE, LEAF_SIZE);
        pool.write_u64(root + H_LEAVES_PER_PAGE, leaves_per_page);
        pool.persist(root, HEADER);
        pool.write_u64_ordered(root + H_MAGIC, INDEX_MAGIC);
        pool.persist(root + H_MAGIC, 8);
        let index = Self::assemble(pool, pages, tag, root, leaves_per_page);
        index.register_page(page);
        {
            let mut slots = index.slots.lock();
            slots.pages = 1;
            slots.free = (2..leaves_per_page)
                .rev()
                .map(|s| root + s * LEAF_SIZE)
                .collect();
        }
        let _ = index.inner.insert_new([0], first);
        Ok(index)
    }

    fn assemble(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        tag: PageTag,
        root: u64,
        leaves_per_page: u64,
    ) -> Self {
        let max_pages = PageManager::pages_for(PageManager::max_pool_size()) as usize;
        Self {
            pool,
            pages,
            tag,
            root,
            first_leaf: root + LEAF_SIZE,
            leaves_per_page,
            inner: BTree::new(),
            directory: (0..max_pages.div_ceil(DIR_FANOUT))
                .map(|_| OnceLock::new())
                .collect(),
            slots: Mutex::new(Slots {
                free: Vec::new(),
                pages: 0,
            }),
            counts: (0..COUNT_STRIPES)
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
        }
    }

    /// Recovers the index whose header is at `root` (what [`root`](Self::root) returned): walks
    /// the leaf chain (one PM line per leaf), finishes or undoes an interrupted split, rebuilds
    /// the DRAM inner nodes and free slots, and frees the tag's pages that hold no linked leaf.
    /// A damaged header or chain (an offset outside the tag's pages, a cycle, keys out of order)
    /// is refused with [`PmOrderedError::Corrupt`] before anything is written.
    pub fn recover(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        root: u64,
    ) -> Result<(Self, OrderedRecoveryStats), PmOrderedError> {
        let started = Instant::now();
        let corrupt = |detail: String| PmOrderedError::Corrupt { root, detail };
        let root_page = pages
            .page_of(root)
            .filter(|_| root % PAGE_SIZE == 0)
            .ok_or_else(|| corrupt("the root is not the start of a page of the pool".into()))?;
        if pool.read_u64(root + H_MAGIC) != INDEX_MAGIC {
            return Err(corrupt("no index header at the root".into()));
        }
        let tag = decode_tag(pool.read_u64(root + H_TAG))
            .ok_or_else(|| corrupt("the header's page tag is invalid".into()))?;
        if pool.read_u64(root + H_LEAF_SIZE) != LEAF_SIZE {
            return Err(corrupt(format!(
                "leaf size {} in the header, expected {LEAF_SIZE}",
                pool.read_u64(root + H_LEAF_SIZE)
            )));
        }
        let leaves_per_page = pool.read_u64(root + H_LEAVES_PER_PAGE);
        if !(2..=MAX_LEAVES_PER_PAGE).contains(&leaves_per_page) {
            return Err(corrupt(format!(
                "{leaves_per_page} leaves per page in the header"
            )));
        }
        let first = pool.read_u64(root + H_FIRST);
        if first != root + LEAF_SIZE {
            return Err(corrupt(format!("first leaf at {first:#x}")));
        }
        let owned: Vec<u64> = pages
            .allocated(&pool)?
            .into_iter()
            .filter(|&(_, t)| t == tag)
            .map(|(page, _)| page)
            .collect();
        if owned.binary_search(&root_page).is_err() {
            return Err(corrupt(format!(
                "the root page {root_page} is not tagged {tag:?}"
            )));
        }
        let layout = ChainLayout {
            pages: &pages,
            owned: &owned,
            root,
            leaves_per_page,
        };

        // Pass 1, read only: validate the whole chain before writing anything.
        let mut visited = vec![0u64; (owned.len() * leaves_per_page as usize).div_ceil(64)];
        let mut chain: Vec<(u64, u64)> = Vec::new();
        let mut leaf = first;
        loop {
            let bit = layout.position(leaf).map_err(&corrupt)?;
            if visited[bit / 64] & (1 << (bit % 64)) != 0 {
                return Err(corrupt(format!("the leaf chain loops at {leaf:#x}")));
            }
            visited[bit / 64] |= 1 << (bit % 64);
            let state = pool.read_u64(leaf + STATE);
            if state >> 32 != LEAF_MAGIC {
                return Err(corrupt(format!(
                    "no leaf at {leaf:#x} (state word {state:#x})"
                )));
            }
            let low = pool.read_u64(leaf + LOW);
            match chain.last() {
                None if low != 0 => {
                    return Err(corrupt(format!("the first leaf's low key is {low}")))
                }
                Some(&(prev, _)) if low <= prev => {
                    return Err(corrupt(format!(
                        "leaf {leaf:#x} starts at key {low}, not above its predecessor's {prev}"
                    )))
                }
                _ => {}
            }
            let bitmap = pool.read_u64(leaf + BITMAP);
            if bitmap & !FULL_MASK != 0 {
                return Err(corrupt(format!("leaf {leaf:#x} has bitmap {bitmap:#x}")));
            }
            chain.push((low, leaf));
            match pool.read_u64(leaf + NEXT) {
                0 => break,
                next => leaf = next,
            }
        }

        // Pass 2: interrupted splits. The chain is valid, so a leaf's next is a checked leaf.
        let mut stats = OrderedRecoveryStats {
            leaves: chain.len() as u64,
            ..OrderedRecoveryStats::default()
        };
        for (i, &(_, leaf)) in chain.iter().enumerate() {
            let moving = pool.read_u64(leaf + STATE) & FULL_MASK;
            let mut bitmap = pool.read_u64(leaf + BITMAP);
            if moving != 0 {
                let moved_key = pool.read_u64(entry_at(leaf, moving.trailing_zeros() as u64));
                // L's old successor starts above every key of L; the new leaf starts at the
                // smallest moved key.
                let linked = chain.get(i + 1).is_some_and(|&(low, _)| low <= moved_key);
                if linked {
                    bitmap &= !moving;
                    pool.write_u64_ordered(leaf + BITMAP, bitmap);
                    stats.splits_finished += 1;
                } else {
                    stats.splits_undone += 1;
                }
                pool.write_u64_ordered(leaf + STATE, STATE_CLEAN);
                pool.persist(leaf, HEADER);
            }
            stats.entries += u64::from(bitmap.count_ones());
        }

        // DRAM: the per-leaf metadata, the inner map, the free slots; unlinked pages freed.
        let index = Self::assemble(pool, pages, tag, root, leaves_per_page);
        let mut free = Vec::new();
        let mut kept = 0;
        for (i, &page) in owned.iter().enumerate() {
            let base = i * leaves_per_page as usize;
            let used = (base..base + leaves_per_page as usize)
                .any(|bit| visited[bit / 64] & (1 << (bit % 64)) != 0);
            if !used && page != root_page {
                index.pages.free(&index.pool, page);
                stats.pages_reclaimed += 1;
                continue;
            }
            kept += 1;
            index.register_page(page);
            let page_off = index.pages.page_offset(page);
            for slot in (0..leaves_per_page).rev() {
                let bit = base + slot as usize;
                let header_slot = page == root_page && slot == 0;
                if visited[bit / 64] & (1 << (bit % 64)) == 0 && !header_slot {
                    free.push(page_off + slot * LEAF_SIZE);
                }
            }
        }
        for (i, &(low, leaf)) in chain.iter().enumerate() {
            if let Some(&(high, _)) = chain.get(i + 1) {
                index.meta(leaf).high.store(high, Ordering::Relaxed);
            }
            let _ = index.inner.insert_new([low], leaf);
        }
        {
            let mut slots = index.slots.lock();
            slots.free = free;
            slots.pages = kept;
        }
        index.counts[0].store(stats.entries as i64, Ordering::Relaxed);
        stats.pages = kept;
        stats.elapsed = started.elapsed();
        Ok((index, stats))
    }

    /// The offset of the index header: what the caller records to find the index at recovery.
    pub fn root(&self) -> u64 {
        self.root
    }

    /// The tag of the index's pages.
    pub fn tag(&self) -> PageTag {
        self.tag
    }

    // ---- DRAM metadata ----

    fn register_page(&self, page: u64) {
        let chunk = self.directory[page as usize / DIR_FANOUT]
            .get_or_init(|| (0..DIR_FANOUT).map(|_| OnceLock::new()).collect());
        let _ = chunk[page as usize % DIR_FANOUT].set(
            (0..self.leaves_per_page)
                .map(|_| LeafMeta::default())
                .collect(),
        );
    }

    /// The DRAM metadata of a leaf, if `leaf` is a leaf slot of a registered page.
    fn try_meta(&self, leaf: u64) -> Option<&LeafMeta> {
        let page = (leaf / PAGE_SIZE).checked_sub(1)? as usize;
        let slot = ((leaf % PAGE_SIZE) / LEAF_SIZE) as usize;
        self.directory
            .get(page / DIR_FANOUT)?
            .get()?
            .get(page % DIR_FANOUT)?
            .get()?
            .get(slot)
    }

    /// The DRAM metadata of a leaf known to be linked (from the inner map, or a `next` read
    /// under the leaf's validated version or lock).
    fn meta(&self, leaf: u64) -> &LeafMeta {
        self.try_meta(leaf)
            .expect("a linked leaf lies in a registered page")
    }

    fn add_count(&self, leaf: u64, delta: i64) {
        let stripe = (leaf / LEAF_SIZE) as usize % COUNT_STRIPES;
        self.counts[stripe].fetch_add(delta, Ordering::Relaxed);
    }

    /// A free leaf slot, taking a new page when none is left.
    fn alloc_leaf(&self) -> Result<u64, PmOrderedError> {
        let mut slots = self.slots.lock();
        if let Some(leaf) = slots.free.pop() {
            return Ok(leaf);
        }
        let page = self.pages.allocate(&self.pool, self.tag)?;
        self.register_page(page);
        let base = self.pages.page_offset(page);
        slots.pages += 1;
        slots.free = (1..self.leaves_per_page)
            .rev()
            .map(|s| base + s * LEAF_SIZE)
            .collect();
        Ok(base)
    }

    /// Makes sure at least `spare` free leaf slots exist, taking a page if fewer do, so that the
    /// next few splits cannot fail for want of PM. A caller that must not fail after a point of
    /// no return (Falcon's secondary-index inserts after the commit mark) reserves before it.
    /// Not a per-caller reservation: concurrent callers share the spare slots, so callers ask for
    /// a margin well above what all threads together take between two reservations.
    pub fn reserve(&self, spare: usize) -> Result<(), PmOrderedError> {
        let mut slots = self.slots.lock();
        if slots.free.len() >= spare {
            return Ok(());
        }
        let page = self.pages.allocate(&self.pool, self.tag)?;
        self.register_page(page);
        let base = self.pages.page_offset(page);
        slots.pages += 1;
        // Taken from the end: keep the slots already free first, then the new page in order.
        let mut carved: Vec<u64> = (0..self.leaves_per_page)
            .rev()
            .map(|s| base + s * LEAF_SIZE)
            .collect();
        carved.append(&mut slots.free);
        slots.free = carved;
        Ok(())
    }

    // ---- finding leaves ----

    /// The leaf with the largest `low` at or below `key` in the inner map: the leaf covering
    /// `key`, or one to its left if a split has not reached the map yet.
    fn locate(&self, key: u64) -> u64 {
        self.inner
            .floor([key])
            .map_or(self.first_leaf, |(_, leaf)| leaf)
    }

    /// Runs `read(leaf)` on the leaf covering `key`, starting at `start` (or the inner map's
    /// guess), inside a validated optimistic section; `read` may see a leaf being changed and
    /// must only read (its result is discarded unless the version held).
    #[inline]
    fn read_covering<R>(&self, key: u64, start: Option<u64>, mut read: impl FnMut(u64) -> R) -> R {
        let mut leaf = start.unwrap_or_else(|| self.locate(key));
        loop {
            let meta = self.meta(leaf);
            let Some(v) = meta.read_begin() else {
                continue;
            };
            if !self.still_covers(leaf, meta, key) {
                if meta.validate(v) {
                    leaf = self.locate(key);
                }
                continue;
            }
            let next = self.pool.read_u64(leaf + NEXT);
            if next != 0 && key >= meta.high.load(Ordering::Relaxed) {
                if meta.validate(v) {
                    leaf = next;
                }
                continue;
            }
            let result = read(leaf);
            if meta.validate(v) {
                return result;
            }
        }
    }

    /// Whether `leaf` may still cover `key` or precede the leaf that does: it is on the chain
    /// (not unlinked) and starts at or below `key` (a slot unlinked and then reused by a split
    /// elsewhere may start above it). Read under the leaf's validated version or its lock.
    #[inline]
    fn still_covers(&self, leaf: u64, meta: &LeafMeta, key: u64) -> bool {
        !meta.unlinked.load(Ordering::Relaxed) && self.pool.read_u64(leaf + LOW) <= key
    }

    /// Locks the leaf covering `key`.
    fn lock_covering(&self, key: u64) -> (u64, LeafGuard<'_>) {
        let mut leaf = self.locate(key);
        loop {
            let meta = self.meta(leaf);
            let guard = meta.lock();
            if !self.still_covers(leaf, meta, key) {
                drop(guard);
                leaf = self.locate(key);
                continue;
            }
            let next = self.pool.read_u64(leaf + NEXT);
            if next != 0 && key >= meta.high.load(Ordering::Relaxed) {
                drop(guard);
                leaf = next;
                continue;
            }
            return (leaf, guard);
        }
    }

    /// The slot of `key` in `leaf` given its `bitmap`, and the value there: fingerprints first,
    /// then the keys of the matching slots only.
    #[inline]
    fn find(&self, leaf: u64, bitmap: u64, key: u64) -> Option<(u64, u64)> {
        let fp = fingerprint(key);
        let mut candidates = 0u64;
        for word in 0..(CAPACITY as u64 / 8) {
            let fps = self.pool.read_u64(leaf + FINGERPRINTS + word * 8);
            for byte in 0..8 {
                if (fps >> (8 * byte)) as u8 == fp {
                    candidates |= 1 << (word * 8 + byte);
                }
            }
        }
        candidates &= bitmap & FULL_MASK;
        while candidates != 0 {
            let slot = u64::from(candidates.trailing_zeros());
            candidates &= candidates - 1;
            let at = entry_at(leaf, slot);
            if self.pool.read_u64(at) == key {
                return Some((slot, self.pool.read_u64(at + 8)));
            }
        }
        None
    }

    // ---- point operations ----

    /// Returns the value stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        self.read_covering(key, None, |leaf| {
            let bitmap = self.pool.read_u64(leaf + BITMAP);
            self.find(leaf, bitmap, key).map(|(_, value)| value)
        })
    }

    /// Starts loading the header line of the leaf covering `key` (its bitmap and fingerprints),
    /// so that a caller that knows its keys can overlap the PM misses.
    pub fn prefetch(&self, key: u64) {
        self.pool.prefetch(self.locate(key), HEADER);
    }

    /// Inserts `key → value` only if `key` is absent (`Ok(Ok(()))`); otherwise leaves the index
    /// unchanged and returns the value already stored (`Ok(Err(existing))`). `Err` only when a
    /// split needed a new page and PM is full (the index is unchanged).
    pub fn insert_new(&self, key: u64, value: u64) -> Result<Result<(), u64>, PmOrderedError> {
        Ok(match self.write(key, Op::InsertNew(value))?.0 {
            Some(existing) => Err(existing),
            None => Ok(()),
        })
    }

    /// Stores `key → value` whether or not `key` is present, returning the previous value. `Err`
    /// only when a split needed a new page and PM is full (the index is unchanged).
    pub fn upsert(&self, key: u64, value: u64) -> Result<Option<u64>, PmOrderedError> {
        Ok(self.write(key, Op::Upsert(value))?.0)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.write_in_place(key, Op::Remove(None)).0
    }

    /// Removes `key` only if it maps to exactly `value`; returns whether it was removed.
    pub fn remove_if(&self, key: u64, value: u64) -> bool {
        self.write_in_place(key, Op::Remove(Some(value))).1
    }

    /// Replaces the value of `key` with `new` only if it currently is `expected`; returns whether
    /// it was replaced. An absent key is never inserted.
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        self.write_in_place(key, Op::Replace { expected, new }).1
    }

    /// A write that never inserts, so never splits nor allocates.
    fn write_in_place(&self, key: u64, op: Op) -> (Option<u64>, bool) {
        self.write(key, op)
            .expect("a write that inserts nothing allocates nothing")
    }

    /// Applies `op` under the lock of the leaf covering `key`; returns the previous value and
    /// whether the index changed.
    fn write(&self, key: u64, op: Op) -> Result<(Option<u64>, bool), PmOrderedError> {
        let pool = &*self.pool;
        loop {
            let (leaf, guard) = self.lock_covering(key);
            let bitmap = pool.read_u64(leaf + BITMAP);
            let found = self.find(leaf, bitmap, key);
            let value_at = |slot| entry_at(leaf, slot) + 8;
            let mut emptied = false;
            let outcome = match (op, found) {
                (Op::InsertNew(_), Some((_, old))) => (Some(old), false),
                (Op::Upsert(value), Some((slot, old))) => {
                    // One 8-byte store: atomic with respect to a power failure.
                    pool.write_u64_ordered(value_at(slot), value);
                    pool.persist(value_at(slot), 8);
                    (Some(old), true)
                }
                (Op::InsertNew(value) | Op::Upsert(value), None) => {
                    let free = !bitmap & FULL_MASK;
                    if free == 0 {
                        self.split(leaf, bitmap, key)?;
                        continue;
                    }
                    self.insert_at(leaf, bitmap, u64::from(free.trailing_zeros()), key, value);
                    self.add_count(leaf, 1);
                    (None, true)
                }
                (Op::Remove(expected), Some((slot, old)))
                    if expected.map_or(true, |e| e == old) =>
                {
                    pool.write_u64_ordered(leaf + BITMAP, bitmap & !(1 << slot));
                    pool.persist(leaf + BITMAP, 8);
                    self.add_count(leaf, -1);
                    emptied = bitmap & !(1 << slot) == 0;
                    (Some(old), true)
                }
                (Op::Replace { expected, new }, Some((slot, old))) if old == expected => {
                    pool.write_u64_ordered(value_at(slot), new);
                    pool.persist(value_at(slot), 8);
                    (Some(old), true)
                }
                (Op::Remove(_) | Op::Replace { .. }, found) => (found.map(|(_, v)| v), false),
            };
            drop(guard);
            if emptied && leaf != self.first_leaf {
                self.unlink_if_empty(leaf);
            }
            return Ok(outcome);
        }
    }

    /// Takes the emptied `leaf` out of the chain, so that a queue-like table (TPC-C NEW-ORDER:
    /// inserts at the high end, removes at the low end) leaves no trail of empty leaves for
    /// scans to walk over and its slots are reused (a departure from NBTree, which merges;
    /// documented on [`PmOrderedIndex`]).
    ///
    /// Locks the predecessor, then the leaf (left to right, the only order in which two leaves
    /// are ever locked), and unlinks it if it is still empty with one persisted 8-byte store of
    /// the predecessor's `next`: atomic with respect to a power failure, after which recovery
    /// finds the slot off the chain and frees it. The predecessor inherits the leaf's range.
    fn unlink_if_empty(&self, leaf: u64) {
        let pool = &*self.pool;
        let low = pool.read_u64(leaf + LOW);
        if low == 0 {
            return;
        }
        let mut prev = self.locate(low - 1);
        let prev_guard = loop {
            let meta = self.meta(prev);
            let guard = meta.lock();
            if meta.unlinked.load(Ordering::Relaxed) {
                drop(guard);
                prev = self.locate(low - 1);
                continue;
            }
            // The predecessor's next is linked while its lock is held (unlinking it needs
            // that lock), so its `low` is stable.
            match pool.read_u64(prev + NEXT) {
                next if next == leaf => break guard,
                next if next != 0 && pool.read_u64(next + LOW) < low => {
                    drop(guard);
                    prev = next;
                }
                // `leaf` is no longer on the chain: another remover unlinked it.
                _ => return,
            }
        };
        let meta = self.meta(leaf);
        let guard = meta.lock();
        if pool.read_u64(leaf + BITMAP) & FULL_MASK != 0 {
            return;
        }
        pool.write_u64_ordered(prev + NEXT, pool.read_u64(leaf + NEXT));
        pool.persist(prev + NEXT, 8);
        self.meta(prev)
            .high
            .store(meta.high.load(Ordering::Relaxed), Ordering::Relaxed);
        // Out of the map before the leaf is marked: a reader that finds the mark (after its
        // version moved) and asks the map again gets the predecessor.
        self.inner.remove_if([low], leaf);
        meta.unlinked.store(true, Ordering::Relaxed);
        drop(guard);
        drop(prev_guard);
        // Durably off the chain (persisted above), so a split may rewrite the slot at once:
        // a reader still holding its offset fails validation (the split locks it) or finds it
        // starting above its key (`still_covers`).
        self.slots.lock().free.push(leaf);
    }

    /// Writes `key → value` into free slot `slot` of the locked `leaf`, then makes it valid.
    fn insert_at(&self, leaf: u64, bitmap: u64, slot: u64, key: u64, value: u64) {
        let pool = &*self.pool;
        let at = entry_at(leaf, slot);
        pool.write_u64(at, key);
        pool.write_u64(at + 8, value);
        self.set_fingerprint(leaf, slot, key);
        // The entry is durable before the bit that makes it valid. The fingerprint shares the
        // bitmap's line and is stored before it, so it is durable whenever the bit is.
        pool.persist(at, ENTRY);
        pool.write_u64_ordered(leaf + BITMAP, bitmap | 1 << slot);
        pool.persist(leaf + BITMAP, 8);
    }

    /// Sets slot `slot`'s fingerprint byte (an 8-byte read-modify-write: only the lock holder
    /// writes a leaf header, and readers load whole words).
    fn set_fingerprint(&self, leaf: u64, slot: u64, key: u64) {
        let word = leaf + FINGERPRINTS + slot / 8 * 8;
        let shift = 8 * (slot % 8);
        let old = self.pool.read_u64(word);
        let new = (old & !(0xff << shift)) | u64::from(fingerprint(key)) << shift;
        self.pool.write_u64(word, new);
    }

    /// Splits the full, locked `leaf` (see the module documentation for the crash-safe order).
    /// Inserting `key` comes next: when it lies above every key of the leaf nothing moves and
    /// the new leaf starts at `key` (appends fill leaves completely).
    fn split(&self, leaf: u64, bitmap: u64, key: u64) -> Result<(), PmOrderedError> {
        let pool = &*self.pool;
        let mut entries: Vec<(u64, u64)> = (0..CAPACITY as u64)
            .filter(|slot| bitmap & (1 << slot) != 0)
            .map(|slot| (pool.read_u64(entry_at(leaf, slot)), slot))
            .collect();
        entries.sort_unstable();
        let max = entries.last().map_or(0, |&(k, _)| k);
        let (split_key, moving): (u64, &[(u64, u64)]) = if key > max {
            (key, &[])
        } else {
            let mid = entries.len() / 2;
            (entries[mid].0, &entries[mid..])
        };
        let new = self.alloc_leaf()?;
        // A reused slot may still be read by an optimistic reader holding its old offset: locked
        // while it is rewritten, so that reader fails validation.
        let new_meta = self.meta(new);
        let new_guard = new_meta.lock();
        new_meta.unlinked.store(false, Ordering::Relaxed);
        let old_next = pool.read_u64(leaf + NEXT);

        // (1) The new leaf, complete and durable before anything refers to it.
        let mut fingerprints = [0u64; CAPACITY / 8];
        for (j, &(k, slot)) in moving.iter().enumerate() {
            let value = pool.read_u64(entry_at(leaf, slot) + 8);
            let at = entry_at(new, j as u64);
            pool.write_u64(at, k);
            pool.write_u64(at + 8, value);
            fingerprints[j / 8] |= u64::from(fingerprint(k)) << (8 * (j % 8));
        }
        for (w, &fps) in fingerprints.iter().enumerate() {
            pool.write_u64(new + FINGERPRINTS + w as u64 * 8, fps);
        }
        pool.write_u64(new + BITMAP, (1u64 << moving.len()) - 1);
        pool.write_u64(new + NEXT, old_next);
        pool.write_u64(new + LOW, split_key);
        pool.write_u64(new + STATE, STATE_CLEAN);
        pool.persist(new, HEADER + moving.len() as u64 * ENTRY);
        let meta = self.meta(leaf);
        new_meta
            .high
            .store(meta.high.load(Ordering::Relaxed), Ordering::Relaxed);

        // (2) Link it, the moving mask first in the same line (durable whenever the link is).
        let moved_mask = moving.iter().fold(0u64, |m, &(_, slot)| m | 1 << slot);
        if moved_mask != 0 {
            pool.write_u64_ordered(leaf + STATE, STATE_CLEAN | moved_mask);
        }
        pool.write_u64_ordered(leaf + NEXT, new);
        pool.persist(leaf, HEADER);

        // (3) Drop the moved entries from the old leaf, then the mask.
        if moved_mask != 0 {
            pool.write_u64_ordered(leaf + BITMAP, bitmap & !moved_mask);
            pool.write_u64_ordered(leaf + STATE, STATE_CLEAN);
            pool.persist(leaf, HEADER);
        }
        meta.high.store(split_key, Ordering::Relaxed);
        let _ = self.inner.insert_new([split_key], new);
        drop(new_guard);
        Ok(())
    }

    // ---- whole-index operations ----

    /// Number of entries.
    pub fn len(&self) -> usize {
        let total: i64 = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        total.max(0) as usize
    }

    /// Whether the index holds no entries.
    pub fn is_empty(&self) -> bool {
        self.first_at_or_after(0).is_none()
    }

    /// Removes every entry (emptied leaves leave the chain; the first one stays).
    pub fn clear(&self) {
        let mut keys = Vec::new();
        self.for_each(|key, _| keys.push(key));
        for key in keys {
            self.remove(key);
        }
    }

    /// Calls `f(key, value)` for every entry in ascending key order. Takes no lock (`f` may
    /// modify the index); not a snapshot: each visited entry was present at some moment of the
    /// walk.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        self.walk_forward(
            0,
            usize::MAX,
            |_| true,
            |k, v| {
                f(k, v);
                true
            },
        );
    }

    /// Visits entries with keys `>= from` in ascending order, calling `f(key, value)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    pub fn scan(&self, from: u64, limit: usize, f: impl FnMut(u64, u64) -> bool) -> usize {
        self.walk_forward(from, limit, |_| true, f)
    }

    /// Visits the entries whose keys fall in `range` in ascending order until `f` returns
    /// `false`; returns the number of calls to `f`. An inverted range visits nothing.
    pub fn scan_range(
        &self,
        range: impl RangeBounds<u64>,
        f: impl FnMut(u64, u64) -> bool,
    ) -> usize {
        let from = match range.start_bound() {
            Bound::Included(&start) => start,
            Bound::Excluded(&u64::MAX) => return 0,
            Bound::Excluded(&start) => start + 1,
            Bound::Unbounded => 0,
        };
        let end = range.end_bound().cloned();
        let in_range = move |key: u64| match end {
            Bound::Included(end) => key <= end,
            Bound::Excluded(end) => key < end,
            Bound::Unbounded => true,
        };
        if !in_range(from) {
            return 0;
        }
        self.walk_forward(from, usize::MAX, in_range, f)
    }

    /// Visits entries with keys `<= upto` in descending order, calling `f(key, value)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    pub fn scan_rev(&self, upto: u64, limit: usize, mut f: impl FnMut(u64, u64) -> bool) -> usize {
        let mut visited = 0;
        let mut batch = Vec::with_capacity(CAPACITY);
        let mut key = upto;
        while visited < limit {
            let leaf = self.snapshot(key, None, &mut batch);
            for &(k, v) in batch.iter().rev().filter(|&&(k, _)| k <= key) {
                if visited >= limit {
                    return visited;
                }
                visited += 1;
                if !f(k, v) {
                    return visited;
                }
            }
            match leaf.low {
                0 => break,
                low => key = low - 1,
            }
        }
        visited
    }

    /// The entry with the smallest key `>= key`.
    pub fn first_at_or_after(&self, key: u64) -> Option<(u64, u64)> {
        crate::index::first_visited(|f| {
            self.scan(key, 1, f);
        })
    }

    /// The entry with the largest key `<= key`.
    pub fn last_at_or_before(&self, key: u64) -> Option<(u64, u64)> {
        crate::index::first_visited(|f| {
            self.scan_rev(key, 1, f);
        })
    }

    /// DRAM bytes used: the inner map, the per-leaf metadata of every page, the directory and
    /// the free-slot list (the leaves themselves are in PM).
    pub fn memory_bytes(&self) -> usize {
        let slots = self.slots.lock();
        let chunks = self.directory.iter().filter(|c| c.get().is_some()).count();
        std::mem::size_of::<Self>()
            + self.inner.memory_bytes()
            + self.directory.len() * std::mem::size_of::<OnceLock<DirChunk>>()
            + chunks * DIR_FANOUT * std::mem::size_of::<OnceLock<Box<[LeafMeta]>>>()
            + slots.pages as usize * self.leaves_per_page as usize * std::mem::size_of::<LeafMeta>()
            + slots.free.capacity() * 8
            + COUNT_STRIPES * std::mem::size_of::<CachePadded<AtomicI64>>()
    }

    /// PM bytes the index owns (its pages).
    pub fn pm_bytes(&self) -> u64 {
        self.slots.lock().pages * PAGE_SIZE
    }

    /// Visits entries `>= from` in ascending order while `in_range` holds, a leaf at a time.
    fn walk_forward(
        &self,
        from: u64,
        limit: usize,
        in_range: impl Fn(u64) -> bool,
        mut f: impl FnMut(u64, u64) -> bool,
    ) -> usize {
        let mut visited = 0;
        let mut batch = Vec::with_capacity(CAPACITY);
        let (mut key, mut start) = (from, None);
        while visited < limit {
            let leaf = self.snapshot(key, start, &mut batch);
            for &(k, v) in batch.iter().filter(|&&(k, _)| k >= key) {
                if visited >= limit || !in_range(k) {
                    return visited;
                }
                visited += 1;
                if !f(k, v) {
                    return visited;
                }
            }
            if leaf.next == 0 {
                break;
            }
            // The next leaf starts at this one's high key.
            (key, start) = (leaf.high, Some(leaf.next));
        }
        visited
    }

    /// Copies the entries of the leaf covering `key` into `out`, sorted, consistently.
    fn snapshot(&self, key: u64, start: Option<u64>, out: &mut Vec<(u64, u64)>) -> LeafView {
        let view = self.read_covering(key, start, |leaf| {
            out.clear();
            let bitmap = self.pool.read_u64(leaf + BITMAP) & FULL_MASK;
            let mut bits = bitmap;
            while bits != 0 {
                let at = entry_at(leaf, u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
                out.push((self.pool.read_u64(at), self.pool.read_u64(at + 8)));
            }
            LeafView {
                low: self.pool.read_u64(leaf + LOW),
                next: self.pool.read_u64(leaf + NEXT),
                high: self.meta(leaf).high.load(Ordering::Relaxed),
            }
        });
        // Sorted outside the optimistic section. Ascending appends (TPC-C's order lines) fill
        // the slots in key order: most leaves need no sort.
        if !out.windows(2).all(|pair| pair[0].0 <= pair[1].0) {
            out.sort_unstable_by_key(|&(k, _)| k);
        }
        view
    }
}

/// What a scan needs of a leaf besides its entries.
struct LeafView {
    low: u64,
    next: u64,
    high: u64,
}

/// Where recovery may find leaves: the tag's pages, `leaves_per_page` slots each.
struct ChainLayout<'a> {
    pages: &'a PageManager,
    owned: &'a [u64],
    root: u64,
    leaves_per_page: u64,
}

impl ChainLayout<'_> {
    /// The position of leaf `off` among the slots of the owned pages, or why it is not a leaf.
    fn position(&self, off: u64) -> Result<usize, String> {
        let not_leaf = |why: &str| format!("the chain points to {off:#x}, {why}");
        let page = self
            .pages
            .page_of(off)
            .ok_or_else(|| not_leaf("outside the pages of the pool"))?;
        let i = self
            .owned
            .binary_search(&page)
            .map_err(|_| not_leaf("in a page the index does not own"))?;
        let within = off - self.pages.page_offset(page);
        if within % LEAF_SIZE != 0 || within / LEAF_SIZE >= self.leaves_per_page || off == self.root
        {
            return Err(not_leaf("not a leaf slot"));
        }
        Ok(i * self.leaves_per_page as usize + (within / LEAF_SIZE) as usize)
    }
}

/// The offset of entry `slot` of `leaf`.
#[inline]
fn entry_at(leaf: u64, slot: u64) -> u64 {
    leaf + HEADER + slot * ENTRY
}

/// A key's fingerprint byte.
#[inline]
fn fingerprint(key: u64) -> u8 {
    (mix64(key) >> 56) as u8
}

fn encode_tag(tag: PageTag) -> u64 {
    (u64::from(tag.kind) << 56) | (u64::from(tag.owner) << 48) | tag.value
}

fn decode_tag(word: u64) -> Option<PageTag> {
    let tag = PageTag {
        kind: (word >> 56) as u8,
        owner: (word >> 48) as u8,
        value: word & ((1 << 48) - 1),
    };
    (tag.kind != 0 && tag.value < 1 << 32).then_some(tag)
}

// Summarise instead of printing every entry.
impl fmt::Debug for PmOrderedIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmOrderedIndex")
            .field("root", &self.root)
            .field("tag", &self.tag)
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::{PersistenceDomain, PoolOptions};

    const TAG: PageTag = PageTag {
        kind: 9,
        owner: 1,
        value: 3,
    };

    /// An index of 300 keys over ~15 leaves in pages of 8 leaves, its pool and page manager.
    fn built() -> (Arc<Pool>, Arc<PageManager>, u64) {
        let opts = PoolOptions::new("pmord", PersistenceDomain::Adr).with_counting(false);
        let pool = Arc::new(Pool::create_in_memory(16 << 20, &opts).unwrap());
        let pages = Arc::new(PageManager::format(&pool).unwrap());
        let index =
            PmOrderedIndex::create_with_leaves_per_page(pool.clone(), pages.clone(), TAG, 8)
                .unwrap();
        for k in 0..300 {
            index.insert_new(k * 7 % 1000, k).unwrap().unwrap();
        }
        (pool, pages, index.root())
    }

    fn chain(pool: &Pool, root: u64) -> Vec<u64> {
        let mut leaves = vec![root + LEAF_SIZE];
        while let next @ 1.. = pool.read_u64(leaves.last().unwrap() + NEXT) {
            leaves.push(next);
        }
        leaves
    }

    #[test]
    fn the_index_is_send_and_sync_and_a_lookup_reads_two_pm_lines() {
        fn shared<T: Send + Sync>() {}
        shared::<PmOrderedIndex>();
        // The header line holds the bitmap, the link and every fingerprint; an entry never
        // straddles a line.
        assert!(FINGERPRINTS + CAPACITY as u64 <= HEADER && HEADER == 64);
        assert_eq!(64 % ENTRY, 0);
        assert_eq!(LEAF_SIZE % 64, 0);
    }

    #[test]
    fn a_corrupt_root_or_leaf_chain_is_refused_without_writing() {
        let (pool, pages, root) = built();
        let leaves = chain(&pool, root);
        assert!(leaves.len() >= 10, "{} leaves", leaves.len());
        let (a, b, last) = (leaves[1], leaves[2], *leaves.last().unwrap());
        let other_page = pages.allocate(&pool, PageTag { value: 4, ..TAG }).unwrap();
        let foreign = pages.page_offset(other_page) + LEAF_SIZE;
        let cases: Vec<(&str, u64, u64, &str)> = vec![
            ("index magic", root + H_MAGIC, 1, "no index header"),
            (
                "header tag",
                root + H_TAG,
                encode_tag(PageTag { value: 5, ..TAG }),
                "not tagged",
            ),
            ("leaf size", root + H_LEAF_SIZE, 512, "leaf size"),
            ("first leaf", root + H_FIRST, a, "first leaf"),
            (
                "next out of the pool",
                a + NEXT,
                1 << 40,
                "outside the pages",
            ),
            (
                "next into the metadata",
                a + NEXT,
                4096,
                "outside the pages",
            ),
            (
                "next into a foreign page",
                a + NEXT,
                foreign,
                "does not own",
            ),
            ("next misaligned", a + NEXT, b + 8, "not a leaf slot"),
            ("next to the header", a + NEXT, root, "not a leaf slot"),
            ("a cycle", last + NEXT, leaves[0], "loops"),
            ("a cycle to itself", b + NEXT, b, "loops"),
            (
                "low keys out of order",
                b + LOW,
                pool.read_u64(a + LOW),
                "not above",
            ),
            (
                "first low key",
                root + LEAF_SIZE + LOW,
                1,
                "first leaf's low key",
            ),
            ("leaf magic", b + STATE, 0, "no leaf"),
            ("bitmap", b + BITMAP, 1 << 40, "bitmap"),
        ];
        for (what, at, bad, expect) in cases {
            let good = pool.read_u64(at);
            pool.write_u64(at, bad);
            let before = pool.read_vec(0, pool.len() as usize);
            let err = PmOrderedIndex::recover(pool.clone(), pages.clone(), root).unwrap_err();
            assert!(
                matches!(err, PmOrderedError::Corrupt { .. }) && err.to_string().contains(expect),
                "{what}: {err}"
            );
            assert!(
                pool.read_vec(0, pool.len() as usize) == before,
                "{what}: recovery wrote to a pool it refused"
            );
            pool.write_u64(at, good);
        }
        for bad_root in [root + 64, 0, 1 << 40, pages.page_offset(other_page)] {
            assert!(PmOrderedIndex::recover(pool.clone(), pages.clone(), bad_root).is_err());
        }
        let (index, stats) = PmOrderedIndex::recover(pool, pages, root).unwrap();
        assert_eq!(stats.leaves as usize, leaves.len());
        assert_eq!(index.len(), 300);
    }

    #[test]
    fn recovery_finishes_a_linked_split_and_undoes_an_unlinked_one() {
        let (pool, pages, root) = built();
        let leaves = chain(&pool, root);
        let i = (0..leaves.len() - 1)
            .find(|&i| pool.read_u64(leaves[i] + BITMAP).count_ones() as usize <= CAPACITY - 2)
            .expect("a leaf with two free slots");
        let (a, b) = (leaves[i], leaves[i + 1]);
        // A split of `a` whose link is durable but whose bits are not cleared yet: its moved
        // entries are copies of `b`'s (same keys, at or above `b`'s low key).
        let bitmap_b = pool.read_u64(b + BITMAP);
        let slots_b: Vec<u64> = (0..CAPACITY as u64)
            .filter(|s| bitmap_b & 1 << s != 0)
            .collect();
        let bitmap_a = pool.read_u64(a + BITMAP);
        let free_a: Vec<u64> = (0..CAPACITY as u64)
            .filter(|s| bitmap_a & 1 << s == 0)
            .take(2)
            .collect();
        let mut mask = 0;
        for (&fa, &sb) in free_a.iter().zip(&slots_b) {
            let key = pool.read_u64(entry_at(b, sb));
            pool.write_u64(entry_at(a, fa), key);
            pool.write_u64(entry_at(a, fa) + 8, u64::MAX);
            mask |= 1 << fa;
        }
        pool.write_u64(a + BITMAP, bitmap_a | mask);
        pool.write_u64(a + STATE, STATE_CLEAN | mask);
        // A split of another leaf that never got linked: its mask names entries that stay.
        let c = leaves[(i + 3) % leaves.len()];
        let bitmap_c = pool.read_u64(c + BITMAP);
        let mask_c = bitmap_c & !(1 << bitmap_c.trailing_zeros()); // all but the lowest slot
        assert_ne!(mask_c, 0);
        pool.write_u64(c + STATE, STATE_CLEAN | mask_c);
        let (index, stats) = PmOrderedIndex::recover(pool.clone(), pages, root).unwrap();
        assert_eq!((stats.splits_finished, stats.splits_undone), (1, 1));
        assert_eq!(index.len(), 300);
        assert_eq!(pool.read_u64(a + BITMAP), bitmap_a);
        assert_eq!(pool.read_u64(c + BITMAP), bitmap_c);
        assert_eq!(pool.read_u64(a + STATE), STATE_CLEAN);
        assert_eq!(pool.read_u64(c + STATE), STATE_CLEAN);
        let mut all = Vec::new();
        index.for_each(|k, v| all.push((k, v)));
        assert_eq!(all.len(), 300);
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(all.iter().all(|&(_, v)| v < 300), "a moved copy survived");
    }
}
