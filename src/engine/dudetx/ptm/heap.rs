//! The persistent-object heap of DUDETx behind `pmtx::ptm` (§3.1, §3.6): size-class pages of
//! slots in PM, their DRAM shadow frames (one per PM page: the shadow memory *perform* runs on),
//! the DRAM free lists (`pmalloc`/`pfree`), and the reproduce step's applier of word and
//! allocation-log ops to the PM pages.
//!
//! ```text
//! heap page (kind HEAP, value = size class c): slots of 16 << c bytes
//!   slot: 0 header word   8.. the object's bytes (the handle names byte 8)
//!   header: 0 (never used) | tag (16 bits: LIVE or FREE) gen (16) size (32)
//! handle: gen << 48 | the pool offset of the object's first byte
//! ```
//!
//! A slot's header changes only through the allocation log (§3.5): `pmalloc` and `pfree` write
//! the header in the transaction's shadow write set, and commit logs it as an op of the
//! [`ALLOC_LOG`] space (the data words go to [`WORD_LOG`]). Both travel in the transaction's
//! redo record, so the persisted allocation state is exactly the one the persisted log says:
//! recovery replays the allocation ops with the data and rebuilds the free lists from the
//! headers.

use super::super::log::{OpRef, Write};
use super::super::pipeline::Apply;
use super::super::pipeline::Core;
use super::super::DudetxFault;
use crate::alloc::{PageManager, PageTag, PAGE_SIZE};
use crate::pmem::Pool;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// Page kind of a heap page (value: its size class).
pub const HEAP_KIND: u8 = 5;
/// Size classes: slots of 16 B to 2 MiB.
pub const CLASSES: usize = 18;
/// The largest object (a slot of a whole page less its header).
pub const MAX_OBJECT: usize = PAGE_SIZE as usize - 8;
/// The log "table" of data words (key: the word's pool offset, row: its 8 bytes).
pub const WORD_LOG: u32 = 0xFFFF_FF00;
/// The log "table" of the allocation log (§3.5; key: a slot header's pool offset, row: the
/// header word).
pub const ALLOC_LOG: u32 = 0xFFFF_FF01;

const LIVE_TAG: u64 = 0xA11C;
const FREE_TAG: u64 = 0xF4EE;
/// Bits of a handle below the generation.
pub const OFFSET_BITS: u32 = 48;

/// Slot bytes of class `c`.
pub fn slot_bytes(class: usize) -> u64 {
    16 << class
}

/// The smallest class whose slot holds an object of `size` bytes and its header.
pub fn class_for(size: usize) -> Option<usize> {
    (0..CLASSES).find(|&c| slot_bytes(c) >= size as u64 + 8)
}

/// A decoded slot header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Allocated (else freed, or never used: `gen` 0).
    pub live: bool,
    /// Generation: bumped by every allocation of the slot, so stale handles are refused.
    pub gen: u64,
    /// Object bytes.
    pub size: u64,
}

impl Header {
    /// The header word.
    pub fn encode(self) -> u64 {
        let tag = if self.live { LIVE_TAG } else { FREE_TAG };
        (tag << 48) | (self.gen << 32) | self.size
    }
    /// Decodes a header word; `None`: not a header (damage).
    pub fn decode(w: u64) -> Option<Header> {
        if w == 0 {
            return Some(Header {
                live: false,
                gen: 0,
                size: 0,
            });
        }
        let live = match w >> 48 {
            LIVE_TAG => true,
            FREE_TAG => false,
            _ => return None,
        };
        Some(Header {
            live,
            gen: (w >> 32) & 0xFFFF,
            size: w & 0xFFFF_FFFF,
        })
    }
}

/// The default shadow page (frame) size: the paper's 4 KiB (§3.6).
pub const DEFAULT_SHADOW_PAGE: usize = 4096;

