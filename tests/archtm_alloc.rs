//! ArchTM's allocator (§4.4, §4.5, §5.4) through the public API: size classes under churn of
//! mixed sizes, a full pool whose recycled blocks of one class serve another, frees in a full
//! pool (the tombstone reserve: topped up for a new worker, set aside again at reopening), and
//! the defragmentation policy of the background thread.

mod common;
use common::eventually;
use common::ptm_model::stat;
use pmtx::crashtest::ptm::{Lcg, Root};
use pmtx::ptm::archtm::alloc::TOMB_RESERVE;
use pmtx::ptm::{PObject, PPtr, Ptm, PtmConfig, PtmError, PtmWorker};
use std::collections::HashMap;
use std::time::Duration;

/// Objects of sizes across the classes (64 B to 4 KiB blocks) and above them (the extent
/// path), allocated, rewritten and freed at random: contents stay right and the allocator's
/// invariants hold, before and after a restart.
#[test]
fn churn_of_mixed_sizes_keeps_contents_and_the_allocator_sound() {
    let dir = common::pool_dir();
    let path = dir.path().join("churn.pool");
    let config = || {
        let mut c = PtmConfig::temporary()
            .size(32 << 20)
            .path(&path)
            .inline_background();
        c.gc_threshold = 16;
        c
    };
    let ptm = Ptm::<Root>::create(config()).unwrap();
    let sizes = [
        8usize, 24, 100, 200, 500, 1000, 2000, 4000, 4064, 6000, 9000,
    ];
    let mut live: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = Lcg(5);
    for i in 0..3000u64 {
        let pick = rng.next(10);
        if pick < 4 || live.len() < 20 {
            let size = sizes[rng.next(sizes.len() as u64) as usize];
            let bytes: Vec<u8> = (0..size).map(|k| (i as usize + k) as u8).collect();
            let h = ptm.run(|tx| tx.alloc_bytes(&bytes)).unwrap();
            live.insert(h, bytes);
        } else if pick < 7 {
            let h = *live
                .keys()
                .nth(rng.next(live.len() as u64) as usize)
                .unwrap();
            let bytes = live.get_mut(&h).unwrap();
            let at = rng.next(bytes.len() as u64) as usize;
            bytes[at] = bytes[at].wrapping_add(1);
            let b = bytes[at];
            ptm.run(|tx| tx.write_bytes(h, at, &[b])).unwrap();
        } else {
            let h = *live
                .keys()
                .nth(rng.next(live.len() as u64) as usize)
                .unwrap();
            ptm.run(|tx| tx.free(PPtr::<u8>::from_raw(h))).unwrap();
            live.remove(&h);
        }
        if i % 500 == 0 {
            ptm.check_invariants().unwrap();
        }
    }
    let check = |ptm: &Ptm<Root>| {
        for (&h, bytes) in &live {
            let mut got = vec![0u8; bytes.len()];
            ptm.run(|tx| tx.read_bytes(h, 0, &mut got)).unwrap();
            assert_eq!(&got, bytes, "object {h:#x}");
        }
        assert_eq!(stat(ptm, "live_objects"), live.len() as u64 + 1);
        ptm.check_invariants().unwrap();
    };
    check(&ptm);
    drop(ptm);
    let ptm = Ptm::<Root>::open(config()).unwrap();
    check(&ptm);
}

