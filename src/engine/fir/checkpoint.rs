//! Index leaf checkpoints (§4.1 "Index Checkpoint", §4.3): a snapshot of every table's index
//! leaves (key → logical address of the newest committed version, with its txnId) on PM pages,
//! which recovery loads instead of reading every region from its start (§4.4.2).
//!
//! **Full and incremental (§4.3.1, Algorithm 2).** A checkpoint is a list of pages of entries
//! sorted by (table, key), each page a contiguous run, named in order by a directory slot of the
//! meta page. A full checkpoint writes every entry to fresh pages. An incremental one:
//! - `MarkNode`: a committing worker marks the leaf of every key it wrote ([`LeafMarks::mark`]).
//!   pmtx's `PrimaryIndex` is shared with the other engines, so the marks live in FIR's own leaf
//!   map: a *leaf* is the range of 64 consecutive keys of a table (key >> 6), its mark the
//!   paper's `t_access` (the largest txnId that wrote into it) plus a bitmap of the keys written.
//!   The map holds only the leaves marked since the previous checkpoint, so dropping the rest is
//!   the paper's skip of every subtree whose `t_access < t_p` (the `skip_item`s: the key ranges
//!   between marked leaves, kept as the previous checkpoint's untouched pages).
//! - `GetIncrement`: the checkpoint drains the marks and reads the newest committed version of
//!   each marked key (or notes that it has none any more: a deletion).
//! - `FlushChpt` / `MergeAndPersist`: each page of the previous checkpoint whose key range holds
//!   part of the increment is read from PM, merged with it and written to fresh pages; the
//!   others are named again. So the work is proportional to the pages the writes touched, not to
//!   the index (§4.3.3's `(1 − α)` factor, at the granularity of a 2 MiB page).
//!
//! The cost model (`cost.rs`, §4.3.3) picks the kind of each checkpoint.
//!
//! **Consistency with running transactions (§4.3.2)** rests on **CT**, taken before the marks
//! are drained and the index read: the smaller of the clock + 1 and the txnId of every running
//! transaction (a worker publishes a lower bound of its txnId before taking it). Every
//! transaction with a txnId below CT had ended before the drain; a worker marks its keys after
//! it has installed its versions (committed headers, index updated), so the marks of every such
//! transaction are in the drained set and the reads see their versions. A transaction that
//! installs after the drain marks the next checkpoint's set. Each entry is the newest
//! *committed* version (a pending version's predecessor: §4.3.2's uncommitted cases). Recovery
//! then redoes every committed version with a txnId ≥ CT (§4.4.1).
//!
//! **Crash safety.** New pages are written and made durable, then the directory slot of the new
//! generation (the one the valid checkpoint does not use) and durable, then one 8-byte store of
//! the meta page's `CKPT_GEN` word (persisted) names it; only then are the pages it replaced
//! freed. A crash at any point leaves the previous generation's directory and pages intact;
//! recovery frees every checkpoint page the valid directory does not name.

use super::cost::{self, CheckpointKind, CheckpointMode};
use super::layout::{checkpoint as ck, kind};
use super::storage::{state, NONE};
use super::{FirEngine, FirFault, TableRt};
use crate::alloc::PageTag;
use crate::catalog::TableId;
use crate::engine::DbError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// A checkpoint entry: table, key, txnId, logical address (`NONE` in an increment: deleted).
pub(crate) type Entry = [u64; 4];

/// Bits of a key below its leaf number: a leaf is 64 consecutive keys.
const LEAF_BITS: u32 = 6;
/// Shards of the leaf map (a committing worker locks one per key it wrote).
const SHARDS: usize = 64;

/// What one checkpoint did.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CheckpointStats {
    /// Its generation.
    pub generation: u64,
    /// Full or incremental.
    pub kind: CheckpointKind,
    /// CT: every transaction with a smaller txnId is in it.
    pub ct: u64,
    /// Index entries in the checkpoint.
    pub entries: u64,
    /// Entries written to PM (all of them for a full checkpoint; for an incremental one, those
    /// of the pages the increment touched).
    pub entries_written: u64,
    /// Keys the increment carried (marked since the previous checkpoint).
    pub marked_keys: u64,
    /// Pages of the checkpoint.
    pub pages: u64,
    /// Pages written (the rest are the previous checkpoint's, named again).
    pub pages_written: u64,
    /// α of the cost model: the share of the index no key of the increment falls in.
    pub alpha: f64,
    /// The cost model's threshold (eq. 4) for this index size.
    pub threshold: f64,
    /// The paper's eq. 2 over the marked leaves' write counts (reported only: see `cost.rs`).
    pub gini_simpson: f64,
    /// Milliseconds it took.
    pub ms: f64,
}

