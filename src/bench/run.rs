//! The driver interface and the multi-threaded run loop.

use std::borrow::Borrow;
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::result::{BenchResult, ThreadStats};
use crate::pmem::{platform, stats};

/// An error a driver returns from [`TxnDriver::run_txn`].
pub type DriverError = Box<dyn std::error::Error + Send + Sync>;

/// One thread's transaction source. Created on its own thread by the factory given to [`run`], so
/// it need not be `Send` and may hold thread-local engine workers.
pub trait TxnDriver {
    /// Runs one transaction to completion. The driver retries conflict aborts itself and reports
    /// how many it saw in [`TxnOutcome::aborts`]. An error stops the whole run.
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError>;

    /// Whether the outcome [`TxnDriver::run_txn`] just returned was one of the workload's
    /// *expected failures*: a transaction that ran as specified but found nothing to do, such as
    /// TATP's GET_NEW_DESTINATION finding no forwarding row or INSERT_CALL_FORWARDING hitting an
    /// existing key. These are counted per kind in [`KindResult::expected_failures`]
    /// (committed or not), never treated as errors. Drivers without such outcomes keep the
    /// default, `false`.
    ///
    /// [`KindResult::expected_failures`]: super::KindResult::expected_failures
    fn last_was_expected_failure(&self) -> bool {
        false
    }
}

/// What one call of [`TxnDriver::run_txn`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Index of the transaction type in [`BenchConfig::txn_kinds`].
    pub kind: usize,
    /// True if the transaction committed; false if the driver gave up or the transaction aborted
    /// on purpose (a "user abort", such as TPC-C's invalid-item New-Order).
    pub committed: bool,
    /// Conflict aborts (retried) before this outcome.
    pub aborts: u32,
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchConfig {
    /// Number of driver threads (at least 1).
    pub threads: usize,
    /// Time to run before measuring (caches, allocator, index warm up).
    pub warmup: Duration,
    /// Measured duration.
    pub duration: Duration,
    /// Names of the transaction types, indexed by [`TxnOutcome::kind`] (at least one), e.g.
    /// YCSB's `["read-write", "read-only"]` or TPC-C's five.
    pub txn_kinds: Vec<String>,
}

/// Why [`run`] failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The configuration cannot be run.
    #[error("invalid benchmark configuration: {0}")]
    Config(String),
    /// The factory could not build a thread's driver.
    #[error("thread {thread}: cannot create the transaction driver: {message}")]
    Factory {
        /// Index of the thread.
        thread: usize,
        /// The factory's error, as text.
        message: String,
    },
    /// A driver returned an error (or an outcome naming an unknown transaction kind).
    #[error("thread {thread}: transaction failed: {message}")]
    Driver {
        /// Index of the thread.
        thread: usize,
        /// The driver's error, as text.
        message: String,
    },
    /// A driver thread panicked.
    #[error("thread {thread} panicked: {message}")]
    Panicked {
        /// Index of the thread.
        thread: usize,
        /// The panic payload, when it is a string.
        message: String,
    },
}

/// Threads build their drivers; nothing runs yet.
const INIT: u8 = 0;
/// Transactions run but are not recorded.
const WARMUP: u8 = 1;
/// Transactions that start and finish in this phase are recorded.
const MEASURE: u8 = 2;
/// Threads finish their current transaction and exit (end of run, or an error).
const STOP: u8 = 3;

/// How often the coordinator looks for an early stop while it sleeps through a phase.
const POLL: Duration = Duration::from_millis(2);

struct Shared {
    phase: AtomicU8,
    /// Set with the STOP phase: the drivers' threads see it through [`crate::cc::stop_requested`],
    /// so that lock waits and retries inside a transaction end with the run.
    stop: Arc<AtomicBool>,
    ready: AtomicUsize,
    error: Mutex<Option<BenchError>>,
}

impl Shared {
    /// Records `err` if it is the first error, and stops every thread.
    fn fail(&self, err: BenchError) {
        let mut slot = self.error.lock();
        if slot.is_none() {
            *slot = Some(err);
        }
        drop(slot);
        self.stop();
    }

