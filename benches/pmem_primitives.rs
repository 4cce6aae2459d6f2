//! Micro-benchmarks of the pmem persistence primitives.
//!
//! * `persist/<domain>/<bytes>`: one `write_bytes` of N bytes then `persist` of the same range,
//!   with the target rotating over a 64 MiB region so that the flushed lines are not always the
//!   same hot ones.
//! * `counting/<on|off>`: 1024 `write_u64` to consecutive words then one `persist` of the last line
//!   (ADR), with the per-thread PM traffic counters on and off.
//! * `flush_line/<domain>`: `write_u64`, `flush(off, 8)`, `fence()` of one line: the raw
//!   `clwb` + `sfence` cost (an `msync` of one page in the msync domain).
//! * `media_read/<none|model|optane>`: one step of a pointer chase over the lines of the 64 MiB
//!   region in a random cyclic order (each `read_u64` yields the next offset, so every read waits
//!   for the one before: a load-to-use latency, as published PM latencies are measured), without
//!   a media model, with the `optane` model, and with the model plus `optane` latency emulation.
//!   `none` is this machine's DRAM latency; `optane` minus `model` is the emulated extra latency
//!   per miss (the region dwarfs the modelled 2 MiB cache, so nearly every read misses). Issue 20.
//! * `media_read_seq/<none|model|optane>`: the same chase in address order: every read is the
//!   line after the previous one, a sequential miss.
//!
//! File pools for volatile, ADR and eADR live under /dev/shm; msync pools live in a temporary
//! directory on the regular disk. Every pool is created with `removing_on_drop`, so nothing is
//! left behind. Run with `cargo bench --bench pmem_primitives`.

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use pmtx::pmem::{MediaModel, MediaOptions, NvmLatency, PersistenceDomain, Pool, PoolOptions};
use std::hint::black_box;
use std::time::Duration;

/// Size of every file pool.
const POOL_SIZE: u64 = 128 << 20;
/// The region the `persist` targets rotate over.
const REGION: u64 = 64 << 20;
/// Sizes of the `persist` benchmarks.
const SIZES: [u64; 4] = [64, 256, 1024, 4096];
/// An odd multiplier: `i * STEP mod 2^k` visits every slot of a power-of-two region once per cycle,
/// in an order the hardware prefetchers do not follow.
const STEP: u64 = 0x9E37_79B9;

const FAST_DOMAINS: [PersistenceDomain; 3] = [
    PersistenceDomain::Volatile,
    PersistenceDomain::Adr,
    PersistenceDomain::Eadr,
];

/// A file pool for `domain` (with `counting`), plus the temporary directory that holds it for the
/// msync domain. Fields drop in order: the pool (removing its file) before the directory.
struct BenchPool {
    pool: Pool,
    _dir: Option<tempfile::TempDir>,
}

impl BenchPool {
    fn new(domain: PersistenceDomain, counting: bool) -> BenchPool {
        Self::with_media(domain, counting, None)
    }

    fn with_media(
        domain: PersistenceDomain,
        counting: bool,
        media: Option<MediaOptions>,
    ) -> BenchPool {
        let opts = PoolOptions::new("bench", domain)
            .with_counting(counting)
            .with_media(media)
            .removing_on_drop();
        let (pool, dir) = if domain == PersistenceDomain::Msync {
            // msync only means something on a real file system, so not under /dev/shm.
            let dir = tempfile::tempdir_in(std::env::temp_dir()).expect("temporary directory");
            let path = dir.path().join("bench.pool");
            (
                Pool::create(Some(&path), POOL_SIZE, &opts).expect("create msync pool"),
                Some(dir),
            )
        } else {
            (
                Pool::create(None, POOL_SIZE, &opts).expect("create pool under /dev/shm"),
                None,
            )
        };
        // Touch the whole region once (page faults, and on disk the conversion of preallocated
        // extents), and for msync write it back, so that the benchmarks only pay for their own
        // stores and flushes.
        let base = pool.first_usable();
        pool.fill(base, 0, REGION);
        if domain == PersistenceDomain::Msync {
            pool.persist(base, REGION);
        }
        BenchPool { pool, _dir: dir }
    }
}

/// Sets the per-group timing for the fast (in-memory) domains.
fn fast_config(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sampling_mode(SamplingMode::Auto)
        .sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
}

/// Sets the timing for msync, where one operation costs a disk write.
fn msync_config(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
}

