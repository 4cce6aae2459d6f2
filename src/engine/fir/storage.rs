//! FIR's DRAM side of time-ordered storage (§4.1): tuple headers in tiles (one tile per block,
//! one header per tuple_content slot), the update_map of each block, logical addresses, and a
//! region's append position.

use crate::alloc::PAGE_SIZE;
use crate::catalog::TableId;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// "No version" (a logical address no region can have: regions are thread slots, at most 256).
pub const NONE: u64 = u64::MAX;

/// A logical address (§4.1): region id in the top 16 bits, block (tile) id in the middle 32,
/// the slot offset in the block in the low 16. The block id is the page-manager page index.
#[inline]
pub fn logical(region: usize, block: u64, offset: u64) -> u64 {
    ((region as u64) << 48) | (block << 16) | offset
}

/// The block (page index) of a logical address.
#[inline]
pub fn block_of(addr: u64) -> u64 {
    (addr >> 16) & 0xffff_ffff
}

/// The slot offset of a logical address within its block.
#[inline]
pub fn offset_of(addr: u64) -> u64 {
    addr & 0xffff
}

/// The region of a logical address.
#[inline]
pub fn region_of(addr: u64) -> usize {
    (addr >> 48) as usize
}

/// Most slots a block holds (the 16-bit offset of a logical address).
pub const MAX_SLOTS: u64 = 1 << 16;

/// Slots of a block for `slot_bytes`-byte tuple contents, at most `cap` (0: no cap beyond the
/// page and the 16-bit offset).
pub fn slots_per_block(slot_bytes: u64, cap: u64) -> u64 {
    let fit = (PAGE_SIZE / slot_bytes).min(MAX_SLOTS);
    if cap == 0 {
        fit
    } else {
        fit.min(cap)
    }
}

/// Header state bits (the `state` word; bit 63 is the header's latch).
pub mod state {
    /// The header's latch: held while a version is read-stamped, superseded or installed.
    pub const LATCH: u64 = 1 << 63;
    /// A version written by a running transaction (not yet committed).
    pub const PENDING: u64 = 1;
    /// A committed version.
    pub const COMMITTED: u64 = 2;
    /// The version is a deletion (with PENDING or COMMITTED).
    pub const TOMBSTONE: u64 = 4;
}

/// A tuple_header (§4.1): MVTO's begin/end/read timestamps and the version chain, in DRAM.
#[derive(Default)]
pub struct Header {
    /// [`state`] bits and the latch.
    pub state: AtomicU64,
    /// begin_ts: the txnId that wrote this version.
    pub begin: AtomicU64,
    /// end_ts: the txnId of the version that superseded it (`u64::MAX` while it is newest).
    pub end: AtomicU64,
    /// read_ts: the largest timestamp that read this version (MVTO).
    pub read: AtomicU64,
    /// prev: the logical address of the previous version, or [`NONE`].
    pub prev: AtomicU64,
    /// The tuple id (primary key).
    pub key: AtomicU64,
}

