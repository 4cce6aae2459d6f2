//! Two-phase locking over the tuple's lock word: no-wait, wait-die and deadlock detection
//! (Falcon §5.2.1 "the first bit acts as the write lock, and the other bits are the read locks";
//! the policies as in Yu et al., VLDB'14, which Zen §4.4 and Falcon §6 evaluate).
//!
//! Word: bit 63 write lock, bits 32..56 the write-lock holder's thread + 1 (so a waiter knows whom
//! it waits for), bits 0..32 the reader count. Readers are counted, not named: a transaction that
//! conflicts with readers cannot tell who they are, so wait-die dies and dl-detect waits with a
//! time-out there (a departure from lock-table designs that list every holder; see docs/CC.md).

use super::{CcShared, MetaWord, Protocol, LOCK_BIT};
use std::sync::atomic::Ordering;

const READERS: u64 = (1 << 32) - 1;
const OWNER_SHIFT: u32 = 32;
const OWNER_MASK: u64 = (1 << 24) - 1;

/// The thread holding the write lock of word value `w`, if any.
#[inline]
pub fn write_owner(w: u64) -> Option<usize> {
    if w & LOCK_BIT == 0 {
        return None;
    }
    let o = (w >> OWNER_SHIFT) & OWNER_MASK;
    (o > 0).then(|| o as usize - 1)
}

/// Who holds a lock that was refused: a named writer, or unnamed readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The write lock holder's thread.
    Writer(usize),
    /// One or more readers.
    Readers,
}

/// Takes a read lock unless a writer holds the word.
#[inline]
pub fn try_read_lock(word: &impl MetaWord) -> Result<(), Holder> {
    let w = word.load();
    if let Some(o) = write_owner(w) {
        return Err(Holder::Writer(o));
    }
    if w & LOCK_BIT == 0 && w & READERS < READERS && word.cas(w, w + 1) {
        Ok(())
    } else {
        // Lost a race with another reader or a writer: report what is there now.
        match write_owner(word.load()) {
            Some(o) => Err(Holder::Writer(o)),
            None => Err(Holder::Readers),
        }
    }
}

/// Takes the write lock for `thread` when nobody holds the word, or upgrades the caller's read
/// lock when it is the only reader.
#[inline]
pub fn try_write_lock(word: &impl MetaWord, holds_read: bool, thread: usize) -> Result<(), Holder> {
    let expected = u64::from(holds_read);
    let locked = LOCK_BIT | ((thread as u64 + 1) << OWNER_SHIFT);
    if word.cas(expected, locked) {
        return Ok(());
    }
    match write_owner(word.load()) {
        Some(o) => Err(Holder::Writer(o)),
        None => Err(Holder::Readers),
    }
}

/// Releases a read lock.
#[inline]
pub fn read_unlock(word: &impl MetaWord) {
    super::no_wait::read_unlock(word)
}

/// Releases the write lock.
#[inline]
pub fn write_unlock(word: &impl MetaWord) {
    word.store(0)
}

/// What a transaction does about a refused lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Poll the word again.
    Wait,
    /// Abort the transaction.
    Abort,
}

/// The policy's answer for thread `me`, refused by `holder` (called on every poll, so a decision
/// follows the holders as they change).
///
/// - no-wait (and MV2PL's read-write transactions): abort.
/// - wait-die: wait only for a younger named writer (smaller timestamp = older); die otherwise.
///   Waits go from older to younger only, so no cycle can form.
/// - dl-detect: publish "me waits for holder" and follow the waits-for chain; if it leads back to
///   `me`, abort (this transaction is the victim). Each thread waits for at most one other, so
///   the waits-for graph is a set of chains and the walk is linear.
pub fn decide(protocol: Protocol, shared: &CcShared, me: usize, holder: Holder) -> Decision {
    match (protocol, holder) {
        (Protocol::WaitDie, Holder::Writer(h)) if h != me => {
            let mine = shared.txn_ts[me].load(Ordering::Acquire);
            let theirs = shared.txn_ts[h].load(Ordering::Acquire);
            if mine < theirs {
                Decision::Wait
            } else {
                Decision::Abort
            }
        }
        (Protocol::DlDetect, Holder::Writer(h)) if h != me => {
            shared.waits_for[me].store(h as u64 + 1, Ordering::SeqCst);
            if closes_cycle(shared, me, h) {
                shared.waits_for[me].store(0, Ordering::SeqCst);
                Decision::Abort
            } else {
                Decision::Wait
            }
        }
        (Protocol::DlDetect, Holder::Readers) => {
            shared.waits_for[me].store(0, Ordering::SeqCst);
            Decision::Wait
        }
        _ => Decision::Abort,
    }
}

