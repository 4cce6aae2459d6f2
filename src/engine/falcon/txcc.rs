//! The concurrency-control side of a Falcon worker: how each protocol reads a tuple, locks it for
//! writing, chooses the commit tid, validates and releases (Falcon §5.2.1 for 2PL, TO, OCC and the
//! MV variants; the others as cited in `crate::cc`). The per-tuple word is the PM header's CC word
//! and the write timestamp its `write_ts` word; what each protocol keeps in the CC word is
//! documented in its module under `crate::cc`.
//!
//! Per-transaction context lives in the worker (`ts`, `snapshot`, held partitions, the version
//! queue) and the per-database context in the engine's [`crate::cc::CcShared`].

use super::layout::tuple;
use super::worker::{FalconWorker, WriteKind};
use crate::catalog::TableId;
use crate::cc::{
    backoff, lock2pl, mvcc, occ, tictoc, tid_timestamp, to, MetaWord, Protocol, LOCK_BIT,
    TID_THREAD_BITS,
};
use crate::engine::TxError;
use std::sync::atomic::{fence, Ordering};

/// Polls of a word held by a transaction that is committing (or, for TO and OCC, a short
/// critical section) before giving up.
const SPIN_LIMIT: u32 = 256;
pub(super) use crate::cc::mvcc::PENDING;

/// What a read found: the flags, key and `write_ts` words of the tuple when the row was copied.
pub(super) struct Copied {
    pub flags: u64,
    pub key: u64,
    pub write_ts: u64,
}

impl FalconWorker {
    /// Whether this transaction locks tuples as it writes them (2PL, TO).
    pub(super) fn locks_writes_early(&self) -> bool {
        self.proto.locks_writes_early(self.read_only)
    }

    /// Whether the read set holds read locks to release (2PL).
    pub(super) fn holds_read_locks(&self) -> bool {
        self.proto.holds_read_locks()
    }

    /// Sets up the transaction's context (Falcon §5.2.1: TO takes its timestamp at begin; the MV
    /// protocols publish a snapshot; wait-die a priority).
    pub(super) fn cc_begin(&mut self) {
        // No Arc clone of the engine here: its reference count is shared by every thread.
        let thread = self.thread;
        self.snapshot = None;
        self.ts = 0;
        match self.proto {
            Protocol::Mvto => {
                let (shared, active) = (&self.eng.cc, &self.eng.active[thread]);
                // Publish a lower bound first, so a concurrent reclaimer never passes our
                // snapshot; then reserve a timestamp (MVTO: the transaction's position).
                active.store(shared.snapshots.current(), Ordering::SeqCst);
                let ts = shared.snapshots.stamp(self.eng.clock.now());
                active.store(ts - 1, Ordering::SeqCst);
                self.ts = (ts << TID_THREAD_BITS) | thread as u64;
                // Written into read timestamps and `write_ts` (see `ensure_lease`).
                self.eng.ensure_lease(self.ts);
                self.snapshot = Some(ts - 1);
            }
            Protocol::Mvocc | Protocol::Mv2pl | Protocol::Si => {
                let s = self.eng.cc.snapshots.snapshot(&self.eng.active[thread]);
                if self.read_only || self.proto == Protocol::Si {
                    self.snapshot = Some(s);
                }
            }
            Protocol::To | Protocol::WaitDie | Protocol::Hstore => {
                let last = self.st().last_tid.max(self.ts_issued);
                self.ts = self.eng.clock.next_tid(thread, last, 0);
                // Written into lock words and `write_ts` (see `ensure_lease`).
                self.eng.ensure_lease(self.ts);
                self.ts_issued = self.ts;
                if self.proto != Protocol::To {
                    self.eng.cc.txn_ts[thread].store(self.ts, Ordering::Release);
                }
                self.eng.active[thread].store(self.eng.clock.now(), Ordering::Release);
            }
            _ => self.eng.active[thread].store(self.eng.clock.now(), Ordering::Release),
        }
    }

