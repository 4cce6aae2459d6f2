//! The seven TATP transactions (spec §3) and a [`TxnDriver`] running them in the standard mix.
//!
//! | transaction | mix | reads/writes | succeeds (spec) |
//! | --- | --- | --- | --- |
//! | GET_SUBSCRIBER_DATA | 35 % | read-only | 100 % |
//! | GET_NEW_DESTINATION | 10 % | read-only | 23.9 % |
//! | GET_ACCESS_DATA | 35 % | read-only | 62.5 % |
//! | UPDATE_SUBSCRIBER_DATA | 2 % | update | 62.5 % |
//! | UPDATE_LOCATION | 14 % | update | 100 % |
//! | INSERT_CALL_FORWARDING | 2 % | insert | 31.25 % |
//! | DELETE_CALL_FORWARDING | 2 % | delete | 31.25 % |
//!
//! The failures are part of the benchmark, not errors (the spec's "errors allowed"): a lookup that
//! finds no row, an update of a special facility the subscriber lacks, an insert whose facility
//! is missing or whose key exists, a delete with nothing to delete. Each such outcome is an
//! *expected failure* ([`TxnResult::value`] is `None`), counted per type by the harness through
//! [`TxnDriver::last_was_expected_failure`]. Lookups and the delete find nothing and commit (a
//! query or a `DELETE` matching no row is not an error); UPDATE_SUBSCRIBER_DATA and
//! INSERT_CALL_FORWARDING violate an integrity constraint and roll back
//! ([`TxnResult::committed`] is false), so they change nothing.

use super::{
    access_info_key, call_forwarding_key, decode_access_info, decode_call_forwarding,
    decode_special_facility, decode_subscriber, digits, get_opt, insert_call_forwarding_row,
    nurand_s_id, special_facility, special_facility_key, sub_nbr, subscriber, AccessInfoRow,
    CallForwardingRow, SubscriberRow, Tables, Tatp, TatpError, START_TIMES, SUB_NBR_LEN,
};
use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::db::{Db, Tx, Value, Worker};
use crate::engine::{DbError, TxError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The seven transaction types, in the order of [`TxnType::ALL`] (the harness's kind indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxnType {
    /// Reads one subscriber row.
    GetSubscriberData,
    /// Finds the forwarding number of an active special facility at a time.
    GetNewDestination,
    /// Reads one access_info row.
    GetAccessData,
    /// Sets a subscriber's `bit_1` and a special facility's `data_a`.
    UpdateSubscriberData,
    /// Sets a subscriber's `vlr_location`, found by `sub_nbr`.
    UpdateLocation,
    /// Adds a call forwarding for a subscriber found by `sub_nbr`.
    InsertCallForwarding,
    /// Removes a call forwarding of a subscriber found by `sub_nbr`.
    DeleteCallForwarding,
}

impl TxnType {
    /// Every type, in kind-index order.
    pub const ALL: [TxnType; 7] = [
        TxnType::GetSubscriberData,
        TxnType::GetNewDestination,
        TxnType::GetAccessData,
        TxnType::UpdateSubscriberData,
        TxnType::UpdateLocation,
        TxnType::InsertCallForwarding,
        TxnType::DeleteCallForwarding,
    ];

    /// The command-line and report name, e.g. `get_subscriber_data`.
    pub fn name(self) -> &'static str {
        match self {
            TxnType::GetSubscriberData => "get_subscriber_data",
            TxnType::GetNewDestination => "get_new_destination",
            TxnType::GetAccessData => "get_access_data",
            TxnType::UpdateSubscriberData => "update_subscriber_data",
            TxnType::UpdateLocation => "update_location",
            TxnType::InsertCallForwarding => "insert_call_forwarding",
            TxnType::DeleteCallForwarding => "delete_call_forwarding",
        }
    }

    /// The type called `name` (case-insensitive; `-` and `_` alike).
    pub fn from_name(name: &str) -> Result<TxnType, TatpError> {
        let wanted = name.trim().to_ascii_lowercase().replace('-', "_");
        TxnType::ALL
            .into_iter()
            .find(|t| t.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = TxnType::ALL.iter().map(|t| t.name()).collect();
                TatpError::Config(format!(
                    "unknown TATP transaction '{name}' (expected one of {})",
                    names.join(", ")
                ))
            })
    }

    /// Percent of the standard mix (spec §3): 35/10/35/2/14/2/2.
    pub fn mix_percent(self) -> u32 {
        match self {
            TxnType::GetSubscriberData => 35,
            TxnType::GetNewDestination => 10,
            TxnType::GetAccessData => 35,
            TxnType::UpdateSubscriberData => 2,
            TxnType::UpdateLocation => 14,
            TxnType::InsertCallForwarding => 2,
            TxnType::DeleteCallForwarding => 2,
        }
    }

    /// The share of successful outcomes the spec expects with the standard population (§3).
    pub fn expected_success_rate(self) -> f64 {
        match self {
            TxnType::GetSubscriberData | TxnType::UpdateLocation => 1.0,
            TxnType::GetNewDestination => 0.239,
            TxnType::GetAccessData | TxnType::UpdateSubscriberData => 0.625,
            TxnType::InsertCallForwarding | TxnType::DeleteCallForwarding => 0.3125,
        }
    }

    /// Whether the type only reads.
    pub fn read_only(self) -> bool {
        matches!(
            self,
            TxnType::GetSubscriberData | TxnType::GetNewDestination | TxnType::GetAccessData
        )
    }

    /// Its index in [`TxnType::ALL`].
    pub fn index(self) -> usize {
        TxnType::ALL
            .iter()
            .position(|&t| t == self)
            .expect("every type is in ALL")
    }

    /// A type drawn from the standard mix with `roll` uniform in 0..100.
    pub fn from_mix_roll(roll: u32) -> TxnType {
        let mut upto = 0;
        for t in TxnType::ALL {
            upto += t.mix_percent();
            if roll < upto {
                return t;
            }
        }
        TxnType::DeleteCallForwarding
    }
}

