//! Dropping a table (issue 21) on FIR.
//!
//! FIR's commit record is the LCTT in the meta page (§4.1), not anything in a table's blocks, so
//! freeing a table's blocks takes no other table's commit evidence with it. What must not happen
//! is that the dropped table's versions come back: from its regions (recovery's redo, §4.4.1) or
//! from the index leaf checkpoint (§4.3), which still names its keys until the next checkpoint.
//! The catalog's state is the mark both follow: recovery reads no block of a table that is not
//! live and installs none of its checkpoint entries.
//!
//! The order, with no worker alive (every thread slot's regions in the engine's hands) and no
//! checkpoint running (the checkpoint lock held):
//! 1. the catalog stored with the table `dropping`;
//! 2. every block page of the table freed (zeroed, page-table entry cleared), its tiles left
//!    [`UNOWNED`](super::storage::UNOWNED) so that any table of the same slot size takes the
//!    page; the threads' regions of the table and their GC waiting lists forget it; the next
//!    checkpoint is a full one (it writes only live tables' entries);
//! 3. the catalog stored with the table `dropped`, and the table's DRAM index replaced by an
//!    empty one.
//!
//! Unlike GC's free (§4.5, `gc.rs`), no free record is needed: a half-zeroed block of a dropped
//! table is never read, since recovery frees every block of a table that is not live before it
//! scans the regions (`free_blocks_of`), then finishes the drop. The test-only fault
//! [`FirFault::DropFreeBeforeTombstone`] swaps steps 1 and 2; the crash suite's drop test
//! catches it.

use super::layout::{kind, SEQ_BITS};
use super::storage::{self, Region};
use super::{FirEngine, FirFault, TableRt};
use crate::catalog::TableId;
use crate::engine::DbError;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl FirEngine {
    /// Step 2's PM part: frees every block of the tables in `dropped` and leaves their tiles
    /// unowned; returns how many blocks. Idempotent.
    pub(super) fn free_blocks_of(&self, dropped: &[TableId]) -> Result<u64, DbError> {
        let freed = self.pages.free_where(&self.pool, |index, tag| {
            let table = TableId::try_from(tag.value >> SEQ_BITS).unwrap_or(TableId::MAX);
            let pick = tag.kind == kind::BLOCK && dropped.contains(&table);
            if pick {
                if let Some(tile) = self.tiles.get(index as usize).and_then(|t| t.get()) {
                    tile.table.store(storage::UNOWNED, Ordering::Release);
                }
            }
            pick
        })?;
        let _ = self
            .gc
            .blocks_in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(freed))
            });
        Ok(freed)
    }

    /// Drops `table` (see the module doc); refuses while a worker of this engine is alive.
    pub(super) fn drop_table_now(&self, table: TableId) -> Result<(), DbError> {
        let _no_checkpoint = self.checkpoint_lock.lock();
        let free = || {
            self.free_blocks_of(&[table])?;
            // The valid checkpoint still names the table's keys; recovery skips them, and the
            // next checkpoint leaves them out.
            self.need_full.store(true, Ordering::SeqCst);
            Ok(())
        };
        let forget = |st: &mut super::ThreadState| {
            if let Some(r) = st.regions.get_mut(table as usize) {
                // Sequence numbers go on (page tags never repeat), though the id is not reused.
                *r = Region {
                    next_seq: r.next_seq,
                    ..Region::default()
                };
            }
            st.gc_waiting.retain(|&(t, _, _)| t != table);
        };
        let tombstone = |done: &crate::catalog::Catalog| {
            let schema = done.tables[table as usize].clone();
            self.tables.write()[table as usize] = Arc::new(TableRt::new(schema));
        };
        crate::engine::common::TableDrop {
            catalog: &self.catalog,
            slots: &self.slots,
            store: &self.catalog_store,
            pool: &self.pool,
            table,
            // The deliberate bug of the crash harness frees first (test-only).
            free_first: self.config.fault == Some(FirFault::DropFreeBeforeTombstone),
        }
        .run_unless_in_use(super::slot_in_use, free, forget, tombstone)
    }
}