    /// Releases what the context holds at the end of a transaction.
    pub(super) fn cc_end(&mut self) {
        let shared = &self.eng.cc;
        for p in self.partitions.drain(..) {
            shared.partitions.unlock(p);
        }
        if matches!(self.proto, Protocol::WaitDie | Protocol::Hstore) {
            shared.txn_ts[self.thread].store(u64::MAX, Ordering::Release);
        }
        if self.proto == Protocol::DlDetect {
            lock2pl::end_transaction(shared, self.thread);
        }
    }

    /// H-Store: takes the lock of `key`'s partition. On a conflict an older transaction waits
    /// for a younger holder and a younger one aborts (wait-die on the begin timestamps).
    pub(super) fn partition_lock(&mut self, key: u64) -> Result<(), TxError> {
        if self.proto != Protocol::Hstore {
            return Ok(());
        }
        let shared = &self.eng.cc;
        let (wait, txn_ts) = (shared.options.wait_spins, &shared.txn_ts[..]);
        shared
            .partitions
            .lock_for(
                key,
                self.thread,
                self.ts,
                txn_ts,
                wait,
                &mut self.partitions,
            )
            .then_some(())
            .ok_or(TxError::Conflict)
    }

    /// Copies the row and its header words.
    pub(super) fn copy_tuple(&self, t: u64, out: &mut [u8]) -> Copied {
        let flags = self.pool.read_u64(t + tuple::FLAGS);
        let key = self.pool.read_u64(t + tuple::KEY);
        let write_ts = self.pool.load_u64(t + tuple::WRITE_TS, Ordering::Acquire);
        self.pool.read_bytes(t + tuple::HEADER, out);
        Copied {
            flags,
            key,
            write_ts,
        }
    }

    pub(super) fn write_ts(&self, t: u64) -> u64 {
        self.pool.load_u64(t + tuple::WRITE_TS, Ordering::Acquire)
    }

    /// Whether this transaction holds the write lock of `t`.
    pub(super) fn write_locked_by_me(&self, t: u64) -> bool {
        self.any_write_locked && self.writes.iter().any(|w| w.tuple == t && w.locked)
    }

    /// Records that this transaction holds the write lock of write `i`'s tuple.
    pub(super) fn mark_write_locked(&mut self, i: usize) {
        self.writes[i].locked = true;
        self.any_write_locked = true;
    }

    /// Reads committed tuple `t` under the protocol into `out`. `Ok(None)` means "not visible to
    /// this transaction" (NotFound for the caller); `Ok(Some(copied))` a visible row image whose
    /// flags and key the caller checks.
    pub(super) fn protocol_read(
        &mut self,
        t: u64,
        out: &mut [u8],
    ) -> Result<Option<Copied>, TxError> {
        if self.write_locked_by_me(t) {
            return Ok(Some(self.copy_tuple(t, out)));
        }
        if let (Some(s), Protocol::Mvocc | Protocol::Mv2pl | Protocol::Si) =
            (self.snapshot, self.proto)
        {
            return self.read_snapshot(t, out, s);
        }
        match self.proto {
            // (SI always has a snapshot; it is listed here only to make the match total.)
            Protocol::Occ | Protocol::Silo | Protocol::Mvocc | Protocol::Si => {
                self.read_occ(t, out).map(Some)
            }
            Protocol::NoWait | Protocol::WaitDie | Protocol::DlDetect | Protocol::Mv2pl => {
                if !self.holds_read_lock(t) {
                    self.wait_for_2pl(t, lock2pl::Request::Read)?;
                    self.reads.push((t, 0));
                }
                Ok(Some(self.copy_tuple(t, out)))
            }
            Protocol::To => self.read_to(t, out, false),
            Protocol::Mvto => self.read_to(t, out, true),
            Protocol::Tictoc => self.read_tictoc(t, out).map(Some),
            Protocol::Hstore => Ok(Some(self.copy_tuple(t, out))),
        }
    }

