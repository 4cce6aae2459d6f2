//! ArchTM's locality-aware allocator (§4.4, §5.4): its metadata lives in DRAM only (§4.2).
//!
//! One thread-private *allocation list* per slot, a portion of the *global free list* fetched in
//! fixed-size pieces (so consecutive allocations of a thread, whatever their sizes, get
//! contiguous blocks and its copies reach PM as sequential writes); one *deallocation list* per
//! slot; and the *global recycle list*, into which garbage collection sorts and merges the
//! freed blocks after zeroing their headers. Blocks are multiples of 64 bytes (§4.5). The
//! user data area grows by 2 MiB pages of the page manager (the paper's pre-allocated
//! segments; the page tags list the data pages, and CHKP-diff, [`super::chkp`], the fetches).

use super::layout::{self, header};
use super::{ArchtmFault, Inner};
use crate::alloc::{PageTag, PAGE_SIZE};
use crate::ptm::PtmError;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;

/// Bytes a slot fetches from the global free list at once (the default segment size).
pub const FETCH: u64 = 64 << 10;
/// Deallocations a slot collects before its commit runs garbage collection.
pub const GC_THRESHOLD: usize = 256;

/// A freed block waiting for garbage collection.
#[derive(Clone, Copy, Debug)]
pub struct Dealloc {
    /// Offset.
    pub off: u64,
    /// Bytes.
    pub len: u64,
    /// A tombstone: zeroed only after every ordinary block of the same collection, so that the
    /// copies it deletes cannot reappear after a crash.
    pub tomb: bool,
    /// A large version (`super::large`): its pages go back to the page manager.
    pub large: bool,
    /// The object a tombstone deletes (id, generation): its checkpoint entry is cleared first.
    pub object: (u64, u64),
}

/// The allocator's DRAM state.
pub struct Allocator {
    /// Per slot: its allocation list (sorted, disjoint extents).
    pub lists: Vec<Mutex<Vec<(u64, u64)>>>,
    /// Per slot: its deallocation list.
    pub dealloc: Vec<Mutex<Vec<Dealloc>>>,
    /// The global free list (sorted, merged).
    pub free: Mutex<Vec<(u64, u64)>>,
    /// The global recycle list (sorted, merged).
    pub recycle: Mutex<Vec<(u64, u64)>>,
    /// Data pages (offsets), in the order they were taken.
    pub pages: Mutex<Vec<u64>>,
    /// One collection (or checkpoint) at a time.
    pub(crate) gc: Mutex<()>,
}

/// Inserts the sorted extents `add` into the sorted list `list`, merging neighbours within a page.
pub fn merge_into(list: &mut Vec<(u64, u64)>, mut add: Vec<(u64, u64)>) {
    if add.is_empty() {
        return;
    }
    add.sort_unstable();
    let mut all = Vec::with_capacity(list.len() + add.len());
    let (mut i, mut j) = (0, 0);
    while i < list.len() || j < add.len() {
        let next = if j >= add.len() || (i < list.len() && list[i].0 < add[j].0) {
            i += 1;
            list[i - 1]
        } else {
            j += 1;
            add[j - 1]
        };
        match all.last_mut() {
            Some((o, l)) if *o + *l == next.0 && *o / PAGE_SIZE == next.0 / PAGE_SIZE => {
                *l += next.1
            }
            _ => all.push(next),
        }
    }
    *list = all;
}

/// Takes `len` bytes from the first extent of `list` that holds them (first fit: the lowest
/// address, so a thread's consecutive allocations are contiguous).
fn first_fit(list: &mut Vec<(u64, u64)>, len: u64) -> Option<u64> {
    let i = list.iter().position(|&(_, l)| l >= len)?;
    let (off, l) = list[i];
    if l == len {
        list.remove(i);
    } else {
        list[i] = (off + len, l - len);
    }
    Some(off)
}

impl Allocator {
    /// An empty allocator for `slots` threads.
    pub fn new(slots: usize) -> Allocator {
        Allocator {
            lists: (0..slots).map(|_| Mutex::new(Vec::new())).collect(),
            dealloc: (0..slots).map(|_| Mutex::new(Vec::new())).collect(),
            free: Mutex::new(Vec::new()),
            recycle: Mutex::new(Vec::new()),
            pages: Mutex::new(Vec::new()),
            gc: Mutex::new(()),
        }
    }

