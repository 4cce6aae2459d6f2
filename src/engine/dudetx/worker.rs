//! A DUDETx worker (§3.1 *perform*): runs the transaction on the DRAM shadow through the shadow
//! engine's own worker (its concurrency control decides conflicts), keeps the transaction's
//! write set as after-images, and at commit turns it into the thread-local redo log it hands to
//! the persist step.

use super::log;
use super::DudetxEngine;
use crate::catalog::TableId;
use crate::engine::{EngineWorker, FieldWrite, TxError};
use std::collections::HashMap;
use std::sync::Arc;

/// One thread's DUDETx executor.
pub(crate) struct DudetxWorker {
    engine: Arc<DudetxEngine>,
    /// The shadow engine's worker: *perform* (§3.1) runs there.
    inner: Box<dyn EngineWorker>,
    /// The transaction's writes: (table, key) → after-image (`None`: deleted), and their order.
    writes: HashMap<(TableId, u64), Option<Vec<u8>>>,
    order: Vec<(TableId, u64)>,
    /// Scratch for a row before an update.
    row: Vec<u8>,
    /// The thread-local volatile redo log (§3.2), reused across transactions.
    log: Vec<u8>,
}

impl DudetxWorker {
    pub fn new(engine: Arc<DudetxEngine>, inner: Box<dyn EngineWorker>) -> DudetxWorker {
        DudetxWorker {
            engine,
            inner,
            writes: HashMap::new(),
            order: Vec::new(),
            row: Vec::new(),
            log: Vec::new(),
        }
    }

    fn note(&mut self, table: TableId, key: u64, row: Option<Vec<u8>>) {
        if self.writes.insert((table, key), row).is_none() {
            self.order.push((table, key));
        }
    }

    fn clear(&mut self) {
        self.writes.clear();
        self.order.clear();
    }
}

impl EngineWorker for DudetxWorker {
    fn begin(&mut self, read_only: bool) {
        self.clear();
        self.inner.begin(read_only);
    }

    fn read(&mut self, table: TableId, key: u64, out: &mut [u8]) -> Result<(), TxError> {
        self.inner.read(table, key, out)
    }

    fn update(
        &mut self,
        table: TableId,
        key: u64,
        writes: &[FieldWrite<'_>],
    ) -> Result<(), TxError> {
        // The after-image: the row as this transaction sees it (read through the shadow's
        // protocol, so the read is validated like any other), with the writes applied.
        let mut row = match self.writes.get(&(table, key)) {
            Some(Some(r)) => r.clone(),
            _ => {
                let len = self.engine.row_len(table)?;
                self.row.resize(len, 0);
                self.inner.read(table, key, &mut self.row)?;
                self.row.clone()
            }
        };
        self.inner.update(table, key, writes)?;
        for w in writes {
            row[w.offset..w.offset + w.bytes.len()].copy_from_slice(w.bytes);
        }
        self.note(table, key, Some(row));
        Ok(())
    }

    fn insert(&mut self, table: TableId, key: u64, row: &[u8]) -> Result<(), TxError> {
        self.inner.insert(table, key, row)?;
        self.note(table, key, Some(row.to_vec()));
        Ok(())
    }

    fn delete(&mut self, table: TableId, key: u64) -> Result<(), TxError> {
        self.inner.delete(table, key)?;
        self.note(table, key, None);
        Ok(())
    }

    fn prefetch(&mut self, table: TableId, keys: &[u64]) {
        self.inner.prefetch(table, keys);
    }

    fn prefetch_for_overwrite(&mut self, table: TableId, keys: &[u64]) {
        self.inner.prefetch_for_overwrite(table, keys);
    }

    fn scan(
        &mut self,
        table: TableId,
        from: u64,
        reverse: bool,
        limit: usize,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), TxError> {
        self.inner.scan(table, from, reverse, limit, f)
    }

    fn lookup_secondary(
        &mut self,
        table: TableId,
        index: usize,
        secondary: u64,
        out: &mut Vec<u64>,
    ) -> Result<(), TxError> {
        self.inner.lookup_secondary(table, index, secondary, out)
    }

    fn commit(&mut self) -> Result<u64, TxError> {
        if self.order.is_empty() {
            self.inner.commit()?;
            return Ok(self
                .engine
                .core
                .committed
                .load(std::sync::atomic::Ordering::Acquire));
        }
        self.log.clear();
        for k in &self.order {
            let row = &self.writes[k];
            log::encode_op(&mut self.log, k.0, k.1, row.as_deref());
        }
        self.clear();
        let log = std::mem::take(&mut self.log);
        self.engine.commit(&mut *self.inner, log)
    }

    fn abort(&mut self) {
        self.clear();
        self.inner.abort();
    }

    fn resolve_miss(&mut self, error: TxError) -> TxError {
        self.inner.resolve_miss(error)
    }
}
