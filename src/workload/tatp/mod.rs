//! TATP, the Telecom Application Transaction Processing benchmark (Neuvonen, Wolski, Manner,
//! Raatikka: *TATP Benchmark Description*, v1.0, 2009), as used by ArchTM §6.2 and DUDETx §6.1.
//!
//! A home location register: four tables keyed by subscriber, seven short transactions (see
//! [`driver`]), the subscriber count `P` as the scale factor.
//!
//! | table | rows | primary key (packed into the engine's u64 key) |
//! | --- | --- | --- |
//! | `subscriber` | `P` | `s_id` (1..=P); secondary index on `sub_nbr` |
//! | `access_info` | 1–4 per subscriber (avg 2.5) | `(s_id, ai_type)` → [`access_info_key`] |
//! | `special_facility` | 1–4 per subscriber (avg 2.5) | `(s_id, sf_type)` → [`special_facility_key`] |
//! | `call_forwarding` | 0–3 per special facility (avg 3.75 per subscriber) | `(s_id, sf_type, start_time)` → [`call_forwarding_key`] |
//!
//! Population (spec §2): `sub_nbr` is `s_id` as 15 zero-padded digits; `bit_*` 0–1, `hex_*` 0–15,
//! `byte2_*` 0–255; locations 1..2³²−1; `ai_type`s and `sf_type`s are distinct random values of
//! 1–4; `is_active` is 1 for 85 % of special facilities; each facility has 0–3 call forwardings
//! with distinct `start_time`s from {0, 8, 16} and `end_time = start_time + rand(1..=8)`. Strings
//! (`data3`, `data4`, `data_b`) are random upper-case letters, `numberx` random digits.
//!
//! Departures from the spec, and why:
//! - Each subscriber's rows are drawn from an RNG seeded by `(seed, s_id)` rather than from one
//!   stream, so loading can be split across threads and [`check`] can regenerate the rows that
//!   no transaction changes and compare them exactly.
//! - Small integer columns are stored as 1-byte columns and `s_id` as 8 bytes (the engine's
//!   column types); the 32-bit locations in 8-byte columns.
//! - Subscribers are loaded in `s_id` order, not shuffled: the hash indexes make the insertion
//!   order irrelevant to lookups.

pub mod driver;

