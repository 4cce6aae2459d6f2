//! A redo log on PM shared by the engines that keep one (DUDETx §3.3, MMDB): a ring of 2 MiB
//! pages addressed by a logical position that only grows, holding CRC'd records.
//!
//! ```text
//! A record, 8-aligned, at logical position p (byte p % capacity of the ring):
//!   0 stored length (u32) | flags (u32, bit 0: LZ4)   8 first id   16 last id
//!   24 raw length (u32) | CRC-32 (u32) of the header (with this CRC as 0) and the payload
//!   32 the record's own logical position (a stale record of an earlier lap of the ring has
//!      another one)   40.. payload (the engine's encoded redo), padded to 8
//! ```
//!
//! A record is taken back only when its position word names the place it is read from and its
//! CRC matches: a torn record (a crash in the middle of its write-back under ADR), a stale one
//! (an earlier lap) and never-written space all read as "no record", which is where a recovery's
//! replay stops.

use crate::alloc::{PageManager, PageTag, PAGE_SIZE};
use crate::engine::DbError;
use crate::pmem::Pool;

/// The fixed words of the meta page of an engine on a catalog and a log ring (DUDETx, MMDB): the
/// same offsets in both. Each engine has its own magic, version and page kind, and its own words
/// from 1 MiB on (its `layout::meta`, which re-exports these).
pub mod ring_meta {
    /// Magic field.
    pub const F_MAGIC: u64 = 0;
    /// Version field.
    pub const F_VERSION: u64 = 8;
    /// Max row bytes field.
    pub const F_MAX_ROW: u64 = 16;
    /// Catalog slot bytes field.
    pub const F_CATALOG_SLOT: u64 = 24;
    /// Log ring pages field.
    pub const F_LOG_PAGES: u64 = 32;
    /// CRC-32 of the first 4 KiB.
    pub const F_CRC: u64 = 40;
    /// Where the catalog slots start.
    pub const CATALOG_AT: u64 = 4096;
    /// Bytes per catalog slot.
    pub const CATALOG_SLOT_BYTES: u64 = 256 * 1024;
}

/// Log record header fields.
pub mod record {
    /// Stored length | flags.
    pub const LEN: usize = 0;
    /// First transaction id.
    pub const FIRST: usize = 8;
    /// Last transaction id.
    pub const LAST: usize = 16;
    /// Raw length | CRC.
    pub const RAW_CRC: usize = 24;
    /// The record's logical position.
    pub const POS: usize = 32;
    /// Header bytes.
    pub const HEADER: usize = 40;
    /// Flag: the payload is LZ4-compressed.
    pub const LZ4: u32 = 1;
}

/// Compresses a payload with LZ4; `None` when that would not make it smaller.
pub fn lz4_compress(raw: &[u8]) -> Option<Vec<u8>> {
    let mut packed = Vec::new();
    let len = lz4_compress_into(raw, &mut packed)?;
    packed.truncate(len);
    Some(packed)
}

/// [`lz4_compress`] into `packed` (grown as needed, reused across calls so that a persist step
/// allocates nothing): the compressed length, `None` when that would not be smaller.
fn lz4_compress_into(raw: &[u8], packed: &mut Vec<u8>) -> Option<usize> {
    let bound = lz4_flex::block::get_maximum_output_size(raw.len());
    if packed.len() < bound {
        packed.resize(bound, 0);
    }
    let len = lz4_flex::block::compress_into(raw, packed).ok()?;
    (len < raw.len()).then_some(len)
}

/// Decompresses what [`lz4_compress`] made, whose raw length is `raw_len`.
pub fn lz4_decompress(packed: &[u8], raw_len: usize) -> Result<Vec<u8>, String> {
    lz4_flex::block::decompress(packed, raw_len).map_err(|e| format!("lz4: {e}"))
}

/// The log ring: pages in ring order; logical position p is byte p % capacity.
pub(crate) struct LogRing {
    /// Page offsets, by number in the ring.
    pub pages: Vec<u64>,
}

impl LogRing {
    /// Bytes the ring holds.
    pub fn capacity(&self) -> u64 {
        self.pages.len() as u64 * PAGE_SIZE
    }

    /// The pieces `[pos, pos + len)` occupies: (pool offset, offset in the range, length). An
    /// iterator, not a Vec: it runs on every record a sync commit waits for.
    fn pieces(&self, pos: u64, len: u64) -> impl Iterator<Item = (u64, usize, u64)> + '_ {
        let capacity = self.capacity();
        let mut done = 0;
        std::iter::from_fn(move || {
            if done >= len {
                return None;
            }
            let at = (pos + done) % capacity;
            let in_page = at % PAGE_SIZE;
            let n = (PAGE_SIZE - in_page).min(len - done);
            let piece = (
                self.pages[(at / PAGE_SIZE) as usize] + in_page,
                done as usize,
                n,
            );
            done += n;
            Some(piece)
        })
    }

    /// Writes `bytes` at logical position `pos`.
    pub fn write(&self, pool: &Pool, pos: u64, bytes: &[u8]) {
        for (off, from, n) in self.pieces(pos, bytes.len() as u64) {
            pool.write_bytes(off, &bytes[from..from + n as usize]);
        }
    }

    /// Writes back `[pos, pos + len)` (no fence).
    pub fn flush(&self, pool: &Pool, pos: u64, len: u64) {
        for (off, _, n) in self.pieces(pos, len) {
            pool.flush(off, n);
        }
    }

    /// Reads `len` bytes at logical position `pos`.
    pub fn read(&self, pool: &Pool, pos: u64, len: u64) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        for (off, from, n) in self.pieces(pos, len) {
            pool.read_bytes(off, &mut out[from..from + n as usize]);
        }
        out
    }
}

