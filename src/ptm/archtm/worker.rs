//! ArchTM's transaction operations (§5.3, Algorithms 1 and 2) for one thread slot.

use super::layout::{block_bytes, header, is_large, state, Header, BLOCK};
use super::retire::{tomb_len, TOMB, TOMB_OWN_BLOCK};
use super::table::{current_offset, dstate, EntryRef, EntryView};
use super::{txstate_word, ArchtmFault, Inner, MAX_OBJECT};
use crate::ptm::{PtmError, PtmWorker};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The largest new version (header and payload) that a first write builds in DRAM and
/// streams to PM ([`Pool::write_bytes_nt`](crate::pmem::Pool::write_bytes_nt)): one cache
/// line (a hash node). Streamed B+-tree nodes (232 and 288 bytes, a partial last line)
/// measured 0.76–0.99× the old update latency (p50, 3 rounds, loaded machine), the hash
/// table's updates 1.2–1.6×, with the other changes of the same build.
const STREAM_MAX: usize = 64;

/// One thread slot's transactions.
pub(crate) struct ArchtmWorker {
    eng: Arc<Inner>,
    slot: usize,
    ts: u64,
    txid: u64,
    running: bool,
    /// §5.1's write-set: ids of the objects this transaction locked (each once: an entry whose
    /// writer is this txid is already in it).
    write_set: Vec<u64>,
    /// The engine's reserved slot ([`Inner::internal_slot`]), never handed to a user thread.
    internal: bool,
    /// The slot's tombstone reserve was topped up for this worker: frees of an earlier worker
    /// on the slot may have used it. Done at the worker's first transaction (a take outside
    /// one could race a checkpoint's CHKP-diff of the lists).
    tomb_reserve_filled: bool,
}

fn entry(eng: &Inner, h: u64) -> Result<(EntryRef<'_>, u64, u64), PtmError> {
    let (id, gen) = (h & 0xffff_ffff, h >> 32);
    if gen == 0 {
        return Err(invalid(h, "the null handle (or not a handle)"));
    }
    let e = eng
        .table
        .get(id)
        .ok_or_else(|| invalid(h, "no object has this id"))?;
    Ok((e, id, gen))
}

/// The entry of `h` and its fields, if the handle's generation is the live one.
fn live_entry(eng: &Inner, h: u64) -> Result<(EntryRef<'_>, u64, u64, EntryView), PtmError> {
    let (e, id, gen) = entry(eng, h)?;
    let v = e.view();
    if v.gen != gen {
        return Err(invalid(
            h,
            "no live object with this handle (freed, or never allocated)",
        ));
    }
    Ok((e, id, gen, v))
}

fn invalid(h: u64, reason: impl Into<String>) -> PtmError {
    PtmError::InvalidHandle {
        handle: h,
        reason: reason.into(),
    }
}

impl ArchtmWorker {
    /// A worker on user slot `slot` (taken from the free slots; given back on drop).
    pub(crate) fn new(eng: Arc<Inner>, slot: usize) -> ArchtmWorker {
        Self::on_slot(eng, slot, false)
    }

    /// A worker on the engine's reserved slot, for its own transactions (defragmentation's
    /// mock transactions, the root object's creation). One at a time: the callers hold
    /// `Inner::defrag_lock`, or run before any other thread can.
    pub(crate) fn internal(eng: Arc<Inner>) -> ArchtmWorker {
        let slot = eng.internal_slot();
        Self::on_slot(eng, slot, true)
    }

    fn on_slot(eng: Arc<Inner>, slot: usize, internal: bool) -> ArchtmWorker {
        ArchtmWorker {
            eng,
            slot,
            ts: 0,
            txid: 0,
            running: false,
            write_set: Vec::new(),
            internal,
            tomb_reserve_filled: false,
        }
    }

    /// Under the crash simulator, after the simulated power failure, a thread waiting for
    /// another (which unwound at its next PM event and will never finish) stops too. Every
    /// wait or retry loop calls it: a loop that reaches no PM event would otherwise spin on a
    /// peer that is gone.
    fn stop_if_crashed(&self) {
        self.eng.pool.unwind_if_crashed();
    }

