//! What PM media would do (issue 20): a model of the CPU cache and of the DIMM's write-combining
//! buffer, fed by the pool's PM events, that counts the bytes the media would read and write; and
//! NVM latency emulation, which delays a thread for the PM lines its reads miss and for each
//! persist. Both are off by default; a pool without them pays one untaken branch per PM call.
//!
//! This machine's "PM" is DRAM (/dev/shm): a flush costs little, nothing wears, and the
//! mechanisms the papers build to cut media writes (Falcon's selective flush and write-combining
//! under eADR, Zen's Met-Cache, ArchTM's write amplification, DUDETx's log combination) would be
//! invisible without a model.
//!
//! # The model ([`MediaModel`])
//!
//! Per thread (a simplification: a real last-level cache and XPBuffer are shared by the threads
//! of a socket and a DIMM; with a thread's share of the cache as its size the model is close for
//! threads working on disjoint data, and optimistic where they share lines):
//!
//! - **CPU cache:** set-associative, LRU, over PM lines only (DRAM traffic, which competes for
//!   the real cache, is not modelled). Write-allocate: a store to a line the cache lacks reads it
//!   from the media first (a read for ownership). A dirty line reaches the media when it is
//!   evicted or written back by a flush (`clwb`: the line stays cached, clean). That holds under
//!   ADR and eADR alike; eADR changes what survives a crash, not when lines are written back,
//!   which is why Falcon's hinted flush under eADR still saves media writes (Falcon §4.3).
//!   Non-temporal stores bypass the cache (and drop the line from it).
//! - **XPBuffer:** the DIMM's write-combining buffer of 256-byte XPLines (Optane's internal access
//!   size), LRU. A 64-byte write-back merges into its XPLine's entry; an evicted entry costs one
//!   256-byte media write, and a partial one (fewer than its four lines written) a 256-byte media
//!   read first (read-modify-write). A cache miss reads its XPLine from the media (256 bytes)
//!   unless the XPBuffer holds it.
//!
//! Entries still in the cache or XPBuffer are not counted until they leave it, so a run's
//! figures are those of its steady state (the benchmarks measure after a warm-up).
//!
//! The `optane` profile's parameters: 256-byte XPLines and a 16 KiB (64-entry) XPBuffer per DIMM,
//! Yang et al., "An Empirical Guide to the Behavior and Use of Scalable Persistent Memory",
//! FAST'20, §3 and §5.1; a 2 MiB cache per thread, about one core's share of the last-level
//! cache plus its L2 on the Cascade Lake Xeons of that study (1.375 MiB of L3 + 1 MiB of L2).
//!
//! # Latency emulation ([`NvmLatency`])
//!
//! As DUDETx §6.1 and the works it cites emulate NVM on DRAM: a delay per PM line that a read
//! misses in the modelled cache (the extra latency of the media over DRAM), and at each fence
//! that persists written-back lines, `max(persist latency, bytes written back / bandwidth)`.
//! Under eADR a fence persists nothing (the cache is persistent), so it adds no delay there.
//! Prefetches install lines without delay (their latency overlaps other work). Delays are
//! accumulated and spun off once they reach [`SPIN_QUANTUM_NS`], so that short ones do not pay
//! a clock read each; a spin's overshoot is credited against the next. `emulated_delay_ns` in
//! [`PmStats`](super::PmStats) counts the delay charged.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::cpu::CACHE_LINE;
use super::domain::PersistenceDomain;

/// Bytes of an XPLine: the media's access size.
pub const XPLINE: u64 = 256;
/// Emulated delays are spun off once this many nanoseconds are owed.
pub const SPIN_QUANTUM_NS: u64 = 1_000;

/// Parameters of the media model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MediaModel {
    /// Bytes of CPU cache modelled per thread (a power of two times `cache_ways` lines).
    pub cache_bytes: u64,
    /// Associativity of the modelled cache.
    pub cache_ways: u32,
    /// XPLine entries of the write-combining buffer.
    pub xpbuffer_lines: u32,
}

