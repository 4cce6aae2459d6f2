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
use crate::engine::{common::PhaseClock, DbError, RecoveryReport};
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

/// Algorithm 2, `scanRegion`.
fn scan_region(
    pool: &Pool,
    tables: &[Arc<TableRt>],
    region: usize,
    pages: &[(TableId, u64)],
) -> Result<RegionScan, DbError> {
    let mut out = RegionScan {
        region,
        ..RegionScan::default()
    };
    let mut pending: Vec<(TableId, u64, u64)> = Vec::new();
    for &(table_id, page) in pages {
        let table = &tables[table_id as usize];
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
    let busy: Vec<usize> = (0..threads).filter(|&r| !regions[r].is_empty()).collect();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(busy.len().max(1));
    let scans: Vec<RegionScan> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (pool, tables, regions, busy) = (&pool, &tables, &regions, &busy);
                s.spawn(move || {
                    busy.iter()
                        .skip(w)
                        .step_by(workers)
                        .map(|&r| scan_region(pool, tables, r, &regions[r]))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            // A scan thread stopped by a simulated crash (or by a bug) unwinds the caller with
            // its own payload: `expect` would turn the simulator's crash into a real panic
            // (found by the crash-consistency suite when it crashes recovery itself).
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.into_iter().flatten().collect())
    })?;
    let mut states: Vec<ThreadState> = (0..threads).map(|_| ThreadState::default()).collect();
    for st in states.iter_mut() {
        st.tables = (0..tables.len()).map(|_| TableAlloc::default()).collect();
    }
    let mut max_cts = 0u64;
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
    for (index, tag) in engine.pages.allocated(pool).map_err(|e| e.to_string())? {
        if tag.kind == kind::HEAP {
            heap_pages.insert(engine.pages.page_offset(index), tag.value as TableId);
        }
    }
    let mut counts = Vec::new();
    for table in &tables {
        let mut problem = None;
        let mut seen = std::collections::HashSet::new();
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
        });
        if let Some(p) = problem {
            return Err(p);
        }
        counts.push(table.index.len() as u64);
    }
    Ok(counts)
}