    /// Alg. 1 APT_TX_READ: the offset and size of the version of `h` this transaction sees
    /// (lock-free). `Err` if it sees none.
    #[inline]
    fn resolve(&self, h: u64) -> Result<(u64, u64), PtmError> {
        match self.current_version(h) {
            Some(version) => Ok(version),
            None => self.resolve_in_entry(h),
        }
    }

    /// `resolve` from the lookup-table entry: a writer holds the object (Alg. 1 lines 10–14),
    /// or the handle names no live object. Out of line, so the common case stays small.
    #[inline(never)]
    fn resolve_in_entry(&self, h: u64) -> Result<(u64, u64), PtmError> {
        let (e, _, gen) = entry(&self.eng, h)?;
        loop {
            let v = e.view();
            if v.gen != gen {
                return Err(invalid(
                    h,
                    "no live object with this handle (freed, or never allocated)",
                ));
            }
            let off = if v.new == 0 {
                v.old
            } else if v.writer == self.txid {
                v.new
            } else if v.ccid != 0 {
                // Committed, not yet retired (`retire`): Alg. 1 line 13 with the commit id
                // the entry carries.
                if v.ccid <= self.ts {
                    v.new
                } else {
                    v.old
                }
            } else {
                let ws = &self.eng.slots[(v.writer & 0xff) as usize];
                let st = ws.state.load(Ordering::Acquire);
                if st >> 2 != v.writer >> 8 || st & 3 == dstate::END {
                    // The writer finished since the view, so the entry changed: read it again.
                    // A writer that died in a simulated crash never changes it: stop then.
                    self.stop_if_crashed();
                    std::hint::spin_loop();
                    continue;
                }
                match st & 3 {
                    dstate::COMMITTING => {
                        self.stop_if_crashed();
                        std::hint::spin_loop();
                        continue;
                    }
                    dstate::COMMITTED if ws.cid.load(Ordering::Acquire) <= self.ts => v.new,
                    _ => v.old,
                }
            };
            if off == 0 {
                return Err(invalid(
                    h,
                    "the object is not committed in this transaction's snapshot",
                ));
            }
            if off & TOMB != 0 {
                return Err(invalid(h, "the object is freed"));
            }
            return Ok((off, v.size));
        }
    }

    /// Alg. 1 line 9 (`obj.new == NULL`: the committed version), the common case of a read:
    /// the offset and size of `h`'s committed version from the id's current word, which is
    /// set only while no transaction holds the object (`table` says why); the size from the
    /// version's header, in the cache line the read loads next anyway. `None`: the entry
    /// decides (a writer holds the object, or the handle is not live).
    #[inline]
    fn current_version(&self, h: u64) -> Option<(u64, u64)> {
        let word = self.eng.table.current(h & 0xffff_ffff)?;
        let off = current_offset(word, h >> 32)?;
        let size = self.eng.pool.read_u64(off + header::SIZE_FLAGS) & 0xffff_ffff;
        Some((off, size))
    }

    /// Copies bytes `[offset, offset + dst.len())` of the payload of the version at `off` of
    /// an object of `size` bytes (checked) into `dst`: one copy for a small object, without
    /// building the span list (`payload_spans`) a large one needs.
    #[inline]
    fn read_payload(
        &self,
        h: u64,
        (off, size): (u64, u64),
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), PtmError> {
        check_bounds(h, offset, dst.len(), size)?;
        if !is_large(size) {
            self.eng
                .pool
                .read_bytes(off + header::BYTES + offset as u64, dst);
            return Ok(());
        }
        let mut at = 0;
        for (pm, n) in self
            .eng
            .payload_spans(off, size, offset as u64, dst.len() as u64)
        {
            self.eng.pool.read_bytes(pm, &mut dst[at..at + n as usize]);
            at += n as usize;
        }
        Ok(())
    }

