//! Pieces every engine's worker and recovery share: range scans and secondary lookups over the
//! DRAM indexes, recovery phase timing, and parsing of the test-only fault names.

use crate::catalog::TableId;
use crate::engine::{RecoveryReport, TxError};
use crate::index::{PrimaryIndex, SecondaryLookup};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Instant;

/// Every commit tid is below this: its timestamp, microseconds of clock summed over the pool's
/// life (`cc::TidClock`), stays below 2^48 (8.9 years). Recovery treats a larger tid in a tuple
/// header as damage (a flipped high byte), rather than restarting the clock from it.
pub const TID_LIMIT: u64 = 1 << 56;

/// Collects the `(key, value)` hits of a primary-index range scan into `hits` (cleared first).
/// A hash-only index refuses scans; the error names the table.
pub(crate) fn collect_scan_hits(
    index: &PrimaryIndex,
    table_name: &str,
    from: u64,
    reverse: bool,
    limit: usize,
    hits: &mut Vec<(u64, u64)>,
) -> Result<(), TxError> {
    hits.clear();
    let collect = |k: u64, v: u64| {
        hits.push((k, v));
        true
    };
    let scanned = if reverse {
        index.scan_rev(from, limit, collect)
    } else {
        index.scan(from, limit, collect)
    };
    scanned
        .map(|_| ())
        .map_err(|e| TxError::Unsupported(format!("table {table_name}: {e}")))
}

