//! Falcon's commit (§5.2, Algorithm 1), one named step per function, in the order the paper
//! gives them: lock and validate (the protocol's part, txcc.rs), log (line 2), apply in place
//! (lines 3–4), publish `write_ts` and release (line 5), selective flush (lines 7–11).
//!
//! The variants that share this code (policy flags, `super::Policy`) add their own steps:
//! Outp's new versions (`supersede_updates`), WBL's fenced commit tids (`persist_new_version_tids`)
//! and group commit (`wbl.rs`); the baselines without a selective flush persist every applied
//! line before `write_ts` instead (`persist_applied`).

use super::layout::{slot, tuple};
use super::worker::{FalconWorker, RangeRec, WriteKind};
use super::{Fault, Policy, TableAlloc, ThreadState};
use crate::catalog::TableId;
use crate::cc::{MetaWord, Protocol, LOCK_BIT};
use crate::engine::TxError;
use crate::index::HintChain;
use crate::pmem::{Pool, CACHE_LINE};
use std::sync::atomic::Ordering;

/// The shortest update range applied with streaming stores ([`Pool::write_bytes_nt`]): below it
/// the partial lines at both ends (stored normally and flushed) cost more than the read-for-
/// ownership the streamed middle saves.
pub(super) const STREAM_MIN_BYTES: usize = 256;

/// Whether an applied range of `len` bytes is written with streaming stores: when it is long and
/// its lines would be flushed anyway, so that its cold destination lines are neither read first
/// (a blind 1 KB update otherwise fetches 16 lines only to overwrite them) nor left for a
/// `clflushopt`. That is every range when the policy flushes all applied lines and fences before
/// `write_ts` (ADR, Inp: durable at that same fence), and under eADR's selective flush a range
/// of a tuple to be flushed (`flushed`: not hot; Falcon §4.3 keeps hot tuples cached), with one
/// fence before `write_ts` instead of a `clflushopt` per line after it.
pub(super) fn streams(policy: Policy, len: usize, flushed: bool) -> bool {
    len >= STREAM_MIN_BYTES && (policy.persist_data || (policy.hinted_flush && flushed))
}

/// [`streams`] for range `r` of a commit whose selective flush covers the writes in `flush`.
fn range_streams(policy: Policy, flush: &[bool], r: &RangeRec) -> bool {
    streams(
        policy,
        r.len as usize,
        flush.get(r.write as usize) == Some(&true),
    )
}

/// Flushes the cache lines covering `spans` (absolute offset, length), merging each span with the
/// one before it when they share or touch a line. Callers push a tuple's spans together, header
/// first ([`FalconWorker::tuple_spans`]), so a header and a field in one line cost one write-back
/// without sorting the spans (sorting was 4 % of TPC-C's cycles under eADR: Delivery flushes
/// ~260 spans). A line shared by spans pushed apart is written back twice, never missed.
fn flush_merged(pool: &Pool, spans: &[(u64, u64)]) {
    let mut current: Option<(u64, u64)> = None;
    for &(start, len) in spans {
        let (lo, hi) = (
            start & !(CACHE_LINE - 1),
            (start + len).next_multiple_of(CACHE_LINE),
        );
        current = match current {
            Some((clo, chi)) if lo <= chi && clo <= hi => Some((clo.min(lo), chi.max(hi))),
            Some((clo, chi)) => {
                pool.flush(clo, chi - clo);
                Some((lo, hi))
            }
            None => Some((lo, hi)),
        };
    }
    if let Some((lo, hi)) = current {
        pool.flush(lo, hi - lo);
    }
}

/// A thread's allocation state of `table`, created if the table is new to it.
fn table_alloc(st: &mut ThreadState, table: TableId) -> &mut TableAlloc {
    if st.tables.len() <= table as usize {
        st.tables
            .resize_with(table as usize + 1, TableAlloc::default);
    }
    &mut st.tables[table as usize]
}

