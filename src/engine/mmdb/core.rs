//! MMDB's persistent side: group commit of the redo log (Zen §4: a transaction's log records
//! combined and written at commit with sequential writes, write-backs and one fence) and the
//! periodic checkpoint with the log truncation that follows it.

use super::layout::{checkpoint_tag, desc, kind, meta};
use super::{MmdbConfig, MmdbFault};
use crate::alloc::{PageManager, PageTag, PAGE_SIZE};
use crate::catalog::TableId;
use crate::engine::dudetx::log as ops;
use crate::engine::falcon::FalconEngine;
use crate::engine::wal::{build_record, LogRing};
use crate::pmem::Pool;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Appends one transaction's frame to a record payload: id, length, encoded ops.
pub(crate) fn frame(out: &mut Vec<u8>, id: u64, log: &[u8]) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(log.len() as u32).to_le_bytes());
    out.extend_from_slice(log);
}

/// A record payload split up: its epoch and its transactions' (id, encoded ops).
pub(crate) type Unframed<'a> = (u64, Vec<(u64, &'a [u8])>);

/// Splits a record payload into its epoch and its transactions' (id, encoded ops).
pub(crate) fn unframe(payload: &[u8]) -> Result<Unframed<'_>, String> {
    if payload.len() < 8 {
        return Err("a log record's payload has no epoch".into());
    }
    let epoch = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    let mut rest = &payload[8..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        if rest.len() < 12 {
            return Err("a transaction frame is cut short".into());
        }
        let id = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes")) as usize;
        if rest.len() < 12 + len {
            return Err(format!(
                "transaction {id}'s redo of {len} bytes is cut short"
            ));
        }
        out.push((id, &rest[12..12 + len]));
        rest = &rest[12 + len..];
    }
    Ok((epoch, out))
}

/// The pipeline's shared state (under [`Core::state`]).
#[derive(Default)]
pub(crate) struct State {
    /// Committed, not yet logged: (id, encoded redo), in id order.
    queue: VecDeque<(u64, Vec<u8>)>,
    /// The next log position to write.
    pub tail: u64,
    /// The truncation position: the log before it may be overwritten.
    pub head: u64,
    /// A record is being written (`tail` is not yet past it).
    writing: bool,
    /// The log writer waits for ring space: a checkpoint is due now.
    checkpoint_wanted: bool,
    /// Why the engine stopped taking commits (a full PM, a failed checkpoint).
    pub failed: Option<String>,
    /// Drop asked the threads to finish.
    stop: bool,
}

/// The valid checkpoint.
#[derive(Default)]
pub(crate) struct Checkpointed {
    /// Its generation (0: none).
    pub generation: u64,
    /// Its pages (page indexes).
    pub pages: Vec<u64>,
    /// The id it covers.
    pub covered: u64,
}

/// What one checkpoint wrote.
pub(crate) struct CheckpointDone {
    pub generation: u64,
    pub covered: u64,
    pub rows: u64,
    pub pages: u64,
    pub ms: f64,
}

/// Counters of the log and the checkpoints.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct MmdbStats {
    /// Transactions logged.
    pub txns: u64,
    /// Log records written (groups: each one write-back run and one fence).
    pub records: u64,
    /// Bytes written to the log ring.
    pub log_bytes: u64,
    /// Checkpoints taken.
    pub checkpoints: u64,
    /// The valid checkpoint's generation.
    pub generation: u64,
}

/// The engine's shared state: the DRAM tables, the log, the checkpoints.
pub(crate) struct Core {
    pub pool: Arc<Pool>,
    pub pages: PageManager,
    pub meta_page: u64,
    pub ring: LogRing,
    pub config: MmdbConfig,
    /// The DRAM tables and indexes (the `volatile` engine).
    pub shadow: Arc<FalconEngine>,
    /// Orders ids with shadow commits, and holds them off while a checkpoint copies the tables.
    pub commit_lock: Mutex<()>,
    pub state: Mutex<State>,
    pub checkpointed: Mutex<Checkpointed>,
    /// One checkpoint at a time.
    pub checkpoint_lock: Mutex<()>,
    wake_writer: Condvar,
    wake_checkpointer: Condvar,
    became_durable: Condvar,
    /// The largest id whose record is durable.
    pub durable: AtomicU64,
    /// The last id assigned to a commit.
    pub committed: AtomicU64,
    /// This open's epoch, stamped in its records.
    epoch: u64,
    stats: [AtomicU64; 4],
}

