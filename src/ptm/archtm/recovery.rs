//! ArchTM's recovery (§5.5): no log to replay. The TxState table names the transactions that
//! had not committed; a scan of the user data area finds every annotated version; per object
//! the version with the largest committed txid wins; everything else is garbage.

use super::alloc::merge_into;
use super::layout::{block_bytes, header, kind, state, Header, BLOCK};
use super::{txstate_split, Inner, MAX_OBJECT};
use crate::alloc::PAGE_SIZE;
use crate::ptm::PtmError;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

/// Rebuilds `inner`'s DRAM state from PM.
pub(super) fn recover(inner: &mut Inner) -> Result<(), PtmError> {
    let pool = &inner.pool;
    // 1. Uncommitted transactions (§5.5 step 1).
    let mut uncommitted = HashSet::new();
    let mut max_txid = 0;
    for slot in 0..inner.max_threads {
        let (txid, st) = txstate_split(pool.read_u64(inner.txstate_at(slot)));
        max_txid = max_txid.max(txid);
        if st == state::BEGIN {
            uncommitted.insert(txid);
        }
    }
    // 2. Scan the data pages for versions (§5.5 step 2).
    let mut pages = Vec::new();
    for (index, tag) in inner.pages.allocated(pool)? {
        if tag.kind == kind::DATA {
            pages.push(inner.pages.page_offset(index));
        }
    }
    pages.sort_unstable();
    let mut found: Vec<(u64, Header)> = Vec::new();
    for &page in &pages {
        let bytes = pool.read_vec(page, PAGE_SIZE as usize);
        let mut pos = 0u64;
        while pos + header::BYTES <= PAGE_SIZE {
            let p = pos as usize;
            let h = Header::decode(&bytes[p..p + 32], page + pos, inner.salt, MAX_OBJECT);
            match h {
                Some(h) if pos + extent(&h) <= PAGE_SIZE => {
                    found.push((page + pos, h));
                    max_txid = max_txid.max(h.txid);
                    pos += extent(&h);
                }
                _ => pos += BLOCK,
            }
        }
    }
    // 3. The latest committed version of each object (its tombstone, if freed).
    let mut latest: HashMap<u32, (u64, Header)> = HashMap::new();
    for &(off, h) in &found {
        if uncommitted.contains(&h.txid) {
            continue;
        }
        match latest.get(&h.id) {
            Some((_, best)) if best.txid >= h.txid => {}
            _ => {
                latest.insert(h.id, (off, h));
            }
        }
    }
    let live: HashMap<u32, (u64, Header)> =
        latest.into_iter().filter(|(_, (_, h))| !h.tomb).collect();
    // 4. Zero the garbage: ordinary versions first, then tombstones (a tombstone must outlive
    // the versions it deletes), each made durable before the next step; the uncommitted
    // copies are invalid before a new transaction of their slot can overwrite their TxState.
    for tombs in [false, true] {
        let mut any = false;
        for &(off, h) in &found {
            let keep = live.get(&h.id).is_some_and(|&(o, _)| o == off);
            if !keep && h.tomb == tombs {
                pool.fill(off, 0, header::BYTES);
                if inner.flushing {
                    pool.flush(off, header::BYTES);
                }
                any = true;
            }
        }
        if any {
            pool.fence();
        }
    }
    // 5. The lookup table, the ID lists and the free space.
    let mut next_id = 0u64;
    for (&id, &(off, h)) in &live {
        let e = inner.table.get(u64::from(id)).ok_or_else(|| {
            PtmError::Pool(format!(
                "object id {id} at offset {off} is beyond the lookup table's {} ids",
                inner.table.capacity()
            ))
        })?;
        e.old.store(off, Ordering::Relaxed);
        e.gen.store(u64::from(h.gen), Ordering::Relaxed);
        e.size.store(h.size, Ordering::Relaxed);
        next_id = next_id.max(u64::from(id) + 1);
    }
    inner.table.next_id.store(next_id, Ordering::Release);
    let free_ids: Vec<u32> = (0..next_id as u32)
        .filter(|id| !live.contains_key(id))
        .collect();
    inner.id_lists[0].lock().extend(free_ids.into_iter().rev());
    let root_id = (inner.root & 0xffff_ffff) as u32;
    match live.get(&root_id) {
        Some((_, h)) if u64::from(h.gen) == inner.root >> 32 => {}
        _ => {
            return Err(PtmError::Pool(format!(
                "the root object {:#x} has no committed version on PM: the pool is damaged",
                inner.root
            )))
        }
    }
    let mut blocks: Vec<(u64, u64)> = live
        .values()
        .map(|&(off, h)| (off, block_bytes(h.size)))
        .collect();
    blocks.sort_unstable();
    let mut free = Vec::new();
    let mut bi = 0;
    for &page in &pages {
        let mut cursor = page;
        while bi < blocks.len() && blocks[bi].0 < page + PAGE_SIZE {
            let (off, len) = blocks[bi];
            if off > cursor {
                free.push((cursor, off - cursor));
            }
            cursor = off + len;
            bi += 1;
        }
        if cursor < page + PAGE_SIZE {
            free.push((cursor, page + PAGE_SIZE - cursor));
        }
    }
    merge_into(&mut inner.alloc.free.lock(), free);
    *inner.alloc.pages.lock() = pages;
    inner.clock.store((max_txid >> 8) + 1, Ordering::Release);
    Ok(())
}

/// Bytes a found version spans (a tombstone only its header's block: the payload behind an
/// in-place tombstone is scanned like free space).
fn extent(h: &Header) -> u64 {
    if h.tomb {
        BLOCK
    } else {
        block_bytes(h.size)
    }
}