impl FalconWorker {
    /// Commits the running transaction (`EngineWorker::commit`): the steps below, in order. A
    /// step that fails rolls the transaction back and returns its error.
    pub(super) fn commit_steps(&mut self) -> Result<u64, TxError> {
        if !self.in_txn {
            return Ok(0);
        }
        let policy = self.eng.policy;
        // 1. Protocols that lock at commit (OCC, Silo, TicToc, MVOCC, SI): lock the write set in
        // address order (so no deadlock can form), spinning briefly on each lock.
        let locks_at_commit = matches!(
            self.proto,
            Protocol::Occ | Protocol::Silo | Protocol::Tictoc | Protocol::Mvocc | Protocol::Si
        );
        if locks_at_commit && !self.lock_at_commit() {
            self.rollback(0);
            return Err(TxError::Conflict);
        }
        // 2. Inserts become visible, locked.
        let published = self.publish_inserts()?;
        // The write set is locked; reads are validated next. Without a full fence between the
        // two, the lock stores may still be in a store buffer while the validation loads run:
        // two transactions that each read what the other writes both validate (write skew).
        // Found by the loom model in tests/cc_model.rs.
        std::sync::atomic::fence(Ordering::SeqCst);
        let has_writes = self.writes.iter().any(|w| w.kind != WriteKind::Cancelled);
        // 3. The commit tid, then read validation at it (OCC family, TicToc) and, under every
        // single-version protocol, phantom validation of the scans.
        let tid = self.take_commit_tid(has_writes);
        if !self.validate_reads(tid)
            || !self.validate_scans()
            || !self.inserts_follow_younger_scans()
        {
            self.rollback(published);
            return Err(TxError::Conflict);
        }
        if !has_writes {
            return Ok(self.finish_read_only());
        }
        // 4. The commit tid is final. Outp: the updates become new versions now that the write
        // set is locked and validated.
        if policy.out_of_place {
            if let Err(e) = self.supersede_updates() {
                self.rollback(published);
                return Err(e);
            }
        }
        self.st().last_tid = tid;
        // The secondary keys this commit replaces, read before the apply overwrites them; PM
        // secondary indexes log them (step 5) and get room for this commit's inserts now, as
        // their changes come after the commit mark and must not fail then.
        let secondary_changes = self.secondary_keys_replaced();
        if let Err(e) = self.reserve_pm_secondaries() {
            self.secondary_changes = secondary_changes;
            self.rollback(published);
            return Err(e);
        }
        if self.eng.config.fault == Some(Fault::SecondaryRemoveBeforeLog) {
            for &(table, si, key, old_key) in &secondary_changes {
                let sec = &self.tables[table as usize].secondary[si];
                if sec.is_pm() {
                    sec.remove(old_key, key);
                }
            }
        }
        // 5. Log window: entries and the COMMITTED mark (Algorithm 1, line 2).
        let logged = if policy.log {
            match self.log_commit(tid, &secondary_changes) {
                Ok(l) => Some(l),
                Err(e) => {
                    self.secondary_changes = secondary_changes;
                    self.rollback(published);
                    return Err(e);
                }
            }
        } else {
            None
        };
        if policy.wbl {
            self.persist_new_version_tids(tid);
        }
        // 6. Apply in place (lines 3–4) and, where the policy says, persist what was applied.
        let flush = self.writes_to_flush();
        let streamed_any = self.apply_ranges(&flush);
        self.write_keys_and_flags();
        self.persist_applied(streamed_any);
        // 7. The secondary indexes follow the applied rows while the write locks are still
        // held: a transaction that locks a row after the release must find its pairs moved, or
        // its own move of the same pair could run first and leave a stale or missing pair
        // (issue 17). PM secondaries: after the commit mark, as before; a crash in between is
        // repaired from the log (`SecondaryOld`, `recovery::repair_pm_secondaries`).
        self.maintain_secondaries(secondary_changes);
        // Headers, write_ts, lock release (line 5); primary-index maintenance.
        self.publish_versions(tid);
        #[cfg(test)]
        if let Some(mut hook) = self.after_release.take() {
            hook();
        }
        // 8. Selective data flush (lines 7–11).
        self.selective_flush(&flush);
        self.flush_write = flush;
        // Read locks go last (strict 2PL).
        if self.holds_read_locks() {
            for i in 0..self.reads.len() {
                crate::cc::lock2pl::read_unlock(&self.word(self.reads[i].0));
            }
        }
        if let Some((at, true)) = logged {
            self.close_spilled_redo(at);
        }
        if policy.wbl {
            self.wbl_finish(tid);
        }
        self.eng.last_commit.note(self.thread, tid);
        self.settle_versions(true);
        self.end_txn();
        self.reclaim_versions();
        match self.late_error.take() {
            None => Ok(tid),
            Some(e) => Err(TxError::PmFull(format!(
                "transaction {tid:#x} committed, but a persistent secondary index could not \
                 take its pair ({e}); the next recovery repairs it while the commit is in the \
                 log window"
            ))),
        }
    }

