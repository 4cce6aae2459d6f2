//! The lock-based perform mode (§5): transactions perform under strict two-phase locks on the
//! shadow's word stripes; the dependency graph comes from lock hand-offs (§5.2: releasing a
//! lock leaves the releasing transaction's id on it, the next holder depends on that id) and
//! from program order (a chain's transactions follow each other); logs are persisted chain by
//! chain, in no global order (§3.3, §5); reproduce and recovery apply exactly the
//! *reproducible* transactions (§5.3: persistent, and everything they depend on reproducible),
//! in a dependency-respecting order, found by one-round or two-round detecting.
//!
//! The steps are the pipeline core's (`pipeline::Core`: its queue, ring, threads or inline
//! steps, group commit, and its faults at each ordering step); `DepOrder` plugs in what this
//! mode does differently: one record per transaction, chain after chain; detection instead of
//! a durable id word; dependency-ordered reproduce; watermarks as the truncation marks.
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
//! one after a newer write of the same word was truncated (§3.4: a record is recycled only once
//! its effects are durable).

use super::super::log::{decode_ops, encode_op, Op};
use super::super::pipeline::{
    Batch, MakeRecords, Persister, Record, Reproduction, Sequencer, Written,
};
use super::DudetxPtmFault;
use crate::engine::dudetx::layout::meta;
use crate::engine::wal::{parse_record, LogRing};
use crate::pmem::Pool;
use std::collections::{HashMap, HashSet, VecDeque};

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

/// The lock-based mode's order on the pipeline core ([`Sequencer`], §5): a group's
/// transactions are persisted one record each, chain after chain (§3.3's per-thread persist:
/// no global order in the ring); once persisted, detection (§5.3) finds the reproducible ones
/// and reports them durable; reproduce applies them in a dependency-respecting order, then
/// writes the chains' reproduced watermarks (double-buffered) before the head moves past the
/// ring's reproduced prefix. There is no durable id word: recovery detects again.
pub(crate) struct DepOrder {
    detect: Detect,
    fault: Option<DudetxPtmFault>,
    /// Watermark words each reproduce writes: the chains workers can use and every chain
    /// with a watermark above 0 (the other chains' words are 0 in both slots, so they need
    /// no rewrite).
    chains: usize,
    /// Persistent, not yet reproducible.
    persisted: HashMap<u64, Persisted>,
    /// Reproducible (durable), not yet reproduced, in a dependency-respecting order.
    ready: VecDeque<(u64, Persisted)>,
    /// Per chain: the last seq reproducible (durable).
    durable: Vec<u64>,
    /// Per chain: the last seq reproduced (as the current watermark slot will say once the
    /// reproduce step in flight is done).
    reproduced: Vec<u64>,
    /// The current watermark slot.
    slot: u64,
    /// Ring records not yet truncated: (id, end position), in ring order.
    ring: VecDeque<(u64, u64)>,
}

impl DepOrder {
    /// The order of a pool whose chains (`max_threads` of them used) have reproduced up to
    /// `reproduced`.
    pub(crate) fn new(
        pool: &Pool,
        meta_page: u64,
        max_threads: usize,
        detect: Detect,
        fault: Option<DudetxPtmFault>,
        reproduced: Vec<u64>,
    ) -> DepOrder {
        let slot = pool.read_u64(meta_page + WM_SEL) & 1;
        // A chain whose current watermark is 0 has never reproduced anything, so its word is 0
        // in the other slot too (watermarks only grow, each slot write copies every chain
        // above 0): words past the last such chain and the workers' chains stay as they are.
        let chains = reproduced
            .iter()
            .rposition(|&w| w != 0)
            .map_or(0, |c| c + 1)
            .max(max_threads.min(CHAINS));
        DepOrder {
            detect,
            fault,
            chains,
            persisted: HashMap::new(),
            ready: VecDeque::new(),
            durable: reproduced.clone(),
            reproduced,
            slot,
            ring: VecDeque::new(),
        }
    }

    /// One record per transaction, chain after chain (each chain's in its own order), its ops
    /// decoded here, outside the state lock ([`Sequencer::persisted`] runs under it).
    fn per_transaction(p: &mut Persister) -> Result<(), String> {
        p.group.sort_by_key(|q| chain_of(q.id));
        for q in p.group.drain(..) {
            let decoded = decode_ops(&q.log)?;
            p.records.push(Record {
                first: q.id,
                last: q.id,
                raw: q.log,
                decoded,
            });
        }
        Ok(())
    }
}

