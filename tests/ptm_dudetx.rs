//! The persistent-object API (`pmtx::ptm`) on DUDETx (§3, §3.6): behaviour and errors, a
//! proptest against a DRAM model with restarts, concurrent transfers, sync and async modes, the
//! perform modes (§4.2 refusal), and crash tests under the crash simulator (ADR and eADR) before
//! every PM event of an alloc/write/free workload, with and without each fault.

mod common;
use common::ptm_model::{self, op};
use pmtx::crashtest::ptm::{
    setup, state_of, sweep as sweep_all, transfer, Lcg, Node, PtmCrashConfig, Root,
};
use pmtx::engine::dudetx::ptm::locks::Detect;
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
    assert_eq!(
        a.raw() & 0xffff_ffff_ffff,
        b.raw() & 0xffff_ffff_ffff,
        "the slot is reused"
    );
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

fn sweep(cfg: PtmCrashConfig) -> Result<u64, String> {
    let r = sweep_all(&cfg).unwrap();
    match r.violations.first() {
        Some(v) => Err(v.clone()),
        None => Ok(r.points),
    }
}

/// A crash before every PM event of the alloc/write/free workload, sync commits, ADR and eADR:
/// every acknowledged transaction survives, nothing uncommitted appears, no object is leaked or
/// owned twice (`check_invariants`, live = reachable).
#[test]
fn every_crash_point_recovers_sync_under_adr_and_eadr() {
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        let mut cfg = PtmCrashConfig::dudetx(domain, DurabilityMode::Sync, None);
        cfg.steps = 15;
        let points = sweep(cfg).unwrap_or_else(|e| panic!("{e}"));
        // eADR has no flush events, so fewer points (116 at 15 steps).
        let enough = if domain == PersistenceDomain::Adr {
            150
        } else {
            100
        };
        assert!(points > enough, "{domain}: only {points} crash points");
    }
}

/// Async commits (groups of 3 combined): exactly the transactions up to the recovered durable
/// id survive, never one after a gap, and nothing reported durable is lost.
#[test]
fn every_crash_point_recovers_async_under_adr_and_eadr() {
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        let mut cfg = PtmCrashConfig::dudetx(domain, DurabilityMode::Async, None);
        cfg.steps = 15;
        let points = sweep(cfg).unwrap_or_else(|e| panic!("{e}"));
        // eADR has no flush events, so fewer points (76 at 15 steps).
        let enough = if domain == PersistenceDomain::Adr {
            80
        } else {
            60
        };
        assert!(points > enough, "{domain}: only {points} crash points");
    }
}

