//! Two-phase locking over the tuple's lock word: no-wait, wait-die and deadlock detection
//! (Falcon §5.2.1 "the first bit acts as the write lock, and the other bits are the read locks";
//! the policies as in Yu et al., VLDB'14, which Zen §4.4 and Falcon §6 evaluate).
//!
//! Word: bit 63 write lock, bits 32..56 the *claimant*'s thread + 1, bits 0..32 the reader count.
//! The claimant is the write-lock holder, or (dl-detect only, bit 63 clear) a writer that waits for
//! the readers to leave: its claim turns new readers away (so a stream of readers cannot starve an
//! upgrade) and names it to them, so they wait for it by name.
//!
//! Readers are counted in the word, not named. Deadlock detection names them elsewhere: under
//! dl-detect each thread publishes the words it holds read locks on ([`CcShared::read_locks`]),
//! and a writer waiting for readers publishes the word it waits on, so the waits-for graph has
//! every edge, including the reader edges of the classic upgrade deadlock (two readers of one
//! tuple both upgrading), which a count alone cannot show (docs/CC.md).

use super::{CcShared, MetaWord, Protocol, LOCK_BIT};
use std::sync::atomic::Ordering;

const READERS: u64 = (1 << 32) - 1;
const OWNER_SHIFT: u32 = 32;
const OWNER_MASK: u64 = (1 << 24) - 1;
const OWNER_BITS: u64 = OWNER_MASK << OWNER_SHIFT;

/// A `waits_for` value that means "waits for the readers of word `value & !WAITS_ON_READERS`"
/// (dl-detect); other non-zero values are a thread + 1.
const WAITS_ON_READERS: u64 = 1 << 63;

/// The thread holding the write lock of word value `w`, if any.
#[inline]
pub fn write_owner(w: u64) -> Option<usize> {
    if w & LOCK_BIT == 0 {
        return None;
    }
    claimant(w)
}

/// The thread that holds or claims (see the module comment) the write lock of word value `w`.
#[inline]
fn claimant(w: u64) -> Option<usize> {
    let o = (w >> OWNER_SHIFT) & OWNER_MASK;
    (o > 0).then(|| o as usize - 1)
}

/// Who holds a lock that was refused: a named writer (or claimant), or unnamed readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The write lock holder's (or claimant's) thread.
    Writer(usize),
    /// One or more readers.
    Readers,
}

/// Takes a read lock unless a writer holds or claims the word.
#[inline]
pub fn try_read_lock(word: &impl MetaWord) -> Result<(), Holder> {
    let w = word.load();
    if let Some(o) = claimant(w) {
        return Err(Holder::Writer(o));
    }
    if w & LOCK_BIT == 0 && w & READERS < READERS && word.cas(w, w + 1) {
        Ok(())
    } else {
        // Lost a race with another reader or a writer: report what is there now.
        match claimant(word.load()) {
            Some(o) => Err(Holder::Writer(o)),
            None => Err(Holder::Readers),
        }
    }
}

/// Takes the write lock for `thread` when nobody else holds the word, or upgrades the caller's
/// read lock when it is the only reader (a claim of `thread`'s own is taken over).
#[inline]
pub fn try_write_lock(word: &impl MetaWord, holds_read: bool, thread: usize) -> Result<(), Holder> {
    let expected = u64::from(holds_read);
    let mine = (thread as u64 + 1) << OWNER_SHIFT;
    let locked = LOCK_BIT | mine;
    if word.cas(expected, locked) || word.cas(expected | mine, locked) {
        return Ok(());
    }
    match claimant(word.load()) {
        Some(o) if o != thread => Err(Holder::Writer(o)),
        _ => Err(Holder::Readers),
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

/// Claims the write lock of a word that readers hold, for `thread` (see the module comment);
/// true if the claim is (now) `thread`'s.
fn claim(word: &impl MetaWord, thread: usize) -> bool {
    let w = word.load();
    match claimant(w) {
        Some(o) => o == thread,
        None => w & LOCK_BIT == 0 && word.cas(w, w | (thread as u64 + 1) << OWNER_SHIFT),
    }
}

/// Withdraws `thread`'s claim on a word, if it still has one.
fn withdraw_claim(word: &impl MetaWord, thread: usize) {
    loop {
        let w = word.load();
        if w & LOCK_BIT != 0 || claimant(w) != Some(thread) {
            return;
        }
        if word.cas(w, w & !OWNER_BITS) {
            return;
        }
    }
}

/// What a transaction does about a refused lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Poll the word again.
    Wait,
    /// Abort the transaction.
    Abort,
}

/// What a transaction asks of [`acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A read lock.
    Read,
    /// The write lock; `holds_read`: upgrade the caller's read lock.
    Write {
        /// The caller holds a read lock on the word.
        holds_read: bool,
    },
}

