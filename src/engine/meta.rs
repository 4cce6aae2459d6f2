//! The meta page an engine formats first on a fresh pool: its fixed words, an empty catalog, and
//! last the magic and the pool root, so that a crash at any point of formatting leaves a pool that
//! `open` refuses as "not formatted" rather than one that is half formatted.

use crate::alloc::{PageManager, PageTag};
use crate::catalog::{Catalog, CatalogStore};
use crate::engine::DbError;
use crate::pmem::Pool;

/// Where an engine keeps its meta page's contents (offsets within the page).
pub(crate) struct MetaLayout<'a> {
    /// The page-manager tag kind of the meta page.
    pub page_kind: u8,
    /// Offset of the magic word, written and persisted after everything else.
    pub magic_at: u64,
    /// The engine's magic value.
    pub magic: u64,
    /// Offset of the first catalog slot, and the bytes per slot.
    pub catalog_at: u64,
    /// Bytes per catalog slot.
    pub catalog_slot_bytes: u64,
    /// `(offset, value)` of every other fixed word (version, geometry, limits).
    pub fields: &'a [(u64, u64)],
}

/// Formats the page manager and the meta page of a fresh pool; returns them with the meta page's
/// offset (which is also the pool root).
pub(crate) fn format(pool: &Pool, layout: &MetaLayout<'_>) -> Result<(PageManager, u64), DbError> {
    let pages = PageManager::format(pool)?;
    let meta_index = pages.allocate(
        pool,
        PageTag {
            kind: layout.page_kind,
            owner: 0,
            value: 0,
        },
    )?;
    let meta_page = pages.page_offset(meta_index);
    CatalogStore {
        base: meta_page + layout.catalog_at,
        slot_bytes: layout.catalog_slot_bytes,
    }
    .store(pool, &Catalog::default())?;
    for &(at, value) in layout.fields {
        pool.write_u64(meta_page + at, value);
    }
    if let (Some(lo), Some(hi)) = (
        layout.fields.iter().map(|f| f.0).min(),
        layout.fields.iter().map(|f| f.0).max(),
    ) {
        pool.persist(meta_page + lo, hi + 8 - lo);
    }
    pool.write_u64(meta_page + layout.magic_at, layout.magic);
    pool.persist(meta_page + layout.magic_at, 8);
    pool.set_root(meta_page)?;
    Ok((pages, meta_page))
}

/// The meta page named by the pool root, checked before anything is read through it: the root is
/// a word in PM, and a corrupt one (zero, misaligned, past the end) must give an error, not a
/// misaligned or out-of-range PM access.
pub(crate) fn root_meta_page(pool: &Pool, engine: &str) -> Result<u64, DbError> {
    let meta_page = pool.root();
    if meta_page == 0 {
        return Err(DbError::Corrupt(format!(
            "the pool has no root: it was never formatted for {engine}"
        )));
    }
    if meta_page % crate::alloc::PAGE_SIZE != 0 {
        return Err(DbError::Corrupt(format!(
            "the pool root {meta_page} is not the start of a 2 MiB page: the root word is corrupt"
        )));
    }
    pool.check_range(meta_page, crate::alloc::PAGE_SIZE)
        .map_err(|e| DbError::Corrupt(format!("the pool root is corrupt: {e}")))?;
    Ok(meta_page)
}

/// Checks the catalog slot size recorded in a meta page against the one this build writes.
pub(crate) fn check_catalog_slot(recorded: u64, expected: u64) -> Result<(), DbError> {
    if recorded != expected {
        return Err(DbError::Corrupt(format!(
            "the meta page records catalog slots of {recorded} bytes, but this layout uses {expected}"
        )));
    }
    Ok(())
}