    fn write_header(&self, off: u64, h: &Header) {
        self.eng
            .pool
            .write_bytes(off, &h.encode(off, self.eng.salt));
    }

    /// When a commit awaiting retirement (`retire`) holds `e`: retires it and takes the lock
    /// (true), if it can. This slot's own commit is retired waiting for the transactions
    /// older than it, which cannot be waiting for us (their start is below its commit id,
    /// ours above); another slot's only if ready (a commit nobody retires would otherwise
    /// keep the object locked once its thread stops running transactions).
    fn retire_holder(&self, e: &EntryRef<'_>) -> bool {
        let holder = e.writer.load(Ordering::Acquire);
        let slot = (holder & 0xff) as usize;
        if holder == 0 || slot >= self.eng.slots.len() {
            return false;
        }
        if slot == self.slot {
            self.eng.retire(slot, true);
        } else if e.ccid.load(Ordering::Acquire) != 0 {
            self.eng.retire(slot, false);
        } else {
            return false;
        }
        e.lock(self.txid)
    }

    /// Takes `e`'s write lock (Alg. 1 line 23; no-wait: a held lock is a conflict) and checks
    /// that the object is still the committed one the handle names.
    fn lock_committed(&self, e: &EntryRef<'_>, h: u64, gen: u64) -> Result<EntryView, PtmError> {
        if !e.lock(self.txid) && !self.retire_holder(e) {
            return Err(PtmError::Conflict {
                handle: h,
                retries: 0,
            });
        }
        let v = e.view();
        if v.gen != gen || v.old == 0 {
            e.unlock();
            return Err(invalid(
                h,
                "no live object with this handle (freed, or never allocated)",
            ));
        }
        Ok(v)
    }

    /// Alg. 1 APT_TX_WRITE for a write of `src` at byte `offset` (checked against the
    /// object's size here: the one bounds check of a write): the offset and size of this
    /// transaction's copy of `h`, made on first use, and whether `src` is in it already. Each
    /// byte of the new version reaches PM once: a copy up to [`STREAM_MAX`] bytes is built in
    /// DRAM with `src` in place and streamed to PM; a larger one holds every payload byte but
    /// those of `src`, which the caller stores next.
    fn copy_for_write(
        &mut self,
        h: u64,
        offset: usize,
        src: &[u8],
    ) -> Result<(u64, u64, bool), PtmError> {
        let len = src.len();
        let (e, id, gen, v) = live_entry(&self.eng, h)?;
        let own = v.writer == self.txid;
        if own && v.new & TOMB != 0 {
            return Err(invalid(h, "the object is freed by this transaction"));
        }
        // A generation names one life of an object, of one size: the size seen here is the
        // locked version's too (`lock_committed` refuses another generation).
        check_bounds(h, offset, len, v.size)?;
        if own {
            return Ok((v.new, v.size, false));
        }
        let v = self.lock_committed(&e, h, gen)?;
        let off = match self.eng.alloc_version(self.slot, v.size) {
            Ok(off) => off,
            Err(err) => {
                e.unlock();
                return Err(err);
            }
        };
        let hdr = Header {
            id: id as u32,
            gen: gen as u32,
            size: v.size,
            tomb: false,
            txid: self.txid,
        };
        let bytes = (header::BYTES + v.size) as usize;
        let streamed = bytes <= STREAM_MAX;
        if streamed {
            // The block is cold (recycled or fresh) and nobody reads the copy before commit:
            // streaming stores skip reading its lines first, and need no flush (durable at
            // the commit's fence, like a store and its flush; Zen and Falcon stream their new
            // versions too).
            let mut buf = [0u8; STREAM_MAX];
            let b = &mut buf[..bytes];
            b[..header::BYTES as usize].copy_from_slice(&hdr.encode(off, self.eng.salt));
            let payload = &mut b[header::BYTES as usize..];
            self.eng.pool.read_bytes(v.old + header::BYTES, payload);
            payload[offset..offset + len].copy_from_slice(src);
            self.eng.pool.write_bytes_nt(off, b);
        } else {
            self.write_header(off, &hdr);
            let skip = offset as u64..(offset + len) as u64;
            self.eng.copy_payload_except(v.old, off, v.size, skip);
        }
        e.modify(|e| e.new.store(off, Ordering::Release));
        self.write_set.push(id);
        Ok((off, v.size, streamed))
    }