/// The policy's answer for thread `me`, refused by `holder` on the word `word_id` (called on every
/// poll, so a decision follows the holders as they change).
///
/// - no-wait (and MV2PL's read-write transactions): abort.
/// - wait-die: wait only for a younger named writer (smaller timestamp = older); die otherwise.
///   Waits go from older to younger only, so no cycle can form.
/// - dl-detect: publish "me waits for holder" (a thread, or the readers of `word_id`) and search
///   the waits-for graph from there; if the search comes back to `me`, abort (this transaction is
///   the victim).
pub fn decide(
    protocol: Protocol,
    shared: &CcShared,
    me: usize,
    holder: Holder,
    word_id: u64,
) -> Decision {
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
            wait_unless_cycle(shared, me)
        }
        (Protocol::DlDetect, Holder::Readers) => {
            debug_assert!(word_id & WAITS_ON_READERS == 0, "word ids fit in 63 bits");
            shared.waits_for[me].store(WAITS_ON_READERS | word_id, Ordering::SeqCst);
            wait_unless_cycle(shared, me)
        }
        _ => Decision::Abort,
    }
}

fn wait_unless_cycle(shared: &CcShared, me: usize) -> Decision {
    if closes_cycle(shared, me) {
        shared.waits_for[me].store(0, Ordering::SeqCst);
        Decision::Abort
    } else {
        Decision::Wait
    }
}

/// Polls between two looks at the run's stop flag ([`super::stop_requested`]) while waiting.
const STOP_CHECK_INTERVAL: u32 = 64;

/// Takes a lock on `word` (whose id, unique among the words that can be locked at the same time,
/// is `word_id`: a tuple's address), waiting as `protocol`'s policy says ([`decide`]: no-wait
/// aborts at once, wait-die waits only for younger writers, dl-detect until it closes a cycle).
/// Gives up after `options.wait_spins` polls, or as soon as the run asks its transactions to stop
/// ([`super::stop_requested`]). Returns whether the lock was taken. Leaves `me`'s waits-for edge
/// cleared and, under dl-detect, `me`'s published read locks up to date.
pub fn acquire<W: MetaWord>(
    protocol: Protocol,
    shared: &CcShared,
    me: usize,
    word: &W,
    word_id: u64,
    request: Request,
) -> bool {
    let detect = protocol == Protocol::DlDetect;
    let mut taken = false;
    let mut claimed = false;
    for round in 0..shared.options.wait_spins {
        let refused = match request {
            Request::Read => try_read_lock(word),
            Request::Write { holds_read } => try_write_lock(word, holds_read, me),
        };
        let holder = match refused {
            Ok(()) => {
                taken = true;
                break;
            }
            Err(holder) => holder,
        };
        if request == Request::Read && holder == Holder::Readers {
            // A race with another reader (or a count at its limit): nobody to wait for by name.
            if detect {
                shared.waits_for[me].store(0, Ordering::SeqCst);
            }
        } else {
            if detect && holder == Holder::Readers && !claimed {
                claimed = claim(word, me);
            }
            if decide(protocol, shared, me, holder, word_id) == Decision::Abort {
                break;
            }
        }
        if round % STOP_CHECK_INTERVAL == STOP_CHECK_INTERVAL - 1 && super::stop_requested() {
            break;
        }
        super::backoff(round)
    }
    if detect {
        shared.waits_for[me].store(0, Ordering::SeqCst);
        if claimed && !taken {
            withdraw_claim(word, me);
        }
        if taken {
            let mut held = shared.read_locks[me].lock();
            match request {
                Request::Read => held.push(word_id),
                // The read lock became the write lock: no waiter for readers counts me now.
                Request::Write { holds_read: true } => {
                    if let Some(i) = held.iter().position(|&w| w == word_id) {
                        held.swap_remove(i);
                    }
                }
                Request::Write { holds_read: false } => {}
            }
        }
    }
    taken
}

/// Forgets the read locks `me` published (dl-detect), when its transaction ends.
pub fn end_transaction(shared: &CcShared, me: usize) {
    shared.waits_for[me].store(0, Ordering::SeqCst);
    shared.read_locks[me].lock().clear();
}