#[test]
fn each_dudetx_ptm_fault_is_caught() {
    for fault in DudetxPtmFault::ALL {
        if fault.lock_mode() {
            continue; // lock_mode_faults_are_caught
        }
        let domains: &[PersistenceDomain] = if fault.adr_only() {
            &[PersistenceDomain::Adr]
        } else {
            &[PersistenceDomain::Adr, PersistenceDomain::Eadr]
        };
        for &domain in domains {
            eprintln!("{fault} under {domain}: sweeping");
            let mut cfg = PtmCrashConfig::dudetx(domain, DurabilityMode::Sync, Some(fault));
            cfg.steps = 15;
            cfg.images_per_point = 8;
            let r = sweep(cfg);
            assert!(
                r.is_err(),
                "{fault} under {domain}: no violation found in {r:?} crash points"
            );
            eprintln!("{fault} under {domain}: {}", r.unwrap_err());
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// The API against a DRAM model with restarts (a power-off: the durable image, recovered),
    /// sync and async: after a restart the pool holds the model as of the recovered durable id
    /// (sync: the last commit), freed handles are refused, nothing leaked or owned twice.
    #[test]
    fn the_api_behaves_like_a_hashmap_across_restarts(
        txs in proptest::collection::vec(
            (proptest::collection::vec(op(), 1..6), proptest::bool::weighted(0.2), proptest::bool::weighted(0.15)),
            1..30,
        ),
        domain in proptest::prop_oneof![
            proptest::strategy::Just(PersistenceDomain::Adr),
            proptest::strategy::Just(PersistenceDomain::Eadr)
        ],
        asynchronous in proptest::bool::ANY,
        group in 1usize..5,
        tiny_shadow in proptest::bool::ANY,
    ) {
        let with_sim = || {
            let mut c = small().domain(domain);
            c.crash_sim = Some(CrashTrigger::Never);
            c.dudetx.group = group;
            // §3.6 paging: a one-frame shadow (the root's and the objects' pages evict each
            // other) must give the same results as a full one.
            c.dudetx.shadow_frames = usize::from(tiny_shadow);
            if asynchronous {
                c.dudetx.mode = DurabilityMode::Async;
            }
            c
        };
        let mut ptm = Ptm::<Root>::create(with_sim()).unwrap();
        let mut model: HashMap<u64, u64> = HashMap::new();
        // The model after each commit id.
        let mut by_id: Vec<(u64, HashMap<u64, u64>)> = vec![(ptm.committed_id().unwrap(), model.clone())];
        let mut freed: Vec<u64> = Vec::new();
        for (ops, abort, restart) in txs {
            let (r, next, mut new_freed) = ptm_model::run_ops(&ptm, &model, &ops, abort);
            match r {
                Ok(()) => {
                    model = next.clone();
                    freed.append(&mut new_freed);
                    by_id.push((ptm.committed_id().unwrap(), model.clone()));
                }
                Err(e) => proptest::prop_assert_eq!(e, PtmError::UserAbort),
            }
            if restart {
                let durable_before = ptm.durable_id().unwrap();
                ptm.engine().pool().crash_now();
                let sim = ptm.engine().pool().crash_sim().unwrap().clone();
                let image = sim.crash_state().unwrap().durable_image();
                drop(ptm);
                ptm = Ptm::<Root>::open_image(&image.bytes, with_sim()).unwrap();
                let d = ptm.durable_id().unwrap();
                proptest::prop_assert!(d >= durable_before);
                if !asynchronous {
                    proptest::prop_assert_eq!(d, by_id.last().unwrap().0);
                }
                // The model as of the durable id: later commits are gone, in order.
                let k = by_id.iter().rposition(|(id, _)| *id <= d).unwrap();
                by_id.truncate(k + 1);
                model = by_id[k].1.clone();
            }
            for (&h, &v) in &model {
                proptest::prop_assert_eq!(ptm.run(|tx| tx.read(PPtr::<u64>::from_raw(h))).unwrap(), v);
            }
            for &h in &freed {
                if !model.contains_key(&h) {
                    let r = ptm.run(|tx| tx.read(PPtr::<u64>::from_raw(h)));
                    proptest::prop_assert!(
                        matches!(r, Err(PtmError::InvalidHandle { .. })),
                        "freed handle {:#x} read as {:?}", h, r
                    );
                }
            }
            ptm.check_invariants().map_err(proptest::test_runner::TestCaseError::fail)?;
            let live = ptm.stats().iter().find(|s| s.0 == "live_objects").unwrap().1 as usize;
            proptest::prop_assert_eq!(live, model.len() + 1);
        }
    }
}

#[test]
fn two_threads_of_transfers_keep_the_total_in_sync_and_async_modes() {
    for mode in [DurabilityMode::Sync, DurabilityMode::Async] {
        let mut c = small();
        c.dudetx.mode = mode;
        let ptm = Ptm::<Root>::create(c).unwrap();
        setup(&ptm).unwrap();
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let ptm = &ptm;
                s.spawn(move || {
                    let mut rng = Lcg(t + 1);
                    for i in 0..1000 {
                        if i % 5 == 0 {
                            let sum: u64 = ptm
                                .run(|tx| {
                                    let r = tx.read(tx.root())?;
                                    r.accounts.iter().map(|&a| tx.read(a)).sum()
                                })
                                .unwrap();
                            assert_eq!(sum, 800, "{mode}: a transaction saw a partial transfer");
                            continue;
                        }
                        transfer(ptm, &mut rng, 30).unwrap();
                        if i % 50 == 0 {
                            let p = ptm.run(|tx| tx.alloc(&Node::default())).unwrap();
                            ptm.run(|tx| tx.free(p)).unwrap();
                        }
                    }
                });
            }
        });
        let (s, _) = state_of(&ptm).unwrap();
        assert_eq!(s.accounts.iter().sum::<u64>(), 800);
        ptm.check_invariants().unwrap();
        let d = ptm.durable_id().unwrap();
        assert_eq!(d, ptm.committed_id().unwrap(), "{mode}: drained");
        let stats: HashMap<_, _> = ptm.stats().into_iter().collect();
        assert!(stats["log_records"] > 0 && stats["log_stored_bytes"] > 0);
    }
}

