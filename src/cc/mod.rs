//! Concurrency control: the protocols, over per-tuple metadata words wherever the engine keeps them.
//!
//! A protocol sees a tuple's metadata only through [`MetaWord`]: an 8-byte word that may live in a
//! PM tuple header (Falcon §5.2.1), a DRAM cache entry (Zen §3.2) or a DRAM tile (FIR). The word
//! encodings are:
//!
//! - **OCC** (Silo-style, Falcon §5.2.1): bit 63 is the lock bit, bits 0..63 the version: the commit
//!   timestamp of the last writer.
//! - **2PL no-wait** (Falcon §5.2.1, "the first bit acts as the write lock, and the other bits are the
//!   read locks"): bit 63 is the write lock, bits 0..32 the reader count. The commit timestamp lives
//!   in the tuple's separate `write_ts` word.
//!
//! Transaction ids are `timestamp << 8 | thread_id` (Falcon §5.2.1 footnote), see [`TidClock`].

use serde::{Deserialize, Serialize};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

/// A concurrency-control protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Optimistic: read without locks, lock the write set at commit, validate the read set (Silo).
    Occ,
    /// Two-phase locking, no-wait: a lock conflict aborts at once, so no deadlock can form.
    NoWait,
}

impl Protocol {
    /// Every protocol, in CLI order.
    pub const ALL: [Protocol; 2] = [Protocol::Occ, Protocol::NoWait];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Occ => "occ",
            Protocol::NoWait => "no-wait",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing an unknown protocol name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown concurrency-control protocol '{0}' (expected one of: occ, no-wait)")]
pub struct UnknownProtocol(pub String);

impl FromStr for Protocol {
    type Err = UnknownProtocol;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownProtocol(s.to_string()))
    }
}

/// A tuple's 8-byte concurrency-control word, wherever it lives.
pub trait MetaWord {
    /// Loads the word (acquire).
    fn load(&self) -> u64;
    /// Compare-and-swap (acquire-release); true when it swapped.
    fn cas(&self, current: u64, new: u64) -> bool;
    /// Stores the word (release).
    fn store(&self, value: u64);
}

impl MetaWord for AtomicU64 {
    fn load(&self) -> u64 {
        AtomicU64::load(self, Ordering::Acquire)
    }
    fn cas(&self, current: u64, new: u64) -> bool {
        self.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    fn store(&self, value: u64) {
        AtomicU64::store(self, value, Ordering::Release)
    }
}

/// The lock bit (OCC) or write-lock bit (2PL).
pub const LOCK_BIT: u64 = 1 << 63;
const READERS: u64 = (1 << 32) - 1;

/// OCC word operations (Silo, Tu et al. SOSP'13; Falcon §5.2.1).
pub mod occ {
    use super::{MetaWord, LOCK_BIT};

    /// The version of an unlocked word, or `None` while a writer holds it.
    #[inline]
    pub fn stable_version(word: &impl MetaWord) -> Option<u64> {
        let w = word.load();
        (w & LOCK_BIT == 0).then_some(w)
    }

    /// Tries to lock an unlocked word; returns the version it held.
    #[inline]
    pub fn try_lock(word: &impl MetaWord) -> Option<u64> {
        let w = word.load();
        (w & LOCK_BIT == 0 && word.cas(w, w | LOCK_BIT)).then_some(w)
    }

    /// Unlocks with a new version (commit) or the old one (abort).
    #[inline]
    pub fn unlock(word: &impl MetaWord, version: u64) {
        debug_assert!(version & LOCK_BIT == 0);
        word.store(version);
    }

    /// Whether a read of `version` is still valid: same version, and not locked by another
    /// transaction (`locked_by_me` says whether the caller holds the lock).
    #[inline]
    pub fn validate(word: &impl MetaWord, version: u64, locked_by_me: bool) -> bool {
        let w = word.load();
        (w & !LOCK_BIT) == version && (w & LOCK_BIT == 0 || locked_by_me)
    }
}

/// 2PL no-wait word operations (Falcon §5.2.1).
pub mod no_wait {
    use super::{MetaWord, LOCK_BIT, READERS};

    /// Takes a read lock unless a writer holds the word.
    #[inline]
    pub fn try_read_lock(word: &impl MetaWord) -> bool {
        let w = word.load();
        w & LOCK_BIT == 0 && w & READERS < READERS && word.cas(w, w + 1)
    }

    /// Releases a read lock.
    #[inline]
    pub fn read_unlock(word: &impl MetaWord) {
        loop {
            let w = word.load();
            debug_assert!(w & READERS > 0, "read unlock without a read lock");
            if word.cas(w, w - 1) {
                return;
            }
        }
    }

    /// Takes the write lock when nobody holds the word, or upgrades the caller's read lock when it
    /// is the only reader.
    #[inline]
    pub fn try_write_lock(word: &impl MetaWord, holds_read_lock: bool) -> bool {
        let expected = u64::from(holds_read_lock);
        word.cas(expected, LOCK_BIT)
    }

