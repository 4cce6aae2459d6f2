//! The pmem crash simulator against the persistence model of shared/DESIGN.md ("The persistence
//! model"): what survives a power failure under ADR and eADR, where exactly power fails, how crash
//! images are enumerated or sampled, and that every image is a pool that opens again.
//!
//! The last part is a model-based property test: random store/streaming-store/flush/fence sequences
//! of three threads, under ADR and eADR, are replayed on an independent reference model, and the
//! simulator's durable image, full image, chosen images and pending counts must agree with it.

use pmtx::pmem::{
    CrashImage, CrashSimOptions, CrashState, CrashTrigger, OnCrash, PersistenceDomain, Pool,
    PoolError, PoolOptions, SimulatedCrash, CACHE_LINE,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

const SIZE: u64 = 64 * 1024;
const LAYOUT: &str = "crashsim";
const OLD: u64 = 0x1111_1111_1111_1111;
const NEW: u64 = 0x2222_2222_2222_2222;
const ADR: PersistenceDomain = PersistenceDomain::Adr;
const EADR: PersistenceDomain = PersistenceDomain::Eadr;

// ---------------------------------------------------------------------------------------------
// helpers

fn opts(domain: PersistenceDomain) -> PoolOptions {
    PoolOptions::new(LAYOUT, domain)
}

fn sim_pool(domain: PersistenceDomain, trigger: CrashTrigger) -> Pool {
    Pool::create_in_memory(SIZE, &opts(domain).with_crash_sim(trigger)).unwrap()
}

/// A pool under the simulator that only crashes when told to.
fn pool(domain: PersistenceDomain) -> Pool {
    sim_pool(domain, CrashTrigger::Never)
}

/// Fails power now and returns the frozen state.
fn crash(pool: &Pool) -> CrashState {
    pool.crash_now();
    state_of(pool)
}

fn state_of(pool: &Pool) -> CrashState {
    pool.crash_sim()
        .expect("simulator attached")
        .crash_state()
        .expect("power has failed")
}

fn word(img: &CrashImage, off: u64) -> u64 {
    word_at(&img.bytes, off)
}

fn word_at(bytes: &[u8], off: u64) -> u64 {
    let o = off as usize;
    u64::from_ne_bytes(bytes[o..o + 8].try_into().unwrap())
}

/// Every legal image (asserting that `images` enumerates exactly `image_count` of them).
fn all_images(state: &CrashState) -> Vec<CrashImage> {
    let n = state.image_count();
    assert!(n <= 100_000, "too many images to enumerate: {n}");
    let images: Vec<CrashImage> = state.images(n as usize, 0).collect();
    assert_eq!(images.len() as u128, n);
    images
}

/// Runs `f`; a simulated crash comes back as `Err`, any other panic goes on unwinding.
fn catch<R>(f: impl FnOnce() -> R) -> Result<R, SimulatedCrash> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Ok(r),
        Err(payload) => {
            assert!(
                SimulatedCrash::is(&*payload),
                "a real panic, not a simulated crash"
            );
            Err(*payload.downcast::<SimulatedCrash>().unwrap())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. unflushed writes

#[test]
fn unflushed_write_may_be_lost_under_adr() {
    let pool = pool(ADR);
    let a = pool.first_usable();
    pool.write_u64(a, NEW);
    assert_eq!(
        pool.read_u64(a),
        NEW,
        "the live image has the write at once"
    );
    let state = crash(&pool);
    assert_eq!(state.domain(), ADR);
    assert_eq!(word(&state.durable_image(), a), 0, "not durable");
    assert_eq!(word(&state.full_image(), a), NEW);
    let seen: HashSet<u64> = all_images(&state).iter().map(|i| word(i, a)).collect();
    assert_eq!(
        seen,
        HashSet::from([0, NEW]),
        "some image loses it, some keeps it"
    );
}

#[test]
fn unflushed_write_always_survives_under_eadr() {
    let pool = pool(EADR);
    let a = pool.first_usable();
    pool.write_u64(a, NEW);
    pool.write_bytes(a + 64, &[7; 100]);
    let state = crash(&pool);
    assert_eq!(state.domain(), EADR);
    assert_eq!(state.image_count(), 1);
    assert_eq!(state.pending_lines(), 0);
    assert_eq!(state.pending_stores(), 0);
    assert_eq!(word(&state.durable_image(), a), NEW);
    for img in state.images(16, 3) {
        assert_eq!(word(&img, a), NEW);
        assert_eq!(&img.bytes[(a + 64) as usize..(a + 164) as usize], &[7; 100]);
        assert_eq!(
            img.bytes,
            pool.read_vec(0, SIZE as usize),
            "image = live image"
        );
    }
}

#[test]
fn eadr_image_is_the_live_image_at_the_crash_point() {
    // The crash comes before event 1: the first store is in, the second never happened.
    let pool = sim_pool(EADR, CrashTrigger::AtEvent(1));
    let a = pool.first_usable();
    let r = catch(|| {
        pool.write_u64(a, 1);
        pool.write_u64(a + 8, 2);
    });
    assert_eq!(r.unwrap_err(), SimulatedCrash { event: 1 });
    let state = state_of(&pool);
    assert_eq!(state.image_count(), 1);
    let img = state.durable_image();
    assert_eq!((word(&img, a), word(&img, a + 8)), (1, 0));
    assert_eq!(
        pool.read_u64(a + 8),
        0,
        "the store at the crash point is not executed"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. flushed and fenced writes

#[test]
fn flushed_and_fenced_writes_survive_every_image() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    // Line 0: two words, flushed together, fenced.
    pool.write_u64(b, 1);
    pool.write_u64(b + 8, 2);
    pool.flush(b, 16);
    pool.fence();
    // Lines 1 and 2: one persist over both.
    pool.write_u64(b + 64, 3);
    pool.write_u64(b + 128, 4);
    pool.persist(b + 64, 128);
    // Lines 3 and 4: an unaligned 2-byte flush range still covers both lines.
    pool.write_u64(b + 192, 5);
    pool.write_u64(b + 256, 6);
    pool.flush(b + 192 + 63, 2);
    pool.fence();
    // Noise that may or may not survive: unflushed, and flushed but unfenced.
    pool.write_u64(b + 320, 7);
    pool.write_u64(b + 328, 8);
    pool.write_u64(b + 384, 9);
    pool.flush(b + 384, 8);
    pool.write_u64(b + 16, 10); // same line as the durable words, later
    let state = crash(&pool);
    assert_eq!(state.pending_lines(), 3);
    assert_eq!(state.pending_stores(), 4);
    assert_eq!(state.image_count(), 3 * 2 * 2);
    for img in all_images(&state) {
        for (i, off) in [b, b + 8, b + 64, b + 128, b + 192, b + 256]
            .into_iter()
            .enumerate()
        {
            assert_eq!(word(&img, off), i as u64 + 1, "durable word {i} lost");
        }
    }
    let durable = state.durable_image();
    for off in [b + 320, b + 328, b + 384, b + 16] {
        assert_eq!(word(&durable, off), 0);
    }
}

#[test]
fn persist_is_flush_and_fence_under_adr_and_nothing_under_eadr() {
    for (domain, events) in [(ADR, 2), (EADR, 0)] {
        let pool = pool(domain);
        let a = pool.first_usable();
        pool.write_u64(a, NEW);
        let sim = pool.crash_sim().unwrap();
        let before = sim.events();
        assert_eq!(before, 1, "a store is one event");
        pool.persist(a, 8);
        assert_eq!(sim.events() - before, events, "{domain}");
        // Reads are not events.
        let _ = pool.read_u64(a);
        let _ = pool.read_vec(a, 100);
        assert_eq!(
            sim.events() - before,
            events,
            "{domain}: reads are not events"
        );
        let state = crash(&pool);
        assert_eq!(state.image_count(), 1, "{domain}");
        assert_eq!(word(&state.durable_image(), a), NEW, "{domain}");
    }
}

#[test]
fn a_non_temporal_store_is_durable_at_the_next_fence_and_not_before() {
    let row: Vec<u8> = (0..200u32).map(|i| i as u8 | 1).collect();
    // Fenced: every image holds the whole row; one event, counted as a write and a flush.
    let p = pool(ADR);
    let a = p.first_usable() + 8; // not line aligned: the row spans 4 lines
    let sim = p.crash_sim().unwrap();
    let stats = pmtx::pmem::stats::thread_snapshot();
    p.write_bytes_nt(a, &row);
    assert_eq!(sim.events(), 1, "a non-temporal store is one event");
    let counted = pmtx::pmem::stats::thread_snapshot() - stats;
    assert_eq!(counted.bytes_written, 200);
    assert_eq!(counted.lines_flushed, 4);
    p.fence();
    let state = crash(&p);
    assert_eq!(state.image_count(), 1, "nothing is pending after the fence");
    for img in all_images(&state) {
        assert_eq!(&img.bytes[a as usize..a as usize + 200], &row[..]);
    }
    // Not fenced: the row may be lost (the durable image has none of it), piece by piece.
    let p = pool(ADR);
    let a = p.first_usable() + 8;
    p.write_bytes_nt(a, &row);
    let state = crash(&p);
    assert!(state.image_count() > 1);
    let durable = state.durable_image();
    assert!(durable.bytes[a as usize..a as usize + 200]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(
        &state.full_image().bytes[a as usize..a as usize + 200],
        &row[..]
    );
    // Another thread's fence does not make it durable.
    let p = std::sync::Arc::new(pool(ADR));
    let a = p.first_usable();
    p.write_bytes_nt(a, &row);
    let other = p.clone();
    std::thread::spawn(move || other.fence()).join().unwrap();
    let state = crash(&p);
    assert!(state.durable_image().bytes[a as usize..a as usize + 200]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_non_temporal_store_without_the_simulator_stores_every_byte() {
    for domain in [ADR, EADR, PersistenceDomain::Volatile] {
        let pool = Pool::create_in_memory(SIZE, &opts(domain)).unwrap();
        let b = pool.first_usable();
        for (start, len) in [(0u64, 1000usize), (3, 61), (8, 8), (13, 3), (64, 0)] {
            let row: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) | 1).collect();
            pool.write_bytes_nt(b + start, &row);
            pool.fence();
            assert_eq!(pool.read_vec(b + start, len), row, "{domain} {start} {len}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. flushed but not fenced

#[test]
fn flushed_but_unfenced_write_may_or_may_not_survive() {
    let pool = pool(ADR);
    let a = pool.first_usable();
    pool.write_u64(a, NEW);
    pool.flush(a, 8);
    let state = crash(&pool);
    assert_eq!(
        word(&state.durable_image(), a),
        0,
        "a flush alone is not durable"
    );
    let seen: HashSet<u64> = all_images(&state).iter().map(|i| word(i, a)).collect();
    assert_eq!(seen, HashSet::from([0, NEW]));
}

#[test]
fn flushed_but_unfenced_write_over_sampled_images() {
    let pool = pool(ADR);
    let a = pool.first_usable();
    // 16 lines with 3 pending stores each: 4^16 images, so `images` samples.
    for line in 0..16 {
        for w in 0..3 {
            pool.write_u64(a + line * CACHE_LINE + w * 8, line * 10 + w + 1);
        }
    }
    pool.flush(a, 16 * CACHE_LINE);
    let state = crash(&pool);
    assert!(state.image_count() > 1000);
    let (mut kept, mut lost) = (0, 0);
    for seed in 0..8 {
        for img in state.images(40, seed) {
            match word(&img, a) {
                0 => lost += 1,
                1 => kept += 1,
                other => panic!("word holds {other}"),
            }
        }
    }
    assert!(kept > 8 && lost > 8, "kept {kept}, lost {lost}");
}

// ---------------------------------------------------------------------------------------------
// 4. one line: program order

#[test]
fn two_writes_to_one_line_never_survive_out_of_order() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    pool.write_u64(b, 0xA);
    pool.write_u64(b + 8, 0xB);
    let state = crash(&pool);
    assert_eq!(state.pending_lines(), 1);
    assert_eq!(state.image_count(), 3);
    let seen: HashSet<(u64, u64)> = all_images(&state)
        .iter()
        .map(|i| (word(i, b), word(i, b + 8)))
        .collect();
    assert!(!seen.contains(&(0, 0xB)), "B survived without A");
    assert_eq!(seen, HashSet::from([(0, 0), (0xA, 0), (0xA, 0xB)]));
}

#[test]
fn surviving_writes_of_one_line_are_a_prefix_of_program_order() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    // Eight distinct words of one line, written in a scrambled order.
    let order = [5u64, 0, 7, 2, 6, 1, 4, 3];
    for (i, &w) in order.iter().enumerate() {
        pool.write_u64(b + w * 8, 100 + i as u64);
    }
    let state = crash(&pool);
    assert_eq!(state.image_count(), 9);
    let mut prefixes = HashSet::new();
    for img in all_images(&state) {
        let survived: Vec<bool> = order
            .iter()
            .enumerate()
            .map(|(i, &w)| match word(&img, b + w * 8) {
                0 => false,
                v if v == 100 + i as u64 => true,
                v => panic!("word {w} holds {v}"),
            })
            .collect();
        let k = survived.iter().take_while(|&&s| s).count();
        assert!(
            survived[k..].iter().all(|&s| !s),
            "not a prefix: {survived:?}"
        );
        assert_eq!(img.prefixes, vec![k]);
        prefixes.insert(k);
    }
    assert_eq!(prefixes, (0..=8).collect::<HashSet<_>>());
}

#[test]
fn repeated_overwrites_of_one_word_survive_as_one_of_its_values_in_order() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    for v in 1..=5u64 {
        pool.write_u64(b, v);
        pool.write_u64(b + 8, v * 10); // interleaved with a neighbour in the same line
    }
    let state = crash(&pool);
    assert_eq!(state.image_count(), 11);
    let seen: Vec<(u64, u64)> = all_images(&state)
        .iter()
        .map(|i| (word(i, b), word(i, b + 8)))
        .collect();
    for &(x, y) in &seen {
        // The neighbour is either one step behind (y = 10 * (x - 1)) or level with x.
        assert!(
            y == x * 10 || (x > 0 && y == (x - 1) * 10),
            "({x}, {y}) is not an in-order prefix"
        );
    }
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 11);
}

// ---------------------------------------------------------------------------------------------
// 5. different lines are independent

#[test]
fn writes_to_two_lines_are_independent() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    pool.write_u64(b + 8, 0xB); // line 0, written first
    pool.write_u64(b + 64, 0xA); // line 1
    let state = crash(&pool);
    assert_eq!(state.pending_lines(), 2);
    let seen: HashSet<(u64, u64)> = all_images(&state)
        .iter()
        .map(|i| (word(i, b + 8), word(i, b + 64)))
        .collect();
    assert_eq!(
        seen,
        HashSet::from([(0, 0), (0xB, 0), (0, 0xA), (0xB, 0xA)])
    );
}

// ---------------------------------------------------------------------------------------------
// 6. tearing

/// Sets `len` bytes at `off` to `old` durably.
fn durable_fill(pool: &Pool, off: u64, len: u64, old: u8) {
    pool.fill(off, old, len);
    pool.persist(off, len);
}

/// Whether each aligned word of `[off, off + len)` in `img` holds only `a` bytes or only `b` bytes,
/// and which (true: `b`).
fn whole_words(img: &CrashImage, off: u64, words: u64, a: u8, b: u8) -> Vec<bool> {
    (0..words)
        .map(|w| {
            let s = (off + w * 8) as usize;
            let bytes = &img.bytes[s..s + 8];
            if bytes.iter().all(|&x| x == a) {
                false
            } else if bytes.iter().all(|&x| x == b) {
                true
            } else {
                panic!("word at {} torn byte-wise: {bytes:x?}", off + w * 8)
            }
        })
        .collect()
}

#[test]
fn aligned_word_store_is_never_torn() {
    let pool = pool(ADR);
    let a = pool.first_usable();
    pool.write_u64(a, OLD);
    pool.persist(a, 8);
    pool.write_u64(a, NEW);
    pool.write_u64(a + 64, NEW);
    pool.store_u64(a + 72, NEW, std::sync::atomic::Ordering::Release);
    let _ = pool.fetch_add_u64(a + 128, NEW);
    let state = crash(&pool);
    let mut seen = HashSet::new();
    for img in all_images(&state) {
        let v = word(&img, a);
        assert!(v == OLD || v == NEW, "torn word {v:#x}");
        seen.insert(v);
        for off in [a + 64, a + 72, a + 128] {
            let v = word(&img, off);
            assert!(v == 0 || v == NEW, "torn word {v:#x}");
        }
    }
    assert_eq!(seen, HashSet::from([OLD, NEW]));
}

#[test]
fn a_16_byte_store_tears_word_wise_never_byte_wise() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    durable_fill(&pool, b, 4 * CACHE_LINE, 0x11);
    // Within one line: two words.
    pool.write_bytes(b, &[0x22; 16]);
    // Across a line boundary: word b+120 in line 1, word b+128 in line 2.
    pool.write_bytes(b + 120, &[0x22; 16]);
    let state = crash(&pool);
    assert_eq!(state.pending_lines(), 3);
    assert_eq!(state.pending_stores(), 4);
    let (mut in_line, mut across) = (HashSet::new(), HashSet::new());
    for img in all_images(&state) {
        let w = whole_words(&img, b, 2, 0x11, 0x22);
        in_line.insert((w[0], w[1]));
        let w = whole_words(&img, b + 120, 2, 0x11, 0x22);
        across.insert((w[0], w[1]));
    }
    assert!(
        in_line.contains(&(true, false)),
        "torn word-wise, first word first"
    );
    assert!(
        !in_line.contains(&(false, true)),
        "within a line the words land in ascending order"
    );
    assert_eq!(in_line.len(), 3);
    assert_eq!(across.len(), 4, "across lines both halves are independent");
}

#[test]
fn an_unaligned_8_byte_store_may_tear_at_the_word_boundary_only() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    durable_fill(&pool, b, 16, 0x11);
    pool.write_bytes(b + 4, &[0x22; 8]);
    let state = crash(&pool);
    assert_eq!(state.pending_stores(), 2, "split at the 8-byte boundary");
    let mut seen = HashSet::new();
    for img in all_images(&state) {
        let (lo, hi) = (
            &img.bytes[(b + 4) as usize..(b + 8) as usize],
            &img.bytes[(b + 8) as usize..(b + 12) as usize],
        );
        let lo_new = lo == [0x22; 4];
        let hi_new = hi == [0x22; 4];
        assert!(lo_new || lo == [0x11; 4], "piece torn: {lo:x?}");
        assert!(hi_new || hi == [0x11; 4], "piece torn: {hi:x?}");
        seen.insert((lo_new, hi_new));
    }
    assert_eq!(
        seen,
        HashSet::from([(false, false), (true, false), (true, true)])
    );
}

// ---------------------------------------------------------------------------------------------
// 7. flush marks are per thread

#[test]
fn flush_on_one_thread_and_fence_on_another_is_not_durable() {
    let pool = pool(ADR);
    let a = pool.first_usable();
    pool.write_u64(a, NEW);
    pool.flush(a, 8);
    std::thread::scope(|s| s.spawn(|| pool.fence()).join().unwrap());
    let state = crash(&pool);
    assert_eq!(word(&state.durable_image(), a), 0, "another thread's fence");
    assert_eq!(state.pending_stores(), 1);
}

#[test]
fn a_stale_flush_mark_does_not_cover_stores_made_after_another_threads_fence() {
    // Thread A and thread B both flush a line; B's fence drains it; A then stores to the line
    // again and fences: A's old flush mark predates the new store, which stays pending. (The
    // simulator once counted a line's stores from an empty log, so the stale mark covered it.)
    let p = pool(ADR);
    let a = p.first_usable();
    p.write_u64(a, OLD);
    std::thread::scope(|scope| {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (flushed, flushed_rx) = std::sync::mpsc::channel::<()>();
        let p = &p;
        let b = scope.spawn(move || {
            p.flush(a, 8);
            flushed.send(()).unwrap();
            wait.recv().unwrap();
            p.fence();
        });
        flushed_rx.recv().unwrap();
        p.flush(a, 8);
        go.send(()).unwrap();
        b.join().unwrap();
    });
    p.write_u64(a, NEW);
    p.fence();
    let state = crash(&p);
    assert_eq!(
        word(&state.durable_image(), a),
        OLD,
        "the new store was never flushed"
    );
    assert_eq!(word(&state.full_image(), a), NEW);
}

#[test]
fn flush_and_fence_on_the_same_thread_is_durable() {
    // The flushing thread's own fence, even after another thread's fence.
    let pool = pool(ADR);
    let a = pool.first_usable();
    pool.write_u64(a, NEW);
    pool.flush(a, 8);
    std::thread::scope(|s| s.spawn(|| pool.fence()).join().unwrap());
    pool.fence();
    let state = crash(&pool);
    assert_eq!(word(&state.durable_image(), a), NEW);
    assert_eq!(state.pending_stores(), 0);

    // A write by one thread, flushed and fenced by another: durable (marks follow the flusher).
    let pool = self::pool(ADR);
    pool.write_u64(a, NEW);
    std::thread::scope(|s| {
        s.spawn(|| {
            pool.flush(a, 8);
            pool.fence();
        })
        .join()
        .unwrap()
    });
    let state = crash(&pool);
    assert_eq!(word(&state.durable_image(), a), NEW);
}

// ---------------------------------------------------------------------------------------------
// 8. a flush covers only what was written before it

#[test]
fn a_write_after_the_flush_is_not_covered_by_it() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    pool.write_u64(b, 0xA);
    pool.flush(b, 2 * CACHE_LINE); // line 1 has nothing pending yet
    pool.write_u64(b + 8, 0xB); // same line as A, after the flush
    pool.write_u64(b + 64, 0xC); // the other flushed line, after the flush
    pool.fence();
    let state = crash(&pool);
    let durable = state.durable_image();
    assert_eq!(word(&durable, b), 0xA);
    assert_eq!(word(&durable, b + 8), 0, "B came after the flush");
    assert_eq!(word(&durable, b + 64), 0, "C came after the flush");
    assert_eq!(state.pending_stores(), 2);
    assert_eq!(state.pending_lines(), 2);
    let full = state.full_image();
    assert_eq!((word(&full, b + 8), word(&full, b + 64)), (0xB, 0xC));
}

