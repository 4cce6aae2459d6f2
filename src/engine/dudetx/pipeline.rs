//! The decoupled back end (§3.1, §3.3–§3.4): committed transactions' redo logs wait in a queue in
//! commit (id) order; the *persist* step combines a group of them (§3.3), writes one record to
//! the PM log ring, makes it durable and then advances the durable id; the *reproduce* step
//! applies persisted records to the PM heap in id order, makes that durable, and truncates the
//! log. The steps run in two background threads, or (`background: false`, for the crash
//! simulator, whose PM events must come from the threads it drives) inline in the committing
//! thread.
//!
//! What differs between the perform modes is a [`Sequencer`]: [`IdOrder`] for the STM and the
//! table engine (global ids, §3.2–§3.4: a group combined into one record, a durable id word,
//! reproduce in id order, truncation by the last id) and `ptm::locks::DepOrder` for the
//! lock-based mode (§5: one record per transaction persisted chain by chain, durability found
//! by one- or two-round detection, reproduce in dependency order, truncation by per-chain
//! watermarks). The core owns everything else: the queue, the ring, the ordering steps and
//! their faults, the threads, group commit, draining and failure.

use super::heap::Heap;
use super::layout::meta;
use super::log::{self, Op, OpRef};
use super::{DudetxConfig, DudetxFault, DurabilityMode};
use crate::alloc::PageManager;
use crate::engine::wal::{build_record_into, is_compressed, LogRing};
use crate::pmem::Pool;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A committed transaction's redo log, queued for a persist step.
pub(crate) struct Queued {
    /// Its id.
    pub id: u64,
    /// The encoded ops.
    pub log: Vec<u8>,
}

impl AsRef<[u8]> for Queued {
    fn as_ref(&self) -> &[u8] {
        &self.log
    }
}

/// A record a persist step writes: the ids it covers and its payload (encoded ops, before
/// compression).
pub(crate) struct Record {
    /// The first id it covers.
    pub first: u64,
    /// The last id it covers.
    pub last: u64,
    /// The encoded ops.
    pub raw: Vec<u8>,
    /// The ops decoded while the record is made, outside the state lock (lock mode, which
    /// needs each record's dependencies when it is persisted); empty for the STM's records.
    pub decoded: Vec<Op>,
}

/// A record written to the ring: where, and where the next one starts.
pub(crate) struct Written {
    /// The record.
    pub record: Record,
    /// Its log position.
    pub pos: u64,
    /// The log position after it.
    pub end: u64,
}

/// What one reproduce step applies and how it truncates the log afterwards (§3.4: a record
/// is recycled only once its effects are durable).
pub(crate) struct Reproduction {
    /// The records' ops, record after record, in the order they apply.
    pub ops: Batch,
    /// The sequencer's truncation marks (the STM: the last reproduced id; lock mode: the
    /// chains' watermarks), written and persisted once the heap writes are durable, before the
    /// head moves.
    pub marks: Box<dyn FnOnce(&Pool) + Send>,
    /// The new truncation position, if the head moves.
    pub head: Option<u64>,
    /// The id [`Core::reproduced`] reports afterwards.
    pub last: u64,
}

/// The ops of a reproduce step's records.
pub(crate) enum Batch {
    /// Decoded at persist (lock mode needs each record's dependencies then).
    Decoded(Vec<Vec<Op>>),
    /// Still encoded: the STM and the table engine decode them in the reproduce step, outside
    /// the state lock and off the commit path (decoding at persist put a copy of every row on
    /// a sync commit's path, under the lock its committers queue on).
    Encoded(Vec<Vec<u8>>),
}

/// How a persist step makes a group of committed logs ([`Persister::group`], in the order they
/// were queued) into records, in ring order, appended to [`Persister::records`]. A plain
/// function of the persister: it runs outside the state lock.
pub(crate) type MakeRecords = fn(&mut Persister) -> Result<(), String>;

/// What the perform modes' pipelines do differently (§3 vs §5), plugged into [`Core`]: how a
/// group of committed logs becomes records, what makes a record durable, which persisted
/// records reproduce next and in what order, and what marks the truncation. Its methods run
/// under the core's state lock.
pub(crate) trait Sequencer: Send + 'static {
    /// How a persist step makes a group into records (called once, when the core is made;
    /// the function runs outside the state lock, see [`Core::persist_step`]).
    fn make_records(&self) -> MakeRecords;

    /// Whether a persist step publishes a durable id word on PM after its records (§3.3, a
    /// global order); without one, recovery finds what is durable again (§5.3).
    fn durable_word(&self) -> bool;

    /// Bookkeeping once `written` are durable (it takes them all); returns the id to report
    /// durable, if any became so.
    fn persisted(&mut self, written: &mut Vec<Written>) -> Result<Option<u64>, String>;

    /// The durable-report fault without a durable word: reports `records` durable before they
    /// are written; returns the id to report.
    fn report_early(&mut self, records: &[Record]) -> Option<u64>;

    /// Whether transaction `id` is durable, `reported` being the last id reported durable.
    fn is_durable(&self, id: u64, reported: u64) -> bool;

    /// Persisted records reproduce could apply now.
    fn reproducible(&self) -> usize;

    /// Takes every reproducible record for one reproduce step (`meta_page`: the meta page the
    /// marks go to); None when there is none.
    fn take_reproducible(&mut self, meta_page: u64) -> Option<Reproduction>;

    /// Whether nothing persisted waits for reproduce, given the last id committed and the last
    /// reproduced.
    fn settled(&self, committed: u64, reproduced: u64) -> bool;
}

/// The global order of the STM and the table engine (§3.2–§3.4): ids in commit order; a
/// group is combined into one record (§3.3) and the durable id published after it; reproduce
/// applies records in id order and truncates with the last id it applied.
#[derive(Default)]
pub(crate) struct IdOrder {
    /// Persisted, not yet reproduced: (last id, log position after it, encoded ops), in id
    /// order.
    persisted: VecDeque<(u64, u64, Vec<u8>)>,
}

