//! TPC-C's New-Order transaction on the key-value store over the persistent-object API
//! ([`ptm_kv`](super::ptm_kv)), as ArchTM §6.2 runs it: "each application thread works on its
//! corresponding warehouse and executes new order transactions" (a 100 % update workload that
//! inserts 12–17 records and updates 6–16 per transaction).
//!
//! Eight TPC-C tables as key-value tables of fixed-size records with the specification's
//! column sizes (clause 1.3; HISTORY is not touched by New-Order and left out), keys packed as
//! the table engines' TPC-C ([`tpcc::keys`](super::tpcc::keys)). The input generation is clause 2.4.1: district
//! uniform, customer NURand(1023), 5–15 lines, items NURand(8191), 1 % of supplying warehouses
//! remote (with more than one warehouse), quantities 1–10, and 1 % of transactions naming an
//! unused item in their last line, which rolls the transaction back (clause 2.4.2.3).
//!
//! Departures, and why: the population is the specification's (clause 4.3.3.1) except that no
//! initial orders are loaded and `D_NEXT_O_ID` starts at 1 (New-Order never reads ORDER,
//! NEW-ORDER or ORDER-LINE, so their initial rows would only lengthen the load), and STOCK's
//! `S_YTD`/`S_ORDER_CNT`/`S_REMOTE_CNT` start at 0 so that [`check`] can balance them exactly
//! against the order lines.

use super::ptm_kv::{all_keys, KvRoot, Table};
use super::tpcc::keys;
use super::tpcc::random::{astring, data_with_original, nurand, state, zip, NuRandConstants};
use super::tpcc::txns::NewOrderInput;
use super::tpcc::{TpccConfig, DISTRICTS};
use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::ptm::{PObject, PTx, PtmError, PtmRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};

crate::pobject! {
    /// The street address of a warehouse, district or customer.
    #[derive(Clone, Copy, Debug)]
    pub struct Address {
        /// STREET_1, STREET_2.
        pub street: [[u8; 20]; 2],
        /// CITY.
        pub city: [u8; 20],
        /// STATE.
        pub state: [u8; 2],
        /// ZIP.
        pub zip: [u8; 9],
    }
}

impl Address {
    /// A random address (clause 4.3.3.1).
    fn random(rng: &mut StdRng, buf: &mut Vec<u8>) -> Address {
        Address {
            street: [text(rng, 10, buf), text(rng, 10, buf)],
            city: text(rng, 10, buf),
            state: {
                state(rng, buf);
                fixed(buf)
            },
            zip: {
                zip(rng, buf);
                fixed(buf)
            },
        }
    }
}

crate::pobject! {
    /// WAREHOUSE (W_ID in the key).
    #[derive(Clone, Copy, Debug)]
    pub struct Warehouse {
        /// W_TAX in 1/10 000.
        pub tax: i64,
        /// W_YTD in cents.
        pub ytd: i64,
        /// W_NAME.
        pub name: [u8; 10],
        /// W_STREET_1, W_STREET_2, W_CITY, W_STATE, W_ZIP.
        pub address: Address,
    }
}

crate::pobject! {
    /// DISTRICT.
    #[derive(Clone, Copy, Debug)]
    pub struct District {
        /// D_NEXT_O_ID.
        pub next_o_id: u64,
        /// D_TAX in 1/10 000.
        pub tax: i64,
        /// D_YTD in cents.
        pub ytd: i64,
        /// D_NAME.
        pub name: [u8; 10],
        /// D_STREET_1, D_STREET_2, D_CITY, D_STATE, D_ZIP.
        pub address: Address,
    }
}