    /// Gives every PM secondary index this commit inserts into room for its inserts
    /// ([`PmSecondaryIndex::reserve`](crate::index::pm::PmSecondaryIndex::reserve)).
    fn reserve_pm_secondaries(&self) -> Result<(), TxError> {
        for w in &self.writes {
            let rt = &self.tables[w.table as usize];
            if w.kind == WriteKind::Cancelled || !rt.secondary.iter().any(|s| s.is_pm()) {
                continue;
            }
            for sec in &rt.secondary {
                sec.reserve(&rt.schema.name)?;
            }
        }
        Ok(())
    }

    /// A secondary-index insert after the commit mark that failed (PM full beyond the
    /// reservation): kept for `commit` to report; the pair's entry in the log lets recovery
    /// add it.
    fn note_late(&mut self, result: Result<(), TxError>) {
        if let Err(e) = result {
            self.late_error.get_or_insert(e);
        }
    }

    /// Step 2: publishes the inserted keys in their indexes with the new tuples locked, so that
    /// readers wait until they are applied. Returns how many it published; on failure rolls the
    /// transaction back.
    fn publish_inserts(&mut self) -> Result<usize, TxError> {
        let mut published = 0;
        // The duplicate checks' leaves (`insert_hints`, in write order): each insert starts at
        // its leaf instead of descending again while the leaf is unchanged (`HintChain`).
        let mut next_hint = 0;
        let mut chain = HintChain::default();
        for i in 0..self.writes.len() {
            if self.writes[i].kind != WriteKind::Insert {
                continue;
            }
            let (table, key, t) = (
                self.writes[i].table,
                self.writes[i].key,
                self.writes[i].tuple,
            );
            while self
                .insert_hints
                .get(next_hint)
                .is_some_and(|&(w, _)| w < i)
            {
                next_hint += 1;
            }
            let hint = match self.insert_hints.get(next_hint) {
                Some(&(w, hint)) if w == i => {
                    next_hint += 1;
                    Some(hint)
                }
                _ => None,
            };
            self.word(t).store(LOCK_BIT);
            self.mark_write_locked(i);
            let rt = &self.tables[table as usize];
            match rt
                .index
                .insert_new_at(&rt.schema.name, key, t, hint, &mut chain)
            {
                Ok(Ok(_)) => published += 1,
                // The key was absent when `insert` checked; a transaction that committed since
                // has inserted it. That invalidates this transaction's observation of absence,
                // so it is a conflict (retryable), not a duplicate the caller made: on retry the
                // transaction sees the new row and decides again (TPC-C New-Order re-reads the
                // district's next order id and inserts a fresh key).
                Ok(Err(_)) => {
                    self.rollback(published);
                    return Err(TxError::Conflict);
                }
                // A PM index could not grow: nothing was inserted for this key.
                Err(full) => {
                    self.rollback(published);
                    return Err(full);
                }
            }
        }
        Ok(published)
    }

