//! ArchTM's locality-aware allocator (§4.4, §5.4): its metadata lives in DRAM only (§4.2).
//!
//! - **Size classes (§4.5's 64-byte unit):** blocks of 64 bytes to [`CLASS_MAX`] (4 KiB) in
//!   64-byte steps, one class per size. Each slot has one free list per class (a stack: pop to
//!   allocate, push to give back), and each class one global *recycle list*, kept in address
//!   order. A slot whose list of a class is empty takes [`CLASS_TAKE`] (16 KiB) of that class
//!   at once, in address order: from the *global free list* (untouched space, carved into
//!   consecutive blocks) first, else the lowest recycled blocks of the class. So a slot's
//!   consecutive allocations of a class come in ascending order from one segment, and its
//!   copies reach PM as sequential writes (§4.4's aim).
//! - **Blocks above 4 KiB** (up to a data page) keep the extent path: a thread-private list of
//!   extents, first fit, refilled by fetching a segment of `PtmConfig::segment_bytes` from the
//!   global free list; freed ones go to a recycle list of extents that refills the free list.
//! - **Garbage collection** gathers the slots' deallocation lists, zeroes the freed headers
//!   and sorts the blocks into their classes' recycle lists (§5.4 "Deallocation").
//! - **Departure from §4.4:** the paper keeps *one* free list for all sizes, so that
//!   consecutive requests of different sizes get contiguous blocks. Here consecutive requests
//!   of one class are contiguous; different classes come from different segments. The reason:
//!   the single list fragments into holes of every size once blocks are recycled, so each
//!   refill found a hole of a few blocks (a search of the whole list, and a CHKP-diff record,
//!   per hole: checkpoints came every few thousand commits). A class list never searches,
//!   and a recycled block always fits the next request of its class. Recycled blocks of a
//!   class no longer in use are returned to the free list by defragmentation
//!   ([`super::defrag`]), or, when the pool is otherwise full, by an allocation.
//!
//! The user data area grows by 2 MiB pages of the page manager (the paper's pre-allocated
//! segments; the page tags list the data pages, and CHKP-diff, [`super::chkp`], the takes).

