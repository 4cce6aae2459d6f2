//! TATP on the key-value store over the persistent-object API ([`ptm_kv`](super::ptm_kv)), as
//! ArchTM §6.2 runs it on PMEMKV: the four tables of the TATP description (the population,
//! keys and parameter distributions of [`tatp`](super::tatp), reused), plus a `sub_nbr` table
//! standing in for the secondary index (its key is the 15 digits read as a decimal number, its
//! record the `s_id`), and all seven transactions in the standard mix
//! ([`TxnType`]: §6.2 names three read-only and three read-write ones; the seventh,
//! DELETE_CALL_FORWARDING, is part of the mix the issue asks for).
//!
//! Expected failures are the specification's: a lookup finding nothing commits;
//! UPDATE_SUBSCRIBER_DATA on a missing special facility and INSERT_CALL_FORWARDING on a
//! missing facility or an existing key roll back.

use super::ptm_kv::{all_keys, KvRoot, Table};
use super::tatp::driver::TxnType;
use super::tatp::{
    access_info_key, call_forwarding_key, digits, nurand_s_id, special_facility_key, sub_nbr,
    CallForwardingRow, CheckReport, SubscriberData, SubscriberRow, START_TIMES, SUB_NBR_LEN,
};
use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::ptm::{PObject, PTx, PtmError, PtmRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};

/// A `subscriber` row: the table engines' row type, a persistent object too.
pub type Subscriber = SubscriberRow;

crate::pobject! {
    /// An `access_info` row (`s_id`, `ai_type` in the key).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct AccessInfo {
        /// `data1`.
        pub data1: u8,
        /// `data2`.
        pub data2: u8,
        /// `data3`.
        pub data3: [u8; 3],
        /// `data4`.
        pub data4: [u8; 5],
    }
}

crate::pobject! {
    /// A `special_facility` row (`s_id`, `sf_type` in the key).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct SpecialFacility {
        /// `is_active`.
        pub is_active: u8,
        /// `error_cntrl`.
        pub error_cntrl: u8,
        /// `data_a`.
        pub data_a: u8,
        /// `data_b`.
        pub data_b: [u8; 5],
    }
}

crate::pobject! {
    /// A `call_forwarding` row (`s_id`, `sf_type`, `start_time` in the key).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct CallForwarding {
        /// `end_time`.
        pub end_time: u8,
        /// `numberx`.
        pub numberx: [u8; SUB_NBR_LEN],
    }
}

/// The `sub_nbr` table's key: the 15 digits as a number (a bijection on digit strings).
pub fn sub_nbr_key(nbr: &[u8; SUB_NBR_LEN]) -> u64 {
    nbr.iter()
        .fold(0u64, |k, &d| k * 10 + u64::from(d.wrapping_sub(b'0') % 10))
}

/// Meta word of the root: the subscriber count, and the population's seed.
const META_SUBSCRIBERS: usize = 0;
const META_SEED: usize = 1;

/// A TATP database on the key-value store.
pub struct TatpKv {
    /// `subscriber`.
    pub subscriber: Table<Subscriber>,
    /// `sub_nbr` → `s_id`.
    pub by_sub_nbr: Table<u64>,
    /// `access_info`.
    pub access_info: Table<AccessInfo>,
    /// `special_facility`.
    pub special_facility: Table<SpecialFacility>,
    /// `call_forwarding`.
    pub call_forwarding: Table<CallForwarding>,
    /// Subscribers (`s_id` 1..=P).
    pub subscribers: u64,
    /// The population's seed.
    pub seed: u64,
}

impl TatpKv {
    /// Creates the tables and loads `subscribers` subscribers drawn from `seed` (the rows
    /// [`SubscriberData::generate`] gives), 16 per transaction.
    pub fn load(
        ptm: &dyn PtmRunner<KvRoot>,
        subscribers: u64,
        seed: u64,
    ) -> Result<TatpKv, PtmError> {
        if subscribers == 0 || subscribers > 1 << 40 {
            return Err(PtmError::Pool(format!(
                "{subscribers} subscribers: TATP needs 1..=2^40"
            )));
        }
        let p = subscribers;
        ptm.run(|tx| {
            let root = tx.root();
            tx.update(root, |r| {
                r.meta[META_SUBSCRIBERS] = p;
                r.meta[META_SEED] = seed;
            })
        })?;
        // About 2 rows per bucket (2.5 access_info, 2.5 special_facility and 3.75
        // call_forwarding rows per subscriber).
        let db = TatpKv {
            subscriber: Table::create(ptm, 0, p.div_ceil(2))?,
            by_sub_nbr: Table::create(ptm, 1, p.div_ceil(2))?,
            access_info: Table::create(ptm, 2, p * 5 / 4 + 1)?,
            special_facility: Table::create(ptm, 3, p * 5 / 4 + 1)?,
            call_forwarding: Table::create(ptm, 4, p * 2 + 1)?,
            subscribers: p,
            seed,
        };
        let mut next = 1;
        while next <= p {
            let end = (next + 16).min(p + 1);
            let batch: Vec<SubscriberData> = (next..end)
                .map(|s| SubscriberData::generate(seed, s))
                .collect();
            ptm.run(|tx| batch.iter().try_for_each(|d| db.insert(tx, d)))?;
            next = end;
        }
        Ok(db)
    }