impl Header {
    /// Takes the latch; returns the state bits. While it waits, a simulated crash of `pool`
    /// unwinds this thread: the holder may have unwound at the crash and never release it.
    #[inline]
    pub fn latch(&self, pool: &crate::pmem::Pool) -> u64 {
        let mut spins = 0u32;
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if s & state::LATCH == 0
                && self
                    .state
                    .compare_exchange_weak(
                        s,
                        s | state::LATCH,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                return s;
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                pool.unwind_if_crashed();
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Releases the latch, leaving `bits` as the state.
    #[inline]
    pub fn unlatch(&self, bits: u64) {
        debug_assert!(bits & state::LATCH == 0);
        self.state.store(bits, Ordering::Release);
    }
}

/// The table of a tile whose block a table drop freed: any table with the same slot size may
/// take the block (the dropped table's id is never used again).
pub const UNOWNED: TableId = TableId::MAX;

/// A tile: the tuple headers of one block, and its update_map (§4.1: one bit per slot, set when
/// the version is obsolete). Both are DRAM-only: recovery rebuilds them.
pub struct Tile {
    /// The table whose block this is ([`UNOWNED`] once a drop freed it); changed only while
    /// nothing refers to the block's versions (a drop, or the block's next allocation).
    pub table: AtomicU32,
    /// The block page's offset in the pool.
    pub page: u64,
    /// Bytes per tuple_content slot.
    pub slot_bytes: u64,
    /// One header per slot.
    pub headers: Box<[Header]>,
    /// update_map: bit i set = slot i holds an obsolete version.
    pub update_map: Box<[AtomicU64]>,
}

impl Tile {
    /// An empty tile for a block of `slots` slots of `table` at pool offset `page`.
    pub fn new(table: TableId, page: u64, slot_bytes: u64, slots: u64) -> Tile {
        let slots = slots as usize;
        Tile {
            table: AtomicU32::new(table),
            page,
            slot_bytes,
            headers: (0..slots).map(|_| Header::default()).collect(),
            update_map: (0..slots.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The table whose block this is.
    #[inline]
    pub fn table(&self) -> TableId {
        self.table.load(Ordering::Acquire)
    }

    /// The pool offset of slot `offset`'s tuple_content.
    #[inline]
    pub fn slot_at(&self, offset: u64) -> u64 {
        self.page + offset * self.slot_bytes
    }

    /// Marks slot `offset` obsolete in the update_map.
    #[inline]
    pub fn mark_obsolete(&self, offset: u64) {
        self.update_map[(offset / 64) as usize].fetch_or(1 << (offset % 64), Ordering::Relaxed);
    }

    /// Marks slot `offset` live again (recovery's rebuild of the update_map).
    #[inline]
    pub fn mark_live(&self, offset: u64) {
        self.update_map[(offset / 64) as usize].fetch_and(!(1 << (offset % 64)), Ordering::Relaxed);
    }

    /// Marks live again every slot whose bit is set in `live` (one word per 64 slots, as the
    /// update_map): recovery's header install, one write per word instead of one per slot.
    pub fn mark_live_bits(&self, live: &[u64]) {
        for (w, &bits) in self.update_map.iter().zip(live) {
            if bits != 0 {
                w.fetch_and(!bits, Ordering::Relaxed);
            }
        }
    }

    /// Marks the first `used` slots obsolete (recovery's rebuild of the update_map: the live
    /// ones are marked live again from the index).
    pub fn mark_all_obsolete(&self, used: u64) {
        for (i, w) in self.update_map.iter().enumerate() {
            let from = i as u64 * 64;
            let bits = match used.saturating_sub(from) {
                0 => 0,
                n if n >= 64 => u64::MAX,
                n => (1u64 << n) - 1,
            };
            w.store(bits, Ordering::Relaxed);
        }
    }

    /// Whether slot `offset` is marked obsolete.
    #[inline]
    pub fn is_obsolete(&self, offset: u64) -> bool {
        self.update_map[(offset / 64) as usize].load(Ordering::Relaxed) & (1 << (offset % 64)) != 0
    }

    /// Empties the tile for a new use of its block by the same table (GC freed the block, §4.5,
    /// and nothing refers to its versions any more).
    pub fn reset(&self) {
        for h in self.headers.iter() {
            h.state.store(0, Ordering::Relaxed);
            h.prev.store(NONE, Ordering::Relaxed);
        }
        for w in self.update_map.iter() {
            w.store(0, Ordering::Release);
        }
    }

    /// Obsolete slots.
    pub fn obsolete_count(&self) -> u64 {
        self.update_map
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }
}

/// One region of one table (§4.1: a thread's append-only part of the table): its blocks in
/// append order and the next empty slot (DRAM; recovery finds it from the content).
#[derive(Clone, Debug, Default)]
pub struct Region {
    /// Block page indices, in the order the region fills them (GC removes collected ones, §4.5).
    pub blocks: Vec<u64>,
    /// The sequence number of the region's next block (its page tag orders it in the region:
    /// numbers grow, GC leaves gaps).
    pub next_seq: usize,
    /// The block being filled (index into `blocks`).
    pub current: usize,
    /// The next empty slot of the current block.
    pub next: u64,
}

impl Region {
    /// The append position, for undoing a transaction's allocations (§4.2.1: an abort resets
    /// the last empty slot positions to the state before the transaction started).
    pub fn position(&self) -> (usize, u64) {
        (self.current, self.next)
    }
}