    /// Returns blocks to `slot`'s allocation list (aborted copies, already invalidated).
    pub fn give_back(&self, slot: usize, blocks: Vec<(u64, u64)>) {
        merge_into(&mut self.lists[slot].lock(), blocks);
    }
}

impl Inner {
    /// Allocates a block of `len` bytes (a multiple of 64) for `slot` (§5.4 "Allocation").
    pub(crate) fn alloc_block(&self, slot: usize, len: u64) -> Result<u64, PtmError> {
        let a = &self.alloc;
        let mut list = a.lists[slot].lock();
        if let Some(off) = first_fit(&mut list, len) {
            return Ok(off);
        }
        loop {
            {
                let mut free = a.free.lock();
                if let Some(i) = free.iter().position(|&(_, l)| l >= len) {
                    let (off, l) = free[i];
                    let take = l.min(self.segment.max(len));
                    if take == l {
                        free.remove(i);
                    } else {
                        free[i] = (off + take, l - take);
                    }
                    // §5.4: the fetch goes into CHKP-diff before the slot can write there.
                    self.record_fetch(off, take);
                    drop(free);
                    merge_into(&mut list, vec![(off, take)]);
                    return Ok(first_fit(&mut list, len).expect("the fetched piece fits"));
                }
                // Replenish the global free list from the recycle list.
                let recycled = std::mem::take(&mut *a.recycle.lock());
                if !recycled.is_empty() {
                    merge_into(&mut free, recycled);
                    continue;
                }
            }
            // Nothing recycled yet: collect what the slots freed, then take a new page.
            if self.gc() > 0 {
                continue;
            }
            let tag = PageTag {
                kind: layout::kind::DATA,
                owner: slot as u8,
                value: 0,
            };
            match self.pages.allocate(&self.pool, tag) {
                Ok(index) => {
                    let off = self.pages.page_offset(index);
                    a.pages.lock().push(off);
                    merge_into(&mut a.free.lock(), vec![(off, PAGE_SIZE)]);
                }
                Err(crate::alloc::AllocError::PmFull { .. }) => {
                    return Err(PtmError::PoolFull {
                        bytes: len as usize,
                        detail: format!(
                            "all {} MiB of the pool are in use by objects or not yet collected",
                            self.pool.len() >> 20
                        ),
                    })
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Garbage collection (§5.4 "Deallocation"): gathers every slot's deallocation list, zeroes
    /// the freed headers (ordinary blocks, fence, then tombstones, fence: a tombstone must
    /// outlive the copies it deletes) and merges the blocks into the global recycle list.
    /// Returns the bytes recycled. One collection at a time.
    pub(crate) fn gc(&self) -> u64 {
        let _g = self.alloc.gc.lock();
        self.gc_locked()
    }

    /// [`Inner::gc`] with the collection lock held.
    pub(crate) fn gc_locked(&self) -> u64 {
        let mut blocks: Vec<Dealloc> = Vec::new();
        for d in &self.alloc.dealloc {
            blocks.append(&mut d.lock());
        }
        if blocks.is_empty() {
            return 0;
        }
        for tombs in [false, true] {
            for b in blocks.iter().filter(|b| b.tomb == tombs) {
                self.pool.fill(b.off, 0, header::BYTES);
                if self.flushing {
                    self.pool.flush(b.off, header::BYTES);
                }
            }
            if !tombs {
                // §5.6: the checkpoint forgets the freed objects before their tombstones go.
                for b in blocks.iter().filter(|b| b.tomb) {
                    self.chkp_forget(b.object.0, b.object.1);
                }
            }
            if self.fault != Some(ArchtmFault::GcSkipFence) {
                // archtm-gc-zero-fence: the zeroed headers are durable before the tombstones
                // are zeroed, and before the blocks can be reused.
                self.pool.fence();
            }
        }
        // Large versions' pages, now that their headers are durably invalid (§4.4's regular
        // path: they return to the page manager, not the recycle list).
        for b in blocks.iter().filter(|b| b.large) {
            self.free_large(b.off);
        }
        blocks.retain(|b| !b.large);
        let bytes = blocks.iter().map(|b| b.len).sum();
        self.counters.gc_runs.fetch_add(1, Ordering::Relaxed);
        self.counters
            .recycled_bytes
            .fetch_add(bytes, Ordering::Release);
        merge_into(
            &mut self.alloc.recycle.lock(),
            blocks.into_iter().map(|b| (b.off, b.len)).collect(),
        );
        bytes
    }
}