    /// Releases the write lock.
    #[inline]
    pub fn write_unlock(word: &impl MetaWord) {
        word.store(0);
    }
}

/// How a protocol answers a request to read a tuple the transaction does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStart {
    /// Read the row now; pass the token to `read_end` and keep it for `validate_read`.
    Go(u64),
    /// Someone is writing the tuple: spin and ask again (OCC waits for the lock to clear).
    Retry,
    /// Conflict: abort the transaction (no-wait).
    Abort,
}

/// A concurrency-control protocol, as the engines drive it: at fixed points of a transaction, over
/// one tuple's metadata word at a time. Where the word lives is the engine's business
/// ([`MetaWord`]); this is what lets Falcon keep it in the PM tuple header and Zen in a DRAM cache
/// entry with the same protocol code (Falcon §5.2.1, Zen §3.3.2).
pub trait CcProtocol: Send + Sync {
    /// Which protocol this is.
    fn protocol(&self) -> Protocol;
    /// Whether writes are locked as they happen (2PL) rather than at commit (OCC).
    fn locks_writes_early(&self) -> bool;
    /// Whether reads hold a lock until the transaction ends (2PL).
    fn holds_read_locks(&self) -> bool;
    /// Whether the read set must be validated at commit (OCC).
    fn validates_reads(&self) -> bool;
    /// Begins reading a tuple the transaction does not hold.
    fn read_begin(&self, word: &dyn MetaWord) -> ReadStart;
    /// After copying the row: whether the copy is consistent with `token`.
    fn read_end(&self, word: &dyn MetaWord, token: u64) -> bool;
    /// Tries to take the write lock; `holds_read` says the caller holds a read lock to upgrade.
    fn try_write_lock(&self, word: &dyn MetaWord, holds_read: bool) -> bool;
    /// At commit: whether a read with `token` is still valid (`locked_by_me`: the caller holds the
    /// write lock of the same tuple).
    fn validate_read(&self, word: &dyn MetaWord, token: u64, locked_by_me: bool) -> bool;
    /// Releases a write lock, installing `tid` as the new version (commit) or restoring the old
    /// one (`None`: abort).
    fn release_write(&self, word: &dyn MetaWord, tid: Option<u64>);
    /// Releases a read lock.
    fn release_read(&self, word: &dyn MetaWord);
    /// The word of a tuple nobody holds, whose last writer committed `write_ts` (recovery).
    fn idle_word(&self, write_ts: u64) -> u64;
}

impl<W: MetaWord + ?Sized> MetaWord for &W {
    fn load(&self) -> u64 {
        (**self).load()
    }
    fn cas(&self, current: u64, new: u64) -> bool {
        (**self).cas(current, new)
    }
    fn store(&self, value: u64) {
        (**self).store(value)
    }
}

/// Silo-style OCC (Tu et al. SOSP'13; Falcon §5.2.1).
pub struct Occ;

impl CcProtocol for Occ {
    fn protocol(&self) -> Protocol {
        Protocol::Occ
    }
    fn locks_writes_early(&self) -> bool {
        false
    }
    fn holds_read_locks(&self) -> bool {
        false
    }
    fn validates_reads(&self) -> bool {
        true
    }
    fn read_begin(&self, word: &dyn MetaWord) -> ReadStart {
        occ::stable_version(&word).map_or(ReadStart::Retry, ReadStart::Go)
    }
    fn read_end(&self, word: &dyn MetaWord, token: u64) -> bool {
        word.load() == token
    }
    fn try_write_lock(&self, word: &dyn MetaWord, _holds_read: bool) -> bool {
        occ::try_lock(&word).is_some()
    }
    fn validate_read(&self, word: &dyn MetaWord, token: u64, locked_by_me: bool) -> bool {
        occ::validate(&word, token, locked_by_me)
    }
    fn release_write(&self, word: &dyn MetaWord, tid: Option<u64>) {
        let version = tid.unwrap_or_else(|| word.load()) & !LOCK_BIT;
        occ::unlock(&word, version)
    }
    fn release_read(&self, _word: &dyn MetaWord) {}
    fn idle_word(&self, write_ts: u64) -> u64 {
        write_ts & !LOCK_BIT
    }
}

/// Two-phase locking with the no-wait policy (Falcon §5.2.1).
pub struct NoWait;