/// A pool filled with 64-byte blocks, all then freed, serves 4 KiB objects: the recycle list
/// of one class is not lost to the others (an allocation that finds no page returns the
/// classes' recycled blocks to the free list, where neighbours merge).
#[test]
fn a_full_pool_of_one_class_serves_another_once_freed() {
    let create = || {
        let mut c = PtmConfig::temporary().size(12 << 20).inline_background();
        c.checkpoint_every = 0;
        Ptm::<Root>::create(c).unwrap()
    };
    // How many 64-byte objects fit; then a pool filled all but 2 048 of them (a free needs a
    // block for its tombstone until the collection recycles it).
    let capacity = fill_with_small_objects(&create(), usize::MAX, 64).len();
    let ptm = create();
    let small = fill_with_small_objects(&ptm, capacity - 2048, 64);
    let data = stat(&ptm, "data_pages") * (2 << 20);
    assert!(
        capacity as u64 * 64 * 10 > data * 9,
        "{capacity} small objects in {data} bytes"
    );
    for chunk in small.chunks(256) {
        ptm.run(|tx| chunk.iter().try_for_each(|&h| tx.free(h)))
            .unwrap();
    }
    ptm.check_invariants().unwrap();
    let mut big = 0u64;
    loop {
        match ptm.run(|tx| tx.alloc_bytes(&[7u8; 4000])) {
            Ok(_) => big += 1,
            Err(PtmError::PoolFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // 4032-byte blocks: all but a few per page (the root, the slot lists' remainders).
    assert!(
        big * 4032 * 10 > data * 9,
        "only {big} objects of 4000 bytes in {data} bytes"
    );
    ptm.check_invariants().unwrap();
}

/// A pool full of 64-byte blocks still frees: each free's tombstone takes one of the thread's
/// reserved blocks (`TOMB_RESERVE`), and once collection has recycled the freed blocks the
/// frees and allocations go on; nothing leaks.
#[test]
fn a_pool_full_of_64_byte_blocks_still_frees() {
    let mut c = PtmConfig::temporary().size(12 << 20).inline_background();
    c.checkpoint_every = 0;
    let ptm = Ptm::<Root>::create(c).unwrap();
    let mut live = fill_to_the_brim(&ptm);
    assert!(live.len() > 50_000, "{} objects", live.len());
    assert_full(&ptm, "after the fill");
    // One free more than the reserve holds, in one transaction: a clear error, nothing lost.
    let reserve = TOMB_RESERVE;
    match ptm.run(|tx| live[..=reserve].iter().try_for_each(|&h| tx.free(h))) {
        Err(PtmError::PoolFull { detail, .. }) => {
            assert!(detail.contains("reserved for the tombstones"), "{detail}")
        }
        r => panic!("{} frees in a full pool gave {r:?}", reserve + 1),
    }
    ptm.check_invariants().unwrap();
    // The aborted frees gave their tombstones back to the reserve, not to the allocator: the
    // pool is still full for an allocation, and the reserve still covers the frees below.
    assert_full(&ptm, "after the aborted frees");
    // As many frees in one transaction as the reserve holds.
    let batch: Vec<_> = live.drain(..reserve).collect();
    ptm.run(|tx| batch.iter().try_for_each(|&h| tx.free(h)))
        .unwrap();
    ptm.check_invariants().unwrap();
    // Then frees one at a time, well past the reserve: each finds a recycled block.
    for h in live.drain(..1000) {
        ptm.run(|tx| tx.free(h)).unwrap();
    }
    ptm.check_invariants().unwrap();
    let again: Vec<_> = (0..500)
        .map(|i| ptm.run(|tx| tx.alloc(&(i as u64))).unwrap())
        .collect();
    for (i, h) in again.iter().enumerate() {
        assert_eq!(ptm.run(|tx| tx.read(*h)).unwrap(), i as u64);
    }
    assert_eq!(
        stat(&ptm, "live_objects"),
        (live.len() + again.len()) as u64 + 1
    );
    ptm.check_invariants().unwrap();
}

/// A worker's frees in a full pool use up its slot's reserve; a new worker on that slot tops
/// the reserve up at its first transaction (from the blocks collection recycles), before the
/// pool fills again, so it can free as many objects in one transaction as the reserve holds.
#[test]
fn a_new_worker_tops_up_the_reserve_its_slot_used() {
    let mut c = PtmConfig::temporary()
        .size(12 << 20)
        .max_threads(2)
        .inline_background();
    c.checkpoint_every = 0;
    let ptm = Ptm::<Root>::create(c).unwrap();
    // `run`'s worker keeps one slot; the engine's workers below take the other, each in turn.
    let mut live = fill_to_the_brim(&ptm);
    assert_full(&ptm, "after the fill");
    let mut first = ptm.engine().worker().unwrap();
    let batch: Vec<_> = live.drain(..TOMB_RESERVE).collect();
    free_in_one_transaction(&mut *first, &batch).expect("the slot's reserve covers the frees");
    drop(first);
    let mut second = ptm.engine().worker().unwrap();
    second.begin();
    second.commit().unwrap();
    live.extend(fill_to_the_brim(&ptm));
    assert_full(&ptm, "after the second fill");
    let batch: Vec<_> = live.drain(..TOMB_RESERVE).collect();
    free_in_one_transaction(&mut *second, &batch)
        .expect("the new worker's first transaction topped the reserve up");
    drop(second);
    ptm.check_invariants().unwrap();
}

/// A pool filled to the brim, reopened, and filled again (recovery finds free what the slots'
/// DRAM lists held) still frees on every slot, as many objects in one transaction as a reserve
/// holds: the reserves are set aside again at open, before any allocation.
#[test]
fn a_pool_reopened_full_still_frees_on_every_slot() {
    let dir = common::pool_dir();
    let path = dir.path().join("full.pool");
    let config = || {
        let mut c = PtmConfig::temporary()
            .size(12 << 20)
            .path(&path)
            .max_threads(2)
            .inline_background();
        c.checkpoint_every = 0;
        c
    };
    let mut live = fill_to_the_brim(&Ptm::<Root>::create(config()).unwrap());
    let ptm = Ptm::<Root>::open(config()).unwrap();
    ptm.check_invariants().unwrap();
    live.extend(fill_to_the_brim(&ptm));
    assert_full(&ptm, "after the fill that follows reopening");
    // First the slot that allocated nothing since the restart (the fill's takes of 64-byte
    // blocks top up the other's reserve), before any committed free gives blocks back.
    let mut other = ptm.engine().worker().unwrap();
    let batch: Vec<_> = live.drain(..TOMB_RESERVE).collect();
    free_in_one_transaction(&mut *other, &batch).expect("the idle slot's reserve covers them");
    drop(other);
    let batch: Vec<_> = live.drain(..TOMB_RESERVE).collect();
    ptm.run(|tx| batch.iter().try_for_each(|&h| tx.free(h)))
        .expect("the filling slot's reserve covers the frees");
    ptm.check_invariants().unwrap();
    // The objects kept their values (each batch's objects hold 0..64).
    for &h in live.iter().step_by(997) {
        assert!(ptm.run(|tx| tx.read(h)).unwrap() < 64);
    }
}

/// Allocates 8-byte objects (64-byte blocks), `batch` in a transaction, until the pool is full
/// or `limit` are allocated; their handles (object `i` of a batch holds `i`).
fn fill_with_small_objects(ptm: &Ptm<Root>, limit: usize, batch: usize) -> Vec<PPtr<u64>> {
    let mut small = Vec::new();
    while small.len() < limit {
        match ptm.run(|tx| {
            (0..batch)
                .map(|i| tx.alloc(&(i as u64)))
                .collect::<Result<Vec<_>, _>>()
        }) {
            Ok(hs) => small.extend(hs),
            Err(PtmError::PoolFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    small
}

/// Fills the pool with 8-byte objects until not one more fits: batches of 64, then one object
/// a transaction (an aborted batch hands its blocks back).
fn fill_to_the_brim(ptm: &Ptm<Root>) -> Vec<PPtr<u64>> {
    let mut live = fill_with_small_objects(ptm, usize::MAX, 64);
    live.extend(fill_with_small_objects(ptm, usize::MAX, 1));
    live
}

/// Asserts that an allocation of an 8-byte object fails with `PoolFull`.
fn assert_full(ptm: &Ptm<Root>, when: &str) {
    match ptm.run(|tx| tx.alloc(&7u64)) {
        Err(PtmError::PoolFull { .. }) => {}
        r => panic!("the pool should be full {when}, yet an allocation gave {r:?}"),
    }
}

/// Frees `handles` in one transaction on `w`: committed, or aborted on the first error.
fn free_in_one_transaction(w: &mut dyn PtmWorker, handles: &[PPtr<u64>]) -> Result<(), PtmError> {
    w.begin();
    match handles.iter().try_for_each(|h| w.free(h.raw())) {
        Ok(()) => w.commit(),
        Err(e) => {
            w.abort();
            Err(e)
        }
    }
}

/// Frees, in one transaction, every object of `handles` but each `n`-th.
fn free_all_but_one_in<T: PObject>(ptm: &Ptm<Root>, handles: &[PPtr<T>], n: usize) {
    ptm.run(|tx| {
        (handles.iter().enumerate())
            .filter(|(i, _)| i % n != 0)
            .try_for_each(|(_, &h)| tx.free(h))
    })
    .unwrap();
}

/// The background thread's policy: no pass while the recycled blocks of idle classes are a
/// small share of the data area (a quarter of a class's blocks freed: an eager pass would move
/// the rest, `archtm_background` shows it); a pass once they exceed a quarter of it, which
/// returns them to the free list and drains the regions below half used.
#[test]
fn the_background_pass_waits_until_idle_classes_strand_a_quarter_of_the_data_area() {
    let mut c = PtmConfig::temporary().size(16 << 20);
    c.gc_interval = Some(Duration::from_millis(1));
    c.defrag_interval = Some(Duration::from_millis(5));
    c.checkpoint_every = 0;
    assert!(!c.defrag_eager, "the default policy");
    let ptm = Ptm::<Root>::create(c).unwrap();
    // 2 048 objects of 64-byte blocks, three in four freed: about 200 KiB (with the
    // tombstones) of a class then idle, in a 2 MiB data area.
    let small: Vec<PPtr<u64>> = ptm
        .run(|tx| (0..2048u64).map(|i| tx.alloc(&i)).collect())
        .unwrap();
    free_all_but_one_in(&ptm, &small, 4);
    eventually("the collection", || {
        stat(&ptm, "recycled_class_bytes") >= 1536 * 64
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(stat(&ptm, "thread_defrag_passes"), 0, "not worthwhile");
    assert_eq!(stat(&ptm, "defrag_moved"), 0);
    // 12 288 objects of 128-byte blocks, seven in eight freed: over a megabyte recycled.
    let mut mid: Vec<PPtr<[u8; 96]>> = Vec::new();
    for b in 0..12u8 {
        let hs: Vec<PPtr<[u8; 96]>> = ptm
            .run(|tx| (0..1024).map(|_| tx.alloc(&[b; 96])).collect())
            .unwrap();
        mid.extend(hs);
    }
    let before = stat(&ptm, "used_regions_4k");
    for chunk in mid.chunks(1024) {
        free_all_but_one_in(&ptm, chunk, 8);
    }
    eventually("a worthwhile pass", || {
        stat(&ptm, "thread_defrag_passes") >= 1 && stat(&ptm, "defrag_moved") >= 1500
    });
    assert!(stat(&ptm, "defrag_released_bytes") >= 1 << 20);
    let after = stat(&ptm, "used_regions_4k");
    assert!(
        after * 3 < before,
        "regions in use: {before} before, {after} after"
    );
    for (i, &h) in small.iter().enumerate().step_by(4) {
        assert_eq!(ptm.run(|tx| tx.read(h)).unwrap(), i as u64, "moved intact");
    }
    for (i, &h) in mid.iter().enumerate().step_by(8) {
        assert_eq!(ptm.run(|tx| tx.read(h)).unwrap(), [(i / 1024) as u8; 96]);
    }
    ptm.check_invariants().unwrap();
}
