//! The page manager: 2 MiB pages of a pool, each owned by one engine structure.
//!
//! Layout: the first 2 MiB of the pool are metadata (the pmem header page, then this manager's
//! superblock at 4 KiB and its page table from 8 KiB); page `k` (k ≥ 1) is the 2 MiB at `k × 2 MiB`.
//! A page's descriptor is one 8-byte word: 0 when free, else a [`PageTag`]. Allocating is a CAS of
//! the descriptor from 0 to the tag followed by a persist, so a page is durably owned before its
//! `allocate` call returns, and a crash can never leave a page owned twice: at worst a page
//! allocated just before the crash is free again after it (its owner had not yet published any
//! durable reference to it).
//!
//! Integrity: a descriptor carries a 14-bit check of its page index, kind, owner and value
//! (bytes 4–5, each with its top bit set, so no single damaged byte turns a descriptor into 0 =
//! "free"); [`PageManager::allocated`] refuses a descriptor whose check fails. Every free page is
//! all zero, and [`PageManager::allocate`] verifies that before handing a page out, so damage in a
//! free page is reported instead of becoming phantom rows of its next owner.

use crate::pmem::{Pool, PoolError};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes in a page.
pub const PAGE_SIZE: u64 = 2 << 20;

const SUPERBLOCK: u64 = 4096;
const SUPER_MAGIC: u64 = u64::from_le_bytes(*b"PMTXPAGE");
/// Version 2: descriptors carry a check (version 1 had none).
const SUPER_VERSION: u64 = 2;
const TABLE: u64 = 8192;
/// Descriptors that fit between the table start and the first page.
const MAX_PAGES: u64 = (PAGE_SIZE - TABLE) / 8;

/// Who owns a page: a kind (non-zero, engine-defined), the owning thread slot, and a 32-bit
/// engine-defined value (a table id, a log ring number, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageTag {
    /// What the page holds (engine-defined, non-zero).
    pub kind: u8,
    /// The thread slot that owns the page.
    pub owner: u8,
    /// An engine-defined value below 2^32.
    pub value: u64,
}

/// Largest tag value + 1.
const VALUE_LIMIT: u64 = 1 << 32;

impl PageTag {
    /// The 16 check bits of `self` as the descriptor of page `index`: a CRC-32 folded to 14 bits,
    /// with the top bit of each byte set.
    fn check(self, index: u64) -> u64 {
        let mut h = crc32fast::Hasher::new();
        h.update(&index.to_le_bytes());
        h.update(&[self.kind, self.owner]);
        h.update(&self.value.to_le_bytes());
        u64::from(h.finalize() as u16) | 0x8080
    }

    fn encode(self, index: u64) -> u64 {
        debug_assert!(self.kind != 0 && self.value < VALUE_LIMIT);
        (u64::from(self.kind) << 56)
            | (u64::from(self.owner) << 48)
            | (self.check(index) << 32)
            | self.value
    }

    /// The tag in `word`, unchecked (None: free).
    fn decode(word: u64) -> Option<PageTag> {
        let kind = (word >> 56) as u8;
        (word != 0).then_some(PageTag {
            kind,
            owner: (word >> 48) as u8,
            value: word & (VALUE_LIMIT - 1),
        })
    }

    /// The tag in `word`, the descriptor of page `index`, with its check verified.
    fn decode_checked(word: u64, index: u64) -> Result<Option<PageTag>, AllocError> {
        match Self::decode(word) {
            Some(tag) if tag.kind == 0 || tag.encode(index) != word => Err(AllocError::Corrupt(
                format!("descriptor of page {index} ({word:#018x}) fails its check"),
            )),
            other => Ok(other),
        }
    }
}

