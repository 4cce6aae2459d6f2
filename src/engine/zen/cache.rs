//! The Met-Cache (Zen §3.2): a DRAM tuple cache per table whose entries carry the protocol's
//! concurrency-control metadata, divided into one region per thread, with CLOCK replacement.
//!
//! An entry holds the row (as 8-byte words, so concurrent readers copy it with plain atomic loads
//! in safe Rust, validated by the CC word as in a seqlock), the NVM-tuple it caches (`nvm`), its
//! Tx-CTS, the tuple id and a state word packing the paper's bits (metadata and row are contiguous
//! words of one slab per chunk of entries, see [`Entry`]):
//!
//! | bits | meaning |
//! | --- | --- |
//! | 0..32 | pin count: the paper's *active* bit, counted, since several transactions (of any thread) may use an entry at once |
//! | 32 | CLOCK: used since the hand last passed |
//! | 33 | COPY: the entry was superseded (copied into another region by a writer, or deleted); the index no longer points at it |
//! | 34 | EVICTING: claimed by its owner for replacement or filling |
//! | 35 | VALID: holds a tuple |
//!
//! The *dirty* bit is not needed: writes are buffered in the transaction's private data until
//! commit (the engine contract), so an entry never holds uncommitted data and an abort restores
//! nothing (§3.3.1 restores dirty entries from NVM instead).
//!
//! Only the owning thread fills, evicts or modifies entries of its region (§3.2); any thread may
//! pin and read them. A pin is taken with one `fetch_add` and then checked (VALID, not EVICTING,
//! not COPY, same key): eviction claims an entry only by a CAS from "no pins, CLOCK clear", so a
//! pinned entry is never replaced.
//!
//! The primary index value is either an NVM offset or a cache reference ([`CACHE_REF`] set:
//! region and entry number), the "unused bit" of §3.1.

use crate::index::PrimaryIndex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Marks an index value as a Met-Cache reference rather than an NVM offset.
pub const CACHE_REF: u64 = 1 << 63;
const REGION_SHIFT: u32 = 40;
const ENTRY_MASK: u64 = (1 << REGION_SHIFT) - 1;

/// Pin-count bits of the state word.
pub const PINS: u64 = (1 << 32) - 1;
/// CLOCK bit.
pub const CLOCK: u64 = 1 << 32;
/// COPY bit (superseded).
pub const COPIED: u64 = 1 << 33;
/// EVICTING bit (claimed by the owner).
pub const EVICTING: u64 = 1 << 34;
/// VALID bit.
pub const VALID: u64 = 1 << 35;

/// Entries per lazily allocated chunk of a region.
const CHUNK: usize = 512;

/// Metadata words at the head of an entry: `cc`, `state`, `key`, `nvm`, `cts`, `lp`.
const META: usize = 6;
const CC: usize = 0;
const STATE: usize = 1;
const KEY: usize = 2;
const NVM: usize = 3;
const CTS: usize = 4;
const LP: usize = 5;
/// Words per cache line.
const LINE_WORDS: usize = 8;

/// Bytes an entry costs beyond its row (metadata words, padding to whole lines): what the cache
/// budget is charged per entry on top of the row.
pub const ENTRY_OVERHEAD: u64 = 64;

/// Whether an index value is a cache reference.
#[inline]
pub fn is_cache_ref(v: u64) -> bool {
    v & CACHE_REF != 0
}

/// The region (thread) of a cache reference.
#[inline]
pub fn region_of(r: u64) -> usize {
    ((r & !CACHE_REF) >> REGION_SHIFT) as usize
}

/// One Met-Cache entry, a view of its words in its chunk's slab: the metadata words first, then
/// the row, contiguous (so the hardware prefetcher follows from the metadata into the row), the
/// entry starting on a cache line and padded to whole lines (pins of neighbouring entries by
/// different threads do not share a line).
#[derive(Clone, Copy)]
pub struct Entry<'a> {
    meta: &'a [AtomicU64; META],
    /// Metadata and row words (the row exactly, without the padding).
    all: &'a [AtomicU64],
}

