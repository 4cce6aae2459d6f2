//! The concurrency-control side of a Zen worker (§3.3.2): every protocol of pmtx's CC layer run
//! over the CC-Meta word of Met-Cache entries, entirely in DRAM. Zen evaluates ten methods
//! (§4.4): 2PL no-wait, wait-die and deadlock detection; OCC, Silo and TicToc; MVCC (DBx1000's
//! multi-version timestamp ordering, `mvto` here), Hekaton (multi-version OCC, `mvocc`), Cicada,
//! and H-Store. pmtx runs all of them but Cicada, plus `to`, `mv2pl` and `si`, which the CC layer
//! also offers.
//!
//! What each protocol keeps in the CC-Meta word is documented in its module under `crate::cc`;
//! the word's companion, the write timestamp, is the entry's Tx-CTS. Per-transaction context
//! (timestamps, snapshots, held partitions, the version queue) lives in the worker, the
//! per-database context in the engine's [`crate::cc::CcShared`].
//!
//! **Multi-version protocols.** Old versions are kept in DRAM (Falcon §6.2.2 describes ZenS doing
//! the same: "the maintenance of extra multiple versions in the DRAM buffer pool"), in a version
//! store per table keyed by primary key: Met-Cache entries move (eviction, copies into another
//! region, §3.2), the key does not. A writer retires the entry's current image to the chain
//! (pending) before it takes its commit timestamp, so a snapshot reader that finds no retired
//! image knows the writer's timestamp is above its snapshot (the same rule as Falcon's, see
//! `engine::falcon::txcc`). Since chains are keyed by key, a snapshot read of a key that a later
//! transaction deleted still finds the row in the chain after the index forgot it.
//!
//! **Superseded entries.** When a writer copies an entry of another region (§3.2) or deletes a
//! tuple, the old entry gets the COPY bit and then the writer's commit tid as its Tx-CTS, before
//! its word is released: validation by write timestamp (TicToc, snapshot reads) fails on it, and
//! readers re-locate the tuple.

use super::cache::is_cache_ref;
use super::layout::tuple;
use super::worker::{WriteKind, ZenWorker};
use crate::catalog::TableId;
use crate::cc::{
    backoff, lock2pl, mvcc, occ, tictoc, tid_timestamp, to, MetaWord, Protocol, LOCK_BIT,
    TID_THREAD_BITS,
};
use crate::engine::TxError;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Polls of a word held by a transaction that is committing (or, for TO and OCC, a short
/// critical section) before giving up.
const SPIN_LIMIT: u32 = 256;
pub(super) use crate::cc::mvcc::PENDING;

/// Releases a write lock held under `proto`: commit with `tid`, or abort (`None`).
pub(super) fn release(proto: Protocol, word: &AtomicU64, tid: Option<u64>) {
    match proto {
        Protocol::NoWait | Protocol::WaitDie | Protocol::DlDetect | Protocol::Mv2pl => {
            lock2pl::write_unlock(word)
        }
        Protocol::To | Protocol::Mvto => to::unlock(word),
        Protocol::Tictoc => match tid {
            Some(tid) => tictoc::unlock(word, tid),
            None => tictoc::unlock(word, MetaWord::load(word)),
        },
        _ => {
            let version = tid.unwrap_or_else(|| MetaWord::load(word)) & !LOCK_BIT;
            occ::unlock(word, version)
        }
    }
}

/// A read the transaction keeps for validation or release.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadRec {
    pub table: TableId,
    /// The Met-Cache entry read, or (OCC and Silo, [`ZenWorker::read_uncached`]) the
    /// NVM-tuple read in place: `is_cache_ref` tells which.
    pub eref: u64,
    /// OCC family: the version word read; TicToc: the `wts` (Tx-CTS) read; 2PL: 0 (a read lock);
    /// an NVM-tuple read in place: its header word.
    pub token: u64,
    /// TicToc: the `rts` seen with it; an NVM-tuple read in place: the key (its validation
    /// looks the key up again).
    pub rts: u64,
}

/// What a protocol read produced.
pub(super) enum Seen {
    /// The entry's row was copied; its Tx-CTS. The caller checks the entry is still current and
    /// then records `read` (if any) in the read set.
    Entry { cts: u64, read: Option<ReadRec> },
    /// A snapshot read answered from the version chain (or found the tuple absent at the
    /// snapshot: `live` false).
    Chain { live: bool },
}