/// A page of the valid checkpoint: its index, its first (table, key) and its entry count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CkptPage {
    pub page: u64,
    pub first: (u64, u64),
    pub entries: u64,
}

/// The valid checkpoint (DRAM copy of its directory).
#[derive(Clone, Debug, Default)]
pub(crate) struct CkptDir {
    pub generation: u64,
    /// Its CT (GC frees a block once CT is past every version in it, §4.5).
    pub ct: u64,
    pub pages: Vec<CkptPage>,
}

/// One leaf's mark (MarkNode): the paper's `t_access` and the keys written.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Leaf {
    pub t_access: u64,
    pub keys: u64,
    pub writes: u64,
}

/// One shard of the leaf map: (table, leaf number) → mark. Hashed with `mix64`, not SipHash:
/// every committed write and every version recovery redoes marks a leaf.
type LeafShard = HashMap<(TableId, u64), Leaf, crate::engine::common::BuildWriteKeyHasher>;

/// What writing a checkpoint's pages gave: the new directory's pages, the previous pages it
/// replaces (freed after the switch) and the pages written (freed if the checkpoint fails).
struct Written {
    pages: Vec<CkptPage>,
    replaced: Vec<u64>,
    fresh: Vec<u64>,
}

/// What the full checkpoint's index walk learns from the version it found for a key, without a
/// latch (`FirEngine::committed_at`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Walked {
    /// A committed version with this txnId: the key's entry.
    Committed(u64),
    /// A committed deletion: the key has no entry.
    Deleted,
    /// Pending, latched, or rewritten meanwhile: the key is looked up again under the latch
    /// (`FirEngine::newest_committed`, §4.3.2's walk to the last committed version).
    LookUp,
}

/// FIR's leaf map of update-time marks (see the module documentation).
pub(crate) struct LeafMarks {
    shards: Box<[Mutex<LeafShard>]>,
}

impl LeafMarks {
    pub fn new() -> LeafMarks {
        LeafMarks {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LeafShard::default()))
                .collect(),
        }
    }

    /// MarkNode: `txn` wrote `key` of `table`.
    pub fn mark(&self, table: TableId, key: u64, txn: u64) {
        let leaf = key >> LEAF_BITS;
        let h = (leaf ^ (u64::from(table) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut m = self.shards[(h >> 58) as usize % SHARDS].lock();
        let l = m.entry((table, leaf)).or_default();
        l.t_access = l.t_access.max(txn);
        l.keys |= 1 << (key & ((1 << LEAF_BITS) - 1));
        l.writes += 1;
    }

    /// Takes every mark, sorted by (table, leaf).
    pub fn drain(&self) -> Vec<((TableId, u64), Leaf)> {
        let mut out: Vec<_> = self
            .shards
            .iter()
            .flat_map(|s| std::mem::take(&mut *s.lock()))
            .collect();
        out.sort_unstable_by_key(|e| e.0);
        out
    }
}

/// Merges a sorted increment into a sorted run of checkpoint entries (MergeAndPersist): an
/// increment entry replaces the entry of its key, one with address `NONE` removes it.
pub(crate) fn merge(old: &[Entry], inc: &[Entry]) -> Vec<Entry> {
    let mut out = Vec::with_capacity(old.len() + inc.len());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < inc.len() {
        let take_old =
            j == inc.len() || (i < old.len() && (old[i][0], old[i][1]) < (inc[j][0], inc[j][1]));
        if take_old {
            out.push(old[i]);
            i += 1;
            continue;
        }
        if i < old.len() && (old[i][0], old[i][1]) == (inc[j][0], inc[j][1]) {
            i += 1;
        }
        if inc[j][3] != NONE {
            out.push(inc[j]);
        }
        j += 1;
    }
    out
}

/// The part of a sorted increment that falls in each page's key range (page i covers its first
/// key up to page i + 1's; the first page also everything below, the last everything above). One
/// part per page, or one in all when there is no page.
pub(crate) fn split_by_pages<'a>(firsts: &[(u64, u64)], inc: &'a [Entry]) -> Vec<&'a [Entry]> {
    let mut parts = Vec::with_capacity(firsts.len().max(1));
    let mut rest = inc;
    for i in 0..firsts.len().max(1) {
        let end = match firsts.get(i + 1) {
            Some(&next) => rest.partition_point(|e| (e[0], e[1]) < next),
            None => rest.len(),
        };
        let (mine, after) = rest.split_at(end);
        parts.push(mine);
        rest = after;
    }
    parts
}