/// Runs `persist/<domain>/<bytes>` for every size on one pool of `domain`, created only if one of
/// the benchmarks is selected by the filter.
fn persist_domain(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    domain: PersistenceDomain,
) {
    let mut slot: Option<BenchPool> = None;
    for &n in &SIZES {
        group.throughput(Throughput::Bytes(n));
        group.bench_with_input(BenchmarkId::new(domain.name(), n), &n, |b, &n| {
            let pool = &slot
                .get_or_insert_with(|| BenchPool::new(domain, true))
                .pool;
            let base = pool.first_usable();
            let slots_mask = REGION / n - 1;
            let payload = vec![0xA5u8; n as usize];
            let mut i: u64 = 0;
            b.iter(|| {
                i = i.wrapping_add(1);
                let off = base + (i.wrapping_mul(STEP) & slots_mask) * n;
                pool.write_bytes(off, black_box(&payload));
                pool.persist(off, n);
            });
        });
    }
    // `slot` drops here: the pool file is removed before the next domain's is created.
}

fn bench_persist(c: &mut Criterion) {
    let mut group = c.benchmark_group("persist");
    fast_config(&mut group);
    for domain in FAST_DOMAINS {
        persist_domain(&mut group, domain);
    }
    msync_config(&mut group);
    persist_domain(&mut group, PersistenceDomain::Msync);
    group.finish();
}

fn bench_counting(c: &mut Criterion) {
    const WORDS: u64 = 1024;
    let mut group = c.benchmark_group("counting");
    fast_config(&mut group);
    group.throughput(Throughput::Bytes(WORDS * 8));
    for counting in [true, false] {
        let name = if counting { "on" } else { "off" };
        let mut slot: Option<BenchPool> = None;
        group.bench_function(name, |b| {
            let pool = &slot
                .get_or_insert_with(|| BenchPool::new(PersistenceDomain::Adr, counting))
                .pool;
            let base = pool.first_usable();
            let last = base + (WORDS - 1) * 8;
            let mut v: u64 = 0;
            b.iter(|| {
                v = v.wrapping_add(1);
                for w in 0..WORDS {
                    pool.write_u64(base + w * 8, black_box(v ^ w));
                }
                pool.persist(last & !63, 64);
            });
        });
    }
    group.finish();
}

fn bench_flush_line(c: &mut Criterion) {
    let mut group = c.benchmark_group("flush_line");
    fast_config(&mut group);
    for domain in PersistenceDomain::ALL {
        if domain == PersistenceDomain::Msync {
            msync_config(&mut group);
        }
        let mut slot: Option<BenchPool> = None;
        group.bench_function(domain.name(), |b| {
            let pool = &slot
                .get_or_insert_with(|| BenchPool::new(domain, true))
                .pool;
            let off = pool.first_usable();
            let mut v: u64 = 0;
            b.iter(|| {
                v = v.wrapping_add(1);
                pool.write_u64(off, black_box(v));
                pool.flush(off, 8);
                pool.fence();
            });
        });
    }
    group.finish();
}

fn bench_media_read(c: &mut Criterion) {
    media_read(c, "media_read", true);
    media_read(c, "media_read_seq", false);
}

/// The pointer chase of `media_read` (random order) or `media_read_seq` (line after line).
fn media_read(c: &mut Criterion, name: &str, random: bool) {
    let mut group = c.benchmark_group(name);
    fast_config(&mut group);
    let model = MediaModel::optane();
    let configs = [
        ("none", None),
        (
            "model",
            Some(MediaOptions {
                model,
                latency: None,
            }),
        ),
        (
            "optane",
            Some(MediaOptions {
                model,
                latency: Some(NvmLatency::optane()),
            }),
        ),
    ];
    for (name, media) in configs {
        let mut slot: Option<BenchPool> = None;
        group.bench_function(name, |b| {
            let pool = &slot
                .get_or_insert_with(|| {
                    let p = BenchPool::with_media(PersistenceDomain::Adr, true, media);
                    link_cycle(&p.pool, random);
                    p
                })
                .pool;
            let mut at = pool.first_usable();
            b.iter(|| {
                at = pool.read_u64(black_box(at));
            });
        });
    }
    group.finish();
}

/// Writes into the first word of every line of the region the offset of the next line of one
/// cycle through all of them, random (Sattolo's shuffle) or in address order, for a pointer
/// chase.
fn link_cycle(pool: &Pool, random: bool) {
    let base = pool.first_usable();
    let lines = (REGION / 64) as usize;
    let mut order: Vec<u64> = (0..lines as u64).collect();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for i in (1..lines).rev().filter(|_| random) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % i as u64) as usize);
    }
    for i in 0..lines {
        let next = order[(i + 1) % lines];
        pool.write_u64(base + order[i] * 64, base + next * 64);
    }
}

criterion_group!(
    benches,
    bench_persist,
    bench_counting,
    bench_flush_line,
    bench_media_read
);
criterion_main!(benches);