impl MediaModel {
    /// Optane DC persistent memory (first generation), per thread (see the module docs).
    pub const fn optane() -> MediaModel {
        MediaModel {
            cache_bytes: 2 << 20,
            cache_ways: 16,
            xpbuffer_lines: 64,
        }
    }

    /// `none` (no model), `optane`, or `CACHE_BYTES,WAYS,XPBUFFER_LINES` (the cache size may
    /// end in K or M: `4M,16,64`), validated.
    pub fn parse(spec: &str) -> Result<Option<MediaModel>, String> {
        match spec {
            "none" => return Ok(None),
            "optane" => return Ok(Some(MediaModel::optane())),
            _ => {}
        }
        let bad = || {
            format!(
                "unknown media model '{spec}' (expected 'none', 'optane' or \
                 CACHE_BYTES,WAYS,XPBUFFER_LINES such as 4M,16,64)"
            )
        };
        let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
        let [cache, ways, lines] = parts[..] else {
            return Err(bad());
        };
        let (digits, scale) = match cache.as_bytes().last() {
            Some(b'K' | b'k') => (&cache[..cache.len() - 1], 1u64 << 10),
            Some(b'M' | b'm') => (&cache[..cache.len() - 1], 1 << 20),
            _ => (cache, 1),
        };
        let model = MediaModel {
            cache_bytes: digits
                .parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(scale))
                .ok_or_else(bad)?,
            cache_ways: ways.parse().map_err(|_| bad())?,
            xpbuffer_lines: lines.parse().map_err(|_| bad())?,
        };
        model.validate()?;
        Ok(Some(model))
    }

    /// Checks the parameters: a cache of at least one set, a power-of-two number of sets, and
    /// a buffer of at least one XPLine.
    pub fn validate(&self) -> Result<(), String> {
        let ways = u64::from(self.cache_ways);
        if ways == 0 || ways > 64 {
            return Err(format!(
                "the modelled cache needs 1 to 64 ways, not {}",
                self.cache_ways
            ));
        }
        let lines = self.cache_bytes / CACHE_LINE;
        let sets = lines / ways;
        if sets == 0 || lines % ways != 0 || !sets.is_power_of_two() || sets > 1 << 24 {
            return Err(format!(
                "the modelled cache of {} bytes and {ways} ways needs a power-of-two number of \
                 sets (at most 2^24) of {ways} 64-byte lines",
                self.cache_bytes
            ));
        }
        if self.xpbuffer_lines == 0 || self.xpbuffer_lines > 4096 {
            return Err(format!(
                "the XPBuffer needs 1 to 4096 entries, not {}",
                self.xpbuffer_lines
            ));
        }
        Ok(())
    }
}

/// Extra latency of NVM over DRAM, added by emulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NvmLatency {
    /// Nanoseconds added per PM line a read misses in the modelled cache (a random read).
    pub read_ns: u64,
    /// Nanoseconds a fence that persists written-back lines takes at least (ADR, msync).
    pub persist_ns: u64,
    /// Media write bandwidth in MB/s (10^6 bytes) that bounds a persist from below; 0: unbounded.
    pub write_mb_per_s: u64,
    /// Nanoseconds added per miss of the line right after the thread's previous miss: a
    /// sequential stream, whose latency prefetching partly hides.
    pub seq_read_ns: u64,
}

impl NvmLatency {
    /// Optane DC PM (Yang et al., FAST'20, §3): a random 64-byte read takes ~305 ns against
    /// ~81 ns from DRAM, so +224 ns; a sequential one ~169 ns against ~79 ns, so +90 ns; a
    /// persisted write ~90 ns against ~57 ns, so +33 ns (rounded to 30); ~2.3 GB/s of write
    /// bandwidth per DIMM (256-byte writes, one DIMM).
    pub const fn optane() -> NvmLatency {
        NvmLatency {
            read_ns: 224,
            persist_ns: 30,
            write_mb_per_s: 2_300,
            seq_read_ns: 90,
        }
    }

