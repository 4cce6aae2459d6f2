//! TATP: population, each transaction against hand-derived expectations, the mix, expected
//! failures through the harness, the population check (and that it catches corruption), and
//! `pmtx bench tatp`.

use pmtx::bench::{self, BenchConfig, TxnDriver};
use pmtx::db::{Db, DbConfig, Value};
use pmtx::engine::EngineKind;
use pmtx::workload::tatp::driver::{self, TatpDriver, TxnType};
use pmtx::workload::tatp::{self, CallForwardingRow, SubscriberData, Tatp, START_TIMES};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::HashMap;
use std::time::Duration;

const SEED: u64 = 42;

fn loaded(subscribers: u64, engine: EngineKind) -> (Db, Tatp) {
    let config = DbConfig::temporary()
        .engine(engine)
        .pool_size(64 << 20)
        .max_threads(6);
    let db = Db::create(config).unwrap();
    let tatp = tatp::load(&db, subscribers, SEED, 2, &|_| {}).unwrap();
    (db, tatp)
}

#[test]
fn the_population_follows_the_spec_and_is_reproducible() {
    let p = 3000;
    let (db, t) = loaded(p, EngineKind::Falcon);
    let report = tatp::check(&db, &t).unwrap();
    assert_eq!(report.subscribers, p);
    assert_eq!(report.call_forwarding_changed, 0);

    // Counts equal the generated population, and its shape matches the spec's averages.
    let data: Vec<SubscriberData> = (1..=p).map(|s| SubscriberData::generate(SEED, s)).collect();
    let sum = |f: fn(&SubscriberData) -> usize| data.iter().map(f).sum::<usize>() as u64;
    assert_eq!(report.access_info, sum(|d| d.access_info.len()));
    assert_eq!(report.special_facility, sum(|d| d.special_facility.len()));
    assert_eq!(report.call_forwarding, sum(|d| d.call_forwarding.len()));
    let rows = db.check_structure().unwrap();
    assert_eq!(rows[t.tables.subscriber as usize], p);
    let avg = |n: u64| n as f64 / p as f64;
    assert!((2.35..2.65).contains(&avg(report.access_info)));
    assert!((2.35..2.65).contains(&avg(report.special_facility)));
    // 1.5 call forwardings per special facility.
    let per_sf = report.call_forwarding as f64 / report.special_facility as f64;
    assert!((1.4..1.6).contains(&per_sf), "{per_sf}");
    let facilities: Vec<_> = data.iter().flat_map(|d| &d.special_facility).collect();
    let active = facilities.iter().filter(|f| f.is_active == 1).count() as f64;
    assert!((0.82..0.88).contains(&(active / facilities.len() as f64)));
    for d in &data {
        let s = &d.subscriber;
        assert_eq!(s.sub_nbr, tatp::sub_nbr(s.s_id));
        assert!(s.bits.iter().all(|&b| b <= 1) && s.hexes.iter().all(|&h| h <= 15));
        assert!(s.msc_location >= 1 && s.vlr_location >= 1);
        assert!((1..=4).contains(&d.access_info.len()));
        assert!((1..=4).contains(&d.special_facility.len()));
        let mut types: Vec<u8> = d.access_info.iter().map(|a| a.ai_type).collect();
        types.sort();
        types.dedup();
        assert_eq!(types.len(), d.access_info.len(), "distinct ai_types");
        assert!(d.access_info.iter().all(|a| a
            .data3
            .iter()
            .chain(&a.data4)
            .all(u8::is_ascii_uppercase)));
        for c in &d.call_forwarding {
            assert!(START_TIMES.contains(&c.start_time));
            assert!((c.start_time + 1..=c.start_time + 8).contains(&c.end_time));
            assert!(c.numberx.iter().all(u8::is_ascii_digit));
            assert!(d.special_facility.iter().any(|f| f.sf_type == c.sf_type));
        }
    }
    assert_eq!(tatp::sub_nbr(42), *b"000000000000042");
    // Another seed draws another population; the same seed the same one.
    assert_eq!(SubscriberData::generate(SEED, 7), data[6]);
    assert_ne!(SubscriberData::generate(SEED + 1, 7), data[6]);
    // The tables can be found again by name.
    assert_eq!(tatp::open_tables(&db).unwrap(), t.tables);
    assert!(tatp::load(&db, 0, SEED, 1, &|_| {}).is_err());
}