impl CcProtocol for NoWait {
    fn protocol(&self) -> Protocol {
        Protocol::NoWait
    }
    fn locks_writes_early(&self) -> bool {
        true
    }
    fn holds_read_locks(&self) -> bool {
        true
    }
    fn validates_reads(&self) -> bool {
        false
    }
    fn read_begin(&self, word: &dyn MetaWord) -> ReadStart {
        if no_wait::try_read_lock(&word) {
            ReadStart::Go(0)
        } else {
            ReadStart::Abort
        }
    }
    fn read_end(&self, _word: &dyn MetaWord, _token: u64) -> bool {
        true
    }
    fn try_write_lock(&self, word: &dyn MetaWord, holds_read: bool) -> bool {
        no_wait::try_write_lock(&word, holds_read)
    }
    fn validate_read(&self, _word: &dyn MetaWord, _token: u64, _locked_by_me: bool) -> bool {
        true
    }
    fn release_write(&self, word: &dyn MetaWord, _tid: Option<u64>) {
        no_wait::write_unlock(&word)
    }
    fn release_read(&self, word: &dyn MetaWord) {
        no_wait::read_unlock(&word)
    }
    fn idle_word(&self, _write_ts: u64) -> u64 {
        0
    }
}

impl Protocol {
    /// The protocol's implementation.
    pub fn implementation(self) -> &'static dyn CcProtocol {
        match self {
            Protocol::Occ => &Occ,
            Protocol::NoWait => &NoWait,
        }
    }
}

/// Bits of a transaction id that hold the thread id.
pub const TID_THREAD_BITS: u32 = 8;
/// The most threads a database can run (one id each).
pub const MAX_THREADS: usize = 1 << TID_THREAD_BITS;

/// Hands out transaction ids `timestamp << 8 | thread_id` (Falcon §5.2.1 footnote), strictly
/// increasing per thread, and above every id seen before a restart: the clock starts from `floor`,
/// the largest timestamp recovery found, so ids stay monotonic even if the wall clock went back.
///
/// Timestamps are microseconds since the clock was made, plus the floor; a thread that commits
/// more than once per microsecond takes the next free value instead.
pub struct TidClock {
    start: std::time::Instant,
    floor: u64,
}

impl TidClock {
    /// A clock whose first timestamp exceeds `floor`.
    pub fn new(floor: u64) -> TidClock {
        TidClock {
            start: std::time::Instant::now(),
            floor,
        }
    }

    /// The current timestamp (not an id).
    #[inline]
    pub fn now(&self) -> u64 {
        self.floor + 1 + self.start.elapsed().as_micros() as u64
    }

    /// A transaction id for `thread` greater than `last` (the thread's previous id) and whose
    /// timestamp exceeds `at_least`.
    #[inline]
    pub fn next_tid(&self, thread: usize, last: u64, at_least: u64) -> u64 {
        let ts = self
            .now()
            .max((last >> TID_THREAD_BITS) + 1)
            .max(at_least + 1);
        (ts << TID_THREAD_BITS) | thread as u64
    }
}

/// The timestamp part of a transaction id.
#[inline]
pub fn tid_timestamp(tid: u64) -> u64 {
    tid >> TID_THREAD_BITS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occ_lock_validate_unlock() {
        let w = AtomicU64::new(10);
        assert_eq!(occ::stable_version(&w), Some(10));
        assert_eq!(occ::try_lock(&w), Some(10));
        assert_eq!(occ::try_lock(&w), None, "a second locker fails");
        assert_eq!(occ::stable_version(&w), None);
        assert!(!occ::validate(&w, 10, false), "locked by another: invalid");
        assert!(occ::validate(&w, 10, true));
        occ::unlock(&w, 12);
        assert!(!occ::validate(&w, 10, false), "new version: invalid");
        assert!(occ::validate(&w, 12, false));
    }

    #[test]
    fn no_wait_readers_writers_and_upgrade() {
        let w = AtomicU64::new(0);
        assert!(no_wait::try_read_lock(&w));
        assert!(no_wait::try_read_lock(&w));
        assert!(
            !no_wait::try_write_lock(&w, true),
            "two readers: no upgrade"
        );
        no_wait::read_unlock(&w);
        assert!(no_wait::try_write_lock(&w, true), "sole reader upgrades");
        assert!(!no_wait::try_read_lock(&w));
        assert!(!no_wait::try_write_lock(&w, false));
        no_wait::write_unlock(&w);
        assert!(no_wait::try_write_lock(&w, false));
    }

    #[test]
    fn tids_are_monotonic_and_above_the_floor() {
        let clock = TidClock::new(1_000_000);
        let mut last = 0;
        for _ in 0..1000 {
            let tid = clock.next_tid(3, last, 0);
            assert!(tid > last);
            assert_eq!(tid & 0xff, 3);
            assert!(tid_timestamp(tid) > 1_000_000);
            last = tid;
        }
        let forced = clock.next_tid(3, last, tid_timestamp(last) + 500);
        assert!(tid_timestamp(forced) > tid_timestamp(last) + 500);
        assert_eq!("no-wait".parse::<Protocol>().unwrap(), Protocol::NoWait);
        assert!("2pl".parse::<Protocol>().is_err());
    }
}