/// Checks a shadow page size: a power of two from 4 KiB to a heap page (2 MiB).
pub fn check_shadow_page(bytes: usize) -> Result<(), String> {
    if !bytes.is_power_of_two() || !(4096..=PAGE_SIZE as usize).contains(&bytes) {
        return Err(format!(
            "the DUDETx shadow page size must be a power of two from 4096 to {PAGE_SIZE} bytes, \
             not {bytes}"
        ));
    }
    Ok(())
}

/// One shadow page's DRAM frame (§3.1: the shadow memory transactions perform on; §3.6: a
/// shadow page is a 4 KiB piece of a heap page by default).
pub struct Frame {
    /// The heap page's size class.
    pub class: usize,
    /// The pool offset of the heap page holding the frame (slots are aligned to it).
    pub page: u64,
    /// The frame's pool offset.
    pub base: u64,
    /// The frame's words.
    pub words: Box<[AtomicU64]>,
}

impl Frame {
    fn zeroed(class: usize, page: u64, base: u64, bytes: u64) -> Frame {
        Frame {
            class,
            page,
            base,
            words: (0..bytes / 8).map(|_| AtomicU64::new(0)).collect(),
        }
    }
    /// The word at pool offset `addr` (in this frame, 8-aligned).
    pub fn word(&self, addr: u64) -> &AtomicU64 {
        &self.words[((addr - self.base) / 8) as usize]
    }
    /// Whether `addr` is in this frame.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + self.words.len() as u64 * 8
    }
    /// The pool offsets of the slot headers in this frame (a slot larger than a frame has its
    /// header in the frame it starts in).
    fn headers(&self) -> impl Iterator<Item = u64> {
        let slot = slot_bytes(self.class);
        let first = self.page + (self.base - self.page).div_ceil(slot) * slot;
        let end = self.base + self.words.len() as u64 * 8;
        (first..end).step_by(slot as usize)
    }
}

/// A shadow page (§3.6 paging): its frame when resident, its touching id (the last
/// transaction that wrote it), and when it was last used (for eviction).
pub struct PageSlot {
    /// The heap page's size class.
    pub class: usize,
    /// The pool offset of the heap page holding it.
    pub page: u64,
    /// The shadow page's pool offset.
    pub base: u64,
    frame: RwLock<Option<Arc<Frame>>>,
    /// The touching id (§3.6): the id of the last transaction that wrote the page.
    touch: AtomicU64,
    used: AtomicU64,
}

/// Paging counters (§6.5).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PagingStats {
    /// Frames resident now.
    pub resident: u64,
    /// Pages loaded from PM after the first load.
    pub loads: u64,
    /// Frames evicted (discarded, §3.6: never written back).
    pub evictions: u64,
    /// Loads that waited for reproduce (the touching id was newer than the reproduced id).
    pub waits: u64,
}

/// The resident shadow pages, for eviction: a list to sample and each one's place in it.
#[derive(Default)]
struct Resident {
    list: Vec<Arc<PageSlot>>,
    at: HashMap<u64, usize>,
    /// Where the next eviction's sample starts (a clock hand over `list`).
    hand: usize,
}

impl Resident {
    fn insert(&mut self, s: &Arc<PageSlot>) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.at.entry(s.base) {
            e.insert(self.list.len());
            self.list.push(s.clone());
        }
    }
    fn remove(&mut self, base: u64) {
        if let Some(i) = self.at.remove(&base) {
            self.list.swap_remove(i);
            if let Some(moved) = self.list.get(i) {
                self.at.insert(moved.base, i);
            }
        }
    }
}

/// Resident frames an eviction compares (the least recently used of them goes).
const EVICTION_SAMPLE: usize = 32;