    fn insert(&self, tx: &mut PTx<'_, KvRoot>, d: &SubscriberData) -> Result<(), PtmError> {
        let s_id = d.subscriber.s_id;
        self.subscriber.insert_new(tx, s_id, &d.subscriber)?;
        self.by_sub_nbr
            .insert_new(tx, sub_nbr_key(&d.subscriber.sub_nbr), &s_id)?;
        for a in &d.access_info {
            self.access_info.insert_new(
                tx,
                access_info_key(s_id, a.ai_type),
                &AccessInfo {
                    data1: a.data1,
                    data2: a.data2,
                    data3: a.data3,
                    data4: a.data4,
                },
            )?;
        }
        for f in &d.special_facility {
            self.special_facility.insert_new(
                tx,
                special_facility_key(s_id, f.sf_type),
                &SpecialFacility {
                    is_active: f.is_active,
                    error_cntrl: f.error_cntrl,
                    data_a: f.data_a,
                    data_b: f.data_b,
                },
            )?;
        }
        for c in &d.call_forwarding {
            self.call_forwarding.insert_new(
                tx,
                call_forwarding_key(s_id, c.sf_type, c.start_time),
                &CallForwarding {
                    end_time: c.end_time,
                    numberx: c.numberx,
                },
            )?;
        }
        Ok(())
    }

    /// Opens the tables of a loaded database.
    pub fn open(ptm: &dyn PtmRunner<KvRoot>) -> Result<TatpKv, PtmError> {
        ptm.run(|tx| {
            let r = tx.read(tx.root())?;
            Ok(TatpKv {
                subscriber: Table::open(tx, 0)?,
                by_sub_nbr: Table::open(tx, 1)?,
                access_info: Table::open(tx, 2)?,
                special_facility: Table::open(tx, 3)?,
                call_forwarding: Table::open(tx, 4)?,
                subscribers: r.meta[META_SUBSCRIBERS],
                seed: r.meta[META_SEED],
            })
        })
    }

    /// Runs one transaction of type `ty` with parameters from `rng` (spec §3, the parameter
    /// distributions of [`tatp::driver`](super::tatp::driver)). Returns `(found, record bytes
    /// put)`: `found` false is an expected failure (committed for lookups and the delete);
    /// an expected failure that rolls back returns [`PtmError::UserAbort`].
    pub fn run_type(
        &self,
        tx: &mut PTx<'_, KvRoot>,
        ty: TxnType,
        p: &Params,
    ) -> Result<(bool, u64), PtmError> {
        let s_id = p.s_id;
        match ty {
            TxnType::GetSubscriberData => Ok((self.subscriber.get(tx, s_id)?.is_some(), 0)),
            TxnType::GetNewDestination => {
                let sf = self
                    .special_facility
                    .get(tx, special_facility_key(s_id, p.sf_type))?;
                if !sf.is_some_and(|f| f.is_active == 1) {
                    return Ok((false, 0));
                }
                for start in START_TIMES.into_iter().filter(|&s| s <= p.start_time) {
                    let key = call_forwarding_key(s_id, p.sf_type, start);
                    if let Some(cf) = self.call_forwarding.get(tx, key)? {
                        if p.end_time < cf.end_time {
                            return Ok((true, 0));
                        }
                    }
                }
                Ok((false, 0))
            }
            TxnType::GetAccessData => Ok((
                self.access_info
                    .get(tx, access_info_key(s_id, p.ai_type))?
                    .is_some(),
                0,
            )),
            TxnType::UpdateSubscriberData => {
                let mut s = self.subscriber.get(tx, s_id)?.ok_or_else(|| lost(s_id))?;
                s.bits[0] = p.bit;
                self.subscriber.put(tx, s_id, &s)?;
                let fkey = special_facility_key(s_id, p.sf_type);
                let Some(mut f) = self.special_facility.get(tx, fkey)? else {
                    return tx.abort();
                };
                f.data_a = p.data_a;
                self.special_facility.put(tx, fkey, &f)?;
                Ok((true, (Subscriber::SIZE + SpecialFacility::SIZE) as u64))
            }
            TxnType::UpdateLocation => {
                let id = self.by_number(tx, s_id)?;
                let mut s = self.subscriber.get(tx, id)?.ok_or_else(|| lost(id))?;
                s.vlr_location = p.vlr;
                self.subscriber.put(tx, id, &s)?;
                Ok((true, Subscriber::SIZE as u64))
            }
            TxnType::InsertCallForwarding => {
                let id = self.by_number(tx, s_id)?;
                if self
                    .special_facility
                    .get(tx, special_facility_key(id, p.sf_type))?
                    .is_none()
                {
                    return tx.abort();
                }
                let row = CallForwarding {
                    end_time: p.end_time,
                    numberx: p.numberx,
                };
                let key = call_forwarding_key(id, p.sf_type, p.start_time);
                if !self.call_forwarding.insert(tx, key, &row)? {
                    return tx.abort();
                }
                Ok((true, CallForwarding::SIZE as u64))
            }
            TxnType::DeleteCallForwarding => {
                let id = self.by_number(tx, s_id)?;
                let key = call_forwarding_key(id, p.sf_type, p.start_time);
                Ok((self.call_forwarding.delete(tx, key)?, 0))
            }
        }
    }