impl IdOrder {
    /// One record for the whole group, its logs combined (§3.3) into the persister's spare
    /// buffer.
    fn combined(p: &mut Persister) -> Result<(), String> {
        let (Some(first), Some(last)) = (p.group.first(), p.group.last()) else {
            return Ok(());
        };
        let (first, last) = (first.id, last.id);
        let mut raw = std::mem::take(&mut p.raw);
        raw.clear();
        match p.group.as_mut_slice() {
            // A single log replays as combined (see the module doc of `engine::dudetx`): it
            // becomes the record's payload as it is, and the spare buffer takes its place in
            // the group (recycled with it) instead of receiving a copy.
            [single] => std::mem::swap(&mut raw, &mut single.log),
            group => p.combiner.combine_into(group, &mut raw)?,
        }
        p.records.push(Record {
            first,
            last,
            raw,
            decoded: Vec::new(),
        });
        Ok(())
    }
}

impl Sequencer for IdOrder {
    fn make_records(&self) -> MakeRecords {
        IdOrder::combined
    }

    fn durable_word(&self) -> bool {
        true
    }

    fn persisted(&mut self, written: &mut Vec<Written>) -> Result<Option<u64>, String> {
        let mut last = None;
        for w in written.drain(..) {
            self.persisted
                .push_back((w.record.last, w.end, w.record.raw));
            last = Some(w.record.last);
        }
        Ok(last)
    }

    fn report_early(&mut self, _records: &[Record]) -> Option<u64> {
        None // the durable id word is written early instead (`Core::write_records`)
    }

    fn is_durable(&self, id: u64, reported: u64) -> bool {
        reported >= id
    }

    fn reproducible(&self) -> usize {
        self.persisted.len()
    }

    fn take_reproducible(&mut self, meta_page: u64) -> Option<Reproduction> {
        let &(last, end, _) = self.persisted.back()?;
        let ops = Batch::Encoded(self.persisted.drain(..).map(|(_, _, raw)| raw).collect());
        let marks = Box::new(move |pool: &Pool| {
            pool.write_u64(meta_page + meta::HEAD_SEQ, last);
            pool.persist(meta_page + meta::HEAD_SEQ, 8);
        });
        Some(Reproduction {
            ops,
            marks,
            head: Some(end),
            last,
        })
    }

    fn settled(&self, committed: u64, reproduced: u64) -> bool {
        self.persisted.is_empty() && reproduced >= committed
    }
}

/// The pipeline's shared state (under [`Core::state`]).
pub(crate) struct State {
    /// Committed, not yet persisted, in the order they were queued (the STM: id order; lock
    /// mode: every transaction after those it depends on).
    queue: VecDeque<Queued>,
    /// Emptied log buffers for committers and persist steps to reuse (at most
    /// [`SPARE_BUFFERS`]): logs and combined records pass from the workers through persist
    /// and reproduce, and come back here instead of being freed and allocated again.
    spare: Vec<Vec<u8>>,
    /// The persist step's buffers: taken by the step that runs (`persisting`), back home
    /// between steps, cleared. Missing at a step's start only if an earlier step unwound before
    /// putting them back (a simulated crash unwinds at a PM event; in the crash suite another
    /// thread then persists before its own next PM event unwinds it too): the step takes fresh
    /// ones, as they carry nothing from one step to the next.
    persister: Option<Box<Persister>>,
    /// The bytes of the logs in `queue`.
    queued_bytes: usize,
    /// When the oldest log in `queue` was queued (the group-fill wait is bounded from it; async
    /// mode only).
    queued_since: Option<std::time::Instant>,
    /// Callers waiting in [`Core::drain`]: the persist thread does not wait for a group to fill
    /// while one does.
    draining: usize,
    /// The next log position to write.
    pub tail: u64,
    /// The truncation position.
    pub head: u64,
    /// The perform mode's order: persisted records and what is durable and reproducible.
    seq: Box<dyn Sequencer>,
    /// Why the pipeline stopped (a full PM heap); commits are refused then.
    pub failed: Option<String>,
    /// Drop asked the threads to finish.
    stop: bool,
    /// A persist step is writing records (by the persist thread or a sync committer leading
    /// one, [`Core::wait_durable`]): the ring tail is taken.
    persisting: bool,
    /// A reproduce step is applying records outside the lock.
    reproducing: bool,
    /// A persist step waits for ring room: reproduce should not wait for a batch.
    room_wanted: bool,
    /// Threads still running.
    running: usize,
}

/// When a persist step tries LZ4 on a record (§3.3). Compression is there to save PM bytes; it
/// costs CPU on the persist path, which a sync commit waits for. A record it did not shrink
/// makes the next 1, 3, 7, ... up to 63 records skip the attempt (doubling with each miss in a
/// row); a record it shrank resets that. Logs that compress (TPC-C's padded rows, combined
/// groups) are compressed as before; incompressible ones (YCSB's random fields) pay for one
/// attempt in 64 instead of every one.
#[derive(Default)]
struct Lz4Backoff {
    /// Attempts in a row that saved nothing (at most [`LZ4_MAX_MISSES`]).
    misses: u32,
    /// Records still to build without an attempt.
    skip: u32,
}

/// The misses in a row after which LZ4 is tried once per 2^this records.
const LZ4_MAX_MISSES: u32 = 6;

