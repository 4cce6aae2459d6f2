//! How a Zen worker commits (§3.3.1): the steps of `commit_steps`, each a function, in the
//! paper's order. Perform happened in the Met-Cache as the transaction ran; at commit the write
//! set is locked and validated, the new versions get NVM-tuple slots in this thread's region,
//! Persist writes them with Algorithm 1, and the versions are installed in the Met-Cache and the
//! index before the locks are released. Maintenance (garbage collection, §3.4) runs just before
//! Persist so that Algorithm 1's fence also orders its zeroing stores.

use super::layout::tuple;
use super::txcc::release;
use super::worker::{WriteKind, WriteRec, ZenWorker, MAX_LOCK_ENTRIES};
use super::{Garbage, TableRt, ZenFault, REBALANCE_EVERY};
use crate::catalog::TableId;
use crate::cc::{tid_timestamp, Protocol};
use crate::engine::TxError;
use std::sync::atomic::{fence, Ordering};

/// What installing one new version leaves for the worker to track.
#[derive(Default)]
struct Installed {
    /// The superseded NVM-tuple, to reclaim once no transaction can read it (§3.4).
    superseded: Option<Garbage>,
    /// A delete's tombstone, reclaimed like garbage.
    tomb: Option<Garbage>,
    /// An entry this transaction filled (a copy into its own region) and pins until it ends.
    pinned: Option<(TableId, u64)>,
    /// An entry used only as the write lock of a blind overwrite, now superseded: free for the
    /// worker's next claim (`ZenWorker::lock_entries`).
    lock_only: Option<(TableId, u64)>,
}

impl ZenWorker {
    /// Commits the running transaction (`EngineWorker::commit`). A step that fails rolls the
    /// transaction back and returns its error.
    pub(super) fn commit_steps(&mut self) -> Result<u64, TxError> {
        if !self.in_txn {
            return Ok(0);
        }
        // The write-set positions, in persist order: a buffer kept across commits.
        let mut order = std::mem::take(&mut self.commit_order);
        let result = self.commit_in_order(&mut order);
        self.commit_order = order;
        result
    }

    fn commit_in_order(&mut self, order: &mut Vec<usize>) -> Result<u64, TxError> {
        if let Err(e) = self.check_exclusive() {
            return self.fail(e);
        }
        // 1. Protocols that lock at commit (OCC family, H-Store): lock the write set.
        if let Err(e) = self.lock_write_set() {
            return self.fail(e);
        }
        // 2. Claim this region's entries for new versions: inserts (published to the index,
        // locked, so readers wait until they are durable) and copies of other regions' entries
        // (§3.2: a thread writes only in its own region).
        if let Err(e) = self.claim_new_versions() {
            return self.fail(e);
        }
        // The write set is locked; reads are validated next. Without a full fence between the
        // two, the lock stores may still be in a store buffer while the validation loads run
        // (write skew; found by the loom model of tests/cc_model.rs for Falcon).
        fence(Ordering::SeqCst);
        order.clear();
        order.extend(
            (0..self.writes.len()).filter(|&i| self.writes[i].kind != WriteKind::Cancelled),
        );
        // 3. The commit tid, then validation at it.
        let tid = match self.take_commit_tid(!order.is_empty()) {
            Ok(tid) => tid,
            Err(e) => return self.fail(e),
        };
        if !self.validate_reads(tid)
            || !self.validate_scans()
            || !self.inserts_follow_younger_scans()
        {
            return self.fail(TxError::Conflict);
        }
        if order.is_empty() {
            self.rollback();
            return Ok(self.st().last_tid);
        }
        // 4. NVM-tuple slots, all before any write, so a failure leaves nothing behind.
        if let Err(e) = self.allocate_slots(order) {
            return self.fail(e);
        }
        // 5. The commit tid is final; the new rows.
        self.st().last_tid = tid;
        self.build_new_rows(order);
        // 6. Maintenance before Persist, so Algorithm 1's fence also orders the zeroing stores.
        let watermark = self.collect_garbage();
        // 7. Persist (Algorithm 1).
        self.persist(tid, order);
        // This commit's own superseded versions (tid) are not zeroed yet either.
        self.eng.gc_done[self.thread].store(watermark.min(tid), Ordering::Release);
        self.eng.region_commit[self.thread].store(tid, Ordering::Release);
        // 8. Install the new versions in the Met-Cache and the index, releasing their locks;
        // then the secondary indexes and the locks no version release covered.
        fence(Ordering::Release);
        self.install_versions(tid, order);
        self.apply_secondary_changes();
        self.release_remaining_locks();
        self.settle_versions(true);
        self.eng.last_commit.note(self.thread, tid);
        self.end_txn();
        self.count_commit();
        self.reclaim_versions();
        if self.took_page {
            self.adopt_idle_region();
        }
        Ok(tid)
    }

