//! The DRAM model both persistent-object API proptests drive (`tests/ptm_api.rs` for ArchTM,
//! `tests/ptm_dudetx.rs` for DUDETx): random operations on `u64` objects, applied in one
//! transaction and mirrored in a `HashMap` from handle to value.

use pmtx::ptm::{PObject, PPtr, Ptm, PtmError};
use std::collections::HashMap;

/// An operation of the model test. Indices pick among the live handles (modulo their count).
#[derive(Clone, Debug)]
pub enum Op {
    Alloc(u64),
    Write(usize, u64),
    Free(usize),
    Read(usize),
}

/// Any [`Op`].
pub fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        any::<u64>().prop_map(Op::Alloc),
        (any::<usize>(), any::<u64>()).prop_map(|(i, v)| Op::Write(i, v)),
        any::<usize>().prop_map(Op::Free),
        any::<usize>().prop_map(Op::Read),
    ]
}

/// Runs `ops` as one transaction of `ptm` (aborted at the end when `abort`), checking every read
/// against `model`. Returns the transaction's result, the model it leaves if it commits, and the
/// handles it frees.
pub fn run_ops<R: PObject>(
    ptm: &Ptm<R>,
    model: &HashMap<u64, u64>,
    ops: &[Op],
    abort: bool,
) -> (Result<(), PtmError>, HashMap<u64, u64>, Vec<u64>) {
    let mut handles: Vec<u64> = model.keys().copied().collect();
    handles.sort_unstable();
    let mut next = model.clone();
    let mut freed = Vec::new();
    let r = ptm.run(|tx| {
        next = model.clone();
        freed.clear();
        let mut hs = handles.clone();
        for op in ops {
            match *op {
                Op::Alloc(v) => {
                    let p = tx.alloc(&v)?;
                    next.insert(p.raw(), v);
                    hs.push(p.raw());
                }
                Op::Write(i, v) if !hs.is_empty() => {
                    let h = hs[i % hs.len()];
                    tx.write(PPtr::<u64>::from_raw(h), &v)?;
                    next.insert(h, v);
                }
                Op::Free(i) if !hs.is_empty() => {
                    let h = hs.remove(i % hs.len());
                    tx.free(PPtr::<u64>::from_raw(h))?;
                    next.remove(&h);
                    freed.push(h);
                }
                Op::Read(i) if !hs.is_empty() => {
                    let h = hs[i % hs.len()];
                    assert_eq!(tx.read(PPtr::<u64>::from_raw(h))?, next[&h]);
                }
                _ => {}
            }
        }
        if abort {
            tx.abort()
        } else {
            Ok(())
        }
    });
    (r, next, freed)
}

/// The engine statistic `name` of `ptm` (panics, naming it, if the engine has none).
pub fn stat<R: PObject>(ptm: &Ptm<R>, name: &str) -> u64 {
    ptm.stats()
        .iter()
        .find(|s| s.0 == name)
        .unwrap_or_else(|| panic!("no stat {name}"))
        .1
}