impl Lz4Backoff {
    /// Whether to try LZ4 on the next record.
    fn attempt(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// Notes whether an attempt shrank its record.
    fn outcome(&mut self, shrank: bool) {
        if shrank {
            self.misses = 0;
        } else {
            self.misses = (self.misses + 1).min(LZ4_MAX_MISSES);
            self.skip = (1 << self.misses) - 1;
        }
    }
}

/// What a persist step works with, kept from one step to the next so that a step allocates
/// nothing once the buffers have grown (`perf`, 2-thread sync YCSB-A: malloc and free were 3-4 %
/// of the commit path). One step at a time owns it (`State::persisting`).
#[derive(Default)]
pub(crate) struct Persister {
    /// The group taken off the queue, in queue order.
    pub group: Vec<Queued>,
    /// The group's records, as the sequencer made them.
    pub records: Vec<Record>,
    /// Log combination's buffers (§3.3).
    pub combiner: log::Combiner,
    /// A spare buffer for the next combined record (from `State::spare`).
    pub raw: Vec<u8>,
    /// The records as the ring holds them: `built[i]` is `records[i]`'s.
    built: Vec<Vec<u8>>,
    /// LZ4's output.
    packed: Vec<u8>,
    /// When LZ4 is tried (§3.3).
    lz4: Lz4Backoff,
    /// Records written, on their way to the sequencer.
    written: Vec<Written>,
}

impl Persister {
    /// Forgets what a step left (a failed step leaves its group and records behind).
    fn clear(&mut self) {
        self.group.clear();
        self.records.clear();
        self.written.clear();
    }
}

/// Spare log buffers kept at most ([`State::spare`]): about what a reproduce batch hands back,
/// which the commits until the next batch take again.
const SPARE_BUFFERS: usize = REPRODUCE_BATCH;

/// The largest buffer kept for reuse: a transaction with a large log should not leave its
/// buffer behind for good (the spare ones hold at most 16 MiB).
const SPARE_MAX_BYTES: usize = 16 << 10;

/// The most ring bytes the records of `group` can take, whatever the sequencer makes of it:
/// combination and LZ4 only ever shrink a log (LZ4 is kept only when smaller), and each record
/// adds a header and at most 7 bytes of padding.
fn group_bound(group: &[Queued]) -> u64 {
    group
        .iter()
        .map(|q| (q.log.len() + crate::engine::wal::record::HEADER + 7) as u64)
        .sum()
}

/// Returns emptied `buffers` to the spare ones (those too large, or beyond the cap, are freed).
fn recycle(st: &mut State, buffers: impl Iterator<Item = Vec<u8>>) {
    for mut b in buffers {
        if st.spare.len() >= SPARE_BUFFERS {
            return;
        }
        if b.capacity() == 0 || b.capacity() > SPARE_MAX_BYTES {
            continue;
        }
        b.clear();
        st.spare.push(b);
    }
}

/// What log combination and compression did (§3.3, §6.3).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct LogStats {
    /// Transactions logged.
    pub txns: u64,
    /// Records written (groups).
    pub records: u64,
    /// Bytes of the transactions' own redo logs.
    pub raw_bytes: u64,
    /// Bytes after combination.
    pub combined_bytes: u64,
    /// Bytes written to the log ring (after compression, with record headers).
    pub stored_bytes: u64,
}

/// What the reproduce step applies records to (§3.1's "PM copy"): the table engine's row heap
/// ([`Heap`]) or the persistent-object API's word heap (`ptm::ObjectHeap`).
pub(crate) trait Apply: Send + 'static {
    /// Applies one op to PM, written back unless `fault` removes that (the caller fences once
    /// after a batch, before truncating the log).
    fn apply(
        &mut self,
        pool: &Pool,
        pages: &PageManager,
        op: OpRef<'_>,
        fault: Option<DudetxFault>,
    ) -> Result<(), String>;

    /// Prefetches what finding `op`'s target takes (the heap directory's entry for its key): a
    /// hint, as [`Apply::prefetch`], issued a pass before the op's [`Apply::prefetch`].
    fn prefetch_lookup(&self, _op: OpRef<'_>) {}

    /// Prefetches what applying `op` will touch (a hint: it changes nothing, and `op` may
    /// still wait behind ops not applied yet).
    fn prefetch(&self, _pool: &Pool, _op: OpRef<'_>) {}
}

/// How many ops reproduce takes through each of its three passes at a time
/// (`Core::reproduce_records`): decode (prefetching each directory entry), look up (prefetching
/// each row), apply. A table op misses twice, on the directory and then on the row the
/// directory names, and on this VM (4 KiB pages, nested paging) `perf` shows the reproduce
/// thread waiting right after those prefetches, as if each held the reorder buffer for its page
/// walk. In a pass of one kind of work an op is a few dozen instructions, so more ops' misses
/// can be in flight at once than when the stages were interleaved per op (before stop 44:
/// lookups 16 ops ahead, rows 8, with a whole op's decode and apply between two prefetches).
const REPRODUCE_CHUNK: usize = 32;

/// The ops of one reproduce chunk, on the stack: no allocation per batch.
type ReproduceChunk<'a> = smallvec::SmallVec<[OpRef<'a>; REPRODUCE_CHUNK]>;

/// The engine's persistent side, shared with the background threads; `H` is what reproduce
/// applies records to.
pub(crate) struct Core<H = Heap> {
    pub pool: Arc<Pool>,
    pub pages: PageManager,
    pub meta_page: u64,
    pub ring: LogRing,
    pub config: DudetxConfig,
    pub state: Mutex<State>,
    pub heap: Mutex<H>,
    /// How the sequencer makes a group into records ([`Sequencer::make_records`]).
    make_records: MakeRecords,
    wake_persist: Condvar,
    wake_reproduce: Condvar,
    became_durable: Condvar,
    /// The last id reported durable (the STM: the durable id of §3.3, as persisted; lock
    /// mode: the last transaction detection found reproducible, any chain).
    pub durable: AtomicU64,
    /// The last id assigned to a commit.
    pub committed: AtomicU64,
    /// The last id reproduced and truncated.
    pub reproduced: AtomicU64,
    /// Whether `State::failed` is set (it is set once, by `fail`): every commit asks, and the
    /// answer is almost always no, which should not cost the state lock the persist step holds.
    has_failed: AtomicBool,
    /// Persist steps ended (bumped under the state lock): what a committer spinning in
    /// [`Core::wait_durable`] watches.
    steps: AtomicU64,
    stats: [AtomicU64; 5],
}

/// Pauses a sync committer spins for the running persist step to end before it sleeps (about
/// 5 to 20 µs, depending on the CPU's `pause`).
const STEP_SPIN: usize = 256;

