//! Write-behind logging (`wbl`; Arulraj et al., VLDB'17, as Zen §4 and FIR §5 use it for a
//! baseline): the group commit of the commit-timestamp gap and the recovery that needs no redo.
//!
//! A transaction writes its new tuple versions (out of place, as `outp`) and flushes them at
//! commit; nothing else is logged. Durability is a group commit of one pair: `c_p`, below which
//! every commit is durable (persisted here, [`GroupCommit::wait`]), and `c_d`, above which no
//! commit has written anything (Falcon's persisted tid lease, `FalconEngine::ensure_lease`).
//! After a crash every tuple version whose commit timestamp lies in the gap `(c_p, c_d]` is
//! invisible: recovery ([`resolve_versions`]) discards those versions and keeps, per key, the
//! newest version at or below `c_p`.
//!
//! Tuple states on PM (the `FLAGS` word): `LIVE` (a current version), [`SUPERSEDED`] (a version a
//! commit has replaced, still the row's value if that commit is in the gap), [`TOMBSTONE`] (a
//! delete's version: the row is gone if it is the newest) and `DELETED_ROW` (a free slot). A
//! commit frees its superseded versions and tombstones only once `c_p` covers it.

use super::layout::tuple;
use super::TableRt;
use crate::cc::TID_THREAD_BITS;
use crate::engine::DbError;
use crate::pmem::Pool;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A version replaced by a commit that may still be in the gap: invisible to transactions, the
/// row's value for recovery if the replacing commit is lost.
pub(crate) const SUPERSEDED: u64 = tuple::LIVE | 4;
/// A delete's version: the key is absent when this is its newest durable version.
pub(crate) const TOMBSTONE: u64 = tuple::LIVE | 8;

/// Where `c_p` lives in the meta page: the word after the tid lease (outside the CRC-checked
/// first 4 KiB; one atomic store).
pub(crate) const CP_AT: u64 = super::layout::meta::TID_LEASE_AT + 8;

/// A thread's commit state for the group commit: not committing.
const IDLE: u64 = u64::MAX;
/// A thread's commit state: committing, its tid not yet known.
const UNKNOWN: u64 = 0;

/// The group commit of `c_p` (WBL §3.2: "group commit" of the write-behind log record).
pub(crate) struct GroupCommit {
    /// Per thread: the tid of its commit whose data is not yet flushed, `UNKNOWN`, or `IDLE`.
    committing: Box<[CachePadded<AtomicU64>]>,
    /// The persisted `c_p`: every commit tid at or below it is durable.
    cp: AtomicU64,
    /// One leader persists `c_p` at a time; the others wait for it.
    leader: Mutex<()>,
    /// The meta page offset.
    meta_page: u64,
}

impl GroupCommit {
    pub(crate) fn new(threads: usize, meta_page: u64, cp: u64) -> GroupCommit {
        GroupCommit {
            committing: (0..threads)
                .map(|_| CachePadded::new(AtomicU64::new(IDLE)))
                .collect(),
            cp: AtomicU64::new(cp),
            leader: Mutex::new(()),
            meta_page,
        }
    }

    /// The thread starts a commit whose tid it does not know yet: `c_p` cannot pass it.
    pub(crate) fn enter(&self, thread: usize) {
        self.committing[thread].store(UNKNOWN, Ordering::SeqCst);
    }

    /// The thread's commit has tid `tid`.
    pub(crate) fn set_tid(&self, thread: usize, tid: u64) {
        self.committing[thread].store(tid, Ordering::SeqCst);
    }

    /// The thread's commit has flushed and fenced its data (or ended without writing).
    pub(crate) fn leave(&self, thread: usize) {
        self.committing[thread].store(IDLE, Ordering::SeqCst);
    }