    /// OCC (Silo, Falcon §5.2.1): copy between two equal unlocked versions.
    fn read_occ(&mut self, t: u64, out: &mut [u8]) -> Result<Copied, TxError> {
        for round in 0..SPIN_LIMIT {
            let Some(version) = occ::stable_version(&self.word(t)) else {
                backoff(round);
                continue;
            };
            let c = self.copy_tuple(t, out);
            fence(Ordering::Acquire);
            if self.word(t).load() != version {
                continue;
            }
            self.reads.push((t, version));
            return Ok(c);
        }
        Err(TxError::Conflict)
    }

    /// TicToc: copy between two unlocked loads with the same `write_ts`; record `wts` and `rts`.
    fn read_tictoc(&mut self, t: u64, out: &mut [u8]) -> Result<Copied, TxError> {
        for round in 0..SPIN_LIMIT {
            let w = self.word(t).load();
            if w & LOCK_BIT != 0 {
                backoff(round);
                continue;
            }
            let c = self.copy_tuple(t, out);
            fence(Ordering::Acquire);
            let w2 = self.word(t).load();
            if w2 & LOCK_BIT != 0 || self.write_ts(t) != c.write_ts {
                continue;
            }
            self.reads.push((t, c.write_ts));
            self.tictoc_rts.push(tictoc::rts(w));
            return Ok(c);
        }
        Err(TxError::Conflict)
    }

    /// TO: raise the tuple's read timestamp to ours, copy, and abort if the version is newer than
    /// us. MVTO: a newer version sends the read to the DRAM chain instead.
    fn read_to(&mut self, t: u64, out: &mut [u8], multi: bool) -> Result<Option<Copied>, TxError> {
        let ts = self.ts;
        // MVTO reads at its timestamp: the versions that committed before it.
        let snapshot = tid_timestamp(ts).saturating_sub(1);
        let patience = if self.read_only {
            self.eng.cc.options.wait_spins
        } else {
            SPIN_LIMIT
        };
        for round in 0..patience {
            let wts = self.write_ts(t);
            if multi && wts > ts {
                return Ok(self.read_chain(t, out, snapshot));
            }
            if !to::stamp_read(&self.word(t), ts) {
                // A write is in flight: it may be older than us, so wait for it.
                backoff(round);
                continue;
            }
            let c = self.copy_tuple(t, out);
            fence(Ordering::Acquire);
            if self.word(t).load() & LOCK_BIT != 0 || self.write_ts(t) != c.write_ts {
                continue;
            }
            if c.write_ts > ts {
                if multi {
                    return Ok(self.read_chain(t, out, snapshot));
                }
                return Err(TxError::Conflict);
            }
            return Ok(Some(c));
        }
        Err(TxError::Conflict)
    }

    /// The version of `t` that the snapshot sees, from the DRAM chain.
    fn read_chain(&self, t: u64, out: &mut [u8], s: u64) -> Option<Copied> {
        let (key, live) = self.eng.cc.versions.read_at(t, s, out)?;
        Some(Copied {
            flags: if live { tuple::LIVE } else { 0 },
            key,
            write_ts: 0,
        })
    }

