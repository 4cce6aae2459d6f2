//! MMDB's persistent layout: the meta page (parameters, catalog, the valid-checkpoint word and
//! two checkpoint descriptors, the open epoch), the log ring (`engine::wal`, records of whole
//! transactions' redo) and checkpoint pages (one generation's snapshot of every table).
//!
//! ```text
//! meta page (kind META, the pool root):
//!   0 magic "PMTXMMD1"   8 version   16 max_row_bytes   24 catalog slot bytes   32 log pages
//!   40 CRC-32 of bytes 0..4096        4096.. catalog slots A and B
//!   1 MiB        CURRENT: the generation of the valid checkpoint (0: none yet, the tables empty)
//!   1 MiB + 64   EPOCH: how many times the pool was opened (stamped in every log record)
//!   1 MiB + 128 + 64 × (generation % 2): the descriptor of a checkpoint generation:
//!                0 generation   8 covered id (every transaction up to it is in the snapshot)
//!                16 log position the replay starts from   24 snapshot bytes   32 pages
//!                40 CRC-32 of the snapshot   48 CRC-32 of bytes 0..48
//! log pages (kind LOG, value = number in the ring): `wal` records; a payload is
//!   0 epoch   then per transaction: id (u64), length (u32), encoded ops (`dudetx::log`)
//! checkpoint pages (kind CHECKPOINT, value = (generation mod 2^16) << 16 | page number): the
//!   snapshot, every live row as a `dudetx::log` put op, laid end to end over the pages
//! ```

/// Page kinds (page-manager tags).
pub mod kind {
    /// The meta page.
    pub const META: u8 = 1;
    /// A page of the log ring; value = its number in the ring.
    pub const LOG: u8 = 2;
    /// A checkpoint page; value = generation (mod 2^16) << 16 | page number.
    pub const CHECKPOINT: u8 = 3;
}

/// Meta page fields.
pub mod meta {
    /// Magic of the meta page.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PMTXMMD1");
    /// Layout version.
    pub const VERSION: u64 = 1;
    /// The fixed words (magic, version, row limit, catalog, log ring, CRC), shared with the
    /// other engines on a log ring.
    pub use crate::engine::wal::ring_meta::*;
    /// The valid checkpoint's generation (own cache line): the one 8-byte store that makes a
    /// checkpoint valid.
    pub const CURRENT: u64 = 1 << 20;
    /// The open epoch (own cache line).
    pub const EPOCH: u64 = CURRENT + 64;
    /// The descriptor of generation `g`.
    pub const fn descriptor(g: u64) -> u64 {
        CURRENT + 128 + 64 * (g % 2)
    }
}

/// Checkpoint descriptor fields (offsets within a descriptor).
pub mod desc {
    /// The generation.
    pub const GENERATION: u64 = 0;
    /// The covered id.
    pub const COVERED: u64 = 8;
    /// The log position replay starts from.
    pub const LOG_POS: u64 = 16;
    /// Snapshot bytes.
    pub const BYTES: u64 = 24;
    /// Checkpoint pages.
    pub const PAGES: u64 = 32;
    /// CRC-32 of the snapshot.
    pub const DATA_CRC: u64 = 40;
    /// CRC-32 of the fields before it.
    pub const CRC: u64 = 48;
    /// Bytes of a descriptor.
    pub const LEN: u64 = 56;
}

/// The page tag value of page `n` of checkpoint generation `g`.
pub fn checkpoint_tag(g: u64, n: u64) -> u64 {
    (g & 0xFFFF) << 16 | n
}
