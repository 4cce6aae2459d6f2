//! Zen recovery without logs (§3.3.3, Algorithm 2): one parallel pass over the NVM-tuple heap,
//! region by region, rebuilding the DRAM indexes, free lists and garbage queues.
//!
//! Each region (the pages of one thread slot) is scanned with a running `ts-commit`, the largest
//! Tx-CTS seen with the LP bit: a tuple at or below it was written by a committed transaction
//! (a thread's commit tids only grow, and all tuples of a transaction are in its thread's region);
//! a tuple above it goes to the pending list and is decided once the region's final `ts-commit`
//! is known. Undecided tuples belong to the transaction that was persisting at the crash: their
//! slots are zeroed (flushed and fenced), which makes recovery idempotent. Committed versions go
//! through `updateIndexGC`: the newest Tx-CTS per key wins, the others become garbage.
//!
//! Departure: tombstones (deleted versions) take part in "newest wins" and their keys are dropped
//! afterwards, instead of being freed on sight (Algorithm 2, line 13), so an older version of a
//! deleted key that is still in the heap cannot come back. Old versions and tombstones are queued
//! as garbage rather than freed at once, so the normal reclamation rules (`mod.rs`) zero them
//! before their slots are reused.

use super::cache::is_cache_ref;
use super::layout::{kind, tuple};
use super::{Garbage, TableAlloc, TableRt, ThreadState, ZenEngine};
use crate::alloc::PAGE_SIZE;
use crate::catalog::TableId;
use crate::cc::tid_timestamp;
use crate::engine::common::{PhaseClock, SlotHolder, SlotLedger};
use crate::engine::{DbError, RecoveryReport};
use crate::pmem::Pool;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

fn corrupt(msg: impl Into<String>) -> DbError {
    DbError::Corrupt(msg.into())
}

/// What scanning one region found.
#[derive(Default)]
struct RegionScan {
    region: usize,
    ts_commit: u64,
    max_cts: u64,
    free: HashMap<TableId, Vec<u64>>,
    garbage: Vec<Garbage>,
    pending: u64,
    discarded: u64,
    slots: u64,
}

/// Algorithm 2, `updateIndexGC`: keeps the newest version of `key` in the index (concurrent
/// scanners may race on one key: the compare-and-replace loop settles it).
fn update_index_gc(
    pool: &Pool,
    table: &TableRt,
    key: u64,
    slot: u64,
    cts: u64,
    out: &mut RegionScan,
) {
    loop {
        match table.index.get(key) {
            None => {
                if table.index.insert_new(key, slot).is_ok() {
                    return;
                }
            }
            Some(p) => {
                let pc = tuple::cts(pool.read_u64(p + tuple::WORD));
                if pc > cts {
                    out.garbage.push(Garbage {
                        table: table.id,
                        slot,
                        tid: pc,
                        reuse: tid_timestamp(pc),
                        header: 0,
                    });
                    return;
                }
                if table.index.replace_if(key, p, slot) {
                    out.garbage.push(Garbage {
                        table: table.id,
                        slot: p,
                        tid: cts,
                        reuse: tid_timestamp(cts),
                        header: 0,
                    });
                    return;
                }
            }
        }
    }
}

