//! Micro-benchmarks of the pmem persistence primitives.
//!
//! * `persist/<domain>/<bytes>`: one `write_bytes` of N bytes then `persist` of the same range,
//!   with the target rotating over a 64 MiB region so that the flushed lines are not always the
//!   same hot ones.
//! * `counting/<on|off>`: 1024 `write_u64` to consecutive words then one `persist` of the last line
//!   (ADR), with the per-thread PM traffic counters on and off.
//! * `flush_line/<domain>`: `write_u64`, `flush(off, 8)`, `fence()` of one line: the raw
//!   `clwb` + `sfence` cost (an `msync` of one page in the msync domain).
//!
//! File pools for volatile, ADR and eADR live under /dev/shm; msync pools live in a temporary
//! directory on the regular disk. Every pool is created with `removing_on_drop`, so nothing is
//! left behind. Run with `cargo bench --bench pmem_primitives`.

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use pmtx::pmem::{PersistenceDomain, Pool, PoolOptions};
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
        let opts = PoolOptions::new("bench", domain)
            .with_counting(counting)
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

criterion_group!(benches, bench_persist, bench_counting, bench_flush_line);
criterion_main!(benches);
