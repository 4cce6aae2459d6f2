//! The initial population (clause 4.3.3.1), loaded by several threads: items are split between
//! them, then each loads whole warehouses (stock, districts, customers, history, orders,
//! order lines, new orders) in transactions of a few hundred rows.

use super::random::{astring, data_with_original, last_name, nstring, nurand, state, zip};
use super::{keys, now, Tpcc, TpccError, DISTRICTS};
use crate::db::{Db, Tx, Value, Worker};
use crate::engine::TxError;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Rows the load inserts (for a progress bar).
pub fn total_rows(tpcc: &Tpcc) -> u64 {
    let c = &tpcc.config;
    let lines = c.orders_per_district * 10; // Expected O_OL_CNT is 10.
    let per_district = 1 + 2 * c.customers_per_district + c.orders_per_district + lines;
    c.items + c.warehouses * (1 + c.items + DISTRICTS * (per_district + c.new_orders_per_district))
}

/// Loads the initial population on `threads` threads, calling `progress` with the rows each
/// transaction inserted. `seed` makes the contents reproducible.
pub fn load(
    db: &Db,
    tpcc: &Tpcc,
    threads: usize,
    seed: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), TpccError> {
    let threads = threads.max(1) as u64;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<(), TpccError> {
                    let mut worker = db.worker()?;
                    let mut loader = Loader {
                        tpcc,
                        worker: &mut worker,
                        rng: StdRng::seed_from_u64(seed.wrapping_add(t * 0x9e37_79b9)),
                        progress,
                        now: now(),
                    };
                    let items = tpcc.config.items;
                    loader.items(items * t / threads + 1, items * (t + 1) / threads + 1)?;
                    let mut w = t + 1;
                    while w <= tpcc.config.warehouses {
                        loader.warehouse(w)?;
                        w += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            // A loader's panic goes on unwinding here with its own payload (a simulated crash of
            // the crash harness must reach the harness as one, not as a new panic).
            .try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// Loads the whole initial population on the calling thread through `worker` (the crash
/// harness: no other thread, no other worker slot).
pub fn load_with(worker: &mut Worker<'_>, tpcc: &Tpcc, seed: u64) -> Result<(), TpccError> {
    let mut loader = Loader {
        tpcc,
        worker,
        rng: StdRng::seed_from_u64(seed),
        progress: &|_| {},
        now: now(),
    };
    loader.items(1, tpcc.config.items + 1)?;
    for w in 1..=tpcc.config.warehouses {
        loader.warehouse(w)?;
    }
    Ok(())
}

/// Rows per loading transaction (roughly).
const BATCH: u64 = 200;

struct Loader<'a, 'db> {
    tpcc: &'a Tpcc,
    worker: &'a mut Worker<'db>,
    rng: StdRng,
    progress: &'a (dyn Fn(u64) + Sync),
    now: u64,
}

/// Random address columns (street 1, street 2, city, state, zip; clause 4.3.3.1).
struct Address([Vec<u8>; 5]);

impl Address {
    fn random(rng: &mut StdRng) -> Address {
        let mut a: [Vec<u8>; 5] = Default::default();
        astring(rng, 10, 20, &mut a[0]);
        astring(rng, 10, 20, &mut a[1]);
        astring(rng, 10, 20, &mut a[2]);
        state(rng, &mut a[3]);
        zip(rng, &mut a[4]);
        Address(a)
    }
    fn values(&self) -> [Value<'_>; 5] {
        [
            Value::Bytes(&self.0[0]),
            Value::Bytes(&self.0[1]),
            Value::Bytes(&self.0[2]),
            Value::Bytes(&self.0[3]),
            Value::Bytes(&self.0[4]),
        ]
    }
}

impl Loader<'_, '_> {
    /// Runs `f` over `lo..hi` in transactions of `batch` units; `rows` rows per unit.
    fn batched(
        &mut self,
        lo: u64,
        hi: u64,
        batch: u64,
        mut f: impl FnMut(&mut Tx<'_>, &mut StdRng, u64) -> Result<u64, TxError>,
    ) -> Result<(), TpccError> {
        let mut next = lo;
        while next < hi {
            let end = (next + batch).min(hi);
            // The rng is cloned per attempt, so that a retried batch inserts the same rows.
            let start_rng = self.rng.clone();
            let mut used = start_rng.clone();
            let rows = self.worker.run(|tx| {
                used = start_rng.clone();
                let mut rows = 0;
                for unit in next..end {
                    rows += f(tx, &mut used, unit)?;
                }
                Ok(rows)
            })?;
            self.rng = used;
            (self.progress)(rows);
            next = end;
        }
        Ok(())
    }

    fn items(&mut self, lo: u64, hi: u64) -> Result<(), TpccError> {
        let table = self.tpcc.item;
        let (mut name, mut data) = (Vec::new(), Vec::new());
        self.batched(lo, hi, BATCH, |tx, rng, i| {
            astring(rng, 14, 24, &mut name);
            data_with_original(rng, 26, 50, &mut data);
            tx.insert(
                table,
                i,
                &[
                    Value::U64(i),
                    Value::U64(rng.gen_range(1..=10_000)),
                    Value::Bytes(&name),
                    Value::I64(rng.gen_range(100..=10_000)),
                    Value::Bytes(&data),
                ],
            )?;
            Ok(1)
        })
    }

    fn warehouse(&mut self, w: u64) -> Result<(), TpccError> {
        let t = self.tpcc;
        let c = t.config;
        let mut name = Vec::new();
        astring(&mut self.rng, 6, 10, &mut name);
        let address = Address::random(&mut self.rng);
        let tax = self.rng.gen_range(0..=2_000i64);
        let ytd = c.initial_district_ytd() * DISTRICTS as i64;
        self.worker.run(|tx| {
            let a = address.values();
            tx.insert(
                t.warehouse,
                keys::warehouse(w),
                &[
                    Value::U64(w),
                    Value::Bytes(&name),
                    a[0],
                    a[1],
                    a[2],
                    a[3],
                    a[4],
                    Value::I64(tax),
                    Value::I64(ytd),
                ],
            )
        })?;
        (self.progress)(1);
        self.stock(w)?;
        for d in 1..=DISTRICTS {
            self.district(w, d)?;
            self.customers(w, d)?;
            self.orders(w, d)?;
        }
        Ok(())
    }

    fn stock(&mut self, w: u64) -> Result<(), TpccError> {
        let table = self.tpcc.stock;
        let mut dists: [Vec<u8>; 10] = Default::default();
        let mut data = Vec::new();
        self.batched(1, self.tpcc.config.items + 1, BATCH, |tx, rng, i| {
            for d in dists.iter_mut() {
                astring(rng, 24, 24, d);
            }
            data_with_original(rng, 26, 50, &mut data);
            let mut values = vec![
                Value::U64(i),
                Value::U64(w),
                Value::I64(rng.gen_range(10..=100)),
            ];
            values.extend(dists.iter().map(|d| Value::Bytes(d)));
            values.extend([
                Value::U64(0),
                Value::U64(0),
                Value::U64(0),
                Value::Bytes(&data),
            ]);
            tx.insert(table, keys::stock(w, i), &values)?;
            Ok(1)
        })
    }

    fn district(&mut self, w: u64, d: u64) -> Result<(), TpccError> {
        let t = self.tpcc;
        let mut name = Vec::new();
        astring(&mut self.rng, 6, 10, &mut name);
        let address = Address::random(&mut self.rng);
        let tax = self.rng.gen_range(0..=2_000i64);
        self.worker.run(|tx| {
            let a = address.values();
            tx.insert(
                t.district,
                keys::district(w, d),
                &[
                    Value::U64(d),
                    Value::U64(w),
                    Value::Bytes(&name),
                    a[0],
                    a[1],
                    a[2],
                    a[3],
                    a[4],
                    Value::I64(tax),
                    Value::I64(t.config.initial_district_ytd()),
                    Value::U64(t.config.orders_per_district + 1),
                ],
            )
        })?;
        (self.progress)(1);
        Ok(())
    }

    fn customers(&mut self, w: u64, d: u64) -> Result<(), TpccError> {
        let t = self.tpcc;
        let now = self.now;
        let (mut first, mut last, mut phone, mut data, mut h_data) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let c_last = t.load_constants.c_last;
        let last_max = t.config.last_name_max();
        self.batched(
            1,
            t.config.customers_per_district + 1,
            BATCH / 2,
            |tx, rng, c| {
                astring(rng, 8, 16, &mut first);
                // The first 1 000 customers take the names 0..999 in order, the rest NURand names.
                let number = if c <= 1000 {
                    c - 1
                } else {
                    nurand(rng, 255, c_last, 0, last_max)
                };
                last_name(number, &mut last);
                let address = Address::random(rng);
                nstring(rng, 16, 16, &mut phone);
                let credit: &[u8] = if rng.gen_range(0..10) == 0 {
                    b"BC"
                } else {
                    b"GC"
                };
                astring(rng, 300, 500, &mut data);
                let a = address.values();
                tx.insert(
                    t.customer,
                    keys::customer(w, d, c),
                    &[
                        Value::U64(c),
                        Value::U64(d),
                        Value::U64(w),
                        Value::Bytes(&first),
                        Value::Bytes(b"OE"),
                        Value::Bytes(&last),
                        a[0],
                        a[1],
                        a[2],
                        a[3],
                        a[4],
                        Value::Bytes(&phone),
                        Value::U64(now),
                        Value::Bytes(credit),
                        Value::I64(5_000_000),
                        Value::I64(rng.gen_range(0..=5_000)),
                        Value::I64(-1_000),
                        Value::I64(1_000),
                        Value::U64(1),
                        Value::U64(0),
                        Value::Bytes(&data),
                    ],
                )?;
                astring(rng, 12, 24, &mut h_data);
                tx.insert(
                    t.history,
                    t.next_history_key(),
                    &[
                        Value::U64(c),
                        Value::U64(d),
                        Value::U64(w),
                        Value::U64(d),
                        Value::U64(w),
                        Value::U64(now),
                        Value::I64(1_000),
                        Value::Bytes(&h_data),
                    ],
                )?;
                Ok(2)
            },
        )
    }

    fn orders(&mut self, w: u64, d: u64) -> Result<(), TpccError> {
        let t = self.tpcc;
        let c = t.config;
        let now = self.now;
        let mut customers: Vec<u64> = (1..=c.customers_per_district).collect();
        customers.shuffle(&mut self.rng);
        let first_new = c.first_new_order();
        let mut dist_info = Vec::new();
        self.batched(1, c.orders_per_district + 1, BATCH / 12, |tx, rng, o| {
            let delivered = o < first_new;
            let ol_cnt = rng.gen_range(5..=15u64);
            let carrier = if delivered { rng.gen_range(1..=10) } else { 0 };
            tx.insert(
                t.order,
                keys::order(w, d, o),
                &[
                    Value::U64(o),
                    Value::U64(d),
                    Value::U64(w),
                    Value::U64(customers[o as usize - 1]),
                    Value::U64(now),
                    Value::U64(carrier),
                    Value::U64(ol_cnt),
                    Value::U64(1),
                ],
            )?;
            for n in 1..=ol_cnt {
                astring(rng, 24, 24, &mut dist_info);
                let amount = if delivered {
                    0
                } else {
                    rng.gen_range(1..=999_999)
                };
                tx.insert(
                    t.order_line,
                    keys::order_line(w, d, o, n),
                    &[
                        Value::U64(o),
                        Value::U64(d),
                        Value::U64(w),
                        Value::U64(n),
                        Value::U64(rng.gen_range(1..=c.items)),
                        Value::U64(w),
                        Value::U64(if delivered { now } else { 0 }),
                        Value::U64(5),
                        Value::I64(amount),
                        Value::Bytes(&dist_info),
                    ],
                )?;
            }
            if !delivered {
                tx.insert(
                    t.new_order,
                    keys::order(w, d, o),
                    &[Value::U64(o), Value::U64(d), Value::U64(w)],
                )?;
            }
            Ok(1 + ol_cnt + u64::from(!delivered))
        })
    }
}