use crate::catalog::{ColumnType, Schema, TableId};
use crate::db::{Db, Row, Tx, Value};
use crate::engine::{DbError, TxError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Length of `sub_nbr` and `numberx`: 15 digits.
pub const SUB_NBR_LEN: usize = 15;

/// Start times a call forwarding can have (spec: 0, 8 or 16).
pub const START_TIMES: [u8; 3] = [0, 8, 16];

/// Names of the four tables.
pub const TABLE_NAMES: [&str; 4] = [
    "subscriber",
    "access_info",
    "special_facility",
    "call_forwarding",
];

/// Column positions of `subscriber`.
pub mod subscriber {
    /// `s_id` (u64).
    pub const S_ID: usize = 0;
    /// `sub_nbr` (15 bytes).
    pub const SUB_NBR: usize = 1;
    /// `bit_1` (the first of ten 1-byte `bit_*` columns).
    pub const BIT_1: usize = 2;
    /// `hex_1` (the first of ten 1-byte `hex_*` columns).
    pub const HEX_1: usize = 12;
    /// `byte2_1` (the first of ten 1-byte `byte2_*` columns).
    pub const BYTE2_1: usize = 22;
    /// `msc_location` (u64 holding a u32).
    pub const MSC_LOCATION: usize = 32;
    /// `vlr_location` (u64 holding a u32).
    pub const VLR_LOCATION: usize = 33;
}

/// Column positions of `access_info`.
pub mod access_info {
    /// `s_id` (u64).
    pub const S_ID: usize = 0;
    /// `ai_type` (1 byte, 1–4).
    pub const AI_TYPE: usize = 1;
    /// `data1` (1 byte).
    pub const DATA1: usize = 2;
    /// `data2` (1 byte).
    pub const DATA2: usize = 3;
    /// `data3` (3 letters).
    pub const DATA3: usize = 4;
    /// `data4` (5 letters).
    pub const DATA4: usize = 5;
}

/// Column positions of `special_facility`.
pub mod special_facility {
    /// `s_id` (u64).
    pub const S_ID: usize = 0;
    /// `sf_type` (1 byte, 1–4).
    pub const SF_TYPE: usize = 1;
    /// `is_active` (1 byte, 0 or 1).
    pub const IS_ACTIVE: usize = 2;
    /// `error_cntrl` (1 byte).
    pub const ERROR_CNTRL: usize = 3;
    /// `data_a` (1 byte).
    pub const DATA_A: usize = 4;
    /// `data_b` (5 letters).
    pub const DATA_B: usize = 5;
}

/// Column positions of `call_forwarding`.
pub mod call_forwarding {
    /// `s_id` (u64).
    pub const S_ID: usize = 0;
    /// `sf_type` (1 byte, 1–4).
    pub const SF_TYPE: usize = 1;
    /// `start_time` (1 byte: 0, 8 or 16).
    pub const START_TIME: usize = 2;
    /// `end_time` (1 byte, 1–24).
    pub const END_TIME: usize = 3;
    /// `numberx` (15 digits).
    pub const NUMBERX: usize = 4;
}

/// Why loading, running or checking TATP failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TatpError {
    /// The database underneath.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A parameter out of range.
    #[error("invalid TATP configuration: {0}")]
    Config(String),
    /// The tables are missing or not TATP's.
    #[error("not a TATP database: {0}")]
    Schema(String),
    /// A population invariant does not hold (see [`check`]).
    #[error("TATP check failed: {0}")]
    Check(String),
}

/// The ids of the four tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tables {
    /// `subscriber`.
    pub subscriber: TableId,
    /// `access_info`.
    pub access_info: TableId,
    /// `special_facility`.
    pub special_facility: TableId,
    /// `call_forwarding`.
    pub call_forwarding: TableId,
}

/// A loaded TATP database: its tables, scale and the seed its population was drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tatp {
    /// The tables.
    pub tables: Tables,
    /// Subscribers `P`; `s_id`s are 1..=P.
    pub subscribers: u64,
    /// Seed of the population (see [`SubscriberData::generate`]).
    pub seed: u64,
}

/// The largest subscriber count accepted: keys pack `s_id` with 4 bits to spare.
pub const MAX_SUBSCRIBERS: u64 = 1 << 40;

fn bytes(n: usize) -> ColumnType {
    ColumnType::Bytes(n as u32)
}

/// The four schemas, in [`TABLE_NAMES`] order. All have hash primary indexes (every access is a
/// point lookup); `subscriber` has a secondary index on `sub_nbr` for UPDATE_LOCATION and the
/// call-forwarding transactions.
pub fn schemas() -> [Schema; 4] {
    let mut names: Vec<String> = vec!["s_id".into(), "sub_nbr".into()];
    for prefix in ["bit", "hex", "byte2"] {
        names.extend((1..=10).map(|i| format!("{prefix}_{i}")));
    }
    names.push("msc_location".into());
    names.push("vlr_location".into());
    let cols: Vec<(&str, ColumnType)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let ty = match i {
                subscriber::S_ID | subscriber::MSC_LOCATION | subscriber::VLR_LOCATION => {
                    ColumnType::U64
                }
                subscriber::SUB_NBR => bytes(SUB_NBR_LEN),
                _ => bytes(1),
            };
            (n.as_str(), ty)
        })
        .collect();
    let subscriber = Schema::new(TABLE_NAMES[0], &cols).with_secondary("by_sub_nbr", &["sub_nbr"]);
    let access_info = Schema::new(
        TABLE_NAMES[1],
        &[
            ("s_id", ColumnType::U64),
            ("ai_type", bytes(1)),
            ("data1", bytes(1)),
            ("data2", bytes(1)),
            ("data3", bytes(3)),
            ("data4", bytes(5)),
        ],
    );
    let special_facility = Schema::new(
        TABLE_NAMES[2],
        &[
            ("s_id", ColumnType::U64),
            ("sf_type", bytes(1)),
            ("is_active", bytes(1)),
            ("error_cntrl", bytes(1)),
            ("data_a", bytes(1)),
            ("data_b", bytes(5)),
        ],
    );
    let call_forwarding = Schema::new(
        TABLE_NAMES[3],
        &[
            ("s_id", ColumnType::U64),
            ("sf_type", bytes(1)),
            ("start_time", bytes(1)),
            ("end_time", bytes(1)),
            ("numberx", bytes(SUB_NBR_LEN)),
        ],
    );
    [subscriber, access_info, special_facility, call_forwarding]
}

