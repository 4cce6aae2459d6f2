//! Every concurrency-control protocol, on contended transfers and read-only scans through the
//! `Db` API, records its committed history; the checker (`pmtx::cc::history`) asserts it is
//! conflict-serializable (SI: that it has no anomaly SI forbids), and the bank total holds. A
//! scripted interleaving shows write skew under SI and under no serializable protocol.

use pmtx::catalog::{ColumnType, Schema, TableId};
use pmtx::cc::history::{History, HistoryError, TxnRecord};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::{EngineKind, FieldWrite, TxError};
use pmtx::pmem::PersistenceDomain;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const OBJECTS: u64 = 8;
const INITIAL: i64 = 1_000;

fn schema() -> Schema {
    // value, and the id of the transaction that wrote this version (0: loaded).
    Schema::new(
        "objs",
        &[("value", ColumnType::I64), ("writer", ColumnType::U64)],
    )
}

/// Every engine with every protocol it runs (FIR: MVTO only): (engine, protocol) pairs.
fn cases(protocols: impl IntoIterator<Item = Protocol> + Clone) -> Vec<(EngineKind, Protocol)> {
    [EngineKind::Falcon, EngineKind::Zen, EngineKind::Fir]
        .into_iter()
        .flat_map(|e| {
            protocols
                .clone()
                .into_iter()
                .filter(move |&p| e.supports(p))
                .map(move |p| (e, p))
        })
        .collect()
}

fn db(engine: EngineKind, protocol: Protocol) -> (Db, TableId) {
    // Failures name the case (stderr is shown for failing tests).
    eprintln!("cc_history: engine {engine}, protocol {protocol}");
    let mut cfg = DbConfig::temporary()
        .engine(engine)
        .protocol(protocol)
        .domain(PersistenceDomain::Eadr)
        .pool_size(32 << 20)
        .max_threads(4);
    cfg.cc_options.partitions = 4;
    let db = Db::create(cfg).unwrap();
    let t = db.create_table(schema()).unwrap();
    db.run(|tx| {
        (0..OBJECTS).try_for_each(|k| tx.insert(t, k, &[Value::I64(INITIAL), Value::U64(0)]))
    })
    .unwrap();
    (db, t)
}

/// A skewed key (θ ≈ 1: most transactions hit the first two objects).
fn hot_key(rng: &mut StdRng) -> u64 {
    let r: f64 = rng.gen();
    ((OBJECTS as f64).powf(r * r) as u64).min(OBJECTS - 1)
}

