//! The lock-based perform mode (§5): transactions perform under strict two-phase locks on the
//! shadow's word stripes; the dependency graph comes from lock hand-offs (§5.2: releasing a
//! lock leaves the releasing transaction's id on it, the next holder depends on that id) and
//! from program order (a chain's transactions follow each other); logs are persisted chain by
//! chain, in no global order (§3.3, §5); reproduce and recovery apply exactly the
//! *reproducible* transactions (§5.3: persistent, and everything they depend on reproducible),
//! in a dependency-respecting order, found by one-round or two-round detecting.
//!
//! A transaction's id is `seq << 8 | chain`: the chain is the worker's slot (the paper's
//! thread), `seq` counts that chain's commits. There is no global order, so the durable state
//! is a watermark per chain: every transaction of the chain up to it is reproducible (§5.3),
//! hence durable.
//!
//! ```text
//! a record (wal::build_record, first = last = the id): ops (log.rs) whose first op is the
//!   dependency list (space DEPS, key: count, row: the ids it depends on, u64 LE each)
//! meta page: 1 MiB + 256 WM_SEL: which watermark slot is current (its low bit)
//!            1 MiB + 4096 + s * 2048: watermark slot s: the last reproduced seq of each chain
//! ```
//!
//! The reproduced watermarks are double-buffered: a crash while the new slot is written leaves
//! the old one current, so recovery never skips a record it needs, nor replays a reproduced
//! one after a newer write of the same word was truncated (§3.1: a record is recycled only once
//! its effects are durable).

use super::super::log::{decode_ops, encode_op, Op};
use super::super::pipeline::Apply;
use super::heap::ObjectApply;
use super::DudetxPtmFault;
use crate::alloc::PageManager;
use crate::engine::dudetx::layout::meta;
use crate::engine::dudetx::DudetxFault;
use crate::engine::dudetx::DurabilityMode;
use crate::engine::wal::{build_record, parse_record, LogRing};
use crate::pmem::Pool;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// The log "table" of a record's dependency list.
pub const DEPS: u32 = 0xFFFF_FF02;
/// Chains (worker slots; ids keep the chain in 8 bits).
pub const CHAINS: usize = 256;
/// Which watermark slot is current.
const WM_SEL: u64 = meta::HEAD_POS + 128;
/// Watermark slot `s` (`CHAINS` words).
fn wm_slot(s: u64) -> u64 {
    meta::DURABLE + 4096 + s * (CHAINS as u64 * 8)
}

/// The id of a chain's `seq`-th transaction.
pub fn id_of(chain: usize, seq: u64) -> u64 {
    seq << 8 | chain as u64
}
/// The chain of `id`.
pub fn chain_of(id: u64) -> usize {
    (id & 0xFF) as usize
}
/// The chain-local number of `id`.
pub fn seq_of(id: u64) -> u64 {
    id >> 8
}

/// How reproducible transactions are found (§5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Detect {
    /// Scan each chain from its first pending transaction while its dependencies are
    /// reproduced: every transaction is marked at most once; needs an acyclic graph, which
    /// strict 2PL guarantees (§5.3 "one-round detecting").
    #[default]
    OneRound,
    /// Atlas's method: mark every persistent transaction reproducible, then for each one that
    /// depends on a volatile or non-reproducible one, mark it and (DFS) its dependents
    /// non-reproducible (§5.3 "two-round detecting").
    TwoRound,
}

impl std::str::FromStr for Detect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "one-round" | "one" | "1" => Ok(Detect::OneRound),
            "two-round" | "two" | "2" => Ok(Detect::TwoRound),
            _ => Err(format!(
                "unknown dependency detection '{s}' (expected one-round or two-round)"
            )),
        }
    }
}

/// Finds the reproducible transactions among `pending` (id → the ids it depends on; ids of
/// persistent transactions not yet reproducible), given `done` (per chain, the last seq already
/// reproducible). Returns them in a dependency-respecting order and advances `done`. A
/// dependency on a transaction neither done nor pending (volatile, or lost in a crash) keeps
/// its dependents back (§5.3).
pub fn detect(
    how: Detect,
    pending: &HashMap<u64, Vec<u64>>,
    done: &mut [u64],
) -> Result<Vec<u64>, String> {
    match how {
        Detect::OneRound => Ok(one_round(pending, done)),
        Detect::TwoRound => two_round(pending, done),
    }
}