/// Records the reproduce thread waits for before it applies them (see `Core::reproduce_loop`):
/// each batch costs two wake-ups (on two cores, a worker switched out), a fence and two
/// truncation words, so a sync run (one record per commit or so) pays them once per 1,024
/// commits. The ring holds far more (16 MiB by default; YCSB-A's records are ~170 bytes), and
/// whoever needs the records applied sooner (a drain, ring room) does not wait for a batch.
const REPRODUCE_BATCH: usize = 1024;

/// How long the reproduce thread waits for a whole batch before it applies a partial one.
const REPRODUCE_IDLE: std::time::Duration = std::time::Duration::from_millis(5);

/// The largest combined log a record may carry: a quarter of the ring, so that a record always
/// fits once the records before it are truncated.
pub(crate) fn max_record_raw(ring_capacity: u64) -> usize {
    (ring_capacity / 4) as usize
}

impl<H: Apply> Core<H> {
    /// A pipeline over `ring` whose durable id is `durable` and whose log is truncated at
    /// `tail`, ordered by `seq`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pool: Arc<Pool>,
        pages: PageManager,
        meta_page: u64,
        ring: LogRing,
        config: DudetxConfig,
        heap: H,
        durable: u64,
        tail: u64,
        seq: Box<dyn Sequencer>,
    ) -> Core<H> {
        let make_records = seq.make_records();
        Core {
            pool,
            pages,
            meta_page,
            ring,
            config,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                spare: Vec::new(),
                persister: Some(Box::default()),
                queued_bytes: 0,
                queued_since: None,
                draining: 0,
                tail,
                head: tail,
                seq,
                failed: None,
                stop: false,
                persisting: false,
                reproducing: false,
                room_wanted: false,
                running: 0,
            }),
            heap: Mutex::new(heap),
            make_records,
            wake_persist: Condvar::new(),
            wake_reproduce: Condvar::new(),
            became_durable: Condvar::new(),
            durable: AtomicU64::new(durable),
            has_failed: AtomicBool::new(false),
            steps: AtomicU64::new(0),
            committed: AtomicU64::new(durable),
            reproduced: AtomicU64::new(durable),
            stats: Default::default(),
        }
    }

    fn fault(&self) -> Option<DudetxFault> {
        self.config.fault
    }

    /// The counters of log combination.
    pub fn stats(&self) -> LogStats {
        let s = |i: usize| self.stats[i].load(Ordering::Relaxed);
        LogStats {
            txns: s(0),
            records: s(1),
            raw_bytes: s(2),
            combined_bytes: s(3),
            stored_bytes: s(4),
        }
    }

    /// Why the pipeline stopped, if it did.
    pub fn failed(&self) -> Option<String> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.state.lock().failed.clone()
    }

    /// Hands a committed transaction's redo log to the pipeline (called in the order the
    /// sequencer needs: the STM under the commit lock, so ids enter the queue in order; lock
    /// mode while the transaction holds its locks, so it follows everything it depends on);
    /// inline mode persists and reproduces here. Returns an empty buffer for the caller's next
    /// log (a spare one when there is one: see [`State::spare`]).
    pub fn enqueue(&self, id: u64, log: Vec<u8>) -> Result<Vec<u8>, String> {
        let mut st = self.state.lock();
        self.stats[0].fetch_add(1, Ordering::Relaxed);
        self.stats[2].fetch_add(log.len() as u64, Ordering::Relaxed);
        st.queued_bytes += log.len();
        st.queue.push_back(Queued { id, log });
        let spare = st.spare.pop().unwrap_or_default();
        // Only async mode waits for a group to fill (`fill_group`); a clock read is ~40 ns in
        // this VM, on every sync commit.
        if st.queued_since.is_none() && self.config.mode == DurabilityMode::Async {
            st.queued_since = Some(std::time::Instant::now());
        }
        if self.config.background {
            // Async: the persist thread waits for the first log, and (filling a group) for a
            // full one. Sync: the committer, which waits next, leads the step itself
            // (`wait_durable`): waking the persist thread too cost a wake-up and a thread
            // competing for the cores on every commit (`perf`, 2-thread sync YCSB-A).
            let wake = self.config.mode == DurabilityMode::Async
                && (st.queue.len() == 1 || self.group_full(&st));
            if wake {
                self.wake_persist.notify_all();
            }
            return Ok(spare);
        }
        let due = self.config.mode == DurabilityMode::Sync || st.queue.len() >= self.config.group;
        if due {
            while !st.queue.is_empty() {
                self.persist_inline(&mut st)?;
            }
            // Leave a couple of records un-reproduced, so that crashes find logs to replay.
            if st.seq.reproducible() > 2 {
                self.reproduce_inline(&mut st)?;
            }
        }
        Ok(spare)
    }

    /// Whether the queue holds a whole group: `group` logs, or a record's worth of bytes.
    fn group_full(&self, st: &State) -> bool {
        st.queue.len() >= self.config.group
            || st.queued_bytes >= max_record_raw(self.ring.capacity())
    }

    /// The persist thread's wait for a group to fill (§3.3: combination saves in proportion to
    /// the group): async mode only (see [`DurabilityMode::Sync`]), bounded by
    /// `group_delay_us` from the oldest queued log, and not while a caller drains or the
    /// engine stops.
    fn fill_group(&self, st: &mut parking_lot::MutexGuard<'_, State>) {
        if self.config.mode != DurabilityMode::Async || self.config.group_delay_us == 0 {
            return;
        }
        let delay = std::time::Duration::from_micros(self.config.group_delay_us);
        while let Some(since) = st.queued_since {
            if self.group_full(st) || st.stop || st.draining > 0 || st.failed.is_some() {
                return;
            }
            let deadline = since + delay;
            if std::time::Instant::now() >= deadline {
                return;
            }
            self.wake_persist.wait_until(st, deadline);
        }
    }

    /// Waits (sync mode) until `id` is durable. With background threads, a waiting committer
    /// that finds logs queued and no persist step running persists the next group itself (group
    /// commit with a leader): the hand-off to the persist thread and back (two wake-ups, on a
    /// loaded machine tens of µs) was most of a sync commit's latency, so in sync mode the
    /// persist thread only serves drains and stops. A committer whose log missed the running
    /// step spins for up to [`STEP_SPIN`] pauses (a step takes a few µs) for it to end before
    /// it sleeps: with two committers the next leader would otherwise sleep and be woken by a
    /// futex call on every commit.
    pub fn wait_durable(&self, id: u64) -> Result<(), String> {
        let mut st = self.state.lock();
        while !st.seq.is_durable(id, self.durable.load(Ordering::Acquire)) {
            if let Some(why) = &st.failed {
                return Err(why.clone());
            }
            if self.config.background && !st.persisting && !st.queue.is_empty() {
                self.persist_step(&mut st);
                continue;
            }
            if self.config.background && st.persisting {
                let step = self.steps.load(Ordering::Acquire);
                let ended = parking_lot::MutexGuard::unlocked(&mut st, || {
                    (0..STEP_SPIN).any(|_| {
                        std::hint::spin_loop();
                        self.steps.load(Ordering::Acquire) != step
                    })
                });
                // Checked again under the lock: a step that ended between the last spin and
                // the re-lock has already notified, and waiting now would sleep with this
                // committer's log still queued and no one left to persist it (a hang seen once
                // in CI, stop 38: `dudetx_api::concurrent_transfers_...`).
                if ended || self.steps.load(Ordering::Acquire) != step {
                    continue;
                }
            }
            self.became_durable.wait(&mut st);
        }
        Ok(())
    }

    /// Takes the next group off the queue (at most `group` transactions and a quarter of the
    /// ring) into `p`, to be built at the ring tail, which it returns ([`Core::build_group`]):
    /// the tail stays put while the step runs (`persisting` keeps every other step off it).
    fn take_group(&self, st: &mut State, p: &mut Persister) -> u64 {
        let limit = max_record_raw(self.ring.capacity());
        let mut n = 0;
        let mut bytes = 0;
        while n < st.queue.len() && n < self.config.group {
            let len = st.queue[n].log.len();
            if n > 0 && bytes + len > limit {
                break;
            }
            bytes += len;
            n += 1;
        }
        p.group.extend(st.queue.drain(..n));
        st.queued_bytes -= bytes;
        if st.queue.is_empty() {
            st.queued_since = None;
        }
        if p.raw.capacity() == 0 {
            p.raw = st.spare.pop().unwrap_or_default();
        }
        st.tail
    }

    /// Makes the group in `p` into records (§3.3: combined, compressed, checksummed) at their
    /// ring positions from `start` on (ids ≥ 1; the sequencer decides how many records a group
    /// makes); returns their bytes. It needs no state: the persist step runs it outside the
    /// state lock.
    fn build_group(&self, p: &mut Persister, start: u64) -> Result<u64, String> {
        p.records.clear();
        (self.make_records)(p)?;
        let n = p.records.len();
        if p.built.len() < n {
            p.built.resize_with(n, Vec::new);
        }
        let mut pos = start;
        let compresses = self.config.compression.compresses(self.config.mode);
        for (r, rec) in p.records.iter().zip(&mut p.built) {
            let attempt = compresses && p.lz4.attempt();
            build_record_into(rec, &mut p.packed, [r.first, r.last, pos], &r.raw, attempt);
            if attempt {
                p.lz4.outcome(is_compressed(rec));
            }
            pos += rec.len() as u64;
        }
        Ok(pos - start)
    }

    /// Whether the ring has room for `bytes` more.
    fn has_room(&self, st: &State, bytes: u64) -> bool {
        st.tail + bytes - st.head <= self.ring.capacity()
    }

    /// The persist step's PM writes for `records` built from `pos` on (§3.3): each record,
    /// its write-back and fence (each before the next, so that the intact records a crash
    /// leaves are a prefix), then, when the sequencer has one, the durable id and its
    /// write-back and fence.
    fn write_records(&self, mut pos: u64, records: &[Vec<u8>], durable_word: Option<u64>) {
        let pool = &*self.pool;
        let durable_at = self.meta_page + meta::DURABLE;
        let fault = self.fault();
        if let (Some(last), Some(DudetxFault::DurableIdFirst)) = (durable_word, fault) {
            pool.write_u64(durable_at, last);
            pool.persist(durable_at, 8);
        }
        // eADR: the caches are persistent, so a write-back (`clwb` of every record line) would
        // only cost; the fence stays, ordering the record before what follows.
        let write_back = pool.domain().needs_flush();
        for rec in records {
            self.ring.write(pool, pos, rec);
            if fault != Some(DudetxFault::SkipLogFlush) {
                if write_back {
                    self.ring.flush(pool, pos, rec.len() as u64);
                }
                pool.fence();
            }
            pos += rec.len() as u64;
        }
        if let Some(last) = durable_word {
            pool.write_u64(durable_at, last);
            pool.persist(durable_at, 8);
        }
    }

    /// Writes the group built in `p` at the tail (the lock released around the PM writes when
    /// `unlocked`), then publishes it ([`Core::publish_group`]).
    fn write_group(
        &self,
        st: &mut parking_lot::MutexGuard<'_, State>,
        p: &mut Persister,
        unlocked: bool,
    ) -> Result<(), String> {
        let durable_word = if st.seq.durable_word() {
            p.records.last().map(|r| r.last)
        } else {
            None
        };
        if self.fault() == Some(DudetxFault::DurableIdFirst) && durable_word.is_none() {
            // The fault without a durable word: report before the records are written.
            if let Some(id) = st.seq.report_early(&p.records) {
                self.durable.store(id, Ordering::Release);
            }
        }
        let pos = st.tail;
        let built = &p.built[..p.records.len()];
        if unlocked {
            parking_lot::MutexGuard::unlocked(st, || self.write_records(pos, built, durable_word));
        } else {
            self.write_records(pos, built, durable_word);
        }
        self.publish_group(st, p, pos)
    }

    /// The bookkeeping after the group built in `p` is written at `pos`: stats, the tail, the
    /// group's log buffers back to the spare ones, the sequencer's, the durable report.
    fn publish_group(&self, st: &mut State, p: &mut Persister, pos: u64) -> Result<(), String> {
        self.stats[1].fetch_add(p.records.len() as u64, Ordering::Relaxed);
        let mut at = pos;
        for (record, rec) in p.records.drain(..).zip(&p.built) {
            self.stats[3].fetch_add(record.raw.len() as u64, Ordering::Relaxed);
            self.stats[4].fetch_add(rec.len() as u64, Ordering::Relaxed);
            let end = at + rec.len() as u64;
            p.written.push(Written {
                record,
                pos: at,
                end,
            });
            at = end;
        }
        st.tail = at;
        recycle(st, p.group.drain(..).map(|q| q.log));
        let reported = st.seq.persisted(&mut p.written)?;
        if let Some(id) = reported {
            self.durable.store(id, Ordering::Release);
        }
        self.became_durable.notify_all();
        Ok(())
    }

    /// Stops the pipeline with `why` (commits are refused from then on).
    fn fail(&self, st: &mut State, why: String) -> String {
        st.failed = Some(why.clone());
        self.has_failed.store(true, Ordering::Release);
        self.became_durable.notify_all();
        self.wake_persist.notify_all();
        self.wake_reproduce.notify_all();
        why
    }

    /// One persist step in the calling thread.
    fn persist_inline(&self, st: &mut parking_lot::MutexGuard<'_, State>) -> Result<(), String> {
        let mut p = st.persister.take().unwrap_or_default();
        let pos = self.take_group(st, &mut p);
        let result = (|| {
            let bytes = self
                .build_group(&mut p, pos)
                .map_err(|e| self.fail(st, e))?;
            if !self.has_room(st, bytes) {
                self.reproduce_inline(st)?;
                if !self.has_room(st, bytes) {
                    return Err(self.fail(st, ring_full(bytes)));
                }
            }
            self.write_group(st, &mut p, false)
                .map_err(|e| self.fail(st, e))
        })();
        p.clear();
        st.persister = Some(p);
        result
    }

    /// The reproduce step's PM writes (§3.4): apply the records' ops to the heap (durably),
    /// then truncate the log: the sequencer's marks, then the head position. Returns the
    /// records' encoded buffers, for reuse.
    fn reproduce_records(&self, r: Reproduction) -> Result<Vec<Vec<u8>>, String> {
        let pool = &*self.pool;
        let Reproduction {
            ops, marks, head, ..
        } = r;
        let mut marks = Some(marks);
        let mut truncate = || {
            if let Some(m) = marks.take() {
                m(pool);
            }
            if let Some(h) = head {
                pool.write_u64(self.meta_page + meta::HEAD_POS, h);
                pool.persist(self.meta_page + meta::HEAD_POS, 8);
            }
        };
        if self.fault() == Some(DudetxFault::TruncateFirst) {
            truncate();
        }
        let buffers = {
            let mut heap = self.heap.lock();
            let fault = self.fault();
            match ops {
                Batch::Decoded(records) => {
                    for op in records.iter().flatten() {
                        heap.apply(pool, &self.pages, op.borrowed(), fault)?;
                    }
                    Vec::new()
                }
                Batch::Encoded(records) => {
                    // Group prefetching in chunks of `REPRODUCE_CHUNK` ops, in the same apply
                    // order as one op at a time (a prefetch is only a hint, so an op whose key
                    // an earlier op of its chunk inserts or deletes is still applied right).
                    let mut chunk = ReproduceChunk::new();
                    for raw in &records {
                        log::for_each_op(raw, |op| {
                            heap.prefetch_lookup(op);
                            chunk.push(op);
                            if chunk.len() < REPRODUCE_CHUNK {
                                return Ok(());
                            }
                            self.apply_chunk(&mut *heap, &mut chunk, fault)
                        })?;
                    }
                    self.apply_chunk(&mut *heap, &mut chunk, fault)?;
                    drop(chunk);
                    records
                }
            }
        };
        // One fence for the batch's write-backs, before the truncation words (§3.4: a record is
        // recycled only once its effects are durable).
        if self.fault() != Some(DudetxFault::SkipHeapFlush) {
            pool.fence();
        }
        if self.fault() != Some(DudetxFault::TruncateFirst) {
            truncate();
        }
        Ok(buffers)
    }

    /// The last two passes of reproduce over `chunk` (its directory entries were prefetched as
    /// it was decoded): prefetch every op's row, then apply the ops in order; leaves `chunk`
    /// empty.
    fn apply_chunk(
        &self,
        heap: &mut H,
        chunk: &mut ReproduceChunk<'_>,
        fault: Option<DudetxFault>,
    ) -> Result<(), String> {
        for &op in chunk.iter() {
            heap.prefetch(&self.pool, op);
        }
        for op in chunk.drain(..) {
            heap.apply(&self.pool, &self.pages, op, fault)?;
        }
        Ok(())
    }

    /// Reproduces every reproducible record in the calling thread, under the state lock.
    fn reproduce_inline(&self, st: &mut State) -> Result<(), String> {
        let Some(r) = st.seq.take_reproducible(self.meta_page) else {
            return Ok(());
        };
        let (head, last) = (r.head, r.last);
        match self.reproduce_records(r) {
            Ok(buffers) => recycle(st, buffers.into_iter()),
            Err(e) => return Err(self.fail(st, e)),
        }
        self.after_reproduce(st, head, last);
        Ok(())
    }

    /// One reproduce step with background threads, by the reproduce thread or by a persist
    /// step that needs ring room (see [`Core::persist_step`]): every reproducible record,
    /// applied outside the state lock, then the bookkeeping and wake-ups. The caller has
    /// checked that no other reproduce step runs: `reproducing` keeps steps (and so the
    /// truncation marks) one after another. Returns false when there was nothing to reproduce.
    fn reproduce_step(&self, st: &mut parking_lot::MutexGuard<'_, State>) -> bool {
        let Some(r) = st.seq.take_reproducible(self.meta_page) else {
            return false;
        };
        let (head, last) = (r.head, r.last);
        st.reproducing = true;
        let result = parking_lot::MutexGuard::unlocked(st, || self.reproduce_records(r));
        st.reproducing = false;
        match result {
            Ok(buffers) => {
                self.after_reproduce(st, head, last);
                recycle(st, buffers.into_iter());
            }
            Err(e) => {
                self.fail(st, e);
            }
        }
        self.wake_after_reproduce(st);
        true
    }

    fn after_reproduce(&self, st: &mut State, head: Option<u64>, last: u64) {
        if let Some(h) = head {
            st.head = h;
        }
        self.reproduced.store(last, Ordering::Release);
    }

    /// Whether everything queued is persisted and reproduced.
    fn drained(&self, st: &State) -> bool {
        st.queue.is_empty()
            && !st.persisting
            && !st.reproducing
            && st.seq.settled(
                self.committed.load(Ordering::Acquire),
                self.reproduced.load(Ordering::Acquire),
            )
    }

    /// Persists and reproduces everything committed (a clean close, a structure check): inline,
    /// or by waiting for the threads.
    pub fn drain(&self) -> Result<(), String> {
        let mut st = self.state.lock();
        if let Some(why) = &st.failed {
            return Err(why.clone());
        }
        if !self.config.background {
            while !st.queue.is_empty() {
                self.persist_inline(&mut st)?;
            }
            while st.seq.reproducible() > 0 {
                self.reproduce_inline(&mut st)?;
            }
            return Ok(());
        }
        st.draining += 1;
        let result = self.wait_drained(&mut st);
        st.draining -= 1;
        result
    }

    /// [`Core::drain`] with background threads.
    fn wait_drained(&self, st: &mut parking_lot::MutexGuard<'_, State>) -> Result<(), String> {
        loop {
            if let Some(why) = &st.failed {
                return Err(why.clone());
            }
            if self.drained(st) {
                return Ok(());
            }
            if st.running == 0 {
                return Err("the persist and reproduce threads are not running".into());
            }
            self.wake_persist.notify_all();
            self.wake_reproduce.notify_one();
            self.became_durable
                .wait_for(st, std::time::Duration::from_millis(5));
        }
    }

    /// The persist thread (§3.3).
    fn persist_loop(&self) {
        let mut st = self.state.lock();
        loop {
            if st.failed.is_some() || (st.stop && st.queue.is_empty() && !st.persisting) {
                break;
            }
            if st.queue.is_empty() || st.persisting || !self.persist_thread_serves(&st) {
                self.wake_persist.wait(&mut st);
                continue;
            }
            self.fill_group(&mut st);
            // A sync committer may have led a step meanwhile (the wait releases the lock).
            if st.queue.is_empty() || st.persisting {
                continue;
            }
            self.persist_step(&mut st);
        }
        st.running -= 1;
        self.became_durable.notify_all();
        self.wake_reproduce.notify_one();
    }

    /// One persist step with background threads (§3.3), by the persist thread or a leading
    /// sync committer: the next group taken off the queue under the lock; made into records
    /// (combined, compressed, checksummed) outside it; room for them in the ring; the records
    /// (and durable id) written outside the lock; then published under it (the tail, the
    /// sequencer's bookkeeping, the durable report). `persisting` keeps a second step off the
    /// ring tail meanwhile, so records are written one step after another in queue order, each
    /// at the tail its group was taken at: the prefix and gap rules recovery relies on
    /// (§3.4–§3.5) are those of a step run wholly under the lock. A failure is left in
    /// `failed`.
    ///
    /// Ring room: when no reproduce step runs, the step reproduces what is reproducible itself
    /// (a departure: §3.4 reproduces in the background only) rather than wake the reproduce
    /// thread and sleep until it is done. On two cores that hand-off is two context switches
    /// with the committer's log waiting, and the reproduce thread need not be running at all
    /// for a sync commit to become durable.
    fn persist_step(&self, st: &mut parking_lot::MutexGuard<'_, State>) {
        st.persisting = true;
        let mut p = st.persister.take().unwrap_or_default();
        let reproducible = st.seq.reproducible();
        let pos = self.take_group(st, &mut p);
        // When the ring has room for the most the group's records can take, they are written
        // right after they are built, in the same stretch outside the lock: the tail is this
        // step's and the head only moves forward, so the room stays. That saves a round trip
        // through the state lock per step, which the committers contend for. (The
        // durable-report fault of a sequencer without a durable word reports under the lock.)
        let durable_word = st.seq.durable_word();
        let write_at_once = self.has_room(st, group_bound(&p.group))
            && (durable_word || self.fault() != Some(DudetxFault::DurableIdFirst));
        // Committers queue their logs (under this lock) while the group is built: building
        // under it made every commit wait for the combination, LZ4 and CRC of the step before.
        let built = parking_lot::MutexGuard::unlocked(st, || -> Result<u64, String> {
            let bytes = self.build_group(&mut p, pos)?;
            if write_at_once {
                let last = p.records.last().map(|r| r.last);
                let records = &p.built[..p.records.len()];
                self.write_records(pos, records, last.filter(|_| durable_word));
            }
            Ok(bytes)
        });
        let result = built.and_then(|bytes| {
            if write_at_once {
                return self.publish_group(st, &mut p, pos);
            }
            while !self.has_room(st, bytes) && st.failed.is_none() {
                if st.reproducing {
                    st.room_wanted = true;
                    self.wake_persist.wait(st);
                    continue;
                }
                if !self.reproduce_step(st) {
                    // Nothing reproduce could apply frees room: the ring is full of records
                    // that are not reproducible yet.
                    st.room_wanted = false;
                    return Err(ring_full(bytes));
                }
            }
            st.room_wanted = false;
            match &st.failed {
                Some(why) => Err(why.clone()),
                None => self.write_group(st, &mut p, true),
            }
        });
        if let Err(e) = result {
            if st.failed.is_none() {
                self.fail(st, e);
            }
        }
        p.clear();
        st.persister = Some(p);
        st.persisting = false;
        self.steps.fetch_add(1, Ordering::Release);
        // Reproduce is woken by the first record to apply and then by every whole batch (it
        // takes a partial one after `REPRODUCE_IDLE`).
        let now = st.seq.reproducible();
        if (reproducible == 0 && now > 0) || now >= REPRODUCE_BATCH {
            self.wake_reproduce.notify_one();
        }
        // Committers waiting for the next step (`write_group` woke the ones now durable), and
        // the persist thread only when it has work: a drain or a stop (sync mode; in async
        // mode the persist thread runs every step itself). Waking it after every step cost
        // a futex wake-up and a context switch per sync commit (`perf`, 1-thread sync YCSB-A).
        if self.config.mode == DurabilityMode::Sync && (st.draining > 0 || st.stop) {
            self.wake_persist.notify_all();
        }
        self.became_durable.notify_all();
    }

    /// Whether the persist thread takes the queued logs: always in async mode; in sync mode
    /// only for a drain or a stop, since every queued log's committer waits in
    /// [`Core::wait_durable`] and leads the step itself (group commit with a leader).
    fn persist_thread_serves(&self, st: &State) -> bool {
        self.config.mode == DurabilityMode::Async || st.draining > 0 || st.stop
    }

    /// The reproduce thread (§3.4). It applies records in batches of [`REPRODUCE_BATCH`], or
    /// what there is after [`REPRODUCE_IDLE`], or at once when a drain, a stop or a persist
    /// step waiting for ring room needs it: reproduce is off every commit's path, and waking
    /// for each record (a wake-up, a fence and two truncation words per record) took about
    /// as much CPU as the workers on two cores (`perf`, 2-thread sync YCSB-A).
    fn reproduce_loop(&self) {
        let mut st = self.state.lock();
        let mut idle = false;
        loop {
            if st.failed.is_some() {
                break;
            }
            let pending = st.seq.reproducible();
            let urgent = st.stop || st.draining > 0 || st.room_wanted;
            // A persist step that needed ring room may be reproducing (`Core::persist_step`).
            if st.reproducing || (pending > 0 && pending < REPRODUCE_BATCH && !urgent && !idle) {
                idle = self
                    .wake_reproduce
                    .wait_for(&mut st, REPRODUCE_IDLE)
                    .timed_out();
                continue;
            }
            idle = false;
            if !self.reproduce_step(&mut st) {
                // The persist thread has finished: nothing more will come.
                if st.stop && st.running == 1 {
                    break;
                }
                self.wake_reproduce.wait(&mut st);
            }
        }
        st.running -= 1;
        self.wake_persist.notify_all();
        self.became_durable.notify_all();
    }

    /// Wakes, after a reproduce step, only those that wait on one: a persist step waiting
    /// for ring room (the persist thread's or a leading committer's) and drains. In sync mode
    /// the persist thread sleeps on `wake_persist` between drains, so waking it after every
    /// batch cost a context switch for nothing, and a sync committer sleeping in
    /// [`Core::wait_durable`] waits for a persist step, not for reproduce. (A failure wakes
    /// everyone in `fail`.)
    fn wake_after_reproduce(&self, st: &State) {
        if st.room_wanted {
            self.wake_persist.notify_all();
        }
        if st.draining > 0 {
            self.became_durable.notify_all();
        }
    }

    /// Starts the persist and reproduce threads.
    pub fn start(self: &Arc<Self>) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
        let mut handles = Vec::new();
        self.state.lock().running = 2;
        for (name, reproduce) in [("dudetx-persist", false), ("dudetx-reproduce", true)] {
            let core = self.clone();
            let spawned = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    if reproduce {
                        core.reproduce_loop()
                    } else {
                        core.persist_loop()
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The thread that did not start never counts itself out.
                    self.state.lock().running = handles.len();
                    self.stop();
                    return Err(format!("cannot start the {name} thread: {e}"));
                }
            }
        }
        Ok(handles)
    }

    /// Asks the threads to finish once everything queued is persisted and reproduced.
    pub fn stop(&self) {
        let mut st = self.state.lock();
        st.stop = true;
        self.wake_persist.notify_all();
        self.wake_reproduce.notify_all();
    }
}