/// Runs `txns` transactions on each of two threads and returns the committed history.
fn contended_history(db: &Db, t: TableId, txns: u32) -> History {
    let protocol = db.config().protocol;
    let start = std::sync::Barrier::new(2);
    let histories: Vec<History> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|thread| {
                let start = &start;
                s.spawn(move || {
                    let mut w = db.worker().unwrap();
                    start.wait();
                    let mut rng = StdRng::seed_from_u64(0xcc + thread);
                    let mut h = History::new();
                    for n in 1..=u64::from(txns) {
                        let id = (thread + 1) << 32 | n;
                        let read_only = n % 4 == 0;
                        let (a, b) = (hot_key(&mut rng), hot_key(&mut rng));
                        let extra = rng.gen_range(0..OBJECTS);
                        let amount = rng.gen_range(1..=50i64);
                        let mut rec = TxnRecord::default();
                        let out = w.run_counted(read_only, |tx| {
                            rec = TxnRecord {
                                id,
                                ..TxnRecord::default()
                            };
                            if read_only {
                                for k in 0..OBJECTS {
                                    let r = tx.get(t, k)?;
                                    rec.reads.push((k, r.u64(1)));
                                    if k == OBJECTS / 2 {
                                        std::thread::yield_now();
                                    }
                                }
                                return Ok(());
                            }
                            let ra = tx.get(t, a)?;
                            rec.reads.push((a, ra.u64(1)));
                            let rx = tx.get(t, extra)?;
                            rec.reads.push((extra, rx.u64(1)));
                            if a == b {
                                return Ok(());
                            }
                            let rb = tx.get(t, b)?;
                            rec.reads.push((b, rb.u64(1)));
                            // Widen the window between reads and writes so the two threads'
                            // transactions overlap even on a loaded machine.
                            std::thread::yield_now();
                            if ra.i64(0) < amount {
                                return Ok(());
                            }
                            tx.update(
                                t,
                                a,
                                &[(0, Value::I64(ra.i64(0) - amount)), (1, Value::U64(id))],
                            )?;
                            tx.update(
                                t,
                                b,
                                &[(0, Value::I64(rb.i64(0) + amount)), (1, Value::U64(id))],
                            )?;
                            rec.writes.push((a, ra.u64(1)));
                            rec.writes.push((b, rb.u64(1)));
                            Ok(())
                        });
                        match out {
                            Ok(_) => h.record(rec.clone()),
                            Err(e) => panic!("{protocol}: transaction failed for good: {e}"),
                        }
                    }
                    h
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = History::new();
    for h in histories {
        all.extend(h);
    }
    all
}

#[test]
fn every_protocol_commits_serializable_histories_and_keeps_the_total() {
    for (engine, protocol) in cases(Protocol::ALL) {
        let (db, t) = db(engine, protocol);
        let history = contended_history(&db, t, 250);
        assert_eq!(history.len(), 500, "{protocol}");
        if protocol.is_serializable() {
            if let Err(e) = history.check_serializable() {
                panic!("{protocol}: {e}");
            }
        } else if let Err(e) = history.check_snapshot_isolation() {
            panic!("{protocol}: {e}");
        }
        let total: i64 = db
            .run(|tx| (0..OBJECTS).map(|k| Ok(tx.get(t, k)?.i64(0))).sum())
            .unwrap();
        // Transfers keep the total under SI as well: each one writes both rows it changes, so
        // first-committer-wins orders any two that touch the same row.
        assert_eq!(total, OBJECTS as i64 * INITIAL, "{protocol}");
        assert_eq!(db.check_structure().unwrap(), vec![OBJECTS], "{protocol}");
    }
}

#[test]
fn multi_version_read_only_transactions_never_abort() {
    for (engine, protocol) in cases(Protocol::ALL.into_iter().filter(|p| p.is_multi_version())) {
        let (db, t) = db(engine, protocol);
        std::thread::scope(|s| {
            let db = &db;
            s.spawn(move || {
                let mut w = db.worker().unwrap();
                let mut rng = StdRng::seed_from_u64(1);
                for _ in 0..400 {
                    let (a, b) = (hot_key(&mut rng), hot_key(&mut rng));
                    if a == b {
                        continue;
                    }
                    w.run(|tx| {
                        let (ra, rb) = (tx.get(t, a)?.i64(0), tx.get(t, b)?.i64(0));
                        tx.update(t, a, &[(0, Value::I64(ra - 1))])?;
                        tx.update(t, b, &[(0, Value::I64(rb + 1))])
                    })
                    .unwrap();
                }
            });
            s.spawn(move || {
                let mut w = db.worker().unwrap();
                for _ in 0..400 {
                    let out = w
                        .run_counted(true, |tx| {
                            (0..OBJECTS)
                                .map(|k| Ok(tx.get(t, k)?.i64(0)))
                                .sum::<Result<i64, TxError>>()
                        })
                        .unwrap();
                    assert_eq!(
                        out.value,
                        OBJECTS as i64 * INITIAL,
                        "{protocol}: a consistent snapshot"
                    );
                    if protocol != Protocol::Mvto {
                        // MVTO's readers wait (bounded) for an older writer in flight; the
                        // snapshot protocols never wait on a lock.
                        assert_eq!(
                            out.aborts, 0,
                            "{protocol}: read-only transactions never abort"
                        );
                    }
                }
            });
        });
    }
}

/// Two transactions each read x and y and write one of them, interleaved by hand: under SI both
/// commit (write skew); under every serializable protocol at most one does.
#[test]
fn write_skew_occurs_under_si_and_nowhere_else() {
    for (engine, protocol) in cases(Protocol::ALL) {
        let (db, t) = db(engine, protocol);
        // `Db::run` keeps its worker in a slot; the engine workers below take slots 0 and 1.
        db.release_idle_workers();
        let mut w1 = db.engine().clone().worker(0).unwrap();
        let mut w2 = db.engine().clone().worker(1).unwrap();
        let (x, y) = (0u64, 1u64);
        let mut row = [0u8; 16];
        let mut ok = [true, true];
        let mut reads: [Vec<(u64, u64)>; 2] = [Vec::new(), Vec::new()];
        w1.begin(false);
        w2.begin(false);
        for (i, w) in [&mut w1, &mut w2].into_iter().enumerate() {
            for k in [x, y] {
                if ok[i] {
                    match w.read(t, k, &mut row) {
                        Ok(()) => {
                            reads[i].push((k, u64::from_le_bytes(row[8..16].try_into().unwrap())))
                        }
                        Err(TxError::Conflict) => ok[i] = false,
                        Err(e) => panic!("{protocol}: {e}"),
                    }
                }
            }
        }
        let writer = |id: u64| id.to_le_bytes();
        for (i, (w, k)) in [(&mut w1, x), (&mut w2, y)].into_iter().enumerate() {
            if ok[i] {
                let id = writer(i as u64 + 1);
                let fw = [FieldWrite {
                    offset: 8,
                    bytes: &id,
                }];
                match w.update(t, k, &fw) {
                    Ok(()) => {}
                    Err(TxError::Conflict) => ok[i] = false,
                    Err(e) => panic!("{protocol}: {e}"),
                }
            }
        }
        for (i, w) in [&mut w1, &mut w2].into_iter().enumerate() {
            if ok[i] {
                ok[i] = w.commit().is_ok();
            } else {
                w.abort();
            }
        }
        let mut h = History::new();
        for (i, k) in [(0usize, x), (1usize, y)] {
            if ok[i] {
                h.record(TxnRecord {
                    id: i as u64 + 1,
                    reads: reads[i].clone(),
                    writes: vec![(k, 0)],
                });
            }
        }
        if protocol == Protocol::Si {
            assert_eq!(ok, [true, true], "SI admits write skew");
            assert!(matches!(
                h.check_serializable(),
                Err(HistoryError::Cycle(_))
            ));
            assert_eq!(h.check_snapshot_isolation(), Ok(()));
        } else {
            assert!(!(ok[0] && ok[1]), "{protocol} let both commit: write skew");
            assert_eq!(h.check_serializable(), Ok(()), "{protocol}");
        }
    }
}

/// One generated transaction: keys to read, keys to overwrite (read-modify-write), read-only.
#[derive(Clone, Debug)]
struct Spec {
    reads: Vec<u64>,
    writes: Vec<u64>,
    read_only: bool,
}

fn spec() -> impl proptest::strategy::Strategy<Value = Spec> {
    use proptest::prelude::*;
    (
        proptest::collection::vec(0..4u64, 0..4),
        proptest::collection::vec(0..4u64, 0..3),
        any::<bool>(),
    )
        .prop_map(|(reads, mut writes, read_only)| {
            writes.sort_unstable();
            writes.dedup();
            Spec {
                reads,
                writes: if read_only { Vec::new() } else { writes },
                read_only,
            }
        })
}

/// Runs the two threads' generated transactions and returns the committed history.
fn run_specs(db: &Db, t: TableId, threads: &[Vec<Spec>; 2]) -> History {
    let protocol = db.config().protocol;
    let start = std::sync::Barrier::new(2);
    let parts: Vec<History> = std::thread::scope(|s| {
        let handles: Vec<_> = threads
            .iter()
            .enumerate()
            .map(|(thread, specs)| {
                let start = &start;
                s.spawn(move || {
                    let mut w = db.worker().unwrap();
                    let mut h = History::new();
                    start.wait();
                    for (n, spec) in specs.iter().enumerate() {
                        let id = (thread as u64 + 1) << 32 | (n as u64 + 1);
                        let mut rec = TxnRecord::default();
                        let out = w.run_counted(spec.read_only, |tx| {
                            rec = TxnRecord {
                                id,
                                ..TxnRecord::default()
                            };
                            for &k in &spec.reads {
                                rec.reads.push((k, tx.get(t, k)?.u64(1)));
                            }
                            std::thread::yield_now();
                            for &k in &spec.writes {
                                let r = tx.get(t, k)?;
                                rec.reads.push((k, r.u64(1)));
                                tx.update(t, k, &[(1, Value::U64(id))])?;
                                rec.writes.push((k, r.u64(1)));
                            }
                            Ok(())
                        });
                        if let Err(e) = out {
                            panic!("{protocol}: transaction failed for good: {e}");
                        }
                        h.record(rec);
                    }
                    h
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = History::new();
    for h in parts {
        all.extend(h);
    }
    all
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 6, ..Default::default() })]

    /// Random transaction mixes over four rows, two threads, every protocol.
    #[test]
    fn random_mixes_are_serializable_under_every_protocol(
        a in proptest::collection::vec(spec(), 10..30),
        b in proptest::collection::vec(spec(), 10..30),
    ) {
        let threads = [a, b];
        for (engine, protocol) in cases(Protocol::ALL) {
            let (db, t) = db(engine, protocol);
            let history = run_specs(&db, t, &threads);
            let checked = if protocol.is_serializable() {
                history.check_serializable()
            } else {
                history.check_snapshot_isolation()
            };
            proptest::prop_assert!(checked.is_ok(), "{}: {:?}", protocol, checked);
        }
    }
}
