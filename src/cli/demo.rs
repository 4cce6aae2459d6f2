//! `pmtx demo`: the embedded default. A scratch pool, some durable writes, and a look at what a
//! simulated power failure could leave under ADR and under eADR.

use super::{human_bytes, CliResult};
use crate::alloc::{PageManager, PageTag};
use crate::pmem::{stats, CrashTrigger, PersistenceDomain, Pool, PoolOptions};
use std::path::PathBuf;

/// Arguments of `pmtx demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Pool file to create (default: a new file under /dev/shm, or the temp dir, removed at exit).
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// Persistence domain for the durable writes.
    #[arg(long, default_value = "adr")]
    pub domain: PersistenceDomain,
    /// Records to write.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
}

const RECORD: u64 = 64;

pub(crate) fn run(args: DemoArgs) -> CliResult {
    let mut opts = PoolOptions::new("demo", args.domain);
    if args.pool.is_none() {
        opts = opts.removing_on_drop();
    }
    let bytes_needed = args.records * RECORD;
    let size = bytes_needed.div_ceil(crate::alloc::PAGE_SIZE) * crate::alloc::PAGE_SIZE
        + 2 * crate::alloc::PAGE_SIZE;
    let pool = Pool::create(args.pool.as_deref(), size, &opts)?;
    outln!(
        "created {} ({}, mapping {:?}, flush with {})",
        pool.path()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        human_bytes(pool.len()),
        pool.mapping_kind(),
        pool.flush_instruction().name()
    );
    let pages = PageManager::format(&pool)?;
    let per_page = crate::alloc::PAGE_SIZE / RECORD;
    let before = stats::thread_snapshot();
    let start = std::time::Instant::now();
    let mut page_base = 0;
    for i in 0..args.records {
        if i % per_page == 0 {
            let page = pages.allocate(
                &pool,
                PageTag {
                    kind: 1,
                    owner: 0,
                    value: 0,
                },
            )?;
            page_base = pages.page_offset(page);
        }
        let off = page_base + (i % per_page) * RECORD;
        let mut record = [0u8; RECORD as usize];
        record[..8].copy_from_slice(&i.to_le_bytes());
        record[8..16].copy_from_slice(&(i * i).to_le_bytes());
        pool.write_bytes(off, &record);
        pool.persist(off, RECORD);
    }
    let elapsed = start.elapsed();
    let d = stats::thread_snapshot() - before;
    outln!(
        "wrote and persisted {} records of {RECORD} B under {}: {:.0} ns per record; {} flushed lines, {} fences",
        args.records,
        args.domain,
        elapsed.as_nanos() as f64 / args.records.max(1) as f64,
        d.lines_flushed,
        d.fences
    );
    let usage = pages.usage(&pool);
    outln!(
        "space used: {} of {}",
        human_bytes(usage.bytes_used),
        human_bytes(usage.bytes_total)
    );
    drop(pool);
    for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
        show_crash(domain)?;
    }
    Ok(())
}

/// Writes two words, persists only the first, then fails power: under ADR the second may or may
/// not survive; under eADR both always do.
fn show_crash(domain: PersistenceDomain) -> CliResult {
    let opts = PoolOptions::new("demo", domain).with_crash_sim(CrashTrigger::Never);
    let pool = Pool::create_in_memory(1 << 20, &opts)?;
    let (a, b) = (pool.first_usable(), pool.first_usable() + 64);
    pool.write_u64(a, 1);
    pool.persist(a, 8);
    pool.write_u64(b, 2);
    pool.crash_now();
    let state = pool
        .crash_sim()
        .expect("attached above")
        .crash_state()
        .expect("crashed above");
    let images: Vec<_> = state.images(16, 1).collect();
    let survivors: Vec<String> = images
        .iter()
        .map(|img| {
            let word = |o: u64| {
                u64::from_le_bytes(img.bytes[o as usize..o as usize + 8].try_into().unwrap())
            };
            format!("a={} b={}", word(a), word(b))
        })
        .collect();
    outln!(
        "{domain}: wrote a=1 (persisted) and b=2 (not flushed), then power failed: {} possible state(s): {}",
        images.len(),
        survivors.join(" | ")
    );
    Ok(())
}
