//! `pmtx bench tpcc` and `pmtx bench tpcc-np`: load a TPC-C database, run the standard mix (or
//! New-Order + Payment only), optionally check the consistency conditions afterwards.

use super::bench::{check_common, finish, rss_anon_bytes, CommonArgs};
use super::CliResult;
use crate::bench::{self, RunReport};
use crate::db::Db;
use crate::engine::falcon::layout::tuple::slot_size;
use crate::workload::tpcc::consistency::check_consistency;
use crate::workload::tpcc::driver::{bound_home, Mix, TpccDriver};
use crate::workload::tpcc::{load, schema, Tpcc, TpccConfig, DISTRICTS};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Where each driver thread's transactions start.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// Thread t always uses warehouse t mod W + 1 (as a TPC-C terminal does).
    Bound,
    /// Every transaction picks a random home warehouse.
    Random,
}

/// Arguments of `pmtx bench tpcc` and `pmtx bench tpcc-np`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Warehouses (the scale factor; about 110 MB of rows each).
    #[arg(long, default_value_t = 4)]
    pub warehouses: u64,
    /// Home warehouse of each thread's transactions.
    #[arg(long, value_enum, default_value = "bound")]
    pub home: Home,
    /// Threads loading the database.
    #[arg(long, default_value_t = 2)]
    pub load_threads: usize,
    /// Check the consistency conditions (clause 3.3.2: 1–10, 12) after each run.
    #[arg(long)]
    pub check: bool,
    /// Pool size in MiB (default: from the warehouses, threads and duration).
    #[arg(long)]
    pub pool_mib: Option<u64>,
    /// Rate limit: transactions per second over all threads.
    #[arg(long)]
    pub max_tps: Option<f64>,
    /// Seed of the load and the transaction inputs.
    #[arg(long, default_value_t = 0x7bcc)]
    pub seed: u64,
    /// Run New-Order and Payment only (set by `pmtx bench tpcc-np`).
    #[arg(skip)]
    pub new_order_payment_only: bool,
}

/// Bytes the initial population takes in the pool (slots, not the DRAM indexes).
fn loaded_bytes(config: &TpccConfig) -> u64 {
    let s = schema::schemas();
    let slot = |i: usize| slot_size(s[i].row_size());
    let w = config.warehouses;
    let districts = w * DISTRICTS;
    let customers = districts * config.customers_per_district;
    let orders = districts * config.orders_per_district;
    w * slot(0)
        + districts * slot(1)
        + customers * (slot(2) + slot(3))
        + districts * config.new_orders_per_district * slot(4)
        + orders * (slot(5) + 10 * slot(6))
        + config.items * (slot(7) + w * slot(8))
}

pub(crate) fn run(args: Args) -> CliResult {
    let common = args.common.clone();
    check_common(&common)?;
    let mix = if args.new_order_payment_only {
        Mix::NewOrderPayment
    } else {
        Mix::Full
    };
    let config = TpccConfig::standard(args.warehouses);
    config.validate()?;
    if args.load_threads == 0 || args.load_threads > 64 {
        return Err("--load-threads must be between 1 and 64".into());
    }
    if let Some(r) = args.max_tps {
        if !(r.is_finite() && r > 0.0) {
            return Err("--max-tps must be a positive number".into());
        }
    }
    let max_threads = common.threads.iter().copied().max().unwrap_or(1);
    // Room for the load, plus what New-Orders add (about 1.5 KB each; a generous 40 MB per
    // thread-second), plus per-thread pages and log windows.
    let seconds = (common.duration + common.warmup).ceil() as u64;
    let pool_size = match args.pool_mib {
        Some(m) if m > 0 => {
            super::bench::pool_size_for(&format!("--pool-mib {m}"), m.checked_mul(1 << 20))?
        }
        Some(_) => return Err("--pool-mib must be positive".into()),
        None => super::bench::pool_size_for(
            &format!(
                "{} warehouses for {seconds} s on {max_threads} threads",
                args.warehouses
            ),
            (|| {
                (loaded_bytes(&config) / 4)
                    .checked_mul(5)?
                    .checked_add(seconds.checked_mul(max_threads as u64 * (40 << 20))?)?
                    .checked_add((64 + 8 * (max_threads + args.load_threads) as u64) * (2 << 20))
            })(),
        )?,
    };
    let mut reports = Vec::new();
    for (round, threads, engine) in common.plan() {
        let mut db_config = common.db_config(engine, threads, pool_size);
        db_config.max_threads = threads.max(args.load_threads) + 1;
        let dram_before = rss_anon_bytes();
        let db = Db::create(db_config)?;
        super::warn_durability(&db);
        let tpcc = Tpcc::create(&db, config, args.seed)?;
        let total = load::total_rows(&tpcc);
        let bar = bench::loading_bar(total, &format!("loading {engine}"));
        let loaded = AtomicU64::new(0);
        let started = Instant::now();
        load::load(&db, &tpcc, args.load_threads, args.seed, &|n| {
            bar.set_position(loaded.fetch_add(n, Ordering::Relaxed) + n);
        })
        .map_err(|e| {
            format!(
                "loading TPC-C into a {} MiB pool: {e} (see --pool-mib)",
                pool_size >> 20
            )
        })?;
        bar.finish_and_clear();
        let load_seconds = started.elapsed().as_secs_f64();
        let dram_after_load = rss_anon_bytes();
        let per_thread_tps = args.max_tps.map(|r| r / threads as f64);
        let result = bench::run(common.bench_config(threads, &mix.kind_names()), |t| {
            let home = match args.home {
                Home::Bound => Some(bound_home(&tpcc, t)),
                Home::Random => None,
            };
            TpccDriver::new(
                &db,
                &tpcc,
                mix,
                home,
                args.seed ^ (0x1000 + t as u64),
                per_thread_tps,
            )
            .map(|d| Box::new(d) as Box<dyn bench::TxnDriver>)
        })
        .map_err(|e| {
            let e = e.to_string();
            if e.contains("persistent memory is full") {
                format!("{e} (raise --pool-mib)")
            } else {
                e
            }
        })?;
        let consistency = if args.check {
            let report = check_consistency(&db)?;
            eprintln!(
                "{engine}, {threads} thr: consistency conditions 1-10, 12 hold ({} orders, {} order \
                 lines, {} history rows)",
                report.orders, report.order_lines, report.history
            );
            Some(true)
        } else {
            None
        };
        let dram_per_warehouse = match (dram_before, dram_after_load) {
            (Some(b), Some(a)) if engine != crate::engine::EngineKind::Volatile => {
                Some(a.saturating_sub(b) / args.warehouses)
            }
            _ => None,
        };
        let params = serde_json::json!({
            "warehouses": args.warehouses,
            "home": format!("{:?}", args.home).to_lowercase(),
            "load_threads": args.load_threads,
            "load_seconds": load_seconds,
            "max_tps": args.max_tps,
            "seed": args.seed,
            "pool_bytes": pool_size,
            "dram_bytes_per_warehouse_after_load": dram_per_warehouse,
            "consistency_checked": consistency,
            "round": round,
        });
        let domain = common.domain_of(engine);
        reports.push(RunReport::new(
            engine.name(),
            common.cc.name(),
            domain.name(),
            mix.name(),
            result,
            params,
        ));
    }
    finish(&common, &mut reports)
}
