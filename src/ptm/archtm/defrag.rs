//! Online defragmentation (§4.5, §5.4 "Defragmentation"): find the 4 KiB regions whose live
//! objects use less than half of them, and move those objects elsewhere with a "mock" write
//! transaction (an ordinary transaction that copies each object unchanged, so the move is as
//! atomic and crash-safe as any update), after which the regions' blocks are collected and the
//! regions are wholly free.
//!
//! The paper's fragmentation manager is a background thread: [`super::background`] runs a pass
//! when its policy calls for one (`Inner::defrag_worthwhile`, or eagerly whenever blocks
//! were recycled); `Ptm::defragment` runs one on the caller's thread (one pass at a time).
//! Departures: a pass finds underused regions from the lookup table's live versions and the
//! classes' recycle lists (a region whose free space sits in a class's recycle list is drained
//! too, so it returns to the free list for any size), and keeps new copies out of the regions
//! it empties by taking their free space out of every list for the duration of the move (the
//! paper does not say how its migration avoids landing in the regions it drains).

use super::alloc::{class_bytes, merge_into, CLASSES};
use super::layout::block_bytes;
use super::Inner;
use crate::alloc::PAGE_SIZE;
use crate::ptm::{PtmError, PtmWorker};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The region size (§6: 4 KB).
pub const REGION: u64 = 4096;
/// A region whose live bytes are below this fraction is underutilized (§5.4: f = 50 %).
pub const UNDERUSED: f64 = 0.5;
/// The policy's window: a size class is idle once no slot allocated from it for this long.
pub const IDLE: Duration = Duration::from_millis(50);
/// The policy's bar: a background pass is worthwhile once the recycled blocks of idle classes
/// exceed this share of the data area.
pub const WORTHWHILE: f64 = 0.25;
/// Objects moved per mock transaction.
const BATCH: usize = 64;

/// What a defragmentation pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefragReport {
    /// Underutilized regions found.
    pub regions: u64,
    /// Objects moved.
    pub moved: u64,
    /// Objects left in place (a concurrent writer held them).
    pub skipped: u64,
    /// Bytes of idle classes' recycled blocks returned to the free list.
    pub released: u64,
}

/// Removes from `list` the parts of its extents inside `regions`; returns them.
fn split_out(list: &mut Vec<(u64, u64)>, regions: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut keep = Vec::with_capacity(list.len());
    let mut taken = Vec::new();
    for &(off, len) in list.iter() {
        let mut at = off;
        while at < off + len {
            let r = at / REGION;
            let end = ((r + 1) * REGION).min(off + len);
            let piece = (at, end - at);
            if regions.contains(&r) {
                taken.push(piece);
            } else {
                match keep.last_mut() {
                    // Merge neighbours within a page only: a block never crosses a page.
                    Some((o, l)) if *o + *l == at && *o / PAGE_SIZE == at / PAGE_SIZE => {
                        *l += piece.1
                    }
                    _ => keep.push(piece),
                }
            }
            at = end;
        }
    }
    *list = keep;
    taken
}

impl Inner {
    /// Live bytes per 4 KiB region (a block spanning regions counts in each for its share).
    pub(crate) fn region_usage(&self) -> BTreeMap<u64, (u64, Vec<u64>)> {
        let mut usage: BTreeMap<u64, (u64, Vec<u64>)> = BTreeMap::new();
        for (id, e) in self.table.iter() {
            let v = e.view();
            if v.gen == 0 || v.old == 0 || super::layout::is_large(v.size) {
                continue; // large objects have pages of their own
            }
            let (start, end) = (v.old, v.old + block_bytes(v.size));
            for r in start / REGION..=(end - 1) / REGION {
                let lo = start.max(r * REGION);
                let hi = end.min((r + 1) * REGION);
                let u = usage.entry(r).or_default();
                u.0 += hi - lo;
                u.1.push(v.gen << 32 | id);
            }
        }
        usage
    }

    /// Takes out of every free list (the slots' lists, the free list, the recycle lists) the
    /// free space that lies in `regions`, and returns it: class blocks that overlap a region
    /// whole (their bytes are free, wherever they lie), extents cut at the regions' bounds.
    fn quarantine(&self, regions: &BTreeSet<u64>) -> Vec<(u64, u64)> {
        let overlaps = |off: u64, len: u64| {
            (off / REGION..=(off + len - 1) / REGION).any(|r| regions.contains(&r))
        };
        let a = &self.alloc;
        let mut out = Vec::new();
        for l in &a.slots {
            let mut l = l.lock();
            for (c, list) in l.classes.iter_mut().enumerate() {
                let size = class_bytes(c);
                list.retain(|&off| {
                    let hit = overlaps(off, size);
                    if hit {
                        out.push((off, size));
                    }
                    !hit
                });
            }
            out.append(&mut split_out(&mut l.extents, regions));
        }
        out.append(&mut split_out(&mut a.free.lock(), regions));
        out.append(&mut split_out(&mut a.recycle.lock(), regions));
        for (c, r) in a.recycled.iter().enumerate() {
            let size = class_bytes(c);
            let mut r = r.lock();
            for &region in regions {
                // Blocks that start less than a block before the region, or inside it.
                let from = (region * REGION + 1).saturating_sub(size);
                let hit: Vec<u64> = r.range(from..(region + 1) * REGION).copied().collect();
                for off in hit {
                    r.remove(&off);
                    out.push((off, size));
                }
            }
        }
        out
    }