/// Creates the four tables.
pub fn create_tables(db: &Db) -> Result<Tables, DbError> {
    let [s, a, f, c] = schemas();
    Ok(Tables {
        subscriber: db.create_table(s)?,
        access_info: db.create_table(a)?,
        special_facility: db.create_table(f)?,
        call_forwarding: db.create_table(c)?,
    })
}

/// The tables of an existing TATP database, checked against [`schemas`].
pub fn open_tables(db: &Db) -> Result<Tables, TatpError> {
    let expected = schemas();
    let mut ids = [0; 4];
    for (i, schema) in expected.iter().enumerate() {
        let id = db
            .table(&schema.name)
            .ok_or_else(|| TatpError::Schema(format!("no table '{}'", schema.name)))?;
        if !db.schema(id).is_some_and(|s| s.same_table_as(schema)) {
            return Err(TatpError::Schema(format!(
                "table '{}' does not have TATP's columns",
                schema.name
            )));
        }
        ids[i] = id;
    }
    Ok(Tables {
        subscriber: ids[0],
        access_info: ids[1],
        special_facility: ids[2],
        call_forwarding: ids[3],
    })
}

/// `sub_nbr` of `s_id`: its decimal digits, zero-padded to 15 (spec §2.1).
pub fn sub_nbr(s_id: u64) -> [u8; SUB_NBR_LEN] {
    let mut out = [b'0'; SUB_NBR_LEN];
    let mut v = s_id;
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out
}

/// Key of the `access_info` row `(s_id, ai_type)`, `ai_type` in 1..=4.
pub fn access_info_key(s_id: u64, ai_type: u8) -> u64 {
    debug_assert!((1..=4).contains(&ai_type));
    (s_id << 2) | u64::from(ai_type - 1)
}

/// Key of the `special_facility` row `(s_id, sf_type)`, `sf_type` in 1..=4.
pub fn special_facility_key(s_id: u64, sf_type: u8) -> u64 {
    debug_assert!((1..=4).contains(&sf_type));
    (s_id << 2) | u64::from(sf_type - 1)
}

/// Key of the `call_forwarding` row `(s_id, sf_type, start_time)`, `start_time` in
/// [`START_TIMES`].
pub fn call_forwarding_key(s_id: u64, sf_type: u8, start_time: u8) -> u64 {
    debug_assert!(START_TIMES.contains(&start_time));
    (special_facility_key(s_id, sf_type) << 2) | u64::from(start_time / 8)
}

/// The constant `A` of the non-uniform `s_id` distribution for `P` subscribers (spec §4.1):
/// 65,535 up to 1 M subscribers, 1,048,575 up to 10 M, 2,097,151 beyond.
pub fn nurand_a(subscribers: u64) -> u64 {
    if subscribers <= 1_000_000 {
        65_535
    } else if subscribers <= 10_000_000 {
        1_048_575
    } else {
        2_097_151
    }
}

/// A non-uniformly distributed `s_id` (spec §4.1): `(rand(0..=A) | rand(1..=P)) % P + 1`.
pub fn nurand_s_id(rng: &mut impl Rng, subscribers: u64) -> u64 {
    let a = nurand_a(subscribers);
    ((rng.gen_range(0..=a) | rng.gen_range(1..=subscribers)) % subscribers) + 1
}

