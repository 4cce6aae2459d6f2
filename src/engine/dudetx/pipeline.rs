//! The decoupled back end (§3.1–§3.2): committed transactions' redo logs wait in a queue in
//! commit (id) order; the *persist* step combines a group of them (§3.3), writes one record to
//! the PM log ring, makes it durable and then advances the durable id; the *reproduce* step
//! applies persisted records to the PM heap in id order, makes that durable, and truncates the
//! log. The steps run in two background threads, or (`background: false`, for the crash
//! simulator, whose PM events must come from the threads it drives) inline in the committing
//! thread.

use super::heap::Heap;
use super::layout::meta;
use super::log::{self, Op};
use super::{DudetxConfig, DudetxFault, DurabilityMode};
use crate::alloc::PageManager;
use crate::engine::wal::{build_record, LogRing};
use crate::pmem::Pool;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A record persisted but not yet reproduced.
struct Persisted {
    last: u64,
    /// The log position after it.
    end: u64,
    ops: Vec<Op>,
}

/// The pipeline's shared state (under [`Core::state`]).
#[derive(Default)]
pub(crate) struct State {
    /// Committed, not yet persisted: (id, encoded redo log), in id order.
    queue: VecDeque<(u64, Vec<u8>)>,
    /// The bytes of the logs in `queue`.
    queued_bytes: usize,
    /// When the oldest log in `queue` was queued (the group-fill wait is bounded from it).
    queued_since: Option<std::time::Instant>,
    /// Callers waiting in [`Core::drain`]: the persist thread does not wait for a group to fill
    /// while one does.
    draining: usize,
    /// The next log position to write.
    pub tail: u64,
    /// The truncation position.
    pub head: u64,
    /// Persisted, not yet reproduced, in id order.
    persisted: VecDeque<Persisted>,
    /// Why the pipeline stopped (a full PM heap); commits are refused then.
    pub failed: Option<String>,
    /// Drop asked the threads to finish.
    stop: bool,
    /// A persist step is writing a record (by the persist thread or a sync committer leading
    /// one, [`Core::wait_durable`]): the ring tail is taken.
    persisting: bool,
    /// Threads still running.
    running: usize,
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
        op: &Op,
        fault: Option<DudetxFault>,
    ) -> Result<(), String>;
}

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
    wake_persist: Condvar,
    wake_reproduce: Condvar,
    became_durable: Condvar,
    /// The durable id (§3.2), as persisted.
    pub durable: AtomicU64,
    /// The last id assigned to a commit.
    pub committed: AtomicU64,
    /// The last id reproduced and truncated.
    pub reproduced: AtomicU64,
    stats: [AtomicU64; 5],
}

/// The largest combined log a record may carry: a quarter of the ring, so that a record always
/// fits once the records before it are truncated.
pub(crate) fn max_record_raw(ring_capacity: u64) -> usize {
    (ring_capacity / 4) as usize
}

