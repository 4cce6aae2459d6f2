//! A Zen worker: one thread's transactions. This file is Perform in the Met-Cache (§3.3.1) and
//! Maintenance (garbage collection, §3.4); `commit.rs` has the commit, Persist with Algorithm 1
//! among its steps.

use super::cache::{is_cache_ref, region_of};
use super::layout::{kind, tuple};
use super::txcc::{ReadRec, Seen, TxContext};
use super::{Garbage, TableAlloc, TableRt, ThreadState, ZenEngine, GARBAGE_THRESHOLD};
use crate::alloc::{PageTag, PAGE_SIZE};
use crate::catalog::TableId;
use crate::cc::{Protocol, LOCK_BIT};
use crate::engine::common::ScanSet;
use crate::engine::{common, DbError, EngineWorker, FieldWrite, TxError};
use crate::pmem::{Pool, CACHE_LINE};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

/// How often a lookup retries when the entry it found was replaced under it.
const LOCATE_ATTEMPTS: u32 = 64;
/// One in this many reads of an uncached row loads it into the Met-Cache; the others read the
/// NVM-tuple in place ([`ZenWorker::read_uncached`]). A row read often is cached after a few
/// reads; a row read once (a uniform key over a table larger than the cache) costs no CLOCK
/// claim, eviction or copy.
const ADMIT_EVERY: u64 = 8;
/// How long a long-running transaction waits for the others to abort before going on.
const EXCLUSIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Garbage entries examined per commit (§3.4: "we limit the number of items to scan in the
/// garbage queue per transaction").
const GC_BUDGET: usize = 64;

/// At most this much of a tuple (or Met-Cache entry) is prefetched per key: enough for the
/// header and a 1 KB row, without flooding the line-fill buffers on larger rows.
const PREFETCH_TUPLE_BYTES: u64 = 2048;
/// Superseded NVM-tuples whose header line a transaction's begin starts loading
/// ([`ZenWorker::prefetch_garbage`]): about what its commit's Maintenance zeroes (one per update
/// of the commit before).
const PREFETCH_GARBAGE: usize = 16;

/// A key announced by a prefetch hint ([`EngineWorker::prefetch`] and its variants) whose index
/// bucket is on its way but whose lookup has not run yet ([`ZenWorker::run_prefetches`]).
#[derive(Clone, Copy)]
struct PendingPrefetch {
    table: TableId,
    key: u64,
    /// The key's index value once looked up (an NVM offset or a Met-Cache reference).
    found: Option<u64>,
    /// Bytes of the uncached NVM-tuple the transaction will read (header and row), or only its
    /// header for a blind overwrite; a cached row's whole entry, or only its metadata line.
    uncached_bytes: u64,
    /// The rest of the row is read, not only the header (or entry metadata).
    whole_row: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriteKind {
    Update,
    Insert,
    Delete,
    /// An insert deleted again by the same transaction, or a failed lock kept for release.
    Cancelled,
}

pub(super) struct WriteRec {
    pub table: TableId,
    pub key: u64,
    /// The Met-Cache entry written (0 for inserts).
    pub eref: u64,
    pub kind: WriteKind,
    /// The CC lock of `eref` is held.
    pub locked: bool,
    /// The entry receiving the new version when it is not `eref` (inserts, and copies of entries
    /// of other regions, §3.2), claimed at commit.
    pub target: u64,
    /// The NVM-tuple slot the new version goes to.
    pub slot: u64,
    /// Offset of the new row in `rows`, or in `data` when `row_in_data`.
    pub row_at: usize,
    /// The new row is one write's bytes exactly, already in `data` (a whole-row update or an
    /// insert): commit persists and installs it from there instead of copying it into `rows`.
    pub row_in_data: bool,
    /// MV protocols: the `begin` of the chain entry retired for this write.
    pub retired_begin: u64,
    /// A write of this transaction replaced every byte of the row: commit builds the new row
    /// from the writes alone, without reading the entry's.
    pub whole_row: bool,
    /// `eref` was claimed at commit for a blind overwrite ([`ZenWorker::claim_for_overwrite`])
    /// and its row never loaded from the NVM-tuple; a rollback loads it before unlocking.
    pub row_unloaded: bool,
}

impl WriteRec {
    fn new(table: TableId, key: u64, eref: u64, kind: WriteKind, locked: bool) -> WriteRec {
        WriteRec {
            table,
            key,
            eref,
            kind,
            locked,
            target: 0,
            slot: 0,
            row_at: 0,
            row_in_data: false,
            retired_begin: 0,
            whole_row: false,
            row_unloaded: false,
        }
    }

    /// The write's table, key, kind and Met-Cache entry.
    pub(super) fn identity(&self) -> (TableId, u64, WriteKind, u64) {
        (self.table, self.key, self.kind, self.eref)
    }
}

/// (table, secondary index, primary key, old secondary key, new secondary key).
pub(super) type SecondaryChange = (TableId, usize, u64, Option<u64>, Option<u64>);

pub(super) struct RangeRec {
    write: u32,
    offset: u32,
    len: u32,
    data: u32,
}

pub(crate) struct ZenWorker {
    pub(super) eng: Arc<ZenEngine>,
    pub(super) proto: Protocol,
    /// The protocol's per-transaction context (§3.3.2).
    pub(super) cx: TxContext,
    pub(super) pool: Arc<Pool>,
    pub(super) thread: usize,
    pub(super) state: Option<ThreadState>,
    pub(super) tables: Vec<Arc<TableRt>>,
    pub(super) in_txn: bool,
    pub(super) read_only: bool,
    /// Met-Cache entries pinned (the active bit) by this transaction.
    pub(super) pins: Vec<(TableId, u64)>,
    /// OCC family: versions read, for validation. 2PL: entries read-locked.
    pub(super) reads: Vec<ReadRec>,
    pub(super) writes: Vec<WriteRec>,
    /// Finds a write of `writes` by table and key.
    write_lookup: common::WriteLookup,
    /// The Met-Cache entries this transaction's reads found (pinned until it ends), so that an
    /// update or delete of a key it has read skips the index lookup.
    recent: common::RecentReads,
    pub(super) ranges: Vec<RangeRec>,
    pub(super) data: Vec<u8>,
    /// New rows built at commit.
    pub(super) rows: Vec<u8>,
    /// Secondary index changes: (table, index, key, old secondary key, new secondary key).
    pub(super) secondary: Vec<SecondaryChange>,
    pub(super) max_seen: u64,
    pub(super) scratch: Vec<u8>,
    scan_hits: Vec<(u64, u64)>,
    /// The intervals this transaction's scans covered, validated at commit (phantoms; see
    /// [`ScanSet`]).
    scan_sets: Vec<ScanSet>,
    /// Write-set positions in lock or persist order, reused by every commit (no allocation).
    pub(super) commit_order: Vec<usize>,
    /// Tuples accessed per table since the last rebalance (f_i of §3.2).
    pub(super) accesses: Vec<u64>,
    /// Reads of uncached rows so far: every [`ADMIT_EVERY`]th is admitted to the Met-Cache.
    uncached_reads: u64,
    /// Keys this transaction declared it reads and does not write
    /// ([`EngineWorker::prefetch_read_only`]): their uncached rows may be read in place.
    read_only_keys: Vec<(TableId, u64)>,
    /// Hinted keys whose lookups wait for the transaction's next operation, so that the index
    /// misses of every hint overlap ([`ZenWorker::run_prefetches`]).
    pending_prefetches: Vec<PendingPrefetch>,
    pub(super) txns: u64,
    /// This thread holds G-EX and the others have finished.
    exclusive_ready: bool,
    /// Entries of this region that committed blind overwrites used only as write locks (the
    /// new version went to NVM alone, `install_versions`): `claim_entry` takes these first, as
    /// they cache nothing, so such an overwrite evicts no row. At most [`MAX_LOCK_ENTRIES`].
    pub(super) lock_entries: Vec<(TableId, u64)>,
    /// This commit took a new NVM page: after it, look for an idle region to adopt
    /// ([`ZenWorker::adopt_idle_region`]).
    pub(super) took_page: bool,
    /// Slots of other regions (owner, table, slot) that this Maintenance pass reclaimed, handed
    /// to their owners' inboxes once at its end ([`ZenWorker::hand_over_freed`]): a lock per
    /// slot would stall each time on the zeroing store just before it (a locked instruction
    /// waits for the store buffer to drain, and that store misses), so the misses would not
    /// overlap. Empty between passes.
    freed_elsewhere: Vec<(usize, TableId, u64)>,
}

/// Freed slots an idle region must have waiting in its inbox before a worker that had to take a
/// new page adopts it ([`ZenWorker::adopt_idle_region`]): enough to be worth the swap, few enough
/// that little space is stranded.
pub(super) const ADOPT_FREED_SLOTS: usize = 256;

/// Lock-only entries a worker keeps for reuse ([`ZenWorker::lock_entries`]): more than a
/// transaction's blind overwrites, few enough that their lines stay in the CPU cache.
pub(super) const MAX_LOCK_ENTRIES: usize = 64;

/// Slots of each table's current page an insert or update leaves, when the pool is full, for
/// the tombstones of deletes (see [`ZenWorker::alloc_slot`]): deletes of up to this many rows per
/// table and thread still commit on a full pool, and free room.
const DELETE_RESERVE_SLOTS: u64 = 16;

fn exhausted(table: &TableRt) -> TxError {
    TxError::PmFull(format!(
        "the Met-Cache region of table {} is exhausted: every one of its entries (up to the hard \
         limit) is pinned by running transactions (a long-running transaction, §3.3.4)",
        table.schema.name
    ))
}

impl ZenWorker {
    pub(crate) fn new(eng: Arc<ZenEngine>, thread: usize) -> Result<ZenWorker, DbError> {
        if thread >= eng.config.max_threads {
            return Err(DbError::NoWorkerSlot(eng.config.max_threads));
        }
        // The slot's own state, unless a worker adopted it (`adopt_idle_region`): then the
        // state that worker left, or any other free one.
        let (thread, state) = {
            let _handover = eng.handover.lock();
            let own = eng.threads[thread].lock().take().map(|st| (thread, st));
            own.or_else(|| {
                (0..eng.config.max_threads)
                    .find_map(|r| eng.threads[r].lock().take().map(|st| (r, st)))
            })
            .ok_or_else(|| DbError::Config(format!("worker slot {thread} is already in use")))?
        };
        let tables = eng.tables.read().clone();
        eng.workers.fetch_add(1, Ordering::Relaxed);
        eng.rebalance();
        Ok(ZenWorker {
            proto: eng.protocol,
            cx: TxContext::default(),
            pool: eng.pool.clone(),
            thread,
            state: Some(state),
            accesses: vec![0; tables.len()],
            uncached_reads: 0,
            read_only_keys: Vec::new(),
            pending_prefetches: Vec::new(),
            tables,
            in_txn: false,
            read_only: false,
            pins: Vec::new(),
            reads: Vec::new(),
            writes: Vec::new(),
            write_lookup: common::WriteLookup::default(),
            recent: common::RecentReads::default(),
            ranges: Vec::new(),
            data: Vec::new(),
            rows: Vec::new(),
            secondary: Vec::new(),
            max_seen: 0,
            scratch: Vec::new(),
            scan_hits: Vec::new(),
            scan_sets: Vec::new(),
            commit_order: Vec::new(),
            txns: 0,
            exclusive_ready: false,
            lock_entries: Vec::new(),
            took_page: false,
            freed_elsewhere: Vec::new(),
            eng,
        })
    }

    pub(super) fn st(&mut self) -> &mut ThreadState {
        self.state
            .as_mut()
            .expect("state is present while the worker lives")
    }

    pub(super) fn alloc_state(st: &mut ThreadState, table: TableId) -> &mut TableAlloc {
        if st.tables.len() <= table as usize {
            st.tables
                .resize_with(table as usize + 1, TableAlloc::default);
        }
        &mut st.tables[table as usize]
    }

    fn ensure_table(&mut self, id: TableId) -> Result<(), TxError> {
        if id as usize >= self.tables.len() {
            self.tables = self.eng.tables.read().clone();
            self.accesses.resize(self.tables.len(), 0);
        }
        let schema = self.tables.get(id as usize).map(|t| &t.schema);
        crate::engine::common::live_schema_in_tx(schema, id).map(|_| ())
    }

    /// Publishes how many tuples the transaction has touched (to pick the long one, §3.3.4).
    #[inline]
    fn note_footprint(&self) {
        if self.pins.len() % 64 == 0 {
            self.eng.footprint[self.thread].store(
                (self.pins.len() + self.writes.len()) as u64,
                Ordering::Relaxed,
            );
        }
    }

    /// §3.3.4: a transaction that is not the long-running one aborts when G-EX is set; the
    /// long-running one waits (bounded) until every other transaction has finished.
    #[inline]
    pub(super) fn check_exclusive(&mut self) -> Result<(), TxError> {
        let g = self.eng.exclusive.load(Ordering::Acquire);
        if g == 0 {
            return Ok(());
        }
        if g != self.thread + 1 {
            return Err(TxError::Conflict);
        }
        if !self.exclusive_ready {
            let started = std::time::Instant::now();
            while self.eng.oldest_active_excluding(self.thread) != u64::MAX
                && started.elapsed() < EXCLUSIVE_WAIT
            {
                std::thread::yield_now();
            }
            self.exclusive_ready = true;
        }
        Ok(())
    }

    /// Whether the index maps `key` to a committed row: an NVM-tuple, or a Met-Cache entry with a
    /// Tx-CTS. An entry without one is another transaction's insert in flight (a duplicate only
    /// if that transaction commits), and a key gone again was such an insert, rolled back since
    /// it was seen: either way the caller's DuplicateKey is a conflict to retry.
    fn holds_committed_row(&self, table: TableId, key: u64) -> bool {
        let Some(t) = self.tables.get(table as usize) else {
            return false;
        };
        match t.index.get(key) {
            Some(v) if is_cache_ref(v) => t.cache.entry(v).cts().load(Ordering::Acquire) != 0,
            Some(_) => true,
            None => false,
        }
    }

    fn find_write(&self, table: TableId, key: u64) -> Option<usize> {
        let writes = &self.writes;
        self.write_lookup.find(writes.len(), table, key, |i| {
            writes[i].table == table && writes[i].key == key
        })
    }

    /// Appends a write and makes it findable by [`find_write`](Self::find_write).
    fn push_write(&mut self, write: WriteRec) -> usize {
        let position = self.writes.len();
        self.write_lookup.record(position, write.table, write.key);
        self.writes.push(write);
        position
    }

    /// Finds the tuple's Met-Cache entry and pins it, bringing the NVM-tuple into this thread's
    /// region on a miss (§3.3.1, Perform: evict a CLOCK victim, build the entry, enhance it with
    /// the protocol's CC-Meta, point the index at it).
    fn locate(&mut self, table: TableId, key: u64) -> Result<u64, TxError> {
        self.accesses[table as usize] += 1;
        for _ in 0..LOCATE_ATTEMPTS {
            let t = &self.tables[table as usize];
            let v = t.index.get(key).ok_or(TxError::NotFound { table, key })?;
            if is_cache_ref(v) {
                if t.cache.pin(v, key) {
                    self.pins.push((table, v));
                    self.note_footprint();
                    return Ok(v);
                }
                std::hint::spin_loop();
                continue;
            }
            // A miss: start loading the NVM-tuple (header and row) while a victim is claimed
            // (the CLOCK scan and the victim's index update miss in the cache too).
            self.pool.prefetch(v, t.slot);
            let r = self.claim_entry(table)?;
            let t = &self.tables[table as usize];
            // The victim's row lines are about to be overwritten: start fetching them while the
            // NVM-tuple is read.
            t.cache.entry(r).prefetch_row();
            let word = self.pool.read_u64(v + tuple::WORD);
            let cts = tuple::cts(word);
            if cts == 0 || word & tuple::DELETED != 0 || self.pool.read_u64(v + tuple::KEY) != key {
                // The index moved on while we looked (the slot was reclaimed).
                t.cache.release_claimed(r);
                continue;
            }
            // The row goes straight from the NVM-tuple into the claimed (unpublished) entry:
            // its words cover the row rounded up to 8 bytes, which the 16-byte slot holds.
            let e = t.cache.entry(r);
            self.pool.read_words(v + tuple::HEADER, e.row());
            if self.pool.read_u64(v + tuple::WORD) != word {
                t.cache.release_claimed(r);
                continue;
            }
            e.key().store(key, Ordering::Relaxed);
            e.nvm().store(v, Ordering::Relaxed);
            e.cts().store(cts, Ordering::Relaxed);
            e.set_lp(word & tuple::LP != 0);
            e.cc().store(self.proto.idle_word(cts), Ordering::Relaxed);
            t.cache.publish(r, 1);
            if t.index.replace_if(key, v, r) {
                self.pins.push((table, r));
                self.note_footprint();
                return Ok(r);
            }
            // Another thread cached it first: ours is garbage (superseded, unpinned).
            t.cache.supersede(r);
            t.cache.unpin(r);
        }
        Err(TxError::Conflict)
    }

    /// An entry of this thread's region of `table`'s Met-Cache to fill, from the CLOCK (§3.2);
    /// asks for the exclusive mode when the region had to grow past its capacity.
    fn claim_entry(&mut self, table: TableId) -> Result<u64, TxError> {
        let t = &self.tables[table as usize];
        // A lock-only entry first: it holds no row, so taking it evicts none (no CLOCK scan,
        // no index update of a victim, whose bucket would miss in the CPU cache).
        while let Some(at) = self.lock_entries.iter().rposition(|&(tb, _)| tb == table) {
            let (_, r) = self.lock_entries.swap_remove(at);
            if t.cache.claim_unused(self.thread, r) {
                return Ok(r);
            }
        }
        let st = self.state.as_mut().expect("state present");
        let hand = &mut Self::alloc_state(st, table).hand;
        let mut overflowed = false;
        let r = t
            .cache
            .claim(self.thread, hand, &t.index, &mut overflowed)
            .map_err(|_| exhausted(t))?;
        if overflowed {
            self.eng.request_exclusive();
        }
        Ok(r)
    }

    /// The first half of a prefetch hint: starts loading the index buckets of `keys` and queues
    /// their lookups for [`run_prefetches`](Self::run_prefetches), which the transaction's next
    /// operation runs. A transaction that hints several groups of keys (YCSB: its reads, then its
    /// overwrites) so waits for one round of index misses, not one per group.
    fn queue_prefetches(&mut self, table: TableId, keys: &[u64], uncached_bytes: u64, whole: bool) {
        let rt = &self.tables[table as usize];
        for &key in keys {
            rt.index.prefetch(key);
        }
        self.pending_prefetches
            .extend(keys.iter().map(|&key| PendingPrefetch {
                table,
                key,
                found: None,
                uncached_bytes,
                whole_row: whole,
            }));
    }

    /// Runs the second half of the hints queued since the last operation, if any: called first by
    /// every operation.
    #[inline]
    fn run_prefetches(&mut self) {
        if !self.pending_prefetches.is_empty() {
            self.issue_pending_prefetches();
        }
    }

    /// The lookups of the queued keys (their buckets are on their way, so they overlap), then
    /// what `locate` or the commit touches next, in two passes. First one line per key, the
    /// Met-Cache entry's metadata or the NVM-tuple's header: each of these lines is on its own
    /// 4 KB page, so the page walks all start before the bulk loads of the second pass, the rest
    /// of each row the transaction reads, fill the line-fill buffers (a header prefetch stalled
    /// as long as a 17-line one). A 16-key transaction then waits for about two rounds of misses
    /// instead of sixteen pairs.
    #[inline(never)]
    fn issue_pending_prefetches(&mut self) {
        let mut pending = std::mem::take(&mut self.pending_prefetches);
        for p in &mut pending {
            let rt = &self.tables[p.table as usize];
            p.found = rt.index.get(p.key);
            match p.found {
                Some(v) if is_cache_ref(v) => rt.cache.entry(v).prefetch_meta(),
                Some(v) => self.pool.prefetch(v, tuple::HEADER),
                None => {}
            }
        }
        // The second pass skips the line the first asked for.
        for p in pending.iter().filter(|p| p.whole_row) {
            let rt = &self.tables[p.table as usize];
            match p.found {
                Some(v) if is_cache_ref(v) => rt.cache.entry(v).prefetch_row_after_meta(),
                Some(v) => {
                    let after_header_line = (v / CACHE_LINE + 1) * CACHE_LINE;
                    let end = v + p.uncached_bytes;
                    if end > after_header_line {
                        self.pool
                            .prefetch(after_header_line, end - after_header_line);
                    }
                }
                None => {}
            }
        }
        pending.clear();
        self.pending_prefetches = pending;
    }

    /// Starts loading the header lines of the oldest superseded NVM-tuples, which the commit's
    /// Maintenance zeroes (§3.4): their misses, each on its own page, overlap the transaction
    /// instead of stalling the commit one after another.
    fn prefetch_garbage(&self) {
        if let Some(st) = &self.state {
            for g in st.garbage.iter().take(PREFETCH_GARBAGE) {
                self.pool.prefetch(g.slot, 8);
            }
        }
    }

    /// [`locate`](Self::locate), but first the entry this transaction's read of `key` found, if
    /// it is still the key's current entry (it stays pinned until the transaction ends).
    fn locate_again(&mut self, table: TableId, key: u64) -> Result<u64, TxError> {
        match self.recent.get(table, key) {
            Some(r) if self.tables[table as usize].cache.entry(r).is_current(key) => Ok(r),
            _ => self.locate(table, key),
        }
    }

    /// Whether a whole-row update of `key` takes the blind-overwrite path
    /// ([`Self::overwrites_blindly`]): the row is not cached. `NotFound` when the key has no row.
    fn is_uncached_overwrite(&self, table: TableId, key: u64) -> Result<bool, TxError> {
        if !self.overwrites_blindly(table) {
            return Ok(false);
        }
        let rt = &self.tables[table as usize];
        let v = rt.index.get(key).ok_or(TxError::NotFound { table, key })?;
        Ok(!is_cache_ref(v))
    }

    /// Reads the row of `key` that the protocol lets this transaction see.
    fn cc_read(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError> {
        if self.read_uncached(table, key, out) {
            return Ok(());
        }
        for _ in 0..LOCATE_ATTEMPTS {
            let r = match self.locate(table, key) {
                Ok(r) => r,
                // A snapshot may still see a row deleted since (the chain is keyed by key).
                Err(TxError::NotFound { .. }) if self.read_absent_at_snapshot(table, key, out) => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            };
            let held = self.write_locked_by_me(table, r)
                || (self.holds_read_locks()
                    && self
                        .reads
                        .iter()
                        .any(|rd| rd.table == table && rd.eref == r));
            match self.protocol_read(table, r, key, held, out)? {
                Seen::Chain { live: true } => return Ok(()),
                Seen::Chain { live: false } => return Err(TxError::NotFound { table, key }),
                Seen::Entry { cts, read } => {
                    if !self.tables[table as usize].cache.entry(r).is_current(key) {
                        // Superseded (copied, deleted or evicted) under us: look it up again.
                        if read.is_some() && self.holds_read_locks() {
                            self.release_read(table, r);
                        }
                        continue;
                    }
                    if let Some(rd) = read {
                        self.reads.push(rd);
                    }
                    self.max_seen = self.max_seen.max(cts);
                    self.recent.note(table, key, r);
                    return Ok(());
                }
            }
        }
        Err(TxError::Conflict)
    }

    /// OCC and Silo: reads the row of `key` from its NVM-tuple in place when it is not in the
    /// Met-Cache (except every [`ADMIT_EVERY`]th such read, which loads it), and records the
    /// tuple's header word for validation (`uncached_read_still_current`). Only in a read-only
    /// transaction or for a key declared read-only ([`EngineWorker::prefetch_read_only`]): a row
    /// read in place and then updated is read from NVM a second time by the update's `locate`
    /// (TPC-C at 1 thread ran at 0.89x when every uncached read went in place). False when the
    /// row is cached, absent or changing, not declared, or the read is to be admitted: then
    /// `locate` runs.
    ///
    /// Departure from §3.3.1, which loads every accessed tuple into the Met-Cache: on a table
    /// much larger than the cache, read uniformly, nearly every read claimed an entry by the
    /// CLOCK, evicted its row (an index update) and copied the 1 KB row twice, for a row not
    /// read again. A version read this way is as safe as a cached one: a writer must first put
    /// a locked entry for the key in the index, which validation sees.
    fn read_uncached(&mut self, table: TableId, key: u64, out: &mut [u8]) -> bool {
        if !matches!(self.proto, Protocol::Occ | Protocol::Silo)
            || !(self.read_only || self.read_only_keys.contains(&(table, key)))
        {
            return false;
        }
        let t = &self.tables[table as usize];
        let Some(v) = t.index.get(key).filter(|&v| !is_cache_ref(v)) else {
            return false;
        };
        self.uncached_reads += 1;
        if self.uncached_reads % ADMIT_EVERY == 0 {
            return false;
        }
        let word = self.pool.read_u64(v + tuple::WORD);
        let cts = tuple::cts(word);
        if cts == 0 || word & tuple::DELETED != 0 || self.pool.read_u64(v + tuple::KEY) != key {
            return false;
        }
        self.pool.read_bytes(v + tuple::HEADER, out);
        fence(Ordering::Acquire);
        if self.pool.read_u64(v + tuple::WORD) != word {
            return false;
        }
        self.accesses[table as usize] += 1;
        self.reads.push(ReadRec {
            table,
            eref: v,
            token: word,
            rts: key,
        });
        self.max_seen = self.max_seen.max(cts);
        true
    }

    /// Locks an entry for writing during execution (2PL, TO), upgrading a read lock.
    fn lock_for_write(&mut self, table: TableId, key: u64, r: u64) -> Result<(), TxError> {
        let held = if self.holds_read_locks() {
            self.reads
                .iter()
                .position(|rd| rd.table == table && rd.eref == r)
        } else {
            None
        };
        self.lock_early(table, r, held.is_some())?;
        if let Some(i) = held {
            self.reads.swap_remove(i);
        }
        let e = self.tables[table as usize].cache.entry(r);
        self.max_seen = self.max_seen.max(e.cts().load(Ordering::Relaxed));
        if !e.is_current(key) {
            // Superseded under us: keep the lock recorded so that abort releases it.
            self.push_write(WriteRec::new(table, key, r, WriteKind::Cancelled, true));
            return Err(TxError::Conflict);
        }
        Ok(())
    }

    fn push_range(&mut self, write: usize, offset: usize, bytes: &[u8]) {
        self.ranges.push(RangeRec {
            write: write as u32,
            offset: offset as u32,
            len: bytes.len() as u32,
            data: self.data.len() as u32,
        });
        self.data.extend_from_slice(bytes);
    }

    /// Where in `data` the whole new row of write `write` lies, if a single range of the
    /// transaction covers all `row` bytes of it and no other range touches it.
    pub(super) fn sole_whole_range(ranges: &[RangeRec], write: usize, row: usize) -> Option<usize> {
        let mut mine = ranges.iter().filter(|r| r.write as usize == write);
        match (mine.next(), mine.next()) {
            (Some(r), None) if r.offset == 0 && r.len as usize == row => Some(r.data as usize),
            _ => None,
        }
    }

    /// The new row of write `w` built by `build_new_rows`, `row` bytes long.
    pub(super) fn new_row(&self, w: &WriteRec, row: usize) -> &[u8] {
        let from = if w.row_in_data {
            &self.data
        } else {
            &self.rows
        };
        &from[w.row_at..w.row_at + row]
    }

    pub(super) fn overlay(ranges: &[RangeRec], data: &[u8], write: usize, out: &mut [u8]) {
        for r in ranges.iter().filter(|r| r.write as usize == write) {
            let (o, l, d) = (r.offset as usize, r.len as usize, r.data as usize);
            out[o..o + l].copy_from_slice(&data[d..d + l]);
        }
    }

    /// A free NVM-tuple slot of `table` in this thread's region (§3.4): from the free list, else
    /// the current page, else a new 2 MiB page from the page manager (the only persisted
    /// allocation metadata).
    ///
    /// A delete writes a tombstone, so it needs a slot too; on a full pool it must still get one,
    /// or no row could ever be deleted to make room. So an insert or update takes a new page
    /// once only [`DELETE_RESERVE_SLOTS`] slots are left, and when no page is to be had, those
    /// last slots are kept for deletes (`for_delete`). Slots left in a page when the next one is
    /// taken go to the free list, so nothing is wasted.
    pub(super) fn alloc_slot(&mut self, table: TableId, for_delete: bool) -> Result<u64, TxError> {
        let rt = &self.tables[table as usize];
        let slot = rt.slot;
        let (eng, thread) = (&self.eng, self.thread);
        let st = self.state.as_mut().expect("state present");
        let ta = Self::alloc_state(st, table);
        let available = ta.free.len() as u64 + (ta.end - ta.bump) / slot;
        let keep = if for_delete { 0 } else { DELETE_RESERVE_SLOTS };
        if available <= keep {
            let tag = PageTag {
                kind: kind::HEAP,
                owner: thread as u8,
                value: u64::from(table),
            };
            match eng.pages.allocate(&eng.pool, tag) {
                Ok(page) => {
                    self.took_page = true;
                    while ta.bump + slot <= ta.end {
                        ta.free.push(ta.bump);
                        ta.bump += slot;
                    }
                    ta.bump = eng.pages.page_offset(page);
                    ta.end = ta.bump + (PAGE_SIZE / slot) * slot;
                }
                Err(e) => {
                    let name = &rt.schema.name;
                    return Err(common::pm_full(
                        format_args!("table '{name}' of thread {thread}"),
                        e,
                    ));
                }
            }
        }
        if let Some(s) = ta.free.pop() {
            return Ok(s);
        }
        let s = ta.bump;
        ta.bump += slot;
        Ok(s)
    }

    /// Zeroes the header word of a reclaimable version and hands its slot to the free list of
    /// the region that owns it (another region's at the end of the pass,
    /// [`hand_over_freed`](Self::hand_over_freed)); false (keep it) when it is the LP evidence of
    /// its region's latest commit.
    fn reclaim(&mut self, g: Garbage) -> bool {
        let eng = &self.eng;
        // The header word as persisted, kept in DRAM (`Garbage::header`); read from NVM only
        // for garbage found by recovery.
        let word = if g.header != 0 {
            g.header
        } else {
            self.pool.read_u64(g.slot + tuple::WORD)
        };
        let owner = eng.region_of_slot(g.slot);
        if word & tuple::LP != 0
            && tuple::cts(word) >= eng.region_commit[owner].load(Ordering::Acquire)
        {
            return false;
        }
        if word != 0 {
            self.pool.write_u64(g.slot + tuple::WORD, 0);
            if eng.flushing {
                self.pool.flush(g.slot, 8);
            }
        }
        if owner == self.thread {
            let st = self.state.as_mut().expect("state present");
            Self::alloc_state(st, g.table).free.push(g.slot);
        } else {
            self.freed_elsewhere.push((owner, g.table, g.slot));
        }
        true
    }

    /// Ends a Maintenance pass: moves the other regions' slots it reclaimed into their owners'
    /// inboxes, one lock per owner.
    fn hand_over_freed(&mut self) {
        if self.freed_elsewhere.is_empty() {
            return;
        }
        // Usually a single owner (the loader's region); sorting groups the rest.
        self.freed_elsewhere
            .sort_unstable_by_key(|&(owner, _, _)| owner);
        for group in self.freed_elsewhere.chunk_by(|a, b| a.0 == b.0) {
            self.eng.inbox[group[0].0]
                .lock()
                .extend(group.iter().map(|&(_, table, slot)| (table, slot)));
        }
        self.freed_elsewhere.clear();
    }

    /// Between two transactions, after a commit that had to take a new page: if an idle region
    /// (no worker holds its state) has at least [`ADOPT_FREED_SLOTS`] slots freed into its inbox,
    /// this worker leaves its own state for the slot's next worker and takes that region's,
    /// becoming its thread (module docs, "An idle region is adopted"). Without it the space of a
    /// region whose thread is gone (a loader's) is never reused: only its owner may.
    pub(super) fn adopt_idle_region(&mut self) {
        self.took_page = false;
        let eng = self.eng.clone();
        if self.in_txn || eng.exclusive.load(Ordering::Acquire) != 0 {
            return;
        }
        let _handover = eng.handover.lock();
        let idle = (0..eng.config.max_threads)
            .filter(|&r| r != self.thread && eng.threads[r].lock().is_some())
            .map(|r| (eng.inbox[r].lock().len(), r))
            .filter(|&(freed, _)| freed >= ADOPT_FREED_SLOTS)
            .max();
        let Some((_, region)) = idle else {
            return;
        };
        let Some(adopted) = eng.threads[region].lock().take() else {
            return;
        };
        let own = self.state.replace(adopted);
        *eng.threads[self.thread].lock() = own;
        self.thread = region;
        // Entries of the old region's Met-Cache: `claim_entry` may take only this region's.
        self.lock_entries.clear();
        // Before the next commit allocates (Maintenance would take them only after).
        self.take_inbox();
    }

    /// Moves the slots other threads freed into this region onto its free lists.
    fn take_inbox(&mut self) {
        let mut inbox = self.eng.inbox[self.thread].lock();
        if !inbox.is_empty() {
            let st = self.state.as_mut().expect("state present");
            for (table, slot) in inbox.drain(..) {
                Self::alloc_state(st, table).free.push(slot);
            }
        }
    }

    /// Maintenance (§3.3.1, §3.4): takes slots other threads freed in this region, and reclaims
    /// garbage whose superseding commit is older than every running transaction; tombstones also
    /// wait until every thread has durably zeroed what it superseded up to the tombstone's tid.
    /// Returns the thread's new zeroing watermark, to publish after the next fence.
    pub(super) fn collect_garbage(&mut self) -> u64 {
        let eng = self.eng.clone();
        self.take_inbox();
        let min_active = eng.oldest_active_excluding(self.thread);
        let mut deferred = std::mem::take(&mut self.st().deferred);
        deferred.retain(|&g| !self.reclaim(g));
        for _ in 0..GC_BUDGET {
            let Some(&g) = self.st().garbage.front() else {
                break;
            };
            if g.reuse >= min_active {
                break;
            }
            self.st().garbage.pop_front();
            if !self.reclaim(g) {
                deferred.push(g);
            }
        }
        if !self.st().tombs.is_empty() {
            let zeroed_below = eng
                .gc_done
                .iter()
                .map(|d| d.load(Ordering::Acquire))
                .min()
                .unwrap_or(u64::MAX);
            while let Some(&g) = self.st().tombs.front() {
                if g.reuse >= min_active || g.tid >= zeroed_below {
                    break;
                }
                self.st().tombs.pop_front();
                if !self.reclaim(g) {
                    deferred.push(g);
                }
            }
        }
        self.hand_over_freed();
        if self.st().garbage.len() > GARBAGE_THRESHOLD {
            self.eng.request_exclusive();
        }
        let st = self.st();
        st.deferred = deferred;
        let pending = st.garbage.front().map_or(u64::MAX, |g| g.tid);
        st.deferred.iter().map(|g| g.tid).fold(pending, u64::min)
    }

    /// Commit step 1 for the protocols that lock at commit (OCC family, H-Store): locks the
    /// updated and deleted entries in a global order (table, entry), spinning briefly on each.
    /// On `Err` the locks taken are recorded in the write set for the rollback to release.
    pub(super) fn lock_write_set(&mut self) -> Result<(), TxError> {
        if !self.locks_at_commit() {
            return Ok(());
        }
        for i in 0..self.writes.len() {
            if self.is_blind_overwrite(i) {
                self.claim_for_overwrite(i)?;
            }
        }
        let mut order = std::mem::take(&mut self.commit_order);
        order.clear();
        order.extend((0..self.writes.len()).filter(|&i| {
            matches!(self.writes[i].kind, WriteKind::Update | WriteKind::Delete)
                && !self.writes[i].locked
        }));
        order.sort_unstable_by_key(|&i| (self.writes[i].table, self.writes[i].eref));
        let mut result = Ok(());
        for &i in &order {
            let (table, key, r) = (
                self.writes[i].table,
                self.writes[i].key,
                self.writes[i].eref,
            );
            if let Err(held) = self.lock_at_commit(table, r) {
                self.writes[i].locked = held;
                result = Err(TxError::Conflict);
                break;
            }
            self.writes[i].locked = true;
            let e = self.tables[table as usize].cache.entry(r);
            self.max_seen = self.max_seen.max(e.cts().load(Ordering::Relaxed));
            if !e.is_current(key) {
                result = Err(TxError::Conflict);
                break;
            }
        }
        self.commit_order = order;
        result
    }

    /// Whether write `i` is a blind overwrite of an uncached row that has no entry yet
    /// ([`Self::overwrites_blindly`]).
    fn is_blind_overwrite(&self, i: usize) -> bool {
        let w = &self.writes[i];
        w.eref == 0 && matches!(w.kind, WriteKind::Update | WriteKind::Delete)
    }

    /// Whether a whole-row update of `table` may skip bringing an uncached row into the
    /// Met-Cache during execution. Departure from §3.3.1, which loads every accessed tuple: a
    /// row the transaction replaces whole and never reads needs only a locked entry at commit,
    /// so its NVM-tuple's row is not read at all (YCSB's blind updates of 1 KB records read 16
    /// lines of NVM and copied them twice for nothing). Only for the single-version protocols
    /// that lock at commit and whose readers wait on a locked entry (OCC, Silo), and tables
    /// without secondary indexes (whose commit compares old and new secondary keys).
    fn overwrites_blindly(&self, table: TableId) -> bool {
        matches!(self.proto, Protocol::Occ | Protocol::Silo)
            && self.tables[table as usize].secondary.is_empty()
    }

    /// Commit step 1 for a blind overwrite (write `i`): the key's current entry, pinned, if it
    /// was cached since; otherwise a new entry of this region published locked, with the
    /// NVM-tuple's header but not its row (readers wait on the lock; commit points the index at
    /// the new NVM-tuple and frees the entry, a rollback loads the old row). Like an insert's
    /// entry in [`Self::claim_new_version`].
    fn claim_for_overwrite(&mut self, i: usize) -> Result<(), TxError> {
        let (table, key) = (self.writes[i].table, self.writes[i].key);
        for _ in 0..LOCATE_ATTEMPTS {
            let t = &self.tables[table as usize];
            // Deleted since `update` found it: the write must not be acknowledged.
            let v = t.index.get(key).ok_or(TxError::Conflict)?;
            if is_cache_ref(v) {
                if t.cache.pin(v, key) {
                    self.pins.push((table, v));
                    self.note_footprint();
                    self.writes[i].eref = v;
                    return Ok(());
                }
                std::hint::spin_loop();
                continue;
            }
            let r = self.claim_entry(table)?;
            let t = &self.tables[table as usize];
            // No prefetch of the entry's row: commit leaves it unloaded (the new version goes to
            // NVM alone, `install_versions`), only a rollback fills it.
            let e = t.cache.entry(r);
            e.key().store(key, Ordering::Relaxed);
            e.nvm().store(v, Ordering::Relaxed);
            e.cts().store(0, Ordering::Relaxed);
            e.cc().store(LOCK_BIT, Ordering::Relaxed);
            t.cache.publish(r, 1);
            if !t.index.replace_if(key, v, r) {
                // Cached or changed meanwhile: ours is garbage (superseded, unpinned).
                e.cc().store(0, Ordering::Relaxed);
                t.cache.supersede(r);
                t.cache.unpin(r);
                continue;
            }
            self.pins.push((table, r));
            self.note_footprint();
            // The index points at our locked entry, so no writer can replace the NVM-tuple now:
            // its header is stable and gives the version this write supersedes.
            let word = self.pool.read_u64(v + tuple::WORD);
            let cts = tuple::cts(word);
            e.cts().store(cts, Ordering::Relaxed);
            e.set_lp(word & tuple::LP != 0);
            e.cc()
                .store(self.proto.idle_word(cts) | LOCK_BIT, Ordering::Relaxed);
            self.max_seen = self.max_seen.max(cts);
            let w = &mut self.writes[i];
            (w.eref, w.locked, w.row_unloaded) = (r, true, true);
            return Ok(());
        }
        Err(TxError::Conflict)
    }

    /// Commit step 2: [`Self::claim_new_version`] for every write.
    pub(super) fn claim_new_versions(&mut self) -> Result<(), TxError> {
        (0..self.writes.len()).try_for_each(|i| self.claim_new_version(i))
    }

    /// Commit step 2 for write `i`: claims an entry of this thread's region for an insert or for
    /// an update of another region's entry (§3.2). An insert's entry is published to the index at
    /// once, locked and without a Tx-CTS, so readers wait and inserters of the same key see it
    /// in flight ([`Self::holds_committed_row`]).
    fn claim_new_version(&mut self, i: usize) -> Result<(), TxError> {
        let (table, key, kind, eref) = (
            self.writes[i].table,
            self.writes[i].key,
            self.writes[i].kind,
            self.writes[i].eref,
        );
        let thread = self.thread;
        let needs_entry =
            kind == WriteKind::Insert || (kind == WriteKind::Update && region_of(eref) != thread);
        if !needs_entry {
            return Ok(());
        }
        let r = self.claim_entry(table)?;
        let t = &self.tables[table as usize];
        self.writes[i].target = r;
        if kind == WriteKind::Insert {
            let e = t.cache.entry(r);
            e.key().store(key, Ordering::Relaxed);
            e.nvm().store(0, Ordering::Relaxed);
            e.cts().store(0, Ordering::Relaxed);
            e.cc().store(LOCK_BIT, Ordering::Relaxed);
            t.cache.publish(r, 1);
            self.pins.push((table, r));
            if t.index.insert_new(key, r).is_err() {
                // The key was absent when `insert` checked; a transaction that committed since
                // has inserted it. That invalidates this transaction's observation of absence
                // (and, under the optimistic protocols, typically a read it made: TPC-C
                // New-Order's district counter), so it is a conflict to retry, as in Falcon,
                // never a duplicate the caller made (issue 22, item 1). On retry `insert` sees
                // the row and, if the caller still inserts it, reports it.
                t.cache.supersede(r);
                self.writes[i].target = 0;
                return Err(TxError::Conflict);
            }
        }
        Ok(())
    }

    /// Undoes [`Self::claim_new_version`] for write `w` of a transaction that failed: an insert
    /// leaves the index and its entry becomes garbage, a copy's entry goes back to the free state.
    fn unclaim_new_version(&self, w: &WriteRec) {
        let t = &self.tables[w.table as usize];
        match w.kind {
            WriteKind::Insert if w.target != 0 => {
                t.index.remove_if(w.key, w.target);
                t.cache.entry(w.target).cc().store(0, Ordering::Release);
                t.cache.supersede(w.target);
            }
            WriteKind::Update if w.target != 0 => t.cache.release_claimed(w.target),
            _ => {}
        }
    }

    /// Phantom validation of this transaction's scans (see `common::ScanSet`), after the write
    /// set is locked and its inserts are in the index.
    pub(super) fn validate_scans(&mut self) -> bool {
        let mut hits = std::mem::take(&mut self.scan_hits);
        let inserts = self.writes.iter().filter(|w| w.kind == WriteKind::Insert);
        let valid = common::scans_unchanged(
            &self.scan_sets,
            &mut hits,
            inserts.map(|w| (w.table, w.key)),
            |table, from, reverse, limit, hits| {
                let rt = &self.tables[table as usize];
                common::collect_scan_hits(&rt.index, &rt.schema.name, from, reverse, limit, hits)
            },
        );
        self.scan_hits = hits;
        valid
    }

    /// TO and MVTO: whether every insert of this transaction is ordered after the scans of its
    /// table (`TableRt::scanned_up_to`, `common::inserts_follow_scans`); after the inserts are
    /// published.
    pub(super) fn inserts_follow_younger_scans(&self) -> bool {
        !matches!(self.proto, Protocol::To | Protocol::Mvto)
            || common::inserts_follow_scans(
                self.cx.ts,
                (self.writes.iter())
                    .filter(|w| w.kind == WriteKind::Insert)
                    .map(|w| &self.tables[w.table as usize].scanned_up_to),
            )
    }

    pub(super) fn end_txn(&mut self) {
        for i in 0..self.pins.len() {
            let (table, r) = self.pins[i];
            self.tables[table as usize].cache.unpin(r);
        }
        self.pins.clear();
        self.cc_end();
        self.reads.clear();
        self.scan_sets.clear();
        self.cx.locked_rts.clear();
        self.writes.clear();
        self.write_lookup.clear();
        self.recent.next_txn();
        self.ranges.clear();
        self.data.clear();
        self.rows.clear();
        self.secondary.clear();
        self.read_only_keys.clear();
        self.pending_prefetches.clear();
        self.in_txn = false;
        self.eng.active[self.thread].store(u64::MAX, Ordering::Release);
        self.eng.footprint[self.thread].store(0, Ordering::Relaxed);
        if self.exclusive_ready || self.eng.exclusive.load(Ordering::Acquire) == self.thread + 1 {
            self.exclusive_ready = false;
            self.eng.exclusive.store(0, Ordering::Release);
        }
    }

    /// Releases every lock, unpublishes inserts and frees claimed entries (abort, failed commit).
    pub(super) fn rollback(&mut self) {
        self.settle_versions(false);
        for w in &self.writes {
            self.unclaim_new_version(w);
            if w.row_unloaded {
                // The old version becomes the entry's content again before readers see it.
                let e = self.tables[w.table as usize].cache.entry(w.eref);
                let nvm = e.nvm().load(Ordering::Relaxed);
                self.pool.read_words(nvm + tuple::HEADER, e.row());
            }
            if w.locked && w.eref != 0 {
                self.release_word(w.table, w.eref, None);
            }
        }
        if self.holds_read_locks() {
            for rd in &self.reads {
                self.release_read(rd.table, rd.eref);
            }
        }
        self.end_txn();
    }

    pub(super) fn fail(&mut self, e: TxError) -> Result<u64, TxError> {
        self.rollback();
        Err(e)
    }
}

impl EngineWorker for ZenWorker {
    fn begin(&mut self, read_only: bool) {
        if self.in_txn {
            self.abort();
        }
        // §3.3.4: threads resume normal execution once the long-running transaction clears G-EX.
        let started = std::time::Instant::now();
        loop {
            let g = self.eng.exclusive.load(Ordering::Acquire);
            if g == 0 || g == self.thread + 1 || started.elapsed() > EXCLUSIVE_WAIT {
                break;
            }
            if self.eng.active[g - 1].load(Ordering::Acquire) == u64::MAX {
                // The chosen transaction ended before it saw G-EX: clear it.
                let _ =
                    self.eng
                        .exclusive
                        .compare_exchange(g, 0, Ordering::AcqRel, Ordering::Acquire);
            }
            std::thread::yield_now();
        }
        self.in_txn = true;
        self.read_only = read_only;
        self.max_seen = 0;
        self.prefetch_garbage();
        self.eng.active[self.thread].store(self.eng.clock.now(), Ordering::Release);
        self.cc_begin();
    }

    fn read(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError> {
        self.run_prefetches();
        self.ensure_table(table)?;
        self.check_exclusive()?;
        self.partition_lock(key)?;
        let rt = &self.tables[table as usize];
        common::check_row_len(&rt.schema.name, rt.row, out.len(), "buffer")?;
        if let Some(w) = self.find_write(table, key) {
            match self.writes[w].kind {
                WriteKind::Delete | WriteKind::Cancelled => {
                    return Err(TxError::NotFound { table, key })
                }
                WriteKind::Insert => out.fill(0),
                WriteKind::Update => self.cc_read(table, key, out)?,
            }
            Self::overlay(&self.ranges, &self.data, w, out);
            return Ok(());
        }
        self.cc_read(table, key, out)
    }

    fn prefetch(&mut self, table: TableId, keys: &[u64]) {
        if self.ensure_table(table).is_ok() {
            let row = self.tables[table as usize].row as u64;
            let bytes = (tuple::HEADER + row).min(PREFETCH_TUPLE_BYTES);
            self.queue_prefetches(table, keys, bytes, true);
        }
    }

    /// As [`prefetch`](Self::prefetch), and (OCC, Silo) the keys' uncached rows may then be
    /// read in place ([`ZenWorker::read_uncached`]).
    fn prefetch_read_only(&mut self, table: TableId, keys: &[u64]) {
        self.prefetch(table, keys);
        if matches!(self.proto, Protocol::Occ | Protocol::Silo) && !self.read_only {
            self.read_only_keys.extend(keys.iter().map(|&k| (table, k)));
        }
    }

    /// As [`prefetch`](Self::prefetch), but a row that a blind overwrite will replace
    /// ([`ZenWorker::overwrites_blindly`]) is never read: only its NVM-tuple's header line, or
    /// its Met-Cache entry's metadata line, is loaded.
    fn prefetch_for_overwrite(&mut self, table: TableId, keys: &[u64]) {
        if self.ensure_table(table).is_err() {
            return;
        }
        if self.overwrites_blindly(table) {
            self.queue_prefetches(table, keys, tuple::HEADER, false);
        } else {
            self.prefetch(table, keys);
        }
    }

    fn update(
        &mut self,
        table: TableId,
        key: u64,
        writes: &[FieldWrite<'_>],
    ) -> Result<(), TxError> {
        self.run_prefetches();
        if self.read_only {
            return Err(TxError::ReadOnly);
        }
        self.ensure_table(table)?;
        self.check_exclusive()?;
        self.partition_lock(key)?;
        let rt = &self.tables[table as usize];
        for f in writes {
            if f.offset + f.bytes.len() > rt.row {
                return Err(TxError::RowTooLarge(format!(
                    "a write of {} bytes at offset {} does not fit rows of {} bytes in table {}",
                    f.bytes.len(),
                    f.offset,
                    rt.row,
                    rt.schema.name
                )));
            }
        }
        let whole_row = writes
            .iter()
            .any(|f| f.offset == 0 && f.bytes.len() == rt.row);
        let w = match self.find_write(table, key) {
            Some(w) => match self.writes[w].kind {
                WriteKind::Delete | WriteKind::Cancelled => {
                    return Err(TxError::NotFound { table, key })
                }
                _ => w,
            },
            None if whole_row && self.is_uncached_overwrite(table, key)? => {
                self.accesses[table as usize] += 1;
                self.push_write(WriteRec::new(table, key, 0, WriteKind::Update, false));
                self.writes.len() - 1
            }
            None => {
                let r = self.locate_again(table, key)?;
                self.tables[table as usize].cache.entry(r).prefetch_row();
                let locked = self.locks_writes_early();
                if locked {
                    self.lock_for_write(table, key, r)?;
                } else {
                    let cts = self.tables[table as usize]
                        .cache
                        .entry(r)
                        .cts()
                        .load(Ordering::Relaxed);
                    self.max_seen = self.max_seen.max(cts);
                }
                self.push_write(WriteRec::new(table, key, r, WriteKind::Update, locked));
                self.writes.len() - 1
            }
        };
        self.writes[w].whole_row |= whole_row;
        for f in writes {
            self.push_range(w, f.offset, f.bytes);
        }
        Ok(())
    }

    fn insert(&mut self, table: TableId, key: u64, row: &[u8]) -> Result<(), TxError> {
        self.run_prefetches();
        if self.read_only {
            return Err(TxError::ReadOnly);
        }
        self.ensure_table(table)?;
        self.check_exclusive()?;
        self.partition_lock(key)?;
        if row.len() > self.eng.config.max_row_bytes {
            return Err(TxError::RowTooLarge(format!(
                "a row of {} bytes exceeds the limit of {} bytes",
                row.len(),
                self.eng.config.max_row_bytes
            )));
        }
        let rt = &self.tables[table as usize];
        common::check_row_len(&rt.schema.name, rt.row, row.len(), "insert")?;
        if let Some(w) = self.find_write(table, key) {
            if self.writes[w].kind != WriteKind::Delete {
                return Err(TxError::DuplicateKey { table, key });
            }
            // Deleted earlier in this transaction: the insert becomes a full-row update.
            self.writes[w].kind = WriteKind::Update;
            self.writes[w].whole_row = true;
            self.push_range(w, 0, row);
            return Ok(());
        }
        if rt.index.get(key).is_some() {
            return Err(TxError::DuplicateKey { table, key });
        }
        self.accesses[table as usize] += 1;
        self.push_write(WriteRec::new(table, key, 0, WriteKind::Insert, false));
        let w = self.writes.len() - 1;
        self.push_range(w, 0, row);
        Ok(())
    }

    fn delete(&mut self, table: TableId, key: u64) -> Result<(), TxError> {
        self.run_prefetches();
        if self.read_only {
            return Err(TxError::ReadOnly);
        }
        self.ensure_table(table)?;
        self.check_exclusive()?;
        self.partition_lock(key)?;
        if let Some(w) = self.find_write(table, key) {
            match self.writes[w].kind {
                WriteKind::Delete | WriteKind::Cancelled => {
                    return Err(TxError::NotFound { table, key })
                }
                WriteKind::Insert => self.writes[w].kind = WriteKind::Cancelled,
                WriteKind::Update => self.writes[w].kind = WriteKind::Delete,
            }
            return Ok(());
        }
        let r = self.locate_again(table, key)?;
        let locked = self.locks_writes_early();
        if locked {
            self.lock_for_write(table, key, r)?;
        }
        self.push_write(WriteRec::new(table, key, r, WriteKind::Delete, locked));
        Ok(())
    }

    fn scan(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), TxError> {
        self.run_prefetches();
        self.ensure_table(table)?;
        let mut hits = std::mem::take(&mut self.scan_hits);
        let mut row = std::mem::take(&mut self.scratch);
        let rt = &self.tables[table as usize];
        row.resize(rt.row, 0);
        if matches!(self.proto, Protocol::To | Protocol::Mvto) {
            // Before the walk (see `TableRt::scanned_up_to`): an older insert published after
            // it then sees this scan at its commit, or this walk sees the insert.
            common::mark_scan(&rt.scanned_up_to, self.cx.ts);
        }
        let result =
            common::collect_scan_hits(&rt.index, &rt.schema.name, from, reverse, limit, &mut hits)
                .and_then(|()| self.no_delete_since_snapshot(rt))
                .and_then(|()| {
                    common::visit_hits(&hits, &mut row, |key, _, out| self.read(table, key, out), f)
                });
        if let Ok(visited) = result {
            if self.proto.validates_scans(self.read_only) && limit > 0 {
                let covered = ScanSet::covered(table, from, reverse, limit, &hits, visited);
                self.scan_sets.push(covered);
            }
        }
        self.scratch = row;
        self.scan_hits = hits;
        result.map(|_| ())
    }

    fn lookup_secondary(
        &mut self,
        table: TableId,
        index: usize,
        secondary: u64,
        out: &mut Vec<u64>,
    ) -> Result<(), TxError> {
        self.ensure_table(table)?;
        let rt = &self.tables[table as usize];
        common::lookup_secondary(&rt.secondary, &rt.schema.name, index, secondary, out)
    }

    fn commit(&mut self) -> Result<u64, TxError> {
        self.commit_steps()
    }

    fn resolve_miss(&mut self, error: TxError) -> TxError {
        // A miss on a key this transaction wrote is its own answer (its own delete or insert,
        // its own lock), never a stale view.
        if let TxError::NotFound { table, key } | TxError::DuplicateKey { table, key } = error {
            if self.find_write(table, key).is_some() {
                return error;
            }
        }
        match error {
            TxError::NotFound { table, key } | TxError::DuplicateKey { table, key }
                if !self.reads_still_valid() || self.miss_after_snapshot(table, key) =>
            {
                TxError::Conflict
            }
            // The row seen may have been another transaction's insert that has rolled back
            // since: its commit had locked the counter this transaction read (TPC-C's district)
            // and restored the counter's version on abort, so the read set still validates
            // (issue 22, item 1: Zen TPC-C under TicToc and MVOCC).
            TxError::DuplicateKey { table, key } if !self.holds_committed_row(table, key) => {
                TxError::Conflict
            }
            other => other,
        }
    }

    fn abort(&mut self) {
        if self.in_txn {
            self.rollback();
        }
    }
}

impl Drop for ZenWorker {
    fn drop(&mut self) {
        if self.in_txn && !std::thread::panicking() {
            self.abort();
        }
        if let Some(state) = self.state.take() {
            *self.eng.threads[self.thread].lock() = Some(state);
        }
        self.eng.workers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ColumnType, Schema};

    #[test]
    fn only_one_range_covering_the_whole_row_is_used_in_place() {
        let range = |write, offset, len, data| RangeRec {
            write,
            offset,
            len,
            data,
        };
        let whole = [range(0, 0, 8, 0), range(1, 0, 100, 8)];
        assert_eq!(ZenWorker::sole_whole_range(&whole, 1, 100), Some(8));
        assert_eq!(
            ZenWorker::sole_whole_range(&whole, 0, 100),
            None,
            "part of the row"
        );
        assert_eq!(
            ZenWorker::sole_whole_range(&whole, 2, 100),
            None,
            "no range"
        );
        let twice = [range(0, 0, 100, 0), range(0, 10, 4, 100)];
        assert_eq!(
            ZenWorker::sole_whole_range(&twice, 0, 100),
            None,
            "a later range changes the row: it must be built"
        );
        let offset = [range(0, 4, 100, 0)];
        assert_eq!(ZenWorker::sole_whole_range(&offset, 0, 100), None);
    }
    use crate::engine::zen::ZenConfig;
    use crate::engine::Engine;
    use crate::pmem::{PersistenceDomain, Pool, PoolOptions};

    /// The keys of `table` whose index value is a Met-Cache reference (rows cached now).
    fn cached_keys(eng: &ZenEngine, table: TableId, rows: u64) -> Vec<u64> {
        let rt = eng.tables.read()[table as usize].clone();
        (0..rows)
            .filter(|&k| is_cache_ref(rt.index.get(k).expect("a loaded key")))
            .collect()
    }

    /// Write-around (commit 3a49a37, `install_version`): a blind overwrite of an uncached row
    /// leaves the new version on NVM alone, the index pointing at its NVM-tuple, and the entry
    /// that served as its write lock is reused by the next blind overwrite, so a run of them
    /// evicts no cached row. Copying the new row into the Met-Cache instead would show as a cache
    /// reference for the key, and every CLOCK claim as a cached row gone.
    #[test]
    fn blind_overwrites_write_around_the_met_cache() {
        const ROWS: u64 = 400;
        for protocol in [Protocol::Occ, Protocol::Silo] {
            let opts = PoolOptions::new("zen", PersistenceDomain::Eadr);
            let pool = Arc::new(Pool::create_in_memory(32 << 20, &opts).unwrap());
            let mut config = ZenConfig::new(protocol);
            config.max_threads = 1;
            config.cache_bytes = Some(0);
            config.cache_min_entries = 64;
            let eng = ZenEngine::create(pool, config).unwrap();
            let table = eng
                .create_table(Schema::new("rows", &[("v", ColumnType::Bytes(64))]))
                .unwrap();
            let mut w = ZenWorker::new(eng.clone(), 0).unwrap();
            // Ten rows a transaction: the cache holds about 64, so the first rows are evicted.
            for first in (0..ROWS).step_by(10) {
                w.begin(false);
                for k in first..first + 10 {
                    w.insert(table, k, &[1; 64]).unwrap();
                }
                w.commit().unwrap();
            }
            let cached = cached_keys(&eng, table, ROWS);
            assert!(
                cached.len() < ROWS as usize / 2,
                "{protocol}: {}",
                cached.len()
            );
            let uncached: Vec<u64> = (0..ROWS).filter(|k| !cached.contains(k)).collect();
            let rt = eng.tables.read()[table as usize].clone();
            let mut cached_after_first = Vec::new();
            for (n, &key) in uncached.iter().take(8).enumerate() {
                let before = rt.index.get(key).unwrap();
                let row = [n as u8 + 2; 64];
                w.begin(false);
                w.prefetch_for_overwrite(table, &[key]);
                w.update(
                    table,
                    key,
                    &[FieldWrite {
                        offset: 0,
                        bytes: &row,
                    }],
                )
                .unwrap();
                w.commit().unwrap();
                let after = rt.index.get(key).unwrap();
                assert!(
                    !is_cache_ref(after),
                    "{protocol}: key {key}'s new version was copied into the Met-Cache"
                );
                assert_ne!(
                    after, before,
                    "{protocol}: the index names the new NVM-tuple"
                );
                if n == 0 {
                    // The first overwrite found no lock-only entry and evicted one row.
                    cached_after_first = cached_keys(&eng, table, ROWS);
                }
            }
            assert_eq!(
                cached_keys(&eng, table, ROWS),
                cached_after_first,
                "{protocol}: later blind overwrites reused the lock-only entry, evicting no row"
            );
            for (n, &key) in uncached.iter().take(8).enumerate() {
                let mut out = [0; 64];
                w.begin(true);
                w.read(table, key, &mut out).unwrap();
                w.commit().unwrap();
                assert_eq!(out, [n as u8 + 2; 64], "{protocol}: key {key}");
            }
        }
    }

    /// Issue 13: rows loaded by a thread that has gone (region 1) and then updated by another
    /// (region 0). Their superseded slots can be reused only by region 1's writer; without the
    /// adoption region 0 took a new page for every page of them while they sat in region 1's
    /// inbox. Region 0's worker adopts region 1 once it has to take a page, and from then on
    /// reuses region 1's slots: a second pass over the rows takes no page at all. The data
    /// survives a reopen (per-region commit order kept), and the slot left behind serves a new
    /// worker.
    #[test]
    fn a_worker_adopts_an_idle_region_instead_of_stranding_its_free_slots() {
        const ROWS: u64 = 8_000;
        const ROW: usize = 1024;
        let opts = PoolOptions::new("zen", PersistenceDomain::Eadr);
        let pool = Arc::new(Pool::create_in_memory(96 << 20, &opts).unwrap());
        let mut config = ZenConfig::new(Protocol::Occ);
        config.max_threads = 2;
        let eng = ZenEngine::create(pool.clone(), config.clone()).unwrap();
        let table = eng
            .create_table(Schema::new("rows", &[("v", ColumnType::Bytes(ROW as u32))]))
            .unwrap();
        let heap_pages = |eng: &ZenEngine| {
            let heap = |(_, tag): &(u64, PageTag)| tag.kind == kind::HEAP;
            let pages = eng.pages.allocated(&eng.pool).unwrap();
            pages.iter().filter(|p| heap(p)).count()
        };
        {
            let mut loader = ZenWorker::new(eng.clone(), 1).unwrap();
            for first in (0..ROWS).step_by(50) {
                loader.begin(false);
                for k in first..first + 50 {
                    loader.insert(table, k, &[0; ROW]).unwrap();
                }
                loader.commit().unwrap();
            }
        }
        let loaded = heap_pages(&eng);
        let mut w = ZenWorker::new(eng.clone(), 0).unwrap();
        let update_all = |w: &mut ZenWorker, value: u8| {
            for first in (0..ROWS).step_by(16) {
                w.begin(false);
                for k in first..first + 16 {
                    let row = [value; ROW];
                    let f = FieldWrite {
                        offset: 0,
                        bytes: &row,
                    };
                    w.update(table, k, &[f]).unwrap();
                }
                w.commit().unwrap();
            }
        };
        update_all(&mut w, 1);
        let after_first = heap_pages(&eng);
        assert!(
            after_first <= loaded + 2,
            "{after_first} heap pages: region 0 took a page for each of the {loaded} loaded"
        );
        assert_eq!(w.thread, 1, "region 0's worker adopted the idle region 1");
        update_all(&mut w, 2);
        assert_eq!(
            heap_pages(&eng),
            after_first,
            "the second pass reuses the slots the first freed"
        );
        // Slot 1's state is in use: a worker for slot 1 gets the state left free (region 0).
        let mut other = ZenWorker::new(eng.clone(), 1).unwrap();
        assert_eq!(other.thread, 0);
        other.begin(false);
        let f = FieldWrite {
            offset: 0,
            bytes: &[3; ROW],
        };
        other.update(table, 0, &[f]).unwrap();
        other.commit().unwrap();
        drop((w, other));
        eng.check_structure().unwrap();

        let mut image = vec![0; pool.len() as usize];
        pool.read_bytes(0, &mut image);
        let reopened =
            ZenEngine::open(Arc::new(Pool::from_image(&image, &opts).unwrap()), config).unwrap();
        let mut r = ZenWorker::new(reopened, 0).unwrap();
        let mut out = [0; ROW];
        r.begin(true);
        for k in 0..ROWS {
            r.read(table, k, &mut out).unwrap();
            let expected = if k == 0 { 3 } else { 2 };
            assert_eq!(out, [expected; ROW], "key {k} after the reopen");
        }
        r.commit().unwrap();
    }

    /// Issue 22, item 1 (Zen TPC-C under TicToc and MVOCC failed with DuplicateKey), replayed step
    /// by step. New-Orders A and B read the same district counter. B's commit locks the counter
    /// and publishes its order's key (steps 1 and 2); A's insert of that key finds it there; B's
    /// commit then fails (in TPC-C, validating an unrelated read) and rolls back, which restores
    /// the counter's version and removes the key. A's read set still validates, yet the row A
    /// collided with never committed: the miss is a conflict to retry, not a duplicate.
    #[test]
    fn an_insert_that_collided_with_a_rolled_back_insert_is_a_conflict() {
        for protocol in [
            Protocol::Occ,
            Protocol::Silo,
            Protocol::Tictoc,
            Protocol::Mvocc,
        ] {
            let opts = PoolOptions::new("zen", PersistenceDomain::Eadr);
            let pool = Arc::new(Pool::create_in_memory(32 << 20, &opts).unwrap());
            let mut config = ZenConfig::new(protocol);
            config.max_threads = 2;
            let eng = ZenEngine::create(pool, config).unwrap();
            let table = |name| {
                eng.create_table(Schema::new(name, &[("v", ColumnType::U64)]))
                    .unwrap()
            };
            let (counter, orders) = (table("counter"), table("orders"));
            let (mut a, mut b) = (
                ZenWorker::new(eng.clone(), 0).unwrap(),
                ZenWorker::new(eng.clone(), 1).unwrap(),
            );
            a.begin(false);
            a.insert(counter, 0, &7u64.to_le_bytes()).unwrap();
            a.commit().unwrap();

            let mut id = [0u8; 8];
            a.begin(false);
            a.read(counter, 0, &mut id).unwrap();
            b.begin(false);
            b.read(counter, 0, &mut id).unwrap();
            let next = (u64::from_le_bytes(id) + 1).to_le_bytes();
            let field = FieldWrite {
                offset: 0,
                bytes: &next,
            };
            b.update(counter, 0, &[field]).unwrap();
            b.insert(orders, 7, &[1; 8]).unwrap();
            b.lock_write_set().unwrap();
            b.claim_new_versions().unwrap();

            let seen = a.insert(orders, 7, &[2; 8]).unwrap_err();
            assert!(matches!(seen, TxError::DuplicateKey { .. }), "{protocol}");
            // While B's insert is in flight, A's miss is a conflict already.
            assert!(
                matches!(a.resolve_miss(seen.clone()), TxError::Conflict),
                "{protocol}"
            );
            let _ = b.fail(TxError::Conflict);
            assert!(
                matches!(a.resolve_miss(seen), TxError::Conflict),
                "{protocol}: a rolled-back insert is no duplicate"
            );
            a.abort();

            // The retry takes the same id (B never committed) and commits it.
            a.begin(false);
            a.read(counter, 0, &mut id).unwrap();
            assert_eq!(u64::from_le_bytes(id), 7, "{protocol}");
            a.insert(orders, 7, &[2; 8]).unwrap();
            a.commit().unwrap();
            // A duplicate of a committed row stays a duplicate.
            a.begin(false);
            let again = a.insert(orders, 7, &[3; 8]).unwrap_err();
            assert!(
                matches!(a.resolve_miss(again), TxError::DuplicateKey { .. }),
                "{protocol}"
            );
            a.abort();
        }
    }
}
