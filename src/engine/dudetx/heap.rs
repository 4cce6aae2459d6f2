//! The PM heap (§3.1's "PM copy"): every table's rows in fixed-size slots of heap pages, written
//! only by the reproduce step (one thread at a time), in transaction order. Its DRAM directory
//! (key → slot, free slots) is rebuilt from the pages at open.

use super::layout::{kind, slot};
use super::log::{OpRef, Write};
use super::DudetxFault;
use crate::alloc::{PageManager, PageTag, PAGE_SIZE};
use crate::catalog::{Catalog, TableId};
use crate::engine::common::BuildWriteKeyHasher;
use crate::engine::DbError;
use crate::pmem::Pool;
use std::collections::HashMap;

/// One table's part of the heap.
#[derive(Default)]
pub(crate) struct HeapTable {
    /// Row bytes.
    row: usize,
    /// Slot bytes.
    slot: u64,
    /// Key → slot offset of its live row. Hashed with `mix64`, not SipHash: reproduce looks a
    /// key up per op, and the keys are the engine's own (`perf`: SipHash was a visible part of
    /// the reproduce thread).
    pub index: HashMap<u64, u64, BuildWriteKeyHasher>,
    /// Free slots.
    free: Vec<u64>,
    /// Heap pages (offsets).
    pub pages: Vec<u64>,
    /// Dropped (issue 21): no pages, and log records of it are skipped.
    dropped: bool,
}

/// The heap's DRAM directory.
pub(crate) struct Heap {
    pub tables: Vec<HeapTable>,
    /// Recovery's replay is running: a field write of a key with no row is skipped (a later
    /// delete was reproduced before the crash) rather than refused as a broken log.
    pub replaying: bool,
}

impl Heap {
    /// An empty directory for `catalog`'s tables.
    pub fn new(catalog: &Catalog) -> Heap {
        let mut h = Heap {
            tables: Vec::new(),
            replaying: false,
        };
        h.sync_tables(catalog);
        h
    }

    /// Adds the tables of `catalog` the directory does not have yet.
    pub fn sync_tables(&mut self, catalog: &Catalog) {
        for schema in &catalog.tables[self.tables.len().min(catalog.tables.len())..] {
            let row = schema.row_size();
            self.tables.push(HeapTable {
                row,
                slot: slot::size(row),
                dropped: !schema.is_live(),
                ..HeapTable::default()
            });
        }
    }

    /// Rebuilds the directory from the heap pages: a slot is live when its state word says so;
    /// every other slot is free (a slot a crash interrupted before its state word is free too).
    pub fn load(pool: &Pool, pages: &PageManager, catalog: &Catalog) -> Result<Heap, DbError> {
        let mut heap = Heap::new(catalog);
        for (index, tag) in pages.allocated(pool)? {
            if tag.kind != kind::HEAP {
                continue;
            }
            let page = pages.page_offset(index);
            let Some(t) = heap.tables.get_mut(tag.value as usize) else {
                return Err(DbError::Corrupt(format!(
                    "heap page {index} belongs to table {}, which the catalog does not have",
                    tag.value
                )));
            };
            if t.dropped {
                // A drop a crash interrupted (issue 21): finish freeing the table's pages.
                pages.free(pool, index);
                continue;
            }
            t.pages.push(page);
            let slots = PAGE_SIZE / t.slot;
            for i in (0..slots).rev() {
                let at = page + i * t.slot;
                if pool.read_u64(at + slot::STATE) == slot::LIVE {
                    let key = pool.read_u64(at + slot::KEY);
                    if let Some(other) = t.index.insert(key, at) {
                        return Err(DbError::Corrupt(format!(
                            "key {key} of table {} is live in two heap slots ({other} and {at})",
                            tag.value
                        )));
                    }
                } else {
                    t.free.push(at);
                }
            }
        }
        Ok(heap)
    }

    /// Forgets `table` (dropped, issue 21) and returns its pages for the caller to free; log
    /// records of it are skipped from now on.
    pub fn drop_table(&mut self, table: TableId) -> Vec<u64> {
        let Some(t) = self.tables.get_mut(table as usize) else {
            return Vec::new();
        };
        let (row, slot) = (t.row, t.slot);
        let pages = std::mem::take(&mut t.pages);
        *t = HeapTable {
            row,
            slot,
            dropped: true,
            ..HeapTable::default()
        };
        pages
    }

    /// A free slot of `table`, taking a new page when none is left.
    fn take_slot(
        &mut self,
        pool: &Pool,
        pages: &PageManager,
        table: TableId,
    ) -> Result<u64, String> {
        let t = &mut self.tables[table as usize];
        if let Some(at) = t.free.pop() {
            return Ok(at);
        }
        let tag = PageTag {
            kind: kind::HEAP,
            owner: 0,
            value: u64::from(table),
        };
        let index = pages.allocate(pool, tag).map_err(|e| {
            format!(
                "the PM heap of table {table} needs a new page: {e}; {}",
                crate::engine::common::PM_FULL_ADVICE
            )
        })?;
        let page = pages.page_offset(index);
        t.pages.push(page);
        let slots = PAGE_SIZE / t.slot;
        t.free.extend((1..slots).rev().map(|i| page + i * t.slot));
        Ok(page)
    }

