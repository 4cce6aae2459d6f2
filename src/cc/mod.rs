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

pub mod history;
pub mod hstore;
pub mod lock2pl;
pub mod mvcc;
pub mod silo;
pub mod tictoc;
pub mod to;

pub use mvcc::{SnapshotClock, VersionStore};

use serde::{Deserialize, Serialize};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A concurrency-control protocol: the set Falcon (§5.2, §6) and Zen (§3.3.2, §4.4) evaluate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Optimistic: read without locks, lock the write set at commit, validate the read set (the
    /// Silo-style OCC Falcon §5.2.1 describes; commit tids from the loosely synchronised clock).
    Occ,
    /// Two-phase locking, no-wait: a lock conflict aborts at once, so no deadlock can form.
    NoWait,
    /// Two-phase locking, wait-die: an older transaction waits for a younger lock holder, a
    /// younger one dies (aborts).
    WaitDie,
    /// Two-phase locking with deadlock detection: waiters publish whom they wait for; a waiter
    /// that closes a cycle in the waits-for graph aborts.
    DlDetect,
    /// Basic timestamp ordering (Falcon §5.2.1): a timestamp at begin, read/write timestamps
    /// per tuple, a lock bit for writes in flight.
    To,
    /// Silo (Tu et al., SOSP'13): OCC whose commit tids come from a global epoch and the versions
    /// seen, not from a clock read per commit.
    Silo,
    /// TicToc (Yu et al., SIGMOD'16): OCC with data-driven commit timestamps (read timestamps
    /// extended at validation).
    Tictoc,
    /// Multi-version OCC (Falcon §5.2.1): OCC for read-write transactions, snapshot reads of DRAM
    /// versions for read-only ones.
    Mvocc,
    /// Multi-version timestamp ordering (Falcon §5.2.1, FIR §4.2).
    Mvto,
    /// Multi-version 2PL (Falcon §5.2.1): no-wait locks for read-write transactions, snapshots for
    /// read-only ones.
    Mv2pl,
    /// Snapshot isolation (ArchTM §5.3): snapshot reads, first committer wins. **Not
    /// serializable**: write skew can occur.
    Si,
    /// Partition locking (H-Store style): one exclusive lock per partition, no per-tuple CC.
    Hstore,
}

