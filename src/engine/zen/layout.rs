//! Zen's persistent layout (Zen §3.1): the meta page and the NVM-tuple slot.
//!
//! ```text
//! meta page (kind META, found from the pool root):
//!   0 magic "PMTXZEN1"   8 version   16 max_threads   24 max_row_bytes   32 catalog slot bytes
//!   40 CRC-32 of bytes 0..4096   4096.. catalog slots A and B
//!   4096 + 2 × 256 KiB: one commit watermark word per region (0 = none; written by a table
//!     drop before it frees the table's pages, see `drop.rs`; outside the CRC'd 4 KiB)
//! NVM-tuple heap pages (kind HEAP, owner = the thread whose region the page belongs to,
//! value = table id): fixed-size slots, 16-byte aligned, each a 16-byte header and the row:
//!   0 word: bit 63 LP (last persisted), bit 62 DELETED, bits 0..62 Tx-CTS (the commit tid;
//!     0 = empty slot)
//!   8 tuple id (the primary key)
//!   16.. row
//! ```
//!
//! The header holds no concurrency-control metadata (§3.1): that lives in the Met-Cache entry.
//! Because slots are 16-byte aligned and the header is 16 bytes, a header never straddles a cache
//! line, so one `clwb` persists it (Algorithm 1, line 12).

/// Page kinds of the Zen layout (page-manager tags).
pub mod kind {
    /// The meta page: layout parameters and the catalog.
    pub const META: u8 = 1;
    /// NVM-tuple heap pages; owner = region (thread), value = table id.
    pub const HEAP: u8 = 2;
}

/// Meta page fields.
pub mod meta {
    /// Magic of the meta page.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PMTXZEN1");
    /// Layout version (2: the meta page carries a CRC).
    pub const VERSION: u64 = 2;
    /// Magic field.
    pub const F_MAGIC: u64 = 0;
    /// Version field.
    pub const F_VERSION: u64 = 8;
    /// Max threads (regions) field.
    pub const F_MAX_THREADS: u64 = 16;
    /// Max row bytes field.
    pub const F_MAX_ROW: u64 = 24;
    /// Catalog slot bytes field.
    pub const F_CATALOG_SLOT: u64 = 32;
    /// CRC-32 of the meta page's first 4 KiB (see `engine::meta`).
    pub const F_CRC: u64 = 40;
    /// Where the catalog slots start within the meta page.
    pub const CATALOG_AT: u64 = 4096;
    /// Bytes per catalog slot.
    pub const CATALOG_SLOT_BYTES: u64 = 256 * 1024;
    /// Where the per-region commit watermarks start (after catalog slots A and B): region `r`'s
    /// word at `WATERMARKS_AT + 8 r`, up to [`crate::cc::MAX_THREADS`] regions. A pool written
    /// before table drops has zeros there, which vouch for nothing.
    pub const WATERMARKS_AT: u64 = CATALOG_AT + 2 * CATALOG_SLOT_BYTES;
}

/// NVM-tuple header fields and helpers.
pub mod tuple {
    /// The word holding LP, DELETED and Tx-CTS.
    pub const WORD: u64 = 0;
    /// The tuple id (primary key).
    pub const KEY: u64 = 8;
    /// Header bytes; the row follows.
    pub const HEADER: u64 = 16;
    /// The last-persisted bit: set on the last tuple a committed transaction persisted.
    pub const LP: u64 = 1 << 63;
    /// The deleted bit: this version is a tombstone.
    pub const DELETED: u64 = 1 << 62;
    /// The Tx-CTS bits.
    pub const CTS_MASK: u64 = DELETED - 1;

    /// Slot size for rows of `row` bytes: header + row, rounded to 16 bytes (§3.1).
    pub fn slot_size(row: usize) -> u64 {
        (HEADER + row as u64).div_ceil(16) * 16
    }

    /// The Tx-CTS of a header word.
    #[inline]
    pub fn cts(word: u64) -> u64 {
        word & CTS_MASK
    }
}