fn letters<const N: usize>(rng: &mut impl Rng) -> [u8; N] {
    std::array::from_fn(|_| rng.gen_range(b'A'..=b'Z'))
}

/// `N` random decimal digits (`numberx`).
pub fn digits<const N: usize>(rng: &mut impl Rng) -> [u8; N] {
    std::array::from_fn(|_| rng.gen_range(b'0'..=b'9'))
}

/// `count` distinct values of 1..=4 in random order.
fn distinct_types(rng: &mut impl Rng, count: usize) -> Vec<u8> {
    let mut types = vec![1u8, 2, 3, 4];
    for i in 0..count {
        let j = rng.gen_range(i..4);
        types.swap(i, j);
    }
    types.truncate(count);
    types
}

crate::pobject! {
    /// A `subscriber` row (also a persistent object: the PTM key-value store's record,
    /// `workload::ptm_tatp`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct SubscriberRow {
        /// The subscriber id.
        pub s_id: u64,
        /// Its number.
        pub sub_nbr: [u8; SUB_NBR_LEN],
        /// `bit_1..bit_10`, each 0 or 1.
        pub bits: [u8; 10],
        /// `hex_1..hex_10`, each 0–15.
        pub hexes: [u8; 10],
        /// `byte2_1..byte2_10`.
        pub byte2: [u8; 10],
        /// `msc_location`.
        pub msc_location: u32,
        /// `vlr_location`.
        pub vlr_location: u32,
    }
}

/// An `access_info` row (without its `s_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessInfoRow {
    /// 1–4.
    pub ai_type: u8,
    /// `data1`.
    pub data1: u8,
    /// `data2`.
    pub data2: u8,
    /// `data3`: 3 letters.
    pub data3: [u8; 3],
    /// `data4`: 5 letters.
    pub data4: [u8; 5],
}

/// A `special_facility` row (without its `s_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialFacilityRow {
    /// 1–4.
    pub sf_type: u8,
    /// 0 or 1.
    pub is_active: u8,
    /// `error_cntrl`.
    pub error_cntrl: u8,
    /// `data_a` (UPDATE_SUBSCRIBER_DATA sets it).
    pub data_a: u8,
    /// `data_b`: 5 letters.
    pub data_b: [u8; 5],
}

/// A `call_forwarding` row (without its `s_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallForwardingRow {
    /// The facility it belongs to, 1–4.
    pub sf_type: u8,
    /// 0, 8 or 16.
    pub start_time: u8,
    /// 1–24.
    pub end_time: u8,
    /// The number calls are forwarded to.
    pub numberx: [u8; SUB_NBR_LEN],
}

/// Every row of one subscriber as loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberData {
    /// The `subscriber` row.
    pub subscriber: SubscriberRow,
    /// Its `access_info` rows (1–4).
    pub access_info: Vec<AccessInfoRow>,
    /// Its `special_facility` rows (1–4).
    pub special_facility: Vec<SpecialFacilityRow>,
    /// Its `call_forwarding` rows (0–3 per special facility).
    pub call_forwarding: Vec<CallForwardingRow>,
}

