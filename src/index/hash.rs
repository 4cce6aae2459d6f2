//! [`HashIndex`]: a concurrent u64 → u64 hash map for point lookups.
//!
//! Built for the engines' access pattern: far more lookups than changes, lookups on the critical
//! path of every read. A lookup costs one cache miss in the common case and writes nothing
//! shared:
//!
//! - **Cache-line buckets.** A bucket is one 64-byte line holding a version word, a slot-state
//!   word and three key/address pairs; keys probe linearly from their home bucket, so a lookup
//!   reads the line it needs and rarely a second.
//! - **Optimistic reads.** A writer bumps a bucket's version to odd while it changes the bucket
//!   and to even after (a seqlock); a reader reads the bucket and retries it if the version moved.
//!   Readers take no lock, so threads reading the same keys do not bounce a lock line (DashMap's
//!   shard read lock did, and with its two-step control-byte probe cost a fifth of TPC-C's
//!   cycles; issue 13).
//! - **Sharded writers.** The key's hash picks a shard; a writer holds its shard's mutex, so
//!   conditional updates (`insert_new`, `remove_if`, `replace_if`) are atomic per key.
//! - **Growth without epochs or reference counts.** A shard's buckets live in type-stable
//!   segments that double the table as it grows and are freed only with the index. A shard
//!   grows (or sheds tombstones) in place under its writer lock, with a shard-wide seqlock word
//!   that readers validate after their bucket read, so a lookup takes no pin and writes nothing
//!   (it used to load the table through `arc-swap`, two locked instructions per lookup; issue
//!   13). Readers of that shard wait while it is rebuilt, which growth makes rare.

use std::fmt;
use std::sync::OnceLock;

use super::sync::{fence, spin, AtomicU64, AtomicUsize, Mutex, Ordering};

use super::{mix64, IndexError};

/// Fewest shards: even a single-threaded engine gets a few, so that recovery threads and the
/// first workers rarely meet on one lock. (The loom model uses one shard of one bucket, so that a
/// few keys make it grow.)
#[cfg(not(loom))]
const MIN_SHARDS: usize = 8;
#[cfg(loom)]
const MIN_SHARDS: usize = 1;
/// Most shards: each costs a table and a lock, and writers rarely meet at 4 shards per thread.
#[cfg(not(loom))]
const MAX_SHARDS: usize = 64;
#[cfg(loom)]
const MAX_SHARDS: usize = 1;
/// Key/address pairs per bucket.
const SLOTS: usize = 3;
/// Slot states, two bits each in a bucket's `states` word.
const EMPTY: u64 = 0;
const FULL: u64 = 1;
/// Removed: probing continues past it (a key further along may have probed through it).
const TOMBSTONE: u64 = 2;
/// A table is rebuilt once full and tombstoned slots exceed this share of its slots (in eighths);
/// it is sized so that the live entries then fill at most half of it.
const MAX_USED_EIGHTHS: usize = 6;
/// Buckets of a shard's first table.
#[cfg(not(loom))]
const MIN_BUCKETS: usize = 4;
#[cfg(loom)]
const MIN_BUCKETS: usize = 1;

/// Four shards per hardware thread keeps the chance that two writers want the same shard low;
/// the clamp bounds the fixed cost on big machines and tiny tables.
fn shard_count() -> usize {
    let threads = std::thread::available_parallelism().map_or(MIN_SHARDS / 4, usize::from);
    (threads * 4)
        .next_power_of_two()
        .clamp(MIN_SHARDS, MAX_SHARDS)
}

/// `per_shard` entries plus headroom: hashed keys fill shards unevenly (binomially), so four
/// standard deviations more.
fn with_headroom(per_shard: usize) -> usize {
    per_shard + 4 * (per_shard as f64).sqrt().ceil() as usize
}

/// A new index's hash seed (a loom model must replay identically: a fixed seed there).
fn new_seed() -> u64 {
    if cfg!(loom) {
        0
    } else {
        rand::random()
    }
}

/// An entry of a bulk build with its hash, computed once: the shard and the home bucket both
/// come from it.
type Hashed = (u64, u64, u64);

/// A counting sort: puts `items` into `out` ordered by `group_of` (below `groups`), keeping
/// their order within a group, and returns where each group starts in `out` (`groups + 1`
/// offsets). `group_of` runs twice per item (count, then place), so it should be cheap: a
/// shift of a stored hash.
fn counting_scatter<T: Copy + Default>(
    items: impl Iterator<Item = T> + Clone,
    groups: usize,
    group_of: impl Fn(&T) -> usize,
    out: &mut Vec<T>,
) -> Vec<usize> {
    let mut starts = vec![0usize; groups + 1];
    for item in items.clone() {
        starts[group_of(&item) + 1] += 1;
    }
    for g in 0..groups {
        starts[g + 1] += starts[g];
    }
    let mut next = starts.clone();
    out.clear();
    out.resize(starts[groups], T::default());
    for item in items {
        let g = group_of(&item);
        out[next[g]] = item;
        next[g] += 1;
    }
    starts
}