// ---------------------------------------------------------------------------------------------
// 9. crash points

/// Six PM events: 0 store, 1 store, 2 flush, 3 fence, 4 store, 5 flush.
fn six_events(pool: &Pool) {
    let b = pool.first_usable();
    pool.write_u64(b, 1);
    pool.write_u64(b + 8, 2);
    pool.flush(b, 16);
    pool.fence();
    pool.write_u64(b + 64, 3);
    pool.flush(b + 64, 8);
}

#[test]
fn at_event_n_executes_exactly_n_events() {
    for n in 0..=6u64 {
        let pool = sim_pool(ADR, CrashTrigger::AtEvent(n));
        let b = pool.first_usable();
        let sim = pool.crash_sim().unwrap().clone();
        let r = catch(|| six_events(&pool));
        if n < 6 {
            assert_eq!(r, Err(SimulatedCrash { event: n }), "n = {n}");
        } else {
            assert_eq!(r, Ok(()));
            assert!(!sim.has_crashed());
            pool.crash_now();
        }
        assert!(sim.has_crashed());
        assert_eq!(sim.crashed_at(), Some(n));
        assert_eq!(sim.events(), n, "executed events");
        let live = [
            pool.read_u64(b),
            pool.read_u64(b + 8),
            pool.read_u64(b + 64),
        ];
        let expect = |executed: bool, v: u64| if executed { v } else { 0 };
        assert_eq!(
            live,
            [expect(n > 0, 1), expect(n > 1, 2), expect(n > 4, 3)],
            "n = {n}: live image"
        );
        let state = sim.crash_state().unwrap();
        assert_eq!(state.event(), n);
        let full = state.full_image();
        assert_eq!(
            [word(&full, b), word(&full, b + 8), word(&full, b + 64)],
            live
        );
        let durable = state.durable_image();
        assert_eq!(
            [
                word(&durable, b),
                word(&durable, b + 8),
                word(&durable, b + 64)
            ],
            [expect(n > 3, 1), expect(n > 3, 2), 0],
            "n = {n}: durable image"
        );
        let pending = [0, 1, 2, 2, 0, 1, 1][n as usize];
        assert_eq!(state.pending_stores(), pending, "n = {n}");
        assert!(state.images(100, 0).all(|i| i.event == n));

        // Every later PM event unwinds and changes nothing; reads still work.
        let later: [&dyn Fn(); 10] = [
            &|| pool.write_u64(b + 128, 9),
            &|| pool.write_bytes(b + 128, &[9; 3]),
            &|| pool.fill(b + 128, 9, 20),
            &|| pool.copy(b, b + 128, 8),
            &|| {
                let _ = pool.cas_u64(b + 128, 0, 9);
            },
            &|| {
                let _ = pool.fetch_add_u64(b + 128, 9);
            },
            &|| pool.flush(b, 64),
            &|| pool.fence(),
            &|| pool.persist(b, 8),
            &|| pool.set_root(b).unwrap(),
        ];
        for (i, f) in later.iter().enumerate() {
            assert_eq!(
                catch(f),
                Err(SimulatedCrash { event: n }),
                "n = {n}, call {i}"
            );
        }
        assert_eq!(pool.read_vec(b + 128, 24), vec![0; 24]);
        assert_eq!(pool.root(), 0);
        pool.crash_now(); // a second crash is a no-op
        assert_eq!(sim.crashed_at(), Some(n));
        assert_eq!(sim.events(), n);
        let again = sim.crash_state().unwrap();
        assert_eq!(again.full_image().bytes, full.bytes);
        assert_eq!(again.durable_image().bytes, durable.bytes);
    }
}