impl SubscriberData {
    /// The initial rows of subscriber `s_id`, drawn from an RNG seeded by `(seed, s_id)`: the
    /// same for every load with that seed, whatever the thread split.
    pub fn generate(seed: u64, s_id: u64) -> SubscriberData {
        let mut rng =
            StdRng::seed_from_u64(seed ^ s_id.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17));
        let rng = &mut rng;
        let subscriber = SubscriberRow {
            s_id,
            sub_nbr: sub_nbr(s_id),
            bits: std::array::from_fn(|_| rng.gen_range(0..=1)),
            hexes: std::array::from_fn(|_| rng.gen_range(0..=15)),
            byte2: std::array::from_fn(|_| rng.gen()),
            msc_location: rng.gen_range(1..=u32::MAX),
            vlr_location: rng.gen_range(1..=u32::MAX),
        };
        let n_ai = rng.gen_range(1..=4);
        let access_info = distinct_types(rng, n_ai)
            .into_iter()
            .map(|ai_type| AccessInfoRow {
                ai_type,
                data1: rng.gen(),
                data2: rng.gen(),
                data3: letters(rng),
                data4: letters(rng),
            })
            .collect();
        let n_sf = rng.gen_range(1..=4);
        let mut special_facility = Vec::with_capacity(n_sf);
        let mut call_forwarding = Vec::new();
        for sf_type in distinct_types(rng, n_sf) {
            special_facility.push(SpecialFacilityRow {
                sf_type,
                is_active: u8::from(rng.gen_range(0..100) < 85),
                error_cntrl: rng.gen(),
                data_a: rng.gen(),
                data_b: letters(rng),
            });
            let n_cf = rng.gen_range(0..=3);
            let mut starts = START_TIMES;
            for i in 0..n_cf {
                let j = rng.gen_range(i..3);
                starts.swap(i, j);
                call_forwarding.push(CallForwardingRow {
                    sf_type,
                    start_time: starts[i],
                    end_time: starts[i] + rng.gen_range(1..=8),
                    numberx: digits(rng),
                });
            }
        }
        SubscriberData {
            subscriber,
            access_info,
            special_facility,
            call_forwarding,
        }
    }

    /// Rows in all four tables.
    pub fn rows(&self) -> u64 {
        1 + (self.access_info.len() + self.special_facility.len() + self.call_forwarding.len())
            as u64
    }

    /// Inserts every row in `tx`.
    pub fn insert(&self, tx: &mut Tx<'_>, tables: &Tables) -> Result<(), TxError> {
        let s = &self.subscriber;
        let mut values = Vec::with_capacity(34);
        values.push(Value::U64(s.s_id));
        values.push(Value::Bytes(&s.sub_nbr));
        for group in [&s.bits, &s.hexes, &s.byte2] {
            values.extend(group.chunks(1).map(Value::Bytes));
        }
        values.push(Value::U64(u64::from(s.msc_location)));
        values.push(Value::U64(u64::from(s.vlr_location)));
        tx.insert(tables.subscriber, s.s_id, &values)?;
        for a in &self.access_info {
            tx.insert(
                tables.access_info,
                access_info_key(s.s_id, a.ai_type),
                &[
                    Value::U64(s.s_id),
                    Value::Bytes(&[a.ai_type]),
                    Value::Bytes(&[a.data1]),
                    Value::Bytes(&[a.data2]),
                    Value::Bytes(&a.data3),
                    Value::Bytes(&a.data4),
                ],
            )?;
        }
        for f in &self.special_facility {
            tx.insert(
                tables.special_facility,
                special_facility_key(s.s_id, f.sf_type),
                &[
                    Value::U64(s.s_id),
                    Value::Bytes(&[f.sf_type]),
                    Value::Bytes(&[f.is_active]),
                    Value::Bytes(&[f.error_cntrl]),
                    Value::Bytes(&[f.data_a]),
                    Value::Bytes(&f.data_b),
                ],
            )?;
        }
        for c in &self.call_forwarding {
            insert_call_forwarding_row(tx, tables, s.s_id, c)?;
        }
        Ok(())
    }
}

/// Inserts one `call_forwarding` row.
pub fn insert_call_forwarding_row(
    tx: &mut Tx<'_>,
    tables: &Tables,
    s_id: u64,
    c: &CallForwardingRow,
) -> Result<(), TxError> {
    tx.insert(
        tables.call_forwarding,
        call_forwarding_key(s_id, c.sf_type, c.start_time),
        &[
            Value::U64(s_id),
            Value::Bytes(&[c.sf_type]),
            Value::Bytes(&[c.start_time]),
            Value::Bytes(&[c.end_time]),
            Value::Bytes(&c.numberx),
        ],
    )
}