#[test]
fn s_ids_are_non_uniform_and_in_range() {
    let mut rng = StdRng::seed_from_u64(1);
    let p = 1000;
    let mut counts = vec![0u32; p as usize + 1];
    let draws = 200_000;
    for _ in 0..draws {
        let s = tatp::nurand_s_id(&mut rng, p);
        assert!((1..=p).contains(&s));
        counts[s as usize] += 1;
    }
    counts.remove(0);
    counts.sort_unstable();
    // Uniform would put ~10% of the draws on the hottest 10% of ids.
    let hottest: u32 = counts[counts.len() * 9 / 10..].iter().sum();
    assert!(hottest as f64 / draws as f64 > 0.13, "{hottest} of {draws}");
    assert_eq!(tatp::nurand_a(1_000_000), 65_535);
    assert_eq!(tatp::nurand_a(1_000_001), 1_048_575);
    assert_eq!(tatp::nurand_a(20_000_000), 2_097_151);
}

/// GET_NEW_DESTINATION evaluated directly on generated rows: the spec's join.
fn expected_destinations(d: &SubscriberData, sf_type: u8, start: u8, end: u8) -> Vec<[u8; 15]> {
    let Some(sf) = d.special_facility.iter().find(|f| f.sf_type == sf_type) else {
        return Vec::new();
    };
    if sf.is_active != 1 {
        return Vec::new();
    }
    let mut out: Vec<(u8, [u8; 15])> = d
        .call_forwarding
        .iter()
        .filter(|c| c.sf_type == sf_type && c.start_time <= start && end < c.end_time)
        .map(|c| (c.start_time, c.numberx))
        .collect();
    out.sort();
    out.into_iter().map(|(_, n)| n).collect()
}