impl<H: Apply> Core<H> {
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
    ) -> Core<H> {
        Core {
            pool,
            pages,
            meta_page,
            ring,
            config,
            state: Mutex::new(State {
                tail,
                head: tail,
                ..State::default()
            }),
            heap: Mutex::new(heap),
            wake_persist: Condvar::new(),
            wake_reproduce: Condvar::new(),
            became_durable: Condvar::new(),
            durable: AtomicU64::new(durable),
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

    /// Hands a committed transaction's redo log to the pipeline (called under the commit lock,
    /// so ids enter the queue in order); inline mode persists and reproduces here.
    pub fn enqueue(&self, id: u64, log: Vec<u8>) -> Result<(), String> {
        let mut st = self.state.lock();
        self.stats[0].fetch_add(1, Ordering::Relaxed);
        self.stats[2].fetch_add(log.len() as u64, Ordering::Relaxed);
        st.queued_bytes += log.len();
        st.queue.push_back((id, log));
        if st.queued_since.is_none() {
            st.queued_since = Some(std::time::Instant::now());
        }
        if self.config.background {
            // The persist thread waits for the first log, and (filling a group) for a full one.
            if st.queue.len() == 1 || self.group_full(&st) {
                self.wake_persist.notify_all();
            }
            return Ok(());
        }
        let due = self.config.mode == DurabilityMode::Sync || st.queue.len() >= self.config.group;
        if due {
            while !st.queue.is_empty() {
                self.persist_inline(&mut st)?;
            }
            // Leave a couple of records un-reproduced, so that crashes find logs to replay.
            if st.persisted.len() > 2 {
                self.reproduce_inline(&mut st)?;
            }
        }
        Ok(())
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
    /// loaded machine tens of µs) was most of a sync commit's latency; the persist thread
    /// still takes what arrives while no committer waits.
    pub fn wait_durable(&self, id: u64) -> Result<(), String> {
        let mut st = self.state.lock();
        while self.durable.load(Ordering::Acquire) < id {
            if let Some(why) = &st.failed {
                return Err(why.clone());
            }
            if self.config.background && !st.persisting && !st.queue.is_empty() {
                self.persist_step(&mut st);
                continue;
            }
            self.became_durable.wait(&mut st);
        }
        Ok(())
    }

    /// Takes the next group off the queue: at most `group` transactions and a quarter of the
    /// ring; returns (first id, last id, combined log).
    fn next_group(&self, st: &mut State) -> Result<(u64, u64, Vec<u8>), String> {
        let limit = max_record_raw(self.ring.capacity());
        let mut n = 0;
        let mut bytes = 0;
        while n < st.queue.len() && n < self.config.group {
            let len = st.queue[n].1.len();
            if n > 0 && bytes + len > limit {
                break;
            }
            bytes += len;
            n += 1;
        }
        let batch: Vec<(u64, Vec<u8>)> = st.queue.drain(..n).collect();
        st.queued_bytes -= bytes;
        if st.queue.is_empty() {
            st.queued_since = None;
        }
        let slices: Vec<&[u8]> = batch.iter().map(|(_, l)| l.as_slice()).collect();
        let raw = log::combine(&slices)?;
        Ok((batch[0].0, batch[batch.len() - 1].0, raw))
    }

    /// The persist step's PM writes for a record at `pos` (§3.2): the record, its write-back and
    /// fence, then the durable id and its write-back and fence.
    fn write_record(&self, pos: u64, rec: &[u8], last: u64) {
        let pool = &*self.pool;
        let durable_at = self.meta_page + meta::DURABLE;
        if self.fault() == Some(DudetxFault::DurableIdFirst) {
            pool.write_u64(durable_at, last);
            pool.persist(durable_at, 8);
        }
        self.ring.write(pool, pos, rec);
        if self.fault() != Some(DudetxFault::SkipLogFlush) {
            self.ring.flush(pool, pos, rec.len() as u64);
            pool.fence();
        }
        pool.write_u64(durable_at, last);
        pool.persist(durable_at, 8);
    }

    /// Bookkeeping after a record is durable.
    fn persisted(&self, st: &mut State, first: u64, last: u64, raw: Vec<u8>, rec_len: u64) {
        let _ = first;
        self.stats[1].fetch_add(1, Ordering::Relaxed);
        self.stats[3].fetch_add(raw.len() as u64, Ordering::Relaxed);
        self.stats[4].fetch_add(rec_len, Ordering::Relaxed);
        st.tail += rec_len;
        let ops = log::decode_ops(&raw).expect("a combined log decodes");
        st.persisted.push_back(Persisted {
            last,
            end: st.tail,
            ops,
        });
        self.durable.store(last, Ordering::Release);
        self.became_durable.notify_all();
    }

    /// One persist step in the calling thread.
    fn persist_inline(&self, st: &mut State) -> Result<(), String> {
        let (first, last, raw) = self.next_group(st)?;
        let rec = build_record(first, last, st.tail, &raw, true);
        if st.tail + rec.len() as u64 - st.head > self.ring.capacity() {
            self.reproduce_inline(st)?;
        }
        self.write_record(st.tail, &rec, last);
        self.persisted(st, first, last, raw, rec.len() as u64);
        Ok(())
    }

    /// The reproduce step's PM writes (§3.1): apply the records' ops to the heap (durably), then
    /// truncate the log up to `end`: the last reproduced id, then the head position.
    fn reproduce_records(&self, records: &[Persisted]) -> Result<(), String> {
        let Some(last) = records.last() else {
            return Ok(());
        };
        let pool = &*self.pool;
        let truncate = || {
            pool.write_u64(self.meta_page + meta::HEAD_SEQ, last.last);
            pool.persist(self.meta_page + meta::HEAD_SEQ, 8);
            pool.write_u64(self.meta_page + meta::HEAD_POS, last.end);
            pool.persist(self.meta_page + meta::HEAD_POS, 8);
        };
        if self.fault() == Some(DudetxFault::TruncateFirst) {
            truncate();
        }
        {
            let mut heap = self.heap.lock();
            for r in records {
                for op in &r.ops {
                    heap.apply(pool, &self.pages, op, self.fault())?;
                }
            }
        }
        // One fence for the batch's write-backs, before the truncation words (§3.1: a record is
        // recycled only once its effects are durable).
        if self.fault() != Some(DudetxFault::SkipHeapFlush) {
            pool.fence();
        }
        if self.fault() != Some(DudetxFault::TruncateFirst) {
            truncate();
        }
        Ok(())
    }

    /// Reproduces every persisted record in the calling thread.
    fn reproduce_inline(&self, st: &mut State) -> Result<(), String> {
        let records: Vec<Persisted> = st.persisted.drain(..).collect();
        if let Err(e) = self.reproduce_records(&records) {
            st.failed = Some(e.clone());
            return Err(e);
        }
        self.after_reproduce(st, &records);
        Ok(())
    }

    fn after_reproduce(&self, st: &mut State, records: &[Persisted]) {
        if let Some(last) = records.last() {
            st.head = last.end;
            self.reproduced.store(last.last, Ordering::Release);
        }
    }

    /// Persists and reproduces everything committed (a clean close, a structure check): inline,
    /// or by waiting for the threads.
    pub fn drain(&self) -> Result<(), String> {
        let mut st = self.state.lock();
        if !self.config.background {
            while !st.queue.is_empty() {
                self.persist_inline(&mut st)?;
            }
            return self.reproduce_inline(&mut st);
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
            let target = self.committed.load(Ordering::Acquire);
            if self.reproduced.load(Ordering::Acquire) >= target && st.queue.is_empty() {
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

    /// The persist thread (§3.2).
    fn persist_loop(&self) {
        let mut st = self.state.lock();
        loop {
            if st.failed.is_some() || (st.stop && st.queue.is_empty() && !st.persisting) {
                break;
            }
            if st.queue.is_empty() || st.persisting {
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

    /// One persist step with background threads (§3.2), by the persist thread or a leading
    /// sync committer: the next group combined into a record, room for it in the ring (waiting
    /// for reproduce), the record and durable id written outside the lock; `persisting` keeps
    /// a second step off the ring tail meanwhile. A failure is left in `failed`.
    fn persist_step(&self, st: &mut parking_lot::MutexGuard<'_, State>) {
        st.persisting = true;
        let (first, last, raw) = match self.next_group(st) {
            Ok(g) => g,
            Err(e) => {
                st.failed = Some(e);
                st.persisting = false;
                self.became_durable.notify_all();
                return;
            }
        };
        let rec = build_record(first, last, st.tail, &raw, true);
        while st.tail + rec.len() as u64 - st.head > self.ring.capacity() && st.failed.is_none() {
            self.wake_reproduce.notify_one();
            self.wake_persist.wait(st);
        }
        if st.failed.is_none() {
            let pos = st.tail;
            parking_lot::MutexGuard::unlocked(st, || self.write_record(pos, &rec, last));
            self.persisted(st, first, last, raw, rec.len() as u64);
        }
        st.persisting = false;
        self.wake_reproduce.notify_one();
        // The persist thread, if it waits for the tail, and committers waiting for the next
        // step (`persisted` woke the ones now durable).
        self.wake_persist.notify_all();
        self.became_durable.notify_all();
    }

    /// The reproduce thread (§3.1).
    fn reproduce_loop(&self) {
        let mut st = self.state.lock();
        loop {
            if st.failed.is_some() {
                break;
            }
            if st.persisted.is_empty() {
                // The persist thread has finished: nothing more will come.
                if st.stop && st.running == 1 {
                    break;
                }
                self.wake_reproduce.wait(&mut st);
                continue;
            }
            let records: Vec<Persisted> = st.persisted.drain(..).collect();
            let result =
                parking_lot::MutexGuard::unlocked(&mut st, || self.reproduce_records(&records));
            match result {
                Ok(()) => self.after_reproduce(&mut st, &records),
                Err(e) => st.failed = Some(e),
            }
            // Both the persist thread and a leading committer may wait for ring room.
            self.wake_persist.notify_all();
            self.became_durable.notify_all();
        }
        st.running -= 1;
        self.wake_persist.notify_all();
        self.became_durable.notify_all();
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
