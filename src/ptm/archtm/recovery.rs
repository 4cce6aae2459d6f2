//! ArchTM's recovery (§5.5): no log to replay. The TxState table names each slot's last
//! committed transaction, so a copy whose txid is above its slot's was not committed; a scan
//! of the user data area finds every annotated version; per object the version with the
//! largest committed txid wins; everything else is garbage. With a
//! checkpoint (§5.6) the scan starts from its copy of the lookup table and covers only the
//! segments its CHKP-diff recorded.

use super::alloc::merge_into;
use super::chkp::{read_diff, RecoveryCounts, DIFF_CAP, ENTRY, PER_PAGE};
use super::layout::{
    block_bytes, header, is_large, kind, large, meta, state, Header, BLOCK, MAX_SMALL,
};
use super::{txstate_split, Inner, MAX_OBJECT};
use crate::alloc::PAGE_SIZE;
use crate::ptm::PtmError;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

/// Rebuilds `inner`'s DRAM state from PM.
pub(super) fn recover(inner: &mut Inner) -> Result<(), PtmError> {
    let pool = &inner.pool;
    // 1. Which copies committed (§5.5 step 1): per slot (the user slots and the engine's
    // reserved one), the last committed txid; a copy committed iff its txid is at most its
    // slot's (`mod.rs`, "TxState": a slot's txids only grow, and no BEGIN is stored).
    let mut max_txid = 0;
    let mut committed_upto = Vec::with_capacity(inner.internal_slot() + 1);
    for slot in 0..=inner.internal_slot() {
        let (txid, st) = txstate_split(pool.read_u64(inner.txstate_at(slot)));
        let named = match st {
            state::COMMITTED if txid & 0xff == slot as u64 => txid,
            state::END if txid == 0 => 0,
            _ => {
                return Err(damaged(format!(
                    "thread slot {slot}'s TxState word names txid {txid:#x} in state {st} \
                     (expected COMMITTED by this slot, or 0)"
                )))
            }
        };
        max_txid = max_txid.max(named);
        committed_upto.push(named);
    }
    let committed = |txid: u64| {
        committed_upto
            .get((txid & 0xff) as usize)
            .is_some_and(|&upto| txid <= upto)
    };
    // 2. The pages: data pages, and the checkpoint copies' pages (§5.6).
    let mut pages = Vec::new();
    // Large-object pages (§4.4's regular path): offset -> (index, head?).
    let mut large_pages: HashMap<u64, (u64, bool)> = HashMap::new();
    for (index, tag) in inner.pages.allocated(pool)? {
        let off = inner.pages.page_offset(index);
        if tag.kind == kind::DATA {
            pages.push(off);
        } else if tag.kind == kind::LARGE {
            large_pages.insert(off, (index, tag.value == large::HEAD));
        } else if tag.kind == kind::CHKP {
            let (copy, chunk) = ((tag.value >> 31) as usize, tag.value & ((1 << 31) - 1));
            if copy > 1 || !inner.chkp.set_page(copy, chunk, off) {
                return Err(damaged(format!(
                    "checkpoint page {index} is tagged copy {copy}, chunk {chunk}, beyond the lookup table"
                )));
            }
        }
    }
    pages.sort_unstable();
    let mut counts = RecoveryCounts {
        data_bytes: pages.len() as u64 * PAGE_SIZE,
        ..Default::default()
    };
    // 3. With a valid checkpoint, its copy of the lookup table and the segments of its diff;
    // else every data page (§5.5).
    let epoch = pool.read_u64(inner.meta + meta::CHKP_EPOCH);
    let overflow = pool.read_u64(inner.meta + meta::CHKP_OVERFLOW);
    inner.chkp.epoch.store(epoch, Ordering::Release);
    let mut from_chkp: HashMap<u32, (u64, Header)> = HashMap::new();
    let mut stale_large: HashSet<u32> = HashSet::new();
    let extents: Vec<(u64, u64)> = if epoch > 0 && overflow != epoch {
        counts.from_checkpoint = true;
        let copy = (epoch % 2) as usize;
        let ids = pool.read_u64(inner.meta + meta::CHKP_NEXT_ID + copy as u64 * 8);
        if ids > inner.table.capacity() {
            return Err(damaged(format!(
                "the checkpoint covers {ids} ids, beyond the lookup table's {}",
                inner.table.capacity()
            )));
        }
        for chunk in 0..ids.div_ceil(PER_PAGE) {
            let page = inner.chkp.page(copy, chunk);
            if page == 0 {
                continue; // never written: every id of the chunk was free
            }
            let n = (ids - chunk * PER_PAGE).min(PER_PAGE);
            let bytes = pool.read_vec(page, (n * ENTRY) as usize);
            counts.chkp_entries += n;
            for i in 0..n {
                let w = |k: u64| {
                    let at = (i * ENTRY + k * 8) as usize;
                    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
                };
                let (off, gs, txid) = (w(0), w(1), w(2));
                if off == 0 {
                    continue;
                }
                let id = chunk * PER_PAGE + i;
                let h = Header {
                    id: id as u32,
                    gen: (gs >> 32) as u32,
                    size: gs & 0xffff_ffff,
                    tomb: false,
                    txid,
                };
                // A large version's pages may have been freed (and reused) since the
                // checkpoint, once a later version replaced it: only a live one must be there.
                let placed = if is_large(h.size) {
                    if !large_pages.get(&off).is_some_and(|&(_, head)| head) {
                        stale_large.insert(h.id);
                    }
                    true
                } else {
                    in_pages(&pages, off, block_bytes(h.size))
                };
                if h.gen == 0 || h.size > MAX_OBJECT || !placed {
                    return Err(damaged(format!(
                        "the checkpoint entry of object {id} names {h:?} at offset {off}, not a block of a data page"
                    )));
                }
                max_txid = max_txid.max(txid);
                from_chkp.insert(h.id, (off, h));
            }
        }
        let mut segments = read_diff(inner, epoch);
        inner.chkp.diff.lock().len = segments.len() as u64;
        counts.segments = segments.len() as u64;
        if let Some(&(off, len)) = segments.iter().find(|&&(o, l)| !in_pages(&pages, o, l)) {
            return Err(damaged(format!(
                "a CHKP-diff segment ({len} bytes at {off}) is not inside a data page"
            )));
        }
        segments.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (off, len) in segments {
            match merged.last_mut() {
                Some((o, l)) if off <= *o + *l => *l = (*l).max(off + len - *o),
                _ => merged.push((off, len)),
            }
        }
        merged
    } else {
        inner.chkp.diff.lock().len = if epoch > 0 {
            DIFF_CAP + 1
        } else {
            read_diff(inner, epoch).len() as u64
        };
        pages.iter().map(|&p| (p, PAGE_SIZE)).collect()
    };
    // 4. Scan for versions (§5.5 step 2).
    let mut found: Vec<(u64, Header)> = Vec::new();
    for &(start, len) in &extents {
        let bytes = pool.read_vec(start, len as usize);
        counts.scanned_bytes += len;
        let mut pos = 0u64;
        while pos + header::BYTES <= len {
            let p = pos as usize;
            let at = start + pos;
            let h = Header::decode(&bytes[p..p + 32], at, inner.salt, MAX_SMALL);
            match h {
                Some(h) if at % PAGE_SIZE + extent(&h) <= PAGE_SIZE => {
                    found.push((at, h));
                    max_txid = max_txid.max(h.txid);
                    pos += extent(&h);
                }
                _ => pos += BLOCK,
            }
        }
    }
    // The head pages of large versions: always scanned (fetches from the free list, which
    // CHKP-diff records, never hold them), a header each.
    for (&off, &(_, head)) in &large_pages {
        if !head {
            continue;
        }
        let b = pool.read_vec(off, header::BYTES as usize);
        counts.scanned_bytes += header::BYTES;
        if let Some(h) = Header::decode(&b, off, inner.salt, MAX_OBJECT) {
            if is_large(h.size) && !h.tomb {
                found.push((off, h));
                max_txid = max_txid.max(h.txid);
            }
        }
    }
    // 5. The latest committed version of each object (its tombstone, if freed): the
    // checkpoint's, unless the scan found a later one.
    let mut latest = from_chkp.clone();
    for &(off, h) in &found {
        if !committed(h.txid) {
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
    if let Some(id) = stale_large
        .iter()
        .find(|id| live.get(id).is_some_and(|l| from_chkp.get(id) == Some(l)))
    {
        return Err(damaged(format!(
            "the checkpoint's version of large object {id} is live, but its page is no large-object head page"
        )));
    }
    // 6. Zero the garbage: ordinary versions first, then tombstones (a tombstone must outlive
    // the versions it deletes), each made durable before the next step; the uncommitted
    // copies are invalid before a new transaction of their slot can overwrite their TxState.
    // A checkpointed version that a later one replaced is garbage too (it lies outside the
    // diff: nothing else would ever zero it), if its block still holds it.
    for tombs in [false, true] {
        let mut any = false;
        if !tombs {
            for (&id, &(off, h)) in &from_chkp {
                if live.get(&id).is_some_and(|&(o, _)| o == off) {
                    continue;
                }
                if !live.contains_key(&id) {
                    // Freed since the checkpoint: the entry goes before the tombstone that
                    // says so (as garbage collection does), or the next recovery revives it.
                    let copy = (epoch % 2) as usize;
                    let at = inner.chkp.page(copy, u64::from(id) / PER_PAGE)
                        + (u64::from(id) % PER_PAGE) * ENTRY;
                    pool.write_u64(at, 0);
                    if inner.flushing {
                        pool.flush(at, 8);
                    }
                    any = true;
                }
                let b = pool.read_vec(off, header::BYTES as usize);
                if Header::decode(&b, off, inner.salt, MAX_OBJECT) == Some(h) {
                    pool.fill(off, 0, header::BYTES);
                    if inner.flushing {
                        pool.flush(off, header::BYTES);
                    }
                    any = true;
                }
            }
        }
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
    // The pages of the live large versions; every other large-object page (of a garbage or
    // uncommitted version, whose header is now durably invalid, or never given a header)
    // returns to the page manager.
    let mut owned: HashSet<u64> = HashSet::new();
    for &(off, h) in live.values() {
        if !is_large(h.size) {
            continue;
        }
        let n = pool.read_u64(off + large::LIST);
        if n + 1 != super::layout::large_pages(h.size) {
            return Err(damaged(format!(
                "the large object {} at {off} lists {n} tail pages for {} bytes",
                h.id, h.size
            )));
        }
        owned.insert(off);
        for i in 0..n {
            let p = pool.read_u64(off + large::LIST + 8 + 8 * i);
            if large_pages.get(&p).map_or(true, |&(_, head)| head) || !owned.insert(p) {
                return Err(damaged(format!(
                    "the large object {} at {off} names page {p}, not a free tail page",
                    h.id
                )));
            }
        }
    }
    for (&off, &(index, _)) in &large_pages {
        if !owned.contains(&off) {
            inner.pages.free(pool, index);
        }
    }
    // 7. The lookup table, the ID lists and the free space.
    let mut next_id = if counts.from_checkpoint {
        // Ids the checkpoint covers stay handed out (free ones go to the ID list).
        pool.read_u64(inner.meta + meta::CHKP_NEXT_ID + (epoch % 2) * 8)
    } else {
        0
    };
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
        e.vtxid.store(h.txid, Ordering::Relaxed);
        e.publish();
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
        .filter(|(_, h)| !is_large(h.size))
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
    // The next checkpoint rewrites what the scan found changed (and everything in the other
    // copy); a full scan leaves everything dirty.
    if counts.from_checkpoint {
        inner
            .chkp
            .reset_dirty(found.iter().map(|(_, h)| u64::from(h.id)));
    }
    inner.recovered = counts;
    Ok(())
}

fn damaged(what: String) -> PtmError {
    PtmError::Pool(format!("the pool is damaged: {what}"))
}

/// Whether `[off, off + len)` lies inside one of the (sorted) data pages, 64-byte aligned.
fn in_pages(pages: &[u64], off: u64, len: u64) -> bool {
    let i = pages.partition_point(|&p| p <= off);
    off % BLOCK == 0 && len > 0 && i > 0 && off + len <= pages[i - 1] + PAGE_SIZE
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
