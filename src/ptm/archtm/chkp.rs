//! §5.6's incremental checkpoint of the object lookup table, and CHKP-diff.
//!
//! - **CHKP** (§5.1, Figure 4): a persistent copy of the lookup table's committed state, one
//!   32-byte entry per object id (`old` offset, generation and size, the version's txid),
//!   in 2 MiB pages of 65 536 ids (page kind CHKP, tag value = copy << 31 | chunk).
//!   Departure: **two copies** that alternate by epoch, so a crash in the middle of a
//!   checkpoint leaves the previous one whole (the paper overwrites one copy in place and
//!   does not say what a torn checkpoint recovers to). An epoch writes into the copy one epoch
//!   behind, so it rewrites what changed during the last two epochs.
//! - **Incremental:** only groups of [`GROUP`] ids (two entries: one cache line) whose
//!   committed state changed are written. Departure: the paper detects changed lookup-table
//!   pages with write protection and page faults; here post-commit sets a bit per group in a
//!   DRAM bitmap (no `unsafe`, no signal handler, the same information, and a finer grain).
//! - **CHKP-diff** (§5.4 "Allocation"): before a slot writes into blocks it took from the
//!   global free or recycle lists, the aligned *chunks* of `PtmConfig::segment_bytes` (64 KiB
//!   by default) that hold them are recorded, durably, each once per checkpoint period; a
//!   checkpoint starts the new epoch's diff with the chunks the slots' lists still hold. Every
//!   version written since the checkpoint therefore lies in a recorded chunk, and recovery
//!   scans only those (§5.6). Departure: the paper records every fetch of a segment; with
//!   recycled blocks a take is scattered over many places, and a record per place filled the
//!   diff within a few thousand commits (each fill forcing a checkpoint). Records are 32 bytes
//!   (offset, length, epoch, a check word), appended to one of two arrays of [`DIFF_CAP`] (by
//!   epoch parity); a record of another epoch or with a bad check ends the array. A full array
//!   sets the epoch's overflow word: recovery then scans everything, as §5.5.
//! - **Quiescence:** the checkpoint blocks new transactions and waits for running ones
//!   (the paper "temporarily blocks all transactions"), then collects garbage, so at its
//!   moment the only valid headers on PM are the live versions CHKP records.
//! - **Freed objects:** garbage collection clears the CHKP entry of an object before it zeroes
//!   the tombstone that deletes it (else a crash would revive the checkpointed version).
//!
//! Checkpoint ordering (each step a fault of [`ArchtmFault`]): entries and
//! the new diff records written and flushed; fence (`archtm-chkp-persist`); the epoch word
//! stored and persisted (the switch).

use super::layout::{self, kind, meta};
use super::{ArchtmFault, Inner};
use crate::alloc::{PageTag, PAGE_SIZE};
use crate::ptm::PtmError;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes of a CHKP entry.
pub const ENTRY: u64 = 32;
/// Ids per CHKP page.
pub const PER_PAGE: u64 = PAGE_SIZE / ENTRY;
/// Ids per dirty bit (64 bytes of CHKP, one cache line: the grain of the incremental copy).
pub const GROUP: u64 = 2;
/// Records per CHKP-diff array (chunks recorded per checkpoint period: 1 GiB of 64 KiB chunks).
pub const DIFF_CAP: u64 = 16_384;
/// Bytes of a CHKP-diff record.
pub const DIFF_REC: u64 = 32;

/// The checkpoint's DRAM state.
pub struct Chkp {
    /// The current epoch (0: no checkpoint yet; recovery scans everything).
    pub epoch: AtomicU64,
    /// The current epoch's diff array, as recorded so far.
    pub diff: Mutex<Diff>,
    /// Per copy: CHKP page offset of each chunk (0: not allocated).
    pages: [Mutex<Vec<u64>>; 2],
    /// Groups changed since the last checkpoint.
    cur: Vec<AtomicU64>,
    /// Groups changed during the epoch before (the other copy misses them too).
    prev: Vec<AtomicU64>,
    /// A checkpoint waits for quiescence: `begin` holds back while it is set.
    pub pending: AtomicBool,
    serial: Mutex<()>,
    /// Commits since the last checkpoint (the automatic trigger).
    /// Every commit of every thread adds to it: a cache line of its own, away from
    /// `pending`, which every begin reads.
    pub commits: CachePadded<AtomicU64>,
    /// Checkpoint after this many commits (0: only when asked).
    pub every: u64,
    /// Checkpoints taken.
    pub taken: AtomicU64,
}

