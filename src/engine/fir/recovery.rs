//! FIR recovery (§4.4) and the structure check.
//!
//! Undo/redo (§4.4.1): a version is committed iff its txnId is at most the LCTT word of the
//! thread whose region holds it. Committed versions form a prefix of every region (the thread's
//! transactions commit in order and each persists before its LCTT word), so each region is read
//! up to its first uncommitted slot; the slots after it that are not empty belong to the
//! transaction the crash interrupted and get their txnId word zeroed (undo), durably, so that no
//! later LCTT value can make them look committed. Of the committed versions the largest txnId of
//! each key wins (redo), since MVTO orders every key's versions by txnId.
//!
//! With an index leaf checkpoint (`checkpoint.rs`) recovery loads its entries and reads each
//! region only from its first committed version with a txnId ≥ the checkpoint's CT, found by a
//! binary search (regions are time-ordered): O(m) in the versions written since, plus the
//! checkpoint itself. Without one, CT is 0 and every region is read from its start.

use super::checkpoint::{CkptDir, CkptPage, Entry};
use super::layout::{checkpoint as ck, kind, tuple};
use super::storage::{self, state, Region, NONE};
use super::{FirEngine, TableRt, ThreadState};
use crate::alloc::PageManager;
use crate::catalog::TableId;
use crate::engine::common::{PhaseClock, TID_LIMIT};
use crate::engine::{DbError, RecoveryReport};
use crate::index::PrimaryIndex;
use crate::pmem::Pool;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

fn corrupt(m: String) -> DbError {
    DbError::Corrupt(m)
}

/// What the scan of one region found.
struct RegionScan {
    thread: usize,
    table: TableId,
    /// The append position after the last committed version.
    position: (usize, u64),
    /// Committed versions with a txnId ≥ CT: (txnId, key, logical address, tombstone).
    versions: Vec<(u64, u64, u64, bool)>,
    /// Committed versions below CT the binary search skipped.
    skipped: u64,
    /// Uncommitted versions whose word was zeroed.
    undone: u64,
    /// Slots whose tuple_content word the scan read (the binary search's probes, the versions
    /// from CT on, the non-empty slots past the committed prefix): O(m + log n), the test of
    /// §4.4.1's claim.
    slots_read: u64,
}

/// The txnId of the committed version in slot `i` of a region, or `None` if the slot holds none.
fn committed_txn(
    pool: &Pool,
    pages: &PageManager,
    blocks: &[u64],
    slot: u64,
    per: u64,
    i: u64,
    lctt: u64,
) -> Option<u64> {
    let at = pages.page_offset(blocks[(i / per) as usize]) + (i % per) * slot;
    let txn = pool.read_u64(at) & tuple::TXN_MASK;
    (txn != 0 && txn <= lctt).then_some(txn)
}

/// Reads one region from its first committed version with a txnId ≥ `ct` (found by a binary
/// search: a region is time-ordered, §4.4.1) up to its first uncommitted slot, and undoes the
/// slots after it.
fn scan_region(
    pool: &Pool,
    pages: &PageManager,
    (thread, table): (usize, TableId),
    blocks: &[u64],
    (lctt, ct): (u64, u64),
    (slot, per): (u64, u64),
) -> Result<RegionScan, DbError> {
    let total = blocks.len() as u64 * per;
    let mut out = RegionScan {
        thread,
        table,
        position: (
            blocks.len().saturating_sub(1),
            if blocks.is_empty() { 0 } else { per },
        ),
        versions: Vec::new(),
        skipped: 0,
        undone: 0,
        slots_read: 0,
    };
    // The committed versions below CT are a prefix of the region: skip it.
    let (mut lo, mut hi) = (0, total);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        out.slots_read += 1;
        if committed_txn(pool, pages, blocks, slot, per, mid, lctt).is_some_and(|t| t < ct) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    out.skipped = lo;
    let mut end: Option<(usize, u64)> = None;
    let first_block = (lo / per) as usize;
    for (b, &block) in blocks.iter().enumerate().skip(first_block) {
        let page = pages.page_offset(block);
        let mut off = if b == first_block { lo % per } else { 0 };
        while off < per {
            let at = page + off * slot;
            if end.is_none() {
                out.slots_read += 1;
                let word = pool.read_u64(at);
                let txn = word & tuple::TXN_MASK;
                if txn != 0 && txn <= lctt {
                    let key = pool.read_u64(at + tuple::KEY);
                    let tomb = word & tuple::TOMBSTONE != 0;
                    let addr = storage::logical(thread, block, off);
                    out.versions.push((txn, key, addr, tomb));
                    off += 1;
                    continue;
                }
                end = Some((b, off));
            }
            // Past the committed prefix: skip empty stretches quickly, undo what is not empty.
            let Some(nonzero) = PageManager::first_nonzero(pool, at, (per - off) * slot) else {
                break;
            };
            off = (nonzero - page) / slot;
            let at = page + off * slot;
            out.slots_read += 1;
            if pool.read_u64(at) != 0 {
                pool.write_u64(at, 0);
                pool.flush(at, 8);
                out.undone += 1;
            }
            off += 1;
        }
    }
    if out.undone > 0 {
        pool.fence();
    }
    if let Some(p) = end {
        out.position = p;
    }
    Ok(out)
}