/// Errors of the page manager.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// Every page of the pool is in use (and the pool cannot grow further).
    #[error("persistent memory is full: {}", full_detail(*pages, *pool_bytes, *max_pool_bytes))]
    PmFull {
        /// Pages in the pool.
        pages: u64,
        /// The pool size in bytes.
        pool_bytes: u64,
        /// The size the pool may grow to (`None`: a fixed-size pool).
        max_pool_bytes: Option<u64>,
    },
    /// The pool is too small to hold even one page.
    #[error("a pool of {size} bytes is too small: pages need at least {min} bytes")]
    PoolTooSmall {
        /// The pool size.
        size: u64,
        /// The minimum size.
        min: u64,
    },
    /// The page manager's metadata is damaged or missing.
    #[error("page table is corrupt: {0}")]
    Corrupt(String),
    /// A tag that cannot be stored.
    #[error("invalid page tag {0:?}: kind must be non-zero and value below 2^32")]
    BadTag(PageTag),
    /// An error of the pool underneath.
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// "all 3 pages of 2 MiB of the 8 MiB pool are in use": what [`AllocError::PmFull`] says, without
/// the "full" the error's own message and [`TxError::PmFull`](crate::engine::TxError::PmFull)
/// already put in front.
pub fn full_detail(pages: u64, pool_bytes: u64, max_pool_bytes: Option<u64>) -> String {
    let growth = match max_pool_bytes {
        Some(max) if max <= pool_bytes => format!(
            ", and the pool has grown to its maximum size of {}",
            mib(max)
        ),
        Some(max) => format!(" (it may grow to {})", mib(max)),
        None => " (a fixed-size pool)".to_string(),
    };
    format!(
        "all {pages} pages of {} MiB of the {} pool are in use{growth}",
        PAGE_SIZE >> 20,
        mib(pool_bytes)
    )
}

/// `n` bytes in MiB, with a fraction only when there is one.
pub fn mib(n: u64) -> String {
    if n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{:.2} MiB", n as f64 / f64::from(1 << 20))
    }
}

/// How much of a pool is in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SpaceUsage {
    /// Pages in the pool.
    pub pages_total: u64,
    /// Pages allocated.
    pub pages_used: u64,
    /// Bytes in use: the metadata region plus the allocated pages.
    pub bytes_used: u64,
    /// The pool size.
    pub bytes_total: u64,
}

/// Hands out the 2 MiB pages of one pool. Cheap to share between threads by reference.
///
/// A growable pool ([`Pool::max_size`]) grows when every page is in use: [`PageManager::allocate`]
/// grows the pool ([`Pool::grow`]: file extended, mapped, new size durable), then records the new
/// page count in the superblock, durably, and only then publishes the new pages; growth is
/// serialised by a lock, and threads keep using existing pages meanwhile. A crash between the
/// pool's new size and the superblock's leaves a superblock with fewer pages than the pool
/// holds; [`PageManager::open`] adopts the pool's (the extra pages are all zero: free).
pub struct PageManager {
    /// Pages in the pool; grows (Release, after the pages are durable and mapped).
    pages: AtomicU64,
    /// Serialises growth.
    grow_lock: parking_lot::Mutex<()>,
    /// Where the next search for a free page starts (DRAM only: a hint).
    next_hint: AtomicU64,
}

impl PageManager {
    /// The largest pool whose every page the page table can describe (about 510 GiB): bytes
    /// beyond it would never be used.
    pub const fn max_pool_size() -> u64 {
        (MAX_PAGES + 1) * PAGE_SIZE
    }

    /// Pages that fit in a pool of `size` bytes.
    pub fn pages_for(size: u64) -> u64 {
        (size / PAGE_SIZE).saturating_sub(1).min(MAX_PAGES)
    }