impl<'a> Entry<'a> {
    fn new(all: &'a [AtomicU64]) -> Entry<'a> {
        let meta = all
            .first_chunk()
            .expect("an entry starts with its metadata");
        Entry { meta, all }
    }

    /// The CC-Meta word (§3.2): the protocol's per-tuple metadata.
    #[inline]
    pub fn cc(self) -> &'a AtomicU64 {
        &self.meta[CC]
    }

    /// Pins and the CLOCK/COPY/EVICTING/VALID bits.
    #[inline]
    pub fn state(self) -> &'a AtomicU64 {
        &self.meta[STATE]
    }

    /// The tuple id (primary key).
    #[inline]
    pub fn key(self) -> &'a AtomicU64 {
        &self.meta[KEY]
    }

    /// The NVM-tuple holding the committed version this entry caches.
    #[inline]
    pub fn nvm(self) -> &'a AtomicU64 {
        &self.meta[NVM]
    }

    /// The Tx-CTS of that version.
    #[inline]
    pub fn cts(self) -> &'a AtomicU64 {
        &self.meta[CTS]
    }

    /// Records whether that version's NVM header carries the LP bit (it was the last tuple its
    /// commit persisted): with `cts`, the header word, so reclamation need not read it from NVM.
    #[inline]
    pub fn set_lp(self, lp: bool) {
        let word = if lp { super::layout::tuple::LP } else { 0 };
        self.meta[LP].store(word, Ordering::Relaxed);
    }

    /// The row, as little-endian words.
    #[inline]
    pub fn row(self) -> &'a [AtomicU64] {
        &self.all[META..]
    }

    /// Copies the row into `out` (relaxed loads: the caller validates with the CC word).
    #[inline]
    pub fn copy_row(self, out: &mut [u8]) {
        let mut words = self.row().iter();
        let mut chunks = out.chunks_exact_mut(8);
        for (chunk, w) in (&mut chunks).zip(&mut words) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let tail = chunks.into_remainder();
        if let Some(w) = words.next() {
            let n = tail.len();
            tail.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes()[..n]);
        }
    }

    /// Stores `row` (relaxed stores: the caller holds the write lock or owns the entry unpublished,
    /// and has issued a release fence after taking the lock).
    #[inline]
    pub fn store_row(self, row: &[u8]) {
        let mut words = self.row().iter();
        let chunks = row.chunks_exact(8);
        let tail = chunks.remainder();
        for (chunk, w) in chunks.zip(&mut words) {
            let word = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
            w.store(word, Ordering::Relaxed);
        }
        if let Some(w) = words.next() {
            let mut bytes = [0u8; 8];
            bytes[..tail.len()].copy_from_slice(tail);
            w.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
    }

    /// Asks the CPU to start loading the entry's lines (a hint, no effect on correctness): a blind
    /// update reads the whole row only at commit, so its misses can overlap the rest of the
    /// transaction instead of stalling the commit.
    #[inline]
    pub fn prefetch_row(self) {
        for line in self.all.chunks(LINE_WORDS) {
            crate::pmem::prefetch(line.as_ptr());
        }
    }

    /// [`prefetch_row`](Self::prefetch_row) without the first line, which
    /// [`prefetch_meta`](Self::prefetch_meta) already asked for: a second hint for a line in
    /// flight still takes a load slot, and may wait for a line-fill buffer when they are full.
    #[inline]
    pub fn prefetch_row_after_meta(self) {
        for line in self.all.chunks(LINE_WORDS).skip(1) {
            crate::pmem::prefetch(line.as_ptr());
        }
    }

    /// Asks the CPU to start loading the entry's first line: its metadata (and the row's first
    /// words), what a lookup, lock or blind overwrite touches before it reads the row, if ever.
    #[inline]
    pub fn prefetch_meta(self) {
        crate::pmem::prefetch(self.meta.as_ptr());
    }

    /// The NVM header word of the cached version (LP, Tx-CTS; never DELETED: a cached version
    /// is live), as it was persisted. Read under the write lock (or by the owner of an
    /// unpublished entry), like `nvm`.
    #[inline]
    pub fn header_word(self) -> u64 {
        self.cts().load(Ordering::Relaxed) | self.meta[LP].load(Ordering::Relaxed)
    }

    /// Whether the entry currently holds `key` and is the latest version (not superseded).
    #[inline]
    pub fn is_current(self, key: u64) -> bool {
        let s = self.state().load(Ordering::Acquire);
        s & (VALID | EVICTING | COPIED) == VALID && self.key().load(Ordering::Relaxed) == key
    }
}