/// Puts a shard's `entries` into `out` ordered by the top bits of their home bucket in a table
/// of `buckets` (up to 10 bits, 1,024 groups), so that a bulk build fills the table front to
/// back: placed in the entries' own order, each one was a cache and TLB miss into a table of
/// megabytes. Linear probing without removals finds a key whatever order the keys were placed
/// in, so only the speed changes.
fn in_bucket_order<'a>(
    entries: impl Iterator<Item = &'a Hashed> + Clone,
    buckets: usize,
    out: &mut Vec<Hashed>,
) {
    let bits = buckets.trailing_zeros().min(10);
    let shift = buckets.trailing_zeros() - bits;
    let group = |e: &Hashed| (e.0 as usize & (buckets - 1)) >> shift;
    counting_scatter(entries.copied(), 1 << bits, group, out);
}

/// One cache line: seqlock version, slot states and three pairs.
#[repr(align(64))]
#[derive(Default)]
struct Bucket {
    version: AtomicU64,
    states: AtomicU64,
    keys: [AtomicU64; SLOTS],
    addrs: [AtomicU64; SLOTS],
}

impl Bucket {
    fn state(states: u64, slot: usize) -> u64 {
        (states >> (2 * slot)) & 3
    }

    /// Starts a change (writers hold the shard lock, so there is no writer to race).
    fn begin_write(&self) {
        self.version.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    fn end_write(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    fn set_state(&self, slot: usize, state: u64) {
        let states = self.states.load(Ordering::Relaxed);
        let states = (states & !(3 << (2 * slot))) | (state << (2 * slot));
        self.states.store(states, Ordering::Relaxed);
    }
}

/// What a consistent read of one bucket found for a key.
enum Probe {
    /// The key, in this slot, with this address.
    Found(usize, u64),
    /// Not here, and this bucket has an empty slot: the key is nowhere further.
    Absent,
    /// Not here; probing goes on.
    Continue,
}

/// Segments of a shard's table. Segment 0 holds [`MIN_BUCKETS`] buckets and segment `s >= 1`
/// holds `MIN_BUCKETS << (s - 1)`, so a table of `MIN_BUCKETS << k` buckets is segments `0..=k`
/// and doubling it adds one segment as large as all the others together. 30 segments reach
/// 2^31 buckets (128 GiB) per shard.
const SEGMENTS: usize = 30;
/// log2 of [`MIN_BUCKETS`].
const MIN_BUCKETS_LOG2: u32 = MIN_BUCKETS.trailing_zeros();
/// A shard's state word: bit 0 is set while its table is rebuilt, bits 1..7 hold log2 of its
/// bucket count, the rest count rebuilds (so a reader sees any rebuild it overlapped).
const REBUILDING: u64 = 1;
const SIZE_SHIFT: u32 = 1;
const SIZE_MASK: u64 = 0x3f;
const SEQ_ONE: u64 = 1 << 7;

/// Where bucket `b` lives: its segment and the offset in it.
#[inline]
fn locate(b: usize) -> (usize, usize) {
    let above = b >> MIN_BUCKETS_LOG2;
    if above == 0 {
        (0, b)
    } else {
        let s = above.ilog2();
        (s as usize + 1, b - (MIN_BUCKETS << s))
    }
}

/// A shard's open-addressing table as of one state word: `mask + 1` buckets in the shard's
/// segments.
#[derive(Clone, Copy)]
struct Table<'a> {
    shard: &'a Shard,
    mask: usize,
}

impl<'a> Table<'a> {
    /// Buckets so that `entries` fill at most half the slots (a power of two).
    fn buckets_for(entries: usize) -> usize {
        (entries * 2)
            .div_ceil(SLOTS)
            .next_power_of_two()
            .max(MIN_BUCKETS)
    }

    fn len(&self) -> usize {
        self.mask + 1
    }

    /// Bucket `b` (below `len`). Every segment of the table exists before a state word that
    /// names its size is published, and segments are freed only with the index.
    #[inline]
    fn bucket(&self, b: usize) -> &'a Bucket {
        let (segment, at) = locate(b);
        &self.shard.segments[segment]
            .get()
            .expect("a published table size has all its segments")[at]
    }

    /// Reads bucket `b` consistently for `key`.
    #[inline]
    fn probe(&self, b: usize, key: u64) -> Probe {
        let bucket = self.bucket(b);
        loop {
            let v = bucket.version.load(Ordering::Acquire);
            if v & 1 != 0 {
                spin();
                continue;
            }
            let states = bucket.states.load(Ordering::Relaxed);
            let mut probe = Probe::Continue;
            for slot in 0..SLOTS {
                match Bucket::state(states, slot) {
                    FULL if bucket.keys[slot].load(Ordering::Relaxed) == key => {
                        probe = Probe::Found(slot, bucket.addrs[slot].load(Ordering::Relaxed));
                        break;
                    }
                    EMPTY => probe = Probe::Absent,
                    _ => {}
                }
            }
            fence(Ordering::Acquire);
            if bucket.version.load(Ordering::Relaxed) == v {
                return probe;
            }
        }
    }