use super::layout::{self, header, BLOCK};
use super::{ArchtmFault, Inner};
use crate::alloc::{PageTag, PAGE_SIZE};
use crate::ptm::PtmError;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Bytes a slot fetches from the global free list at once for blocks above [`CLASS_MAX`] (the
/// default segment size).
pub const FETCH: u64 = 64 << 10;
/// Deallocations a slot collects before its commit runs garbage collection.
pub const GC_THRESHOLD: usize = 256;
/// The largest block of a size class; larger blocks take the extent path.
pub const CLASS_MAX: u64 = 4096;
/// Size classes: 64, 128, ..., [`CLASS_MAX`] bytes.
pub const CLASSES: usize = (CLASS_MAX / BLOCK) as usize;
/// Bytes of one class a slot takes at once (less if the segment is smaller; at least a block).
pub const CLASS_TAKE: u64 = 16 << 10;
/// 64-byte blocks each slot keeps for tombstones only, so that a thread can free objects in
/// a full pool (a free writes a tombstone version, which needs a block until garbage
/// collection recycles it with the freed copy).
pub const TOMB_RESERVE: usize = 16;

/// The size class of a block of `len` bytes (a multiple of 64), if it has one.
pub fn class_of(len: u64) -> Option<usize> {
    (len <= CLASS_MAX).then(|| (len / BLOCK).max(1) as usize - 1)
}

/// Bytes of a block of size class `class`.
pub fn class_bytes(class: usize) -> u64 {
    (class as u64 + 1) * BLOCK
}

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

/// One slot's free blocks (only its own thread allocates from them).
pub struct SlotLists {
    /// Per size class: free blocks, the lowest address last (popped first).
    pub classes: Vec<Vec<u64>>,
    /// Free extents for blocks above [`CLASS_MAX`] (sorted, disjoint).
    pub extents: Vec<(u64, u64)>,
    /// Up to [`TOMB_RESERVE`] 64-byte blocks only a tombstone may take, when no other block is
    /// left (topped up from the slot's takes of 64-byte blocks).
    pub tomb_reserve: Vec<u64>,
}

impl SlotLists {
    fn new() -> SlotLists {
        SlotLists {
            classes: vec![Vec::new(); CLASSES],
            extents: Vec::new(),
            tomb_reserve: Vec::new(),
        }
    }

    /// Moves 64-byte blocks from the class list into the tombstone reserve until it is full,
    /// keeping `keep` blocks in the list (the highest addresses go, so the list's next
    /// allocations stay contiguous).
    fn top_up_tomb_reserve(&mut self, keep: usize) {
        let list = &mut self.classes[0];
        let n = (TOMB_RESERVE.saturating_sub(self.tomb_reserve.len()))
            .min(list.len().saturating_sub(keep));
        self.tomb_reserve.extend(list.drain(..n));
    }

    /// Every free extent the slot holds, `(offset, bytes)`: its class blocks and its extents.
    pub fn extents_held(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let blocks = self.classes.iter().enumerate().flat_map(|(c, list)| {
            let size = class_bytes(c);
            list.iter().map(move |&off| (off, size))
        });
        let tombs = self.tomb_reserve.iter().map(|&off| (off, BLOCK));
        blocks.chain(self.extents.iter().copied()).chain(tombs)
    }
}

/// The allocator's DRAM state.
pub struct Allocator {
    /// Per slot: its class lists and extents.
    pub slots: Vec<CachePadded<Mutex<SlotLists>>>,
    /// Per slot: its deallocation list.
    pub dealloc: Vec<CachePadded<Mutex<Vec<Dealloc>>>>,
    /// The global free list (sorted, merged): untouched space, and space no class holds.
    pub free: Mutex<Vec<(u64, u64)>>,
    /// Per size class: the global recycle list (block offsets, in address order).
    pub recycled: Vec<Mutex<BTreeSet<u64>>>,
    /// The global recycle list of blocks above [`CLASS_MAX`] (sorted, merged).
    pub recycle: Mutex<Vec<(u64, u64)>>,
    /// Data pages (offsets), in the order they were taken.
    pub pages: Mutex<Vec<u64>>,
    /// One collection (or checkpoint) at a time.
    pub(crate) gc: Mutex<()>,
    /// Per size class: a slot allocated from it since the defragmentation policy last looked
    /// (`Inner::idle_classes`).
    pub(crate) class_used: Vec<AtomicBool>,
    /// Per size class: when the policy last saw it used.
    pub(crate) class_seen: Mutex<Vec<Instant>>,
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

/// The ascending blocks `blocks` of `size` bytes as runs of adjacent blocks `(offset, bytes)`,
/// each within a data page.
fn runs(blocks: &[u64], size: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((o, l)) if *o + *l == b && *o / PAGE_SIZE == b / PAGE_SIZE => *l += size,
            _ => out.push((b, size)),
        }
    }
    out
}

/// Carves up to `want` consecutive blocks of `size` bytes from the free list `free`: from
/// the lowest extent that holds them all, else the lowest that holds one. Returns the first
/// block and the count.
fn carve(free: &mut Vec<(u64, u64)>, size: u64, want: u64) -> Option<(u64, u64)> {
    let i = free
        .iter()
        .position(|&(_, l)| l >= want * size)
        .or_else(|| free.iter().position(|&(_, l)| l >= size))?;
    let (off, l) = free[i];
    let n = (l / size).min(want);
    let take = n * size;
    if take == l {
        free.remove(i);
    } else {
        free[i] = (off + take, l - take);
    }
    Some((off, n))
}

impl Allocator {
    /// An empty allocator for `slots` threads.
    pub fn new(slots: usize) -> Allocator {
        Allocator {
            // Each slot's locks on lines of their own: its thread takes them at every write
            // and commit.
            slots: (0..slots)
                .map(|_| CachePadded::new(Mutex::new(SlotLists::new())))
                .collect(),
            dealloc: (0..slots)
                .map(|_| CachePadded::new(Mutex::new(Vec::new())))
                .collect(),
            free: Mutex::new(Vec::new()),
            recycled: (0..CLASSES).map(|_| Mutex::new(BTreeSet::new())).collect(),
            recycle: Mutex::new(Vec::new()),
            pages: Mutex::new(Vec::new()),
            gc: Mutex::new(()),
            class_used: (0..CLASSES).map(|_| AtomicBool::new(false)).collect(),
            class_seen: Mutex::new(vec![Instant::now(); CLASSES]),
        }
    }

