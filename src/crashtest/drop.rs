//! Crashes inside a table drop (issue 21): a run creates two tables and fills them (updating a
//! row, so the log holds entries of the table to drop; the last transaction writes a row of the
//! kept table and then one of the dropped table, so that the commit evidence of engines that
//! keep it in the last tuple written, Zen's LP bit, lies in the dropped table's space; the
//! dropped table's long values fill its chunk table, which the drop drops after it, so crashes
//! fall between the two as well); from that pool's image, the database is
//! opened and the table dropped, and power fails before each PM event of the drop in turn
//! (only the open and the drop run under the simulator for each point, not the fill); every
//! sampled crash image is recovered and checked:
//! - the dropped table is either intact (every row and long value, as committed) or gone (its
//!   name unknown, its id an error), never partly there; no hidden table outlives its table;
//! - the other table is intact;
//! - the engine's structure check passes (no leaked or doubly owned slot);
//! - the space is reusable: the table, dropped now if the crash came before its drop took
//!   effect, is created again and filled as much as before, in a pool too small to hold both.

use super::{catch, Caught, CrashTestConfig, WorkloadKind};
use crate::catalog::{ColumnType, Schema, TableId};
use crate::db::{Db, DbConfig, Value};
use crate::engine::{EngineKind, TxError};
use crate::pmem::{CrashTrigger, PersistenceDomain, Pool};

/// Rows of the table that is dropped: most of a heap page of its 1 KiB rows.
const VICTIM_ROWS: u64 = 1500;
/// Rows of the table that stays.
const KEEP_ROWS: u64 = 20;
/// The victim's id: created after the kept table (0) and its own chunk table (1).
const VICTIM_ID: TableId = 2;
/// Victim rows with a long value (two chunks each: most of a heap page of its chunk table).
const LONG_ROWS: u64 = 700;

/// The victim's long value of row `key` (empty for rows past [`LONG_ROWS`]).
fn note(key: u64) -> String {
    let len = if key < LONG_ROWS {
        crate::catalog::INLINE_CAPACITY + 2 * crate::db::CHUNK_BYTES
    } else {
        0
    };
    (0..len)
        .map(|i| (b'a' + ((key + i as u64) % 26) as u8) as char)
        .collect()
}

/// What [`run`] did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DropCrashReport {
    /// PM events of the drop (each a crash point).
    pub events: u64,
    /// Images recovered and checked.
    pub images: u64,
    /// Images where the drop had taken effect (the table gone).
    pub gone: u64,
    /// Images where it had not (the table intact).
    pub intact: u64,
}

fn victim() -> Schema {
    Schema::new(
        "victim",
        &[
            ("v", ColumnType::U64),
            ("pad", ColumnType::Bytes(1000)),
            ("note", ColumnType::Text(3000)),
        ],
    )
}

fn keep() -> Schema {
    Schema::new("keep", &[("v", ColumnType::U64)])
}

fn config(
    engine: EngineKind,
    domain: PersistenceDomain,
    fault: Option<super::InjectedFault>,
) -> DbConfig {
    let mut cfg = CrashTestConfig::new(engine, domain, WorkloadKind::Bank);
    cfg.fault = fault;
    let mut c = cfg.db_config(2);
    // FIR: blocks of a whole page (the crash config's 10-slot blocks would need 150 of them).
    c.fir_block_slots = None;
    // Room for the tables and one copy of the victim's rows and chunks, not two: a drop that
    // leaked the victim's space or its chunk table's fails the refill.
    c.pool_size = crate::db::min_pool_size(engine, c.max_threads) + 3 * crate::alloc::PAGE_SIZE;
    c
}

fn fill_victim(db: &Db, t: TableId, round: u64) -> Result<(), String> {
    for chunk in (0..VICTIM_ROWS).collect::<Vec<_>>().chunks(100) {
        db.run(|tx| {
            for &k in chunk {
                let note = note(k);
                let row = [
                    Value::U64(k + round),
                    Value::Bytes(&[1; 1000]),
                    Value::Str(&note),
                ];
                tx.insert(t, k, &row)?;
            }
            Ok(())
        })
        .map_err(|e| format!("filling the victim table: {e}"))?;
    }
    Ok(())
}

/// Creates and fills both tables.
fn load(db: &Db) -> Result<(), String> {
    let e = |e: crate::engine::DbError| e.to_string();
    let k = db.create_table(keep()).map_err(e)?;
    let t = db.create_table(victim()).map_err(e)?;
    assert_eq!(t, VICTIM_ID);
    db.run(|tx| (0..KEEP_ROWS - 1).try_for_each(|i| tx.insert(k, i, &[Value::U64(i)])))
        .map_err(e)?;
    fill_victim(db, t, 0)?;
    db.run(|tx| {
        tx.insert(k, KEEP_ROWS - 1, &[Value::U64(KEEP_ROWS - 1)])?;
        tx.update(t, 7, &[(0, Value::U64(7))])
    })
    .map_err(e)?;
    Ok(())
}