crate::pobject! {
    /// CUSTOMER.
    #[derive(Clone, Copy, Debug)]
    pub struct Customer {
        /// C_DISCOUNT in 1/10 000.
        pub discount: i64,
        /// C_CREDIT_LIM in cents.
        pub credit_lim: i64,
        /// C_BALANCE in cents.
        pub balance: i64,
        /// C_YTD_PAYMENT in cents.
        pub ytd_payment: i64,
        /// C_PAYMENT_CNT.
        pub payment_cnt: u64,
        /// C_DELIVERY_CNT.
        pub delivery_cnt: u64,
        /// C_SINCE.
        pub since: u64,
        /// C_FIRST.
        pub first: [u8; 16],
        /// C_MIDDLE.
        pub middle: [u8; 2],
        /// C_LAST.
        pub last: [u8; 16],
        /// C_CREDIT ("GC" or "BC").
        pub credit: [u8; 2],
        /// C_STREET_1, C_STREET_2, C_CITY, C_STATE, C_ZIP.
        pub address: Address,
        /// C_PHONE.
        pub phone: [u8; 16],
        /// C_DATA.
        pub data: [u8; 500],
    }
}

crate::pobject! {
    /// ITEM.
    #[derive(Clone, Copy, Debug)]
    pub struct Item {
        /// I_IM_ID.
        pub im_id: u64,
        /// I_PRICE in cents.
        pub price: i64,
        /// I_NAME.
        pub name: [u8; 24],
        /// I_DATA.
        pub data: [u8; 50],
    }
}

crate::pobject! {
    /// STOCK.
    #[derive(Clone, Copy, Debug)]
    pub struct Stock {
        /// S_QUANTITY.
        pub quantity: i64,
        /// S_YTD.
        pub ytd: u64,
        /// S_ORDER_CNT.
        pub order_cnt: u64,
        /// S_REMOTE_CNT.
        pub remote_cnt: u64,
        /// S_DIST_01..S_DIST_10.
        pub dist: [[u8; 24]; 10],
        /// S_DATA.
        pub data: [u8; 50],
    }
}

crate::pobject! {
    /// ORDER.
    #[derive(Clone, Copy, Debug)]
    pub struct Order {
        /// O_C_ID.
        pub c_id: u64,
        /// O_ENTRY_D.
        pub entry_d: u64,
        /// O_CARRIER_ID (0: null).
        pub carrier_id: u64,
        /// O_OL_CNT.
        pub ol_cnt: u64,
        /// O_ALL_LOCAL.
        pub all_local: u64,
    }
}

crate::pobject! {
    /// NEW-ORDER.
    #[derive(Clone, Copy, Debug)]
    pub struct NewOrder {
        /// NO_O_ID.
        pub o_id: u64,
    }
}

crate::pobject! {
    /// ORDER-LINE.
    #[derive(Clone, Copy, Debug)]
    pub struct OrderLine {
        /// OL_I_ID.
        pub i_id: u64,
        /// OL_SUPPLY_W_ID.
        pub supply_w_id: u64,
        /// OL_DELIVERY_D (0: null).
        pub delivery_d: u64,
        /// OL_QUANTITY.
        pub quantity: u64,
        /// OL_AMOUNT in cents.
        pub amount: i64,
        /// OL_DIST_INFO.
        pub dist_info: [u8; 24],
    }
}

/// Meta words of the root: warehouses, items, customers per district, and NURand's C.
const META_WAREHOUSES: usize = 0;
const META_ITEMS: usize = 1;
const META_CUSTOMERS: usize = 2;
const META_C_ID: usize = 3;
const META_OL_I_ID: usize = 4;

/// The New-Order database: its tables and scale.
pub struct NewOrderDb {
    /// WAREHOUSE.
    pub warehouse: Table<Warehouse>,
    /// DISTRICT.
    pub district: Table<District>,
    /// CUSTOMER.
    pub customer: Table<Customer>,
    /// ITEM.
    pub item: Table<Item>,
    /// STOCK.
    pub stock: Table<Stock>,
    /// ORDER.
    pub order: Table<Order>,
    /// NEW-ORDER.
    pub new_order: Table<NewOrder>,
    /// ORDER-LINE.
    pub order_line: Table<OrderLine>,
    /// Warehouses, items, customers per district (orders are not loaded).
    pub config: TpccConfig,
    /// NURand's C for customer and item ids.
    pub constants: NuRandConstants,
}

fn text<const N: usize>(rng: &mut StdRng, min: usize, out: &mut Vec<u8>) -> [u8; N] {
    astring(rng, min, N, out);
    fixed(out)
}