impl FirEngine {
    /// Takes an index leaf checkpoint (§4.3) while transactions run, of the kind the configured
    /// [`CheckpointMode`] gives; one at a time.
    pub fn checkpoint(&self) -> Result<CheckpointStats, DbError> {
        self.checkpoint_as(self.config.checkpoint_mode)
    }

    /// Takes a checkpoint in `mode`. The first one, and the first after a failed one (whose
    /// drained marks are lost), are full whatever the mode.
    pub fn checkpoint_as(&self, mode: CheckpointMode) -> Result<CheckpointStats, DbError> {
        let _one = self.checkpoint_lock.lock();
        let started = Instant::now();
        let clock = self.clock.load(Ordering::SeqCst);
        let oldest = self.oldest_active();
        let ct = if self.config.fault == Some(FirFault::CheckpointCtIgnoresRunning) {
            clock + 1
        } else {
            (clock + 1).min(oldest)
        };
        // After CT: the marks of every transaction below CT are in (see the module docs).
        let leaves = self.marks.drain();
        let tables = self.tables.read().clone();
        let n: u64 = tables.iter().map(|t| t.index.len() as u64).sum();
        let marked: u64 = leaves
            .iter()
            .map(|l| u64::from(l.1.keys.count_ones()))
            .sum();
        let alpha = cost::skew(marked, n);
        let model = &self.config.cost_model;
        let dir = self.ckpt.lock().clone();
        let lost_marks = self.need_full.swap(false, Ordering::SeqCst);
        let forced_full = dir.generation == 0 || lost_marks;
        let kind = match mode {
            _ if forced_full => CheckpointKind::Full,
            CheckpointMode::Full => CheckpointKind::Full,
            CheckpointMode::Incremental => CheckpointKind::Incremental,
            CheckpointMode::CostModel => model.choose(n, alpha),
        };
        let generation = dir.generation + 1;
        let written = match kind {
            CheckpointKind::Full => self.write_full(&tables, generation),
            CheckpointKind::Incremental => {
                let inc = self.get_increment(&tables, &leaves);
                self.merge_and_write(&dir, &inc, generation)
            }
        };
        let Written {
            pages,
            replaced,
            fresh,
        } = match written {
            Ok(w) => w,
            Err(e) => {
                // The drained marks are gone: the next checkpoint must be full.
                self.need_full.store(true, Ordering::SeqCst);
                return Err(e);
            }
        };
        if pages.len() as u64 > ck::MAX_PAGES {
            for p in fresh {
                self.pages.free(&self.pool, p);
            }
            self.need_full.store(true, Ordering::SeqCst);
            return Err(DbError::Tx(crate::engine::TxError::PmFull(format!(
                "an index checkpoint of {} pages exceeds the directory's {}",
                pages.len(),
                ck::MAX_PAGES
            ))));
        }
        let stats = CheckpointStats {
            generation,
            kind,
            ct,
            entries: pages.iter().map(|p| p.entries).sum(),
            entries_written: pages
                .iter()
                .filter(|p| fresh.contains(&p.page))
                .map(|p| p.entries)
                .sum::<u64>(),
            marked_keys: marked,
            pages: pages.len() as u64,
            pages_written: fresh.len() as u64,
            alpha,
            threshold: model.threshold(n),
            gini_simpson: cost::skew_gini_simpson(leaves.iter().map(|l| l.1.writes)),
            ms: 0.0,
        };
        self.publish(generation, (ct, kind, started), pages, replaced);
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(CheckpointStats {
            ms: started.elapsed().as_secs_f64() * 1e3,
            ..stats
        })
    }

