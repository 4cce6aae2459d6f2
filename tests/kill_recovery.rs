//! Real crashes: a `pmtx bench bank` child writing a /dev/shm pool is killed with SIGKILL at a
//! random moment; the pool must reopen, recover, keep the bank invariant and accept new work.
//! A SIGKILL loses no store that reached the shared mapping, so this is an eADR crash (Falcon §6.5).

use pmtx::cc::Protocol;
use pmtx::db::{Db, DbConfig};
use pmtx::engine::{DbError, EngineKind};
use pmtx::index::IndexPlacement;
use pmtx::pmem::PersistenceDomain;
use pmtx::pmem::PoolError;
use pmtx::workload::bank;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

const ACCOUNTS: u64 = 200;

fn kill_and_recover(engine: EngineKind, protocol: Protocol, domain: PersistenceDomain, kills: u64) {
    kill_and_recover_with(engine, protocol, domain, IndexPlacement::Dram, kills)
}

/// The kills of [`kill_and_recover`], the bench's tables' indexes placed by `index`. With PM
/// indexes (issue 17) every recovery that finds the tables must scan no heap page: the heap
/// is left to the lazy background sweep.
fn kill_and_recover_with(
    engine: EngineKind,
    protocol: Protocol,
    domain: PersistenceDomain,
    index: IndexPlacement,
    kills: u64,
) {
    let dir = common::pool_dir();
    let mut mid_run = 0;
    for round in 0..kills {
        let path = dir.path().join(format!("bank-{round}.pool"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_pmtx"))
            .args([
                "bench",
                "bank",
                "--accounts",
                &ACCOUNTS.to_string(),
                "--duration",
                "60",
                "--warmup",
                "0",
            ])
            .args([
                "--threads",
                "2",
                "--check",
                "false",
                "--engine",
                engine.name(),
                "--cc",
                protocol.name(),
            ])
            .args([
                "--index",
                index.as_str(),
                "--domain",
                domain.name(),
                "--pool",
            ])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pmtx");
        // Time is counted from the moment the pool file appears, so that a slow start on a loaded
        // machine does not turn every kill into a kill during creation. From just after that
        // (possibly mid-creation) to well into the transfers.
        let started = std::time::Instant::now();
        while !path.exists() && started.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let delay_ms = 20 + (round * 7919 + 13) % 700;
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
        if !path.exists() {
            continue; // killed before the pool file existed
        }
        let config = DbConfig::temporary()
            .engine(engine)
            .protocol(protocol)
            .domain(domain)
            .path(&path)
            .max_threads(3);
        let db = match Db::open(config) {
            Ok(db) => db,
            // Killed before the header was complete (the magic is written last): refused cleanly,
            // whenever that was.
            Err(e @ DbError::Pool(PoolError::NotAPool { .. } | PoolError::Truncated { .. })) => {
                eprintln!("round {round} ({delay_ms} ms): refused an unfinished pool: {e}");
                continue;
            }
            // Killed while the engine metadata was being created: refused cleanly.
            Err(e) if delay_ms < 200 => {
                eprintln!("round {round} ({delay_ms} ms): refused an unfinished pool: {e}");
                continue;
            }
            Err(e) => panic!(
                "{engine} {protocol} {domain}: round {round} ({delay_ms} ms): cannot reopen: {e}"
            ),
        };
        bank::check(&db, ACCOUNTS)
            .unwrap_or_else(|e| panic!("{engine} {protocol} {domain} round {round}: {e}"));
        if index == IndexPlacement::Pm && db.table("bank_accounts").is_some() {
            let report = db
                .recovery_report()
                .expect("a reopened pool has a recovery report");
            let fact = |name: &str| report.facts.iter().find(|(n, _)| n == name).map(|f| f.1);
            assert_eq!(
                fact("heap pages scanned at recovery"),
                Some(0),
                "{engine} {protocol} {domain} round {round}: {:?}",
                report.facts
            );
        }
        // Liveness: the recovered database takes new transfers and still holds the invariant.
        if let Some(table) = db.table("bank_accounts") {
            if db.check_structure().unwrap()[table as usize] == ACCOUNTS {
                let done: u64 = db
                    .run(|tx| (0..ACCOUNTS).map(|k| Ok(tx.get(table, k)?.u64(1))).sum())
                    .unwrap();
                if done > 0 {
                    mid_run += 1;
                }
                let mut w = db.worker().unwrap();
                let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(round);
                for _ in 0..200 {
                    bank::transfer(&mut w, table, ACCOUNTS, &mut rng).unwrap();
                }
                drop(w);
                bank::check(&db, ACCOUNTS).unwrap();
            }
        }
    }
    assert!(
        mid_run > 0,
        "{engine}: no kill landed while transfers were running"
    );
}

#[test]
fn sigkill_falcon_occ_eadr() {
    kill_and_recover(
        EngineKind::Falcon,
        Protocol::Occ,
        PersistenceDomain::Eadr,
        6,
    );
}

#[test]
fn sigkill_falcon_no_wait_adr() {
    kill_and_recover(
        EngineKind::Falcon,
        Protocol::NoWait,
        PersistenceDomain::Adr,
        4,
    );
}

#[test]
fn sigkill_inp_and_allflush() {
    kill_and_recover(EngineKind::Inp, Protocol::Occ, PersistenceDomain::Eadr, 3);
    kill_and_recover(
        EngineKind::FalconAllflush,
        Protocol::NoWait,
        PersistenceDomain::Eadr,
        3,
    );
}

#[test]
fn sigkill_zen_occ_eadr_and_no_wait_adr() {
    kill_and_recover(EngineKind::Zen, Protocol::Occ, PersistenceDomain::Eadr, 5);
    kill_and_recover(EngineKind::Zen, Protocol::NoWait, PersistenceDomain::Adr, 3);
}

/// Issue 17: `pmtx bench bank --index pm` killed mid-run, under eADR and ADR: recovery scans no
/// heap page, and the bank invariant, the structure check (indexes against the rows, after the
/// lazy sweep) and new transfers pass.
#[test]
fn sigkill_falcon_pm_index_eadr_and_adr() {
    kill_and_recover_with(
        EngineKind::Falcon,
        Protocol::Occ,
        PersistenceDomain::Eadr,
        IndexPlacement::Pm,
        5,
    );
    kill_and_recover_with(
        EngineKind::Falcon,
        Protocol::NoWait,
        PersistenceDomain::Adr,
        IndexPlacement::Pm,
        4,
    );
}