/// Reads the row of every hit through the transaction (`read(key, addr, row)`, so the protocol
/// sees each read; `addr` is what the index held, sparing a second lookup) and hands it to `f`
/// until `f` returns false. A key deleted since the index scan is skipped.
///
/// Returns how many hits were visited (up to and including the one `f` stopped at), which is
/// what a [`ScanSet`] covers.
pub(crate) fn visit_hits(
    hits: &[(u64, u64)],
    row: &mut [u8],
    mut read: impl FnMut(u64, u64, &mut [u8]) -> Result<(), TxError>,
    f: &mut dyn FnMut(u64, &[u8]) -> bool,
) -> Result<usize, TxError> {
    for (i, &(key, addr)) in hits.iter().enumerate() {
        match read(key, addr, row) {
            Ok(()) => {
                if !f(key, row) {
                    return Ok(i + 1);
                }
            }
            Err(TxError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(hits.len())
}

/// Phantom protection for the single-version protocols (issue 21): the key interval one range
/// scan covered and a digest of the keys the index held in it. At commit, once the write set is
/// locked and its inserts are in the index, the interval is scanned again; any other key in it
/// (an insert committed or in flight since the scan) or a key gone from it fails validation, so
/// no transaction commits having missed a row that a serial order would have shown it. This is
/// re-scan validation (as in Hekaton's scan sets) rather than Silo's node-set validation, which
/// would need version counters in every index's leaves, PM ones included.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanSet {
    /// The table scanned.
    pub table: TableId,
    from: u64,
    reverse: bool,
    /// The last key visited; `None` when the scan ran off the end of the index, so the interval
    /// reaches the end of the key space.
    to: Option<u64>,
    count: usize,
    digest: u64,
}

impl ScanSet {
    /// What a scan of `table` from `from` covered: it asked for `limit` hits, found `hits`, and
    /// visited the first `visited` of them.
    pub fn covered(
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        hits: &[(u64, u64)],
        visited: usize,
    ) -> ScanSet {
        let seen = &hits[..visited];
        let ran_off_the_end = visited == hits.len() && hits.len() < limit;
        ScanSet {
            table,
            from,
            reverse,
            to: if ran_off_the_end {
                None
            } else {
                seen.last().map(|&(k, _)| k)
            },
            count: seen.len(),
            digest: seen.iter().fold(0, |d, &(k, _)| d.wrapping_add(mix(k))),
        }
    }

    /// Whether the interval still holds exactly the keys it held at the scan, apart from keys
    /// for which `own_insert` is true (this transaction's inserts, which entered the index at
    /// its commit; there are at most `own_inserts` of them). `rescan(from, reverse, limit, hits)`
    /// collects index hits as the scan did; `hits` is a scratch buffer.
    pub fn unchanged(
        &self,
        own_inserts: usize,
        own_insert: impl Fn(u64) -> bool,
        hits: &mut Vec<(u64, u64)>,
        rescan: impl FnOnce(u64, bool, usize, &mut Vec<(u64, u64)>) -> Result<(), TxError>,
    ) -> bool {
        // One more than can match, so an extra key shows up as a count mismatch.
        let limit = self.count + own_inserts + 1;
        if rescan(self.from, self.reverse, limit, hits).is_err() {
            return false;
        }
        let inside = |k: u64| match (self.to, self.reverse) {
            (None, _) => true,
            (Some(to), false) => k <= to,
            (Some(to), true) => k >= to,
        };
        let (mut count, mut digest) = (0, 0u64);
        for &(k, _) in hits.iter().take_while(|&&(k, _)| inside(k)) {
            if !own_insert(k) {
                count += 1;
                digest = digest.wrapping_add(mix(k));
            }
        }
        count == self.count && digest == self.digest
    }
}

/// Timestamp ordering's guard against an older insert behind a younger scan (TO and MVTO;
/// docs/CC.md, "Phantoms"): an absent key has no tuple to carry a read timestamp, so a scan
/// raises its table's `scanned_up_to` mark to its timestamp before it walks the index, and
/// [`inserts_follow_scans`] fails a transaction whose insert went to a table a younger one
/// scanned. The two full fences make one side see the other: either the walk meets the insert,
/// or the inserter's check (after it published the insert) meets the mark.
pub(crate) fn mark_scan(scanned_up_to: &AtomicU64, ts: u64) {
    scanned_up_to.fetch_max(ts, Ordering::SeqCst);
    fence(Ordering::SeqCst);
}

/// Whether no transaction younger than `ts` scanned any of the tables (their `scanned_up_to`
/// marks) that this one inserted into; see [`mark_scan`]. Called after the inserts are published.
pub(crate) fn inserts_follow_scans<'a>(
    ts: u64,
    inserted_tables: impl IntoIterator<Item = &'a AtomicU64>,
) -> bool {
    fence(Ordering::SeqCst);
    inserted_tables
        .into_iter()
        .all(|scanned_up_to| scanned_up_to.load(Ordering::SeqCst) <= ts)
}

/// [`ScanSet::unchanged`] for every scan of a transaction whose inserts are `inserts` (table,
/// key); `rescan(table, from, reverse, limit, hits)` collects index hits as the scans did.
pub(crate) fn scans_unchanged(
    sets: &[ScanSet],
    hits: &mut Vec<(u64, u64)>,
    inserts: impl Iterator<Item = (TableId, u64)>,
    rescan: impl Fn(TableId, u64, bool, usize, &mut Vec<(u64, u64)>) -> Result<(), TxError>,
) -> bool {
    if sets.is_empty() {
        return true;
    }
    let mut inserts: Vec<(TableId, u64)> = inserts.collect();
    inserts.sort_unstable();
    sets.iter().all(|set| {
        let table = set.table;
        let in_table = inserts.partition_point(|&(t, _)| t < table);
        let in_table = &inserts[in_table..inserts.partition_point(|&(t, _)| t <= table)];
        set.unchanged(
            in_table.len(),
            |key| in_table.binary_search(&(table, key)).is_ok(),
            hits,
            |from, reverse, limit, hits| rescan(table, from, reverse, limit, hits),
        )
    })
}

/// A 64-bit finalizer (splitmix64), so that the digest's sum of keys does not cancel out for
/// keys that differ in a few bits.
fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Looks `key` up in the table's `index`-th secondary index, with a typed error for a missing one.
pub(crate) fn lookup_secondary<S: SecondaryLookup>(
    secondary: &[S],
    table_name: &str,
    index: usize,
    key: u64,
    out: &mut Vec<u64>,
) -> Result<(), TxError> {
    let sec = secondary.get(index).ok_or_else(|| {
        TxError::SchemaMismatch(format!("table {table_name} has no secondary index {index}"))
    })?;
    sec.lookup(key, out);
    Ok(())
}

/// Times recovery phases into a [`RecoveryReport`].
pub(crate) struct PhaseClock {
    phase_start: Instant,
}

impl PhaseClock {
    /// Starts timing the first phase.
    pub(crate) fn start() -> PhaseClock {
        PhaseClock {
            phase_start: Instant::now(),
        }
    }

    /// Ends the current phase as `name` and starts the next.
    pub(crate) fn lap(&mut self, report: &mut RecoveryReport, name: &str) {
        report.phases.push((
            name.to_string(),
            self.phase_start.elapsed().as_secs_f64() * 1e3,
        ));
        self.phase_start = Instant::now();
    }
}

/// `Display` (its `name()`) and `FromStr` (one of its `ALL` by name, via [`parse_named`]) for an
/// engine's test-only fault enum; `$what` names the kind of name in the error ("dudetx fault").
macro_rules! named_fault {
    ($t:ty, $what:expr) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                crate::engine::common::parse_named(s, &<$t>::ALL, <$t>::name, $what)
            }
        }
    };
}
pub(crate) use named_fault;