    /// Writes an empty page table into a fresh pool (crash-safe: the superblock magic is
    /// persisted last, so a crash leaves either no page manager or a complete one).
    pub fn format(pool: &Pool) -> Result<PageManager, AllocError> {
        let pages = Self::pages_for(pool.len());
        if pages == 0 {
            return Err(AllocError::PoolTooSmall {
                size: pool.len(),
                min: 2 * PAGE_SIZE,
            });
        }
        pool.write_u64(SUPERBLOCK + 8, SUPER_VERSION);
        pool.write_u64(SUPERBLOCK + 16, pages);
        // The table of a fresh pool is zero (new files read as zero); clear it anyway, since the
        // caller may be re-formatting a used pool.
        pool.fill(TABLE, 0, pages * 8);
        pool.persist(SUPERBLOCK + 8, 16);
        pool.persist(TABLE, pages * 8);
        pool.write_u64(SUPERBLOCK, SUPER_MAGIC);
        pool.persist(SUPERBLOCK, 8);
        Ok(PageManager::with_pages(pages))
    }

    fn with_pages(pages: u64) -> PageManager {
        PageManager {
            pages: AtomicU64::new(pages),
            grow_lock: parking_lot::Mutex::new(()),
            next_hint: AtomicU64::new(0),
        }
    }

    /// Opens the page table of a formatted pool, checking it against the pool.
    pub fn open(pool: &Pool) -> Result<PageManager, AllocError> {
        if pool.read_u64(SUPERBLOCK) != SUPER_MAGIC {
            return Err(AllocError::Corrupt(
                "no page-table superblock (pool never formatted, or its superblock is damaged)"
                    .into(),
            ));
        }
        let version = pool.read_u64(SUPERBLOCK + 8);
        if version != SUPER_VERSION {
            return Err(AllocError::Corrupt(format!(
                "page-table version {version}, expected {SUPER_VERSION}"
            )));
        }
        let pages = pool.read_u64(SUPERBLOCK + 16);
        let in_pool = Self::pages_for(pool.len());
        // Fewer pages than the pool holds: a growth whose new pool size was durable but whose
        // page count was not yet (a growable pool only).
        let interrupted_growth = pool.max_size().is_some() && pages < in_pool;
        if pages == 0 || (pages != in_pool && !interrupted_growth) {
            return Err(AllocError::Corrupt(format!(
                "page table says {pages} pages but a pool of {} bytes has {in_pool}",
                pool.len(),
            )));
        }
        if interrupted_growth && !pool.is_read_only() {
            // The table entries of the pages past the old count are zero (free): the table region
            // is zero at creation and entries past the count are never written. The pages
            // themselves were never handed out, so they are zero too.
            Self::record_page_count(pool, in_pool);
        }
        Ok(PageManager::with_pages(in_pool))
    }

    fn record_page_count(pool: &Pool, pages: u64) {
        pool.write_u64(SUPERBLOCK + 16, pages);
        pool.persist(SUPERBLOCK + 16, 8);
    }

    /// Whether `pool` holds a page table.
    pub fn is_formatted(pool: &Pool) -> bool {
        pool.read_u64(SUPERBLOCK) == SUPER_MAGIC
    }

    /// Pages in the pool.
    pub fn page_count(&self) -> u64 {
        self.pages.load(Ordering::Acquire)
    }

    /// The pool offset of page `index` (0-based).
    pub fn page_offset(&self, index: u64) -> u64 {
        debug_assert!(index < self.page_count());
        (index + 1) * PAGE_SIZE
    }

    /// The page index holding pool offset `off`, if it is in a page.
    pub fn page_of(&self, off: u64) -> Option<u64> {
        let index = (off / PAGE_SIZE).checked_sub(1)?;
        (index < self.page_count()).then_some(index)
    }

    fn descriptor(index: u64) -> u64 {
        TABLE + index * 8
    }

    /// Allocates a page for `tag`, durably, and returns its index. The page is all zero (see
    /// [`PageManager::free`]).
    pub fn allocate(&self, pool: &Pool, tag: PageTag) -> Result<u64, AllocError> {
        if tag.kind == 0 || tag.value >= VALUE_LIMIT {
            return Err(AllocError::BadTag(tag));
        }
        loop {
            let pages = self.page_count();
            if let Some(index) = self.claim(pool, tag, pages)? {
                return Ok(index);
            }
            if !self.grow(pool, pages)? {
                return Err(AllocError::PmFull {
                    pages,
                    pool_bytes: pool.len(),
                    max_pool_bytes: pool.max_size(),
                });
            }
        }
    }