    /// The live rows of `table`, by key.
    pub fn rows(&self, pool: &Pool, table: TableId) -> Vec<(u64, Vec<u8>)> {
        let t = &self.tables[table as usize];
        let mut rows: Vec<(u64, Vec<u8>)> = t
            .index
            .iter()
            .map(|(&k, &at)| (k, pool.read_vec(at + slot::HEADER, t.row)))
            .collect();
        rows.sort_unstable_by_key(|r| r.0);
        rows
    }
}

impl super::pipeline::Apply for Heap {
    /// Applies one op (§3.4 reproduce): a put writes key and row, makes them durable, and only
    /// then marks a new slot live; an update rewrites the row in place (a torn row is redone from
    /// the log, which is truncated only after the heap writes are durable); a delete clears the
    /// state word.
    fn apply(
        &mut self,
        pool: &Pool,
        pages: &PageManager,
        op: OpRef<'_>,
        fault: Option<DudetxFault>,
    ) -> Result<(), String> {
        let Some(t) = self.tables.get(op.table as usize) else {
            return Err(format!(
                "a log record writes table {}, which does not exist",
                op.table
            ));
        };
        if t.dropped {
            // The table was dropped after this record (ids are never reused): it is gone.
            return Ok(());
        }
        // Write-backs only: the reproduce step fences once for its whole batch before it
        // truncates (§3.4), and replay redoes an untruncated batch. The one fence per op kept is
        // a new slot's, between its key and row and its LIVE state: the directory rebuilt at
        // open must never see a LIVE slot with a stale key (it also orders every write-back
        // before it, so an earlier delete's state is durable before a new slot of its key).
        // Under eADR the caches are persistent: a write-back would buy nothing and evict the
        // line (as the persist step skips the log's), so only the fences stay.
        let flush = fault != Some(DudetxFault::SkipHeapFlush) && pool.domain().needs_flush();
        match op.write {
            Write::Fields { at, bytes } => {
                let end = at + bytes.len();
                if end > t.row {
                    return Err(super::log::field_out_of_row(
                        op.table, op.key, at, end, t.row,
                    ));
                }
                let Some(&slot_at) = t.index.get(&op.key) else {
                    if self.replaying {
                        // A delete after this write was reproduced before the crash; the
                        // replay repeats it (see log.rs).
                        return Ok(());
                    }
                    return Err(format!(
                        "a log record writes fields of key {} in table {}, which has no row",
                        op.key, op.table
                    ));
                };
                let dst = slot_at + slot::HEADER + at as u64;
                pool.write_bytes(dst, bytes);
                if flush {
                    pool.flush(dst, bytes.len() as u64);
                }
            }
            Write::Put(row) => {
                if row.len() != t.row {
                    return Err(format!(
                        "a log record writes a row of {} bytes into table {} (rows of {} bytes)",
                        row.len(),
                        op.table,
                        t.row
                    ));
                }
                if let Some(&at) = t.index.get(&op.key) {
                    pool.write_bytes(at + slot::HEADER, row);
                    if flush {
                        pool.flush(at + slot::HEADER, row.len() as u64);
                    }
                    return Ok(());
                }
                let at = self.take_slot(pool, pages, op.table)?;
                pool.write_u64(at + slot::KEY, op.key);
                pool.write_bytes(at + slot::HEADER, row);
                if fault != Some(DudetxFault::SkipHeapFlush) {
                    // Under eADR a compiler fence only: x86 keeps the stores in order.
                    pool.persist(at, slot::HEADER + row.len() as u64);
                }
                pool.write_u64(at + slot::STATE, slot::LIVE);
                if flush {
                    pool.flush(at + slot::STATE, 8);
                }
                self.tables[op.table as usize].index.insert(op.key, at);
            }
            Write::Delete => {
                let t = &mut self.tables[op.table as usize];
                if let Some(at) = t.index.remove(&op.key) {
                    pool.write_u64(at + slot::STATE, 0);
                    if flush {
                        pool.flush(at + slot::STATE, 8);
                    }
                    t.free.push(at);
                }
            }
        }
        Ok(())
    }

    /// Prefetches the bytes `op` will write in an existing row (a new row's slot is not
    /// known until it is taken).
    fn prefetch(&self, pool: &Pool, op: OpRef<'_>) {
        let Some(t) = self.tables.get(op.table as usize) else {
            return;
        };
        let Some(&slot_at) = t.index.get(&op.key) else {
            return;
        };
        match op.write {
            Write::Fields { at, bytes } if at + bytes.len() <= t.row => {
                pool.prefetch(slot_at + slot::HEADER + at as u64, bytes.len() as u64)
            }
            Write::Put(row) if row.len() == t.row => {
                pool.prefetch(slot_at + slot::HEADER, row.len() as u64)
            }
            Write::Delete => pool.prefetch(slot_at + slot::STATE, 8),
            _ => {}
        }
    }
}