/// Finds the item of `all` whose `name` is `s`; the error lists every name (`what` says which
/// kind of name it is, e.g. "fault").
pub(crate) fn parse_named<T: Copy>(
    s: &str,
    all: &[T],
    name: impl Fn(T) -> &'static str,
    what: &str,
) -> Result<T, String> {
    all.iter().copied().find(|&t| name(t) == s).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|&t| name(t)).collect();
        format!(
            "unknown {what} '{s}' (expected one of: {})",
            names.join(", ")
        )
    })
}

/// Refuses a row buffer (`what`: "buffer", "insert") whose length is not the table's row size.
pub(crate) fn check_row_len(
    table_name: &str,
    row: usize,
    got: usize,
    what: &str,
) -> Result<(), TxError> {
    if got == row {
        return Ok(());
    }
    Err(TxError::SchemaMismatch(format!(
        "table {table_name} has rows of {row} bytes, the {what} has {got}"
    )))
}

/// The oldest start timestamp of running transactions other than `thread`'s own (`u64::MAX`
/// marks an idle slot), the bound below which deleted or superseded versions may be reused.
pub(crate) fn oldest_active_excluding(
    active: &[crossbeam_utils::CachePadded<std::sync::atomic::AtomicU64>],
    thread: usize,
) -> u64 {
    active
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != thread)
        .map(|(_, a)| a.load(std::sync::atomic::Ordering::Acquire))
        .min()
        .unwrap_or(u64::MAX)
}

/// The largest committed transaction id, kept per thread: each worker stores its own last tid
/// (a plain release store) and readers take the maximum. A shared `fetch_max` instead cost every
/// commit a locked read-modify-write that waited for its whole store buffer (~2 % of TPC-C).
pub(crate) struct LastCommits(Box<[crossbeam_utils::CachePadded<std::sync::atomic::AtomicU64>]>);

impl LastCommits {
    pub(crate) fn new(threads: usize) -> LastCommits {
        LastCommits(
            (0..threads)
                .map(|_| crossbeam_utils::CachePadded::new(std::sync::atomic::AtomicU64::new(0)))
                .collect(),
        )
    }

    /// Records that `thread` committed `tid` (only `thread` writes its slot).
    pub(crate) fn note(&self, thread: usize, tid: u64) {
        use std::sync::atomic::Ordering;
        let mine = &self.0[thread];
        if tid > mine.load(Ordering::Relaxed) {
            mine.store(tid, Ordering::Release);
        }
    }

