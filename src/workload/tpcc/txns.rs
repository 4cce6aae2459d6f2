//! The five TPC-C transactions (clause 2.4–2.8) as functions over a [`Tx`], with their inputs
//! generated as clause 2 prescribes. Each runs inside a caller's transaction (so `Worker::run`
//! retries conflicts); New-Order's deliberate rollback (clause 2.4.2.3) returns
//! [`TxError::UserAbort`].
//!
//! Money is in cents and rates in units of 0.0001 (see [`schema`](super::schema)).

use super::random::{last_name, nurand, trimmed, NuRandConstants};
use super::schema::{customer, district, item, order, order_line, stock, warehouse};
use super::{keys, Tpcc, TpccConfig, DISTRICTS};
use crate::db::{Row, Tx, Value};
use crate::engine::TxError;
use rand::Rng;

/// The transaction types, in the order of the standard mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnType {
    /// New-Order (clause 2.4).
    NewOrder,
    /// Payment (clause 2.5).
    Payment,
    /// Order-Status (clause 2.6).
    OrderStatus,
    /// Delivery (clause 2.7).
    Delivery,
    /// Stock-Level (clause 2.8).
    StockLevel,
}

impl TxnType {
    /// All five, in kind order.
    pub const ALL: [TxnType; 5] = [
        TxnType::NewOrder,
        TxnType::Payment,
        TxnType::OrderStatus,
        TxnType::Delivery,
        TxnType::StockLevel,
    ];

    /// The name used in results.
    pub fn name(self) -> &'static str {
        match self {
            TxnType::NewOrder => "new-order",
            TxnType::Payment => "payment",
            TxnType::OrderStatus => "order-status",
            TxnType::Delivery => "delivery",
            TxnType::StockLevel => "stock-level",
        }
    }

    /// Whether the transaction only reads.
    pub fn read_only(self) -> bool {
        matches!(self, TxnType::OrderStatus | TxnType::StockLevel)
    }
}

/// A random district id.
fn district_id(rng: &mut impl Rng) -> u64 {
    rng.gen_range(1..=DISTRICTS)
}

/// A warehouse other than `w`, or `w` when there is only one.
fn other_warehouse(rng: &mut impl Rng, config: &TpccConfig, w: u64) -> u64 {
    if config.warehouses <= 1 {
        return w;
    }
    let other = rng.gen_range(1..config.warehouses);
    if other >= w {
        other + 1
    } else {
        other
    }
}

/// How a transaction names its customer (clause 2.5.1.2, 2.6.1.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CustomerSelector {
    /// By C_ID.
    Id(u64),
    /// By C_LAST: the customer at position ⌈n/2⌉ of those with that name sorted by C_FIRST.
    LastName(Vec<u8>),
}

impl CustomerSelector {
    /// 60% by last name (NURand(255, 0, 999)), 40% by id (NURand(1023, 1, 3000)).
    pub fn generate(rng: &mut impl Rng, t: &Tpcc) -> CustomerSelector {
        if rng.gen_range(1..=100) <= 60 {
            let mut name = Vec::new();
            let n = nurand(rng, 255, t.constants.c_last, 0, t.config.last_name_max());
            last_name(n, &mut name);
            CustomerSelector::LastName(name)
        } else {
            CustomerSelector::Id(customer_id(rng, t))
        }
    }
}

fn customer_id(rng: &mut impl Rng, t: &Tpcc) -> u64 {
    customer_id_in(rng, &t.config, &t.constants)
}

fn customer_id_in(rng: &mut impl Rng, config: &TpccConfig, constants: &NuRandConstants) -> u64 {
    nurand(rng, 1023, constants.c_id, 1, config.customers_per_district)
}