    /// Alg. 2 APT_TX_POST_COMMIT: queues the commit for retirement (`retire`) and retires
    /// what is ready; the engine's own transactions wait for theirs.
    fn post_commit(&mut self, cid: u64) {
        self.eng.post_commit(
            self.slot,
            cid,
            self.txid,
            &mut self.write_set,
            self.internal,
        );
        let pending = self.eng.alloc.dealloc[self.slot].lock().len();
        self.end();
        if pending > self.eng.gc_threshold {
            // §5.4: the GC thread collects; without one, the committing thread does.
            if self.eng.signal.gc_thread.load(Ordering::Acquire) {
                self.eng.signal.want_gc();
            } else {
                self.eng.gc();
            }
        }
        self.eng.maybe_checkpoint();
    }

    fn end(&mut self) {
        let s = &self.eng.slots[self.slot];
        s.state.store(self.ts << 2 | dstate::END, Ordering::Release);
        s.active.store(u64::MAX, Ordering::Release);
        s.busy.store(0, Ordering::Release);
        self.write_set.clear();
        self.running = false;
    }

    /// Waits while a checkpoint is pending (§5.6 blocks new transactions), then marks the slot
    /// busy. Busy first, then the check: a checkpoint that set `pending` before our check sees
    /// us busy or we see it pending (both SeqCst).
    fn enter(&self) {
        let (s, c) = (&self.eng.slots[self.slot], &self.eng.chkp);
        loop {
            s.busy.store(1, Ordering::SeqCst);
            if !c.pending.load(Ordering::SeqCst) {
                return;
            }
            s.busy.store(0, Ordering::SeqCst);
            while c.pending.load(Ordering::SeqCst) {
                self.stop_if_crashed();
                std::thread::yield_now();
            }
        }
    }

    /// After a simulated power failure (no PM event may run): unlocks the entries this
    /// transaction still holds, in DRAM only, so that no thread of the dead process waits on a
    /// writer that is gone (the crash image is already taken; this changes nothing on PM).
    fn release_after_crash(&mut self) {
        for &id in &self.write_set {
            let Some(e) = self.eng.table.get(id) else {
                continue;
            };
            if e.writer.load(Ordering::Acquire) == self.txid {
                e.modify(|e| e.new.store(0, Ordering::Release));
                e.unlock();
            }
        }
        let s = &self.eng.slots[self.slot];
        s.active.store(u64::MAX, Ordering::SeqCst);
        s.busy.store(0, Ordering::SeqCst);
        self.write_set.clear();
        self.running = false;
    }
}

impl PtmWorker for ArchtmWorker {
    fn begin(&mut self) {
        if self.running {
            self.abort();
        }
        self.enter();
        // Earlier commits whose older transactions have all finished since (`retire`).
        self.eng.retire(self.slot, false);
        let s = &self.eng.slots[self.slot];
        // 0 first: a committer scanning for older transactions waits for one that is taking
        // its timestamp (it may get one below the commit id). Release is enough for both
        // stores: a committer whose commit id is above our timestamp took it with a
        // read-modify-write of the clock after ours, so it sees our 0 (ours releases it) or a
        // later value; one whose commit id is below need not wait for us.
        s.active.store(0, Ordering::Release);
        self.ts = self.eng.clock.fetch_add(1, Ordering::SeqCst);
        s.active.store(self.ts, Ordering::Release);
        self.txid = self.ts << 8 | self.slot as u64;
        s.state
            .store(self.ts << 2 | dstate::BEGIN, Ordering::Release);
        self.write_set.clear();
        self.running = true;
        if !self.tomb_reserve_filled {
            self.tomb_reserve_filled = true;
            self.eng.fill_tomb_reserve(self.slot);
        }
    }