    /// Returns blocks `(offset, bytes)` to `slot`'s lists (aborted copies and tombstones,
    /// already invalidated). A slot that `keeps_reserve` refills its tombstone reserve first:
    /// an aborted transaction may have taken tombstones from it, and left in the 64-byte class
    /// they would go to the next ordinary allocation, leaving a full pool unable to free.
    pub fn give_back(&self, slot: usize, blocks: Vec<(u64, u64)>, keeps_reserve: bool) {
        let mut lists = self.slots[slot].lock();
        let mut extents = Vec::new();
        for (off, len) in blocks {
            match class_of(len) {
                Some(c) => lists.classes[c].push(off),
                None => extents.push((off, len)),
            }
        }
        merge_into(&mut lists.extents, extents);
        if keeps_reserve {
            lists.top_up_tomb_reserve(0);
        }
    }

    /// Bytes in the classes' recycle lists.
    pub fn recycled_class_bytes(&self) -> u64 {
        (self.recycled.iter().enumerate())
            .map(|(c, r)| r.lock().len() as u64 * class_bytes(c))
            .sum()
    }

    /// Bytes free in every list (the slots', the free list and the recycle lists).
    pub fn free_bytes(&self) -> u64 {
        let sum = |l: &[(u64, u64)]| l.iter().map(|e| e.1).sum::<u64>();
        let slots: u64 = (self.slots.iter())
            .map(|l| l.lock().extents_held().map(|e| e.1).sum::<u64>())
            .sum();
        slots + self.recycled_class_bytes() + sum(&self.free.lock()) + sum(&self.recycle.lock())
    }
}

impl Inner {
    /// Allocates a block of `len` bytes (a multiple of 64, within a data page) for `slot`
    /// (§5.4 "Allocation").
    pub(crate) fn alloc_block(&self, slot: usize, len: u64) -> Result<u64, PtmError> {
        let Some(class) = class_of(len) else {
            return self.alloc_extent(slot, len);
        };
        // For the defragmentation policy: a load per allocation, a store once per look.
        let used = &self.alloc.class_used[class];
        if !used.load(Ordering::Relaxed) {
            used.store(true, Ordering::Relaxed);
        }
        let mut lists = self.alloc.slots[slot].lock();
        if let Some(off) = lists.classes[class].pop() {
            return Ok(off);
        }
        let size = class_bytes(class);
        let taken = self.take_class(slot, class, (CLASS_TAKE.min(self.segment) / size).max(1))?;
        lists.classes[class].extend(taken.iter().rev());
        // A take of 64-byte blocks tops up the tombstone reserve (one block stays for this
        // allocation).
        if class == 0 && self.keeps_tomb_reserve(slot) {
            lists.top_up_tomb_reserve(1);
        }
        Ok(lists.classes[class]
            .pop()
            .expect("a take holds at least one block"))
    }

    /// Allocates the 64-byte block of a tombstone for `slot`: an ordinary block, else (the
    /// pool is full) one of the slot's reserve, so that freeing works in a full pool.
    pub(crate) fn alloc_tomb(&self, slot: usize) -> Result<u64, PtmError> {
        match self.alloc_block(slot, BLOCK) {
            Err(PtmError::PoolFull { .. }) => self.alloc.slots[slot]
                .lock()
                .tomb_reserve
                .pop()
                .ok_or_else(|| PtmError::PoolFull {
                    bytes: BLOCK as usize,
                    detail: format!(
                        "the pool is full and this thread's {TOMB_RESERVE} blocks reserved \
                             for the tombstones of frees are in use: commit the frees, then \
                             free more (collection recycles the freed blocks)"
                    ),
                }),
            r => r,
        }
    }

    /// Fills `slot`'s tombstone reserve, if it keeps one: from its 64-byte blocks, else with a
    /// take of just the blocks missing. Best effort: in a full pool it stays short.
    pub(crate) fn fill_tomb_reserve(&self, slot: usize) {
        if !self.keeps_tomb_reserve(slot) {
            return;
        }
        let mut lists = self.alloc.slots[slot].lock();
        lists.top_up_tomb_reserve(0);
        let missing = TOMB_RESERVE - lists.tomb_reserve.len();
        if missing > 0 {
            if let Ok(taken) = self.take_class(slot, 0, missing as u64) {
                lists.tomb_reserve.extend(taken);
            }
        }
    }