/// Finds the customer `sel` names in district (w, d) and reads its row.
pub fn find_customer(
    tx: &mut Tx<'_>,
    t: &Tpcc,
    w: u64,
    d: u64,
    sel: &CustomerSelector,
) -> Result<(u64, Row), TxError> {
    match sel {
        CustomerSelector::Id(c) => Ok((*c, tx.get(t.customer, keys::customer(w, d, *c))?)),
        CustomerSelector::LastName(name) => {
            let keys = tx.lookup_secondary(
                t.customer,
                customer::BY_LAST_NAME,
                &[Value::U64(w), Value::U64(d), Value::Bytes(name)],
            )?;
            // The candidates' misses overlap (about three customers share a last name).
            tx.prefetch(t.customer, &keys);
            let mut matching = Vec::with_capacity(keys.len());
            for k in keys {
                let row = match tx.get(t.customer, k) {
                    Ok(row) => row,
                    // Gone between the index lookup and the read (not in TPC-C, which never
                    // deletes customers, but the index is no snapshot).
                    Err(TxError::NotFound { .. }) => continue,
                    Err(e) => return Err(e),
                };
                // Secondary keys are hashes: re-check the columns.
                if row.u64(customer::W_ID) == w
                    && row.u64(customer::D_ID) == d
                    && trimmed(row.bytes_at(customer::LAST)) == name.as_slice()
                {
                    matching.push(row);
                }
            }
            if matching.is_empty() {
                return Err(TxError::NotFound {
                    table: t.customer,
                    key: keys::customer(w, d, 0),
                });
            }
            matching.sort_by(|a, b| a.bytes_at(customer::FIRST).cmp(b.bytes_at(customer::FIRST)));
            let row = matching.swap_remove((matching.len() - 1) / 2);
            Ok((row.u64(customer::ID), row))
        }
    }
}

/// One order line of a New-Order input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderLineInput {
    /// OL_I_ID (an unused id makes the transaction roll back).
    pub item: u64,
    /// OL_SUPPLY_W_ID.
    pub supply_w: u64,
    /// OL_QUANTITY.
    pub quantity: u64,
}

/// New-Order's input (clause 2.4.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOrderInput {
    /// W_ID.
    pub w: u64,
    /// D_ID.
    pub d: u64,
    /// C_ID.
    pub c: u64,
    /// The lines (5 to 15).
    pub lines: Vec<OrderLineInput>,
    /// O_ENTRY_D.
    pub entry_d: u64,
}

impl NewOrderInput {
    /// Clause 2.4.1: random district, NURand customer, 5–15 NURand items with 1% from a remote
    /// warehouse, quantities 1–10, and in 1% of transactions an unused item as the last line.
    pub fn generate(rng: &mut impl Rng, t: &Tpcc, w: u64) -> NewOrderInput {
        Self::draw(rng, &t.config, &t.constants, w)
    }

    /// [`generate`](Self::generate) from the scale and the NURand constants alone (for the
    /// New-Order of the persistent-object API, `workload::ptm_neworder`).
    pub fn draw(
        rng: &mut impl Rng,
        config: &TpccConfig,
        constants: &NuRandConstants,
        w: u64,
    ) -> NewOrderInput {
        let d = district_id(rng);
        let c = customer_id_in(rng, config, constants);
        let count = rng.gen_range(5..=15);
        let rollback = rng.gen_range(1..=100) == 1;
        let lines = (0..count)
            .map(|i| {
                let item = if rollback && i == count - 1 {
                    config.items + 1
                } else {
                    nurand(rng, 8191, constants.ol_i_id, 1, config.items)
                };
                let supply_w = if rng.gen_range(1..=100) == 1 {
                    other_warehouse(rng, config, w)
                } else {
                    w
                };
                OrderLineInput {
                    item,
                    supply_w,
                    quantity: rng.gen_range(1..=10),
                }
            })
            .collect();
        NewOrderInput {
            w,
            d,
            c,
            lines,
            entry_d: super::now(),
        }
    }
}