/// `bytes` zero-padded to a fixed-width column.
fn fixed<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a[..bytes.len()].copy_from_slice(bytes);
    a
}

/// Records per loading transaction.
const LOAD_BATCH: u64 = 256;

impl NewOrderDb {
    /// Creates the tables and loads the population of `config` (orders excluded, see the module
    /// doc) in transactions of a few hundred records; `seed` draws it.
    pub fn load(
        ptm: &dyn PtmRunner<KvRoot>,
        config: TpccConfig,
        seed: u64,
    ) -> Result<NewOrderDb, PtmError> {
        config
            .validate()
            .map_err(|e| PtmError::Pool(e.to_string()))?;
        let mut rng = StdRng::seed_from_u64(seed);
        let constants = NuRandConstants::for_load(&mut rng);
        let w = config.warehouses;
        let per_district = config.customers_per_district;
        ptm.run(|tx| {
            let root = tx.root();
            tx.update(root, |r| {
                r.meta[META_WAREHOUSES] = w;
                r.meta[META_ITEMS] = config.items;
                r.meta[META_CUSTOMERS] = per_district;
                r.meta[META_C_ID] = constants.c_id;
                r.meta[META_OL_I_ID] = constants.ol_i_id;
            })
        })?;
        // Room for about 2 pairs per bucket at load; the order tables for a few hundred
        // thousand orders (chains lengthen past that, but New-Order never walks them).
        let db = NewOrderDb {
            warehouse: Table::create(ptm, 0, w)?,
            district: Table::create(ptm, 1, w * DISTRICTS)?,
            customer: Table::create(ptm, 2, (w * DISTRICTS * per_district).div_ceil(2))?,
            item: Table::create(ptm, 3, config.items.div_ceil(2))?,
            stock: Table::create(ptm, 4, (w * config.items).div_ceil(2))?,
            order: Table::create(ptm, 5, (w << 15).min(1 << 19))?,
            new_order: Table::create(ptm, 6, (w << 15).min(1 << 19))?,
            order_line: Table::create(ptm, 7, (w << 17).min(1 << 19))?,
            config,
            constants,
        };
        db.batched(ptm, config.items, |tx, db, i| {
            let rng = &mut StdRng::seed_from_u64(seed ^ (i << 8) ^ 1);
            let mut buf = Vec::new();
            let mut data = Vec::new();
            data_with_original(rng, 26, 50, &mut data);
            let mut d = [0u8; 50];
            d[..data.len()].copy_from_slice(&data);
            db.item.insert_new(
                tx,
                i + 1,
                &Item {
                    im_id: rng.gen_range(1..=10_000),
                    price: rng.gen_range(100..=10_000),
                    name: text(rng, 14, &mut buf),
                    data: d,
                },
            )
        })?;
        for wid in 1..=w {
            let rng = &mut StdRng::seed_from_u64(seed ^ (wid << 40));
            ptm.run(|tx| {
                let mut b = Vec::new();
                db.warehouse.insert_new(
                    tx,
                    keys::warehouse(wid),
                    &Warehouse {
                        tax: rng.gen_range(0..=2000),
                        ytd: 30_000_000,
                        name: text(rng, 6, &mut b),
                        address: Address::random(rng, &mut b),
                    },
                )?;
                for did in 1..=DISTRICTS {
                    db.district.insert_new(
                        tx,
                        keys::district(wid, did),
                        &District {
                            next_o_id: 1,
                            tax: rng.gen_range(0..=2000),
                            ytd: 3_000_000,
                            name: text(rng, 6, &mut b),
                            address: Address::random(rng, &mut b),
                        },
                    )?;
                }
                Ok(())
            })?;
            db.batched(ptm, config.items, |tx, db, i| {
                let rng = &mut StdRng::seed_from_u64(seed ^ (wid << 40) ^ (i << 8) ^ 2);
                let mut b = Vec::new();
                let mut data = Vec::new();
                data_with_original(rng, 26, 50, &mut data);
                let mut d = [0u8; 50];
                d[..data.len()].copy_from_slice(&data);
                db.stock.insert_new(
                    tx,
                    keys::stock(wid, i + 1),
                    &Stock {
                        quantity: rng.gen_range(10..=100),
                        ytd: 0,
                        order_cnt: 0,
                        remote_cnt: 0,
                        dist: std::array::from_fn(|_| text(rng, 24, &mut b)),
                        data: d,
                    },
                )
            })?;
            db.batched(ptm, DISTRICTS * per_district, |tx, db, n| {
                let (did, cid) = (n / per_district + 1, n % per_district + 1);
                let rng = &mut StdRng::seed_from_u64(seed ^ (wid << 40) ^ (n << 8) ^ 3);
                let mut b = Vec::new();
                let mut last = [0u8; 16];
                let mut name = Vec::new();
                let number = if cid <= 1000 {
                    cid - 1
                } else {
                    nurand(rng, 255, constants.c_last, 0, config.last_name_max())
                };
                super::tpcc::random::last_name(number, &mut name);
                last[..name.len()].copy_from_slice(&name);
                db.customer.insert_new(
                    tx,
                    keys::customer(wid, did, cid),
                    &Customer {
                        discount: rng.gen_range(0..=5000),
                        credit_lim: 5_000_000,
                        balance: -1000,
                        ytd_payment: 1000,
                        payment_cnt: 1,
                        delivery_cnt: 0,
                        since: 1,
                        first: text(rng, 8, &mut b),
                        middle: *b"OE",
                        last,
                        credit: if rng.gen_range(0..10) == 0 {
                            *b"BC"
                        } else {
                            *b"GC"
                        },
                        address: Address::random(rng, &mut b),
                        phone: text(rng, 16, &mut b),
                        data: text(rng, 300, &mut b),
                    },
                )
            })?;
        }
        Ok(db)
    }

