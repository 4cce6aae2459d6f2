//! The persistent hash index (`index::pm::PmHashIndex`) through its public API: a model test
//! against `HashMap` across splits and directory doublings with a recovery at the end, a
//! clean reopen of a pool file, and concurrent writers and readers across splits. Crash
//! consistency at every PM event is tested in the module (`src/index/pm/hash.rs`).

use pmtx::alloc::{PageManager, PageTag, PAGE_SIZE};
use pmtx::index::pm::{PmHashIndex, PmHashOptions};
use pmtx::pmem::{PersistenceDomain, Pool, PoolOptions};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const TAG: PageTag = PageTag {
    kind: 11,
    owner: 0,
    value: 1,
};

/// Segments of one bucket and one stash bucket: a split every few dozen keys.
const TINY: PmHashOptions = PmHashOptions {
    initial_depth: 0,
    buckets_per_segment: 1,
    stash_buckets: 1,
};

fn opts(domain: PersistenceDomain) -> PoolOptions {
    PoolOptions::new("pmhash", domain).with_counting(false)
}

fn setup(pages: u64, domain: PersistenceDomain) -> (Arc<Pool>, Arc<PageManager>) {
    let pool = Pool::create_in_memory((pages + 1) * PAGE_SIZE, &opts(domain)).unwrap();
    let pages = PageManager::format(&pool).unwrap();
    (Arc::new(pool), Arc::new(pages))
}

fn contents(index: &PmHashIndex) -> HashMap<u64, u64> {
    let mut seen = HashMap::new();
    index.for_each(|k, v| assert!(seen.insert(k, v).is_none(), "key {k} visited twice"));
    seen
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Point operations against a `HashMap` over a key space that splits a `TINY` index many
    /// times (and doubles its directory), then the same after recovery.
    #[test]
    fn matches_a_hashmap_and_recovers_it(
        ops in proptest::collection::vec((0u8..5, 0u64..600, 0u64..3), 1..2_000),
        eadr in any::<bool>(),
    ) {
        let domain = if eadr { PersistenceDomain::Eadr } else { PersistenceDomain::Adr };
        let (pool, pages) = setup(1, domain);
        let index = PmHashIndex::create_with(pool.clone(), pages.clone(), TAG, TINY).unwrap();
        let mut model = HashMap::new();
        for (op, key, value) in ops {
            // Keys spread over the whole u64 range, 0 included.
            let key = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            match op {
                0 => {
                    let expected = model.get(&key).copied();
                    prop_assert_eq!(index.insert_new(key, value).unwrap().err(), expected);
                    model.entry(key).or_insert(value);
                }
                1 => prop_assert_eq!(index.upsert(key, value).unwrap(), model.insert(key, value)),
                2 => prop_assert_eq!(index.remove(key), model.remove(&key)),
                3 => {
                    let hit = model.get(&key) == Some(&value);
                    if hit {
                        model.remove(&key);
                    }
                    prop_assert_eq!(index.remove_if(key, value), hit);
                }
                _ => {
                    let hit = model.get(&key) == Some(&value);
                    if hit {
                        model.insert(key, value + 1);
                    }
                    prop_assert_eq!(index.replace_if(key, value, value + 1), hit);
                }
            }
            prop_assert_eq!(index.get(key), model.get(&key).copied());
        }
        prop_assert_eq!(index.len(), model.len());
        prop_assert_eq!(&contents(&index), &model);
        let root = index.root();
        drop(index);
        let (index, stats) = PmHashIndex::recover(pool, pages, root).unwrap();
        prop_assert_eq!(stats.segments, index.segments());
        prop_assert_eq!(index.len(), model.len());
        prop_assert_eq!(&contents(&index), &model);
        for (&key, &value) in &model {
            prop_assert_eq!(index.get(key), Some(value));
        }
    }
}