/// [`CHUNK`] entries in one slab of words, each entry `stride` words from the previous, the
/// first at a 64-byte boundary (`base` words into the allocation).
struct Chunk {
    words: Box<[AtomicU64]>,
    base: usize,
}

impl Chunk {
    fn new(stride: usize) -> Chunk {
        let words: Box<[AtomicU64]> = (0..CHUNK * stride + LINE_WORDS - 1)
            .map(|_| AtomicU64::new(0))
            .collect();
        let misalign = words.as_ptr() as usize % (LINE_WORDS * 8);
        let base = (LINE_WORDS * 8 - misalign) % (LINE_WORDS * 8) / 8;
        Chunk { words, base }
    }
}

struct Region {
    chunks: Box<[OnceLock<Chunk>]>,
    /// Entries handed out so far (only the owner grows it).
    len: AtomicUsize,
}

/// The Met-Cache of one table.
pub struct MetCache {
    regions: Box<[Region]>,
    /// Metadata and row words of an entry.
    words: usize,
    /// Words from one entry to the next: `words` rounded up to whole lines.
    stride: usize,
    /// Entries each region may hold (set by the knapsack split, [`split_budget`]).
    capacity: AtomicUsize,
    /// Hard limit per region (chunk table size).
    max_entries: usize,
}

/// Why an entry could not be had.
#[derive(Debug)]
pub struct RegionExhausted;

impl MetCache {
    /// A cache for rows of `row` bytes with `regions` regions of at most `max_entries` entries.
    pub fn new(row: usize, regions: usize, capacity: usize, max_entries: usize) -> MetCache {
        let max_entries = max_entries.max(CHUNK);
        let chunks = max_entries.div_ceil(CHUNK);
        MetCache {
            regions: (0..regions)
                .map(|_| Region {
                    chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
                    len: AtomicUsize::new(0),
                })
                .collect(),
            words: META + row.div_ceil(8),
            stride: (META + row.div_ceil(8)).next_multiple_of(LINE_WORDS),
            capacity: AtomicUsize::new(capacity.clamp(1, max_entries)),
            max_entries: chunks * CHUNK,
        }
    }

    /// Entries per region.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Sets the entries per region (the owner evicts down to it lazily: entries already
    /// allocated stay allocated).
    pub fn set_capacity(&self, entries: usize) {
        self.capacity
            .store(entries.clamp(1, self.max_entries), Ordering::Relaxed);
    }

    /// Entries allocated over all regions.
    pub fn allocated(&self) -> usize {
        self.regions
            .iter()
            .map(|r| r.len.load(Ordering::Relaxed))
            .sum()
    }

