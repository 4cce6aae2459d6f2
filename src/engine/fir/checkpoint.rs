//! Index leaf checkpoints (§4.1 "Index Checkpoint", §4.3): a snapshot of every table's index
//! leaves (key → logical address of the newest committed version, with its txnId) written to PM
//! pages, which recovery loads instead of reading every region from its start (§4.4.2).
//!
//! This is the *full* checkpoint of §4.3; the incremental one (update-time marks on the index
//! nodes, Algorithm 2) and the time cost model choosing between them are not built yet.
//!
//! Consistency with running transactions (§4.3.2) rests on **CT**, taken before the index is
//! read: the smaller of the clock + 1 and the txnId of every running transaction (a worker
//! publishes a lower bound of its txnId before taking it). Every transaction with a txnId below
//! CT had ended when the scan began, so its effects are in the index the scan reads; each entry is
//! the newest *committed* version (a pending version's predecessor, §4.3.2's "uncommitted insert
//! and update": an uncommitted insert is left out, a committed delete is absent or a committed
//! tombstone, skipped). Recovery then redoes, in txnId order, every committed version with a
//! txnId ≥ CT, found by a binary search of each time-ordered region (§4.4.1).
//!
//! Crash safety: a checkpoint is written to fresh pages whose headers carry its generation, made
//! durable, and only then named by the meta page's `CKPT_GEN` word (one 8-byte store, persisted);
//! the previous checkpoint's pages are freed after that. Recovery frees every checkpoint page of
//! another generation (a checkpoint the crash interrupted, or an old one not yet freed).

use super::layout::{checkpoint as ck, kind};
use super::storage::{state, NONE};
use super::{FirEngine, FirFault, TableRt};
use crate::alloc::PageTag;
use crate::engine::DbError;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What one checkpoint did.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CheckpointStats {
    /// Its generation.
    pub generation: u64,
    /// CT: every transaction with a smaller txnId is in it.
    pub ct: u64,
    /// Index entries written.
    pub entries: u64,
    /// 2 MiB pages written.
    pub pages: u64,
    /// Milliseconds it took.
    pub ms: f64,
}

impl FirEngine {
    /// Takes a full index leaf checkpoint (§4.3) while transactions run; one at a time.
    pub fn checkpoint(&self) -> Result<CheckpointStats, DbError> {
        let _one = self.checkpoint_lock.lock();
        let started = Instant::now();
        let clock = self.clock.load(Ordering::SeqCst);
        let oldest = self
            .active
            .iter()
            .map(|a| a.load(Ordering::SeqCst))
            .min()
            .unwrap_or(u64::MAX);
        let ct = if self.config.fault == Some(FirFault::CheckpointCtIgnoresRunning) {
            clock + 1
        } else {
            (clock + 1).min(oldest)
        };
        let tables = self.tables.read().clone();
        let mut entries: Vec<[u64; 4]> = Vec::new();
        let mut keys = Vec::new();
        for (table, t) in tables.iter().enumerate() {
            keys.clear();
            t.index.for_each(|k, _| keys.push(k));
            for &key in &keys {
                if let Some((txn, addr)) = self.newest_committed(t, key) {
                    entries.push([table as u64, key, txn, addr]);
                }
            }
        }
        let count = entries.len() as u64;
        let pages_needed = count.div_ceil(ck::PER_PAGE).max(1);
        let generation = self.pool.read_u64(self.ckpt_gen_at) + 1;
        let mut pages = Vec::with_capacity(pages_needed as usize);
        for seq in 0..pages_needed {
            let tag = PageTag {
                kind: kind::CHECKPOINT,
                owner: 0,
                value: seq,
            };
            match self.pages.allocate(&self.pool, tag) {
                Ok(p) => pages.push(p),
                Err(e) => {
                    for p in pages {
                        self.pages.free(&self.pool, p);
                    }
                    return Err(e.into());
                }
            }
        }
        let gen_first = self.config.fault == Some(FirFault::CheckpointGenFirst);
        if gen_first {
            self.pool.write_u64(self.ckpt_gen_at, generation);
            self.pool.persist(self.ckpt_gen_at, 8);
        }
        let mut buf = Vec::new();
        for (seq, &page) in pages.iter().enumerate() {
            let at = self.pages.page_offset(page);
            let from = seq * ck::PER_PAGE as usize;
            let chunk = &entries
                [from.min(entries.len())..(from + ck::PER_PAGE as usize).min(entries.len())];
            buf.clear();
            for word in [generation, seq as u64, ct, count, pages_needed] {
                buf.extend_from_slice(&word.to_le_bytes());
            }
            buf.resize(ck::FIRST_ENTRY as usize, 0);
            for e in chunk {
                for word in e {
                    buf.extend_from_slice(&word.to_le_bytes());
                }
            }
            self.pool.write_bytes(at, &buf);
            if self.flushing {
                self.pool.flush(at, buf.len() as u64);
            }
        }
        if self.flushing {
            self.pool.fence();
        }
        // The switch: one 8-byte store names the new checkpoint (ordered after the pages' stores
        // for eADR, where nothing above is flushed or fenced).
        self.pool.write_u64_ordered(self.ckpt_gen_at, generation);
        self.pool.persist(self.ckpt_gen_at, 8);
        let old = std::mem::replace(&mut *self.ckpt_pages.lock(), pages);
        for p in old {
            self.pages.free(&self.pool, p);
        }
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(CheckpointStats {
            generation,
            ct,
            entries: count,
            pages: pages_needed,
            ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// The newest committed version of `key` and its txnId; `None` if the key has none or it is
    /// a deletion.
    fn newest_committed(&self, t: &TableRt, key: u64) -> Option<(u64, u64)> {
        loop {
            let head = t.index.get(key)?;
            let h = self.header(head);
            let s = h.latch();
            if t.index.get(key) != Some(head) {
                h.unlatch(s);
                continue;
            }
            // Only the newest version can be pending; its predecessor is committed.
            let (v, v_state) = if s & state::PENDING != 0 {
                let prev = h.prev.load(Ordering::Acquire);
                if prev == NONE {
                    h.unlatch(s);
                    return None;
                }
                (prev, self.header(prev).state.load(Ordering::Acquire))
            } else {
                (head, s)
            };
            let txn = self.header(v).begin.load(Ordering::Acquire);
            h.unlatch(s);
            return (v_state & state::TOMBSTONE == 0).then_some((txn, v));
        }
    }

    /// Checkpoints taken since the engine started.
    pub fn checkpoints_taken(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }
}
