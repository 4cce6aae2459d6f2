//! Falcon's persistent layout: the meta page, the tuple header, and the log window slots.
//!
//! ```text
//! meta page (kind META, found from the pool root):
//!   0  magic "PMTXFALC"   8 version   16 max_threads   24 window_slots   32 window_slot_bytes
//!   40 max_row_bytes      48 catalog slot bytes        56 CRC-32 of bytes 0..4096
//!   4096.. catalog slots A and B
//!   1 MiB - 64: the tid lease (see `meta::TID_LEASE_AT`)
//!   1 MiB..: one word per table, the root of its PM primary index (0: DRAM index)
//!   1.5 MiB..: eight words per table, the roots of its PM secondary indexes
//! tuple slot (heap pages, kind HEAP, tag value = table id; Falcon §5.1 "Tuple Heap"):
//!   0  cc word (OCC version | lock bit, or 2PL lock word)   8 write_ts (commit tid of the last
//!   writer: recovery's replay filter)   16 key   24 flags (LIVE, DELETED)   32.. row
//! window (one page per thread, kind WINDOW, owner = thread): `window_slots` slots of
//! `window_slot_bytes`, each:
//!   0 state   8 commit tid   16 payload bytes   24 crc32 (ADR only)   32 spill page chain head
//!   64.. payload: entries (see window.rs)
//! ```

/// Page kinds of the Falcon layout (page-manager tags).
pub mod kind {
    /// The meta page: layout parameters and the catalog.
    pub const META: u8 = 1;
    /// Tuple heap pages; the tag value is the table id.
    pub const HEAP: u8 = 2;
    /// A thread's log window.
    pub const WINDOW: u8 = 3;
    /// A thread's spill log for transactions whose redo does not fit a window slot; the tag value
    /// is the page's position in the thread's spill chain.
    pub const SPILL: u8 = 4;
    /// A table's persistent index (issue 17); the tag value is the table id, the owner 0 for
    /// the primary index and `1 + i` for secondary index `i`.
    pub const INDEX: u8 = 5;
}

/// Meta page fields.
pub mod meta {
    /// Magic of the meta page.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PMTXFALC");
    /// Layout version (2: the meta page carries a CRC; 3: PM index roots and the tid lease;
    /// 4: a PM table's secondary indexes in PM, with their roots).
    pub const VERSION: u64 = 4;
    /// Field offsets.
    pub const F_MAGIC: u64 = 0;
    /// Version field.
    pub const F_VERSION: u64 = 8;
    /// Max threads field.
    pub const F_MAX_THREADS: u64 = 16;
    /// Window slots per thread.
    pub const F_WINDOW_SLOTS: u64 = 24;
    /// Bytes per window slot.
    pub const F_WINDOW_SLOT_BYTES: u64 = 32;
    /// Max row bytes.
    pub const F_MAX_ROW: u64 = 40;
    /// Catalog slot bytes.
    pub const F_CATALOG_SLOT: u64 = 48;
    /// CRC-32 of the meta page's first 4 KiB (see `engine::meta`).
    pub const F_CRC: u64 = 56;
    /// Where the catalog slots start within the meta page.
    pub const CATALOG_AT: u64 = 4096;
    /// Bytes per catalog slot.
    pub const CATALOG_SLOT_BYTES: u64 = 256 * 1024;
    /// The tid lease: every commit tid's timestamp is below it (see `recovery.rs`), so recovery
    /// restarts the clock above it without reading a tuple. One word, outside the CRC-checked
    /// first 4 KiB, written with one atomic store.
    pub const TID_LEASE_AT: u64 = (1 << 20) - 64;
    /// Where the PM index roots start: the word at `ROOTS_AT + 8 * table` is the root offset of
    /// the table's persistent index, written durably before the catalog that names the table.
    pub const ROOTS_AT: u64 = 1 << 20;
    /// Root words in the meta page.
    const ROOT_WORDS: u64 = (crate::alloc::PAGE_SIZE - ROOTS_AT) / 8;
    /// Secondary-index root words per table: a PM table has at most this many secondaries.
    pub const SECONDARY_ROOTS: u64 = 8;
    /// Tables whose root words fit the meta page (half the words are primary roots, half
    /// secondary ones).
    pub const MAX_ROOTS: u64 = ROOT_WORDS / 2 / SECONDARY_ROOTS;

    /// The root word of table `table`'s primary index.
    pub fn primary_root_at(table: u64) -> u64 {
        ROOTS_AT + 8 * table
    }

    /// The root word of table `table`'s secondary index `index`.
    pub fn secondary_root_at(table: u64, index: u64) -> u64 {
        ROOTS_AT + 8 * (ROOT_WORDS / 2 + table * SECONDARY_ROOTS + index)
    }
}

/// Tuple header fields.
pub mod tuple {
    /// Concurrency-control word.
    pub const CC: u64 = 0;
    /// Commit tid of the last writer.
    pub const WRITE_TS: u64 = 8;
    /// Primary key.
    pub const KEY: u64 = 16;
    /// Flags word.
    pub const FLAGS: u64 = 24;
    /// Header bytes; the row follows.
    pub const HEADER: u64 = 32;
    /// The slot holds a row.
    pub const LIVE: u64 = 1;
    /// The row was deleted (the slot is reusable once no reader can see it, Falcon §5.4).
    pub const DELETED: u64 = 2;
    /// The flags of a deleted row: `LIVE | DELETED`.
    pub const DELETED_ROW: u64 = LIVE | DELETED;

    /// Slot size for rows of `row` bytes: header + row, rounded to 16 bytes.
    pub fn slot_size(row: usize) -> u64 {
        (HEADER + row as u64).div_ceil(16) * 16
    }
}

/// Window slot fields.
pub mod slot {
    /// State word.
    pub const STATE: u64 = 0;
    /// Commit tid.
    pub const TID: u64 = 8;
    /// Payload length in bytes.
    pub const LEN: u64 = 16;
    /// CRC-32 over tid, length and payload (written under ADR, where one fence covers the payload
    /// and the state together, so recovery must detect a torn slot).
    pub const CRC: u64 = 24;
    /// Whether the payload lives in the spill chain (1) or inline (0).
    pub const SPILLED: u64 = 32;
    /// Slot header bytes; the payload follows.
    pub const HEADER: u64 = 64;

    /// Free or never used.
    pub const FREE: u64 = 0;
    /// Committed, payload inline or spilled, no CRC (eADR: stores are durable in order).
    pub const COMMITTED: u64 = 0xC0A1;
    /// Committed, with a CRC to check (ADR).
    pub const COMMITTED_CRC: u64 = 0xC0A2;
}