fn one_round(pending: &HashMap<u64, Vec<u64>>, done: &mut [u64]) -> Vec<u64> {
    let mut chains: Vec<usize> = pending.keys().map(|&id| chain_of(id)).collect();
    chains.sort_unstable();
    chains.dedup();
    let mut out = Vec::new();
    // A pass takes each chain as far as it goes; a chain held back by another chain's later
    // transaction is taken further on the next pass (each transaction is still marked once).
    loop {
        let before = out.len();
        for &c in &chains {
            while let Some(deps) = pending.get(&id_of(c, done[c] + 1)) {
                if !deps.iter().all(|&d| seq_of(d) <= done[chain_of(d)]) {
                    break;
                }
                done[c] += 1;
                out.push(id_of(c, done[c]));
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

fn two_round(pending: &HashMap<u64, Vec<u64>>, done: &mut [u64]) -> Result<Vec<u64>, String> {
    let known = |d: u64| pending.contains_key(&d) || seq_of(d) <= done[chain_of(d)];
    // Edges: the listed dependencies and program order (the chain's previous transaction).
    let deps_of = |id: u64| -> Vec<u64> {
        let mut v = pending[&id].clone();
        if seq_of(id) > 1 {
            v.push(id_of(chain_of(id), seq_of(id) - 1));
        }
        v
    };
    let mut dependents: HashMap<u64, Vec<u64>> = HashMap::new();
    for &id in pending.keys() {
        for d in deps_of(id) {
            dependents.entry(d).or_default().push(id);
        }
    }
    // Round one: all reproducible; round two: invalidate from each one that depends on a
    // volatile transaction, and (DFS) everything depending on it.
    let mut bad: HashSet<u64> = HashSet::new();
    for &id in pending.keys() {
        if bad.contains(&id) || deps_of(id).into_iter().all(known) {
            continue;
        }
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            if bad.insert(n) {
                stack.extend(dependents.get(&n).into_iter().flatten().copied());
            }
        }
    }
    // The reproducible ones in a topological order (Kahn); under strict 2PL there is no cycle.
    let good: Vec<u64> = pending
        .keys()
        .copied()
        .filter(|id| !bad.contains(id))
        .collect();
    let mut indegree: HashMap<u64, usize> = HashMap::new();
    for &id in &good {
        let n = deps_of(id)
            .into_iter()
            .filter(|d| pending.contains_key(d) && !bad.contains(d))
            .count();
        indegree.insert(id, n);
    }
    let mut ready: Vec<u64> = indegree
        .iter()
        .filter(|(_, &n)| n == 0)
        .map(|(&id, _)| id)
        .collect();
    ready.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::with_capacity(good.len());
    while let Some(id) = ready.pop() {
        out.push(id);
        for &n in dependents.get(&id).into_iter().flatten() {
            if let Some(k) = indegree.get_mut(&n) {
                *k -= 1;
                if *k == 0 {
                    ready.push(n);
                }
            }
        }
    }
    if out.len() != good.len() {
        return Err(format!(
            "the dependency graph has a cycle among {} transactions: strict two-phase locking \
             cannot produce one, so the log is damaged",
            good.len() - out.len()
        ));
    }
    for &id in &out {
        let c = chain_of(id);
        done[c] = done[c].max(seq_of(id));
    }
    Ok(out)
}

/// Splits a record's ops into its dependency list and its writes.
pub fn split_deps(mut ops: Vec<Op>) -> Result<(Vec<u64>, Vec<Op>), String> {
    if ops.first().map(|o| o.table) != Some(DEPS) {
        return Err("a lock-mode log record does not start with its dependency list".into());
    }
    let first = ops.remove(0);
    let row = first.row.unwrap_or_default();
    if row.len() as u64 != first.key * 8 {
        return Err("a lock-mode dependency list is cut short".into());
    }
    let deps = row
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    Ok((deps, ops))
}

/// Encodes a dependency list as a record's first op.
pub fn encode_deps(out: &mut Vec<u8>, deps: &[u64]) {
    let mut row = Vec::with_capacity(deps.len() * 8);
    for d in deps {
        row.extend_from_slice(&d.to_le_bytes());
    }
    encode_op(out, DEPS, deps.len() as u64, Some(&row));
}

/// A persistent transaction not yet reproduced.
struct Persisted {
    deps: Vec<u64>,
    ops: Vec<Op>,
    /// Its ring position (the ring-order fault reproduces by it).
    pos: u64,
}

#[derive(Default)]
struct State {
    /// Per chain, committed and not yet persisted: (id, encoded log with its dependencies).
    queues: BTreeMap<usize, VecDeque<(u64, Vec<u8>)>>,
    queued: usize,
    /// Persistent, not yet reproducible.
    persisted: HashMap<u64, Persisted>,
    /// Reproducible (durable), not yet reproduced, in a dependency-respecting order.
    ready: VecDeque<(u64, Persisted)>,
    /// Per chain: the last seq reproducible (durable).
    durable: Vec<u64>,
    /// Per chain: the last seq reproduced (as persisted in the current watermark slot).
    reproduced: Vec<u64>,
    /// The current watermark slot.
    slot: u64,
    /// Ring records not yet truncated: (id, end position), in ring order.
    ring: VecDeque<(u64, u64)>,
    tail: u64,
    head: u64,
    /// Why the pipeline stopped; commits are refused then.
    failed: Option<String>,
    /// The last id committed and the last made durable (any chain).
    last_committed: u64,
    last_durable: u64,
    stats: super::super::LogStats,
}

/// The lock mode's persist and reproduce steps, run by the committing threads (a step persists
/// every chain's queue, chain after chain, detects, and reproduces).
pub struct LockPipe {
    pool: std::sync::Arc<Pool>,
    ring: LogRing,
    meta_page: u64,
    mode: DurabilityMode,
    group: usize,
    detect: Detect,
    fault: Option<DudetxPtmFault>,
    /// Watermark words each reproduce writes: the chains workers can use and every chain
    /// with a watermark above 0 (the other chains' words are 0 in both slots, so they need
    /// no rewrite).
    chains: usize,
    state: Mutex<State>,
    became_durable: Condvar,
    apply: Mutex<ObjectApply>,
}

/// What recovery found in a lock-mode log.
pub struct Recovered {
    /// Per chain, the last seq reproduced (so the next is one more).
    pub reproduced: Vec<u64>,
    /// Records replayed, and persistent ones abandoned (§5.3: not reproducible).
    pub replayed: u64,
    /// Persistent records abandoned.
    pub abandoned: u64,
    /// The truncation position after recovery.
    pub pos: u64,
}

fn read_watermarks(pool: &Pool, meta_page: u64) -> (u64, Vec<u64>) {
    let slot = pool.read_u64(meta_page + WM_SEL) & 1;
    let base = meta_page + wm_slot(slot);
    let wm = (0..CHAINS as u64)
        .map(|c| pool.read_u64(base + c * 8))
        .collect();
    (slot, wm)
}

/// Writes `wm` (the first chains' watermarks: the other words of both slots are already
/// equal, see [`LockPipe::new`]) to the slot that is not current, makes it durable, then makes
/// it current; returns the new slot.
fn write_watermarks(pool: &Pool, meta_page: u64, slot: u64, wm: &[u64]) -> u64 {
    let next = slot ^ 1;
    let base = meta_page + wm_slot(next);
    for (c, &w) in wm.iter().enumerate() {
        pool.write_u64(base + c as u64 * 8, w);
    }
    pool.persist(base, wm.len() as u64 * 8);
    pool.write_u64(meta_page + WM_SEL, next);
    pool.persist(meta_page + WM_SEL, 8);
    next
}

/// Recovery of a lock-mode log (§3.5, §5.3): from the truncation point, every intact record
/// (the ring is written in order, each record fenced before the next, so they are a prefix);
/// those already reproduced (at or below their chain's watermark) skipped; the rest detected as
/// in reproduce, the reproducible ones replayed in dependency order, the others abandoned (they
/// depend on a transaction a crash lost: cascading roll-back, §5.1). Then the new watermarks
/// and the truncation point past every scanned record.
pub(crate) fn recover(
    pool: &Pool,
    ring: &LogRing,
    meta_page: u64,
    how: Detect,
    ring_order: bool,
    mut apply: impl FnMut(&Op) -> Result<(), String>,
) -> Result<Recovered, String> {
    let (slot, mut done) = read_watermarks(pool, meta_page);
    let mut pos = pool.read_u64(meta_page + meta::HEAD_POS);
    let mut pending: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut ops_of: HashMap<u64, (u64, Vec<Op>)> = HashMap::new();
    while let Some(rec) = parse_record(ring, pool, pos) {
        let Ok(ops) = decode_ops(&rec.raw) else { break };
        let Ok((deps, ops)) = split_deps(ops) else {
            break;
        };
        let id = rec.first;
        if rec.last != id || seq_of(id) == 0 {
            break;
        }
        if seq_of(id) > done[chain_of(id)] {
            pending.insert(id, deps);
            ops_of.insert(id, (pos, ops));
        }
        pos += rec.len;
    }
    let mut order = detect(how, &pending, &mut done)?;
    if ring_order {
        order.sort_unstable_by_key(|id| ops_of[id].0);
    }
    for id in &order {
        for op in &ops_of[id].1 {
            apply(op).map_err(|e| format!("replaying lock-mode record {id:#x}: {e}"))?;
        }
    }
    // The replayed writes are fenced by the watermark slot's persist.
    write_watermarks(pool, meta_page, slot, &done);
    pool.write_u64(meta_page + meta::HEAD_POS, pos);
    pool.persist(meta_page + meta::HEAD_POS, 8);
    Ok(Recovered {
        reproduced: done,
        replayed: order.len() as u64,
        abandoned: (pending.len() - order.len()) as u64,
        pos,
    })
}

impl LockPipe {
    /// A pipeline over `ring` whose chains (`max_threads` of them used) have reproduced up to
    /// `reproduced`, the log truncated at `pos`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        pool: std::sync::Arc<Pool>,
        ring: LogRing,
        meta_page: u64,
        config: &super::DudetxPtmOptions,
        max_threads: usize,
        detect: Detect,
        apply: ObjectApply,
        reproduced: Vec<u64>,
        pos: u64,
    ) -> LockPipe {
        let slot = pool.read_u64(meta_page + WM_SEL) & 1;
        // A chain whose current watermark is 0 has never reproduced anything, so its word is 0
        // in the other slot too (watermarks only grow, each slot write copies every chain
        // above 0): words past the last such chain and the workers' chains stay as they are.
        let chains = reproduced
            .iter()
            .rposition(|&w| w != 0)
            .map_or(0, |c| c + 1)
            .max(max_threads.min(CHAINS));
        LockPipe {
            chains,
            pool,
            ring,
            meta_page,
            mode: config.mode,
            group: config.group,
            detect,
            fault: config.fault,
            state: Mutex::new(State {
                durable: reproduced.clone(),
                reproduced,
                slot,
                tail: pos,
                head: pos,
                ..State::default()
            }),
            became_durable: Condvar::new(),
            apply: Mutex::new(apply),
        }
    }

    /// The last seq each chain reproduced (chains continue after it).
    pub fn reproduced(&self) -> Vec<u64> {
        self.state.lock().reproduced.clone()
    }

    /// Why the pipeline stopped, if it did.
    pub fn failed(&self) -> Option<String> {
        self.state.lock().failed.clone()
    }

    /// (last id committed, last id made durable), any chain.
    pub fn ids(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.last_committed, st.last_durable)
    }

    /// What the log did (no combination in this mode: combined = raw).
    pub fn stats(&self) -> super::super::LogStats {
        self.state.lock().stats
    }

    /// The record a transaction's log becomes: its dependency list first (§5.2), then its ops.
    pub fn log_with_deps(&self, deps: &[u64], ops: &[u8]) -> Vec<u8> {
        let mut log = Vec::with_capacity(ops.len() + 17 + deps.len() * 8);
        let listed: &[u64] = if self.fault == Some(DudetxPtmFault::LockNoDeps) {
            &[]
        } else {
            deps
        };
        encode_deps(&mut log, listed);
        log.extend_from_slice(ops);
        log
    }

    /// Queues a committed transaction's log (called while the transaction still holds its
    /// locks, so everything it depends on is queued before it).
    pub fn enqueue(&self, id: u64, log: Vec<u8>) {
        let mut st = self.state.lock();
        st.stats.txns += 1;
        st.stats.raw_bytes += log.len() as u64;
        st.queues
            .entry(chain_of(id))
            .or_default()
            .push_back((id, log));
        st.queued += 1;
        st.last_committed = id;
    }

    /// The table engine's pipeline fault of this kind, if it is the one configured (the lock
    /// mode's steps have the same ordering points: log persist, durable report, reproduce,
    /// truncation).
    fn pipeline_fault(&self, f: DudetxFault) -> bool {
        self.fault == Some(DudetxPtmFault::Pipeline(f))
    }

    /// After a commit: the steps when due (sync: always; async: once `group` logs wait), and in
    /// sync mode the wait until `id` is durable.
    pub fn after_commit(&self, pages: &PageManager, id: u64) -> Result<(), String> {
        let mut st = self.state.lock();
        if self.pipeline_fault(DudetxFault::DurableIdFirst) {
            // The fault: the commit is reported durable before its record is persisted.
            st.last_durable = id;
            if st.queued < self.group {
                return Ok(());
            }
        }
        if self.mode == DurabilityMode::Sync || st.queued >= self.group {
            self.step(pages, &mut st)?;
        }
        if self.mode == DurabilityMode::Sync {
            while seq_of(id) > st.durable[chain_of(id)] {
                if let Some(why) = &st.failed {
                    return Err(why.clone());
                }
                self.step(pages, &mut st)?;
                if seq_of(id) > st.durable[chain_of(id)] {
                    self.became_durable
                        .wait_for(&mut st, std::time::Duration::from_millis(1));
                }
            }
        }
        Ok(())
    }

    /// Persists, detects and reproduces everything queued.
    pub fn drain(&self, pages: &PageManager) -> Result<(), String> {
        let mut st = self.state.lock();
        self.step(pages, &mut st)?;
        self.reproduce(pages, &mut st)
    }

    fn fail(&self, st: &mut State, why: String) -> String {
        st.failed = Some(why.clone());
        self.became_durable.notify_all();
        why
    }

    /// One step: persist every chain's queue (chain after chain: no global order, §3.3), detect
    /// the reproducible transactions (§5.3), and reproduce when more than two wait (leaving a
    /// few, so crashes find logs to replay).
    fn step(&self, pages: &PageManager, st: &mut State) -> Result<(), String> {
        if let Some(why) = &st.failed {
            return Err(why.clone());
        }
        let queues = std::mem::take(&mut st.queues);
        st.queued = 0;
        for (_, q) in queues {
            for (id, log) in q {
                self.persist(pages, st, id, log)?;
            }
        }
        let pending: HashMap<u64, Vec<u64>> = st
            .persisted
            .iter()
            .map(|(&id, p)| (id, p.deps.clone()))
            .collect();
        let mut durable = st.durable.clone();
        let order = match detect(self.detect, &pending, &mut durable) {
            Ok(o) => o,
            Err(e) => return Err(self.fail(st, e)),
        };
        st.durable = durable;
        for id in order {
            let p = st.persisted.remove(&id).expect("a detected transaction");
            st.last_durable = id;
            st.ready.push_back((id, p));
        }
        self.became_durable.notify_all();
        if st.ready.len() > 2 {
            self.reproduce(pages, st)?;
        }
        Ok(())
    }

    /// The persist step for one transaction (§3.3): the record, its write-back and fence.
    fn persist(
        &self,
        pages: &PageManager,
        st: &mut State,
        id: u64,
        log: Vec<u8>,
    ) -> Result<(), String> {
        let rec = build_record(id, id, st.tail, &log, true);
        if st.tail + rec.len() as u64 - st.head > self.ring.capacity() {
            self.reproduce(pages, st)?;
            if st.tail + rec.len() as u64 - st.head > self.ring.capacity() {
                return Err(self.fail(
                    st,
                    "the DUDETx log ring is full of records that are not reproducible yet \
                     (they wait on transactions not persisted): format the pool with a larger \
                     log"
                    .into(),
                ));
            }
        }
        self.ring.write(&self.pool, st.tail, &rec);
        if !self.pipeline_fault(DudetxFault::SkipLogFlush) {
            self.ring.flush(&self.pool, st.tail, rec.len() as u64);
            self.pool.fence();
        }
        let (deps, ops) = decode_ops(&log)
            .and_then(split_deps)
            .expect("a log this engine encoded");
        st.stats.records += 1;
        st.stats.combined_bytes += log.len() as u64;
        st.stats.stored_bytes += rec.len() as u64;
        let pos = st.tail;
        st.tail += rec.len() as u64;
        st.ring.push_back((id, st.tail));
        st.persisted.insert(id, Persisted { deps, ops, pos });
        Ok(())
    }

    /// The reproduced watermarks after `batch`, persisted (double-buffered).
    fn advance_watermarks(&self, st: &mut State, batch: &[(u64, Persisted)]) {
        for (id, _) in batch {
            let c = chain_of(*id);
            st.reproduced[c] = st.reproduced[c].max(seq_of(*id));
        }
        let wm = &st.reproduced[..self.chains];
        st.slot = write_watermarks(&self.pool, self.meta_page, st.slot, wm);
    }

    /// The reproduce step (§3.4, §5.3): the ready transactions' writes in dependency order,
    /// written back and fenced, then the reproduced watermarks (double-buffered), then the
    /// truncation of the ring's reproduced prefix.
    fn reproduce(&self, pages: &PageManager, st: &mut State) -> Result<(), String> {
        if st.ready.is_empty() {
            return Ok(());
        }
        let mut batch: Vec<(u64, Persisted)> = st.ready.drain(..).collect();
        if self.fault == Some(DudetxPtmFault::LockRingOrder) {
            batch.sort_unstable_by_key(|(_, p)| p.pos);
        }
        let truncate_first = self.pipeline_fault(DudetxFault::TruncateFirst);
        if truncate_first {
            self.advance_watermarks(st, &batch);
        }
        let heap_fault = match self.fault {
            Some(DudetxPtmFault::Pipeline(f @ DudetxFault::SkipHeapFlush)) => Some(f),
            _ => None,
        };
        {
            let mut apply = self.apply.lock();
            for (_, p) in &batch {
                for op in &p.ops {
                    if let Err(e) = apply.apply(&self.pool, pages, op, heap_fault) {
                        return Err(self.fail(st, e));
                    }
                }
            }
        }
        // The heap writes durable before the watermarks say they are (§3.1).
        if heap_fault.is_none() {
            self.pool.fence();
        }
        if !truncate_first {
            self.advance_watermarks(st, &batch);
        }
        let mut head = st.head;
        while let Some(&(id, end)) = st.ring.front() {
            if seq_of(id) > st.reproduced[chain_of(id)] {
                break;
            }
            head = end;
            st.ring.pop_front();
        }
        if head != st.head {
            st.head = head;
            self.pool.write_u64(self.meta_page + meta::HEAD_POS, head);
            self.pool.persist(self.meta_page + meta::HEAD_POS, 8);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A random strict-2PL history over `words` words by `chains` chains: each transaction
    /// writes some words (locks them), depends on the last writer of each (lock hand-off) and
    /// on its chain's previous transaction. Returns the transactions in commit order: (id,
    /// deps, writes).
    /// A committed transaction: (id, dependencies, (word, value) writes).
    type Txn = (u64, Vec<u64>, Vec<(u64, u64)>);

    fn history(steps: &[(usize, Vec<(u64, u64)>)]) -> Vec<Txn> {
        let mut seq = [0u64; 4];
        let mut last: HashMap<u64, u64> = HashMap::new();
        let mut out = Vec::new();
        for (chain, writes) in steps {
            seq[*chain] += 1;
            let id = id_of(*chain, seq[*chain]);
            let mut deps: Vec<u64> = writes
                .iter()
                .filter_map(|(w, _)| last.get(w).copied())
                .filter(|&d| chain_of(d) != *chain)
                .collect();
            deps.sort_unstable();
            deps.dedup();
            for (w, _) in writes {
                last.insert(*w, id);
            }
            out.push((id, deps, writes.clone()));
        }
        out
    }

    proptest! {
        /// §5.3: whatever subset of a strict-2PL history is persistent (each chain persisting
        /// a prefix of its own transactions, the chains in any order), applying the
        /// transactions detection finds reproducible, in its order, gives the state of a
        /// sequential replay (commit order) of exactly those transactions; they are closed
        /// under dependencies; one-round and two-round detecting find the same set.
        #[test]
        fn dependency_ordered_reproduce_equals_sequential_replay(
            steps in prop::collection::vec(
                (0usize..4, prop::collection::vec((0u64..6, any::<u64>()), 1..4)),
                1..40,
            ),
            persisted_per_chain in prop::collection::vec(0u64..12, 4),
        ) {
            let h = history(&steps);
            let pending: HashMap<u64, Vec<u64>> = h
                .iter()
                .filter(|(id, _, _)| seq_of(*id) <= persisted_per_chain[chain_of(*id)])
                .map(|(id, deps, _)| (*id, deps.clone()))
                .collect();
            let mut done1 = vec![0u64; CHAINS];
            let one = detect(Detect::OneRound, &pending, &mut done1).unwrap();
            let mut done2 = vec![0u64; CHAINS];
            let two = detect(Detect::TwoRound, &pending, &mut done2).unwrap();
            let set1: HashSet<u64> = one.iter().copied().collect();
            let set2: HashSet<u64> = two.iter().copied().collect();
            prop_assert_eq!(&set1, &set2);
            prop_assert_eq!(&done1, &done2);
            for order in [&one, &two] {
                let mut applied: HashMap<u64, u64> = HashMap::new();
                let writes: HashMap<u64, &Vec<(u64, u64)>> =
                    h.iter().map(|(id, _, w)| (*id, w)).collect();
                let mut seen = HashSet::new();
                for id in order.iter() {
                    for d in &pending[id] {
                        prop_assert!(seen.contains(d), "{:#x} before its dependency {:#x}", id, d);
                    }
                    seen.insert(*id);
                    for &(w, v) in writes[id] {
                        applied.insert(w, v);
                    }
                }
                let mut sequential: HashMap<u64, u64> = HashMap::new();
                for (id, deps, w) in &h {
                    if set1.contains(id) {
                        for d in deps {
                            prop_assert!(set1.contains(d), "reproducible {:#x} depends on lost {:#x}", id, d);
                        }
                        for &(w, v) in w {
                            sequential.insert(w, v);
                        }
                    }
                }
                prop_assert_eq!(&applied, &sequential);
            }
            // Everything persisted whose ancestors are persisted is found.
            let all: HashMap<u64, Vec<u64>> = h.iter().map(|(id, d, _)| (*id, d.clone())).collect();
            let mut done = vec![0u64; CHAINS];
            prop_assert_eq!(detect(Detect::OneRound, &all, &mut done).unwrap().len(), h.len());
        }
    }

    #[test]
    fn a_transaction_on_a_lost_one_is_abandoned_with_its_dependents() {
        // Chain 0: 1, 2; chain 1: 1 depends on chain 0's 2, 2; chain 0's 2 is lost.
        let mut pending = HashMap::new();
        pending.insert(id_of(0, 1), vec![]);
        pending.insert(id_of(1, 1), vec![id_of(0, 2)]);
        pending.insert(id_of(1, 2), vec![]);
        for how in [Detect::OneRound, Detect::TwoRound] {
            let mut done = vec![0u64; CHAINS];
            let out = detect(how, &pending, &mut done).unwrap();
            assert_eq!(out, vec![id_of(0, 1)], "{how:?}");
        }
    }

    #[test]
    fn a_cycle_is_refused_by_two_round_detecting() {
        let mut pending = HashMap::new();
        pending.insert(id_of(0, 1), vec![id_of(1, 1)]);
        pending.insert(id_of(1, 1), vec![id_of(0, 1)]);
        let mut done = vec![0u64; CHAINS];
        let e = detect(Detect::TwoRound, &pending, &mut done).unwrap_err();
        assert!(e.contains("cycle"), "{e}");
        let mut done = vec![0u64; CHAINS];
        assert!(detect(Detect::OneRound, &pending, &mut done)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn detect_names_parse() {
        assert_eq!("two-round".parse::<Detect>().unwrap(), Detect::TwoRound);
        assert!("three".parse::<Detect>().unwrap_err().contains("one-round"));
    }
}