    /// A snapshot read (MV read-only transactions, SI): the PM version if the snapshot sees it,
    /// else the DRAM chain. Never takes a lock; waits only while a writer that the snapshot must
    /// see is applying its commit (between its commit timestamp and its unlock).
    fn read_snapshot(&mut self, t: u64, out: &mut [u8], s: u64) -> Result<Option<Copied>, TxError> {
        let versions = &self.eng.cc.versions;
        for round in 0..self.eng.cc.options.wait_spins {
            let w1 = self.word(t).load();
            let wts1 = self.write_ts(t);
            if tid_timestamp(wts1) > s {
                return Ok(self.read_chain(t, out, s));
            }
            let c = self.copy_tuple(t, out);
            fence(Ordering::SeqCst);
            let w2 = self.word(t).load();
            if self.write_ts(t) != wts1 {
                continue;
            }
            let write_locked = |w: u64| w & LOCK_BIT != 0;
            if write_locked(w1) || write_locked(w2) {
                // A writer holds the tuple. Until it retires the current image to the chain it
                // has neither a commit timestamp nor started writing in place, so the copy is
                // the committed version; once retired, the chain entry says whether the
                // snapshot must see the new version (wait) or the old one (use the chain).
                match mvcc::past_writer(
                    || versions.replaced_by(t, wts1),
                    wts1,
                    s,
                    || self.write_ts(t),
                ) {
                    mvcc::PastWriter::Retry => {
                        backoff(round);
                        continue;
                    }
                    mvcc::PastWriter::UseChain => match self.read_chain(t, out, s) {
                        Some(c) => return Ok(Some(c)),
                        // The writer failed validation and took its entry back: look again.
                        None => {
                            backoff(round);
                            continue;
                        }
                    },
                    mvcc::PastWriter::UseCopy => {}
                }
            }
            return Ok(Some(c));
        }
        Err(TxError::Conflict)
    }

    /// Takes a 2PL lock with the protocol's waiting policy (no-wait, wait-die, dl-detect).
    pub(super) fn wait_for_2pl(
        &mut self,
        t: u64,
        request: lock2pl::Request,
    ) -> Result<(), TxError> {
        // The tuple's offset names its word in the waits-for graph.
        lock2pl::acquire(
            self.proto,
            &self.eng.cc,
            self.thread,
            &self.word(t),
            t,
            request,
        )
        .then_some(())
        .ok_or(TxError::Conflict)
    }

    /// Locks `t` for a write during execution (2PL, TO). Returns false if refused.
    pub(super) fn lock_early(&mut self, t: u64, holds_read: bool) -> Result<(), TxError> {
        match self.proto {
            Protocol::To | Protocol::Mvto => {
                let ts = self.ts;
                to::try_write_lock(&self.word(t), ts).map_err(|_| TxError::Conflict)?;
                if self.write_ts(t) > ts {
                    // A younger transaction already wrote it: TO aborts (no Thomas write rule,
                    // the write is a read-modify-write of the row's bytes).
                    to::unlock(&self.word(t));
                    return Err(TxError::Conflict);
                }
                Ok(())
            }
            _ => self.wait_for_2pl(t, lock2pl::Request::Write { holds_read }),
        }
    }

    /// Locks the write set at commit (OCC, Silo, TicToc, MVOCC, SI), in address order so no
    /// deadlock can form. Returns false (after nothing is left locked by the caller to undo
    /// beyond what `locked` flags record) when a lock or SI's first-committer check fails.
    pub(super) fn lock_at_commit(&mut self) -> bool {
        // The order lives in a buffer the worker keeps: no allocation per commit.
        let mut order = std::mem::take(&mut self.lock_order);
        order.clear();
        order.extend(
            (0..self.writes.len())
                .filter(|&i| matches!(self.writes[i].kind, WriteKind::Update | WriteKind::Delete)),
        );
        order.sort_unstable_by_key(|&i| self.writes[i].tuple);
        self.locked_rts.clear();
        let locked = order.iter().all(|&i| self.lock_write_at_commit(i));
        self.lock_order = order;
        locked
    }