    /// The commit tid (0 for a read-only transaction, except under TicToc, which validates its
    /// reads at one). Under the multi-version protocols the old images are retired first, so a
    /// snapshot reader that finds no retired image knows the tid is above its snapshot.
    fn take_commit_tid(&mut self, writes: bool) -> Result<u64, TxError> {
        self.order_after_deletes()?;
        if !writes && self.proto != Protocol::Tictoc {
            return Ok(0);
        }
        let last = self.st().last_tid;
        if writes {
            self.retire_versions();
        }
        let tid = self.commit_tid(last);
        self.settle_versions_pending(tid);
        Ok(tid)
    }

    /// Step 4: an NVM-tuple slot for each new version in `order`. On a full pool, reclaimable
    /// garbage (versions superseded by deletes and updates) is collected first, so deleted room
    /// is reused at once; if a slot still cannot be had, the slots taken are given back.
    fn allocate_slots(&mut self, order: &[usize]) -> Result<(), TxError> {
        for (n, &i) in order.iter().enumerate() {
            let (table, for_delete) = (
                self.writes[i].table,
                self.writes[i].kind == WriteKind::Delete,
            );
            let mut slot = self.alloc_slot(table, for_delete);
            if matches!(slot, Err(TxError::PmFull(_))) {
                self.collect_garbage();
                slot = self.alloc_slot(table, for_delete);
            }
            match slot {
                Ok(s) => self.writes[i].slot = s,
                Err(e) => {
                    for &j in &order[..n] {
                        let (table, s) = (self.writes[j].table, self.writes[j].slot);
                        Self::alloc_state(self.st(), table).free.push(s);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Step 5: each new version's row in `rows` (the entry is locked, so its row is the latest),
    /// and the secondary-key changes it makes.
    fn build_new_rows(&mut self, order: &[usize]) {
        let mut old = std::mem::take(&mut self.scratch);
        for &i in order {
            let (table, key, kind, eref) = self.writes[i].identity();
            let t = &self.tables[table as usize];
            let indexed = !t.secondary.is_empty();
            if indexed && kind != WriteKind::Insert {
                old.resize(t.row, 0);
                t.cache.entry(eref).copy_row(&mut old);
            }
            // A row written whole by one write is used where it lies: copying 1 KB rows
            // again (and zeroing the room first) was a measurable part of a 16-op YCSB commit.
            let sole = (kind != WriteKind::Delete)
                .then(|| Self::sole_whole_range(&self.ranges, i, t.row))
                .flatten();
            if let Some(at) = sole {
                (self.writes[i].row_at, self.writes[i].row_in_data) = (at, true);
            } else {
                let at = self.rows.len();
                (self.writes[i].row_at, self.writes[i].row_in_data) = (at, false);
                self.rows.resize(at + t.row, 0);
                if kind != WriteKind::Delete {
                    if kind == WriteKind::Update && !self.writes[i].whole_row {
                        t.cache.entry(eref).copy_row(&mut self.rows[at..at + t.row]);
                    }
                    Self::overlay(&self.ranges, &self.data, i, &mut self.rows[at..at + t.row]);
                }
            }
            for si in 0..t.secondary.len() {
                // Only tables with secondary indexes copied the old row.
                let before = (kind != WriteKind::Insert).then(|| t.secondary_key(si, &old));
                let after = (kind != WriteKind::Delete)
                    .then(|| t.secondary_key(si, self.new_row(&self.writes[i], t.row)));
                if before != after {
                    self.secondary.push((table, si, key, before, after));
                }
            }
        }
        self.scratch = old;
    }

    /// Step 7: writes the new versions out of place and makes them durable with the LP bit of
    /// the last one as the commit mark (Algorithm 1).
    ///
    /// Departure (equivalent ordering): Algorithm 1 stores each tuple and `clwb`s its lines; here
    /// the lines it flushes before its `sfence` (every line of every tuple but the header line of
    /// the last one) are written with non-temporal stores ([`crate::pmem::Pool::write_bytes_nt`])
    /// and not flushed. A streaming store reaches the persistence domain at the next `sfence`
    /// exactly like a store + `clwb`, so the one `sfence` of line 10 still orders all of them
    /// before the LP store, which stays an ordinary store + `clwb` of the header line (lines
    /// 11–12). New versions go to cold slots and are not read back by this thread, so streaming
    /// them skips the read-for-ownership of every line. The `sfence` also orders the streaming
    /// stores before the lock releases that publish the versions to other threads.
    fn persist(&mut self, tid: u64, order: &[usize]) {
        let pool = &self.pool;
        let fault = self.eng.config.fault;
        let flush_tuples = fault != Some(ZenFault::SkipTupleFlush);
        let last = order.len() - 1;
        let mut last_word = 0;
        for (n, &i) in order.iter().enumerate() {
            let w = &self.writes[i];
            let t = &self.tables[w.table as usize];
            let mut word = tid & tuple::CTS_MASK;
            let row: &[u8] = if w.kind == WriteKind::Delete {
                word |= tuple::DELETED;
                &[]
            } else {
                self.new_row(w, t.row)
            };
            if !flush_tuples {
                // The fault: Algorithm 1 without its flushes (ordinary stores, no clwb).
                if !row.is_empty() {
                    pool.write_bytes(w.slot + tuple::HEADER, row);
                }
                pool.write_u64(w.slot + tuple::KEY, w.key);
                if n < last {
                    pool.write_u64(w.slot + tuple::WORD, word);
                } else {
                    last_word = word | tuple::LP;
                }
                continue;
            }
            if n < last {
                // Lines 2–5: the whole tuple, header (LP = 0) and row, streamed.
                let mut header = [0u8; tuple::HEADER as usize];
                header[..8].copy_from_slice(&word.to_ne_bytes());
                header[8..].copy_from_slice(&w.key.to_ne_bytes());
                pool.write_bytes_nt(w.slot, &header);
                pool.write_bytes_nt(w.slot + tuple::HEADER, row);
            } else {
                last_word = word | tuple::LP;
                // Lines 7–9: every line of the last tuple but the one holding its header is
                // streamed; the header line (tuple id, the row's first bytes) gets ordinary
                // stores, flushed with the LP store after the fence.
                let after_header = (w.slot | 63) + 1;
                let in_header_line =
                    ((after_header - w.slot - tuple::HEADER) as usize).min(row.len());
                if in_header_line > 0 {
                    pool.write_bytes(w.slot + tuple::HEADER, &row[..in_header_line]);
                }
                pool.write_bytes_nt(
                    w.slot + tuple::HEADER + in_header_line as u64,
                    &row[in_header_line..],
                );
                pool.write_u64(w.slot + tuple::KEY, w.key);
            }
        }
        if fault != Some(ZenFault::SkipFence) {
            pool.fence(); // line 10: one sfence for all the streaming stores
        }
        let last_slot = self.writes[order[last]].slot;
        // Line 11: LP = 1. An ordered store: under eADR program order is persistence order, so
        // the compiler must not move it above the last tuple's ordinary stores (its header line)
        // made before the fence; the streaming stores are ordered by the fence itself.
        pool.write_u64_ordered(last_slot + tuple::WORD, last_word);
        pool.flush(last_slot, tuple::HEADER); // line 12: clwb the header, no trailing fence
        if self.eng.flushing && fault != Some(ZenFault::SkipCommitFence) {
            // Departure: under ADR the commit is acknowledged only once LP is durable.
            pool.fence();
        }
    }

    /// Step 8: each new version goes into the Met-Cache and the index and its lock is released
    /// with the commit tid; what it supersedes becomes garbage. Persist put the LP bit on the
    /// last tuple of `order` only, and the entries remember which one carries it.
    fn install_versions(&mut self, tid: u64, order: &[usize]) {
        let reuse = tid_timestamp(tid).max(self.eng.clock.now());
        let lp_write = order[order.len() - 1];
        for &i in order {
            let installed = self.install_version(&self.writes[i], tid, reuse, i == lp_write);
            if let Some(pin) = installed.pinned {
                self.pins.push(pin);
            }
            if let Some(entry) = installed.lock_only {
                if self.lock_entries.len() == MAX_LOCK_ENTRIES {
                    self.lock_entries.remove(0);
                }
                self.lock_entries.push(entry);
            }
            let st = self.st();
            st.garbage.extend(installed.superseded);
            st.tombs.extend(installed.tomb);
        }
    }

    fn install_version(&self, w: &WriteRec, tid: u64, reuse: u64, lp: bool) -> Installed {
        let t = &self.tables[w.table as usize];
        let row = self.new_row(w, t.row);
        let garbage = |slot, header| Garbage {
            table: w.table,
            slot,
            tid,
            reuse,
            header,
        };
        match w.kind {
            WriteKind::Update if w.target == 0 && w.row_unloaded => {
                // A blind overwrite of an uncached row (`claim_for_overwrite`): its entry was
                // only the write lock. Departure from §3.3.1 (write-around): the new version
                // stays on NVM alone, where Persist wrote it, and the index points at its
                // NVM-tuple, as for any uncached row; the entry is superseded, so a reader that
                // waited on its lock looks the key up again and finds the new version. The row
                // is not copied into DRAM a second time, and the next claim reuses the entry
                // instead of evicting a cached row.
                let (old_nvm, old_header) = self.retire_entry(t, w, w.slot, tid);
                Installed {
                    superseded: Some(garbage(old_nvm, old_header)),
                    lock_only: Some((w.table, w.eref)),
                    ..Installed::default()
                }
            }
            WriteKind::Update if w.target == 0 => {
                // The entry is in this thread's region: the new version replaces its row.
                let e = t.cache.entry(w.eref);
                let (old_nvm, old_header) = (e.nvm().load(Ordering::Relaxed), e.header_word());
                e.store_row(row);
                e.nvm().store(w.slot, Ordering::Relaxed);
                e.set_lp(lp);
                e.cts().store(tid, Ordering::Release);
                release(self.proto, e.cc(), Some(tid));
                Installed {
                    superseded: Some(garbage(old_nvm, old_header)),
                    ..Installed::default()
                }
            }
            WriteKind::Update => self.install_update_into_copy(t, w, row, tid, lp, garbage),
            WriteKind::Insert => {
                let e = t.cache.entry(w.target);
                e.store_row(row);
                e.nvm().store(w.slot, Ordering::Relaxed);
                e.set_lp(lp);
                e.cts().store(tid, Ordering::Release);
                release(self.proto, e.cc(), Some(tid));
                Installed::default()
            }
            WriteKind::Delete => {
                let e = t.cache.entry(w.eref);
                let (old_nvm, old_header) = (e.nvm().load(Ordering::Relaxed), e.header_word());
                // Before the key leaves the index: an insert that finds it absent then sees
                // this tid (`order_after_deletes`).
                t.deleted_up_to.fetch_max(tid, Ordering::SeqCst);
                t.index.remove_if(w.key, w.eref);
                t.cache.supersede(w.eref);
                e.cts().store(tid, Ordering::Release);
                release(self.proto, e.cc(), Some(tid));
                let lp_bit = if lp { tuple::LP } else { 0 };
                let tomb_header = (tid & tuple::CTS_MASK) | tuple::DELETED | lp_bit;
                Installed {
                    superseded: Some(garbage(old_nvm, old_header)),
                    tomb: Some(garbage(w.slot, tomb_header)),
                    ..Installed::default()
                }
            }
            WriteKind::Cancelled => Installed::default(),
        }
    }

    /// An update of an entry of another thread's region (§3.2): the new version goes into the
    /// copy claimed in this thread's region, which replaces the old entry in the index; the old
    /// entry is superseded and stamped with the tid, so validation by Tx-CTS fails on it.
    fn install_update_into_copy(
        &self,
        t: &TableRt,
        w: &WriteRec,
        row: &[u8],
        tid: u64,
        lp: bool,
        garbage: impl Fn(u64, u64) -> Garbage,
    ) -> Installed {
        let copy = t.cache.entry(w.target);
        copy.store_row(row);
        copy.key().store(w.key, Ordering::Relaxed);
        copy.nvm().store(w.slot, Ordering::Relaxed);
        copy.cts().store(tid, Ordering::Relaxed);
        copy.set_lp(lp);
        copy.cc()
            .store(self.proto.idle_word(tid), Ordering::Relaxed);
        t.cache.publish(w.target, 1);
        let (old_nvm, old_header) = self.retire_entry(t, w, w.target, tid);
        Installed {
            superseded: Some(garbage(old_nvm, old_header)),
            pinned: Some((w.table, w.target)),
            ..Installed::default()
        }
    }

    /// Points the index at `new` (a copy entry, or the new NVM-tuple) instead of the locked
    /// entry of write `w`, supersedes that entry and releases its lock stamped with `tid`, so
    /// validation by Tx-CTS fails on it. Returns the NVM-tuple and header word of the version
    /// the entry held (read before the stamp).
    fn retire_entry(&self, t: &TableRt, w: &WriteRec, new: u64, tid: u64) -> (u64, u64) {
        let e = t.cache.entry(w.eref);
        let swapped = t.index.replace_if(w.key, w.eref, new);
        debug_assert!(swapped, "a locked current entry is the index's value");
        let old = (e.nvm().load(Ordering::Relaxed), e.header_word());
        t.cache.supersede(w.eref);
        e.cts().store(tid, Ordering::Release);
        release(self.proto, e.cc(), Some(tid));
        old
    }

    /// The secondary-key changes `build_new_rows` found, applied once the versions are in.
    fn apply_secondary_changes(&self) {
        for &(table, si, key, before, after) in &self.secondary {
            let sec = &self.tables[table as usize].secondary[si];
            if let Some(b) = before {
                sec.remove(b, key);
            }
            if let Some(a) = after {
                sec.insert(a, key);
            }
        }
    }

    /// Locks that installing the versions did not release: cancelled records that still hold
    /// one (a failed 2PL upgrade kept for release) and 2PL's read locks (strict 2PL: last).
    fn release_remaining_locks(&self) {
        for w in &self.writes {
            if w.kind == WriteKind::Cancelled && w.locked && w.eref != 0 {
                self.release_word(w.table, w.eref, None);
            }
        }
        if self.holds_read_locks() {
            for rd in &self.reads {
                self.release_read(rd.table, rd.eref);
            }
        }
    }

    /// Counts the commit, and every [`REBALANCE_EVERY`] commits publishes this thread's access
    /// counts and rebalances the Met-Cache between tables (§3.2).
    fn count_commit(&mut self) {
        self.txns += 1;
        let st = self.st();
        st.commits += 1;
        if st.commits % REBALANCE_EVERY == 0 {
            for (t, n) in self.tables.iter().zip(self.accesses.iter_mut()) {
                t.accesses.fetch_add(std::mem::take(n), Ordering::Relaxed);
            }
            self.eng
                .txns
                .fetch_add(std::mem::take(&mut self.txns), Ordering::Relaxed);
            self.eng.rebalance();
        }
    }
}
