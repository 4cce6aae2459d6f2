//! The crash simulator: which states could persistent memory be left in if power failed *now*?
//!
//! It follows the x86 persistence model of Vinter and pmreorder (shared/DESIGN.md, "The persistence
//! model"). Beside the live mapping it keeps a *durable image* (what certainly survives) and, for every
//! 64-byte cache line, the ordered list of stores not yet known durable plus, per thread, "flushed up
//! to" marks:
//!
//! - **ADR** (and `Msync`, modelled the same way at cache-line rather than page granularity, which
//!   allows more states, never fewer): `flush(range)` sets the calling thread's mark of each line to
//!   the end of that line's list; `fence()` makes every write up to the calling thread's marks durable.
//!   A legal crash image is the durable image plus, for every line, an in-order *prefix* of its pending
//!   stores: a line may be evicted silently at any moment, but a line's stores reach memory in program
//!   order. Stores are split at 8-byte boundaries, so an aligned 8-byte store is never torn while a
//!   larger one may be (its words land in ascending address order).
//! - **eADR**: every executed (cached) store is durable at once; flushes are hints.
//! - **Non-temporal stores**, under both domains: they bypass the cache into write-combining
//!   buffers, which drain in no particular order, so until the issuing thread's next `fence()` each
//!   8-byte piece of one independently may or may not have reached PM (any subset, in any order).
//!   The fence makes all of that thread's pieces durable; another thread's fence does not.
//!
//! A later store to the same bytes wins over an earlier one whichever reaches PM first (a store
//! to a line snoops the write-combining buffer that holds it, and a line reaches memory as a
//! whole), so an image applies the surviving pieces in global event order, and a pending
//! non-temporal piece wholly overwritten by a later durable store is no longer pending.
//!
//! Every PM event (store, atomic, flush, fence) goes through one mutex here, so events have one global
//! order and a single-threaded run is deterministic. A [`CrashTrigger`] names the event *before* which
//! power fails. At that point the state freezes; later events are no longer recorded and, with
//! [`OnCrash::Unwind`], the thread making them unwinds (with [`SimulatedCrash`] as payload, and
//! without running the panic hook) so that workers stop at their next PM event.

use super::cpu::CACHE_LINE;
use super::domain::PersistenceDomain;
use super::mapping::Mapping;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

/// Where the simulated power failure happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashTrigger {
    /// Never by itself; call [`Pool::crash_now`](super::Pool::crash_now) (e.g. at the end of a run).
    Never,
    /// Before the N-th PM event of the process (counting from 0).
    AtEvent(u64),
    /// Before the N-th PM event of one thread (counting from 0).
    AtThreadEvent {
        /// The thread whose events are counted.
        thread: ThreadId,
        /// Its event number.
        event: u64,
    },
}

impl CrashTrigger {
    /// A reproducible random event in `[0, max_event)` drawn from `seed`.
    pub fn random(seed: u64, max_event: u64) -> CrashTrigger {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        CrashTrigger::AtEvent(rng.gen_range(0..max_event.max(1)))
    }
}

/// What a thread does when it reaches a PM event after the crash point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnCrash {
    /// Unwind with a [`SimulatedCrash`] payload (catch it with `std::panic::catch_unwind`).
    #[default]
    Unwind,
    /// Go on running against the live mapping; the crash state stays as it was frozen.
    Continue,
}

/// The unwind payload of a thread stopped by a simulated crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimulatedCrash {
    /// The global event number before which power failed.
    pub event: u64,
}

impl SimulatedCrash {
    /// Whether a caught unwind payload is a simulated crash (rather than a real panic).
    pub fn is(payload: &(dyn std::any::Any + Send)) -> bool {
        payload.is::<SimulatedCrash>()
    }
}