    /// Runs `f(tx, db, i)` for `i` in `0..n`, [`LOAD_BATCH`] per transaction.
    fn batched(
        &self,
        ptm: &dyn PtmRunner<KvRoot>,
        n: u64,
        f: impl Fn(&mut PTx<'_, KvRoot>, &NewOrderDb, u64) -> Result<(), PtmError>,
    ) -> Result<(), PtmError> {
        let mut i = 0;
        while i < n {
            let end = (i + LOAD_BATCH).min(n);
            ptm.run(|tx| (i..end).try_for_each(|j| f(tx, self, j)))?;
            i = end;
        }
        Ok(())
    }

    /// Opens the tables of a loaded database (e.g. after a restart).
    pub fn open(ptm: &dyn PtmRunner<KvRoot>) -> Result<NewOrderDb, PtmError> {
        ptm.run(|tx| {
            let r = tx.read(tx.root())?;
            let config = TpccConfig {
                warehouses: r.meta[META_WAREHOUSES],
                items: r.meta[META_ITEMS],
                customers_per_district: r.meta[META_CUSTOMERS],
                orders_per_district: r.meta[META_CUSTOMERS],
                new_orders_per_district: 0,
            };
            config
                .validate()
                .map_err(|e| PtmError::Pool(format!("not a New-Order database: {e}")))?;
            Ok(NewOrderDb {
                warehouse: Table::open(tx, 0)?,
                district: Table::open(tx, 1)?,
                customer: Table::open(tx, 2)?,
                item: Table::open(tx, 3)?,
                stock: Table::open(tx, 4)?,
                order: Table::open(tx, 5)?,
                new_order: Table::open(tx, 6)?,
                order_line: Table::open(tx, 7)?,
                config,
                constants: NuRandConstants {
                    c_last: 0,
                    c_id: r.meta[META_C_ID],
                    ol_i_id: r.meta[META_OL_I_ID],
                },
            })
        })
    }
}

impl NewOrderDb {
    /// Draws the input of a New-Order at home warehouse `w_id` (clause 2.4.1, as the table
    /// engines' TPC-C draws it).
    pub fn input(&self, rng: &mut StdRng, w_id: u64) -> NewOrderInput {
        NewOrderInput::draw(rng, &self.config, &self.constants, w_id)
    }