    /// The entry a reference names.
    #[inline]
    pub fn entry(&self, r: u64) -> Entry<'_> {
        let region = &self.regions[region_of(r)];
        let i = (r & ENTRY_MASK) as usize;
        let chunk = region.chunks[i / CHUNK]
            .get()
            .expect("a reference names an allocated entry");
        let at = chunk.base + i % CHUNK * self.stride;
        Entry::new(&chunk.words[at..at + self.words])
    }

    fn reference(region: usize, i: usize) -> u64 {
        CACHE_REF | (region as u64) << REGION_SHIFT | i as u64
    }

    /// Pins the entry `r` if it still holds `key` as its latest version.
    #[inline]
    pub fn pin(&self, r: u64, key: u64) -> bool {
        let e = self.entry(r);
        let s = e.state().fetch_add(1, Ordering::AcqRel) + 1;
        if s & (VALID | EVICTING | COPIED) == VALID && e.key().load(Ordering::Relaxed) == key {
            if s & CLOCK == 0 {
                e.state().fetch_or(CLOCK, Ordering::AcqRel); // referenced (CLOCK, §3.2)
            }
            return true;
        }
        e.state().fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Releases a pin (the CLOCK bit was set when it was taken).
    #[inline]
    pub fn unpin(&self, r: u64) {
        self.entry(r).state().fetch_sub(1, Ordering::AcqRel);
    }

    /// Publishes a filled entry as VALID and referenced with `pins` pins.
    pub fn publish(&self, r: u64, pins: u64) {
        self.replace_flags(r, VALID | CLOCK, pins);
    }

    /// Sets the flag bits of `r`'s state to `flags` and adds `pins` pins, keeping the pin count
    /// it has. An entry being claimed or filled has no real pins, but it can carry transient
    /// ones: a [`pin`](Self::pin) that found the index still naming it adds one, sees that the
    /// entry is not VALID and takes the one back. A plain store would erase the count before it
    /// is taken back, and the late decrement would then remove a pin that the entry's new owner
    /// holds, letting CLOCK evict an entry a transaction is still using (an SI update then
    /// swapped the index away from an entry no longer in it: `tests/zen_api.rs`,
    /// `si_transfers_keep_the_total`).
    fn replace_flags(&self, r: u64, flags: u64, pins: u64) {
        let state = self.entry(r).state();
        let mut s = state.load(Ordering::Relaxed);
        loop {
            let next = flags | ((s & PINS) + pins);
            match state.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => s = now,
            }
        }
    }

    /// Marks a pinned entry superseded: the index no longer points at it.
    pub fn supersede(&self, r: u64) {
        self.entry(r).state().fetch_or(COPIED, Ordering::AcqRel);
    }

    /// Returns a claimed (EVICTING, unpublished) entry to the free state.
    pub fn release_claimed(&self, r: u64) {
        self.replace_flags(r, 0, 0);
    }

    /// An entry of `region` claimed for filling (state EVICTING, no pins): a never-used entry
    /// while the region is below its capacity, else the CLOCK victim (§3.2: the first entry
    /// whose active and clock bits are both clear, clearing clock bits on the way). A victim that
    /// is the latest version of its tuple is unlinked from `index` (the index then points at its
    /// NVM-tuple; nothing is written to NVM: committed versions are persisted at commit). When
    /// every entry is pinned the region grows past its capacity up to the hard limit
    /// ([`RegionExhausted`] beyond it: the long-running-transaction condition of §3.3.4).
    ///
    /// `overflowed` is set when the region had to grow past its capacity because every entry was
    /// pinned: the first detection condition of a long-running transaction (§3.3.4).
    pub fn claim(
        &self,
        region: usize,
        hand: &mut usize,
        index: &PrimaryIndex,
        overflowed: &mut bool,
    ) -> Result<u64, RegionExhausted> {
        let reg = &self.regions[region];
        let len = reg.len.load(Ordering::Relaxed);
        if len < self.capacity() {
            return Ok(self.grow(region));
        }
        for _ in 0..2 * len + 1 {
            *hand = if *hand + 1 >= len { 0 } else { *hand + 1 };
            let r = Self::reference(region, *hand);
            let e = self.entry(r);
            let s = e.state().load(Ordering::Acquire);
            if s & (PINS | EVICTING) != 0 {
                continue;
            }
            if s & CLOCK != 0 {
                e.state().fetch_and(!CLOCK, Ordering::AcqRel);
                continue;
            }
            if e.state()
                .compare_exchange(s, s | EVICTING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            if s & VALID != 0 && s & COPIED == 0 {
                let key = e.key().load(Ordering::Relaxed);
                let unlinked = index.replace_if(key, r, e.nvm().load(Ordering::Relaxed));
                debug_assert!(unlinked, "a current entry is the index's value for its key");
            }
            self.replace_flags(r, EVICTING, 0);
            return Ok(r);
        }
        if len < self.max_entries {
            *overflowed = true;
            return Ok(self.grow(region));
        }
        Err(RegionExhausted)
    }

    /// Claims `r` of `region` for filling (state EVICTING, no pins) without moving the CLOCK
    /// hand, when it holds nothing the index points at: never published, or superseded. For the
    /// entries a region's owner only used as write locks (`ZenWorker::claim_entry`): reusing one
    /// evicts nobody. False when `r` is not such an entry of `region` any more (pinned, claimed
    /// or published again since): the caller takes the CLOCK's victim instead.
    pub fn claim_unused(&self, region: usize, r: u64) -> bool {
        let i = (r & ENTRY_MASK) as usize;
        if region_of(r) != region || i >= self.regions[region].len.load(Ordering::Acquire) {
            return false;
        }
        let e = self.entry(r);
        let s = e.state().load(Ordering::Acquire);
        if s & (PINS | EVICTING) != 0 || s & (VALID | COPIED) == VALID {
            return false;
        }
        if e.state()
            .compare_exchange(s, s | EVICTING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.replace_flags(r, EVICTING, 0);
        true
    }

    fn grow(&self, region: usize) -> u64 {
        let reg = &self.regions[region];
        let i = reg.len.load(Ordering::Relaxed);
        let stride = self.stride;
        reg.chunks[i / CHUNK].get_or_init(|| Chunk::new(stride));
        let r = Self::reference(region, i);
        self.entry(r).state().store(EVICTING, Ordering::Release);
        reg.len.store(i + 1, Ordering::Release);
        r
    }
}

/// One table's demand, for [`split_budget`].
#[derive(Clone, Copy, Debug)]
pub struct TableDemand {
    /// DRAM bytes per cache entry.
    pub entry_bytes: u64,
    /// NVM bytes of the table (S_i).
    pub nvm_bytes: u64,
    /// Entries that would cache the whole table.
    pub rows: u64,
    /// Average tuples of the table accessed per transaction (f_i).
    pub accesses_per_txn: f64,
}

/// Splits a DRAM budget of `budget` bytes into cache entries per table (Zen §3.2): every table
/// first gets `min_entries` (C_min, so concurrency control always has entries to work in), then
/// the rest goes greedily to tables in descending order of f_i / S_i, the expected hits per byte
/// under uniform access, each taking at most what caches its whole table (the classic greedy
/// solution of the fractional knapsack the paper derives).
pub fn split_budget(budget: u64, tables: &[TableDemand], min_entries: u64) -> Vec<u64> {
    let mut out: Vec<u64> = vec![min_entries; tables.len()];
    let reserved: u64 = tables.iter().map(|t| min_entries * t.entry_bytes).sum();
    let mut left = budget.saturating_sub(reserved);
    let mut order: Vec<usize> = (0..tables.len()).collect();
    let density = |t: &TableDemand| {
        if t.nvm_bytes == 0 {
            0.0
        } else {
            t.accesses_per_txn / t.nvm_bytes as f64
        }
    };
    order.sort_by(|&a, &b| density(&tables[b]).total_cmp(&density(&tables[a])));
    for i in order {
        let t = &tables[i];
        if t.entry_bytes == 0 {
            continue;
        }
        let wanted = t.rows.saturating_sub(min_entries);
        let take = wanted.min(left / t.entry_bytes);
        out[i] += take;
        left -= take * t.entry_bytes;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::PrimaryIndexKind;

    #[test]
    fn knapsack_prefers_dense_tables_and_keeps_the_minimum() {
        let t = |rows: u64, f: f64| TableDemand {
            entry_bytes: 100,
            nvm_bytes: rows * 100,
            rows,
            accesses_per_txn: f,
        };
        // Table 1 is accessed as often but is 10x smaller: it is filled first.
        let split = split_budget(100 * 1_500, &[t(10_000, 1.0), t(1_000, 1.0)], 10);
        assert_eq!(
            split,
            vec![500, 1_000],
            "the dense table is cached whole first"
        );
        // With a hot large table the order flips.
        let split = split_budget(100 * 1_500, &[t(10_000, 100.0), t(1_000, 1.0)], 10);
        assert_eq!(split, vec![1_490, 10]);
        // A budget below the minimum still gives every table its minimum.
        assert_eq!(split_budget(0, &[t(5, 1.0), t(5, 0.0)], 4), vec![4, 4]);
    }

    #[test]
    fn clock_skips_pinned_and_recent_entries_and_unlinks_victims() {
        let index = PrimaryIndex::new(PrimaryIndexKind::Hash);
        let cache = MetCache::new(16, 2, 2, 4);
        cache.set_capacity(2);
        let mut hand = 0;
        let a = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        let b = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        assert_eq!(region_of(a), 1);
        for (r, key) in [(a, 7u64), (b, 8u64)] {
            let e = cache.entry(r);
            e.key().store(key, Ordering::Relaxed);
            e.nvm().store(4096 * key, Ordering::Relaxed);
            cache.publish(r, 0);
            index.insert_new(key, r).unwrap();
        }
        assert!(cache.pin(a, 7));
        assert!(!cache.pin(a, 8), "wrong key");
        cache.unpin(a); // a: CLOCK set
        assert!(cache.pin(b, 8)); // b: pinned
        let v = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        assert_eq!(
            v, a,
            "a's clock bit was cleared on the first pass, b is pinned"
        );
        assert_eq!(
            index.get(7),
            Some(4096 * 7),
            "the victim's key points at NVM again"
        );
        assert!(!cache.pin(a, 7), "a claimed entry cannot be pinned");
        // Everything pinned: the region grows past its capacity up to the hard limit.
        cache.publish(v, 1);
        let g = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        assert_ne!(g, a);
        assert_ne!(g, b);
    }

    /// A blind overwrite's lock-only entry is reused without the CLOCK only while it caches
    /// nothing and nobody holds it: never a current entry, a pinned or claimed one, or one of
    /// another region.
    #[test]
    fn claim_unused_takes_only_free_or_superseded_entries_of_its_region() {
        let index = PrimaryIndex::new(PrimaryIndexKind::Hash);
        let cache = MetCache::new(16, 2, 2, 4);
        cache.set_capacity(4);
        let mut hand = 0;
        let r = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        assert!(!cache.claim_unused(1, r), "a claimed entry is not free");
        let e = cache.entry(r);
        e.key().store(7, Ordering::Relaxed);
        cache.publish(r, 1);
        index.insert_new(7, r).unwrap();
        assert!(!cache.claim_unused(1, r), "a pinned current entry");
        cache.unpin(r);
        assert!(!cache.claim_unused(1, r), "a current entry caches its row");
        assert!(cache.pin(r, 7));
        cache.supersede(r);
        assert!(!cache.claim_unused(1, r), "superseded but still pinned");
        cache.unpin(r);
        assert!(!cache.claim_unused(0, r), "an entry of another region");
        assert!(cache.claim_unused(1, r), "superseded and unpinned: free");
        assert_eq!(
            cache.entry(r).state().load(Ordering::Relaxed),
            EVICTING,
            "claimed, as from the CLOCK"
        );
        assert!(!cache.claim_unused(1, r), "claimed once only");
        let never = CACHE_REF | 1 << REGION_SHIFT | 3;
        assert!(
            !cache.claim_unused(1, never),
            "an entry the region has not allocated"
        );
        assert_eq!(index.get(7), Some(r), "the index is left alone");
    }

    /// A failed pin's add and take-back straddling a claim, a publish or a release: the
    /// owner's pin must survive (a plain store of the state word lost it, and CLOCK then
    /// evicted an entry that a transaction was still using).
    #[test]
    fn a_failed_pin_taken_back_late_leaves_the_owners_pin() {
        let index = PrimaryIndex::new(PrimaryIndexKind::Hash);
        let cache = MetCache::new(16, 2, 2, 4);
        cache.set_capacity(1);
        let mut hand = 0;
        let r = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        let e = cache.entry(r);
        e.key().store(7, Ordering::Relaxed);
        cache.publish(r, 0);
        index.insert_new(7, r).unwrap();
        let pins = |r| cache.entry(r).state().load(Ordering::Relaxed) & PINS;

        // A reader found `r` in the index; the entry is claimed (evicted) before its add lands.
        let v = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        assert_eq!(v, r);
        e.state().fetch_add(1, Ordering::AcqRel); // the reader's add: sees EVICTING
                                                  // The claimer fills the entry for key 7 again and publishes it with its own pin...
        cache.publish(r, 1);
        // ...and only then does the reader take its add back.
        e.state().fetch_sub(1, Ordering::AcqRel);
        assert_eq!(pins(r), 1, "the publisher's pin survives a late take-back");
        assert!(
            cache.claim(1, &mut hand, &index, &mut false).unwrap() != r,
            "a pinned entry is never a victim"
        );

        // The same straddling a claim's own flag change and a release of a claimed entry.
        let q = cache.claim(1, &mut hand, &index, &mut false).unwrap();
        let f = cache.entry(q);
        f.state().fetch_add(1, Ordering::AcqRel);
        cache.release_claimed(q);
        f.state().fetch_sub(1, Ordering::AcqRel);
        assert_eq!(
            f.state().load(Ordering::Relaxed),
            0,
            "free, with no stray count"
        );
    }
}
