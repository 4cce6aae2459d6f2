//! TPC-C (TPC Benchmark C, standard specification v5.11) over the [`Db`] API: the nine tables
//! ([`schema`]), the initial population of clause 4.3 ([`load`]), the five transactions of
//! clause 2 ([`txns`]), the consistency conditions of clause 3.3.2 ([`consistency`]) and a
//! benchmark driver running the standard mix or TPC-C-NP ([`driver`]).
//!
//! The scale is set by [`TpccConfig`]: warehouses as in the spec, plus the per-warehouse
//! cardinalities (items, customers, orders), which tests shrink to keep a database tiny. Every
//! constant of the spec that depends on those cardinalities (NURand ranges, the delivered/undelivered
//! split of the initial orders, the initial year-to-date totals) is derived from them, so that a
//! reduced database is consistent in the sense of clause 3.3.2 just like a full one.
//!
//! What is left out of the spec (no terminals, keying or think times, no deferred Delivery queue,
//! no response-time constraints) is listed in docs/WORKLOADS.md.

pub mod consistency;
pub mod driver;
pub mod load;
pub mod random;
pub mod schema;
pub mod txns;

use crate::catalog::TableId;
use crate::db::{Db, Value, Worker};
use crate::engine::{DbError, TxError};
use random::NuRandConstants;
use std::sync::atomic::{AtomicU64, Ordering};

/// Districts per warehouse (clause 1.2.1; fixed by the spec).
pub const DISTRICTS: u64 = 10;

/// The largest warehouse count the key packing allows.
pub const MAX_WAREHOUSES: u64 = (1 << 20) - 1;

/// The scale of a TPC-C database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpccConfig {
    /// Warehouses: the scale factor.
    pub warehouses: u64,
    /// Items (spec: 100 000), and stock rows per warehouse.
    pub items: u64,
    /// Customers per district (spec: 3 000).
    pub customers_per_district: u64,
    /// Orders per district at load (spec: 3 000, one per customer).
    pub orders_per_district: u64,
    /// Of those, undelivered ones with a NEW-ORDER row (spec: the last 900).
    pub new_orders_per_district: u64,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid TPC-C configuration: {0}")]
pub struct ConfigError(pub String);

impl TpccConfig {
    /// The specification's cardinalities for `warehouses` warehouses.
    pub fn standard(warehouses: u64) -> TpccConfig {
        TpccConfig {
            warehouses,
            items: 100_000,
            customers_per_district: 3_000,
            orders_per_district: 3_000,
            new_orders_per_district: 900,
        }
    }

    /// A tiny database for tests: 1/100 of the spec's cardinalities (1 000 items, 30 customers and
    /// orders per district, 9 of them new).
    pub fn tiny(warehouses: u64) -> TpccConfig {
        TpccConfig {
            warehouses,
            items: 1_000,
            customers_per_district: 30,
            orders_per_district: 30,
            new_orders_per_district: 9,
        }
    }

    /// Checks the cardinalities against the key packing and the spec's rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError(s));
        if self.warehouses == 0 || self.warehouses > MAX_WAREHOUSES {
            return bad(format!("warehouses must be 1..={MAX_WAREHOUSES}"));
        }
        if self.items == 0 || self.items >= 1 << 24 {
            return bad("items must be 1..2^24".into());
        }
        if self.customers_per_district == 0 || self.customers_per_district >= 1 << 20 {
            return bad("customers per district must be 1..2^20".into());
        }
        if self.orders_per_district != self.customers_per_district {
            // Clause 4.3.3.1: O_C_ID is a permutation of the customer ids.
            return bad("orders per district must equal customers per district".into());
        }
        if self.new_orders_per_district > self.orders_per_district {
            return bad("new orders cannot exceed orders".into());
        }
        Ok(())
    }

    /// The largest last-name number used: 999, or fewer when there are fewer than 1 000
    /// customers per district (so that every name drawn exists).
    pub fn last_name_max(&self) -> u64 {
        self.customers_per_district.min(1000) - 1
    }

    /// Initial D_YTD in cents: the sum of the initial payments (10.00 per customer), 30 000.00
    /// at the spec's scale (clause 4.3.3.1), so that consistency conditions 8 and 9 hold.
    pub fn initial_district_ytd(&self) -> i64 {
        self.customers_per_district as i64 * 1_000
    }

    /// The first order id at load that is undelivered.
    pub fn first_new_order(&self) -> u64 {
        self.orders_per_district - self.new_orders_per_district + 1
    }
}