    /// Stops every thread: they finish (or abandon) their current transaction and exit.
    fn stop(&self) {
        self.phase.store(STOP, Ordering::Release);
        self.stop.store(true, Ordering::Release);
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }
}

/// Stops the run if the thread that owns it unwinds, so that the coordinator does not wait for it.
struct StopOnPanic<'a>(&'a Shared);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop();
        }
    }
}

/// Runs `config.threads` driver threads: each builds its driver with `factory(thread index)`,
/// waits until all are built, then runs transactions back to back through a warm-up of
/// `config.warmup` and a measured phase of `config.duration`.
///
/// Only transactions that start and finish within the measured phase are recorded (latency in
/// nanoseconds, 3 significant digits, of every outcome, committed or not, including the driver's
/// retries). The measured wall time is the actual time between the switches into and out of the
/// measured phase; a thread's last transaction may run past the end and is not counted.
///
/// PM traffic is the difference of [`crate::pmem::stats::snapshot`] taken at the start and end of
/// the measured phase. Those counters are process-wide: they include every thread of the process
/// (background threads of the engine, but also anything else running), so run nothing else
/// meanwhile. Writes of transactions straddling either switch are included. The process's CPU
/// time over the same phase gives [`BenchResult::cpu_us_per_txn`], process-wide too.
///
/// The first error (from the factory, a driver, or a panic in a driver thread) stops all threads
/// and is returned. A driver that never returns from `run_txn` blocks the run.
///
/// `config` may be passed by value or by reference.
pub fn run<'d, C, F, E>(config: C, factory: F) -> Result<BenchResult, BenchError>
where
    C: Borrow<BenchConfig>,
    F: Fn(usize) -> Result<Box<dyn TxnDriver + 'd>, E> + Sync,
    E: Display,
{
    let config = config.borrow();
    if config.threads == 0 {
        return Err(BenchError::Config("threads must be at least 1".into()));
    }
    if config.txn_kinds.is_empty() {
        return Err(BenchError::Config(
            "at least one transaction kind is needed".into(),
        ));
    }
    let n_kinds = config.txn_kinds.len();
    let shared = Shared {
        phase: AtomicU8::new(INIT),
        stop: Arc::new(AtomicBool::new(false)),
        ready: AtomicUsize::new(0),
        error: Mutex::new(None),
    };

    let (joined, window) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..config.threads)
            .map(|thread| {
                let shared = &shared;
                let factory = &factory;
                std::thread::Builder::new()
                    .name(format!("bench-{thread}"))
                    .spawn_scoped(scope, move || worker(thread, n_kinds, shared, factory))
                    .expect("cannot spawn a benchmark thread")
            })
            .collect();

        let window = coordinate(config, &shared);
        let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (joined, window)
    });

    let mut per_thread = Vec::with_capacity(joined.len());
    let mut panicked = None;
    for (thread, outcome) in joined.into_iter().enumerate() {
        match outcome {
            Ok(stats) => per_thread.push(stats),
            Err(payload) => {
                if panicked.is_none() {
                    panicked = Some(BenchError::Panicked {
                        thread,
                        message: panic_message(payload.as_ref()),
                    });
                }
            }
        }
    }
    // A driver error is more telling than a panic it may have caused elsewhere, so it comes first.
    if let Some(err) = shared.error.into_inner().or(panicked) {
        return Err(err);
    }
    let mut result = BenchResult::from_threads(
        config.threads,
        window.wall,
        &config.txn_kinds,
        per_thread,
        window.pm,
    );
    result.set_cpu_time(window.cpu);
    Ok(result)
}

/// What the coordinator measured over the measured phase.
#[derive(Default)]
struct Window {
    wall: Duration,
    pm: stats::PmStats,
    /// CPU time of the whole process (drivers and the engine's background threads), when the
    /// platform reports it.
    cpu: Option<Duration>,
}

