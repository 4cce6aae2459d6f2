//! Per-thread counters of PM traffic: bytes written, cache lines flushed, fences.
//!
//! Each thread owns one set of counters and is their only writer, so an update is a relaxed load
//! and store (no locked instruction): cheap enough to stay on in benchmarks. Readers sum every
//! thread's set on demand. Counters are process-wide (not per pool); take a snapshot before and after
//! the code you measure and subtract.

use std::cell::OnceCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// A sum of PM traffic counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PmStats {
    /// Store operations on PM (a `write_bytes` call is one).
    pub writes: u64,
    /// Bytes stored to PM.
    pub bytes_written: u64,
    /// Cache lines written back by flush instructions (or handed to `msync`).
    pub lines_flushed: u64,
    /// Store fences issued.
    pub fences: u64,
    /// Bytes the PM media model ([`media`](super::media)) wrote to the media: 256-byte XPLines.
    /// Zero without a model.
    pub media_bytes_written: u64,
    /// Bytes the media model read from the media: XPLines read on cache misses and for the
    /// read-modify-write of partial XPLines. Zero without a model.
    pub media_bytes_read: u64,
    /// Nanoseconds of delay NVM latency emulation added. Zero without emulation.
    pub emulated_delay_ns: u64,
}

impl std::ops::Sub for PmStats {
    type Output = PmStats;

    fn sub(self, rhs: PmStats) -> PmStats {
        PmStats {
            writes: self.writes.wrapping_sub(rhs.writes),
            bytes_written: self.bytes_written.wrapping_sub(rhs.bytes_written),
            lines_flushed: self.lines_flushed.wrapping_sub(rhs.lines_flushed),
            fences: self.fences.wrapping_sub(rhs.fences),
            media_bytes_written: self
                .media_bytes_written
                .wrapping_sub(rhs.media_bytes_written),
            media_bytes_read: self.media_bytes_read.wrapping_sub(rhs.media_bytes_read),
            emulated_delay_ns: self.emulated_delay_ns.wrapping_sub(rhs.emulated_delay_ns),
        }
    }
}

impl std::ops::Add for PmStats {
    type Output = PmStats;

    fn add(self, rhs: PmStats) -> PmStats {
        PmStats {
            writes: self.writes + rhs.writes,
            bytes_written: self.bytes_written + rhs.bytes_written,
            lines_flushed: self.lines_flushed + rhs.lines_flushed,
            fences: self.fences + rhs.fences,
            media_bytes_written: self.media_bytes_written + rhs.media_bytes_written,
            media_bytes_read: self.media_bytes_read + rhs.media_bytes_read,
            emulated_delay_ns: self.emulated_delay_ns + rhs.emulated_delay_ns,
        }
    }
}

#[derive(Default)]
struct ThreadCounters {
    writes: AtomicU64,
    bytes_written: AtomicU64,
    lines_flushed: AtomicU64,
    fences: AtomicU64,
    media_bytes_written: AtomicU64,
    media_bytes_read: AtomicU64,
    emulated_delay_ns: AtomicU64,
}

impl ThreadCounters {
    fn read(&self) -> PmStats {
        PmStats {
            writes: self.writes.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            lines_flushed: self.lines_flushed.load(Relaxed),
            fences: self.fences.load(Relaxed),
            media_bytes_written: self.media_bytes_written.load(Relaxed),
            media_bytes_read: self.media_bytes_read.load(Relaxed),
            emulated_delay_ns: self.emulated_delay_ns.load(Relaxed),
        }
    }
}

/// Every thread's counters ever registered; a finished thread's stay so that sums never go back.
static REGISTRY: Mutex<Vec<Arc<ThreadCounters>>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: OnceCell<Arc<ThreadCounters>> = const { OnceCell::new() };
}

#[inline]
fn with_mine(f: impl FnOnce(&ThreadCounters)) {
    MINE.with(|cell| {
        let counters = cell.get_or_init(|| {
            let counters = Arc::new(ThreadCounters::default());
            REGISTRY
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(counters.clone());
            counters
        });
        f(counters)
    })
}

/// Adds without a locked instruction: only the owning thread writes its counters.
#[inline(always)]
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
}

#[inline]
pub(crate) fn count_write(bytes: u64) {
    with_mine(|c| {
        bump(&c.writes, 1);
        bump(&c.bytes_written, bytes);
    })
}

#[inline]
pub(crate) fn count_flush(lines: u64) {
    with_mine(|c| bump(&c.lines_flushed, lines))
}

#[inline]
pub(crate) fn count_fence() {
    with_mine(|c| bump(&c.fences, 1))
}

/// Media traffic and emulated delay of the calling thread (see [`media`](super::media)).
#[inline]
pub(crate) fn count_media(written: u64, read: u64, delay_ns: u64) {
    with_mine(|c| {
        bump(&c.media_bytes_written, written);
        bump(&c.media_bytes_read, read);
        bump(&c.emulated_delay_ns, delay_ns);
    })
}

/// The sum of every thread's counters since the process started.
pub fn snapshot() -> PmStats {
    REGISTRY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .fold(PmStats::default(), |sum, c| sum + c.read())
}

/// The calling thread's counters since it started.
pub fn thread_snapshot() -> PmStats {
    let mut out = PmStats::default();
    with_mine(|c| out = c.read());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counters_add_up_and_global_sum_includes_other_threads() {
        let before = thread_snapshot();
        count_write(10);
        count_write(6);
        count_flush(3);
        count_fence();
        let delta = thread_snapshot() - before;
        assert_eq!(
            delta,
            PmStats {
                writes: 2,
                bytes_written: 16,
                lines_flushed: 3,
                fences: 1,
                ..PmStats::default()
            }
        );
        let global_before = snapshot();
        std::thread::spawn(|| count_write(1000)).join().unwrap();
        assert!(snapshot().bytes_written >= global_before.bytes_written + 1000);
    }
}