/// Algorithm 2, `scanRegion`, with `ts-commit` starting at the region's persisted commit
/// `watermark` (0 unless a table drop wrote one, `drop.rs`). A dropped table's pages still
/// there count for their LP evidence only: their tuples are neither indexed nor freed here (the
/// pages are freed after the scan).
fn scan_region(
    pool: &Pool,
    tables: &[Arc<TableRt>],
    region: usize,
    watermark: u64,
    pages: &[(TableId, u64)],
) -> Result<RegionScan, DbError> {
    let mut out = RegionScan {
        region,
        ts_commit: watermark,
        max_cts: watermark,
        ..RegionScan::default()
    };
    let mut pending: Vec<(TableId, u64, u64)> = Vec::new();
    for &(table_id, page) in pages {
        let table = &tables[table_id as usize];
        let live = table.schema.is_live();
        for i in 0..PAGE_SIZE / table.slot {
            let slot = page + i * table.slot;
            let word = pool.read_u64(slot + tuple::WORD);
            let cts = tuple::cts(word);
            if let Some(problem) = header_word_problem(word, region) {
                return Err(corrupt(format!(
                    "table {}: NVM-tuple at {slot} in region {region}: {problem}",
                    table.schema.name
                )));
            }
            out.slots += 1;
            out.max_cts = out.max_cts.max(cts);
            if word & tuple::LP != 0 {
                out.ts_commit = out.ts_commit.max(cts); // lines 11–12
            }
            if !live {
                continue;
            }
            if cts == 0 {
                out.free.entry(table_id).or_default().push(slot); // line 14 (empty)
            } else if cts <= out.ts_commit {
                let key = pool.read_u64(slot + tuple::KEY);
                update_index_gc(pool, table, key, slot, cts, &mut out); // line 16
            } else {
                pending.push((table_id, slot, cts)); // line 18
            }
        }
    }
    out.pending = pending.len() as u64;
    let mut zeroed = false;
    for (table_id, slot, cts) in pending {
        if cts <= out.ts_commit {
            let key = pool.read_u64(slot + tuple::KEY);
            update_index_gc(pool, &tables[table_id as usize], key, slot, cts, &mut out);
        } else {
            // Lines 23–24: the crash hit this transaction's persist; mark the slot empty.
            pool.write_u64(slot + tuple::WORD, 0);
            pool.flush(slot, 8);
            zeroed = true;
            out.discarded += 1;
            out.free.entry(table_id).or_default().push(slot);
        }
    }
    if zeroed {
        pool.fence(); // line 25
    }
    Ok(out)
}

/// What is wrong with an NVM-tuple header word found in `region`'s pages, if anything.
///
/// Internal consistency, checked at recovery for free (no checksum on the commit path): a word is
/// 0 (empty) or holds a non-zero Tx-CTS below [`TID_LIMIT`](crate::engine::common::TID_LIMIT);
/// a version is written only by its region's thread (a
/// transaction persists into its own thread's region, §3.3.3), and a tid's low byte is that
/// thread's slot, so the Tx-CTS must name the region. A stale word left by a lost store is an
/// older version of the same region, which passes.
pub(crate) fn header_word_problem(word: u64, region: usize) -> Option<String> {
    let cts = tuple::cts(word);
    let thread_mask = (1u64 << crate::cc::TID_THREAD_BITS) - 1;
    if word != 0 && cts == 0 {
        Some(format!("header word {word:#x} has flags but no Tx-CTS"))
    } else if cts >= crate::engine::common::TID_LIMIT {
        Some(format!(
            "Tx-CTS {cts:#x} is beyond any commit tid (2^56: 2^48 µs of clock)"
        ))
    } else if cts != 0 && (cts & thread_mask) as usize != region {
        Some(format!(
            "Tx-CTS {cts:#x} names thread {}, not the region's thread",
            cts & thread_mask
        ))
    } else {
        None
    }
}