impl Sequencer for DepOrder {
    fn make_records(&self) -> MakeRecords {
        DepOrder::per_transaction
    }

    fn durable_word(&self) -> bool {
        false
    }

    /// Adds the records to the graph and detects (§5.3): the reproducible ones become durable
    /// and ready, in the order found.
    fn persisted(&mut self, written: &mut Vec<Written>) -> Result<Option<u64>, String> {
        for w in written.drain(..) {
            let id = w.record.first;
            let (deps, ops) = split_deps(w.record.decoded)?;
            self.ring.push_back((id, w.end));
            self.persisted.insert(
                id,
                Persisted {
                    deps,
                    ops,
                    pos: w.pos,
                },
            );
        }
        let pending: HashMap<u64, Vec<u64>> = self
            .persisted
            .iter()
            .map(|(&id, p)| (id, p.deps.clone()))
            .collect();
        let order = detect(self.detect, &pending, &mut self.durable)?;
        let last = order.last().copied();
        for id in order {
            let p = self.persisted.remove(&id).expect("a detected transaction");
            self.ready.push_back((id, p));
        }
        Ok(last)
    }

    fn report_early(&mut self, records: &[Record]) -> Option<u64> {
        records.last().map(|r| r.last)
    }

    fn is_durable(&self, id: u64, _reported: u64) -> bool {
        seq_of(id) <= self.durable[chain_of(id)]
    }

    fn reproducible(&self) -> usize {
        self.ready.len()
    }

    /// The ready transactions in dependency order (ring order under the fault), the new
    /// watermarks into the slot that is not current, and the head past the ring's prefix of
    /// reproduced records.
    fn take_reproducible(&mut self, meta_page: u64) -> Option<Reproduction> {
        if self.ready.is_empty() {
            return None;
        }
        let mut batch: Vec<(u64, Persisted)> = self.ready.drain(..).collect();
        if self.fault == Some(DudetxPtmFault::LockRingOrder) {
            batch.sort_unstable_by_key(|(_, p)| p.pos);
        }
        let mut last = 0;
        for (id, _) in &batch {
            let c = chain_of(*id);
            self.reproduced[c] = self.reproduced[c].max(seq_of(*id));
            last = *id;
        }
        if self.fault != Some(DudetxPtmFault::LockWatermarkInPlace) {
            self.slot ^= 1;
        }
        let (slot, wm) = (self.slot, self.reproduced[..self.chains].to_vec());
        let marks = Box::new(move |pool: &Pool| write_watermarks(pool, meta_page, slot, &wm));
        let mut head = None;
        while let Some(&(id, end)) = self.ring.front() {
            if seq_of(id) > self.reproduced[chain_of(id)] {
                break;
            }
            head = Some(end);
            self.ring.pop_front();
        }
        Some(Reproduction {
            ops: Batch::Decoded(batch.into_iter().map(|(_, p)| p.ops).collect()),
            marks,
            head,
            last,
        })
    }

    fn settled(&self, _committed: u64, _reproduced: u64) -> bool {
        self.persisted.is_empty() && self.ready.is_empty()
    }
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
/// equal, see [`DepOrder::new`]) to watermark slot `slot`, makes it durable, then makes it
/// current. The caller passes the slot that is *not* current (double-buffering), except under
/// the fault [`DudetxPtmFault::LockWatermarkInPlace`].
fn write_watermarks(pool: &Pool, meta_page: u64, slot: u64, wm: &[u64]) {
    let base = meta_page + wm_slot(slot);
    for (c, &w) in wm.iter().enumerate() {
        pool.write_u64(base + c as u64 * 8, w);
    }
    pool.persist(base, wm.len() as u64 * 8);
    pool.write_u64(meta_page + WM_SEL, slot);
    pool.persist(meta_page + WM_SEL, 8);
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
    write_watermarks(pool, meta_page, slot ^ 1, &done);
    pool.write_u64(meta_page + meta::HEAD_POS, pos);
    pool.persist(meta_page + meta::HEAD_POS, 8);
    Ok(Recovered {
        reproduced: done,
        replayed: order.len() as u64,
        abandoned: (pending.len() - order.len()) as u64,
        pos,
    })
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