/// The shadow memory: shadow pages (4 KiB pieces of the heap pages by default) by pool offset,
/// each resident as a frame or paged out, and the free slots of each class.
///
/// Paging (§3.6, software-based as §3.6.2): at most `capacity` frames are resident (0: every
/// page). A page is loaded on touch; when the shadow is full the least recently used of a
/// sample of resident frames that no transaction holds (the frame's `Arc` is the slot's only
/// one: §3.6.2's reference count) is discarded without write-back, since its committed writes
/// are in the redo log. A page whose touching id is newer than the reproduced id is loaded only
/// after reproduce catches up, so a reload is never stale.
pub struct Shadow {
    pages: RwLock<HashMap<u64, Arc<PageSlot>>>,
    /// Bytes of a shadow page (a power of two, 4 KiB to 2 MiB).
    frame_bytes: u64,
    /// The resident frames (for eviction).
    resident_set: Mutex<Resident>,
    /// Free slots (pool offsets of their headers) per class: the DRAM `pmalloc` state.
    pub free: Mutex<Vec<Vec<u64>>>,
    /// Frames at most (0: see `percent`).
    frames: usize,
    /// Frames at most as a percentage of the heap pages (0: every page, unless `frames`).
    percent: usize,
    /// Whether pages are ever evicted ([`Shadow::pages`]).
    paging: bool,
    resident: AtomicUsize,
    tick: AtomicU64,
    /// The pipeline: the pool and the reproduced id, and how to wait for it.
    core: OnceLock<Weak<Core<ObjectApply>>>,
    counters: [AtomicU64; 3],
}

impl Default for Shadow {
    fn default() -> Self {
        Shadow::with_capacity(0, 0, DEFAULT_SHADOW_PAGE)
    }
}

impl Shadow {
    /// A shadow of shadow pages of `frame_bytes` (see [`check_shadow_page`]) holding at most
    /// `frames` resident frames, or (`frames` 0) `percent` % of the shadow pages (at least one;
    /// both 0: every page).
    pub fn with_capacity(frames: usize, percent: usize, frame_bytes: usize) -> Shadow {
        Shadow {
            pages: RwLock::new(HashMap::new()),
            frame_bytes: frame_bytes as u64,
            resident_set: Mutex::new(Resident::default()),
            free: Mutex::new(vec![Vec::new(); CLASSES]),
            frames,
            percent,
            paging: Shadow::pages(frames, percent),
            resident: AtomicUsize::new(0),
            tick: AtomicU64::new(0),
            core: OnceLock::new(),
            counters: Default::default(),
        }
    }

    /// Whether a shadow of `frames` frames or `percent` % of the heap pages (0 and 100 %: every
    /// page, no paging) ever evicts a page: the one rule, for the shadow and its configuration.
    pub(crate) fn pages(frames: usize, percent: usize) -> bool {
        frames > 0 || (1..100).contains(&percent)
    }

    /// Frames the shadow holds at most now (0: no limit).
    fn capacity(&self) -> usize {
        match (self.paging, self.frames) {
            (false, _) => 0,
            (true, 0) => (self.frame_count() * self.percent / 100).max(1),
            (true, f) => f,
        }
    }

    /// Connects the shadow to its pipeline (page loads read PM and wait for reproduce).
    pub(crate) fn attach(&self, core: &Arc<Core<ObjectApply>>) {
        let _ = self.core.set(Arc::downgrade(core));
    }

    /// The paging counters.
    pub fn paging_stats(&self) -> PagingStats {
        let c = |i: usize| self.counters[i].load(Ordering::Relaxed);
        PagingStats {
            resident: self.resident.load(Ordering::Relaxed) as u64,
            loads: c(0),
            evictions: c(1),
            waits: c(2),
        }
    }

    /// The shadow page holding `addr`, if it is in a heap page (never loads it).
    pub fn page(&self, addr: u64) -> Option<Arc<PageSlot>> {
        self.pages.read().get(&self.frame_base(addr)).cloned()
    }

    /// The pool offset of the shadow page holding `addr`.
    pub fn frame_base(&self, addr: u64) -> u64 {
        addr & !(self.frame_bytes - 1)
    }