/// Runs recovery; returns the report and the timestamp floor for the tid clock.
pub(super) fn recover(engine: &mut ZenEngine) -> Result<(RecoveryReport, u64), DbError> {
    let started = Instant::now();
    let mut report = RecoveryReport::default();
    let mut phase = PhaseClock::start();
    let pool = engine.pool.clone();
    let threads = engine.config.max_threads;
    let tables = engine.tables.read().clone();

    // Phase 1: the page table maps heap pages to regions (thread slots) and tables.
    let mut regions: Vec<Vec<(TableId, u64)>> = vec![Vec::new(); threads];
    for (index, tag) in engine.pages.allocated(&pool)? {
        let owner = tag.owner as usize;
        match tag.kind {
            kind::META => {}
            kind::HEAP if (tag.value as usize) < tables.len() && owner < threads => {
                regions[owner].push((tag.value as TableId, engine.pages.page_offset(index)))
            }
            other => {
                return Err(corrupt(format!(
                    "page {index} has tag kind {other}, owner {owner}, value {} that the Zen layout does not use",
                    tag.value
                )))
            }
        }
    }
    let heap_pages: usize = regions.iter().map(Vec::len).sum();
    phase.lap(&mut report, "page table");

    // Phase 2: Algorithm 2 on every region, regions spread over the available cores.
    let watermarks: Vec<u64> = (0..threads)
        .map(|r| super::drop::watermark(&pool, engine.meta_page, r))
        .collect();
    let busy: Vec<usize> = (0..threads).filter(|&r| !regions[r].is_empty()).collect();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(busy.len().max(1));
    let scans: Vec<RegionScan> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (pool, tables, regions, busy) = (&pool, &tables, &regions, &busy);
                let watermarks = &watermarks;
                s.spawn(move || {
                    busy.iter()
                        .skip(w)
                        .step_by(workers)
                        .map(|&r| scan_region(pool, tables, r, watermarks[r], &regions[r]))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        crate::engine::common::join_parts(handles)
    })?;
    let mut states: Vec<ThreadState> = (0..threads).map(|_| ThreadState::default()).collect();
    for st in states.iter_mut() {
        st.tables = (0..tables.len()).map(|_| TableAlloc::default()).collect();
    }
    // A region without pages keeps its watermark as its latest commit.
    for (r, &w) in watermarks.iter().enumerate() {
        engine.region_commit[r].store(w, Ordering::Release);
    }
    let mut max_cts = watermarks.iter().copied().max().unwrap_or(0);
    let (mut pending, mut discarded, mut slots, mut old_versions) = (0u64, 0u64, 0u64, 0u64);
    for scan in scans {
        max_cts = max_cts.max(scan.max_cts);
        pending += scan.pending;
        discarded += scan.discarded;
        slots += scan.slots;
        old_versions += scan.garbage.len() as u64;
        engine.region_commit[scan.region].store(scan.ts_commit, Ordering::Release);
        let st = &mut states[scan.region];
        for (table, mut free) in scan.free {
            // Pop from the end: lowest offsets first.
            free.sort_unstable_by(|a, b| b.cmp(a));
            st.tables[table as usize].free = free;
        }
        st.garbage.extend(scan.garbage);
    }
    phase.lap(&mut report, "scan regions (Algorithm 2)");

    // Interrupted or finished drops (`drop.rs`, steps 2 to 4): the LP evidence the scan found
    // becomes the watermarks before any page of a dropped table is freed.
    let dropped = engine.catalog.lock().dropped_ids();
    let mut freed = 0;
    if !dropped.is_empty() {
        let holds_pages = regions.iter().flatten().any(|(t, _)| dropped.contains(t));
        if holds_pages {
            let commits = engine
                .region_commit
                .iter()
                .map(|c| c.load(Ordering::Acquire));
            super::drop::raise_watermarks(&pool, engine.meta_page, commits);
            freed = super::drop::free_pages(&pool, &engine.pages, &dropped)?;
        }
        let mut catalog = engine.catalog.lock();
        if let Some(done) = engine.catalog_store.store_drops_finished(&pool, &catalog)? {
            for &t in &dropped {
                let schema = done.tables[t as usize].clone();
                engine.tables.write()[t as usize] =
                    Arc::new(TableRt::new(t, schema, &engine.config));
            }
            *catalog = done;
        }
        phase.lap(&mut report, "finish table drops");
    }

    // Phase 3: drop deleted keys (their tombstones become garbage), rebuild secondary indexes.
    let mut rows = 0u64;
    let mut tombstones = 0u64;
    for table in &tables {
        let mut live: Vec<(u64, u64)> = Vec::with_capacity(table.index.len());
        table.index.for_each(|k, v| live.push((k, v)));
        let mut row = vec![0u8; table.row];
        for (key, slot) in live {
            let word = pool.read_u64(slot + tuple::WORD);
            if word & tuple::DELETED != 0 {
                table.index.remove_if(key, slot);
                let owner = engine.region_of_slot(slot);
                states[owner].tombs.push_back(Garbage {
                    table: table.id,
                    slot,
                    tid: tuple::cts(word),
                    reuse: tid_timestamp(tuple::cts(word)),
                    header: word,
                });
                tombstones += 1;
                continue;
            }
            rows += 1;
            if !table.secondary.is_empty() {
                pool.read_bytes(slot + tuple::HEADER, &mut row);
                for (si, sec) in table.secondary.iter().enumerate() {
                    sec.insert(table.secondary_key(si, &row), key);
                }
            }
        }
    }
    for (t, st) in states.iter_mut().enumerate() {
        st.garbage.make_contiguous().sort_unstable_by_key(|g| g.tid);
        st.tombs.make_contiguous().sort_unstable_by_key(|g| g.tid);
        st.last_tid = max_cts;
        let first = st.garbage.front().map_or(u64::MAX, |g| g.tid);
        engine.gc_done[t].store(first, Ordering::Release);
    }
    for (slot_state, st) in engine.threads.iter().zip(states) {
        *slot_state.lock() = Some(st);
    }
    phase.lap(&mut report, "tombstones and secondary indexes");
    report.rows = rows;
    report.facts = vec![
        ("heap pages".into(), heap_pages as u64),
        ("pages of dropped tables freed".into(), freed),
        ("NVM-tuple slots scanned".into(), slots),
        ("pending-list revisits".into(), pending),
        ("uncommitted tuples discarded".into(), discarded),
        ("old versions queued as garbage".into(), old_versions),
        ("deleted keys (tombstones)".into(), tombstones),
    ];
    report.total_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok((report, tid_timestamp(max_cts)))
}