/// A store (or part of one) not yet known to be durable: the bytes `mask` selects of one aligned
/// 8-byte word. A later store made durable over some of its bytes clears them from `mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    /// The word's address (8-byte aligned).
    word: u64,
    /// Bit `i`: byte `word + i` is stored.
    mask: u8,
    data: [u8; 8],
    /// The global order of the store (its event number): surviving pieces apply in this order.
    seq: u64,
}

impl Chunk {
    /// Writes the chunk's bytes into a pool image.
    fn apply(&self, bytes: &mut [u8]) {
        let base = self.word as usize;
        for i in 0..8 {
            if self.mask & (1 << i) != 0 {
                bytes[base + i] = self.data[i];
            }
        }
    }
}

#[derive(Default)]
struct LineLog {
    /// The line's cached stores not yet durable, in program order.
    pending: std::collections::VecDeque<Chunk>,
}

struct SimState {
    durable: Arc<Vec<u8>>,
    lines: HashMap<u64, LineLog>,
    /// Per thread: (line, event) marks set by flushes not yet fenced: the thread's next fence makes
    /// the line's stores made before that event durable. (An event number, not a count of the
    /// line's stores: a line log emptied by another thread's fence and refilled since must not
    /// let a stale mark cover the new stores.)
    marks: HashMap<ThreadId, Vec<(u64, u64)>>,
    /// Per thread: its non-temporal store pieces not yet fenced (in program order).
    streaming: HashMap<ThreadId, Vec<Chunk>>,
    events: u64,
    thread_events: HashMap<ThreadId, u64>,
    trigger: CrashTrigger,
    crashed_at: Option<u64>,
}

/// The crash simulator attached to one pool. Share it with `Arc`; the pool records into it.
pub struct CrashSim {
    domain: PersistenceDomain,
    on_crash: OnCrash,
    crashed: AtomicBool,
    state: Mutex<SimState>,
}

/// The kinds of PM event, for [`CrashSim`] bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Store,
    /// A non-temporal store: pending, piece by piece and unordered, until the calling thread's
    /// next fence (one event).
    StoreNonTemporal,
    Flush,
    Fence,
}

impl CrashSim {
    pub(crate) fn new(
        domain: PersistenceDomain,
        map: &Mapping,
        trigger: CrashTrigger,
        on_crash: OnCrash,
    ) -> CrashSim {
        CrashSim {
            domain,
            on_crash,
            crashed: AtomicBool::new(false),
            state: Mutex::new(SimState {
                durable: Arc::new(map.to_vec()),
                lines: HashMap::new(),
                marks: HashMap::new(),
                streaming: HashMap::new(),
                events: 0,
                thread_events: HashMap::new(),
                trigger,
                crashed_at: None,
            }),
        }
    }

    /// The domain whose rules decide what a crash may lose.
    pub fn domain(&self) -> PersistenceDomain {
        self.domain
    }

    /// PM events recorded so far (all threads). Run a workload once to count its events, then pick
    /// crash points among them.
    pub fn events(&self) -> u64 {
        self.state.lock().events
    }

    /// Whether the crash point has been reached.
    pub fn has_crashed(&self) -> bool {
        self.crashed.load(Ordering::Acquire)
    }

    /// The global event number before which power failed, once it has.
    pub fn crashed_at(&self) -> Option<u64> {
        self.state.lock().crashed_at
    }

    /// Sets a new trigger (only before the crash).
    pub fn arm(&self, trigger: CrashTrigger) {
        self.state.lock().trigger = trigger;
    }

    /// Fails power here and now (if it has not failed yet). Later events are no longer recorded.
    pub(crate) fn crash_now(&self) {
        let mut st = self.state.lock();
        if st.crashed_at.is_none() {
            self.freeze(&mut st);
        }
    }

    fn freeze(&self, st: &mut SimState) {
        st.crashed_at = Some(st.events);
        // Flushes not fenced yet guarantee nothing; unfenced non-temporal stores stay pending.
        st.marks.clear();
        self.crashed.store(true, Ordering::Release);
    }