    /// Takes up to `want` blocks of size class `class` for `slot`, in address order:
    /// consecutive blocks of the free list, else the lowest recycled blocks of the class.
    fn take_class(&self, slot: usize, class: usize, want: u64) -> Result<Vec<u64>, PtmError> {
        let size = class_bytes(class);
        loop {
            let carved = carve(&mut self.alloc.free.lock(), size, want);
            if let Some((off, n)) = carved {
                // §5.4: the take goes into CHKP-diff before the slot can write there.
                self.record_taken(&[(off, n * size)]);
                return Ok((0..n).map(|i| off + i * size).collect());
            }
            let taken: Vec<u64> = {
                let mut r = self.alloc.recycled[class].lock();
                (0..want).map_while(|_| r.pop_first()).collect()
            };
            if !taken.is_empty() {
                self.record_taken(&runs(&taken, size));
                return Ok(taken);
            }
            if !self.replenish(slot)? {
                return Err(self.pool_full(size));
            }
        }
    }

    /// Allocates a block above [`CLASS_MAX`] from `slot`'s extents (first fit: the lowest
    /// address), fetching a segment from the global free list when none holds it.
    fn alloc_extent(&self, slot: usize, len: u64) -> Result<u64, PtmError> {
        let a = &self.alloc;
        let mut lists = a.slots[slot].lock();
        if let Some(off) = first_fit(&mut lists.extents, len) {
            return Ok(off);
        }
        loop {
            let fetched = {
                let mut free = a.free.lock();
                free.iter().position(|&(_, l)| l >= len).map(|i| {
                    let (off, l) = free[i];
                    let take = l.min(self.segment.max(len));
                    if take == l {
                        free.remove(i);
                    } else {
                        free[i] = (off + take, l - take);
                    }
                    (off, take)
                })
            };
            if let Some((off, take)) = fetched {
                // §5.4: the fetch goes into CHKP-diff before the slot can write there.
                self.record_taken(&[(off, take)]);
                merge_into(&mut lists.extents, vec![(off, take)]);
                return Ok(first_fit(&mut lists.extents, len).expect("the fetched piece fits"));
            }
            if !self.replenish(slot)? {
                return Err(self.pool_full(len));
            }
        }
    }