/// Writes the header of a committed version found by recovery (the newest of its key).
fn install_header(h: &storage::Header, key: u64, txn: u64) {
    h.begin.store(txn, Ordering::Relaxed);
    h.end.store(u64::MAX, Ordering::Relaxed);
    h.read.store(txn, Ordering::Relaxed);
    h.prev.store(NONE, Ordering::Relaxed);
    h.key.store(key, Ordering::Relaxed);
    h.state.store(state::COMMITTED, Ordering::Release);
}

/// The valid checkpoint's directory, as recovery reads it from the meta page.
struct DirRead {
    generation: u64,
    ct: u64,
    entries: u64,
    /// 1 if it is an incremental checkpoint, 0 if full.
    incremental: u64,
    /// When it was published (ms since the Unix epoch; 0: unknown) and how long it took (µs).
    published_ms: u64,
    took_us: u64,
    /// Its pages, in key order.
    listed: Vec<u64>,
}

/// Reads and checks the valid index leaf checkpoint's directory, and frees the checkpoint pages
/// it does not name (a checkpoint a crash interrupted, or pages a newer one replaced and had not
/// freed yet). CT is 0 without a checkpoint.
fn read_directory(engine: &FirEngine, checkpoint_pages: &[u64]) -> Result<DirRead, DbError> {
    let pool = &engine.pool;
    let generation = pool.read_u64(engine.ckpt_gen_at);
    let mut dir = DirRead {
        generation,
        ct: 0,
        entries: 0,
        incremental: 0,
        published_ms: 0,
        took_us: 0,
        listed: Vec::new(),
    };
    if generation != 0 {
        let at = engine.dir_at(generation);
        let r = |f: u64| pool.read_u64(at + f);
        let (slot_gen, count) = (r(ck::DIR_GEN), r(ck::DIR_PAGES));
        (dir.ct, dir.entries) = (r(ck::DIR_CT), r(ck::DIR_ENTRIES));
        (dir.incremental, dir.published_ms, dir.took_us) =
            (r(ck::DIR_KIND), r(ck::DIR_PUBLISHED_MS), r(ck::DIR_TOOK_US));
        if slot_gen != generation || count > ck::MAX_PAGES || dir.ct >= TID_LIMIT {
            return Err(corrupt(format!(
                "the meta page names index checkpoint {generation}, but its directory holds generation {slot_gen}, {count} pages, CT {}",
                dir.ct
            )));
        }
        let mut buf = vec![0u8; 8 * count as usize];
        pool.read_bytes(at + ck::DIR_FIRST, &mut buf);
        dir.listed = buf
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        let mut sorted = dir.listed.clone();
        sorted.sort_unstable();
        for (i, &p) in dir.listed.iter().enumerate() {
            if checkpoint_pages.binary_search(&p).is_err() {
                return Err(corrupt(format!(
                    "index checkpoint {generation} names page {p} (number {i}), which is not an allocated checkpoint page"
                )));
            }
        }
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(corrupt(format!(
                "index checkpoint {generation} names a page twice"
            )));
        }
        for &page in checkpoint_pages {
            if sorted.binary_search(&page).is_err() {
                engine.pages.free(pool, page);
            }
        }
    } else {
        for &page in checkpoint_pages {
            engine.pages.free(pool, page);
        }
    }
    Ok(dir)
}

/// The entry count of each page of checkpoint `generation` (`listed`, in key order), from the
/// page headers, checked; they place each page's entries in the one array recovery reads them
/// into.
fn page_counts(engine: &FirEngine, generation: u64, listed: &[u64]) -> Result<Vec<u64>, DbError> {
    let pool = &engine.pool;
    listed
        .iter()
        .map(|&page| {
            let at = engine.pages.page_offset(page);
            let (wrote, n) = (pool.read_u64(at + ck::GEN), pool.read_u64(at + ck::COUNT));
            if wrote == 0 || wrote > generation || n == 0 || n > ck::PER_PAGE {
                return Err(corrupt(format!(
                    "page {page} of index checkpoint {generation} is damaged: written by generation {wrote}, {n} entries"
                )));
            }
            Ok(n)
        })
        .collect()
}

/// Reads checkpoint `pages` (one thread's share; `out` holds exactly their entries, `counts`
/// says how many each has) and checks every entry against the tiles and the LCTT; the indexes
/// are built afterwards from every share at once (`build_indexes`).
fn read_pages(
    engine: &FirEngine,
    tables: &[Arc<TableRt>],
    lctt: &[u64],
    generation: u64,
    (pages, counts): (&[u64], &[u64]),
    out: &mut [Entry],
) -> Result<Vec<CkptPage>, DbError> {
    let mut read = Vec::with_capacity(pages.len());
    let mut buf = Vec::new();
    let mut rest = out;
    for (&page, &n) in pages.iter().zip(counts) {
        let (mine, after) = std::mem::take(&mut rest).split_at_mut(n as usize);
        rest = after;
        engine.read_page_into(page, mine, &mut buf);
        let mut prev: Option<(u64, u64)> = None;
        for &[table, key, txn, addr] in mine.iter() {
            let bad = |why: &str| {
                corrupt(format!(
                    "index checkpoint {generation}: entry (table {table}, key {key}, txnId {txn}, address {addr:#x}) {why}"
                ))
            };
            if prev.is_some_and(|p| p >= (table, key)) {
                return Err(bad("is out of key order"));
            }
            prev = Some((table, key));
            let Some(t) = tables.get(table as usize) else {
                return Err(bad("names no table"));
            };
            if !t.schema.is_live() {
                continue; // a dropped table's: its blocks are gone (`drop.rs`)
            }
            let block = storage::block_of(addr) as usize;
            let region = storage::region_of(addr);
            match engine.tiles.get(block).and_then(|t| t.get()) {
                Some(tile)
                    if u64::from(tile.table()) == table
                        && region < lctt.len()
                        && storage::offset_of(addr) < tile.headers.len() as u64 => {}
                _ => return Err(bad("names no slot of a block of its table")),
            }
            if txn == 0 || txn > lctt[region] {
                return Err(bad("is not a committed version"));
            }
        }
        read.push(CkptPage {
            page,
            first: (mine[0][0], mine[0][1]),
            entries: n,
        });
    }
    Ok(read)
}