    /// Where `key` is: its bucket, slot and address.
    #[inline]
    fn find(&self, hash: u64, key: u64) -> Option<(usize, usize, u64)> {
        let mask = self.mask;
        let mut b = hash as usize & mask;
        for _ in 0..self.len() {
            match self.probe(b, key) {
                Probe::Found(slot, addr) => return Some((b, slot, addr)),
                Probe::Absent => return None,
                Probe::Continue => b = (b + 1) & mask,
            }
        }
        None
    }

    /// Puts a key known absent into the first free slot of its probe sequence. The caller holds
    /// the shard lock and has made sure there is room.
    fn place(&self, hash: u64, key: u64, addr: u64) {
        let mask = self.mask;
        let mut b = hash as usize & mask;
        loop {
            let bucket = self.bucket(b);
            let states = bucket.states.load(Ordering::Relaxed);
            if let Some(slot) = (0..SLOTS).find(|&s| Bucket::state(states, s) != FULL) {
                if Bucket::state(states, slot) == EMPTY {
                    self.shard.used.fetch_add(1, Ordering::Relaxed);
                }
                bucket.begin_write();
                bucket.keys[slot].store(key, Ordering::Relaxed);
                bucket.addrs[slot].store(addr, Ordering::Relaxed);
                bucket.set_state(slot, FULL);
                bucket.end_write();
                return;
            }
            b = (b + 1) & mask;
        }
    }

    /// Puts `key` into the first free slot of its probe sequence in a table no other thread
    /// can see yet (a bulk build: no reader to fence off, no lock, no tombstone), unless it is
    /// there already; returns whether it was put. The caller has sized the table.
    fn place_private(&self, hash: u64, key: u64, addr: u64) -> bool {
        let mask = self.mask;
        let mut b = hash as usize & mask;
        loop {
            let bucket = self.bucket(b);
            let states = bucket.states.load(Ordering::Relaxed);
            for slot in 0..SLOTS {
                if Bucket::state(states, slot) == FULL {
                    if bucket.keys[slot].load(Ordering::Relaxed) == key {
                        return false;
                    }
                    continue;
                }
                // Slots fill in order and nothing is removed: this one and the rest are empty,
                // so the key is nowhere further along either.
                bucket.keys[slot].store(key, Ordering::Relaxed);
                bucket.addrs[slot].store(addr, Ordering::Relaxed);
                bucket.set_state(slot, FULL);
                return true;
            }
            b = (b + 1) & mask;
        }
    }

    fn for_each_entry(&self, mut f: impl FnMut(u64, u64)) {
        for b in 0..self.len() {
            let bucket = self.bucket(b);
            let states = bucket.states.load(Ordering::Relaxed);
            for slot in 0..SLOTS {
                if Bucket::state(states, slot) == FULL {
                    f(
                        bucket.keys[slot].load(Ordering::Relaxed),
                        bucket.addrs[slot].load(Ordering::Relaxed),
                    );
                }
            }
        }
    }
}

/// One shard: its table's segments, the state word readers validate against, and the lock its
/// writers hold.
struct Shard {
    /// Rebuild bit, log2 of the bucket count and rebuild count (see [`REBUILDING`]).
    state: AtomicU64,
    /// Type-stable bucket storage (see [`SEGMENTS`]): allocated as the table doubles, freed
    /// only with the index, so a reader never needs a reference count or an epoch pin to read
    /// it (issue 13: `arc-swap`'s per-lookup debt slot cost two locked instructions).
    segments: [OnceLock<Box<[Bucket]>>; SEGMENTS],
    /// Full plus tombstoned slots (changed under the writer lock only).
    used: AtomicUsize,
    writer: Mutex<()>,
    len: AtomicUsize,
}

impl Shard {
    fn with_buckets(buckets: usize) -> Shard {
        let shard = Shard {
            state: AtomicU64::new(0),
            segments: std::array::from_fn(|_| OnceLock::new()),
            used: AtomicUsize::new(0),
            writer: Mutex::new(()),
            len: AtomicUsize::new(0),
        };
        shard.allocate(buckets);
        shard.state.store(
            u64::from(buckets.trailing_zeros()) << SIZE_SHIFT,
            Ordering::Relaxed,
        );
        shard
    }

    /// Makes sure the segments of a table of `buckets` (a power of two) exist.
    fn allocate(&self, buckets: usize) {
        let (last, _) = locate(buckets - 1);
        assert!(
            last < SEGMENTS,
            "a hash shard of {buckets} buckets exceeds its {SEGMENTS} segments"
        );
        for (s, segment) in self.segments[..=last].iter().enumerate() {
            let size = if s == 0 {
                MIN_BUCKETS
            } else {
                MIN_BUCKETS << (s - 1)
            };
            segment.get_or_init(|| super::slice_on_huge_pages(size, Bucket::default));
        }
    }