/// What New-Order returns (clause 2.4.3.3, the parts a test can check).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOrderOutput {
    /// O_ID given to the order.
    pub o_id: u64,
    /// Per line: OL_AMOUNT (cents), S_QUANTITY after the update, brand-generic flag (b'B' or b'G').
    pub lines: Vec<(i64, i64, u8)>,
    /// The order total in cents: Σ OL_AMOUNT × (1 − C_DISCOUNT) × (1 + W_TAX + D_TAX), rounded
    /// down.
    pub total: i64,
}

/// New-Order (clause 2.4.2).
pub fn new_order(
    tx: &mut Tx<'_>,
    t: &Tpcc,
    input: &NewOrderInput,
) -> Result<NewOrderOutput, TxError> {
    let (w, d) = (input.w, input.d);
    // Every item, stock and the customer row are known from the input: start their misses
    // together, before the warehouse and district reads, which then overlap them.
    let items: smallvec::SmallVec<[u64; 15]> = input.lines.iter().map(|l| l.item).collect();
    let stocks: smallvec::SmallVec<[u64; 15]> = input
        .lines
        .iter()
        .map(|l| keys::stock(l.supply_w, l.item))
        .collect();
    // New-Order reads its customer and items and writes neither.
    tx.prefetch_read_only(t.customer, &[keys::customer(w, d, input.c)]);
    tx.prefetch_read_only(t.item, &items);
    tx.prefetch(t.stock, &stocks);
    // Rows are read as borrowed views (`get_ref`), taking only the columns the profile uses:
    // the same reads, without an owned copy per row.
    let w_tax = tx
        .get_ref(t.warehouse, keys::warehouse(w))?
        .i64(warehouse::TAX);
    let (d_tax, o_id) = {
        let dist = tx.get_ref(t.district, keys::district(w, d))?;
        (dist.i64(district::TAX), dist.u64(district::NEXT_O_ID))
    };
    tx.update(
        t.district,
        keys::district(w, d),
        &[(district::NEXT_O_ID, Value::U64(o_id + 1))],
    )?;
    let discount = tx
        .get_ref(t.customer, keys::customer(w, d, input.c))?
        .i64(customer::DISCOUNT);
    let all_local = input.lines.iter().all(|l| l.supply_w == w);
    // An O_ID taken by a concurrent New-Order (a stale D_NEXT_O_ID) is a conflict, not a
    // duplicate: the engine re-checks such misses against the read set.
    tx.insert(
        t.order,
        keys::order(w, d, o_id),
        &[
            Value::U64(o_id),
            Value::U64(d),
            Value::U64(w),
            Value::U64(input.c),
            Value::U64(input.entry_d),
            Value::U64(0),
            Value::U64(input.lines.len() as u64),
            Value::U64(u64::from(all_local)),
        ],
    )?;
    tx.insert(
        t.new_order,
        keys::order(w, d, o_id),
        &[Value::U64(o_id), Value::U64(d), Value::U64(w)],
    )?;
    let mut out = Vec::with_capacity(input.lines.len());
    let mut sum = 0i64;
    let original = |b: &[u8]| b.windows(8).any(|x| x == b"ORIGINAL");
    for (n, line) in input.lines.iter().enumerate() {
        let (price, item_original) = match tx.get_ref(t.item, line.item) {
            Ok(row) => (row.i64(item::PRICE), original(row.bytes_at(item::DATA))),
            // Clause 2.4.2.3: an unused item id rolls the whole transaction back.
            Err(TxError::NotFound { .. }) => return tx.abort(),
            Err(e) => return Err(e),
        };
        let skey = keys::stock(line.supply_w, line.item);
        let s = tx.get_ref(t.stock, skey)?;
        let (s_quantity, s_ytd, s_order_cnt, s_remote_cnt) = (
            s.i64(stock::QUANTITY),
            s.u64(stock::YTD),
            s.u64(stock::ORDER_CNT),
            s.u64(stock::REMOTE_CNT),
        );
        let stock_original = original(s.bytes_at(stock::DATA));
        let dist_info: [u8; stock::DIST_BYTES] = s
            .bytes_at(stock::DIST_01 + d as usize - 1)
            .try_into()
            .expect("S_DIST_xx is a fixed-size column");
        let q = line.quantity as i64;
        let new_quantity = if s_quantity >= q + 10 {
            s_quantity - q
        } else {
            s_quantity - q + 91
        };
        let remote = line.supply_w != w;
        tx.update(
            t.stock,
            skey,
            &[
                (stock::QUANTITY, Value::I64(new_quantity)),
                (stock::YTD, Value::U64(s_ytd + line.quantity)),
                (stock::ORDER_CNT, Value::U64(s_order_cnt + 1)),
                (
                    stock::REMOTE_CNT,
                    Value::U64(s_remote_cnt + u64::from(remote)),
                ),
            ],
        )?;
        let amount = q * price;
        sum += amount;
        let brand = if item_original && stock_original {
            b'B'
        } else {
            b'G'
        };
        let number = n as u64 + 1;
        tx.insert(
            t.order_line,
            keys::order_line(w, d, o_id, number),
            &[
                Value::U64(o_id),
                Value::U64(d),
                Value::U64(w),
                Value::U64(number),
                Value::U64(line.item),
                Value::U64(line.supply_w),
                Value::U64(0),
                Value::U64(line.quantity),
                Value::I64(amount),
                Value::Bytes(&dist_info),
            ],
        )?;
        out.push((amount, new_quantity, brand));
    }
    let total =
        i128::from(sum) * i128::from(10_000 - discount) * i128::from(10_000 + w_tax + d_tax)
            / 100_000_000;
    Ok(NewOrderOutput {
        o_id,
        lines: out,
        total: total as i64,
    })
}