/// A share of the checkpoint's entries bucketed by block: `starts[b]..starts[b + 1]` of
/// `entries` are block `b`'s, as (slot offset, key, txnId).
struct ByBlock {
    starts: Vec<usize>,
    entries: Vec<(u64, u64, u64)>,
}

/// Buckets a share of the checked checkpoint entries by block, with a counting sort, O(n): a
/// checkpoint is in key order, which scatters its versions over the blocks (written in that
/// order, nearly every header write missed the cache and the TLB; sorting them by address,
/// n log n, was about 40 % of this step's samples in a profile at 1 GiB).
fn bucket_by_block(entries: &[Entry], blocks: usize) -> ByBlock {
    let mut starts = vec![0usize; blocks + 1];
    for e in entries {
        starts[storage::block_of(e[3]) as usize + 1] += 1;
    }
    for b in 0..blocks {
        starts[b + 1] += starts[b];
    }
    let mut next = starts.clone();
    let mut by_block = vec![(0u64, 0u64, 0u64); entries.len()];
    for &[_, key, txn, addr] in entries {
        let b = storage::block_of(addr) as usize;
        by_block[next[b]] = (storage::offset_of(addr), key, txn);
        next[b] += 1;
    }
    ByBlock {
        starts,
        entries: by_block,
    }
}

/// Writes the headers of the checked checkpoint entries into the tiles over `workers` threads:
/// each thread buckets its share of the entries by block ([`bucket_by_block`]), then installs
/// every share's entries of its own range of blocks (ranges of about equal entry counts). So a
/// tile is written by one thread only: split by key range instead, both threads wrote into
/// every tile, and the cache lines of its headers and update_map words (a `fetch_and` per
/// entry) moved between the cores.
fn install_headers(engine: &FirEngine, entries: &[Entry], workers: usize) -> Result<(), DbError> {
    let blocks = engine.tiles.len();
    let workers = workers.max(1);
    let share = entries.len().div_ceil(workers).max(1);
    let shares: Vec<ByBlock> = std::thread::scope(|s| {
        let handles: Vec<_> = entries
            .chunks(share)
            .map(|part| s.spawn(move || Ok::<_, DbError>(vec![bucket_by_block(part, blocks)])))
            .collect();
        crate::engine::common::join_parts(handles)
    })?;
    // Block ranges of about `share` entries each, from the entries before each block.
    let before = |b: usize| shares.iter().map(|p| p.starts[b]).sum::<usize>();
    let mut bounds = vec![0usize];
    for b in 1..blocks {
        if before(b) >= share * bounds.len() {
            bounds.push(b);
        }
    }
    bounds.push(blocks);
    let shares = &shares;
    std::thread::scope(|s| {
        let handles: Vec<_> = bounds
            .windows(2)
            .map(|range| {
                let range = range[0]..range[1];
                s.spawn(move || {
                    let mut live: Vec<u64> = Vec::new();
                    for b in range {
                        if shares.iter().all(|p| p.starts[b] == p.starts[b + 1]) {
                            continue;
                        }
                        let tile = engine.tile_of(storage::logical(0, b as u64, 0));
                        live.clear();
                        live.resize(tile.update_map.len(), 0);
                        for part in shares {
                            for &(offset, key, txn) in
                                &part.entries[part.starts[b]..part.starts[b + 1]]
                            {
                                install_header(&tile.headers[offset as usize], key, txn);
                                live[(offset / 64) as usize] |= 1 << (offset % 64);
                            }
                        }
                        // One update_map write per 64 slots instead of a locked one per entry.
                        tile.mark_live_bits(&live);
                    }
                    Ok::<_, DbError>(Vec::<()>::new())
                })
            })
            .collect();
        crate::engine::common::join_parts(handles)
    })?;
    Ok(())
}

