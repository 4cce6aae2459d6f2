//! Loom model checks of the concurrency-control words, with the real protocol code
//! (`pmtx::cc::{occ, lock2pl}`) over loom's atomics: every interleaving and every weak-memory
//! outcome loom can produce of two small transactions.
//!
//! - OCC commit (Falcon §5.2.1, Silo): lock the write set, **SeqCst fence**, validate the read set.
//!   Two transactions that each read x and y and write one of them must not both commit (write
//!   skew). Without the fence loom finds the execution where each validation misses the other's
//!   lock (store buffering): the engine's commit has the fence for that reason.
//! - 2PL no-wait / wait-die / dl-detect lock word: readers and an upgrading writer are mutually
//!   exclusive.

use loom::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use pmtx::cc::{lock2pl, occ, MetaWord};

/// A tuple word in loom's memory model.
struct Word(AtomicU64);

impl MetaWord for Word {
    fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
    fn cas(&self, current: u64, new: u64) -> bool {
        self.0
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    fn store(&self, value: u64) {
        self.0.store(value, Ordering::Release)
    }
}

/// One OCC transaction: reads `other` and `mine`, writes `mine`. Returns the version of `other`
/// it read if it committed.
fn occ_txn(mine: &Word, other: &Word, tid: u64, with_fence: bool) -> Option<u64> {
    let v_mine = occ::stable_version(mine)?;
    let v_other = occ::stable_version(other)?;
    // Commit: lock the write set.
    let locked = occ::try_lock(mine)?;
    if locked != v_mine {
        occ::unlock(mine, locked);
        return None;
    }
    if with_fence {
        fence(Ordering::SeqCst);
    }
    // Validate the read set.
    if !occ::validate(other, v_other, false) {
        occ::unlock(mine, v_mine);
        return None;
    }
    occ::unlock(mine, tid);
    Some(v_other)
}

fn write_skew_possible(with_fence: bool) -> bool {
    let found = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = found.clone();
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(move || {
        let x = Arc::new(Word(AtomicU64::new(1)));
        let y = Arc::new(Word(AtomicU64::new(1)));
        let (x2, y2) = (x.clone(), y.clone());
        let t = thread::spawn(move || occ_txn(&y2, &x2, 20, with_fence));
        let a = occ_txn(&x, &y, 10, with_fence);
        let b = t.join().unwrap();
        // Both committed, each having read the other's initial version: no serial order
        // explains that (a serial run has the second read the first's write).
        if a == Some(1) && b == Some(1) {
            seen.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    found.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn occ_with_the_fence_admits_no_write_skew() {
    assert!(!write_skew_possible(true));
}

#[test]
fn occ_without_the_fence_admits_write_skew() {
    assert!(
        write_skew_possible(false),
        "loom should find the store-buffering execution"
    );
}

#[test]
fn two_phase_locking_word_is_mutually_exclusive() {
    loom::model(|| {
        let word = Arc::new(Word(AtomicU64::new(0)));
        let inside = Arc::new(AtomicUsize::new(0));
        let run = |word: Arc<Word>, inside: Arc<AtomicUsize>, thread: usize| {
            // Read lock, then upgrade (the read-modify-write of a 2PL transaction).
            if lock2pl::try_read_lock(&*word).is_err() {
                return;
            }
            if lock2pl::try_write_lock(&*word, true, thread).is_err() {
                lock2pl::read_unlock(&*word);
                return;
            }
            assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0, "two writers");
            inside.fetch_sub(1, Ordering::Relaxed);
            lock2pl::write_unlock(&*word);
        };
        let (w2, i2) = (word.clone(), inside.clone());
        let t = thread::spawn(move || run(w2, i2, 1));
        run(word.clone(), inside.clone(), 0);
        t.join().unwrap();
        assert_eq!(word.0.load(Ordering::Relaxed), 0, "every lock released");
    });
}