/// Packing of composite keys into the engine's 8-byte keys. Districts are `w·16 + d`; the fields
/// after it are in big-endian order so that a district's rows are contiguous in ordered indexes
/// and sorted by order id.
pub mod keys {
    /// WAREHOUSE key.
    pub fn warehouse(w: u64) -> u64 {
        w
    }
    /// DISTRICT key (also the prefix of the per-district keys below).
    pub fn district(w: u64, d: u64) -> u64 {
        (w << 4) | d
    }
    /// CUSTOMER key.
    pub fn customer(w: u64, d: u64, c: u64) -> u64 {
        (district(w, d) << 20) | c
    }
    /// ORDER and NEW-ORDER key.
    pub fn order(w: u64, d: u64, o: u64) -> u64 {
        (district(w, d) << 32) | o
    }
    /// The district part of an ORDER or NEW-ORDER key.
    pub fn order_district(key: u64) -> u64 {
        key >> 32
    }
    /// The order id part of an ORDER or NEW-ORDER key.
    pub fn order_id(key: u64) -> u64 {
        key & 0xffff_ffff
    }
    /// ORDER-LINE key: the order's key and the line number (1..=15).
    pub fn order_line(w: u64, d: u64, o: u64, number: u64) -> u64 {
        (order(w, d, o) << 4) | number
    }
    /// STOCK key.
    pub fn stock(w: u64, i: u64) -> u64 {
        (w << 24) | i
    }
}

/// The tables of a loaded TPC-C database, its scale, and what the transactions share.
#[derive(Debug)]
pub struct Tpcc {
    /// WAREHOUSE.
    pub warehouse: TableId,
    /// DISTRICT.
    pub district: TableId,
    /// CUSTOMER.
    pub customer: TableId,
    /// HISTORY.
    pub history: TableId,
    /// NEW-ORDER.
    pub new_order: TableId,
    /// ORDER.
    pub order: TableId,
    /// ORDER-LINE.
    pub order_line: TableId,
    /// ITEM.
    pub item: TableId,
    /// STOCK.
    pub stock: TableId,
    /// The one-row table holding the scale.
    pub meta: TableId,
    /// The scale.
    pub config: TpccConfig,
    /// NURand constants of the load.
    pub load_constants: NuRandConstants,
    /// NURand constants for the run (C_LAST at a permitted distance from the load's).
    pub constants: NuRandConstants,
    /// The next HISTORY key (HISTORY has no primary key in the spec; rows get a sequence number).
    history_seq: AtomicU64,
}

/// Why a TPC-C database could not be opened or loaded.
#[derive(Debug, thiserror::Error)]
pub enum TpccError {
    /// The database underneath.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database holds no (complete) TPC-C schema.
    #[error("not a TPC-C database: {0}")]
    NotTpcc(String),
}

impl From<TxError> for TpccError {
    fn from(e: TxError) -> Self {
        TpccError::Db(DbError::Tx(e))
    }
}

impl Tpcc {
    /// Creates the tables (empty) and records the scale.
    pub fn create(db: &Db, config: TpccConfig, seed: u64) -> Result<Tpcc, TpccError> {
        config.validate()?;
        for schema in schema::schemas() {
            db.create_table(schema)?;
        }
        Tpcc::init(db, &mut db.worker()?, config, seed)
    }