    /// The `s_id` of subscriber `s_id`'s number, through the `sub_nbr` table.
    fn by_number(&self, tx: &mut PTx<'_, KvRoot>, s_id: u64) -> Result<u64, PtmError> {
        self.by_sub_nbr
            .get(tx, sub_nbr_key(&sub_nbr(s_id)))?
            .ok_or_else(|| lost(s_id))
    }
}

fn lost(s_id: u64) -> PtmError {
    PtmError::Pool(format!("TATP: subscriber {s_id} is missing"))
}

/// A transaction's parameters (spec §3; those a type does not use are ignored).
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// `s_id` (NURand).
    pub s_id: u64,
    /// `sf_type` 1–4.
    pub sf_type: u8,
    /// `ai_type` 1–4.
    pub ai_type: u8,
    /// `start_time` from {0, 8, 16}.
    pub start_time: u8,
    /// `end_time` 1–24.
    pub end_time: u8,
    /// `bit_1`.
    pub bit: u8,
    /// `data_a`.
    pub data_a: u8,
    /// `vlr_location`.
    pub vlr: u32,
    /// `numberx`.
    pub numberx: [u8; SUB_NBR_LEN],
}

impl Params {
    /// Draws every parameter.
    pub fn draw(rng: &mut StdRng, subscribers: u64) -> Params {
        Params {
            s_id: nurand_s_id(rng, subscribers),
            sf_type: rng.gen_range(1..=4),
            ai_type: rng.gen_range(1..=4),
            start_time: START_TIMES[rng.gen_range(0..3)],
            end_time: rng.gen_range(1..=24),
            bit: rng.gen_range(0..=1),
            data_a: rng.gen(),
            vlr: rng.gen_range(1..=u32::MAX),
            numberx: digits(rng),
        }
    }
}

/// Checks the database after any number of transactions (and after a restart), counting the
/// rows as [`tatp::check`](super::tatp::check) does (`call_forwarding_changed`: rows that are
/// not the loaded ones), as
/// [`tatp::check`](super::tatp::check) does for the table engines: every subscriber is its
/// loaded row except `bit_1` (0/1) and `vlr_location` (non-zero), and the `sub_nbr` table finds
/// it; `access_info` rows are the loaded ones; `special_facility` rows the loaded ones except
/// `data_a`; every `call_forwarding` row belongs to an existing facility with `end_time` in
/// 1..=24 and a digit `numberx`; and no table holds a row outside those keys.
pub fn check(ptm: &dyn PtmRunner<KvRoot>, db: &TatpKv) -> Result<CheckReport, String> {
    let e = |e: PtmError| e.to_string();
    let mut rep = CheckReport::default();
    let mut s_id = 1;
    while s_id <= db.subscribers {
        let end = (s_id + 64).min(db.subscribers + 1);
        let (part, problem) = ptm
            .run(|tx| {
                let mut part = CheckReport::default();
                for id in s_id..end {
                    if let Some(p) = check_one(tx, db, id, &mut part)? {
                        return Ok((part, Some(p)));
                    }
                }
                Ok((part, None))
            })
            .map_err(e)?;
        if let Some(p) = problem {
            return Err(p);
        }
        rep.subscribers += part.subscribers;
        rep.access_info += part.access_info;
        rep.special_facility += part.special_facility;
        rep.call_forwarding += part.call_forwarding;
        rep.call_forwarding_changed += part.call_forwarding_changed;
        s_id = end;
    }
    for (name, n, want) in [
        (
            "subscriber",
            all_keys(ptm, &db.subscriber).map_err(e)?.len(),
            rep.subscribers,
        ),
        (
            "sub_nbr",
            all_keys(ptm, &db.by_sub_nbr).map_err(e)?.len(),
            rep.subscribers,
        ),
        (
            "access_info",
            all_keys(ptm, &db.access_info).map_err(e)?.len(),
            rep.access_info,
        ),
        (
            "special_facility",
            all_keys(ptm, &db.special_facility).map_err(e)?.len(),
            rep.special_facility,
        ),
        (
            "call_forwarding",
            all_keys(ptm, &db.call_forwarding).map_err(e)?.len(),
            rep.call_forwarding,
        ),
    ] {
        if n as u64 != want {
            return Err(format!(
                "table {name} holds {n} rows, {want} have keys of subscribers 1..={}",
                db.subscribers
            ));
        }
    }
    Ok(rep)
}

