//! The STM perform mode (§4.1): a TinySTM-like word-based STM on the DRAM shadow.
//!
//! Versioned locks ("stripes", a hash of the word's address) and a global clock: a read takes
//! the word from the shadow between two loads of its stripe and records the version; a version
//! newer than the transaction's snapshot extends the snapshot if everything read so far is
//! unchanged (TinySTM's timestamp extension), else the attempt aborts with a conflict that
//! [`Ptm::run`](crate::ptm::Ptm::run) retries. Writes are buffered (word → value). Commit, under
//! the engine's commit lock: lock the written stripes, validate the reads, take the next id
//! (the clock), write the words into the shadow, release the stripes with the id as their
//! version, and hand the redo log (§3.2) to the persist step in id order.
//!
//! The lock-based mode (§5, `locks.rs`) shares everything but reads, writes and commit: a read
//! or write first takes the word's stripe lock exclusively and holds it to the end (strict
//! 2PL: no cycles in the dependency graph, so one-round detecting works, §5.3), noting the
//! transaction that released the lock last as a dependency (§5.2); a lock held by another
//! transaction is waited for briefly, then the attempt aborts with a conflict (no deadlock);
//! commit writes the shadow, queues the log with its dependencies, and only then releases the
//! locks, leaving its id on them.

use super::super::log::encode_op;
use super::heap::{
    class_for, slot_bytes, Frame, Header, ALLOC_LOG, MAX_OBJECT, OFFSET_BITS, WORD_LOG,
};
use super::locks::{chain_of, encode_deps, id_of};
use super::{DudetxPtmFault, Inner};
use crate::engine::dudetx::DurabilityMode;
use crate::ptm::{PtmError, PtmWorker};
use std::collections::BTreeMap;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

/// The lock bit of a stripe.
pub(super) const LOCKED: u64 = 1 << 63;
/// Stripes (a power of two).
pub(super) const STRIPES: usize = 1 << 16;

