//! Dropping a table (issue 21), for Falcon and its variants (`inp`, `outp`, `wbl`, `volatile`,
//! and the DRAM shadows of `mmdb` and `dudetx`).
//!
//! A table's space is exactly its pages: heap pages are tagged `(HEAP, value = table id)` and
//! its PM indexes' pages `(INDEX, value = table id)` (`layout.rs`); per-thread free lists and
//! deleted-slot queues (§5.4) are DRAM. So a drop, with no worker alive (every thread slot's
//! state in the engine's hands), is:
//! 1. the catalog stored with the table `dropping` (from here on recovery finishes the drop);
//! 2. its PM index root words zeroed, then each of its pages freed (zeroed, then its page-table
//!    entry cleared: `PageManager::free`), so any table can take them;
//! 3. the catalog stored with the table `dropped`.
//!
//! Recovery (`finish_drops`, before the index and log recovery) repeats step 2 for every
//! dropping or dropped table, which is idempotent, and then step 3. The log windows may still
//! hold committed entries of the table, pointing into pages that another table may own by
//! then: recovery skips every entry of a table that is not live (`recovery.rs`), and since ids
//! are never reused such an entry can never be taken for a new table's.

use super::layout::{kind, meta};
use super::tindex::{TableIndex, TableSecondary};
use super::{FalconEngine, TableAlloc, TableRt};
use crate::alloc::{PageManager, PAGE_SIZE};
use crate::catalog::{Catalog, CatalogStore, TableId};
use crate::engine::DbError;
use crate::index::SecondaryIndex;
use crate::pmem::Pool;
use std::sync::Arc;

/// Step 2 for every table `dropped` holds: zeroes its PM index roots and frees its heap and
/// index pages; calls `each_page` with each page's offset before freeing it. Idempotent.
fn free_space(
    pool: &Pool,
    pages: &PageManager,
    meta_page: u64,
    dropped: &[TableId],
    mut each_page: impl FnMut(TableId, u64),
) -> Result<u64, DbError> {
    for &t in dropped {
        if u64::from(t) >= meta::MAX_ROOTS {
            continue;
        }
        let words = std::iter::once(meta::primary_root_at(u64::from(t)))
            .chain((0..meta::SECONDARY_ROOTS).map(|i| meta::secondary_root_at(u64::from(t), i)));
        for at in words {
            let at = meta_page + at;
            if pool.read_u64(at) != 0 {
                pool.write_u64(at, 0);
                pool.persist(at, 8);
            }
        }
    }
    let mut freed = 0;
    for (index, tag) in pages.allocated(pool)? {
        let table = TableId::try_from(tag.value).unwrap_or(TableId::MAX);
        if matches!(tag.kind, kind::HEAP | kind::INDEX) && dropped.contains(&table) {
            each_page(table, pages.page_offset(index));
            pages.free(pool, index);
            freed += 1;
        }
    }
    Ok(freed)
}

/// Recovery's part: finishes interrupted drops and frees what any dropped table still holds;
/// returns the catalog with every drop finished and the number of pages freed.
pub(super) fn finish_drops(
    pool: &Pool,
    pages: &PageManager,
    meta_page: u64,
    catalog: Catalog,
    store: &CatalogStore,
) -> Result<(Catalog, u64), DbError> {
    let dropped = catalog.dropped_ids();
    if dropped.is_empty() {
        return Ok((catalog, 0));
    }
    let freed = free_space(pool, pages, meta_page, &dropped, |_, _| {})?;
    if catalog.dropping_ids().is_empty() {
        return Ok((catalog, freed));
    }
    let done = catalog.drops_finished();
    store.store(pool, &done)?;
    Ok((done, freed))
}

impl FalconEngine {
    /// Drops `table` (see the module doc); refuses while a worker of this engine is alive.
    pub(super) fn drop_table_now(&self, table: TableId) -> Result<(), DbError> {
        // Pages the lazy recovery sweep has not reached may be the table's: finish it first.
        if let Some(sweep) = &self.sweep {
            sweep.finish(self);
        }
        // Every thread slot's allocation state, so that no worker runs meanwhile and each can be
        // told to forget the table.
        let (mut catalog, dropping, mut states) =
            crate::engine::common::start_drop(&self.catalog, &self.threads, table)?;
        let rt = self.tables.read()[table as usize].clone();
        let free = || {
            free_space(
                &self.pool,
                &self.pages,
                self.meta_page,
                &[table],
                |_, page| {
                    // The multi-version protocols' DRAM chains are keyed by tuple address: a later
                    // table's tuple at the same address must not find the dropped one's versions.
                    for t in (page..page + PAGE_SIZE).step_by(rt.slot as usize) {
                        self.cc.versions.clear(t);
                    }
                },
            )
        };
        // The deliberate bug of the crash harness frees first (test-only).
        let early = self.config.fault == Some(super::Fault::DropFreeBeforeTombstone);
        if early {
            free()?;
        }
        self.catalog_store.store(&self.pool, &dropping)?;
        *catalog = dropping;
        if !early {
            free()?;
        }
        for st in states.iter_mut().filter_map(|s| s.as_mut()) {
            if let Some(ta) = st.tables.get_mut(table as usize) {
                *ta = TableAlloc::default();
            }
        }
        let done = catalog.drops_finished();
        self.catalog_store.store(&self.pool, &done)?;
        // The tombstone: DRAM indexes, empty (the old ones' memory goes with the last worker's
        // copy of the table list; none is alive).
        let schema = done.tables[table as usize].clone();
        let secondary = schema
            .secondary
            .iter()
            .map(|_| TableSecondary::Dram(SecondaryIndex::new()))
            .collect();
        let index = TableIndex::dram(schema.primary_index);
        self.tables.write()[table as usize] =
            Arc::new(TableRt::new(table, schema, index, secondary));
        *catalog = done;
        Ok(())
    }
}
