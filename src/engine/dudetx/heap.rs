//! The PM heap (§3.1's "PM copy"): every table's rows in fixed-size slots of heap pages, written
//! only by the reproduce step (one thread at a time), in transaction order. Its DRAM directory
//! (key → slot, free slots) is rebuilt from the pages at open.

use super::layout::{kind, slot};
use super::log::{OpRef, Write};
use super::DudetxFault;
use crate::alloc::{PageManager, PageTag, PAGE_SIZE};
use crate::catalog::{Catalog, TableId};
use crate::engine::DbError;
use crate::pmem::Pool;

/// One table's part of the heap.
#[derive(Default)]
pub(crate) struct HeapTable {
    /// Row bytes.
    row: usize,
    /// Slot bytes.
    slot: u64,
    /// Key → slot offset of its live row.
    pub index: SlotIndex,
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
            .map(|(k, at)| (k, pool.read_vec(at + slot::HEADER, t.row)))
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
                let Some(slot_at) = t.index.get(op.key) else {
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
                if let Some(at) = t.index.get(op.key) {
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
                if let Some(at) = t.index.remove(op.key) {
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

    /// Prefetches the directory entry `op`'s key hashes to.
    fn prefetch_lookup(&self, op: OpRef<'_>) {
        if let Some(t) = self.tables.get(op.table as usize) {
            t.index.prefetch(op.key);
        }
    }

    /// Prefetches the bytes `op` will write in an existing row (a new row's slot is not
    /// known until it is taken).
    fn prefetch(&self, pool: &Pool, op: OpRef<'_>) {
        let Some(t) = self.tables.get(op.table as usize) else {
            return;
        };
        let Some(slot_at) = t.index.get(op.key) else {
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

/// A table's directory: key → slot offset of its live row, an open-addressing table with linear
/// probing whose entries can be prefetched. Reproduce looks a key up per op, and the lookups of
/// a large table miss the caches twice in a `std` map (control bytes, then the entry); `perf`
/// put that wait at 60 % of the reproduce thread on TPC-C. Here one key's probe starts at one
/// 16-byte entry, which reproduce prefetches a pass before the lookup (`pipeline::REPRODUCE_CHUNK`).
/// At most half full, so a lookup reads one or two entries on average.
#[derive(Default)]
pub(crate) struct SlotIndex {
    /// (key, slot offset) pairs, a power of two of them (or none); offset 0 marks an empty
    /// entry (no heap slot is at offset 0: the pool header is).
    entries: Vec<[u64; 2]>,
    /// Live entries.
    len: usize,
}

/// The fewest entries a directory that holds a row has.
const MIN_ENTRIES: usize = 16;

/// Log2 of how many consecutive keys have consecutive directory entries ([`SlotIndex::home`]):
/// 8 entries of 16 bytes, two cache lines.
const RUN_BITS: u32 = 3;

impl SlotIndex {
    /// Where `key`'s probe starts (`entries` is not empty): the keys of one aligned run of
    /// 2^[`RUN_BITS`] consecutive keys start at consecutive entries (the run's hash, then the key's
    /// place in the run), so a transaction's consecutive keys share a cache line or two (and a
    /// page) of the directory instead of one random line each. TPC-C's order lines of one order
    /// are consecutive keys (`order << 4 | number`), as are its orders and history rows, and
    /// they are about half of reproduce's ops; random keys (YCSB's hashed ones, stock) spread
    /// as before.
    fn home(&self, key: u64) -> usize {
        let run_mask = (1 << RUN_BITS) - 1;
        let spread = (crate::index::mix64(key >> RUN_BITS) << RUN_BITS) | (key & run_mask);
        spread as usize & (self.entries.len() - 1)
    }

    /// The entry of `key`, if it is there.
    fn position(&self, key: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let [k, at] = self.entries[i];
            if at == 0 {
                return None;
            }
            if k == key {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot offset of `key`'s row.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.position(key).map(|i| self.entries[i][1])
    }

    /// Starts loading the entry `key`'s probe begins at (a hint: it changes nothing).
    pub fn prefetch(&self, key: u64) {
        if !self.entries.is_empty() {
            crate::pmem::cpu::prefetch(&self.entries[self.home(key)]);
        }
    }

    /// Maps `key` to slot offset `at` (not 0); returns the offset it replaced.
    pub fn insert(&mut self, key: u64, at: u64) -> Option<u64> {
        assert!(at != 0, "no heap slot is at offset 0");
        if let Some(i) = self.position(key) {
            return Some(std::mem::replace(&mut self.entries[i][1], at));
        }
        if (self.len + 1) * 2 > self.entries.len() {
            let grown = (self.entries.len() * 2).max(MIN_ENTRIES);
            let old = std::mem::replace(&mut self.entries, vec![[0, 0]; grown]);
            for [k, at] in old {
                if at != 0 {
                    self.place(k, at);
                }
            }
        }
        self.place(key, at);
        self.len += 1;
        None
    }

    /// Puts (`key`, `at`) in the first empty entry of its probe (`key` is not there, and an
    /// entry is empty).
    fn place(&mut self, key: u64, at: u64) {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        while self.entries[i][1] != 0 {
            i = (i + 1) & mask;
        }
        self.entries[i] = [key, at];
    }

    /// Removes `key`; returns its slot offset. The entries after it in its run move back into
    /// the hole where their probes allow it (backward-shift deletion), so no tombstones are left.
    pub fn remove(&mut self, key: u64) -> Option<u64> {
        let mut hole = self.position(key)?;
        let removed = self.entries[hole][1];
        let mask = self.entries.len() - 1;
        let mut j = (hole + 1) & mask;
        loop {
            let [k, at] = self.entries[j];
            if at == 0 {
                break;
            }
            // The entry at `j` may fill the hole if the hole is on its probe path: at least as
            // far from `j` back to its home as from `j` back to the hole.
            let home = self.home(k);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.entries[hole] = self.entries[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.entries[hole] = [0, 0];
        self.len -= 1;
        Some(removed)
    }

    /// The (key, slot offset) pairs, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries
            .iter()
            .filter(|e| e[1] != 0)
            .map(|&[k, at]| (k, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The directory answers as a `std` map under any mix of inserts, replacements and
        /// removals, over few keys (long runs, many backward shifts): colliding ones, or
        /// consecutive ones (whose runs of entries abut and overlap).
        #[test]
        fn slot_index_matches_a_std_map(
            spacing in prop_oneof![Just(0u32), Just(6)],
            ops in proptest::collection::vec((0u8..3, 0u64..64, 1u64..1000), 0..2000)
        ) {
            let mut index = SlotIndex::default();
            let mut model = std::collections::HashMap::new();
            for (kind, key, at) in ops {
                // Spacing 6: keys 64 apart, the same low bits before mixing; 0: consecutive.
                let key = key << spacing;
                match kind {
                    0 | 1 => prop_assert_eq!(index.insert(key, at), model.insert(key, at)),
                    _ => prop_assert_eq!(index.remove(key), model.remove(&key)),
                }
                prop_assert_eq!(index.len, model.len());
            }
            for key in 0..64u64 {
                let key = key << spacing;
                prop_assert_eq!(index.get(key), model.get(&key).copied());
            }
            let mut pairs: Vec<_> = index.iter().collect();
            pairs.sort_unstable();
            let mut expected: Vec<_> = model.into_iter().collect();
            expected.sort_unstable();
            prop_assert_eq!(pairs, expected);
        }
    }

    /// The probes of one aligned run of consecutive keys start at consecutive entries (one
    /// or two cache lines), and different runs start at spread-out places.
    #[test]
    fn consecutive_keys_probe_from_consecutive_entries() {
        let mut index = SlotIndex::default();
        let run = 1u64 << RUN_BITS;
        for key in 0..1u64 << 16 {
            index.insert(key, 64 + key);
        }
        let mask = index.entries.len() - 1;
        let mut run_starts = std::collections::HashSet::new();
        for r in 0..1_000u64 {
            let start = index.home(r * run);
            for i in 1..run {
                assert_eq!(index.home(r * run + i), (start + i as usize) & mask);
            }
            run_starts.insert(start);
        }
        // 1,000 runs in 2^14 places of runs: a few may share one, not many.
        assert!(run_starts.len() > 900, "{} places", run_starts.len());
    }
}