#[test]
fn each_transaction_does_what_the_spec_says() {
    let p = 200;
    let (db, t) = loaded(p, EngineKind::Falcon);
    let tables = t.tables;
    let mut w = db.worker().unwrap();

    // Read-only transactions against the generated rows, over every parameter combination.
    let (mut found, mut missing) = (0, 0);
    for s_id in 1..=40 {
        let d = SubscriberData::generate(SEED, s_id);
        let r = driver::get_subscriber_data(&mut w, &tables, s_id).unwrap();
        assert!(r.committed);
        assert_eq!(r.value.as_ref(), Some(&d.subscriber));
        for ai_type in 1..=4 {
            let r = driver::get_access_data(&mut w, &tables, s_id, ai_type).unwrap();
            assert!(r.committed);
            assert_eq!(
                r.value.as_ref(),
                d.access_info.iter().find(|a| a.ai_type == ai_type)
            );
        }
        for sf_type in 1..=4 {
            for start in START_TIMES {
                for end in 1..=24 {
                    let r = driver::get_new_destination(&mut w, &tables, s_id, sf_type, start, end)
                        .unwrap();
                    assert!(r.committed);
                    let want = expected_destinations(&d, sf_type, start, end);
                    match r.value {
                        Some(got) => {
                            found += 1;
                            assert_eq!(got, want);
                        }
                        None => {
                            missing += 1;
                            assert!(want.is_empty());
                        }
                    }
                }
            }
        }
    }
    assert!(found > 0 && missing > 0);

    // UPDATE_SUBSCRIBER_DATA: both rows change, or (no such facility) neither does.
    let d = (1..=p)
        .map(|s| SubscriberData::generate(SEED, s))
        .find(|d| {
            // A facility lacking a type, and a forwarding whose facility has a free start time.
            d.special_facility.len() < 4
                && d.call_forwarding.first().is_some_and(|c| {
                    d.call_forwarding
                        .iter()
                        .filter(|o| o.sf_type == c.sf_type)
                        .count()
                        < 3
                })
        })
        .unwrap();
    let s_id = d.subscriber.s_id;
    let present = d.special_facility[0].sf_type;
    let absent = (1..=4)
        .find(|&x| d.special_facility.iter().all(|f| f.sf_type != x))
        .unwrap();
    let new_bit = 1 - d.subscriber.bits[0];
    let r = driver::update_subscriber_data(&mut w, &tables, s_id, new_bit, present, 77).unwrap();
    assert_eq!((r.committed, r.value), (true, Some(())));
    let sf_key = tatp::special_facility_key(s_id, present);
    let (bit, data_a) = db
        .run(|tx| {
            Ok((
                tx.get(tables.subscriber, s_id)?
                    .bytes_at(tatp::subscriber::BIT_1)[0],
                tx.get(tables.special_facility, sf_key)?
                    .bytes_at(tatp::special_facility::DATA_A)[0],
            ))
        })
        .unwrap();
    assert_eq!((bit, data_a), (new_bit, 77));
    let r = driver::update_subscriber_data(&mut w, &tables, s_id, 1 - new_bit, absent, 9).unwrap();
    assert_eq!((r.committed, r.value), (false, None), "rolled back");
    let sub = driver::get_subscriber_data(&mut w, &tables, s_id).unwrap();
    assert_eq!(
        sub.value.unwrap().bits[0],
        new_bit,
        "the rollback kept bit_1"
    );

    // UPDATE_LOCATION finds the subscriber by number.
    let r = driver::update_location(&mut w, &tables, &tatp::sub_nbr(s_id), 123_456).unwrap();
    assert_eq!(r.value, Some(s_id));
    let sub = driver::get_subscriber_data(&mut w, &tables, s_id).unwrap();
    assert_eq!(sub.value.unwrap().vlr_location, 123_456);

    // INSERT_CALL_FORWARDING: missing facility and existing key roll back; a new one inserts.
    let nbr = tatp::sub_nbr(s_id);
    let existing = d.call_forwarding[0].clone();
    let row = |sf_type, start_time| CallForwardingRow {
        sf_type,
        start_time,
        end_time: 20,
        numberx: *b"555000111222333",
    };
    let r = driver::insert_call_forwarding(&mut w, &tables, &nbr, &row(absent, 0)).unwrap();
    assert_eq!((r.committed, r.value), (false, None), "no such facility");
    let r = driver::insert_call_forwarding(
        &mut w,
        &tables,
        &nbr,
        &row(existing.sf_type, existing.start_time),
    )
    .unwrap();
    assert_eq!((r.committed, r.value), (false, None), "duplicate key");
    let free_start = START_TIMES
        .into_iter()
        .find(|&s| {
            !d.call_forwarding
                .iter()
                .any(|c| c.sf_type == existing.sf_type && c.start_time == s)
        })
        .expect("chosen with a free start time");
    let r =
        driver::insert_call_forwarding(&mut w, &tables, &nbr, &row(existing.sf_type, free_start))
            .unwrap();
    assert_eq!((r.committed, r.value), (true, Some(())));
    let key = tatp::call_forwarding_key(s_id, existing.sf_type, free_start);
    let stored = db
        .run(|tx| {
            Ok(tatp::decode_call_forwarding(
                &tx.get(tables.call_forwarding, key)?,
            ))
        })
        .unwrap();
    assert_eq!(stored, row(existing.sf_type, free_start));

    // DELETE_CALL_FORWARDING: deletes it once; the second time there is nothing to delete.
    let r = driver::delete_call_forwarding(&mut w, &tables, &nbr, existing.sf_type, free_start)
        .unwrap();
    assert_eq!((r.committed, r.value), (true, Some(())));
    let r = driver::delete_call_forwarding(&mut w, &tables, &nbr, existing.sf_type, free_start)
        .unwrap();
    assert_eq!((r.committed, r.value), (true, None));
    assert!(!db.run(|tx| tx.exists(tables.call_forwarding, key)).unwrap());
    drop(w);
    tatp::check(&db, &t).unwrap();
}