    /// The largest tid any thread has committed.
    pub(crate) fn max(&self) -> u64 {
        self.0
            .iter()
            .map(|t| t.load(std::sync::atomic::Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }
}

/// Finds a transaction's write by table and key in its write set: a linear scan of the first
/// [`WriteLookup::LINEAR`] writes (cheapest for the short transactions that dominate), a hash
/// map for the writes after them, so that a transaction with thousands of writes (a bulk load,
/// TPC-C Delivery's ~130) does not pay a quadratic scan. The engine records each write's
/// position as it appends it, and clears the lookup with the write set.
#[derive(Default)]
pub(crate) struct WriteLookup {
    beyond: std::collections::HashMap<(TableId, u64), usize, BuildWriteKeyHasher>,
}

impl WriteLookup {
    /// Writes found by a linear scan.
    pub(crate) const LINEAR: usize = 16;

    /// Records that the write at `position` is the one of (`table`, `key`).
    #[inline]
    pub(crate) fn record(&mut self, position: usize, table: TableId, key: u64) {
        if position >= Self::LINEAR {
            self.beyond.insert((table, key), position);
        }
    }

    /// The position of the write of (`table`, `key`) among `len` writes, where `is_at(i)` says
    /// whether write `i` is that one.
    #[inline]
    pub(crate) fn find(
        &self,
        len: usize,
        table: TableId,
        key: u64,
        is_at: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        (0..len.min(Self::LINEAR)).find(|&i| is_at(i)).or_else(|| {
            if len > Self::LINEAR {
                self.beyond.get(&(table, key)).copied()
            } else {
                None
            }
        })
    }

    /// Forgets every write (the transaction ended).
    #[inline]
    pub(crate) fn clear(&mut self) {
        if !self.beyond.is_empty() {
            self.beyond.clear();
        }
    }
}

/// Hashes write-set keys with [`crate::index::mix64`]: they come from the engine's own callers,
/// and SipHash would cost more than the scan it replaces.
#[derive(Clone, Copy, Default)]
pub(crate) struct BuildWriteKeyHasher;

impl std::hash::BuildHasher for BuildWriteKeyHasher {
    type Hasher = WriteKeyHasher;
    fn build_hasher(&self) -> WriteKeyHasher {
        WriteKeyHasher(0)
    }
}

/// See [`BuildWriteKeyHasher`].
pub(crate) struct WriteKeyHasher(u64);

impl std::hash::Hasher for WriteKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = crate::index::mix64(self.0.rotate_left(29) ^ n);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The tuple addresses a transaction's recent reads found, so that an update or delete of a key
/// it has just read skips the index descent (issue 13: TPC-C updates almost every row it reads,
/// and Delivery reads ~100 order lines by a scan before updating each). Direct-mapped and
/// overwritten freely; an entry counts only in the transaction that made it (`txn`).
///
/// Using the address of the transaction's own earlier read is as safe as the index lookup made
/// then: the read is in the read set (validated at commit) or locked, and a slot is reused only
/// once no running transaction can still hold its address (Falcon §5.4).
pub(crate) struct RecentReads {
    /// (table, key, transaction number, tuple).
    entries: Box<[(TableId, u64, u64, u64)]>,
    txn: u64,
}

impl Default for RecentReads {
    fn default() -> Self {
        RecentReads {
            entries: vec![(0, 0, 0, 0); Self::SLOTS].into_boxed_slice(),
            txn: 1,
        }
    }
}

impl RecentReads {
    const SLOTS: usize = 64;

    fn slot(table: TableId, key: u64) -> usize {
        (crate::index::mix64(key ^ (u64::from(table) << 48)) as usize) & (Self::SLOTS - 1)
    }

    /// Forgets the previous transaction's reads (in O(1)).
    pub fn next_txn(&mut self) {
        self.txn += 1;
    }

    /// Records that this transaction read `key` of `table` at `tuple`.
    #[inline]
    pub fn note(&mut self, table: TableId, key: u64, tuple: u64) {
        self.entries[Self::slot(table, key)] = (table, key, self.txn, tuple);
    }

    /// Forgets `key` of `table` (this transaction changes it).
    #[inline]
    pub fn forget(&mut self, table: TableId, key: u64) {
        let entry = &mut self.entries[Self::slot(table, key)];
        if entry.0 == table && entry.1 == key {
            entry.2 = 0;
        }
    }

    /// Where this transaction last read `key` of `table`, if that is still remembered.
    #[inline]
    pub fn get(&self, table: TableId, key: u64) -> Option<u64> {
        let (t, k, txn, tuple) = self.entries[Self::slot(table, key)];
        (t == table && k == key && txn == self.txn).then_some(tuple)
    }
}

/// Most hot tuples Falcon tracks per thread (`hot_tuples`): each costs DRAM in every worker.
pub const MAX_HOT_TUPLES: usize = 1 << 20;
/// Most `hstore` partitions (`CcOptions::partitions`): each is one lock word in DRAM.
pub const MAX_PARTITIONS: usize = 1 << 20;

/// Refuses a non-durable domain for an engine whose design is about durability (zen, fir): the
/// volatile engine is the one without it.
pub(crate) fn require_durable_domain(
    engine: super::EngineKind,
    domain: crate::pmem::PersistenceDomain,
) -> Result<(), super::DbError> {
    if domain.is_durable() {
        return Ok(());
    }
    Err(super::DbError::Config(format!(
        "engine {} needs a durable domain (adr, eadr or msync); use the volatile engine for no \
         durability",
        engine.name()
    )))
}

/// Checks the partition count of `hstore` (both engines).
pub(crate) fn check_partitions(partitions: usize) -> Result<(), super::DbError> {
    if partitions == 0 || partitions > MAX_PARTITIONS {
        return Err(super::DbError::Config(format!(
            "hstore needs 1 to {MAX_PARTITIONS} partitions, not {partitions}"
        )));
    }
    Ok(())
}

/// Who holds a tuple slot, for the slot-ownership check of a structure check (issue 19, item 5):
/// every slot of a heap page is either live (the index names it) or held by exactly one of its
/// owner thread's allocation structures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotHolder {
    /// A free list (the thread's own, or a region's inbox of slots freed by other threads).
    Free,
    /// A queue of deleted or superseded versions awaiting reclamation.
    Reclaim,
    /// The never-used tail of the thread's current page (from its bump pointer).
    Unallocated,
}

impl std::fmt::Display for SlotHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SlotHolder::Free => "a free list",
            SlotHolder::Reclaim => "a reclamation queue",
            SlotHolder::Unallocated => "the unallocated tail of a page",
        })
    }
}

