//! TPC-C ([`crate::workload::tpcc`]) as a crash workload: a very small database is loaded before
//! the crash window, then New-Order, Payment and Delivery transactions of
//! [`crate::workload::tpcc::txns`] run under the crash simulator.
//!
//! The transactions are the benchmark's own, written against [`Tx`](crate::db::Tx); each notes
//! the keys it wrote (derived from its input and output: New-Order's district, order, new-order,
//! order lines and stock rows; Payment's warehouse, district, customer and history row;
//! Delivery's new-order, order, order lines and customer per district) with their after-images
//! in the oracle. A key it forgot would differ from its acknowledged value and be reported as
//! lost, so the derivation is itself checked by every crash-free image.
//!
//! After every recovery: the oracle's checks (every acknowledged row durable: with the DISTRICT
//! rows' `D_NEXT_O_ID`, the orders of every acknowledged New-Order; open transactions all or
//! nothing), the orders per district on the rows the oracle knows, and the consistency
//! conditions of clause 3.3.2 on the whole database
//! ([`crate::workload::tpcc::consistency::check_consistency`]).

use super::workload::{CrashWorkload, OTx, Observed, TxCtx, Write};
use crate::catalog::Schema;
use crate::db::Db;
use crate::engine::{DbError, TxError};
use crate::workload::tpcc::consistency::{check_consistency, ConsistencyError};
use crate::workload::tpcc::schema::{self, district, order};
use crate::workload::tpcc::txns::{self, DeliveryInput, NewOrderInput, PaymentInput};
use crate::workload::tpcc::{keys, load, Tpcc, TpccConfig, TpccError, DISTRICTS};
use rand::rngs::StdRng;
use rand::Rng;
use std::sync::atomic::{AtomicU64, Ordering};

/// The seed of the load's contents and the transactions' NURand constants.
const SEED: u64 = 0x7bcc;

/// Table positions in [`schema::schemas`] (the workload's table indexes).
const WAREHOUSE: usize = 0;
const DISTRICT: usize = 1;
const CUSTOMER: usize = 2;
const HISTORY: usize = 3;
const NEW_ORDER: usize = 4;
const ORDER: usize = 5;
const ORDER_LINE: usize = 6;
const ITEM: usize = 7;
const STOCK: usize = 8;
const META: usize = 9;

/// The scale crash tests use: one warehouse (its ten districts are fixed by the spec), 20 items,
/// 3 customers and orders per district, 1 of them new: about 450 rows, so that a run (creation,
/// load, transactions) is short. Every table still fits one heap page, so the pool is as large
/// as the ten tables make it (see `CrashTestConfig::pool_size`).
pub fn crash_config() -> TpccConfig {
    TpccConfig {
        warehouses: 1,
        items: 20,
        customers_per_district: 3,
        orders_per_district: 3,
        new_orders_per_district: 1,
    }
}

/// TPC-C under the oracle.
pub struct TpccCrash {
    /// The scale.
    pub config: TpccConfig,
    /// PM events when the last load finished (the crash window starts there).
    loaded_at: AtomicU64,
}

impl TpccCrash {
    /// The workload at scale `config`.
    pub fn new(config: TpccConfig) -> TpccCrash {
        TpccCrash {
            config,
            loaded_at: AtomicU64::new(0),
        }
    }
}

fn db_error(e: TpccError) -> DbError {
    match e {
        TpccError::Db(e) => e,
        other => DbError::Config(other.to_string()),
    }
}