/// Decodes a `subscriber` row.
pub fn decode_subscriber(row: &Row) -> SubscriberRow {
    let group = |first: usize| -> [u8; 10] { std::array::from_fn(|i| row.bytes_at(first + i)[0]) };
    SubscriberRow {
        s_id: row.u64(subscriber::S_ID),
        sub_nbr: row
            .bytes_at(subscriber::SUB_NBR)
            .try_into()
            .expect("sub_nbr is 15 bytes"),
        bits: group(subscriber::BIT_1),
        hexes: group(subscriber::HEX_1),
        byte2: group(subscriber::BYTE2_1),
        msc_location: row.u64(subscriber::MSC_LOCATION) as u32,
        vlr_location: row.u64(subscriber::VLR_LOCATION) as u32,
    }
}

/// Decodes an `access_info` row.
pub fn decode_access_info(row: &Row) -> AccessInfoRow {
    AccessInfoRow {
        ai_type: row.bytes_at(access_info::AI_TYPE)[0],
        data1: row.bytes_at(access_info::DATA1)[0],
        data2: row.bytes_at(access_info::DATA2)[0],
        data3: row
            .bytes_at(access_info::DATA3)
            .try_into()
            .expect("3 bytes"),
        data4: row
            .bytes_at(access_info::DATA4)
            .try_into()
            .expect("5 bytes"),
    }
}

/// Decodes a `special_facility` row.
pub fn decode_special_facility(row: &Row) -> SpecialFacilityRow {
    SpecialFacilityRow {
        sf_type: row.bytes_at(special_facility::SF_TYPE)[0],
        is_active: row.bytes_at(special_facility::IS_ACTIVE)[0],
        error_cntrl: row.bytes_at(special_facility::ERROR_CNTRL)[0],
        data_a: row.bytes_at(special_facility::DATA_A)[0],
        data_b: row
            .bytes_at(special_facility::DATA_B)
            .try_into()
            .expect("5 bytes"),
    }
}

/// Decodes a `call_forwarding` row.
pub fn decode_call_forwarding(row: &Row) -> CallForwardingRow {
    CallForwardingRow {
        sf_type: row.bytes_at(call_forwarding::SF_TYPE)[0],
        start_time: row.bytes_at(call_forwarding::START_TIME)[0],
        end_time: row.bytes_at(call_forwarding::END_TIME)[0],
        numberx: row
            .bytes_at(call_forwarding::NUMBERX)
            .try_into()
            .expect("15 bytes"),
    }
}

