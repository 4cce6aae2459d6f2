//! [`PmHashIndex`]: a u64 → u64 hash index whose buckets live in PM, in the spirit of Dash
//! (Lu et al., "Dash: Scalable Hashing on Persistent Memory", VLDB'20), so that recovery finds it
//! instead of rebuilding it from the heap (Falcon §4 and §6.5: 1.057 ms of Falcon's 3.276 ms
//! recovery is Dash's `Recovery()`).
//!
//! # Layout
//!
//! The index owns 2 MiB pages of the [`PageManager`], all tagged with the [`PageTag`] the caller
//! gives at creation (recovery finds them by that tag). A page is 128 *segment slots* of 16 KiB.
//! Slot 0 of every page holds no segment but the page's *segment table*: from byte 1024, one
//! *state word* per segment slot of the page (a magic, a state `PENDING`/`LIVE`/`LIVE_DIRTY`,
//! the local depth `d` and the pattern: the top `d` bits of the hashes the segment holds; zero:
//! a free slot). Slot 0 of the first page also holds, before its table, the *root* (magic,
//! version, hash seed, tag, geometry, a check, and the recovery epoch), and
//! [`PmHashIndex::root`] is its offset. A segment slot is 64 buckets of 256 bytes:
//!
//! - bucket 0 is the *segment header*: word 1 is the parent segment of a `PENDING` one;
//! - then `buckets_per_segment` (≤ 59) normal buckets and `stash_buckets` (≤ 4) stash buckets.
//!
//! A bucket is four cache lines: word 0 `meta` (bits 0–13: the allocation bitmap of its 14
//! slots; bit 15: *overflow*, "a key whose home is this bucket may be in the stash"), words 1–2
//! fourteen 1-byte fingerprints, word 3 the bucket's version (see below), then 14 key/value
//! pairs. The allocation bitmap alone says which slots are valid, so keys and values may be any
//! u64 (0 included).
//!
//! A key's 64-bit hash (murmur3's finaliser over key ⊕ a per-index seed) picks its segment with
//! its top bits (the directory), its home bucket with its low 32 bits and its fingerprint with
//! bits 32–39. A key lives in its home bucket or, when that is full, in a stash bucket of the
//! same segment (the home bucket's overflow bit is set first); when the stash is full too, the
//! segment splits.
//!
//! # Lookups
//!
//! A lookup reads the DRAM directory and segment handle, then the home bucket's first line
//! (version, bitmap, fingerprints) and, when a fingerprint matches, the line of that slot (none
//! more for slots 0–1, which share the first line): **one or two PM cache lines**, plus the stash
//! buckets' first lines only when the overflow bit is set. Readers write nothing shared: they
//! validate the bucket's version word before and after (a seqlock), and the segment handle's
//! split version.
//!
//! # Crash consistency (ADR and eADR)
//!
//! Every single-key operation becomes durable with one 8-byte store, ordered after the stores it
//! publishes; under ADR the order is made with flushes and fences, under eADR (where every
//! executed store is durable) with [`Pool::write_u64_ordered`] alone, and no flush is issued.
//!
//! - **insert** into slot `i`: store key, value and fingerprint; ADR: flush the pair's line and
//!   fence (skipped for slots 0–1, whose pair shares the `meta` line: a line's stores persist in
//!   order); then the ordered store of `meta | 1 << i`; flush, fence. Into the stash: first set
//!   the home bucket's overflow bit (flushed, covered by the same fence).
//! - **remove**: the ordered store of `meta & !(1 << i)`; flush, fence.
//! - **replace** (`upsert` of a present key, `replace_if`): the ordered store of the value word;
//!   flush, fence. An aligned 8-byte store is never torn: old or new survives.
//! - **split** of segment `S` (depth `d`, pattern `p`) into `S` (`d+1`, `2p`) and a new `N`
//!   (`d+1`, `2p+1`), under `S`'s writer lock: (1) write `N`: its buckets hold the entries of
//!   `S` whose hash bit `63-d` is set, its parent word `S`, then its state word `PENDING`;
//!   flush it all, fence.
//!   (2) *Commit*: `S`'s state word becomes `LIVE_DIRTY (d+1, 2p)`; flush, fence. (3) `N`'s
//!   becomes `LIVE`; flush, fence. (4) Clean `S`: clear the bits of the entries it no longer
//!   covers and recompute its overflow bits; flush, fence. (5) `S` becomes `LIVE`; flush, fence.
//!   Recovery resolves any crash point: a `PENDING` segment whose parent is its sibling
//!   (`LIVE*` at the same depth, pattern differing in the last bit) was committed and becomes
//!   `LIVE`; any other `PENDING` one is discarded (its slot freed); a `LIVE_DIRTY` segment is
//!   cleaned. No key is lost (it is in `S` until the commit, in `N` after) or duplicated (a
//!   dirty `S`'s stale copies are cleared before the index is used).
//! - **new pages**: a page is durably tagged by [`PageManager::allocate`] before any segment in
//!   it is written; recovery finds every page with the tag, so a page allocated just before a
//!   crash is not leaked: its free slots go back to the free list.
//!
//! # Recovery is instant (O(segments), not O(keys))
//!
//! [`PmHashIndex::recover`] validates the root, bumps the persisted *epoch*, lists the index's
//! pages from the page table, reads each page's segment table (1 KiB, contiguous: one 4 KiB
//! OS page of the mapping per 2 MiB of index, where reading a header word per segment touched
//! 128), resolves the few
//! `PENDING`/`LIVE_DIRTY` segments an interrupted split leaves (at most one per writer thread),
//! and rebuilds the directory in DRAM from the live segments' depths and patterns (checking that
//! they tile the hash space exactly). Bucket versions are left as they are: a version word
//! carries the epoch it was written in, and one from an older epoch counts as unlocked version 0
//! (Dash's lazy lock reset, §4.5), so no bucket is touched. Counts are lazy too: each segment's
//! entry count lives in DRAM and is recounted (popcount of its bitmaps) on the first write to the
//! segment or the first [`len`](PmHashIndex::len) after recovery; nothing per operation is
//! persisted for it.
//!
//! # Departures from Dash
//!
//! - The directory is in DRAM, rebuilt at recovery from the segment tables (O(segments), 8
//!   contiguous bytes per segment), rather than persisted: a split then persists two state
//!   words instead of directory entries, directory doubling needs no crash protocol, and a
//!   lookup's directory access is a DRAM hit. Dash persists the directory and recovers in O(1)
//!   plus lazy work; ours reads 1 KiB per 2 MiB page of index (the compact table is what makes
//!   it cheap: the state words used to sit in the segment headers, one per 16 KiB, and each read
//!   touched a page of the mapping: 2.5 ms at a 4 GiB pool).
//! - Keys go to their home bucket or the stash, without Dash's balanced insert into the
//!   neighbour bucket and displacement: a lookup reads one bucket instead of two. The stash
//!   absorbs the imbalance (about 88% load at split with the default geometry), and overflow
//!   bits (one per bucket, instead of Dash's overflow fingerprints) keep negative lookups to the
//!   home bucket. An overflow bit is cleared only when its segment splits.
//! - Writers lock the segment (a DRAM mutex) rather than a bucket: splits and the lazy count
//!   then need no lock ordering; readers still validate per bucket, so they retry only when
//!   their own bucket changes. The version word they validate is in PM, as in Dash.
//! - Segments never merge and pages are never returned to the page manager.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::alloc::{AllocError, PageManager, PageTag, PAGE_SIZE};
use crate::index::mix64;

use super::seqlock::{self, PoolWord};
use crate::pmem::{Pool, PoolError, CACHE_LINE};

/// Bytes of a segment slot.
const SEGMENT_BYTES: u64 = 16 << 10;
/// Segment slots in a page.
const SEGMENTS_PER_PAGE: u64 = PAGE_SIZE / SEGMENT_BYTES;
/// Bytes of a bucket (and of the segment header and root).
const BUCKET_BYTES: u64 = 256;
/// Key/value slots per bucket.
const SLOTS: u32 = 14;
/// Most normal buckets per segment: 64 minus the header and the largest stash.
pub const MAX_BUCKETS_PER_SEGMENT: u32 = 59;
/// Most stash buckets per segment.
pub const MAX_STASH_BUCKETS: u32 = 4;
/// Deepest directory: 2^24 segments of 16 KiB (256 GiB of index). Also keeps the directory bits
/// (the top 24) apart from the fingerprint bits (32–39).
pub const MAX_DEPTH: u32 = 24;
/// Deepest initial directory: its segments must fit in the root page.
const MAX_INITIAL_DEPTH: u32 = 6;

// Bucket words (byte offsets in a bucket).
const META: u64 = 0;
const FINGERPRINTS: u64 = 8;
const VERSION: u64 = 24;
const PAIRS: u64 = 32;
const SLOT_BITS: u64 = (1 << SLOTS) - 1;
const OVERFLOW: u64 = 1 << 15;