/// §3.6 shadow paging: a crash before every other PM event with a one-frame shadow (pages
/// evicted and reloaded all the time, loads waiting for reproduce), sync and async, ADR and
/// eADR.
#[test]
fn every_crash_point_recovers_with_a_one_frame_shadow() {
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        for mode in [DurabilityMode::Sync, DurabilityMode::Async] {
            let mut cfg = PtmCrashConfig::dudetx(domain, mode, None);
            cfg.steps = 10;
            cfg.stride = 3;
            cfg.dudetx_shadow_frames = 1;
            let points = sweep(cfg).unwrap_or_else(|e| panic!("{e}"));
            eprintln!("{domain} {mode}: {points} crash points");
            assert!(points > 15, "{domain} {mode}: only {points} crash points");
        }
    }
}

/// §3.6: the same workload with shadows of 1, 2 and every frame (4 KiB shadow pages, and
/// whole 2 MiB heap pages) ends in the same state; the small shadows evict, reload and (async)
/// wait for reproduce before reloading a touched page; an object spanning shadow pages reads
/// and writes across their boundaries.
#[test]
fn a_small_shadow_pages_and_gives_the_same_results() {
    let mut results = Vec::new();
    for (frames, mode, page) in [
        (0, DurabilityMode::Sync, 4096),
        (1, DurabilityMode::Sync, 4096),
        (1, DurabilityMode::Async, 4096),
        (2, DurabilityMode::Async, 4096),
        (1, DurabilityMode::Async, 2 << 20),
        (3, DurabilityMode::Sync, 16384),
    ] {
        // Room for a page per size class used (the 20 000-byte object takes a sixth).
        let mut c = small().size(32 << 20);
        c.dudetx.shadow_frames = frames;
        c.dudetx.mode = mode;
        c.dudetx.shadow_page_bytes = page;
        // Inline steps (as under the crash simulator): reproduce lags deterministically, so
        // async reloads find touched pages.
        c.crash_sim = Some(CrashTrigger::Never);
        let ptm = Ptm::<Root>::create(c).unwrap();
        setup(&ptm).unwrap();
        let mut rng = Lcg(5);
        let mut moved = 0;
        for i in 0..80 {
            pmtx::crashtest::ptm::step(&ptm, i, &mut rng, &mut moved).unwrap();
        }
        // Objects of a third size class: a third page.
        let big = ptm.run(|tx| tx.alloc(&[7u8; 3000])).unwrap();
        assert_eq!(ptm.run(|tx| tx.read(big)).unwrap(), [7u8; 3000]);
        ptm.run(|tx| tx.free(big)).unwrap();
        // An object of 20 000 bytes spans five 4 KiB shadow pages: a write across a boundary
        // (the object starts 8 bytes into its slot, so offset 4088 is a page boundary).
        let pattern: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let huge = ptm.run(|tx| tx.alloc_bytes(&pattern)).unwrap();
        let mut expect = pattern.clone();
        expect[4080..4100].copy_from_slice(&[0xAB; 20]);
        ptm.run(|tx| tx.write_bytes(huge, 4080, &[0xAB; 20]))
            .unwrap();
        let got = ptm
            .run(|tx| {
                let mut b = vec![0u8; 20_000];
                tx.read_bytes(huge, 0, &mut b)?;
                Ok(b)
            })
            .unwrap();
        assert_eq!(got, expect);
        ptm.check_invariants().unwrap();
        let s: HashMap<_, _> = ptm.stats().into_iter().collect();
        if frames > 0 {
            assert!(
                s["page_evictions"] > 0 && s["page_loads"] > 0,
                "{frames} {mode}: {s:?}"
            );
            if mode == DurabilityMode::Async {
                assert!(
                    s["page_waits"] > 0,
                    "{frames}: a reload waited for reproduce: {s:?}"
                );
            }
        } else {
            assert_eq!(s["page_evictions"], 0);
        }
        results.push(state_of(&ptm).unwrap().0);
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
}

#[test]
fn a_shadow_page_size_that_is_no_power_of_two_in_range_is_refused() {
    for bytes in [0, 1000, 2048, 4 << 20] {
        let mut c = small();
        c.dudetx.shadow_page_bytes = bytes;
        let e = Ptm::<Root>::create(c).err().expect("refused");
        assert!(e.to_string().contains("shadow page size"), "{bytes}: {e}");
    }
}

#[test]
fn paging_is_refused_with_the_lock_mode() {
    let mut c = small();
    c.dudetx.shadow_frames = 1;
    c.dudetx.perform = PerformMode::Locks(Detect::OneRound);
    let e = Ptm::<Root>::create(c).err().expect("refused");
    assert!(e.to_string().contains("paging"), "{e}");
}

/// §3.3: in async mode a group combines transactions, so a word written by every one of them is
/// logged once per record: fewer combined bytes than raw.
#[test]
fn async_groups_combine_repeated_writes() {
    let mut c = small();
    c.dudetx.mode = DurabilityMode::Async;
    c.dudetx.group = 100;
    c.crash_sim = Some(CrashTrigger::Never); // inline steps: groups fill deterministically
    let ptm = Ptm::<Root>::create(c).unwrap();
    let a = ptm.run(|tx| tx.alloc(&0u64)).unwrap();
    for i in 0..500u64 {
        ptm.run(|tx| tx.write(a, &i)).unwrap();
    }
    ptm.check_invariants().unwrap();
    let s: HashMap<_, _> = ptm.stats().into_iter().collect();
    assert!(
        s["log_combined_bytes"] * 20 < s["log_raw_bytes"],
        "combination saved too little: {s:?}"
    );
    assert_eq!(ptm.run(|tx| tx.read(a)).unwrap(), 499);
}

/// §3.3 with the background persist thread: in async mode it waits for a group to fill (so
/// 500 commits make about 500 / 100 records, not one per wake-up), and never longer than the
/// group delay (a group that cannot fill is persisted once the delay has passed).
#[test]
fn the_persist_thread_fills_groups_within_the_delay() {
    let mut c = small();
    c.dudetx.mode = DurabilityMode::Async;
    c.dudetx.group = 100;
    c.dudetx.group_delay_us = 1_000_000;
    let ptm = Ptm::<Root>::create(c).unwrap();
    let a = ptm.run(|tx| tx.alloc(&0u64)).unwrap();
    let before: HashMap<_, _> = ptm.stats().into_iter().collect();
    for i in 0..500u64 {
        ptm.run(|tx| tx.write(a, &i)).unwrap();
    }
    ptm.check_invariants().unwrap();
    let s: HashMap<_, _> = ptm.stats().into_iter().collect();
    let records = s["log_records"] - before["log_records"];
    assert!(
        (5..=7).contains(&records),
        "500 commits in groups of 100 took {records} records: {s:?}"
    );
    drop(ptm);

    // A group of a million never fills: the delay (20 ms) bounds how long commits stay
    // volatile.
    let mut c = small();
    c.dudetx.mode = DurabilityMode::Async;
    c.dudetx.group = 1 << 20;
    c.dudetx.group_delay_us = 20_000;
    let ptm = Ptm::<Root>::create(c).unwrap();
    let a = ptm.run(|tx| tx.alloc(&0u64)).unwrap();
    for i in 0..10u64 {
        ptm.run(|tx| tx.write(a, &i)).unwrap();
    }
    let committed = ptm.engine().committed_id().unwrap();
    let start = std::time::Instant::now();
    while ptm.engine().durable_id().unwrap() < committed {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "the persist thread waited past its delay for a group that cannot fill"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn a_pool_file_reopens_with_its_objects() {
    let path = std::env::temp_dir().join(format!("pmtx-ptm-dudetx-{}.pool", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cfg = || small().path(&path);
    let a = {
        let ptm = Ptm::<Root>::create(cfg()).unwrap();
        setup(&ptm).unwrap();
        let a = ptm.run(|tx| tx.alloc(&77u64)).unwrap();
        ptm.run(|tx| tx.update(tx.root(), |r| r.len = a.raw()))
            .unwrap();
        a
    };
    let ptm = Ptm::<Root>::open(cfg()).unwrap();
    let r = ptm.run(|tx| tx.read(tx.root())).unwrap();
    assert_eq!(r.len, a.raw());
    assert_eq!(ptm.run(|tx| tx.read(a)).unwrap(), 77);
    ptm.check_invariants().unwrap();
    drop(ptm);
    std::fs::remove_file(&path).unwrap();
}

/// §4.2: this machine has no RTM; the HTM mode is refused with a message naming what is
/// missing, and the HTM-or-STM mode falls back to the STM and works.
#[test]
fn htm_mode_is_refused_without_rtm_and_falls_back() {
    let mut c = small();
    c.dudetx.perform = PerformMode::Htm;
    let e = Ptm::<Root>::create(c).err().expect("HTM refused");
    assert!(e.to_string().contains("RTM"), "{e}");
    if !pmtx::engine::dudetx::ptm::cpu_has_rtm() {
        assert!(e.to_string().contains("does not have"), "{e}");
    }
    let mut c = small();
    c.dudetx.perform = PerformMode::HtmOrStm;
    if pmtx::engine::dudetx::ptm::cpu_has_rtm() {
        return;
    }
    let ptm = Ptm::<Root>::create(c).unwrap();
    setup(&ptm).unwrap();
    assert_eq!(state_of(&ptm).unwrap().0.accounts, vec![100; 8]);
}

// ---- The lock-based perform mode (§5) ----

fn locked(detect: Detect, mode: DurabilityMode) -> PtmConfig {
    let mut c = small().max_threads(3);
    c.dudetx.perform = PerformMode::Locks(detect);
    c.dudetx.mode = mode;
    c
}

#[test]
fn lock_mode_runs_the_api_and_keeps_its_invariants() {
    for detect in [Detect::OneRound, Detect::TwoRound] {
        for mode in [DurabilityMode::Sync, DurabilityMode::Async] {
            let ptm = Ptm::<Root>::create(locked(detect, mode)).unwrap();
            setup(&ptm).unwrap();
            let mut rng = Lcg(3);
            let mut moved = 0;
            for i in 0..60 {
                pmtx::crashtest::ptm::step(&ptm, i, &mut rng, &mut moved).unwrap();
            }
            let (s, reachable) = state_of(&ptm).unwrap();
            assert_eq!(s.accounts.iter().sum::<u64>(), 800, "{detect:?} {mode}");
            ptm.check_invariants().unwrap();
            let live = ptm
                .stats()
                .iter()
                .find(|s| s.0 == "live_objects")
                .unwrap()
                .1;
            assert_eq!(live as usize, reachable);
            let (c, d) = (ptm.committed_id().unwrap(), ptm.durable_id().unwrap());
            assert_eq!(c, d, "{detect:?} {mode}: drained");
        }
    }
}

/// Two threads of transfers under locks (sync and async, one- and two-round detecting): no
/// transaction sees a partial transfer, the total stays, the heap equals the shadow, and a
/// restart (the durable image) recovers a consistent state.
#[test]
fn lock_mode_two_threads_keep_the_total_and_recover() {
    for detect in [Detect::OneRound, Detect::TwoRound] {
        for mode in [DurabilityMode::Sync, DurabilityMode::Async] {
            let mut c = locked(detect, mode);
            c.crash_sim = Some(CrashTrigger::Never);
            let ptm = Ptm::<Root>::create(c.clone()).unwrap();
            setup(&ptm).unwrap();
            std::thread::scope(|s| {
                for t in 0..2u64 {
                    let ptm = &ptm;
                    s.spawn(move || {
                        let mut rng = Lcg(t + 11);
                        for i in 0..400 {
                            if i % 7 == 0 {
                                let sum: u64 = ptm
                                    .run(|tx| {
                                        let r = tx.read(tx.root())?;
                                        r.accounts.iter().map(|&a| tx.read(a)).sum()
                                    })
                                    .unwrap();
                                assert_eq!(sum, 800, "a transaction saw a partial transfer");
                            } else {
                                transfer(ptm, &mut rng, 30).unwrap();
                            }
                        }
                    });
                }
            });
            assert_eq!(state_of(&ptm).unwrap().0.accounts.iter().sum::<u64>(), 800);
            // A power-off without the final drain: whatever is recovered is consistent.
            ptm.engine().pool().crash_now();
            let sim = ptm.engine().pool().crash_sim().unwrap().clone();
            let image = sim.crash_state().unwrap().durable_image();
            drop(ptm);
            let mut c2 = c.clone();
            c2.crash_sim = None;
            let ptm = Ptm::<Root>::open_image(&image.bytes, c2).unwrap();
            let (s, _) = state_of(&ptm).unwrap();
            assert_eq!(s.accounts.iter().sum::<u64>(), 800, "{detect:?} {mode}");
            ptm.check_invariants().unwrap();
            let stats: HashMap<_, _> = ptm.stats().into_iter().collect();
            assert!(stats["heap_pages"] > 0);
        }
    }
}

#[test]
fn a_lock_mode_pool_refuses_the_stm_and_reopens_under_locks() {
    let path =
        std::env::temp_dir().join(format!("pmtx-ptm-dudetx-locks-{}.pool", std::process::id()));
    let _ = std::fs::remove_file(&path);
    {
        let ptm = Ptm::<Root>::create(locked(Detect::OneRound, DurabilityMode::Sync).path(&path))
            .unwrap();
        setup(&ptm).unwrap();
    }
    let e = Ptm::<Root>::open(small().path(&path))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("lock-based"), "{e}");
    let ptm =
        Ptm::<Root>::open(locked(Detect::TwoRound, DurabilityMode::Sync).path(&path)).unwrap();
    assert_eq!(state_of(&ptm).unwrap().0.accounts, vec![100; 8]);
    transfer(&ptm, &mut Lcg(1), 50).unwrap();
    ptm.check_invariants().unwrap();
    drop(ptm);
    assert_eq!(
        "locks-two-round".parse::<PerformMode>().unwrap(),
        PerformMode::Locks(Detect::TwoRound)
    );
    assert!("lox".parse::<PerformMode>().unwrap_err().contains("locks"));
    std::fs::remove_file(&path).unwrap();
}

/// The shared crash sweep (`crashtest::ptm`) in lock mode: the workload's steps take turns on
/// two workers (two chains, so the graph has hand-offs between chains and the ring holds them
/// out of order), crashed before every `stride`-th PM event; sync: the acknowledged steps or
/// one more survive; async: the state after some step from the last reported durable to the
/// one in flight.
fn lock_sweep(
    domain: PersistenceDomain,
    mode: DurabilityMode,
    detect: Detect,
    fault: Option<DudetxPtmFault>,
    steps: u64,
    stride: u64,
) -> Result<u64, String> {
    let mut cfg = PtmCrashConfig::dudetx(domain, mode, fault);
    cfg.dudetx_perform = PerformMode::Locks(detect);
    cfg.steps = steps;
    cfg.stride = stride;
    sweep(cfg)
}

/// Crash tests of the lock mode: ADR and eADR, sync and async, one- and two-round detecting.
#[test]
fn lock_mode_every_crash_point_recovers_a_prefix() {
    use DurabilityMode::{Async, Sync};
    use PersistenceDomain::{Adr, Eadr};
    for (domain, mode, detect) in [
        (Adr, Sync, Detect::OneRound),
        (Adr, Async, Detect::TwoRound),
        (Eadr, Sync, Detect::TwoRound),
        (Eadr, Async, Detect::OneRound),
    ] {
        let points =
            lock_sweep(domain, mode, detect, None, 10, 3).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            points > 12,
            "{domain} {mode} {detect:?}: only {points} crash points"
        );
    }
}

/// The lock mode's ordering faults are caught (async mode: the ring holds chains out of
/// order there): its own (dependency list, dependency order, double-buffered watermarks) and
/// the pipeline core's, at the same ordering steps as in the STM (log write-back, durable
/// report, heap write-back, truncation).
#[test]
fn lock_mode_faults_are_caught() {
    let faults = DudetxPtmFault::ALL
        .into_iter()
        .filter(|f| f.lock_mode() || matches!(f, DudetxPtmFault::Pipeline(_)));
    for fault in faults {
        let domains: &[PersistenceDomain] = if fault.adr_only() {
            &[PersistenceDomain::Adr]
        } else {
            &[PersistenceDomain::Adr, PersistenceDomain::Eadr]
        };
        for &domain in domains {
            let r = lock_sweep(
                domain,
                DurabilityMode::Async,
                Detect::OneRound,
                Some(fault),
                12,
                1,
            );
            assert!(
                r.is_err(),
                "{fault} under {domain}: no violation in {r:?} crash points"
            );
            eprintln!("{fault} under {domain}: {}", r.unwrap_err());
        }
    }
}