impl Protocol {
    /// Every protocol, in CLI order.
    pub const ALL: [Protocol; 12] = [
        Protocol::NoWait,
        Protocol::WaitDie,
        Protocol::DlDetect,
        Protocol::To,
        Protocol::Occ,
        Protocol::Silo,
        Protocol::Tictoc,
        Protocol::Mvocc,
        Protocol::Mvto,
        Protocol::Mv2pl,
        Protocol::Si,
        Protocol::Hstore,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Occ => "occ",
            Protocol::NoWait => "no-wait",
            Protocol::WaitDie => "wait-die",
            Protocol::DlDetect => "dl-detect",
            Protocol::To => "to",
            Protocol::Silo => "silo",
            Protocol::Tictoc => "tictoc",
            Protocol::Mvocc => "mvocc",
            Protocol::Mvto => "mvto",
            Protocol::Mv2pl => "mv2pl",
            Protocol::Si => "si",
            Protocol::Hstore => "hstore",
        }
    }

    /// Whether the protocol keeps old versions in DRAM (Falcon §5.2.3) and runs read-only
    /// transactions on snapshots, so they never abort.
    pub fn is_multi_version(self) -> bool {
        matches!(
            self,
            Protocol::Mvocc | Protocol::Mvto | Protocol::Mv2pl | Protocol::Si
        )
    }

    /// Whether a transaction's scans are validated against phantoms at commit
    /// (`engine::common::ScanSet`): under the protocols that claim serializability, for the
    /// transactions that read current rows or hold a timestamp order to keep. That is every
    /// transaction of the single-version protocols, and the read-write transactions of MVOCC,
    /// MV2PL (which read current rows under validation or locks) and MVTO (whose scans must not
    /// miss an insert ordered before it). Read-only transactions of the multi-version protocols
    /// read a snapshot, serializable at it as it is; SI admits phantoms by definition.
    pub fn validates_scans(self, read_only: bool) -> bool {
        match self {
            Protocol::Si => false,
            Protocol::Mvocc | Protocol::Mv2pl | Protocol::Mvto => !read_only,
            _ => true,
        }
    }

    /// Whether a transaction locks tuples as it writes them (2PL, TO) rather than at commit;
    /// MV2PL's read-only transactions take no locks.
    pub fn locks_writes_early(self, read_only: bool) -> bool {
        match self {
            Protocol::NoWait | Protocol::WaitDie | Protocol::DlDetect => true,
            Protocol::To | Protocol::Mvto => true,
            Protocol::Mv2pl => !read_only,
            _ => false,
        }
    }

    /// Whether reads take read locks held to the end of the transaction (2PL).
    pub fn holds_read_locks(self) -> bool {
        matches!(
            self,
            Protocol::NoWait | Protocol::WaitDie | Protocol::DlDetect | Protocol::Mv2pl
        )
    }

    /// Whether committed histories are conflict-serializable (all but snapshot isolation).
    pub fn is_serializable(self) -> bool {
        self != Protocol::Si
    }

    /// Whether the protocol needs more than the per-tuple word of [`CcProtocol`]: a transaction
    /// context (timestamps, waits-for, partition locks, version chains; see [`CcShared`]). Engines
    /// that drive protocols only through [`CcProtocol`] refuse these with
    /// [`UnsupportedProtocol`].
    pub fn requires_context(self) -> bool {
        !matches!(self, Protocol::Occ | Protocol::NoWait | Protocol::Silo)
    }

    /// The tuple word a recovered tuple gets (no locks, no readers), given the commit tid of its
    /// last writer.
    pub fn idle_word(self, write_ts: u64) -> u64 {
        match self {
            Protocol::NoWait | Protocol::WaitDie | Protocol::DlDetect | Protocol::Mv2pl => 0,
            // OCC family: the version; TO, MVTO and TicToc: the read timestamp, equal to wts.
            _ => write_ts & !LOCK_BIT,
        }
    }

    /// Help text for `--cc`: every name with a short description.
    pub fn help() -> String {
        let names: Vec<&str> = Protocol::ALL.iter().map(|p| p.name()).collect();
        format!(
            "Concurrency-control protocol: {} (si is snapshot isolation, not serializable; \
             hstore locks partitions, see --partitions)",
            names.join(", ")
        )
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing an unknown protocol name.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "unknown concurrency-control protocol '{0}' (expected one of: no-wait, wait-die, dl-detect, \
     to, occ, silo, tictoc, mvocc, mvto, mv2pl, si, hstore)"
)]
pub struct UnknownProtocol(pub String);

/// An engine cannot run a protocol (e.g. one that needs a transaction context, see
/// [`Protocol::requires_context`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("engine {engine} does not support concurrency control '{protocol}': {reason}")]
pub struct UnsupportedProtocol {
    /// The engine's name.
    pub engine: String,
    /// The protocol.
    pub protocol: Protocol,
    /// Why not.
    pub reason: String,
}

impl FromStr for Protocol {
    type Err = UnknownProtocol;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownProtocol(s.to_string()))
    }
}

/// Options of the protocols that need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CcOptions {
    /// Partitions for `hstore` (a key's partition is `key % partitions`, so keys that encode a
    /// warehouse in their low bits partition by warehouse).
    pub partitions: usize,
    /// How many times a waiting protocol (wait-die, dl-detect, and readers of a tuple whose
    /// commit is in flight) polls before giving up and aborting.
    pub wait_spins: u32,
}

impl Default for CcOptions {
    fn default() -> Self {
        CcOptions {
            partitions: 16,
            wait_spins: 1 << 14,
        }
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
        validate_with(word, version, || locked_by_me)
    }