    /// A full checkpoint's pages: every table's entries, sorted. Returns the new directory's
    /// pages, the pages it replaces and the pages written.
    ///
    /// The index walk gives each key's address, and a committed version's header is read
    /// directly (`committed_at`: a committed update or insert is written as found, a committed
    /// deletion not at all); only a key whose version is pending or latched takes the lookup
    /// and latch of [`newest_committed`](Self::newest_committed). Looking every key up again
    /// cost a second random cache miss and a latch per key.
    fn write_full(&self, tables: &[Arc<TableRt>], generation: u64) -> Result<Written, DbError> {
        let total: usize = tables.iter().map(|t| t.index.len()).sum();
        let mut entries: Vec<Entry> = Vec::with_capacity(total);
        let mut pairs = Vec::new();
        for (table, t) in tables.iter().enumerate() {
            pairs.clear();
            pairs.reserve(t.index.len());
            t.index.for_each(|k, a| pairs.push((k, a)));
            pairs.sort_unstable_by_key(|p| p.0);
            for &(key, addr) in &pairs {
                let found = match self.committed_at(key, addr) {
                    Walked::Committed(txn) => Some((txn, addr)),
                    Walked::Deleted => None,
                    Walked::LookUp => self.newest_committed(t, key),
                };
                if let Some((txn, addr)) = found {
                    entries.push([table as u64, key, txn, addr]);
                }
            }
        }
        let pages = self.write_pages(generation, &entries)?;
        let fresh = pages.iter().map(|p| p.page).collect();
        let replaced = self.ckpt.lock().pages.iter().map(|p| p.page).collect();
        Ok(Written {
            pages,
            replaced,
            fresh,
        })
    }

    /// GetIncrement: the newest committed version of every marked key, or a deletion entry.
    fn get_increment(
        &self,
        tables: &[Arc<TableRt>],
        leaves: &[((TableId, u64), Leaf)],
    ) -> Vec<Entry> {
        let mut inc = Vec::new();
        for &((table, leaf), l) in leaves {
            let Some(t) = tables.get(table as usize) else {
                continue;
            };
            let mut bits = l.keys;
            while bits != 0 {
                let key = (leaf << LEAF_BITS) | u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                inc.push(match self.newest_committed(t, key) {
                    Some((txn, addr)) => [u64::from(table), key, txn, addr],
                    None => [u64::from(table), key, 0, NONE],
                });
            }
        }
        inc
    }

    /// FlushChpt / MergeAndPersist: merges the increment into each page of the previous
    /// checkpoint whose key range it falls in (page i covers its first key up to page i + 1's),
    /// writing those pages anew and keeping the others.
    fn merge_and_write(
        &self,
        dir: &CkptDir,
        inc: &[Entry],
        generation: u64,
    ) -> Result<Written, DbError> {
        let mut out = Vec::with_capacity(dir.pages.len());
        let mut replaced = Vec::new();
        let mut fresh: Vec<u64> = Vec::new();
        let mut old = Vec::new();
        // Scratch for the page bytes, reused from page to page.
        let mut page_buf = Vec::new();
        let pages: Vec<Option<CkptPage>> = if dir.pages.is_empty() {
            vec![None]
        } else {
            dir.pages.iter().copied().map(Some).collect()
        };
        let firsts: Vec<(u64, u64)> = dir.pages.iter().map(|p| p.first).collect();
        for (page, mine) in pages.iter().zip(split_by_pages(&firsts, inc)) {
            if mine.is_empty() {
                out.extend(*page);
                continue;
            }
            old.clear();
            if let Some(p) = page {
                old.resize(p.entries.min(ck::PER_PAGE) as usize, [0; 4]);
                self.read_page_into(p.page, &mut old, &mut page_buf);
            }
            let merged = merge(&old, mine);
            match self.write_pages(generation, &merged) {
                Ok(ps) => {
                    fresh.extend(ps.iter().map(|p| p.page));
                    out.extend(ps);
                    replaced.extend(page.map(|p| p.page));
                }
                Err(e) => {
                    for p in fresh {
                        self.pages.free(&self.pool, p);
                    }
                    return Err(e);
                }
            }
        }
        Ok(Written {
            pages: out,
            replaced,
            fresh,
        })
    }

    /// Reads the first `out.len()` entries of checkpoint page `page` into `out` (at most a
    /// page's), through `buf` (scratch, reused by the caller from page to page).
    pub(crate) fn read_page_into(&self, page: u64, out: &mut [Entry], buf: &mut Vec<u8>) {
        let n = out.len().min(ck::PER_PAGE as usize);
        buf.resize(n * ck::ENTRY as usize, 0);
        self.pool
            .read_bytes(self.pages.page_offset(page) + ck::FIRST_ENTRY, buf);
        for (e, bytes) in out.iter_mut().zip(buf.chunks_exact(ck::ENTRY as usize)) {
            let w =
                |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            *e = [w(0), w(1), w(2), w(3)];
        }
    }