    /// Step 3: the commit tid; 0 for a read-only transaction that needs none. The MV protocols
    /// take it after retiring the old images, so a snapshot reader that finds no retired image
    /// knows the tid is above its snapshot.
    fn take_commit_tid(&mut self, has_writes: bool) -> u64 {
        if !has_writes && self.proto != Protocol::Tictoc {
            return 0;
        }
        if has_writes {
            self.retire_versions();
        }
        // WBL: the group commit's c_p may not pass this commit from before its tid is taken
        // until its data is durable (`wbl.rs`).
        if let Some(group) = self.eng.group.as_ref().filter(|_| has_writes) {
            group.enter(self.thread);
        }
        let tid = self.commit_tid();
        if let Some(group) = self.eng.group.as_ref().filter(|_| has_writes) {
            group.set_tid(self.thread, tid);
        }
        self.eng.ensure_lease(tid);
        if has_writes {
            self.settle_versions_pending(tid);
        }
        tid
    }

    /// A validated transaction that wrote nothing ends here; returns the thread's last commit tid.
    fn finish_read_only(&mut self) -> u64 {
        self.rollback(0);
        // WBL: what this transaction read must be durable before it returns (the writers
        // released their locks before the group commit covered them).
        if let Some(group) = &self.eng.group {
            group.wait(&self.pool, self.max_seen, || self.eng.clock.now());
        }
        self.st().last_tid
    }

    /// The secondary keys that change, read from the rows before the apply: (table, index,
    /// primary key, old secondary key) for every update or delete that touches an indexed
    /// column (the old row is read only for those).
    fn secondary_keys_replaced(&mut self) -> Vec<(TableId, usize, u64, u64)> {
        let mut changes = std::mem::take(&mut self.secondary_changes);
        changes.clear();
        let mut old = std::mem::take(&mut self.row_buf);
        for (i, w) in self.writes.iter().enumerate() {
            let rt = &self.tables[w.table as usize];
            if rt.secondary.is_empty()
                || w.kind == WriteKind::Cancelled
                || w.kind == WriteKind::Insert
            {
                continue;
            }
            let mut old_read = false;
            for si in 0..rt.secondary.len() {
                let touched = w.kind == WriteKind::Delete
                    || self
                        .ranges
                        .iter()
                        .filter(|r| r.write as usize == i)
                        .any(|r| {
                            rt.schema.secondary[si].columns.iter().any(|&c| {
                                let (co, cl) =
                                    (rt.schema.column_offset(c), rt.schema.columns[c].ty.size());
                                (r.offset as usize) < co + cl && co < (r.offset + r.len) as usize
                            })
                        });
                if touched {
                    if !old_read {
                        old.resize(rt.row, 0);
                        // Outp: the old row is in the superseded version.
                        let source = match self.superseded.get(i) {
                            Some(&o) if o != 0 => o,
                            _ => w.tuple,
                        };
                        self.pool.read_bytes(source + tuple::HEADER, &mut old);
                        old_read = true;
                    }
                    changes.push((w.table, si, w.key, rt.secondary_key(si, &old)));
                }
            }
        }
        self.row_buf = old;
        changes
    }

    /// WBL: the new versions' commit tids are durable before their data, so that no image shows
    /// a reused slot's new key or data under the older, committed tid it held before.
    fn persist_new_version_tids(&mut self, tid: u64) {
        let mut spans = std::mem::take(&mut self.spans);
        spans.clear();
        for (i, w) in self.writes.iter().enumerate() {
            let moved = self.superseded.get(i).is_some_and(|&o| o != 0);
            if w.kind == WriteKind::Insert || moved {
                self.pool.write_u64(w.tuple + tuple::WRITE_TS, tid);
                spans.push((w.tuple + tuple::WRITE_TS, 8));
            }
        }
        flush_merged(&self.pool, &spans);
        self.spans = spans;
        if self.eng.config.fault != Some(Fault::WblSkipTidFence) {
            self.pool.fence();
        }
    }