/// A record as the ring holds it, built from a group's combined log.
pub(crate) fn build_record(first: u64, last: u64, pos: u64, raw: &[u8], compress: bool) -> Vec<u8> {
    let mut rec = Vec::new();
    build_record_into(&mut rec, &mut Vec::new(), [first, last, pos], raw, compress);
    rec
}

/// [`build_record`] of ids `first..=last` at log position `pos` into `rec` (its old bytes replaced),
/// with `packed` as LZ4's scratch: both are reused across records, so that building one
/// allocates nothing once they have grown (it is on a sync commit's path).
pub(crate) fn build_record_into(
    rec: &mut Vec<u8>,
    packed: &mut Vec<u8>,
    [first, last, pos]: [u64; 3],
    raw: &[u8],
    compress: bool,
) {
    let packed_len = if compress {
        lz4_compress_into(raw, packed)
    } else {
        None
    };
    let (payload, flags) = match packed_len {
        Some(len) => (&packed[..len], record::LZ4),
        None => (raw, 0),
    };
    let total = (record::HEADER + payload.len()).div_ceil(8) * 8;
    rec.clear();
    rec.resize(total, 0);
    let put = |rec: &mut [u8], at: usize, v: u64| rec[at..at + 8].copy_from_slice(&v.to_le_bytes());
    put(
        rec,
        record::LEN,
        payload.len() as u64 | u64::from(flags) << 32,
    );
    put(rec, record::FIRST, first);
    put(rec, record::LAST, last);
    put(rec, record::RAW_CRC, raw.len() as u64);
    put(rec, record::POS, pos);
    rec[record::HEADER..record::HEADER + payload.len()].copy_from_slice(payload);
    let crc = record_crc(rec);
    put(
        rec,
        record::RAW_CRC,
        raw.len() as u64 | u64::from(crc) << 32,
    );
}

/// Whether a record [`build_record`] made holds an LZ4-compressed payload.
pub(crate) fn is_compressed(rec: &[u8]) -> bool {
    let word = u64::from_le_bytes(
        rec[record::LEN..record::LEN + 8]
            .try_into()
            .expect("8 bytes"),
    );
    (word >> 32) as u32 & record::LZ4 != 0
}

/// CRC-32 of a record with its CRC half-word taken as zero.
fn record_crc(rec: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&rec[..record::RAW_CRC + 4]);
    h.update(&[0u8; 4]);
    h.update(&rec[record::RAW_CRC + 8..]);
    h.finalize()
}

/// A record read back from the ring.
pub(crate) struct ParsedRecord {
    pub first: u64,
    pub last: u64,
    /// Bytes it takes in the ring.
    pub len: u64,
    /// The payload, decompressed.
    pub raw: Vec<u8>,
}

/// The intact record written at logical position `pos`, if there is one (a torn, stale or
/// never-written one is `None`).
pub(crate) fn parse_record(ring: &LogRing, pool: &Pool, pos: u64) -> Option<ParsedRecord> {
    let header = ring.read(pool, pos, record::HEADER as u64);
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    if word(record::POS) != pos {
        return None;
    }
    let stored = word(record::LEN) & 0xFFFF_FFFF;
    let flags = (word(record::LEN) >> 32) as u32;
    let raw_len = word(record::RAW_CRC) & 0xFFFF_FFFF;
    let crc = (word(record::RAW_CRC) >> 32) as u32;
    let total = (record::HEADER as u64 + stored).div_ceil(8) * 8;
    if total > ring.capacity() || raw_len > ring.capacity() * 256 {
        return None;
    }
    let rec = ring.read(pool, pos, total);
    if record_crc(&rec) != crc {
        return None;
    }
    let payload = &rec[record::HEADER..record::HEADER + stored as usize];
    let raw = if flags & record::LZ4 != 0 {
        lz4_decompress(payload, raw_len as usize).ok()?
    } else {
        payload.to_vec()
    };
    Some(ParsedRecord {
        first: word(record::FIRST),
        last: word(record::LAST),
        len: total,
        raw,
    })
}

/// The most 2 MiB pages a log ring may have.
pub(crate) const MAX_RING_PAGES: usize = 4096;

/// Refuses a configured ring size above [`MAX_RING_PAGES`]; `engine` names the engine.
pub(crate) fn check_ring_pages(requested: usize, engine: &str) -> Result<(), DbError> {
    if requested > MAX_RING_PAGES {
        return Err(DbError::Config(format!(
            "the {engine} log ring must have at most {MAX_RING_PAGES} pages of 2 MiB (0: sized from the pool), not {requested}"
        )));
    }
    Ok(())
}