/// The per-transaction context of the protocols.
#[derive(Default)]
pub(super) struct TxContext {
    /// TO, MVTO, wait-die, H-Store: the transaction's timestamp (a tid).
    pub ts: u64,
    /// The largest timestamp this thread handed out (so a retry gets a fresh one).
    pub ts_issued: u64,
    /// MV read-only transactions and SI: the snapshot timestamp.
    pub snapshot: Option<u64>,
    /// H-Store: partitions held.
    pub partitions: Vec<usize>,
    /// TicToc: the `rts` of each write-set entry locked at commit.
    pub locked_rts: Vec<u64>,
    /// The largest committed-delete tid of the tables this transaction inserts into.
    pub insert_floor: u64,
    /// MV protocols: this commit retired old images to the version chains.
    pub retired: bool,
    /// Their end (PENDING until the commit tid is known).
    pub retired_end: u64,
    /// MV protocols: (end timestamp, table, key) of retired versions, for pruning (Falcon §5.4's
    /// per-thread version queue).
    pub version_queue: std::collections::VecDeque<(u64, TableId, u64)>,
}

impl ZenWorker {
    fn word(&self, table: TableId, r: u64) -> &AtomicU64 {
        self.tables[table as usize].cache.entry(r).cc()
    }

    fn cts_of(&self, table: TableId, r: u64) -> u64 {
        self.tables[table as usize]
            .cache
            .entry(r)
            .cts()
            .load(Ordering::Acquire)
    }

    /// Whether this transaction locks tuples as it writes them (2PL, TO).
    pub(super) fn locks_writes_early(&self) -> bool {
        self.proto.locks_writes_early(self.read_only)
    }

    /// Whether the read set holds read locks to release (2PL).
    pub(super) fn holds_read_locks(&self) -> bool {
        self.proto.holds_read_locks()
    }

    /// Whether reads go to snapshots (MV read-only transactions, SI).
    pub(super) fn reads_snapshots(&self) -> bool {
        self.cx.snapshot.is_some()
            && matches!(self.proto, Protocol::Mvocc | Protocol::Mv2pl | Protocol::Si)
    }

    /// Sets up the transaction's context: TO and MVTO take their timestamp at begin, the MV
    /// protocols publish a snapshot, wait-die and H-Store a priority.
    pub(super) fn cc_begin(&mut self) {
        let thread = self.thread;
        self.cx.snapshot = None;
        self.cx.ts = 0;
        let eng = &self.eng;
        match self.proto {
            Protocol::Mvto => {
                let (shared, active) = (&eng.cc, &eng.snap_active[thread]);
                // Publish a lower bound first, so a concurrent pruner never passes our snapshot.
                active.store(shared.snapshots.current(), Ordering::SeqCst);
                let ts = shared.snapshots.stamp(eng.clock.now());
                active.store(ts - 1, Ordering::SeqCst);
                self.cx.ts = (ts << TID_THREAD_BITS) | thread as u64;
                self.cx.ts_issued = self.cx.ts;
                self.cx.snapshot = Some(ts - 1);
            }
            Protocol::Mvocc | Protocol::Mv2pl | Protocol::Si => {
                let s = eng.cc.snapshots.snapshot(&eng.snap_active[thread]);
                if self.read_only || self.proto == Protocol::Si {
                    self.cx.snapshot = Some(s);
                }
            }
            Protocol::To | Protocol::WaitDie | Protocol::Hstore => {
                let last = self
                    .state
                    .as_ref()
                    .map_or(0, |s| s.last_tid)
                    .max(self.cx.ts_issued);
                self.cx.ts = eng.clock.next_tid(thread, last, 0);
                self.cx.ts_issued = self.cx.ts;
                if self.proto != Protocol::To {
                    eng.cc.txn_ts[thread].store(self.cx.ts, Ordering::Release);
                }
            }
            _ => {}
        }
    }