/// Builds each table's primary index from its checkpoint entries at once (§4.4.2's bottom-up
/// build: `PrimaryIndex::from_sorted`, a hash index filled shard by shard in parallel, an
/// ordered one leaves first), with room for `extra[table]` more keys (the versions redo may
/// insert). The entries are in (table, key) order.
fn build_indexes(
    tables: &[Arc<TableRt>],
    entries: &[Entry],
    extra: &[u64],
    generation: u64,
) -> Result<Vec<Arc<TableRt>>, DbError> {
    let mut rest = entries;
    let mut built = Vec::with_capacity(tables.len());
    for (table, t) in tables.iter().enumerate() {
        // A linear search: a damaged checkpoint need not be partitioned by table.
        let mine = rest
            .iter()
            .position(|e| e[0] != table as u64)
            .unwrap_or(rest.len());
        let (this, after) = rest.split_at(mine);
        rest = after;
        let key_addr = |e: &Entry| (e[1], e[3]);
        let index = PrimaryIndex::from_sorted_by(
            t.schema.primary_index,
            this,
            key_addr,
            extra[table] as usize,
        )
        .map_err(|e| corrupt(format!("index checkpoint {generation}, table {table}: {e}")))?;
        built.push(Arc::new(TableRt::with_index(t.schema.clone(), index)));
    }
    if let Some(e) = rest.first() {
        return Err(corrupt(format!(
            "index checkpoint {generation}: entry (table {}, key {}) is out of table order",
            e[0], e[1]
        )));
    }
    Ok(built)
}

/// Loads the valid index leaf checkpoint (§4.4.2): its pages are read and checked over `workers`
/// threads, each table's index is built from its entries at once, with room for `extra[table]`
/// more keys (the versions redo may insert, so that no insert of recovery grows it), then the
/// tiles' headers are written over `workers` threads. Returns the directory.
fn load_checkpoint(
    engine: &mut FirEngine,
    tables: &mut Vec<Arc<TableRt>>,
    lctt: &[u64],
    dir: DirRead,
    extra: &[u64],
    workers: usize,
    (phase, report): (&mut PhaseClock, &mut RecoveryReport),
) -> Result<CkptDir, DbError> {
    let generation = dir.generation;
    let counts = page_counts(engine, generation, &dir.listed)?;
    let total: u64 = counts.iter().sum();
    if total != dir.entries {
        return Err(corrupt(format!(
            "index checkpoint {generation} holds {total} entries, not the {} its directory says",
            dir.entries
        )));
    }
    // One array for every entry, each thread reading its pages into its own part of it (no
    // per-thread vectors that grow and are then copied together).
    let mut entries: Vec<Entry> = vec![[0; 4]; total as usize];
    let per_worker = dir.listed.len().div_ceil(workers.max(1)).max(1);
    let pages: Vec<CkptPage> = std::thread::scope(|s| {
        let (eng, tabs): (&FirEngine, &[Arc<TableRt>]) = (engine, tables);
        let mut rest: &mut [Entry] = &mut entries;
        let mut handles = Vec::new();
        for (listed, counts) in dir.listed.chunks(per_worker).zip(counts.chunks(per_worker)) {
            let len: u64 = counts.iter().sum();
            let (mine, after) = std::mem::take(&mut rest).split_at_mut(len as usize);
            rest = after;
            handles.push(
                s.spawn(move || read_pages(eng, tabs, lctt, generation, (listed, counts), mine)),
            );
        }
        crate::engine::common::join_parts(handles)
    })?;
    if pages.windows(2).any(|w| w[0].first >= w[1].first) {
        return Err(corrupt(format!(
            "index checkpoint {generation} has its pages out of key order"
        )));
    }
    phase.lap(report, "checkpoint read");
    if tables.iter().any(|t| !t.schema.is_live()) {
        entries.retain(|e| tables[e[0] as usize].schema.is_live());
    }
    *tables = build_indexes(tables, &entries, extra, generation)?;
    *engine.tables.get_mut() = tables.clone();
    phase.lap(report, "index build");
    install_headers(engine, &entries, workers)?;
    Ok(CkptDir {
        generation,
        ct: dir.ct,
        pages,
    })
}