    /// Heap pages.
    pub fn page_count(&self) -> usize {
        self.frame_count() / (PAGE_SIZE / self.frame_bytes) as usize
    }

    /// Shadow pages (resident or not).
    pub fn frame_count(&self) -> usize {
        self.pages.read().len()
    }

    /// The frame of the heap page holding `addr`, if it is one, loaded if it is paged out
    /// (`None` also when the load cannot wait for reproduce: the pipeline failed).
    pub fn frame(&self, addr: u64) -> Option<Arc<Frame>> {
        let slot = self.page(addr)?;
        // The LRU clock only matters to eviction: without paging, no shared counter per access.
        if self.paging {
            slot.used
                .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        }
        if let Some(f) = slot.frame.read().as_ref() {
            return Some(f.clone());
        }
        self.page_in(&slot)
    }

    /// Records that transaction `id` wrote the page holding `addr` (its touching id, §3.6);
    /// called while the writer holds the frame, so it cannot be evicted before.
    pub fn touch(&self, addr: u64, id: u64) {
        if self.paging {
            if let Some(s) = self.page(addr) {
                s.touch.fetch_max(id, Ordering::AcqRel);
            }
        }
    }

    fn page_in(&self, slot: &Arc<PageSlot>) -> Option<Arc<Frame>> {
        let core = self.core.get()?.upgrade()?;
        let capacity = self.capacity();
        if capacity > 0 {
            while self.resident.load(Ordering::Relaxed) >= capacity {
                if !self.evict_one() {
                    break; // every frame is in use: the shadow overshoots for now
                }
            }
        }
        loop {
            let mut g = slot.frame.write();
            if let Some(f) = g.as_ref() {
                return Some(f.clone());
            }
            if slot.touch.load(Ordering::Acquire) <= core.reproduced.load(Ordering::Acquire) {
                let f = Arc::new(Frame::zeroed(
                    slot.class,
                    slot.page,
                    slot.base,
                    self.frame_bytes,
                ));
                core.pool.read_words(slot.base, &f.words);
                *g = Some(f.clone());
                self.resident_set.lock().insert(slot);
                self.resident.fetch_add(1, Ordering::Relaxed);
                self.counters[0].fetch_add(1, Ordering::Relaxed);
                return Some(f);
            }
            // Un-reproduced writes: the PM page is stale until reproduce applies them.
            drop(g);
            self.counters[2].fetch_add(1, Ordering::Relaxed);
            core.drain().ok()?;
        }
    }