#[test]
fn the_mix_follows_the_standard_proportions() {
    let mut counts: HashMap<TxnType, u32> = HashMap::new();
    for roll in 0..100 {
        *counts.entry(TxnType::from_mix_roll(roll)).or_default() += 1;
    }
    for ty in TxnType::ALL {
        assert_eq!(counts[&ty], ty.mix_percent(), "{}", ty.name());
        assert_eq!(TxnType::from_name(ty.name()).unwrap(), ty);
    }
    assert_eq!(
        TxnType::ALL.iter().map(|t| t.mix_percent()).sum::<u32>(),
        100
    );
    assert_eq!(
        TxnType::from_name("Update-Location").unwrap(),
        TxnType::UpdateLocation
    );
    let err = TxnType::from_name("new_order").unwrap_err().to_string();
    assert!(err.contains("unknown TATP transaction") && err.contains("get_access_data"));

    // The driver draws types in those proportions.
    let (db, t) = loaded(500, EngineKind::Volatile);
    let mut d = TatpDriver::new(&db, t, 5, None).unwrap();
    let mut drawn: HashMap<TxnType, u32> = HashMap::new();
    let n = 50_000;
    for _ in 0..n {
        *drawn.entry(d.next_type()).or_default() += 1;
    }
    for ty in TxnType::ALL {
        let share = drawn[&ty] as f64 / n as f64 * 100.0;
        assert!(
            (share - ty.mix_percent() as f64).abs() < 1.0,
            "{}: {share}%",
            ty.name()
        );
    }
}

#[test]
fn a_run_counts_expected_failures_per_type_and_keeps_the_invariants() {
    let (db, t) = loaded(2000, EngineKind::Falcon);
    let config = BenchConfig {
        threads: 2,
        warmup: Duration::from_millis(20),
        duration: Duration::from_millis(400),
        txn_kinds: driver::kind_names(None)
            .into_iter()
            .map(String::from)
            .collect(),
    };
    let result = bench::run(&config, |thread| {
        TatpDriver::new(&db, t, 100 + thread as u64, None)
            .map(|d| Box::new(d) as Box<dyn TxnDriver>)
    })
    .unwrap();
    assert!(result.committed > 1000, "{} committed", result.committed);
    assert!(result.expected_failures > 0);
    for (ty, kind) in TxnType::ALL.iter().zip(&result.per_kind) {
        assert_eq!(kind.name, ty.name());
        let outcomes = (kind.committed + kind.user_aborted) as f64;
        assert!(outcomes > 0.0, "{} never ran", ty.name());
        assert!(
            (kind.mix_share * 100.0 - ty.mix_percent() as f64).abs() < 2.0,
            "{} share {}",
            ty.name(),
            kind.mix_share
        );
        if ty.read_only() {
            assert_eq!(kind.user_aborted, 0, "{} only commits", ty.name());
        }
        match ty {
            TxnType::GetSubscriberData | TxnType::UpdateLocation => {
                assert_eq!(kind.expected_failures, 0, "{} always succeeds", ty.name())
            }
            // Enough samples to compare with the spec's 62.5 % success.
            TxnType::GetAccessData => assert!(
                (kind.fail_rate - 0.375).abs() < 0.05,
                "get_access_data fails {}",
                kind.fail_rate
            ),
            _ => assert!(kind.expected_failures > 0, "{} never failed", ty.name()),
        }
        if matches!(
            ty,
            TxnType::UpdateSubscriberData | TxnType::InsertCallForwarding
        ) {
            // Their failures roll back.
            assert_eq!(kind.user_aborted, kind.expected_failures, "{}", ty.name());
        }
    }
    let report = tatp::check(&db, &t).unwrap();
    assert!(
        report.call_forwarding_changed > 0,
        "the run changed forwardings"
    );

    // One type only: the run has that single kind.
    let only = Some(TxnType::InsertCallForwarding);
    let config = BenchConfig {
        threads: 1,
        txn_kinds: driver::kind_names(only)
            .into_iter()
            .map(String::from)
            .collect(),
        ..config
    };
    let result = bench::run(&config, |_| {
        TatpDriver::new(&db, t, 9, only).map(|d| Box::new(d) as Box<dyn TxnDriver>)
    })
    .unwrap();
    assert_eq!(result.per_kind.len(), 1);
    assert!(result.per_kind[0].expected_failures > 0);
    tatp::check(&db, &t).unwrap();
}