    fn read(&mut self, h: u64, offset: usize, dst: &mut [u8]) -> Result<(), PtmError> {
        let version = self.resolve(h)?;
        self.read_payload(h, version, offset, dst)
    }

    fn write(&mut self, h: u64, offset: usize, src: &[u8]) -> Result<(), PtmError> {
        let (off, size, written) = self.copy_for_write(h, offset, src)?;
        if written {
            return Ok(());
        }
        let mut at = 0;
        for (pm, n) in self
            .eng
            .payload_spans(off, size, offset as u64, src.len() as u64)
        {
            self.eng.pool.write_bytes(pm, &src[at..at + n as usize]);
            at += n as usize;
        }
        Ok(())
    }

    fn alloc(&mut self, init: &[u8]) -> Result<u64, PtmError> {
        let size = init.len() as u64;
        if size > MAX_OBJECT {
            return Err(PtmError::TooLarge(format!(
                "an object of {size} bytes is larger than the largest object ({MAX_OBJECT} bytes)"
            )));
        }
        let id = match self.eng.id_lists[self.slot].lock().pop() {
            Some(id) => u64::from(id),
            None => self.eng.table.next_id.fetch_add(1, Ordering::AcqRel),
        };
        let eng = &*self.eng;
        let Some(e) = eng.table.get(id) else {
            return Err(PtmError::PoolFull {
                bytes: init.len(),
                detail: format!("all {} object ids are in use", self.eng.table.capacity()),
            });
        };
        if !e.lock(self.txid) {
            return Err(PtmError::Conflict {
                handle: id,
                retries: 0,
            });
        }
        let off = match self.eng.alloc_version(self.slot, size) {
            Ok(off) => off,
            Err(err) => {
                e.unlock();
                self.eng.id_lists[self.slot].lock().push(id as u32);
                return Err(err);
            }
        };
        // The generation: the low 32 bits of the allocating timestamp (never 0), so a handle
        // of an earlier life of the id is refused, across restarts too.
        let gen = (self.ts as u32).max(1);
        let hdr = Header {
            id: id as u32,
            gen,
            size,
            tomb: false,
            txid: self.txid,
        };
        self.write_header(off, &hdr);
        let mut at = 0;
        for (pm, n) in self.eng.payload_spans(off, size, 0, size) {
            self.eng.pool.write_bytes(pm, &init[at..at + n as usize]);
            at += n as usize;
        }
        e.modify(|e| {
            e.gen.store(u64::from(gen), Ordering::Release);
            e.size.store(size, Ordering::Release);
            e.old.store(0, Ordering::Release);
            e.new.store(off, Ordering::Release);
        });
        self.write_set.push(id);
        Ok(u64::from(gen) << 32 | id)
    }

    fn free(&mut self, h: u64) -> Result<(), PtmError> {
        if h == self.eng.root {
            return Err(invalid(h, "the root object cannot be freed"));
        }
        let eng = &*self.eng;
        let (e, id, gen, v) = live_entry(eng, h)?;
        let tomb = Header {
            id: id as u32,
            gen: gen as u32,
            size: 0,
            tomb: true,
            txid: self.txid,
        };
        if v.writer == self.txid {
            if v.new & TOMB != 0 {
                return Err(invalid(
                    h,
                    "the object is already freed by this transaction",
                ));
            }
            if !is_large(v.size) {
                // The transaction's own copy becomes the tombstone.
                self.write_header(v.new, &tomb);
                e.modify(|e| e.new.store(v.new | TOMB, Ordering::Release));
                return Ok(());
            }
            // A large copy is dropped at once (its pages are ours alone: invalid on PM before
            // they go back), and the tombstone takes a block of its own.
            let off = self.eng.alloc_tomb(self.slot)?;
            self.eng.pool.fill(v.new, 0, header::BYTES);
            self.eng.persist(v.new, header::BYTES);
            self.eng.free_large(v.new);
            self.write_header(off, &tomb);
            e.modify(|e| e.new.store(off | TOMB | TOMB_OWN_BLOCK, Ordering::Release));
            return Ok(());
        }
        self.lock_committed(&e, h, gen)?;
        let off = match self.eng.alloc_tomb(self.slot) {
            Ok(off) => off,
            Err(err) => {
                e.unlock();
                return Err(err);
            }
        };
        self.write_header(off, &tomb);
        e.modify(|e| e.new.store(off | TOMB | TOMB_OWN_BLOCK, Ordering::Release));
        self.write_set.push(id);
        Ok(())
    }