#[test]
fn at_thread_event_counts_only_that_thread() {
    use std::sync::mpsc::channel;
    let pool = pool(ADR);
    let sim = pool.crash_sim().unwrap().clone();
    let b = pool.first_usable();
    let (to_b, b_rx) = channel::<()>();
    let (to_a, a_rx) = channel::<()>();
    let (id_tx, id_rx) = channel();
    let to_a_from_b = to_a.clone();
    let pool = &pool;
    let (ra, rb) = std::thread::scope(|s| {
        let ta = s.spawn(move || {
            a_rx.recv().unwrap(); // wait until armed
            catch(|| {
                for i in 0..3 {
                    pool.write_u64(b + i * 8, 10 + i); // A events 0..3, global 0..3
                }
                to_b.send(()).unwrap();
                a_rx.recv().unwrap();
                for i in 3..6 {
                    pool.write_u64(b + i * 8, 10 + i); // A events 3..6, global 4..7
                }
                to_b.send(()).unwrap();
            })
        });
        let tb = s.spawn(move || {
            id_tx.send(std::thread::current().id()).unwrap();
            b_rx.recv().unwrap();
            catch(|| {
                pool.write_u64(b + 64, 20); // B event 0, global 3
                to_a_from_b.send(()).unwrap();
                b_rx.recv().unwrap();
                pool.write_u64(b + 72, 21); // B event 1, global 7
                pool.write_u64(b + 80, 22); // B event 2, global 8: crash
                pool.write_u64(b + 88, 23);
            })
        });
        let thread = id_rx.recv().unwrap();
        sim.arm(CrashTrigger::AtThreadEvent { thread, event: 2 });
        to_a.send(()).unwrap();
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert_eq!(
        ra,
        Ok(()),
        "A never crashed although it passed global event 2"
    );
    assert_eq!(rb, Err(SimulatedCrash { event: 8 }));
    assert_eq!(sim.crashed_at(), Some(8));
    assert_eq!(sim.events(), 8);
    let full = sim.crash_state().unwrap().full_image();
    for i in 0..6 {
        assert_eq!(word(&full, b + i * 8), 10 + i);
    }
    assert_eq!(
        [
            word(&full, b + 64),
            word(&full, b + 72),
            word(&full, b + 80)
        ],
        [20, 21, 0]
    );
    assert_eq!(pool.read_u64(b + 80), 0);
    // After the crash, A's thread (or any other) unwinds too.
    std::thread::scope(|s| {
        let r = s.spawn(|| catch(|| pool.fence())).join().unwrap();
        assert_eq!(r, Err(SimulatedCrash { event: 8 }));
    });
}

// ---------------------------------------------------------------------------------------------
// 10. determinism

/// Sixteen lines with three pending stores each (4^16 images), plus some durable data.
fn busy_script(pool: &Pool) {
    let b = pool.first_usable();
    pool.write_bytes(b + 4096, b"durable");
    pool.persist(b + 4096, 7);
    for line in 0..16u64 {
        pool.write_u64(b + line * CACHE_LINE, line + 1);
        pool.write_bytes(b + line * CACHE_LINE + 12, &[line as u8 + 1; 9]);
    }
    pool.flush(b, 8 * CACHE_LINE);
}

/// The part of an image that does not depend on the pool's random UUID and creation time.
fn body(img: &CrashImage) -> (Vec<usize>, Vec<u8>) {
    (img.prefixes.clone(), img.bytes[4096..].to_vec())
}

#[test]
fn same_seed_same_images_different_seed_different_images() {
    let run = || {
        let pool = pool(ADR);
        busy_script(&pool);
        crash(&pool)
    };
    let (s1, s2) = (run(), run());
    assert_eq!(s1.image_count(), 4u128.pow(16));
    let a: Vec<_> = s1.images(32, 42).map(|i| body(&i)).collect();
    let b: Vec<_> = s2.images(32, 42).map(|i| body(&i)).collect();
    assert_eq!(a.len(), 32);
    assert!(a == b, "same script, same seed: same images");
    let again: Vec<Vec<u8>> = s1.images(32, 42).map(|i| i.bytes).collect();
    let first: Vec<Vec<u8>> = s1.images(32, 42).map(|i| i.bytes).collect();
    assert!(again == first, "same state, same seed: byte-identical");
    // Sampling: first the all-lost image, then the all-survived one.
    assert_eq!(body(&s1.durable_image()), a[0]);
    assert_eq!(body(&s1.full_image()), a[1]);
    assert!(a[0].0.iter().all(|&p| p == 0));
    assert!(a[1].0.iter().all(|&p| p == 3));
    let c: Vec<_> = s1.images(32, 43).map(|i| body(&i)).collect();
    assert_eq!(c[..2], a[..2]);
    assert!(a[2..] != c[2..], "different seeds must sample differently");
    // The samples are legal images.
    for (p, bytes) in &a {
        assert_eq!(&s1.image(p).bytes[4096..], &bytes[..]);
    }
    // A random trigger is reproducible.
    assert_eq!(CrashTrigger::random(9, 1000), CrashTrigger::random(9, 1000));
    match CrashTrigger::random(9, 10) {
        CrashTrigger::AtEvent(n) => assert!(n < 10),
        other => panic!("{other:?}"),
    }
}

#[test]
fn enumeration_does_not_depend_on_the_seed() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    pool.write_u64(b, 1);
    pool.write_u64(b + 8, 2);
    pool.write_u64(b + 64, 3);
    let state = crash(&pool);
    let a: Vec<Vec<u8>> = state.images(6, 1).map(|i| i.bytes).collect();
    let c: Vec<Vec<u8>> = state.images(100, 2).map(|i| i.bytes).collect();
    assert!(a == c);
}

// ---------------------------------------------------------------------------------------------
// 11. enumeration count

#[test]
fn image_count_is_the_product_of_pending_pieces_plus_one() {
    let pool = pool(ADR);
    let b = pool.first_usable();
    pool.write_u64(b, 1); // line 0: 2 pieces
    pool.write_u64(b + 8, 2);
    pool.write_bytes(b + 64 + 4, &[3; 8]); // line 1: 2 pieces (unaligned) ...
    pool.write_u64(b + 64 + 16, 4); // ... + 1 = 3
    pool.write_bytes(b + 128 + 56, &[5; 16]); // line 2: 1 piece, line 3: 1 piece
    pool.write_u64(b + 256, 6); // line 4: persisted, 0 pieces
    pool.persist(b + 256, 8);
    pool.write_bytes(b + 320 + 2, &[7; 20]); // line 5: 6 + 8 + 6 bytes = 3 pieces
    let state = crash(&pool);
    let per_line = [2usize, 3, 1, 1, 3];
    assert_eq!(state.pending_lines(), per_line.len());
    assert_eq!(state.pending_stores(), per_line.iter().sum::<usize>());
    let product: u128 = per_line.iter().map(|&p| p as u128 + 1).product();
    assert_eq!(product, 192);
    assert_eq!(state.image_count(), product);

    let images: Vec<CrashImage> = state.images(1000, 5).collect();
    assert_eq!(images.len(), 192, "exactly image_count images");
    let prefixes: HashSet<Vec<usize>> = images.iter().map(|i| i.prefixes.clone()).collect();
    assert_eq!(prefixes.len(), 192, "distinct prefix vectors");
    for p in &prefixes {
        assert!(p.iter().zip(&per_line).all(|(k, n)| k <= n), "{p:?}");
    }
    let bytes: HashSet<&[u8]> = images.iter().map(|i| &i.bytes[..]).collect();
    assert_eq!(bytes.len(), 192, "distinct images");
    for img in &images {
        assert_eq!(state.image(&img.prefixes).bytes, img.bytes);
    }
    // Exactly image_count as the limit still enumerates; one less samples.
    assert_eq!(state.images(192, 0).count(), 192);
    let sampled: Vec<CrashImage> = state.images(191, 0).collect();
    assert_eq!(sampled.len(), 191);
    assert_eq!(sampled[0].prefixes, vec![0; 5]);
    assert_eq!(sampled[1].prefixes, per_line.to_vec());
}

// ---------------------------------------------------------------------------------------------
// 12. images are pools

#[test]
fn crash_images_reopen_as_pools_with_header_and_root() {
    let dir = tempfile::tempdir().unwrap();
    for domain in [ADR, EADR] {
        let pool = pool(domain);
        let b = pool.first_usable();
        let (uuid, created) = (pool.header().uuid, pool.header().created_unix_ns);
        pool.write_bytes(b, b"root record");
        pool.persist(b, 11);
        pool.set_root(b).unwrap();
        pool.write_u64(b + 64, 1);
        pool.write_u64(b + 72, 2);
        pool.write_u64(b + 128, 3);
        let state = crash(&pool);
        let images = all_images(&state);
        assert_eq!(images.len(), if domain == ADR { 6 } else { 1 });
        for (i, img) in images.iter().enumerate() {
            let check = |p: &Pool| {
                assert_eq!(p.header().uuid, uuid);
                assert_eq!(p.header().created_unix_ns, created);
                assert_eq!(p.header().layout, LAYOUT);
                assert_eq!(p.len(), SIZE);
                assert_eq!(p.root(), b, "the root survives");
                assert_eq!(p.read_vec(b, 11), b"root record");
                assert_eq!(p.read_vec(0, SIZE as usize), img.bytes);
            };
            let p = Pool::from_image(&img.bytes, &opts(domain)).unwrap();
            check(&p);
            // A reopened image can itself run under the simulator.
            let p = Pool::from_image(
                &img.bytes,
                &opts(domain).with_crash_sim(CrashTrigger::Never),
            )
            .unwrap();
            check(&p);
            let path = dir.path().join(format!("{domain}-{i}.pool"));
            img.write_to(&path).unwrap();
            let p = Pool::open(&path, &opts(domain)).unwrap();
            check(&p);
        }
        let err = Pool::from_image(&images[0].bytes, &PoolOptions::new("other", domain));
        assert!(matches!(err, Err(PoolError::LayoutMismatch { .. })));
    }
}

// ---------------------------------------------------------------------------------------------
// 13. OnCrash::Continue

fn continue_pool(trigger: CrashTrigger) -> Pool {
    let o = PoolOptions {
        crash_sim: Some(CrashSimOptions {
            trigger,
            on_crash: OnCrash::Continue,
        }),
        ..opts(ADR)
    };
    Pool::create_in_memory(SIZE, &o).unwrap()
}

#[test]
fn on_crash_continue_freezes_the_crash_state() {
    let pool = continue_pool(CrashTrigger::AtEvent(2));
    let sim = pool.crash_sim().unwrap().clone();
    let b = pool.first_usable();
    pool.write_u64(b, 1); // event 0
    pool.flush(b, 8); // event 1
    pool.fence(); // power fails before this: no unwind
    assert!(sim.has_crashed());
    assert_eq!(sim.crashed_at(), Some(2));
    let at_crash = sim.crash_state().unwrap();
    let r = catch(|| {
        pool.write_u64(b + 8, 2);
        pool.persist(b, 64);
        pool.write_bytes(b + 64, &[3; 70]);
        let _ = pool.fetch_add_u64(b + 256, 5);
        let _ = pool.cas_u64(b + 264, 0, 9);
        pool.flush(b, 512);
        pool.fence();
    });
    assert_eq!(r, Ok(()), "Continue never unwinds");
    assert_eq!(sim.events(), 2, "later events are not recorded");
    let later = sim.crash_state().unwrap();
    assert_eq!(later.event(), 2);
    assert_eq!(
        word(&later.durable_image(), b),
        0,
        "the fence never happened"
    );
    assert_eq!(word(&later.full_image(), b), 1);
    assert_eq!(
        word(&later.full_image(), b + 8),
        0,
        "stores after the crash are not in any image"
    );
    assert_eq!(later.pending_stores(), 1);
    assert_eq!(later.image_count(), at_crash.image_count());
    assert_eq!(later.durable_image().bytes, at_crash.durable_image().bytes);
    assert_eq!(later.full_image().bytes, at_crash.full_image().bytes);
}

/// Regression: under `OnCrash::Continue` stores after the crash point must still reach the live
/// image (they are only left out of the crash state). An earlier `CrashSim::record` returned a bare
/// `false` after the crash without running `apply`, and `Pool::store_event` then dropped the store,
/// so the live image lost it and `cas_u64` / `fetch_add_u64` returned made-up results.
#[test]
fn on_crash_continue_keeps_running_live_writes() {
    let pool = continue_pool(CrashTrigger::AtEvent(0));
    let b = pool.first_usable();
    pool.write_u64(b, 7); // power fails before this store; it must still happen live
    assert!(pool.crash_sim().unwrap().has_crashed());
    assert_eq!(
        pool.read_u64(b),
        7,
        "write_u64 after the crash point lost from the live image"
    );
    pool.write_bytes(b + 8, b"live");
    assert_eq!(pool.read_vec(b + 8, 4), b"live", "write_bytes lost");
    pool.fill(b + 16, 0xAB, 8);
    assert_eq!(
        pool.read_u64(b + 16),
        u64::from_ne_bytes([0xAB; 8]),
        "fill lost"
    );
    pool.copy(b, b + 24, 8);
    assert_eq!(pool.read_u64(b + 24), 7, "copy lost");
    assert_eq!(pool.fetch_add_u64(b, 1), 7, "fetch_add result");
    assert_eq!(pool.read_u64(b), 8, "fetch_add lost");
    assert_eq!(pool.cas_u64(b, 8, 9), Ok(8), "cas result");
    assert_eq!(pool.read_u64(b), 9, "cas lost");
    // And none of it is in the frozen crash state.
    let state = state_of(&pool);
    assert_eq!(state.image_count(), 1);
    assert_eq!(word(&state.full_image(), b), 0);
}

// ---------------------------------------------------------------------------------------------
// 15. volatile

#[test]
fn volatile_domain_refuses_a_crash_simulator() {
    let o = opts(PersistenceDomain::Volatile).with_crash_sim(CrashTrigger::Never);
    let err = Pool::create_in_memory(SIZE, &o).unwrap_err();
    assert!(matches!(err, PoolError::InvalidArgument(_)), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.pool");
    let err = Pool::create(Some(&path), SIZE, &o).unwrap_err();
    assert!(matches!(err, PoolError::InvalidArgument(_)), "{err}");
    assert!(!path.exists(), "nothing created");
    // Without a simulator the volatile domain is fine.
    let plain = Pool::create_in_memory(SIZE, &opts(PersistenceDomain::Volatile)).unwrap();
    assert!(plain.crash_sim().is_none());
}

// ---------------------------------------------------------------------------------------------
// 14. non-temporal stores: pending and unordered until their thread's fence, under ADR and eADR

#[test]
fn an_unfenced_non_temporal_store_may_be_lost_under_eadr_too() {
    let p = pool(EADR);
    let a = p.first_usable();
    p.write_bytes_nt(a, &NEW.to_ne_bytes());
    p.write_u64(a + 64, NEW); // an ordinary store: durable at once under eADR
    let state = crash(&p);
    assert_eq!(
        state.pending_lines(),
        0,
        "no cached store is pending under eADR"
    );
    assert_eq!(state.pending_non_temporal(), 1);
    assert_eq!(state.image_count(), 2);
    assert_eq!(
        word(&state.durable_image(), a),
        0,
        "the streaming store may be lost"
    );
    assert_eq!(word(&state.full_image(), a), NEW);
    for img in all_images(&state) {
        assert_eq!(word(&img, a + 64), NEW, "the cached store always survives");
    }
    // Fenced by its own thread: durable.
    let p = pool(EADR);
    p.write_bytes_nt(a, &NEW.to_ne_bytes());
    p.fence();
    let state = crash(&p);
    assert_eq!(state.image_count(), 1);
    assert_eq!(word(&state.durable_image(), a), NEW);
}

#[test]
fn a_commit_mark_after_unfenced_streaming_data_may_survive_without_the_data() {
    // Zen's pattern without its `sfence` (Algorithm 1 line 10): data streamed, then the commit
    // word stored and its line written back. Under eADR some image keeps the mark and loses data.
    let p = pool(EADR);
    let data = p.first_usable();
    let mark = data + 256;
    p.write_bytes_nt(data, &[7u8; 128]);
    p.write_u64(mark, 1);
    p.flush(mark, 8);
    let state = crash(&p);
    let torn = all_images(&state).into_iter().any(|img| {
        word(&img, mark) == 1 && img.bytes[data as usize..data as usize + 128] != [7u8; 128]
    });
    assert!(torn, "the mark can reach PM before the data");
    // Under ADR the same, the mark line written back silently (no fence at all).
    let p = pool(ADR);
    p.write_bytes_nt(data, &[7u8; 16]);
    p.write_u64(mark, 1);
    let state = crash(&p);
    assert!(all_images(&state)
        .into_iter()
        .any(|img| word(&img, mark) == 1 && word(&img, data) == 0));
    // With the fence between them, no image has the mark without the data.
    for domain in [ADR, EADR] {
        let p = pool(domain);
        p.write_bytes_nt(data, &[7u8; 128]);
        p.fence();
        p.write_u64(mark, 1);
        let state = crash(&p);
        for img in all_images(&state) {
            assert_eq!(&img.bytes[data as usize..data as usize + 128], &[7u8; 128]);
        }
    }
}

#[test]
fn non_temporal_pieces_survive_in_any_subset_and_order() {
    for domain in [ADR, EADR] {
        let p = pool(domain);
        let a = p.first_usable();
        // Three streaming stores in program order: two to one line, one to another.
        p.write_bytes_nt(a, &OLD.to_ne_bytes());
        p.write_bytes_nt(a + 8, &NEW.to_ne_bytes());
        p.write_bytes_nt(a + 128, &NEW.to_ne_bytes());
        let state = crash(&p);
        assert_eq!(state.pending_non_temporal(), 3, "{domain}");
        assert_eq!(state.image_count(), 8, "{domain}");
        let seen: HashSet<(bool, bool, bool)> = all_images(&state)
            .iter()
            .map(|img| {
                (
                    word(img, a) == OLD,
                    word(img, a + 8) == NEW,
                    word(img, a + 128) == NEW,
                )
            })
            .collect();
        assert_eq!(
            seen.len(),
            8,
            "{domain}: every subset, a later one without an earlier too"
        );
    }
}

#[test]
fn a_fence_drains_only_its_own_threads_non_temporal_stores() {
    for domain in [ADR, EADR] {
        let p = std::sync::Arc::new(pool(domain));
        let a = p.first_usable();
        let other = p.clone();
        std::thread::spawn(move || {
            other.write_bytes_nt(a + 64, &NEW.to_ne_bytes());
            other.fence();
        })
        .join()
        .unwrap();
        p.write_bytes_nt(a, &NEW.to_ne_bytes());
        let other = p.clone();
        std::thread::spawn(move || other.fence()).join().unwrap();
        let state = crash(&p);
        assert_eq!(state.pending_non_temporal(), 1, "{domain}");
        assert_eq!(
            word(&state.durable_image(), a),
            0,
            "{domain}: not fenced by its thread"
        );
        assert_eq!(
            word(&state.durable_image(), a + 64),
            NEW,
            "{domain}: fenced by its own"
        );
    }
}

#[test]
fn a_later_durable_store_wins_over_an_earlier_unfenced_streaming_store() {
    // eADR: the ordinary store is durable at once and supersedes the streaming store, which is
    // then no longer pending (whichever reaches PM first, the older value cannot be left).
    let p = pool(EADR);
    let a = p.first_usable();
    p.write_bytes_nt(a, &OLD.to_ne_bytes());
    p.write_u64(a, NEW);
    let state = crash(&p);
    assert_eq!(state.image_count(), 1);
    assert_eq!(word(&state.durable_image(), a), NEW);
    // Partly overwritten: the rest of the streaming store stays pending.
    let p = pool(EADR);
    p.write_bytes_nt(a, &[1u8; 16]);
    p.write_u64(a, NEW);
    let state = crash(&p);
    assert_eq!(state.pending_non_temporal(), 1);
    for img in all_images(&state) {
        assert_eq!(word(&img, a), NEW);
    }
    // ADR: a streaming store fenced over a pending cached store of the same word: whether that
    // line is written back later or not, the newer value stays.
    let p = pool(ADR);
    p.write_u64(a, OLD);
    p.write_bytes_nt(a, &NEW.to_ne_bytes());
    p.fence();
    let state = crash(&p);
    for img in all_images(&state) {
        assert_eq!(
            word(&img, a),
            NEW,
            "the older cached store cannot show through"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 16. model-based property test (three threads, streaming stores, both domains)

/// Three cache lines.
const REGION: usize = 3 * CACHE_LINE as usize;
/// Threads issuing the ops of one case.
const THREADS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    WriteU64 { word: usize, value: u64 },
    WriteBytes { off: usize, data: Vec<u8> },
    WriteNonTemporal { off: usize, data: Vec<u8> },
    Flush { off: usize, len: usize },
    Fence,
}

fn bytes_strategy() -> impl Strategy<Value = (usize, Vec<u8>)> {
    (0..REGION, prop::collection::vec(any::<u8>(), 1..=24)).prop_map(|(off, mut data)| {
        data.truncate(REGION - off);
        (off, data)
    })
}

/// An op and the thread (`0..THREADS`) that issues it.
fn op_strategy() -> impl Strategy<Value = (usize, Op)> {
    let op = prop_oneof![
        3 => (0..REGION / 8, any::<u64>()).prop_map(|(word, value)| Op::WriteU64 { word, value }),
        3 => bytes_strategy().prop_map(|(off, data)| Op::WriteBytes { off, data }),
        2 => bytes_strategy().prop_map(|(off, data)| Op::WriteNonTemporal { off, data }),
        2 => (0..REGION, 0..=REGION).prop_map(|(off, len)| Op::Flush { off, len: len.min(REGION - off) }),
        1 => Just(Op::Fence),
    ];
    (0..THREADS, op)
}

/// One store piece (at most 8 bytes inside one aligned word) of the reference model.
struct Piece {
    addr: usize,
    data: Vec<u8>,
    thread: usize,
    non_temporal: bool,
    /// Threads that flushed this (cached) piece's line after it was stored.
    flushed_by: HashSet<usize>,
    durable: bool,
}

/// The reference model: every store piece ever made, in global program order, each with its own
/// persistence state, written from the rules of shared/DESIGN.md rather than from the simulator's
/// data structures. Offsets are relative to the region, which starts on a line boundary.
struct Model {
    domain: PersistenceDomain,
    initial: Vec<u8>,
    live: Vec<u8>,
    pieces: Vec<Piece>,
}

impl Model {
    fn new(domain: PersistenceDomain, initial: Vec<u8>) -> Model {
        Model {
            domain,
            live: initial.clone(),
            initial,
            pieces: Vec::new(),
        }
    }

    fn store(&mut self, thread: usize, off: usize, data: &[u8], non_temporal: bool) {
        self.live[off..off + data.len()].copy_from_slice(data);
        let mut start = 0;
        for i in 1..=data.len() {
            if i == data.len() || (off + i) % 8 == 0 {
                self.pieces.push(Piece {
                    addr: off + start,
                    data: data[start..i].to_vec(),
                    thread,
                    non_temporal,
                    flushed_by: HashSet::new(),
                    // eADR: an ordinary store is durable once executed; a streaming one is not.
                    durable: self.domain == EADR && !non_temporal,
                });
                start = i;
            }
        }
    }

    fn line(addr: usize) -> usize {
        addr / CACHE_LINE as usize
    }

    fn flush(&mut self, thread: usize, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        let lines = Self::line(off)..=Self::line(off + len - 1);
        for p in &mut self.pieces {
            if !p.durable && !p.non_temporal && lines.contains(&Self::line(p.addr)) {
                p.flushed_by.insert(thread);
            }
        }
    }

    /// A fence makes durable what its own thread flushed and streamed, nothing of other threads.
    fn fence(&mut self, thread: usize) {
        for p in &mut self.pieces {
            if (p.non_temporal && p.thread == thread) || p.flushed_by.contains(&thread) {
                p.durable = true;
            }
        }
    }

    /// Whether every byte of piece `i` is overwritten by a later durable piece.
    fn superseded(&self, i: usize) -> bool {
        let p = &self.pieces[i];
        (p.addr..p.addr + p.data.len()).all(|b| {
            self.pieces[i + 1..]
                .iter()
                .any(|q| q.durable && (q.addr..q.addr + q.data.len()).contains(&b))
        })
    }

    /// The pending units, as `CrashState` orders them: the lines with pending cached pieces
    /// (address order, each with its pieces' indexes in program order), then the pending
    /// streaming pieces that can still show (program order).
    fn units(&self) -> (BTreeMap<usize, Vec<usize>>, Vec<usize>) {
        let mut lines: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut streaming = Vec::new();
        for (i, p) in self.pieces.iter().enumerate().filter(|(_, p)| !p.durable) {
            if p.non_temporal {
                if !self.superseded(i) {
                    streaming.push(i);
                }
            } else {
                lines.entry(Self::line(p.addr)).or_default().push(i);
            }
        }
        (lines, streaming)
    }

    /// The image that keeps the durable pieces and the pending ones `choice` selects, applied in
    /// program order (a later store wins).
    fn image(&self, choice: &[usize]) -> Vec<u8> {
        let (lines, streaming) = self.units();
        let mut keep: HashSet<usize> = HashSet::new();
        for ((_, pieces), &k) in lines.iter().zip(choice) {
            keep.extend(&pieces[..k]);
        }
        for (&i, &k) in streaming.iter().zip(&choice[lines.len()..]) {
            if k != 0 {
                keep.insert(i);
            }
        }
        let mut bytes = self.initial.clone();
        for (i, p) in self.pieces.iter().enumerate() {
            if p.durable || keep.contains(&i) {
                bytes[p.addr..p.addr + p.data.len()].copy_from_slice(&p.data);
            }
        }
        bytes
    }

    fn durable(&self) -> Vec<u8> {
        let (lines, streaming) = self.units();
        self.image(&vec![0; lines.len() + streaming.len()])
    }
}

/// Runs `ops` on `THREADS` threads, one op at a time in the given order (so the global order is
/// deterministic), against a simulated pool and the model, then compares what a crash may leave.
fn run_model_case(
    domain: PersistenceDomain,
    ops: &[(usize, Op)],
    picks: &[usize],
) -> Result<(), TestCaseError> {
    let pool = pool(domain);
    let base = pool.first_usable();
    let b = base as usize;
    prop_assert_eq!(base % CACHE_LINE, 0);
    let initial_pool = pool.read_vec(0, SIZE as usize);
    let mut model = Model::new(domain, initial_pool[b..b + REGION].to_vec());
    let mut events = 0;
    std::thread::scope(|scope| {
        let mut inboxes = Vec::new();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        for _ in 0..THREADS {
            let (tx, rx) = std::sync::mpsc::channel::<Op>();
            inboxes.push(tx);
            let done = done_tx.clone();
            let pool = &pool;
            scope.spawn(move || {
                for op in rx {
                    match op {
                        Op::WriteU64 { word, value } => {
                            pool.write_u64(base + 8 * word as u64, value)
                        }
                        Op::WriteBytes { off, data } => pool.write_bytes(base + off as u64, &data),
                        Op::WriteNonTemporal { off, data } => {
                            pool.write_bytes_nt(base + off as u64, &data)
                        }
                        Op::Flush { off, len } => pool.flush(base + off as u64, len as u64),
                        Op::Fence => pool.fence(),
                    }
                    done.send(()).unwrap();
                }
            });
        }
        for (thread, op) in ops {
            inboxes[*thread].send(op.clone()).unwrap();
            done_rx.recv().unwrap();
            match op {
                Op::WriteU64 { word, value } => {
                    model.store(*thread, 8 * word, &value.to_ne_bytes(), false)
                }
                Op::WriteBytes { off, data } => model.store(*thread, *off, data, false),
                Op::WriteNonTemporal { off, data } => model.store(*thread, *off, data, true),
                Op::Flush { off, len } => model.flush(*thread, *off, *len),
                Op::Fence => model.fence(*thread),
            }
            // A zero-length flush is not an event (Pool::flush returns before recording it).
            if !matches!(op, Op::Flush { len: 0, .. }) {
                events += 1;
            }
        }
        drop(inboxes);
    });
    prop_assert_eq!(pool.crash_sim().unwrap().events(), events);
    let state = crash(&pool);
    let in_pool = |region: &[u8]| {
        let mut all = initial_pool.clone();
        all[b..b + REGION].copy_from_slice(region);
        all
    };
    // (a) durable image
    prop_assert!(
        state.durable_image().bytes == in_pool(&model.durable()),
        "durable image differs"
    );
    // (b) full image = live bytes
    let live = pool.read_vec(0, SIZE as usize);
    prop_assert!(
        live == in_pool(&model.live),
        "live bytes differ from the model"
    );
    prop_assert!(
        state.full_image().bytes == live,
        "full image differs from live"
    );
    // (d) pending counts
    let (lines, streaming) = model.units();
    prop_assert_eq!(state.pending_lines(), lines.len());
    prop_assert_eq!(state.pending_non_temporal(), streaming.len());
    prop_assert_eq!(
        state.pending_stores(),
        lines.values().map(Vec::len).sum::<usize>() + streaming.len()
    );
    let radices: Vec<usize> = lines
        .values()
        .map(|p| p.len() + 1)
        .chain(streaming.iter().map(|_| 2))
        .collect();
    let count: u128 = radices.iter().map(|&r| r as u128).product();
    prop_assert_eq!(state.image_count(), count);
    // (c) chosen images
    for chunk in picks.chunks(3) {
        let choice: Vec<usize> = radices
            .iter()
            .enumerate()
            .map(|(i, r)| chunk[i % chunk.len()].wrapping_add(i) % r)
            .collect();
        let img = state.image(&choice);
        prop_assert_eq!(&img.prefixes, &choice);
        prop_assert!(
            img.bytes == in_pool(&model.image(&choice)),
            "image {:?} differs",
            choice
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn simulator_matches_a_reference_model_under_adr(
        ops in prop::collection::vec(op_strategy(), 0..40),
        picks in prop::collection::vec(any::<usize>(), 12),
    ) {
        run_model_case(ADR, &ops, &picks)?;
    }

    #[test]
    fn simulator_matches_a_reference_model_under_eadr(
        ops in prop::collection::vec(op_strategy(), 0..40),
        picks in prop::collection::vec(any::<usize>(), 12),
    ) {
        run_model_case(EADR, &ops, &picks)?;
    }
}

/// A thread waiting on DRAM state (FIR's header latch) unwinds at a simulated crash through
/// `unwind_if_crashed`, as its next PM event would: the holder may have unwound at the crash and
/// never release it. Before the crash, and without a simulator, it returns.
#[test]
fn unwind_if_crashed_unwinds_only_after_the_crash() {
    let pool = pool(ADR);
    assert!(catch(|| pool.unwind_if_crashed()).is_ok());
    pool.crash_now();
    let event = pool.crash_sim().unwrap().crashed_at().unwrap();
    assert_eq!(
        catch(|| pool.unwind_if_crashed()).unwrap_err(),
        SimulatedCrash { event }
    );
    let plain = Pool::create_in_memory(SIZE, &opts(ADR)).unwrap();
    assert!(catch(|| plain.unwind_if_crashed()).is_ok());
}
