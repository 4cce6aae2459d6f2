//! Recovery without a heap scan (issue 17): the lazy heap sweep.
//!
//! A table whose primary index is in PM (and that has no DRAM secondary index to rebuild) needs
//! nothing from its heap to run transactions, except three things the DRAM-index recovery got
//! from its scan: the free slots, the locks that a crash left set, and the tid clock's floor.
//!
//! - **The clock** comes from the *tid lease* in the meta page (`layout::meta::TID_LEASE_AT`):
//!   every commit tid's timestamp is below it, because a commit (or a TO/MVTO begin) that would
//!   reach it first persists a new lease ([`FalconEngine::ensure_lease`]), once per
//!   [`LEASE_SPAN`] µs of clock. Recovery starts the clock above the lease and the window's tids.
//! - **Locks and free slots** are found lazily, page by page, while transactions already run
//!   (the "rebuild lazily in the background"): each heap page of such a table starts
//!   *dirty*; it is *cleaned* (every lock on it reset to the idle word of its `write_ts`, every
//!   slot that is not live added to the table's recovered free list) by a background thread, or
//!   by the first transaction that reaches a tuple on it through the index ([`Sweep::gate`]),
//!   whichever comes first. Since no transaction of this run touches a tuple of a dirty page
//!   before it is cleaned, every lock found on a dirty page is a stale one.
//! - **Index entries of uncommitted inserts.** Falcon publishes an insert in the index (locked)
//!   before its log slot is written; a crash in between leaves an entry whose slot is not live
//!   with that key. Lookups already treat such a slot as a miss; an insert of the key withdraws
//!   the entry (`worker.rs`), and so does the sweep's last pass over the index.
//!
//! **Crash safety.** The sweep writes only lock words (idempotent resets of locks that are stale
//! whenever a sweep finds them: a reset lost in a crash is redone by the next recovery, which
//! again treats every lock on a dirty page as stale) and removes index entries whose slot is not
//! live with their key (each removal is atomic, and repeating it is harmless). Free slots are
//! DRAM state. Proved by the crash suite with chains of crashes across recoveries
//! (tests/crash_suite.rs, `falcon_pm_index_*`) and by real kills.
//!
//! **Departure from Falcon.** Falcon persists its deleted list and clears lock bits from the
//! write sets in its window, which hold every tuple a transaction locked (§5.2.2). pmtx's window
//! holds redo entries only after the commit's locks are taken, so it cannot name the tuples an
//! uncommitted transaction locked; it resets them lazily instead. Deleted slots awaiting
//! reclamation (§5.4) become free slots: after a restart no running transaction can see them.

use super::layout::tuple;
use super::recovery::{live_with_key, tuple_header_problem};
use super::{FalconEngine, TableRt};
use crate::alloc::PAGE_SIZE;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Microseconds of clock a persisted tid lease covers: one small persist per 10 s of commits.
pub(crate) const LEASE_SPAN: u64 = 10_000_000;

const CLEAN: u8 = 0;
const DIRTY: u8 = 1;
const CLEANING: u8 = 2;

/// The lazy sweep of the heap pages recovery did not scan.
pub(crate) struct Sweep {
    /// Per pool page index: `CLEAN` (also every page not to sweep), `DIRTY` or `CLEANING`.
    state: Box<[AtomicU8]>,
    /// The pages to sweep: (page index, page offset, table).
    pages: Vec<(u64, u64, u32)>,
    /// The table of each dirty page, by page index (`u32::MAX`: none).
    table_of: Box<[u32]>,
    /// The background sweeper's position in `pages`.
    next: AtomicUsize,
    /// Pages not yet clean.
    remaining: AtomicUsize,
    /// Work left: pages, or the final pass over the PM indexes.
    pending: AtomicBool,
    /// Serialises the final index pass.
    finishing: Mutex<()>,
    /// Free slots found, per table.
    free: Box<[Mutex<Vec<u64>>]>,
    /// Whether `free[table]` may hold slots (a cheap check on the insert path).
    has_free: Box<[AtomicBool]>,
    /// Damage found in a page (reported by the structure check; the slot is not reused).
    problems: Mutex<Vec<String>>,
    locks_cleared: AtomicU64,
    dangling_removed: AtomicU64,
    started: Instant,
    /// Milliseconds from recovery's end until the sweep finished (0 while pending).
    finished_us: AtomicU64,
}