/// Payment's input (clause 2.5.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentInput {
    /// W_ID (the terminal's warehouse).
    pub w: u64,
    /// D_ID.
    pub d: u64,
    /// C_W_ID (85% the home warehouse, 15% a remote one).
    pub c_w: u64,
    /// C_D_ID.
    pub c_d: u64,
    /// The customer.
    pub customer: CustomerSelector,
    /// H_AMOUNT in cents (1.00 to 5 000.00).
    pub amount: i64,
    /// H_DATE.
    pub date: u64,
}

impl PaymentInput {
    /// Clause 2.5.1: random district; 85% a home customer, 15% one of a random district of a
    /// remote warehouse; 60% by last name.
    pub fn generate(rng: &mut impl Rng, t: &Tpcc, w: u64) -> PaymentInput {
        let d = district_id(rng);
        let (c_w, c_d) = if rng.gen_range(1..=100) <= 85 {
            (w, d)
        } else {
            (other_warehouse(rng, &t.config, w), district_id(rng))
        };
        PaymentInput {
            w,
            d,
            c_w,
            c_d,
            customer: CustomerSelector::generate(rng, t),
            amount: rng.gen_range(100..=500_000),
            date: super::now(),
        }
    }
}

/// What Payment returns (the parts a test can check).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentOutput {
    /// The customer paid for.
    pub c_id: u64,
    /// C_BALANCE after the payment.
    pub balance: i64,
    /// C_CREDIT.
    pub credit: [u8; 2],
}

