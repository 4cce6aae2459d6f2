//! DUDETx's redo log records (§3.2) and their combination and compression (§3.3).
//!
//! A transaction's thread-local volatile redo log is a list of ops: the after-image of a row it
//! inserted (a put), the bytes an update wrote into a row (a field write: offset and bytes, the
//! nearest a row store comes to §3.2's word-granular (address, value) entries), or the deletion
//! of a key. Replaying the log records from the last truncation point in id order ends in the
//! same rows whatever part of them the reproduce thread had applied before a crash: every byte
//! a replayed op writes ends as the last replayed op left it, and a byte none writes was not
//! touched since the truncation (§3.5). A field write whose key is gone during that replay was
//! followed by a delete the reproduce thread had applied, which the replay repeats: it is
//! skipped.
//!
//! Combination (§3.3): a group of consecutive transactions is persisted as one record that holds,
//! per key, only what the group's last put or delete and the field writes after it leave (the
//! paper combines by address; a row here plays the address's part): field writes after a put are
//! folded into the put, field writes after a delete are dropped, and a field write that a later
//! one of the same key covers is dropped. The combined record is then compressed with LZ4 (§3.3
//! uses LZ4 too) when that makes it smaller. Because a group record is atomic (one CRC),
//! recovery replays a group wholly or not at all, so applying the combined ops equals applying
//! the group's transactions one by one (proptest `combined_replay_equals_sequential_replay`).

use crate::catalog::TableId;
use std::collections::BTreeMap;

/// One write of a whole-row redo log (the PTM's words, MMDB's rows): a row's after-image
/// (`Some`) or its deletion (`None`). Logs with field writes are read as [`OpRef`]s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The table.
    pub table: TableId,
    /// The primary key.
    pub key: u64,
    /// The whole row after the write; `None`: the key was deleted.
    pub row: Option<Vec<u8>>,
}

/// Op kind bytes of the encoding.
const PUT: u8 = 1;
const DELETE: u8 = 2;
const FIELDS: u8 = 3;

/// Bytes of an op's header: table (u32), kind (u8), key (u64), payload length (u32).
const OP_HEADER: usize = 17;

/// Appends `op` to `out`: table (u32), kind (u8), key (u64), row length (u32) and row bytes.
pub fn encode_op(out: &mut Vec<u8>, table: TableId, key: u64, row: Option<&[u8]>) {
    let bytes = row.unwrap_or(&[]);
    let kind = if row.is_some() { PUT } else { DELETE };
    out.reserve(OP_HEADER + bytes.len());
    out.extend_from_slice(&header(table, kind, key, bytes.len()));
    out.extend_from_slice(bytes);
}