impl Sweep {
    /// A sweep of `pages` (page index, offset, table) in a pool of `page_count` pages.
    pub fn new(page_count: u64, pages: Vec<(u64, u64, u32)>, tables: usize) -> Sweep {
        let state: Box<[AtomicU8]> = (0..page_count).map(|_| AtomicU8::new(CLEAN)).collect();
        let mut table_of = vec![u32::MAX; page_count as usize].into_boxed_slice();
        for &(index, _, table) in &pages {
            state[index as usize].store(DIRTY, Ordering::Relaxed);
            table_of[index as usize] = table;
        }
        Sweep {
            remaining: AtomicUsize::new(pages.len()),
            pending: AtomicBool::new(true),
            state,
            table_of,
            pages,
            next: AtomicUsize::new(0),
            finishing: Mutex::new(()),
            free: (0..tables).map(|_| Mutex::new(Vec::new())).collect(),
            has_free: (0..tables).map(|_| AtomicBool::new(false)).collect(),
            problems: Mutex::new(Vec::new()),
            locks_cleared: AtomicU64::new(0),
            dangling_removed: AtomicU64::new(0),
            started: Instant::now(),
            finished_us: AtomicU64::new(0),
        }
    }

    /// Pages recovery left to the sweep.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Whether work is left.
    #[inline]
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Makes sure the page holding tuple `t` is clean before a transaction touches `t`.
    #[inline]
    pub fn gate(&self, eng: &FalconEngine, t: u64) {
        if !self.pending() {
            return;
        }
        if let Some(index) = eng.pages.page_of(t) {
            if (index as usize) < self.state.len() {
                self.ensure_clean(eng, index);
            }
        }
    }

    fn ensure_clean(&self, eng: &FalconEngine, index: u64) {
        let state = &self.state[index as usize];
        loop {
            match state.load(Ordering::Acquire) {
                CLEAN => return,
                DIRTY => {
                    if state
                        .compare_exchange(DIRTY, CLEANING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.clean(eng, index);
                        state.store(CLEAN, Ordering::Release);
                        self.remaining.fetch_sub(1, Ordering::AcqRel);
                        return;
                    }
                }
                _ => std::thread::yield_now(),
            }
        }
    }

    /// Resets the stale locks of page `index` and collects its free slots.
    fn clean(&self, eng: &FalconEngine, index: u64) {
        let table_id = self.table_of[index as usize];
        let tables = eng.tables.read();
        let Some(table) = tables.get(table_id as usize).cloned() else {
            return;
        };
        drop(tables);
        let pool = &eng.pool;
        let page = eng.pages.page_offset(index);
        let idle = eng.protocol.implementation();
        let mut free = Vec::new();
        let mut cleared = 0;
        for i in 0..PAGE_SIZE / table.slot {
            let t = page + i * table.slot;
            let flags = pool.read_u64(t + tuple::FLAGS);
            let write_ts = pool.read_u64(t + tuple::WRITE_TS);
            let key = pool.read_u64(t + tuple::KEY);
            if let Some(problem) =
                tuple_header_problem(flags, write_ts, key, eng.config.max_threads)
            {
                self.problems.lock().push(format!(
                    "table {}: tuple at {t}: {problem}",
                    table.schema.name
                ));
                continue;
            }
            // Not flushed: a reset lost in a crash is redone by the next recovery.
            let unlocked = idle.idle_word(write_ts);
            if pool.read_u64(t + tuple::CC) != unlocked {
                pool.write_u64(t + tuple::CC, unlocked);
                cleared += 1;
            }
            if flags != tuple::LIVE {
                free.push(t);
            }
        }
        self.locks_cleared.fetch_add(cleared, Ordering::Relaxed);
        if !free.is_empty() {
            // Popped from the end: lowest offsets first.
            free.reverse();
            self.free[table_id as usize].lock().extend(free);
            self.has_free[table_id as usize].store(true, Ordering::Release);
        }
    }

    /// Up to `n` recovered free slots of `table`, appended to `out`.
    pub fn take_free(&self, table: u32, n: usize, out: &mut Vec<u64>) {
        let Some(flag) = self.has_free.get(table as usize) else {
            return;
        };
        if !flag.load(Ordering::Acquire) {
            return;
        }
        let mut free = self.free[table as usize].lock();
        let take = free.len().min(n);
        let at = free.len() - take;
        out.extend(free.drain(at..));
        if free.is_empty() {
            flag.store(false, Ordering::Release);
        }
    }