/// Reads the row with `key`, `None` when there is none.
pub(crate) fn get_opt(tx: &mut Tx<'_>, table: TableId, key: u64) -> Result<Option<Row>, TxError> {
    match tx.get(table, key) {
        Ok(row) => Ok(Some(row)),
        Err(TxError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Expected PM bytes of a population of `subscribers` in the falcon engines' tuple slots
/// (average rows per subscriber times their slot sizes), for sizing pools.
pub fn data_bytes(subscribers: u64) -> u64 {
    let slot = |s: &Schema| crate::engine::falcon::layout::tuple::slot_size(s.row_size());
    let [s, a, f, c] = schemas();
    // Per subscriber: 1 subscriber, 2.5 access_info, 2.5 special_facility, 3.75 call_forwarding
    // rows; ×4 to stay in integers.
    let per4 = 4 * slot(&s) + 10 * slot(&a) + 10 * slot(&f) + 15 * slot(&c);
    subscribers * per4 / 4
}

/// Subscribers per loading transaction.
const LOAD_BATCH: u64 = 16;

/// Creates the tables and loads `subscribers` subscribers drawn from `seed` on `threads` threads,
/// 16 subscribers per transaction; `progress` is called with the number of
/// subscribers just loaded (from any thread).
pub fn load(
    db: &Db,
    subscribers: u64,
    seed: u64,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Tatp, TatpError> {
    if subscribers == 0 || subscribers > MAX_SUBSCRIBERS {
        return Err(TatpError::Config(format!(
            "the subscriber count must be between 1 and {MAX_SUBSCRIBERS}, not {subscribers}"
        )));
    }
    let tables = create_tables(db)?;
    let threads = (threads.max(1) as u64).min(subscribers);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<(), DbError> {
                    let mut w = db.worker()?;
                    // s_ids 1..=P split into contiguous ranges.
                    let (lo, hi) = (
                        1 + subscribers * t / threads,
                        1 + subscribers * (t + 1) / threads,
                    );
                    let mut next = lo;
                    while next < hi {
                        let end = (next + LOAD_BATCH).min(hi);
                        let batch: Vec<SubscriberData> = (next..end)
                            .map(|s_id| SubscriberData::generate(seed, s_id))
                            .collect();
                        w.run(|tx| batch.iter().try_for_each(|d| d.insert(tx, &tables)))?;
                        progress(end - next);
                        next = end;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("TATP loader thread panicked"))
    })?;
    Ok(Tatp {
        tables,
        subscribers,
        seed,
    })
}

/// Rows found by [`check`], per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// `subscriber` rows.
    pub subscribers: u64,
    /// `access_info` rows.
    pub access_info: u64,
    /// `special_facility` rows.
    pub special_facility: u64,
    /// `call_forwarding` rows.
    pub call_forwarding: u64,
    /// `call_forwarding` rows that are not those loaded (inserted or replaced by transactions).
    pub call_forwarding_changed: u64,
}

/// Subscribers checked per read-only transaction.
const CHECK_BATCH: u64 = 64;

/// Checks the population invariants after any number of TATP transactions:
///
/// 1. The engine's indexes agree with storage ([`Db::check_structure`]), and each table holds
///    exactly the rows found under TATP keys below (no stray rows).
/// 2. Every subscriber 1..=P exists; its row equals the loaded one except `bit_1` (0 or 1) and
///    `vlr_location` (non-zero), which transactions update; the `sub_nbr` index finds it.
/// 3. `access_info` rows are exactly the loaded ones (no transaction writes them).
/// 4. `special_facility` rows are the loaded ones except `data_a`.
/// 5. Every `call_forwarding` row belongs to an existing special facility (the foreign key
///    INSERT_CALL_FORWARDING enforces), its columns match its key, `end_time` is in 1..=24 and
///    `numberx` is digits.
pub fn check(db: &Db, tatp: &Tatp) -> Result<CheckReport, TatpError> {
    let t = tatp.tables;
    let fail = |msg: String| TatpError::Check(msg);
    let mut report = CheckReport::default();
    let mut worker = db.worker()?;
    let mut s_id = 1;
    while s_id <= tatp.subscribers {
        let end = (s_id + CHECK_BATCH).min(tatp.subscribers + 1);
        let batch = worker.run_read_only(|tx| {
            let mut part = CheckReport::default();
            let mut problems = Vec::new();
            for id in s_id..end {
                check_subscriber(tx, &t, tatp.seed, id, &mut part, &mut problems)?;
                if !problems.is_empty() {
                    break;
                }
            }
            Ok((part, problems))
        })?;
        let (part, problems) = batch;
        if let Some(p) = problems.into_iter().next() {
            return Err(fail(p));
        }
        report.subscribers += part.subscribers;
        report.access_info += part.access_info;
        report.special_facility += part.special_facility;
        report.call_forwarding += part.call_forwarding;
        report.call_forwarding_changed += part.call_forwarding_changed;
        s_id = end;
    }
    drop(worker);
    let live = db.check_structure().map_err(fail)?;
    let count = |id: TableId| live.get(id as usize).copied().unwrap_or(0);
    for (name, id, found) in [
        (TABLE_NAMES[0], t.subscriber, report.subscribers),
        (TABLE_NAMES[1], t.access_info, report.access_info),
        (TABLE_NAMES[2], t.special_facility, report.special_facility),
        (TABLE_NAMES[3], t.call_forwarding, report.call_forwarding),
    ] {
        if count(id) != found {
            return Err(fail(format!(
                "table {name} holds {} rows but {found} have TATP keys of subscribers 1..={}",
                count(id),
                tatp.subscribers
            )));
        }
    }
    Ok(report)
}

fn check_subscriber(
    tx: &mut Tx<'_>,
    t: &Tables,
    seed: u64,
    s_id: u64,
    part: &mut CheckReport,
    problems: &mut Vec<String>,
) -> Result<(), TxError> {
    let loaded = SubscriberData::generate(seed, s_id);
    let Some(row) = get_opt(tx, t.subscriber, s_id)? else {
        problems.push(format!("subscriber {s_id} is missing"));
        return Ok(());
    };
    part.subscribers += 1;
    let mut sub = decode_subscriber(&row);
    if sub.bits[0] > 1 || sub.vlr_location == 0 {
        problems.push(format!(
            "subscriber {s_id}: bit_1 {} or vlr_location {} out of range",
            sub.bits[0], sub.vlr_location
        ));
    }
    sub.bits[0] = loaded.subscriber.bits[0];
    sub.vlr_location = loaded.subscriber.vlr_location;
    if sub != loaded.subscriber {
        problems.push(format!(
            "subscriber {s_id}: row {sub:?} differs from the loaded {:?} in a column no transaction writes",
            loaded.subscriber
        ));
    }
    let found = tx.lookup_secondary(t.subscriber, 0, &[Value::Bytes(&sub_nbr(s_id))])?;
    if !found.contains(&s_id) {
        problems.push(format!("the sub_nbr index does not find subscriber {s_id}"));
    }
    for ai_type in 1..=4u8 {
        let expected = loaded.access_info.iter().find(|a| a.ai_type == ai_type);
        let got = get_opt(tx, t.access_info, access_info_key(s_id, ai_type))?;
        if got.is_some() {
            part.access_info += 1;
        }
        let got = got.map(|r| (r.u64(access_info::S_ID), decode_access_info(&r)));
        if got.as_ref().map(|(id, a)| (*id, a)) != expected.map(|a| (s_id, a)) {
            problems.push(format!(
                "access_info ({s_id}, {ai_type}): found {got:?}, loaded {expected:?}"
            ));
        }
    }
    for sf_type in 1..=4u8 {
        let expected = loaded
            .special_facility
            .iter()
            .find(|f| f.sf_type == sf_type);
        let got = get_opt(tx, t.special_facility, special_facility_key(s_id, sf_type))?;
        if got.is_some() {
            part.special_facility += 1;
        }
        let got = got.map(|r| {
            let mut f = decode_special_facility(&r);
            let id = r.u64(special_facility::S_ID);
            // data_a is UPDATE_SUBSCRIBER_DATA's to change.
            if let Some(e) = expected {
                f.data_a = e.data_a;
            }
            (id, f)
        });
        if got.as_ref().map(|(id, f)| (*id, f)) != expected.map(|f| (s_id, f)) {
            problems.push(format!(
                "special_facility ({s_id}, {sf_type}): found {got:?}, loaded {expected:?}"
            ));
        }
        for start_time in START_TIMES {
            let Some(r) = get_opt(
                tx,
                t.call_forwarding,
                call_forwarding_key(s_id, sf_type, start_time),
            )?
            else {
                continue;
            };
            part.call_forwarding += 1;
            let c = decode_call_forwarding(&r);
            if expected.is_none() {
                problems.push(format!(
                    "call_forwarding ({s_id}, {sf_type}, {start_time}) has no special facility"
                ));
            }
            if r.u64(call_forwarding::S_ID) != s_id
                || c.sf_type != sf_type
                || c.start_time != start_time
                || !(1..=24).contains(&c.end_time)
                || !c.numberx.iter().all(u8::is_ascii_digit)
            {
                problems.push(format!(
                    "call_forwarding ({s_id}, {sf_type}, {start_time}) holds {c:?}"
                ));
            }
            if !loaded.call_forwarding.contains(&c) {
                part.call_forwarding_changed += 1;
            }
        }
    }
    Ok(())
}