    /// Per write, whether the selective flush (Algorithm 1, lines 7–11) covers it: a tuple not in
    /// the hot set is flushed and becomes hot. Decided before the apply, so that the long ranges
    /// of flushed tuples can be streamed instead.
    fn writes_to_flush(&mut self) -> Vec<bool> {
        let policy = self.eng.policy;
        let mut flush = std::mem::take(&mut self.flush_write);
        flush.clear();
        if policy.hinted_flush {
            for w in &self.writes {
                let hot = policy.track_hot && self.hot.check_and_touch(w.tuple);
                flush.push(w.kind != WriteKind::Cancelled && !hot);
            }
        }
        flush
    }

    /// Step 6: applies the after-images in place (Algorithm 1, lines 3–4; Outp and WBL: into the
    /// new versions). Long ranges go with streaming stores where their lines would be flushed
    /// anyway (`streams`): durable at a fence like the flushed ones, without first reading the
    /// cold lines they overwrite. Returns whether any range was streamed.
    fn apply_ranges(&self, flush: &[bool]) -> bool {
        let policy = self.eng.policy;
        let mut streamed_any = false;
        for r in &self.ranges {
            let w = &self.writes[r.write as usize];
            if w.kind == WriteKind::Cancelled {
                continue;
            }
            let d = r.data as usize;
            let (at, bytes) = (
                w.tuple + tuple::HEADER + u64::from(r.offset),
                &self.data[d..d + r.len as usize],
            );
            if range_streams(policy, flush, r) {
                self.pool.write_bytes_nt(at, bytes);
                streamed_any = true;
            } else {
                self.pool.write_bytes(at, bytes);
            }
        }
        streamed_any
    }

    /// The KEY and FLAGS of inserted and deleted tuples go with the data, before its fence: a
    /// slot is 16-byte aligned, so its header may straddle two cache lines, and under ADR a
    /// durable `write_ts` (written in step 7) must imply durable flags, or recovery's replay
    /// filter skips an insert whose LIVE flag was lost (found by the crash harness, issue 4).
    fn write_keys_and_flags(&self) {
        let policy = self.eng.policy;
        let keep_old_live = self.eng.config.fault == Some(Fault::OutpKeepOldLive);
        for (i, w) in self.writes.iter().enumerate() {
            let old = self.superseded.get(i).copied().unwrap_or(0);
            match w.kind {
                // WBL: the old version stays the row's value for recovery until the group
                // commit covers this one (`wbl.rs`); transactions no longer see it.
                WriteKind::Update | WriteKind::Delete if old != 0 && policy.wbl => {
                    let state = if w.kind == WriteKind::Delete {
                        super::wbl::TOMBSTONE
                    } else {
                        tuple::LIVE
                    };
                    self.pool.write_u64(w.tuple + tuple::KEY, w.key);
                    self.pool.write_u64(w.tuple + tuple::FLAGS, state);
                    self.pool
                        .write_u64(old + tuple::FLAGS, super::wbl::SUPERSEDED);
                }
                // Outp: the new version is an insert, the old one a delete.
                WriteKind::Update if old != 0 => {
                    self.pool.write_u64(w.tuple + tuple::KEY, w.key);
                    self.pool.write_u64(w.tuple + tuple::FLAGS, tuple::LIVE);
                    if !keep_old_live {
                        self.pool
                            .write_u64(old + tuple::FLAGS, tuple::LIVE | tuple::DELETED);
                    }
                }
                WriteKind::Insert => {
                    self.pool.write_u64(w.tuple + tuple::KEY, w.key);
                    self.pool.write_u64(w.tuple + tuple::FLAGS, tuple::LIVE);
                }
                WriteKind::Delete => self
                    .pool
                    .write_u64(w.tuple + tuple::FLAGS, tuple::LIVE | tuple::DELETED),
                WriteKind::Update | WriteKind::Cancelled => {}
            }
        }
    }

