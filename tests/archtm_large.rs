//! ArchTM's large objects (§4.4's regular data path): objects larger than a data page holds
//! take pages of their own. Allocation, copy-on-write writes across page boundaries, aborts,
//! frees (also of the transaction's own copy), a full pool, reopening, the limit, and power
//! failures under the crash simulator (ADR and eADR) with the allocator's invariants checked
//! after every recovery (no large-object page leaked or owned twice).

use pmtx::pmem::{CrashTrigger, PersistenceDomain, SimulatedCrash};
use pmtx::ptm::archtm::layout::{large, MAX_SMALL};
use pmtx::ptm::archtm::MAX_OBJECT;
use pmtx::ptm::{PPtr, Ptm, PtmConfig, PtmError, PtmWorker};

mod common;
use common::ptm_model::stat;

/// Five MiB: a head page and two tail pages.
const BIG: usize = 5 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
        .collect()
}

fn read_all(w: &mut Box<dyn PtmWorker>, h: u64) -> Vec<u8> {
    w.begin();
    let n = w.size_of(h).unwrap();
    let mut v = vec![0u8; n];
    w.read(h, 0, &mut v).unwrap();
    w.commit().unwrap();
    v
}

#[test]
fn large_objects_allocate_write_free_and_recover() {
    let dir = common::pool_dir();
    let path = dir.path().join("large.pool");
    let config = || PtmConfig::temporary().size(40 << 20).path(&path);
    let ptm = Ptm::<u64>::create(config()).unwrap();
    let mut w = ptm.engine().worker().unwrap();
    let mut expect = pattern(BIG, 1);
    w.begin();
    let h = w.alloc(&expect).unwrap();
    w.commit().unwrap();
    assert_eq!(stat(&ptm, "large_objects"), 1);
    assert_eq!(read_all(&mut w, h), expect);
    // A copy-on-write update across the head page's end and one across a tail boundary.
    let edges = [
        large::HEAD_BYTES as usize - 10,
        (large::HEAD_BYTES + (2 << 20)) as usize - 3,
    ];
    w.begin();
    for (k, &at) in edges.iter().enumerate() {
        let bytes = [0xa0 + k as u8; 20];
        w.write(h, at, &bytes).unwrap();
        expect[at..at + 20].copy_from_slice(&bytes);
    }
    let mut piece = [0u8; 20];
    w.read(h, edges[0], &mut piece).unwrap();
    assert_eq!(piece, [0xa0; 20], "the transaction reads its own copy");
    w.commit().unwrap();
    assert_eq!(read_all(&mut w, h), expect);
    ptm.check_invariants().unwrap();
    // An aborted write leaves the object as it was and its copy's pages free.
    w.begin();
    w.write(h, 0, &[9; 64]).unwrap();
    w.abort();
    assert_eq!(read_all(&mut w, h), expect);
    ptm.check_invariants().unwrap();
    // Past the limit: a clear error; past the pool: pool full, nothing leaked.
    w.begin();
    let too_big = vec![0u8; MAX_OBJECT as usize + 1];
    match w.alloc(&too_big) {
        Err(PtmError::TooLarge(m)) => assert!(m.contains("larger than the largest"), "{m}"),
        r => panic!("{r:?}"),
    }
    drop(too_big);
    match w.alloc(&vec![1u8; 64 << 20]) {
        Err(PtmError::PoolFull { detail, .. }) => assert!(detail.contains("pages"), "{detail}"),
        r => panic!("{r:?}"),
    }
    w.abort();
    ptm.check_invariants().unwrap();
    // A large object freed in the transaction that wrote it.
    w.begin();
    let h2 = w.alloc(&pattern(MAX_SMALL as usize + 1, 2)).unwrap();
    w.commit().unwrap();
    w.begin();
    w.write(h2, 5, &[7; 8]).unwrap();
    w.free(h2).unwrap();
    w.commit().unwrap();
    w.begin();
    assert!(matches!(w.size_of(h2), Err(PtmError::InvalidHandle { .. })));
    w.commit().unwrap();
    drop(w);
    ptm.check_invariants().unwrap();
    assert_eq!(stat(&ptm, "large_objects"), 1);
    drop(ptm);
    // Recovery finds the large object from its head page.
    let ptm = Ptm::<u64>::open(config()).unwrap();
    let mut w = ptm.engine().worker().unwrap();
    assert_eq!(read_all(&mut w, h), expect);
    ptm.check_invariants().unwrap();
    w.begin();
    w.free(h).unwrap();
    w.commit().unwrap();
    drop(w);
    ptm.check_invariants().unwrap();
    assert_eq!(stat(&ptm, "large_objects"), 0);
    drop(ptm);
    let ptm = Ptm::<u64>::open(config()).unwrap();
    ptm.check_invariants().unwrap();
    assert_eq!(stat(&ptm, "large_objects"), 0);
}