    fn size_of(&mut self, h: u64) -> Result<usize, PtmError> {
        self.resolve(h).map(|(_, size)| size as usize)
    }

    fn commit(&mut self) -> Result<(), PtmError> {
        if self.write_set.is_empty() {
            // Read-only: nothing to persist (Alg. 2 line 2).
            self.end();
            return Ok(());
        }
        let eng = &*self.eng;
        if eng.flushing && eng.fault != Some(ArchtmFault::SkipCopyFlush) {
            // archtm-copy-flush (Alg. 2 line 4)
            for &id in &self.write_set {
                let v = eng.table.get(id).expect("a locked id").view();
                if v.new & TOMB != 0 {
                    eng.pool.flush(v.new & !(BLOCK - 1), header::BYTES);
                } else {
                    for (off, len) in eng.version_extents(v.new, v.size) {
                        eng.pool.flush(off, len);
                    }
                }
            }
        }
        if eng.fault != Some(ArchtmFault::SkipCopyFence) {
            // archtm-copy-fence (Alg. 2 line 5): every copy durable before COMMITTED.
            eng.pool.fence();
        }
        let s = &eng.slots[self.slot];
        // Release: a reader whose timestamp is at least `cid` took it from the clock after
        // the read-modify-write below, so it sees COMMITTING (or later).
        s.state
            .store(self.ts << 2 | dstate::COMMITTING, Ordering::Release);
        let cid = eng.clock.fetch_add(1, Ordering::SeqCst);
        // The slot's TxState now names this txid: every copy of the slot annotated with it or
        // an earlier one is committed (recovery's rule; `mod.rs`, "TxState"). The transaction
        // wrote nothing to PM before its first copy (no durable BEGIN).
        let at = eng.txstate_at(self.slot);
        eng.pool.write_u64(at + 8, cid);
        eng.pool
            .write_u64_ordered(at, txstate_word(self.txid, state::COMMITTED));
        if eng.fault != Some(ArchtmFault::SkipCommitPersist) {
            // archtm-commit-persist (Alg. 2 lines 7-8): durable before commit returns.
            eng.persist(at, 16);
        }
        // The entries carry the commit id until their retirement, which may come after this
        // slot's next transaction has reused its state (`retire`).
        for &id in &self.write_set {
            let e = eng.table.get(id).expect("a locked id");
            e.modify(|e| e.ccid.store(cid, Ordering::Release));
        }
        s.cid.store(cid, Ordering::Release);
        s.state
            .store(self.ts << 2 | dstate::COMMITTED, Ordering::Release);
        s.active.store(u64::MAX, Ordering::Release);
        self.post_commit(cid);
        Ok(())
    }