    /// DUDETx §6.1: reads as DRAM, 1,000 cycles (~300 ns at its 3.4 GHz) per persist, 1 GB/s.
    pub const fn dudetx() -> NvmLatency {
        NvmLatency {
            read_ns: 0,
            persist_ns: 300,
            write_mb_per_s: 1_000,
            seq_read_ns: 0,
        }
    }

    /// `none`, `optane`, `dudetx`, or `READ_NS,PERSIST_NS[,WRITE_MB_PER_S[,SEQ_READ_NS]]`
    /// (unbounded bandwidth and sequential reads as random ones when left out).
    pub fn parse(spec: &str) -> Result<Option<NvmLatency>, String> {
        match spec {
            "none" => return Ok(None),
            "optane" => return Ok(Some(NvmLatency::optane())),
            "dudetx" => return Ok(Some(NvmLatency::dudetx())),
            _ => {}
        }
        let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
        let bad = || {
            format!(
                "NVM latency '{spec}' is not 'none', 'optane', 'dudetx' or \
                 READ_NS,PERSIST_NS[,WRITE_MB_PER_S[,SEQ_READ_NS]] (whole numbers, at most \
                 1000000 each)"
            )
        };
        if !(2..=4).contains(&parts.len()) {
            return Err(bad());
        }
        let mut numbers = [0u64; 4];
        for (n, p) in numbers.iter_mut().zip(&parts) {
            *n = p.parse().map_err(|_| bad())?;
            if *n > 1_000_000 {
                return Err(bad());
            }
        }
        Ok(Some(NvmLatency {
            read_ns: numbers[0],
            persist_ns: numbers[1],
            write_mb_per_s: numbers[2],
            seq_read_ns: if parts.len() == 4 {
                numbers[3]
            } else {
                numbers[0]
            },
        }))
    }
}

/// What a pool attaches: the model, and optionally latency emulation on top of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MediaOptions {
    /// The modelled cache and XPBuffer (emulation uses the cache to tell read misses).
    pub model: MediaModel,
    /// Delays to add, if any.
    pub latency: Option<NvmLatency>,
}

/// The model attached to one pool. Each thread keeps its own cache and XPBuffer state (in
/// thread-local storage, keyed by the model's id) and adds to its own counters in
/// [`stats`](super::stats).
#[derive(Debug)]
pub(crate) struct Media {
    id: u64,
    options: MediaOptions,
    /// Fences persist written-back lines (ADR, msync), so they carry the persist delay.
    fences_persist: bool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Per-thread states of at most this many models; the oldest is dropped beyond it.
const STATES_PER_THREAD: usize = 8;

thread_local! {
    static STATES: RefCell<Vec<ThreadMedia>> = const { RefCell::new(Vec::new()) };
}

impl Media {
    pub(crate) fn new(options: MediaOptions, domain: PersistenceDomain) -> Result<Media, String> {
        options.model.validate()?;
        Ok(Media {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            options,
            fences_persist: matches!(domain, PersistenceDomain::Adr | PersistenceDomain::Msync),
        })
    }

    pub(crate) fn options(&self) -> MediaOptions {
        self.options
    }

    fn with<R>(&self, f: impl FnOnce(&mut ThreadMedia) -> R) -> R {
        STATES.with(|cell| {
            let mut states = cell.borrow_mut();
            let i = match states.iter().position(|s| s.id == self.id) {
                Some(i) => i,
                None => {
                    if states.len() == STATES_PER_THREAD {
                        states.remove(0);
                    }
                    states.push(ThreadMedia::new(self.id, &self.options.model));
                    states.len() - 1
                }
            };
            let state = &mut states[i];
            let out = f(state);
            state.settle(self.options.latency.is_some());
            out
        })
    }

    /// A store of `[off, off + len)` through the cache.
    pub(crate) fn store(&self, off: u64, len: u64) {
        self.with(|s| {
            for line in lines(off, len) {
                s.access(line, true);
            }
        })
    }