// Segment header words. A segment's state word is not in its header but in its page's segment
// table (`state_at`), so that recovery reads one compact table per page, not one line per 16 KiB.
const SEG_PARENT: u64 = 8;
/// The segment table: in slot 0 of every page (which holds no segment), one state word per
/// segment slot of the page, at this byte offset (the root's words come first in the root page).
const TABLE: u64 = 1024;
const SEG_MAGIC: u64 = 0x5347;
const PENDING: u64 = 1;
const LIVE: u64 = 2;
const LIVE_DIRTY: u64 = 3;

// Root words.
const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"PMHASH\0\x01");
/// Version 2: segment state words in per-page segment tables (version 1 had them in the
/// segment headers).
const ROOT_VERSION: u64 = 2;
const R_MAGIC: u64 = 0;
const R_VERSION: u64 = 8;
const R_SEED: u64 = 16;
const R_TAG: u64 = 24;
const R_BUCKETS: u64 = 32;
const R_STASH: u64 = 40;
const R_CHECK: u64 = 48;
/// The recovery epoch: bumped (durably) by every recovery; bucket versions carry it.
const R_EPOCH: u64 = 56;

/// A segment's DRAM count before it is recounted after recovery.
const UNCOUNTED: u64 = u64::MAX;

/// Errors of the persistent hash index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PmHashError {
    /// No page for a new segment (PM full), or the page table refused.
    #[error("persistent hash index: cannot get a page for a new segment: {0}")]
    Alloc(#[from] AllocError),
    /// The root or a segment header read from PM is not a valid index.
    #[error("persistent hash index at offset {root} is corrupt: {reason}")]
    Corrupt {
        /// The root offset given to recovery.
        root: u64,
        /// What is wrong.
        reason: String,
    },
    /// Options outside their documented ranges.
    #[error("invalid persistent hash index options: {0}")]
    InvalidOptions(String),
    /// A segment would split beyond [`MAX_DEPTH`].
    #[error("persistent hash index: a segment reached the maximum depth {MAX_DEPTH} (the hash is badly skewed or the index holds over 2^{MAX_DEPTH} segments)")]
    DepthLimit,
    /// An error of the pool underneath.
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// The geometry of a new index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmHashOptions {
    /// log2 of the segments created at once (0..=6).
    pub initial_depth: u32,
    /// Normal buckets per segment (1..=[`MAX_BUCKETS_PER_SEGMENT`]); fewer make splits come
    /// sooner (tests use that to cross splits in a few operations).
    pub buckets_per_segment: u32,
    /// Stash buckets per segment (0..=[`MAX_STASH_BUCKETS`]).
    pub stash_buckets: u32,
}

impl Default for PmHashOptions {
    /// Four segments of 59 buckets and 4 stash buckets (3,528 slots).
    fn default() -> Self {
        PmHashOptions {
            initial_depth: 2,
            buckets_per_segment: MAX_BUCKETS_PER_SEGMENT,
            stash_buckets: MAX_STASH_BUCKETS,
        }
    }
}

/// What [`PmHashIndex::recover`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PmHashRecoveryStats {
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
    /// Pages the index owns.
    pub pages: usize,
    /// Live segments.
    pub segments: usize,
    /// Free segment slots (in the index's pages).
    pub free_segments: usize,
    /// Splits that had committed but not finished at the crash, completed.
    pub splits_completed: usize,
    /// Splits that had not committed at the crash, discarded.
    pub splits_discarded: usize,
    /// Segments whose stale entries (after a committed split) were cleared.
    pub segments_cleaned: usize,
    /// The directory's depth.
    pub directory_depth: u32,
}

/// A segment's state word: magic, state, depth and pattern.
fn state_word(state: u64, depth: u32, pattern: u64) -> u64 {
    (SEG_MAGIC << 48) | (state << 40) | (u64::from(depth) << 32) | pattern
}

/// The (depth, pattern) pair a DRAM segment handle keeps in one atomic word.
fn shape(depth: u32, pattern: u64) -> u64 {
    (u64::from(depth) << 32) | pattern
}

fn depth_of(shape: u64) -> u32 {
    ((shape >> 32) & 0xff) as u32
}

fn pattern_of(shape: u64) -> u64 {
    shape & 0xffff_ffff
}

/// Whether a segment of `shape` holds hash `h`.
#[inline]
fn covers(shape: u64, h: u64) -> bool {
    let depth = depth_of(shape);
    depth == 0 || h >> (64 - depth) == pattern_of(shape)
}

/// The directory entry of hash `h` at depth `depth`.
#[inline]
fn dir_index(h: u64, depth: u32) -> usize {
    if depth == 0 {
        0
    } else {
        (h >> (64 - depth)) as usize
    }
}

#[inline]
fn fingerprint(h: u64) -> u8 {
    (h >> 32) as u8
}

/// The set slots of a bitmap, lowest first.
fn slots_of(bits: u64) -> impl Iterator<Item = u32> {
    let mut bits = bits & SLOT_BITS;
    std::iter::from_fn(move || {
        (bits != 0).then(|| {
            let slot = bits.trailing_zeros();
            bits &= bits - 1;
            slot
        })
    })
}

fn key_word(bucket: u64, slot: u32) -> u64 {
    bucket + PAIRS + 16 * u64::from(slot)
}

fn line_of(off: u64) -> u64 {
    off & !(CACHE_LINE - 1)
}

/// Where the state word of the segment slot at `offset` lives: its page's segment table.
#[inline]
fn state_at(offset: u64) -> u64 {
    let page = offset & !(PAGE_SIZE - 1);
    page + TABLE + 8 * ((offset - page) / SEGMENT_BYTES)
}

/// A segment's DRAM handle.
struct Segment {
    /// Its slot's offset in the pool.
    offset: u64,
    /// Depth and pattern ([`shape`]); changes only when the segment splits.
    shape: AtomicU64,
    /// Odd while the segment's shape changes and the directory is republished (a seqlock for
    /// readers, who may hold an old directory).
    split_version: crate::index::sync::AtomicU64,
    /// Held by every writer of the segment, including a split.
    writer: Mutex<()>,
    /// Entries, or [`UNCOUNTED`] until recounted after recovery (changed under `writer`).
    count: AtomicU64,
}

impl Segment {
    fn new(offset: u64, depth: u32, pattern: u64, count: u64) -> Segment {
        Segment {
            offset,
            shape: AtomicU64::new(shape(depth, pattern)),
            split_version: crate::index::sync::AtomicU64::new(0),
            writer: Mutex::new(()),
            count: AtomicU64::new(count),
        }
    }
}

/// The DRAM directory: 2^depth entries, the entries of a segment of depth `d` contiguous.
struct Directory {
    depth: u32,
    segments: Vec<Arc<Segment>>,
}

impl Directory {
    #[inline]
    fn segment(&self, h: u64) -> &Arc<Segment> {
        &self.segments[dir_index(h, self.depth)]
    }

    /// Each segment once.
    fn unique(&self) -> impl Iterator<Item = &Arc<Segment>> {
        let mut last: Option<&Arc<Segment>> = None;
        self.segments.iter().filter(move |s| {
            let new = !last.is_some_and(|l| Arc::ptr_eq(l, s));
            last = Some(s);
            new
        })
    }
}

/// Where a key is.
#[derive(Clone, Copy)]
struct Loc {
    bucket: u64,
    slot: u32,
    value: u64,
}

/// A concurrent, crash-consistent u64 → u64 hash index in PM (see the module documentation).
///
/// Every method takes `&self`; single-key operations are atomic with respect to each other and
/// to a power failure: after [`recover`](Self::recover), each one acknowledged (returned) before
/// the crash is present, the one in flight happened wholly or not at all, and nothing else
/// changed.
pub struct PmHashIndex {
    pool: Arc<Pool>,
    pages: Arc<PageManager>,
    tag: PageTag,
    root: u64,
    seed: u64,
    buckets: u32,
    stash: u32,
    /// This run's epoch, in the top 32 bits of every bucket version written in it.
    epoch: u64,
    /// Whether stores must be flushed to be durable (ADR, msync); not under eADR.
    flush: bool,
    dir: ArcSwap<Directory>,
    /// Serialises directory updates (taken after a segment's writer lock, never before).
    dir_lock: Mutex<()>,
    /// Free segment slots in the index's pages.
    free: Mutex<Vec<u64>>,
    /// Splits published so far (lets `for_each` notice one).
    splits: AtomicU64,
    /// Pages the index owns.
    page_count: AtomicU64,
}

impl PmHashIndex {
    /// Creates an empty index with the default geometry in a new page tagged `tag` (every page
    /// with this tag belongs to the index: give it a tag nothing else uses). Store
    /// [`root`](Self::root) durably to find the index again; a crash before that leaves a tagged
    /// page the caller may free.
    pub fn create(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        tag: PageTag,
    ) -> Result<PmHashIndex, PmHashError> {
        Self::create_with(pool, pages, tag, PmHashOptions::default())
    }