/// Payment (clause 2.5.2).
pub fn payment(tx: &mut Tx<'_>, t: &Tpcc, input: &PaymentInput) -> Result<PaymentOutput, TxError> {
    let (w, d) = (input.w, input.d);
    // H_DATA: W_NAME, four spaces, D_NAME (clause 2.5.2.2), gathered from the borrowed views of
    // the warehouse and district rows.
    let mut h_data = smallvec::SmallVec::<[u8; 32]>::new();
    let w_ytd = {
        let wh = tx.get_ref(t.warehouse, keys::warehouse(w))?;
        h_data.extend_from_slice(trimmed(wh.bytes_at(warehouse::NAME)));
        wh.i64(warehouse::YTD)
    };
    tx.update(
        t.warehouse,
        keys::warehouse(w),
        &[(warehouse::YTD, Value::I64(w_ytd + input.amount))],
    )?;
    h_data.extend_from_slice(b"    ");
    let d_ytd = {
        let dist = tx.get_ref(t.district, keys::district(w, d))?;
        h_data.extend_from_slice(trimmed(dist.bytes_at(district::NAME)));
        dist.i64(district::YTD)
    };
    tx.update(
        t.district,
        keys::district(w, d),
        &[(district::YTD, Value::I64(d_ytd + input.amount))],
    )?;
    let (c_id, c) = find_customer(tx, t, input.c_w, input.c_d, &input.customer)?;
    let balance = c.i64(customer::BALANCE) - input.amount;
    let credit: [u8; 2] = c.bytes_at(customer::CREDIT).try_into().expect("2 bytes");
    let ckey = keys::customer(input.c_w, input.c_d, c_id);
    // Clause 2.5.2.2: bad credit prepends the payment to C_DATA, keeping 500 characters.
    let data = (&credit == b"BC").then(|| {
        let mut data = format!(
            "{c_id} {} {} {d} {w} {}.{:02} ",
            input.c_d,
            input.c_w,
            input.amount / 100,
            input.amount % 100
        )
        .into_bytes();
        data.extend_from_slice(trimmed(c.bytes_at(customer::DATA)));
        data.truncate(500);
        data
    });
    let mut values: smallvec::SmallVec<[(usize, Value<'_>); 4]> = smallvec::smallvec![
        (customer::BALANCE, Value::I64(balance)),
        (
            customer::YTD_PAYMENT,
            Value::I64(c.i64(customer::YTD_PAYMENT) + input.amount),
        ),
        (
            customer::PAYMENT_CNT,
            Value::U64(c.u64(customer::PAYMENT_CNT) + 1),
        ),
    ];
    if let Some(data) = &data {
        values.push((customer::DATA, Value::Bytes(data)));
    }
    tx.update(t.customer, ckey, &values)?;
    tx.insert(
        t.history,
        t.next_history_key(),
        &[
            Value::U64(c_id),
            Value::U64(input.c_d),
            Value::U64(input.c_w),
            Value::U64(d),
            Value::U64(w),
            Value::U64(input.date),
            Value::I64(input.amount),
            Value::Bytes(&h_data),
        ],
    )?;
    Ok(PaymentOutput {
        c_id,
        balance,
        credit,
    })
}

/// Order-Status's input (clause 2.6.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderStatusInput {
    /// W_ID.
    pub w: u64,
    /// D_ID.
    pub d: u64,
    /// The customer.
    pub customer: CustomerSelector,
}

impl OrderStatusInput {
    /// Clause 2.6.1: random district, 60% by last name.
    pub fn generate(rng: &mut impl Rng, t: &Tpcc, w: u64) -> OrderStatusInput {
        OrderStatusInput {
            w,
            d: district_id(rng),
            customer: CustomerSelector::generate(rng, t),
        }
    }
}

/// What Order-Status returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderStatusOutput {
    /// The customer.
    pub c_id: u64,
    /// C_BALANCE.
    pub balance: i64,
    /// The customer's most recent order: O_ID and O_CARRIER_ID (0 = null), if any.
    pub order: Option<(u64, u64)>,
    /// Its lines: OL_I_ID, OL_SUPPLY_W_ID, OL_QUANTITY, OL_AMOUNT, OL_DELIVERY_D.
    pub lines: Vec<(u64, u64, u64, i64, u64)>,
}