/// Indexes and heap agree: every index entry names a current Met-Cache entry or an NVM-tuple of
/// its table holding its key, committed and not deleted, and a cached entry's version is the
/// one in NVM. Returns live rows per table.
pub(super) fn check_structure(engine: &ZenEngine) -> Result<Vec<u64>, String> {
    let pool = &engine.pool;
    let tables = engine.tables.read().clone();
    let mut heap_pages: HashMap<u64, TableId> = HashMap::new();
    let mut owners: HashMap<u64, (TableId, usize)> = HashMap::new();
    for (index, tag) in engine.pages.allocated(pool).map_err(|e| e.to_string())? {
        if tag.kind == kind::HEAP {
            let page = engine.pages.page_offset(index);
            heap_pages.insert(page, tag.value as TableId);
            owners.insert(page, (tag.value as TableId, tag.owner as usize));
        }
    }
    let mut counts = Vec::new();
    // Every table's current versions: key → Tx-CTS, and their slots.
    let mut current: Vec<HashMap<u64, u64>> = Vec::with_capacity(tables.len());
    let mut live_slots = std::collections::HashSet::new();
    for table in &tables {
        let mut problem = None;
        let mut seen = std::collections::HashSet::new();
        let mut versions = HashMap::new();
        table.index.for_each(|key, v| {
            if problem.is_some() {
                return;
            }
            let (slot, cached_cts) = if is_cache_ref(v) {
                let e = table.cache.entry(v);
                if !e.is_current(key) {
                    problem = Some(format!(
                        "table {}: key {key} points at a Met-Cache entry that does not hold it",
                        table.schema.name
                    ));
                    return;
                }
                (
                    e.nvm().load(Ordering::Acquire),
                    Some(e.cts().load(Ordering::Acquire)),
                )
            } else {
                (v, None)
            };
            let page = slot - slot % PAGE_SIZE;
            if heap_pages.get(&page) != Some(&table.id) || (slot - page) % table.slot != 0 {
                problem = Some(format!(
                    "table {}: key {key} names {slot}, not a slot of the table",
                    table.schema.name
                ));
                return;
            }
            let word = pool.read_u64(slot + tuple::WORD);
            if tuple::cts(word) == 0 || word & tuple::DELETED != 0 {
                problem = Some(format!(
                    "table {}: key {key} names a slot that is empty or deleted",
                    table.schema.name
                ));
            } else if pool.read_u64(slot + tuple::KEY) != key {
                problem = Some(format!(
                    "table {}: key {key} names a slot holding another key",
                    table.schema.name
                ));
            } else if cached_cts.is_some_and(|c| c != tuple::cts(word)) {
                problem = Some(format!(
                    "table {}: key {key} is cached at another version than NVM holds",
                    table.schema.name
                ));
            } else if !seen.insert(slot) {
                problem = Some(format!(
                    "table {}: two keys name slot {slot}",
                    table.schema.name
                ));
            }
            versions.insert(key, tuple::cts(word));
        });
        if let Some(p) = problem {
            return Err(p);
        }
        counts.push(table.index.len() as u64);
        live_slots.extend(seen);
        current.push(versions);
    }
    check_slot_ownership(
        engine,
        &tables,
        SlotLedger::new(owners),
        &live_slots,
        &current,
    )?;
    Ok(counts)
}