    /// Locks write `i`'s tuple for [`Self::lock_at_commit`]; false when the lock, the row's
    /// liveness or SI's first-committer check fails.
    fn lock_write_at_commit(&mut self, i: usize) -> bool {
        let t = self.writes[i].tuple;
        let mut got = None;
        for round in 0..SPIN_LIMIT {
            let w = self.word(t).load();
            if w & LOCK_BIT == 0 && self.word(t).cas(w, w | LOCK_BIT) {
                got = Some(w);
                break;
            }
            backoff(round);
        }
        let Some(old) = got else {
            return false;
        };
        self.mark_write_locked(i);
        // A blind update or delete (the transaction did not read the row) is validated by
        // nothing else: the row may have been deleted by a transaction that committed since
        // the index gave its address. Writing into the dead slot would acknowledge a write to
        // a row that no longer exists (`tests/db_api.rs`,
        // `a_blind_write_to_a_row_deleted_meanwhile_is_not_acknowledged`).
        if !super::recovery::live_with_key(&self.pool, t, self.writes[i].key) {
            return false;
        }
        let write_ts = self.write_ts(t);
        self.max_seen = self.max_seen.max(write_ts);
        if self.proto == Protocol::Tictoc {
            self.locked_rts.push(tictoc::rts(old));
        }
        if self.proto == Protocol::Si {
            // First committer wins (ArchTM §5.3): a version newer than the snapshot means a
            // concurrent transaction committed a write to this tuple first.
            let s = self.snapshot.expect("SI transactions have a snapshot");
            if tid_timestamp(write_ts) > s {
                return false;
            }
        }
        true
    }

    /// The commit tid, after the write set is locked (and, for the MV protocols, its old images
    /// retired as pending versions).
    pub(super) fn commit_tid(&mut self) -> u64 {
        let last = self.st().last_tid;
        match self.proto {
            Protocol::To | Protocol::Mvto => self.ts,
            Protocol::Silo => {
                let ts = self.eng.cc.epoch.commit_ts(
                    self.eng.clock.now(),
                    tid_timestamp(last),
                    tid_timestamp(self.max_seen),
                );
                (ts << TID_THREAD_BITS) | self.thread as u64
            }
            Protocol::Tictoc => {
                // ct ≥ every read's wts, > every written tuple's rts, > the thread's last tid.
                let mut ct = last + 1;
                for &(_, wts) in &self.reads {
                    ct = ct.max(wts);
                }
                for &rts in &self.locked_rts {
                    ct = ct.max(rts + 1);
                }
                for w in &self.writes {
                    if w.locked && w.kind != WriteKind::Insert {
                        ct = ct.max(self.write_ts(w.tuple) + 1);
                    }
                }
                tictoc::tid_at_least(ct, self.thread)
            }
            Protocol::Mvocc | Protocol::Mv2pl | Protocol::Si => {
                let floor = (self.eng.clock.now())
                    .max(tid_timestamp(last) + 1)
                    .max(tid_timestamp(self.max_seen) + 1);
                let ts = self.eng.cc.snapshots.stamp(floor);
                (ts << TID_THREAD_BITS) | self.thread as u64
            }
            _ => self
                .eng
                .clock
                .next_tid(self.thread, last, tid_timestamp(self.max_seen)),
        }
    }

    /// Validates the read set at commit time `tid` (OCC family: versions unchanged; TicToc:
    /// versions unchanged and valid at `tid`, extending read timestamps).
    pub(super) fn validate_reads(&mut self, tid: u64) -> bool {
        match self.proto {
            Protocol::Occ | Protocol::Silo | Protocol::Mvocc => (0..self.reads.len()).all(|i| {
                let (t, v) = self.reads[i];
                occ::validate_with(&self.word(t), v, || self.write_locked_by_me(t))
            }),
            Protocol::Tictoc => (0..self.reads.len()).all(|i| {
                let (t, wts) = self.reads[i];
                let rts = self.tictoc_rts[i];
                if rts >= tid && !self.write_locked_by_me(t) {
                    // Valid through tid already, unless overwritten since.
                    return self.write_ts(t) == wts;
                }
                let pool = &self.pool;
                tictoc::validate_and_extend(
                    &self.word(t),
                    wts,
                    tid,
                    || pool.load_u64(t + tuple::WRITE_TS, Ordering::Acquire),
                    self.write_locked_by_me(t),
                )
            }),
            _ => true,
        }
    }

