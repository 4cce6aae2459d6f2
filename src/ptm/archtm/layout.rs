//! ArchTM's persistent layout (§5.1, Figure 4).
//!
//! ```text
//! meta page (kind META, found from the pool root): the metadata area
//!   0 magic "PMTXATM1"  8 version  16 max_threads  24 salt  32 root object bytes
//!   40 catalog slot bytes  48 CRC-32 of bytes 0..4096   4096.. (an empty catalog: meta::format)
//!   64 KiB: the root object's handle (0 until creation finished)
//!   128 KiB: the TxState table: one 64-byte line per thread slot, then one for the engine's
//!            reserved slot (its own transactions: defragmentation, the root's creation),
//!            word 0 = txid << 2 | state: the slot's last committed txid (COMMITTED; END, 0:
//!            none yet), word 1 = its commit id
//!   192 KiB: CHKP (§5.6, `chkp`): the epoch (0: none), the epoch whose diff overflowed,
//!            at +64 the ids each copy covers (copy 0, copy 1)
//!   256 KiB: CHKP-diff: two arrays (by epoch parity) of 16 384 32-byte records
//!            (chunk offset, bytes, epoch, check)
//! CHKP pages (kind CHKP, tag value = copy << 31 | chunk): 65 536 entries of 32 bytes
//!   (committed version's offset (0: free id), generation << 32 | size, txid, 0)
//! large-object pages (kind LARGE; tag value 0: a version's head page, 1: a tail page): §4.4's
//!   regular data path for objects too large for a data page. Head page: the 32-byte header
//!   below, at 32 the count of tail pages and their offsets, the payload from 4096 on, then
//!   on in each tail page, whole.
//! data pages (kind DATA, owner = the slot that fetched the page): the user data area.
//!   Objects in 64-byte blocks (§4.5's size class), each:
//!   0 id (bits 0..32) | generation (bits 32..64)   8 payload bytes (0..32) | flags (32..64)
//!   16 txid of the transaction that wrote this version (§4.2's annotation)
//!   24 check: a hash of words 0..3, the block's offset and the pool's salt
//!   32.. payload
//! ```
//!
//! The check word departs from the paper, which trusts "object ID and size" to find objects: a
//! version whose header was torn by a crash, a zeroed-then-reused block, or payload bytes that
//! happen to look like a header would otherwise be read as an object by the recovery scan.

/// Page kinds of the ArchTM layout (page-manager tags).
pub mod kind {
    /// The meta page.
    pub const META: u8 = 1;
    /// A page of the user data area (one allocator segment).
    pub const DATA: u8 = 2;
    /// A page of a lookup-table checkpoint copy (§5.6).
    pub const CHKP: u8 = 3;
    /// A page of a large object's version (§4.4's regular data path).
    pub const LARGE: u8 = 4;
}

/// The large-object area (§4.4's regular data path): a version larger than a data page holds
/// takes whole pages of its own, a head page and tail pages.
pub mod large {
    use crate::alloc::PAGE_SIZE;
    /// Tag value of a head page.
    pub const HEAD: u64 = 0;
    /// Tag value of a tail page.
    pub const TAIL: u64 = 1;
    /// The page list in the head page: the tail count, then the tail pages' offsets.
    pub const LIST: u64 = 32;
    /// Where the payload starts in the head page.
    pub const PAYLOAD: u64 = 4096;
    /// Tail pages of one version at most (the list fits below `PAYLOAD`).
    pub const MAX_TAIL: u64 = 255;
    /// Payload bytes of the head page.
    pub const HEAD_BYTES: u64 = PAGE_SIZE - PAYLOAD;
}

/// The largest object the locality-aware path (a block within one data page) takes.
pub const MAX_SMALL: u64 = crate::alloc::PAGE_SIZE - header::BYTES;
/// The largest object: a head page and `large::MAX_TAIL` tail pages of payload.
pub const MAX_LARGE: u64 = large::HEAD_BYTES + large::MAX_TAIL * crate::alloc::PAGE_SIZE;

/// Whether an object of `size` bytes takes the large-object path.
pub fn is_large(size: u64) -> bool {
    size > MAX_SMALL
}

/// Pages of a large version of `size` bytes (head included).
pub fn large_pages(size: u64) -> u64 {
    1 + size
        .saturating_sub(large::HEAD_BYTES)
        .div_ceil(crate::alloc::PAGE_SIZE)
}