    fn abort(&mut self) {
        if !self.running {
            return;
        }
        let eng = &*self.eng;
        if !self.write_set.is_empty() {
            let keep = eng.fault == Some(ArchtmFault::AbortKeepsCopies);
            let mut blocks = Vec::with_capacity(self.write_set.len());
            let mut large = Vec::new();
            for &id in &self.write_set {
                let v = eng.table.get(id).expect("a locked id").view();
                let off = v.new & !(BLOCK - 1);
                if !keep {
                    eng.pool.fill(off, 0, header::BYTES);
                    if eng.flushing {
                        eng.pool.flush(off, header::BYTES);
                    }
                }
                if v.new & TOMB != 0 {
                    blocks.push((off, tomb_len(v.new, v.size)));
                } else if is_large(v.size) {
                    large.push(off);
                } else {
                    blocks.push((off, block_bytes(v.size)));
                }
            }
            if !keep {
                // archtm-abort-invalidate: the copies are invalid on PM before a later commit
                // of this slot can name a txid above theirs (which would make them committed).
                eng.pool.fence();
            }
            for &id in &self.write_set {
                let e = eng.table.get(id).expect("a locked id");
                let fresh = e.view().old == 0;
                e.modify(|e| {
                    e.new.store(0, Ordering::Release);
                    if fresh {
                        e.gen.store(0, Ordering::Release);
                        e.size.store(0, Ordering::Release);
                    }
                });
                e.unlock();
                if fresh {
                    eng.id_lists[self.slot].lock().push(id as u32);
                }
            }
            eng.alloc
                .give_back(self.slot, blocks, eng.keeps_tomb_reserve(self.slot));
            // After the fence above: the copies' headers are invalid on PM.
            for off in large {
                eng.free_large(off);
            }
        }
        self.end();
    }
}

#[inline]
fn check_bounds(h: u64, offset: usize, len: usize, size: u64) -> Result<(), PtmError> {
    if offset
        .checked_add(len)
        .map_or(true, |end| end as u64 > size)
    {
        return Err(out_of_bounds(h, offset, len, size));
    }
    Ok(())
}

/// `check_bounds`' error, out of line: every read and write checks, almost none fails.
#[cold]
fn out_of_bounds(h: u64, offset: usize, len: usize, size: u64) -> PtmError {
    PtmError::TooLarge(format!(
        "bytes {offset}..{} of object {h:#x}, which has {size}",
        offset.saturating_add(len)
    ))
}