    /// Runs New-Order (clause 2.4.2) in `tx`; returns the bytes of the records it put (the
    /// bytes the application asks to change) or [`PtmError::UserAbort`] for an unused item.
    pub fn new_order(
        &self,
        tx: &mut PTx<'_, KvRoot>,
        input: &NewOrderInput,
    ) -> Result<u64, PtmError> {
        let (w_id, d_id) = (input.w, input.d);
        let gone = |what: &str| PtmError::Pool(format!("New-Order: {what} is missing"));
        let w = self
            .warehouse
            .get(tx, keys::warehouse(w_id))?
            .ok_or_else(|| gone("the warehouse"))?;
        let dkey = keys::district(w_id, d_id);
        let mut d = self
            .district
            .get(tx, dkey)?
            .ok_or_else(|| gone("the district"))?;
        let o_id = d.next_o_id;
        d.next_o_id += 1;
        self.district.put(tx, dkey, &d)?;
        let c = self
            .customer
            .get(tx, keys::customer(w_id, d_id, input.c))?
            .ok_or_else(|| gone("the customer"))?;
        let all_local = input.lines.iter().all(|l| l.supply_w == w_id);
        let okey = keys::order(w_id, d_id, o_id);
        self.order.insert_new(
            tx,
            okey,
            &Order {
                c_id: input.c,
                entry_d: super::tpcc::now(),
                carrier_id: 0,
                ol_cnt: input.lines.len() as u64,
                all_local: u64::from(all_local),
            },
        )?;
        self.new_order.insert_new(tx, okey, &NewOrder { o_id })?;
        let mut put = (District::SIZE + Order::SIZE + NewOrder::SIZE) as u64;
        let mut total = 0i64;
        for (n, line) in input.lines.iter().enumerate() {
            let Some(item) = self.item.get(tx, line.item)? else {
                // Clause 2.4.2.3: an unused item rolls the whole transaction back.
                return tx.abort();
            };
            let skey = keys::stock(line.supply_w, line.item);
            let mut s = self
                .stock
                .get(tx, skey)?
                .ok_or_else(|| gone("a stock row"))?;
            let q = line.quantity as i64;
            s.quantity = if s.quantity >= q + 10 {
                s.quantity - q
            } else {
                s.quantity - q + 91
            };
            s.ytd += line.quantity;
            s.order_cnt += 1;
            if line.supply_w != w_id {
                s.remote_cnt += 1;
            }
            self.stock.put(tx, skey, &s)?;
            let amount = q * item.price;
            total += amount;
            self.order_line.insert_new(
                tx,
                keys::order_line(w_id, d_id, o_id, n as u64 + 1),
                &OrderLine {
                    i_id: line.item,
                    supply_w_id: line.supply_w,
                    delivery_d: 0,
                    quantity: line.quantity,
                    amount,
                    dist_info: s.dist[d_id as usize - 1],
                },
            )?;
            put += (Stock::SIZE + OrderLine::SIZE) as u64;
        }
        // The total the terminal displays (clause 2.4.2.2); nothing stores it.
        let _ = total * (10_000 - c.discount) * (10_000 + w.tax + d.tax);
        Ok(put)
    }
}

/// What [`check`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Orders (= NEW-ORDER rows).
    pub orders: u64,
    /// Order lines.
    pub order_lines: u64,
}

