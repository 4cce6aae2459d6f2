//! A Falcon worker: one thread's transactions (Falcon §5.2, Algorithm 1).

use super::commit::{streams, STREAM_MIN_BYTES};
use super::layout::{kind, slot, tuple};
use super::window::{self, EntryKind};
use super::{FalconEngine, Fault, TableAlloc, TableRt, ThreadState};
use crate::alloc::{PageTag, PAGE_SIZE};
use crate::catalog::TableId;
use crate::cc::{tid_timestamp, MetaWord, Protocol, LOCK_BIT};
use crate::engine::common::{pm_full, ScanSet};
use crate::engine::{common, DbError, EngineWorker, FieldWrite, TxError};
use crate::index::LeafHint;
use crate::pmem::Pool;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A tuple's CC word in its PM header.
pub(super) struct PmWord<'a> {
    pool: &'a Pool,
    at: u64,
}

impl MetaWord for PmWord<'_> {
    fn load(&self) -> u64 {
        self.pool.load_u64(self.at, Ordering::Acquire)
    }
    fn cas(&self, current: u64, new: u64) -> bool {
        self.pool.cas_u64(self.at, current, new).is_ok()
    }
    fn store(&self, value: u64) {
        self.pool.store_u64(self.at, value, Ordering::Release)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriteKind {
    Update,
    Insert,
    Delete,
    /// An insert deleted again by the same transaction: nothing reaches PM.
    Cancelled,
}

pub(super) struct WriteRec {
    pub(super) table: TableId,
    pub(super) key: u64,
    pub(super) tuple: u64,
    pub(super) kind: WriteKind,
    /// OCC: the lock is held (taken at commit). 2PL: always true once recorded.
    pub(super) locked: bool,
}

/// One after-image range of a write, in program order.
pub(super) struct RangeRec {
    pub(super) write: u32,
    pub(super) offset: u32,
    pub(super) len: u32,
    pub(super) data: u32,
}

/// The hot-tuple set (Falcon §4.4, "hot tuple tracking"): a small set-associative LRU of recently
/// flushed tuples. Each tuple maps to one set of `WAYS` entries kept in recency order, so a lookup
/// and an update cost a few compares whatever the capacity; within a set it is exact LRU (the paper
/// says "a small LRU cache" without more detail).
pub(super) struct HotSet {
    sets: Vec<[u64; HotSet::WAYS]>,
}

impl HotSet {
    const WAYS: usize = 4;

    fn new(capacity: usize) -> HotSet {
        let sets = capacity.div_ceil(Self::WAYS).next_power_of_two().max(1);
        HotSet {
            sets: vec![[u64::MAX; Self::WAYS]; sets],
        }
    }

    /// Whether `tuple` is hot, without touching it.
    fn contains(&self, tuple: u64) -> bool {
        let h = (tuple >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.sets[(h >> 40) as usize & (self.sets.len() - 1)].contains(&tuple)
    }

    /// Whether `tuple` is hot; makes it the most recent entry of its set either way (Algorithm 1,
    /// lines 9–11: a tuple not in the set is flushed and cached).
    pub(super) fn check_and_touch(&mut self, tuple: u64) -> bool {
        let h = (tuple >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mask = self.sets.len() - 1;
        let set = &mut self.sets[(h >> 40) as usize & mask];
        let (hit, at) = match set.iter().position(|&t| t == tuple) {
            Some(i) => (true, i),
            None => (false, Self::WAYS - 1),
        };
        set.copy_within(0..at, 1);
        set[0] = tuple;
        hit
    }
}

pub(crate) struct FalconWorker {
    pub(super) eng: Arc<FalconEngine>,
    /// The concurrency-control protocol (its word is the tuple header's CC word; see txcc.rs).
    pub(super) proto: Protocol,
    pub(super) pool: Arc<Pool>,
    pub(super) thread: usize,
    pub(super) state: Option<ThreadState>,
    pub(super) tables: Vec<Arc<TableRt>>,
    pub(super) in_txn: bool,
    pub(super) read_only: bool,
    /// OCC: (tuple, version read). TicToc: (tuple, wts read). 2PL: tuples read-locked.
    pub(super) reads: Vec<(u64, u64)>,
    /// TicToc: the rts seen with each read, parallel to `reads`.
    pub(super) tictoc_rts: Vec<u64>,
    /// TicToc: the rts of each tuple locked at commit.
    pub(super) locked_rts: Vec<u64>,
    pub(super) writes: Vec<WriteRec>,
    /// For each insert of `writes` (its position), where the duplicate check's index lookup
    /// ended: a DRAM ordered index's leaf, so that publishing the key at commit need not descend
    /// the tree again (issue 13: the two descents were ~9 % of TPC-C). Kept beside `writes`, not
    /// in them, so that the write set's records stay small for `find_write`.
    pub(super) insert_hints: Vec<(usize, LeafHint)>,
    /// Whether any write of `writes` has been locked in this transaction: until one is,
    /// `write_locked_by_me` answers without searching them (an OCC read asks it before the
    /// commit locks anything, once per read).
    pub(super) any_write_locked: bool,
    /// Finds a write of `writes` by table and key.
    write_lookup: common::WriteLookup,
    /// Where this transaction's reads found their keys (an update after a read skips the index).
    recent: common::RecentReads,
    /// The index hits of this transaction's prefetches (issue 13): the read or write of a
    /// prefetched key takes its tuple address from here instead of looking the key up again,
    /// while the slot still holds `key` live ([`index_get`](Self::index_get)); otherwise (a
    /// concurrent delete, an Outp update that superseded the version) the index is asked again,
    /// so a remembered address answers only what a lookup at that moment would. Forgotten at
    /// the transaction's end (`end_txn`), and per key when this transaction inserts or deletes
    /// it.
    prefetched: common::RecentReads,
    pub(super) ranges: Vec<RangeRec>,
    pub(super) data: Vec<u8>,
    payload: Vec<u8>,
    /// Largest version / write_ts seen: the commit tid must exceed it.
    pub(super) max_seen: u64,
    /// TO, MVTO: the transaction's timestamp (a tid); wait-die: its priority.
    pub(super) ts: u64,
    /// The largest `ts` handed out by this worker (TO and wait-die timestamps stay unique).
    pub(super) ts_issued: u64,
    /// Multi-version snapshot reads: the snapshot timestamp.
    pub(super) snapshot: Option<u64>,
    /// H-Store: partitions held.
    pub(super) partitions: Vec<usize>,
    /// MV: pending chain entries were pushed by this commit.
    pub(super) retired: bool,
    /// MV: the end they carry (pending, or the commit tid once known).
    pub(super) retired_end: u64,
    /// MV: (end timestamp, tuple) of versions this thread retired, oldest first (Falcon §5.4).
    pub(super) version_queue: std::collections::VecDeque<(u64, u64)>,
    pub(super) hot: HotSet,
    scratch: Vec<u8>,
    pub(super) scan_hits: Vec<(u64, u64)>,
    /// The intervals this transaction's scans covered, validated at commit (phantoms; see
    /// [`ScanSet`]).
    pub(super) scan_sets: Vec<ScanSet>,
    pub(super) spans: Vec<(u64, u64)>,
    /// Per write of a committing transaction: whether its lines get the hinted flush.
    pub(super) flush_write: Vec<bool>,
    /// Per write, while a commit builds its flush spans: whether its header is in them.
    pub(super) span_seen: Vec<bool>,
    /// Secondary entries a commit replaces: (table, index, primary key, old secondary key).
    pub(super) secondary_changes: Vec<(TableId, usize, u64, u64)>,
    /// The write set's indexes in lock order (`lock_at_commit`), kept between commits.
    pub(super) lock_order: Vec<usize>,
    /// A secondary-index insert that failed after the commit mark (`commit.rs`, `note_late`).
    pub(super) late_error: Option<TxError>,
    /// A row read back from PM at commit (secondary keys).
    pub(super) row_buf: Vec<u8>,
    /// Outp, during a commit: per write, the old version an update supersedes (0: none; the
    /// write's `tuple` is then the new version). Empty outside an Outp commit.
    pub(super) superseded: Vec<u64>,
    /// Unit tests: run once by the next commit right after it releases its write locks, to
    /// interleave another transaction there deterministically (`commit.rs` tests).
    #[cfg(test)]
    pub(super) after_release: Option<Box<dyn FnMut() + Send>>,
}

impl FalconWorker {
    pub(crate) fn new(eng: Arc<FalconEngine>, thread: usize) -> Result<FalconWorker, DbError> {
        if thread >= eng.config.max_threads {
            return Err(DbError::NoWorkerSlot(eng.config.max_threads));
        }
        let state = eng.threads[thread]
            .lock()
            .take()
            .ok_or_else(|| DbError::Config(format!("worker slot {thread} is already in use")))?;
        let tables = eng.tables.read().clone();
        Ok(FalconWorker {
            proto: eng.protocol,
            tictoc_rts: Vec::new(),
            locked_rts: Vec::new(),
            ts: 0,
            ts_issued: 0,
            snapshot: None,
            partitions: Vec::new(),
            retired: false,
            retired_end: 0,
            version_queue: std::collections::VecDeque::new(),
            pool: eng.pool.clone(),
            hot: HotSet::new(eng.config.hot_tuples.max(1)),
            thread,
            state: Some(state),
            tables,
            in_txn: false,
            read_only: false,
            reads: Vec::new(),
            writes: Vec::new(),
            insert_hints: Vec::new(),
            any_write_locked: false,
            write_lookup: common::WriteLookup::default(),
            recent: common::RecentReads::default(),
            prefetched: common::RecentReads::default(),
            ranges: Vec::new(),
            data: Vec::new(),
            payload: Vec::new(),
            max_seen: 0,
            scratch: Vec::new(),
            scan_hits: Vec::new(),
            scan_sets: Vec::new(),
            spans: Vec::new(),
            flush_write: Vec::new(),
            span_seen: Vec::new(),
            secondary_changes: Vec::new(),
            lock_order: Vec::new(),
            late_error: None,
            row_buf: Vec::new(),
            superseded: Vec::new(),
            #[cfg(test)]
            after_release: None,
            eng,
        })
    }

    pub(super) fn st(&mut self) -> &mut ThreadState {
        self.state
            .as_mut()
            .expect("state is present while the worker lives")
    }

    /// Makes sure the cached table list covers `id` (tables are only ever appended).
    fn ensure_table(&mut self, id: TableId) -> Result<(), TxError> {
        if id as usize >= self.tables.len() {
            self.tables = self.eng.tables.read().clone();
        }
        let schema = self.tables.get(id as usize).map(|t| &t.schema);
        crate::engine::common::live_schema_in_tx(schema, id).map(|_| ())
    }

    /// Whether every version this transaction has read is still current (an early OCC
    /// validation, used to tell a stale read from a real duplicate key).
    fn reads_still_valid(&self) -> bool {
        match self.proto {
            Protocol::Occ | Protocol::Silo | Protocol::Mvocc => self.reads.iter().all(|&(t, v)| {
                crate::cc::occ::validate_with(&self.word(t), v, || self.write_locked_by_me(t))
            }),
            Protocol::Tictoc => self.reads.iter().all(|&(t, wts)| self.write_ts(t) == wts),
            // Lock-based and timestamp-ordering protocols never hold a stale read.
            _ => true,
        }
    }

    pub(super) fn word(&self, tuple: u64) -> PmWord<'_> {
        PmWord {
            pool: &self.pool,
            at: tuple + tuple::CC,
        }
    }

    pub(super) fn find_write(&self, table: TableId, key: u64) -> Option<usize> {
        let writes = &self.writes;
        self.write_lookup.find(writes.len(), table, key, |i| {
            writes[i].table == table && writes[i].key == key
        })
    }

    /// Appends a write and makes it findable by [`find_write`](Self::find_write).
    fn push_write(&mut self, write: WriteRec) -> usize {
        let position = self.writes.len();
        self.write_lookup.record(position, write.table, write.key);
        self.any_write_locked |= write.locked;
        self.writes.push(write);
        position
    }

    /// A scan at a snapshot (MV read-only transactions, SI, MVTO) walks the current index, from
    /// which a delete takes its key at commit: a row the snapshot holds but a later delete took
    /// out would be missed. Rather than read past it, such a scan fails with `Conflict` (and is
    /// retried at a new snapshot) when `rt` saw a delete commit after the snapshot. Called after
    /// the index walk: a delete whose removal the walk missed raised `deleted_up_to` before it.
    fn no_delete_since_snapshot(&self, rt: &TableRt) -> Result<(), TxError> {
        match self.snapshot {
            Some(s) if tid_timestamp(rt.deleted_up_to.load(Ordering::SeqCst)) > s => {
                Err(TxError::Conflict)
            }
            _ => Ok(()),
        }
    }

    pub(super) fn holds_read_lock(&self, tuple: u64) -> bool {
        self.reads.iter().any(|&(t, _)| t == tuple)
    }

    /// Reads a committed row under the protocol into `out`; NotFound if the slot no longer holds
    /// a live row with `key` (or, for snapshot reads, held none at the snapshot).
    fn cc_read(
        &mut self,
        tuple: u64,
        key: u64,
        table: TableId,
        out: &mut [u8],
    ) -> Result<(), TxError> {
        let not_found = TxError::NotFound { table, key };
        match self.protocol_read(tuple, out)? {
            Some(c) => {
                self.max_seen = self.max_seen.max(c.write_ts);
                if c.flags == tuple::LIVE && c.key == key {
                    Ok(())
                } else {
                    Err(not_found)
                }
            }
            None => Err(not_found),
        }
    }

    /// Locks `tuple` for writing during execution (protocols that lock early, e.g. 2PL), upgrading
    /// a read lock, and checks it still holds `key`.
    fn lock_for_write(&mut self, tuple: u64, key: u64, table: TableId) -> Result<(), TxError> {
        let held = if self.holds_read_locks() {
            self.reads.iter().position(|&(t, _)| t == tuple)
        } else {
            None
        };
        self.lock_early(tuple, held.is_some())?;
        if let Some(i) = held {
            self.reads.swap_remove(i);
        }
        self.max_seen = self
            .max_seen
            .max(self.pool.read_u64(tuple + tuple::WRITE_TS));
        if self.pool.read_u64(tuple + tuple::FLAGS) != tuple::LIVE
            || self.pool.read_u64(tuple + tuple::KEY) != key
        {
            // Keep the lock recorded so abort releases it.
            self.push_write(WriteRec {
                table,
                key,
                tuple,
                kind: WriteKind::Cancelled,
                locked: true,
            });
            // Outp: the row may live on in a newer version the index now points at.
            if self.superseded_meanwhile(table, key, tuple) {
                return Err(TxError::Conflict);
            }
            return Err(TxError::NotFound { table, key });
        }
        Ok(())
    }

    /// Whether a commit would stream a range of `len` bytes into `tuple` if it committed now
    /// (`range_streams`; the hot set may change by then, which costs only a miss or a prefetch).
    fn will_stream(&self, tuple: u64, len: usize) -> bool {
        let policy = self.eng.policy;
        streams(policy, len, !(policy.track_hot && self.hot.contains(tuple)))
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

    fn overlay(&self, write: usize, out: &mut [u8]) {
        for r in self.ranges.iter().filter(|r| r.write as usize == write) {
            let (o, l, d) = (r.offset as usize, r.len as usize, r.data as usize);
            out[o..o + l].copy_from_slice(&self.data[d..d + l]);
        }
    }

    /// A protocol read of `key` in a table already checked (`read`, and the rows of a scan):
    /// the transaction's own write wins, else the committed row at `tuple`, the address the
    /// caller's index hit gave, or the index's.
    fn read_from(
        &mut self,
        table: TableId,
        key: u64,
        tuple: Option<u64>,
        out: &mut [u8],
    ) -> Result<(), TxError> {
        self.partition_lock(key)?;
        if let Some(w) = self.find_write(table, key) {
            let (kind, t) = (self.writes[w].kind, self.writes[w].tuple);
            match kind {
                WriteKind::Delete | WriteKind::Cancelled => {
                    return Err(TxError::NotFound { table, key })
                }
                WriteKind::Insert => {}
                WriteKind::Update => self.cc_read(t, key, table, out)?,
            }
            self.overlay(w, out);
            return Ok(());
        }
        let mut t = match tuple {
            Some(t) => t,
            None => self
                .index_get(table, key)
                .ok_or(TxError::NotFound { table, key })?,
        };
        // Outp: a version found dead may have been superseded since the index gave its address:
        // follow the index to the newer one (a bounded number of times; a row updated faster
        // than this thread can follow it is a conflict).
        let mut follow = 0;
        loop {
            self.eng.gate(t);
            match self.cc_read(t, key, table, out) {
                Err(TxError::NotFound { .. }) if self.superseded_meanwhile(table, key, t) => {
                    follow += 1;
                    if follow > 8 {
                        return Err(TxError::Conflict);
                    }
                    t = self.tables[table as usize]
                        .index
                        .get(key)
                        .ok_or(TxError::NotFound { table, key })?;
                }
                result => {
                    result?;
                    break;
                }
            }
        }
        self.recent.note(table, key, t);
        Ok(())
    }

    /// The index's address for `key`: where this transaction's prefetch found it if that slot
    /// still holds `key` live, else a lookup.
    fn index_get(&self, table: TableId, key: u64) -> Option<u64> {
        if let Some(t) = self.prefetched.get(table, key) {
            self.eng.gate(t);
            if super::recovery::live_with_key(&self.pool, t, key) {
                return Some(t);
            }
        }
        self.tables[table as usize].index.get(key)
    }

    /// The prefetch hints ([`EngineWorker::prefetch`], and `overwrite` for
    /// [`EngineWorker::prefetch_for_overwrite`]): every index bucket first, then each hit's tuple,
    /// only its header for an overwrite whose ranges will stream, and the hit remembered for the
    /// transaction's next use of the key ([`index_get`](Self::index_get)).
    fn prefetch_tuples(&mut self, table: TableId, keys: &[u64], overwrite: bool) {
        if self.ensure_table(table).is_err() {
            return;
        }
        let rt = &self.tables[table as usize];
        for &key in keys {
            rt.index.prefetch(key);
        }
        let whole = (tuple::HEADER + rt.row as u64).min(PREFETCH_TUPLE_BYTES);
        for &key in keys {
            if let Some(t) = rt.index.get(key) {
                let header_only = overwrite && self.will_stream(t, rt.row);
                self.pool
                    .prefetch(t, if header_only { tuple::HEADER } else { whole });
                self.prefetched.note(table, key, t);
            }
        }
    }

    /// The tuple of `key`: where this transaction read it, else the index's.
    fn locate(&self, table: TableId, key: u64) -> Result<u64, TxError> {
        match self.recent.get(table, key) {
            Some(t) => Ok(t),
            None => {
                let t = self
                    .index_get(table, key)
                    .ok_or(TxError::NotFound { table, key })?;
                let rt = &self.tables[table as usize];
                self.eng.gate(t);
                // A blind update or delete takes the slot as the index gives it; a PM index may
                // give the slot of an insert a crash interrupted (`sweep.rs`): not live with the
                // key. Withdrawn when unlocked (the key is absent); a locked one is an insert in
                // flight, whose fate is not known yet.
                if rt.index.is_pm() && !super::recovery::live_with_key(&self.pool, t, key) {
                    if self.word(t).load() & LOCK_BIT != 0 {
                        return Err(TxError::Conflict);
                    }
                    super::sweep::withdraw_if_dangling(&self.eng, &rt.index, key, t);
                    return Err(TxError::NotFound { table, key });
                }
                Ok(t)
            }
        }
    }

    /// Outp: whether `key`'s index entry has moved away from `tuple` (an update superseded it).
    fn superseded_meanwhile(&self, table: TableId, key: u64, tuple: u64) -> bool {
        self.eng.policy.out_of_place
            && self.tables[table as usize]
                .index
                .get(key)
                .is_some_and(|now| now != tuple)
    }

    /// The old version write `i` supersedes (Outp), or 0.
    fn superseded_of(&self, i: usize) -> u64 {
        self.superseded.get(i).copied().unwrap_or(0)
    }

    /// Outp (Falcon §6.2): turns every update of the locked, validated write set into a new
    /// version, whole, in a free slot of this thread; the write's ranges become one full-row
    /// range at the new slot, which the log records as an insert, and the old version is logged
    /// and applied as a delete. The new slot is locked until its commit releases it, and the
    /// index is repointed only then (step 7), so an abort here has nothing to undo in the index.
    pub(super) fn supersede_updates(&mut self) -> Result<(), TxError> {
        self.superseded.clear();
        self.superseded.resize(self.writes.len(), 0);
        let mut rows = std::mem::take(&mut self.scratch);
        rows.clear();
        let mut moved = Vec::new();
        let tombstones = self.eng.policy.wbl;
        for i in 0..self.writes.len() {
            let kind = self.writes[i].kind;
            if kind == WriteKind::Delete && tombstones {
                // WBL: a delete is a tombstone version, so that recovery can tell a committed
                // delete from one in the gap.
                let (table, old) = (self.writes[i].table, self.writes[i].tuple);
                let tomb = self.alloc_slot(table)?;
                self.word(tomb).store(LOCK_BIT);
                self.writes[i].tuple = tomb;
                self.superseded[i] = old;
                continue;
            }
            if kind != WriteKind::Update {
                continue;
            }
            let (table, old) = (self.writes[i].table, self.writes[i].tuple);
            let new = self.alloc_slot(table)?;
            self.word(new).store(LOCK_BIT);
            self.writes[i].tuple = new;
            self.superseded[i] = old;
            let row = self.tables[table as usize].row;
            let at = rows.len();
            rows.resize(at + row, 0);
            self.pool.read_bytes(old + tuple::HEADER, &mut rows[at..]);
            self.overlay(i, &mut rows[at..]);
            moved.push((i, at, row));
        }
        if !moved.is_empty() {
            let superseded = &self.superseded;
            self.ranges.retain(|r| superseded[r.write as usize] == 0);
            for &(i, at, row) in &moved {
                self.push_range(i, 0, &rows[at..at + row]);
            }
        }
        self.scratch = rows;
        Ok(())
    }

    /// WBL, after the commit's data is durable: leaves the group commit and waits until `c_p`
    /// covers `tid` (the acknowledgement), then frees the superseded versions and, once their
    /// frees are durable, the tombstones (`wbl.rs`: an older version must never outlive the
    /// tombstone that hides it).
    pub(super) fn wbl_finish(&mut self, tid: u64) {
        let fault = self.eng.config.fault;
        let eng = self.eng.clone();
        let group = eng.group.as_ref().expect("a WBL engine has a group commit");
        group.leave(self.thread);
        if fault == Some(Fault::WblFreeBeforeCp) {
            self.wbl_free_superseded();
        }
        if fault != Some(Fault::WblAckBeforeCp) {
            group.wait(&self.pool, tid, || eng.clock.now());
        }
        if fault != Some(Fault::WblFreeBeforeCp) {
            self.wbl_free_superseded();
        }
    }

    fn wbl_free_superseded(&self) {
        let mut tombstones = false;
        for (w, &old) in self.writes.iter().zip(&self.superseded) {
            if old != 0 {
                self.pool.write_u64(old + tuple::FLAGS, tuple::DELETED_ROW);
                self.pool.flush(old + tuple::FLAGS, 8);
                tombstones |= w.kind == WriteKind::Delete;
            }
        }
        if tombstones {
            self.pool.fence();
            for (w, &old) in self.writes.iter().zip(&self.superseded) {
                if old != 0 && w.kind == WriteKind::Delete {
                    self.pool
                        .write_u64(w.tuple + tuple::FLAGS, tuple::DELETED_ROW);
                    self.pool.flush(w.tuple + tuple::FLAGS, 8);
                }
            }
        }
    }

    /// A free slot of `table` owned by this thread: a reclaimable deleted slot (§5.4), a free one,
    /// or a new one from the current page (allocating a page when it is full).
    fn alloc_slot(&mut self, table_id: TableId) -> Result<u64, TxError> {
        let oldest = self.eng.oldest_active_excluding(self.thread);
        let table = &self.tables[table_id as usize];
        let (eng, thread) = (&self.eng, self.thread);
        let st = self.state.as_mut().expect("state present");
        if st.tables.len() <= table.id as usize {
            st.tables
                .resize_with(table.id as usize + 1, TableAlloc::default);
        }
        let ta = &mut st.tables[table.id as usize];
        if let Some(&(t, tid)) = ta.deleted.front() {
            if tid_timestamp(tid) < oldest {
                ta.deleted.pop_front();
                return Ok(t);
            }
        }
        if let Some(t) = ta.free.pop() {
            return Ok(t);
        }
        // Free slots the lazy recovery sweep found (`sweep.rs`), a batch at a time.
        if let Some(sweep) = &eng.sweep {
            sweep.take_free(table.id, 64, &mut ta.free);
            if let Some(t) = ta.free.pop() {
                return Ok(t);
            }
        }
        if ta.bump + table.slot > ta.end {
            let tag = PageTag {
                kind: kind::HEAP,
                owner: thread as u8,
                value: u64::from(table.id),
            };
            let page = match eng.pages.allocate(&eng.pool, tag) {
                Ok(page) => page,
                Err(e) => {
                    // PM is full, but pages the lazy recovery sweep has not reached yet may hold
                    // free slots: sweep them now (`sweep.rs`).
                    if let Some(sweep) = eng.sweep.as_ref().filter(|s| s.pending()) {
                        if sweep.help_for_space(eng, table.id) {
                            sweep.take_free(table.id, 64, &mut ta.free);
                            if let Some(t) = ta.free.pop() {
                                return Ok(t);
                            }
                        }
                    }
                    return Err(pm_full(
                        format_args!("table '{}' of thread {thread}", table.schema.name),
                        e,
                    ));
                }
            };
            ta.bump = eng.pages.page_offset(page);
            ta.end = ta.bump + (PAGE_SIZE / table.slot) * table.slot;
        }
        let t = ta.bump;
        ta.bump += table.slot;
        Ok(t)
    }

    fn release_slot(&mut self, table: TableId, tuple: u64) {
        let st = self.st();
        if st.tables.len() <= table as usize {
            st.tables
                .resize_with(table as usize + 1, TableAlloc::default);
        }
        st.tables[table as usize].free.push(tuple);
    }

    pub(super) fn end_txn(&mut self) {
        self.cc_end();
        self.reads.clear();
        self.scan_sets.clear();
        self.tictoc_rts.clear();
        self.locked_rts.clear();
        self.writes.clear();
        self.insert_hints.clear();
        self.any_write_locked = false;
        self.write_lookup.clear();
        self.recent.next_txn();
        self.prefetched.next_txn();
        self.ranges.clear();
        self.data.clear();
        self.superseded.clear();
        if let Some(group) = &self.eng.group {
            group.leave(self.thread);
        }
        self.in_txn = false;
        self.eng.active[self.thread].store(u64::MAX, Ordering::Release);
    }

    /// Releases every lock and returns unpublished insert slots; used by abort and failed commits.
    pub(super) fn rollback(&mut self, published_inserts: usize) {
        self.settle_versions(false);
        let mut inserts_seen = 0;
        for i in 0..self.writes.len() {
            let (table, key, t, kind, locked) = {
                let w = &self.writes[i];
                (w.table, w.key, w.tuple, w.kind, w.locked)
            };
            let old = self.superseded_of(i);
            match kind {
                // Outp, WBL: a new version (or tombstone) never published; the old one is
                // still the row.
                WriteKind::Update | WriteKind::Delete if old != 0 => {
                    self.word(t).store(0);
                    self.release_slot(table, t);
                    if locked {
                        self.release_word(old, None);
                    }
                }
                WriteKind::Insert => {
                    if inserts_seen < published_inserts {
                        if let Some(rt) = self.tables.get(table as usize) {
                            rt.index.remove_if(key, t);
                        }
                    }
                    inserts_seen += 1;
                    if locked {
                        self.word(t).store(0);
                    }
                    self.release_slot(table, t);
                }
                WriteKind::Cancelled if t == 0 => {}
                _ if locked => self.release_word(t, None),
                _ => {}
            }
        }
        if self.holds_read_locks() {
            for i in 0..self.reads.len() {
                crate::cc::lock2pl::read_unlock(&self.word(self.reads[i].0));
            }
        }
        self.end_txn();
    }

    /// Writes the redo entries and the COMMITTED mark to the next window slot (Algorithm 1,
    /// "Before Update" and line 2). Returns the slot offset and whether it spilled.
    ///
    /// `secondary_changes` are the secondary keys the commit replaces (`secondary_keys_replaced`):
    /// those of tables whose secondary indexes are in PM are logged too
    /// ([`EntryKind::SecondaryOld`]), for recovery to remove the old pairs.
    pub(super) fn log_commit(
        &mut self,
        tid: u64,
        secondary_changes: &[(TableId, usize, u64, u64)],
    ) -> Result<(u64, bool), TxError> {
        self.payload.clear();
        let fault = self.eng.config.fault;
        for r in &self.ranges {
            let w = &self.writes[r.write as usize];
            let moved = self
                .superseded
                .get(r.write as usize)
                .is_some_and(|&o| o != 0);
            let kind = match w.kind {
                WriteKind::Insert | WriteKind::Update
                    if (w.kind == WriteKind::Insert || moved)
                        && r.offset == 0
                        && r.len as usize == self.tables[w.table as usize].row =>
                {
                    EntryKind::Insert
                }
                WriteKind::Cancelled | WriteKind::Delete => continue,
                _ => EntryKind::Update,
            };
            let d = r.data as usize;
            window::encode(
                &mut self.payload,
                kind,
                w.table,
                w.tuple,
                w.key,
                r.offset,
                &self.data[d..d + r.len as usize],
            );
        }
        for w in self.writes.iter().filter(|w| w.kind == WriteKind::Delete) {
            window::encode(
                &mut self.payload,
                EntryKind::Delete,
                w.table,
                w.tuple,
                w.key,
                0,
                &[],
            );
        }
        for &(table, si, key, old_key) in secondary_changes {
            if self.tables[table as usize].secondary[si].is_pm()
                && fault != Some(Fault::SecondarySkipOldLog)
            {
                window::encode(
                    &mut self.payload,
                    EntryKind::SecondaryOld,
                    table,
                    0,
                    key,
                    si as u32,
                    &old_key.to_le_bytes(),
                );
            }
        }
        // Outp: the superseded versions are deleted by the same commit.
        if fault != Some(Fault::OutpKeepOldLive) {
            for (w, &old) in self.writes.iter().zip(&self.superseded) {
                if old != 0 {
                    window::encode(
                        &mut self.payload,
                        EntryKind::Delete,
                        w.table,
                        old,
                        w.key,
                        0,
                        &[],
                    );
                }
            }
        }
        let eng = &self.eng;
        let (slots, slot_bytes) = (eng.config.window_slots, eng.config.window_slot_bytes as u64);
        let thread = self.thread;
        let st = self.state.as_mut().expect("state present");
        let win = match st.window {
            Some(w) => w,
            None => {
                let page = eng
                    .pages
                    .allocate(
                        &eng.pool,
                        PageTag {
                            kind: kind::WINDOW,
                            owner: thread as u8,
                            value: 0,
                        },
                    )
                    .map_err(|e| pm_full(format_args!("the log window of thread {thread}"), e))?;
                let w = eng.pages.page_offset(page);
                st.window = Some(w);
                w
            }
        };
        let at = win + st.cursor as u64 * slot_bytes;
        st.cursor = (st.cursor + 1) % slots;
        let pool = &self.pool;
        // Invalidate first: under eADR stores are durable in program order, so the old mark must
        // be gone before the old payload is overwritten (an ordered store: the compiler may not
        // move the payload copy above it).
        pool.write_u64_ordered(at + slot::STATE, slot::FREE);
        if fault == Some(Fault::CommitMarkFirst) {
            pool.write_u64(at + slot::TID, tid);
            pool.write_u64(at + slot::LEN, self.payload.len() as u64);
            pool.write_u64(at + slot::STATE, slot::COMMITTED);
            pool.persist(at, slot::HEADER);
        }
        let len = self.payload.len() as u64;
        let spilled = len > slot_bytes - slot::HEADER;
        // A long payload goes with streaming stores where a CRC covers it (ADR): a flushed slot
        // leaves the cache (`clflushopt`), so each reuse would first read its lines back. The
        // streamed bytes are durable at the fence below, like flushed ones, and the CRC catches
        // a mark that persisted before them (as it does for flushed lines in any order).
        let streams_log =
            eng.policy.crc && eng.policy.persist_log && self.payload.len() >= STREAM_MIN_BYTES;
        if spilled {
            let needed = len.div_ceil(PAGE_SIZE) as usize;
            while st.spill_pages.len() < needed {
                let position = st.spill_pages.len() as u64;
                let page = eng
                    .pages
                    .allocate(
                        &eng.pool,
                        PageTag {
                            kind: kind::SPILL,
                            owner: thread as u8,
                            value: position,
                        },
                    )
                    .map_err(|e| {
                        pm_full(
                            format_args!(
                                "the spill area of thread {thread} (a redo log of {len} bytes, \
                                 more than a window slot holds)"
                            ),
                            e,
                        )
                    })?;
                st.spill_pages.push(eng.pages.page_offset(page));
            }
            for (i, chunk) in self.payload.chunks(PAGE_SIZE as usize).enumerate() {
                if streams_log {
                    pool.write_bytes_nt(st.spill_pages[i], chunk);
                } else {
                    pool.write_bytes(st.spill_pages[i], chunk);
                    if eng.policy.persist_log {
                        pool.flush(st.spill_pages[i], chunk.len() as u64);
                    }
                }
            }
        } else if streams_log {
            pool.write_bytes_nt(at + slot::HEADER, &self.payload);
        } else {
            pool.write_bytes(at + slot::HEADER, &self.payload);
        }
        pool.write_u64(at + slot::TID, tid);
        pool.write_u64(at + slot::LEN, len);
        pool.write_u64(at + slot::SPILLED, u64::from(spilled));
        let mark = if fault == Some(Fault::CommitMarkFirst) {
            slot::COMMITTED
        } else if eng.policy.crc {
            pool.write_u64(at + slot::CRC, window::slot_crc(tid, &self.payload));
            slot::COMMITTED_CRC
        } else {
            slot::COMMITTED
        };
        // eADR ordering point (issue 19): the mark persists after the entries, TID, LEN and CRC
        // stored above and before the in-place apply that follows `log_commit`; program order is
        // persistence order there, so the store is ordered against the compiler on both sides
        // (ADR orders it with the flush + fence below, and the next fence before the apply).
        pool.write_u64_ordered(at + slot::STATE, mark);
        if eng.policy.persist_log {
            let inline = if spilled || streams_log { 0 } else { len };
            if fault != Some(Fault::SkipLogFlush) {
                pool.flush(at, slot::HEADER + inline);
            }
            if fault != Some(Fault::SkipLogFence) {
                pool.fence();
            }
        }
        Ok((at, spilled))
    }
}

/// The most bytes of one tuple [`EngineWorker::prefetch`] asks for: the whole tuple of rows up to
/// about 2 KiB. Prefetching only the header and first lines (256 bytes, before issue 13's second
/// round) left a 1 KB YCSB row's remaining lines to miss one after another in the read's copy:
/// the whole tuple was 7–15 % faster on the 16-op 1 KB YCSB (1 thread, ADR, 3 interleaved rounds).
const PREFETCH_TUPLE_BYTES: u64 = 2048;

/// How many hits ahead of the one being read a scan prefetches.
const SCAN_PREFETCH_AHEAD: usize = 8;

impl FalconEngine {
    /// The oldest start timestamp of running transactions other than `thread`'s own.
    pub(crate) fn oldest_active_excluding(&self, thread: usize) -> u64 {
        crate::engine::common::oldest_active_excluding(&self.active, thread)
    }
}

impl EngineWorker for FalconWorker {
    fn begin(&mut self, read_only: bool) {
        if self.in_txn {
            self.abort();
        }
        self.in_txn = true;
        self.read_only = read_only;
        self.max_seen = 0;
        self.cc_begin();
    }

    fn read(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError> {
        self.ensure_table(table)?;
        let rt = &self.tables[table as usize];
        common::check_row_len(&rt.schema.name, rt.row, out.len(), "buffer")?;
        self.read_from(table, key, None, out)
    }

    /// Two passes so that the misses overlap: every index bucket first, then (their lookups now
    /// hitting the cache) every tuple (up to [`PREFETCH_TUPLE_BYTES`]).
    fn prefetch(&mut self, table: TableId, keys: &[u64]) {
        self.prefetch_tuples(table, keys, false);
    }

    /// Streamed ranges (`streams`) never read their lines, so only the index entries and the
    /// tuple headers (the lock word, `write_ts`) are loaded; otherwise as [`Self::prefetch`]
    /// (the stores of the apply read their lines first).
    fn prefetch_for_overwrite(&mut self, table: TableId, keys: &[u64]) {
        self.prefetch_tuples(table, keys, true);
    }

    fn update(
        &mut self,
        table: TableId,
        key: u64,
        writes: &[FieldWrite<'_>],
    ) -> Result<(), TxError> {
        if self.read_only {
            return Err(TxError::ReadOnly);
        }
        self.ensure_table(table)?;
        self.partition_lock(key)?;
        for f in writes {
            if f.offset + f.bytes.len() > self.tables[table as usize].row {
                return Err(TxError::RowTooLarge(format!(
                    "a write of {} bytes at offset {} does not fit rows of {} bytes in table {}",
                    f.bytes.len(),
                    f.offset,
                    self.tables[table as usize].row,
                    self.tables[table as usize].schema.name
                )));
            }
        }
        let w = match self.find_write(table, key) {
            Some(w) => match self.writes[w].kind {
                WriteKind::Delete | WriteKind::Cancelled => {
                    return Err(TxError::NotFound { table, key })
                }
                _ => w,
            },
            None => {
                let t = self.locate(table, key)?;
                let locked = self.locks_writes_early();
                if locked {
                    self.lock_for_write(t, key, table)?;
                }
                self.push_write(WriteRec {
                    table,
                    key,
                    tuple: t,
                    kind: WriteKind::Update,
                    locked,
                });
                self.writes.len() - 1
            }
        };
        // The commit stores these bytes in place: fetch their lines now, so that the misses
        // overlap with the rest of the transaction instead of stalling the apply (a blind update,
        // as YCSB's, has not read the row).
        // Streamed ranges (`range_streams`) do not read their lines at all.
        let t = self.writes[w].tuple;
        for f in writes {
            if !self.will_stream(t, f.bytes.len()) {
                self.pool
                    .prefetch(t + tuple::HEADER + f.offset as u64, f.bytes.len() as u64);
            }
            self.push_range(w, f.offset, f.bytes);
        }
        Ok(())
    }

    fn insert(&mut self, table: TableId, key: u64, row: &[u8]) -> Result<(), TxError> {
        if self.read_only {
            return Err(TxError::ReadOnly);
        }
        self.ensure_table(table)?;
        self.partition_lock(key)?;
        // The write set answers for the key from now on; a prefetched address must not outlive
        // a change this transaction makes to the key.
        self.prefetched.forget(table, key);
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
            self.push_range(w, 0, row);
            return Ok(());
        }
        let (mut found, hint) = self.tables[table as usize].index.get_for_insert(key);
        if let Some(existing) = found {
            self.eng.gate(existing);
            // A PM index may hold the entry of an insert that a crash interrupted (its slot is
            // not live with the key): withdraw it, then the key is absent (`sweep.rs`).
            let rt = &self.tables[table as usize];
            if rt.index.is_pm()
                && super::sweep::withdraw_if_dangling(&self.eng, &rt.index, key, existing)
            {
                found = rt.index.get(key);
                if let Some(again) = found {
                    self.eng.gate(again);
                }
            }
        }
        if let Some(existing) = found {
            // A locked entry may be another transaction's insert, published at its commit and
            // possibly about to be withdrawn if that commit fails validation: its fate is not
            // known yet, so this is a conflict to retry, not a duplicate.
            if self.word(existing).load() & LOCK_BIT != 0 {
                return Err(TxError::Conflict);
            }
            return Err(TxError::DuplicateKey { table, key });
        }
        let t = self.alloc_slot(table)?;
        // The commit stores into the new slot (its lock word, then the row): start loading it
        // now. Otherwise that store misses, and the index lock taken right after it to publish
        // the key (a locked instruction, which waits for earlier stores) waits for the miss: it
        // was ~80 % of the publish step's samples in TPC-C (issue 13).
        self.pool.prefetch(t, tuple::HEADER + row.len() as u64);
        let w = self.push_write(WriteRec {
            table,
            key,
            tuple: t,
            kind: WriteKind::Insert,
            locked: false,
        });
        if let Some(hint) = hint {
            self.insert_hints.push((w, hint));
        }
        self.push_range(w, 0, row);
        Ok(())
    }

    fn delete(&mut self, table: TableId, key: u64) -> Result<(), TxError> {
        if self.read_only {
            return Err(TxError::ReadOnly);
        }
        self.ensure_table(table)?;
        self.partition_lock(key)?;
        self.prefetched.forget(table, key);
        if let Some(w) = self.find_write(table, key) {
            match self.writes[w].kind {
                WriteKind::Delete | WriteKind::Cancelled => {
                    return Err(TxError::NotFound { table, key })
                }
                WriteKind::Insert => {
                    let t = self.writes[w].tuple;
                    self.writes[w].kind = WriteKind::Cancelled;
                    self.release_slot(table, t);
                    self.writes[w].tuple = 0;
                }
                WriteKind::Update => self.writes[w].kind = WriteKind::Delete,
            }
            return Ok(());
        }
        let t = self.locate(table, key)?;
        let locked = self.locks_writes_early();
        if locked {
            self.lock_for_write(t, key, table)?;
        }
        self.push_write(WriteRec {
            table,
            key,
            tuple: t,
            kind: WriteKind::Delete,
            locked,
        });
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
        self.ensure_table(table)?;
        let mut hits = std::mem::take(&mut self.scan_hits);
        let mut row = std::mem::take(&mut self.scratch);
        let rt = &self.tables[table as usize];
        row.resize(rt.row, 0);
        let bytes = (tuple::HEADER + rt.row as u64).min(PREFETCH_TUPLE_BYTES);
        let pool = Arc::clone(&self.pool);
        if matches!(self.proto, Protocol::To | Protocol::Mvto) {
            // Before the walk (see `TableRt::scanned_up_to`): an older insert published after
            // it then sees this scan at its commit, or this walk sees the insert.
            common::mark_scan(&rt.scanned_up_to, self.ts);
        }
        let result = rt
            .index
            .collect_scan_hits(&rt.schema.name, from, reverse, limit, &mut hits)
            .and_then(|()| self.no_delete_since_snapshot(rt))
            .and_then(|()| {
                // The hits' tuples are scattered over the heap: keep the next few loading while
                // one is read, so a scan of many rows (Stock-Level's order lines) does not wait
                // for each header miss in turn.
                for &(_, t) in hits.iter().take(SCAN_PREFETCH_AHEAD) {
                    pool.prefetch(t, bytes);
                }
                let mut ahead = hits.iter().skip(SCAN_PREFETCH_AHEAD);
                common::visit_hits(
                    &hits,
                    &mut row,
                    |key, tuple, out| {
                        if let Some(&(_, t)) = ahead.next() {
                            pool.prefetch(t, bytes);
                        }
                        self.read_from(table, key, Some(tuple), out)
                    },
                    f,
                )
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
        let stale = match error {
            // A miss on a key this transaction wrote is its own answer (its own delete or insert,
            // under its own lock), never a stale view; but a row found gone when an early lock
            // was taken (`lock_for_write`'s record: cancelled, with a tuple) is judged as usual.
            TxError::NotFound { table, key } | TxError::DuplicateKey { table, key } => {
                let own = self.find_write(table, key).is_some_and(|w| {
                    let w = &self.writes[w];
                    !(w.kind == WriteKind::Cancelled && w.tuple != 0)
                });
                !own && (!self.reads_still_valid() || self.miss_after_snapshot(table, key))
            }
            _ => false,
        };
        match error {
            TxError::NotFound { .. } | TxError::DuplicateKey { .. } if stale => TxError::Conflict,
            other => other,
        }
    }

    fn abort(&mut self) {
        if self.in_txn {
            self.rollback(0);
        }
    }
}

impl Drop for FalconWorker {
    fn drop(&mut self) {
        if self.in_txn && !std::thread::panicking() {
            self.abort();
        }
        // The last commit's header flushes (write_ts) are not yet fenced; a fence covers only the
        // flushes of its own thread, so fence before the slot (and its log window) can move to
        // another thread, whose fences would not make them durable before it reuses the window
        // (found by the crash harness, issue 4).
        if self.eng.policy.persist_data || self.eng.policy.persist_log {
            self.pool.fence();
        }
        if let Some(state) = self.state.take() {
            *self.eng.threads[self.thread].lock() = Some(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FalconWorker;
    use crate::catalog::{ColumnType, Schema, TableId};
    use crate::cc::Protocol;
    use crate::engine::falcon::{FalconConfig, FalconEngine};
    use crate::engine::{Engine, EngineKind, EngineWorker, FieldWrite, TxError};
    use crate::index::IndexPlacement;
    use crate::pmem::{PersistenceDomain, Pool, PoolOptions};
    use std::sync::Arc;

    /// An engine with table `t(v)` holding rows 0..4 with `v = 10 k`, and two idle workers.
    fn setup(
        placement: IndexPlacement,
    ) -> (Arc<FalconEngine>, TableId, FalconWorker, FalconWorker) {
        let opts = PoolOptions::new(EngineKind::Falcon.layout(), PersistenceDomain::Eadr);
        let pool = Arc::new(Pool::create_in_memory(32 << 20, &opts).unwrap());
        let mut config = FalconConfig::new(EngineKind::Falcon, Protocol::Occ);
        config.max_threads = 2;
        config.index_placement = placement;
        let eng = FalconEngine::create(pool, config).unwrap();
        let t = eng
            .create_table(Schema::new("t", &[("v", ColumnType::U64)]))
            .unwrap();
        let mut a = FalconWorker::new(eng.clone(), 0).unwrap();
        a.begin(false);
        for k in 0..4u64 {
            a.insert(t, k, &(10 * k).to_le_bytes()).unwrap();
        }
        a.commit().unwrap();
        let b = FalconWorker::new(eng.clone(), 1).unwrap();
        (eng, t, a, b)
    }

    fn value(w: &mut FalconWorker, t: TableId, key: u64) -> Result<u64, TxError> {
        let mut out = [0u8; 8];
        w.read(t, key, &mut out)?;
        Ok(u64::from_le_bytes(out))
    }

    fn set(w: &mut FalconWorker, t: TableId, key: u64, v: u64) -> Result<(), TxError> {
        let bytes = v.to_le_bytes();
        w.update(
            t,
            key,
            &[FieldWrite {
                offset: 0,
                bytes: &bytes,
            }],
        )
    }

    /// Issue 13's prefetch memo: a key this transaction deletes, re-inserts or updates after
    /// prefetching it reads as its own write says, and an abort leaves nothing remembered.
    #[test]
    fn prefetched_addresses_yield_to_own_writes_and_to_an_abort() {
        for placement in [IndexPlacement::Dram, IndexPlacement::Pm] {
            let (_eng, t, mut a, _b) = setup(placement);
            a.begin(false);
            a.prefetch(t, &[0, 1, 2, 3]);
            a.delete(t, 1).unwrap();
            assert!(matches!(value(&mut a, t, 1), Err(TxError::NotFound { .. })));
            a.insert(t, 1, &111u64.to_le_bytes()).unwrap();
            assert_eq!(value(&mut a, t, 1), Ok(111));
            set(&mut a, t, 2, 222).unwrap();
            assert_eq!(value(&mut a, t, 2), Ok(222));
            assert_eq!(value(&mut a, t, 3), Ok(30));
            a.delete(t, 3).unwrap();
            assert!(matches!(
                set(&mut a, t, 3, 5),
                Err(TxError::NotFound { .. })
            ));
            a.abort();
            a.begin(false);
            a.prefetch(t, &[1, 2, 3]);
            assert_eq!(
                (
                    value(&mut a, t, 1),
                    value(&mut a, t, 2),
                    value(&mut a, t, 3)
                ),
                (Ok(10), Ok(20), Ok(30)),
                "{placement:?}"
            );
            a.commit().unwrap();
        }
    }

    /// A row another transaction deletes and re-inserts (in another slot) between this
    /// transaction's prefetch and its read or write is found where the index now has it, as
    /// without the prefetch: the remembered slot no longer holds the key live.
    #[test]
    fn a_prefetched_address_gone_stale_is_looked_up_again() {
        for placement in [IndexPlacement::Dram, IndexPlacement::Pm] {
            let (eng, t, mut a, mut b) = setup(placement);
            a.begin(false);
            a.prefetch(t, &[2, 3]);
            for key in [2, 3] {
                b.begin(false);
                b.delete(t, key).unwrap();
                b.commit().unwrap();
                b.begin(false);
                b.insert(t, key, &(key * 100).to_le_bytes()).unwrap();
                b.commit().unwrap();
            }
            assert_eq!(value(&mut a, t, 2), Ok(200), "{placement:?}");
            set(&mut a, t, 3, 7).unwrap();
            a.commit().unwrap();
            a.begin(true);
            assert_eq!(value(&mut a, t, 3), Ok(7), "{placement:?}");
            a.commit().unwrap();
            drop((a, b));
            assert_eq!(Engine::check_structure(&*eng), Ok(vec![4]), "{placement:?}");
        }
    }
}