/// The slots a structure check has seen held, with the heap geometry to judge them by. Per heap
/// page a dense array of holders (indexed by slot number), since a fresh page's unallocated tail
/// alone is tens of thousands of slots and the check runs on every crash image the suite recovers.
#[derive(Default)]
pub(crate) struct SlotLedger {
    /// Heap page offset → its table, owner thread and holders.
    pages: std::collections::HashMap<u64, LedgerPage>,
}

/// One heap page of a [`SlotLedger`].
struct LedgerPage {
    table: TableId,
    owner: usize,
    /// Holder of slot `i` of the page; empty until a slot of the page is first held.
    held: Vec<Option<SlotHolder>>,
}

impl SlotLedger {
    /// A ledger over the heap pages: page offset → (table, owner thread).
    pub fn new(pages: std::collections::HashMap<u64, (TableId, usize)>) -> SlotLedger {
        SlotLedger {
            pages: pages
                .into_iter()
                .map(|(page, (table, owner))| {
                    let held = Vec::new();
                    (page, LedgerPage { table, owner, held })
                })
                .collect(),
        }
    }

    /// Records that `holder`, a structure of thread `owner` for `table` (whose slots are
    /// `slot_bytes` apart from the page start), holds `slot`: `Err` if the slot is not one of
    /// that table's slots in a page of that thread (of any thread unless `own_pages_only`: Falcon
    /// reuses a slot it deleted in another thread's page, §5.4), or is held twice.
    #[allow(clippy::too_many_arguments)]
    pub fn hold(
        &mut self,
        slot: u64,
        holder: SlotHolder,
        table: TableId,
        owner: usize,
        own_pages_only: bool,
        slot_bytes: u64,
        page_size: u64,
    ) -> Result<(), String> {
        let geometry = (table, owner, own_pages_only, slot_bytes, page_size);
        self.hold_run(slot, slot + slot_bytes, holder, geometry)
    }

    /// [`SlotLedger::hold`] for every whole slot in `[from, to)`, which lie in one page (the
    /// unallocated tail of a thread's current page).
    pub fn hold_tail(
        &mut self,
        from: u64,
        to: u64,
        table: TableId,
        owner: usize,
        slot_bytes: u64,
        page_size: u64,
    ) -> Result<(), String> {
        if from + slot_bytes > to {
            return Ok(());
        }
        if from / page_size != (to - 1) / page_size {
            return Err(format!(
                "the unallocated tail [{from}, {to}) of thread {owner}, table {table} spans pages"
            ));
        }
        let geometry = (table, owner, true, slot_bytes, page_size);
        self.hold_run(from, to, SlotHolder::Unallocated, geometry)
    }