/// Every row of the loaded database, as the writes of one acknowledged load.
fn loaded_rows(ctx: &mut TxCtx<'_, '_>, t: &Tpcc) -> Result<Vec<Write>, DbError> {
    let c = t.config;
    // Hashed tables: their keys, enumerated from the scale.
    let mut hashed: Vec<(usize, u64)> = vec![(META, 0)];
    hashed.extend((1..=c.items).map(|i| (ITEM, i)));
    for w in 1..=c.warehouses {
        hashed.push((WAREHOUSE, keys::warehouse(w)));
        hashed.extend((1..=c.items).map(|i| (STOCK, keys::stock(w, i))));
        for d in 1..=DISTRICTS {
            hashed.push((DISTRICT, keys::district(w, d)));
            hashed.extend(
                (1..=c.customers_per_district).map(|cu| (CUSTOMER, keys::customer(w, d, cu))),
            );
        }
    }
    let ids = [
        t.warehouse,
        t.district,
        t.customer,
        t.history,
        t.new_order,
        t.order,
        t.order_line,
        t.item,
        t.stock,
        t.meta,
    ];
    let writes = ctx.worker().run_read_only(|tx| {
        let mut writes = Vec::new();
        for &(table, key) in &hashed {
            writes.push(Write {
                table,
                key,
                row: Some(tx.get(ids[table], key)?.bytes().to_vec()),
                read: false,
            });
        }
        // Ordered tables: scanned whole.
        for table in [HISTORY, NEW_ORDER, ORDER, ORDER_LINE] {
            tx.scan_with(ids[table], 0, false, usize::MAX, &mut |key, row| {
                writes.push(Write {
                    table,
                    key,
                    row: Some(row.to_vec()),
                    read: false,
                });
                true
            })?;
        }
        Ok(writes)
    })?;
    Ok(writes)
}

/// New-Order, noting what it wrote.
fn new_order(otx: &mut OTx<'_, '_>, t: &Tpcc, input: &NewOrderInput) -> Result<(), TxError> {
    let out = txns::new_order(otx.tx(), t, input)?;
    let (w, d) = (input.w, input.d);
    otx.record(DISTRICT, keys::district(w, d))?;
    otx.record(ORDER, keys::order(w, d, out.o_id))?;
    otx.record(NEW_ORDER, keys::order(w, d, out.o_id))?;
    for (n, line) in input.lines.iter().enumerate() {
        otx.record(ORDER_LINE, keys::order_line(w, d, out.o_id, n as u64 + 1))?;
        otx.record(STOCK, keys::stock(line.supply_w, line.item))?;
    }
    Ok(())
}

/// Payment, noting what it wrote.
fn payment(otx: &mut OTx<'_, '_>, t: &Tpcc, input: &PaymentInput) -> Result<(), TxError> {
    let out = txns::payment(otx.tx(), t, input)?;
    otx.record(WAREHOUSE, keys::warehouse(input.w))?;
    otx.record(DISTRICT, keys::district(input.w, input.d))?;
    otx.record(CUSTOMER, keys::customer(input.c_w, input.c_d, out.c_id))?;
    // This attempt took the last HISTORY key handed out (`t` serves one transaction).
    otx.record(HISTORY, t.peek_history_key() - 1)?;
    Ok(())
}

/// Delivery, noting what it wrote.
fn delivery(otx: &mut OTx<'_, '_>, t: &Tpcc, input: &DeliveryInput) -> Result<(), TxError> {
    let delivered = txns::delivery(otx.tx(), t, input)?;
    let w = input.w;
    for (d, o_id) in (1..=DISTRICTS).zip(delivered) {
        let Some(o_id) = o_id else { continue };
        let key = keys::order(w, d, o_id);
        otx.record(NEW_ORDER, key)?;
        otx.record(ORDER, key)?;
        let o = otx.tx().get(t.order, key)?;
        for n in 1..=o.u64(order::OL_CNT) {
            otx.record(ORDER_LINE, keys::order_line(w, d, o_id, n))?;
        }
        otx.record(CUSTOMER, keys::customer(w, d, o.u64(order::C_ID)))?;
    }
    Ok(())
}

fn word(row: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(row[at..at + 8].try_into().expect("8 bytes"))
}