    /// A read of `[off, off + len)`: misses read from the media, delayed under emulation.
    pub(crate) fn read(&self, off: u64, len: u64) {
        let (random_ns, seq_ns) = self
            .options
            .latency
            .map_or((0, 0), |l| (l.read_ns, l.seq_read_ns));
        self.with(|s| {
            for line in lines(off, len) {
                if !s.access(line, false) {
                    let sequential = s.last_read_miss.wrapping_add(1) == line;
                    s.last_read_miss = line;
                    s.charge_delay(if sequential { seq_ns } else { random_ns });
                }
            }
        })
    }

    /// A prefetch: lines come in as on a read, without delay.
    pub(crate) fn prefetch(&self, off: u64, len: u64) {
        self.with(|s| {
            for line in lines(off, len) {
                s.access(line, false);
            }
        })
    }

    /// A flush (`clwb`) of `[off, off + len)`: dirty lines go to the XPBuffer.
    pub(crate) fn flush(&self, off: u64, len: u64) {
        self.with(|s| {
            for line in lines(off, len) {
                if s.cache.write_back(line) {
                    s.written_back_since_fence += CACHE_LINE;
                    s.xpbuffer_write(line);
                }
            }
        })
    }

    /// Non-temporal stores of `[off, off + len)`: straight to the XPBuffer.
    pub(crate) fn store_non_temporal(&self, off: u64, len: u64) {
        self.with(|s| {
            for line in lines(off, len) {
                s.cache.invalidate(line);
                s.written_back_since_fence += CACHE_LINE;
                s.xpbuffer_write(line);
            }
        })
    }

    /// A fence: under ADR it waits for the lines written back since the last one.
    pub(crate) fn fence(&self) {
        let latency = self.options.latency;
        let persists = self.fences_persist;
        self.with(|s| {
            let bytes = std::mem::take(&mut s.written_back_since_fence);
            if let (Some(l), true, true) = (latency, persists, bytes > 0) {
                // MB/s = bytes per microsecond: ns = bytes * 1000 / (MB/s).
                let transfer = (bytes * 1000).checked_div(l.write_mb_per_s).unwrap_or(0);
                s.charge_delay(l.persist_ns.max(transfer));
            }
        })
    }
}

/// The 64-byte line numbers (offset / 64) of `[off, off + len)`.
fn lines(off: u64, len: u64) -> std::ops::Range<u64> {
    if len == 0 {
        return 0..0;
    }
    off / CACHE_LINE..(off + len).div_ceil(CACHE_LINE)
}

/// One thread's state for one model.
struct ThreadMedia {
    id: u64,
    cache: Cache,
    xpbuffer: XpBuffer,
    /// Media bytes written and read, and delay owed, not yet added to the thread's counters.
    written: u64,
    read: u64,
    /// Delay owed (negative: a spin overshot by that much).
    owed_ns: i64,
    /// Delay charged and not yet added to the thread's counters.
    charged_ns: u64,
    /// The line of the thread's last read miss (sequential misses are charged less).
    last_read_miss: u64,
    /// Bytes written back (flushes, non-temporal stores) since this thread's last fence.
    written_back_since_fence: u64,
}

impl ThreadMedia {
    fn new(id: u64, model: &MediaModel) -> ThreadMedia {
        ThreadMedia {
            id,
            cache: Cache::new(model),
            xpbuffer: XpBuffer::new(model.xpbuffer_lines as usize),
            written: 0,
            read: 0,
            owed_ns: 0,
            charged_ns: 0,
            last_read_miss: u64::MAX - 1,
            written_back_since_fence: 0,
        }
    }

    /// One line through the cache; `true` on a hit. A miss reads the line's XPLine from the
    /// media into the XPBuffer, unless the buffer has the line's bytes (the XPLine read in, or
    /// that line written); an evicted dirty line goes to the XPBuffer.
    fn access(&mut self, line: u64, write: bool) -> bool {
        let (hit, victim) = self.cache.access(line, write);
        if let Some(dirty) = victim {
            self.xpbuffer_write(dirty);
        }
        if !hit {
            let (had, e) = self.xpbuffer.read(line);
            if !had {
                self.read += XPLINE;
            }
            self.charge(e);
        }
        hit
    }