/// How one TATP transaction ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResult<T> {
    /// What it found or did; `None` for an expected failure.
    pub value: Option<T>,
    /// Whether it committed (false: rolled back on an integrity violation).
    pub committed: bool,
    /// Conflict aborts retried before this ending.
    pub aborts: u32,
}

/// Runs `f` as a transaction, counting its attempts; `Ok(None)` from `f` is an expected failure
/// that commits, and the errors in `rolled_back` are expected failures that roll back.
fn run_txn<T>(
    worker: &mut Worker<'_>,
    read_only: bool,
    rolled_back: fn(&TxError) -> bool,
    mut f: impl FnMut(&mut Tx<'_>) -> Result<Option<T>, TxError>,
) -> Result<TxnResult<T>, DbError> {
    let mut attempts = 0u32;
    let outcome = worker.run_counted(read_only, |tx| {
        attempts += 1;
        f(tx)
    });
    match outcome {
        Ok(o) => Ok(TxnResult {
            value: o.value,
            committed: true,
            aborts: o.aborts,
        }),
        Err(DbError::Tx(e)) if rolled_back(&e) => Ok(TxnResult {
            value: None,
            committed: false,
            aborts: attempts.saturating_sub(1),
        }),
        Err(e) => Err(e),
    }
}

fn never(_: &TxError) -> bool {
    false
}

/// Reads the subscriber `s_id`, which must exist.
fn subscriber_row(tx: &mut Tx<'_>, t: &Tables, s_id: u64) -> Result<SubscriberRow, TxError> {
    Ok(decode_subscriber(&tx.get(t.subscriber, s_id)?))
}

/// The `s_id` whose `sub_nbr` is `nbr`, through the secondary index (whose keys are hashes, so
/// each candidate's row is re-checked). Every number of a loaded subscriber exists.
fn s_id_of(tx: &mut Tx<'_>, t: &Tables, nbr: &[u8; SUB_NBR_LEN]) -> Result<u64, TxError> {
    for candidate in tx.lookup_secondary(t.subscriber, 0, &[Value::Bytes(nbr)])? {
        if let Some(row) = get_opt(tx, t.subscriber, candidate)? {
            if row.bytes_at(subscriber::SUB_NBR) == nbr {
                return Ok(candidate);
            }
        }
    }
    Err(TxError::NotFound {
        table: t.subscriber,
        key: u64::MAX,
    })
}

/// GET_SUBSCRIBER_DATA: the subscriber row of `s_id`.
pub fn get_subscriber_data(
    w: &mut Worker<'_>,
    t: &Tables,
    s_id: u64,
) -> Result<TxnResult<SubscriberRow>, DbError> {
    run_txn(w, true, never, |tx| subscriber_row(tx, t, s_id).map(Some))
}

/// GET_NEW_DESTINATION: the `numberx` of the call forwardings of special facility
/// `(s_id, sf_type)`, if active, with `start_time <= start` and `end < end_time`. `None` when
/// there is none (the facility is missing or inactive, or no forwarding covers the time).
pub fn get_new_destination(
    w: &mut Worker<'_>,
    t: &Tables,
    s_id: u64,
    sf_type: u8,
    start: u8,
    end: u8,
) -> Result<TxnResult<Vec<[u8; SUB_NBR_LEN]>>, DbError> {
    run_txn(w, true, never, |tx| {
        let Some(sf) = get_opt(tx, t.special_facility, special_facility_key(s_id, sf_type))? else {
            return Ok(None);
        };
        if sf.bytes_at(special_facility::IS_ACTIVE)[0] != 1 {
            return Ok(None);
        }
        let mut numbers = Vec::new();
        for start_time in START_TIMES.into_iter().filter(|&s| s <= start) {
            let key = call_forwarding_key(s_id, sf_type, start_time);
            if let Some(cf) = get_opt(tx, t.call_forwarding, key)? {
                let cf = decode_call_forwarding(&cf);
                if end < cf.end_time {
                    numbers.push(cf.numberx);
                }
            }
        }
        Ok((!numbers.is_empty()).then_some(numbers))
    })
}

/// GET_ACCESS_DATA: the `access_info` row `(s_id, ai_type)`, `None` when it does not exist.
pub fn get_access_data(
    w: &mut Worker<'_>,
    t: &Tables,
    s_id: u64,
    ai_type: u8,
) -> Result<TxnResult<AccessInfoRow>, DbError> {
    run_txn(w, true, never, |tx| {
        Ok(get_opt(tx, t.access_info, access_info_key(s_id, ai_type))?
            .map(|r| decode_access_info(&r)))
    })
}

/// UPDATE_SUBSCRIBER_DATA: sets `bit_1` of subscriber `s_id` and `data_a` of its special
/// facility `sf_type`; rolls back (an expected failure) when that facility does not exist.
pub fn update_subscriber_data(
    w: &mut Worker<'_>,
    t: &Tables,
    s_id: u64,
    bit_1: u8,
    sf_type: u8,
    data_a: u8,
) -> Result<TxnResult<()>, DbError> {
    run_txn(
        w,
        false,
        |e| matches!(e, TxError::UserAbort),
        |tx| {
            tx.update(
                t.subscriber,
                s_id,
                &[(subscriber::BIT_1, Value::Bytes(&[bit_1]))],
            )?;
            let key = special_facility_key(s_id, sf_type);
            match tx.update(
                t.special_facility,
                key,
                &[(special_facility::DATA_A, Value::Bytes(&[data_a]))],
            ) {
                Ok(()) => Ok(Some(())),
                // The spec's second UPDATE matches no row: the transaction fails and rolls back.
                Err(TxError::NotFound { .. }) => tx.abort(),
                Err(e) => Err(e),
            }
        },
    )
}

/// UPDATE_LOCATION: sets `vlr_location` of the subscriber whose number is `nbr`; returns its
/// `s_id`.
pub fn update_location(
    w: &mut Worker<'_>,
    t: &Tables,
    nbr: &[u8; SUB_NBR_LEN],
    vlr_location: u32,
) -> Result<TxnResult<u64>, DbError> {
    run_txn(w, false, never, |tx| {
        let s_id = s_id_of(tx, t, nbr)?;
        tx.update(
            t.subscriber,
            s_id,
            &[(
                subscriber::VLR_LOCATION,
                Value::U64(u64::from(vlr_location)),
            )],
        )?;
        Ok(Some(s_id))
    })
}

/// INSERT_CALL_FORWARDING: finds the subscriber whose number is `nbr` and its special facility
/// types, then inserts the call forwarding `row`. Rolls back (an expected failure) when the
/// subscriber has no facility `row.sf_type` (the foreign key) or the forwarding exists (the
/// primary key), also when a concurrent transaction inserts it first.
pub fn insert_call_forwarding(
    w: &mut Worker<'_>,
    t: &Tables,
    nbr: &[u8; SUB_NBR_LEN],
    row: &CallForwardingRow,
) -> Result<TxnResult<()>, DbError> {
    run_txn(
        w,
        false,
        |e| matches!(e, TxError::UserAbort | TxError::DuplicateKey { .. }),
        |tx| {
            let s_id = s_id_of(tx, t, nbr)?;
            // SELECT sf_type FROM special_facility WHERE s_id = ?: the four possible keys.
            let mut has_type = false;
            for sf_type in 1..=4u8 {
                let found = get_opt(tx, t.special_facility, special_facility_key(s_id, sf_type))?;
                if found.is_some_and(|r| decode_special_facility(&r).sf_type == row.sf_type) {
                    has_type = true;
                }
            }
            if !has_type {
                return tx.abort();
            }
            insert_call_forwarding_row(tx, t, s_id, row)?;
            Ok(Some(()))
        },
    )
}

/// DELETE_CALL_FORWARDING: deletes the call forwarding `(s_id, sf_type, start_time)` of the
/// subscriber whose number is `nbr`; `None` (committed, nothing changed) when there is none.
pub fn delete_call_forwarding(
    w: &mut Worker<'_>,
    t: &Tables,
    nbr: &[u8; SUB_NBR_LEN],
    sf_type: u8,
    start_time: u8,
) -> Result<TxnResult<()>, DbError> {
    run_txn(w, false, never, |tx| {
        let s_id = s_id_of(tx, t, nbr)?;
        match tx.delete(
            t.call_forwarding,
            call_forwarding_key(s_id, sf_type, start_time),
        ) {
            Ok(()) => Ok(Some(())),
            Err(TxError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    })
}

/// One thread's TATP transactions: types from the standard mix (or one type only), parameters
/// from the spec's distributions with the non-uniform `s_id`.
pub struct TatpDriver<'db> {
    worker: Worker<'db>,
    tatp: Tatp,
    rng: StdRng,
    only: Option<TxnType>,
    last_expected_failure: bool,
}

impl<'db> TatpDriver<'db> {
    /// A driver on its own worker; `only` restricts it to one type.
    pub fn new(
        db: &'db Db,
        tatp: Tatp,
        seed: u64,
        only: Option<TxnType>,
    ) -> Result<TatpDriver<'db>, DbError> {
        Ok(TatpDriver {
            worker: db.worker()?,
            tatp,
            rng: StdRng::seed_from_u64(seed),
            only,
            last_expected_failure: false,
        })
    }

    /// The next type: the fixed one, or one drawn from the mix.
    pub fn next_type(&mut self) -> TxnType {
        match self.only {
            Some(t) => t,
            None => TxnType::from_mix_roll(self.rng.gen_range(0..100)),
        }
    }

    /// Runs one transaction of type `ty` with random parameters; returns
    /// `(committed, expected failure, conflict aborts)`.
    pub fn run_type(&mut self, ty: TxnType) -> Result<(bool, bool, u32), DbError> {
        let rng = &mut self.rng;
        let t = self.tatp.tables;
        let s_id = nurand_s_id(rng, self.tatp.subscribers);
        let w = &mut self.worker;
        fn summary<T>(r: TxnResult<T>) -> (bool, bool, u32) {
            (r.committed, r.value.is_none(), r.aborts)
        }
        Ok(match ty {
            TxnType::GetSubscriberData => summary(get_subscriber_data(w, &t, s_id)?),
            TxnType::GetNewDestination => {
                let sf_type = rng.gen_range(1..=4);
                let start = START_TIMES[rng.gen_range(0..3)];
                let end = rng.gen_range(1..=24);
                summary(get_new_destination(w, &t, s_id, sf_type, start, end)?)
            }
            TxnType::GetAccessData => summary(get_access_data(w, &t, s_id, rng.gen_range(1..=4))?),
            TxnType::UpdateSubscriberData => {
                let (bit, sf_type, data_a) =
                    (rng.gen_range(0..=1), rng.gen_range(1..=4), rng.gen());
                summary(update_subscriber_data(w, &t, s_id, bit, sf_type, data_a)?)
            }
            TxnType::UpdateLocation => {
                let vlr = rng.gen_range(1..=u32::MAX);
                summary(update_location(w, &t, &sub_nbr(s_id), vlr)?)
            }
            TxnType::InsertCallForwarding => {
                let row = CallForwardingRow {
                    sf_type: rng.gen_range(1..=4),
                    start_time: START_TIMES[rng.gen_range(0..3)],
                    end_time: rng.gen_range(1..=24),
                    numberx: digits(rng),
                };
                summary(insert_call_forwarding(w, &t, &sub_nbr(s_id), &row)?)
            }
            TxnType::DeleteCallForwarding => {
                let sf_type = rng.gen_range(1..=4);
                let start = START_TIMES[rng.gen_range(0..3)];
                summary(delete_call_forwarding(
                    w,
                    &t,
                    &sub_nbr(s_id),
                    sf_type,
                    start,
                )?)
            }
        })
    }
}

impl TxnDriver for TatpDriver<'_> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        let ty = self.next_type();
        let (committed, failed, aborts) = self.run_type(ty).map_err(|e| -> DriverError {
            // Abandoned at the end of the run: keep the type, so the harness recognises it.
            if matches!(e, DbError::Interrupted { .. }) {
                Box::new(e)
            } else {
                format!("{}: {e}", ty.name()).into()
            }
        })?;
        self.last_expected_failure = failed;
        Ok(TxnOutcome {
            // With `only`, the run has that one kind.
            kind: if self.only.is_some() { 0 } else { ty.index() },
            committed,
            aborts,
        })
    }

    fn last_was_expected_failure(&self) -> bool {
        self.last_expected_failure
    }
}

/// The harness's kind names: all seven, or the one of `only`.
pub fn kind_names(only: Option<TxnType>) -> Vec<&'static str> {
    match only {
        Some(t) => vec![t.name()],
        None => TxnType::ALL.iter().map(|t| t.name()).collect(),
    }
}