/// Checks one recovered database (see the module doc).
fn check(db: &Db) -> Result<bool, String> {
    let k = db.table("keep").ok_or("the kept table is missing")?;
    let values = db
        .run(|tx| {
            (0..KEEP_ROWS)
                .map(|i| tx.get(k, i).map(|r| r.u64(0)))
                .collect::<Result<Vec<_>, TxError>>()
        })
        .map_err(|e| format!("reading the kept table: {e}"))?;
    if values != (0..KEEP_ROWS).collect::<Vec<_>>() {
        return Err(format!("the kept table changed: {values:?}"));
    }
    let gone = match db.table("victim") {
        Some(t) => {
            let n = db
                .run(|tx| {
                    let mut n = 0u64;
                    for key in 0..VICTIM_ROWS {
                        let want = if key == 7 { 7 } else { key };
                        match tx.get(t, key) {
                            Ok(r) if r.u64(0) == want && r.get_str("note")? == note(key) => n += 1,
                            Ok(r) => {
                                return Ok(Err(format!(
                                    "victim row {key} holds {} and a note of {} bytes",
                                    r.u64(0),
                                    r.get_str("note")?.len()
                                )))
                            }
                            Err(TxError::NotFound { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(Ok(n))
                })
                .map_err(|e| format!("reading the victim table: {e}"))??;
            if n != VICTIM_ROWS {
                return Err(format!(
                    "the victim table is live with {n} of its {VICTIM_ROWS} rows"
                ));
            }
            db.check_structure()?;
            db.drop_table(t)
                .map_err(|e| format!("dropping the recovered table: {e}"))?;
            false
        }
        None => match db.run(|tx| tx.get(VICTIM_ID, 0).map(|_| ())) {
            Err(e) if e.to_string().contains("was dropped") => true,
            other => return Err(format!("the dropped table's id reads as: {other:?}")),
        },
    };
    db.check_structure()?;
    let hidden: Vec<String> = (db.engine().catalog().live_tables())
        .filter(|(_, s)| crate::catalog::bytekey::is_hidden(&s.name))
        .map(|(_, s)| s.name.clone())
        .collect();
    if !hidden.is_empty() {
        return Err(format!(
            "hidden tables outlive the dropped table: {hidden:?}"
        ));
    }
    let again = db
        .create_table(victim())
        .map_err(|e| format!("creating the table again: {e}"))?;
    fill_victim(db, again, 1).map_err(|e| format!("space not reclaimed: {e}"))?;
    db.check_structure()?;
    Ok(gone)
}

/// Crashes the drop at each of its PM events (every `step`-th when `step` > 1), recovering up to
/// `images_per_point` images of each, with the deliberate bug `fault` if given (see
/// `Fault::DropFreeBeforeTombstone`); an error names the first image that failed a check.
pub fn run(
    engine: EngineKind,
    domain: PersistenceDomain,
    images_per_point: usize,
    step: u64,
    fault: Option<super::InjectedFault>,
) -> Result<DropCrashReport, String> {
    let cfg = config(engine, domain, fault);
    let opts = || crate::pmem::PoolOptions::new(engine.layout(), domain).with_counting(false);
    let sim_of = |db: &Db| db.engine().pool().and_then(|p| p.crash_sim().cloned());
    // The loaded pool, as it is after a clean close.
    let loaded = {
        let pool =
            Pool::create_in_memory(cfg.pool_size, &opts().with_crash_sim(CrashTrigger::Never))
                .map_err(|e| e.to_string())?;
        let sim = pool.crash_sim().expect("attached").clone();
        let db = Db::create_on_pool(pool, cfg.clone()).map_err(|e| e.to_string())?;
        load(&db)?;
        let pool = db.engine().pool().expect("a pool").clone();
        drop(db);
        pool.crash_now();
        sim.crash_state().ok_or("no state")?.full_image().bytes
    };
    // Open and drop, crashing at event `trigger` (counted from the open); returns the simulator
    // and the events before the drop.
    let open_and_drop = |trigger: CrashTrigger| -> Result<
        (std::sync::Arc<crate::pmem::CrashSim>, Option<u64>),
        String,
    > {
        let pool = Pool::from_image(&loaded, &opts().with_crash_sim(trigger))
            .map_err(|e| e.to_string())?;
        let sim = pool.crash_sim().expect("attached").clone();
        let mut at_drop = None;
        match catch(|| -> Result<(), String> {
            let db = Db::open_pool(pool, cfg.clone()).map_err(|e| format!("open: {e}"))?;
            at_drop = sim_of(&db).map(|s| s.events());
            db.drop_table(VICTIM_ID).map_err(|e| format!("drop: {e}"))?;
            if let Some(p) = db.engine().pool() {
                p.crash_now();
            }
            Ok(())
        }) {
            Caught::Done(r) => r?,
            Caught::Crashed => {}
            Caught::Panicked(m) => return Err(format!("the run panicked: {m}")),
        }
        Ok((sim, at_drop))
    };
    let (sim, start) = open_and_drop(CrashTrigger::Never)?;
    let start = start.ok_or("the run never reached the drop")?;
    let end = sim.crashed_at().unwrap_or(sim.events());
    let mut report = DropCrashReport {
        events: end - start,
        ..Default::default()
    };
    for at in (start..=end).step_by(step.max(1) as usize) {
        let (sim, _) = open_and_drop(CrashTrigger::AtEvent(at))?;
        let state = sim
            .crash_state()
            .ok_or_else(|| format!("no crash at event {at}"))?;
        for (i, image) in state.images(images_per_point, at).enumerate() {
            let pool = Pool::from_image(&image.bytes, &opts())
                .map_err(|e| format!("event {at}, image {i}: not a pool: {e}"))?;
            let verdict = catch(|| -> Result<bool, String> {
                let db = Db::open_pool(pool, cfg.clone()).map_err(|e| format!("recovery: {e}"))?;
                check(&db)
            });
            match verdict {
                Caught::Done(Ok(true)) => report.gone += 1,
                Caught::Done(Ok(false)) => report.intact += 1,
                Caught::Done(Err(e)) => {
                    return Err(format!("{engine} {domain}: crash at event {at} (drop events {start}..{end}), image {i}: {e}"))
                }
                Caught::Crashed => unreachable!("no simulator on a recovered image"),
                Caught::Panicked(m) => {
                    return Err(format!("{engine} {domain}: crash at event {at}, image {i}: panic: {m}"))
                }
            }
            report.images += 1;
        }
    }
    Ok(report)
}