    /// Records one event over `[off, off + len)`. `apply` performs the live operation under the
    /// simulator's lock (so the live image and the logs agree) and says whether it stored anything;
    /// a store is logged as the bytes the range holds afterwards. Returns false when power has
    /// failed: `apply` has not run and is handed back, for the caller to act on [`OnCrash`].
    pub(crate) fn record<F: FnOnce() -> bool>(
        &self,
        map: &Mapping,
        event: Event,
        off: u64,
        len: u64,
        apply: F,
    ) -> Result<(), F> {
        let mut st = self.state.lock();
        if st.crashed_at.is_some() {
            return Err(apply);
        }
        let tid = std::thread::current().id();
        let thread_event = *st.thread_events.get(&tid).unwrap_or(&0);
        let hit = match st.trigger {
            CrashTrigger::Never => false,
            CrashTrigger::AtEvent(n) => st.events == n,
            CrashTrigger::AtThreadEvent { thread, event } => thread == tid && thread_event == event,
        };
        if hit {
            self.freeze(&mut st);
            return Err(apply);
        }
        let seq = st.events;
        st.events += 1;
        *st.thread_events.entry(tid).or_default() += 1;
        let stored = apply();
        match event {
            Event::Store | Event::StoreNonTemporal if stored && len > 0 => {
                let mut data = vec![0u8; len as usize];
                map.load(off, &mut data);
                let streaming = event == Event::StoreNonTemporal;
                for chunk in Self::chunks(off, &data, seq) {
                    if streaming {
                        st.streaming.entry(tid).or_default().push(chunk);
                    } else if self.domain == PersistenceDomain::Eadr {
                        // A cached store is durable as soon as it executes.
                        Self::make_durable(&mut st, chunk);
                    } else {
                        st.lines
                            .entry(chunk.word / CACHE_LINE)
                            .or_default()
                            .pending
                            .push_back(chunk);
                    }
                }
            }
            Event::Store | Event::StoreNonTemporal => {}
            Event::Flush => self.log_flush(&mut st, tid, seq, (off, len)),
            Event::Fence => self.log_fence(&mut st, tid),
        }
        Ok(())
    }

