//! Dropping a table (issue 21): the database side. A drop runs alone: it holds every worker
//! slot while the engine frees the table's space, so no transaction can touch the table (or
//! any other) meanwhile, and every worker made afterwards reads the catalog anew. Idle workers
//! that [`Db::run`] cached are discarded; a worker another thread still holds is waited for, up
//! to [`DbConfig::worker_wait`](super::DbConfig::worker_wait), after which the drop fails with
//! [`CatalogError::Busy`] and changes nothing.

use super::Db;
use crate::catalog::{CatalogError, PrimaryKey, Schema, TableId};
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

impl Db {
    /// Drops the hidden tables no live table refers to, at open: a crash between a table's drop
    /// and its hidden tables' leaves them (their rows would otherwise stay for good), as does a
    /// create that failed after making them. Engines that cannot drop tables keep them: such an
    /// engine never dropped the owner, so they are a failed create's, which the next create of
    /// the name takes over.
    pub(super) fn with_orphans_dropped(self) -> Result<Db, DbError> {
        let orphans: Vec<TableId> = {
            let catalog = self.engine.catalog();
            let used: Vec<TableId> = (catalog.live_tables())
                .flat_map(|(_, s)| hidden_tables_of(s))
                .collect();
            (catalog.live_tables())
                .filter(|(id, s)| {
                    super::varlen::is_hidden(&s.name)
                        && s.name != super::CHUNK_TABLE
                        && !used.contains(id)
                })
                .map(|(id, _)| id)
                .collect()
        };
        for id in orphans {
            match self.drop_table_alone(id) {
                Ok(()) | Err(DbError::Unsupported(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self)
    }
}

/// The hidden tables that serve table `schema`: its chunk table and a byte-key table's index.
pub(super) fn hidden_tables_of(schema: &Schema) -> impl Iterator<Item = TableId> {
    let index = match &schema.key {
        PrimaryKey::Bytes(keys) => keys.index_table,
        PrimaryKey::U64 => None,
    };
    schema.chunk_table.into_iter().chain(index)
}
