//! Zen under simulated power failures (the pmem crash simulator): crash at many PM events of a
//! run of multi-tuple transactions (transfers, plus deletes and inserts that move a token row),
//! under ADR and eADR; recover every legal crash image (sampled) and check that
//!
//! - every acknowledged commit survived (durability), and at most the one in flight was added;
//! - the state is exactly the model's after that many transactions (atomicity: no torn
//!   transaction, no resurrected deleted row, no lost insert);
//! - indexes and heap agree, and the recovered database accepts new work.
//!
//! Then each deliberate `ZenFault` must make the same sweep fail somewhere, showing that the
//! harness catches exactly the orderings Algorithm 1 depends on. A second sweep crashes during
//! recovery itself (Algorithm 2 is idempotent).

use pmtx::catalog::{ColumnType, Schema, TableId};
use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::zen::ZenFault;
use pmtx::engine::{EngineKind, TxError};
use pmtx::pmem::{CrashTrigger, PersistenceDomain, Pool, PoolOptions, SimulatedCrash};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

const POOL: u64 = 8 << 20;
const ACCOUNTS: u64 = 6;
const COUNTER: u64 = 1000;
const TOKENS: u64 = 100;
const TXNS: u64 = 24;

type Model = BTreeMap<u64, i64>;

fn config(domain: PersistenceDomain, protocol: Protocol, fault: Option<ZenFault>) -> DbConfig {
    let mut c = DbConfig::temporary()
        .engine(EngineKind::Zen)
        .protocol(protocol)
        .domain(domain)
        .pool_size(POOL)
        .max_threads(2);
    // A tiny Met-Cache, so that evictions and reloads from NVM happen during the run.
    c.cache_bytes = Some(1);
    c.cache_min_entries = 4;
    c.zen_fault = fault;
    c
}

fn schema() -> Schema {
    Schema::new("t", &[("v", ColumnType::I64)]).ordered()
}

fn initial() -> Model {
    let mut m: Model = (0..ACCOUNTS).map(|k| (k, 100)).collect();
    m.insert(COUNTER, 0);
    m.insert(TOKENS, 7);
    m
}

/// Transaction `i` on the model: a transfer between two accounts and the counter; every third
/// one also moves the token row to the next key (a delete and an insert).
fn apply(m: &mut Model, i: u64) {
    let (a, b) = (i % ACCOUNTS, (i * 5 + 1) % ACCOUNTS);
    if a != b {
        *m.get_mut(&a).unwrap() -= 3;
        *m.get_mut(&b).unwrap() += 3;
    }
    *m.get_mut(&COUNTER).unwrap() += 1;
    if i % 3 == 2 {
        let (&k, &v) = m.range(TOKENS..COUNTER).next().unwrap();
        m.remove(&k);
        m.insert(k + 1, v + 1);
    }
}

fn run_txn(db: &Db, t: TableId, i: u64) -> Result<(), pmtx::engine::DbError> {
    db.run(|tx| {
        let (a, b) = (i % ACCOUNTS, (i * 5 + 1) % ACCOUNTS);
        if a != b {
            let va = tx.get(t, a)?.i64(0);
            let vb = tx.get(t, b)?.i64(0);
            tx.update(t, a, &[(0, Value::I64(va - 3))])?;
            tx.update(t, b, &[(0, Value::I64(vb + 3))])?;
        }
        let c = tx.get(t, COUNTER)?.i64(0);
        tx.update(t, COUNTER, &[(0, Value::I64(c + 1))])?;
        if i % 3 == 2 {
            let (k, row) = tx.scan(t, TOKENS, 1)?.into_iter().next().unwrap();
            let v = row.i64(0);
            tx.delete(t, k)?;
            tx.insert(t, k + 1, &[Value::I64(v + 1)])?;
        }
        Ok::<(), TxError>(())
    })
}

fn state(db: &Db, t: TableId) -> Result<Model, String> {
    db.run(|tx| {
        Ok(tx
            .scan(t, 0, usize::MAX)?
            .into_iter()
            .map(|(k, r)| (k, r.i64(0)))
            .collect::<Model>())
    })
    .map_err(|e| format!("reading the state: {e}"))
}

/// A fresh database on a simulator pool, loaded with the initial state.
fn setup(cfg: &DbConfig) -> (Db, TableId) {
    let opts = PoolOptions::new("zen", cfg.domain.expect("config() sets the domain"))
        .with_crash_sim(CrashTrigger::Never);
    let pool = Pool::create_in_memory(POOL, &opts).unwrap();
    let db = Db::create_on_pool(pool, cfg.clone()).unwrap();
    let t = db.create_table(schema()).unwrap();
    db.run(|tx| {
        initial()
            .iter()
            .try_for_each(|(&k, &v)| tx.insert(t, k, &[Value::I64(v)]))
    })
    .unwrap();
    (db, t)
}

/// Runs the transactions with power failing before event `crash_at` of the run (None: never);
/// returns the database, its table and the number of acknowledged commits.
fn run_until_crash(cfg: &DbConfig, crash_at: Option<u64>) -> (Db, TableId, u64) {
    let (db, t) = setup(cfg);
    let sim = db.engine().pool().unwrap().crash_sim().unwrap().clone();
    if let Some(n) = crash_at {
        sim.arm(CrashTrigger::AtEvent(sim.events() + n));
    }
    let mut acked = 0;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        for i in 0..TXNS {
            run_txn(&db, t, i).unwrap();
            acked += 1;
        }
    }));
    if let Err(payload) = outcome {
        assert!(SimulatedCrash::is(payload.as_ref()), "a real panic");
    }
    if !sim.has_crashed() {
        db.engine().pool().unwrap().crash_now();
    }
    (db, t, acked)
}