/// The current epoch's CHKP-diff in DRAM.
#[derive(Default)]
pub struct Diff {
    /// Records in the array (`DIFF_CAP` + 1 once it overflowed).
    pub len: u64,
    /// Offsets of the chunks recorded (durably) this epoch: a take there needs no record.
    pub recorded: HashSet<u64>,
}

/// What the last recovery read (counters for the tests and `stats`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecoveryCounts {
    /// Whether it started from a checkpoint (else it scanned every data page).
    pub from_checkpoint: bool,
    /// CHKP entries read.
    pub chkp_entries: u64,
    /// Data-page bytes scanned for headers.
    pub scanned_bytes: u64,
    /// Bytes of all data pages.
    pub data_bytes: u64,
    /// CHKP-diff segments scanned.
    pub segments: u64,
}

impl Chkp {
    /// A state for a table of `capacity` ids; every group is dirty in both bitmaps (nothing is
    /// known to be in either copy).
    pub fn new(capacity: u64, every: u64) -> Chkp {
        let words = capacity.div_ceil(GROUP).div_ceil(64) as usize;
        let chunks = capacity.div_ceil(PER_PAGE) as usize;
        Chkp {
            epoch: AtomicU64::new(0),
            diff: Mutex::new(Diff::default()),
            pages: [Mutex::new(vec![0; chunks]), Mutex::new(vec![0; chunks])],
            cur: (0..words).map(|_| AtomicU64::new(u64::MAX)).collect(),
            prev: (0..words).map(|_| AtomicU64::new(u64::MAX)).collect(),
            pending: AtomicBool::new(false),
            serial: Mutex::new(()),
            commits: CachePadded::new(AtomicU64::new(0)),
            every,
            taken: AtomicU64::new(0),
        }
    }

    /// Marks `id`'s committed state changed.
    pub fn mark(&self, id: u64) {
        let g = id / GROUP;
        if let Some(w) = self.cur.get((g / 64) as usize) {
            if w.load(Ordering::Relaxed) & 1 << (g % 64) == 0 {
                w.fetch_or(1 << (g % 64), Ordering::Relaxed);
            }
        }
    }

    /// After a recovery: only the groups of `changed` ids differ from the valid copy; the other
    /// copy is of unknown age, so everything is dirty for it.
    pub fn reset_dirty(&self, changed: impl Iterator<Item = u64>) {
        for w in &self.cur {
            w.store(0, Ordering::Relaxed);
        }
        for w in &self.prev {
            w.store(u64::MAX, Ordering::Relaxed);
        }
        for id in changed {
            self.mark(id);
        }
    }