    /// [`validate`] that asks `locked_by_me` only when the word is locked: finding out is a
    /// search of the write set, which a commit would otherwise pay for every read (issue 13).
    #[inline]
    pub fn validate_with(
        word: &impl MetaWord,
        version: u64,
        locked_by_me: impl FnOnce() -> bool,
    ) -> bool {
        let w = word.load();
        (w & !LOCK_BIT) == version && (w & LOCK_BIT == 0 || locked_by_me())
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
    /// Whether the protocol needs a transaction context beyond these per-word methods
    /// ([`Protocol::requires_context`]); an engine that cannot provide one must refuse it.
    fn requires_context(&self) -> bool {
        self.protocol().requires_context()
    }
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

/// The per-word face of a protocol that needs a transaction context ([`CcProtocol::requires_context`]
/// is true). Engines that honour `requires_context` never call its methods; one that ignores it
/// gets every read and lock refused (aborts), never a silently different protocol.
pub struct ContextOnly(pub Protocol);

impl CcProtocol for ContextOnly {
    fn protocol(&self) -> Protocol {
        self.0
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
    fn read_begin(&self, _word: &dyn MetaWord) -> ReadStart {
        ReadStart::Abort
    }
    fn read_end(&self, _word: &dyn MetaWord, _token: u64) -> bool {
        false
    }
    fn try_write_lock(&self, _word: &dyn MetaWord, _holds_read: bool) -> bool {
        false
    }
    fn validate_read(&self, _word: &dyn MetaWord, _token: u64, _locked_by_me: bool) -> bool {
        false
    }
    fn release_write(&self, word: &dyn MetaWord, tid: Option<u64>) {
        let version = tid.unwrap_or_else(|| word.load()) & !LOCK_BIT;
        word.store(version)
    }
    fn release_read(&self, _word: &dyn MetaWord) {}
    fn idle_word(&self, write_ts: u64) -> u64 {
        self.0.idle_word(write_ts)
    }
}

/// Silo's per-word operations are OCC's (lock bit + version); what differs is how the commit tid
/// is chosen ([`silo::EpochClock`]), which an engine without context may do with its own clock.
pub struct Silo;

impl CcProtocol for Silo {
    fn protocol(&self) -> Protocol {
        Protocol::Silo
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
        Occ.read_begin(word)
    }
    fn read_end(&self, word: &dyn MetaWord, token: u64) -> bool {
        Occ.read_end(word, token)
    }
    fn try_write_lock(&self, word: &dyn MetaWord, holds_read: bool) -> bool {
        Occ.try_write_lock(word, holds_read)
    }
    fn validate_read(&self, word: &dyn MetaWord, token: u64, locked_by_me: bool) -> bool {
        Occ.validate_read(word, token, locked_by_me)
    }
    fn release_write(&self, word: &dyn MetaWord, tid: Option<u64>) {
        Occ.release_write(word, tid)
    }
    fn release_read(&self, _word: &dyn MetaWord) {}
    fn idle_word(&self, write_ts: u64) -> u64 {
        write_ts & !LOCK_BIT
    }
}

impl Protocol {
    /// The protocol's per-word implementation. For protocols that
    /// [need a context](Protocol::requires_context) it is a [`ContextOnly`] that refuses every
    /// operation: engines must check `requires_context` first.
    pub fn implementation(self) -> &'static dyn CcProtocol {
        const CONTEXT_ONLY: [ContextOnly; 12] = [
            ContextOnly(Protocol::NoWait),
            ContextOnly(Protocol::WaitDie),
            ContextOnly(Protocol::DlDetect),
            ContextOnly(Protocol::To),
            ContextOnly(Protocol::Occ),
            ContextOnly(Protocol::Silo),
            ContextOnly(Protocol::Tictoc),
            ContextOnly(Protocol::Mvocc),
            ContextOnly(Protocol::Mvto),
            ContextOnly(Protocol::Mv2pl),
            ContextOnly(Protocol::Si),
            ContextOnly(Protocol::Hstore),
        ];
        match self {
            Protocol::Occ => &Occ,
            Protocol::NoWait => &NoWait,
            Protocol::Silo => &Silo,
            other => {
                let i = Protocol::ALL
                    .iter()
                    .position(|&p| p == other)
                    .expect("every protocol is in ALL");
                &CONTEXT_ONLY[i]
            }
        }
    }
}

/// State the context-requiring protocols share across a database's workers (the "context" of
/// [`Protocol::requires_context`]): per-thread timestamps and waits-for edges (wait-die,
/// dl-detect), partition locks (hstore), the Silo epoch, and the DRAM version store and snapshot
/// clock (multi-version protocols). Engines keep one per database.
#[derive(Debug)]
pub struct CcShared {
    /// The options.
    pub options: CcOptions,
    /// Per thread: the running transaction's priority timestamp (wait-die), `u64::MAX` idle.
    pub txn_ts: Box<[crossbeam_utils::CachePadded<AtomicU64>]>,
    /// Per thread: the thread + 1 it waits for, or the word whose readers it waits for
    /// (dl-detect, see [`lock2pl::decide`]), 0 when not waiting.
    pub waits_for: Box<[crossbeam_utils::CachePadded<AtomicU64>]>,
    /// Per thread: the ids of the words it holds read locks on (dl-detect only), so that a
    /// writer waiting for readers knows whom it waits for ([`lock2pl::closes_cycle`]).
    pub read_locks: Box<[crossbeam_utils::CachePadded<parking_lot::Mutex<Vec<u64>>>]>,
    /// Partition locks (hstore).
    pub partitions: hstore::PartitionLocks,
    /// Silo's global epoch.
    pub epoch: silo::EpochClock,
    /// Old versions (multi-version protocols).
    pub versions: VersionStore,
    /// Snapshot and commit timestamps of the multi-version protocols.
    pub snapshots: SnapshotClock,
}

impl CcShared {
    /// Shared state for `threads` worker slots.
    pub fn new(threads: usize, options: CcOptions) -> CcShared {
        let slots = |v: u64| {
            (0..threads)
                .map(|_| crossbeam_utils::CachePadded::new(AtomicU64::new(v)))
                .collect()
        };
        CcShared {
            options,
            txn_ts: slots(u64::MAX),
            waits_for: slots(0),
            read_locks: (0..threads)
                .map(|_| crossbeam_utils::CachePadded::new(parking_lot::Mutex::new(Vec::new())))
                .collect(),
            partitions: hstore::PartitionLocks::new(options.partitions),
            epoch: silo::EpochClock::default(),
            versions: VersionStore::new(),
            snapshots: SnapshotClock::default(),
        }
    }
}

thread_local! {
    /// The stop flag of the run this thread works for, if any ([`set_stop_flag`]).
    static STOP_FLAG: std::cell::RefCell<Option<Arc<AtomicBool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes `flag` this thread's stop flag (`None`: no flag): once it is set, lock waits give up
/// ([`lock2pl::acquire`]) and `Worker::run_counted` stops retrying aborted transactions, so a
/// thread stuck behind contention notices that its run is over (the benchmark harness sets it
/// when the measured duration ends).
pub fn set_stop_flag(flag: Option<Arc<AtomicBool>>) {
    STOP_FLAG.with(|f| *f.borrow_mut() = flag);
}

/// Whether this thread's run asked it to stop ([`set_stop_flag`]).
pub fn stop_requested() -> bool {
    STOP_FLAG.with(|f| {
        f.borrow()
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::Acquire))
    })
}

/// A backoff step of a polling loop: spin first, then yield (two cores shared by many threads).
#[inline]
pub fn backoff(round: u32) {
    if round < 32 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
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
    fn occ_validate_with_asks_about_the_lock_only_when_the_word_is_locked() {
        let w = AtomicU64::new(10);
        let asked = std::cell::Cell::new(0);
        let ask = |answer: bool| {
            asked.set(asked.get() + 1);
            answer
        };
        assert!(
            occ::validate_with(&w, 10, || ask(false)),
            "unlocked, same version"
        );
        assert!(
            !occ::validate_with(&w, 8, || ask(true)),
            "unlocked, new version"
        );
        assert_eq!(asked.get(), 0, "an unlocked word needs no write-set search");
        occ::try_lock(&w);
        assert!(
            !occ::validate_with(&w, 10, || ask(false)),
            "locked by another"
        );
        assert!(
            occ::validate_with(&w, 10, || ask(true)),
            "locked by the validator"
        );
        assert_eq!(asked.get(), 2);
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
