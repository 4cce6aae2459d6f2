//! Range iterators over a table's primary keys inside a transaction ([`Tx::range`],
//! [`Tx::range_rev`]).
//!
//! The engine contract offers one scan primitive, `EngineWorker::scan`: rows from a start key in
//! one direction, up to a limit, until a callback says stop. An iterator runs it in batches that
//! grow from [`FIRST_BATCH`] to [`MAX_BATCH`] rows, so a short range costs one small scan and a long
//! one a few large ones, and each batch stops at the range's end bound: a row past the end is never
//! handed out. Each batch resumes just past the last key it returned, so the rows come in key order
//! without repeats, and every row is read through the engine's protocol exactly as
//! [`Tx::scan`] reads it (it enters the read set, locks are taken, snapshots apply).
//!
//! **Phantoms.** Under every protocol that claims serializability (all but SI) on the Falcon
//! family and Zen, the interval each batch of a read-write transaction covered is validated at
//! commit: a row inserted into it by another transaction since fails the transaction with
//! `Conflict`, so a range read is serializable. So are the read-only transactions of the
//! single-version protocols (2PL, TO, OCC, Silo, TicToc, H-Store); those of the multi-version
//! ones (MVOCC, MV2PL, MVTO) read a snapshot, serializable at it. SI's scans read its snapshot
//! and admit phantoms by definition. A scan at a snapshot fails with `Conflict` when a delete
//! committed in its table after the snapshot (the walked index no longer holds that row). FIR
//! (MVTO) keeps its timestamp order for scans too (docs/CC.md, "Phantoms"). A batch reads one row past the range's
//! end (the scan primitive finds the end by reading it) and hands out
//! none of it; that row is in the read set like the others.

use super::{layout_of, Row, Tx};
use crate::catalog::TableId;
use crate::engine::TxError;
use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};

/// Rows fetched by an iterator's first scan: a range of a few rows costs one small scan.
pub const FIRST_BATCH: usize = 16;
/// Largest batch: each later scan doubles the previous one up to this many rows.
pub const MAX_BATCH: usize = 256;

/// Rows of a key range, in ascending ([`Tx::range`]) or descending ([`Tx::range_rev`]) key order,
/// read lazily in batches through the transaction. Each item is `(key, row)` or the error that
/// ended the scan (a conflict, for instance); the iterator yields nothing after an error, and the
/// transaction then fails as it would after any failed read.
///
/// ```
/// use pmtx::prelude::*;
/// # fn main() -> Result<(), DbError> {
/// let db = Db::create(DbConfig::temporary())?;
/// let items = db.create_table(Schema::new("items", &[("price", ColumnType::U64)]).ordered())?;
/// db.run(|tx| {
///     for key in 0..100 {
///         tx.insert(items, key, &[Value::U64(key * 10)])?;
///     }
///     Ok(())
/// })?;
/// let total: u64 = db.run(|tx| {
///     let mut total = 0;
///     for row in tx.range(items, 10..20) {
///         let (_key, row) = row?;
///         total += row.u64(0);
///     }
///     Ok(total)
/// })?;
/// assert_eq!(total, (10..20u64).map(|k| k * 10).sum::<u64>());
/// let last_three: Vec<u64> = db.run(|tx| {
///     tx.range_rev(items, ..=50).take(3).map(|r| r.map(|(k, _)| k)).collect()
/// })?;
/// assert_eq!(last_three, [50, 49, 48]);
/// # Ok(())
/// # }
/// ```
pub struct RangeIter<'t, 'w> {
    tx: &'t mut Tx<'w>,
    table: TableId,
    reverse: bool,
    /// The key the next batch starts from (inclusive); `None` once the range is exhausted or an
    /// error ended it.
    next: Option<u64>,
    /// The bound where the iteration stops: the range's end going up, its start going down.
    stop: Bound<u64>,
    batch: usize,
    rows: VecDeque<(u64, Row)>,
}

