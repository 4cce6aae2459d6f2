//! The small log window (Falcon §4.3, §5.2.2): redo entries of a transaction, encoded in DRAM and
//! written to the thread's window slot (or spill chain) in one copy.
//!
//! Entry encoding (little-endian), 8-byte aligned:
//! `kind: u32 | table: u32 | tuple: u64 | key: u64 | field_offset: u32 | len: u32 | bytes, padded to 8`.
//! Entries are after-images, so replay is idempotent (Falcon §5.2.2: "the updates in the write-set
//! must be idempotent").

/// Bytes of an entry header.
pub const ENTRY_HEADER: usize = 32;

/// What an entry does to its tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// Replace `len` bytes of the row at `field_offset`.
    Update = 1,
    /// Fill a free slot with a new row (`field_offset` 0, `len` the row size).
    Insert = 2,
    /// Mark the row deleted.
    Delete = 3,
    /// Not a change of the tuple: the secondary key (8 bytes) that the row with primary key
    /// `key` had in its table's secondary index `field_offset` before this transaction changed
    /// or deleted it. Written only for tables whose secondary indexes are in PM, so that
    /// recovery can remove the old pair, which the in-place apply overwrote (`recovery.rs`).
    SecondaryOld = 4,
}

/// A decoded entry, borrowing its bytes from the payload.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// What it does.
    pub kind: EntryKind,
    /// The table.
    pub table: u32,
    /// Pool offset of the tuple slot.
    pub tuple: u64,
    /// The row's primary key.
    pub key: u64,
    /// Byte offset within the row.
    pub field_offset: u32,
    /// The after-image bytes.
    pub bytes: &'a [u8],
}

/// Appends one entry to `payload`.
pub fn encode(
    payload: &mut Vec<u8>,
    kind: EntryKind,
    table: u32,
    tuple: u64,
    key: u64,
    field_offset: u32,
    bytes: &[u8],
) {
    payload.extend_from_slice(&(kind as u32).to_le_bytes());
    payload.extend_from_slice(&table.to_le_bytes());
    payload.extend_from_slice(&tuple.to_le_bytes());
    payload.extend_from_slice(&key.to_le_bytes());
    payload.extend_from_slice(&field_offset.to_le_bytes());
    payload.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    payload.extend_from_slice(bytes);
    payload.resize(payload.len().next_multiple_of(8), 0);
}

/// Decodes a payload; `None` if it is malformed (which a CRC-checked or eADR-ordered slot never is,
/// but recovery must not trust PM blindly).
pub fn decode(payload: &[u8]) -> Option<Vec<Entry<'_>>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let u32_at = |p: &[u8], o: usize| u32::from_le_bytes(p[o..o + 4].try_into().unwrap());
    let u64_at = |p: &[u8], o: usize| u64::from_le_bytes(p[o..o + 8].try_into().unwrap());
    while at < payload.len() {
        if payload.len() - at < ENTRY_HEADER {
            return None;
        }
        let kind = match u32_at(payload, at) {
            1 => EntryKind::Update,
            2 => EntryKind::Insert,
            3 => EntryKind::Delete,
            4 => EntryKind::SecondaryOld,
            _ => return None,
        };
        let len = u32_at(payload, at + 28) as usize;
        let start = at + ENTRY_HEADER;
        if payload.len() - start < len {
            return None;
        }
        out.push(Entry {
            kind,
            table: u32_at(payload, at + 4),
            tuple: u64_at(payload, at + 8),
            key: u64_at(payload, at + 16),
            field_offset: u32_at(payload, at + 24),
            bytes: &payload[start..start + len],
        });
        at = (start + len).next_multiple_of(8);
    }
    Some(out)
}

/// CRC-32 over a slot's commit tid, payload length and payload.
pub fn slot_crc(tid: u64, payload: &[u8]) -> u64 {
    let mut h = crc32fast::Hasher::new();
    h.update(&tid.to_le_bytes());
    h.update(&(payload.len() as u64).to_le_bytes());
    h.update(payload);
    u64::from(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_garbage_is_refused() {
        let mut p = Vec::new();
        encode(&mut p, EntryKind::Update, 3, 4096, 7, 12, b"abc");
        encode(&mut p, EntryKind::Insert, 1, 8192, 9, 0, &[5u8; 20]);
        encode(&mut p, EntryKind::Delete, 1, 8192, 9, 0, &[]);
        let e = decode(&p).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(
            (
                e[0].kind,
                e[0].table,
                e[0].tuple,
                e[0].key,
                e[0].field_offset,
                e[0].bytes
            ),
            (EntryKind::Update, 3, 4096, 7, 12, &b"abc"[..])
        );
        assert_eq!(e[1].bytes, &[5u8; 20]);
        assert_eq!(e[2].kind, EntryKind::Delete);
        assert!(decode(&p[..p.len() - 40]).is_none());
        let mut bad = p.clone();
        bad[0] = 9;
        assert!(decode(&bad).is_none());
        assert_ne!(slot_crc(1, &p), slot_crc(2, &p));
    }
}
