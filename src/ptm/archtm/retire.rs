//! The second half of Alg. 2's APT_TX_POST_COMMIT, *retirement*: once no transaction that
//! began before a commit still executes, its new versions become the committed ones, the
//! replaced versions go to the slot's deallocation list, and the objects are unlocked.
//!
//! Departure (Alg. 2 lines 13–16 wait for the older transactions inside the commit): a user
//! slot's commit retires at once when no older transaction executes (always with one thread),
//! else it queues the commit here and returns; the slot retires its queue at its next begin,
//! and a checkpoint, an invariant check or the worker's drop retire every queue. Meanwhile
//! each of the commit's entries carries its commit id (`Entry::ccid`), so a reader picks the
//! new version exactly as Alg. 1 line 13 would (commit id at most its start), without the
//! writer's slot state, which the slot's next transaction reuses; the objects stay locked, so
//! a writer that began before the commit still conflicts (first updater wins, as before). With
//! two threads the wait was the other thread's remaining execution, at every commit.
//!
//! Only a user slot defers: the engine's own transactions (defragmentation's mock
//! transactions) retire before their commit returns, as the paper's do.

use super::alloc::Dealloc;
use super::layout::{block_bytes, is_large, BLOCK};
use super::Inner;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Low bits of `Entry::new` (offsets are 64-byte aligned): the new version is a tombstone
/// (the transaction frees the object) ...
pub(crate) const TOMB: u64 = 1;
/// ... in a block of its own (64 bytes), rather than written over the transaction's own copy.
pub(crate) const TOMB_OWN_BLOCK: u64 = 2;

/// Bytes of the block of a tombstone `new` (tagged offset) of an object of `size` bytes.
pub(crate) fn tomb_len(new: u64, size: u64) -> u64 {
    if new & TOMB_OWN_BLOCK != 0 {
        BLOCK
    } else {
        block_bytes(size)
    }
}

/// A committed transaction not yet retired.
struct Committed {
    cid: u64,
    txid: u64,
    ids: Vec<u64>,
}

/// One slot's commits to retire, oldest first (on cache lines of its own: its thread takes
/// the lock at every commit).
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Retirements {
    queue: Mutex<Queue>,
    /// Commits in the queue (read without the lock by `begin`'s check).
    queued: AtomicUsize,
}

#[derive(Default)]
struct Queue {
    commits: VecDeque<Committed>,
    /// Emptied write-set vectors, for the slot's next transactions (no allocation per commit).
    spare: Vec<Vec<u64>>,
}

impl Inner {
    /// Post-commit of `slot`'s transaction `txid` with commit id `cid`: queues its write set
    /// (replaced by an empty vector) for retirement, then retires what is ready (with `wait`,
    /// everything: see [`Inner::retire`]).
    pub(crate) fn post_commit(
        &self,
        slot: usize,
        cid: u64,
        txid: u64,
        write_set: &mut Vec<u64>,
        wait: bool,
    ) {
        let r = &self.retirements[slot];
        let mut q = r.queue.lock();
        let ids = std::mem::replace(write_set, q.spare.pop().unwrap_or_default());
        q.commits.push_back(Committed { cid, txid, ids });
        self.retire_locked(slot, r, &mut q, wait);
    }

    /// Whether no transaction of a slot other than `slot` that began before `cid` still
    /// executes; with `wait`, waits until then (returns true).
    fn older_done(&self, slot: usize, cid: u64, wait: bool) -> bool {
        for (i, s) in self.slots.iter().enumerate() {
            if i == slot {
                continue;
            }
            while s.active.load(Ordering::SeqCst) < cid {
                if !wait {
                    return false;
                }
                // A peer that died in a simulated crash never finishes: stop then.
                self.pool.unwind_if_crashed();
                std::hint::spin_loop();
            }
        }
        true
    }

    /// Retires `slot`'s queued commits in order, each once no older transaction executes;
    /// with `wait`, all of them (waiting), else as many as are ready, and nothing if another
    /// thread holds the queue (it may be waiting for the caller's transaction to end).
    pub(crate) fn retire(&self, slot: usize, wait: bool) {
        let r = &self.retirements[slot];
        if r.queued.load(Ordering::Relaxed) == 0 {
            return;
        }
        if wait {
            self.retire_locked(slot, r, &mut r.queue.lock(), true);
        } else if let Some(mut q) = r.queue.try_lock() {
            self.retire_locked(slot, r, &mut q, false);
        }
    }

    fn retire_locked(&self, slot: usize, r: &Retirements, q: &mut Queue, wait: bool) {
        while let Some(c) = q.commits.front() {
            if !self.older_done(slot, c.cid, wait) {
                break;
            }
            let mut c = q.commits.pop_front().expect("the front");
            self.retire_one(slot, c.txid, &c.ids);
            c.ids.clear();
            q.spare.push(c.ids);
        }
        // Changed only under the lock: a store, not a locked read-modify-write.
        r.queued.store(q.commits.len(), Ordering::Relaxed);
    }

    /// Retires every slot's queue: no transaction may be executing (a checkpoint's
    /// quiescence, an invariant check).
    pub(crate) fn retire_all(&self) {
        for slot in 0..self.retirements.len() {
            self.retire(slot, true);
        }
    }

    /// Alg. 2 lines 17–23 for one commit of `slot`.
    fn retire_one(&self, slot: usize, txid: u64, ids: &[u64]) {
        // The replaced versions go straight into the slot's deallocation list; the
        // collection, which takes the lists, waits the few entries.
        let mut dealloc = self.alloc.dealloc[slot].lock();
        for &id in ids {
            // §5.6: the entry's committed state changes, so its group goes into the next
            // checkpoint.
            self.chkp.mark(id);
            let e = self.table.get(id).expect("a locked id");
            let v = e.view();
            if v.old != 0 {
                dealloc.push(Dealloc {
                    off: v.old,
                    len: block_bytes(v.size),
                    tomb: false,
                    large: is_large(v.size),
                    object: (id, v.gen),
                });
            }
            if v.new & TOMB != 0 {
                dealloc.push(Dealloc {
                    off: v.new & !(BLOCK - 1),
                    len: tomb_len(v.new, v.size),
                    tomb: true,
                    large: false,
                    object: (id, v.gen),
                });
                e.modify(|e| {
                    e.old.store(0, Ordering::Release);
                    e.new.store(0, Ordering::Release);
                    e.ccid.store(0, Ordering::Release);
                    e.gen.store(0, Ordering::Release);
                    e.size.store(0, Ordering::Release);
                });
                e.unlock();
                self.id_lists[slot].lock().push(id as u32);
            } else {
                e.vtxid.store(txid, Ordering::Release);
                e.modify(|e| {
                    e.old.store(v.new, Ordering::Release);
                    e.new.store(0, Ordering::Release);
                    e.ccid.store(0, Ordering::Release);
                });
                e.unlock();
            }
        }
    }
}