/// Whether the waits-for graph has a path from `me`'s published edge back to `me`: a depth-first
/// search whose edges are a waiter's named holder, or, for a waiter for the readers of a word,
/// every other thread that published a read lock on it.
///
/// The graph is read while it changes: a stale edge can make a victim of a transaction whose wait
/// would have ended (a spurious abort, harmless); a missing one delays detection to a later poll.
/// A real deadlock does not change, so a poll after its last edge appears finds it.
pub fn closes_cycle(shared: &CcShared, me: usize) -> bool {
    let threads = shared.waits_for.len();
    let mut seen = vec![false; threads];
    let mut stack = vec![me];
    seen[me] = true;
    while let Some(at) = stack.pop() {
        let edge = shared.waits_for[at].load(Ordering::SeqCst);
        if edge == 0 {
            continue;
        }
        let mut visit = |next: usize| {
            if next == me {
                return true;
            }
            if next < threads && !seen[next] {
                seen[next] = true;
                stack.push(next);
            }
            false
        };
        if edge & WAITS_ON_READERS == 0 {
            if visit(edge as usize - 1) {
                return true;
            }
            continue;
        }
        let word_id = edge & !WAITS_ON_READERS;
        for reader in (0..threads).filter(|&t| t != at) {
            if shared.read_locks[reader].lock().contains(&word_id) && visit(reader) {
                return true;
            }
        }
    }
    false
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
        let d = |me, h| decide(Protocol::WaitDie, &shared, me, h, 0);
        assert_eq!(d(0, Holder::Writer(1)), Decision::Wait, "older waits");
        assert_eq!(d(1, Holder::Writer(0)), Decision::Abort, "younger dies");
        assert_eq!(d(0, Holder::Readers), Decision::Abort);
        assert_eq!(
            decide(Protocol::NoWait, &shared, 0, Holder::Writer(1), 0),
            Decision::Abort
        );
    }

    #[test]
    fn dl_detect_finds_the_cycle() {
        let shared = CcShared::new(4, CcOptions::default());
        let d = |me, h| decide(Protocol::DlDetect, &shared, me, h, 0);
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

    /// Two readers of one word that both upgrade: the first claims the word and waits for the
    /// other reader, whose upgrade then closes the cycle through the reader edge (a reader count
    /// alone could not show it: each waited for "readers" until a time-out, issue 22).
    #[test]
    fn dl_detect_finds_the_upgrade_cycle_through_readers() {
        let shared = CcShared::new(2, CcOptions::default());
        let x = AtomicU64::new(0);
        let word_id = 0x40;
        for me in 0..2 {
            assert!(acquire(
                Protocol::DlDetect,
                &shared,
                me,
                &x,
                word_id,
                Request::Read
            ));
        }
        assert_eq!(*shared.read_locks[1].lock(), vec![word_id]);
        // Thread 0 asks for the upgrade while 1 reads: it claims the word and waits for readers.
        assert_eq!(try_write_lock(&x, true, 0), Err(Holder::Readers));
        assert!(claim(&x, 0));
        assert_eq!(
            decide(Protocol::DlDetect, &shared, 0, Holder::Readers, word_id),
            Decision::Wait
        );
        assert_eq!(
            try_read_lock(&x),
            Err(Holder::Writer(0)),
            "claimed: no new reader"
        );
        // Thread 1's upgrade now waits for 0, which waits for 1 (a reader of x): the victim is 1.
        let upgrade = Request::Write { holds_read: true };
        assert!(!acquire(
            Protocol::DlDetect,
            &shared,
            1,
            &x,
            word_id,
            upgrade
        ));
        assert_eq!(shared.waits_for[1].load(Ordering::Relaxed), 0);
        read_unlock(&x);
        end_transaction(&shared, 1);
        // With 1 gone, 0 takes over its own claim.
        assert!(acquire(
            Protocol::DlDetect,
            &shared,
            0,
            &x,
            word_id,
            upgrade
        ));
        assert_eq!(write_owner(x.load(Ordering::Relaxed)), Some(0));
        assert!(
            shared.read_locks[0].lock().is_empty(),
            "the read lock became the write lock"
        );
    }

    /// A victim withdraws its claim, so readers are not turned away by a writer that gave up.
    #[test]
    fn a_writer_that_gives_up_withdraws_its_claim() {
        let options = CcOptions {
            wait_spins: 8,
            ..CcOptions::default()
        };
        let shared = CcShared::new(2, options);
        let x = AtomicU64::new(0);
        assert!(acquire(
            Protocol::DlDetect,
            &shared,
            1,
            &x,
            7,
            Request::Read
        ));
        let write = Request::Write { holds_read: false };
        assert!(
            !acquire(Protocol::DlDetect, &shared, 0, &x, 7, write),
            "times out"
        );
        assert_eq!(x.load(Ordering::Relaxed), 1, "one reader, no claim left");
        assert_eq!(try_read_lock(&x), Ok(()));
    }
}