/// Polls of a word held by unnamed readers before a waiter gives up: readers cannot be checked
/// for a waits-for cycle (two readers upgrading deadlock), so such a wait gets a short time-out.
const READER_WAIT_LIMIT: u32 = 256;

/// Takes a lock on `word` with `attempt`, waiting as `protocol`'s policy says ([`decide`]:
/// no-wait aborts at once, wait-die waits only for younger writers, dl-detect until it closes a
/// cycle), for at most `options.wait_spins` polls. Returns whether the lock was taken. Leaves
/// `me`'s waits-for edge cleared.
pub fn acquire<W: MetaWord + ?Sized>(
    protocol: Protocol,
    shared: &CcShared,
    me: usize,
    word: &W,
    attempt: impl Fn(&W) -> Result<(), Holder>,
) -> bool {
    let mut taken = false;
    let mut reader_waits = 0;
    for round in 0..shared.options.wait_spins {
        match attempt(word) {
            Ok(()) => {
                taken = true;
                break;
            }
            Err(holder) => match decide(protocol, shared, me, holder) {
                Decision::Abort => break,
                Decision::Wait if holder == Holder::Readers => {
                    reader_waits += 1;
                    if reader_waits > READER_WAIT_LIMIT {
                        break;
                    }
                    super::backoff(round)
                }
                Decision::Wait => super::backoff(round),
            },
        }
    }
    if protocol == Protocol::DlDetect {
        shared.waits_for[me].store(0, Ordering::SeqCst);
    }
    taken
}

/// Whether following waits-for edges from `start` reaches `me`.
pub fn closes_cycle(shared: &CcShared, me: usize, start: usize) -> bool {
    let mut at = start;
    for _ in 0..shared.waits_for.len() {
        if at == me {
            return true;
        }
        let next = shared.waits_for[at].load(Ordering::SeqCst);
        if next == 0 {
            return false;
        }
        at = next as usize - 1;
    }
    // A chain longer than the thread count repeats a node: a cycle (possibly not through `me`,
    // whose members will find it themselves); waiting on it is pointless.
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::CcOptions;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn owners_are_named_and_readers_counted() {
        let w = AtomicU64::new(0);
        assert_eq!(try_read_lock(&w), Ok(()));
        assert_eq!(try_write_lock(&w, false, 3), Err(Holder::Readers));
        assert_eq!(try_write_lock(&w, true, 3), Ok(()));
        assert_eq!(write_owner(w.load(Ordering::Relaxed)), Some(3));
        assert_eq!(try_read_lock(&w), Err(Holder::Writer(3)));
        assert_eq!(try_write_lock(&w, false, 4), Err(Holder::Writer(3)));
        write_unlock(&w);
        assert_eq!(try_write_lock(&w, false, 0), Ok(()));
        assert_eq!(write_owner(w.load(Ordering::Relaxed)), Some(0));
    }

    #[test]
    fn wait_die_waits_only_for_younger_holders() {
        let shared = CcShared::new(4, CcOptions::default());
        shared.txn_ts[0].store(10, Ordering::Relaxed);
        shared.txn_ts[1].store(20, Ordering::Relaxed);
        let d = |me, h| decide(Protocol::WaitDie, &shared, me, h);
        assert_eq!(d(0, Holder::Writer(1)), Decision::Wait, "older waits");
        assert_eq!(d(1, Holder::Writer(0)), Decision::Abort, "younger dies");
        assert_eq!(d(0, Holder::Readers), Decision::Abort);
        assert_eq!(
            decide(Protocol::NoWait, &shared, 0, Holder::Writer(1)),
            Decision::Abort
        );
    }

    #[test]
    fn dl_detect_finds_the_cycle() {
        let shared = CcShared::new(4, CcOptions::default());
        let d = |me, h| decide(Protocol::DlDetect, &shared, me, h);
        assert_eq!(d(0, Holder::Writer(1)), Decision::Wait);
        assert_eq!(d(1, Holder::Writer(2)), Decision::Wait);
        assert_eq!(d(2, Holder::Writer(0)), Decision::Abort, "2 → 0 → 1 → 2");
        assert_eq!(shared.waits_for[2].load(Ordering::Relaxed), 0);
        assert_eq!(
            d(3, Holder::Writer(0)),
            Decision::Wait,
            "3 is not on the cycle"
        );
    }
}