    /// Writes sorted `entries` to fresh checkpoint pages of `generation` (flushed, not fenced).
    fn write_pages(&self, generation: u64, entries: &[Entry]) -> Result<Vec<CkptPage>, DbError> {
        let mut pages = Vec::new();
        let mut buf = Vec::new();
        for chunk in entries.chunks(ck::PER_PAGE as usize) {
            let tag = PageTag {
                kind: kind::CHECKPOINT,
                owner: 0,
                value: 0,
            };
            let page = match self.pages.allocate(&self.pool, tag) {
                Ok(p) => p,
                Err(e) => {
                    for p in pages {
                        let p: CkptPage = p;
                        self.pages.free(&self.pool, p.page);
                    }
                    return Err(e.into());
                }
            };
            buf.clear();
            for word in [generation, chunk.len() as u64] {
                buf.extend_from_slice(&word.to_le_bytes());
            }
            buf.resize(ck::FIRST_ENTRY as usize, 0);
            for e in chunk {
                for word in e {
                    buf.extend_from_slice(&word.to_le_bytes());
                }
            }
            let at = self.pages.page_offset(page);
            self.pool.write_bytes(at, &buf);
            if self.flushing {
                self.pool.flush(at, buf.len() as u64);
            }
            pages.push(CkptPage {
                page,
                first: (chunk[0][0], chunk[0][1]),
                entries: chunk.len() as u64,
            });
        }
        Ok(pages)
    }

    /// The directory slot of `generation`.
    pub(crate) fn dir_at(&self, generation: u64) -> u64 {
        self.dir_base + (generation % 2) * ck::DIR_SLOT_BYTES
    }

    /// Makes the new checkpoint valid: pages durable, then its directory (with when it was
    /// published and how long it took since `started`, which recovery reports), then the
    /// generation word; then frees the pages it replaced.
    fn publish(
        &self,
        generation: u64,
        (ct, kind, started): (u64, CheckpointKind, Instant),
        pages: Vec<CkptPage>,
        replaced: Vec<u64>,
    ) {
        let fault = self.config.fault;
        if self.flushing {
            self.pool.fence();
        }
        if fault == Some(FirFault::CheckpointGenFirst) {
            self.pool.write_u64(self.ckpt_gen_at, generation);
            self.pool.persist(self.ckpt_gen_at, 8);
        }
        if fault == Some(FirFault::CheckpointFreeFirst) {
            for &p in &replaced {
                self.pages.free(&self.pool, p);
            }
        }
        let entries: u64 = pages.iter().map(|p| p.entries).sum();
        let kind_word = u64::from(kind == CheckpointKind::Incremental);
        let took_us = started.elapsed().as_micros() as u64;
        let mut buf = Vec::with_capacity((ck::DIR_FIRST + 8 * pages.len() as u64) as usize);
        for word in [
            generation,
            ct,
            entries,
            pages.len() as u64,
            kind_word,
            unix_ms(),
            took_us,
        ] {
            buf.extend_from_slice(&word.to_le_bytes());
        }
        buf.resize(ck::DIR_FIRST as usize, 0);
        for p in &pages {
            buf.extend_from_slice(&p.page.to_le_bytes());
        }
        let at = self.dir_at(generation);
        self.pool.write_bytes(at, &buf);
        if self.flushing && fault != Some(FirFault::CheckpointSkipDirectoryFlush) {
            self.pool.flush(at, buf.len() as u64);
            self.pool.fence();
        }
        // The switch: one 8-byte store names the new checkpoint (ordered after the stores above
        // for eADR, where nothing is flushed or fenced).
        self.pool.write_u64_ordered(self.ckpt_gen_at, generation);
        self.pool.persist(self.ckpt_gen_at, 8);
        if fault != Some(FirFault::CheckpointFreeFirst) {
            for p in replaced {
                self.pages.free(&self.pool, p);
            }
        }
        *self.ckpt.lock() = CkptDir {
            generation,
            ct,
            pages,
        };
    }