/// Order-Status (clause 2.6.2), read-only.
pub fn order_status(
    tx: &mut Tx<'_>,
    t: &Tpcc,
    input: &OrderStatusInput,
) -> Result<OrderStatusOutput, TxError> {
    let (w, d) = (input.w, input.d);
    let (c_id, c) = find_customer(tx, t, w, d, &input.customer)?;
    let mut orders = tx.lookup_secondary(
        t.order,
        order::BY_CUSTOMER,
        &[Value::U64(w), Value::U64(d), Value::U64(c_id)],
    )?;
    // The most recent order is the largest O_ID; keys sort by O_ID within a district.
    orders.sort_unstable();
    let mut found = None;
    for &k in orders.iter().rev() {
        match tx.get(t.order, k) {
            Ok(row)
                if row.u64(order::W_ID) == w
                    && row.u64(order::D_ID) == d
                    && row.u64(order::C_ID) == c_id =>
            {
                found = Some(row);
                break;
            }
            Ok(_) | Err(TxError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    let mut lines = Vec::new();
    let order = match found {
        None => None,
        Some(o) => {
            let o_id = o.u64(order::ID);
            let ol_cnt = o.u64(order::OL_CNT) as usize;
            for (k, l) in tx.scan(t.order_line, keys::order_line(w, d, o_id, 0), ol_cnt)? {
                if k >> 4 != keys::order(w, d, o_id) {
                    break;
                }
                lines.push((
                    l.u64(order_line::I_ID),
                    l.u64(order_line::SUPPLY_W_ID),
                    l.u64(order_line::QUANTITY),
                    l.i64(order_line::AMOUNT),
                    l.u64(order_line::DELIVERY_D),
                ));
            }
            Some((o_id, o.u64(order::CARRIER_ID)))
        }
    };
    Ok(OrderStatusOutput {
        c_id,
        balance: c.i64(customer::BALANCE),
        order,
        lines,
    })
}

/// Delivery's input (clause 2.7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryInput {
    /// W_ID.
    pub w: u64,
    /// O_CARRIER_ID (1 to 10).
    pub carrier: u64,
    /// OL_DELIVERY_D.
    pub date: u64,
}

impl DeliveryInput {
    /// Clause 2.7.1: a random carrier.
    pub fn generate(rng: &mut impl Rng, w: u64) -> DeliveryInput {
        DeliveryInput {
            w,
            carrier: rng.gen_range(1..=10),
            date: super::now(),
        }
    }
}

/// Delivery (clause 2.7.4): for each district, delivers its oldest undelivered order, if any.
/// All ten districts are one database transaction (the spec allows one to ten). Returns the
/// order delivered in each district (`None` when it had none).
pub fn delivery(
    tx: &mut Tx<'_>,
    t: &Tpcc,
    input: &DeliveryInput,
) -> Result<Vec<Option<u64>>, TxError> {
    let w = input.w;
    // Three passes over the districts instead of one district after another, so that each
    // pass's misses (orders, then customers) overlap across districts: the transaction is the
    // same, only the order of its accesses differs.
    // 1. The oldest new order of each district: the first row at or after the district's
    //    lowest key, if it is in the district (a row deleted by a concurrent Delivery is
    //    skipped by the scan). Keys ascend, so the visit stops at the first row it is shown.
    let mut oldest = [0u64; DISTRICTS as usize];
    for d in 1..=DISTRICTS {
        let district_key = keys::district(w, d);
        let first = &mut oldest[(d - 1) as usize];
        tx.scan_refs(t.new_order, keys::order(w, d, 0), false, 4, &mut |k, _| {
            if keys::order_district(k) == district_key {
                *first = k;
            }
            false
        })?;
    }
    let pending: smallvec::SmallVec<[u64; 10]> =
        oldest.iter().copied().filter(|&k| k != 0).collect();
    tx.prefetch(t.order, &pending);
    // 2. Delete each new order, read its order and set the carrier. A concurrent Delivery that
    //    deleted the row since the scan read it makes the engine report a (retryable) conflict,
    //    not NotFound.
    let mut orders = [(0u64, 0u64, 0usize); DISTRICTS as usize];
    for ((d, &no_key), order) in (1..=DISTRICTS).zip(&oldest).zip(orders.iter_mut()) {
        if no_key == 0 {
            continue;
        }
        tx.delete(t.new_order, no_key)?;
        let (c_id, ol_cnt) = {
            let o = tx.get_ref(t.order, no_key)?;
            (o.u64(order::C_ID), o.u64(order::OL_CNT) as usize)
        };
        tx.update(
            t.order,
            no_key,
            &[(order::CARRIER_ID, Value::U64(input.carrier))],
        )?;
        *order = (keys::customer(w, d, c_id), keys::order_id(no_key), ol_cnt);
    }
    let customers: smallvec::SmallVec<[u64; 10]> =
        orders.iter().filter(|o| o.0 != 0).map(|o| o.0).collect();
    tx.prefetch(t.customer, &customers);
    // 3. Each order's lines get the delivery date; their sum goes to the customer's balance.
    let mut delivered = Vec::with_capacity(DISTRICTS as usize);
    for (d, (&no_key, &(ckey, o_id, ol_cnt))) in (1..=DISTRICTS).zip(oldest.iter().zip(&orders)) {
        if no_key == 0 {
            delivered.push(None);
            continue;
        }
        let mut sum = 0;
        let mut lines = smallvec::SmallVec::<[u64; 15]>::new();
        tx.scan_refs(
            t.order_line,
            keys::order_line(w, d, o_id, 0),
            false,
            ol_cnt,
            &mut |k, l| {
                if k >> 4 != no_key {
                    return false;
                }
                sum += l.i64(order_line::AMOUNT);
                lines.push(k);
                true
            },
        )?;
        for k in lines {
            tx.update(
                t.order_line,
                k,
                &[(order_line::DELIVERY_D, Value::U64(input.date))],
            )?;
        }
        let (balance, delivery_cnt) = {
            let c = tx.get_ref(t.customer, ckey)?;
            (c.i64(customer::BALANCE), c.u64(customer::DELIVERY_CNT))
        };
        tx.update(
            t.customer,
            ckey,
            &[
                (customer::BALANCE, Value::I64(balance + sum)),
                (customer::DELIVERY_CNT, Value::U64(delivery_cnt + 1)),
            ],
        )?;
        delivered.push(Some(o_id));
    }
    Ok(delivered)
}

/// Stock-Level's input (clause 2.8.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StockLevelInput {
    /// W_ID.
    pub w: u64,
    /// D_ID (fixed per terminal in the spec; random here, as there are no terminals).
    pub d: u64,
    /// The threshold (10 to 20).
    pub threshold: i64,
}

impl StockLevelInput {
    /// Clause 2.8.1: a random threshold in 10..=20.
    pub fn generate(rng: &mut impl Rng, w: u64) -> StockLevelInput {
        StockLevelInput {
            w,
            d: district_id(rng),
            threshold: rng.gen_range(10..=20),
        }
    }
}

/// Stock-Level (clause 2.8.2), read-only: the number of distinct items in the district's last
/// 20 orders whose home-warehouse stock is below the threshold.
pub fn stock_level(tx: &mut Tx<'_>, t: &Tpcc, input: &StockLevelInput) -> Result<u64, TxError> {
    let (w, d) = (input.w, input.d);
    let next = tx
        .get_ref(t.district, keys::district(w, d))?
        .u64(district::NEXT_O_ID);
    let first = next.saturating_sub(20).max(1);
    let end = keys::order_line(w, d, next, 0);
    let mut items = Vec::with_capacity(300);
    tx.scan_refs(
        t.order_line,
        keys::order_line(w, d, first, 0),
        false,
        (next - first) as usize * 15,
        &mut |k, row| {
            if k >= end {
                return false;
            }
            items.push(row.u64(order_line::I_ID));
            true
        },
    )?;
    items.sort_unstable();
    items.dedup();
    for item in items.iter_mut() {
        *item = keys::stock(w, *item);
    }
    tx.prefetch(t.stock, &items);
    let mut low = 0;
    for &stock_key in &items {
        if tx.get_ref(t.stock, stock_key)?.i64(stock::QUANTITY) < input.threshold {
            low += 1;
        }
    }
    Ok(low)
}