    /// Releases what the context holds at the end of a transaction.
    pub(super) fn cc_end(&mut self) {
        let shared = &self.eng.cc;
        for p in self.cx.partitions.drain(..) {
            shared.partitions.unlock(p);
        }
        match self.proto {
            Protocol::WaitDie | Protocol::Hstore => {
                shared.txn_ts[self.thread].store(u64::MAX, Ordering::Release)
            }
            Protocol::DlDetect => lock2pl::end_transaction(shared, self.thread),
            Protocol::Mvto | Protocol::Mvocc | Protocol::Mv2pl | Protocol::Si => {
                self.eng.snap_active[self.thread].store(u64::MAX, Ordering::SeqCst)
            }
            _ => {}
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
                self.cx.ts,
                txn_ts,
                wait,
                &mut self.cx.partitions,
            )
            .then_some(())
            .ok_or(TxError::Conflict)
    }

    /// Reads entry `r` of `table` (holding `key`) under the protocol into `out`. `held`: the
    /// transaction already holds a lock on it (2PL read lock, or its write lock).
    pub(super) fn protocol_read(
        &mut self,
        table: TableId,
        r: u64,
        key: u64,
        held: bool,
        out: &mut [u8],
    ) -> Result<Seen, TxError> {
        let e = self.tables[table as usize].cache.entry(r);
        if held {
            e.copy_row(out);
            let cts = e.cts().load(Ordering::Acquire);
            return Ok(Seen::Entry { cts, read: None });
        }
        if let Some(s) = self.cx.snapshot.filter(|_| self.reads_snapshots()) {
            return self.read_snapshot(table, r, key, out, s);
        }
        let rec = |token, rts| ReadRec {
            table,
            eref: r,
            token,
            rts,
        };
        match self.proto {
            Protocol::Occ | Protocol::Silo | Protocol::Mvocc | Protocol::Si => {
                for round in 0..SPIN_LIMIT {
                    let Some(version) = occ::stable_version(e.cc()) else {
                        backoff(round);
                        continue;
                    };
                    e.copy_row(out);
                    let cts = e.cts().load(Ordering::Relaxed);
                    fence(Ordering::Acquire);
                    if e.cc().load(Ordering::Relaxed) == version {
                        return Ok(Seen::Entry {
                            cts,
                            read: Some(rec(version, 0)),
                        });
                    }
                }
                Err(TxError::Conflict)
            }
            Protocol::NoWait | Protocol::WaitDie | Protocol::DlDetect | Protocol::Mv2pl => {
                self.wait_for_2pl(table, r, lock2pl::Request::Read)?;
                let e = self.tables[table as usize].cache.entry(r);
                e.copy_row(out);
                let cts = e.cts().load(Ordering::Acquire);
                Ok(Seen::Entry {
                    cts,
                    read: Some(rec(0, 0)),
                })
            }
            Protocol::Tictoc => {
                for round in 0..SPIN_LIMIT {
                    let w = e.cc().load(Ordering::Acquire);
                    if w & LOCK_BIT != 0 {
                        backoff(round);
                        continue;
                    }
                    let wts = e.cts().load(Ordering::Acquire);
                    e.copy_row(out);
                    fence(Ordering::Acquire);
                    let w2 = e.cc().load(Ordering::Relaxed);
                    if w2 & LOCK_BIT != 0 || e.cts().load(Ordering::Relaxed) != wts {
                        continue;
                    }
                    return Ok(Seen::Entry {
                        cts: wts,
                        read: Some(rec(wts, tictoc::rts(w))),
                    });
                }
                Err(TxError::Conflict)
            }
            Protocol::To | Protocol::Mvto => self.read_to(table, r, key, out),
            Protocol::Hstore => {
                e.copy_row(out);
                let cts = e.cts().load(Ordering::Acquire);
                Ok(Seen::Entry { cts, read: None })
            }
        }
    }

