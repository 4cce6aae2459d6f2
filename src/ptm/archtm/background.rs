//! ArchTM's background threads (§4.4, §4.5, §5.4): the garbage-collection thread, which takes
//! the slots' deallocation lists and merges the freed blocks into the global recycle list, and
//! the fragmentation manager, which empties underused 4 KiB regions through mock transactions.
//!
//! Both start with the engine when [`PtmConfig::gc_interval`] / [`PtmConfig::defrag_interval`]
//! are set and stop (joined) when it is dropped. With them unset the same work runs inline
//! (collection on the committing thread past `gc_threshold`, defragmentation on
//! [`Ptm::defragment`](crate::ptm::Ptm::defragment)): the deterministic mode the crash
//! simulator's image sweep uses, since a sweep needs the same PM events on every run. The
//! threads themselves are crash-tested by random crash points under the simulator
//! (`crashtest::ptm` with `background`), where a thread that hits the power failure stops.
//!
//! [`PtmConfig::gc_interval`]: crate::ptm::PtmConfig::gc_interval
//! [`PtmConfig::defrag_interval`]: crate::ptm::PtmConfig::defrag_interval

use super::worker::ArchtmWorker;
use super::Inner;
use crate::pmem::SimulatedCrash;
use parking_lot::{Condvar, Mutex};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The GC thread's default period (it is also woken past `gc_threshold`).
pub const GC_INTERVAL: Duration = Duration::from_millis(10);
/// The defragmentation thread's default period.
pub const DEFRAG_INTERVAL: Duration = Duration::from_millis(100);

/// The wake-up state shared by the engine and its threads.
#[derive(Default)]
pub struct Signal {
    /// Set on drop: the threads finish their pass and exit.
    stop: Mutex<bool>,
    wake: Condvar,
    /// A slot's deallocation list passed the threshold since the GC thread last ran.
    gc_wanted: AtomicBool,
    /// Whether a GC thread runs (else commits collect inline).
    pub(crate) gc_thread: AtomicBool,
}

/// Counters of the background work (engine stats).
#[derive(Default)]
pub struct Counters {
    /// Collections that recycled something.
    pub gc_runs: AtomicU64,
    /// Bytes collected into the recycle list, in total.
    pub recycled_bytes: AtomicU64,
    /// Defragmentation passes that found underused regions.
    pub defrag_passes: AtomicU64,
    /// Objects defragmentation moved, in total.
    pub defrag_moved: AtomicU64,
    /// Bytes of idle classes' recycled blocks the background passes returned to the free list.
    pub defrag_released: AtomicU64,
    /// Of `gc_runs`, those a background thread ran: the GC thread, or the defragmentation
    /// thread before its pass (not a commit or an allocation inline).
    pub thread_gc_runs: AtomicU64,
    /// Of `defrag_passes`, those the defragmentation thread ran (not `Ptm::defragment`).
    pub thread_defrag_passes: AtomicU64,
}

impl Signal {
    /// Asks the GC thread to collect now (a slot's deallocation list passed the threshold).
    pub(crate) fn want_gc(&self) {
        if !self.gc_wanted.swap(true, Ordering::AcqRel) {
            let _g = self.stop.lock();
            self.wake.notify_all();
        }
    }

    /// Waits up to `period` (or until stop, or a GC request when `gc`); false once stopping.
    fn wait(&self, period: Duration, gc: bool) -> bool {
        let mut stop = self.stop.lock();
        let woken = *stop || (gc && self.gc_wanted.load(Ordering::Acquire));
        if !woken {
            self.wake.wait_for(&mut stop, period);
        }
        !*stop
    }
}

/// The running threads; dropping it stops and joins them.
pub(crate) struct Background {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

/// Runs one pass of background work; `false` if the simulated power failure hit it (the thread
/// then stops: the process it models is dead). A real panic propagates.
fn pass(f: impl FnOnce()) -> bool {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => true,
        Err(p) if SimulatedCrash::is(p.as_ref()) => false,
        Err(p) => std::panic::resume_unwind(p),
    }
}

