//! The persistent-object API (`pmtx::ptm`) on DUDETx (§3, §3.6): behaviour and errors, a
//! proptest against a DRAM model with restarts, concurrent transfers, sync and async modes, the
//! perform modes (§4.2 refusal), and crash tests under the crash simulator (ADR and eADR) before
//! every PM event of an alloc/write/free workload, with and without each fault.

use pmtx::crashtest::ptm::{
    setup, state_of, sweep as sweep_all, transfer, Lcg, Node, PtmCrashConfig, Root,
};
use pmtx::engine::dudetx::ptm::{DudetxPtmFault, PerformMode};
use pmtx::engine::dudetx::DurabilityMode;
use pmtx::pmem::{CrashTrigger, PersistenceDomain};
use pmtx::ptm::{PPtr, Ptm, PtmConfig, PtmEngineKind, PtmError};
use std::collections::HashMap;

fn small() -> PtmConfig {
    PtmConfig::temporary()
        .size(16 << 20)
        .engine(PtmEngineKind::Dudetx)
}

#[test]
fn alloc_read_write_free_and_the_root() {
    let ptm = Ptm::<Root>::create(small()).unwrap();
    assert_eq!(ptm.engine().name(), "dudetx");
    let (a, n) = ptm
        .run(|tx| {
            let a = tx.alloc(&41u64)?;
            let n = tx.alloc(&Node {
                value: 1,
                next: PPtr::null(),
            })?;
            tx.write(a, &42)?;
            assert_eq!(tx.read(a)?, 42, "a transaction reads its own writes");
            let root = tx.root();
            tx.update(root, |r| {
                r.accounts[0] = a;
                r.head = n;
                r.len = 1;
            })?;
            Ok((a, n))
        })
        .unwrap();
    let (v, node, r) = ptm
        .run(|tx| Ok((tx.read(a)?, tx.read(n)?, tx.read(tx.root())?)))
        .unwrap();
    assert_eq!(
        (v, node.value, r.accounts[0], r.head, r.len),
        (42, 1, a, n, 1)
    );
    ptm.run(|tx| tx.write_at(n, 8, &a.raw())).unwrap();
    assert_eq!(
        ptm.run(|tx| tx.read_at::<Node, u64>(n, 8)).unwrap(),
        a.raw()
    );
    // A sub-word field write keeps the rest of the word.
    let b = ptm.run(|tx| tx.alloc(&[1u8; 12])).unwrap();
    ptm.run(|tx| tx.write_at(b, 5, &[9u8; 4])).unwrap();
    assert_eq!(
        ptm.run(|tx| tx.read(b)).unwrap(),
        [1, 1, 1, 1, 1, 9, 9, 9, 9, 1, 1, 1]
    );
    ptm.run(|tx| tx.free(a)).unwrap();
    let err = ptm.run(|tx| tx.read(a)).unwrap_err();
    assert!(matches!(err, PtmError::InvalidHandle { .. }), "{err}");
    assert!(err.to_string().contains("freed"), "{err}");
    assert!(!ptm.run(|tx| tx.is_valid(a)).unwrap());
    ptm.check_invariants().unwrap();
}

#[test]
fn errors_are_typed_and_clear() {
    let ptm = Ptm::<Root>::create(small()).unwrap();
    let null: PPtr<u64> = PPtr::null();
    let e = ptm.run(|tx| tx.read(null)).unwrap_err();
    assert!(e.to_string().contains("null"), "{e}");
    let bogus: PPtr<u64> = PPtr::from_raw(7 << 48 | 123_456);
    let e = ptm.run(|tx| tx.write(bogus, &1)).unwrap_err();
    assert!(matches!(e, PtmError::InvalidHandle { .. }), "{e}");
    let a = ptm.run(|tx| tx.alloc(&1u64)).unwrap();
    let e = ptm.run(|tx| tx.write_at(a, 4, &0u64)).unwrap_err();
    assert!(matches!(e, PtmError::TooLarge(_)), "{e}");
    let mut w = ptm.engine().worker().unwrap();
    w.begin();
    let e = w.alloc(&vec![0u8; 3 << 20]).unwrap_err();
    w.abort();
    drop(w);
    assert!(e.to_string().contains("largest object"), "{e}");
    let e = ptm
        .run(|tx| {
            let r = tx.root();
            tx.free(r)
        })
        .unwrap_err();
    assert!(e.to_string().contains("root object cannot be freed"), "{e}");
    // A freed slot reused: the old handle is refused (another generation).
    ptm.run(|tx| tx.free(a)).unwrap();
    let b = ptm.run(|tx| tx.alloc(&2u64)).unwrap();
    assert_ne!(a, b);
    assert_eq!(a.raw() & 0xffff_ffff_ffff, b.raw() & 0xffff_ffff_ffff, "the slot is reused");
    assert!(ptm.run(|tx| tx.read(a)).is_err());
    assert_eq!(ptm.run(|tx| tx.read(b)).unwrap(), 2);
    let e = ptm
        .run(|tx| {
            tx.write(b, &99)?;
            tx.alloc(&5u64)?;
            tx.abort::<()>()
        })
        .unwrap_err();
    assert_eq!(e, PtmError::UserAbort);
    assert_eq!(ptm.run(|tx| tx.read(b)).unwrap(), 2);
    ptm.check_invariants().unwrap();
}