/// Appends a field write to `out`: the header (kind 3, payload length 4 + `bytes`), the offset
/// in the row (u32), the bytes.
pub fn encode_field_write(out: &mut Vec<u8>, table: TableId, key: u64, at: usize, bytes: &[u8]) {
    // Every update of a transaction appends one of these on the perform path: one reservation,
    // and the header built whole rather than a capacity check per field.
    out.reserve(OP_HEADER + 4 + bytes.len());
    out.extend_from_slice(&header(table, FIELDS, key, 4 + bytes.len()));
    out.extend_from_slice(&(at as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// An op's header: table (u32), kind (u8), key (u64), payload length (u32).
fn header(table: TableId, kind: u8, key: u64, payload: usize) -> [u8; OP_HEADER] {
    let mut h = [0u8; OP_HEADER];
    h[0..4].copy_from_slice(&table.to_le_bytes());
    h[4] = kind;
    h[5..13].copy_from_slice(&key.to_le_bytes());
    h[13..17].copy_from_slice(&(payload as u32).to_le_bytes());
    h
}

/// Bytes [`encode_op`] appends for a row of `row_len` bytes.
pub fn encoded_len(row_len: usize) -> usize {
    OP_HEADER + row_len
}

/// Bytes [`encode_field_write`] appends for `len` bytes written.
pub fn encoded_field_write_len(len: usize) -> usize {
    OP_HEADER + 4 + len
}

/// What an op does to its key's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write<'a> {
    /// The whole row after the write.
    Put(&'a [u8]),
    /// `bytes` written at byte offset `at` of the existing row.
    Fields {
        /// The offset in the row.
        at: usize,
        /// The bytes written there.
        bytes: &'a [u8],
    },
    /// The key was deleted.
    Delete,
}

/// One write of an encoded redo log, borrowed from the log's bytes (what reproduce applies:
/// decoding borrows rather than copying every row, §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRef<'a> {
    /// The table.
    pub table: TableId,
    /// The primary key.
    pub key: u64,
    /// The write.
    pub write: Write<'a>,
}

impl Op {
    /// The op borrowed.
    pub fn borrowed(&self) -> OpRef<'_> {
        OpRef {
            table: self.table,
            key: self.key,
            write: match &self.row {
                Some(row) => Write::Put(row),
                None => Write::Delete,
            },
        }
    }
}

/// Calls `f` with each op of an encoded log, in order; `Err` names what is malformed (or is
/// `f`'s error).
pub fn for_each_op<'a>(
    mut bytes: &'a [u8],
    mut f: impl FnMut(OpRef<'a>) -> Result<(), String>,
) -> Result<(), String> {
    while !bytes.is_empty() {
        let (op, len) = decode_op(bytes)?;
        bytes = &bytes[len..];
        f(op)?;
    }
    Ok(())
}

/// The op at the start of `bytes` (not empty) and the bytes it takes; `Err` names what is
/// malformed.
fn decode_op(bytes: &[u8]) -> Result<(OpRef<'_>, usize), String> {
    if bytes.len() < OP_HEADER {
        return Err(format!(
            "a log op is cut short ({} bytes left)",
            bytes.len()
        ));
    }
    let table = TableId::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let kind = bytes[4];
    let key = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(bytes[13..17].try_into().expect("4 bytes")) as usize;
    let Some(payload) = bytes[OP_HEADER..].get(..len) else {
        return Err(format!("a log op's row of {len} bytes is cut short"));
    };
    let write = match kind {
        PUT => Write::Put(payload),
        DELETE if len == 0 => Write::Delete,
        FIELDS if len < 4 => {
            return Err(format!(
                "a field-write log op of {len} bytes lacks its 4-byte offset"
            ))
        }
        FIELDS => Write::Fields {
            at: u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize,
            bytes: &payload[4..],
        },
        other => return Err(format!("a log op has the unknown kind {other}")),
    };
    Ok((OpRef { table, key, write }, OP_HEADER + len))
}

/// Decodes a whole-row log (no field writes: the PTM's, MMDB's); `Err` names what is malformed.
pub fn decode_ops(bytes: &[u8]) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    for_each_op(bytes, |op| {
        let row = match op.write {
            Write::Put(row) => Some(row.to_vec()),
            Write::Delete => None,
            Write::Fields { .. } => {
                return Err(format!(
                    "a log op writes fields of key {}, in a log of whole rows",
                    op.key
                ))
            }
        };
        ops.push(Op {
            table: op.table,
            key: op.key,
            row,
        });
        Ok(())
    })?;
    Ok(ops)
}

/// Combines the encoded logs of consecutive transactions (in commit order) into one encoded log
/// (§3.3): per key, in (table, key) order, what its last put or delete and the field writes
/// after it leave (see the module doc). [`Combiner::combine_into`] without its reuse.
pub fn combine(logs: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    Combiner::default().combine_into(logs, &mut out)?;
    Ok(out)
}

/// Log combination (§3.3) with buffers kept from one group to the next: it runs on a sync
/// commit's path, where an allocation per group showed in `perf` (malloc and free 3-4 %).
#[derive(Default)]
pub struct Combiner {
    /// The group's ops as (table, key, log, offset in the log), sorted by key.
    ops: Vec<(TableId, u64, u32, u32)>,
    /// A put's row with the field writes after it folded in.
    row: Vec<u8>,
}

