//! A FIR worker: one thread's transactions (§4.2.1): MVTO over the tuple headers in the tiles,
//! new versions appended to the thread's regions, Algorithm 1's `Persist`, and the LCTT.

use super::layout::tuple;
use super::storage::{self, state, NONE};
use super::{FirEngine, FirFault, TableRt, ThreadState};
use crate::catalog::TableId;
use crate::engine::{common, DbError, EngineWorker, FieldWrite, TxError};
use crate::pmem::{PersistenceDomain, Pool};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Times a read retries while the version it must see is being committed by another
/// transaction (MVTO: a reader younger than a pending writer waits for its outcome), before it
/// gives up with a retryable conflict.
const PENDING_WAITS: u32 = 256;

/// Bytes of a cache line (the unit of Algorithm 1's write-back loop).
const LINE: u64 = 64;

/// Live versions GC copies per transaction (stage 1, §4.5): short enough that the versions it
/// holds pending keep readers waiting only briefly.
const GC_BATCH: usize = 32;

/// The pool's share held by region blocks from which GC collects emptier blocks, more often
/// (`FirWorker::gc_threshold_now`).
const ROOM_SHORT: f64 = 0.6;

/// The share from which GC collects at half its threshold, and a round takes the checkpoint
/// that lets it free what it emptied itself rather than leave it to the background
/// checkpointer.
const ROOM_NEARLY_GONE: f64 = 0.85;

/// Stage 2 of GC for the slots other than `me`: the blocks a round took from a slot whose
/// worker stopped writing wait in that slot's state, which no round of its own frees (a slot
/// another worker holds is skipped: never waiting, no lock order to keep).
fn free_collected_of_others(eng: &FirEngine, me: usize) {
    for other in (0..eng.config.max_threads).filter(|&o| o != me) {
        if let Some(mut guard) = eng.slots[other].try_lock() {
            if let Some(ost) = guard.as_mut() {
                free_collected(eng, ost);
            }
        }
    }
}

