//! ArchTM's DRAM metadata (§4.3, §5.1): the object lookup table, the per-slot ID lists, and the
//! DRAM mirror of each slot's TxState that readers consult without locks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Entries per lazily allocated chunk of the lookup table.
const CHUNK: usize = 4096;

/// One lookup-table entry (§5.1: new, old, writer and its lock). `writer` is the txid of the
/// transaction holding the write lock (0: unlocked), so the lock and the writer are one word.
/// The other fields change only under the lock and inside a `seq` bracket (a seqlock), so a
/// lock-free reader sees them consistent. Aligned to a cache line: the seven words would
/// otherwise straddle two lines in most entries, and a read of an object would miss twice.
#[derive(Default)]
#[repr(align(64))]
pub struct Entry {
    seq: AtomicU64,
    /// Offset of the committed version (0: none).
    pub old: AtomicU64,
    /// Offset of the writer's new version (0: none).
    pub new: AtomicU64,
    /// Txid of the lock holder (0: unlocked).
    pub writer: AtomicU64,
    /// The live object's generation (0: the id is free).
    pub gen: AtomicU64,
    /// The object's payload bytes.
    pub size: AtomicU64,
    /// The txid that wrote the committed version (`old`): what the checkpoint records (§5.6).
    pub vtxid: AtomicU64,
}

/// A consistent snapshot of an entry's fields.
#[derive(Clone, Copy, Debug)]
pub struct EntryView {
    /// Committed version.
    pub old: u64,
    /// New version.
    pub new: u64,
    /// Lock holder.
    pub writer: u64,
    /// Generation.
    pub gen: u64,
    /// Payload bytes.
    pub size: u64,
}

impl Entry {
    /// Reads the fields consistently (retrying while a writer changes them): lock-free.
    pub fn view(&self) -> EntryView {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let v = EntryView {
                old: self.old.load(Ordering::Acquire),
                new: self.new.load(Ordering::Acquire),
                writer: self.writer.load(Ordering::Acquire),
                gen: self.gen.load(Ordering::Acquire),
                size: self.size.load(Ordering::Acquire),
            };
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return v;
            }
        }
    }

    /// Changes fields (`f`) inside a seqlock bracket. Only the lock holder calls it.
    pub fn modify(&self, f: impl FnOnce(&Entry)) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        f(self);
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// Takes the write lock for `txid`; false if another transaction holds it.
    pub fn lock(&self, txid: u64) -> bool {
        self.writer
            .compare_exchange(0, txid, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// The object lookup table: a one-dimensional array indexed by object id, in lazily allocated
/// chunks so that a large pool does not pay for ids it never hands out.
pub struct LookupTable {
    chunks: Box<[OnceLock<Box<[Entry]>>]>,
    /// The next never-used id.
    pub next_id: AtomicU64,
}

impl LookupTable {
    /// A table for up to `capacity` ids.
    pub fn new(capacity: u64) -> LookupTable {
        let n = (capacity as usize).div_ceil(CHUNK).max(1);
        LookupTable {
            chunks: (0..n).map(|_| OnceLock::new()).collect(),
            next_id: AtomicU64::new(0),
        }
    }

    /// Ids the table can hold.
    pub fn capacity(&self) -> u64 {
        (self.chunks.len() * CHUNK) as u64
    }

    /// The entry of `id` (`None` beyond the capacity).
    pub fn get(&self, id: u64) -> Option<&Entry> {
        let chunk = self.chunks.get(id as usize / CHUNK)?;
        let c = chunk.get_or_init(|| (0..CHUNK).map(|_| Entry::default()).collect());
        Some(&c[id as usize % CHUNK])
    }

    /// Entries of every id handed out so far, with their ids.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Entry)> {
        let n = self.next_id.load(Ordering::Acquire);
        (0..n).filter_map(move |id| self.get(id).map(|e| (id, e)))
    }
}

/// DRAM states of a slot (the PM TxState keeps END, BEGIN, COMMITTED; COMMITTING exists only
/// here, so that a reader that began after the commit id was taken waits for the decision
/// rather than reading the old version).
pub mod dstate {
    /// Idle.
    pub const END: u64 = 0;
    /// Running.
    pub const BEGIN: u64 = 1;
    /// Between taking the commit id and publishing it.
    pub const COMMITTING: u64 = 2;
    /// Committed with `cid` (post-commit under way).
    pub const COMMITTED: u64 = 3;
}

/// The DRAM mirror of one slot's TxState plus what post-commit waits on.
pub struct SlotState {
    /// `ts << 2 | dstate`.
    pub state: AtomicU64,
    /// The commit timestamp (valid in COMMITTED).
    pub cid: AtomicU64,
    /// The start timestamp while the transaction still reads objects; 0 while it is taking
    /// one; `u64::MAX` when idle or committed.
    pub active: AtomicU64,
    /// 1 from `begin` (before the snapshot) to the end of post-commit or abort: what a
    /// checkpoint waits to see 0 in every slot (§5.6's blocked transactions).
    pub busy: AtomicU64,
}

impl Default for SlotState {
    fn default() -> Self {
        SlotState {
            state: AtomicU64::new(0),
            cid: AtomicU64::new(0),
            active: AtomicU64::new(u64::MAX),
            busy: AtomicU64::new(0),
        }
    }
}