    /// Creates an empty index with the geometry `opts` (see [`create`](Self::create)).
    pub fn create_with(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        tag: PageTag,
        opts: PmHashOptions,
    ) -> Result<PmHashIndex, PmHashError> {
        if opts.initial_depth > MAX_INITIAL_DEPTH
            || !(1..=MAX_BUCKETS_PER_SEGMENT).contains(&opts.buckets_per_segment)
            || opts.stash_buckets > MAX_STASH_BUCKETS
        {
            return Err(PmHashError::InvalidOptions(format!(
                "{opts:?}: initial_depth must be at most {MAX_INITIAL_DEPTH}, buckets_per_segment \
                 1..={MAX_BUCKETS_PER_SEGMENT}, stash_buckets at most {MAX_STASH_BUCKETS}"
            )));
        }
        let page = pages.allocate(&pool, tag)?;
        let root = pages.page_offset(page);
        let seed: u64 = rand::random();
        let flush = pool.domain().needs_flush();
        let initial = 1u64 << opts.initial_depth;
        let mut segments = Vec::with_capacity(initial as usize);
        for pattern in 0..initial {
            // A fresh page is all zero: empty buckets, versions of epoch 0 (stale, so unlocked).
            let offset = root + SEGMENT_BYTES * (1 + pattern);
            pool.write_u64(
                state_at(offset),
                state_word(LIVE, opts.initial_depth, pattern),
            );
            segments.push(Arc::new(Segment::new(
                offset,
                opts.initial_depth,
                pattern,
                0,
            )));
        }
        let encoded_tag = encode_tag(tag);
        let epoch = 1u64;
        pool.write_u64(root + R_VERSION, ROOT_VERSION);
        pool.write_u64(root + R_SEED, seed);
        pool.write_u64(root + R_TAG, encoded_tag);
        pool.write_u64(root + R_BUCKETS, u64::from(opts.buckets_per_segment));
        pool.write_u64(root + R_STASH, u64::from(opts.stash_buckets));
        pool.write_u64(
            root + R_CHECK,
            root_check(
                seed,
                encoded_tag,
                opts.buckets_per_segment,
                opts.stash_buckets,
            ),
        );
        pool.write_u64(root + R_EPOCH, epoch);
        // The magic last: a crash before it leaves no index, never a half-made one.
        if flush {
            pool.flush(root, 64);
            pool.flush(state_at(root), 8 * SEGMENTS_PER_PAGE);
            pool.fence();
        }
        pool.write_u64_ordered(root + R_MAGIC, ROOT_MAGIC);
        pool.persist(root, 8);
        let free = (1 + initial..SEGMENTS_PER_PAGE)
            .rev()
            .map(|slot| root + slot * SEGMENT_BYTES)
            .collect();
        Ok(PmHashIndex {
            pool,
            pages,
            tag,
            root,
            seed,
            buckets: opts.buckets_per_segment,
            stash: opts.stash_buckets,
            epoch,
            flush,
            dir: ArcSwap::from_pointee(Directory {
                depth: opts.initial_depth,
                segments,
            }),
            dir_lock: Mutex::new(()),
            free: Mutex::new(free),
            splits: AtomicU64::new(0),
            page_count: AtomicU64::new(1),
        })
    }

    /// The root's offset: what recovery needs.
    pub fn root(&self) -> u64 {
        self.root
    }

    /// The tag of the index's pages.
    pub fn tag(&self) -> PageTag {
        self.tag
    }

    /// Finds the index whose root is at `root` after a restart or crash, in O(segments): see the
    /// module documentation. Refuses, with [`PmHashError::Corrupt`] and without writing, a root
    /// or segment header that is not valid; finishes or discards a split the crash interrupted.
    pub fn recover(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        root: u64,
    ) -> Result<(PmHashIndex, PmHashRecoveryStats), PmHashError> {
        let started = Instant::now();
        let corrupt = |reason: String| PmHashError::Corrupt { root, reason };
        // The root: in a page of the pool, at its start, owned by the tag it records.
        let root_page = pages
            .page_of(root)
            .filter(|_| root % PAGE_SIZE == 0 && pool.check_range(root, BUCKET_BYTES).is_ok())
            .ok_or_else(|| corrupt("the root is not the start of a page of the pool".into()))?;
        let word = |at: u64| pool.read_u64(root + at);
        if word(R_MAGIC) != ROOT_MAGIC {
            return Err(corrupt("no persistent hash index there (bad magic)".into()));
        }
        if word(R_VERSION) != ROOT_VERSION {
            return Err(corrupt(format!(
                "version {}, expected {ROOT_VERSION}",
                word(R_VERSION)
            )));
        }
        let (seed, encoded_tag) = (word(R_SEED), word(R_TAG));
        let (buckets, stash) = (word(R_BUCKETS), word(R_STASH));
        if !(1..=u64::from(MAX_BUCKETS_PER_SEGMENT)).contains(&buckets)
            || stash > u64::from(MAX_STASH_BUCKETS)
        {
            return Err(corrupt(format!(
                "geometry of {buckets} buckets and {stash} stash buckets per segment"
            )));
        }
        let (buckets, stash) = (buckets as u32, stash as u32);
        if word(R_CHECK) != root_check(seed, encoded_tag, buckets, stash) {
            return Err(corrupt("the root fails its check".into()));
        }
        let tag = decode_tag(encoded_tag)
            .ok_or_else(|| corrupt(format!("bad page tag {encoded_tag:#x}")))?;
        if pages.tag(&pool, root_page) != Some(tag) {
            return Err(corrupt(format!(
                "the root's page {root_page} is not tagged {tag:?}"
            )));
        }
        let mine: Vec<u64> = pages
            .allocated(&pool)?
            .into_iter()
            .filter(|&(_, t)| t == tag)
            .map(|(index, _)| pages.page_offset(index))
            .collect();

        // One state word per segment slot, from each page's table (16 lines per 2 MiB page).
        let mut stats = PmHashRecoveryStats {
            pages: mine.len(),
            ..PmHashRecoveryStats::default()
        };
        let mut free = Vec::new();
        let mut live: Vec<(u64, u64)> = Vec::new(); // (offset, state word)
        let mut pending: Vec<(u64, u64, u64)> = Vec::new(); // (offset, state word, parent)
        for &page in &mine {
            for slot in 1..SEGMENTS_PER_PAGE {
                let offset = page + slot * SEGMENT_BYTES;
                let state = pool.read_u64(state_at(offset));
                if state == 0 {
                    free.push(offset);
                    continue;
                }
                let (kind, _, _) = decode_state(state)
                    .ok_or_else(|| corrupt(format!("segment at {offset}: state {state:#x}")))?;
                match kind {
                    PENDING => {
                        pending.push((offset, state, pool.read_u64(offset + SEG_PARENT)));
                    }
                    _ => live.push((offset, state)),
                }
            }
        }
        // Interrupted splits: committed (the parent is the sibling) or not. Decided, and the
        // directory they make checked, before anything is written.
        let same_shape = |a: u64, b: u64| a & !(0xff << 40) == b & !(0xff << 40);
        let mut promote = Vec::new();
        let mut discard = Vec::new();
        for (offset, state, parent) in pending {
            let (_, depth, pattern) = decode_state(state).expect("validated above");
            let sibling = state_word(LIVE, depth, pattern ^ 1);
            let committed = live
                .iter()
                .any(|&(o, s)| o == parent && same_shape(s, sibling));
            if committed {
                promote.push((offset, state_word(LIVE, depth, pattern)));
            } else {
                discard.push(offset);
            }
        }
        let dirty: Vec<(u64, u64)> = live
            .iter()
            .copied()
            .filter(|&(_, s)| (s >> 40) & 0xff == LIVE_DIRTY)
            .collect();
        live.extend(promote.iter().copied());
        let directory = build_directory(&live).map_err(corrupt)?;

        let epoch = u64::from((word(R_EPOCH) as u32).wrapping_add(1).max(1));
        // Durable before any version carries it (see the module documentation).
        pool.write_u64(root + R_EPOCH, epoch);
        pool.persist(root + R_EPOCH, 8);
        let index = PmHashIndex {
            flush: pool.domain().needs_flush(),
            pool,
            pages,
            tag,
            root,
            seed,
            buckets,
            stash,
            epoch,
            dir: ArcSwap::from_pointee(directory),
            dir_lock: Mutex::new(()),
            free: Mutex::new(Vec::new()),
            splits: AtomicU64::new(0),
            page_count: AtomicU64::new(mine.len() as u64),
        };
        let pool = &*index.pool;
        for &(offset, state) in &promote {
            pool.write_u64_ordered(state_at(offset), state);
            pool.persist(state_at(offset), 8);
        }
        for &offset in &discard {
            pool.write_u64_ordered(state_at(offset), 0);
            pool.persist(state_at(offset), 8);
            free.push(offset);
        }
        // Stale copies left in a split segment.
        for &(offset, state) in &dirty {
            let (_, depth, pattern) = decode_state(state).expect("validated above");
            index.clean(offset, shape(depth, pattern));
            pool.write_u64_ordered(state_at(offset), state_word(LIVE, depth, pattern));
            pool.persist(state_at(offset), 8);
        }
        stats.splits_completed = promote.len();
        stats.splits_discarded = discard.len();
        stats.segments_cleaned = dirty.len();
        stats.segments = live.len();
        stats.free_segments = free.len();
        stats.directory_depth = index.directory_depth();
        free.sort_unstable_by(|a, b| b.cmp(a));
        *index.free.lock() = free;
        stats.elapsed = started.elapsed();
        Ok((index, stats))
    }