    /// `data` stored at `off`, split at 8-byte word boundaries.
    fn chunks(off: u64, data: &[u8], seq: u64) -> impl Iterator<Item = Chunk> + '_ {
        let end = off + data.len() as u64;
        let first_word = off & !7;
        (first_word..end).step_by(8).map(move |word| {
            let mut chunk = Chunk {
                word,
                mask: 0,
                data: [0; 8],
                seq,
            };
            for addr in word.max(off)..(word + 8).min(end) {
                let i = (addr - word) as usize;
                chunk.mask |= 1 << i;
                chunk.data[i] = data[(addr - off) as usize];
            }
            chunk
        })
    }

    /// Writes `chunk` into the durable image and clears its bytes from every older pending store,
    /// which can no longer show through it.
    fn make_durable(st: &mut SimState, chunk: Chunk) {
        chunk.apply(Arc::<Vec<u8>>::make_mut(&mut st.durable).as_mut_slice());
        if let Some(log) = st.lines.get_mut(&(chunk.word / CACHE_LINE)) {
            for older in log.pending.iter_mut() {
                if older.word == chunk.word && older.seq < chunk.seq {
                    older.mask &= !chunk.mask;
                }
            }
        }
        for pieces in st.streaming.values_mut() {
            pieces.retain_mut(|older| {
                if older.word == chunk.word && older.seq < chunk.seq {
                    older.mask &= !chunk.mask;
                }
                older.mask != 0
            });
        }
    }

    fn log_flush(&self, st: &mut SimState, tid: ThreadId, seq: u64, (off, len): (u64, u64)) {
        // Under eADR no cached store is pending, so a flush has nothing to mark.
        if len == 0 || self.domain == PersistenceDomain::Eadr {
            return;
        }
        let first = off / CACHE_LINE;
        let last = (off + len - 1) / CACHE_LINE;
        let SimState { lines, marks, .. } = st;
        let my_marks = marks.entry(tid).or_default();
        for line in first..=last {
            if let Some(log) = lines.get(&line) {
                if !log.pending.is_empty() {
                    my_marks.push((line, seq));
                }
            }
        }
    }

    /// The calling thread's fence: its flushed lines up to their marks and all its non-temporal
    /// stores become durable, in event order.
    fn log_fence(&self, st: &mut SimState, tid: ThreadId) {
        let mut drained = st.streaming.remove(&tid).unwrap_or_default();
        for (line, mark) in st.marks.remove(&tid).unwrap_or_default() {
            let Some(log) = st.lines.get_mut(&line) else {
                continue;
            };
            while log.pending.front().is_some_and(|c| c.seq < mark) {
                drained.extend(log.pending.pop_front());
            }
            if log.pending.is_empty() {
                st.lines.remove(&line);
            }
        }
        drained.sort_by_key(|c| c.seq);
        for chunk in drained {
            Self::make_durable(st, chunk);
        }
    }

    /// What a thread does at an event after the crash: unwind, unless it is already unwinding
    /// (a destructor touching PM during the unwind must not abort the process). When it returns,
    /// the caller goes on with the live operation, unrecorded.
    pub(crate) fn after_crash(&self) {
        if self.on_crash == OnCrash::Unwind && !std::thread::panicking() {
            let event = self.state.lock().crashed_at.unwrap_or(0);
            std::panic::resume_unwind(Box::new(SimulatedCrash { event }));
        }
    }

    /// The frozen crash state, from which crash images are drawn; `None` before the crash.
    pub fn crash_state(&self) -> Option<CrashState> {
        let st = self.state.lock();
        let event = st.crashed_at?;
        let mut pending: Vec<(u64, Vec<Chunk>)> = st
            .lines
            .iter()
            .filter(|(_, log)| !log.pending.is_empty())
            .map(|(&line, log)| (line, log.pending.iter().copied().collect()))
            .collect();
        pending.sort_by_key(|(line, _)| *line);
        let mut streaming: Vec<Chunk> = st.streaming.values().flatten().copied().collect();
        streaming.sort_by_key(|c| (c.seq, c.word));
        Some(CrashState {
            event,
            domain: self.domain,
            durable: st.durable.clone(),
            pending,
            streaming,
        })
    }
}

/// The state of PM at a crash point: the durable image and the stores that may or may not have
/// reached it: per cache line, cached stores of which an in-order prefix survives, and unfenced
/// non-temporal store pieces, each of which survives or not on its own.
///
/// An image is chosen by one number per *pending unit*: first the lines with pending cached stores
/// in address order (how many of the line's stores survive, `0..=n`), then the pending
/// non-temporal pieces in event order (`0` lost, `1` survived).
pub struct CrashState {
    event: u64,
    domain: PersistenceDomain,
    durable: Arc<Vec<u8>>,
    pending: Vec<(u64, Vec<Chunk>)>,
    streaming: Vec<Chunk>,
}

impl CrashState {
    /// The global event number before which power failed.
    pub fn event(&self) -> u64 {
        self.event
    }

    /// The domain whose rules produced this state.
    pub fn domain(&self) -> PersistenceDomain {
        self.domain
    }

    /// Cache lines with cached stores that may or may not survive.
    pub fn pending_lines(&self) -> usize {
        self.pending.len()
    }

    /// Unfenced non-temporal store pieces (8-byte words), each of which may or may not survive.
    pub fn pending_non_temporal(&self) -> usize {
        self.streaming.len()
    }

    /// Stores (8-byte pieces) that may or may not survive: cached ones over all lines plus
    /// non-temporal ones.
    pub fn pending_stores(&self) -> usize {
        self.pending.iter().map(|(_, c)| c.len()).sum::<usize>() + self.streaming.len()
    }