/// Stage 2 of GC: frees the blocks of `st` (a slot's state) waiting for it that the valid
/// checkpoint no longer names and no running transaction can read (see `gc.rs`), and drops them
/// from their regions.
fn free_collected(eng: &FirEngine, st: &mut ThreadState) {
    if st.gc_waiting.is_empty() {
        return;
    }
    let ct = eng.ckpt.lock().ct;
    let oldest = eng.oldest_active();
    let at_once = eng.config.fault == Some(FirFault::GcFreeBeforeCheckpoint);
    let (ready, waiting): (Vec<_>, Vec<_>) = st
        .gc_waiting
        .drain(..)
        .partition(|&(_, _, by)| at_once || (by < ct && by < oldest));
    st.gc_waiting = waiting;
    if ready.is_empty() {
        return;
    }
    let mut pages = Vec::with_capacity(ready.len());
    for &(_, block, _) in &ready {
        if let Some(tag) = eng.pages.tag(&eng.pool, block) {
            pages.push((block, super::gc::tag_word(tag)));
        }
    }
    eng.free_blocks(&pages);
    for (table, block, _) in ready {
        let r = &mut st.regions[table as usize];
        if let Some(i) = r.blocks.iter().position(|&b| b == block) {
            r.blocks.remove(i);
            if i < r.current {
                r.current -= 1;
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteKind {
    Insert,
    Update,
    Delete,
}

/// An entry of the w_set (§4.1): the table and logical address of a new version.
struct WriteRec {
    table: TableId,
    key: u64,
    /// The new version (its header is pending until commit).
    addr: u64,
    /// The version it supersedes, or [`NONE`].
    prev: u64,
    kind: WriteKind,
    /// Offset of the new row in `FirWorker::rows`.
    row_at: usize,
}

pub(crate) struct FirWorker {
    eng: Arc<FirEngine>,
    pool: Arc<Pool>,
    thread: usize,
    state: Option<ThreadState>,
    tables: Vec<Arc<TableRt>>,
    in_txn: bool,
    read_only: bool,
    /// The transaction's txnId (its MVTO timestamp).
    ts: u64,
    writes: Vec<WriteRec>,
    write_lookup: common::WriteLookup,
    rows: Vec<u8>,
    /// Per table written: the region's append position before the transaction's first write.
    undo: Vec<(TableId, (usize, u64))>,
    /// Tuple contents of one run of slots, built by `persist`.
    content: Vec<u8>,
    scratch: Vec<u8>,
    old_row: Vec<u8>,
    scan_hits: Vec<(u64, u64)>,
    /// The transaction being committed wrote nothing.
    writes_were_empty: bool,
}

impl FirWorker {
    pub(crate) fn new(eng: Arc<FirEngine>, thread: usize) -> Result<FirWorker, DbError> {
        if thread >= eng.config.max_threads {
            return Err(DbError::NoWorkerSlot(eng.config.max_threads));
        }
        {
            let mut slot = eng.slots[thread].lock();
            match slot.as_mut() {
                Some(st) if !st.owned => st.owned = true,
                _ => {
                    return Err(DbError::Config(format!(
                        "worker slot {thread} is already in use"
                    )))
                }
            }
        }
        let tables = eng.tables.read().clone();
        Ok(FirWorker {
            pool: eng.pool.clone(),
            thread,
            state: None,
            tables,
            in_txn: false,
            read_only: false,
            ts: 0,
            writes: Vec::new(),
            write_lookup: common::WriteLookup::default(),
            rows: Vec::new(),
            undo: Vec::new(),
            content: Vec::new(),
            scratch: Vec::new(),
            old_row: Vec::new(),
            scan_hits: Vec::new(),
            writes_were_empty: true,
            eng,
        })
    }

    fn table(&mut self, id: TableId) -> Result<Arc<TableRt>, TxError> {
        if id as usize >= self.tables.len() {
            self.tables = self.eng.tables.read().clone();
        }
        let schema = self.tables.get(id as usize).map(|t| &t.schema);
        crate::engine::common::live_schema_in_tx(schema, id)?;
        Ok(self.tables[id as usize].clone())
    }

    fn find_write(&self, table: TableId, key: u64) -> Option<usize> {
        self.write_lookup.find(self.writes.len(), table, key, |i| {
            self.writes[i].table == table && self.writes[i].key == key
        })
    }

    fn not_found(table: TableId, key: u64) -> TxError {
        TxError::NotFound { table, key }
    }

    /// The version of `key` this transaction sees (MVTO read, §4.2.1 steps 1–4): the newest
    /// version that began at or before `ts`, read-stamped with `ts`; `None` if there is none or
    /// it is a deletion. A pending version the transaction must see makes it wait.
    fn visible(&self, t: &TableRt, key: u64) -> Result<Option<u64>, TxError> {
        let mut waits = 0;
        loop {
            let Some(head) = t.index.get(key) else {
                return Ok(None);
            };
            let h = self.eng.header(head);
            let s = h.latch(&self.pool);
            if t.index.get(key) != Some(head) {
                h.unlatch(s);
                continue;
            }
            // Only the newest version can be pending: a writer needs a committed newest version.
            let mut v = head;
            let mut v_state = s;
            let found = loop {
                let hv = self.eng.header(v);
                if hv.begin.load(Ordering::Acquire) <= self.ts {
                    break Some(v);
                }
                let prev = hv.prev.load(Ordering::Acquire);
                if prev == NONE {
                    break None;
                }
                v = prev;
                v_state = self.eng.header(v).state.load(Ordering::Acquire) & !state::LATCH;
            };
            match found {
                None => {
                    h.unlatch(s);
                    return Ok(None);
                }
                Some(_) if v_state & state::PENDING != 0 => {
                    h.unlatch(s);
                    waits += 1;
                    if waits > PENDING_WAITS {
                        return Err(TxError::Conflict);
                    }
                    std::thread::yield_now();
                }
                Some(v) => {
                    self.eng.header(v).read.fetch_max(self.ts, Ordering::AcqRel);
                    h.unlatch(s);
                    return Ok((v_state & state::TOMBSTONE == 0).then_some(v));
                }
            }
        }
    }

    /// Copies the row of the version at `addr` (committed, so immutable) into `out`.
    fn read_row(&self, addr: u64, out: &mut [u8]) {
        self.pool
            .read_bytes(self.eng.content_at(addr) + tuple::HEADER, out);
    }

    /// Takes the next empty slot of the thread's region of `table` (§4.2.1 step 5), allocating
    /// a block when the current one is full. Returns the logical address.
    fn alloc(&mut self, table: TableId, t: &TableRt) -> Result<u64, TxError> {
        let per = self.eng.slots(t.slot);
        let thread = self.thread;
        let st = self.state.as_mut().expect("the worker holds its state");
        if st.regions.len() <= table as usize {
            st.regions.resize_with(table as usize + 1, Default::default);
        }
        let r = &mut st.regions[table as usize];
        if !self.undo.iter().any(|&(u, _)| u == table) {
            self.undo.push((table, r.position()));
        }
        let before = r.position();
        if r.current < r.blocks.len() && r.next == per {
            r.current += 1;
            r.next = 0;
        }
        if r.current == r.blocks.len() {
            // A page GC freed keeps the tile of its previous use; one of another table or slot
            // size cannot serve: hold it and take another (at most a few), then give them back
            // (before anything is written to the one taken, so a crash in between leaves only
            // empty blocks at the region's end). Each try has its own sequence number: page tags
            // never repeat.
            let mut unsuitable = Vec::new();
            let got = loop {
                let tag = match FirEngine::block_tag(thread, table, r.next_seq) {
                    Ok(tag) => tag,
                    Err(e) => break Err(TxError::PmFull(e)),
                };
                r.next_seq += 1;
                match self.eng.pages.allocate(&self.pool, tag) {
                    Ok(b) if self.eng.tile(b, table, t.slot).is_some() => break Ok(b),
                    Ok(b) if unsuitable.len() < 8 => unsuitable.push(b),
                    Ok(b) => {
                        unsuitable.push(b);
                        break Err(TxError::PmFull(format!(
                            "table '{}' of thread {thread} needs a block, but the free pages \
                             GC returned were last used by other tables (FIR keeps a page's \
                             tile of tuple headers for its table); give the pool more room",
                            t.schema.name
                        )));
                    }
                    Err(e) => {
                        break Err(common::pm_full(
                            format_args!("table '{}' of thread {thread}", t.schema.name),
                            e,
                        ))
                    }
                }
            };
            for b in unsuitable {
                self.eng.pages.free(&self.pool, b);
            }
            let block = match got {
                Ok(b) => b,
                Err(e) => {
                    (r.current, r.next) = before;
                    return Err(e);
                }
            };
            r.blocks.push(block);
            self.eng.gc.blocks_in_use.fetch_add(1, Ordering::Relaxed);
        }
        let addr = storage::logical(thread, r.blocks[r.current], r.next);
        r.next += 1;
        Ok(addr)
    }

    /// Writes a pending header for a new version of `key` at `addr` (begin_ts = txnId).
    fn init_pending(&self, addr: u64, key: u64, prev: u64) {
        let h = self.eng.header(addr);
        h.latch(&self.pool);
        h.begin.store(self.ts, Ordering::Relaxed);
        h.end.store(u64::MAX, Ordering::Relaxed);
        h.read.store(self.ts, Ordering::Relaxed);
        h.prev.store(prev, Ordering::Relaxed);
        h.key.store(key, Ordering::Relaxed);
        h.unlatch(state::PENDING);
    }

    fn push_write(&mut self, table: TableId, key: u64, addr: u64, prev: u64, kind: WriteKind) {
        let row = self.tables[table as usize].row;
        let row_at = self.rows.len();
        self.rows.resize(row_at + row, 0);
        let position = self.writes.len();
        self.writes.push(WriteRec {
            table,
            key,
            addr,
            prev,
            kind,
            row_at,
        });
        self.write_lookup.record(position, table, key);
    }

    /// Creates a new version of an existing `key` (an update applying `fields`, or a deletion):
    /// MVTO's write rule on the newest version under its latch, then a pending header in the
    /// thread's region that the index points to (§4.2.1 steps 1–7).
    fn supersede(
        &mut self,
        table: TableId,
        key: u64,
        kind: WriteKind,
        fields: &[FieldWrite<'_>],
    ) -> Result<(), TxError> {
        let t = self.table(table)?;
        let eng = self.eng.clone();
        loop {
            let Some(head) = t.index.get(key) else {
                return Err(Self::not_found(table, key));
            };
            let h = eng.header(head);
            let s = h.latch(&self.pool);
            if t.index.get(key) != Some(head) {
                h.unlatch(s);
                continue;
            }
            let refuse = if s & state::PENDING != 0
                || h.begin.load(Ordering::Acquire) > self.ts
                || h.read.load(Ordering::Acquire) > self.ts
            {
                Some(TxError::Conflict)
            } else if s & state::TOMBSTONE != 0 {
                Some(Self::not_found(table, key))
            } else {
                None
            };
            if let Some(e) = refuse {
                h.unlatch(s);
                return Err(e);
            }
            let addr = match self.alloc(table, &t) {
                Ok(a) => a,
                Err(e) => {
                    h.unlatch(s);
                    return Err(e);
                }
            };
            self.init_pending(addr, key, head);
            let replaced = t.index.replace_if(key, head, addr);
            debug_assert!(
                replaced,
                "the index entry is stable under the newest version's latch"
            );
            h.unlatch(s);
            self.push_write(table, key, addr, head, kind);
            let w = self.writes.len() - 1;
            if kind == WriteKind::Update {
                let at = self.writes[w].row_at;
                let mut row = std::mem::take(&mut self.rows);
                self.read_row(head, &mut row[at..at + t.row]);
                for f in fields {
                    row[at + f.offset..at + f.offset + f.bytes.len()].copy_from_slice(f.bytes);
                }
                self.rows = row;
            }
            return Ok(());
        }
    }

    fn check_fields(t: &TableRt, fields: &[FieldWrite<'_>]) -> Result<(), TxError> {
        for f in fields {
            if f.offset + f.bytes.len() > t.row {
                return Err(TxError::RowTooLarge(format!(
                    "a write of {} bytes at offset {} does not fit rows of {} bytes in table {}",
                    f.bytes.len(),
                    f.offset,
                    t.row,
                    t.schema.name
                )));
            }
        }
        Ok(())
    }

    /// Algorithm 1 (`Persist`) for one run of consecutive slots of one region, whose contents
    /// are in `self.content`: copy them (lines 4–7), then `clwb` + `sfence` each cache line
    /// (lines 8–10). Under eADR the stores alone are durable, in program order.
    fn persist(&self, at: u64, slot: u64) {
        let fault = self.eng.config.fault;
        // Lines 4–7: one copy per new tuple, in order.
        for (i, tuple) in self.content.chunks(slot as usize).enumerate() {
            self.pool.write_bytes(at + i as u64 * slot, tuple);
        }
        if !self.eng.flushing || fault == Some(FirFault::SkipTupleFlush) {
            return;
        }
        let end = at + self.content.len() as u64;
        if self.eng.domain == PersistenceDomain::Msync {
            // An msync per line would be a system call per line: one for the run.
            self.pool.flush(at, end - at);
            self.pool.fence();
            return;
        }
        let mut line = at & !(LINE - 1);
        while line < end {
            let from = line.max(at);
            self.pool.flush(from, (line + LINE).min(end) - from);
            if fault != Some(FirFault::SkipTupleFence) {
                self.pool.fence();
            }
            line += LINE;
        }
    }

    /// Persists every new version of the transaction, a run of consecutive slots at a time.
    fn persist_writes(&mut self) {
        let mut i = 0;
        while i < self.writes.len() {
            let first = &self.writes[i];
            let t = &self.tables[first.table as usize];
            let at = self.eng.content_at(first.addr);
            let mut content = std::mem::take(&mut self.content);
            content.clear();
            let mut j = i;
            loop {
                let w = &self.writes[j];
                let tomb = if w.kind == WriteKind::Delete {
                    tuple::TOMBSTONE
                } else {
                    0
                };
                content.extend_from_slice(&(self.ts | tomb).to_le_bytes());
                content.extend_from_slice(&w.key.to_le_bytes());
                content.extend_from_slice(&self.rows[w.row_at..w.row_at + t.row]);
                content.resize(((j - i + 1) as u64 * t.slot) as usize, 0);
                j += 1;
                let contiguous = j < self.writes.len()
                    && self.writes[j].table == w.table
                    && self.writes[j].addr == w.addr + 1
                    && storage::offset_of(w.addr) + 1 < storage::MAX_SLOTS;
                if !contiguous {
                    break;
                }
            }
            self.content = content;
            self.persist(at, t.slot);
            i = j;
        }
    }

    /// Stores txnId in the thread's LCTT word and makes it durable: the commit point (§4.2.1).
    fn write_lctt(&self) {
        let at = self.eng.lctt_word(self.thread);
        // Under eADR program order is persistence order and nothing is flushed or fenced: the
        // ordered store keeps the compiler from moving the commit point above the copies of
        // Persist (docs/CRASHTEST.md, "Compiler ordering").
        self.pool.write_u64_ordered(at, self.ts);
        if self.eng.flushing && self.eng.config.fault != Some(FirFault::SkipLcttFlush) {
            self.pool.flush(at, 8);
            self.pool.fence();
        }
    }

    /// Makes the committed versions visible: headers committed, old versions ended and marked
    /// obsolete, deletions out of the index, secondary indexes updated.
    fn install(&mut self) {
        let mut old_row = std::mem::take(&mut self.old_row);
        for w in &self.writes {
            let t = &self.tables[w.table as usize];
            let new_row = &self.rows[w.row_at..w.row_at + t.row];
            let has_old = w.prev != NONE;
            if !t.secondary.is_empty() {
                if has_old {
                    old_row.resize(t.row, 0);
                    self.read_row(w.prev, &mut old_row);
                }
                for (i, sec) in t.secondary.iter().enumerate() {
                    let old = has_old.then(|| t.secondary_key(i, &old_row));
                    let new = (w.kind != WriteKind::Delete).then(|| t.secondary_key(i, new_row));
                    if old != new {
                        if let Some(o) = old {
                            sec.remove(o, w.key);
                        }
                        if let Some(n) = new {
                            sec.insert(n, w.key);
                        }
                    }
                }
            }
            if has_old {
                self.eng
                    .header(w.prev)
                    .end
                    .store(self.ts, Ordering::Release);
                self.eng
                    .tile_of(w.prev)
                    .mark_obsolete(storage::offset_of(w.prev));
            }
            let h = self.eng.header(w.addr);
            h.latch(&self.pool);
            if w.kind == WriteKind::Delete {
                h.unlatch(state::COMMITTED | state::TOMBSTONE);
                t.deleted_up_to.fetch_max(self.ts, Ordering::AcqRel);
                t.index.remove_if(w.key, w.addr);
                self.eng
                    .tile_of(w.addr)
                    .mark_obsolete(storage::offset_of(w.addr));
            } else {
                h.unlatch(state::COMMITTED);
            }
            // MarkNode (Algorithm 2), after the version is installed: a checkpoint whose CT is
            // above this txnId drains the mark after it and so reads the installed state.
            self.eng.marks.mark(w.table, w.key, self.ts);
        }
        self.old_row = old_row;
    }

    /// Commits the running transaction (§4.2.1): Persist, the LCTT word, then the versions
    /// become visible. Returns its txnId.
    fn commit_writes(&mut self) -> u64 {
        self.writes_were_empty = self.writes.is_empty();
        if !self.writes.is_empty() {
            let lctt_first = self.eng.config.fault == Some(FirFault::LcttFirst);
            if lctt_first {
                self.write_lctt();
            }
            self.persist_writes();
            if !lctt_first {
                self.write_lctt();
            }
            self.install();
            self.eng.last_commit.fetch_max(self.ts, Ordering::AcqRel);
        }
        self.finish();
        self.ts
    }

    /// Whether every insert of this transaction is ordered after the scans of its table
    /// (`TableRt::scanned_up_to`, `common::inserts_follow_scans`): FIR publishes an insert
    /// when it is made, so a younger scan may have walked past the key before.
    fn inserts_follow_younger_scans(&self) -> bool {
        common::inserts_follow_scans(
            self.ts,
            (self.writes.iter())
                .filter(|w| w.kind == WriteKind::Insert)
                .map(|w| &self.tables[w.table as usize].scanned_up_to),
        )
    }

    /// Takes the slot's state from where it is parked between transactions (see
    /// `FirEngine::slots`); waits while another worker's GC round works on it.
    fn hold(&mut self) {
        if self.state.is_none() {
            self.state = self.eng.slots[self.thread].lock().take();
            debug_assert!(
                self.state.is_some(),
                "a live worker's state is parked or held"
            );
        }
    }

    /// Parks the slot's state between transactions, where another worker's GC can collect the
    /// regions of a worker that stopped writing (§4.5).
    fn park(&mut self) {
        if let Some(st) = self.state.take() {
            *self.eng.slots[self.thread].lock() = Some(st);
        }
    }

    /// A garbage collection round (§4.5, see `gc.rs`): frees the blocks earlier rounds emptied
    /// once a checkpoint covers them (stage 2), moves the live versions out of this worker's
    /// mostly obsolete blocks and out of those of slots that stopped writing (stage 1), then takes
    /// a checkpoint and frees what it covers.
    pub(crate) fn collect_garbage(&mut self) -> Result<(), TxError> {
        if self.in_txn {
            return Ok(());
        }
        self.hold();
        let eng = self.eng.clone();
        let me = self.thread;
        let mut st = self.state.take().expect("the worker holds its state");
        // Stage 2 of earlier rounds: what the checkpoints since then cover, in this slot and in
        // the slots whose regions a round adopted.
        free_collected(&eng, &mut st);
        free_collected_of_others(&eng, me);
        let victims = self.gc_victims(self.thread, &st);
        self.state = Some(st);
        let mut emptied = false;
        if !victims.is_empty() {
            self.eng.gc.rounds.fetch_add(1, Ordering::Relaxed);
            let done = self.redistribute(self.thread, &victims);
            let st = self.state.as_mut().expect("the worker holds its state");
            emptied |= !done.is_empty();
            st.gc_waiting.extend(done);
        }
        // The regions of slots whose worker stopped writing (or left): nothing else would ever
        // collect them. Their state is taken only if no one holds it (never waiting: no lock
        // order to keep), and no checkpoint runs while it is held (a table drop holds the
        // checkpoint lock while it locks the slots).
        for other in (0..eng.config.max_threads).filter(|&o| o != me) {
            let Some(mut guard) = eng.slots[other].try_lock() else {
                continue;
            };
            let Some(ost) = guard.as_mut() else {
                continue;
            };
            if ost.commits != ost.gc_seen_commits {
                ost.gc_seen_commits = ost.commits; // still writing: its own rounds collect
                continue;
            }
            let victims = self.gc_victims(other, ost);
            if victims.is_empty() {
                continue;
            }
            self.eng.gc.rounds.fetch_add(1, Ordering::Relaxed);
            self.eng.gc.adopted.fetch_add(1, Ordering::Relaxed);
            let done = self.redistribute(other, &victims);
            emptied |= !done.is_empty();
            ost.gc_waiting.extend(done);
        }
        if !emptied {
            return Ok(());
        }
        // Stage 2 (§4.5): the emptied blocks are freed once a checkpoint that no longer names
        // them is complete. The paper's GC thread takes that checkpoint at once; here a worker
        // runs the round, and a checkpoint of a large index kept its transactions waiting for
        // as long as it took, every round (at pool pressure a round comes every 128 commits: a
        // 2-thread YCSB run over 1 M keys in 4 GiB all but stopped after 20 s, issue 14). So
        // while the background checkpointer runs, the round leaves the blocks to its next
        // checkpoint and a later round frees them. The worker still takes it when no
        // checkpointer runs (the crash suite's deterministic runs) and when room is nearly
        // gone: there its wait is the back-pressure that keeps the writers from filling the
        // pool before the blocks are freed.
        let leave_to_checkpointer = self.eng.checkpointer_running.load(Ordering::Acquire)
            && self.pool_pressure() < ROOM_NEARLY_GONE;
        if leave_to_checkpointer {
            return Ok(());
        }
        if self.eng.config.fault != Some(FirFault::GcFreeBeforeCheckpoint)
            && self.eng.checkpoint().is_err()
        {
            self.eng.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
        }
        let st = self.state.as_mut().expect("the worker holds its state");
        free_collected(&eng, st);
        free_collected_of_others(&eng, me);
        Ok(())
    }

    /// Stage 1 of GC (§4.5): supersedes every live version of `victims` (blocks of `owner`'s
    /// regions) with an identical copy in this worker's region, in short transactions of
    /// [`GC_BATCH`] versions. One long transaction over thousands of versions kept them pending
    /// for its whole copy, so that every transaction reading one waited and then aborted, and a
    /// single conflict undid the round; a batch that meets a conflict is given up alone (its
    /// blocks stay and a later round retries them). Returns the blocks now wholly obsolete, with
    /// the clock at the end (stage 2's bound).
    fn redistribute(
        &mut self,
        owner: usize,
        victims: &[(TableId, u64)],
    ) -> Vec<(TableId, u64, u64)> {
        let eng = self.eng.clone();
        let mut live: Vec<(TableId, u64, u64)> = Vec::new();
        for &(table, block) in victims {
            let t = self.tables[table as usize].clone();
            let tile = eng.tile_of(storage::logical(owner, block, 0));
            for off in 0..eng.slots(t.slot) {
                if !tile.is_obsolete(off) {
                    let addr = storage::logical(owner, block, off);
                    let key = tile.headers[off as usize].key.load(Ordering::Acquire);
                    live.push((table, key, addr));
                }
            }
        }
        let mut moved = 0u64;
        for batch in live.chunks(GC_BATCH) {
            self.begin_txn(false);
            let mut copied = 0u64;
            let mut failed = false;
            for &(table, key, addr) in batch {
                if self.tables[table as usize].index.get(key) != Some(addr) {
                    continue; // superseded or deleted since: obsolete once that commits
                }
                if self.update(table, key, &[]).is_err() {
                    failed = true;
                    break;
                }
                copied += 1;
            }
            if failed {
                self.abort_txn();
                self.eng.gc.failures.fetch_add(1, Ordering::Relaxed);
            } else {
                self.commit_writes();
                moved += copied;
            }
        }
        self.eng.gc.moved.fetch_add(moved, Ordering::Relaxed);
        let obsolete_by = self.eng.clock.load(Ordering::SeqCst);
        victims
            .iter()
            .filter(|&&(table, block)| {
                let per = eng.slots(self.tables[table as usize].slot);
                eng.tile_of(storage::logical(owner, block, 0))
                    .obsolete_count()
                    == per
            })
            .map(|&(table, block)| (table, block, obsolete_by))
            .collect()
    }

    /// The pool's share held by region blocks.
    fn pool_pressure(&self) -> f64 {
        let blocks = self.eng.gc.blocks_in_use.load(Ordering::Relaxed);
        blocks as f64 / self.eng.pages.page_count().max(1) as f64
    }

    /// The obsolete share at which a block is collected: `gc_threshold` while region blocks
    /// hold under 60 % of the pool, falling linearly to half of it at 85 % and above.
    ///
    /// Departs from §4.5, whose threshold is fixed: under uniform updates a block's live share
    /// decays slowly, so with a fixed 90 % the regions settle at about 2.6× the live data, and a
    /// pool sized for less fills up (2 threads of 16-op YCSB hit PmFull within seconds in the
    /// auto-sized pool). Collecting emptier blocks copies more, but only when room runs short.
    fn gc_threshold_now(&self) -> f64 {
        let base = self.eng.config.gc_threshold;
        let squeeze =
            ((self.pool_pressure() - ROOM_SHORT) / (ROOM_NEARLY_GONE - ROOM_SHORT)).clamp(0.0, 1.0);
        base - squeeze * base / 2.0
    }

    /// The full blocks of `owner`'s regions (not the ones being filled) that are at least
    /// [`gc_threshold_now`](Self::gc_threshold_now) obsolete and not already waiting to be
    /// freed, the most obsolete first, at most a few per round.
    fn gc_victims(&self, owner: usize, st: &ThreadState) -> Vec<(TableId, u64)> {
        const MAX_PER_ROUND: usize = 8;
        let threshold = self.gc_threshold_now();
        let waiting = &st.gc_waiting;
        // (obsolete share, table, block)
        let mut candidates: Vec<(f64, TableId, u64)> = Vec::new();
        for (table, r) in st.regions.iter().enumerate() {
            let Some(t) = self.tables.get(table) else {
                continue;
            };
            if !t.schema.is_live() {
                continue;
            }
            let per = self.eng.slots(t.slot);
            let need = (threshold * per as f64).ceil() as u64;
            for &block in &r.blocks[..r.current.min(r.blocks.len())] {
                if waiting.iter().any(|w| w.1 == block) {
                    continue;
                }
                let obsolete = self
                    .eng
                    .tile_of(storage::logical(owner, block, 0))
                    .obsolete_count();
                if obsolete >= need.max(1) {
                    candidates.push((obsolete as f64 / per as f64, table as TableId, block));
                }
            }
        }
        candidates.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        candidates
            .into_iter()
            .take(MAX_PER_ROUND)
            .map(|(_, table, block)| (table, block))
            .collect()
    }

    /// Starts a transaction (the slot's state must be held): its txnId from the clock.
    fn begin_txn(&mut self, read_only: bool) {
        // A lower bound of the txnId is published first, so that a checkpoint reading the clock
        // and then the running transactions never misses this one (see `checkpoint.rs`, CT).
        let floor = self.eng.clock.load(Ordering::SeqCst) + 1;
        self.eng.active[self.thread].store(floor, Ordering::SeqCst);
        self.ts = self.eng.clock.fetch_add(1, Ordering::SeqCst) + 1;
        self.eng.active[self.thread].store(self.ts, Ordering::SeqCst);
        self.read_only = read_only;
        self.in_txn = true;
    }

    /// Rolls back the running transaction (§4.2.1): the index points at the previous versions
    /// again and the regions' append positions go back.
    fn abort_txn(&mut self) {
        if !self.in_txn {
            return;
        }
        for w in self.writes.iter().rev() {
            let t = &self.tables[w.table as usize];
            let h = self.eng.header(w.addr);
            h.latch(&self.pool);
            if w.prev != NONE {
                t.index.replace_if(w.key, w.addr, w.prev);
            } else {
                t.index.remove_if(w.key, w.addr);
            }
            h.unlatch(0);
        }
        let st = self.state.as_mut().expect("the worker holds its state");
        for &(table, (current, next)) in &self.undo {
            let r = &mut st.regions[table as usize];
            (r.current, r.next) = (current, next);
        }
        self.finish();
    }

    fn finish(&mut self) {
        self.writes.clear();
        self.write_lookup.clear();
        self.rows.clear();
        self.undo.clear();
        self.eng.active[self.thread].store(u64::MAX, Ordering::Release);
        self.in_txn = false;
    }

    fn check_write(&self) -> Result<(), TxError> {
        if self.read_only {
            return Err(TxError::ReadOnly);
        }
        Ok(())
    }
}

impl EngineWorker for FirWorker {
    fn begin(&mut self, read_only: bool) {
        if self.in_txn {
            self.abort_txn();
        }
        self.hold();
        self.begin_txn(read_only);
    }

    fn read(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError> {
        let t = self.table(table)?;
        common::check_row_len(&t.schema.name, t.row, out.len(), "buffer")?;
        if let Some(i) = self.find_write(table, key) {
            let w = &self.writes[i];
            if w.kind == WriteKind::Delete {
                return Err(Self::not_found(table, key));
            }
            out.copy_from_slice(&self.rows[w.row_at..w.row_at + t.row]);
            return Ok(());
        }
        match self.visible(&t, key)? {
            Some(addr) => {
                self.read_row(addr, out);
                Ok(())
            }
            None => Err(Self::not_found(table, key)),
        }
    }

    fn update(
        &mut self,
        table: TableId,
        key: u64,
        writes: &[FieldWrite<'_>],
    ) -> Result<(), TxError> {
        self.check_write()?;
        let t = self.table(table)?;
        Self::check_fields(&t, writes)?;
        if let Some(i) = self.find_write(table, key) {
            let w = &self.writes[i];
            if w.kind == WriteKind::Delete {
                return Err(Self::not_found(table, key));
            }
            let at = w.row_at;
            for f in writes {
                self.rows[at + f.offset..at + f.offset + f.bytes.len()].copy_from_slice(f.bytes);
            }
            return Ok(());
        }
        self.supersede(table, key, WriteKind::Update, writes)
    }

    fn insert(&mut self, table: TableId, key: u64, row: &[u8]) -> Result<(), TxError> {
        self.check_write()?;
        let t = self.table(table)?;
        common::check_row_len(&t.schema.name, t.row, row.len(), "insert")?;
        if let Some(i) = self.find_write(table, key) {
            let w = &mut self.writes[i];
            if w.kind != WriteKind::Delete {
                return Err(TxError::DuplicateKey { table, key });
            }
            w.kind = if w.prev == NONE {
                WriteKind::Insert
            } else {
                WriteKind::Update
            };
            let at = w.row_at;
            self.rows[at..at + t.row].copy_from_slice(row);
            return Ok(());
        }
        // A key deleted by a younger transaction cannot be inserted by an older one: recovery
        // keeps the version with the largest txnId.
        if t.deleted_up_to.load(Ordering::Acquire) >= self.ts {
            return Err(TxError::Conflict);
        }
        loop {
            let before = self
                .state
                .as_ref()
                .and_then(|s| s.regions.get(table as usize).map(|r| r.position()));
            let addr = self.alloc(table, &t)?;
            self.init_pending(addr, key, NONE);
            let existing = match t.index.insert_new(key, addr) {
                Ok(()) => {
                    self.push_write(table, key, addr, NONE, WriteKind::Insert);
                    let at = self.writes[self.writes.len() - 1].row_at;
                    self.rows[at..at + t.row].copy_from_slice(row);
                    return Ok(());
                }
                Err(existing) => existing,
            };
            // Give the slot back: it must stay the region's next empty slot (no holes).
            let h = self.eng.header(addr);
            h.latch(&self.pool);
            h.unlatch(0);
            let st = self.state.as_mut().expect("the worker holds its state");
            let r = &mut st.regions[table as usize];
            (r.current, r.next) = before.unwrap_or((0, 0));
            let eh = self.eng.header(existing);
            let s = eh.latch(&self.pool);
            if t.index.get(key) != Some(existing) {
                eh.unlatch(s);
                continue;
            }
            let result = if s & (state::PENDING | state::TOMBSTONE) != 0
                || eh.begin.load(Ordering::Acquire) > self.ts
            {
                TxError::Conflict
            } else {
                eh.read.fetch_max(self.ts, Ordering::AcqRel);
                TxError::DuplicateKey { table, key }
            };
            eh.unlatch(s);
            return Err(result);
        }
    }

    fn delete(&mut self, table: TableId, key: u64) -> Result<(), TxError> {
        self.check_write()?;
        self.table(table)?;
        if let Some(i) = self.find_write(table, key) {
            let w = &mut self.writes[i];
            if w.kind == WriteKind::Delete {
                return Err(Self::not_found(table, key));
            }
            // Deleting the transaction's own insert still persists a tombstone: the slot is
            // taken, and a region has no holes.
            w.kind = WriteKind::Delete;
            return Ok(());
        }
        self.supersede(table, key, WriteKind::Delete, &[])
    }

    fn scan(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), TxError> {
        let t = self.table(table)?;
        let mut hits = std::mem::take(&mut self.scan_hits);
        // Before the walk (see `TableRt::scanned_up_to`): an older insert published after it
        // then sees this scan at its commit, or this walk meets the insert (and waits for it).
        common::mark_scan(&t.scanned_up_to, self.ts);
        let collected =
            common::collect_scan_hits(&t.index, &t.schema.name, from, reverse, limit, &mut hits)
                .and_then(|()| {
                    // A delete by a younger transaction took its key out of the index, though
                    // this one's timestamp still sees the row: rather than miss it, retry.
                    if t.deleted_up_to.load(Ordering::SeqCst) > self.ts {
                        Err(TxError::Conflict)
                    } else {
                        Ok(())
                    }
                });
        let mut row = std::mem::take(&mut self.scratch);
        row.resize(t.row, 0);
        let result = collected.and_then(|()| {
            common::visit_hits(&hits, &mut row, |k, _, out| self.read(table, k, out), f).map(|_| ())
        });
        self.scan_hits = hits;
        self.scratch = row;
        result
    }

    fn lookup_secondary(
        &mut self,
        table: TableId,
        index: usize,
        secondary: u64,
        out: &mut Vec<u64>,
    ) -> Result<(), TxError> {
        let t = self.table(table)?;
        common::lookup_secondary(&t.secondary, &t.schema.name, index, secondary, out)
    }

    fn commit(&mut self) -> Result<u64, TxError> {
        if !self.in_txn {
            return Ok(self.ts);
        }
        if !self.inserts_follow_younger_scans() {
            self.abort();
            return Err(TxError::Conflict);
        }
        let ts = self.commit_writes();
        if let Some(every) = self.eng.config.checkpoint_every_commits {
            if !self.writes_were_empty
                && (self.eng.commits.fetch_add(1, Ordering::Relaxed) + 1) % every == 0
                && self.eng.checkpoint().is_err()
            {
                self.eng.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(every) = self.eng.config.gc_every_commits {
            let pressure = self.pool_pressure();
            let st = self.state.as_mut().expect("the worker holds its state");
            if !self.writes_were_empty {
                st.commits += 1;
                // Rounds come 8× as often when room runs short (see `gc_threshold_now`).
                let every = if pressure > ROOM_SHORT {
                    (every / 8).max(1)
                } else {
                    every
                };
                if st.commits % every == 0 {
                    // A round that cannot finish (a conflict, a full pool) is retried later.
                    let _ = self.collect_garbage();
                }
            }
        }
        self.park();
        Ok(ts)
    }

    fn abort(&mut self) {
        self.abort_txn();
        self.park();
    }

    fn resolve_miss(&mut self, error: TxError) -> TxError {
        let (TxError::NotFound { table, key } | TxError::DuplicateKey { table, key }) = error
        else {
            return error;
        };
        if self.find_write(table, key).is_some() {
            return error;
        }
        let Some(t) = self.tables.get(table as usize) else {
            return error;
        };
        // A miss that a younger commit (a delete, or a version this transaction may not see)
        // or one in flight explains is a stale view: retry rather than fail.
        let stale = t.deleted_up_to.load(Ordering::Acquire) > self.ts
            || t.index.get(key).is_some_and(|head| {
                let h = self.eng.header(head);
                h.state.load(Ordering::Acquire) & state::PENDING != 0
                    || h.begin.load(Ordering::Acquire) > self.ts
            });
        if stale {
            TxError::Conflict
        } else {
            error
        }
    }
}

impl Drop for FirWorker {
    fn drop(&mut self) {
        if self.in_txn && !std::thread::panicking() {
            self.abort();
        }
        let mut slot = self.eng.slots[self.thread].lock();
        if let Some(mut state) = self.state.take() {
            state.owned = false;
            *slot = Some(state);
        } else if let Some(state) = slot.as_mut() {
            state.owned = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Engine;

    /// Region blocks of worker slot `thread`.
    fn blocks_of(eng: &FirEngine, thread: usize) -> usize {
        eng.pages
            .allocated(&eng.pool)
            .unwrap()
            .iter()
            .filter(|(_, tag)| tag.kind == super::super::layout::kind::BLOCK)
            .filter(|(_, tag)| usize::from(tag.owner) == thread)
            .count()
    }

    /// A live worker owns its slot between transactions (`ThreadState::owned`, its state parked
    /// in `FirEngine::slots`): a second worker for the slot and a table drop are refused, with
    /// an error naming the slot, before and after a transaction; once it is dropped, both
    /// succeed.
    #[test]
    fn a_parked_worker_keeps_its_slot_from_a_second_worker_and_a_table_drop() {
        let (eng, t) = super::super::test_engine(2, false, |_| {});
        let refused = |eng: &Arc<FirEngine>| {
            match FirWorker::new(eng.clone(), 0) {
                Err(DbError::Config(m)) => assert!(m.contains("slot 0"), "{m}"),
                Err(e) => panic!("a second worker for slot 0: {e}"),
                Ok(_) => panic!("a second worker took slot 0 from a live one"),
            }
            match eng.drop_table(t) {
                Err(DbError::Config(m)) => assert!(m.contains("worker slot 0 is in use"), "{m}"),
                other => panic!("a drop with a live worker: {other:?}"),
            }
        };
        let mut w = FirWorker::new(eng.clone(), 0).unwrap();
        refused(&eng);
        w.begin(false);
        w.insert(t, 1, &7u64.to_le_bytes()).unwrap();
        w.commit().unwrap();
        refused(&eng);
        // The refused drops left the table live.
        w.begin(true);
        let mut row = [0u8; 8];
        w.read(t, 1, &mut row).unwrap();
        w.commit().unwrap();
        assert_eq!(u64::from_le_bytes(row), 7);
        drop(w);
        drop(FirWorker::new(eng.clone(), 0).unwrap());
        eng.drop_table(t).unwrap();
        assert!(!eng.catalog().tables[t as usize].is_live());
    }

    /// Inserts rows 0 to `rows` − 1 of `t` (value 0), 64 per transaction.
    fn insert_rows(w: &mut FirWorker, t: TableId, rows: u64) {
        for chunk in 0..rows / 64 {
            w.begin(false);
            for k in chunk * 64..(chunk + 1) * 64 {
                w.insert(t, k, &0u64.to_le_bytes()).unwrap();
            }
            w.commit().unwrap();
        }
    }

    /// Rewrites every one of `rows` rows of `t` with `value`, 16 per transaction.
    fn rewrite_rows(w: &mut FirWorker, t: TableId, rows: u64, value: u64) {
        for chunk in 0..rows / 16 {
            w.begin(false);
            for k in chunk * 16..(chunk + 1) * 16 {
                let write = FieldWrite {
                    offset: 0,
                    bytes: &value.to_le_bytes(),
                };
                w.update(t, k, &[write]).unwrap();
            }
            w.commit().unwrap();
        }
    }

    /// Issue 14: while the background checkpointer runs, a GC round leaves §4.5's stage-2
    /// checkpoint to it instead of taking one on the worker (a checkpoint of a large index held
    /// the worker's transactions for its whole length, every round): the emptied blocks wait
    /// for its next checkpoint and a round after that frees them. Once room is nearly gone, the
    /// round takes it again (the writers wait: back-pressure).
    #[test]
    fn gc_leaves_its_checkpoint_to_the_background_checkpointer() {
        let (eng, t) = super::super::test_engine(1, true, |config| {
            config.block_slots = Some(64);
            config.gc_every_commits = Some(4);
            // Running, but its interval does not come up during the test.
            config.checkpoint_interval = Some(std::time::Duration::from_secs(3600));
        });
        assert!(eng.checkpointer_running.load(Ordering::Acquire));
        let mut w = FirWorker::new(eng.clone(), 0).unwrap();
        insert_rows(&mut w, t, 640);
        // The loaded blocks become wholly obsolete; region blocks stay under 85 % of the pool.
        rewrite_rows(&mut w, t, 640, 1);
        let stats = eng.gc_stats();
        assert!(stats.rounds > 0, "{stats:?}");
        assert_eq!(
            eng.checkpoints_taken(),
            0,
            "a GC round took its checkpoint on the worker ({stats:?})"
        );
        assert_eq!(
            stats.blocks_freed, 0,
            "freed before a checkpoint: {stats:?}"
        );
        let before = blocks_of(&eng, 0);
        // The checkpointer's next checkpoint, then a round frees what it covers.
        eng.checkpoint().unwrap();
        rewrite_rows(&mut w, t, 64, 2);
        let freed = eng.gc_stats().blocks_freed;
        assert!(freed > 0, "{:?}", eng.gc_stats());
        assert!(blocks_of(&eng, 0) < before);
        // Room nearly gone: a round that empties blocks takes the checkpoint and frees them.
        eng.gc
            .blocks_in_use
            .store(eng.pages.page_count(), Ordering::Relaxed);
        rewrite_rows(&mut w, t, 640, 3);
        assert!(eng.checkpoints_taken() > 1, "{:?}", eng.gc_stats());
        rewrite_rows(&mut w, t, 64, 4);
        assert!(eng.gc_stats().blocks_freed > freed, "{:?}", eng.gc_stats());
        let mut row = [0u8; 8];
        w.begin(true);
        for k in 0..640u64 {
            w.read(t, k, &mut row).unwrap();
            assert_eq!(
                u64::from_le_bytes(row),
                if k < 64 { 4 } else { 3 },
                "key {k}"
            );
        }
        w.commit().unwrap();
        drop(w);
        assert_eq!(eng.check_structure().unwrap(), vec![640]);
    }

    /// §4.5 with a worker that stopped writing: slot 0 loads 640 rows (10 blocks of 64 slots)
    /// and then idles (alive between transactions, or gone); slot 1 rewrites every row, so slot
    /// 0's blocks become wholly obsolete. Only a GC round of slot 1 can collect them (slot 0
    /// runs none): they are freed, slot 0 writes again afterwards, and every row reads back.
    #[test]
    fn gc_collects_the_regions_of_a_worker_that_stopped_writing() {
        for keep_alive in [true, false] {
            let (eng, t) = super::super::test_engine(2, true, |config| {
                config.block_slots = Some(64);
                config.gc_every_commits = Some(4);
            });
            let mut a = FirWorker::new(eng.clone(), 0).unwrap();
            insert_rows(&mut a, t, 640);
            assert_eq!(blocks_of(&eng, 0), 10);
            let a = if keep_alive {
                Some(a)
            } else {
                drop(a);
                None
            };
            let mut b = FirWorker::new(eng.clone(), 1).unwrap();
            for round in 1..=3u64 {
                rewrite_rows(&mut b, t, 640, round);
            }
            let stats = eng.gc_stats();
            assert!(
                stats.idle_slot_rounds > 0,
                "keep_alive {keep_alive}: {stats:?}"
            );
            // The block being filled stays (a region always has one to append to).
            assert!(
                blocks_of(&eng, 0) <= 1,
                "keep_alive {keep_alive}: slot 0 keeps {} blocks ({stats:?})",
                blocks_of(&eng, 0)
            );
            let mut a = a.unwrap_or_else(|| FirWorker::new(eng.clone(), 0).unwrap());
            a.begin(false);
            a.insert(t, 5000, &9u64.to_le_bytes()).unwrap();
            a.update(
                t,
                7,
                &[FieldWrite {
                    offset: 0,
                    bytes: &9u64.to_le_bytes(),
                }],
            )
            .unwrap();
            a.commit().unwrap();
            let mut row = [0u8; 8];
            b.begin(true);
            for k in (0..640u64).chain([5000]) {
                b.read(t, k, &mut row).unwrap();
                let want = if k == 7 || k == 5000 { 9 } else { 3 };
                assert_eq!(u64::from_le_bytes(row), want, "key {k}");
            }
            b.commit().unwrap();
            drop((a, b));
            assert_eq!(eng.check_structure().unwrap(), vec![641]);
        }
    }
}
