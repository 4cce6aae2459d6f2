//! ArchTM's DRAM metadata (§4.3, §5.1): the object lookup table, the per-slot ID lists, and the
//! DRAM mirror of each slot's TxState that readers consult without locks.
//!
//! Besides §5.1's entry (new, old, writer, lock), each id has a *current word* in a dense array
//! beside the entries: the committed version's offset and the object's generation in 8 bytes,
//! published while no transaction holds the object's lock, 0 while one does. A read of an
//! object nobody is writing (Alg. 1 line 9, `obj.new == NULL`) takes it from that one word; the
//! 64-byte entries of 100 000 objects fill 6.4 MB, their current words 0.8 MB, which stays in
//! the core's L2 cache where the entries missed it on every node of a hash chain. Departure
//! (§4.3 gives the table one array of entries): the same information, split by use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Entries per lazily allocated chunk of the lookup table.
const CHUNK: usize = 4096;

/// One lookup-table entry (§5.1: new, old, writer and its lock). `writer` is the txid of the
/// transaction holding the write lock (0: unlocked), so the lock and the writer are one word.
/// The other fields change only under the lock and inside a `seq` bracket (a seqlock), so a
/// lock-free reader sees them consistent. Aligned to a cache line: the eight words would
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
    /// The writer's commit id once it committed and until its retirement (`retire`): a
    /// reader takes `new` iff this is at most its start (0: not committed).
    pub ccid: AtomicU64,
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
    /// The writer's commit id (0: not committed).
    pub ccid: u64,
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
                ccid: self.ccid.load(Ordering::Acquire),
            };
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return v;
            }
        }
    }

    /// Changes fields (`f`) inside a seqlock bracket. Only the lock holder calls it, so the
    /// sequence is bumped with plain stores (a locked read-modify-write each would cost more
    /// than the rest of a small transaction's bookkeeping): odd, a release fence, the fields,
    /// then even with Release; `view`'s acquire fence pairs with them.
    pub fn modify(&self, f: impl FnOnce(&Entry)) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        f(self);
        self.seq.store(s + 2, Ordering::Release);
    }
}

/// The current word of a committed version at `old` of generation `gen`: `gen << 32 | old / 64`
/// (0 where there is none, or where the offset does not fit in 32 bits of 64-byte blocks,
/// beyond 256 GiB: those objects take the entry's path).
pub fn current_word(gen: u64, old: u64) -> u64 {
    let block = old / super::layout::BLOCK;
    if gen == 0 || old == 0 || old % super::layout::BLOCK != 0 || block > u64::from(u32::MAX) {
        return 0;
    }
    gen << 32 | block
}

/// The committed version's offset a current word `word` names, if it names generation `gen`
/// (never for 0: a generation is never 0).
#[inline]
pub fn current_offset(word: u64, gen: u64) -> Option<u64> {
    (word >> 32 == gen && word as u32 != 0).then(|| (word & 0xffff_ffff) * super::layout::BLOCK)
}

/// An id's entry and its current word.
#[derive(Clone, Copy)]
pub struct EntryRef<'t> {
    entry: &'t Entry,
    current: &'t AtomicU64,
}

impl std::ops::Deref for EntryRef<'_> {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        self.entry
    }
}

impl EntryRef<'_> {
    /// The current word (see [`current_word`]): Acquire, so the version it names is visible.
    #[inline]
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }

    /// Takes the write lock for `txid`; false if another transaction holds it. The current
    /// word is cleared at once, before the holder can take a commit id: a reader whose
    /// snapshot includes the holder's commit then finds no current word and reads the entry.
    pub fn lock(&self, txid: u64) -> bool {
        let taken = self
            .entry
            .writer
            .compare_exchange(0, txid, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if taken {
            // Release is enough: the holder's commit id is a SeqCst read-modify-write of the
            // clock after this store, and a reader's start timestamp reads the clock.
            self.current.store(0, Ordering::Release);
        }
        taken
    }

    /// Publishes the entry's committed version as the current word (the lock holder, or
    /// recovery before any transaction runs).
    pub fn publish(&self) {
        let e = self.entry;
        let word = if e.new.load(Ordering::Relaxed) == 0 {
            current_word(e.gen.load(Ordering::Relaxed), e.old.load(Ordering::Relaxed))
        } else {
            0
        };
        self.current.store(word, Ordering::Release);
    }

    /// Releases the write lock: publishes the committed version first, so that no later lock
    /// holder's cleared word is overwritten.
    pub fn unlock(&self) {
        self.publish();
        self.entry.writer.store(0, Ordering::Release);
    }
}

/// A chunk of the lookup table: the entries and their current words.
struct Chunk {
    entries: Box<[Entry]>,
    current: Box<[AtomicU64]>,
}

/// The object lookup table: a one-dimensional array indexed by object id, in lazily allocated
/// chunks so that a large pool does not pay for ids it never hands out.
pub struct LookupTable {
    chunks: Box<[OnceLock<Chunk>]>,
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
    #[inline]
    pub fn get(&self, id: u64) -> Option<EntryRef<'_>> {
        let chunk = self.chunks.get(id as usize / CHUNK)?;
        let c = chunk.get_or_init(|| Chunk {
            entries: (0..CHUNK).map(|_| Entry::default()).collect(),
            current: (0..CHUNK).map(|_| AtomicU64::new(0)).collect(),
        });
        let i = id as usize % CHUNK;
        Some(EntryRef {
            entry: &c.entries[i],
            current: &c.current[i],
        })
    }

    /// The current word of `id` (see [`current_word`]), Acquire; `None` where the id's chunk
    /// was never allocated (no object ever had the id). The read path's first load: it skips
    /// the entry and never allocates a chunk.
    #[inline]
    pub fn current(&self, id: u64) -> Option<u64> {
        let c = self.chunks.get(id as usize / CHUNK)?.get()?;
        Some(c.current[id as usize % CHUNK].load(Ordering::Acquire))
    }

    /// Entries of every id handed out so far, with their ids.
    pub fn iter(&self) -> impl Iterator<Item = (u64, EntryRef<'_>)> {
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

/// The DRAM mirror of one slot's TxState plus what post-commit waits on. Its thread writes
/// it at every begin and end, so each slot has cache lines of its own (128 bytes: the
/// adjacent-line prefetcher pairs lines); two slots in one line made the two threads'
/// transactions invalidate each other's line at every step.
#[repr(align(128))]
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