    /// Waits until `c_p >= tid` is persisted, leading the group commit when no one else does.
    /// `now` reads the tid clock: `c_p` may advance to just below it when no commit is open.
    pub(crate) fn wait(&self, pool: &Pool, tid: u64, now: impl Fn() -> u64) {
        let mut round = 0u32;
        while self.cp.load(Ordering::Acquire) < tid {
            if let Some(_lead) = self.leader.try_lock() {
                // The clock first, then the threads: a commit that enters after its slot is read
                // takes a tid above the clock read here.
                let clock = now() << TID_THREAD_BITS;
                let open = self
                    .committing
                    .iter()
                    .map(|c| c.load(Ordering::SeqCst))
                    .min()
                    .unwrap_or(IDLE);
                let bound = clock.min(open).saturating_sub(1);
                if bound > self.cp.load(Ordering::Acquire) {
                    let at = self.meta_page + CP_AT;
                    // WBL's log record: written and persisted after the data of every commit
                    // below it (each fenced its own before leaving).
                    pool.write_u64_ordered(at, bound);
                    pool.persist(at, 8);
                    self.cp.store(bound, Ordering::Release);
                }
            }
            // A thread that crashed (simulated) inside its commit never leaves: its open tid
            // would hold `c_p` below ours for ever.
            pool.unwind_if_crashed();
            round += 1;
            if round > 4 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Recovery without redo (WBL §4): over every heap page, discard the versions whose commit tid
/// is above the persisted `c_p` (the gap: none of them was acknowledged, and any commit that read
/// one of them has a larger tid), then keep per key the newest remaining version: a `LIVE` or
/// `SUPERSEDED` one becomes the live row, a `TOMBSTONE` means the row is gone; every other
/// version is freed. Afterwards the heap holds Falcon's states only, and Falcon's heap scan
/// rebuilds the indexes. Idempotent: a crash during it repeats it with the same outcome (it never
/// changes the version it keeps, except a superseded one's flag, which is equivalent).
/// Returns (versions discarded from the gap, older versions and tombstones freed).
pub(crate) fn resolve_versions(
    pool: &Pool,
    tables: &[Arc<TableRt>],
    heap: &[(u32, usize, u64)],
    cp: u64,
) -> Result<(u64, u64), DbError> {
    let mut discarded = 0u64;
    let mut freed = 0u64;
    // (table, key) -> (tid, slot, flags) of the newest durable version seen so far.
    let mut newest: HashMap<(u32, u64), (u64, u64, u64)> = HashMap::new();
    let free = |t: u64| {
        pool.write_u64(t + tuple::FLAGS, tuple::DELETED_ROW);
        pool.flush(t + tuple::FLAGS, 8);
    };
    for &(table_id, _, page) in heap {
        let table = &tables[table_id as usize];
        for i in 0..crate::alloc::PAGE_SIZE / table.slot {
            let t = page + i * table.slot;
            let flags = pool.read_u64(t + tuple::FLAGS);
            if flags == 0 {
                // A never-used slot an insert in the gap began to write (its commit tid goes
                // first): back to all zero, as Falcon's heap scan expects of an unused slot.
                if pool.read_u64(t + tuple::WRITE_TS) != 0 || pool.read_u64(t + tuple::KEY) != 0 {
                    pool.write_u64(t + tuple::WRITE_TS, 0);
                    pool.write_u64(t + tuple::KEY, 0);
                    pool.flush(t + tuple::WRITE_TS, 16);
                    discarded += 1;
                }
                continue;
            }
            if !matches!(flags, tuple::LIVE | SUPERSEDED | TOMBSTONE) {
                continue;
            }
            let tid = pool.read_u64(t + tuple::WRITE_TS);
            if tid == 0 {
                return Err(DbError::Corrupt(format!(
                    "table {}: the version at {t} has no commit tid",
                    table.schema.name
                )));
            }
            if tid > cp {
                free(t);
                discarded += 1;
                continue;
            }
            let key = pool.read_u64(t + tuple::KEY);
            match newest.get_mut(&(table_id, key)) {
                Some(best) if best.0 >= tid => {
                    free(t);
                    freed += 1;
                }
                Some(best) => {
                    free(best.1);
                    freed += 1;
                    *best = (tid, t, flags);
                }
                None => {
                    newest.insert((table_id, key), (tid, t, flags));
                }
            }
        }
    }
    // The older versions' frees are durable before a tombstone that outlived them is freed:
    // otherwise an image could hold the old version and not the tombstone.
    pool.fence();
    for &(_, t, flags) in newest.values() {
        match flags {
            SUPERSEDED => {
                pool.write_u64(t + tuple::FLAGS, tuple::LIVE);
                pool.flush(t + tuple::FLAGS, 8);
            }
            TOMBSTONE => {
                free(t);
                freed += 1;
            }
            _ => {}
        }
    }
    pool.fence();
    Ok((discarded, freed))
}