    #[inline]
    fn hash(&self, key: u64) -> u64 {
        mix64(key ^ self.seed)
    }

    #[inline]
    fn bucket(&self, segment: u64, index: u32) -> u64 {
        segment + BUCKET_BYTES * (1 + u64::from(index))
    }

    /// The home bucket's index in its segment.
    #[inline]
    fn home(&self, h: u64) -> u32 {
        (((h & 0xffff_ffff) * u64::from(self.buckets)) >> 32) as u32
    }

    fn all_buckets(&self) -> u32 {
        self.buckets + self.stash
    }

    /// Whether a version word says a writer holds its bucket (one of an older epoch never does).
    #[inline]
    fn locked(&self, version: u64) -> bool {
        version >> 32 == self.epoch && version & 1 == 1
    }

    /// Reads `bucket` consistently and looks for `key` there; also returns the bucket's `meta`.
    #[inline]
    fn probe(&self, bucket: u64, key: u64, fp: u8) -> (Option<Loc>, u64) {
        let pool = &*self.pool;
        loop {
            let word = PoolWord {
                pool,
                offset: bucket + VERSION,
            };
            let version = seqlock::read_begin(&word);
            if self.locked(version) {
                std::hint::spin_loop();
                continue;
            }
            let found = self.search(bucket, key, fp);
            let meta = pool.read_u64(bucket + META);
            if seqlock::read_validate(&word, version) {
                return (found, meta);
            }
        }
    }

    /// Looks for `key` in `bucket` (unvalidated: the caller validates or holds the lock).
    #[inline]
    fn search(&self, bucket: u64, key: u64, fp: u8) -> Option<Loc> {
        let pool = &*self.pool;
        let meta = pool.read_u64(bucket + META);
        let fps = [
            pool.read_u64(bucket + FINGERPRINTS),
            pool.read_u64(bucket + FINGERPRINTS + 8),
        ];
        for slot in slots_of(meta) {
            if (fps[slot as usize / 8] >> (8 * (slot % 8))) as u8 != fp {
                continue;
            }
            let at = key_word(bucket, slot);
            if pool.read_u64(at) == key {
                return Some(Loc {
                    bucket,
                    slot,
                    value: pool.read_u64(at + 8),
                });
            }
        }
        None
    }

    /// Where `key` is in `segment`, read under its writer lock.
    fn find_locked(&self, segment: u64, h: u64, key: u64) -> Option<Loc> {
        let fp = fingerprint(h);
        let home = self.bucket(segment, self.home(h));
        if let Some(loc) = self.search(home, key, fp) {
            return Some(loc);
        }
        if self.pool.read_u64(home + META) & OVERFLOW == 0 {
            return None;
        }
        (self.buckets..self.all_buckets())
            .find_map(|s| self.search(self.bucket(segment, s), key, fp))
    }

    /// Returns the value stored for `key`.
    pub fn get(&self, key: u64) -> Option<u64> {
        let h = self.hash(key);
        let fp = fingerprint(h);
        loop {
            let dir = self.dir.load();
            let segment = dir.segment(h);
            let split = seqlock::read_begin(&segment.split_version);
            if split & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            if !covers(segment.shape.load(Ordering::Relaxed), h) {
                // An old directory: the segment split since; load the new one.
                continue;
            }
            let home = self.bucket(segment.offset, self.home(h));
            let (mut found, meta) = self.probe(home, key, fp);
            if found.is_none() && meta & OVERFLOW != 0 {
                found = (self.buckets..self.all_buckets())
                    .find_map(|s| self.probe(self.bucket(segment.offset, s), key, fp).0);
            }
            if seqlock::read_validate(&segment.split_version, split) {
                return found.map(|loc| loc.value);
            }
        }
    }

    /// Starts loading the line of `key`'s home bucket that a [`get`](Self::get) reads first.
    pub fn prefetch(&self, key: u64) {
        let h = self.hash(key);
        let dir = self.dir.load();
        let segment = dir.segment(h);
        self.pool
            .prefetch(self.bucket(segment.offset, self.home(h)), CACHE_LINE);
    }

    /// Runs `f` on the segment holding hash `h`, under its writer lock, with its count known.
    fn with_segment<R>(&self, h: u64, f: impl FnOnce(&Segment) -> R) -> R {
        loop {
            let segment = Arc::clone(self.dir.load().segment(h));
            let _writer = segment.writer.lock();
            if !covers(segment.shape.load(Ordering::Relaxed), h) {
                continue;
            }
            self.ensure_counted(&segment);
            return f(&segment);
        }
    }

    /// Recounts a segment after recovery (under its writer lock).
    fn ensure_counted(&self, segment: &Segment) {
        if segment.count.load(Ordering::Relaxed) != UNCOUNTED {
            return;
        }
        let n: u64 = (0..self.all_buckets())
            .map(|b| {
                let meta = self.pool.read_u64(self.bucket(segment.offset, b) + META);
                u64::from((meta & SLOT_BITS).count_ones())
            })
            .sum();
        segment.count.store(n, Ordering::Relaxed);
    }

    /// Starts a change of `bucket` (under its segment's writer lock): its version becomes odd.
    /// Returns the odd version, for [`end_write`](Self::end_write).
    fn begin_write(&self, bucket: u64) -> u64 {
        let old = self.pool.read_u64(bucket + VERSION);
        let old = if old >> 32 == self.epoch { old } else { 0 };
        let odd = (self.epoch << 32) | u64::from((old as u32).wrapping_add(1));
        seqlock::write_begin(&self.version_word(bucket), odd);
        odd
    }

    fn end_write(&self, bucket: u64, odd: u64) {
        let even = (self.epoch << 32) | u64::from((odd as u32).wrapping_add(1));
        seqlock::write_end(&self.version_word(bucket), even);
    }