    /// The CHKP page of `copy`'s chunk (0: none).
    pub fn page(&self, copy: usize, chunk: u64) -> u64 {
        self.pages[copy]
            .lock()
            .get(chunk as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Records a CHKP page found at recovery.
    pub fn set_page(&self, copy: usize, chunk: u64, off: u64) -> bool {
        match self.pages[copy].lock().get_mut(chunk as usize) {
            Some(p) => {
                *p = off;
                true
            }
            None => false,
        }
    }
}

/// The PM offset of record `i` of diff array `copy`.
pub fn diff_at(meta_off: u64, copy: usize, i: u64) -> u64 {
    meta_off + meta::DIFF + copy as u64 * DIFF_CAP * DIFF_REC + i * DIFF_REC
}

/// The check word of a diff record.
fn record_check(off: u64, len: u64, epoch: u64, at: u64, salt: u64) -> u64 {
    layout::check(off, len, epoch, at, salt ^ 0x5eed)
}

/// Reads diff array `epoch % 2`: the segments of `epoch`, up to the first record that is not.
pub(crate) fn read_diff(inner: &Inner, epoch: u64) -> Vec<(u64, u64)> {
    let copy = (epoch % 2) as usize;
    let mut out = Vec::new();
    for i in 0..DIFF_CAP {
        let at = diff_at(inner.meta, copy, i);
        let w: Vec<u64> = (0..4).map(|k| inner.pool.read_u64(at + k * 8)).collect();
        if w[2] != epoch || w[3] != record_check(w[0], w[1], w[2], at, inner.salt) {
            break;
        }
        out.push((w[0], w[1]));
    }
    out
}

impl Inner {
    fn write_record(&self, copy: usize, i: u64, off: u64, len: u64, epoch: u64, flush: bool) {
        let at = diff_at(self.meta, copy, i);
        let words = [
            off,
            len,
            epoch,
            record_check(off, len, epoch, at, self.salt),
        ];
        let mut b = [0u8; 32];
        for (k, w) in words.iter().enumerate() {
            b[k * 8..k * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.pool.write_bytes(at, &b);
        if self.flushing && flush {
            self.pool.flush(at, DIFF_REC);
        }
    }

    /// Marks the current epoch's diff as overflowed (recovery scans everything), durably.
    fn diff_overflow(&self, epoch: u64) {
        let at = self.meta + meta::CHKP_OVERFLOW;
        self.pool.write_u64_ordered(at, epoch);
        self.persist(at, 8);
    }

    /// The offsets of the chunks (aligned, of `segment` bytes, within a data page) that hold
    /// some of `extents`.
    fn chunks_of(&self, extents: impl Iterator<Item = (u64, u64)>) -> BTreeSet<u64> {
        let chunk = self.segment;
        let mut out = BTreeSet::new();
        for (off, len) in extents {
            out.extend((off / chunk * chunk..off + len).step_by(chunk as usize));
        }
        out
    }

    /// §5.4: records the chunks that hold the extents `taken` (a slot's take from the global
    /// free or recycle lists) in CHKP-diff, durably, before the slot writes into them; a chunk
    /// already recorded this epoch needs nothing. One take at a time (the diff lock, held to
    /// the fence: another slot sees a chunk recorded only once the record is durable).
    pub(crate) fn record_taken(&self, taken: &[(u64, u64)]) {
        let mut d = self.chkp.diff.lock();
        if d.len > DIFF_CAP {
            return; // overflowed: recovery scans everything this epoch
        }
        let epoch = self.chkp.epoch.load(Ordering::Acquire);
        // archtm-diff-persist: the records are durable before the take's first copy (else a
        // crash could keep a copy there and lose the record that makes recovery look).
        let persist = self.fault != Some(ArchtmFault::DiffPersist);
        let mut wrote = false;
        for start in self.chunks_of(taken.iter().copied()) {
            if d.recorded.contains(&start) {
                continue;
            }
            if d.len == DIFF_CAP {
                // Durable with the records before it (the overflow word's persist fences).
                self.diff_overflow(epoch);
                d.len += 1;
                return;
            }
            self.write_record(
                (epoch % 2) as usize,
                d.len,
                start,
                self.segment,
                epoch,
                persist,
            );
            d.len += 1;
            d.recorded.insert(start);
            wrote = true;
        }
        if persist && wrote {
            self.pool.fence();
        }
    }

    /// The CHKP page of `copy`'s `chunk`, allocated if it has none.
    fn chkp_page(&self, copy: usize, chunk: u64) -> Result<u64, PtmError> {
        let p = self.chkp.page(copy, chunk);
        if p != 0 {
            return Ok(p);
        }
        let tag = PageTag {
            kind: kind::CHKP,
            owner: 0,
            value: (copy as u64) << 31 | chunk,
        };
        let index = self.pages.allocate(&self.pool, tag).map_err(|e| match e {
            crate::alloc::AllocError::PmFull { .. } => PtmError::PoolFull {
                bytes: PAGE_SIZE as usize,
                detail: "no free page for the lookup-table checkpoint".into(),
            },
            e => e.into(),
        })?;
        let off = self.pages.page_offset(index);
        self.chkp.set_page(copy, chunk, off);
        Ok(off)
    }

    /// Blocks new transactions and waits until none runs. False if `patience` ran out first
    /// (then nothing is blocked any more).
    fn quiesce(&self, patience: Option<Duration>) -> bool {
        self.chkp.pending.store(true, Ordering::SeqCst);
        let start = Instant::now();
        for s in &self.slots {
            while s.busy.load(Ordering::SeqCst) != 0 {
                if let Some(sim) = self.pool.crash_sim() {
                    if let Some(event) = sim.crashed_at() {
                        self.chkp.pending.store(false, Ordering::SeqCst);
                        std::panic::resume_unwind(Box::new(crate::pmem::SimulatedCrash { event }));
                    }
                }
                if patience.is_some_and(|p| start.elapsed() > p) {
                    self.chkp.pending.store(false, Ordering::SeqCst);
                    return false;
                }
                std::thread::yield_now();
            }
        }
        true
    }

    /// Takes an incremental checkpoint (§5.6). With `patience`, gives up (`Ok(false)`) if
    /// transactions keep running that long, or if another checkpoint is under way. The caller
    /// must not be inside a transaction.
    pub(crate) fn checkpoint(&self, patience: Option<Duration>) -> Result<bool, PtmError> {
        let _serial = match patience {
            Some(_) => match self.chkp.serial.try_lock() {
                Some(g) => g,
                None => return Ok(false),
            },
            None => self.chkp.serial.lock(),
        };
        if !self.quiesce(patience) {
            return Ok(false);
        }
        let r = self.checkpoint_quiesced();
        self.chkp.pending.store(false, Ordering::SeqCst);
        r.map(|()| true)
    }

    fn checkpoint_quiesced(&self) -> Result<(), PtmError> {
        // Commits awaiting retirement first: their new versions are the committed state the
        // copy records (nothing executes, so none waits).
        self.retire_all();
        let _gc = self.alloc.gc.lock();
        // Nothing runs: after this collection every valid header on PM is a live version.
        self.gc_locked();
        let c = &self.chkp;
        let epoch = c.epoch.load(Ordering::Acquire);
        let next = epoch + 1;
        let copy = (next % 2) as usize;
        let next_id = self.table.next_id.load(Ordering::Acquire);
        // archtm-chkp-persist: the copy and the diff are durable before the epoch names them.
        let persist = self.fault != Some(ArchtmFault::ChkpPersist);
        // 1. The changed groups into the copy one epoch behind: one write (and flush) per
        // run of consecutive changed groups within a CHKP page.
        let groups = next_id.div_ceil(GROUP);
        let mut run: Option<(u64, u64)> = None; // first and last group
        for w in 0..groups.div_ceil(64) {
            let mut bits = c.cur[w as usize].load(Ordering::Relaxed)
                | c.prev[w as usize].load(Ordering::Relaxed);
            while bits != 0 {
                let g = w * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                if g >= groups {
                    break;
                }
                match run {
                    Some((first, last)) if last + 1 == g && (g * GROUP) % PER_PAGE != 0 => {
                        run = Some((first, g))
                    }
                    _ => {
                        if let Some((first, last)) = run {
                            self.write_groups(copy, first, last, next_id, persist)?;
                        }
                        run = Some((g, g));
                    }
                }
            }
        }
        if let Some((first, last)) = run {
            self.write_groups(copy, first, last, next_id, persist)?;
        }
        // 2. The new epoch's diff: the chunks of the space the slots' lists still hold.
        let mut chunks = BTreeSet::new();
        if self.fault != Some(ArchtmFault::ChkpSkipListDiff) {
            for l in &self.alloc.slots {
                chunks.append(&mut self.chunks_of(l.lock().extents_held()));
            }
        }
        let mut diff = c.diff.lock();
        let n = chunks.len() as u64;
        for (i, &off) in chunks.iter().take(DIFF_CAP as usize).enumerate() {
            self.write_record(copy, i as u64, off, self.segment, next, persist);
        }
        let nid_at = self.meta + meta::CHKP_NEXT_ID + copy as u64 * 8;
        self.pool.write_u64(nid_at, next_id);
        if self.flushing && persist {
            self.pool.flush(nid_at, 8);
        }
        if n > DIFF_CAP {
            self.diff_overflow(next);
        }
        if persist {
            self.pool.fence();
        }
        // 3. The switch.
        let at = self.meta + meta::CHKP_EPOCH;
        self.pool.write_u64_ordered(at, next);
        self.persist(at, 8);
        c.epoch.store(next, Ordering::Release);
        diff.len = if n > DIFF_CAP { DIFF_CAP + 1 } else { n };
        diff.recorded = chunks.into_iter().collect();
        for (p, k) in c.prev.iter().zip(&c.cur) {
            p.store(k.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        }
        c.commits.store(0, Ordering::Relaxed);
        c.taken.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the entries of groups `first..=last` (one CHKP page) into `copy`, flushed
    /// unless `persist` is off (the `archtm-chkp-persist` fault).
    fn write_groups(
        &self,
        copy: usize,
        first: u64,
        last: u64,
        next_id: u64,
        persist: bool,
    ) -> Result<(), PtmError> {
        let (lo, hi) = (first * GROUP, ((last + 1) * GROUP).min(next_id));
        let page = self.chkp_page(copy, lo / PER_PAGE)?;
        let at = page + (lo % PER_PAGE) * ENTRY;
        let mut buf = vec![0u8; ((hi - lo) * ENTRY) as usize];
        for id in lo..hi {
            let e = self.table.get(id).expect("an id below next_id");
            let v = e.view();
            let words = if v.gen == 0 || v.old == 0 {
                [0; 4]
            } else {
                [
                    v.old,
                    v.gen << 32 | v.size,
                    e.vtxid.load(Ordering::Acquire),
                    0,
                ]
            };
            let o = ((id - lo) * ENTRY) as usize;
            for (k, w) in words.iter().enumerate() {
                buf[o + k * 8..o + k * 8 + 8].copy_from_slice(&w.to_le_bytes());
            }
        }
        self.pool.write_bytes(at, &buf);
        if self.flushing && persist {
            self.pool.flush(at, buf.len() as u64);
        }
        Ok(())
    }

    /// During garbage collection, before a tombstone of object `id` (generation `gen`) is
    /// zeroed: clears the object's entry in the valid CHKP copy if it names that life, so that
    /// a crash cannot revive the checkpointed version. Not yet durable: the caller's fence.
    pub(crate) fn chkp_forget(&self, id: u64, gen: u64) {
        let epoch = self.chkp.epoch.load(Ordering::Acquire);
        if epoch == 0 || self.fault == Some(ArchtmFault::GcKeepsChkpEntry) {
            return;
        }
        let page = self.chkp.page((epoch % 2) as usize, id / PER_PAGE);
        if page == 0 {
            return;
        }
        let at = page + (id % PER_PAGE) * ENTRY;
        if self.pool.read_u64(at) != 0 && self.pool.read_u64(at + 8) >> 32 == gen {
            self.pool.write_u64(at, 0);
            if self.flushing {
                self.pool.flush(at, 8);
            }
        }
    }

    /// After a commit: takes an automatic checkpoint when enough commits passed or the diff
    /// array fills up (a quarter left), unless transactions keep running (then a later commit
    /// tries again).
    pub(crate) fn maybe_checkpoint(&self) {
        let c = &self.chkp;
        if c.every == 0 {
            return;
        }
        let n = c.commits.fetch_add(1, Ordering::Relaxed) + 1;
        // The diff's fill, every 64 commits (its lock per commit cost more than the check is
        // worth): the last quarter of the array is far more than 64 commits' takes.
        let filling = n % 64 == 0 && c.diff.lock().len >= DIFF_CAP * 3 / 4;
        if n >= c.every || filling {
            // An error (no page for the copy) leaves the previous checkpoint valid.
            let _ = self.checkpoint(Some(Duration::from_millis(20)));
        }
    }
}