    /// Holds the whole slots in `[from, to)` (one page) for `holder`.
    fn hold_run(
        &mut self,
        from: u64,
        to: u64,
        holder: SlotHolder,
        (table, owner, own_pages_only, slot_bytes, page_size): (TableId, usize, bool, u64, u64),
    ) -> Result<(), String> {
        let page = from - from % page_size;
        let entry = match self.pages.get_mut(&page) {
            Some(p)
                if p.table == table
                    && (p.owner == owner || !own_pages_only)
                    && (from - page) % slot_bytes == 0 =>
            {
                p
            }
            other => {
                return Err(format!(
                    "slot {from} in {holder} of thread {owner}, table {table} is not a slot of \
                     that table{} (its page: {})",
                    if own_pages_only {
                        " in a page of that thread"
                    } else {
                        ""
                    },
                    match other {
                        Some(p) => format!("table {}, thread {}", p.table, p.owner),
                        None => "not a heap page".into(),
                    }
                ))
            }
        };
        if entry.held.is_empty() {
            entry.held = vec![None; (page_size / slot_bytes) as usize];
        }
        let first = ((from - page) / slot_bytes) as usize;
        let count = ((to - from) / slot_bytes) as usize;
        for (i, held) in entry.held[first..first + count].iter_mut().enumerate() {
            if let Some(earlier) = held.replace(holder) {
                let slot = from + i as u64 * slot_bytes;
                return Err(format!(
                    "slot {slot} of table {table} is held twice: by {earlier} and by {holder} \
                     (thread {owner})"
                ));
            }
        }
        Ok(())
    }

    /// The heap pages, with their table, owner, and the holder of each slot (by slot number;
    /// `None` past the end of the slice).
    pub fn pages(&self) -> impl Iterator<Item = (u64, TableId, usize, &[Option<SlotHolder>])> {
        self.pages
            .iter()
            .map(|(&page, p)| (page, p.table, p.owner, p.held.as_slice()))
    }
}

/// What to do about a full pool, appended to every [`TxError::PmFull`] about pages.
pub(crate) const PM_FULL_ADVICE: &str = "give the pool more room: a larger pool \
     (DbConfig::pool_size, --pool-size), fewer worker threads (DbConfig::max_threads, --threads: \
     each thread takes pages of its own), or let it grow (DbConfig::max_pool_size, \
     --max-pool-size); deleting rows frees room for later inserts";

/// The [`TxError`] for a page `what` needed (e.g. "table 'items' of thread 0") that the page
/// manager could not give: says once that PM is full, what needed room, how big the pool is and
/// what to do.
pub(crate) fn pm_full(what: std::fmt::Arguments<'_>, e: crate::alloc::AllocError) -> TxError {
    match e {
        crate::alloc::AllocError::PmFull {
            pages,
            pool_bytes,
            max_pool_bytes,
        } => TxError::PmFull(format!(
            "{what} needs a new {} MiB page, but {}; {PM_FULL_ADVICE}",
            crate::alloc::PAGE_SIZE >> 20,
            crate::alloc::full_detail(pages, pool_bytes, max_pool_bytes)
        )),
        other => TxError::PmFull(format!("{what} needs a new page: {other}")),
    }
}

/// Joins scoped recovery threads that each return a part of the result, in order, and flattens
/// the parts. A thread stopped by a simulated crash (or by a bug) unwinds the caller with its own
/// payload: `expect` would turn the simulator's crash into a real panic (found by the
/// crash-consistency suite when it crashes recovery itself).
pub(crate) fn join_parts<T, E>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<Vec<T>, E>>>,
) -> Result<Vec<T>, E> {
    handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect::<Result<Vec<_>, _>>()
        .map(|v| v.into_iter().flatten().collect())
}

/// A table drop (issue 21), with the order every engine shares (`catalog/drop.rs`): the catalog
/// stored with the table dropping, the engine's own step that makes the table's rows
/// unreachable and frees its space, every thread slot's state told to forget the table, the
/// catalog stored with the table dropped, the engine's DRAM tombstone installed. It runs with
/// no worker alive: a worker holds its slot's state (`None` in `slots`) while it lives, and the
/// drop holds every slot's lock throughout, so none starts meanwhile.
pub(crate) struct TableDrop<'a, T> {
    /// The engine's catalog.
    pub catalog: &'a parking_lot::Mutex<crate::catalog::Catalog>,
    /// Every thread slot's state (empty for an engine without per-thread state).
    pub slots: &'a [parking_lot::Mutex<Option<T>>],
    /// Where the catalog is stored.
    pub store: &'a crate::catalog::CatalogStore,
    /// The pool the catalog is stored in.
    pub pool: &'a crate::pmem::Pool,
    /// The table.
    pub table: TableId,
    /// The crash harness's deliberate bug (test-only): the space freed before the catalog says
    /// the table is dropping.
    pub free_first: bool,
}