    /// The version word of `bucket` (the bucket's seqlock, in PM).
    fn version_word(&self, bucket: u64) -> PoolWord<'_> {
        PoolWord {
            pool: &self.pool,
            offset: bucket + VERSION,
        }
    }

    /// Flushes `[off, off + len)` under ADR (nothing under eADR).
    #[inline]
    fn flush(&self, off: u64, len: u64) {
        if self.flush {
            self.pool.flush(off, len);
        }
    }

    #[inline]
    fn fence_if_flushing(&self) {
        if self.flush {
            self.pool.fence();
        }
    }

    /// Stores `key → value` into the free `slot` of `bucket`, durably (see the module
    /// documentation for the order). `fence_first`: a flush of another line is pending that
    /// must be durable before the entry is.
    fn put(&self, bucket: u64, slot: u32, key: u64, value: u64, fp: u8, fence_first: bool) {
        let pool = &*self.pool;
        let version = self.begin_write(bucket);
        let at = key_word(bucket, slot);
        pool.write_u64(at, key);
        pool.write_u64(at + 8, value);
        let fp_word = bucket + FINGERPRINTS + 8 * u64::from(slot / 8);
        let shift = 8 * (slot % 8);
        let fps = pool.read_u64(fp_word) & !(0xff << shift) | u64::from(fp) << shift;
        pool.write_u64(fp_word, fps);
        let separate_line = line_of(at) != line_of(bucket);
        if separate_line {
            self.flush(at, 16);
        }
        if separate_line || fence_first {
            self.fence_if_flushing();
        }
        let meta = pool.read_u64(bucket + META);
        pool.write_u64_ordered(bucket + META, meta | 1 << slot);
        self.end_write(bucket, version);
        self.flush(bucket, 8);
        self.fence_if_flushing();
    }

    /// Places a key known absent in its segment: its home bucket, else the stash. False when
    /// both are full (the segment must split).
    fn place(&self, segment: &Segment, h: u64, key: u64, value: u64) -> bool {
        let fp = fingerprint(h);
        let home = self.bucket(segment.offset, self.home(h));
        let home_meta = self.pool.read_u64(home + META);
        let free = !home_meta & SLOT_BITS;
        if free != 0 {
            self.put(home, free.trailing_zeros(), key, value, fp, false);
            segment.count.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        for s in self.buckets..self.all_buckets() {
            let bucket = self.bucket(segment.offset, s);
            let free = !self.pool.read_u64(bucket + META) & SLOT_BITS;
            if free == 0 {
                continue;
            }
            let mut fence_first = false;
            if home_meta & OVERFLOW == 0 {
                // Durable before the stash entry, so that a lookup looks in the stash.
                let version = self.begin_write(home);
                self.pool
                    .write_u64_ordered(home + META, home_meta | OVERFLOW);
                self.end_write(home, version);
                self.flush(home, 8);
                fence_first = true;
            }
            self.put(bucket, free.trailing_zeros(), key, value, fp, fence_first);
            segment.count.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Removes the entry at `loc`, durably.
    fn take(&self, segment: &Segment, loc: Loc) {
        let version = self.begin_write(loc.bucket);
        let meta = self.pool.read_u64(loc.bucket + META);
        self.pool
            .write_u64_ordered(loc.bucket + META, meta & !(1 << loc.slot));
        self.end_write(loc.bucket, version);
        self.flush(loc.bucket, 8);
        self.fence_if_flushing();
        segment.count.fetch_sub(1, Ordering::Relaxed);
    }

    /// Replaces the value at `loc`, durably (one aligned word: old or new survives).
    fn set(&self, loc: Loc, value: u64) {
        let at = key_word(loc.bucket, loc.slot) + 8;
        let version = self.begin_write(loc.bucket);
        self.pool.write_u64_ordered(at, value);
        self.end_write(loc.bucket, version);
        self.flush(at, 8);
        self.fence_if_flushing();
    }

    /// Adds an absent key, splitting its segment as often as needed; returns through `done`.
    fn insert_with<R>(
        &self,
        key: u64,
        value: u64,
        present: impl Fn(&Self, &Segment, Loc) -> R,
        absent: R,
    ) -> Result<R, PmHashError>
    where
        R: Copy,
    {
        let h = self.hash(key);
        loop {
            let step = self.with_segment(h, |segment| {
                if let Some(loc) = self.find_locked(segment.offset, h, key) {
                    return Ok(Some(present(self, segment, loc)));
                }
                if self.place(segment, h, key, value) {
                    return Ok(Some(absent));
                }
                self.split(segment).map(|()| None)
            })?;
            if let Some(result) = step {
                return Ok(result);
            }
        }
    }

    /// Inserts `key → value` only if `key` is absent: `Ok(Ok(()))`; otherwise leaves the index
    /// unchanged and returns `Ok(Err(existing value))`. `Err` only when a needed split found no
    /// PM page (or hit [`MAX_DEPTH`]); the index is then unchanged.
    pub fn insert_new(&self, key: u64, value: u64) -> Result<Result<(), u64>, PmHashError> {
        self.insert_with(key, value, |_, _, loc| Err(loc.value), Ok(()))
    }

    /// Stores `key → value` whether or not `key` is present, returning the previous value.
    /// `Err` as for [`insert_new`](Self::insert_new).
    pub fn upsert(&self, key: u64, value: u64) -> Result<Option<u64>, PmHashError> {
        self.insert_with(
            key,
            value,
            |index, _, loc| {
                index.set(loc, value);
                Some(loc.value)
            },
            None,
        )
    }

    /// Removes `key`, returning its value.
    pub fn remove(&self, key: u64) -> Option<u64> {
        let h = self.hash(key);
        self.with_segment(h, |segment| {
            let loc = self.find_locked(segment.offset, h, key)?;
            self.take(segment, loc);
            Some(loc.value)
        })
    }

    /// Removes `key` only if it maps to exactly `value`; returns whether it was removed.
    pub fn remove_if(&self, key: u64, value: u64) -> bool {
        let h = self.hash(key);
        self.with_segment(h, |segment| {
            match self.find_locked(segment.offset, h, key) {
                Some(loc) if loc.value == value => {
                    self.take(segment, loc);
                    true
                }
                _ => false,
            }
        })
    }

    /// Replaces the value of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        let h = self.hash(key);
        self.with_segment(h, |segment| {
            match self.find_locked(segment.offset, h, key) {
                Some(loc) if loc.value == expected => {
                    self.set(loc, new);
                    true
                }
                _ => false,
            }
        })
    }

    /// A free segment slot, from a new page if none is left.
    fn take_free_segment(&self) -> Result<u64, PmHashError> {
        let mut free = self.free.lock();
        if let Some(offset) = free.pop() {
            return Ok(offset);
        }
        let page = self
            .pages
            .page_offset(self.pages.allocate(&self.pool, self.tag)?);
        self.page_count.fetch_add(1, Ordering::Relaxed);
        // Slot 0 holds the page's segment table (all zero in a new page: every slot free).
        free.extend(
            (2..SEGMENTS_PER_PAGE)
                .rev()
                .map(|slot| page + slot * SEGMENT_BYTES),
        );
        Ok(page + SEGMENT_BYTES)
    }

    /// Splits `segment` in two (under its writer lock); see the module documentation for the
    /// crash protocol.
    fn split(&self, segment: &Segment) -> Result<(), PmHashError> {
        let pool = &*self.pool;
        let old = segment.shape.load(Ordering::Relaxed);
        let (depth, pattern) = (depth_of(old), pattern_of(old));
        if depth >= MAX_DEPTH {
            return Err(PmHashError::DepthLimit);
        }
        let (stay, moved) = (
            shape(depth + 1, pattern << 1),
            shape(depth + 1, pattern << 1 | 1),
        );
        let new_offset = self.take_free_segment()?;
        // (1) The new segment: the entries that move, with their slots, fingerprints and
        // overflow bits; then its header, PENDING.
        let mut moved_count = 0u64;
        let mut metas = vec![0u64; self.all_buckets() as usize];
        for b in 0..self.all_buckets() {
            let (from, to) = (self.bucket(segment.offset, b), self.bucket(new_offset, b));
            let meta = pool.read_u64(from + META);
            for slot in slots_of(meta) {
                let at = key_word(from, slot);
                let key = pool.read_u64(at);
                let h = self.hash(key);
                if !covers(moved, h) {
                    continue;
                }
                pool.write_u64(key_word(to, slot), key);
                pool.write_u64(key_word(to, slot) + 8, pool.read_u64(at + 8));
                metas[b as usize] |= 1 << slot;
                if b >= self.buckets {
                    metas[self.home(h) as usize] |= OVERFLOW;
                }
                moved_count += 1;
            }
            for w in 0..2 {
                let fps = pool.read_u64(from + FINGERPRINTS + 8 * w);
                pool.write_u64(to + FINGERPRINTS + 8 * w, fps);
            }
            pool.write_u64(to + VERSION, self.epoch << 32);
        }
        for b in 0..self.all_buckets() {
            pool.write_u64(self.bucket(new_offset, b) + META, metas[b as usize]);
        }
        pool.write_u64(new_offset + SEG_PARENT, segment.offset);
        // The parent word before the PENDING state that makes recovery read it (eADR: in
        // this order; ADR: both flushed before the fence below, and PENDING with any parent
        // is harmless: only a parent that is the committed sibling keeps the segment).
        pool.write_u64_ordered(
            state_at(new_offset),
            state_word(PENDING, depth + 1, pattern << 1 | 1),
        );
        self.flush(
            new_offset,
            BUCKET_BYTES * (1 + u64::from(self.all_buckets())),
        );
        self.flush(state_at(new_offset), 8);
        self.fence_if_flushing();
        // (2) Commit: the old segment now covers half the hashes, and the new one is its
        // sibling, so recovery keeps it.
        pool.write_u64_ordered(
            state_at(segment.offset),
            state_word(LIVE_DIRTY, depth + 1, pattern << 1),
        );
        self.flush(state_at(segment.offset), 8);
        self.fence_if_flushing();
        // (3) The new segment is live on its own (before the old one may split again).
        pool.write_u64_ordered(
            state_at(new_offset),
            state_word(LIVE, depth + 1, pattern << 1 | 1),
        );
        self.flush(state_at(new_offset), 8);
        self.fence_if_flushing();
        // DRAM: the new shape and directory, under the split seqlock.
        let sibling = Arc::new(Segment::new(
            new_offset,
            depth + 1,
            pattern << 1 | 1,
            moved_count,
        ));
        segment.split_version.fetch_add(1, Ordering::Relaxed);
        seqlock::write_begun();
        segment.shape.store(stay, Ordering::Relaxed);
        segment.count.fetch_sub(moved_count, Ordering::Relaxed);
        self.publish(sibling);
        segment.split_version.fetch_add(1, Ordering::Release);
        // (4) Clear the stale copies; (5) the old segment is clean.
        self.clean(segment.offset, stay);
        pool.write_u64_ordered(
            state_at(segment.offset),
            state_word(LIVE, depth + 1, pattern << 1),
        );
        self.flush(state_at(segment.offset), 8);
        self.fence_if_flushing();
        Ok(())
    }

    /// Clears every entry of the segment at `offset` that a segment of `shape` does not cover,
    /// and recomputes its overflow bits, durably (under its writer lock, or at recovery).
    fn clean(&self, offset: u64, shape: u64) {
        let pool = &*self.pool;
        let mut keep = vec![0u64; self.all_buckets() as usize];
        for b in 0..self.all_buckets() {
            let bucket = self.bucket(offset, b);
            for slot in slots_of(pool.read_u64(bucket + META)) {
                let h = self.hash(pool.read_u64(key_word(bucket, slot)));
                if covers(shape, h) {
                    keep[b as usize] |= 1 << slot;
                    if b >= self.buckets {
                        keep[self.home(h) as usize] |= OVERFLOW;
                    }
                }
            }
        }
        for b in 0..self.all_buckets() {
            let bucket = self.bucket(offset, b);
            if pool.read_u64(bucket + META) != keep[b as usize] {
                let version = self.begin_write(bucket);
                pool.write_u64_ordered(bucket + META, keep[b as usize]);
                self.end_write(bucket, version);
                self.flush(bucket, 8);
            }
        }
        self.fence_if_flushing();
    }

    /// Puts a new segment into the directory, doubling it if the segment is deeper.
    fn publish(&self, segment: Arc<Segment>) {
        let _serial = self.dir_lock.lock();
        let current = self.dir.load();
        let shape = segment.shape.load(Ordering::Relaxed);
        let (depth, pattern) = (depth_of(shape), pattern_of(shape));
        let (mut global, mut segments) = (current.depth, current.segments.clone());
        if depth > global {
            segments = segments
                .iter()
                .flat_map(|s| [Arc::clone(s), Arc::clone(s)])
                .collect();
            global += 1;
        }
        let span = 1usize << (global - depth);
        let start = (pattern as usize) << (global - depth);
        for entry in &mut segments[start..start + span] {
            *entry = Arc::clone(&segment);
        }
        self.dir.store(Arc::new(Directory {
            depth: global,
            segments,
        }));
        self.splits.fetch_add(1, Ordering::Release);
    }

    /// Number of entries (exact when no writer runs). After recovery, the first call recounts
    /// each segment not yet written to (one pass over its bitmaps).
    pub fn len(&self) -> usize {
        let dir = self.dir.load_full();
        dir.unique()
            .map(|segment| {
                let n = segment.count.load(Ordering::Relaxed);
                if n != UNCOUNTED {
                    return n;
                }
                let _writer = segment.writer.lock();
                self.ensure_counted(segment);
                segment.count.load(Ordering::Relaxed)
            })
            .sum::<u64>() as usize
    }

    /// Whether the index holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f(key, value)` for every entry, in no particular order.
    ///
    /// Each segment is copied under its writer lock and visited after, so `f` may modify the
    /// index. Not a snapshot: entries changed concurrently may or may not be seen; a walk that a
    /// split overlapped is repeated (the split may have moved entries between segments), up to
    /// a few times.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        let mut entries = Vec::new();
        for _attempt in 0..4 {
            entries.clear();
            let splits = self.splits.load(Ordering::Acquire);
            let dir = self.dir.load_full();
            for segment in dir.unique() {
                let _writer = segment.writer.lock();
                for b in 0..self.all_buckets() {
                    let bucket = self.bucket(segment.offset, b);
                    for slot in slots_of(self.pool.read_u64(bucket + META)) {
                        let at = key_word(bucket, slot);
                        entries.push((self.pool.read_u64(at), self.pool.read_u64(at + 8)));
                    }
                }
            }
            if self.splits.load(Ordering::Acquire) == splits {
                break;
            }
        }
        for (key, value) in entries {
            f(key, value);
        }
    }

    /// DRAM bytes used: the directory, the segment handles and the free list.
    pub fn memory_bytes(&self) -> usize {
        let dir = self.dir.load();
        std::mem::size_of::<Self>()
            + std::mem::size_of::<Directory>()
            + dir.segments.len() * std::mem::size_of::<Arc<Segment>>()
            + dir.unique().count() * (std::mem::size_of::<Segment>() + 16)
            + self.free.lock().capacity() * 8
    }

    /// PM bytes owned: the index's pages.
    pub fn pm_bytes(&self) -> u64 {
        self.page_count.load(Ordering::Relaxed) * PAGE_SIZE
    }

    /// The directory's depth (log2 of its entries).
    pub fn directory_depth(&self) -> u32 {
        self.dir.load().depth
    }

    /// Live segments.
    pub fn segments(&self) -> usize {
        self.dir.load().unique().count()
    }
}