    /// Phantom validation ([`ScanSet`](crate::engine::common::ScanSet)): every interval a scan
    /// covered still holds the keys it held, this transaction's own inserts (in the index since
    /// commit step 2) aside. Runs after the write set is locked, like read validation.
    pub(super) fn validate_scans(&mut self) -> bool {
        let mut hits = std::mem::take(&mut self.scan_hits);
        let inserts = self.writes.iter().filter(|w| w.kind == WriteKind::Insert);
        let valid = crate::engine::common::scans_unchanged(
            &self.scan_sets,
            &mut hits,
            inserts.map(|w| (w.table, w.key)),
            |table, from, reverse, limit, hits| {
                let rt = &self.tables[table as usize];
                rt.index
                    .collect_scan_hits(&rt.schema.name, from, reverse, limit, hits)
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
            || crate::engine::common::inserts_follow_scans(
                self.ts,
                (self.writes.iter())
                    .filter(|w| w.kind == WriteKind::Insert)
                    .map(|w| &self.tables[w.table as usize].scanned_up_to),
            )
    }

    /// Releases the write lock of `t`: commit with `tid`, or abort (`None`).
    pub(super) fn release_word(&self, t: u64, tid: Option<u64>) {
        let word = self.word(t);
        match self.proto {
            Protocol::NoWait | Protocol::WaitDie | Protocol::DlDetect | Protocol::Mv2pl => {
                lock2pl::write_unlock(&word)
            }
            Protocol::To | Protocol::Mvto => to::unlock(&word),
            Protocol::Tictoc => match tid {
                Some(tid) => tictoc::unlock(&word, tid),
                None => tictoc::unlock(&word, word.load()),
            },
            _ => {
                let version = tid.unwrap_or_else(|| word.load()) & !LOCK_BIT;
                occ::unlock(&word, version)
            }
        }
    }

    /// MV protocols: retires the current image of every tuple the transaction overwrites or
    /// deletes (and marks reused insert slots) as pending chain entries, before the commit
    /// timestamp is taken (so a snapshot reader that sees no entry knows the writer's timestamp
    /// is above its snapshot).
    pub(super) fn retire_versions(&mut self) {
        if !self.proto.is_multi_version() {
            return;
        }
        let versions = &self.eng.cc.versions;
        for i in 0..self.writes.len() {
            let (t, kind, table) = (
                self.writes[i].tuple,
                self.writes[i].kind,
                self.writes[i].table,
            );
            let row_len = self.tables[table as usize].row;
            let end = if self.proto == Protocol::Mvto {
                self.ts
            } else {
                PENDING
            };
            match kind {
                WriteKind::Update | WriteKind::Delete => {
                    let begin = self.write_ts(t);
                    let row = self.pool.read_vec(t + tuple::HEADER, row_len);
                    versions.push(
                        t,
                        mvcc::Version {
                            begin,
                            end,
                            live: self.pool.read_u64(t + tuple::FLAGS) == tuple::LIVE,
                            key: self.pool.read_u64(t + tuple::KEY),
                            row: row.into_boxed_slice(),
                        },
                    );
                }
                WriteKind::Insert => {
                    // The slot's previous occupant's versions all ended before any running
                    // snapshot (the slot was reclaimed), so they go; a dead marker tells
                    // snapshot readers that the slot is being filled.
                    versions.clear(t);
                    versions.push(
                        t,
                        mvcc::Version {
                            begin: self.write_ts(t),
                            end,
                            live: false,
                            key: 0,
                            row: Box::new([]),
                        },
                    );
                }
                WriteKind::Cancelled => continue,
            }
            self.retired = true;
        }
        self.retired_end = if self.proto == Protocol::Mvto {
            self.ts
        } else {
            PENDING
        };
        fence(Ordering::SeqCst);
    }

    /// MV protocols: sets the end of the pending entries to the commit tid, once it is known.
    pub(super) fn settle_versions_pending(&mut self, tid: u64) {
        if !self.retired {
            return;
        }
        let versions = &self.eng.cc.versions;
        for i in 0..self.writes.len() {
            let (t, kind) = (self.writes[i].tuple, self.writes[i].kind);
            if kind != WriteKind::Cancelled {
                versions.settle(t, self.write_ts(t), tid);
            }
        }
        self.retired_end = tid;
        fence(Ordering::SeqCst);
    }

    /// MV protocols, at the end of a commit that retired versions: queue them for reclamation
    /// (`committed`) or drop them (the commit failed after retiring).
    pub(super) fn settle_versions(&mut self, committed: bool) {
        if !self.retired {
            return;
        }
        self.retired = false;
        let versions = &self.eng.cc.versions;
        for i in 0..self.writes.len() {
            let (t, kind) = (self.writes[i].tuple, self.writes[i].kind);
            if kind == WriteKind::Cancelled {
                continue;
            }
            if committed {
                self.version_queue
                    .push_back((tid_timestamp(self.retired_end), t));
            } else {
                versions.discard(t, self.write_ts(t), self.retired_end);
            }
        }
    }

    /// MV protocols: prunes the chains this thread retired versions into, below the oldest
    /// snapshot (Falcon §5.4: per-thread version queues ordered by end timestamp).
    pub(super) fn reclaim_versions(&mut self) {
        let Some(&(first_end, _)) = self.version_queue.front() else {
            return;
        };
        let eng = &self.eng;
        let oldest = mvcc::oldest_snapshot(&eng.cc.snapshots, eng.active.iter().map(|a| &**a));
        if first_end > oldest {
            return;
        }
        while let Some(&(end, t)) = self.version_queue.front() {
            if end > oldest {
                break;
            }
            self.version_queue.pop_front();
            eng.cc.versions.prune(t, oldest);
        }
    }

    /// A deleted slot's reuse stamp: a transaction whose begin stamp is above it cannot hold the
    /// slot's address (Falcon §5.4). Above the clock as well as the tid, since TicToc's and
    /// Silo's tids need not follow the clock.
    pub(super) fn reuse_stamp(&self, tid: u64) -> u64 {
        let ts = tid_timestamp(tid).max(self.eng.clock.now());
        let ts = match self.proto.is_multi_version() {
            true => ts.max(self.eng.cc.snapshots.current()),
            false => ts,
        };
        ts << TID_THREAD_BITS
    }

    /// Snapshot (SI) and MVTO transactions: whether a miss on `key` of `table` (NotFound, or a
    /// DuplicateKey) may come from a commit after the transaction's snapshot or timestamp, which
    /// it did not see: the key's row changed since (its `write_ts` is newer, or it is being
    /// written), or a newer delete took a key out of the table. Such a miss is a conflict to
    /// retry (SI: first committer wins; MVTO: a younger writer came first), not an answer:
    /// TPC-C Delivery under MVTO deleted a new-order row that a younger Delivery had deleted
    /// since its scan and failed with NotFound (issue 22, item 2).
    pub(super) fn miss_after_snapshot(&self, table: TableId, key: u64) -> bool {
        let Some(s) = self
            .snapshot
            .filter(|_| matches!(self.proto, Protocol::Si | Protocol::Mvto))
        else {
            return false;
        };
        let Some(rt) = self.tables.get(table as usize) else {
            return false;
        };
        if tid_timestamp(rt.deleted_up_to.load(Ordering::SeqCst)) > s {
            return true;
        }
        rt.index.get(key).is_some_and(|t| {
            self.eng.gate(t);
            self.word(t).load() & LOCK_BIT != 0 || tid_timestamp(self.write_ts(t)) > s
        })
    }

    /// The table a write belongs to (for messages).
    #[allow(dead_code)]
    pub(super) fn table_of(&self, i: usize) -> TableId {
        self.writes[i].table
    }
}
