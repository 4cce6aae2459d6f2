//! DUDETx's redo log records (§3.2) and their combination and compression (§3.3).
//!
//! A transaction's thread-local volatile redo log is a list of [`Op`]s: the after-image of every
//! row it wrote, or the deletion of a key. Replaying a record is idempotent (whole after-images,
//! no deltas), which is what lets recovery replay from the last truncation point without knowing
//! exactly which records the reproduce thread had applied (§3.5).
//!
//! Combination (§3.3): a group of consecutive transactions is persisted as one record that holds,
//! per key, only the last write of the group (the paper combines by address; a row here plays the
//! address's part). The combined record is then compressed with LZ4 (§3.3 uses LZ4 too) when that
//! makes it smaller. Because a group record is atomic (one CRC), recovery replays a group wholly
//! or not at all, so applying only each key's last write equals applying the group's
//! transactions one by one (proptest `combined_replay_equals_sequential_replay`).

use crate::catalog::TableId;
use std::collections::BTreeMap;

/// One write of a redo log: a row's after-image (`Some`) or its deletion (`None`).
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

/// Appends `op` to `out`: table (u32), kind (u8), key (u64), row length (u32) and row bytes.
pub fn encode_op(out: &mut Vec<u8>, table: TableId, key: u64, row: Option<&[u8]>) {
    out.extend_from_slice(&table.to_le_bytes());
    out.push(if row.is_some() { PUT } else { DELETE });
    out.extend_from_slice(&key.to_le_bytes());
    let bytes = row.unwrap_or(&[]);
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Bytes [`encode_op`] appends for a row of `row_len` bytes.
pub fn encoded_len(row_len: usize) -> usize {
    4 + 1 + 8 + 4 + row_len
}

/// Decodes a sequence of encoded ops; `Err` names what is malformed.
pub fn decode_ops(mut bytes: &[u8]) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 17 {
            return Err(format!(
                "a log op is cut short ({} bytes left)",
                bytes.len()
            ));
        }
        let table = TableId::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let kind = bytes[4];
        let key = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(bytes[13..17].try_into().expect("4 bytes")) as usize;
        bytes = &bytes[17..];
        if bytes.len() < len {
            return Err(format!("a log op's row of {len} bytes is cut short"));
        }
        let row = match kind {
            PUT => Some(bytes[..len].to_vec()),
            DELETE if len == 0 => None,
            other => return Err(format!("a log op has the unknown kind {other}")),
        };
        bytes = &bytes[len..];
        ops.push(Op { table, key, row });
    }
    Ok(ops)
}

/// Combines the encoded logs of consecutive transactions (in commit order) into one encoded log
/// holding each key's last write (§3.3), in (table, key) order.
pub fn combine(logs: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut last: BTreeMap<(TableId, u64), Option<Vec<u8>>> = BTreeMap::new();
    for log in logs {
        for op in decode_ops(log)? {
            last.insert((op.table, op.key), op.row);
        }
    }
    let mut out = Vec::new();
    for ((table, key), row) in &last {
        encode_op(&mut out, *table, *key, row.as_deref());
    }
    Ok(out)
}

/// Applies `ops` in order to a map of rows (the reference semantics of a log).
pub fn apply_to_map(map: &mut BTreeMap<(TableId, u64), Vec<u8>>, ops: &[Op]) {
    for op in ops {
        match &op.row {
            Some(row) => {
                map.insert((op.table, op.key), row.clone());
            }
            None => {
                map.remove(&(op.table, op.key));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op_strategy() -> impl Strategy<Value = (TableId, u64, Option<Vec<u8>>)> {
        (
            0..3u32,
            0..12u64,
            prop::option::weighted(0.8, prop::collection::vec(any::<u8>(), 0..40)),
        )
    }

    proptest! {
        /// §3.3: persisting a group's combined (and compressed) log and replaying it gives the
        /// same rows as replaying each transaction's log in commit order.
        #[test]
        fn combined_replay_equals_sequential_replay(
            txns in prop::collection::vec(prop::collection::vec(op_strategy(), 1..6), 1..30),
            group in 1usize..12,
        ) {
            let logs: Vec<Vec<u8>> = txns
                .iter()
                .map(|ops| {
                    let mut out = Vec::new();
                    for (t, k, r) in ops {
                        encode_op(&mut out, *t, *k, r.as_deref());
                    }
                    out
                })
                .collect();
            let mut sequential = BTreeMap::new();
            for log in &logs {
                apply_to_map(&mut sequential, &decode_ops(log).unwrap());
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
                apply_to_map(&mut combined, &decode_ops(&back).unwrap());
            }
            prop_assert_eq!(sequential, combined);
            prop_assert!(combined_total <= raw_total);
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
    fn malformed_logs_are_refused_with_a_reason() {
        assert!(decode_ops(&[1, 2, 3]).unwrap_err().contains("cut short"));
        let mut out = Vec::new();
        encode_op(&mut out, 0, 1, Some(&[1, 2, 3]));
        out[4] = 9;
        assert!(decode_ops(&out).unwrap_err().contains("unknown kind"));
        out.truncate(out.len() - 1);
        assert!(decode_ops(&out).is_err());
    }
}