impl fmt::Debug for PmHashIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmHashIndex")
            .field("root", &self.root)
            .field("segments", &self.segments())
            .field("directory_depth", &self.directory_depth())
            .finish()
    }
}

fn encode_tag(tag: PageTag) -> u64 {
    u64::from(tag.kind) | u64::from(tag.owner) << 8 | tag.value << 16
}

fn decode_tag(word: u64) -> Option<PageTag> {
    let tag = PageTag {
        kind: word as u8,
        owner: (word >> 8) as u8,
        value: word >> 16,
    };
    (tag.kind != 0 && tag.value < 1 << 32).then_some(tag)
}

fn root_check(seed: u64, tag: u64, buckets: u32, stash: u32) -> u64 {
    let mut h = crc32fast::Hasher::new();
    for word in [
        ROOT_MAGIC,
        ROOT_VERSION,
        seed,
        tag,
        u64::from(buckets),
        u64::from(stash),
    ] {
        h.update(&word.to_le_bytes());
    }
    u64::from(h.finalize()) | 0x5a5a << 48
}

/// A segment state word's (state, depth, pattern), if it is a valid one.
fn decode_state(word: u64) -> Option<(u64, u32, u64)> {
    let (magic, kind) = (word >> 48, (word >> 40) & 0xff);
    let (depth, pattern) = (depth_of(word), pattern_of(word));
    let valid = magic == SEG_MAGIC
        && (PENDING..=LIVE_DIRTY).contains(&kind)
        && depth <= MAX_DEPTH
        && pattern >> depth == 0;
    valid.then_some((kind, depth, pattern))
}