    /// Cleans pages of `table` until one yields free slots (for an insert that found PM full
    /// while pages are still dirty); returns whether any were found.
    pub fn help_for_space(&self, eng: &FalconEngine, table: u32) -> bool {
        for &(index, _, t) in &self.pages {
            if t == table && self.state[index as usize].load(Ordering::Acquire) == DIRTY {
                self.ensure_clean(eng, index);
                if self.has_free[table as usize].load(Ordering::Acquire) {
                    return true;
                }
            }
        }
        self.has_free[table as usize].load(Ordering::Acquire)
    }

    /// One step of the background sweep: cleans the next dirty page, or (when none is left)
    /// runs the final pass. Returns whether work is left.
    pub fn step(&self, eng: &FalconEngine) -> bool {
        if !self.pending() {
            return false;
        }
        let i = self.next.fetch_add(1, Ordering::AcqRel);
        if let Some(&(index, _, _)) = self.pages.get(i) {
            self.ensure_clean(eng, index);
            return true;
        }
        self.finish(eng);
        false
    }

    /// Finishes the sweep in the calling thread: every dirty page, then the pass that withdraws
    /// the PM index entries of uncommitted inserts.
    pub fn finish(&self, eng: &FalconEngine) {
        if !self.pending() {
            return;
        }
        for &(index, _, _) in &self.pages {
            self.ensure_clean(eng, index);
        }
        let _one = self.finishing.lock();
        if !self.pending() {
            return;
        }
        let tables: Vec<Arc<TableRt>> = eng.tables.read().clone();
        for table in tables.iter().filter(|t| t.index.is_pm()) {
            let mut entries = Vec::new();
            table.index.for_each(|key, t| entries.push((key, t)));
            for (key, t) in entries {
                if withdraw_if_dangling(eng, &table.index, key, t) {
                    self.dangling_removed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.finished_us
            .store(self.started.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.pending.store(false, Ordering::Release);
    }

    /// The free slots recovered so far, per table (for the slot-ownership check).
    pub fn free_slots(&self) -> Vec<Vec<u64>> {
        self.free.iter().map(|f| f.lock().clone()).collect()
    }

    /// Damage the sweep found.
    pub fn problems(&self) -> Vec<String> {
        self.problems.lock().clone()
    }

    /// (locks cleared, index entries withdrawn, milliseconds until finished or `None`).
    pub fn stats(&self) -> (u64, u64, Option<f64>) {
        let us = self.finished_us.load(Ordering::Relaxed);
        (
            self.locks_cleared.load(Ordering::Relaxed),
            self.dangling_removed.load(Ordering::Relaxed),
            (!self.pending()).then_some(us as f64 / 1e3),
        )
    }
}

/// Withdraws `key → t` from a PM index if `t` is not live with `key` and not locked (a locked
/// slot may be an insert of this run being published). Returns whether it was removed. The
/// caller has made `t`'s page clean (its locks are this run's).
pub(crate) fn withdraw_if_dangling(
    eng: &FalconEngine,
    index: &super::tindex::TableIndex,
    key: u64,
    t: u64,
) -> bool {
    if let Some(sweep) = eng.sweep.as_ref() {
        sweep.gate(eng, t);
    }
    let pool = &eng.pool;
    if live_with_key(pool, t, key) {
        return false;
    }
    let in_pool = t
        .checked_add(tuple::HEADER)
        .is_some_and(|end| end <= pool.len());
    if in_pool && pool.read_u64(t + tuple::CC) & crate::cc::LOCK_BIT != 0 {
        return false;
    }
    index.remove_if(key, t)
}

/// Spawns the background sweeper; it holds the engine weakly and stops when the engine is
/// dropped.
pub(crate) fn spawn(engine: &Arc<FalconEngine>) {
    let weak = Arc::downgrade(engine);
    let spawned = std::thread::Builder::new()
        .name("pmtx-sweep".into())
        .spawn(move || loop {
            let Some(eng) = weak.upgrade() else { return };
            let Some(sweep) = eng.sweep.as_ref() else {
                return;
            };
            if !sweep.step(&eng) {
                return;
            }
        });
    // Without a thread the sweep still completes: transactions clean the pages they reach and
    // the structure check finishes the rest.
    drop(spawned);
}