fn check_one(
    tx: &mut PTx<'_, KvRoot>,
    db: &TatpKv,
    s_id: u64,
    part: &mut CheckReport,
) -> Result<Option<String>, PtmError> {
    let loaded = SubscriberData::generate(db.seed, s_id);
    let Some(mut s) = db.subscriber.get(tx, s_id)? else {
        return Ok(Some(format!("subscriber {s_id} is missing")));
    };
    part.subscribers += 1;
    if s.bits[0] > 1 || s.vlr_location == 0 {
        return Ok(Some(format!(
            "subscriber {s_id}: bit_1 or vlr_location out of range"
        )));
    }
    let want = loaded.subscriber;
    s.bits[0] = want.bits[0];
    s.vlr_location = want.vlr_location;
    if s != want {
        return Ok(Some(format!(
            "subscriber {s_id}: {s:?} is not the loaded {want:?}"
        )));
    }
    if db.by_sub_nbr.get(tx, sub_nbr_key(&sub_nbr(s_id)))? != Some(s_id) {
        return Ok(Some(format!(
            "the sub_nbr table does not find subscriber {s_id}"
        )));
    }
    for t in 1..=4u8 {
        let got = db.access_info.get(tx, access_info_key(s_id, t))?;
        part.access_info += u64::from(got.is_some());
        let want = loaded
            .access_info
            .iter()
            .find(|a| a.ai_type == t)
            .map(|a| AccessInfo {
                data1: a.data1,
                data2: a.data2,
                data3: a.data3,
                data4: a.data4,
            });
        if got != want {
            return Ok(Some(format!(
                "access_info ({s_id}, {t}): {got:?}, loaded {want:?}"
            )));
        }
        let got = db.special_facility.get(tx, special_facility_key(s_id, t))?;
        part.special_facility += u64::from(got.is_some());
        let want = loaded.special_facility.iter().find(|f| f.sf_type == t);
        let same = match (got, want) {
            (None, None) => true,
            (Some(g), Some(w)) => {
                (g.is_active, g.error_cntrl, g.data_b) == (w.is_active, w.error_cntrl, w.data_b)
            }
            _ => false,
        };
        if !same {
            return Ok(Some(format!(
                "special_facility ({s_id}, {t}): {got:?}, loaded {want:?}"
            )));
        }
        for start in START_TIMES {
            if let Some(c) = db
                .call_forwarding
                .get(tx, call_forwarding_key(s_id, t, start))?
            {
                part.call_forwarding += 1;
                let row = CallForwardingRow {
                    sf_type: t,
                    start_time: start,
                    end_time: c.end_time,
                    numberx: c.numberx,
                };
                part.call_forwarding_changed += u64::from(!loaded.call_forwarding.contains(&row));
                if want.is_none()
                    || !(1..=24).contains(&c.end_time)
                    || !c.numberx.iter().all(u8::is_ascii_digit)
                {
                    return Ok(Some(format!(
                        "call_forwarding ({s_id}, {t}, {start}): {c:?} (facility {want:?})"
                    )));
                }
            }
        }
    }
    Ok(None)
}

/// The kinds of [`TatpKvDriver`]'s outcomes: the seven types.
pub fn kinds() -> Vec<String> {
    TxnType::ALL.iter().map(|t| t.name().to_string()).collect()
}

