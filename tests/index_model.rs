//! Loom model checks of the hand-written concurrent indexes (issue 13): every interleaving loom can
//! produce of a writer and an optimistic reader, with the real index code built over loom's
//! atomics (`src/index/sync.rs`; B+-tree nodes shrink to 4 keys, so a few keys split them).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test index_model` (`.ci/run` does).
//! Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use pmtx::index::{HashIndex, OrderedIndex, SecondaryIndex};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(f);
}

/// A reader racing a writer whose insert splits the leaf (and grows a new root) always finds the
/// keys that were there before, and its scan sees ascending keys including all of them.
#[test]
fn btree_readers_see_stable_keys_through_a_split() {
    model(|| {
        let index = Arc::new(OrderedIndex::new());
        for key in [10, 20, 30, 40] {
            index.insert_new(key, key).unwrap();
        }
        let writer = {
            let index = index.clone();
            thread::spawn(move || {
                index.insert_new(25, 25).unwrap();
            })
        };
        // (A write first: loom's partial-order reduction explores a thread that only reads in
        // a single schedule.)
        index.upsert(50, 50);
        assert_eq!(index.get(30), Some(30));
        let mut seen = Vec::new();
        index.scan(0, usize::MAX, |k, _| {
            seen.push(k);
            true
        });
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        for key in [10, 20, 30, 40, 50] {
            assert!(seen.contains(&key), "{key} missing from {seen:?}");
        }
        writer.join().unwrap();
        assert_eq!(index.get(25), Some(25));
        assert_eq!(index.len(), 6);
    });
}

/// Removing a leaf's last key unlinks the leaf; a reader racing it never loses a key of another
/// leaf, and a concurrent insert into the emptied range is never lost either.
#[test]
fn btree_unlinking_an_empty_leaf_loses_no_key() {
    model(|| {
        let index = Arc::new(OrderedIndex::new());
        // Ascending inserts keep left leaves full: [1 2 3] [4 5]; removing 4 leaves 5 alone.
        for key in 1..=5 {
            index.insert_new(key, key).unwrap();
        }
        assert_eq!(index.remove(4), Some(4));
        let remover = {
            let index = index.clone();
            thread::spawn(move || {
                assert_eq!(index.remove(5), Some(5));
            })
        };
        let inserter = {
            let index = index.clone();
            thread::spawn(move || {
                index.insert_new(6, 6).unwrap();
            })
        };
        assert_eq!(index.get(3), Some(3));
        remover.join().unwrap();
        inserter.join().unwrap();
        assert_eq!(index.get(6), Some(6));
        assert_eq!(index.get(5), None);
        let mut seen = Vec::new();
        index.for_each(|k, _| seen.push(k));
        assert_eq!(seen, vec![1, 2, 3, 6]);
    });
}

/// Two writers inserting into one full leaf: both keys land, and conditional updates stay exact.
#[test]
fn btree_concurrent_writers_on_one_leaf() {
    model(|| {
        let index = Arc::new(OrderedIndex::new());
        for key in [10, 20, 30] {
            index.insert_new(key, key).unwrap();
        }
        let a = {
            let index = index.clone();
            thread::spawn(move || {
                index.insert_new(15, 1).unwrap();
                index.replace_if(10, 10, 11)
            })
        };
        index.insert_new(35, 2).unwrap();
        let replaced_by_b = index.replace_if(10, 10, 12);
        let replaced_by_a = a.join().unwrap();
        assert!(replaced_by_a ^ replaced_by_b, "exactly one replace_if wins");
        let mut seen = Vec::new();
        index.for_each(|k, _| seen.push(k));
        assert_eq!(seen, vec![10, 15, 20, 30, 35]);
    });
}

/// An insert that starts at the leaf its earlier lookup found (Falcon's commit publishing an
/// insert, `insert_new_at`) races another writer that splits that leaf and inserts the same key:
/// exactly one of the two inserts of the key wins, and every key lands in a well-ordered tree.
#[test]
fn btree_hinted_insert_races_a_split_and_a_duplicate() {
    model(|| {
        let index = Arc::new(OrderedIndex::new());
        // Four keys fill a loom-sized leaf: the other writer's insert splits it.
        for key in [10, 20, 30, 40] {
            index.insert_new(key, key).unwrap();
        }
        let (found, hint) = index.get_for_insert(35);
        assert_eq!(found, None);
        let other = {
            let index = index.clone();
            thread::spawn(move || {
                index.insert_new(15, 15).unwrap();
                index.insert_new(35, 2).is_ok()
            })
        };
        let mut chain = pmtx::index::HintChain::default();
        let mine = index.insert_new_at(35, 1, hint, &mut chain).is_ok();
        let theirs = other.join().unwrap();
        assert!(mine ^ theirs, "exactly one insert of 35 wins");
        assert_eq!(index.get(35), Some(if mine { 1 } else { 2 }));
        let mut seen = Vec::new();
        index.for_each(|k, _| seen.push(k));
        assert_eq!(seen, vec![10, 15, 20, 30, 35, 40]);
        assert_eq!(index.len(), 6);
    });
}