    fn xpbuffer_write(&mut self, line: u64) {
        let e = self.xpbuffer.write(line);
        self.charge(e);
    }

    fn charge(&mut self, e: Eviction) {
        self.written += e.written;
        self.read += e.read;
    }

    /// Moves the pending counts to the thread's counters and spins off owed delay. A spin that
    /// overshoots is credited against the next one, so the total stays what was configured.
    fn settle(&mut self, emulating: bool) {
        if emulating && self.owed_ns >= SPIN_QUANTUM_NS as i64 {
            // The clock reads around a spin cost time the spin does not see: take it off.
            let overhead = spin_overhead_ns();
            let spun = spin_for((self.owed_ns as u64).saturating_sub(overhead));
            self.owed_ns -= (spun + overhead) as i64;
        }
        if self.written | self.read | self.charged_ns != 0 {
            super::stats::count_media(
                std::mem::take(&mut self.written),
                std::mem::take(&mut self.read),
                std::mem::take(&mut self.charged_ns),
            );
        }
    }

    /// Owes `ns` of emulated delay.
    fn charge_delay(&mut self, ns: u64) {
        self.owed_ns += ns as i64;
        self.charged_ns += ns;
    }
}

/// What a spin costs beyond the time it measures (its clock reads, the call), measured once as
/// the median of 64 rounds of 16 empty spins.
fn spin_overhead_ns() -> u64 {
    static OVERHEAD: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        let mut rounds: Vec<u64> = (0..64)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..16 {
                    std::hint::black_box(spin_for(0));
                }
                start.elapsed().as_nanos() as u64 / 16
            })
            .collect();
        rounds.sort_unstable();
        rounds[rounds.len() / 2]
    })
}

/// Busy-waits at least `ns` nanoseconds (a sleep would give the core away and wake late);
/// returns the nanoseconds actually waited.
fn spin_for(ns: u64) -> u64 {
    let start = std::time::Instant::now();
    let wanted = std::time::Duration::from_nanos(ns);
    loop {
        let spun = start.elapsed();
        if spun >= wanted {
            return spun.as_nanos() as u64;
        }
        std::hint::spin_loop();
    }
}

/// A set-associative LRU cache of lines with dirty bits. Each set is `ways` 32-bit words in
/// most-recently-used-first order (a 16-way set is one 64-byte line of the host's cache, so the
/// model's own footprint stays small: 128 KiB for the `optane` profile). A word is
/// `VALID | DIRTY? | line / sets`.
struct Cache {
    sets: u64,
    ways: usize,
    words: Vec<u32>,
}

const VALID: u32 = 1 << 31;
const DIRTY: u32 = 1 << 30;
const TAG_MASK: u32 = DIRTY - 1;

impl Cache {
    fn new(model: &MediaModel) -> Cache {
        let ways = model.cache_ways as usize;
        let sets = model.cache_bytes / CACHE_LINE / ways as u64;
        Cache {
            sets,
            ways,
            words: vec![0; sets as usize * ways],
        }
    }

    /// The set's words and the tag `line` has in it. A tag wider than 30 bits (a pool over
    /// 2^30 lines per set: 128 TiB with the `optane` profile) is folded, which can only make
    /// two far-apart lines alias.
    fn set(&mut self, line: u64) -> (&mut [u32], u32) {
        let set = (line & (self.sets - 1)) as usize;
        let tag = ((line / self.sets) as u32) & TAG_MASK;
        (&mut self.words[set * self.ways..(set + 1) * self.ways], tag)
    }