impl Combiner {
    /// Appends to `out` the combination of `logs` (see [`combine`]). The ops are located, not
    /// copied, and sorted by key (a stable sort keeps each key's writes in commit order); a
    /// row is copied only for a put that absorbs field writes.
    pub fn combine_into<L: AsRef<[u8]>>(
        &mut self,
        logs: &[L],
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        self.ops.clear();
        let mut total = 0;
        for (i, log) in logs.iter().enumerate() {
            let log = log.as_ref();
            total += log.len();
            let mut at = 0;
            while at < log.len() {
                let (op, len) = decode_op(&log[at..])?;
                self.ops.push((op.table, op.key, i as u32, at as u32));
                at += len;
            }
        }
        self.ops.sort_by_key(|&(table, key, _, _)| (table, key));
        out.reserve(total);
        for run in self.ops.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let mut writes: smallvec::SmallVec<[OpRef<'_>; 4]> = smallvec::SmallVec::new();
            for &(_, _, log, at) in run {
                writes.push(decode_op(&logs[log as usize].as_ref()[at as usize..])?.0);
            }
            combine_key(out, &writes, &mut self.row)?;
        }
        Ok(())
    }
}

/// Appends what one key's writes `run` (in commit order) leave, for [`combine`]; `row` is
/// scratch for a put that absorbs field writes.
fn combine_key(out: &mut Vec<u8>, run: &[OpRef<'_>], row: &mut Vec<u8>) -> Result<(), String> {
    let (table, key) = (run[0].table, run[0].key);
    let last_whole = run
        .iter()
        .rposition(|op| !matches!(op.write, Write::Fields { .. }));
    let after = &run[last_whole.map_or(0, |i| i + 1)..];
    match last_whole.map(|i| run[i].write) {
        Some(Write::Put(put)) if !after.is_empty() => {
            row.clear();
            row.extend_from_slice(put);
            for op in after {
                if let Write::Fields { at, bytes } = op.write {
                    let end = at + bytes.len();
                    let Some(dst) = row.get_mut(at..end) else {
                        return Err(field_out_of_row(table, key, at, end, row.len()));
                    };
                    dst.copy_from_slice(bytes);
                }
            }
            encode_op(out, table, key, Some(row));
        }
        Some(Write::Put(put)) => encode_op(out, table, key, Some(put)),
        // Field writes after a delete find no row (recovery skips them; reproduce never sees
        // them, since the shadow refuses an update of a deleted key).
        Some(_) => encode_op(out, table, key, None),
        None => {
            for (i, op) in after.iter().enumerate() {
                let Write::Fields { at, bytes } = op.write else {
                    continue;
                };
                let end = at + bytes.len();
                let covered = after[i + 1..].iter().any(|later| {
                    matches!(later.write, Write::Fields { at: a, bytes: b }
                        if a <= at && end <= a + b.len())
                });
                if !covered {
                    encode_field_write(out, table, key, at, bytes);
                }
            }
        }
    }
    Ok(())
}

/// Why a field write does not fit its row.
pub fn field_out_of_row(table: TableId, key: u64, at: usize, end: usize, row: usize) -> String {
    format!(
        "a log op writes bytes {at}..{end} of key {key} in table {table}, whose rows have {row} \
         bytes"
    )
}

/// Applies `ops` in order to a map of rows (the reference semantics of a log): a field write of
/// a key the map lacks changes nothing.
pub fn apply_to_map(
    map: &mut BTreeMap<(TableId, u64), Vec<u8>>,
    ops: &[OpRef<'_>],
) -> Result<(), String> {
    for op in ops {
        let k = (op.table, op.key);
        match op.write {
            Write::Put(row) => {
                map.insert(k, row.to_vec());
            }
            Write::Delete => {
                map.remove(&k);
            }
            Write::Fields { at, bytes } => {
                if let Some(row) = map.get_mut(&k) {
                    let (end, len) = (at + bytes.len(), row.len());
                    let Some(dst) = row.get_mut(at..end) else {
                        return Err(field_out_of_row(op.table, op.key, at, end, len));
                    };
                    dst.copy_from_slice(bytes);
                }
            }
        }
    }
    Ok(())
}

/// The ops of an encoded log, borrowed.
pub fn ops_of(bytes: &[u8]) -> Result<Vec<OpRef<'_>>, String> {
    let mut ops = Vec::new();
    for_each_op(bytes, |op| {
        ops.push(op);
        Ok(())
    })?;
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A test op: (table, key, write), owned.
    #[derive(Clone, Debug)]
    enum TestWrite {
        Put(Vec<u8>),
        Fields(usize, Vec<u8>),
        Delete,
    }

    /// Table `t`'s row length (fixed per table, as in the engine).
    fn row_len(t: TableId) -> usize {
        8 + 4 * t as usize
    }

    fn op_strategy() -> impl Strategy<Value = (TableId, u64, TestWrite)> {
        (0..3u32, 0..12u64, 0..10u8).prop_flat_map(|(t, k, kind)| {
            let len = row_len(t);
            let write = match kind {
                0..=3 => prop::collection::vec(any::<u8>(), len..=len)
                    .prop_map(TestWrite::Put)
                    .boxed(),
                4 => Just(TestWrite::Delete).boxed(),
                _ => (0..len)
                    .prop_flat_map(move |at| {
                        prop::collection::vec(any::<u8>(), 0..=len - at)
                            .prop_map(move |b| TestWrite::Fields(at, b))
                    })
                    .boxed(),
            };
            (Just(t), Just(k), write)
        })
    }

    fn encode(ops: &[(TableId, u64, TestWrite)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (t, k, w) in ops {
            match w {
                TestWrite::Put(row) => encode_op(&mut out, *t, *k, Some(row)),
                TestWrite::Fields(at, bytes) => encode_field_write(&mut out, *t, *k, *at, bytes),
                TestWrite::Delete => encode_op(&mut out, *t, *k, None),
            }
        }
        out
    }

    proptest! {
        /// §3.3: persisting a group's combined (and compressed) log and replaying it gives the
        /// same rows as replaying each transaction's log in commit order.
        #[test]
        fn combined_replay_equals_sequential_replay(
            txns in prop::collection::vec(prop::collection::vec(op_strategy(), 1..6), 1..30),
            group in 1usize..12,
        ) {
            let logs: Vec<Vec<u8>> = txns.iter().map(|ops| encode(ops)).collect();
            let mut sequential = BTreeMap::new();
            for log in &logs {
                apply_to_map(&mut sequential, &ops_of(log).unwrap()).unwrap();
            }
            let mut combined = BTreeMap::new();
            let mut raw_total = 0;
            let mut combined_total = 0;
            for chunk in logs.chunks(group) {
                let slices: Vec<&[u8]> = chunk.iter().map(|l| l.as_slice()).collect();
                raw_total += slices.iter().map(|s| s.len()).sum::<usize>();
                let raw = combine(&slices).unwrap();
                combined_total += raw.len();
                let stored = crate::engine::wal::lz4_compress(&raw);
                let back = match &stored {
                    Some(packed) => crate::engine::wal::lz4_decompress(packed, raw.len()).unwrap(),
                    None => raw.clone(),
                };
                prop_assert_eq!(&back, &raw);
                apply_to_map(&mut combined, &ops_of(&back).unwrap()).unwrap();
            }
            prop_assert_eq!(sequential, combined);
            prop_assert!(combined_total <= raw_total);
        }

        /// §3.5: replaying the log from the truncation point over a heap that holds any prefix
        /// of the ops after it (what reproduce had applied before a crash) ends in the same rows
        /// as applying every op once.
        #[test]
        fn replay_over_a_partly_reproduced_heap_ends_in_the_same_rows(
            base in prop::collection::vec(op_strategy(), 0..20),
            tail in prop::collection::vec(op_strategy(), 1..30),
            applied in 0usize..30,
        ) {
            let (base, tail) = (encode(&base), encode(&tail));
            let mut once = BTreeMap::new();
            apply_to_map(&mut once, &ops_of(&base).unwrap()).unwrap();
            let mut crashed = once.clone();
            let tail_ops = ops_of(&tail).unwrap();
            apply_to_map(&mut once, &tail_ops).unwrap();
            apply_to_map(&mut crashed, &tail_ops[..applied.min(tail_ops.len())]).unwrap();
            apply_to_map(&mut crashed, &tail_ops).unwrap();
            prop_assert_eq!(once, crashed);
        }
    }

    #[test]
    fn a_key_written_many_times_in_a_group_is_logged_once() {
        let mut logs = Vec::new();
        for v in 0..100u8 {
            let mut out = Vec::new();
            encode_op(&mut out, 1, 7, Some(&[v; 32]));
            logs.push(out);
        }
        let slices: Vec<&[u8]> = logs.iter().map(|l| l.as_slice()).collect();
        let raw = combine(&slices).unwrap();
        assert_eq!(raw.len(), encoded_len(32));
        assert_eq!(
            decode_ops(&raw).unwrap(),
            vec![Op {
                table: 1,
                key: 7,
                row: Some(vec![99; 32])
            }]
        );
    }

    #[test]
    fn field_writes_fold_into_the_put_before_them_and_the_covered_ones_drop() {
        let mut insert = Vec::new();
        encode_op(&mut insert, 1, 7, Some(&[0; 8]));
        let mut update = Vec::new();
        encode_field_write(&mut update, 1, 7, 2, &[5, 6]);
        let raw = combine(&[&insert, &update]).unwrap();
        assert_eq!(
            decode_ops(&raw).unwrap(),
            vec![Op {
                table: 1,
                key: 7,
                row: Some(vec![0, 0, 5, 6, 0, 0, 0, 0])
            }]
        );
        // Without a put, the field writes stay, less the one a later write covers.
        let mut again = Vec::new();
        encode_field_write(&mut again, 1, 7, 1, &[9, 9, 9]);
        let mut other = Vec::new();
        encode_field_write(&mut other, 1, 7, 6, &[4]);
        let raw = combine(&[&update, &other, &again]).unwrap();
        let ops = ops_of(&raw).unwrap();
        assert_eq!(
            ops.iter().map(|o| o.write).collect::<Vec<_>>(),
            vec![
                Write::Fields { at: 6, bytes: &[4] },
                Write::Fields {
                    at: 1,
                    bytes: &[9, 9, 9]
                }
            ]
        );
        assert_eq!(raw.len(), 2 * encoded_field_write_len(0) + 4);
    }

    #[test]
    fn malformed_logs_are_refused_with_a_reason() {
        assert!(decode_ops(&[1, 2, 3]).unwrap_err().contains("cut short"));
        let mut out = Vec::new();
        encode_op(&mut out, 0, 1, Some(&[1, 2, 3]));
        out[4] = 9;
        assert!(decode_ops(&out).unwrap_err().contains("unknown kind"));
        out.truncate(out.len() - 1);
        assert!(decode_ops(&out).is_err());
        // A field write without its offset, and one in a whole-row log.
        let mut fields = Vec::new();
        encode_field_write(&mut fields, 0, 1, 0, &[]);
        fields.truncate(OP_HEADER);
        fields[13..17].copy_from_slice(&0u32.to_le_bytes());
        assert!(ops_of(&fields).unwrap_err().contains("offset"));
        let mut fields = Vec::new();
        encode_field_write(&mut fields, 0, 1, 0, &[1]);
        assert!(decode_ops(&fields).unwrap_err().contains("whole rows"));
        // A field write past its row.
        let mut put = Vec::new();
        encode_op(&mut put, 0, 1, Some(&[0; 4]));
        let mut past = Vec::new();
        encode_field_write(&mut past, 0, 1, 3, &[1, 2]);
        assert!(combine(&[&put, &past]).unwrap_err().contains("bytes 3..5"));
    }
}