/// The directory of the live segments `(offset, state word)`, which must tile the hash space.
fn build_directory(live: &[(u64, u64)]) -> Result<Directory, String> {
    let shapes: Vec<(u64, u32, u64)> = live
        .iter()
        .map(|&(offset, state)| (offset, depth_of(state), pattern_of(state)))
        .collect();
    let depth = shapes.iter().map(|s| s.1).max().ok_or("no live segment")?;
    // Coverage adds up to the whole space before anything is allocated for it.
    let covered: u128 = shapes.iter().map(|s| 1u128 << (depth - s.1)).sum();
    if covered != 1u128 << depth {
        return Err(format!(
            "the {} live segments cover {covered} of the {} directory entries",
            shapes.len(),
            1u64 << depth
        ));
    }
    let mut entries: Vec<Option<Arc<Segment>>> = vec![None; 1 << depth];
    for &(offset, d, pattern) in &shapes {
        let segment = Arc::new(Segment::new(offset, d, pattern, UNCOUNTED));
        let start = (pattern as usize) << (depth - d);
        for entry in &mut entries[start..start + (1 << (depth - d))] {
            if entry.is_some() {
                return Err(format!(
                    "segment at {offset} (depth {d}, pattern {pattern:#x}) overlaps another"
                ));
            }
            *entry = Some(Arc::clone(&segment));
        }
    }
    Ok(Directory {
        depth,
        segments: entries.into_iter().map(|e| e.expect("covered")).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::{CrashTrigger, PersistenceDomain, PoolOptions, SimulatedCrash};
    use std::collections::HashMap;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    const LAYOUT: &str = "pmhash";
    const TAG: PageTag = PageTag {
        kind: 9,
        owner: 0,
        value: 3,
    };
    /// Splits after a few dozen keys: one bucket and one stash bucket per segment.
    const TINY: PmHashOptions = PmHashOptions {
        initial_depth: 0,
        buckets_per_segment: 1,
        stash_buckets: 1,
    };

    fn opts(domain: PersistenceDomain) -> PoolOptions {
        PoolOptions::new(LAYOUT, domain).with_counting(false)
    }

    /// A pool of `pages` index pages with a formatted page table.
    fn setup(pages: u64, domain: PersistenceDomain) -> (Arc<Pool>, Arc<PageManager>) {
        let pool = Pool::create_in_memory((pages + 1) * PAGE_SIZE, &opts(domain)).unwrap();
        let pm = PageManager::format(&pool).unwrap();
        (Arc::new(pool), Arc::new(pm))
    }

    /// A `TINY` index (many segments soon) in a pool of `pages` pages, holding `k → k` for
    /// every `k < keys`.
    fn tiny_with_keys(pages: u64, keys: u64) -> (Arc<Pool>, Arc<PageManager>, PmHashIndex) {
        let (pool, pm) = setup(pages, PersistenceDomain::Adr);
        let index = PmHashIndex::create_with(pool.clone(), pm.clone(), TAG, TINY).unwrap();
        for k in 0..keys {
            index.insert_new(k, k).unwrap().unwrap();
        }
        (pool, pm, index)
    }

    fn contents(index: &PmHashIndex) -> HashMap<u64, u64> {
        let mut seen = HashMap::new();
        index.for_each(|k, v| assert!(seen.insert(k, v).is_none(), "key {k} visited twice"));
        seen
    }

    /// Recovery takes every segment's state from its page's segment table: it reads nothing of
    /// the segments themselves (the index spans several pages, each with its table), and each
    /// segment slot's state sits where `state_at` says.
    #[test]
    fn recovery_reads_the_segment_tables_not_the_segments() {
        let (pool, pages, index) = tiny_with_keys(6, 6_000);
        let index_pages = (index.pm_bytes() / PAGE_SIZE) as usize;
        assert!(index_pages >= 2, "the index spans {index_pages} pages");
        let (root, segments) = (index.root(), index.segments());
        let offsets: Vec<u64> = index.dir.load().unique().map(|s| s.offset).collect();
        drop(index);
        for &offset in &offsets {
            assert_eq!(offset % SEGMENT_BYTES, 0);
            assert_ne!(offset % PAGE_SIZE, 0, "slot 0 of a page holds its table");
            assert!(decode_state(pool.read_u64(state_at(offset))).is_some());
            // Bucket 0's first word (the old home of the state word) is not read any more.
            pool.write_u64(offset, u64::MAX);
        }
        let (index, stats) = PmHashIndex::recover(pool, pages, root).unwrap();
        assert_eq!((stats.pages, stats.segments), (index_pages, segments));
        assert_eq!(index.len(), 6_000);
        assert!((0..6_000u64).all(|k| index.get(k) == Some(k)));
    }

    #[test]
    fn point_operations_follow_the_dram_index_contract() {
        let (pool, pages) = setup(1, PersistenceDomain::Adr);
        let index = PmHashIndex::create(pool, pages, TAG).unwrap();
        assert_eq!(index.insert_new(7, 100).unwrap(), Ok(()));
        assert_eq!(index.insert_new(7, 200).unwrap(), Err(100));
        assert_eq!(index.get(7), Some(100));
        assert_eq!(index.upsert(7, 101).unwrap(), Some(100));
        assert_eq!(index.upsert(8, 80).unwrap(), None);
        assert!(!index.replace_if(7, 100, 102));
        assert!(index.replace_if(7, 101, 102));
        assert!(
            !index.replace_if(9, 0, 1),
            "an absent key is never inserted"
        );
        assert_eq!(index.get(9), None);
        assert!(!index.remove_if(7, 101));
        assert!(index.remove_if(7, 102));
        assert_eq!(index.remove(7), None);
        assert_eq!(index.remove(8), Some(80));
        assert!(index.is_empty());
        // Key 0, value 0 and the extremes are ordinary entries.
        for (k, v) in [(0, 0), (u64::MAX, 0), (1, u64::MAX)] {
            assert_eq!(index.insert_new(k, v).unwrap(), Ok(()));
            assert_eq!(index.get(k), Some(v));
        }
        assert_eq!(index.len(), 3);
        assert_eq!(index.remove(0), Some(0));
        assert_eq!(index.get(0), None);
    }

    #[test]
    fn splits_and_doublings_keep_every_key_and_recovery_finds_them() {
        let (pool, pages) = setup(2, PersistenceDomain::Adr);
        let index = PmHashIndex::create_with(pool.clone(), pages.clone(), TAG, TINY).unwrap();
        for k in 0..3_000u64 {
            index.insert_new(k, k * 3).unwrap().unwrap();
        }
        for k in (0..3_000u64).step_by(2) {
            assert_eq!(index.remove(k), Some(k * 3));
        }
        assert!(index.segments() > 64, "{} segments", index.segments());
        assert!(index.directory_depth() >= 6);
        let root = index.root();
        let before = contents(&index);
        drop(index);
        let (index, stats) = PmHashIndex::recover(pool, pages, root).unwrap();
        assert_eq!(stats.splits_completed + stats.splits_discarded, 0);
        assert_eq!(stats.segments, index.segments());
        assert!(stats.pages >= 1 && stats.elapsed < Duration::from_secs(1));
        assert_eq!(index.len(), 1_500);
        assert_eq!(contents(&index), before);
        for k in 0..3_000u64 {
            assert_eq!(index.get(k), (k % 2 == 1).then_some(k * 3), "key {k}");
        }
    }

    #[test]
    fn a_full_pool_is_an_error_and_leaves_the_index_usable() {
        let (pool, pages) = setup(1, PersistenceDomain::Eadr);
        let index = PmHashIndex::create_with(pool, pages, TAG, TINY).unwrap();
        let mut inserted = 0u64;
        let err = loop {
            match index.insert_new(inserted, inserted) {
                Ok(Ok(())) => inserted += 1,
                Ok(Err(_)) => unreachable!("fresh keys"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(err, PmHashError::Alloc(AllocError::PmFull { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("full"), "{err}");
        assert_eq!(index.len() as u64, inserted);
        assert!((0..inserted).all(|k| index.get(k) == Some(k)));
        assert_eq!(index.remove(0), Some(0));
        assert_eq!(index.insert_new(0, 5).unwrap(), Ok(()));
    }

    #[test]
    fn bad_options_are_refused() {
        let (pool, pages) = setup(1, PersistenceDomain::Adr);
        for opts in [
            PmHashOptions {
                initial_depth: 7,
                ..TINY
            },
            PmHashOptions {
                buckets_per_segment: 0,
                ..TINY
            },
            PmHashOptions {
                buckets_per_segment: 60,
                ..TINY
            },
            PmHashOptions {
                stash_buckets: 5,
                ..TINY
            },
        ] {
            assert!(matches!(
                PmHashIndex::create_with(pool.clone(), pages.clone(), TAG, opts),
                Err(PmHashError::InvalidOptions(_))
            ));
        }
    }

    /// Every kind of damage recovery can meet is refused with an error, and a refused recovery
    /// writes nothing.
    #[test]
    fn a_corrupt_root_or_segment_header_is_refused() {
        let (pool, pages, index) = tiny_with_keys(2, 200);
        let root = index.root();
        let some_segment = index.dir.load().segments[0].offset;
        drop(index);
        let refused = |at: u64, root: u64, what: &str| {
            let reason = match PmHashIndex::recover(pool.clone(), pages.clone(), root) {
                Err(PmHashError::Corrupt { reason, .. }) => reason,
                Err(e) => panic!("{what}: wrong error {e}"),
                Ok(_) => panic!("{what}: accepted"),
            };
            let _ = at;
            reason
        };
        // Roots that are not one.
        for bad_root in [0, 8, root + 64, root + 2 * PAGE_SIZE, u64::MAX - 7, 1 << 40] {
            refused(0, bad_root, "bad root offset");
        }
        let epoch = pool.read_u64(root + R_EPOCH);
        // Damage to each root word (the epoch is not checked: any value is a valid epoch).
        for word in [
            R_MAGIC, R_VERSION, R_SEED, R_TAG, R_BUCKETS, R_STASH, R_CHECK,
        ] {
            let good = pool.read_u64(root + word);
            pool.write_u64(root + word, good ^ 0x40);
            let reason = refused(root + word, root, "root word");
            assert!(!reason.is_empty());
            pool.write_u64(root + word, good);
        }
        assert_eq!(
            pool.read_u64(root + R_EPOCH),
            epoch,
            "refusals write nothing"
        );
        // A segment header that is not one, or that overlaps another.
        let some_segment = state_at(some_segment);
        let good = pool.read_u64(some_segment);
        for bad in [
            1,
            good ^ (1 << 50),
            state_word(LIVE, 30, 0),
            good ^ (1 << 33),
        ] {
            pool.write_u64(some_segment, bad);
            refused(some_segment, root, "segment header");
        }
        // A segment slot claiming a range another covers.
        let free_slot = state_at(root + SEGMENT_BYTES * (SEGMENTS_PER_PAGE - 1));
        pool.write_u64(some_segment, good);
        pool.write_u64(free_slot, good);
        assert!(refused(free_slot, root, "overlap").contains("cover"));
        pool.write_u64(free_slot, 0);
        // The root's page tagged for someone else.
        let (index, _) = PmHashIndex::recover(pool.clone(), pages.clone(), root).unwrap();
        assert_eq!(index.len(), 200);
    }

    /// The root of an index in a page the page table gives to another owner is refused.
    #[test]
    fn a_root_in_a_page_of_another_owner_is_refused() {
        let (pool, pages) = setup(2, PersistenceDomain::Adr);
        let index = PmHashIndex::create(pool.clone(), pages.clone(), TAG).unwrap();
        let root = index.root();
        drop(index);
        let other = PageTag { value: 4, ..TAG };
        let page = pages.allocate(&pool, other).unwrap();
        // A copy of the root in the other owner's page: valid words, wrong owner.
        let copy = pages.page_offset(page);
        for w in (0..64).step_by(8) {
            pool.write_u64(copy + w, pool.read_u64(root + w));
        }
        assert!(matches!(
            PmHashIndex::recover(pool, pages, copy),
            Err(PmHashError::Corrupt { reason, .. }) if reason.contains("not tagged")
        ));
    }

    /// A writer's lock (an odd version) that a crash left in PM is not a lock after recovery:
    /// the new epoch makes it stale, without recovery touching the bucket (Dash §4.5).
    #[test]
    fn a_bucket_lock_left_by_a_crash_is_released_by_the_new_epoch() {
        let (pool, pages) = setup(1, PersistenceDomain::Eadr);
        let index = PmHashIndex::create(pool.clone(), pages.clone(), TAG).unwrap();
        index.insert_new(42, 7).unwrap().unwrap();
        let h = index.hash(42);
        let bucket = index.bucket(index.dir.load().segment(h).offset, index.home(h));
        // A writer died between begin_write and end_write.
        let odd = index.begin_write(bucket);
        assert!(index.locked(odd));
        let root = index.root();
        drop(index);
        let (index, _) = PmHashIndex::recover(pool.clone(), pages, root).unwrap();
        assert_eq!(
            pool.read_u64(bucket + VERSION),
            odd,
            "recovery left the bucket as it was"
        );
        assert!(
            !index.locked(odd),
            "a version of an older epoch is unlocked"
        );
        assert_eq!(index.get(42), Some(7));
        assert_eq!(index.upsert(42, 8).unwrap(), Some(7));
        assert!(
            index.locked(index.begin_write(bucket)),
            "a writer locks it again"
        );
    }

    // ---- crash consistency ----

    #[derive(Clone, Copy, Debug)]
    enum Op {
        Insert(u64, u64),
        Upsert(u64, u64),
        Remove(u64),
        RemoveIf(u64, u64),
        ReplaceIf(u64, u64, u64),
    }

    /// A deterministic sequence over 120 keys (0 and u64::MAX among them): `fill` inserts of
    /// fresh keys, then `mixed` operations of every kind; with a `TINY` index it crosses several
    /// splits and directory doublings.
    fn sequence(fill: usize, mixed: usize) -> Vec<Op> {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let key = |r: u64| match r % 120 {
            0 => 0,
            1 => u64::MAX,
            k => k * 0x9e37_79b9,
        };
        let fill = (0..fill as u64).map(|i| Op::Insert(key(i), i % 3));
        let mixed: Vec<Op> = (0..mixed)
            .map(|_| {
                let (r, k, v) = (next(), key(next()), next() % 4);
                match r % 10 {
                    0..=3 => Op::Insert(k, v),
                    4 | 5 => Op::Upsert(k, v),
                    6 => Op::Remove(k),
                    7 => Op::RemoveIf(k, v),
                    _ => Op::ReplaceIf(k, v, v + 1),
                }
            })
            .collect();
        fill.chain(mixed).collect()
    }

    /// Applies `op` to the model, returning what the index must answer.
    fn model_apply(model: &mut HashMap<u64, u64>, op: Op) -> String {
        match op {
            Op::Insert(k, v) => match model.get(&k) {
                Some(&old) => format!("{:?}", Err::<(), u64>(old)),
                None => {
                    model.insert(k, v);
                    format!("{:?}", Ok::<(), u64>(()))
                }
            },
            Op::Upsert(k, v) => format!("{:?}", model.insert(k, v)),
            Op::Remove(k) => format!("{:?}", model.remove(&k)),
            Op::RemoveIf(k, v) => {
                let hit = model.get(&k) == Some(&v);
                if hit {
                    model.remove(&k);
                }
                format!("{hit:?}")
            }
            Op::ReplaceIf(k, e, n) => {
                let hit = model.get(&k) == Some(&e);
                if hit {
                    model.insert(k, n);
                }
                format!("{hit:?}")
            }
        }
    }

    fn index_apply(index: &PmHashIndex, op: Op) -> String {
        match op {
            Op::Insert(k, v) => format!("{:?}", index.insert_new(k, v).unwrap()),
            Op::Upsert(k, v) => format!("{:?}", index.upsert(k, v).unwrap()),
            Op::Remove(k) => format!("{:?}", index.remove(k)),
            Op::RemoveIf(k, v) => format!("{:?}", index.remove_if(k, v)),
            Op::ReplaceIf(k, e, n) => format!("{:?}", index.replace_if(k, e, n)),
        }
    }

    /// Checks a recovered index against the model states it may legally show, and that it
    /// works on.
    fn check_recovered(
        index: &PmHashIndex,
        legal: &[&HashMap<u64, u64>],
        universe: &[u64],
        what: &str,
    ) {
        let got = contents(index);
        assert!(
            legal.iter().any(|m| **m == got),
            "{what}: recovered {got:?}, expected one of {legal:?}"
        );
        assert_eq!(index.len(), got.len(), "{what}: len");
        for &k in universe {
            assert_eq!(index.get(k), got.get(&k).copied(), "{what}: get({k})");
        }
        // Usable after recovery: new keys, removals and the splits they cause.
        let mut model = got.clone();
        for k in 1_000..1_020u64 {
            assert_eq!(index.insert_new(k, k).unwrap(), Ok(()), "{what}");
            model.insert(k, k);
        }
        for &k in universe.iter().take(10) {
            assert_eq!(index.remove(k), model.remove(&k), "{what}");
        }
        assert_eq!(contents(index), model, "{what}: after further operations");
        assert_eq!(index.len(), model.len(), "{what}");
    }

    /// Crashes a run of `ops` at every PM event (recovery of the starting index included) and
    /// recovers up to 3 crash images per event (all when there are no more). `fresh_page`: the run starts with an
    /// empty free list, so its first split allocates a page (which a crash may leave unlinked).
    fn crash_at_every_event(domain: PersistenceDomain, ops: &[Op], fresh_page: bool) -> usize {
        // The starting pool: a page table and an empty index, no simulator.
        let (pool, pages) = setup(if fresh_page { 2 } else { 1 }, domain);
        let root = PmHashIndex::create_with(pool.clone(), pages, TAG, TINY)
            .unwrap()
            .root();
        let template = pool.read_vec(0, pool.len() as usize);
        drop(pool);
        let start = |trigger: CrashTrigger| {
            let pool = Arc::new(
                Pool::from_image(&template, &opts(domain).with_crash_sim(trigger)).unwrap(),
            );
            let pages = Arc::new(PageManager::open(&pool).unwrap());
            (pool, pages)
        };
        let open = |pool: &Arc<Pool>, pages: &Arc<PageManager>| {
            let (index, _) = PmHashIndex::recover(pool.clone(), pages.clone(), root).unwrap();
            if fresh_page {
                index.free.lock().clear();
            }
            index
        };
        // The models after each prefix of the run, and the event count of a whole run.
        let mut models = vec![HashMap::new()];
        let (pool, pages) = start(CrashTrigger::Never);
        let index = open(&pool, &pages);
        for &op in ops {
            let mut model = models.last().unwrap().clone();
            let expected = model_apply(&mut model, op);
            assert_eq!(index_apply(&index, op), expected, "{op:?}");
            models.push(model);
        }
        assert!(
            index.segments() >= 3 && index.directory_depth() >= 2
                || fresh_page && index.segments() >= 2,
            "{} segments, depth {}",
            index.segments(),
            index.directory_depth()
        );
        if fresh_page {
            assert_eq!(index.pm_bytes(), 2 * PAGE_SIZE);
        }
        let total = pool.crash_sim().unwrap().events();
        eprintln!("{domain}: {total} events, {} segments", index.segments());
        drop((pool, index));
        let universe: Vec<u64> = models.iter().flat_map(|m| m.keys().copied()).collect();
        let mut recovered = 0;
        for event in 0..=total {
            let (pool, pages) = start(CrashTrigger::AtEvent(event));
            let mut done = 0;
            let crashed = catch_unwind(AssertUnwindSafe(|| {
                let index = open(&pool, &pages);
                for &op in ops {
                    index_apply(&index, op);
                    done += 1;
                }
            }));
            if let Err(payload) = crashed {
                assert!(
                    SimulatedCrash::is(&*payload),
                    "a real panic at event {event}"
                );
            }
            // Crashed during the starting recovery: nothing ran.
            let legal: Vec<&HashMap<u64, u64>> = models[done..].iter().take(2).collect();
            pool.crash_now();
            let state = pool.crash_sim().unwrap().crash_state().unwrap();
            for (i, image) in state.images(3, event).enumerate() {
                let what = format!("{domain} event {event}/{total} image {i} after {done} ops");
                let pool = Arc::new(Pool::from_image(&image.bytes, &opts(domain)).unwrap());
                let pages = Arc::new(PageManager::open(&pool).unwrap());
                let (index, _) = PmHashIndex::recover(pool, pages, root)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                check_recovered(&index, &legal, &universe, &what);
                recovered += 1;
            }
        }
        recovered
    }

    #[test]
    fn every_crash_point_of_a_run_with_splits_recovers_under_adr() {
        let images = crash_at_every_event(PersistenceDomain::Adr, &sequence(60, 40), false);
        assert!(images > 500, "{images} images");
    }

    #[test]
    fn every_crash_point_of_a_run_with_splits_recovers_under_eadr() {
        let images = crash_at_every_event(PersistenceDomain::Eadr, &sequence(60, 40), false);
        assert!(images > 200, "{images} images");
    }

    #[test]
    fn a_page_allocated_by_a_split_is_never_leaked_or_lost_by_a_crash() {
        let images = crash_at_every_event(PersistenceDomain::Adr, &sequence(40, 20), true);
        assert!(images > 100, "{images} images");
    }
}