    /// Touches `line` (dirtying it on a write): `(hit, the evicted line if it was dirty)`.
    fn access(&mut self, line: u64, write: bool) -> (bool, Option<u64>) {
        let sets = self.sets;
        let (ways, tag) = self.set(line);
        let dirty = if write { DIRTY } else { 0 };
        if let Some(i) = ways
            .iter()
            .position(|&w| w & VALID != 0 && w & TAG_MASK == tag)
        {
            let w = ways[i] | dirty;
            ways.copy_within(0..i, 1);
            ways[0] = w;
            return (true, None);
        }
        let last = ways[ways.len() - 1];
        let evicted = (last & (VALID | DIRTY) == VALID | DIRTY)
            .then(|| u64::from(last & TAG_MASK) * sets + (line & (sets - 1)));
        ways.copy_within(0..ways.len() - 1, 1);
        ways[0] = VALID | dirty | tag;
        (false, evicted)
    }

    /// Cleans `line` if it is cached dirty; `true` if it was.
    fn write_back(&mut self, line: u64) -> bool {
        let (ways, tag) = self.set(line);
        match ways
            .iter_mut()
            .find(|w| **w & (VALID | DIRTY) == VALID | DIRTY && **w & TAG_MASK == tag)
        {
            Some(w) => {
                *w &= !DIRTY;
                true
            }
            None => false,
        }
    }

    /// Drops `line` from the cache.
    fn invalidate(&mut self, line: u64) {
        let (ways, tag) = self.set(line);
        if let Some(i) = ways
            .iter()
            .position(|&w| w & VALID != 0 && w & TAG_MASK == tag)
        {
            // The least recently used end holds the invalid ways.
            ways.copy_within(i + 1.., i);
            let n = ways.len();
            ways[n - 1] = 0;
        }
    }
}

/// The DIMM's buffer: XPLine entries in most-recently-used-first order, each with a mask of the
/// lines written into it and whether its old contents were read from the media (a read miss
/// brings the XPLine in). An entry is one word: `xpline << 8 | LOADED? | written mask`.
struct XpBuffer {
    capacity: usize,
    entries: Vec<u64>,
}

const LOADED: u64 = 1 << 7;
const WRITTEN_MASK: u64 = 0xF;

/// What an eviction costs the media.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Eviction {
    written: u64,
    read: u64,
}

const LINES_PER_XPLINE: u64 = XPLINE / CACHE_LINE;

impl XpBuffer {
    fn new(capacity: usize) -> XpBuffer {
        XpBuffer {
            capacity,
            entries: Vec::with_capacity(capacity),
        }
    }

    fn position(&self, xpline: u64) -> Option<usize> {
        self.entries.iter().position(|&e| e >> 8 == xpline)
    }

    /// Moves `line`'s XPLine's entry to the front, making it (and evicting the least recently
    /// used entry) if absent, and ORs `bits` into it. Returns the entry as it was (0: absent).
    fn touch(&mut self, line: u64, bits: u64) -> (u64, Eviction) {
        let xpline = line / LINES_PER_XPLINE;
        let mut eviction = Eviction::default();
        let (before, entry) = match self.position(xpline) {
            Some(i) => {
                let e = self.entries.remove(i);
                (e, e)
            }
            None => {
                if self.entries.len() == self.capacity {
                    let old = self.entries.pop().expect("a full buffer has entries");
                    let written = old & WRITTEN_MASK;
                    if written != 0 {
                        eviction.written = XPLINE;
                        if written != WRITTEN_MASK && old & LOADED == 0 {
                            eviction.read = XPLINE; // read-modify-write of a partial XPLine
                        }
                    }
                }
                (0, xpline << 8)
            }
        };
        self.entries.insert(0, entry | bits);
        (before, eviction)
    }

    /// Merges a written-back line.
    fn write(&mut self, line: u64) -> Eviction {
        self.touch(line, 1 << (line % LINES_PER_XPLINE)).1
    }