impl<T> TableDrop<'_, T> {
    /// Runs the drop: `free_space` is the engine's middle step, `forget` is called with each
    /// thread slot's state, `tombstone` with the catalog that has the table dropped. An error if
    /// the table is not live, naming the slot if a worker is alive, or if the pool fails.
    pub(crate) fn run(
        self,
        free_space: impl FnOnce() -> Result<(), crate::engine::DbError>,
        forget: impl FnMut(&mut T),
        tombstone: impl FnOnce(&crate::catalog::Catalog),
    ) -> Result<(), crate::engine::DbError> {
        self.run_unless_in_use(Option::is_none, free_space, forget, tombstone)
    }

    /// [`run`](Self::run) for an engine whose slot says itself whether a worker is alive in it
    /// (`in_use`; FIR keeps a live worker's state in its slot between transactions).
    pub(crate) fn run_unless_in_use(
        self,
        in_use: impl Fn(&Option<T>) -> bool,
        free_space: impl FnOnce() -> Result<(), crate::engine::DbError>,
        mut forget: impl FnMut(&mut T),
        tombstone: impl FnOnce(&crate::catalog::Catalog),
    ) -> Result<(), crate::engine::DbError> {
        let mut catalog = self.catalog.lock();
        let dropping = catalog.with_state(self.table, crate::catalog::TableState::Dropping)?;
        let name = &catalog.tables[self.table as usize].name;
        let mut states = self
            .slots
            .iter()
            .enumerate()
            .map(|(slot, state)| {
                let guard = state.lock();
                if in_use(&guard) {
                    return Err(crate::engine::DbError::Config(format!(
                        "cannot drop table '{name}': worker slot {slot} is in use (a drop runs \
                         with no worker alive)"
                    )));
                }
                Ok(guard)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut free_space = Some(free_space);
        let mut free = || free_space.take().map_or(Ok(()), |f| f());
        if self.free_first {
            free()?;
        }
        self.store.store(self.pool, &dropping)?;
        *catalog = dropping;
        free()?;
        for state in states.iter_mut().filter_map(|s| s.as_mut()) {
            forget(state);
        }
        let done = catalog.drops_finished();
        self.store.store(self.pool, &done)?;
        tombstone(&done);
        *catalog = done;
        Ok(())
    }
}

/// `schema` if it is a live table's, else the error a transaction gets for table `table`: no
/// such table, or the table was dropped ([`crate::catalog::live_schema`]'s rule and texts). For
/// the `db` layer's and the engines' workers' copies of the schemas.
/// Inlined like `live_schema`; the error's text is formatted out of line.
#[inline]
pub(crate) fn live_schema_in_tx(
    schema: Option<&crate::catalog::Schema>,
    table: TableId,
) -> Result<&crate::catalog::Schema, TxError> {
    crate::catalog::live_schema(schema, table).map_err(schema_mismatch)
}

#[cold]
#[inline(never)]
fn schema_mismatch(e: crate::catalog::CatalogError) -> TxError {
    TxError::SchemaMismatch(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_reads_hold_only_the_current_transactions_reads() {
        let mut r = RecentReads::default();
        assert_eq!(r.get(1, 7), None);
        r.note(1, 7, 4096);
        r.note(2, 7, 8192);
        assert_eq!(r.get(1, 7), Some(4096));
        assert_eq!(r.get(2, 7), Some(8192));
        assert_eq!(r.get(1, 8), None);
        // A later read of the key replaces the address.
        r.note(1, 7, 12288);
        assert_eq!(r.get(1, 7), Some(12288));
        // A key this transaction changes is forgotten; its neighbours are not.
        r.forget(2, 7);
        r.forget(1, 8);
        assert_eq!((r.get(1, 7), r.get(2, 7)), (Some(12288), None));
        r.note(2, 7, 8192);
        // The next transaction sees none of them.
        r.next_txn();
        assert_eq!((r.get(1, 7), r.get(2, 7)), (None, None));
        // Keys that share a slot overwrite each other: the loser is simply not remembered.
        for key in 0..1000u64 {
            r.note(3, key, key * 64);
        }
        let remembered = (0..1000u64)
            .filter(|&k| r.get(3, k) == Some(k * 64))
            .count();
        assert!(remembered > 0 && remembered <= RecentReads::SLOTS);
        assert!((0..1000u64).all(|k| r.get(3, k).map_or(true, |t| t == k * 64)));
    }
}