    /// TO: raise the entry's read timestamp to ours, copy, and abort if the version is newer than
    /// us. MVTO: a newer version sends the read to the version chain instead.
    fn read_to(
        &mut self,
        table: TableId,
        r: u64,
        key: u64,
        out: &mut [u8],
    ) -> Result<Seen, TxError> {
        let multi = self.proto == Protocol::Mvto;
        let ts = self.cx.ts;
        // MVTO reads at its timestamp: the versions that committed before it.
        let snapshot = tid_timestamp(ts).saturating_sub(1);
        let patience = if self.read_only {
            self.eng.cc.options.wait_spins
        } else {
            SPIN_LIMIT
        };
        let t = &self.tables[table as usize];
        let e = t.cache.entry(r);
        for round in 0..patience {
            let wts = e.cts().load(Ordering::Acquire);
            if multi && wts > ts {
                return Ok(Self::read_chain(&t.versions, key, out, snapshot));
            }
            if !to::stamp_read(e.cc(), ts) {
                // A write is in flight: it may be older than us, so wait for it.
                backoff(round);
                continue;
            }
            e.copy_row(out);
            fence(Ordering::Acquire);
            if e.cc().load(Ordering::Relaxed) & LOCK_BIT != 0
                || e.cts().load(Ordering::Relaxed) != wts
            {
                continue;
            }
            if wts > ts {
                if multi {
                    return Ok(Self::read_chain(&t.versions, key, out, snapshot));
                }
                return Err(TxError::Conflict);
            }
            return Ok(Seen::Entry {
                cts: wts,
                read: None,
            });
        }
        Err(TxError::Conflict)
    }

    /// The version of `key` that snapshot `s` sees, from the version chain.
    fn read_chain(versions: &mvcc::VersionStore, key: u64, out: &mut [u8], s: u64) -> Seen {
        match versions.read_at(key, s, out) {
            Some((_, live)) => Seen::Chain { live },
            None => Seen::Chain { live: false },
        }
    }

    /// A snapshot read of a tuple the index no longer has (deleted after the snapshot).
    pub(super) fn read_absent_at_snapshot(&self, table: TableId, key: u64, out: &mut [u8]) -> bool {
        match self.cx.snapshot.filter(|_| self.reads_snapshots()) {
            Some(s) => matches!(
                Self::read_chain(&self.tables[table as usize].versions, key, out, s),
                Seen::Chain { live: true }
            ),
            None => false,
        }
    }

    /// A snapshot read (MV read-only transactions, SI): the entry's version if the snapshot sees
    /// it, else the chain. Never takes a lock; waits only while a writer that the snapshot must
    /// see is applying its commit (between its commit timestamp and its unlock).
    fn read_snapshot(
        &mut self,
        table: TableId,
        r: u64,
        key: u64,
        out: &mut [u8],
        s: u64,
    ) -> Result<Seen, TxError> {
        let t = &self.tables[table as usize];
        let (e, versions) = (t.cache.entry(r), &t.versions);
        for round in 0..self.eng.cc.options.wait_spins {
            let w1 = e.cc().load(Ordering::SeqCst);
            let wts1 = e.cts().load(Ordering::SeqCst);
            if wts1 == 0 {
                // An insert in flight. Its writer pushes a dead marker before it takes its
                // commit timestamp: no marker means a timestamp above the snapshot.
                match versions.newest(key) {
                    Some((false, end)) if end == PENDING || tid_timestamp(end) <= s => {
                        if !e.is_current(key) {
                            // Rolled back: the caller looks the key up again.
                            return Ok(Seen::Entry { cts: 0, read: None });
                        }
                        backoff(round);
                        continue;
                    }
                    // No marker may also mean that the insert committed and its marker, ended
                    // at or below the snapshot, was pruned since (see `mvcc::past_writer`):
                    // then the Tx-CTS is set, and the row must be read.
                    _ if e.cts().load(Ordering::SeqCst) != 0 => {
                        backoff(round);
                        continue;
                    }
                    _ => return Ok(Seen::Chain { live: false }),
                }
            }
            if tid_timestamp(wts1) > s {
                return Ok(Self::read_chain(versions, key, out, s));
            }
            e.copy_row(out);
            fence(Ordering::SeqCst);
            let w2 = e.cc().load(Ordering::SeqCst);
            if e.cts().load(Ordering::SeqCst) != wts1 {
                continue;
            }
            if w1 & LOCK_BIT != 0 || w2 & LOCK_BIT != 0 {
                // A writer holds the entry. Until it retires the current image it has neither a
                // commit timestamp nor installed anything, so the copy is the committed version;
                // once retired, the chain says whether the snapshot must see the new version
                // (wait) or the old one (use the chain).
                let wts_now = || e.cts().load(Ordering::SeqCst);
                match mvcc::past_writer(|| versions.replaced_by(key, wts1), wts1, s, wts_now) {
                    mvcc::PastWriter::Retry => {
                        backoff(round);
                        continue;
                    }
                    mvcc::PastWriter::UseChain => match Self::read_chain(versions, key, out, s) {
                        Seen::Chain { live: true } => return Ok(Seen::Chain { live: true }),
                        // The writer failed and took its entry back: look again.
                        _ => {
                            backoff(round);
                            continue;
                        }
                    },
                    mvcc::PastWriter::UseCopy => {}
                }
            }
            return Ok(Seen::Entry {
                cts: wts1,
                read: None,
            });
        }
        Err(TxError::Conflict)
    }