impl<'w> Tx<'w> {
    /// Rows with keys in `range`, in ascending key order, read lazily (see [`RangeIter`]). Needs an
    /// ordered primary index, as [`Tx::scan`] does.
    pub fn range<'t>(
        &'t mut self,
        table: TableId,
        range: impl RangeBounds<u64>,
    ) -> RangeIter<'t, 'w> {
        let first = match range.start_bound() {
            Bound::Included(&k) => Some(k),
            Bound::Excluded(&k) => k.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        RangeIter::new(self, table, false, first, range.end_bound().cloned())
    }

    /// Rows with keys in `range`, in descending key order, read lazily (see [`RangeIter`]).
    pub fn range_rev<'t>(
        &'t mut self,
        table: TableId,
        range: impl RangeBounds<u64>,
    ) -> RangeIter<'t, 'w> {
        let first = match range.end_bound() {
            Bound::Included(&k) => Some(k),
            Bound::Excluded(&k) => k.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        RangeIter::new(self, table, true, first, range.start_bound().cloned())
    }
}

impl<'t, 'w> RangeIter<'t, 'w> {
    fn new(
        tx: &'t mut Tx<'w>,
        table: TableId,
        reverse: bool,
        first: Option<u64>,
        stop: Bound<u64>,
    ) -> RangeIter<'t, 'w> {
        RangeIter {
            tx,
            table,
            reverse,
            next: first.filter(|&k| within(stop, reverse, k)),
            stop,
            batch: FIRST_BATCH,
            rows: VecDeque::new(),
        }
    }

    /// Reads the next batch into `rows`, leaving `next` where the one after starts (or `None`).
    fn fetch(&mut self) -> Result<(), TxError> {
        let Some(from) = self.next.take() else {
            return Ok(());
        };
        let (table, reverse, limit) = (self.table, self.reverse, self.batch);
        self.batch = (self.batch * 2).min(MAX_BATCH);
        let stop = self.stop;
        let core = self.tx.live()?;
        super::bytekey::check_u64_keys(&core.schemas, table)?;
        let layout = layout_of(&core.layouts, table)?.clone();
        let rows = &mut self.rows;
        let fetched_from = rows.len();
        let mut passed_end = false;
        let result = core
            .inner
            .scan(table, from, reverse, limit, &mut |key, bytes| {
                if !within(stop, reverse, key) {
                    passed_end = true;
                    return false;
                }
                let mut row = super::row_buffer(0);
                row.extend_from_slice(bytes);
                rows.push_back((
                    key,
                    Row {
                        bytes: row,
                        layout: layout.clone(),
                        large: Vec::new(),
                    },
                ));
                true
            });
        self.tx.settle(result)?;
        if layout.spills {
            // Long variable-length values come with their rows (see `varlen`).
            for (key, row) in self.rows.iter_mut().skip(fetched_from) {
                let read = self
                    .tx
                    .materialise(table, *key, &row.bytes, &layout, &mut row.large);
                if read.is_err() {
                    self.rows.clear();
                    return read;
                }
            }
        }
        let full = self.rows.len() == limit;
        if full && !passed_end {
            let &(last, _) = self.rows.back().expect("a full batch has rows");
            self.next = if reverse {
                last.checked_sub(1)
            } else {
                last.checked_add(1)
            }
            .filter(|&k| within(stop, reverse, k));
        }
        Ok(())
    }
}

/// Whether `key` lies on the near side of `stop`, for an iteration going down when `reverse`.
fn within(stop: Bound<u64>, reverse: bool, key: u64) -> bool {
    match (stop, reverse) {
        (Bound::Unbounded, _) => true,
        (Bound::Included(s), false) => key <= s,
        (Bound::Excluded(s), false) => key < s,
        (Bound::Included(s), true) => key >= s,
        (Bound::Excluded(s), true) => key > s,
    }
}

impl Iterator for RangeIter<'_, '_> {
    type Item = Result<(u64, Row), TxError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rows.is_empty() {
            if let Err(e) = self.fetch() {
                self.next = None;
                return Some(Err(e));
            }
        }
        self.rows.pop_front().map(Ok)
    }
}

impl std::iter::FusedIterator for RangeIter<'_, '_> {}
