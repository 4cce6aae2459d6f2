//! Dropping a table (issue 21): the database side. A drop runs alone: it holds every worker
//! slot while the engine frees the table's space, so no transaction can touch the table (or
//! any other) meanwhile, and every worker made afterwards reads the catalog anew. Idle workers
//! that [`Db::run`] cached are discarded; a worker another thread still holds is waited for, up
//! to [`DbConfig::worker_wait`](super::DbConfig::worker_wait), after which the drop fails with
//! [`CatalogError::Busy`] and changes nothing.

use super::Db;
use crate::catalog::{CatalogError, TableId};
use crate::engine::DbError;

impl Db {
    /// The drop itself (see [`Db::drop_table`]).
    pub(super) fn drop_table_alone(&self, table: TableId) -> Result<(), DbError> {
        let name = self.engine.catalog().check_live(table)?.name.clone();
        let _one = self.drops.lock();
        let started = std::time::Instant::now();
        let slots = self.config.max_threads;
        let mut held = Vec::with_capacity(slots);
        let result = loop {
            if held.len() == slots {
                break self.engine.drop_table(table);
            }
            let left = self.config.worker_wait.saturating_sub(started.elapsed());
            match self.slots.claim(left) {
                // An idle cached worker gives its engine state back to the engine here.
                Some((slot, core)) => {
                    drop(core);
                    held.push(slot);
                }
                None => {
                    break Err(CatalogError::Busy {
                        table: name,
                        workers: slots - held.len(),
                    }
                    .into())
                }
            }
        };
        for slot in held {
            self.slots.release(slot);
        }
        result
    }
}

/// `schema` if it is a live table's, else the error a transaction gets for table `table`: no
/// such table, or the table was dropped.
pub(super) fn live(
    schema: Option<&crate::catalog::Schema>,
    table: TableId,
) -> Result<&crate::catalog::Schema, crate::engine::TxError> {
    crate::catalog::live_schema(schema, table)
        .map_err(|e| crate::engine::TxError::SchemaMismatch(e.to_string()))
}