    /// The table a state word describes.
    #[inline]
    fn table(&self, state: u64) -> Table<'_> {
        Table {
            shard: self,
            mask: (1usize << ((state >> SIZE_SHIFT) & SIZE_MASK)) - 1,
        }
    }

    /// The current table, for a writer (who holds the lock, so it cannot change).
    fn locked_table(&self) -> Table<'_> {
        self.table(self.state.load(Ordering::Relaxed))
    }

    /// Calls `f` on the current table and returns its result once no rebuild overlapped the
    /// call (a seqlock over the whole shard; each bucket has its own for ordinary writes).
    #[inline]
    fn read<R>(&self, mut f: impl FnMut(Table<'_>) -> R) -> R {
        loop {
            let state = self.state.load(Ordering::Acquire);
            if state & REBUILDING != 0 {
                spin();
                continue;
            }
            let result = f(self.table(state));
            fence(Ordering::Acquire);
            if self.state.load(Ordering::Relaxed) == state {
                return result;
            }
        }
    }

    /// Rebuilds the table in place under the writer lock, with `buckets` (at least the current
    /// count): tombstones are dropped and every entry rehashed. Readers wait meanwhile (they see
    /// the rebuild bit), which is the price of never freeing a table under them; growth is
    /// geometric, so this is rare.
    /// With `keep` false every entry is dropped instead (`clear`).
    fn rebuild(&self, hash: impl Fn(u64) -> u64, buckets: usize, keep: bool) {
        let old = self.locked_table();
        let mut entries = Vec::new();
        if keep {
            entries.reserve(self.len.load(Ordering::Relaxed));
            old.for_each_entry(|k, a| entries.push((k, a)));
        }
        // New segments are allocated (zeroed) before readers are held off.
        self.allocate(buckets);
        let state = self.state.load(Ordering::Relaxed);
        self.state.store(state | REBUILDING, Ordering::Relaxed);
        fence(Ordering::Release);
        for b in 0..old.len() {
            old.bucket(b).states.store(0, Ordering::Relaxed);
        }
        self.used.store(0, Ordering::Relaxed);
        let seq = (state & !(SEQ_ONE - 1)) + SEQ_ONE;
        let new_state = seq | (u64::from(buckets.trailing_zeros()) << SIZE_SHIFT);
        let new = self.table(new_state);
        for (k, a) in entries {
            new.place(hash(k), k, a);
        }
        self.state.store(new_state, Ordering::Release);
    }
}

/// A concurrent hash map from an 8-byte primary key to an 8-byte tuple address (see the module
/// documentation for its design).
///
/// Lookups take no lock. Each mutation locks its key's shard, so every method is atomic with
/// respect to the others on the same key. No key order is kept; use
/// [`OrderedIndex`](super::OrderedIndex) for range scans.
pub struct HashIndex {
    shards: Box<[Shard]>,
    shard_shift: u32,
    /// Per-index random seed: two indexes never share a bucket order, which would make copying
    /// one into another (iterate one, insert into the other) degrade to quadratic probing.
    seed: u64,
}

impl HashIndex {
    /// Creates an empty index.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// Creates an empty index that holds `capacity` entries without growing, so that recovery can
    /// presize it from the number of rows it is about to insert.
    pub fn with_capacity(capacity: usize) -> Self {
        let shards = shard_count();
        let per_shard = with_headroom(capacity.div_ceil(shards));
        Self {
            shards: (0..shards)
                .map(|_| Shard::with_buckets(Table::buckets_for(per_shard)))
                .collect(),
            shard_shift: 64 - shards.trailing_zeros(),
            seed: new_seed(),
        }
    }

    /// Builds an index holding `entries` (key, address; keys distinct, in any order) that takes
    /// `spare` more entries without growing. The entries are split by shard, then each shard's
    /// table is sized for its own share and filled by one thread, the shards in parallel, with
    /// no lock, seqlock bump or growth per entry (FIR §4.4.2: recovery rebuilds an index from
    /// its checkpoint's entries multi-threaded and without contention). Inserting them one by
    /// one into a shared index cost a lock and a cache miss into a table of the whole index's
    /// size per entry. An error names a key given twice.
    pub fn from_entries(entries: &[(u64, u64)], spare: usize) -> Result<Self, IndexError> {
        Self::from_entries_by(entries, |&pair| pair, spare)
    }