/// Why a group of `bytes` cannot be persisted: the ring is full of records that are not
/// reproducible yet (lock mode: they wait on transactions not persisted).
fn ring_full(bytes: u64) -> String {
    format!(
        "the DUDETx log ring has no room for {bytes} more bytes of records, and the records in \
         it are not reproducible yet: format the pool with a larger log"
    )
}

/// For tests: the state a persist step leaves when it unwinds (a simulated crash) before it
/// puts its buffers back.
#[cfg(test)]
impl<H: Apply> Core<H> {
    pub(super) fn lose_persist_buffers(&self) {
        self.state.lock().persister = None;
    }

    pub(super) fn has_persist_buffers(&self) -> bool {
        self.state.lock().persister.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attempts a backoff makes over `records` records whose attempts all miss.
    fn attempts_over(backoff: &mut Lz4Backoff, records: usize) -> Vec<usize> {
        (0..records)
            .filter(|_| {
                let attempt = backoff.attempt();
                if attempt {
                    backoff.outcome(false);
                }
                attempt
            })
            .collect()
    }

    #[test]
    fn lz4_attempts_back_off_while_they_save_nothing_and_resume_when_one_does() {
        let mut backoff = Lz4Backoff::default();
        // Each miss in a row doubles the gap (1 record skipped, then 3, 7, ... 63): attempts
        // at records 0, 2, 6, 14, 30, 62, 126, then every 64th.
        assert_eq!(
            attempts_over(&mut backoff, 200),
            vec![0, 2, 6, 14, 30, 62, 126, 190]
        );
        // A record that shrank makes the next one an attempt again.
        while !backoff.attempt() {}
        backoff.outcome(true);
        assert!(backoff.attempt());
    }
}