    /// The policies that persist every applied line (ADR, Inp, Outp, WBL) flush them and fence
    /// before `write_ts`; under eADR only streamed stores need that fence (they are ordered and
    /// durable only at one, and `write_ts` must persist after them: step 7's ordering point).
    fn persist_applied(&mut self, streamed_any: bool) {
        let policy = self.eng.policy;
        let fault = self.eng.config.fault;
        if policy.persist_data {
            let spans = self.tuple_spans(
                |worker, i, spans| {
                    let w = &worker.writes[i];
                    let old = worker.superseded.get(i).copied().unwrap_or(0);
                    if matches!(w.kind, WriteKind::Insert | WriteKind::Delete) || old != 0 {
                        spans.push((w.tuple + tuple::KEY, 16));
                    }
                    if old != 0 {
                        spans.push((old + tuple::KEY, 16));
                    }
                },
                |worker, r| {
                    worker.writes[r.write as usize].kind != WriteKind::Cancelled
                        && !streams(policy, r.len as usize, true)
                },
            );
            if fault != Some(Fault::SkipDataFlush) {
                flush_merged(&self.pool, &spans);
            }
            self.spans = spans;
            if fault != Some(Fault::SkipDataFence) {
                self.pool.fence();
            }
        } else if streamed_any && fault != Some(Fault::SkipDataFence) {
            self.pool.fence();
        }
    }

    /// Step 7: each new version's `write_ts`, the release of its lock, and the primary-index
    /// changes of deletes and Outp's moved versions.
    fn publish_versions(&mut self, tid: u64) {
        let policy = self.eng.policy;
        // Only deletes and Outp's moved versions need it: read the clock for those alone.
        let mut reuse = None;
        for i in 0..self.writes.len() {
            let (table, key, t, kind) = (
                self.writes[i].table,
                self.writes[i].key,
                self.writes[i].tuple,
                self.writes[i].kind,
            );
            if kind == WriteKind::Cancelled {
                continue;
            }
            // eADR ordering point: recovery skips replaying an entry whose tid is <= write_ts,
            // so write_ts must persist after the data, KEY and FLAGS applied above (ADR: after
            // their flush + fence).
            self.pool.write_u64_ordered(t + tuple::WRITE_TS, tid);
            self.release_word(t, Some(tid));
            if policy.persist_data {
                self.pool.flush(t, tuple::HEADER);
            }
            let rt = &self.tables[table as usize];
            let superseded = self.superseded.get(i).copied().unwrap_or(0);
            if superseded != 0 {
                // Outp: readers of the old version that find it dead follow the index to the
                // new one, so the index moves before the old version is released (deleted).
                // Outp's indexes are DRAM ones (`check_placement`), whose upsert cannot fail.
                if kind == WriteKind::Delete {
                    rt.index.remove_if(key, superseded);
                } else {
                    rt.index
                        .upsert(&rt.schema.name, key, t)
                        .expect("a DRAM index upsert does not fail");
                }
                // WBL keeps the old version's commit tid: recovery compares versions by it.
                if !policy.wbl {
                    self.pool
                        .write_u64_ordered(superseded + tuple::WRITE_TS, tid);
                }
                self.release_word(superseded, Some(tid));
                if policy.persist_data {
                    self.pool.flush(superseded, tuple::HEADER);
                }
                let reuse = *reuse.get_or_insert_with(|| self.reuse_stamp(tid));
                table_alloc(self.state.as_mut().expect("state present"), table)
                    .deleted
                    .push_back((superseded, reuse));
            }
            if kind == WriteKind::Delete {
                rt.deleted_up_to.fetch_max(tid, Ordering::SeqCst);
                rt.index.remove_if(key, t);
                let reuse = *reuse.get_or_insert_with(|| self.reuse_stamp(tid));
                table_alloc(self.state.as_mut().expect("state present"), table)
                    .deleted
                    .push_back((t, reuse));
            }
        }
    }