    /// Pages a pool of `pages` grows by at once: as many again (amortised growth), at least one
    /// and at most 1 GiB of pages.
    fn growth_step(pages: u64) -> u64 {
        pages.clamp(1, (1 << 30) / PAGE_SIZE)
    }

    /// Grows the pool when it still has `seen` pages (else another thread grew it meanwhile: true,
    /// try again); false when it cannot grow (fixed size, or at its maximum).
    fn grow(&self, pool: &Pool, seen: u64) -> Result<bool, AllocError> {
        let _serial = self.grow_lock.lock();
        if self.page_count() != seen {
            return Ok(true);
        }
        let Some(max) = pool.max_size() else {
            return Ok(false);
        };
        let target = (seen + Self::growth_step(seen)).min(Self::pages_for(max));
        if target <= seen {
            return Ok(false);
        }
        // Page k ends at (k + 2) × PAGE_SIZE: the metadata region comes first.
        pool.grow((target + 1) * PAGE_SIZE)?;
        Self::record_page_count(pool, target);
        self.pages.store(target, Ordering::Release);
        Ok(true)
    }

    /// Claims a free page among the first `pages`, if there is one.
    fn claim(&self, pool: &Pool, tag: PageTag, pages: u64) -> Result<Option<u64>, AllocError> {
        let start = self.next_hint.load(Ordering::Relaxed) % pages;
        for step in 0..pages {
            let index = (start + step) % pages;
            let at = Self::descriptor(index);
            if pool.read_u64(at) == 0 && pool.cas_u64(at, 0, tag.encode(index)).is_ok() {
                // A free page is all zero (see `free`); anything else is damage, which the new
                // owner would read as data. Checked before the claim is made durable, and the
                // claim is undone, so the pool is left as it was found.
                if let Some(at_byte) = Self::first_nonzero(pool, self.page_offset(index), PAGE_SIZE)
                {
                    pool.write_u64(at, 0);
                    return Err(AllocError::Corrupt(format!(
                        "free page {index} is not all zero (byte {at_byte} of the pool): the pool is damaged; run `pmtx check`"
                    )));
                }
                pool.persist(at, 8);
                self.next_hint.store(index + 1, Ordering::Relaxed);
                return Ok(Some(index));
            }
        }
        Ok(None)
    }

    /// Returns a page to the free pool, durably, zeroing it first: every free page is all zero
    /// (a fresh pool is, and `free` keeps it so), so a new owner finds no stale data and engines
    /// can treat a zero header as "never used". The caller guarantees nothing durable refers to it.
    pub fn free(&self, pool: &Pool, index: u64) {
        let page = self.page_offset(index);
        pool.fill(page, 0, PAGE_SIZE);
        pool.persist(page, PAGE_SIZE);
        let at = Self::descriptor(index);
        pool.write_u64(at, 0);
        pool.persist(at, 8);
    }