    /// Takes a 2PL lock with the protocol's waiting policy (no-wait, wait-die, dl-detect).
    fn wait_for_2pl(
        &mut self,
        table: TableId,
        r: u64,
        request: lock2pl::Request,
    ) -> Result<(), TxError> {
        let word = self.word(table, r);
        // The word's address names it in the waits-for graph (entries do not move while a
        // transaction holds them).
        let word_id = word as *const AtomicU64 as u64;
        lock2pl::acquire(
            self.proto,
            &self.eng.cc,
            self.thread,
            word,
            word_id,
            request,
        )
        .then_some(())
        .ok_or(TxError::Conflict)
    }

    /// Locks entry `r` for a write during execution (2PL, TO), upgrading a read lock.
    pub(super) fn lock_early(
        &mut self,
        table: TableId,
        r: u64,
        holds_read: bool,
    ) -> Result<(), TxError> {
        match self.proto {
            Protocol::To | Protocol::Mvto => {
                let ts = self.cx.ts;
                let word = self.word(table, r);
                to::try_write_lock(word, ts).map_err(|_| TxError::Conflict)?;
                if self.cts_of(table, r) > ts {
                    // A younger transaction already wrote it: TO aborts (no Thomas write rule,
                    // the write is a read-modify-write of the row's bytes).
                    to::unlock(word);
                    return Err(TxError::Conflict);
                }
                Ok(())
            }
            _ => self.wait_for_2pl(table, r, lock2pl::Request::Write { holds_read }),
        }
    }

    /// Whether the protocol locks its write set at commit (OCC family; H-Store too, uncontended:
    /// its partition locks exclude every other writer, but the lock bit keeps Zen's insert and
    /// install paths uniform).
    pub(super) fn locks_at_commit(&self) -> bool {
        matches!(
            self.proto,
            Protocol::Occ
                | Protocol::Silo
                | Protocol::Tictoc
                | Protocol::Mvocc
                | Protocol::Si
                | Protocol::Hstore
        )
    }

    /// Takes the write lock of entry `r` at commit (spinning briefly), then SI's first-committer
    /// check. `Err(held)` when refused: `held` says whether the lock was taken (SI's check failed
    /// after locking), so the caller releases only a lock that is its own.
    pub(super) fn lock_at_commit(&mut self, table: TableId, r: u64) -> Result<(), bool> {
        let word = self.word(table, r);
        let mut got = None;
        for round in 0..SPIN_LIMIT {
            let w = word.load(Ordering::Acquire);
            if w & LOCK_BIT == 0 && word.cas(w, w | LOCK_BIT) {
                got = Some(w);
                break;
            }
            backoff(round);
        }
        let Some(old) = got else {
            return Err(false);
        };
        if self.proto == Protocol::Tictoc {
            self.cx.locked_rts.push(tictoc::rts(old));
        }
        if self.proto == Protocol::Si {
            // First committer wins (ArchTM §5.3): a version newer than the snapshot means a
            // concurrent transaction committed a write to this tuple first.
            let s = self.cx.snapshot.expect("SI transactions have a snapshot");
            if tid_timestamp(self.cts_of(table, r)) > s {
                return Err(true);
            }
        }
        Ok(())
    }

