//! The consistency conditions of TPC-C clause 3.3.2, checked over a whole database: 1–10 and 12.
//! Condition 11 (orders minus new orders per district equals 2 100) only holds right after the
//! load, before any Delivery, so it is not checked.
//!
//! The check reads the database in many small read-only transactions; run it when nothing else
//! runs (after a benchmark, after recovery), or its sums mix states.

use super::schema::{customer, district, history, new_order, order, order_line, warehouse};
use super::{keys, Tpcc, TpccError, DISTRICTS};
use crate::catalog::TableId;
use crate::db::{Db, Worker};
use crate::engine::{DbError, TxError};
use std::collections::{BTreeMap, HashMap};

/// Rows read per transaction when scanning.
const CHUNK: usize = 4096;

/// What the check looked at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsistencyReport {
    /// Warehouses checked.
    pub warehouses: u64,
    /// Districts checked.
    pub districts: u64,
    /// Customers checked.
    pub customers: u64,
    /// ORDER rows.
    pub orders: u64,
    /// NEW-ORDER rows.
    pub new_orders: u64,
    /// ORDER-LINE rows.
    pub order_lines: u64,
    /// HISTORY rows.
    pub history: u64,
}

/// One broken condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The condition's number in clause 3.3.2.
    pub condition: u8,
    /// Where and how.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "condition {}: {}", self.condition, self.detail)
    }
}

/// Why the check failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsistencyError {
    /// The database could not be read (or holds no TPC-C database).
    #[error(transparent)]
    Tpcc(#[from] TpccError),
    /// Conditions do not hold: the first few violations found (at most 20).
    #[error("TPC-C consistency violated: {}", .0.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; "))]
    Violations(Vec<Violation>),
}

impl From<DbError> for ConsistencyError {
    fn from(e: DbError) -> Self {
        ConsistencyError::Tpcc(TpccError::Db(e))
    }
}

/// At most this many violations are reported.
const MAX_VIOLATIONS: usize = 20;

fn u64_at(row: &[u8], col: usize) -> u64 {
    // Every column the check reads from ORDER, NEW-ORDER, ORDER-LINE and HISTORY comes after
    // u64/i64 columns only, so its offset is 8 × its position.
    u64::from_le_bytes(row[col * 8..col * 8 + 8].try_into().expect("8 bytes"))
}

fn i64_at(row: &[u8], col: usize) -> i64 {
    u64_at(row, col) as i64
}

/// Visits the rows of `table` with keys in `lo..hi`, ascending, in read-only transactions of
/// [`CHUNK`] rows.
fn scan_range(
    worker: &mut Worker<'_>,
    table: TableId,
    lo: u64,
    hi: u64,
    mut f: impl FnMut(u64, &[u8]),
) -> Result<(), DbError> {
    let mut from = lo;
    loop {
        let chunk = worker.run_read_only(|tx| {
            let mut rows = Vec::new();
            tx.scan_with(table, from, false, CHUNK, &mut |k, r| {
                if k >= hi {
                    return false;
                }
                rows.push((k, r.to_vec()));
                true
            })?;
            Ok::<_, TxError>(rows)
        })?;
        let full = chunk.len() == CHUNK;
        for (k, r) in &chunk {
            f(*k, r);
        }
        match chunk.last() {
            Some((k, _)) if full && *k < u64::MAX => from = k + 1,
            _ => return Ok(()),
        }
    }
}

struct Checker {
    violations: Vec<Violation>,
}

impl Checker {
    fn expect(&mut self, ok: bool, condition: u8, detail: impl FnOnce() -> String) {
        if !ok && self.violations.len() < MAX_VIOLATIONS {
            self.violations.push(Violation {
                condition,
                detail: detail(),
            });
        }
    }
}

