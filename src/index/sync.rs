//! The atomics, lock and spin hint of the hand-written concurrent indexes (`btree.rs`,
//! `hash.rs`), swapped for loom's under `--cfg loom` so that `tests/index_model.rs` can check
//! every interleaving of their optimistic reads against their writers.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};

/// A mutex whose `lock` returns the guard directly (parking_lot's shape).
#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;

/// A mutex whose `lock` returns the guard directly, over loom's mutex.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .expect("a loom mutex is never poisoned in a passing model")
    }
}

/// Waits a moment for a writer to finish: a CPU spin hint, or under loom a yield, so that the
/// model lets the writer run instead of exploring an endless spin.
#[inline]
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