/// Slot ownership and the heap → index direction (issue 19, item 5). Every slot of a heap page
/// is a current version (the index names it), or is held by exactly one structure of the region
/// that owns the page: its free list or inbox and the unallocated tail of its current page
/// (header word 0: a stale committed word there would come back as a version at the next
/// recovery), or its garbage, deferred or tombstone queue. A queued version must be older than
/// the key's current version or its tombstone, since recovery (Algorithm 2) keeps the newest
/// committed version of a key; a queued tombstone must be older than a re-inserted current
/// version. The allocation state is in DRAM, so this runs only while no worker holds its
/// thread's state (after recovery, or once every worker is dropped) and is skipped otherwise.
fn check_slot_ownership(
    engine: &ZenEngine,
    tables: &[Arc<TableRt>],
    mut ledger: SlotLedger,
    live_slots: &std::collections::HashSet<u64>,
    current: &[HashMap<u64, u64>],
) -> Result<(), String> {
    let pool = &engine.pool;
    let states: Vec<_> = engine.threads.iter().map(|m| m.lock()).collect();
    if states.iter().any(|s| s.is_none()) {
        return Ok(());
    }
    let inboxes: Vec<_> = engine.inbox.iter().map(|m| m.lock()).collect();
    let table_of = |table: TableId| {
        tables
            .get(table as usize)
            .ok_or_else(|| format!("a slot of unknown table {table} is held"))
    };
    // Every structure of a region holds slots of that region's pages only (§3.2).
    let hold = |ledger: &mut SlotLedger, slot, holder, rt: &TableRt, region| {
        ledger.hold(slot, holder, rt.id, region, true, rt.slot, PAGE_SIZE)
    };
    // Queued versions, checked against the current ones once every tombstone is known.
    let mut queued: Vec<(TableId, u64)> = Vec::new();
    let mut tombs: HashMap<(TableId, u64), u64> = HashMap::new();
    for (owner, st) in states.iter().enumerate() {
        let st = st.as_ref().expect("checked above");
        for (table, ta) in st.tables.iter().enumerate() {
            let Some(rt) = tables.get(table) else {
                if ta.free.is_empty() && ta.bump == ta.end {
                    continue;
                }
                return Err(format!(
                    "thread {owner} holds slots of unknown table {table}"
                ));
            };
            for &slot in &ta.free {
                hold(&mut ledger, slot, SlotHolder::Free, rt, owner)?;
            }
            ledger.hold_tail(ta.bump, ta.end, rt.id, owner, rt.slot, PAGE_SIZE)?;
        }
        for &(table, slot) in &*inboxes[owner] {
            let rt = table_of(table)?;
            hold(&mut ledger, slot, SlotHolder::Free, rt, owner)?;
        }
        for g in st.garbage.iter().chain(&st.deferred).chain(&st.tombs) {
            let rt = table_of(g.table)?;
            // A version is superseded into the queue of the thread that superseded it, which
            // may not own its region.
            let region = engine.region_of_slot(g.slot);
            hold(&mut ledger, g.slot, SlotHolder::Reclaim, rt, region)?;
            let word = pool.read_u64(g.slot + tuple::WORD);
            let key = pool.read_u64(g.slot + tuple::KEY);
            if word & tuple::DELETED != 0 {
                let cts = tombs.entry((g.table, key)).or_insert(0);
                *cts = (*cts).max(tuple::cts(word));
            }
            if tuple::cts(word) != 0 {
                queued.push((g.table, g.slot));
            }
        }
    }
    for (table, slot) in queued {
        let rt = table_of(table)?;
        let word = pool.read_u64(slot + tuple::WORD);
        let (key, cts) = (pool.read_u64(slot + tuple::KEY), tuple::cts(word));
        let newer = current[table as usize].get(&key).copied().unwrap_or(0);
        let deleted = word & tuple::DELETED != 0;
        let tomb = if deleted {
            0
        } else {
            tombs.get(&(table, key)).copied().unwrap_or(0)
        };
        if newer <= cts && tomb <= cts && !(deleted && newer == 0) {
            return Err(format!(
                "table {}: queued {} of key {key} at slot {slot} (Tx-CTS {cts:#x}) is not older \
                 than the key's current version ({newer:#x}) or tombstone ({tomb:#x}): the next \
                 recovery would bring it back",
                rt.schema.name,
                if deleted { "tombstone" } else { "version" }
            ));
        }
    }
    for (page, table, owner, held) in ledger.pages() {
        let rt = table_of(table)?;
        for i in 0..PAGE_SIZE / rt.slot {
            let slot = page + i * rt.slot;
            let holder = held.get(i as usize).copied().flatten();
            match (live_slots.contains(&slot), holder) {
                (true, Some(holder)) => {
                    return Err(format!(
                        "table {}: current version at slot {slot} is also in {holder} of region \
                         {owner}",
                        rt.schema.name
                    ))
                }
                (false, None) => {
                    return Err(format!(
                        "table {}: slot {slot} of region {owner} is neither a current version nor \
                         held by any free list or queue (leaked)",
                        rt.schema.name
                    ))
                }
                (false, Some(SlotHolder::Free | SlotHolder::Unallocated)) => {
                    let word = pool.read_u64(slot + tuple::WORD);
                    if word != 0 {
                        return Err(format!(
                            "table {}: free slot {slot} of region {owner} has header word \
                             {word:#x}: recovery would take it for a version",
                            rt.schema.name
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::worker::ZenWorker;
    use super::super::ZenConfig;
    use super::*;
    use crate::catalog::{ColumnType, Schema};
    use crate::cc::Protocol;
    use crate::engine::{Engine, EngineWorker, FieldWrite};
    use crate::pmem::{PersistenceDomain, PoolOptions};

    /// Issue 19, item 5: the structure check sees a leaked slot, a free slot still holding a
    /// committed header (the next recovery would take it for a version), and a queued version
    /// newer than the key's current one.
    #[test]
    fn the_structure_check_finds_leaked_stale_and_resurrectable_slots() {
        let opts = PoolOptions::new("zen", PersistenceDomain::Eadr);
        let pool = Arc::new(Pool::create_in_memory(32 << 20, &opts).unwrap());
        let mut config = ZenConfig::new(Protocol::Occ);
        config.max_threads = 2;
        let eng = ZenEngine::create(pool.clone(), config).unwrap();
        let t = eng
            .create_table(Schema::new("t", &[("v", ColumnType::U64)]))
            .unwrap();
        {
            let mut w = ZenWorker::new(eng.clone(), 0).unwrap();
            w.begin(false);
            for k in 0..20u64 {
                w.insert(t, k, &k.to_le_bytes()).unwrap();
            }
            w.commit().unwrap();
            // Updates and deletes leave superseded versions and tombstones queued.
            w.begin(false);
            let bytes = 99u64.to_le_bytes();
            for k in 5..10u64 {
                w.update(
                    t,
                    k,
                    &[FieldWrite {
                        offset: 0,
                        bytes: &bytes,
                    }],
                )
                .unwrap();
            }
            for k in 0..5u64 {
                w.delete(t, k).unwrap();
            }
            w.commit().unwrap();
        }
        assert_eq!(check_structure(&eng).unwrap(), vec![15]);
        let with_state = |f: &mut dyn FnMut(&mut ThreadState)| {
            let mut st = eng.threads[0].lock();
            f(st.as_mut().unwrap());
        };
        // A superseded version dropped from the garbage queue: leaked.
        let mut dropped = None;
        with_state(&mut |st| dropped = st.garbage.pop_back());
        let g = dropped.unwrap();
        let err = check_structure(&eng).unwrap_err();
        assert!(err.contains("leaked"), "{err}");
        // Put on a free list without zeroing its header.
        with_state(&mut |st| st.tables[t as usize].free.push(g.slot));
        let err = check_structure(&eng).unwrap_err();
        assert!(
            err.contains("recovery would take it for a version"),
            "{err}"
        );
        // Queued again, but with a Tx-CTS above the current version's.
        with_state(&mut |st| {
            st.tables[t as usize].free.pop();
            st.garbage.push_back(g);
        });
        assert!(check_structure(&eng).is_ok());
        let word = pool.read_u64(g.slot + tuple::WORD);
        // Far above any Tx-CTS the run can have reached (a small step could stay below the
        // current version's when the two commits were far apart on a loaded machine).
        pool.write_u64(g.slot + tuple::WORD, word + (1 << 50));
        let err = check_structure(&eng).unwrap_err();
        assert!(err.contains("would bring it back"), "{err}");
    }
}
