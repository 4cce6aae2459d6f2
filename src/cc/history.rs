//! A conflict-serializability checker for recorded histories (Adya's direct serialization graph
//! with a known version order).
//!
//! Each committed transaction records, per object, the version it **read** and the version it
//! **installed** over which previous version. Versions are named by the transaction that wrote
//! them ([`INITIAL`] for the loaded state). From that:
//!
//! - `ww`: the writer of the overwritten version → the writer of the new one;
//! - `wr`: the writer of a version → each transaction that read it;
//! - `rw` (anti-dependency): each reader of a version → the transaction that overwrote it.
//!
//! The history is conflict-serializable iff this graph is acyclic. Workloads make every write a
//! read-modify-write of a row that carries its writer's id, so the overwritten version is known
//! exactly (the test driver reads it in the same transaction).
//!
//! For snapshot isolation, [`History::check_snapshot_isolation`] reports what SI forbids (lost
//! updates: two committed writers that overwrote the same version; reads of versions never
//! installed; cycles with fewer than two anti-dependencies), while write skew is allowed.

use std::collections::HashMap;

/// The version every object holds before any recorded transaction.
pub const INITIAL: u64 = 0;

/// One committed transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRecord {
    /// Its id (also the name of the versions it wrote); never [`INITIAL`].
    pub id: u64,
    /// `(object, version read)`.
    pub reads: Vec<(u64, u64)>,
    /// `(object, version overwritten)`: the new version is `id`.
    pub writes: Vec<(u64, u64)>,
}

/// A dependency edge kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Edge {
    /// Write-write.
    Ww,
    /// Write-read.
    Wr,
    /// Read-write (anti-dependency).
    Rw,
}

/// Why a history is not what a protocol promises.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// A cycle in the dependency graph: transaction ids in order, with the edge into each next.
    #[error("dependency cycle: {0:?}")]
    Cycle(Vec<(u64, Edge)>),
    /// Two committed transactions overwrote the same version of an object (a lost update).
    #[error("lost update: transactions {first} and {second} both overwrote version {version} of object {object}")]
    LostUpdate {
        /// The object.
        object: u64,
        /// The version both overwrote.
        version: u64,
        /// One writer.
        first: u64,
        /// The other.
        second: u64,
    },
    /// A read of a version no committed transaction installed (a dirty or aborted read).
    #[error("transaction {reader} read version {version} of object {object}, which no committed transaction wrote")]
    PhantomVersion {
        /// The reader.
        reader: u64,
        /// The object.
        object: u64,
        /// The version.
        version: u64,
    },
    /// Two records with one id, or a record with the initial id.
    #[error("bad transaction id {0}")]
    BadId(u64),
}

/// A recorded history of committed transactions.
#[derive(Clone, Debug, Default)]
pub struct History {
    txns: Vec<TxnRecord>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Records a committed transaction.
    pub fn record(&mut self, txn: TxnRecord) {
        self.txns.push(txn);
    }

    /// Adds every record of `other`.
    pub fn extend(&mut self, other: History) {
        self.txns.extend(other.txns);
    }