impl Core {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pool: Arc<Pool>,
        pages: PageManager,
        meta_page: u64,
        ring: LogRing,
        config: MmdbConfig,
        shadow: Arc<FalconEngine>,
        checkpointed: Checkpointed,
        durable: u64,
        tail: u64,
        epoch: u64,
    ) -> Core {
        Core {
            pool,
            pages,
            meta_page,
            ring,
            config,
            shadow,
            commit_lock: Mutex::new(()),
            state: Mutex::new(State {
                tail,
                head: tail,
                ..State::default()
            }),
            checkpointed: Mutex::new(checkpointed),
            checkpoint_lock: Mutex::new(()),
            wake_writer: Condvar::new(),
            wake_checkpointer: Condvar::new(),
            became_durable: Condvar::new(),
            durable: AtomicU64::new(durable),
            committed: AtomicU64::new(durable),
            epoch,
            stats: Default::default(),
        }
    }

    fn fault(&self) -> Option<MmdbFault> {
        self.config.fault
    }

    /// The counters.
    pub fn stats(&self) -> MmdbStats {
        let s = |i: usize| self.stats[i].load(Ordering::Relaxed);
        MmdbStats {
            txns: s(0),
            records: s(1),
            log_bytes: s(2),
            checkpoints: s(3),
            generation: self.checkpointed.lock().generation,
        }
    }

    /// The largest record payload: a quarter of the ring, so that a record always fits once the
    /// log before the next checkpoint's position is truncated.
    pub fn max_payload(&self) -> usize {
        (self.ring.capacity() / 4) as usize
    }

    /// Queues a committed transaction's redo (called under the commit lock: ids enter in order).
    pub fn enqueue(&self, id: u64, log: Vec<u8>) {
        let mut st = self.state.lock();
        st.queue.push_back((id, log));
        if self.config.background {
            self.wake_writer.notify_one();
        }
    }

    /// Waits until `id` is durable (group commit: the log writer's next record carries it).
    pub fn wait_durable(&self, id: u64) -> Result<(), String> {
        let mut st = self.state.lock();
        while self.durable.load(Ordering::Acquire) < id {
            if let Some(why) = &st.failed {
                return Err(why.clone());
            }
            self.became_durable.wait(&mut st);
        }
        Ok(())
    }

    /// Takes the next group off the queue: up to `group` transactions and a quarter of the ring;
    /// returns (first id, last id, payload).
    fn next_group(&self, st: &mut State, keep: usize) -> Option<(u64, u64, Vec<u8>)> {
        let limit = self.max_payload();
        let mut payload = self.epoch.to_le_bytes().to_vec();
        let (mut first, mut last) = (0, 0);
        let mut n = 0;
        while st.queue.len() > keep && n < self.config.group {
            let len = st.queue[0].1.len() + 12;
            if n > 0 && payload.len() + len > limit {
                break;
            }
            let (id, log) = st.queue.pop_front().expect("non-empty");
            frame(&mut payload, id, &log);
            if n == 0 {
                first = id;
            }
            last = id;
            n += 1;
        }
        self.stats[0].fetch_add(n as u64, Ordering::Relaxed);
        (n > 0).then_some((first, last, payload))
    }

    /// Writes a record at `pos` and makes it durable: the record's write-back and one fence
    /// (ADR; under eADR the stores are durable as they retire and the write-back is a no-op).
    fn write_record(&self, pos: u64, rec: &[u8]) {
        let pool = &*self.pool;
        self.ring.write(pool, pos, rec);
        if self.fault() != Some(MmdbFault::SkipLogFlush) {
            self.ring.flush(pool, pos, rec.len() as u64);
            pool.fence();
        }
    }

    /// Bookkeeping after a record is durable: the tail passes it, its commits are acknowledged.
    fn logged(&self, st: &mut State, last: u64, len: u64) {
        st.tail += len;
        self.stats[1].fetch_add(1, Ordering::Relaxed);
        self.stats[2].fetch_add(len, Ordering::Relaxed);
        self.durable.store(last, Ordering::Release);
        self.became_durable.notify_all();
    }

    fn fits(&self, st: &State, len: u64) -> bool {
        st.tail + len - st.head <= self.ring.capacity()
    }

    /// Logs the queue in the calling thread (inline mode, for the crash simulator): a group at a
    /// time; a full ring takes a checkpoint first. Under [`MmdbFault::AckBeforeLog`] the newest
    /// transaction is left for the next commit, though its commit returns now.
    pub fn log_inline(&self) -> Result<(), String> {
        let keep = usize::from(self.fault() == Some(MmdbFault::AckBeforeLog));
        loop {
            let mut st = self.state.lock();
            if let Some(why) = &st.failed {
                return Err(why.clone());
            }
            let Some(peek) = st.queue.front().map(|q| q.0) else {
                return Ok(());
            };
            if st.queue.len() <= keep {
                // The fault: acknowledged without its record.
                self.durable.fetch_max(peek, Ordering::AcqRel);
                return Ok(());
            }
            let Some((first, last, payload)) = self.next_group(&mut st, keep) else {
                return Ok(());
            };
            let rec = build_record(first, last, st.tail, &payload, false);
            if !self.fits(&st, rec.len() as u64) {
                // Put the group back in order and make room.
                let (_, txns) = unframe(&payload)?;
                for (id, log) in txns.into_iter().rev() {
                    st.queue.push_front((id, log.to_vec()));
                }
                drop(st);
                self.checkpoint()?;
                if !self.fits(&self.state.lock(), rec.len() as u64) {
                    return Err("the MMDB log ring is full even after a checkpoint".into());
                }
                continue;
            }
            let pos = st.tail;
            self.write_record(pos, &rec);
            self.logged(&mut st, last, rec.len() as u64);
        }
    }

    /// The log writer (group commit): waits for commits, lets a group gather for up to
    /// `group_wait`, writes it as one record with one fence, and acknowledges its commits.
    fn writer_loop(&self) {
        let mut st = self.state.lock();
        loop {
            if st.failed.is_some() || (st.stop && st.queue.is_empty()) {
                break;
            }
            if st.queue.is_empty() {
                self.wake_writer.wait(&mut st);
                continue;
            }
            if st.queue.len() < self.config.group && !self.config.group_wait.is_zero() && !st.stop {
                // The leader waits a little for followers to join its group.
                self.wake_writer.wait_for(&mut st, self.config.group_wait);
            }
            let Some((first, last, payload)) = self.next_group(&mut st, 0) else {
                continue;
            };
            let rec = build_record(first, last, st.tail, &payload, false);
            while !self.fits(&st, rec.len() as u64) && st.failed.is_none() {
                st.checkpoint_wanted = true;
                self.wake_checkpointer.notify_one();
                self.wake_writer
                    .wait_for(&mut st, Duration::from_millis(50));
            }
            if st.failed.is_some() {
                break;
            }
            let pos = st.tail;
            st.writing = true;
            if self.fault() == Some(MmdbFault::AckBeforeLog) {
                self.durable.store(last, Ordering::Release);
                self.became_durable.notify_all();
            }
            parking_lot::MutexGuard::unlocked(&mut st, || self.write_record(pos, &rec));
            st.writing = false;
            self.logged(&mut st, last, rec.len() as u64);
            if (st.tail - st.head) * 2 > self.ring.capacity() {
                // Half the ring in use: checkpoint before commits have to wait for room.
                st.checkpoint_wanted = true;
                self.wake_checkpointer.notify_one();
            }
        }
        self.became_durable.notify_all();
    }

    /// The checkpointer: a checkpoint every `checkpoint_interval` (when anything committed since
    /// the last), or at once when the log needs room.
    fn checkpointer_loop(&self) {
        let interval = self.config.checkpoint_interval;
        let mut last = Instant::now();
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.stop || st.failed.is_some() {
                        return;
                    }
                    if st.checkpoint_wanted || (!interval.is_zero() && last.elapsed() >= interval) {
                        break;
                    }
                    let wait = if interval.is_zero() {
                        Duration::from_millis(100)
                    } else {
                        interval.saturating_sub(last.elapsed())
                    };
                    self.wake_checkpointer.wait_for(&mut st, wait);
                }
                st.checkpoint_wanted = false;
            }
            last = Instant::now();
            let changed = self.committed.load(Ordering::Acquire) > self.checkpointed.lock().covered;
            if changed {
                if let Err(e) = self.checkpoint() {
                    let mut st = self.state.lock();
                    st.failed = Some(e);
                    self.became_durable.notify_all();
                    self.wake_writer.notify_all();
                    return;
                }
            }
        }
    }

    /// Takes a checkpoint: a consistent snapshot of every table at a commit boundary, written to
    /// fresh PM pages, made valid by one 8-byte store; then the log before its position is
    /// truncated and the previous checkpoint's pages are freed.
    ///
    /// Why it is crash-safe: the snapshot is the state after transaction `covered` exactly (the
    /// commit lock holds commits off while it is copied), and `pos` is a record boundary where
    /// every earlier record holds only ids up to `durable ≤ covered`; so the log from `pos` holds
    /// every transaction after `covered`, in id order, and recovery replays those (skipping ids
    /// up to `covered`). Until CURRENT names the new generation, recovery uses the previous one,
    /// whose pages and log are untouched: its pages are freed, and the log before `pos` may be
    /// overwritten, only after CURRENT is durable.
    pub fn checkpoint(&self) -> Result<CheckpointDone, String> {
        let _one = self.checkpoint_lock.lock();
        let started = Instant::now();
        let (covered, pos, snapshot, rows) = {
            let _order = self.commit_lock.lock();
            let pos = {
                let mut st = self.state.lock();
                while st.writing {
                    self.became_durable
                        .wait_for(&mut st, Duration::from_millis(10));
                }
                st.tail
            };
            let covered = self.committed.load(Ordering::Acquire);
            let mut snapshot = Vec::new();
            let mut rows = 0u64;
            let tables = self.shadow_tables();
            for table in 0..tables {
                self.shadow.for_each_committed_row(table, |key, row| {
                    ops::encode_op(&mut snapshot, table, key, Some(row));
                    rows += 1;
                });
            }
            (covered, pos, snapshot, rows)
        };
        let pool = &*self.pool;
        let (old, generation) = {
            let c = self.checkpointed.lock();
            (c.pages.clone(), c.generation + 1)
        };
        let fault = self.fault();
        if fault == Some(MmdbFault::TruncateBeforeValid) {
            self.truncate(pos, &old);
        }
        let page_count = (snapshot.len() as u64).div_ceil(PAGE_SIZE);
        if page_count >= 1 << 16 {
            return Err(format!(
                "an MMDB checkpoint of {} bytes exceeds 65535 pages of 2 MiB",
                snapshot.len()
            ));
        }
        let descriptor = self.meta_page + meta::descriptor(generation);
        let write_valid = || {
            pool.write_u64(descriptor + desc::GENERATION, generation);
            pool.write_u64(descriptor + desc::COVERED, covered);
            pool.write_u64(descriptor + desc::LOG_POS, pos);
            pool.write_u64(descriptor + desc::BYTES, snapshot.len() as u64);
            pool.write_u64(descriptor + desc::PAGES, page_count);
            pool.write_u64(
                descriptor + desc::DATA_CRC,
                u64::from(crc32fast::hash(&snapshot)),
            );
            let mut d = vec![0u8; desc::CRC as usize];
            pool.read_bytes(descriptor, &mut d);
            pool.write_u64(descriptor + desc::CRC, u64::from(crc32fast::hash(&d)));
            pool.persist(descriptor, desc::LEN);
            // The one 8-byte store that makes the checkpoint valid.
            pool.write_u64(self.meta_page + meta::CURRENT, generation);
            pool.persist(self.meta_page + meta::CURRENT, 8);
        };
        if fault == Some(MmdbFault::ValidBeforePages) {
            write_valid();
        }
        let mut new_pages = Vec::with_capacity(page_count as usize);
        for n in 0..page_count {
            let index = self
                .pages
                .allocate(
                    pool,
                    PageTag {
                        kind: kind::CHECKPOINT,
                        owner: 0,
                        value: checkpoint_tag(generation, n),
                    },
                )
                .map_err(|e| {
                    // Give back what this checkpoint took: the previous one stays valid.
                    for &p in &new_pages {
                        self.pages.free(pool, p);
                    }
                    format!(
                        "no PM for checkpoint {generation} ({} bytes): {e}",
                        snapshot.len()
                    )
                })?;
            new_pages.push(index);
            let from = (n * PAGE_SIZE) as usize;
            let to = (from + PAGE_SIZE as usize).min(snapshot.len());
            let at = self.pages.page_offset(index);
            pool.write_bytes(at, &snapshot[from..to]);
            if fault != Some(MmdbFault::SkipCheckpointFlush) {
                pool.flush(at, (to - from) as u64);
            }
        }
        pool.fence();
        if fault != Some(MmdbFault::ValidBeforePages) {
            write_valid();
        }
        if fault != Some(MmdbFault::TruncateBeforeValid) {
            self.truncate(pos, &old);
        }
        *self.checkpointed.lock() = Checkpointed {
            generation,
            pages: new_pages,
            covered,
        };
        self.stats[3].fetch_add(1, Ordering::Relaxed);
        Ok(CheckpointDone {
            generation,
            covered,
            rows,
            pages: page_count,
            ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// The truncation after a checkpoint at `pos`: the log before it may be reused, and the
    /// previous checkpoint's pages are freed.
    fn truncate(&self, pos: u64, old: &[u64]) {
        for &p in old {
            self.pages.free(&self.pool, p);
        }
        let mut st = self.state.lock();
        st.head = st.head.max(pos);
        self.wake_writer.notify_all();
    }

    /// Tables in the shadow.
    fn shadow_tables(&self) -> TableId {
        use crate::engine::Engine;
        self.shadow.catalog().tables.len() as TableId
    }

    /// Starts the log writer and the checkpointer.
    pub fn start(self: &Arc<Self>) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
        let mut handles = Vec::new();
        for (name, checkpointer) in [("mmdb-log-writer", false), ("mmdb-checkpointer", true)] {
            let core = self.clone();
            let spawned = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    if checkpointer {
                        core.checkpointer_loop()
                    } else {
                        core.writer_loop()
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    self.stop();
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(format!("cannot start the {name} thread: {e}"));
                }
            }
        }
        Ok(handles)
    }

    /// Asks the threads to finish once the queue is logged.
    pub fn stop(&self) {
        let mut st = self.state.lock();
        st.stop = true;
        self.wake_writer.notify_all();
        self.wake_checkpointer.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_cut_ones_are_refused() {
        let mut p = 7u64.to_le_bytes().to_vec();
        frame(&mut p, 3, b"abc");
        frame(&mut p, 4, b"");
        let (epoch, txns) = unframe(&p).unwrap();
        assert_eq!(epoch, 7);
        assert_eq!(txns, vec![(3, &b"abc"[..]), (4, &b""[..])]);
        assert!(unframe(&p[..p.len() - 1]).is_err());
        assert!(unframe(&p[..4]).is_err());
    }
}