/// Checks the database after any number of New-Orders (and after a restart):
///
/// 1. For every district, `D_NEXT_O_ID − 1` orders exist with ids `1..D_NEXT_O_ID` (TPC-C
///    consistency condition 2), none beyond, each with its NEW-ORDER row and exactly `O_OL_CNT`
///    (5–15) order lines (condition 6).
/// 2. ORDER, NEW-ORDER and ORDER-LINE hold no other rows (a scan of every bucket).
/// 3. Per supplying warehouse, `Σ S_YTD` equals the quantities of the order lines it supplied,
///    `Σ S_ORDER_CNT` their number and `Σ S_REMOTE_CNT` the remote ones, and every
///    `S_QUANTITY` is in 10..=100 (the stock starts at 0 and only New-Order changes it).
pub fn check(ptm: &dyn PtmRunner<KvRoot>, db: &NewOrderDb) -> Result<CheckReport, String> {
    let c = db.config;
    let e = |e: PtmError| e.to_string();
    let mut report = CheckReport::default();
    // Per warehouse: (quantity, lines, remote lines) supplied.
    let mut supplied = vec![(0u64, 0u64, 0u64); c.warehouses as usize + 1];
    for w in 1..=c.warehouses {
        for d in 1..=DISTRICTS {
            let next = ptm
                .run(|tx| db.district.get(tx, keys::district(w, d)))
                .map_err(e)?
                .ok_or(format!("district ({w}, {d}) is missing"))?
                .next_o_id;
            for o in 1..=next {
                let okey = keys::order(w, d, o);
                let lines = ptm
                    .run(|tx| {
                        let order = db.order.get(tx, okey)?;
                        let no = db.new_order.get(tx, okey)?;
                        let mut lines = Vec::new();
                        if let Some(order) = order {
                            for n in 1..=order.ol_cnt + 1 {
                                lines.push(db.order_line.get(tx, keys::order_line(w, d, o, n))?);
                            }
                        }
                        Ok((order, no, lines))
                    })
                    .map_err(e)?;
                match lines {
                    (None, None, _) if o == next => {}
                    (Some(_), _, _) if o == next => {
                        return Err(format!(
                            "district ({w}, {d}): order {o} exists but D_NEXT_O_ID is {next}"
                        ))
                    }
                    (Some(order), Some(no), lines)
                        if no.o_id == o
                            && (5..=15).contains(&order.ol_cnt)
                            && lines.last().is_some_and(Option::is_none)
                            && lines[..lines.len() - 1].iter().all(Option::is_some) =>
                    {
                        report.orders += 1;
                        for l in lines.iter().flatten() {
                            report.order_lines += 1;
                            let s = &mut supplied[l.supply_w_id as usize];
                            s.0 += l.quantity;
                            s.1 += 1;
                            s.2 += u64::from(l.supply_w_id != w);
                        }
                    }
                    other => {
                        return Err(format!(
                            "district ({w}, {d}): order {o} below D_NEXT_O_ID {next} is \
                             incomplete: order {:?}, new-order {:?}, lines {:?}",
                            other.0,
                            other.1,
                            other.2.iter().map(Option::is_some).collect::<Vec<_>>()
                        ))
                    }
                }
            }
        }
    }
    for (name, n, want) in [
        (
            "ORDER",
            all_keys(ptm, &db.order).map_err(e)?.len(),
            report.orders,
        ),
        (
            "NEW-ORDER",
            all_keys(ptm, &db.new_order).map_err(e)?.len(),
            report.orders,
        ),
        (
            "ORDER-LINE",
            all_keys(ptm, &db.order_line).map_err(e)?.len(),
            report.order_lines,
        ),
    ] {
        if n as u64 != want {
            return Err(format!("{name} holds {n} rows, {want} belong to orders"));
        }
    }
    for w in 1..=c.warehouses {
        let mut sum = (0u64, 0u64, 0u64);
        let mut i = 1;
        while i <= c.items {
            let end = (i + 1024).min(c.items + 1);
            let part = ptm
                .run(|tx| {
                    let mut part = (0u64, 0u64, 0u64, Vec::new());
                    for item in i..end {
                        match db.stock.get(tx, keys::stock(w, item))? {
                            Some(s) => {
                                part.0 += s.ytd;
                                part.1 += s.order_cnt;
                                part.2 += s.remote_cnt;
                                if !(10..=100).contains(&s.quantity) {
                                    part.3.push(format!(
                                        "stock ({w}, {item}): S_QUANTITY {}",
                                        s.quantity
                                    ));
                                }
                            }
                            None => part.3.push(format!("stock ({w}, {item}) is missing")),
                        }
                    }
                    Ok(part)
                })
                .map_err(e)?;
            if let Some(p) = part.3.into_iter().next() {
                return Err(p);
            }
            sum = (sum.0 + part.0, sum.1 + part.1, sum.2 + part.2);
            i = end;
        }
        if sum != supplied[w as usize] {
            return Err(format!(
                "warehouse {w}: stock (Σ S_YTD, Σ S_ORDER_CNT, Σ S_REMOTE_CNT) = {sum:?}, its \
                 order lines say {:?}",
                supplied[w as usize]
            ));
        }
    }
    Ok(report)
}