/// Recovers one crash image and checks it; Err describes the first violation.
fn check_image(bytes: &[u8], cfg: &DbConfig, acked: u64) -> Result<(), String> {
    let pool = Pool::from_image(
        bytes,
        &PoolOptions::new("zen", cfg.domain.expect("config() sets the domain")),
    )
    .map_err(|e| format!("image refused: {e}"))?;
    let db = Db::open_pool(pool, cfg.clone()).map_err(|e| format!("recovery failed: {e}"))?;
    db.check_structure()?;
    let t = db.table("t").ok_or("table lost")?;
    let got = state(&db, t)?;
    let c = *got.get(&COUNTER).ok_or("counter row lost")? as u64;
    if c < acked || c > acked + 1 {
        return Err(format!(
            "{acked} commits were acknowledged but {c} survived"
        ));
    }
    let mut want = initial();
    (0..c).for_each(|i| apply(&mut want, i));
    if got != want {
        return Err(format!(
            "after {c} transactions the state is {got:?}, expected {want:?}"
        ));
    }
    // The recovered database works: one more transaction, then the model again.
    run_txn(&db, t, c).map_err(|e| format!("after recovery: {e}"))?;
    apply(&mut want, c);
    if state(&db, t)? != want {
        return Err("the first transaction after recovery went wrong".into());
    }
    db.check_structure()?;
    Ok(())
}

/// PM events of a full run, to pick crash points from.
fn run_events(cfg: &DbConfig) -> u64 {
    let (db, _, acked) = run_until_crash(cfg, None);
    assert_eq!(acked, TXNS);
    let sim = db.engine().pool().unwrap().crash_sim().unwrap().clone();
    sim.crashed_at().unwrap()
}

/// Crashes at `points` spread over the run and checks up to `images` images each; returns the
/// first failure.
fn sweep(cfg: &DbConfig, points: u64, images: usize) -> Result<u64, String> {
    let (setup_db, _) = setup(cfg);
    let setup_events = setup_db
        .engine()
        .pool()
        .unwrap()
        .crash_sim()
        .unwrap()
        .events();
    drop(setup_db);
    let total = run_events(cfg) - setup_events;
    let step = (total / points).max(1);
    let mut checked = 0;
    for n in (0..total).step_by(step as usize) {
        let (db, _, acked) = run_until_crash(cfg, Some(n));
        let sim = db.engine().pool().unwrap().crash_sim().unwrap().clone();
        let state = sim.crash_state().unwrap();
        for img in state.images(images, n) {
            check_image(&img.bytes, cfg, acked).map_err(|e| {
                format!(
                    "{} {} crash before run event {n} (image {:?}): {e}",
                    cfg.domain.expect("config() sets the domain"),
                    cfg.protocol,
                    img.prefixes
                )
            })?;
            checked += 1;
        }
    }
    Ok(checked)
}

#[test]
fn acknowledged_commits_survive_and_transactions_stay_atomic_under_adr_and_eadr() {
    for (domain, protocol) in [
        (PersistenceDomain::Adr, Protocol::Occ),
        (PersistenceDomain::Adr, Protocol::NoWait),
        (PersistenceDomain::Eadr, Protocol::Occ),
    ] {
        let checked =
            sweep(&config(domain, protocol, None), 60, 6).unwrap_or_else(|e| panic!("{e}"));
        assert!(checked >= 60, "{domain}: only {checked} images checked");
    }
}

#[test]
fn every_fault_is_caught_under_adr() {
    for fault in ZenFault::ALL {
        if pmtx::crashtest::InjectedFault::from(fault).is_drop_step() {
            continue; // crash_suite's `each_drop_ordering_fault_is_caught`
        }
        let cfg = config(PersistenceDomain::Adr, Protocol::Occ, Some(fault));
        match sweep(&cfg, 80, 12) {
            Err(e) => eprintln!("{fault}: caught: {e}"),
            Ok(n) => panic!("{fault}: {n} crash images all passed: the harness misses this bug"),
        }
    }
}

#[test]
fn a_crash_during_recovery_is_survivable() {
    // Crash mid-run, then crash again at every event of the recovery of the worst image (the
    // one with nothing pending made durable), and recover that.
    let cfg = config(PersistenceDomain::Adr, Protocol::Occ, None);
    let mut crashed_recoveries = 0;
    for n in [40u64, 95, 150, 233] {
        let (db, _, acked) = run_until_crash(&cfg, Some(n));
        let sim = db.engine().pool().unwrap().crash_sim().unwrap().clone();
        let image = sim.crash_state().unwrap().full_image();
        for k in (0..400u64).step_by(7) {
            let opts = PoolOptions::new("zen", cfg.domain.expect("config() sets the domain"))
                .with_crash_sim(CrashTrigger::AtEvent(k));
            let pool = Pool::from_image(&image.bytes, &opts).unwrap();
            let sim2 = pool.crash_sim().unwrap().clone();
            let opened = catch_unwind(AssertUnwindSafe(|| Db::open_pool(pool, cfg.clone())));
            if !sim2.has_crashed() {
                break; // recovery finished before event k
            }
            if let Ok(Ok(db2)) = opened {
                drop(db2);
            }
            crashed_recoveries += 1;
            for img in sim2.crash_state().unwrap().images(4, k) {
                check_image(&img.bytes, &cfg, acked)
                    .unwrap_or_else(|e| panic!("run event {n}, recovery event {k}: {e}"));
            }
        }
    }
    assert!(
        crashed_recoveries > 0,
        "no recovery ever crashed: the test tested nothing"
    );
}
