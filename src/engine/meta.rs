//! The meta page an engine formats first on a fresh pool: its fixed words, an empty catalog, and
//! last the magic and the pool root, so that a crash at any point of formatting leaves a pool that
//! `open` refuses as "not formatted" rather than one that is half formatted.
//!
//! The first [`CHECKED_BYTES`] of the meta page (the fixed words, everything but the catalog) are
//! immutable after formatting and covered by a CRC-32 stored in the page, which [`open`] verifies:
//! a damaged thread count or window geometry would otherwise make recovery read the pool with the
//! wrong shape.

use crate::alloc::PAGE_SIZE;
use crate::alloc::{PageManager, PageTag};
use crate::catalog::{Catalog, CatalogStore};
use crate::engine::DbError;
use crate::pmem::Pool;

/// Bytes of the meta page covered by its CRC (the catalog starts after them).
pub(crate) const CHECKED_BYTES: u64 = 4096;

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
    /// Offset of the CRC-32 of the first [`CHECKED_BYTES`] (taken with this word as zero).
    pub crc_at: u64,
}

/// CRC-32 of the checked part of a meta page whose bytes are `page`, the CRC word taken as zero.
fn meta_crc(page: &[u8], crc_at: u64) -> u64 {
    let mut h = crc32fast::Hasher::new();
    h.update(&page[..crc_at as usize]);
    h.update(&[0u8; 8]);
    h.update(&page[crc_at as usize + 8..]);
    u64::from(h.finalize())
}

/// Finds and verifies the meta page of an existing pool: the root names a page, which holds
/// `layout`'s magic and version, and whose checked bytes match their CRC. Returns its offset.
pub(crate) fn open(pool: &Pool, layout: &MetaLayout<'_>, engine: &str) -> Result<u64, DbError> {
    let corrupt = |m: String| DbError::Corrupt(m);
    let meta_page = pool.root();
    if meta_page == 0 {
        return Err(corrupt(format!(
            "the pool has no root: it was never formatted for {engine}"
        )));
    }
    // The root is read from PM: it must name a whole page of the pool before anything reads there
    // (a misaligned word access would panic).
    if meta_page % PAGE_SIZE != 0 || pool.check_range(meta_page, PAGE_SIZE).is_err() {
        return Err(corrupt(format!(
            "the pool root {meta_page} is not the offset of a 2 MiB page of the pool"
        )));
    }
    let page = pool.read_vec(meta_page, CHECKED_BYTES as usize);
    let word = |at: u64| u64::from_le_bytes(page[at as usize..at as usize + 8].try_into().unwrap());
    if word(layout.magic_at) != layout.magic {
        return Err(corrupt(format!(
            "the {engine} meta page (at offset {meta_page}) has no {engine} magic"
        )));
    }
    let (version_at, version) = layout.fields[0];
    if word(version_at) != version {
        return Err(corrupt(format!(
            "the {engine} meta page has layout version {}, this build reads {version}",
            word(version_at)
        )));
    }
    let (stored, computed) = (word(layout.crc_at), meta_crc(&page, layout.crc_at));
    if stored != computed {
        return Err(corrupt(format!(
            "the {engine} meta page checksum does not match (stored {stored:#010x}, computed {computed:#010x}): its parameters are damaged"
        )));
    }
    Ok(meta_page)
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
    // The checked bytes as they will be once the magic is in: fields, magic, CRC.
    let mut page = vec![0u8; CHECKED_BYTES as usize];
    let mut put =
        |at: u64, v: u64| page[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
    for &(at, value) in layout.fields {
        put(at, value);
    }
    put(layout.magic_at, layout.magic);
    let crc = meta_crc(&page, layout.crc_at);
    for &(at, value) in layout.fields.iter().chain([(layout.crc_at, crc)].iter()) {
        pool.write_u64(meta_page + at, value);
    }
    pool.persist(meta_page, CHECKED_BYTES);
    pool.write_u64(meta_page + layout.magic_at, layout.magic);
    pool.persist(meta_page + layout.magic_at, 8);
    pool.set_root(meta_page)?;
    Ok((pages, meta_page))
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