    /// The number of choices per pending unit (lines, then non-temporal pieces).
    fn radices(&self) -> impl Iterator<Item = usize> + '_ {
        self.pending
            .iter()
            .map(|(_, c)| c.len() + 1)
            .chain(self.streaming.iter().map(|_| 2))
    }

    /// How many distinct legal images there are (saturating at `u128::MAX`).
    pub fn image_count(&self) -> u128 {
        self.radices()
            .fold(1u128, |n, r| n.saturating_mul(r as u128))
    }

    /// The image chosen by `prefixes`, one per pending unit (see [`CrashState`]): for line `i` (in
    /// address order) its first `prefixes[i]` pending stores survive; after the lines, a nonzero
    /// entry keeps that non-temporal piece. Surviving stores apply in event order.
    pub fn image(&self, prefixes: &[usize]) -> CrashImage {
        assert_eq!(
            prefixes.len(),
            self.pending.len() + self.streaming.len(),
            "one choice per pending line and non-temporal piece"
        );
        let (line_choices, nt_choices) = prefixes.split_at(self.pending.len());
        let mut kept: Vec<&Chunk> = self
            .pending
            .iter()
            .zip(line_choices)
            .flat_map(|((_, chunks), &keep)| &chunks[..keep.min(chunks.len())])
            .chain(
                self.streaming
                    .iter()
                    .zip(nt_choices)
                    .filter(|(_, &keep)| keep != 0)
                    .map(|(chunk, _)| chunk),
            )
            .collect();
        kept.sort_by_key(|c| c.seq);
        let mut bytes = self.durable.to_vec();
        for chunk in kept {
            chunk.apply(&mut bytes);
        }
        CrashImage {
            bytes,
            prefixes: prefixes.to_vec(),
            event: self.event,
        }
    }

    /// Only what was certainly durable: every pending store lost.
    pub fn durable_image(&self) -> CrashImage {
        self.image(&vec![0; self.pending.len() + self.streaming.len()])
    }

    /// Every pending store survived (what the live image was at the crash).
    pub fn full_image(&self) -> CrashImage {
        self.image(&self.radices().map(|r| r - 1).collect::<Vec<_>>())
    }

    /// Up to `max` images: all of them when there are at most `max`, else the two extremes
    /// (nothing pending survived, everything survived) and random prefixes drawn from `seed`.
    pub fn images(&self, max: usize, seed: u64) -> impl Iterator<Item = CrashImage> + '_ {
        let total = self.image_count();
        let enumerate = total <= max as u128;
        let count = if enumerate { total as usize } else { max };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let radices: Vec<usize> = self.radices().collect();
        let mut counter = vec![0usize; radices.len()];
        (0..count).map(move |i| {
            let prefixes = if enumerate {
                let current = counter.clone();
                for (digit, radix) in counter.iter_mut().zip(&radices) {
                    *digit += 1;
                    if *digit < *radix {
                        break;
                    }
                    *digit = 0;
                }
                current
            } else if i == 0 {
                vec![0; radices.len()]
            } else if i == 1 {
                radices.iter().map(|r| r - 1).collect()
            } else {
                radices.iter().map(|&r| rng.gen_range(0..r)).collect()
            };
            self.image(&prefixes)
        })
    }
}

/// One legal state of PM after the crash: the bytes of a whole pool.
#[derive(Clone)]
pub struct CrashImage {
    /// The pool's bytes.
    pub bytes: Vec<u8>,
    /// Per pending unit (lines in address order, then non-temporal pieces; see [`CrashState`]),
    /// how many of its pending stores survived.
    pub prefixes: Vec<usize>,
    /// The global event number before which power failed.
    pub event: u64,
}

impl CrashImage {
    /// Writes the image as a pool file that [`Pool::open`](super::Pool::open) accepts.
    pub fn write_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        std::fs::write(path, &self.bytes)
    }
}