/// The meta page's words.
pub mod meta {
    /// Magic word (written last by `meta::format`).
    pub const F_MAGIC: u64 = 0;
    /// Layout version.
    pub const F_VERSION: u64 = 8;
    /// Thread slots.
    pub const F_MAX_THREADS: u64 = 16;
    /// The salt of header checks.
    pub const F_SALT: u64 = 24;
    /// Bytes of the root object.
    pub const F_ROOT_SIZE: u64 = 32;
    /// Catalog slot bytes.
    pub const F_CATALOG_SLOT: u64 = 40;
    /// CRC of the checked bytes.
    pub const F_CRC: u64 = 48;
    /// The magic value.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PMTXATM1");
    /// The layout version this build writes (3: CHKP-diff of 16 384 chunk records, the
    /// engine's reserved TxState slot; 4: TxState holds the slot's last committed txid, and
    /// no BEGIN).
    pub const VERSION: u64 = 4;
    /// Where the (empty) catalog starts.
    pub const CATALOG_AT: u64 = 4096;
    /// Bytes per catalog slot.
    pub const CATALOG_SLOT_BYTES: u64 = 4096;
    /// The root handle word.
    pub const ROOT_HANDLE: u64 = 64 << 10;
    /// The TxState table.
    pub const TXSTATE: u64 = 128 << 10;
    /// Bytes per TxState entry (one cache line: no false sharing between threads).
    pub const TXSTATE_STRIDE: u64 = 64;
    /// The checkpoint epoch word (§5.6).
    pub const CHKP_EPOCH: u64 = 192 << 10;
    /// The epoch whose CHKP-diff overflowed (recovery then scans every data page).
    pub const CHKP_OVERFLOW: u64 = CHKP_EPOCH + 8;
    /// Ids covered by CHKP copy 0 and copy 1 (two words).
    pub const CHKP_NEXT_ID: u64 = CHKP_EPOCH + 64;
    /// The two CHKP-diff arrays.
    pub const DIFF: u64 = 256 << 10;
}

/// Object header fields (offsets within a block).
pub mod header {
    /// id | generation << 32.
    pub const ID_GEN: u64 = 0;
    /// payload bytes | flags << 32.
    pub const SIZE_FLAGS: u64 = 8;
    /// The writer's txid.
    pub const TXID: u64 = 16;
    /// The check word.
    pub const CHECK: u64 = 24;
    /// Header bytes; the payload follows.
    pub const BYTES: u64 = 32;
    /// Flag: this version is a tombstone (the object was freed by its transaction).
    pub const TOMB: u64 = 1;
}

/// TxState states (§5.1). Only COMMITTED is ever stored: a slot's word names its last
/// committed txid, so every copy of the slot with that txid or an earlier one is committed
/// and every later one is not (`super` explains why no BEGIN is needed).
pub mod state {
    /// The slot never committed (the word is 0): none of its copies is committed.
    pub const END: u64 = 0;
    /// The word's txid committed, and so did (or aborted, copies invalidated) every earlier
    /// transaction of the slot.
    pub const COMMITTED: u64 = 2;
}

/// The allocation unit and size class (§4.5).
pub const BLOCK: u64 = 64;

/// Bytes of the block holding a version of `size` payload bytes.
pub fn block_bytes(size: u64) -> u64 {
    (header::BYTES + size).div_ceil(BLOCK) * BLOCK
}

/// The check word of a header at pool offset `off`.
pub fn check(w0: u64, w1: u64, w2: u64, off: u64, salt: u64) -> u64 {
    let mut h = salt ^ 0x9e37_79b9_7f4a_7c15;
    for w in [w0, w1, w2, off] {
        h ^= w;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 29;
    }
    h | 1
}

/// A decoded object header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Object id (index of the lookup table).
    pub id: u32,
    /// Generation (the handle's upper half).
    pub gen: u32,
    /// Payload bytes.
    pub size: u64,
    /// Tombstone.
    pub tomb: bool,
    /// The writer's txid.
    pub txid: u64,
}

impl Header {
    /// The four header words of this header at `off`.
    pub fn encode(&self, off: u64, salt: u64) -> [u8; 32] {
        let w0 = u64::from(self.id) | u64::from(self.gen) << 32;
        let w1 = self.size | if self.tomb { header::TOMB << 32 } else { 0 };
        let w3 = check(w0, w1, self.txid, off, salt);
        let mut b = [0u8; 32];
        for (i, w) in [w0, w1, self.txid, w3].into_iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Decodes the header bytes `b` found at `off`; `None` unless the check matches and the
    /// fields are sane (a non-zero generation and txid, a known flag, a size below `max_size`).
    pub fn decode(b: &[u8], off: u64, salt: u64, max_size: u64) -> Option<Header> {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let (w0, w1, w2, w3) = (w(0), w(1), w(2), w(3));
        if w3 == 0 || check(w0, w1, w2, off, salt) != w3 {
            return None;
        }
        let h = Header {
            id: w0 as u32,
            gen: (w0 >> 32) as u32,
            size: w1 & 0xffff_ffff,
            tomb: (w1 >> 32) & header::TOMB != 0,
            txid: w2,
        };
        let sane =
            h.gen != 0 && h.txid != 0 && (w1 >> 32) & !header::TOMB == 0 && h.size <= max_size;
        sane.then_some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_refuse_damage_or_another_place() {
        let h = Header {
            id: 7,
            gen: 3,
            size: 24,
            tomb: false,
            txid: 99 << 8,
        };
        let b = h.encode(4096, 42);
        assert_eq!(Header::decode(&b, 4096, 42, 1 << 20), Some(h));
        assert_eq!(
            Header::decode(&b, 4160, 42, 1 << 20),
            None,
            "another offset"
        );
        assert_eq!(Header::decode(&b, 4096, 43, 1 << 20), None, "another pool");
        for i in 0..32 {
            let mut d = b;
            d[i] ^= 1;
            assert_eq!(Header::decode(&d, 4096, 42, 1 << 20), None, "byte {i}");
        }
        assert_eq!(Header::decode(&[0; 32], 4096, 42, 1 << 20), None);
        assert_eq!(block_bytes(24), 64);
        assert_eq!(block_bytes(33), 128);
        assert_eq!(block_bytes(0), 64);
    }
}
