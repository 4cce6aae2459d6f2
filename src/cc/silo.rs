//! Silo's commit tids (Tu et al., SOSP'13 §4.2): no shared counter per commit. A global epoch
//! advances periodically; a commit tid is the smallest value above the epoch's start, the
//! thread's previous tid, and every version the transaction read or wrote.
//!
//! Departure: Silo advances the epoch from a dedicated thread every 40 ms; here the first commit
//! that sees the epoch older than [`EPOCH_MICROS`] advances it with a CAS, and the epoch holds a
//! timestamp of the engine clock (so tids keep the clock's scale, which the engine's reclamation
//! of deleted slots compares against).

use std::sync::atomic::{AtomicU64, Ordering};

/// Epoch length, in clock microseconds (Silo: 40 ms).
pub const EPOCH_MICROS: u64 = 40_000;

/// The global epoch.
#[derive(Debug, Default)]
pub struct EpochClock {
    epoch: AtomicU64,
}

impl EpochClock {
    /// The current epoch's start timestamp, advancing it when `now` is an epoch past it.
    #[inline]
    pub fn epoch(&self, now: u64) -> u64 {
        let e = self.epoch.load(Ordering::Acquire);
        if now >= e + EPOCH_MICROS {
            let _ = self
                .epoch
                .compare_exchange(e, now, Ordering::AcqRel, Ordering::Acquire);
            return self.epoch.load(Ordering::Acquire);
        }
        e
    }

    /// The commit timestamp (not yet a tid): above the epoch, `last_ts` (the thread's previous
    /// commit) and `seen_ts` (the largest version read or written).
    #[inline]
    pub fn commit_ts(&self, now: u64, last_ts: u64, seen_ts: u64) -> u64 {
        self.epoch(now).max(last_ts + 1).max(seen_ts + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_advance_and_tids_exceed_what_was_seen() {
        let c = EpochClock::default();
        assert_eq!(c.epoch(100_000), 100_000);
        assert_eq!(c.epoch(120_000), 100_000, "within the epoch");
        assert_eq!(c.epoch(140_000), 140_000);
        assert_eq!(c.commit_ts(140_001, 5, 7), 140_000);
        assert_eq!(c.commit_ts(140_001, 140_000, 7), 140_001);
        assert_eq!(c.commit_ts(140_001, 5, 150_000), 150_001);
    }
}