impl Drop for ArchtmWorker {
    fn drop(&mut self) {
        let crashed = self.eng.pool.crash_sim().is_some_and(|s| s.has_crashed());
        if self.running && !crashed {
            self.abort();
        } else if self.running {
            self.release_after_crash();
        }
        if !crashed {
            // No commit of this slot stays locked once its worker is gone.
            self.eng.retire(self.slot, true);
        }
        if !self.internal {
            self.eng.free_slots.lock().push(self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::pmem::stats::thread_snapshot;
    use crate::ptm::{Ptm, PtmConfig, PtmError, PtmWorker};

    const SIZE: usize = 200;

    fn pattern(seed: u8) -> Vec<u8> {
        (0..SIZE as u8).map(|i| i.wrapping_mul(7) ^ seed).collect()
    }

    fn read_all(w: &mut Box<dyn PtmWorker>, h: u64) -> Vec<u8> {
        w.begin();
        let mut v = vec![0u8; SIZE];
        w.read(h, 0, &mut v).unwrap();
        w.commit().unwrap();
        v
    }

    /// PM bytes `f` stores on this thread (inline background: nothing runs elsewhere).
    fn pm_bytes(f: impl FnOnce()) -> u64 {
        let before = thread_snapshot().bytes_written;
        f();
        thread_snapshot().bytes_written - before
    }

    /// §4.1's copy on first write stores each byte of the new version once: a transaction
    /// writing an object (whole, or in part) stores the copy's header (32) and payload (200),
    /// and the commit id and COMMITTED (16), whatever it overwrites (no BEGIN); the bytes
    /// around a partial write keep the committed values, and a write out of bounds fails
    /// without leaving a hole in the copy.
    #[test]
    fn a_write_stores_each_byte_of_the_new_version_once() {
        let mut config = PtmConfig::temporary().size(16 << 20).inline_background();
        config.checkpoint_every = 0;
        config.gc_threshold = usize::MAX;
        let ptm = Ptm::<u64>::create(config).unwrap();
        let mut w = ptm.engine().worker().unwrap();
        w.begin();
        let h = w.alloc(&pattern(0)).unwrap();
        w.commit().unwrap();
        // The slot takes its blocks of this size class now, not in a measured transaction.
        w.begin();
        w.write(h, 0, &pattern(1)).unwrap();
        w.commit().unwrap();
        let version = 32 + SIZE as u64 + 16;
        let whole = pm_bytes(|| {
            w.begin();
            w.write(h, 0, &pattern(2)).unwrap();
            w.commit().unwrap();
        });
        assert_eq!(whole, version, "a whole-object write");
        let mut expect = pattern(2);
        assert_eq!(read_all(&mut w, h), expect);
        let partial = pm_bytes(|| {
            w.begin();
            match w.write(h, SIZE - 4, &[0xee; 8]) {
                Err(PtmError::TooLarge(m)) => assert!(m.contains("which has 200"), "{m}"),
                r => panic!("an out-of-bounds write: {r:?}"),
            }
            w.write(h, 100, &[0xab; 8]).unwrap();
            w.write(h, 3, &[0xcd; 2]).unwrap();
            w.commit().unwrap();
        });
        assert_eq!(
            partial,
            version + 2,
            "a partial write, then 2 bytes into the same copy"
        );
        expect[100..108].fill(0xab);
        expect[3..5].fill(0xcd);
        assert_eq!(
            read_all(&mut w, h),
            expect,
            "the rest of the copy is the old payload"
        );
        drop(w);
        ptm.check_invariants().unwrap();
    }

    /// A commit made while an older transaction still reads returns at once and is retired
    /// later (`retire`); meanwhile a transaction that begins after it reads the new version
    /// (the current word, a read's one-load path, was cleared when the writer locked the
    /// object, and the entry carries the commit id), the older one still the old version
    /// (§5.3's snapshot), and the object stays locked; the older reader's end lets the
    /// writer's slot retire it at its next begin.
    #[test]
    fn a_commit_during_an_older_read_is_retired_after_it_and_read_by_newer_snapshots() {
        use crate::ptm::archtm::ArchTm;
        use crate::ptm::PtmEngine;
        use std::sync::atomic::Ordering;
        let config = PtmConfig::temporary()
            .size(16 << 20)
            .max_threads(3)
            .inline_background();
        let eng = ArchTm::create(&config, &[0; 8]).unwrap();
        let (mut old_reader, mut writer, mut new_reader) = (
            eng.worker().unwrap(),
            eng.worker().unwrap(),
            eng.worker().unwrap(),
        );
        writer.begin();
        let h = writer.alloc(&pattern(1)).unwrap();
        writer.commit().unwrap();
        let mut v = vec![0u8; SIZE];
        old_reader.begin();
        old_reader.read(h, 0, &mut v).unwrap();
        assert_eq!(v, pattern(1));
        writer.begin();
        writer.write(h, 0, &pattern(2)).unwrap();
        writer.commit().unwrap();
        let entry = eng.inner.table.get(h & 0xffff_ffff).unwrap();
        assert!(
            entry.writer.load(Ordering::Acquire) != 0 && entry.view().ccid != 0,
            "the commit awaits retirement, its object locked"
        );
        new_reader.begin();
        new_reader.read(h, 0, &mut v).unwrap();
        assert_eq!(v, pattern(2), "a snapshot taken after the commit");
        match new_reader.write(h, 0, &pattern(3)) {
            Err(PtmError::Conflict { .. }) => {}
            r => panic!("a write of an object awaiting retirement: {r:?}"),
        }
        new_reader.abort();
        old_reader.read(h, 0, &mut v).unwrap();
        assert_eq!(v, pattern(1), "the older snapshot");
        old_reader.commit().unwrap();
        // The writer's next begin retires the commit.
        writer.begin();
        writer.commit().unwrap();
        assert_eq!(
            entry.writer.load(Ordering::Acquire),
            0,
            "retired and unlocked"
        );
        assert_eq!(entry.view().ccid, 0);
        new_reader.begin();
        new_reader.write(h, 0, &pattern(3)).unwrap();
        new_reader.commit().unwrap();
        new_reader.begin();
        new_reader.read(h, 0, &mut v).unwrap();
        new_reader.commit().unwrap();
        assert_eq!(v, pattern(3));
        drop((old_reader, writer, new_reader));
        eng.check_invariants().unwrap();
    }
}