    /// Frees every allocated page that `select` picks (called with the page's index and tag,
    /// before the page is freed, so that a caller can forget what it kept about the page);
    /// returns how many it freed. What a table drop does with its pages (issue 21).
    pub fn free_where(
        &self,
        pool: &Pool,
        mut select: impl FnMut(u64, PageTag) -> bool,
    ) -> Result<u64, AllocError> {
        let mut freed = 0;
        for (index, tag) in self.allocated(pool)? {
            if select(index, tag) {
                self.free(pool, index);
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// The owner of page `index`, if allocated (check not verified: for hot paths that look up a
    /// page [`PageManager::allocated`] has verified).
    pub fn tag(&self, pool: &Pool, index: u64) -> Option<PageTag> {
        PageTag::decode(pool.read_u64(Self::descriptor(index)))
    }

    /// Every allocated page with its tag, in index order (recovery walks these); refuses a
    /// descriptor whose check fails.
    pub fn allocated(&self, pool: &Pool) -> Result<Vec<(u64, PageTag)>, AllocError> {
        let mut out = Vec::new();
        for i in 0..self.page_count() {
            if let Some(t) = PageTag::decode_checked(pool.read_u64(Self::descriptor(i)), i)? {
                out.push((i, t));
            }
        }
        Ok(out)
    }

    /// The offset of the first non-zero byte in `[off, off + len)`, if any.
    pub fn first_nonzero(pool: &Pool, off: u64, len: u64) -> Option<u64> {
        const CHUNK: u64 = 64 << 10;
        let mut buf = vec![0u8; CHUNK.min(len) as usize];
        let mut at = off;
        while at < off + len {
            let n = CHUNK.min(off + len - at) as usize;
            pool.read_bytes(at, &mut buf[..n]);
            // OR-fold 256-byte blocks (the compiler vectorises it), and look for the exact byte
            // only in a block that is not zero: a page allocation reads 2 MiB here.
            for (b, block) in buf[..n].chunks(256).enumerate() {
                if block.iter().fold(0u8, |acc, &x| acc | x) != 0 {
                    let i = block.iter().position(|&x| x != 0).expect("a non-zero byte");
                    return Some(at + (b * 256 + i) as u64);
                }
            }
            at += n as u64;
        }
        None
    }

    /// Free pages (descriptor 0) that are not all zero, as `(page index, first non-zero offset)`;
    /// for `pmtx check` (reads every free page).
    pub fn dirty_free_pages(&self, pool: &Pool) -> Vec<(u64, u64)> {
        (0..self.page_count())
            .filter(|&i| pool.read_u64(Self::descriptor(i)) == 0)
            .filter_map(|i| {
                Self::first_nonzero(pool, self.page_offset(i), PAGE_SIZE).map(|o| (i, o))
            })
            .collect()
    }

    /// Space in use.
    pub fn usage(&self, pool: &Pool) -> SpaceUsage {
        let used = (0..self.page_count())
            .filter(|&i| pool.read_u64(Self::descriptor(i)) != 0)
            .count() as u64;
        SpaceUsage {
            pages_total: self.page_count(),
            pages_used: used,
            bytes_used: PAGE_SIZE + used * PAGE_SIZE,
            bytes_total: pool.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::{PersistenceDomain, PoolOptions};

    fn pool(mib: u64) -> Pool {
        Pool::create_in_memory(mib << 20, &PoolOptions::new("t", PersistenceDomain::Adr)).unwrap()
    }

    #[test]
    fn first_nonzero_finds_the_exact_byte_across_blocks_and_chunks() {
        let p = pool(4);
        let base = 2 << 20;
        assert_eq!(PageManager::first_nonzero(&p, base, PAGE_SIZE), None);
        // Block edges (256 B), read-buffer edges (64 KiB), the last byte of the range.
        for at in [
            0u64,
            255,
            256,
            4097,
            (64 << 10) - 1,
            64 << 10,
            PAGE_SIZE - 1,
        ] {
            p.write_bytes(base + at, &[0x10]);
            assert_eq!(
                PageManager::first_nonzero(&p, base, PAGE_SIZE),
                Some(base + at)
            );
            assert_eq!(
                PageManager::first_nonzero(&p, base + at + 1, PAGE_SIZE - at - 1),
                None
            );
            p.write_bytes(base + at, &[0]);
        }
    }

    #[test]
    fn allocates_every_page_once_then_reports_full_and_reuses_freed() {
        let pool = pool(10);
        let pm = PageManager::format(&pool).unwrap();
        assert_eq!(pm.page_count(), 4);
        let tag = PageTag {
            kind: 3,
            owner: 1,
            value: 77,
        };
        let mut got: Vec<u64> = (0..4).map(|_| pm.allocate(&pool, tag).unwrap()).collect();
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert!(matches!(
            pm.allocate(&pool, tag),
            Err(AllocError::PmFull {
                pages: 4,
                pool_bytes: 10485760,
                max_pool_bytes: None
            })
        ));
        assert_eq!(pm.usage(&pool).pages_used, 4);
        pool.write_u64(pm.page_offset(2) + 64, 0xdead);
        pm.free(&pool, 2);
        assert_eq!(pm.allocate(&pool, tag).unwrap(), 2);
        assert_eq!(
            pool.read_u64(pm.page_offset(2) + 64),
            0,
            "a freed page comes back zeroed"
        );
        assert_eq!(pm.tag(&pool, 2), Some(tag));
        assert_eq!(pm.page_of(pm.page_offset(3) + 5), Some(3));
        assert_eq!(pm.page_of(100), None);
    }

    #[test]
    fn reopen_sees_the_same_table_and_corruption_is_refused() {
        let pool = pool(8);
        assert!(!PageManager::is_formatted(&pool));
        assert!(matches!(
            PageManager::open(&pool),
            Err(AllocError::Corrupt(_))
        ));
        let pm = PageManager::format(&pool).unwrap();
        let tag = PageTag {
            kind: 1,
            owner: 0,
            value: 5,
        };
        let i = pm.allocate(&pool, tag).unwrap();
        let again = PageManager::open(&pool).unwrap();
        assert_eq!(again.allocated(&pool).unwrap(), vec![(i, tag)]);
        // Damage to any byte of the descriptor is caught by its check.
        let good = pool.read_u64(TABLE + i * 8);
        for byte in 0..8 {
            pool.write_u64(TABLE + i * 8, good ^ (0x41 << (8 * byte)));
            assert!(
                matches!(again.allocated(&pool), Err(AllocError::Corrupt(_))),
                "byte {byte}"
            );
        }
        pool.write_u64(TABLE + i * 8, good);
        // A free page holding anything is refused by allocate, and the claim is undone.
        let free_page = (0..again.page_count()).find(|&p| p != i).unwrap();
        pool.write_u64(again.page_offset(free_page) + 4096, 7);
        let err = (0..again.page_count())
            .map(|_| again.allocate(&pool, tag))
            .find_map(Result::err)
            .unwrap();
        assert!(
            matches!(err, AllocError::Corrupt(ref m) if m.contains("not all zero")),
            "{err}"
        );
        assert_eq!(again.tag(&pool, free_page), None);
        assert_eq!(
            again.dirty_free_pages(&pool),
            vec![(free_page, again.page_offset(free_page) + 4096)]
        );
        pool.write_u64(SUPERBLOCK + 16, 999);
        assert!(matches!(
            PageManager::open(&pool),
            Err(AllocError::Corrupt(_))
        ));
    }

    #[test]
    fn too_small_pools_and_bad_tags_are_refused() {
        let small = pool(3);
        assert!(matches!(
            PageManager::format(&small),
            Err(AllocError::PoolTooSmall { .. })
        ));
        let pool = pool(6);
        let pm = PageManager::format(&pool).unwrap();
        assert!(matches!(
            pm.allocate(
                &pool,
                PageTag {
                    kind: 0,
                    owner: 0,
                    value: 0
                }
            ),
            Err(AllocError::BadTag(_))
        ));
    }

    #[test]
    fn concurrent_allocation_never_hands_out_a_page_twice() {
        let pool = pool(70);
        let pm = PageManager::format(&pool).unwrap();
        let per_thread: Vec<Vec<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u8)
                .map(|t| {
                    let (pool, pm) = (&pool, &pm);
                    s.spawn(move || {
                        let tag = PageTag {
                            kind: 2,
                            owner: t,
                            value: 0,
                        };
                        std::iter::from_fn(|| pm.allocate(pool, tag).ok()).collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = per_thread.concat();
        all.sort();
        all.dedup();
        assert_eq!(all.len() as u64, pm.page_count());
        assert_eq!(
            per_thread.iter().map(Vec::len).sum::<usize>() as u64,
            pm.page_count()
        );
    }
}