/// The secondary index is the same tree with two-word keys: a lookup racing an insert of another
/// pair under the same secondary key sees every pair present before it.
#[test]
fn secondary_lookup_races_an_insert() {
    model(|| {
        let index = Arc::new(SecondaryIndex::new());
        for pk in [1, 2, 3] {
            index.insert(7, pk);
        }
        let writer = {
            let index = index.clone();
            thread::spawn(move || index.insert(7, 4))
        };
        index.insert(9, 1); // a write first: see btree_readers_see_stable_keys_through_a_split
        let mut out = Vec::new();
        index.lookup(7, &mut out);
        assert!(out.starts_with(&[1, 2, 3]), "{out:?}");
        writer.join().unwrap();
    });
}

/// A hash lookup racing a writer that updates, removes and re-inserts other keys of the same
/// bucket, and one that grows the table, always finds a key nobody touches.
#[test]
fn hash_reader_finds_a_stable_key_while_its_bucket_changes_and_the_table_grows() {
    model(|| {
        let index = Arc::new(HashIndex::new());
        index.insert_new(1, 100).unwrap();
        let writer = {
            let index = index.clone();
            thread::spawn(move || {
                // Under loom an index is one shard of one bucket at first: these grow it twice.
                for key in 2..7 {
                    index.insert_new(key, key).unwrap();
                }
                assert!(index.replace_if(2, 2, 3));
                assert_eq!(index.remove(3), Some(3));
            })
        };
        index.insert_new(100, 0).unwrap(); // a write first, as in the B+-tree reader model
        assert_eq!(index.get(1), Some(100));
        writer.join().unwrap();
        assert_eq!(index.get(2), Some(3));
        assert_eq!(index.get(3), None);
        assert_eq!(index.len(), 6);
    });
}

/// The persistent indexes' reader protocol (`src/index/pm/seqlock.rs`, the functions the PM hash
/// index's buckets and the PM ordered index's leaves use), over loom atomics standing for the PM
/// words: a writer empties an entry slot, writes a new key and value into it and publishes it
/// again (clear bit, write, set bit: the order of an insert into a reused slot), while a reader
/// reads the bitmap and the entry optimistically. A validated read never pairs the old key with
/// the new value or the reverse. Removing the Release fence of `write_begin` makes this model fail
/// (a torn entry: key 1 with value 20; checked 2026-11-26).
#[test]
fn pm_seqlock_readers_never_validate_a_torn_entry() {
    use loom::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use pmtx::index::pm::seqlock;
    struct Leaf {
        version: AtomicU64,
        bitmap: AtomicU64,
        key: AtomicU64,
        value: AtomicU64,
        scratch: AtomicU64,
    }
    model(|| {
        let leaf = Arc::new(Leaf {
            scratch: AtomicU64::new(0),
            version: AtomicU64::new(0),
            bitmap: AtomicU64::new(1),
            key: AtomicU64::new(1),
            value: AtomicU64::new(10),
        });
        let writer = {
            let leaf = leaf.clone();
            thread::spawn(move || {
                // Hash-index style: the writer excludes others by a lock elsewhere and makes
                // the version odd itself.
                seqlock::write_begin(&leaf.version, 1);
                leaf.bitmap.store(0, Relaxed);
                leaf.key.store(2, Relaxed);
                leaf.value.store(20, Relaxed);
                leaf.bitmap.store(1, Relaxed);
                seqlock::write_end(&leaf.version, 2);
            })
        };
        // A write first, as in the B+-tree reader model, to a word the protocol does not guard
        // (an RMW on the bitmap itself would join the writer's release sequence).
        leaf.scratch.fetch_add(1, Relaxed);
        loop {
            let v = seqlock::read_begin(&leaf.version);
            if v & 1 == 1 {
                thread::yield_now();
                continue;
            }
            let bit = leaf.bitmap.load(Relaxed);
            let (key, value) = (leaf.key.load(Relaxed), leaf.value.load(Relaxed));
            if seqlock::read_validate(&leaf.version, v) {
                assert_eq!(bit, 1, "a validated read saw the slot half published");
                assert_eq!(value, key * 10, "torn entry: key {key}, value {value}");
                break;
            }
            thread::yield_now();
        }
        writer.join().unwrap();
    });
}
