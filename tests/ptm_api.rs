//! The persistent-object API (`pmtx::ptm`) on ArchTM: behaviour and errors, a proptest against a
//! DRAM model, two threads of transfers, and crash tests under the crash simulator (ADR and
//! eADR) at every PM event of a workload that allocates, updates, frees and collects garbage,
//! with and without each `archtm-*` fault.

use pmtx::pmem::{CrashTrigger, PersistenceDomain};
use pmtx::ptm::archtm::ArchtmFault;
use pmtx::ptm::{PPtr, Ptm, PtmConfig, PtmEngine, PtmError};
use std::collections::HashMap;

pmtx::pobject! {
    /// A list node.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub struct Node { pub value: u64, pub next: PPtr<Node> }
}

pmtx::pobject! {
    /// The root of the tests' pools.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub struct Root { pub accounts: [PPtr<u64>; 8], pub head: PPtr<Node>, pub len: u64 }
}

fn small() -> PtmConfig {
    PtmConfig::temporary().size(16 << 20)
}

#[test]
fn alloc_read_write_free_and_the_root() {
    let ptm = Ptm::<Root>::create(small()).unwrap();
    let (a, n) = ptm
        .run(|tx| {
            let a = tx.alloc(&41u64)?;
            let n = tx.alloc(&Node { value: 1, next: PPtr::null() })?;
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
    assert_eq!((v, node.value, r.accounts[0], r.head, r.len), (42, 1, a, n, 1));
    // Field access: Node's `next` is at byte 8.
    ptm.run(|tx| tx.write_at(n, 8, &a.raw())).unwrap();
    assert_eq!(ptm.run(|tx| tx.read_at::<Node, u64>(n, 8)).unwrap(), a.raw());
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
    assert!(matches!(e, PtmError::InvalidHandle { .. }) && e.to_string().contains("null"), "{e}");
    let bogus: PPtr<u64> = PPtr::from_raw(7 << 32 | 123_456);
    let e = ptm.run(|tx| tx.write(bogus, &1)).unwrap_err();
    assert!(matches!(e, PtmError::InvalidHandle { .. }), "{e}");
    // A field past the object's end.
    let a = ptm.run(|tx| tx.alloc(&1u64)).unwrap();
    let e = ptm.run(|tx| tx.write_at(a, 4, &0u64)).unwrap_err();
    assert!(matches!(e, PtmError::TooLarge(_)) && e.to_string().contains("past"), "{e}");
    // An object larger than a page.
    let mut w = ptm.engine().worker().unwrap();
    w.begin();
    let e = w.alloc(&vec![0u8; 3 << 20]).unwrap_err();
    w.abort();
    drop(w);
    assert!(matches!(e, PtmError::TooLarge(_)) && e.to_string().contains("largest object"), "{e}");
    // The root cannot be freed.
    let e = ptm.run(|tx| { let r = tx.root(); tx.free(r) }).unwrap_err();
    assert!(e.to_string().contains("root object cannot be freed"), "{e}");
    // A freed handle stays invalid once the id is reused (another generation).
    ptm.run(|tx| tx.free(a)).unwrap();
    let b = ptm.run(|tx| tx.alloc(&2u64)).unwrap();
    assert_ne!(a, b);
    assert_eq!(a.raw() & 0xffff_ffff, b.raw() & 0xffff_ffff, "the id is reused");
    assert!(ptm.run(|tx| tx.read(a)).is_err());
    assert_eq!(ptm.run(|tx| tx.read(b)).unwrap(), 2);
    // A user abort discards everything.
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

#[test]
fn a_full_pool_says_so_and_recovers_after_frees() {
    let ptm = Ptm::<Root>::create(PtmConfig::temporary().size(8 << 20)).unwrap();
    let mut handles = Vec::new();
    let err = loop {
        match ptm.run(|tx| tx.alloc(&[7u64; 100])) {
            Ok(h) => handles.push(h),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, PtmError::PoolFull { .. }), "{err}");
    assert!(err.to_string().contains("persistent memory is full"), "{err}");
    assert!(handles.len() > 1000, "{}", handles.len());
    for h in handles.drain(..) {
        ptm.run(|tx| tx.free(h)).unwrap();
    }
    // The freed space is collected and reused.
    for _ in 0..1000 {
        ptm.run(|tx| tx.alloc(&[1u64; 100])).unwrap();
    }
    ptm.check_invariants().unwrap();
}

#[test]
fn a_conflict_is_retried_and_surfaces_only_past_max_retries() {
    let mut config = small();
    config.max_retries = 3;
    let ptm = Ptm::<Root>::create(config).unwrap();
    let a = ptm.run(|tx| tx.alloc(&1u64)).unwrap();
    // Another worker holds a's write lock.
    let mut w = ptm.engine().worker().unwrap();
    w.begin();
    w.write(a.raw(), 0, &5u64.to_le_bytes()).unwrap();
    let e = ptm.run(|tx| tx.write(a, &2)).unwrap_err();
    assert_eq!(e, PtmError::Conflict { handle: a.raw(), retries: 3 });
    assert!(e.to_string().contains("retried 3 times"), "{e}");
    // Snapshot isolation: the uncommitted write is invisible.
    assert_eq!(ptm.run(|tx| tx.read(a)).unwrap(), 1);
    w.commit().unwrap();
    drop(w);
    assert_eq!(ptm.run(|tx| tx.read(a)).unwrap(), 5);
    ptm.run(|tx| tx.write(a, &6)).unwrap();
    assert_eq!(ptm.run(|tx| tx.read(a)).unwrap(), 6);
    ptm.check_invariants().unwrap();
}

#[test]
fn a_pool_file_reopens_with_its_handles() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("ptm.pool");
    let config = || small().path(&path);
    let a = {
        let ptm = Ptm::<Root>::open_or_create(config()).unwrap();
        ptm.run(|tx| {
            let a = tx.alloc(&10u64)?;
            let root = tx.root();
            tx.update(root, |r| r.accounts[3] = a)?;
            Ok(a)
        })
        .unwrap()
    };
    let ptm = Ptm::<Root>::open_or_create(config()).unwrap();
    let r = ptm.run(|tx| tx.read(tx.root())).unwrap();
    assert_eq!(r.accounts[3], a);
    assert_eq!(ptm.run(|tx| tx.read(a)).unwrap(), 10);
    ptm.run(|tx| tx.write(a, &11)).unwrap();
    ptm.check_invariants().unwrap();
    drop(ptm);
    let e = Ptm::<u64>::open(config()).err().unwrap();
    assert!(e.to_string().contains("root type"), "{e}");
}