    /// More free space when the lists have none for the block wanted, cheapest first:
    /// the recycled extents, a collection, a new data page, then the recycle lists of every
    /// class (their blocks merged into the free list, for any size). False if nothing came.
    fn replenish(&self, slot: usize) -> Result<bool, PtmError> {
        let a = &self.alloc;
        let recycled = std::mem::take(&mut *a.recycle.lock());
        if !recycled.is_empty() {
            merge_into(&mut a.free.lock(), recycled);
            return Ok(true);
        }
        if self.gc() > 0 {
            return Ok(true);
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
                return Ok(true);
            }
            Err(crate::alloc::AllocError::PmFull { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(self.release_recycled(|_| true) > 0)
    }

    /// Moves the recycled blocks of the classes `which` selects into the free list, where
    /// neighbours merge and serve any size; returns the bytes moved.
    pub(crate) fn release_recycled(&self, which: impl Fn(usize) -> bool) -> u64 {
        let mut moved = Vec::new();
        for (c, r) in self.alloc.recycled.iter().enumerate() {
            if which(c) {
                let size = class_bytes(c);
                moved.extend(
                    std::mem::take(&mut *r.lock())
                        .into_iter()
                        .map(|o| (o, size)),
                );
            }
        }
        let bytes = moved.iter().map(|e| e.1).sum();
        merge_into(&mut self.alloc.free.lock(), moved);
        bytes
    }

    fn pool_full(&self, len: u64) -> PtmError {
        PtmError::PoolFull {
            bytes: len as usize,
            detail: format!(
                "all {} MiB of the pool are in use by objects or not yet collected",
                self.pool.len() >> 20
            ),
        }
    }

    /// Garbage collection (§5.4 "Deallocation"): gathers every slot's deallocation list, zeroes
    /// the freed headers (ordinary blocks, fence, then tombstones, fence: a tombstone must
    /// outlive the copies it deletes) and sorts the blocks into the recycle lists.
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
        // Into the recycle lists: each class's in address order, larger blocks as extents.
        let mut extents = Vec::new();
        let mut by_class: Vec<(usize, u64)> = Vec::with_capacity(blocks.len());
        for b in blocks {
            match class_of(b.len) {
                Some(c) => by_class.push((c, b.off)),
                None => extents.push((b.off, b.len)),
            }
        }
        by_class.sort_unstable();
        for group in by_class.chunk_by(|x, y| x.0 == y.0) {
            self.alloc.recycled[group[0].0]
                .lock()
                .extend(group.iter().map(|&(_, off)| off));
        }
        merge_into(&mut self.alloc.recycle.lock(), extents);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptm::archtm::ArchTm;
    use crate::ptm::PtmConfig;

    fn engine() -> ArchTm {
        let mut c = PtmConfig::temporary().size(16 << 20).inline_background();
        c.checkpoint_every = 0;
        ArchTm::create(&c, &[0; 8]).unwrap()
    }

    fn consecutive(blocks: &[u64], size: u64) -> bool {
        blocks.windows(2).all(|w| w[1] == w[0] + size)
    }

    /// §4.4's locality: a slot's consecutive allocations of a class are consecutive blocks of
    /// one segment, even when it allocates another class in between.
    #[test]
    fn a_slots_allocations_of_a_class_come_in_address_order_from_one_segment() {
        let eng = engine();
        let inner = &eng.inner;
        let (mut small, mut mid) = (Vec::new(), Vec::new());
        for _ in 0..CLASS_TAKE / 192 {
            small.push(inner.alloc_block(1, 64).unwrap());
            mid.push(inner.alloc_block(1, 192).unwrap());
        }
        assert!(consecutive(&small, 64), "{small:?}");
        assert!(consecutive(&mid, 192), "{mid:?}");
        // Each class from its own segment of at most CLASS_TAKE bytes.
        assert!(small[0] + CLASS_TAKE <= mid[0] || mid[0] + CLASS_TAKE <= small[0]);
        // The next take of a class continues after its last one (fresh space, in order).
        let more: Vec<u64> = (0..CLASS_TAKE / 64)
            .map(|_| inner.alloc_block(1, 64).unwrap())
            .collect();
        assert!(more.windows(2).all(|w| w[0] < w[1]), "ascending");
        // Another slot takes a segment of its own.
        let other = inner.alloc_block(2, 64).unwrap();
        assert!(!small.contains(&other) && !more.contains(&other));
    }

    /// Once the free list is used up, a take of a class comes from the class's recycle list,
    /// lowest addresses first, whatever order the blocks were freed in, before a new page.
    #[test]
    fn recycled_blocks_are_taken_in_address_order_before_a_new_page() {
        let eng = engine();
        let inner = &eng.inner;
        let mut blocks = Vec::new();
        loop {
            blocks.push(inner.alloc_block(1, 64).unwrap());
            let list_empty = inner.alloc.slots[1].lock().classes[0].is_empty();
            if list_empty && inner.alloc.free.lock().is_empty() {
                break;
            }
        }
        let pages = inner.alloc.pages.lock().len();
        // Free every third block, in reverse order, and collect them.
        let mut freed: Vec<u64> = blocks.iter().copied().step_by(3).collect();
        inner.alloc.dealloc[1]
            .lock()
            .extend(freed.iter().rev().map(|&off| Dealloc {
                off,
                len: 64,
                tomb: false,
                large: false,
                object: (0, 0),
            }));
        assert_eq!(inner.gc(), freed.len() as u64 * 64);
        freed.sort_unstable();
        let again: Vec<u64> = (0..300)
            .map(|_| inner.alloc_block(1, 64).unwrap())
            .collect();
        assert_eq!(again, freed[..300], "the lowest recycled blocks, in order");
        assert_eq!(inner.alloc.pages.lock().len(), pages, "no new page");
    }

    #[test]
    fn classes_runs_and_carving() {
        assert_eq!(class_of(64), Some(0));
        assert_eq!(class_of(4096), Some(CLASSES - 1));
        assert_eq!(class_of(4160), None);
        assert_eq!(class_bytes(class_of(192).unwrap()), 192);
        let p = PAGE_SIZE;
        // Adjacent blocks form a run, but never across a page boundary.
        assert_eq!(
            runs(&[p - 128, p - 64, p, p + 128], 64),
            vec![(p - 128, 128), (p, 64), (p + 128, 64)]
        );
        // A carve prefers the lowest extent that holds the whole take.
        let mut free = vec![(p, 128), (2 * p, 4096)];
        assert_eq!(carve(&mut free, 64, 16), Some((2 * p, 16)));
        assert_eq!(free, vec![(p, 128), (2 * p + 1024, 3072)]);
        // Else the lowest that holds one block; a remainder smaller than a block stays.
        let mut free = vec![(p, 320), (2 * p, 128)];
        assert_eq!(carve(&mut free, 128, 16), Some((p, 2)));
        assert_eq!(free, vec![(p + 256, 64), (2 * p, 128)]);
        assert_eq!(carve(&mut vec![(p, 64)], 128, 1), None);
    }
}