    /// The committed transactions.
    pub fn len(&self) -> usize {
        self.txns.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// The dependency graph: for each transaction index, its out-edges `(target index, kind)`.
    pub fn graph(&self) -> Result<Vec<Vec<(usize, Edge)>>, HistoryError> {
        let mut index: HashMap<u64, usize> = HashMap::new();
        for (i, t) in self.txns.iter().enumerate() {
            if t.id == INITIAL || index.insert(t.id, i).is_some() {
                return Err(HistoryError::BadId(t.id));
            }
        }
        // (object, overwritten version) → overwriting transaction index.
        let mut overwriter: HashMap<(u64, u64), usize> = HashMap::new();
        let mut installed: HashMap<(u64, u64), usize> = HashMap::new();
        let mut edges = vec![Vec::new(); self.txns.len()];
        for (i, t) in self.txns.iter().enumerate() {
            for &(object, old) in &t.writes {
                installed.insert((object, t.id), i);
                if let Some(&j) = overwriter.get(&(object, old)) {
                    return Err(HistoryError::LostUpdate {
                        object,
                        version: old,
                        first: self.txns[j].id,
                        second: t.id,
                    });
                }
                overwriter.insert((object, old), i);
            }
        }
        for (i, t) in self.txns.iter().enumerate() {
            for &(object, old) in &t.writes {
                if old != INITIAL {
                    let &w = installed
                        .get(&(object, old))
                        .ok_or(HistoryError::PhantomVersion {
                            reader: t.id,
                            object,
                            version: old,
                        })?;
                    edges[w].push((i, Edge::Ww));
                }
            }
            for &(object, v) in &t.reads {
                if v != INITIAL && v != t.id {
                    let &w = installed
                        .get(&(object, v))
                        .ok_or(HistoryError::PhantomVersion {
                            reader: t.id,
                            object,
                            version: v,
                        })?;
                    edges[w].push((i, Edge::Wr));
                }
                if let Some(&o) = overwriter.get(&(object, v)) {
                    if o != i {
                        edges[i].push((o, Edge::Rw));
                    }
                }
            }
        }
        Ok(edges)
    }

    /// Checks conflict-serializability: `Ok` iff the dependency graph is acyclic; otherwise one
    /// cycle.
    pub fn check_serializable(&self) -> Result<(), HistoryError> {
        let edges = self.graph()?;
        match find_cycle(&edges, |_| true) {
            Some(c) => Err(HistoryError::Cycle(
                c.into_iter().map(|(i, e)| (self.txns[i].id, e)).collect(),
            )),
            None => Ok(()),
        }
    }

    /// Checks what snapshot isolation promises (Adya's PL-SI, as used by Fekete et al.,
    /// TODS'05): no lost update, no read of an uninstalled version, no cycle of `ww`/`wr` edges
    /// only (G1c), and no cycle with exactly one anti-dependency (G-single: read skew). Cycles
    /// with two or more anti-dependencies, such as write skew, pass.
    pub fn check_snapshot_isolation(&self) -> Result<(), HistoryError> {
        let edges = self.graph()?;
        let named = |c: Vec<(usize, Edge)>| {
            HistoryError::Cycle(c.into_iter().map(|(i, e)| (self.txns[i].id, e)).collect())
        };
        if let Some(c) = find_cycle(&edges, |e| e != Edge::Rw) {
            return Err(named(c));
        }
        // G-single: an rw edge a → b closed by a path b ⇝ a of ww/wr edges.
        for (a, out) in edges.iter().enumerate() {
            for &(b, kind) in out {
                if kind != Edge::Rw {
                    continue;
                }
                if let Some(mut path) = dependency_path(&edges, b, a) {
                    path.insert(0, (a, Edge::Rw));
                    return Err(named(path));
                }
            }
        }
        Ok(())
    }
}

/// A path `from ⇝ to` over ww/wr edges, as (node, edge into the next node), breadth first.
fn dependency_path(
    edges: &[Vec<(usize, Edge)>],
    from: usize,
    to: usize,
) -> Option<Vec<(usize, Edge)>> {
    let mut came: Vec<Option<(usize, Edge)>> = vec![None; edges.len()];
    let mut seen = vec![false; edges.len()];
    let mut queue = std::collections::VecDeque::from([from]);
    seen[from] = true;
    while let Some(n) = queue.pop_front() {
        if n == to {
            let mut path = Vec::new();
            let mut at = n;
            while let Some((p, e)) = came[at] {
                path.push((p, e));
                at = p;
            }
            path.reverse();
            return Some(path);
        }
        for &(m, e) in &edges[n] {
            if e != Edge::Rw && !seen[m] {
                seen[m] = true;
                came[m] = Some((n, e));
                queue.push_back(m);
            }
        }
    }
    None
}

/// A cycle over edges accepted by `keep`, as (node, edge into the next node), or `None`.
fn find_cycle(
    edges: &[Vec<(usize, Edge)>],
    keep: impl Fn(Edge) -> bool,
) -> Option<Vec<(usize, Edge)>> {
    // Iterative three-colour DFS, remembering the edge used to reach each node.
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let n = edges.len();
    let mut colour = vec![WHITE; n];
    let mut parent: Vec<Option<(usize, Edge)>> = vec![None; n];
    for root in 0..n {
        if colour[root] != WHITE {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        colour[root] = GREY;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&(to, kind)) = edges[node].get(*next) {
                *next += 1;
                if !keep(kind) {
                    continue;
                }
                match colour[to] {
                    WHITE => {
                        colour[to] = GREY;
                        parent[to] = Some((node, kind));
                        stack.push((to, 0));
                    }
                    GREY => {
                        // Back edge node → to: walk parents from node back to `to`.
                        let mut cycle = vec![(node, kind)];
                        let mut at = node;
                        while at != to {
                            let (p, k) =
                                parent[at].expect("grey nodes below the root have parents");
                            cycle.push((p, k));
                            at = p;
                        }
                        cycle.reverse();
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                colour[node] = BLACK;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, reads: &[(u64, u64)], writes: &[(u64, u64)]) -> TxnRecord {
        TxnRecord {
            id,
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        }
    }

    #[test]
    fn serial_history_passes() {
        let mut h = History::new();
        h.record(t(1, &[(10, 0)], &[(10, 0)]));
        h.record(t(2, &[(10, 1), (11, 0)], &[(10, 1), (11, 0)]));
        h.record(t(3, &[(11, 2)], &[]));
        assert_eq!(h.check_serializable(), Ok(()));
        assert_eq!(h.check_snapshot_isolation(), Ok(()));
    }

    #[test]
    fn write_skew_is_caught_but_allowed_under_si() {
        // T1 reads x, y and writes x; T2 reads x, y and writes y; both from the initial state.
        let mut h = History::new();
        h.record(t(1, &[(1, 0), (2, 0)], &[(1, 0)]));
        h.record(t(2, &[(1, 0), (2, 0)], &[(2, 0)]));
        match h.check_serializable() {
            Err(HistoryError::Cycle(c)) => {
                assert_eq!(c.len(), 2);
                assert!(c.iter().all(|&(_, e)| e == Edge::Rw));
            }
            other => panic!("expected a cycle, got {other:?}"),
        }
        assert_eq!(h.check_snapshot_isolation(), Ok(()));
    }

    #[test]
    fn lost_update_and_dirty_read_are_caught() {
        let mut h = History::new();
        h.record(t(1, &[(1, 0)], &[(1, 0)]));
        h.record(t(2, &[(1, 0)], &[(1, 0)]));
        assert!(matches!(
            h.check_snapshot_isolation(),
            Err(HistoryError::LostUpdate { object: 1, .. })
        ));
        let mut h = History::new();
        h.record(t(1, &[(1, 99)], &[]));
        assert!(matches!(
            h.check_serializable(),
            Err(HistoryError::PhantomVersion { version: 99, .. })
        ));
        let mut h = History::new();
        h.record(t(1, &[], &[]));
        h.record(t(1, &[], &[]));
        assert_eq!(h.check_serializable(), Err(HistoryError::BadId(1)));
    }

    #[test]
    fn read_skew_cycle_with_a_wr_edge() {
        // T1 writes x and y; T2 reads x before T1 and y after T1: T2 → T1 (rw on x), T1 → T2
        // (wr on y). Neither serializable nor SI (G-single: one anti-dependency).
        let mut h = History::new();
        h.record(t(1, &[(1, 0), (2, 0)], &[(1, 0), (2, 0)]));
        h.record(t(2, &[(1, 0), (2, 1)], &[]));
        assert!(matches!(
            h.check_serializable(),
            Err(HistoryError::Cycle(_))
        ));
        assert!(matches!(
            h.check_snapshot_isolation(),
            Err(HistoryError::Cycle(_))
        ));
    }
}
