//! §4.4's regular data path: objects too large for a data page (the locality-aware path's
//! blocks stay within one 2 MiB page) take whole pages of the page manager, page-granular, as
//! a general-purpose allocator serves large requests. A large version is a head page (its
//! header, the list of its tail pages, the first payload bytes) and tail pages; copy-on-write,
//! commit, garbage collection and recovery treat it like a small version, except that its
//! pages return to the page manager instead of the recycle list. Departure: the paper does
//! not describe the regular path's layout; the page list in the head page is ours, and a
//! version's pages need not be contiguous (the page manager hands out single pages).

use super::layout::{self, header, is_large, kind, large};
use super::Inner;
use crate::alloc::{AllocError, PageTag, PAGE_SIZE};
use crate::ptm::PtmError;
use std::ops::Range;

/// PM extents (offset, bytes), without a heap allocation for an object within one block.
pub(crate) type Spans = smallvec::SmallVec<[(u64, u64); 2]>;

impl Inner {
    /// Allocates the pages of a large version of `size` bytes for `slot` and writes their
    /// list into the head page (not the header); returns the head page's offset.
    pub(crate) fn alloc_large(&self, slot: usize, size: u64) -> Result<u64, PtmError> {
        let n = layout::large_pages(size);
        let mut got: Vec<u64> = Vec::with_capacity(n as usize);
        for i in 0..n {
            let tag = PageTag {
                kind: kind::LARGE,
                owner: slot as u8,
                value: if i == 0 { large::HEAD } else { large::TAIL },
            };
            match self.pages.allocate(&self.pool, tag) {
                Ok(index) => got.push(self.pages.page_offset(index)),
                Err(e) => {
                    // Nothing refers to the pages yet: give them back.
                    for p in got {
                        self.free_page(p);
                    }
                    return Err(match e {
                        AllocError::PmFull { .. } => PtmError::PoolFull {
                            bytes: size as usize,
                            detail: format!(
                                "a large object needs {n} free pages of 2 MiB in a pool of {} MiB",
                                self.pool.len() >> 20
                            ),
                        },
                        e => e.into(),
                    });
                }
            }
        }
        let mut list = Vec::with_capacity(8 * n as usize);
        list.extend_from_slice(&(n - 1).to_le_bytes());
        for p in &got[1..] {
            list.extend_from_slice(&p.to_le_bytes());
        }
        self.pool.write_bytes(got[0] + large::LIST, &list);
        Ok(got[0])
    }

    /// The pages of the large version at `head` (head first), read from its page list.
    pub(crate) fn large_pages_of(&self, head: u64) -> Vec<u64> {
        let n = self.pool.read_u64(head + large::LIST).min(large::MAX_TAIL);
        let mut pages = Vec::with_capacity(n as usize + 1);
        pages.push(head);
        for i in 0..n {
            pages.push(self.pool.read_u64(head + large::LIST + 8 + 8 * i));
        }
        pages
    }

    /// Returns a page to the page manager (zeroed, durably).
    fn free_page(&self, off: u64) {
        if let Some(index) = self.pages.page_of(off) {
            self.pages.free(&self.pool, index);
        }
    }

    /// Frees the pages of the large version at `head`, whose header is already invalid on PM
    /// (durably): nothing refers to them.
    pub(crate) fn free_large(&self, head: u64) {
        let pages = self.large_pages_of(head);
        // Tails first: a crash in between leaves pages no valid header owns, which recovery
        // frees.
        for &p in pages.iter().rev() {
            self.free_page(p);
        }
    }

    /// The PM extents of payload bytes `[at, at + len)` of the version at `off` of an object of
    /// `size` bytes. Inline for the common one-extent case: every read and write asks.
    pub(crate) fn payload_spans(&self, off: u64, size: u64, at: u64, len: u64) -> Spans {
        if !is_large(size) {
            return smallvec::smallvec![(off + header::BYTES + at, len)];
        }
        let pages = self.large_pages_of(off);
        let mut spans = Spans::new();
        let (mut pos, end) = (at, at + len);
        while pos < end {
            let (pm, room) = if pos < large::HEAD_BYTES {
                (off + large::PAYLOAD + pos, large::HEAD_BYTES - pos)
            } else {
                let k = (pos - large::HEAD_BYTES) / PAGE_SIZE;
                let within = (pos - large::HEAD_BYTES) % PAGE_SIZE;
                let page = pages.get(1 + k as usize).copied().unwrap_or(0);
                (page + within, PAGE_SIZE - within)
            };
            let n = room.min(end - pos);
            spans.push((pm, n));
            pos += n;
        }
        spans
    }

    /// The PM extents a version at `off` of an object of `size` bytes occupies: what commit
    /// flushes (header, page list and payload of a large one).
    pub(crate) fn version_extents(&self, off: u64, size: u64) -> Spans {
        if !is_large(size) {
            return smallvec::smallvec![(off, header::BYTES + size)];
        }
        let mut v: Spans = smallvec::smallvec![(off, large::PAYLOAD)];
        v.extend(self.payload_spans(off, size, 0, size));
        v
    }

    /// Allocates a version of `size` bytes for `slot`: a block on the locality-aware path, or
    /// pages on the regular one.
    pub(crate) fn alloc_version(&self, slot: usize, size: u64) -> Result<u64, PtmError> {
        if is_large(size) {
            self.alloc_large(slot, size)
        } else {
            self.alloc_block(slot, layout::block_bytes(size))
        }
    }

    /// Copies the payload of the version at `from` into the version at `to` (same size),
    /// except the bytes `skip` (an empty range: all of it), which the caller writes next: the
    /// first write of a transaction fills its copy's bytes once (§4.1's copy-on-write puts the
    /// old payload and the write in one new version; copying bytes that are overwritten at
    /// once only added PM writes, on a whole-record put as many as the record).
    pub(crate) fn copy_payload_except(&self, from: u64, to: u64, size: u64, skip: Range<u64>) {
        for (at, len) in [(0, skip.start), (skip.end, size - skip.end)] {
            if len == 0 {
                continue;
            }
            let (a, b) = (
                self.payload_spans(from, size, at, len),
                self.payload_spans(to, size, at, len),
            );
            for ((src, n), (dst, m)) in a.into_iter().zip(b) {
                debug_assert_eq!(n, m, "versions of one size have the same layout");
                self.pool.copy(src, dst, n);
            }
        }
    }
}