    /// Step 7, before the lock release: the secondary pairs of inserted rows, and those of
    /// updated or deleted rows moved from their old keys (`changes`, read before the apply) to
    /// the new ones (deleted rows: removed).
    fn maintain_secondaries(&mut self, changes: Vec<(TableId, usize, u64, u64)>) {
        let mut row = std::mem::take(&mut self.row_buf);
        for i in 0..self.writes.len() {
            let w = &self.writes[i];
            let rt = &self.tables[w.table as usize];
            if w.kind != WriteKind::Insert || rt.secondary.is_empty() {
                continue;
            }
            let (key, t) = (w.key, w.tuple);
            row.resize(rt.row, 0);
            self.pool.read_bytes(t + tuple::HEADER, &mut row);
            for si in 0..rt.secondary.len() {
                let rt = &self.tables[self.writes[i].table as usize];
                let result =
                    rt.secondary[si].insert(&rt.schema.name, rt.secondary_key(si, &row), key);
                self.note_late(result);
            }
        }
        for &(table, si, key, old_key) in &changes {
            let rt = &self.tables[table as usize];
            rt.secondary[si].remove(old_key, key);
            if let Some(i) = self.find_write(table, key) {
                if self.writes[i].kind == WriteKind::Update {
                    row.resize(rt.row, 0);
                    self.pool
                        .read_bytes(self.writes[i].tuple + tuple::HEADER, &mut row);
                    let result =
                        rt.secondary[si].insert(&rt.schema.name, rt.secondary_key(si, &row), key);
                    self.note_late(result);
                }
            }
        }
        self.secondary_changes = changes;
        self.row_buf = row;
    }

    /// Step 8, Algorithm 1 lines 7–11: sfence, then clwb the header and updated lines of the
    /// tuples that are not hot. The clwbs complete at a later fence; eADR needs none for
    /// correctness, so the sfence, which only orders them, is skipped when every tuple is hot.
    /// Streamed ranges are already on their way.
    fn selective_flush(&mut self, flush: &[bool]) {
        let policy = self.eng.policy;
        if !policy.hinted_flush || !flush.contains(&true) {
            return;
        }
        let spans = self.tuple_spans(
            |worker, i, spans| {
                if flush[i] {
                    spans.push((worker.writes[i].tuple, tuple::HEADER));
                }
            },
            |_, r| flush[r.write as usize] && !range_streams(policy, flush, r),
        );
        self.pool.fence();
        flush_merged(&self.pool, &spans);
        self.spans = spans;
    }

    /// The spans to flush, a tuple's together: for each write, what `header` pushes for it, then
    /// the applied ranges of it that `range` selects. One pass over the ranges (a per-write scan
    /// would be quadratic in large transactions: TPC-C Delivery has ~130 writes); ranges are
    /// recorded in program order, so a write's ranges usually follow one another.
    fn tuple_spans(
        &mut self,
        header: impl Fn(&Self, usize, &mut Vec<(u64, u64)>),
        range: impl Fn(&Self, &RangeRec) -> bool,
    ) -> Vec<(u64, u64)> {
        let mut spans = std::mem::take(&mut self.spans);
        let mut seen = std::mem::take(&mut self.span_seen);
        spans.clear();
        seen.clear();
        seen.resize(self.writes.len(), false);
        for r in &self.ranges {
            let w = r.write as usize;
            if !seen[w] {
                seen[w] = true;
                header(self, w, &mut spans);
            }
            if range(self, r) {
                let t = self.writes[w].tuple;
                spans.push((t + tuple::HEADER + u64::from(r.offset), u64::from(r.len)));
            }
        }
        for (w, &done) in seen.iter().enumerate() {
            if !done {
                header(self, w, &mut spans);
            }
        }
        self.span_seen = seen;
        spans
    }

    /// A spilled redo is closed at once, so the spill chain can be reused by the next one.
    fn close_spilled_redo(&mut self, at: u64) {
        if self.eng.policy.persist_data {
            self.pool.fence();
        }
        // Ordered: under eADR the slot must stay COMMITTED until the apply and write_ts stores
        // above have persisted.
        self.pool.write_u64_ordered(at + slot::STATE, slot::FREE);
        self.pool.persist(at, 8);
    }
}