/// One thread of the TATP mix on the key-value store.
pub struct TatpKvDriver<'a> {
    ptm: &'a dyn PtmRunner<KvRoot>,
    db: &'a TatpKv,
    rng: StdRng,
    app: &'a [AtomicU64; 2],
    failed: bool,
}

impl<'a> TatpKvDriver<'a> {
    /// A driver; `app` sums (record bytes put, transactions committed).
    pub fn new(
        ptm: &'a dyn PtmRunner<KvRoot>,
        db: &'a TatpKv,
        seed: u64,
        app: &'a [AtomicU64; 2],
    ) -> Self {
        TatpKvDriver {
            ptm,
            db,
            rng: StdRng::seed_from_u64(seed),
            app,
            failed: false,
        }
    }
}

impl TxnDriver for TatpKvDriver<'_> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        let ty = TxnType::from_mix_roll(self.rng.gen_range(0..100));
        let p = Params::draw(&mut self.rng, self.db.subscribers);
        let (committed, found, put, aborts) =
            match self.ptm.run_counted(|tx| self.db.run_type(tx, ty, &p)) {
                Ok(((found, put), aborts)) => (true, found, put, aborts),
                Err(PtmError::UserAbort) => (false, false, 0, 0),
                Err(e) => return Err(format!("{}: {e}", ty.name()).into()),
            };
        self.failed = !found;
        self.app[0].fetch_add(put, Ordering::Relaxed);
        // Per committed transaction, as the bench's window counts them: a rolled-back one
        // (§TATP's expected failures) puts nothing and is not a commit.
        self.app[1].fetch_add(u64::from(committed), Ordering::Relaxed);
        Ok(TxnOutcome {
            kind: ty.index(),
            committed,
            aborts,
        })
    }

    fn last_was_expected_failure(&self) -> bool {
        self.failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptm::{Ptm, PtmConfig};

    #[test]
    fn the_tatp_mix_keeps_the_population_consistent_across_threads_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tatp.pool");
        let pc = || PtmConfig::temporary().size(64 << 20).path(&path);
        let before = {
            let ptm = Ptm::<KvRoot>::create(pc()).unwrap();
            let db = TatpKv::load(&ptm, 500, 4).unwrap();
            let loaded = check(&ptm, &db).unwrap();
            assert_eq!(loaded.subscribers, 500);
            let app = [AtomicU64::new(0), AtomicU64::new(0)];
            let committed = AtomicU64::new(0);
            std::thread::scope(|s| {
                for t in 0..2u64 {
                    let (ptm, db, app, committed) = (&ptm, &db, &app, &committed);
                    s.spawn(move || {
                        let mut d = TatpKvDriver::new(ptm, db, t + 11, app);
                        for _ in 0..2000 {
                            let done = d.run_txn().unwrap().committed;
                            committed.fetch_add(u64::from(done), Ordering::Relaxed);
                        }
                    });
                }
            });
            // TATP's mix rolls some back by design (a missing row): those are not counted.
            let committed = committed.into_inner();
            assert!((3000..4000).contains(&committed), "{committed} of 4000");
            assert_eq!(app[1].load(Ordering::Relaxed), committed);
            assert!(app[0].load(Ordering::Relaxed) > 0, "updates put records");
            let after = check(&ptm, &db).unwrap();
            assert_eq!(
                (after.subscribers, after.access_info, after.special_facility),
                (
                    loaded.subscribers,
                    loaded.access_info,
                    loaded.special_facility
                )
            );
            assert_ne!(after.call_forwarding, 0);
            assert_ne!(after.call_forwarding_changed, 0, "inserts and deletes ran");
            ptm.check_invariants().unwrap();
            after
        };
        let ptm = Ptm::<KvRoot>::open(pc()).unwrap();
        let db = TatpKv::open(&ptm).unwrap();
        assert_eq!(check(&ptm, &db).unwrap(), before);
        // A call forwarding without its facility is caught.
        let orphan = (1..=500u64)
            .flat_map(|s| (1..=4u8).map(move |t| (s, t)))
            .find(|&(s, t)| {
                ptm.run(|tx| db.special_facility.get(tx, special_facility_key(s, t)))
                    .unwrap()
                    .is_none()
            })
            .expect("some subscriber lacks a facility type");
        ptm.run(|tx| {
            let row = CallForwarding {
                end_time: 5,
                numberx: [b'1'; SUB_NBR_LEN],
            };
            db.call_forwarding
                .insert(tx, call_forwarding_key(orphan.0, orphan.1, 0), &row)
                .map(|_| ())
        })
        .unwrap();
        assert!(check(&ptm, &db).unwrap_err().contains("call_forwarding"));
    }
}