/// A pool file closed and opened again: the index comes back whole, its recovery reads no
/// entry (it is O(segments)), and it keeps working.
#[test]
fn a_reopened_pool_file_finds_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pmhash.pool");
    let domain = PersistenceDomain::Adr;
    let root = {
        let pool = Pool::create(Some(&path), 4 * PAGE_SIZE, &opts(domain)).unwrap();
        let pages = Arc::new(PageManager::format(&pool).unwrap());
        let pool = Arc::new(pool);
        let index = PmHashIndex::create(pool.clone(), pages, TAG).unwrap();
        for key in 0..50_000u64 {
            index.insert_new(key, !key).unwrap().unwrap();
        }
        for key in (0..50_000u64).step_by(5) {
            assert_eq!(index.remove(key), Some(!key));
        }
        pool.set_root(index.root()).unwrap();
        index.root()
    };
    let pool = Arc::new(Pool::open(&path, &opts(domain)).unwrap());
    assert_eq!(pool.root(), root);
    let pages = Arc::new(PageManager::open(&pool).unwrap());
    let (index, stats) = PmHashIndex::recover(pool, pages, root).unwrap();
    assert!(stats.segments >= 64, "{stats:?}");
    assert_eq!(stats.splits_completed + stats.splits_discarded, 0);
    eprintln!(
        "recovered {} segments in {:?} ({} pages)",
        stats.segments, stats.elapsed, stats.pages
    );
    assert_eq!(index.len(), 40_000);
    for key in 0..50_000u64 {
        assert_eq!(index.get(key), (key % 5 != 0).then_some(!key), "key {key}");
    }
    assert_eq!(index.insert_new(0, 1).unwrap(), Ok(()));
    assert_eq!(index.len(), 40_001);
}

/// Counts a finished writer when dropped (also by a panic).
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// Writers insert, update and remove their own keys, splitting segments all the while, and a
/// reader checks that keys nobody touches are always found with their value.
#[test]
fn readers_always_find_stable_keys_while_writers_split_and_churn() {
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        // About 10,000 keys at most at 24 a segment: 3 to 4 pages of 127 segments.
        let (pool, pages) = setup(6, domain);
        let index = PmHashIndex::create_with(pool.clone(), pages.clone(), TAG, TINY).unwrap();
        for key in (0..6_000u64).step_by(3) {
            index.insert_new(key, key).unwrap().unwrap();
        }
        let done = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for writer in 1..3u64 {
                let (index, done) = (&index, &done);
                scope.spawn(move || {
                    // Counted even if the writer panics, so that the reader stops.
                    let _done = Done(done);
                    for round in 0..3u64 {
                        let mine = (0..12_000u64).filter(|k| k % 3 == writer);
                        for key in mine.clone() {
                            assert_eq!(index.insert_new(key, round).unwrap(), Ok(()));
                            assert!(index.replace_if(key, round, round + 1));
                        }
                        // Both writers also fight over shared keys.
                        for key in (0..200u64).map(|k| 1_000_000 + k) {
                            index.upsert(key, writer).unwrap();
                            index.remove_if(key, 3 - writer);
                        }
                        for key in mine {
                            assert_eq!(index.remove(key), Some(round + 1));
                        }
                    }
                });
            }
            let (index, done) = (&index, &done);
            scope.spawn(move || {
                let mut key = 0u64;
                let mut reads = 0u64;
                while done.load(Ordering::Acquire) < 2 || reads < 10_000 {
                    key = (key + 3 * 7919) % 6_000;
                    assert_eq!(index.get(key), Some(key), "stable key {key}");
                    reads += 1;
                }
            });
        });
        let shared = (0..200u64)
            .filter(|k| index.get(1_000_000 + k).is_some())
            .count();
        assert_eq!(index.len(), 2_000 + shared, "{domain}");
        assert!(index.segments() > 100, "{} segments", index.segments());
        let before = contents(&index);
        let root = index.root();
        drop(index);
        let (index, _) = PmHashIndex::recover(pool, pages, root).unwrap();
        assert_eq!(contents(&index), before, "{domain}");
        assert_eq!(index.len(), before.len());
    }
}