    /// What the version at `addr`, which the index walk found for `key`, says about the
    /// checkpoint's entry for `key` (see [`Walked`]).
    ///
    /// A committed version's begin_ts never changes (the header is written before its state is
    /// stored with release order), so no latch is needed. If the key got a newer version after
    /// the walk read `addr`, that version's transaction ended after CT was taken, so its txnId
    /// is at least CT and recovery redoes it (the module documentation's rule).
    fn committed_at(&self, key: u64, addr: u64) -> Walked {
        let h = self.header(addr);
        let seen = h.state.load(Ordering::Acquire);
        if seen != state::COMMITTED && seen != state::COMMITTED | state::TOMBSTONE {
            return Walked::LookUp;
        }
        let (found, txn) = (
            h.key.load(Ordering::Relaxed),
            h.begin.load(Ordering::Relaxed),
        );
        // A header rewritten meanwhile (a latch taken) changed its state word: checked again.
        std::sync::atomic::fence(Ordering::Acquire);
        if found != key || h.state.load(Ordering::Relaxed) != seen {
            return Walked::LookUp;
        }
        if seen & state::TOMBSTONE != 0 {
            // A committed deletion (its commit removes the key from the index right after):
            // the key has no entry, as `newest_committed` would find.
            Walked::Deleted
        } else {
            Walked::Committed(txn)
        }
    }