    /// Inserts commit above every delete committed before them (`TableRt::deleted_up_to`): an
    /// insert's only "read" is the key's absence, which no protocol records, yet recovery orders
    /// a re-inserted key's versions against its tombstone by Tx-CTS. TO and MVTO, whose tid is
    /// fixed at begin, abort instead when a delete with a larger tid came first. Called after
    /// the inserts are published and fenced, so a delete that removed the key is visible here.
    pub(super) fn order_after_deletes(&mut self) -> Result<(), TxError> {
        self.cx.insert_floor = 0;
        for w in self.writes.iter().filter(|w| w.kind == WriteKind::Insert) {
            let hw = self.tables[w.table as usize]
                .deleted_up_to
                .load(Ordering::SeqCst);
            self.cx.insert_floor = self.cx.insert_floor.max(hw);
        }
        match self.proto {
            Protocol::To | Protocol::Mvto if self.cx.insert_floor > self.cx.ts => {
                Err(TxError::Conflict)
            }
            _ => {
                self.max_seen = self.max_seen.max(self.cx.insert_floor);
                Ok(())
            }
        }
    }

    /// The commit tid, after the write set is locked (and, for the MV protocols, its old images
    /// retired as pending versions).
    pub(super) fn commit_tid(&mut self, last: u64) -> u64 {
        let thread = self.thread;
        match self.proto {
            Protocol::To | Protocol::Mvto => self.cx.ts,
            Protocol::Silo => {
                let ts = self.eng.cc.epoch.commit_ts(
                    self.eng.clock.now(),
                    tid_timestamp(last),
                    tid_timestamp(self.max_seen),
                );
                (ts << TID_THREAD_BITS) | thread as u64
            }
            Protocol::Tictoc => {
                // ct ≥ every read's wts, > every written entry's rts and wts, > the thread's
                // last tid (per-region Tx-CTS order must be commit order, Algorithm 2).
                let mut ct = (last + 1).max(self.cx.insert_floor + 1);
                for rd in &self.reads {
                    ct = ct.max(rd.token);
                }
                for &rts in &self.cx.locked_rts {
                    ct = ct.max(rts + 1);
                }
                for w in &self.writes {
                    if w.locked && matches!(w.kind, WriteKind::Update | WriteKind::Delete) {
                        ct = ct.max(self.cts_of(w.table, w.eref) + 1);
                    }
                }
                tictoc::tid_at_least(ct, thread)
            }
            Protocol::Mvocc | Protocol::Mv2pl | Protocol::Si => {
                let floor = (self.eng.clock.now())
                    .max(tid_timestamp(last) + 1)
                    .max(tid_timestamp(self.max_seen) + 1);
                let ts = self.eng.cc.snapshots.stamp(floor);
                (ts << TID_THREAD_BITS) | thread as u64
            }
            _ => self
                .eng
                .clock
                .next_tid(thread, last, tid_timestamp(self.max_seen)),
        }
    }

    /// Validates the read set at commit time `tid` (OCC family: versions unchanged; TicToc:
    /// versions unchanged and valid at `tid`, extending read timestamps).
    pub(super) fn validate_reads(&self, tid: u64) -> bool {
        match self.proto {
            Protocol::Occ | Protocol::Silo | Protocol::Mvocc => self.reads.iter().all(|rd| {
                if !is_cache_ref(rd.eref) {
                    return self.uncached_read_still_current(rd);
                }
                occ::validate_with(self.word(rd.table, rd.eref), rd.token, || {
                    self.write_locked_by_me(rd.table, rd.eref)
                })
            }),
            Protocol::Tictoc => self.reads.iter().all(|rd| {
                let mine = self.write_locked_by_me(rd.table, rd.eref);
                if rd.rts >= tid && !mine {
                    // Valid through tid already, unless overwritten since.
                    return self.cts_of(rd.table, rd.eref) == rd.token;
                }
                tictoc::validate_and_extend(
                    self.word(rd.table, rd.eref),
                    rd.token,
                    tid,
                    || self.cts_of(rd.table, rd.eref),
                    mine,
                )
            }),
            _ => true,
        }
    }

