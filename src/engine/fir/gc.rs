//! Garbage collection (FIR §4.5): block redistribution in two crash-safe stages.
//!
//! A worker collects the full blocks of its own regions whose update_map marks at least
//! `FirConfig::gc_threshold` of the versions obsolete (the paper's `gc_array`, found when the
//! round runs rather than queued):
//!
//! 1. **Redistribution.** One MVTO transaction of the worker supersedes every live version of
//!    those blocks with an identical copy appended to the worker's region (so the copy is
//!    committed by the LCTT like any version, and recovery orders it by its txnId). The blocks
//!    now hold only obsolete versions, but the valid index checkpoint may still name some, and
//!    recovery may still read them.
//! 2. **Checkpoint, then free.** An index checkpoint is taken at once; a block is freed only when
//!    the valid checkpoint's CT is above the clock at the end of stage 1 (so no entry names the
//!    block and recovery's redo, which starts at CT, never reads it: every version in it is older)
//!    and every running transaction is younger (no MVTO reader can walk its version chain into
//!    the block). The pages are listed in the meta page's free record before they are zeroed and
//!    released, and the record is cleared after: recovery finishes a free a crash interrupted
//!    (a half-zeroed block in the middle of a region would otherwise end its committed prefix).
//!
//! A crash before the checkpoint is valid leaves the blocks allocated and their versions
//! obsolete; recovery rebuilds the update_map from the index (every slot it does not name is
//! obsolete), so the next round collects them again (the paper: "another round of GC after
//! recovery").

use super::layout::meta;
use super::FirEngine;
use super::FirFault;
use crate::alloc::PageTag;
use crate::engine::DbError;
use std::sync::atomic::Ordering;

/// A page tag as the free record stores it.
pub(crate) fn tag_word(tag: PageTag) -> u64 {
    (u64::from(tag.kind) << 56) | (u64::from(tag.owner) << 48) | tag.value
}

impl FirEngine {
    /// Frees `blocks` (page index, tag word) crash-safely: listed in the free record (durable),
    /// zeroed and released, then the record cleared.
    pub(crate) fn free_blocks(&self, blocks: &[(u64, u64)]) {
        // One free record: workers free one after another.
        let _one = self.gc_free_lock.lock();
        let record = self.config.fault != Some(FirFault::GcSkipFreeRecord);
        for chunk in blocks.chunks(meta::GC_MAX as usize) {
            if record {
                let mut buf = Vec::with_capacity(16 * chunk.len());
                for &(page, tag) in chunk {
                    buf.extend_from_slice(&page.to_le_bytes());
                    buf.extend_from_slice(&tag.to_le_bytes());
                }
                self.pool.write_bytes(self.gc_at + 8, &buf);
                if self.flushing {
                    self.pool.flush(self.gc_at + 8, buf.len() as u64);
                    self.pool.fence();
                }
                // The count names the list (ordered after it under eADR).
                self.pool.write_u64_ordered(self.gc_at, chunk.len() as u64);
                self.pool.persist(self.gc_at, 8);
            }
            for &(page, _) in chunk {
                self.pages.free(&self.pool, page);
            }
            self.gc
                .blocks_in_use
                .fetch_sub(chunk.len() as u64, Ordering::Relaxed);
            if record {
                self.pool.write_u64_ordered(self.gc_at, 0);
                self.pool.persist(self.gc_at, 8);
            }
            self.gc
                .freed
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }

    /// Recovery: finishes the free a crash interrupted (every listed page that still carries the
    /// tag it had when listed is freed again: zeroing is idempotent, and a page that was freed
    /// and taken by a new owner carries another tag, since block sequence numbers never repeat).
    /// Returns the pages freed.
    pub(crate) fn finish_interrupted_free(&self) -> Result<u64, DbError> {
        let n = self.pool.read_u64(self.gc_at);
        if n == 0 {
            return Ok(0);
        }
        if n > meta::GC_MAX {
            return Err(DbError::Corrupt(format!(
                "the FIR GC free record lists {n} blocks (at most {})",
                meta::GC_MAX
            )));
        }
        let mut freed = 0;
        for i in 0..n {
            let at = self.gc_at + 8 + 16 * i;
            let (page, tag) = (self.pool.read_u64(at), self.pool.read_u64(at + 8));
            if page >= self.pages.page_count() {
                return Err(DbError::Corrupt(format!(
                    "the FIR GC free record names page {page}, beyond the pool's {}",
                    self.pages.page_count()
                )));
            }
            if self.pages.tag(&self.pool, page).map(tag_word) == Some(tag) {
                self.pages.free(&self.pool, page);
                freed += 1;
            }
        }
        self.pool.write_u64_ordered(self.gc_at, 0);
        self.pool.persist(self.gc_at, 8);
        self.gc
            .finished_at_recovery
            .fetch_add(freed, Ordering::Relaxed);
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_words_differ_by_owner_kind_and_value() {
        let t = |kind, owner, value| tag_word(PageTag { kind, owner, value });
        let words = [t(2, 0, 5), t(2, 1, 5), t(3, 0, 5), t(2, 0, 6)];
        for (i, a) in words.iter().enumerate() {
            for b in &words[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