/// Switches the phases; returns the measured wall time, PM traffic and CPU time within it.
fn coordinate(config: &BenchConfig, shared: &Shared) -> Window {
    // Wait for every driver to be built (or for a failure).
    while shared.ready.load(Ordering::Acquire) < config.threads && shared.phase() != STOP {
        std::thread::sleep(Duration::from_micros(200));
    }
    if shared
        .phase
        .compare_exchange(INIT, WARMUP, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Window::default();
    }
    if !sleep_unless_stopped(shared, config.warmup)
        || shared
            .phase
            .compare_exchange(WARMUP, MEASURE, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return Window::default();
    }
    let start = Instant::now();
    let pm_start = stats::snapshot();
    let cpu_start = platform::process_cpu_time();
    sleep_unless_stopped(shared, config.duration);
    shared.stop();
    let wall = start.elapsed();
    let cpu_end = platform::process_cpu_time();
    let pm = stats::snapshot() - pm_start;
    let cpu = cpu_start
        .zip(cpu_end)
        .map(|(start, end)| end.saturating_sub(start));
    Window { wall, pm, cpu }
}

/// Sleeps for `total` in short steps; returns false early if the run was stopped.
fn sleep_unless_stopped(shared: &Shared, total: Duration) -> bool {
    let deadline = Instant::now() + total;
    loop {
        if shared.phase() == STOP {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep(POLL.min(deadline - now));
    }
}

fn worker<'d, F, E>(thread: usize, n_kinds: usize, shared: &Shared, factory: &F) -> ThreadStats
where
    F: Fn(usize) -> Result<Box<dyn TxnDriver + 'd>, E>,
    E: Display,
{
    let _guard = StopOnPanic(shared);
    let _stop_flag = StopFlagInstalled::new(&shared.stop);
    let mut stats = ThreadStats::new(n_kinds);
    let mut driver = match factory(thread) {
        Ok(driver) => driver,
        Err(e) => {
            shared.fail(BenchError::Factory {
                thread,
                message: e.to_string(),
            });
            return stats;
        }
    };
    shared.ready.fetch_add(1, Ordering::AcqRel);
    while shared.phase() == INIT {
        std::thread::sleep(Duration::from_micros(100));
    }
    loop {
        let before = shared.phase();
        if before == STOP {
            break;
        }
        let start = Instant::now();
        let outcome = driver.run_txn();
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match outcome {
            Ok(outcome) if outcome.kind < n_kinds => {
                if before == MEASURE && shared.phase() == MEASURE {
                    stats.record(&outcome, driver.last_was_expected_failure(), nanos);
                }
            }
            Ok(outcome) => {
                shared.fail(BenchError::Driver {
                    thread,
                    message: format!(
                        "transaction kind {} out of range (the run has {n_kinds} kinds)",
                        outcome.kind
                    ),
                });
                break;
            }
            // A transaction abandoned because the run ended is not a failure.
            Err(e) if shared.phase() == STOP && is_interruption(e.as_ref()) => break,
            Err(e) => {
                shared.fail(BenchError::Driver {
                    thread,
                    message: e.to_string(),
                });
                break;
            }
        }
    }
    stats
}

/// Makes the run's stop flag the thread's ([`crate::cc::set_stop_flag`]) while it lives.
struct StopFlagInstalled;

impl StopFlagInstalled {
    fn new(flag: &Arc<AtomicBool>) -> StopFlagInstalled {
        crate::cc::set_stop_flag(Some(Arc::clone(flag)));
        StopFlagInstalled
    }
}

impl Drop for StopFlagInstalled {
    fn drop(&mut self) {
        crate::cc::set_stop_flag(None);
    }
}

/// Whether `e` (or an error it wraps) is a transaction abandoned at the end of the run.
fn is_interruption(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        if matches!(
            e.downcast_ref::<crate::engine::DbError>(),
            Some(crate::engine::DbError::Interrupted { .. })
        ) {
            return true;
        }
        at = e.source();
    }
    false
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