    /// Validation of an NVM-tuple read in place ([`ZenWorker::read_uncached`]): the key still
    /// leads to that version, either directly (the index still holds the NVM-tuple) or through
    /// a Met-Cache entry loaded from it since, unchanged and not locked by another transaction.
    /// A writer of the key always goes through an entry: `locate` or a blind overwrite's
    /// `claim_for_overwrite` puts a locked entry in the index before it installs anything, and
    /// a commit changes the entry's NVM-tuple and Tx-CTS.
    fn uncached_read_still_current(&self, rd: &ReadRec) -> bool {
        let (key, nvm) = (rd.rts, rd.eref);
        let t = &self.tables[rd.table as usize];
        match t.index.get(key) {
            Some(v) if v == nvm => self.pool.read_u64(nvm + tuple::WORD) == rd.token,
            Some(r) if is_cache_ref(r) => {
                let e = t.cache.entry(r);
                let unlocked = e.cc().load(Ordering::Acquire) & LOCK_BIT == 0
                    || self.write_locked_by_me(rd.table, r);
                unlocked
                    && e.nvm().load(Ordering::Acquire) == nvm
                    && e.cts().load(Ordering::Acquire) == tuple::cts(rd.token)
                    && e.is_current(key)
            }
            _ => false,
        }
    }

    /// Whether every read is still valid now (a miss explained by a stale read is a conflict).
    pub(super) fn reads_still_valid(&self) -> bool {
        match self.proto {
            Protocol::Occ | Protocol::Silo | Protocol::Mvocc => self.validate_reads(0),
            // A read whose entry another transaction holds locked is about to be overwritten:
            // stale too (that writer may already have installed a row the miss is about).
            Protocol::Tictoc => self.reads.iter().all(|rd| {
                self.cts_of(rd.table, rd.eref) == rd.token
                    && (self.word(rd.table, rd.eref).load(Ordering::SeqCst) & LOCK_BIT == 0
                        || self.write_locked_by_me(rd.table, rd.eref))
            }),
            // Lock-based and timestamp-ordering protocols never hold a stale read.
            _ => true,
        }
    }

    /// Snapshot (SI) and MVTO transactions: whether a miss on `key` of `table` (NotFound, or a
    /// DuplicateKey) may come from a commit after the transaction's snapshot or timestamp, which
    /// it did not see: the key's chain holds a version that ended after it (the key was
    /// inserted, updated or deleted since; such entries are kept while the transaction runs),
    /// its current entry is newer or being written, or a newer delete took a key out of the
    /// table. Such a miss is a conflict to retry (SI: first committer wins; MVTO: a younger
    /// writer came first), not an answer: TPC-C New-Order under SI read a district counter in
    /// its snapshot and failed with DuplicateKey on the order a concurrent New-Order had
    /// inserted since (issue 22, item 1).
    pub(super) fn miss_after_snapshot(&self, table: TableId, key: u64) -> bool {
        let Some(s) = self
            .cx
            .snapshot
            .filter(|_| matches!(self.proto, Protocol::Si | Protocol::Mvto))
        else {
            return false;
        };
        let Some(t) = self.tables.get(table as usize) else {
            return false;
        };
        let after = |tid: u64| tid == PENDING || tid_timestamp(tid) > s;
        if after(t.deleted_up_to.load(Ordering::SeqCst))
            || t.versions.newest(key).is_some_and(|(_, end)| after(end))
        {
            return true;
        }
        match t.index.get(key) {
            Some(r) if super::cache::is_cache_ref(r) => {
                let e = t.cache.entry(r);
                e.cc().load(Ordering::SeqCst) & LOCK_BIT != 0
                    || after(e.cts().load(Ordering::SeqCst))
            }
            _ => false,
        }
    }

    /// A scan at a snapshot (MV read-only transactions, SI, MVTO) walks the current index, from
    /// which a delete takes its key at commit: a row the snapshot holds but a later delete took
    /// out would be missed (point reads find it in the key's chain, a walk has no key to ask
    /// for). Rather than read past it, such a scan fails with `Conflict` (and is retried at a new
    /// snapshot) when `rt` saw a delete commit, or one is committing, after the snapshot. Called
    /// after the index walk: a delete whose removal the walk missed raised `deleted_up_to` first.
    pub(super) fn no_delete_since_snapshot(&self, rt: &super::TableRt) -> Result<(), TxError> {
        let Some(s) = self.cx.snapshot else {
            return Ok(());
        };
        let last = rt.deleted_up_to.load(Ordering::SeqCst);
        if last == PENDING || tid_timestamp(last) > s {
            return Err(TxError::Conflict);
        }
        Ok(())
    }