    /// The newest committed version of `key` and its txnId; `None` if the key has none or it is
    /// a deletion.
    fn newest_committed(&self, t: &TableRt, key: u64) -> Option<(u64, u64)> {
        loop {
            let head = t.index.get(key)?;
            let h = self.header(head);
            let s = h.latch(&self.pool);
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

/// The wall-clock time in ms since the Unix epoch (0 if the clock is before it): a checkpoint's
/// directory records when it was published, so that recovery can say how old it was.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn entries(m: &BTreeMap<(u64, u64), (u64, u64)>) -> Vec<Entry> {
        m.iter().map(|(&(t, k), &(x, a))| [t, k, x, a]).collect()
    }

    #[test]
    fn merge_replaces_inserts_and_removes() {
        let old = vec![[0, 1, 5, 10], [0, 3, 5, 11], [1, 0, 6, 12]];
        let inc = vec![
            [0, 0, 7, 20],
            [0, 3, 8, 21],
            [1, 0, 0, NONE],
            [2, 9, 0, NONE],
        ];
        assert_eq!(
            merge(&old, &inc),
            vec![[0, 0, 7, 20], [0, 1, 5, 10], [0, 3, 8, 21]]
        );
        assert_eq!(merge(&[], &[]), Vec::<Entry>::new());
    }

    #[test]
    fn marks_cover_each_written_key_once_per_leaf() {
        let m = LeafMarks::new();
        for (key, txn) in [(5u64, 3u64), (63, 4), (64, 9), (5, 7)] {
            m.mark(2, key, txn);
        }
        m.mark(1, 5, 1);
        let d = m.drain();
        let got: Vec<_> = d
            .iter()
            .map(|&(k, l)| (k, l.t_access, l.keys, l.writes))
            .collect();
        assert_eq!(
            got,
            vec![
                ((1, 0), 1, 1 << 5, 1),
                ((2, 0), 7, (1 << 5) | (1 << 63), 3),
                ((2, 1), 9, 1, 1)
            ]
        );
        assert!(m.drain().is_empty(), "drain takes the marks");
    }

    /// Every entry of the valid checkpoint, in page order.
    fn checkpoint_entries(eng: &FirEngine) -> Vec<Entry> {
        let dir = eng.ckpt.lock().clone();
        let (mut out, mut buf) = (Vec::new(), Vec::new());
        for p in &dir.pages {
            let mut page = vec![[0; 4]; p.entries as usize];
            eng.read_page_into(p.page, &mut page, &mut buf);
            out.extend(page);
        }
        out
    }

    /// The full checkpoint's fallback (§4.3.2): a key whose newest version is pending (an
    /// update not committed yet) or whose header is latched is looked up again and written with
    /// its newest committed version, and a committed deletion still in the index (between its
    /// commit and the index removal) is left out. The checkpoint equals the index once the
    /// update has aborted and the latch is released.
    #[test]
    fn a_full_checkpoint_writes_the_committed_version_of_pending_and_latched_keys() {
        use super::super::worker::FirWorker;
        use crate::engine::{EngineWorker, FieldWrite};
        let (eng, t) = super::super::test_engine(1, false, |_| {});
        let mut w = FirWorker::new(eng.clone(), 0).unwrap();
        w.begin(false);
        for k in 0..100u64 {
            w.insert(t, k, &k.to_le_bytes()).unwrap();
        }
        w.commit().unwrap();
        let table = eng.tables.read()[t as usize].clone();
        let index = &table.index;
        let (pending, latched, deleted) = (5u64, 7u64, 9u64);
        let committed_5 = index.get(pending).unwrap();
        w.begin(false);
        let write = FieldWrite {
            offset: 0,
            bytes: &99u64.to_le_bytes(),
        };
        w.update(t, pending, &[write]).unwrap();
        assert_ne!(
            index.get(pending),
            Some(committed_5),
            "the index names the pending version"
        );
        let h7 = eng.header(index.get(latched).unwrap());
        let h9 = eng.header(index.get(deleted).unwrap());
        h9.state
            .store(state::COMMITTED | state::TOMBSTONE, Ordering::Release);
        let bits = h7.latch(&eng.pool);
        let stats = std::thread::scope(|s| {
            let running = s.spawn(|| eng.checkpoint_as(CheckpointMode::Full));
            std::thread::sleep(std::time::Duration::from_millis(50));
            // It cannot pass key 7 without its latch.
            assert!(
                !running.is_finished(),
                "the checkpoint read a latched header"
            );
            h7.unlatch(bits);
            running.join().unwrap().unwrap()
        });
        assert_eq!(stats.kind, CheckpointKind::Full);
        w.abort();
        h9.state.store(state::COMMITTED, Ordering::Release);
        assert_eq!(index.get(pending), Some(committed_5));
        let mut want = Vec::new();
        index.for_each(|key, addr| {
            let h = eng.header(addr);
            if key != deleted {
                want.push([u64::from(t), key, h.begin.load(Ordering::Relaxed), addr]);
            }
        });
        want.sort_unstable();
        assert_eq!(want.len(), 99);
        assert_eq!(checkpoint_entries(&eng), want);
    }

    proptest! {
        /// A full checkpoint of an index, with the increments of later changes merged into it
        /// page by page, equals the full checkpoint of the changed index.
        #[test]
        fn full_plus_increments_is_the_index(
            start in prop::collection::btree_map((0u64..3, 0u64..400), (1u64..1000, 0u64..1000), 0..300),
            rounds in prop::collection::vec(
                prop::collection::vec(((0u64..3, 0u64..400), prop::option::of((1u64..1000, 0u64..1000))), 0..60),
                1..5),
            per_page in 1usize..40,
        ) {
            let mut index = start.clone();
            // The checkpoint as pages of at most `per_page` entries.
            let mut pages: Vec<Vec<Entry>> = entries(&index).chunks(per_page).map(|c| c.to_vec()).collect();
            for changes in rounds {
                let mut marked = BTreeMap::new();
                for (key, value) in changes {
                    match value {
                        Some(v) => { index.insert(key, v); }
                        None => { index.remove(&key); }
                    }
                    marked.insert(key, ());
                }
                // GetIncrement: the state of each marked key now.
                let inc: Vec<Entry> = marked.keys().map(|&(t, k)| match index.get(&(t, k)) {
                    Some(&(x, a)) => [t, k, x, a],
                    None => [t, k, 0, NONE],
                }).collect();
                // MergeAndPersist by page ranges, as `merge_and_write` does.
                let firsts: Vec<(u64, u64)> = pages.iter().map(|p| (p[0][0], p[0][1])).collect();
                let olds = if pages.is_empty() { vec![Vec::new()] } else { std::mem::take(&mut pages) };
                let mut next_pages = Vec::new();
                for (old, mine) in olds.into_iter().zip(split_by_pages(&firsts, &inc)) {
                    if mine.is_empty() {
                        if !old.is_empty() { next_pages.push(old); }
                        continue;
                    }
                    for c in merge(&old, mine).chunks(per_page) {
                        next_pages.push(c.to_vec());
                    }
                }
                pages = next_pages;
                let flat: Vec<Entry> = pages.concat();
                prop_assert_eq!(&flat, &entries(&index));
                prop_assert!(pages.iter().all(|p| !p.is_empty() && p.len() <= per_page));
            }
        }
    }
}