/// The ring's pages: `requested`, or for 0 a quarter of the pool's pages, 1 to `auto_max`, so
/// that a small pool keeps room for what else it holds.
pub(crate) fn ring_size(pool: &Pool, requested: usize, auto_max: usize) -> usize {
    if requested != 0 {
        return requested;
    }
    let pool_pages = (pool.len() / crate::alloc::PAGE_SIZE) as usize;
    (pool_pages / 4).clamp(1, auto_max)
}

/// The log ring's pages, tagged `(kind, owner 0, value = number in the ring)`; `create`
/// allocates them. A pool whose formatting a crash interrupted (the ring incomplete while the log
/// was never used) gets the missing pages. `engine` names the engine in errors.
pub(crate) fn ring_pages(
    pool: &Pool,
    pages: &PageManager,
    kind: u8,
    count: usize,
    create: bool,
    engine: &str,
) -> Result<LogRing, DbError> {
    if create {
        allocate(pool, pages, kind, 0, count)?;
    }
    let mut found: Vec<(u64, u64)> = pages
        .allocated(pool)?
        .into_iter()
        .filter(|(_, t)| t.kind == kind)
        .map(|(i, t)| (t.value, pages.page_offset(i)))
        .collect();
    found.sort_unstable();
    if found.iter().enumerate().any(|(i, (n, _))| *n != i as u64) {
        return Err(DbError::Corrupt(format!(
            "the {engine} log ring's pages are not numbered 0, 1, 2, ..."
        )));
    }
    if found.len() < count {
        allocate(pool, pages, kind, found.len(), count)?;
        return ring_pages(pool, pages, kind, count, false, engine);
    }
    if found.len() > count {
        return Err(DbError::Corrupt(format!(
            "the {engine} log ring has {} pages, the meta page says {count}",
            found.len()
        )));
    }
    Ok(LogRing {
        pages: found.into_iter().map(|(_, off)| off).collect(),
    })
}

/// Allocates ring pages `from..to`, numbered in ring order.
fn allocate(
    pool: &Pool,
    pages: &PageManager,
    kind: u8,
    from: usize,
    to: usize,
) -> Result<(), DbError> {
    for i in from..to {
        pages.allocate(
            pool,
            PageTag {
                kind,
                owner: 0,
                value: i as u64,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::dudetx::log;
    use crate::pmem::{PersistenceDomain, PoolOptions};

    fn ring() -> (Pool, LogRing) {
        let pool = Pool::create_in_memory(
            8 * PAGE_SIZE,
            &PoolOptions::new("dudetx", PersistenceDomain::Adr).with_counting(false),
        )
        .unwrap();
        // Two pages out of order in the pool: positions must map through the ring's page list.
        let ring = LogRing {
            pages: vec![5 * PAGE_SIZE, 2 * PAGE_SIZE],
        };
        (pool, ring)
    }

    fn raw(n: u8) -> Vec<u8> {
        let mut out = Vec::new();
        log::encode_op(&mut out, 0, u64::from(n), Some(&[n; 100]));
        log::encode_op(&mut out, 1, 9, None);
        out
    }

    #[test]
    fn a_record_reads_back_across_pages_and_the_wrap() {
        let (pool, ring) = ring();
        // Straddles the end of the first page, and the end of the ring (back to its start).
        for pos in [PAGE_SIZE - 24, 2 * PAGE_SIZE - 40, 3 * PAGE_SIZE + 64] {
            let rec = build_record(7, 9, pos, &raw(3), true);
            ring.write(&pool, pos, &rec);
            let back = parse_record(&ring, &pool, pos).expect("intact");
            assert_eq!((back.first, back.last, back.len), (7, 9, rec.len() as u64));
            assert_eq!(back.raw, raw(3));
        }
    }

    #[test]
    fn a_record_says_whether_its_payload_is_compressed() {
        // raw(3) repeats one byte 100 times: LZ4 shrinks it, unless it is not asked to.
        assert!(is_compressed(&build_record(1, 1, 0, &raw(3), true)));
        assert!(!is_compressed(&build_record(1, 1, 0, &raw(3), false)));
        // Bytes with no repeats do not shrink, so they are stored as they are.
        let distinct: Vec<u8> = (0..=255u8).collect();
        assert!(!is_compressed(&build_record(1, 1, 0, &distinct, true)));
    }

    #[test]
    fn torn_and_stale_records_are_not_taken() {
        let (pool, ring) = ring();
        let rec = build_record(1, 1, 128, &raw(1), true);
        ring.write(&pool, 128, &rec);
        // The same bytes one lap later are a stale record of another position.
        assert!(parse_record(&ring, &pool, 128 + ring.capacity()).is_none());
        // A torn payload byte fails the CRC.
        let mut torn = rec.clone();
        let last = torn.len() - 9;
        torn[last] ^= 0xFF;
        ring.write(&pool, 128, &torn);
        assert!(parse_record(&ring, &pool, 128).is_none());
        // Never written.
        assert!(parse_record(&ring, &pool, 4096).is_none());
    }
}
