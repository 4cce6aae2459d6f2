//! FIR's persistent layout (FIR §4.1): the meta page with the LCTT, and the blocks of
//! time-ordered tuple content.
//!
//! ```text
//! meta page (kind META, found from the pool root):
//!   0 magic "PMTXFIR1"   8 version   16 max_threads   24 max_row_bytes   32 catalog slot bytes
//!   40 CRC-32 of bytes 0..4096   48 slots per block (0: as many as fit, up to 65,536)
//!   4096.. catalog slots A and B
//!   1 MiB.. LCTT: one 8-byte word per thread slot, the txnId of its last committed transaction
//!           (eight threads share a 64-byte line, so one write-back carries up to eight commit
//!           signals: §4.2.1's group commit)
//!   1 MiB + 4 KiB: the generation of the valid index leaf checkpoint (0: none)
//!   1 MiB + 8 KiB: two checkpoint directory slots of 64 KiB (generation g uses slot g % 2)
//!   1 MiB + 256 KiB: the GC free record (§4.5): 0 count, 8.. (page, page tag word) pairs of
//!           blocks being freed; recovery finishes freeing the listed pages that still carry
//!           their tag
//! block pages (kind BLOCK, owner = the thread whose region the page belongs to,
//! value = table id << 20 | sequence number of the page in the region):
//!   fixed-size tuple_content slots, 16-byte aligned, appended in commit-time order:
//!   0 word: bit 63 TOMBSTONE, bits 0..63 txnId (the transaction's MVTO timestamp; 0 = empty)
//!   8 tuple id (the primary key)
//!   16.. row
//! ```
//!
//! A block here is one 2 MiB page of the page manager (the paper's block is 2,048 slots); its
//! update_map and its tile of tuple headers live in DRAM (see `storage.rs`).

/// Page kinds of the FIR layout (page-manager tags).
pub mod kind {
    /// The meta page: layout parameters, the catalog and the LCTT.
    pub const META: u8 = 1;
    /// A block of tuple contents; owner = region (thread), value = table << 20 | sequence.
    pub const BLOCK: u8 = 2;
    /// A page of an index leaf checkpoint (the directory in the meta page orders them).
    pub const CHECKPOINT: u8 = 3;
}

/// Index leaf checkpoints (§4.1 "Index Checkpoint", §4.3): pages of entries sorted by
/// (table, key), each page a contiguous run, and a directory naming the pages in order.
///
/// ```text
/// checkpoint page (kind CHECKPOINT, value = 0):
///   0 the generation that wrote it   8 entries in this page
///   64.. entries of 32 bytes: table, key, txnId, logical address of the version
/// directory slot (two in the meta page, at DIR_AT + (generation % 2) * DIR_SLOT_BYTES):
///   0 generation   8 CT: every transaction with a smaller txnId had ended when the checkpoint
///   read the index   16 entries in the whole checkpoint   24 pages   32 kind (0 full,
///   1 incremental)   40 wall-clock time it was published (ms since the Unix epoch)
///   48 µs it took   64.. the pages' indices, in key order
/// ```
///
/// An incremental checkpoint (Algorithm 2's MergeAndPersist) rewrites only the pages whose key
/// range holds a marked key and names the others again: a page can belong to several
/// generations, which is why the directory, not the page, carries CT.
pub mod checkpoint {
    /// The generation that wrote the page.
    pub const GEN: u64 = 0;
    /// Entries in the page.
    pub const COUNT: u64 = 8;
    /// Where the entries start in a page.
    pub const FIRST_ENTRY: u64 = 64;
    /// Bytes per entry.
    pub const ENTRY: u64 = 32;
    /// Entries per page.
    pub const PER_PAGE: u64 = (crate::alloc::PAGE_SIZE - FIRST_ENTRY) / ENTRY;
    /// Directory: generation field.
    pub const DIR_GEN: u64 = 0;
    /// Directory: CT field.
    pub const DIR_CT: u64 = 8;
    /// Directory: total entries field.
    pub const DIR_ENTRIES: u64 = 16;
    /// Directory: page count field.
    pub const DIR_PAGES: u64 = 24;
    /// Directory: kind field (0 full, 1 incremental).
    pub const DIR_KIND: u64 = 32;
    /// Directory: when the checkpoint was published, in ms since the Unix epoch (0 in a pool a
    /// build before it wrote: unknown). Recovery reports the checkpoint's age from it.
    pub const DIR_PUBLISHED_MS: u64 = 40;
    /// Directory: how long the checkpoint took, in µs (0: unknown, as above).
    pub const DIR_TOOK_US: u64 = 48;
    /// Directory: where the page indices start.
    pub const DIR_FIRST: u64 = 64;
    /// Bytes per directory slot.
    pub const DIR_SLOT_BYTES: u64 = 64 * 1024;
    /// Most pages a checkpoint has (about 16 GiB of entries).
    pub const MAX_PAGES: u64 = (DIR_SLOT_BYTES - DIR_FIRST) / 8;
}

/// Bits of a block page's tag value that number the page within its region.
pub const SEQ_BITS: u32 = 20;

/// Meta page fields.
pub mod meta {
    /// Magic of the meta page.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PMTXFIR1");
    /// Layout version (3: the GC free record and the slots-per-block field).
    pub const VERSION: u64 = 3;
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
    /// Slots per block field (0: as many as fit in the page, at most 65,536).
    pub const F_BLOCK_SLOTS: u64 = 48;
    /// Where the catalog slots start within the meta page.
    pub const CATALOG_AT: u64 = 4096;
    /// Bytes per catalog slot.
    pub const CATALOG_SLOT_BYTES: u64 = 256 * 1024;
    /// Where the LCTT starts within the meta page (after both catalog slots).
    pub const LCTT_AT: u64 = 1 << 20;
    /// The generation of the valid index leaf checkpoint (0: none), after the LCTT's 256 words.
    pub const CKPT_GEN: u64 = LCTT_AT + 4096;
    /// The two checkpoint directory slots (`checkpoint::DIR_*`), after the generation word.
    pub const DIR_AT: u64 = LCTT_AT + 8192;
    /// The GC free record (§4.5): a count word, then (page index, tag word) pairs.
    pub const GC_AT: u64 = LCTT_AT + (256 << 10);
    /// Most blocks one GC free record lists.
    pub const GC_MAX: u64 = 4096;
}

/// tuple_content fields and helpers.
pub mod tuple {
    /// The word holding TOMBSTONE and the txnId.
    pub const WORD: u64 = 0;
    /// The tuple id (primary key).
    pub const KEY: u64 = 8;
    /// Header bytes; the row follows.
    pub const HEADER: u64 = 16;
    /// This version is a deletion.
    pub const TOMBSTONE: u64 = 1 << 63;
    /// The txnId bits.
    pub const TXN_MASK: u64 = TOMBSTONE - 1;

    /// Slot size for rows of `row` bytes: header + row, rounded to 16 bytes.
    pub fn slot_size(row: usize) -> u64 {
        (HEADER + row as u64).div_ceil(16) * 16
    }
}