/// A workload of large-object allocations, updates and frees, crashed under the simulator at
/// sampled PM events: every image recovers to the state after the last acknowledged step or
/// the one in flight, with the allocator's invariants (every large-object page owned by one
/// version) holding.
#[test]
fn power_failures_during_large_object_work_recover() {
    const SIZE: usize = MAX_SMALL as usize + 4096;
    let config = |domain, trigger| {
        let mut c = PtmConfig::temporary()
            .size(24 << 20)
            .domain(domain)
            .max_threads(2)
            .inline_background();
        c.gc_threshold = 1;
        c.crash_sim = trigger;
        c
    };
    // Step k: 0 allocates the object (value 1), odd steps write `k` at both ends, even ones
    // replace it by a fresh object of value `k` (alloc + free).
    let steps = 6u8;
    let run = |ptm: &Ptm<u64>, acked: &mut usize| -> Result<(), PtmError> {
        for k in 0..steps {
            ptm.run(|tx| {
                let root = tx.root();
                let old: u64 = tx.read(root)?;
                if k % 2 == 1 {
                    tx.write_bytes(old, 0, &[k])?;
                    tx.write_bytes(old, SIZE - 1, &[k])
                } else {
                    let fresh = tx.alloc_bytes(&vec![k + 1; SIZE])?;
                    if old != 0 {
                        tx.free(PPtr::<u8>::from_raw(old))?;
                    }
                    tx.write(root, &fresh)
                }
            })?;
            *acked += 1;
        }
        Ok(())
    };
    let state = |ptm: &Ptm<u64>| -> (u8, u8) {
        ptm.run(|tx| {
            let h: u64 = tx.read(tx.root())?;
            if h == 0 {
                return Ok((0, 0));
            }
            let (mut first, mut last) = ([0u8], [0u8]);
            tx.read_bytes(h, 0, &mut first)?;
            tx.read_bytes(h, SIZE - 1, &mut last)?;
            let (first, last) = (first[0], last[0]);
            Ok((first, last))
        })
        .unwrap()
    };
    let expected = |n: usize| -> (u8, u8) {
        if n == 0 {
            return (0, 0);
        }
        let k = (n - 1) as u8;
        if k % 2 == 1 {
            (k, k)
        } else {
            (k + 1, k + 1)
        }
    };
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        let reference = Ptm::<u64>::create(config(domain, Some(CrashTrigger::Never))).unwrap();
        let sim = reference.engine().pool().crash_sim().unwrap().clone();
        let start = sim.events();
        run(&reference, &mut 0).unwrap();
        let end = sim.events();
        drop(reference);
        let mut images = 0;
        for at in (start..end).step_by(((end - start) / 40).max(1) as usize) {
            let ptm = Ptm::<u64>::create(config(domain, Some(CrashTrigger::AtEvent(at)))).unwrap();
            let mut acked = 0;
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&ptm, &mut acked)));
            match r {
                Err(p) if !SimulatedCrash::is(p.as_ref()) => std::panic::resume_unwind(p),
                Ok(r) => r.unwrap(),
                _ => {}
            }
            let sim = ptm.engine().pool().crash_sim().unwrap().clone();
            let Some(cs) = sim.crash_state() else {
                continue;
            };
            drop(ptm);
            for img in cs.images(2, at) {
                images += 1;
                let ctx = format!("{domain} crash before event {at} after {acked} steps");
                let ptm = Ptm::<u64>::open_image(&img.bytes, config(domain, None))
                    .unwrap_or_else(|e| panic!("{ctx}: recovery failed: {e}"));
                let s = state(&ptm);
                assert!(
                    s == expected(acked) || s == expected(acked + 1),
                    "{ctx}: recovered {s:?}, expected {:?} or {:?}",
                    expected(acked),
                    expected(acked + 1)
                );
                ptm.check_invariants()
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                let live = stat(&ptm, "large_objects");
                assert_eq!(live, u64::from(s != (0, 0)), "{ctx}: large objects");
            }
        }
        assert!(images >= 40, "{domain}: {images} images");
    }
}