impl Background {
    /// Starts the threads `gc` / `defrag` (their periods; the defragmentation policy, eager
    /// or not) ask for.
    pub(crate) fn start(
        inner: &Arc<Inner>,
        gc: Option<Duration>,
        defrag: Option<(Duration, bool)>,
    ) -> Result<Background, std::io::Error> {
        let mut threads = Vec::new();
        if let Some(period) = gc {
            inner.signal.gc_thread.store(true, Ordering::Release);
            let eng = Arc::clone(inner);
            threads.push(
                std::thread::Builder::new()
                    .name("archtm-gc".into())
                    .spawn(move || gc_loop(&eng, period))?,
            );
        }
        if let Some((period, eager)) = defrag {
            let eng = Arc::clone(inner);
            threads.push(
                std::thread::Builder::new()
                    .name("archtm-defrag".into())
                    .spawn(move || defrag_loop(&eng, period, eager))?,
            );
        }
        Ok(Background {
            inner: Arc::clone(inner),
            threads,
        })
    }
}

/// §5.4 "Deallocation": the GC thread collects when woken by a committing slot (its list
/// passed `gc_threshold`) or every `period`.
fn gc_loop(eng: &Inner, period: Duration) {
    while eng.signal.wait(period, true) {
        eng.signal.gc_wanted.store(false, Ordering::Release);
        if !pass(|| {
            if eng.gc() > 0 {
                eng.counters.thread_gc_runs.fetch_add(1, Ordering::Relaxed);
            }
        }) {
            break;
        }
    }
    // Commits collect inline from now on (after a simulated crash nothing runs anyway).
    eng.signal.gc_thread.store(false, Ordering::Release);
}

/// §4.5 / §5.4 "Defragmentation": every `period`, a pass on the engine's reserved slot if the
/// policy calls for one. Eager (§4.5): whenever blocks were recycled since the last pass.
/// Otherwise when [`Inner::defrag_worthwhile`]: the recycled blocks of classes no slot used
/// for 50 ms exceed a quarter of the data area; such a pass first returns them to the free
/// list. Departure: the paper's manager drains underused regions continuously; with size
/// classes, recycled blocks of a class in use are taken back by its next allocations, and
/// moving objects for them would only add copies.
fn defrag_loop(eng: &Arc<Inner>, period: Duration, eager: bool) {
    let mut seen = u64::MAX;
    while eng.signal.wait(period, false) {
        let idle = if eager {
            let recycled = eng.counters.recycled_bytes.load(Ordering::Acquire);
            let pending = eng.alloc.dealloc.iter().any(|d| !d.lock().is_empty());
            if recycled == seen && !pending {
                continue; // nothing freed since the last pass: no region can have emptied
            }
            None
        } else {
            let idle = eng.idle_classes();
            if !eng.defrag_worthwhile(&idle) {
                continue;
            }
            Some(idle)
        };
        let ok = pass(|| {
            // The pass starts with the pending collections; collected here they count as a
            // background thread's (the pass would otherwise take them from the GC thread).
            if eng.gc() > 0 {
                eng.counters.thread_gc_runs.fetch_add(1, Ordering::Relaxed);
            }
            // The engine's reserved slot: no user slot is borrowed, none waited for.
            let mut w = ArchtmWorker::internal(Arc::clone(eng));
            let before = eng.counters.defrag_passes.load(Ordering::Relaxed);
            // An error (the pool full for the moved copies) leaves everything consistent: the
            // pass is retried later.
            let _ = eng.defragment(&mut w, idle.as_deref());
            if eng.counters.defrag_passes.load(Ordering::Relaxed) > before {
                eng.counters
                    .thread_defrag_passes
                    .fetch_add(1, Ordering::Relaxed);
            }
        });
        if !ok {
            break;
        }
        seen = eng.counters.recycled_bytes.load(Ordering::Acquire);
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        *self.inner.signal.stop.lock() = true;
        self.inner.signal.wake.notify_all();
        for t in self.threads.drain(..) {
            if let Err(p) = t.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(p);
                }
            }
        }
        self.inner.signal.gc_thread.store(false, Ordering::Release);
    }
}
