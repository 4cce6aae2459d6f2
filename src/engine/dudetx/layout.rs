//! DUDETx's persistent layout: the meta page (parameters, catalog, the durable id and the
//! truncation point), the log area (a ring of pages holding persisted redo records, §3.3) and the
//! PM heap (the tables' rows as the reproduce thread leaves them, §3.4).
//!
//! ```text
//! meta page (kind META, the pool root):
//!   0 magic "PMTXDUD1"   8 version   16 max_row_bytes   24 catalog slot bytes   32 log pages
//!   40 CRC-32 of bytes 0..4096        4096.. catalog slots A and B
//!   1 MiB       DURABLE: the largest transaction id whose redo record is persisted (§3.3)
//!   1 MiB + 64  HEAD_SEQ: the last transaction id the reproduce thread applied and truncated
//!   1 MiB + 128 HEAD_POS: the log position (a byte count that only grows) of the first record
//!               not yet truncated
//! log pages (kind LOG, value = the page's number in the ring): a ring of records at logical
//! positions; position p is byte p % (pages × 2 MiB) of the ring. A record, 8-aligned:
//!   0 stored length (u32) | flags (u32, bit 0: LZ4)   8 first id   16 last id
//!   24 raw length (u32) | CRC-32 (u32) of the header (with this CRC as 0) and the payload
//!   32 the record's own logical position (a stale record of an earlier lap of the ring has
//!      another one)   40.. payload (encoded ops, `log.rs`), padded to 8
//! heap pages (kind HEAP, value = table id): slots of 16 + row (rounded to 8) bytes:
//!   0 key   8 state (LIVE, or 0: free)   16.. row
//! ```

/// Page kinds (page-manager tags).
pub mod kind {
    /// The meta page.
    pub const META: u8 = 1;
    /// A page of the log ring; value = its number in the ring.
    pub const LOG: u8 = 2;
    /// A heap page; value = the table id.
    pub const HEAP: u8 = 3;
}

/// Meta page fields.
pub mod meta {
    /// Magic of the meta page.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PMTXDUD1");
    /// Layout version.
    pub const VERSION: u64 = 1;
    /// The fixed words (magic, version, row limit, catalog, log ring, CRC), shared with the
    /// other engines on a log ring.
    pub use crate::engine::wal::ring_meta::*;
    /// The durable id word (own cache line).
    pub const DURABLE: u64 = 1 << 20;
    /// The last truncated id (own cache line).
    pub const HEAD_SEQ: u64 = DURABLE + 64;
    /// The truncation position (own cache line).
    pub const HEAD_POS: u64 = DURABLE + 128;
}

/// Heap slot fields.
pub mod slot {
    /// The key.
    pub const KEY: u64 = 0;
    /// The state word.
    pub const STATE: u64 = 8;
    /// Header bytes; the row follows.
    pub const HEADER: u64 = 16;
    /// The state of a slot holding a live row.
    pub const LIVE: u64 = 0x4C49_5645; // "LIVE"

    /// Slot bytes for rows of `row` bytes.
    pub fn size(row: usize) -> u64 {
        HEADER + (row as u64).div_ceil(8) * 8
    }
}
