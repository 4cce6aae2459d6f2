//! Dropped tables (issue 21): a table's id is its position in the catalog, which every engine's
//! recovery walks, so a dropped table stays there as a tombstone. Its name is free for a later
//! `create_table` (which gets a new id), and no id is ever reused, so nothing an engine left
//! behind for the old table (log entries, window slots, checkpoint records) can be taken for a
//! row of a new table.
//!
//! The drop's crash order, common to every engine: the catalog is stored with the table
//! [`TableState::Dropping`]; the engine makes its rows unreachable and frees their space; the
//! catalog is stored with the table [`TableState::Dropped`]. Recovery treats both states alike:
//! it frees whatever space the table still holds (idempotently) and ignores any log record of
//! it, then marks it `Dropped`.

use super::{Catalog, CatalogError, CatalogStore, Schema, TableId};
use crate::pmem::Pool;
use serde::{Deserialize, Serialize};

/// A table's life-cycle state in the catalog. Absent in catalogs written before issue 21:
/// every table there is live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TableState {
    /// In use.
    #[default]
    Live,
    /// Being dropped: its space may be partly freed; recovery finishes the drop.
    Dropping,
    /// Dropped: a tombstone that keeps the table's id taken.
    Dropped,
}

impl TableState {
    /// Whether the table is in use (not being dropped nor dropped).
    pub fn is_live(&self) -> bool {
        *self == TableState::Live
    }
}

impl Schema {
    /// Whether the table is in use (see [`TableState`]).
    pub fn is_live(&self) -> bool {
        self.state.is_live()
    }
}

impl Catalog {
    /// Whether table `id` exists and is live.
    pub fn is_live(&self, id: TableId) -> bool {
        self.tables.get(id as usize).is_some_and(Schema::is_live)
    }

    /// The live tables with their ids, in creation order.
    pub fn live_tables(&self) -> impl Iterator<Item = (TableId, &Schema)> + '_ {
        (0..)
            .zip(&self.tables)
            .filter(|(_, s): &(TableId, &Schema)| s.is_live())
    }

    /// The ids of the tables being dropped or dropped (recovery frees what they still hold).
    pub fn dropped_ids(&self) -> Vec<TableId> {
        (0..)
            .zip(&self.tables)
            .filter(|(_, s): &(TableId, &Schema)| !s.is_live())
            .map(|(id, _)| id)
            .collect()
    }

    /// The ids of the tables whose drop a crash interrupted.
    pub fn dropping_ids(&self) -> Vec<TableId> {
        (0..)
            .zip(&self.tables)
            .filter(|(_, s): &(TableId, &Schema)| s.state == TableState::Dropping)
            .map(|(id, _)| id)
            .collect()
    }

    /// A copy of this catalog with table `id` in `state`; an error naming the table if `id` is
    /// not a live table (for `Dropping`) or not a table at all.
    pub fn with_state(&self, id: TableId, state: TableState) -> Result<Catalog, CatalogError> {
        let schema = self
            .tables
            .get(id as usize)
            .ok_or(CatalogError::NoSuchTable(id))?;
        if state == TableState::Dropping && !schema.is_live() {
            return Err(CatalogError::TableDropped {
                id,
                name: schema.name.clone(),
            });
        }
        let mut next = self.clone();
        next.tables[id as usize].state = state;
        Ok(next)
    }

    /// Checks that `id` is a live table, with an error that says which of "unknown" and
    /// "dropped" it is.
    pub fn check_live(&self, id: TableId) -> Result<&Schema, CatalogError> {
        live_schema(self.tables.get(id as usize), id)
    }

    /// Every table with the drop finished: for recovery, after it has freed what the
    /// interrupted drops (`Dropping`) held.
    pub fn drops_finished(&self) -> Catalog {
        let mut next = self.clone();
        for t in &mut next.tables {
            if t.state == TableState::Dropping {
                t.state = TableState::Dropped;
            }
        }
        next
    }
}

impl CatalogStore {
    /// Recovery's last step of the drop (the same in every engine): once the engine has freed
    /// what the interrupted drops held, stores `catalog` with them finished and returns it;
    /// `None`, storing nothing, when no drop was interrupted.
    pub fn store_drops_finished(
        &self,
        pool: &Pool,
        catalog: &Catalog,
    ) -> Result<Option<Catalog>, CatalogError> {
        if catalog.dropping_ids().is_empty() {
            return Ok(None);
        }
        let done = catalog.drops_finished();
        self.store(pool, &done)?;
        Ok(Some(done))
    }
}

/// `schema`, the catalog's entry for table `id` (`None`: there is none), if the table is live;
/// else the error saying which of "unknown" and "dropped" it is. The one place of that rule,
/// for the catalog and for the workers' copies of its schemas.
///
/// Inlined, with the error built out of line: every operation of every transaction checks its
/// table here, often several times (issue 13: 1.5 % of TPC-C as a call).
#[inline]
pub fn live_schema(schema: Option<&Schema>, id: TableId) -> Result<&Schema, CatalogError> {
    match schema {
        Some(s) if s.is_live() => Ok(s),
        _ => Err(not_live(schema, id)),
    }
}

/// Why [`live_schema`] refused `schema`.
#[cold]
#[inline(never)]
fn not_live(schema: Option<&Schema>, id: TableId) -> CatalogError {
    match schema {
        None => CatalogError::NoSuchTable(id),
        Some(s) => CatalogError::TableDropped {
            id,
            name: s.name.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ColumnType;

    #[test]
    fn a_dropped_table_keeps_its_id_and_frees_its_name() {
        let mut c = Catalog::default();
        let s = Schema::new("t", &[("v", ColumnType::U64)]);
        let t = c.add(s.clone(), 100).unwrap();
        let dropping = c.with_state(t, TableState::Dropping).unwrap();
        assert_eq!(dropping.dropping_ids(), vec![t]);
        assert!(dropping.with_state(t, TableState::Dropping).is_err());
        let mut c = dropping.drops_finished();
        assert_eq!(c.tables[t as usize].state, TableState::Dropped);
        assert_eq!(c.table_id("t"), None);
        assert!(!c.is_live(t));
        let err = c.check_live(t).unwrap_err().to_string();
        assert!(err.contains("dropped"), "{err}");
        assert!(c
            .check_live(9)
            .unwrap_err()
            .to_string()
            .contains("no table"));
        let t2 = c.add(s, 100).unwrap();
        assert_eq!(t2, t + 1);
        assert_eq!(c.table_id("t"), Some(t2));
        assert_eq!(c.live_tables().count(), 1);
        assert_eq!(c.dropped_ids(), vec![t]);
        c.validate(100).unwrap();
        // A catalog without states (written before issue 21) reads as all live; a live table's
        // state is not written, so such catalogs stay as they were.
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json.matches("\"state\"").count(), 1, "{json}");
        let back: Catalog = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
    }
}