    /// Discards a frame no transaction holds, the least recently used of a sample of
    /// [`EVICTION_SAMPLE`] resident frames taken round the resident list (with 4 KiB pages the
    /// shadow holds too many frames to sort them all at every eviction; the sample moves on
    /// each time, so every frame is considered in turn); false if no resident frame is free.
    fn evict_one(&self) -> bool {
        let free = |s: &PageSlot| {
            s.frame
                .try_read()
                .is_some_and(|f| f.as_ref().is_some_and(|f| Arc::strong_count(f) == 1))
        };
        let mut set = self.resident_set.lock();
        let n = set.list.len();
        let mut seen = 0;
        while seen < n {
            let take = EVICTION_SAMPLE.min(n - seen);
            let start = set.hand % n;
            set.hand = (start + take) % n;
            let victim = (0..take)
                .map(|i| set.list[(start + i) % n].clone())
                .filter(|s| free(s))
                .min_by_key(|s| s.used.load(Ordering::Relaxed));
            seen += take;
            let Some(s) = victim else { continue };
            let evicted = match s.frame.try_write() {
                Some(mut g) if g.as_ref().is_some_and(|f| Arc::strong_count(f) == 1) => {
                    *g = None;
                    true
                }
                _ => false,
            };
            if evicted {
                set.remove(s.base);
                self.resident.fetch_sub(1, Ordering::Relaxed);
                self.counters[1].fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// Adds a heap page of `class` at `page`: its shadow pages, paged out (`load` or a touch
    /// loads them).
    pub fn add_page(&self, class: usize, page: u64) -> Vec<Arc<PageSlot>> {
        let slots: Vec<Arc<PageSlot>> = (0..PAGE_SIZE / self.frame_bytes)
            .map(|i| {
                Arc::new(PageSlot {
                    class,
                    page,
                    base: page + i * self.frame_bytes,
                    frame: RwLock::new(None),
                    touch: AtomicU64::new(0),
                    used: AtomicU64::new(0),
                })
            })
            .collect();
        let mut pages = self.pages.write();
        for s in &slots {
            pages.insert(s.base, s.clone());
        }
        slots
    }

    /// A free slot of `class` (its header's offset), taking a new PM page when none is left
    /// (without paging its frames resident and zero, as a free page is, `PageManager::free`;
    /// with paging paged out, loaded on touch).
    pub fn take_slot(&self, pool: &Pool, pages: &PageManager, class: usize) -> Result<u64, String> {
        let mut free = self.free.lock();
        if let Some(at) = free[class].pop() {
            return Ok(at);
        }
        let index = pages
            .allocate(
                pool,
                PageTag {
                    kind: HEAP_KIND,
                    owner: 0,
                    value: class as u64,
                },
            )
            .map_err(|e| e.to_string())?;
        let base = pages.page_offset(index);
        let slots = self.add_page(class, base);
        if !self.paging {
            let mut set = self.resident_set.lock();
            for s in &slots {
                *s.frame.write() = Some(Arc::new(Frame::zeroed(
                    class,
                    base,
                    s.base,
                    self.frame_bytes,
                )));
                set.insert(s);
                self.resident.fetch_add(1, Ordering::Relaxed);
            }
        }
        let slot = slot_bytes(class);
        free[class].extend((1..PAGE_SIZE / slot).rev().map(|i| base + i * slot));
        Ok(base)
    }

    /// Returns slots to their free lists.
    pub fn release(&self, slots: &[(usize, u64)]) {
        let mut free = self.free.lock();
        for &(class, at) in slots {
            free[class].push(at);
        }
    }

    fn slots_sorted(&self) -> Vec<Arc<PageSlot>> {
        let mut v: Vec<Arc<PageSlot>> = self.pages.read().values().cloned().collect();
        v.sort_unstable_by_key(|s| s.base);
        v
    }

    /// The page's frame if resident, else its PM contents read into a frame that is not kept.
    fn contents(&self, pool: &Pool, s: &PageSlot) -> (Arc<Frame>, bool) {
        if let Some(f) = s.frame.read().as_ref() {
            return (f.clone(), true);
        }
        let f = Arc::new(Frame::zeroed(s.class, s.page, s.base, self.frame_bytes));
        pool.read_words(s.base, &f.words);
        (f, false)
    }

    /// After recovery: the free lists rebuilt from every page's slot headers (the pages read
    /// from PM; as many kept resident as the shadow holds); returns the live objects. A header
    /// that is not one is damage.
    pub fn load(&self, pool: &Pool) -> Result<u64, String> {
        let mut live = 0;
        let mut free = self.free.lock();
        for s in self.slots_sorted() {
            let (f, _) = self.contents(pool, &s);
            let headers: Vec<u64> = f.headers().collect();
            for &at in headers.iter().rev() {
                let w = f.word(at).load(Ordering::Relaxed);
                match Header::decode(w) {
                    Some(h) if h.live => live += 1,
                    Some(_) => free[f.class].push(at),
                    None => {
                        return Err(format!(
                            "the header word {w:#x} of the slot at {at} is not a DUDETx header"
                        ))
                    }
                }
            }
            let capacity = self.capacity();
            if capacity == 0 || self.resident.load(Ordering::Relaxed) < capacity {
                let mut g = s.frame.write();
                if g.is_none() {
                    *g = Some(f);
                    self.resident_set.lock().insert(&s);
                    self.resident.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(live)
    }

    /// The heap's invariants (no transaction running, everything reproduced): each resident
    /// frame equals its PM page; each slot is live or on its free list, never both, never
    /// twice; `live` slots are live.
    pub fn check(&self, pool: &Pool, live: u64) -> Result<(), String> {
        let free = self.free.lock();
        let mut on_list: HashMap<u64, usize> = HashMap::new();
        for (class, list) in free.iter().enumerate() {
            for &at in list {
                if on_list.insert(at, class).is_some() {
                    return Err(format!(
                        "slot {at} is twice on the free list (it would be owned twice)"
                    ));
                }
            }
        }
        let mut counted = 0;
        for s in self.slots_sorted() {
            let (f, resident) = self.contents(pool, &s);
            if resident {
                let pm = pool.read_vec(f.base, self.frame_bytes as usize);
                for (i, w) in f.words.iter().enumerate() {
                    let v = w.load(Ordering::Relaxed);
                    let p = u64::from_le_bytes(pm[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                    if v != p {
                        return Err(format!(
                            "word {} differs between the DRAM shadow ({v:#x}) and PM ({p:#x}) \
                             though everything is reproduced",
                            f.base + i as u64 * 8
                        ));
                    }
                }
            }
            for at in f.headers() {
                let h = Header::decode(f.word(at).load(Ordering::Relaxed))
                    .ok_or_else(|| format!("slot {at} has a damaged header"))?;
                match (h.live, on_list.remove(&at)) {
                    (true, Some(_)) => {
                        return Err(format!(
                            "slot {at} is allocated and on the free list (double ownership)"
                        ))
                    }
                    (false, None) => {
                        return Err(format!("slot {at} is neither allocated nor free (leaked)"))
                    }
                    (false, Some(c)) if c != f.class => {
                        return Err(format!("slot {at} is on the free list of class {c}"))
                    }
                    (true, None) => counted += 1,
                    _ => {}
                }
            }
        }
        if let Some((at, _)) = on_list.into_iter().next() {
            return Err(format!("the free list holds {at}, which is no heap slot"));
        }
        if counted != live {
            return Err(format!(
                "{counted} slots are allocated, the engine counts {live} live objects"
            ));
        }
        Ok(())
    }
}

/// The reproduce step's applier (§3.4) for the object heap: a word op writes the word of a heap
/// page, an allocation-log op a slot's header (checked to be one).
pub struct ObjectApply {
    /// The heap pages (their frames), to check that an op writes a heap page.
    pub shadow: Arc<Shadow>,
}

impl Apply for ObjectApply {
    fn apply(
        &mut self,
        pool: &Pool,
        _pages: &PageManager,
        op: OpRef<'_>,
        fault: Option<DudetxFault>,
    ) -> Result<(), String> {
        let value = match op.write {
            Write::Put(b) if b.len() == 8 => u64::from_le_bytes(b.try_into().expect("8 bytes")),
            _ => return Err(format!("a log op at {} is not one 8-byte word", op.key)),
        };
        let Some(f) = self.shadow.page(op.key) else {
            return Err(format!(
                "a log op writes offset {}, which is in no heap page",
                op.key
            ));
        };
        if op.key % 8 != 0 {
            return Err(format!("a log op writes the unaligned offset {}", op.key));
        }
        match op.table {
            WORD_LOG => {}
            ALLOC_LOG => {
                if (op.key - f.page) % slot_bytes(f.class) != 0 || Header::decode(value).is_none() {
                    return Err(format!(
                        "an allocation-log op writes {value:#x} at {}, which is no slot header",
                        op.key
                    ));
                }
            }
            t => return Err(format!("a log op of the unknown space {t:#x}")),
        }
        pool.write_u64(op.key, value);
        if fault != Some(DudetxFault::SkipHeapFlush) {
            pool.flush(op.key, 8);
        }
        Ok(())
    }
}