#[test]
fn the_check_catches_a_broken_population() {
    let (db, t) = loaded(300, EngineKind::Falcon);
    let tables = t.tables;
    tatp::check(&db, &t).unwrap();
    // A forwarding whose facility is gone violates the foreign key.
    let d = (1..=300)
        .map(|s| SubscriberData::generate(SEED, s))
        .find(|d| !d.call_forwarding.is_empty())
        .unwrap();
    let s_id = d.subscriber.s_id;
    let sf_type = d.call_forwarding[0].sf_type;
    db.run(|tx| {
        tx.delete(
            tables.special_facility,
            tatp::special_facility_key(s_id, sf_type),
        )
    })
    .unwrap();
    let err = tatp::check(&db, &t).unwrap_err().to_string();
    assert!(err.contains("TATP check failed"), "{err}");
    assert!(
        err.contains("special_facility") || err.contains("no special facility"),
        "{err}"
    );

    // A changed access_info row (no transaction writes one).
    let (db, t) = loaded(300, EngineKind::Falcon);
    let d = SubscriberData::generate(SEED, 5);
    let key = tatp::access_info_key(5, d.access_info[0].ai_type);
    let data1 = d.access_info[0].data1.wrapping_add(1);
    db.run(|tx| {
        tx.update(
            t.tables.access_info,
            key,
            &[(tatp::access_info::DATA1, Value::Bytes(&[data1]))],
        )
    })
    .unwrap();
    let err = tatp::check(&db, &t).unwrap_err().to_string();
    assert!(err.contains("access_info (5,"), "{err}");

    // A row under a key no subscriber owns.
    let (db, t) = loaded(300, EngineKind::Falcon);
    db.run(|tx| {
        tatp::insert_call_forwarding_row(
            tx,
            &t.tables,
            301,
            &CallForwardingRow {
                sf_type: 1,
                start_time: 0,
                end_time: 3,
                numberx: *b"000000000000001",
            },
        )
    })
    .unwrap();
    let err = tatp::check(&db, &t).unwrap_err().to_string();
    assert!(err.contains("table call_forwarding holds"), "{err}");
}

fn pmtx(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bench_tatp_runs_checks_and_writes_per_type_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tatp.json");
    let out = pmtx(&[
        "bench",
        "tatp",
        "--subscribers",
        "1500",
        "--engine",
        "falcon",
        "--compare-volatile",
        "--threads",
        "1,2",
        "--duration",
        "0.2",
        "--warmup",
        "0.05",
        "--check",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stderr.matches("TATP check passed").count(), 4, "{stderr}");
    assert!(stdout.contains("fail%") && stdout.contains("get_new_destination"));
    let reports: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let reports = reports.as_array().unwrap();
    assert_eq!(reports.len(), 4, "2 engines × 2 thread counts");
    for r in reports {
        assert_eq!(r["workload"], "tatp");
        assert_eq!(r["params"]["subscribers"], 1500);
        assert!(r["ratio_to_volatile"].is_f64());
        assert!(!r["latency_cdf_us"].as_array().unwrap().is_empty());
        let kinds = r["per_kind"].as_array().unwrap();
        assert_eq!(kinds.len(), 7);
        assert!(kinds[1]["fail_rate"].as_f64().unwrap() > 0.0);
    }

    let out = pmtx(&[
        "bench",
        "tatp",
        "--subscribers",
        "500",
        "--duration",
        "0.1",
        "--warmup",
        "0",
        "--only",
        "delete-call-forwarding",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("tatp-delete_call_forwarding") && stdout.contains("fail%"));

    let out = pmtx(&["bench", "tatp", "--subscribers", "500", "--only", "payment"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown TATP transaction 'payment'"));
    let out = pmtx(&["bench", "tatp", "--subscribers", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--subscribers"));
}