impl CrashWorkload for TpccCrash {
    fn name(&self) -> &'static str {
        "tpcc"
    }

    fn schemas(&self) -> Vec<Schema> {
        schema::schemas()
    }

    fn load(&self, ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError> {
        // On the context's worker: the run uses one worker slot, so one heap page per table.
        let db = ctx.db;
        let t = Tpcc::init(db, ctx.worker(), self.config, SEED).map_err(db_error)?;
        load::load_with(ctx.worker(), &t, SEED).map_err(db_error)?;
        let rows = loaded_rows(ctx, &t)?;
        ctx.record_loaded(rows);
        if let Some(sim) = ctx.db.engine().pool().and_then(|p| p.crash_sim()) {
            self.loaded_at.store(sim.events(), Ordering::Relaxed);
        }
        Ok(())
    }

    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError> {
        // Opened per transaction: it carries the next HISTORY key, read from the database.
        let db = ctx.db;
        let t = Tpcc::open_with(db, ctx.worker(), SEED).map_err(db_error)?;
        let w = rng.gen_range(1..=t.config.warehouses);
        // Fixed dates: the rows of a rerun crash point are the same.
        let op = rng.gen_range(0..100u32);
        if op < 50 {
            let mut input = NewOrderInput::generate(rng, &t, w);
            input.entry_d = 1;
            ctx.run(|otx| new_order(otx, &t, &input))?;
        } else if op < 85 {
            let mut input = PaymentInput::generate(rng, &t, w);
            input.date = 1;
            ctx.run(|otx| payment(otx, &t, &input))?;
        } else {
            let mut input = DeliveryInput::generate(rng, w);
            input.date = 1;
            ctx.run(|otx| delivery(otx, &t, &input))?;
        }
        Ok(())
    }

    /// On the rows the oracle knows (every loaded row and every row a transaction wrote): each
    /// district holds exactly the orders `1..D_NEXT_O_ID`. With the durability check (the
    /// acknowledged `D_NEXT_O_ID` recovered), every order of an acknowledged New-Order is there.
    fn check(&self, rows: &Observed) -> Vec<String> {
        let schemas = schema::schemas();
        let next_at = schemas[DISTRICT].column_offset(district::NEXT_O_ID);
        let mut problems = Vec::new();
        for (&dk, row) in &rows[DISTRICT] {
            let next = word(row, next_at);
            let ids: Vec<u64> = rows[ORDER]
                .keys()
                .filter(|&&k| keys::order_district(k) == dk)
                .map(|&k| keys::order_id(k))
                .collect();
            if ids.len() as u64 != next.saturating_sub(1)
                || ids.iter().enumerate().any(|(i, &o)| o != i as u64 + 1)
            {
                problems.push(format!(
                    "district {dk:#x}: D_NEXT_O_ID {next} but {} orders (ids {:?})",
                    ids.len(),
                    &ids[ids.len().saturating_sub(4)..]
                ));
            }
        }
        problems
    }

    fn check_db(&self, db: &Db) -> Vec<String> {
        match check_consistency(db) {
            Ok(_) => Vec::new(),
            Err(ConsistencyError::Violations(v)) => v.iter().map(|v| v.to_string()).collect(),
            Err(e) => vec![format!("the TPC-C consistency check failed: {e}")],
        }
    }

    fn crash_window_start(&self) -> u64 {
        self.loaded_at.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn state(next_o_id: u64, orders: &[u64]) -> Observed {
        let schemas = schema::schemas();
        let mut rows: Observed = vec![BTreeMap::new(); schemas.len()];
        let mut d = vec![0u8; schemas[DISTRICT].row_size()];
        let at = schemas[DISTRICT].column_offset(district::NEXT_O_ID);
        d[at..at + 8].copy_from_slice(&next_o_id.to_le_bytes());
        rows[DISTRICT].insert(keys::district(1, 1), d);
        for &o in orders {
            let row = vec![0u8; schemas[ORDER].row_size()];
            rows[ORDER].insert(keys::order(1, 1, o), row);
        }
        rows
    }

    #[test]
    fn orders_per_district_must_match_d_next_o_id() {
        let w = TpccCrash::new(crash_config());
        assert!(w.check(&state(4, &[1, 2, 3])).is_empty());
        // The order of an acknowledged New-Order (D_NEXT_O_ID 4) is missing, or one is too many.
        assert_eq!(w.check(&state(4, &[1, 2])).len(), 1);
        assert_eq!(w.check(&state(3, &[1, 2, 3])).len(), 1);
        // A gap.
        assert_eq!(w.check(&state(4, &[1, 2, 4])).len(), 1);
        crash_config().validate().unwrap();
    }
}
