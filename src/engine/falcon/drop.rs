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
    let freed = pages.free_where(pool, |index, tag| {
        let table = TableId::try_from(tag.value).unwrap_or(TableId::MAX);
        let pick = matches!(tag.kind, kind::HEAP | kind::INDEX) && dropped.contains(&table);
        if pick {
            each_page(table, pages.page_offset(index));
        }
        pick
    })?;
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
    let catalog = store
        .store_drops_finished(pool, &catalog)?
        .unwrap_or(catalog);
    Ok((catalog, freed))
}

impl FalconEngine {
    /// Drops `table` (see the module doc); refuses while a worker of this engine is alive.
    pub(super) fn drop_table_now(&self, table: TableId) -> Result<(), DbError> {
        // Pages the lazy recovery sweep has not reached may be the table's: finish it first.
        if let Some(sweep) = &self.sweep {
            sweep.finish(self);
        }
        let free = || {
            // Read here: the drop has checked that the table exists.
            let rt = self.tables.read()[table as usize].clone();
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
            .map(|_| ())
        };
        let forget = |st: &mut super::ThreadState| {
            if let Some(ta) = st.tables.get_mut(table as usize) {
                *ta = TableAlloc::default();
            }
        };
        // The tombstone: DRAM indexes, empty (the old ones' memory goes with the last worker's
        // copy of the table list; none is alive).
        let tombstone = |done: &Catalog| {
            let schema = done.tables[table as usize].clone();
            let secondary = schema
                .secondary
                .iter()
                .map(|_| TableSecondary::Dram(SecondaryIndex::new()))
                .collect();
            let index = TableIndex::dram(schema.primary_index);
            self.tables.write()[table as usize] =
                Arc::new(TableRt::new(table, schema, index, secondary));
        };
        crate::engine::common::TableDrop {
            catalog: &self.catalog,
            slots: &self.threads,
            store: &self.catalog_store,
            pool: &self.pool,
            table,
            // The deliberate bug of the crash harness frees first (test-only).
            free_first: self.config.fault == Some(super::Fault::DropFreeBeforeTombstone),
        }
        .run(free, forget, tombstone)
    }
}