    /// Releases the write lock of entry `r`: commit with `tid`, or abort (`None`).
    pub(super) fn release_word(&self, table: TableId, r: u64, tid: Option<u64>) {
        release(self.proto, self.word(table, r), tid);
    }

    /// Releases a read lock (2PL).
    pub(super) fn release_read(&self, table: TableId, r: u64) {
        lock2pl::read_unlock(self.word(table, r));
    }

    /// MV protocols: retires the current image of every entry the transaction overwrites or
    /// deletes, and a dead marker for every insert, as pending chain entries, before the commit
    /// timestamp is taken.
    pub(super) fn retire_versions(&mut self) {
        if !self.proto.is_multi_version() {
            return;
        }
        let end = if self.proto == Protocol::Mvto {
            self.cx.ts
        } else {
            PENDING
        };
        let mut row = std::mem::take(&mut self.scratch);
        for i in 0..self.writes.len() {
            let (table, key, kind, eref) = self.writes[i].identity();
            let t = &self.tables[table as usize];
            let version = match kind {
                WriteKind::Update | WriteKind::Delete => {
                    let e = t.cache.entry(eref);
                    row.resize(t.row, 0);
                    e.copy_row(&mut row);
                    mvcc::Version {
                        begin: e.cts().load(Ordering::Acquire),
                        end,
                        live: true,
                        key,
                        row: row.clone().into_boxed_slice(),
                    }
                }
                // The key was absent until now: a dead version from the end of its last life.
                WriteKind::Insert => mvcc::Version {
                    begin: t.versions.newest(key).map_or(0, |(_, e)| e),
                    end,
                    live: false,
                    key,
                    row: Box::new([]),
                },
                WriteKind::Cancelled => continue,
            };
            self.writes[i].retired_begin = version.begin;
            t.versions.push(key, version);
            self.cx.retired = true;
        }
        self.scratch = row;
        self.cx.retired_end = end;
        fence(Ordering::SeqCst);
    }

    /// MV protocols: sets the end of the pending entries to the commit tid, once it is known.
    pub(super) fn settle_versions_pending(&mut self, tid: u64) {
        if !self.cx.retired {
            return;
        }
        for w in self
            .writes
            .iter()
            .filter(|w| w.kind != WriteKind::Cancelled)
        {
            self.tables[w.table as usize]
                .versions
                .settle(w.key, w.retired_begin, tid);
        }
        self.cx.retired_end = tid;
        fence(Ordering::SeqCst);
    }

    /// MV protocols, at the end of a commit that retired versions: queue them for pruning
    /// (`committed`) or drop them (the commit failed after retiring).
    pub(super) fn settle_versions(&mut self, committed: bool) {
        if !self.cx.retired {
            return;
        }
        self.cx.retired = false;
        let end = self.cx.retired_end;
        for w in self
            .writes
            .iter()
            .filter(|w| w.kind != WriteKind::Cancelled)
        {
            if committed {
                self.cx
                    .version_queue
                    .push_back((tid_timestamp(end), w.table, w.key));
            } else {
                self.tables[w.table as usize]
                    .versions
                    .discard(w.key, w.retired_begin, end);
            }
        }
    }

    /// MV protocols: prunes the chains this thread retired versions into, below the oldest
    /// snapshot (per-thread version queues ordered by end timestamp, as in Falcon §5.4).
    pub(super) fn reclaim_versions(&mut self) {
        let Some(&(first_end, _, _)) = self.cx.version_queue.front() else {
            return;
        };
        let eng = &self.eng;
        let oldest = mvcc::oldest_snapshot(&eng.cc.snapshots, eng.snap_active.iter().map(|a| &**a));
        if first_end > oldest {
            return;
        }
        while let Some(&(end, table, key)) = self.cx.version_queue.front() {
            if end > oldest {
                break;
            }
            self.cx.version_queue.pop_front();
            self.tables[table as usize].versions.prune(key, oldest);
        }
    }

    /// Whether this transaction holds the write lock of entry `r`.
    pub(super) fn write_locked_by_me(&self, table: TableId, r: u64) -> bool {
        self.writes
            .iter()
            .any(|w| w.table == table && w.eref == r && w.locked)
    }
}