    /// [`from_entries`](Self::from_entries) over records of any type, `key_addr` giving each
    /// one's key and address: FIR's recovery builds from its checkpoint's entries where they
    /// were read, without a copy of the pairs (16 MiB of fresh memory per million keys).
    pub fn from_entries_by<T: Sync>(
        entries: &[T],
        key_addr: impl Fn(&T) -> (u64, u64) + Sync,
        spare: usize,
    ) -> Result<Self, IndexError> {
        let key_addr = &key_addr;
        let shard_total = shard_count();
        // The index without its shards yet: its `hash` and `shard_of` place every entry where
        // lookups will look for it.
        let mut index = Self {
            shards: Box::new([]),
            shard_shift: 64 - shard_total.trailing_zeros(),
            seed: new_seed(),
        };
        let shell = &index;
        let hash = |key: u64| shell.hash(key);
        let shard_of = |h: u64| shell.shard_of(h);
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(shard_total);
        let spare_per_shard = spare.div_ceil(shard_total);
        // Each thread splits its part of the entries by shard, each entry with its hash (made
        // here and kept: the split's count and scatter hash each key, nothing after them), then
        // builds every `threads`-th shard from all the parts.
        let part_len = entries.len().div_ceil(threads).max(1);
        let parts: Vec<(Vec<Hashed>, Vec<usize>)> = std::thread::scope(|s| {
            entries
                .chunks(part_len)
                .map(|part| {
                    s.spawn(move || {
                        let hashed = part.iter().map(|e| {
                            let (key, addr) = key_addr(e);
                            (hash(key), key, addr)
                        });
                        let mut by_shard = Vec::new();
                        let starts =
                            counting_scatter(hashed, shard_total, |e| shard_of(e.0), &mut by_shard);
                        (by_shard, starts)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let parts = &parts;
        let built: Vec<Result<Vec<(usize, Shard)>, IndexError>> = std::thread::scope(|s| {
            (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        let mut ordered = Vec::new();
                        (t..shard_total)
                            .step_by(threads)
                            .map(|shard_index| {
                                let mine = || {
                                    parts.iter().flat_map(move |(by_shard, starts)| {
                                        &by_shard[starts[shard_index]..starts[shard_index + 1]]
                                    })
                                };
                                let count = parts
                                    .iter()
                                    .map(|(_, starts)| {
                                        starts[shard_index + 1] - starts[shard_index]
                                    })
                                    .sum();
                                let buckets =
                                    Table::buckets_for(count + with_headroom(spare_per_shard));
                                let shard = Shard::with_buckets(buckets);
                                let table = shard.locked_table();
                                in_bucket_order(mine(), buckets, &mut ordered);
                                for &(h, key, addr) in &ordered {
                                    if !table.place_private(h, key, addr) {
                                        return Err(IndexError::BulkDuplicateKey(key));
                                    }
                                }
                                shard.used.store(count, Ordering::Relaxed);
                                shard.len.store(count, Ordering::Relaxed);
                                Ok((shard_index, shard))
                            })
                            .collect()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut shards = Vec::with_capacity(shard_total);
        for part in built {
            shards.extend(part?);
        }
        shards.sort_unstable_by_key(|(i, _)| *i);
        index.shards = shards.into_iter().map(|(_, shard)| shard).collect();
        Ok(index)
    }

    #[inline]
    fn hash(&self, key: u64) -> u64 {
        mix64(key ^ self.seed)
    }

    /// The shard of a hash: its top bits (the bucket uses the low ones).
    #[inline]
    fn shard_of(&self, hash: u64) -> usize {
        hash.checked_shr(self.shard_shift).unwrap_or(0) as usize
    }

    /// Returns the address stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        let hash = self.hash(key);
        self.shards[self.shard_of(hash)]
            .read(|table| table.find(hash, key).map(|(_, _, addr)| addr))
    }

    /// Starts loading the bucket where `key` would be, so that a later [`get`](Self::get) finds
    /// it in the cache: a transaction that knows its keys issues these first and overlaps the
    /// misses. A hint: a concurrent rebuild may make it load the wrong line, never a wrong result.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        let hash = self.hash(key);
        let shard = &self.shards[self.shard_of(hash)];
        // Acquire: a state naming a grown table must also show that table's new segments.
        let table = shard.table(shard.state.load(Ordering::Acquire));
        crate::pmem::prefetch(table.bucket(hash as usize & table.mask));
    }

    /// Runs `f` on `key`'s shard under its writer lock, with the current table and where the key
    /// is in it.
    fn write<R>(
        &self,
        key: u64,
        f: impl FnOnce(&Shard, Table<'_>, u64, Option<(usize, usize, u64)>) -> R,
    ) -> R {
        let hash = self.hash(key);
        let shard = &self.shards[self.shard_of(hash)];
        let _writer = shard.writer.lock();
        let table = shard.locked_table();
        let found = table.find(hash, key);
        f(shard, table, hash, found)
    }

    /// Adds an absent key under the shard lock, first rebuilding the table if it is too full.
    /// A table never shrinks (its segments stay allocated anyway): a rebuild for tombstones
    /// keeps its size.
    fn add(&self, shard: &Shard, table: Table<'_>, hash: u64, key: u64, addr: u64) {
        let slots = table.len() * SLOTS;
        if (shard.used.load(Ordering::Relaxed) + 1) * 8 > slots * MAX_USED_EIGHTHS {
            let live = shard.len.load(Ordering::Relaxed) + 1;
            shard.rebuild(
                |k| self.hash(k),
                Table::buckets_for(live).max(table.len()),
                true,
            );
            shard.locked_table().place(hash, key, addr);
        } else {
            table.place(hash, key, addr);
        }
        shard.len.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes the entry at (`b`, `slot`) under the shard lock.
    fn take(shard: &Shard, table: Table<'_>, b: usize, slot: usize) {
        let bucket = table.bucket(b);
        bucket.begin_write();
        bucket.set_state(slot, TOMBSTONE);
        bucket.end_write();
        shard.len.fetch_sub(1, Ordering::Relaxed);
    }

    /// Sets the address at (`b`, `slot`) under the shard lock.
    fn set(table: Table<'_>, b: usize, slot: usize, addr: u64) {
        let bucket = table.bucket(b);
        bucket.begin_write();
        bucket.addrs[slot].store(addr, Ordering::Relaxed);
        bucket.end_write();
    }

    /// Inserts `key → addr` only if `key` is absent; otherwise leaves the index unchanged and
    /// returns the address already stored.
    pub fn insert_new(&self, key: u64, addr: u64) -> Result<(), u64> {
        self.write(key, |shard, table, hash, found| match found {
            Some((_, _, existing)) => Err(existing),
            None => {
                self.add(shard, table, hash, key, addr);
                Ok(())
            }
        })
    }

    /// Stores `key → addr` whether or not `key` is present, returning the previous address.
    pub fn upsert(&self, key: u64, addr: u64) -> Option<u64> {
        self.write(key, |shard, table, hash, found| match found {
            Some((b, slot, previous)) => {
                Self::set(table, b, slot, addr);
                Some(previous)
            }
            None => {
                self.add(shard, table, hash, key, addr);
                None
            }
        })
    }

    /// Removes `key`, returning its address.
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.write(key, |shard, table, _, found| {
            let (b, slot, addr) = found?;
            Self::take(shard, table, b, slot);
            Some(addr)
        })
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    ///
    /// Lets a transaction delete the version it saw without clobbering a newer one.
    pub fn remove_if(&self, key: u64, addr: u64) -> bool {
        self.write(key, |shard, table, _, found| match found {
            Some((b, slot, stored)) if stored == addr => {
                Self::take(shard, table, b, slot);
                true
            }
            _ => false,
        })
    }

    /// Replaces the address of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    ///
    /// Out-of-place engines use it to swing a key to a new tuple version, compare-and-swap style.
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        self.write(key, |_, table, _, found| match found {
            Some((b, slot, stored)) if stored == expected => {
                Self::set(table, b, slot, new);
                true
            }
            _ => false,
        })
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.len.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether the index holds no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry, keeping each shard's table size for a rebuild.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let _writer = shard.writer.lock();
            let buckets = shard.locked_table().len();
            shard.rebuild(|k| self.hash(k), buckets, false);
            shard.len.store(0, Ordering::Relaxed);
        }
    }

    /// Calls `f(key, addr)` for every entry, in no particular order.
    ///
    /// Each shard is copied under its writer lock and visited after, so `f` may modify the
    /// index. Not a snapshot across shards: entries changed concurrently in shards not yet
    /// visited may or may not be seen.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        let mut entries = Vec::new();
        for shard in self.shards.iter() {
            entries.clear();
            {
                let _writer = shard.writer.lock();
                shard
                    .locked_table()
                    .for_each_entry(|k, a| entries.push((k, a)));
            }
            for &(k, a) in &entries {
                f(k, a);
            }
        }
    }

    /// DRAM bytes used by the index: every shard's allocated segments (64 bytes a bucket) plus
    /// the fixed part.
    pub fn memory_bytes(&self) -> usize {
        let buckets: usize = self
            .shards
            .iter()
            .flat_map(|s| s.segments.iter().filter_map(OnceLock::get))
            .map(|segment| segment.len())
            .sum();
        std::mem::size_of::<Self>()
            + self.shards.len() * std::mem::size_of::<Shard>()
            + buckets * std::mem::size_of::<Bucket>()
    }
}

impl Default for HashIndex {
    fn default() -> Self {
        Self::new()
    }
}

// Summarise instead of printing every entry.
impl fmt::Debug for HashIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashIndex")
            .field("len", &self.len())
            .field("shards", &self.shards.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_new_refuses_duplicates_and_reports_the_existing_addr() {
        let index = HashIndex::new();
        assert_eq!(index.insert_new(7, 100), Ok(()));
        assert_eq!(index.insert_new(7, 200), Err(100));
        assert_eq!(index.get(7), Some(100));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn upsert_and_remove_return_the_previous_addr() {
        let index = HashIndex::new();
        assert_eq!(index.upsert(1, 10), None);
        assert_eq!(index.upsert(1, 11), Some(10));
        assert_eq!(index.get(1), Some(11));
        assert_eq!(index.remove(1), Some(11));
        assert_eq!(index.remove(1), None);
        assert_eq!(index.get(1), None);
        assert!(index.is_empty());
    }

    #[test]
    fn remove_if_needs_the_exact_addr() {
        let index = HashIndex::new();
        index.upsert(3, 30);
        assert!(!index.remove_if(3, 31));
        assert_eq!(index.get(3), Some(30));
        assert!(!index.remove_if(4, 30));
        assert!(index.remove_if(3, 30));
        assert_eq!(index.get(3), None);
        assert!(!index.remove_if(3, 30));
    }

    #[test]
    fn replace_if_swaps_only_the_expected_addr_and_never_inserts() {
        let index = HashIndex::new();
        index.upsert(5, 50);
        assert!(!index.replace_if(5, 49, 51));
        assert_eq!(index.get(5), Some(50));
        assert!(index.replace_if(5, 50, 51));
        assert_eq!(index.get(5), Some(51));
        assert!(!index.replace_if(6, 0, 60));
        assert_eq!(index.get(6), None);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn clear_and_for_each_see_every_entry() {
        let index = HashIndex::with_capacity(1000);
        for key in 0..1000 {
            index.insert_new(key, key * 2).unwrap();
        }
        let mut sum = 0;
        let mut visited = 0;
        index.for_each(|key, addr| {
            assert_eq!(addr, key * 2);
            sum += key;
            visited += 1;
        });
        assert_eq!((visited, sum), (1000, 999 * 1000 / 2));
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.get(10), None);
    }

    #[test]
    fn with_capacity_presizes_every_shard() {
        let index = HashIndex::with_capacity(100_000);
        let before = index.memory_bytes();
        for key in 0..100_000 {
            index.upsert(key, key);
        }
        assert_eq!(index.memory_bytes(), before, "presized index must not grow");
    }

    #[test]
    fn strided_keys_spread_over_the_shards() {
        // Composite keys often share their low bits; the hash must not map them together.
        let index = HashIndex::new();
        let shards: std::collections::HashSet<usize> = (0..256u64)
            .map(|k| index.shard_of(index.hash(k << 24)))
            .collect();
        assert_eq!(shards.len(), index.shards.len());
    }

    #[test]
    fn churn_through_tombstones_keeps_lookups_exact() {
        // Insert and remove a sliding window many times the table size: tombstones must be
        // reclaimed by rebuilds, and no removed key may come back.
        let index = HashIndex::new();
        for key in 0..200_000u64 {
            index.insert_new(key, key).unwrap();
            if key >= 100 {
                assert_eq!(index.remove(key - 100), Some(key - 100));
            }
        }
        assert_eq!(index.len(), 100);
        for key in 0..200_000u64 {
            assert_eq!(index.get(key), (key >= 199_900).then_some(key));
        }
        assert!(
            index.memory_bytes() < 64 << 10,
            "{} bytes",
            index.memory_bytes()
        );
    }

    /// Applies point operation `op` (insert_new, upsert, remove, remove_if, replace_if) to the
    /// index and to a `HashMap` model; checks that they agree on its result and on the key after.
    fn check_op(
        index: &HashIndex,
        model: &mut std::collections::HashMap<u64, u64>,
        op: u8,
        key: u64,
        addr: u64,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        match op {
            0 => {
                let expected = model.get(&key).copied();
                proptest::prop_assert_eq!(index.insert_new(key, addr).err(), expected);
                model.entry(key).or_insert(addr);
            }
            1 => proptest::prop_assert_eq!(index.upsert(key, addr), model.insert(key, addr)),
            2 => proptest::prop_assert_eq!(index.remove(key), model.remove(&key)),
            3 => {
                let hit = model.get(&key) == Some(&addr);
                if hit {
                    model.remove(&key);
                }
                proptest::prop_assert_eq!(index.remove_if(key, addr), hit);
            }
            _ => {
                let hit = model.get(&key) == Some(&addr);
                if hit {
                    model.insert(key, addr + 1);
                }
                proptest::prop_assert_eq!(index.replace_if(key, addr, addr + 1), hit);
            }
        }
        proptest::prop_assert_eq!(index.get(key), model.get(&key).copied());
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Point operations against a `HashMap`, over a key space that fills, grows and churns
        /// a few buckets of every shard.
        #[test]
        fn matches_a_hashmap(ops in proptest::collection::vec((0u8..5, 0u64..400, 0u64..3), 1..3_000)) {
            let index = HashIndex::new();
            let mut model = std::collections::HashMap::new();
            for (op, key, addr) in ops {
                check_op(&index, &mut model, op, key, addr)?;
            }
            proptest::prop_assert_eq!(index.len(), model.len());
            let mut seen = std::collections::HashMap::new();
            index.for_each(|k, a| {
                assert!(seen.insert(k, a).is_none(), "key {k} visited twice");
            });
            proptest::prop_assert_eq!(seen, model);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// A bulk-built index holds exactly its entries, then behaves as a `HashMap` under
        /// further point operations, and its `spare` inserts do not grow it.
        #[test]
        fn from_entries_matches_a_hashmap(
            start in proptest::collection::hash_map(0u64..5_000, 0u64..1_000, 0..2_000),
            spare in 0usize..500,
            ops in proptest::collection::vec((0u8..5, 0u64..6_000, 0u64..3), 0..500),
        ) {
            let entries: Vec<(u64, u64)> = start.iter().map(|(&k, &a)| (k, a)).collect();
            let index = HashIndex::from_entries(&entries, spare).unwrap();
            let mut model = start;
            proptest::prop_assert_eq!(index.len(), model.len());
            for key in 0..6_000u64 {
                proptest::prop_assert_eq!(index.get(key), model.get(&key).copied(), "key {}", key);
            }
            let before = index.memory_bytes();
            let mut fresh = 0;
            for key in (10_000u64..).take(spare) {
                index.insert_new(key, key).unwrap();
                model.insert(key, key);
                fresh += 1;
            }
            proptest::prop_assert_eq!(index.memory_bytes(), before, "{} spare inserts grew it", fresh);
            for (op, key, addr) in ops {
                check_op(&index, &mut model, op, key, addr)?;
            }
            let mut seen = std::collections::HashMap::new();
            index.for_each(|k, a| {
                assert!(seen.insert(k, a).is_none(), "key {k} visited twice");
            });
            proptest::prop_assert_eq!(seen, model);
        }
    }

    #[test]
    fn from_entries_refuses_a_key_given_twice() {
        let mut entries: Vec<(u64, u64)> = (0..10_000u64).map(|k| (k * 7, k)).collect();
        entries.push((700, 1));
        assert_eq!(
            HashIndex::from_entries(&entries, 0).err(),
            Some(IndexError::BulkDuplicateKey(700))
        );
        assert!(HashIndex::from_entries(&[], 0).unwrap().is_empty());
    }

    /// A bulk build large enough that every shard's table has more than 1,024 buckets, so that
    /// its entries are ordered by the top 10 bits of their home bucket (`in_bucket_order`'s
    /// `shift > 0`), holds exactly its entries.
    #[test]
    fn from_entries_of_shards_over_1024_buckets_matches_a_hashmap() {
        let key = |i: u64| mix64(i) ^ 0x5eed;
        let model: std::collections::HashMap<u64, u64> =
            (0..200_000u64).map(|i| (key(i), i)).collect();
        let entries: Vec<(u64, u64)> = model.iter().map(|(&k, &a)| (k, a)).collect();
        let index = HashIndex::from_entries(&entries, 0).unwrap();
        let smallest = index.shards.iter().map(|s| s.locked_table().len()).min();
        assert!(
            smallest > Some(1024),
            "smallest shard table: {smallest:?} buckets"
        );
        assert_eq!(index.len(), model.len());
        for (&k, &a) in &model {
            assert_eq!(index.get(k), Some(a), "key {k}");
        }
        // mix64 is a bijection: these keys are none of the entries'.
        for i in 200_000..210_000u64 {
            assert_eq!(index.get(key(i)), None, "absent key {}", key(i));
        }
        let mut seen = std::collections::HashMap::new();
        index.for_each(|k, a| {
            assert!(seen.insert(k, a).is_none(), "key {k} visited twice");
        });
        assert_eq!(seen, model);
    }

    /// Writers insert, update and remove their own keys (growing the tables as they go) while a
    /// reader checks that keys nobody touches are always found with their value.
    #[test]
    fn readers_always_find_stable_keys_while_writers_grow_and_churn() {
        let index = HashIndex::new();
        for key in (0..30_000u64).step_by(3) {
            index.insert_new(key, key).unwrap();
        }
        let done = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for writer in 1..3u64 {
                let (index, done) = (&index, &done);
                scope.spawn(move || {
                    for round in 0..4u64 {
                        let mine = (0..60_000u64).filter(|k| k % 3 == writer);
                        for key in mine.clone() {
                            index.insert_new(key, round).unwrap();
                            assert!(index.replace_if(key, round, round + 1));
                        }
                        for key in mine {
                            assert_eq!(index.remove(key), Some(round + 1));
                        }
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                });
            }
            let (index, done) = (&index, &done);
            scope.spawn(move || {
                let mut key = 0u64;
                while done.load(std::sync::atomic::Ordering::Acquire) < 2 {
                    key = (key + 3 * 7919) % 30_000;
                    assert_eq!(index.get(key), Some(key), "stable key {key}");
                }
            });
        });
        assert_eq!(index.len(), 10_000);
    }

    /// Tombstone rebuilds happen in place: a queue-like table (inserts of new keys, removals of
    /// old ones) keeps its memory however long it runs.
    #[test]
    fn churn_rebuilds_in_place_without_growing_memory() {
        let index = HashIndex::new();
        for key in 0..1_000u64 {
            index.insert_new(key, key).unwrap();
        }
        let settled = {
            for key in 1_000..20_000u64 {
                index.insert_new(key, key).unwrap();
                assert_eq!(index.remove(key - 1_000), Some(key - 1_000));
            }
            index.memory_bytes()
        };
        for key in 20_000..200_000u64 {
            index.insert_new(key, key).unwrap();
            assert_eq!(index.remove(key - 1_000), Some(key - 1_000));
        }
        // A shard whose share of the 1,000 live keys drifts up may double once more, but 180,000
        // further inserts and removals (dozens of rebuilds per shard) must not add up.
        let after = index.memory_bytes();
        assert!(after <= 2 * settled, "{settled} bytes became {after}");
        assert_eq!(index.len(), 1_000);
        assert!((199_000..200_000).all(|k| index.get(k) == Some(k)));
        assert_eq!(index.get(198_999), None);
    }

    #[test]
    fn memory_bytes_grows_with_entries_within_a_sane_range() {
        let index = HashIndex::new();
        let empty = index.memory_bytes();
        assert!(empty < 64 * 1024, "empty index costs {empty} bytes");
        for key in 0..100_000u64 {
            index.upsert(key.wrapping_mul(0x9e37_79b9_7f4a_7c15), key);
        }
        let full = index.memory_bytes();
        let per_entry = full as f64 / 100_000.0;
        assert!(full > empty);
        assert!(
            (16.0..60.0).contains(&per_entry),
            "{per_entry} bytes per entry"
        );
    }
}