/// Kinds of [`NewOrderDriver`]'s outcomes.
pub const KINDS: [&str; 1] = ["new_order"];

/// One thread of the benchmark: New-Orders at its home warehouse (§6.2).
pub struct NewOrderDriver<'a> {
    ptm: &'a dyn PtmRunner<KvRoot>,
    db: &'a NewOrderDb,
    w_id: u64,
    rng: StdRng,
    /// Bytes of the records committed transactions put, and the transactions, summed over
    /// threads.
    app: &'a [AtomicU64; 2],
}

impl<'a> NewOrderDriver<'a> {
    /// A driver at home warehouse `w_id`; `app` sums (record bytes put, committed
    /// transactions).
    pub fn new(
        ptm: &'a dyn PtmRunner<KvRoot>,
        db: &'a NewOrderDb,
        w_id: u64,
        seed: u64,
        app: &'a [AtomicU64; 2],
    ) -> Self {
        NewOrderDriver {
            ptm,
            db,
            w_id,
            rng: StdRng::seed_from_u64(seed),
            app,
        }
    }
}

impl TxnDriver for NewOrderDriver<'_> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        let input = self.db.input(&mut self.rng, self.w_id);
        match self.ptm.run_counted(|tx| self.db.new_order(tx, &input)) {
            Ok((put, aborts)) => {
                self.app[0].fetch_add(put, Ordering::Relaxed);
                self.app[1].fetch_add(1, Ordering::Relaxed);
                Ok(TxnOutcome {
                    kind: 0,
                    committed: true,
                    aborts,
                })
            }
            Err(PtmError::UserAbort) => Ok(TxnOutcome {
                kind: 0,
                committed: false,
                aborts: 0,
            }),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptm::{Ptm, PtmConfig};

    #[test]
    fn new_orders_keep_the_database_consistent_across_threads_and_reopen() {
        let config = TpccConfig::tiny(2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no.pool");
        let pc = || PtmConfig::temporary().size(64 << 20).path(&path);
        let report = {
            let ptm = Ptm::<KvRoot>::create(pc()).unwrap();
            let db = NewOrderDb::load(&ptm, config, 9).unwrap();
            assert_eq!(check(&ptm, &db).unwrap(), CheckReport::default());
            let app = [AtomicU64::new(0), AtomicU64::new(0)];
            let rolled_back = AtomicU64::new(0);
            std::thread::scope(|s| {
                for w in 1..=2u64 {
                    let (ptm, db, app, rb) = (&ptm, &db, &app, &rolled_back);
                    s.spawn(move || {
                        let mut d = NewOrderDriver::new(ptm, db, w, w * 77, app);
                        for _ in 0..300 {
                            if !d.run_txn().unwrap().committed {
                                rb.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            let report = check(&ptm, &db).unwrap();
            assert_eq!(report.orders + rolled_back.load(Ordering::Relaxed), 600);
            assert_eq!(app[1].load(Ordering::Relaxed), report.orders);
            assert!((5 * report.orders..=15 * report.orders).contains(&report.order_lines));
            ptm.check_invariants().unwrap();
            report
        };
        let ptm = Ptm::<KvRoot>::open(pc()).unwrap();
        let db = NewOrderDb::open(&ptm).unwrap();
        assert_eq!(db.config.items, config.items);
        assert_eq!(check(&ptm, &db).unwrap(), report);
        // A damaged balance is caught: one stock row's S_YTD off by one.
        ptm.run(|tx| {
            let k = keys::stock(1, 1);
            let mut s = db.stock.get(tx, k)?.unwrap();
            s.ytd += 1;
            db.stock.put(tx, k, &s).map(|_| ())
        })
        .unwrap();
        assert!(check(&ptm, &db).unwrap_err().contains("warehouse 1"));
    }
}
