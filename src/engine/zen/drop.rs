//! Dropping a table (issue 21) on Zen.
//!
//! The difficulty is Zen's commit evidence (§3.3.3, Algorithm 2): recovery decides which
//! NVM-tuples of a region committed by the region's `ts-commit`, the largest Tx-CTS that carries
//! the LP bit, and only the LP tuple of a thread's latest commit is kept for that purpose. That
//! tuple may sit in a page of the table being dropped (a transaction that wrote the dropped
//! table last); freeing the page would make every later-than-the-remaining-LP tuple of the other
//! tables in that region look undecided, and recovery would zero them. So before any page is
//! freed the evidence is moved: each region's latest commit tid is persisted as a *commit
//! watermark* word in the meta page (`layout::meta::WATERMARKS_AT`), and recovery starts each
//! region's `ts-commit` there instead of at 0. With no worker alive every tuple at or below a
//! region's latest commit tid is committed (a thread's tids only grow, and a commit that failed
//! half-way left nothing), so the watermark vouches exactly for what the LP bits did.
//!
//! The order, with no worker alive (every thread slot's state in the engine's hands):
//! 1. the catalog stored with the table `dropping`;
//! 2. the regions' watermarks raised to their latest commits, flushed, one fence;
//! 3. the table's heap pages freed (zeroed, page-table entry cleared), and its slots removed from
//!    the threads' free lists, garbage queues and inboxes; its Met-Cache, DRAM indexes and
//!    version store replaced by empty ones;
//! 4. the catalog stored with the table `dropped`.
//!
//! Recovery (`recovery.rs`) scans a dropped table's remaining pages for LP evidence only (none
//! of their tuples is indexed), then repeats steps 2 to 4 (idempotent). The test-only fault
//! [`ZenFault::DropSkipWatermark`] leaves step 2 out; the crash suite's drop test catches it.

use super::layout::{kind, meta};
use super::{TableAlloc, TableRt, ZenEngine, ZenFault};
use crate::alloc::PageManager;
use crate::catalog::TableId;
use crate::engine::DbError;
use crate::pmem::Pool;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The persisted commit watermark of `region` (0: none).
pub(super) fn watermark(pool: &Pool, meta_page: u64, region: usize) -> u64 {
    pool.read_u64(meta_page + meta::WATERMARKS_AT + 8 * region as u64)
}

/// Step 2: raises each region's persisted watermark to `commits[region]` where it is lower,
/// durably (one fence for all).
pub(super) fn raise_watermarks(pool: &Pool, meta_page: u64, commits: impl Iterator<Item = u64>) {
    let mut wrote = false;
    for (region, tid) in commits.enumerate() {
        let at = meta_page + meta::WATERMARKS_AT + 8 * region as u64;
        if pool.read_u64(at) < tid {
            pool.write_u64(at, tid);
            pool.flush(at, 8);
            wrote = true;
        }
    }
    if wrote {
        pool.fence();
    }
}

/// Step 3's PM part: frees every heap page of the tables in `dropped`; returns how many.
pub(super) fn free_pages(
    pool: &Pool,
    pages: &PageManager,
    dropped: &[TableId],
) -> Result<u64, DbError> {
    let freed = pages.free_where(pool, |_, tag| {
        let table = TableId::try_from(tag.value).unwrap_or(TableId::MAX);
        tag.kind == kind::HEAP && dropped.contains(&table)
    })?;
    Ok(freed)
}

impl ZenEngine {
    /// Drops `table` (see the module doc); refuses while a worker of this engine is alive.
    pub(super) fn drop_table_now(&self, table: TableId) -> Result<(), DbError> {
        let free = || {
            if self.config.fault != Some(ZenFault::DropSkipWatermark) {
                let commits = self.region_commit.iter().map(|c| c.load(Ordering::Acquire));
                raise_watermarks(&self.pool, self.meta_page, commits);
            }
            free_pages(&self.pool, &self.pages, &[table])?;
            for inbox in self.inbox.iter() {
                inbox.lock().retain(|&(t, _)| t != table);
            }
            Ok(())
        };
        // Each thread slot's state forgets the table's slots.
        let forget = |st: &mut super::ThreadState| {
            if let Some(ta) = st.tables.get_mut(table as usize) {
                *ta = TableAlloc::default();
            }
            st.garbage.retain(|g| g.table != table);
            st.tombs.retain(|g| g.table != table);
            st.deferred.retain(|g| g.table != table);
        };
        // The tombstone: an empty Met-Cache, index and version store (the old ones' memory goes
        // with the last copy of the table list; no worker holds one).
        let tombstone = |done: &crate::catalog::Catalog| {
            let schema = done.tables[table as usize].clone();
            self.tables.write()[table as usize] =
                Arc::new(TableRt::new(table, schema, &self.config));
        };
        crate::engine::common::TableDrop {
            catalog: &self.catalog,
            slots: &self.threads,
            store: &self.catalog_store,
            pool: &self.pool,
            table,
            free_first: false,
        }
        .run(free, forget, tombstone)?;
        self.rebalance();
        Ok(())
    }
}