    /// Records the scale (through `worker`) in a database whose TPC-C tables (the
    /// [`schema::schemas`], in order) exist but are empty, e.g. created by the crash harness.
    pub fn init(
        db: &Db,
        worker: &mut Worker<'_>,
        config: TpccConfig,
        seed: u64,
    ) -> Result<Tpcc, TpccError> {
        config.validate()?;
        use rand::SeedableRng;
        let load = NuRandConstants::for_load(&mut rand::rngs::StdRng::seed_from_u64(!seed));
        let tpcc = Tpcc::attach(db, load, seed)?;
        worker.run(|tx| {
            tx.insert(
                tpcc.meta,
                0,
                &[
                    Value::U64(config.warehouses),
                    Value::U64(config.items),
                    Value::U64(config.customers_per_district),
                    Value::U64(config.orders_per_district),
                    Value::U64(config.new_orders_per_district),
                    Value::U64(load.c_last),
                    Value::U64(load.c_id),
                    Value::U64(load.ol_i_id),
                ],
            )
        })?;
        Ok(Tpcc { config, ..tpcc })
    }

    /// Opens the TPC-C tables of an existing database (e.g. after recovery), reading its scale.
    pub fn open(db: &Db, seed: u64) -> Result<Tpcc, TpccError> {
        Tpcc::open_with(db, &mut db.worker()?, seed)
    }

    /// As [`Tpcc::open`], reading through the caller's `worker` (no second worker slot taken).
    pub fn open_with(db: &Db, worker: &mut Worker<'_>, seed: u64) -> Result<Tpcc, TpccError> {
        let meta = db
            .table(schema::TABLE_NAMES[9])
            .ok_or_else(|| TpccError::NotTpcc(format!("no table {}", schema::TABLE_NAMES[9])))?;
        let row = worker
            .run(|tx| tx.get(meta, 0))
            .map_err(|e| TpccError::NotTpcc(format!("no scale recorded ({e})")))?;
        let load = NuRandConstants {
            c_last: row.u64(schema::meta::C_LAST_LOAD),
            c_id: row.u64(schema::meta::C_ID_LOAD),
            ol_i_id: row.u64(schema::meta::OL_I_ID_LOAD),
        };
        let mut tpcc = Tpcc::attach(db, load, seed)?;
        tpcc.config = TpccConfig {
            warehouses: row.u64(schema::meta::WAREHOUSES),
            items: row.u64(schema::meta::ITEMS),
            customers_per_district: row.u64(schema::meta::CUSTOMERS),
            orders_per_district: row.u64(schema::meta::ORDERS),
            new_orders_per_district: row.u64(schema::meta::NEW_ORDERS),
        };
        tpcc.config.validate()?;
        let history = tpcc.history;
        let last = worker.run(|tx| tx.scan_rev(history, u64::MAX, 1))?;
        let next = last.first().map_or(0, |(k, _)| k + 1);
        tpcc.history_seq.store(next, Ordering::Relaxed);
        Ok(tpcc)
    }

    fn attach(db: &Db, load: NuRandConstants, seed: u64) -> Result<Tpcc, TpccError> {
        let id = |i: usize| {
            db.table(schema::TABLE_NAMES[i])
                .ok_or_else(|| TpccError::NotTpcc(format!("no table {}", schema::TABLE_NAMES[i])))
        };
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        Ok(Tpcc {
            warehouse: id(0)?,
            district: id(1)?,
            customer: id(2)?,
            history: id(3)?,
            new_order: id(4)?,
            order: id(5)?,
            order_line: id(6)?,
            item: id(7)?,
            stock: id(8)?,
            meta: id(9)?,
            config: TpccConfig::standard(1),
            load_constants: load,
            constants: NuRandConstants::for_run(&load, &mut rng),
            history_seq: AtomicU64::new(0),
        })
    }

    /// A fresh HISTORY key.
    pub fn next_history_key(&self) -> u64 {
        self.history_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// HISTORY keys handed out so far plus the first one: the next key [`Tpcc::next_history_key`]
    /// returns (the crash harness derives a Payment's HISTORY key from it).
    pub fn peek_history_key(&self) -> u64 {
        self.history_seq.load(Ordering::Relaxed)
    }
}

/// The current time in seconds since the Unix epoch (dates in TPC-C rows; never 0, which means
/// null).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs().max(1))
}