pub(super) fn stripe(addr: u64) -> usize {
    ((addr >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize & (STRIPES - 1)
}

/// One thread's transactions.
pub(super) struct StmWorker {
    pub inner: Arc<Inner>,
    /// The snapshot: the clock when the transaction began (or was extended).
    rv: u64,
    /// (stripe, version) of every read.
    reads: Vec<(usize, u64)>,
    /// Buffered writes: word offset → (value, is a slot header).
    writes: BTreeMap<u64, (u64, bool)>,
    /// Slots allocated by this transaction (returned to the free lists if it aborts).
    allocated: Vec<(usize, u64)>,
    /// Slots freed by this transaction (returned to the free lists when it commits).
    freed: Vec<(usize, u64)>,
    /// The last frame used (saves the page-table lookup).
    frame: Option<Arc<Frame>>,
    /// Lock mode (§5): this worker's transactions' state.
    lock: Option<LockTx>,
}

/// A lock-mode transaction's locks and dependencies.
struct LockTx {
    /// The worker's chain (§5.2's thread).
    chain: usize,
    /// Stripes held.
    held: Vec<usize>,
    /// Transactions of other chains that released a lock this one took (§5.2).
    deps: Vec<u64>,
}

/// A location of an object: its header's and first byte's offsets, its size.
struct Obj {
    header_at: u64,
    at: u64,
    size: u64,
    class: usize,
    header: Header,
}

/// A heap page that could not be loaded into the shadow.
fn unloadable() -> PtmError {
    PtmError::Pool(
        "a heap page could not be loaded into the DRAM shadow: the persist/reproduce pipeline \
         has stopped"
            .into(),
    )
}

fn invalid(h: u64, reason: impl Into<String>) -> PtmError {
    PtmError::InvalidHandle {
        handle: h,
        reason: reason.into(),
    }
}

impl StmWorker {
    /// A worker; `chain`: the lock mode's chain (None: the STM).
    pub fn new(inner: Arc<Inner>, chain: Option<usize>) -> StmWorker {
        StmWorker {
            inner,
            rv: 0,
            reads: Vec::new(),
            writes: BTreeMap::new(),
            allocated: Vec::new(),
            freed: Vec::new(),
            frame: None,
            lock: chain.map(|chain| LockTx {
                chain,
                held: Vec::new(),
                deps: Vec::new(),
            }),
        }
    }

    /// Lock mode: takes the stripe of `addr` (if not held), noting who released it last
    /// (§5.2); a lock another transaction keeps is a conflict after a short wait.
    fn lock_word(&mut self, addr: u64, h: u64) -> Result<(), PtmError> {
        let Some(l) = &mut self.lock else {
            return Ok(());
        };
        let s = stripe(addr);
        let me = l.chain as u64 + 1;
        let owner = &self.inner.owners[s];
        if owner.load(Ordering::Relaxed) == me {
            return Ok(());
        }
        let mut spins = 0u32;
        while owner
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins > 2000 {
                return Err(PtmError::Conflict {
                    handle: h,
                    retries: 0,
                });
            }
            if spins > 64 {
                std::thread::yield_now();
            }
        }
        l.held.push(s);
        let last = self.inner.released_by[s].load(Ordering::Acquire);
        if last != 0 && chain_of(last) != l.chain && !l.deps.contains(&last) {
            l.deps.push(last);
        }
        Ok(())
    }

    /// Lock mode: releases every lock, leaving `id` on them when the transaction committed.
    fn unlock_all(&mut self, id: Option<u64>) {
        let Some(l) = &mut self.lock else { return };
        for s in l.held.drain(..) {
            if let Some(id) = id {
                self.inner.released_by[s].store(id, Ordering::Release);
            }
            self.inner.owners[s].store(0, Ordering::Release);
        }
        l.deps.clear();
    }

    fn frame_of(&mut self, addr: u64) -> Option<Arc<Frame>> {
        if let Some(f) = &self.frame {
            if f.contains(addr) {
                return Some(f.clone());
            }
        }
        let f = self.inner.shadow.frame(addr)?;
        self.frame = Some(f.clone());
        Some(f)
    }

    /// Whether every read is still at the version it was read at (`own`: stripes this
    /// transaction has locked itself, during commit).
    fn reads_valid(&self) -> bool {
        self.reads.iter().all(|&(s, v)| {
            let cur = self.inner.locks[s].load(Ordering::SeqCst);
            cur & !LOCKED == v
        })
    }

    /// A transactional read of the word at `addr` (in a heap page; `h` names the object, for
    /// the conflict error).
    fn read_word(&mut self, f: &Frame, addr: u64, h: u64) -> Result<u64, PtmError> {
        if let Some(&(v, _)) = self.writes.get(&addr) {
            return Ok(v);
        }
        if self.lock.is_some() {
            self.lock_word(addr, h)?;
            return Ok(f.word(addr).load(Ordering::Relaxed));
        }
        let s = stripe(addr);
        let lock = &self.inner.locks[s];
        let mut spins = 0u32;
        loop {
            let v1 = lock.load(Ordering::SeqCst);
            if v1 & LOCKED == 0 && v1 <= self.rv {
                let value = f.word(addr).load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if lock.load(Ordering::Relaxed) == v1 {
                    self.reads.push((s, v1));
                    return Ok(value);
                }
                continue;
            }
            if v1 & LOCKED != 0 {
                // A commit is writing the stripe back: it holds it only that long.
                spins += 1;
                if spins > 64 {
                    std::thread::yield_now();
                }
                continue;
            }
            // Written after our snapshot: extend the snapshot if nothing read so far changed
            // (TinySTM), else abort.
            let now = self.inner.clock.load(Ordering::SeqCst);
            if !self.reads_valid() {
                return Err(PtmError::Conflict {
                    handle: h,
                    retries: 0,
                });
            }
            self.rv = now;
        }
    }

    /// The live object `h` names (its header read transactionally, so a concurrent free
    /// conflicts).
    fn object(&mut self, h: u64) -> Result<Obj, PtmError> {
        if h == 0 {
            return Err(invalid(h, "the null handle names no object"));
        }
        let gen = h >> OFFSET_BITS;
        let at = h & ((1 << OFFSET_BITS) - 1);
        if at < 8 || at % 8 != 0 {
            return Err(invalid(h, "not the handle of an object of this pool"));
        }
        let header_at = at - 8;
        if self.inner.shadow.page(header_at).is_none() {
            return Err(invalid(h, "it points into no object page of this pool"));
        }
        let f = self.frame_of(header_at).ok_or_else(unloadable)?;
        if (header_at - f.page) % slot_bytes(f.class) != 0 {
            return Err(invalid(h, "it points into the middle of a slot"));
        }
        let w = self.read_word(&f, header_at, h)?;
        let header = Header::decode(w).ok_or_else(|| invalid(h, "its slot header is damaged"))?;
        if header.gen == 0 {
            return Err(invalid(h, "its slot was never allocated"));
        }
        if !header.live || header.gen != gen {
            return Err(invalid(h, "the object was freed"));
        }
        Ok(Obj {
            header_at,
            at,
            size: header.size,
            class: f.class,
            header,
        })
    }

    fn range(h: u64, o: &Obj, offset: usize, len: usize) -> Result<(), PtmError> {
        if offset as u64 + len as u64 > o.size {
            return Err(PtmError::TooLarge(format!(
                "{len} bytes at offset {offset} run past the end of object {h:#x} ({} bytes)",
                o.size
            )));
        }
        Ok(())
    }

    /// Buffers a write of `src` at `at` (an object of `h`; it may span shadow pages).
    fn write_bytes(&mut self, at: u64, src: &[u8], h: u64) -> Result<(), PtmError> {
        let mut i = 0usize;
        while i < src.len() {
            let addr = (at + i as u64) & !7;
            let skip = (at + i as u64 - addr) as usize;
            let n = (8 - skip).min(src.len() - i);
            let value = if n == 8 {
                u64::from_le_bytes(src[i..i + 8].try_into().expect("8 bytes"))
            } else {
                let f = self.frame_of(addr).ok_or_else(unloadable)?;
                let mut b = self.read_word(&f, addr, h)?.to_le_bytes();
                b[skip..skip + n].copy_from_slice(&src[i..i + n]);
                u64::from_le_bytes(b)
            };
            self.lock_word(addr, h)?;
            self.writes.insert(addr, (value, false));
            i += n;
        }
        Ok(())
    }

    fn clear(&mut self) {
        // A cached frame would pin its page in the shadow (§3.6 paging).
        self.frame = None;
        self.reads.clear();
        self.writes.clear();
        self.allocated.clear();
        self.freed.clear();
    }

    /// Writes the write set into the shadow frames as transaction `id` (touching the pages,
    /// §3.6); returns the change in live objects.
    fn write_shadow(&self, frames: &std::collections::HashMap<u64, Arc<Frame>>, id: u64) -> i64 {
        let mut live_delta = 0i64;
        for (&addr, &(value, header)) in &self.writes {
            let w = frames[&self.inner.shadow.frame_base(addr)].word(addr);
            if header {
                let was = Header::decode(w.load(Ordering::Relaxed)).is_some_and(|h| h.live);
                let is = Header::decode(value).is_some_and(|h| h.live);
                live_delta += i64::from(is) - i64::from(was);
            }
            w.store(value, Ordering::Relaxed);
            self.inner.shadow.touch(addr, id);
        }
        live_delta
    }

    /// The frames of the pages the transaction writes, by base (loaded if paged out).
    fn written_frames(&self) -> Result<std::collections::HashMap<u64, Arc<Frame>>, PtmError> {
        let mut frames = std::collections::HashMap::new();
        for &addr in self.writes.keys() {
            let base = self.inner.shadow.frame_base(addr);
            if let std::collections::hash_map::Entry::Vacant(e) = frames.entry(base) {
                e.insert(self.inner.shadow.frame(addr).ok_or_else(unloadable)?);
            }
        }
        Ok(frames)
    }

    /// The redo log (§3.2): data words and the allocation log (§3.5).
    fn redo_log(&self) -> Result<Vec<u8>, PtmError> {
        let mut log = Vec::with_capacity(self.writes.len() * 25);
        for (&addr, &(value, header)) in &self.writes {
            if header && self.inner.fault == Some(DudetxPtmFault::SkipAllocLog) {
                continue;
            }
            let space = if header { ALLOC_LOG } else { WORD_LOG };
            encode_op(&mut log, space, addr, Some(&value.to_le_bytes()));
        }
        let limit = super::super::pipeline::max_record_raw(self.inner.core.ring.capacity());
        if log.len() > limit {
            return Err(PtmError::TooLarge(format!(
                "the transaction's redo log of {} bytes exceeds a quarter of the DUDETx log \
                 ring ({limit} bytes): split the transaction",
                log.len()
            )));
        }
        Ok(log)
    }

    /// Lock-mode commit (§5): every lock is held, so the writes go to the shadow directly; the
    /// log, its dependency list first (§5.2), is queued while the locks are still held (so a
    /// transaction always follows those it depends on in the pipeline's queue), then the locks
    /// are released with this id; a sync commit then waits until detection finds it durable.
    fn commit_locked(&mut self) -> Result<(), PtmError> {
        let inner = self.inner.clone();
        let core = &inner.core;
        if self.writes.is_empty() {
            // Read-only: it wrote nothing a later transaction could depend on.
            self.unlock_all(None);
            self.clear();
            return Ok(());
        }
        if let Some(why) = core.failed() {
            return Err(PtmError::Pool(why));
        }
        let ops = self.redo_log()?;
        let frames = self.written_frames()?;
        let l = self.lock.as_ref().expect("lock mode");
        let chain = l.chain;
        let deps: &[u64] = if inner.fault == Some(DudetxPtmFault::LockNoDeps) {
            &[]
        } else {
            &l.deps
        };
        let mut log = Vec::with_capacity(ops.len() + 17 + deps.len() * 8);
        encode_deps(&mut log, deps);
        log.extend_from_slice(&ops);
        let id = id_of(
            chain,
            inner.chain_seq[chain].fetch_add(1, Ordering::Relaxed) + 1,
        );
        let live_delta = self.write_shadow(&frames, id);
        inner.live.fetch_add(live_delta as u64, Ordering::Relaxed);
        inner.shadow.release(&self.freed);
        core.committed.store(id, Ordering::Release);
        let queued = core.enqueue(id, log);
        self.unlock_all(Some(id));
        self.allocated.clear();
        self.clear();
        queued.map_err(PtmError::Pool)?;
        if core.config.mode == DurabilityMode::Sync {
            core.wait_durable(id).map_err(PtmError::Pool)?;
        }
        Ok(())
    }

    fn conflict(&mut self, h: u64) -> PtmError {
        PtmError::Conflict {
            handle: h,
            retries: 0,
        }
    }
}

impl PtmWorker for StmWorker {
    fn begin(&mut self) {
        self.clear();
        self.rv = self.inner.clock.load(Ordering::SeqCst);
    }

    fn read(&mut self, h: u64, offset: usize, dst: &mut [u8]) -> Result<(), PtmError> {
        let o = self.object(h)?;
        Self::range(h, &o, offset, dst.len())?;
        let at = o.at + offset as u64;
        let mut f = self.frame_of(at).ok_or_else(unloadable)?;
        let mut i = 0usize;
        while i < dst.len() {
            let addr = (at + i as u64) & !7;
            // An object may span shadow pages (§3.6: 4 KiB by default).
            if !f.contains(addr) {
                f = self.frame_of(addr).ok_or_else(unloadable)?;
            }
            let skip = (at + i as u64 - addr) as usize;
            let n = (8 - skip).min(dst.len() - i);
            let b = self.read_word(&f, addr, h)?.to_le_bytes();
            dst[i..i + n].copy_from_slice(&b[skip..skip + n]);
            i += n;
        }
        Ok(())
    }

    fn write(&mut self, h: u64, offset: usize, src: &[u8]) -> Result<(), PtmError> {
        let o = self.object(h)?;
        Self::range(h, &o, offset, src.len())?;
        self.write_bytes(o.at + offset as u64, src, h)
    }

    /// `pmalloc` (§3.5): a free slot from the DRAM free lists; its header (a new generation)
    /// and bytes go into the write set, the header as an allocation-log op.
    fn alloc(&mut self, init: &[u8]) -> Result<u64, PtmError> {
        if init.len() > MAX_OBJECT {
            return Err(PtmError::TooLarge(format!(
                "an object of {} bytes is larger than the largest object ({MAX_OBJECT} bytes)",
                init.len()
            )));
        }
        let class = class_for(init.len()).expect("a class for an object up to MAX_OBJECT");
        let core = &self.inner.core;
        let header_at = self
            .inner
            .shadow
            .take_slot(&core.pool, &core.pages, class)
            .map_err(|detail| PtmError::PoolFull {
                bytes: init.len(),
                detail,
            })?;
        self.allocated.push((class, header_at));
        let f = self.frame_of(header_at).ok_or_else(unloadable)?;
        // The slot is this transaction's alone while it is off the free list: its committed
        // header (the last generation) is read directly.
        let old = Header::decode(f.word(header_at).load(Ordering::SeqCst)).unwrap_or(Header {
            live: false,
            gen: 0,
            size: 0,
        });
        let gen = old.gen % 0xFFFF + 1;
        let h = (gen << OFFSET_BITS) | (header_at + 8);
        self.lock_word(header_at, h)?;
        let header = Header {
            live: true,
            gen,
            size: init.len() as u64,
        };
        self.writes.insert(header_at, (header.encode(), true));
        self.write_bytes(header_at + 8, init, h)?;
        Ok(h)
    }

    /// `pfree` (§3.5): the header, marked free, into the write set; the slot returns to the
    /// free list when the transaction commits.
    fn free(&mut self, h: u64) -> Result<(), PtmError> {
        if h == self.inner.root {
            return Err(invalid(h, "the root object cannot be freed"));
        }
        let o = self.object(h)?;
        let header = Header {
            live: false,
            ..o.header
        };
        self.writes.insert(o.header_at, (header.encode(), true));
        self.freed.push((o.class, o.header_at));
        Ok(())
    }

    fn size_of(&mut self, h: u64) -> Result<usize, PtmError> {
        self.object(h).map(|o| o.size as usize)
    }

    fn commit(&mut self) -> Result<(), PtmError> {
        if self.lock.is_some() {
            return self.commit_locked();
        }
        if self.writes.is_empty() {
            // Read-only: every read was consistent with the snapshot when it was made.
            self.clear();
            return Ok(());
        }
        let inner = self.inner.clone();
        let core = &inner.core;
        if let Some(why) = core.failed() {
            return Err(PtmError::Pool(why));
        }
        let log = self.redo_log()?;
        // The written pages' frames, loaded (§3.6 paging) and pinned before the commit lock.
        let frames = self.written_frames()?;
        let id = {
            let _order = inner.commit_lock.lock();
            let mut stripes: Vec<usize> = self.writes.keys().map(|&a| stripe(a)).collect();
            stripes.sort_unstable();
            stripes.dedup();
            for &s in &stripes {
                inner.locks[s].fetch_or(LOCKED, Ordering::SeqCst);
            }
            if !self.reads_valid() {
                for &s in &stripes {
                    inner.locks[s].fetch_and(!LOCKED, Ordering::SeqCst);
                }
                let h = self.writes.keys().next().copied().unwrap_or(0);
                return Err(self.conflict(h));
            }
            let id = core.committed.load(Ordering::Relaxed) + 1;
            inner.clock.store(id, Ordering::SeqCst);
            let live_delta = self.write_shadow(&frames, id);
            fence(Ordering::Release);
            for &s in &stripes {
                inner.locks[s].store(id, Ordering::SeqCst);
            }
            inner.live.fetch_add(live_delta as u64, Ordering::Relaxed);
            core.committed.store(id, Ordering::Release);
            inner.shadow.release(&self.freed);
            core.enqueue(id, log).map_err(PtmError::Pool)?;
            id
        };
        self.allocated.clear();
        self.clear();
        if core.config.mode == DurabilityMode::Sync {
            core.wait_durable(id).map_err(PtmError::Pool)?;
        }
        Ok(())
    }

    fn abort(&mut self) {
        self.inner.shadow.release(&self.allocated);
        self.unlock_all(None);
        self.clear();
    }
}

impl Drop for StmWorker {
    fn drop(&mut self) {
        self.inner.shadow.release(&self.allocated);
        self.unlock_all(None);
        if let Some(l) = &self.lock {
            self.inner.free_chains.lock().push(l.chain);
        }
        self.inner.workers.fetch_sub(1, Ordering::Relaxed);
    }
}