    /// A read of `line` that missed the CPU cache: whether the buffer had its bytes (else the
    /// XPLine is read from the media, and is then loaded).
    fn read(&mut self, line: u64) -> (bool, Eviction) {
        let (before, eviction) = self.touch(line, LOADED);
        let bit = 1 << (line % LINES_PER_XPLINE);
        (before & (LOADED | bit) != 0, eviction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::stats::thread_snapshot;

    /// A model of `lines` cache lines in `ways` ways and `xplines` XPBuffer entries.
    fn model(lines: u64, ways: u32, xplines: u32) -> MediaOptions {
        MediaOptions {
            model: MediaModel {
                cache_bytes: lines * CACHE_LINE,
                cache_ways: ways,
                xpbuffer_lines: xplines,
            },
            latency: None,
        }
    }

    /// A tiny model: 2 sets of 2 ways (4 lines), an XPBuffer of 2 XPLines.
    fn tiny() -> MediaOptions {
        model(4, 2, 2)
    }

    /// (media bytes written, media bytes read) that `f` caused on this thread.
    fn traffic(f: impl FnOnce()) -> (u64, u64) {
        let before = thread_snapshot();
        f();
        let d = thread_snapshot() - before;
        (d.media_bytes_written, d.media_bytes_read)
    }

    #[test]
    fn a_flushed_line_reaches_the_media_when_its_xpline_leaves_the_buffer() {
        let m = Media::new(tiny(), PersistenceDomain::Adr).unwrap();
        // A store misses: its XPLine is read into the buffer (read for ownership).
        assert_eq!(traffic(|| m.store(0, 8)), (0, XPLINE));
        // The flush merges the line into the buffered XPLine: nothing reaches the media yet.
        assert_eq!(traffic(|| m.flush(0, 8)), (0, 0));
        // Flushing it again is free (clean), as is flushing an uncached line.
        assert_eq!(traffic(|| m.flush(0, 8)), (0, 0));
        assert_eq!(traffic(|| m.flush(4096, 64)), (0, 0));
        // Two more XPLines read push the written one out: one 256-byte write, no
        // read-modify-write (its old contents were read in), plus the two reads.
        assert_eq!(traffic(|| m.read(1024, 8)), (0, XPLINE));
        assert_eq!(traffic(|| m.read(2048, 8)), (XPLINE, XPLINE));
    }

    #[test]
    fn four_lines_of_one_xpline_are_combined_into_one_media_write() {
        let m = Media::new(tiny(), PersistenceDomain::Adr).unwrap();
        // Four lines of one XPLine stored: one XPLine read (the others are then buffered).
        assert_eq!(traffic(|| m.store(0, XPLINE)), (0, XPLINE));
        assert_eq!(traffic(|| m.flush(0, XPLINE)), (0, 0));
        // Evicted, the XPLine costs one 256-byte write.
        m.read(1024, 8);
        assert_eq!(traffic(|| m.read(2048, 8)), (XPLINE, XPLINE));
    }

    #[test]
    fn a_partial_xpline_not_read_in_costs_a_read_modify_write() {
        let m = Media::new(tiny(), PersistenceDomain::Adr).unwrap();
        // Non-temporal stores: no read for ownership, no cache.
        assert_eq!(traffic(|| m.store_non_temporal(0, 64)), (0, 0));
        assert_eq!(traffic(|| m.store_non_temporal(1024, XPLINE)), (0, 0));
        // XPLine 0 (one line of four) leaves: written, and read first.
        assert_eq!(traffic(|| m.store_non_temporal(2048, 64)), (XPLINE, XPLINE));
        // XPLine 4 (whole) leaves: written only.
        assert_eq!(traffic(|| m.store_non_temporal(4096, 64)), (XPLINE, 0));
    }

    #[test]
    fn under_eadr_without_flushes_a_dirty_line_reaches_the_media_when_evicted() {
        // One set of two ways, one XPBuffer entry.
        let m = Media::new(model(2, 2, 1), PersistenceDomain::Eadr).unwrap();
        assert_eq!(traffic(|| m.store(0, 8)), (0, XPLINE));
        // Line 1 is in the buffered XPLine 0: a cache miss but no media read.
        assert_eq!(traffic(|| m.store(64, 8)), (0, 0));
        // Line 4 evicts dirty line 0 into XPLine 0, then reading XPLine 1 evicts XPLine 0.
        assert_eq!(traffic(|| m.store(256, 8)), (XPLINE, XPLINE));
    }

    #[test]
    fn reads_hit_after_the_first_miss() {
        let m = Media::new(tiny(), PersistenceDomain::Adr).unwrap();
        // Two lines of one XPLine: one media read.
        assert_eq!(traffic(|| m.read(0, 128)), (0, XPLINE));
        assert_eq!(traffic(|| m.read(0, 128)), (0, 0));
        // A prefetched line then hits.
        m.prefetch(512, 64);
        assert_eq!(traffic(|| m.read(512, 8)), (0, 0));
    }

    #[test]
    fn emulation_owes_read_misses_and_persists_and_settles_in_quanta() {
        // 64 lines in 16 sets of 4 ways.
        let mut options = model(64, 4, 2);
        options.latency = Some(NvmLatency {
            read_ns: 300,
            persist_ns: 500,
            write_mb_per_s: 1_000,
            seq_read_ns: 100,
        });
        let adr = Media::new(options, PersistenceDomain::Adr).unwrap();
        let delay = |f: &dyn Fn()| {
            let before = thread_snapshot();
            f();
            (thread_snapshot() - before).emulated_delay_ns
        };
        // Each miss is charged its delay (spun off once a quantum is owed), a sequential one
        // (the line after the previous miss) less; a hit nothing.
        assert_eq!(delay(&|| adr.read(0, 3 * 64)), 300 + 100 + 100);
        assert_eq!(delay(&|| adr.read(10 * 64, 8)), 300);
        assert_eq!(delay(&|| adr.read(10 * 64, 8)), 0);
        assert_eq!(delay(&|| adr.read(11 * 64, 8)), 100);
        // A fence after 1 KiB written back: max(500, 1024 B at 1 GB/s = 1024 ns).
        adr.store(4096, 1024);
        adr.flush(4096, 1024);
        assert_eq!(delay(&|| adr.fence()), 1_024);
        // Under eADR a fence persists nothing: no delay.
        let eadr = Media::new(options, PersistenceDomain::Eadr).unwrap();
        eadr.store(4096, 1024);
        eadr.flush(4096, 1024);
        assert_eq!(delay(&|| eadr.fence()), 0);
    }

    #[test]
    fn profiles_and_specs_parse_and_bad_ones_are_refused() {
        assert_eq!(MediaModel::parse("none"), Ok(None));
        assert_eq!(MediaModel::parse("optane"), Ok(Some(MediaModel::optane())));
        assert!(MediaModel::parse("pcm")
            .unwrap_err()
            .contains("unknown media model"));
        assert_eq!(NvmLatency::parse("optane"), Ok(Some(NvmLatency::optane())));
        assert_eq!(
            NvmLatency::parse("100, 200"),
            Ok(Some(NvmLatency {
                read_ns: 100,
                persist_ns: 200,
                write_mb_per_s: 0,
                seq_read_ns: 100,
            }))
        );
        assert_eq!(
            NvmLatency::parse("1,2,3,4").unwrap().unwrap().seq_read_ns,
            4
        );
        for bad in ["", "1", "1,2,3,4,5", "a,b", "-1,2", "1,99999999"] {
            assert!(NvmLatency::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            MediaModel::parse("4M,16,64"),
            Ok(Some(MediaModel {
                cache_bytes: 4 << 20,
                cache_ways: 16,
                xpbuffer_lines: 64
            }))
        );
        for bad in [
            "4M,16",
            "3M,16,64",
            "4M,0,64",
            "4M,16,0",
            "x,1,1",
            "99999999999999M,1,1",
        ] {
            assert!(MediaModel::parse(bad).is_err(), "{bad}");
        }
        let mut m = MediaModel::optane();
        assert!(m.validate().is_ok());
        m.cache_bytes = 3 * 64 * 16;
        assert!(m.validate().is_err());
        m = MediaModel::optane();
        m.cache_ways = 0;
        assert!(m.validate().is_err());
        m = MediaModel::optane();
        m.xpbuffer_lines = 0;
        assert!(m.validate().is_err());
    }
}