/// Checks consistency conditions 1–10 and 12 of clause 3.3.2 on the TPC-C database in `db`.
pub fn check_consistency(db: &Db) -> Result<ConsistencyReport, ConsistencyError> {
    let t = Tpcc::open(db, 0)?;
    let config = t.config;
    let mut worker = db.worker()?;
    let mut report = ConsistencyReport::default();
    let mut checker = Checker {
        violations: Vec::new(),
    };

    // HISTORY: sums by (H_W_ID, H_D_ID) for conditions 8 and 9, by customer for 10.
    let mut by_district: HashMap<u64, i64> = HashMap::new();
    let mut by_customer: HashMap<u64, i64> = HashMap::new();
    scan_range(&mut worker, t.history, 0, u64::MAX, |_, r| {
        let amount = i64_at(r, history::AMOUNT);
        let (w, d) = (u64_at(r, history::W_ID), u64_at(r, history::D_ID));
        *by_district.entry(keys::district(w, d)).or_default() += amount;
        let c = keys::customer(
            u64_at(r, history::C_W_ID),
            u64_at(r, history::C_D_ID),
            u64_at(r, history::C_ID),
        );
        *by_customer.entry(c).or_default() += amount;
        report.history += 1;
    })?;

    for w in 1..=config.warehouses {
        let w_ytd = worker
            .run_read_only(|tx| tx.get(t.warehouse, keys::warehouse(w)))?
            .i64(warehouse::YTD);
        report.warehouses += 1;
        let mut d_ytd_sum = 0;
        let mut h_warehouse_sum = 0;
        for d in 1..=DISTRICTS {
            let dk = keys::district(w, d);
            let dist = worker.run_read_only(|tx| tx.get(t.district, dk))?;
            report.districts += 1;
            let d_ytd = dist.i64(district::YTD);
            let next_o_id = dist.u64(district::NEXT_O_ID);
            d_ytd_sum += d_ytd;
            let h_sum = by_district.get(&dk).copied().unwrap_or(0);
            h_warehouse_sum += h_sum;
            checker.expect(d_ytd == h_sum, 9, || {
                format!("district ({w},{d}): D_YTD {d_ytd} but the sum of H_AMOUNT is {h_sum}")
            });

            let (lo, hi) = (keys::order(w, d, 0), keys::order(w, d + 1, 0));
            let mut new_orders = Vec::new();
            scan_range(&mut worker, t.new_order, lo, hi, |_, r| {
                new_orders.push(u64_at(r, new_order::O_ID));
            })?;
            report.new_orders += new_orders.len() as u64;
            // o_id → (c_id, carrier, ol_cnt, lines found, delivered lines, delivered amount)
            let mut orders: BTreeMap<u64, (u64, u64, u64, u64, u64, i64)> = BTreeMap::new();
            scan_range(&mut worker, t.order, lo, hi, |_, r| {
                orders.insert(
                    u64_at(r, order::ID),
                    (
                        u64_at(r, order::C_ID),
                        u64_at(r, order::CARRIER_ID),
                        u64_at(r, order::OL_CNT),
                        0,
                        0,
                        0,
                    ),
                );
            })?;
            report.orders += orders.len() as u64;
            let mut lines_total = 0u64;
            let mut orphan_lines = Vec::new();
            scan_range(
                &mut worker,
                t.order_line,
                keys::order_line(w, d, 0, 0),
                keys::order_line(w, d + 1, 0, 0),
                |_, r| {
                    lines_total += 1;
                    let o_id = u64_at(r, order_line::O_ID);
                    let delivered = u64_at(r, order_line::DELIVERY_D) != 0;
                    match orders.get_mut(&o_id) {
                        Some(o) => {
                            o.3 += 1;
                            if delivered {
                                o.4 += 1;
                                o.5 += i64_at(r, order_line::AMOUNT);
                            }
                        }
                        None => orphan_lines.push(o_id),
                    }
                },
            )?;
            report.order_lines += lines_total;

            // Condition 2: D_NEXT_O_ID − 1 = max(O_ID) = max(NO_O_ID).
            let max_o = orders.keys().next_back().copied().unwrap_or(0);
            // Checked subtraction: a damaged row (D_NEXT_O_ID 0, e.g. after a bad recovery) is a
            // violation to report, not an overflow.
            checker.expect(next_o_id.checked_sub(1) == Some(max_o), 2, || {
                format!("district ({w},{d}): D_NEXT_O_ID {next_o_id} but max(O_ID) {max_o}")
            });
            if let (Some(&min_no), Some(&max_no)) = (new_orders.first(), new_orders.last()) {
                checker.expect(next_o_id.checked_sub(1) == Some(max_no), 2, || {
                    format!("district ({w},{d}): D_NEXT_O_ID {next_o_id} but max(NO_O_ID) {max_no}")
                });
                // Condition 3: the new orders are a contiguous range.
                let count = new_orders.len() as u64;
                checker.expect(max_no - min_no + 1 == count, 3, || {
                    format!(
                        "district ({w},{d}): NO_O_ID from {min_no} to {max_no} but {count} rows"
                    )
                });
            }
            // Condition 4: Σ O_OL_CNT = number of ORDER-LINE rows.
            let ol_cnt_sum: u64 = orders.values().map(|o| o.2).sum();
            checker.expect(ol_cnt_sum == lines_total, 4, || {
                format!("district ({w},{d}): Σ O_OL_CNT {ol_cnt_sum} but {lines_total} order lines")
            });
            checker.expect(orphan_lines.is_empty(), 6, || {
                format!(
                    "district ({w},{d}): order lines of missing orders {:?}",
                    &orphan_lines[..orphan_lines.len().min(5)]
                )
            });
            let mut delivered_by_customer: HashMap<u64, i64> = HashMap::new();
            for (&o_id, &(c_id, carrier, ol_cnt, lines, delivered_lines, amount)) in &orders {
                // Condition 5: O_CARRIER_ID is null iff a NEW-ORDER row exists.
                let is_new = new_orders.binary_search(&o_id).is_ok();
                checker.expect((carrier == 0) == is_new, 5, || {
                    format!(
                        "order ({w},{d},{o_id}): O_CARRIER_ID {carrier} but new-order row {}",
                        if is_new { "present" } else { "absent" }
                    )
                });
                // Condition 6: O_OL_CNT = its lines.
                checker.expect(ol_cnt == lines, 6, || {
                    format!("order ({w},{d},{o_id}): O_OL_CNT {ol_cnt} but {lines} lines")
                });
                // Condition 7: OL_DELIVERY_D is null iff O_CARRIER_ID is.
                let expected = if carrier == 0 { 0 } else { lines };
                checker.expect(delivered_lines == expected, 7, || {
                    format!(
                        "order ({w},{d},{o_id}): O_CARRIER_ID {carrier} but {delivered_lines} of \
                         {lines} lines delivered"
                    )
                });
                *delivered_by_customer.entry(c_id).or_default() += amount;
            }
            for c_id in 1..=config.customers_per_district {
                let ck = keys::customer(w, d, c_id);
                let c = worker.run_read_only(|tx| tx.get(t.customer, ck))?;
                report.customers += 1;
                let balance = c.i64(customer::BALANCE);
                let ytd = c.i64(customer::YTD_PAYMENT);
                let delivered = delivered_by_customer.get(&c_id).copied().unwrap_or(0);
                let paid = by_customer.get(&ck).copied().unwrap_or(0);
                // Condition 10: C_BALANCE = Σ delivered OL_AMOUNT − Σ H_AMOUNT.
                checker.expect(balance == delivered - paid, 10, || {
                    format!(
                        "customer ({w},{d},{c_id}): C_BALANCE {balance} but delivered {delivered} \
                         − paid {paid}"
                    )
                });
                // Condition 12: C_BALANCE + C_YTD_PAYMENT = Σ delivered OL_AMOUNT.
                checker.expect(balance + ytd == delivered, 12, || {
                    format!(
                        "customer ({w},{d},{c_id}): C_BALANCE {balance} + C_YTD_PAYMENT {ytd} but \
                         delivered {delivered}"
                    )
                });
            }
        }
        // Condition 1: W_YTD = Σ D_YTD.
        checker.expect(w_ytd == d_ytd_sum, 1, || {
            format!("warehouse {w}: W_YTD {w_ytd} but Σ D_YTD {d_ytd_sum}")
        });
        // Condition 8: W_YTD = Σ H_AMOUNT of its districts.
        checker.expect(w_ytd == h_warehouse_sum, 8, || {
            format!("warehouse {w}: W_YTD {w_ytd} but Σ H_AMOUNT {h_warehouse_sum}")
        });
    }
    if checker.violations.is_empty() {
        Ok(report)
    } else {
        Err(ConsistencyError::Violations(checker.violations))
    }
}