/// Runs recovery (§4.4): loads the index leaf checkpoint, redoes the committed versions written
/// since (undoing the interrupted transaction's), and installs the indexes, tiles, regions and
/// clock in `engine`.
pub(super) fn recover(engine: &mut FirEngine) -> Result<RecoveryReport, DbError> {
    let started = Instant::now();
    let cpu_at_start = crate::pmem::platform::process_cpu_time();
    let started_unix_ms = super::checkpoint::unix_ms();
    let mut report = RecoveryReport::default();
    let mut phase = PhaseClock::start();
    let pool = engine.pool.clone();
    let threads = engine.config.max_threads;

    // The LCTT: the last committed txnId of every thread (§4.1).
    let lctt: Vec<u64> = (0..threads)
        .map(|t| pool.read_u64(engine.lctt_word(t)))
        .collect();
    if let Some(t) = lctt.iter().position(|&v| v >= TID_LIMIT) {
        return Err(corrupt(format!(
            "the LCTT word of thread {t} is {:#x}, beyond any txnId",
            lctt[t]
        )));
    }

    // A GC free a crash interrupted (§4.5) is finished first: its blocks are not read.
    let gc_finished = engine.finish_interrupted_free()?;

    // Table drops (`drop.rs`): every block of a table that is not live is freed before the
    // regions are read, then an interrupted drop is finished.
    let dropped = engine.catalog.get_mut().dropped_ids();
    let dropped_blocks = if dropped.is_empty() {
        0
    } else {
        engine.free_blocks_of(&dropped)?
    };
    if let Some(done) = engine
        .catalog_store
        .store_drops_finished(&pool, engine.catalog.get_mut())?
    {
        for &t in &dropped {
            let schema = done.tables[t as usize].clone();
            engine.tables.get_mut()[t as usize] = Arc::new(TableRt::new(schema));
        }
        *engine.catalog.get_mut() = done;
    }
    let tables: Vec<Arc<TableRt>> = engine.tables.read().clone();

    // The page table: blocks per region, in region order; checkpoint pages.
    let mut regions: HashMap<(usize, TableId), Vec<(u64, u64)>> = HashMap::new();
    let mut checkpoint_pages: Vec<u64> = Vec::new();
    for (index, tag) in engine.pages.allocated(&pool)? {
        let owner = tag.owner as usize;
        let table = (tag.value >> super::layout::SEQ_BITS) as usize;
        let seq = tag.value & ((1 << super::layout::SEQ_BITS) - 1);
        match tag.kind {
            kind::META => {}
            kind::CHECKPOINT => checkpoint_pages.push(index),
            kind::BLOCK if owner < threads && table < tables.len() => regions
                .entry((owner, table as TableId))
                .or_default()
                .push((seq, index)),
            other => {
                return Err(corrupt(format!(
                    "page {index} has tag kind {other}, owner {owner}, value {} that the FIR layout does not use",
                    tag.value
                )))
            }
        }
    }
    // A region's blocks in sequence order (GC leaves gaps: §4.5 frees whole blocks).
    let mut region_list: Vec<((usize, TableId), Vec<u64>)> = Vec::new();
    let mut next_seq: HashMap<(usize, TableId), usize> = HashMap::new();
    for (region, mut blocks) in regions {
        blocks.sort_unstable();
        if let Some(w) = blocks.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(corrupt(format!(
                "blocks {} and {} of table {}, thread {} both are number {} of their region",
                w[0].1, w[1].1, region.1, region.0, w[0].0
            )));
        }
        next_seq.insert(region, blocks.last().map_or(0, |b| b.0 as usize + 1));
        region_list.push((region, blocks.into_iter().map(|(_, i)| i).collect()));
    }
    region_list.sort_unstable_by_key(|r| r.0);
    engine.gc.blocks_in_use.store(
        region_list.iter().map(|(_, b)| b.len() as u64).sum(),
        Ordering::Relaxed,
    );
    // The tiles (DRAM headers, one per slot of every block), made in parallel: a fresh tile is
    // written whole, so this is the one pass over DRAM proportional to the pool's blocks.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let all_blocks: Vec<(TableId, u64)> = region_list
        .iter()
        .flat_map(|((_, table), blocks)| blocks.iter().map(move |&b| (*table, b)))
        .collect();
    std::thread::scope(|s| {
        let (eng, tabs): (&FirEngine, &[Arc<TableRt>]) = (engine, &tables);
        for share in all_blocks.chunks(all_blocks.len().div_ceil(cores).max(1)) {
            s.spawn(move || {
                for &(table, block) in share {
                    eng.tile(block, table, tabs[table as usize].slot);
                }
            });
        }
    });
    phase.lap(&mut report, "page table");

    // The index leaf checkpoint's directory: CT, and the pages to load (§4.4.2).
    checkpoint_pages.sort_unstable();
    let dir = read_directory(engine, &checkpoint_pages)?;
    let ct = dir.ct;
    // How old the checkpoint is and what it was, for the report (issue 14: does the checkpointer
    // keep up with a long run?). The age counts from the wall clock at the start of recovery.
    let age_ms = (dir.published_ms != 0).then(|| started_unix_ms.saturating_sub(dir.published_ms));
    let (ckpt_incremental, ckpt_took_us) = (dir.incremental, dir.took_us);

    // Undo/redo (§4.4.1): the regions from CT on, spread over the available cores.
    let workers = cores.min(region_list.len().max(1));
    let block_slots = engine.block_slots;
    let scans: Vec<RegionScan> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (pool, pages, tables, list, lctt) =
                    (&pool, &engine.pages, &tables, &region_list, &lctt);
                s.spawn(move || {
                    list.iter()
                        .skip(w)
                        .step_by(workers)
                        .map(|&((thread, table), ref blocks)| {
                            let slot = tables[table as usize].slot;
                            let bounds = (lctt[thread], ct);
                            let geometry = (slot, storage::slots_per_block(slot, block_slots));
                            scan_region(pool, pages, (thread, table), blocks, bounds, geometry)
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        crate::engine::common::join_parts(handles)
    })?;
    let undone: u64 = scans.iter().map(|s| s.undone).sum();
    let skipped: u64 = scans.iter().map(|s| s.skipped).sum();
    let slots_read: u64 = scans.iter().map(|s| s.slots_read).sum();
    // The work since the checkpoint (§4.4.1's m), in bytes of tuple_content.
    let bytes_since_ct: u64 = scans
        .iter()
        .map(|s| s.versions.len() as u64 * tables[s.table as usize].slot)
        .sum();
    phase.lap(&mut report, "undo/redo scan");

    // The update_map (§4.5's input), rebuilt without a pass over the versions: every used slot
    // of a block starts obsolete, and installing a version (from the checkpoint or by redo)
    // marks its slot live again. One word store per 64 slots (the blocks' used prefix).
    let mut states: Vec<ThreadState> = (0..threads).map(|_| ThreadState::default()).collect();
    let mut redo_per_table = vec![0u64; tables.len()];
    for scan in &scans {
        let blocks = &region_list
            .iter()
            .find(|r| r.0 == (scan.thread, scan.table))
            .expect("every scan is of a listed region")
            .1;
        let per = engine.slots(tables[scan.table as usize].slot);
        for (b, &block) in blocks.iter().enumerate() {
            let used = match b.cmp(&scan.position.0) {
                std::cmp::Ordering::Less => per,
                std::cmp::Ordering::Equal => scan.position.1,
                std::cmp::Ordering::Greater => 0,
            };
            engine
                .tile_of(storage::logical(scan.thread, block, 0))
                .mark_all_obsolete(used);
        }
        let st = &mut states[scan.thread];
        if st.regions.len() <= scan.table as usize {
            st.regions
                .resize_with(scan.table as usize + 1, Region::default);
        }
        st.regions[scan.table as usize] = Region {
            blocks: blocks.clone(),
            next_seq: next_seq[&(scan.thread, scan.table)],
            current: scan.position.0,
            next: scan.position.1,
        };
        redo_per_table[scan.table as usize] += scan.versions.len() as u64;
    }
    phase.lap(&mut report, "update_map");

    // The checkpoint's entries into the indexes (sized for them and the redo), in parallel.
    let mut tables = tables;
    let dir = load_checkpoint(
        engine,
        &mut tables,
        &lctt,
        dir,
        &redo_per_table,
        cores,
        (&mut phase, &mut report),
    )?;
    let (generation, checkpoint_page_count) = (dir.generation, dir.pages.len() as u64);
    let from_checkpoint: u64 = tables.iter().map(|t| t.index.len() as u64).sum();
    let skipped_dropped = dir.pages.iter().map(|p| p.entries).sum::<u64>() - from_checkpoint;
    if skipped_dropped > 0 {
        // The next checkpoint is a full one: it leaves the dropped tables' entries out.
        engine.need_full.store(true, Ordering::SeqCst);
    }
    *engine.ckpt.lock() = dir;
    phase.lap(&mut report, "checkpoint headers");

    // Redo (§4.4.2: in parallel): the versions are split by key over the cores, and each part
    // is applied in txnId order: each version replaces an older one of its key (MVTO orders a
    // key's versions by txnId), a tombstone removes it. Keys never cross parts, so the threads
    // never meet on a key.
    let parts = cores.max(1);
    let mut split: Vec<Vec<Redo>> = (0..parts).map(|_| Vec::new()).collect();
    for scan in &scans {
        for &(txn, key, addr, tomb) in &scan.versions {
            let h = (key ^ (u64::from(scan.table) << 48)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            split[((h >> 32) % parts as u64) as usize].push((txn, scan.table, key, addr, tomb));
        }
    }
    let redone: u64 = split.iter().map(|p| p.len() as u64).sum();
    let outcomes: Vec<RedoOutcome> = std::thread::scope(|s| {
        let (eng, tabs): (&FirEngine, &[Arc<TableRt>]) = (engine, &tables);
        let handles: Vec<_> = split
            .into_iter()
            .map(|part| s.spawn(move || redo_part(eng, tabs, part).map(|o| vec![o])))
            .collect();
        crate::engine::common::join_parts(handles)
    })?;
    let mut max_txn = lctt.iter().copied().max().unwrap_or(0).max(ct);
    let mut deleted_up_to = vec![0u64; tables.len()];
    let (mut obsolete, mut tombstones) = (0u64, 0u64);
    for o in &outcomes {
        max_txn = max_txn.max(o.max_txn);
        obsolete += o.obsolete;
        tombstones += o.tombstones;
        for (d, &p) in deleted_up_to.iter_mut().zip(&o.deleted_up_to) {
            *d = (*d).max(p);
        }
    }
    phase.lap(&mut report, "redo");

    // Secondary indexes, from the rows the primary indexes name.
    let mut rows = 0u64;
    let mut row = Vec::new();
    for (table, t) in tables.iter().enumerate() {
        rows += t.index.len() as u64;
        t.deleted_up_to
            .store(deleted_up_to[table], Ordering::Release);
        if t.secondary.is_empty() {
            continue;
        }
        row.resize(t.row, 0);
        let mut live = Vec::new();
        t.index.for_each(|k, a| live.push((k, a)));
        for (key, addr) in live {
            pool.read_bytes(engine.content_at(addr) + tuple::HEADER, &mut row);
            for (i, sec) in t.secondary.iter().enumerate() {
                sec.insert(t.secondary_key(i, &row), key);
            }
        }
    }
    phase.lap(&mut report, "secondary indexes");

    for (slot, st) in engine.slots.iter().zip(states) {
        *slot.lock() = Some(st);
    }
    engine.clock.store(max_txn, Ordering::SeqCst);
    let last_committed = lctt.iter().copied().max().unwrap_or(0);
    engine.last_commit.store(last_committed, Ordering::Release);
    report.rows = rows;
    report.committed_in_log = redone;
    report.discarded_in_log = undone;
    report.facts = vec![
        ("regions".into(), region_list.len() as u64),
        ("checkpoint generation".into(), generation),
        ("checkpoint CT".into(), ct),
        ("last committed txnId".into(), last_committed),
        ("txnIds since CT".into(), last_committed.saturating_sub(ct)),
        ("checkpoint incremental".into(), ckpt_incremental),
        ("checkpoint took (us)".into(), ckpt_took_us),
        ("checkpoint pages".into(), checkpoint_page_count),
        ("recovery threads".into(), cores as u64),
        ("entries from the checkpoint".into(), from_checkpoint),
        ("versions before CT skipped".into(), skipped),
        ("region slots read".into(), slots_read),
        ("versions redone (txnId >= CT)".into(), redone),
        ("bytes written since CT".into(), bytes_since_ct),
        ("uncommitted versions undone".into(), undone),
        ("obsolete versions".into(), obsolete),
        ("tombstones".into(), tombstones),
        ("GC blocks whose free recovery finished".into(), gc_finished),
        ("blocks of dropped tables freed".into(), dropped_blocks),
        (
            "checkpoint entries of dropped tables skipped".into(),
            skipped_dropped,
        ),
    ];
    if let Some(age) = age_ms {
        report
            .facts
            .push(("checkpoint age at recovery (ms)".into(), age));
    }
    report.total_ms = started.elapsed().as_secs_f64() * 1e3;
    if let (Some(from), Some(to)) = (cpu_at_start, crate::pmem::platform::process_cpu_time()) {
        // On a shared machine the wall time follows the other processes' load; the CPU time
        // (user and system, every thread: page faults are system time) follows the work done.
        report.facts.push((
            "recovery CPU time (ms, all threads)".into(),
            to.saturating_sub(from).as_millis() as u64,
        ));
    }
    Ok(report)
}

/// A committed version recovery redoes: (txnId, table, key, logical address, tombstone).
type Redo = (u64, TableId, u64, u64, bool);

/// What redoing one part of the versions did.
struct RedoOutcome {
    max_txn: u64,
    deleted_up_to: Vec<u64>,
    obsolete: u64,
    tombstones: u64,
}

/// Redoes one part of the versions written since CT (every version of a key is in the same
/// part), in txnId order, over the indexes the checkpoint filled.
fn redo_part(
    engine: &FirEngine,
    tables: &[Arc<TableRt>],
    mut part: Vec<Redo>,
) -> Result<RedoOutcome, DbError> {
    part.sort_unstable_by_key(|r| r.0);
    let mut out = RedoOutcome {
        max_txn: 0,
        deleted_up_to: vec![0; tables.len()],
        obsolete: 0,
        tombstones: 0,
    };
    // The index bucket and the new version's header of a version a few ahead are loaded while
    // this one is applied: each is a cache miss into tens of MiB, and one after another they
    // were most of redo's time.
    const AHEAD: usize = 8;
    for (i, &(txn, table, key, addr, tomb)) in part.iter().enumerate() {
        if let Some(&(_, t, k, a, _)) = part.get(i + AHEAD) {
            tables[t as usize].index.prefetch(k);
            crate::pmem::prefetch(engine.header(a));
        }
        out.max_txn = out.max_txn.max(txn);
        let t = &tables[table as usize];
        let current = t.index.get(key);
        if let Some(cur) = current {
            let cur_txn = engine.header(cur).begin.load(Ordering::Relaxed);
            if cur == addr {
                continue; // in the checkpoint already
            }
            if cur_txn == txn {
                return Err(corrupt(format!(
                    "two versions of key {key} in table {table} carry txnId {txn}"
                )));
            }
            if cur_txn > txn {
                mark_obsolete(engine, addr);
                out.obsolete += 1;
                continue;
            }
            mark_obsolete(engine, cur);
            out.obsolete += 1;
        }
        // The next incremental checkpoint merges what recovery changed into the loaded one.
        engine.marks.mark(table, key, txn);
        if tomb {
            if let Some(cur) = current {
                t.index.remove_if(key, cur);
            }
            mark_obsolete(engine, addr);
            out.deleted_up_to[table as usize] = out.deleted_up_to[table as usize].max(txn);
            out.tombstones += 1;
            continue;
        }
        install_header(engine.header(addr), key, txn);
        engine.tile_of(addr).mark_live(storage::offset_of(addr));
        match current {
            Some(cur) => {
                t.index.replace_if(key, cur, addr);
            }
            None => {
                let _ = t.index.insert_new(key, addr);
            }
        }
    }
    Ok(out)
}

fn mark_obsolete(engine: &FirEngine, addr: u64) {
    engine.tile_of(addr).mark_obsolete(storage::offset_of(addr));
}

/// Checks that indexes, tiles and the PM contents agree: every index entry names a committed,
/// live version whose tuple_content carries its key and txnId; secondary indexes hold every live
/// row; every region is committed up to its append position and empty after it. Returns the live
/// rows per table.
pub(super) fn check_structure(engine: &FirEngine) -> Result<Vec<u64>, String> {
    let pool = &engine.pool;
    let tables = engine.tables.read().clone();
    let threads = engine.config.max_threads;
    let lctt: Vec<u64> = (0..threads)
        .map(|t| pool.read_u64(engine.lctt_word(t)))
        .collect();
    let mut counts = Vec::with_capacity(tables.len());
    let mut row = Vec::new();
    for (table, t) in tables.iter().enumerate() {
        let mut problem = None;
        let mut rows = 0u64;
        row.resize(t.row, 0);
        t.index.for_each(|key, addr| {
            if problem.is_some() {
                return;
            }
            rows += 1;
            let block = storage::block_of(addr) as usize;
            let Some(tile) = engine.tiles.get(block).and_then(|t| t.get()) else {
                problem = Some(format!("key {key} of table {table} names block {block}, which has no tile"));
                return;
            };
            if tile.table() as usize != table || storage::region_of(addr) >= threads {
                problem = Some(format!("key {key} of table {table} names a block of table {} / region {}", tile.table(), storage::region_of(addr)));
                return;
            }
            let h = engine.header(addr);
            let s = h.state.load(Ordering::Acquire);
            let begin = h.begin.load(Ordering::Acquire);
            let at = engine.content_at(addr);
            let word = pool.read_u64(at);
            if s != state::COMMITTED || h.key.load(Ordering::Acquire) != key {
                problem = Some(format!("key {key} of table {table}: header state {s:#x} / key {} is not a committed live version", h.key.load(Ordering::Acquire)));
            } else if word != begin || pool.read_u64(at + tuple::KEY) != key {
                problem = Some(format!("key {key} of table {table}: content word {word:#x} / key {} does not match the header (txnId {begin})", pool.read_u64(at + tuple::KEY)));
            } else if begin > lctt[storage::region_of(addr)] {
                problem = Some(format!("key {key} of table {table}: txnId {begin} is beyond its thread's LCTT"));
            } else if !t.secondary.is_empty() {
                pool.read_bytes(at + tuple::HEADER, &mut row);
                for (i, sec) in t.secondary.iter().enumerate() {
                    if !sec.contains(t.secondary_key(i, &row), key) {
                        problem = Some(format!("key {key} of table {table} is missing from secondary index {i}"));
                    }
                }
            }
        });
        if let Some(p) = problem {
            return Err(p);
        }
        for (i, sec) in t.secondary.iter().enumerate() {
            if sec.len() as u64 != rows {
                return Err(format!(
                    "secondary index {i} of table {table} has {} entries for {rows} rows",
                    sec.len()
                ));
            }
        }
        counts.push(rows);
    }
    // Regions: committed up to the append position, empty after it.
    for (thread, slot) in engine.slots.iter().enumerate() {
        let guard = slot.lock();
        let Some(st) = guard.as_ref() else { continue };
        for (table, r) in st.regions.iter().enumerate() {
            let Some(t) = tables.get(table) else {
                return Err(format!(
                    "thread {thread} has a region of unknown table {table}"
                ));
            };
            let per = engine.slots(t.slot);
            for (b, &block) in r.blocks.iter().enumerate() {
                let page = engine.pages.page_offset(block);
                for off in 0..per {
                    let word = pool.read_u64(page + off * t.slot);
                    let before = (b, off) < (r.current, r.next);
                    let txn = word & tuple::TXN_MASK;
                    if before && (txn == 0 || txn > lctt[thread]) {
                        return Err(format!("slot {off} of block {block} (table {table}, thread {thread}) is before the append position but holds no committed version (word {word:#x})"));
                    }
                    if !before && word != 0 {
                        return Err(format!("slot {off} of block {block} (table {table}, thread {thread}) is past the append position but not empty (word {word:#x})"));
                    }
                }
            }
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::super::worker::FirWorker;
    use super::super::FirConfig;
    use super::*;
    use crate::catalog::{ColumnType, Schema};
    use crate::cc::Protocol;
    use crate::engine::{Engine, EngineWorker};
    use crate::pmem::{PersistenceDomain, PoolOptions};

    /// A checkpoint of two pages whose key ranges overlap (each page in order, their first keys
    /// in order, so only the bulk index build sees it) is refused as corrupt, naming the key,
    /// for a hash and an ordered table: a key installed twice would otherwise map to one of
    /// its two versions at random.
    #[test]
    fn a_checkpoint_whose_pages_overlap_is_refused() {
        for ordered in [false, true] {
            let opts = PoolOptions::new("fir", PersistenceDomain::Adr);
            let pool = Arc::new(Pool::create_in_memory(64 << 20, &opts).unwrap());
            let mut config = FirConfig::new(Protocol::Mvto);
            config.max_threads = 1;
            config.checkpoint_interval = None;
            let eng = FirEngine::create(pool.clone(), config.clone()).unwrap();
            let schema = Schema::new("kv", &[("v", ColumnType::U64)]);
            let t = eng
                .create_table(if ordered { schema.ordered() } else { schema })
                .unwrap();
            let keys = ck::PER_PAGE + 10;
            let mut w = FirWorker::new(eng.clone(), 0).unwrap();
            for chunk in (0..keys).collect::<Vec<_>>().chunks(10_000) {
                w.begin(false);
                for &k in chunk {
                    w.insert(t, k, &k.to_le_bytes()).unwrap();
                }
                w.commit().unwrap();
            }
            drop(w);
            let stats = eng.checkpoint().unwrap();
            assert_eq!((stats.entries, stats.pages), (keys, 2));
            // The second page's first entry takes the first page's last key.
            let second = eng.ckpt.lock().pages[1].page;
            let at = eng.pages.page_offset(second) + ck::FIRST_ENTRY + 8;
            assert_eq!(pool.read_u64(at), ck::PER_PAGE);
            pool.write_u64(at, ck::PER_PAGE - 1);
            pool.persist(at, 8);
            drop(eng);
            match FirEngine::open(pool, config) {
                Err(DbError::Corrupt(m)) => assert!(
                    m.contains(&format!("key {}", ck::PER_PAGE - 1)),
                    "ordered {ordered}: {m}"
                ),
                Err(e) => panic!("ordered {ordered}: expected a corrupt checkpoint, got {e}"),
                Ok(_) => panic!("ordered {ordered}: overlapping checkpoint pages were accepted"),
            }
        }
    }
}