#[cfg(test)]
mod tests {
    use super::super::worker::FalconWorker;
    use super::super::{FalconConfig, FalconEngine};
    use crate::catalog::{ColumnType, Schema, TableId};
    use crate::cc::Protocol;
    use crate::engine::{Engine, EngineKind, EngineWorker, FieldWrite};
    use crate::index::IndexPlacement;
    use crate::pmem::{PersistenceDomain, Pool, PoolOptions};
    use std::sync::Arc;

    /// An engine with table `t(city)` indexed by city, rows 0..4 with city `k % 2`, and two
    /// idle workers.
    fn setup(
        placement: IndexPlacement,
        protocol: Protocol,
    ) -> (Arc<FalconEngine>, TableId, FalconWorker, FalconWorker) {
        let opts = PoolOptions::new(EngineKind::Falcon.layout(), PersistenceDomain::Adr);
        let pool = Arc::new(Pool::create_in_memory(32 << 20, &opts).unwrap());
        let mut config = FalconConfig::new(EngineKind::Falcon, protocol);
        config.max_threads = 2;
        config.index_placement = placement;
        let eng = FalconEngine::create(pool, config).unwrap();
        let schema = Schema::new("t", &[("city", ColumnType::U64)]).with_secondary("c", &["city"]);
        let t = eng.create_table(schema).unwrap();
        let mut a = FalconWorker::new(eng.clone(), 0).unwrap();
        a.begin(false);
        for k in 0..4u64 {
            a.insert(t, k, &(k % 2).to_le_bytes()).unwrap();
        }
        a.commit().unwrap();
        let b = FalconWorker::new(eng.clone(), 1).unwrap();
        (eng, t, a, b)
    }

    fn set_city(w: &mut FalconWorker, t: TableId, key: u64, city: u64) {
        let bytes = city.to_le_bytes();
        w.update(
            t,
            key,
            &[FieldWrite {
                offset: 0,
                bytes: &bytes,
            }],
        )
        .unwrap();
    }

    /// Issue 17, item 1: a second transaction that takes a row's lock the moment the first
    /// commit releases it (the hook runs it there) and changes the indexed column again, or
    /// re-inserts a deleted row with the same secondary key, finds the first commit's
    /// secondary changes done: no stale pair, no missing one. Before the fix the first commit
    /// moved its pairs after the release, and this failed with DRAM and PM indexes.
    #[test]
    fn secondary_changes_precede_the_lock_release() {
        for placement in [IndexPlacement::Dram, IndexPlacement::Pm] {
            for protocol in [Protocol::Occ, Protocol::NoWait] {
                let (eng, t, mut a, mut b) = setup(placement, protocol);
                a.begin(false);
                // Row 1 moves from city 1 to 7; row 2 (city 0) is deleted.
                set_city(&mut a, t, 1, 7);
                a.delete(t, 2).unwrap();
                a.after_release = Some(Box::new(move || {
                    b.begin(false);
                    set_city(&mut b, t, 1, 8);
                    b.insert(t, 2, &0u64.to_le_bytes()).unwrap();
                    b.commit().expect("the rows are unlocked once released");
                }));
                a.commit().unwrap();
                drop(a);
                let what = format!("{placement:?} {protocol:?}");
                assert_eq!(
                    Engine::check_structure(&*eng).map_err(|e| format!("{what}: {e}")),
                    Ok(vec![4])
                );
                let rt = eng.tables.read()[t as usize].clone();
                let key = |city: u64| rt.secondary_key(0, &city.to_le_bytes());
                assert!(rt.secondary[0].contains(key(8), 1), "{what}");
                assert!(!rt.secondary[0].contains(key(7), 1), "{what}");
                assert!(rt.secondary[0].contains(key(0), 2), "{what}");
            }
        }
    }
}