    /// Regions that hold recycled blocks of a size class.
    fn regions_with_recycled_blocks(&self) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        for (c, r) in self.alloc.recycled.iter().enumerate() {
            let size = class_bytes(c);
            for &off in r.lock().iter() {
                out.extend(off / REGION..=(off + size - 1) / REGION);
            }
        }
        out
    }

    /// The size classes no slot allocated from for [`IDLE`] (by class). Reads and clears the
    /// classes' use flags, so its resolution is the caller's period (the background thread's).
    pub(crate) fn idle_classes(&self) -> Vec<bool> {
        let now = Instant::now();
        let mut seen = self.alloc.class_seen.lock();
        (0..CLASSES)
            .map(|c| {
                if self.alloc.class_used[c].swap(false, Ordering::Relaxed) {
                    seen[c] = now;
                }
                now.duration_since(seen[c]) >= IDLE
            })
            .collect()
    }

    /// Whether a background pass is worthwhile: the recycled blocks of the `idle` classes
    /// exceed [`WORTHWHILE`] of the data area. Memory no class in use will take back; below
    /// the bar a pass would move objects to gain little.
    pub(crate) fn defrag_worthwhile(&self, idle: &[bool]) -> bool {
        let stranded: u64 = (self.alloc.recycled.iter().enumerate())
            .filter(|&(c, _)| idle[c])
            .map(|(c, r)| r.lock().len() as u64 * class_bytes(c))
            .sum();
        let data = self.alloc.pages.lock().len() as u64 * PAGE_SIZE;
        stranded as f64 > WORTHWHILE * data as f64
    }

    /// One defragmentation pass with `worker` (on the engine's reserved slot): with `idle`,
    /// first returns those classes' recycled blocks to the free list; then §4.5's rule, every
    /// region below half used drained.
    pub(crate) fn defragment(
        &self,
        worker: &mut dyn PtmWorker,
        idle: Option<&[bool]>,
    ) -> Result<DefragReport, PtmError> {
        let _one = self.defrag_lock.lock();
        // Finish pending collections first, so freed blocks count as free.
        self.gc();
        let released = idle.map_or(0, |idle| self.release_recycled(|c| idle[c]));
        let usage = self.region_usage();
        let mut regions = BTreeSet::new();
        let mut objects = BTreeSet::new();
        // Regions with live objects, and regions whose free space sits in a class's recycle
        // list (no other class can use it until the region is returned to the free list).
        let mut candidates: BTreeSet<u64> = usage.keys().copied().collect();
        candidates.append(&mut self.regions_with_recycled_blocks());
        let no_objects = (0, Vec::new());
        for r in candidates {
            let (used, handles) = usage.get(&r).unwrap_or(&no_objects);
            if (*used as f64) < UNDERUSED * REGION as f64 {
                // Only regions of small objects: moving a large object empties little.
                if handles.iter().all(|&h| {
                    let e = self.table.get(h & 0xffff_ffff).expect("a live id");
                    block_bytes(e.size.load(Ordering::Acquire)) <= REGION / 2
                }) {
                    regions.insert(r);
                    objects.extend(handles.iter().copied());
                }
            }
        }
        let mut report = DefragReport {
            regions: regions.len() as u64,
            released,
            ..Default::default()
        };
        self.counters
            .defrag_released
            .fetch_add(released, Ordering::Relaxed);
        if regions.is_empty() {
            return Ok(report);
        }
        // Quarantine the regions' free space: the copies must land elsewhere.
        let mut quarantine = self.quarantine(&regions);
        let objects: Vec<u64> = objects.into_iter().filter(|&h| h != self.root).collect();
        let mut result = Ok(());
        for batch in objects.chunks(BATCH) {
            worker.begin();
            let mut moved = 0;
            let mut failed = None;
            for &h in batch {
                match worker.write(h, 0, &[]) {
                    Ok(()) => moved += 1,
                    Err(PtmError::Conflict { .. }) | Err(PtmError::InvalidHandle { .. }) => {
                        report.skipped += 1
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                worker.abort();
                result = Err(e);
                break;
            }
            if let Err(e) = worker.commit() {
                result = Err(e);
                break;
            }
            report.moved += moved;
        }
        // The moved objects' old blocks, now collected into the recycle lists, are free space
        // of the regions too: the regions go back to the free list whole, for any size.
        self.gc();
        quarantine.append(&mut self.quarantine(&regions));
        merge_into(&mut self.alloc.free.lock(), quarantine);
        self.counters.defrag_passes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .defrag_moved
            .fetch_add(report.moved, Ordering::Relaxed);
        result.map(|()| report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_out_never_merges_across_a_page() {
        let p = PAGE_SIZE;
        // Two extents that touch at a page boundary stay two (a block must not cross it).
        let mut list = vec![(p - 64, 64), (p, 128)];
        assert!(split_out(&mut list, &BTreeSet::new()).is_empty());
        assert_eq!(list, vec![(p - 64, 64), (p, 128)]);
        // The middle region of one extent is taken out; the rest stays.
        let mut list = vec![(p, 3 * REGION)];
        let taken = split_out(&mut list, &[p / REGION + 1].into_iter().collect());
        assert_eq!(taken, vec![(p + REGION, REGION)]);
        assert_eq!(list, vec![(p, REGION), (p + 2 * REGION, REGION)]);
    }
}
