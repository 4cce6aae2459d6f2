//! TicToc (Yu et al., SIGMOD'16): OCC with data-driven timestamps. Each tuple carries a write
//! timestamp `wts` (here the tuple's `write_ts`) and a read timestamp `rts`: its value is valid
//! for every logical time in `[wts, rts]`. A transaction commits at the smallest time `ct` that is
//! at least every read's `wts` and above every written tuple's `rts`, extending the `rts` of reads
//! that end before `ct` when no write intervened.
//!
//! Word: bit 63 lock, bits 0..63 `rts`. The paper packs `wts`, a delta `rts` and the lock in one
//! word; here `wts` lives in the separate `write_ts` word the engine keeps for recovery, so an
//! extension checks `write_ts` after reading the word and commits with a CAS on the word (which
//! any writer must lock first): a departure in encoding, not in the protocol.

use super::{MetaWord, LOCK_BIT};

/// The tid with thread part `thread` that is at least `min_tid`: TicToc's commit time `ct` as a
/// transaction id (`ts << TID_THREAD_BITS | thread`).
#[inline]
pub fn tid_at_least(min_tid: u64, thread: usize) -> u64 {
    let thread = thread as u64;
    let base = min_tid >> super::TID_THREAD_BITS;
    let candidate = (base << super::TID_THREAD_BITS) | thread;
    if candidate >= min_tid {
        candidate
    } else {
        ((base + 1) << super::TID_THREAD_BITS) | thread
    }
}

/// The `rts` of word value `w`.
#[inline]
pub fn rts(w: u64) -> u64 {
    w & !LOCK_BIT
}

/// Tries to lock; returns the `rts` it held.
#[inline]
pub fn try_lock(word: &impl MetaWord) -> Option<u64> {
    let w = word.load();
    (w & LOCK_BIT == 0 && word.cas(w, w | LOCK_BIT)).then_some(rts(w))
}

/// Unlocks with read timestamp `rts` (commit: `ct`, so the new version is valid at `[ct, ct]`;
/// abort: the old `rts`).
#[inline]
pub fn unlock(word: &impl MetaWord, rts: u64) {
    word.store(rts & !LOCK_BIT)
}

/// Validates a read of version `wts` for commit time `ct`, extending the tuple's `rts` to `ct` if
/// needed. `current_wts` reads the tuple's `write_ts` now. Fails if another transaction wrote the
/// tuple since, or holds its lock while the read would need extending.
#[inline]
pub fn validate_and_extend(
    word: &impl MetaWord,
    wts: u64,
    ct: u64,
    current_wts: impl Fn() -> u64,
    locked_by_me: bool,
) -> bool {
    loop {
        let w = word.load();
        if current_wts() != wts {
            return false;
        }
        if rts(w) >= ct || locked_by_me {
            return true;
        }
        if w & LOCK_BIT != 0 {
            return false;
        }
        if word.cas(w, ct) {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn extension_and_conflicts() {
        let w = AtomicU64::new(10);
        assert!(
            validate_and_extend(&w, 5, 8, || 5, false),
            "inside [wts, rts]"
        );
        assert!(validate_and_extend(&w, 5, 20, || 5, false), "extended");
        assert_eq!(rts(w.load(Ordering::Relaxed)), 20);
        assert!(!validate_and_extend(&w, 5, 30, || 21, false), "overwritten");
        assert_eq!(try_lock(&w), Some(20));
        assert!(
            !validate_and_extend(&w, 5, 30, || 5, false),
            "locked by another"
        );
        assert!(validate_and_extend(&w, 5, 30, || 5, true));
        unlock(&w, 31);
        assert_eq!(w.load(Ordering::Relaxed), 31);
    }
}
