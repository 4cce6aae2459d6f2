//! What the fuzz targets (`fuzz/`, `scripts/fuzz.sh`, README "Fuzzing") and their CI proptest
//! (`tests/fuzz_props.rs`) run: small crash images of every durable engine, byte patches applied
//! to them, and the full open path — pool header, page table, engine recovery, a read of every
//! row, the structure check — on the result.
//!
//! The property is the one of `pmtx check`: whatever the bytes, opening them ends in `Ok` or in a
//! clear error; never a panic, a hang, an out-of-bounds read, an allocation the size of a damaged
//! length field, or a write to the input (the image is copied into its own pool first).

use crate::catalog::{ColumnType, Schema};
use crate::db::{Db, DbConfig, Value};
use crate::engine::{EngineKind, TxError};
use crate::pmem::header::{Header, HEADER_LEN};
use crate::pmem::{CrashTrigger, PersistenceDomain, Pool, PoolOptions, SimulatedCrash};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::OnceLock;

/// The engine × domain pairs a crash image is made for: every durable engine under every domain
/// it is crash-safe in (falcon-noflush only under eADR, see [`super::supported`]).
pub const VARIANTS: [(EngineKind, PersistenceDomain); 9] = [
    (EngineKind::Falcon, PersistenceDomain::Adr),
    (EngineKind::Falcon, PersistenceDomain::Eadr),
    (EngineKind::FalconAllflush, PersistenceDomain::Adr),
    (EngineKind::FalconAllflush, PersistenceDomain::Eadr),
    (EngineKind::FalconNoflush, PersistenceDomain::Eadr),
    (EngineKind::Inp, PersistenceDomain::Adr),
    (EngineKind::Inp, PersistenceDomain::Eadr),
    (EngineKind::Zen, PersistenceDomain::Adr),
    (EngineKind::Zen, PersistenceDomain::Eadr),
];

/// Where in the workload power fails, per mille of its PM events (1000: after the last one,
/// with every pending store lost).
pub const CRASH_POINTS: [u64; 2] = [700, 1000];

/// Base images: every variant at every crash point.
pub const BASE_IMAGES: usize = VARIANTS.len() * CRASH_POINTS.len();

/// Accounts the workload loads (keys `0..ACCOUNTS`).
const ACCOUNTS: u64 = 24;
/// Notes the workload loads (keys `0..NOTES`).
const NOTES: u64 = 8;
/// Keys probed in the hash-indexed table (it cannot be scanned): all the workload ever wrote.
const NOTE_KEYS_PROBED: u64 = 64;

/// A crash image to mutate, and the 64-byte lines of it worth mutating.
pub struct BaseImage {
    /// The engine that wrote it (recovery runs this engine).
    pub engine: EngineKind,
    /// The domain it was written under.
    pub domain: PersistenceDomain,
    /// The pool's bytes.
    pub bytes: Vec<u8>,
    /// Offsets of the 64-byte lines holding a nonzero byte (headers, page table, meta page,
    /// catalog, log windows, tuple headers and rows), and of the line after each (what a torn or
    /// a longer write would reach).
    pub hot_lines: Vec<u64>,
}

fn db_config(engine: EngineKind, domain: PersistenceDomain) -> DbConfig {
    let mut c = DbConfig::temporary()
        .engine(engine)
        .domain(domain)
        .max_threads(2)
        .pool_size(6 * crate::alloc::PAGE_SIZE);
    c.counting = false;
    c.max_row_bytes = 512;
    c.cache_min_entries = 16;
    c.max_retries = 10;
    if engine != EngineKind::Zen {
        // Small slots: the larger transactions below spill their redo (Falcon's spill path).
        c.window_slot_bytes = Some(512);
        c.window_slots = Some(4);
    }
    c
}

/// The deterministic workload: two tables (ordered with a secondary index, and hashed), a load,
/// transfers, updates, deletes and re-inserts, and transactions too large for a window slot.
fn workload(db: &Db) -> Result<(), String> {
    let e = |e: crate::engine::DbError| e.to_string();
    let accounts = db
        .create_table(
            Schema::new(
                "accounts",
                &[
                    ("balance", ColumnType::U64),
                    ("owner", ColumnType::Bytes(16)),
                ],
            )
            .ordered()
            .with_secondary("by_owner", &["owner"]),
        )
        .map_err(e)?;
    let notes = db
        .create_table(Schema::new("notes", &[("text", ColumnType::Bytes(200))]))
        .map_err(e)?;
    let owner = |k: u64| format!("owner-{}", k % 5).into_bytes();
    for chunk in 0..ACCOUNTS / 6 {
        db.run(|tx| {
            for k in chunk * 6..chunk * 6 + 6 {
                tx.insert(accounts, k, &[Value::U64(100), Value::Bytes(&owner(k))])?;
            }
            Ok(())
        })
        .map_err(e)?;
    }
    db.run(|tx| {
        for k in 0..NOTES {
            tx.insert(notes, k, &[Value::Bytes(&[b'a' + k as u8; 150])])?;
        }
        Ok(())
    })
    .map_err(e)?;
    for i in 0..24u64 {
        let (from, to) = ((i * 7) % ACCOUNTS, (i * 11 + 3) % ACCOUNTS);
        db.run(|tx| {
            let a = match tx.get(accounts, from) {
                Ok(r) => r.u64(0),
                Err(TxError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            let b = match tx.get(accounts, to) {
                Ok(r) => r.u64(0),
                Err(TxError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            if from != to {
                tx.update(accounts, from, &[(0, Value::U64(a.saturating_sub(i)))])?;
                tx.update(accounts, to, &[(0, Value::U64(b + i))])?;
            }
            Ok(())
        })
        .map_err(e)?;
        match i % 6 {
            1 => db.run(|tx| tx.delete(accounts, i % ACCOUNTS)).map_err(e)?,
            2 => db
                .run(|tx| {
                    let k = ACCOUNTS + i;
                    tx.insert(accounts, k, &[Value::U64(i), Value::Bytes(&owner(k))])
                })
                .map_err(e)?,
            3 => db
                .run(|tx| {
                    // Four 200-byte after-images: more than a 512-byte window slot holds.
                    for k in 0..4 {
                        let key = (k + i) % NOTES;
                        if tx.exists(notes, key)? {
                            tx.update(notes, key, &[(0, Value::Bytes(&[i as u8; 180]))])?;
                        }
                    }
                    Ok(())
                })
                .map_err(e)?,
            4 => db
                .run(|tx| {
                    if tx.exists(notes, i % NOTES)? {
                        tx.delete(notes, i % NOTES)?;
                    }
                    tx.insert(notes, NOTES + i, &[Value::Bytes(b"re-inserted")])
                })
                .map_err(e)?,
            _ => {}
        }
    }
    Ok(())
}

/// Runs the workload on a fresh in-memory pool of `engine` under `domain` with power failing at
/// `trigger`; returns the simulator's events and the crash image (every pending store kept when
/// `keep_pending`, else every one lost).
fn run_workload(
    engine: EngineKind,
    domain: PersistenceDomain,
    trigger: CrashTrigger,
    keep_pending: bool,
) -> Result<(u64, Vec<u8>), String> {
    let config = db_config(engine, domain);
    let opts = PoolOptions::new(engine.layout(), domain)
        .with_counting(false)
        .with_crash_sim(trigger);
    let pool = Pool::create_in_memory(config.pool_size, &opts).map_err(|e| e.to_string())?;
    let sim = pool.crash_sim().expect("attached").clone();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let db = Db::create_on_pool(pool, config).map_err(|e| e.to_string())?;
        workload(&db)?;
        if let Some(p) = db.engine().pool() {
            p.crash_now();
        }
        Ok(())
    }));
    match outcome {
        Ok(r) => r?,
        Err(p) if SimulatedCrash::is(p.as_ref()) => {}
        Err(p) => std::panic::resume_unwind(p),
    }
    let state = sim
        .crash_state()
        .ok_or("the simulator did not record a crash")?;
    let image = if keep_pending {
        state.full_image()
    } else {
        state.durable_image()
    };
    Ok((sim.events(), image.bytes))
}

/// Builds base image `index` (a variant at a crash point; see [`VARIANTS`] and [`CRASH_POINTS`]).
/// Deterministic up to the pool's UUID and creation time.
pub fn build_base_image(index: usize) -> Result<BaseImage, String> {
    let (engine, domain) = VARIANTS[index % VARIANTS.len()];
    let permille = CRASH_POINTS[(index / VARIANTS.len()) % CRASH_POINTS.len()];
    let (events, _) = run_workload(engine, domain, CrashTrigger::Never, false)?;
    let bytes = if permille >= 1000 {
        run_workload(engine, domain, CrashTrigger::Never, false)?.1
    } else {
        let at = events * permille / 1000;
        run_workload(engine, domain, CrashTrigger::AtEvent(at), true)?.1
    };
    let mut hot_lines = Vec::new();
    for (i, line) in bytes.chunks(64).enumerate() {
        if line.iter().any(|&b| b != 0) {
            let at = i as u64 * 64;
            if hot_lines.last() != Some(&at) {
                hot_lines.push(at);
            }
            if at + 64 < bytes.len() as u64 {
                hot_lines.push(at + 64);
            }
        }
    }
    Ok(BaseImage {
        engine,
        domain,
        bytes,
        hot_lines,
    })
}

/// Base image `index`, built once per process.
pub fn base_image(index: usize) -> &'static BaseImage {
    static IMAGES: [OnceLock<BaseImage>; BASE_IMAGES] = [const { OnceLock::new() }; BASE_IMAGES];
    IMAGES[index % BASE_IMAGES].get_or_init(|| {
        build_base_image(index % BASE_IMAGES)
            .unwrap_or_else(|e| panic!("building base image {index}: {e}"))
    })
}

/// Bytes of one patch in a fuzz input.
pub const PATCH_BYTES: usize = 8;

/// Applies the patches in `input` to `image` (whose nonzero lines are `hot_lines`). Each patch is
/// [`PATCH_BYTES`] bytes: `op, line (u16), at, value (u32)`, all little-endian; `line` picks a hot
/// line, `at` a byte or word in it. Ops: set a byte, flip bits, store a 32-bit or a repeated
/// 64-bit word, add a signed delta to a word (lengths and offsets off by a little), copy one line
/// over another (a structure where another one belongs), zero a line (a lost write), set a byte
/// anywhere in the image.
pub fn apply_patches(image: &mut [u8], hot_lines: &[u64], input: &[u8]) {
    if image.is_empty() || hot_lines.is_empty() {
        return;
    }
    let len = image.len() as u64;
    let line_of = |sel: u64| hot_lines[(sel % hot_lines.len() as u64) as usize];
    for p in input.chunks_exact(PATCH_BYTES) {
        let op = p[0] % 8;
        let line = line_of(u64::from(u16::from_le_bytes([p[1], p[2]])));
        let at = p[3];
        let value = u32::from_le_bytes([p[4], p[5], p[6], p[7]]);
        let byte_at = ((line + u64::from(at % 64)) % len) as usize;
        let word_at = ((line + u64::from(at % 8) * 8) % len) as usize & !7;
        let word =
            |image: &[u8]| u64::from_le_bytes(image[word_at..word_at + 8].try_into().unwrap());
        match op {
            0 => image[byte_at] = value as u8,
            1 => image[byte_at] ^= (value as u8).max(1),
            2 => image[word_at..word_at + 8].copy_from_slice(&u64::from(value).to_le_bytes()),
            3 => {
                let v = u64::from(value) << 32 | u64::from(value);
                image[word_at..word_at + 8].copy_from_slice(&v.to_le_bytes())
            }
            4 => {
                let v = word(image).wrapping_add(value as i32 as i64 as u64);
                image[word_at..word_at + 8].copy_from_slice(&v.to_le_bytes())
            }
            5 => {
                let to = line_of(u64::from(value)) as usize;
                let from = line as usize;
                if from + 64 <= image.len() && to + 64 <= image.len() {
                    image.copy_within(from..from + 64, to);
                }
            }
            6 => {
                let from = line as usize;
                let end = (from + 64).min(image.len());
                image[from..end].fill(0);
            }
            _ => image[(u64::from(value) * 8 % len) as usize + (at as usize % 8)] = at,
        }
    }
}

/// What opening an image found.
#[derive(Debug)]
pub struct ImageSummary {
    /// The engine that recovered it.
    pub engine: EngineKind,
    /// Live rows per table (the structure check's count).
    pub rows: Vec<u64>,
    /// Rows read through transactions.
    pub rows_read: u64,
}

/// Opens `bytes` as a pool (its own copy), recovers it with `engine` (or the header's engine when
/// `None`), runs `pmtx check`'s checks, and reads every row: ordered tables by a full scan, the
/// others by probing the keys the fuzz workload uses. `Err` is the clear message a damaged image
/// must produce.
pub fn open_image(bytes: &[u8], engine: Option<EngineKind>) -> Result<ImageSummary, String> {
    let name = Path::new("<fuzzed image>");
    let header = Header::decode(name, bytes, bytes.len() as u64).map_err(|e| e.to_string())?;
    let engine = match engine {
        Some(e) => e,
        None => EngineKind::for_layout(&header.layout)
            .ok_or_else(|| format!("unknown layout '{}'", header.layout))?,
    };
    if engine == EngineKind::Volatile || engine.layout() != header.layout {
        return Err(format!(
            "engine {engine} does not open pools of layout '{}'",
            header.layout
        ));
    }
    let opts = PoolOptions::new(&header.layout, header.domain).with_counting(false);
    let pool = Pool::from_image(bytes, &opts).map_err(|e| e.to_string())?;
    let recovered = crate::cli::check::check_pool_as(pool, engine).map_err(|f| f.message())?;
    let db = &recovered.db;
    let mut rows_read = 0u64;
    for (id, schema) in db.engine().catalog().tables.iter().enumerate() {
        let id = id as crate::catalog::TableId;
        let ordered = schema.primary_index == crate::index::PrimaryIndexKind::Ordered;
        let read = db
            .worker()
            .and_then(|mut w| {
                w.run_read_only(|tx| {
                    if ordered {
                        return Ok(tx.scan(id, 0, usize::MAX)?.len() as u64);
                    }
                    let mut n = 0;
                    for k in 0..NOTE_KEYS_PROBED {
                        match tx.get(id, k) {
                            Ok(_) => n += 1,
                            Err(TxError::NotFound { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(n)
                })
            })
            .map_err(|e| format!("reading table {}: {e}", schema.name))?;
        rows_read += read;
    }
    Ok(ImageSummary {
        engine,
        rows: recovered.rows,
        rows_read,
    })
}

/// One fuzz case of the crash-image target: byte 0 picks the base image, the rest are patches.
/// Returns what [`open_image`] returned.
pub fn mutated_image_case(input: &[u8]) -> Result<ImageSummary, String> {
    let Some((&pick, patches)) = input.split_first() else {
        return Err("empty input".into());
    };
    let base = base_image(usize::from(pick));
    let mut image = base.bytes.clone();
    apply_patches(&mut image, &base.hot_lines, patches);
    open_image(&image, Some(base.engine))
}

/// Bytes of a pool header (what the pool-open target's inputs are mostly about).
pub const POOL_HEADER_BYTES: usize = HEADER_LEN;

/// One fuzz case of the pool-open target. Byte 0 is a mode: bit 0 clear, the rest of the input is
/// the whole image, as it is (mostly refused at the header); bit 0 set, the rest is laid over the
/// structures at the start of a pool of 64 KiB, 4 MiB or 6 MiB (bits 1–2) — 256 bytes at 0
/// (header and root word), 256 at 4 KiB (page-table superblock), 512 at 8 KiB (the first 64
/// descriptors), the rest from 2 MiB (page 1: the meta page when the root points there) — and the
/// header is made to pass its own checks (magic, version, length, size, CRC; a known layout and
/// domain when bit 3 is set, and then the page table's page count and the CRCs of the meta page
/// and of catalog slot A too), so that what lies behind them is reached: a CRC shows that bytes
/// are the ones written, not that what was written holds together.
pub fn pool_open_case(input: &[u8]) -> Result<ImageSummary, String> {
    let Some((&mode, rest)) = input.split_first() else {
        return Err("empty input".into());
    };
    if mode & 1 == 0 {
        for domain in [PersistenceDomain::Adr, PersistenceDomain::Eadr] {
            for layout in ["falcon", "zen"] {
                let _ = Pool::from_image(rest, &PoolOptions::new(layout, domain));
            }
        }
        return open_image(rest, None);
    }
    let size = [
        crate::pmem::MIN_POOL_SIZE,
        2 * crate::alloc::PAGE_SIZE,
        3 * crate::alloc::PAGE_SIZE,
    ][usize::from(mode >> 1 & 3) % 3];
    let mut image = vec![0u8; size as usize];
    let page = crate::alloc::PAGE_SIZE as usize;
    let mut rest = rest;
    for (at, len) in [
        (0usize, 256usize),
        (4096, 256),
        (8192, 512),
        (page, usize::MAX),
    ] {
        if at >= image.len() {
            break;
        }
        let n = rest.len().min(len).min(image.len() - at);
        image[at..at + n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
    seal_header(&mut image, mode & 8 != 0, mode >> 4);
    open_image(&image, None)
}

/// Makes the header of `image` pass [`Header::decode`]: magic, version, header length, size and
/// CRC; with `known`, also a layout and domain this build knows (picked by `pick`).
fn seal_header(image: &mut [u8], known: bool, pick: u8) {
    use crate::pmem::header::{FORMAT_VERSION, MAGIC};
    image[0..8].copy_from_slice(&MAGIC);
    image[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    image[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    let size = image.len() as u64;
    image[32..40].copy_from_slice(&size.to_le_bytes());
    if known {
        let layout: &[u8] = if pick & 1 == 0 { b"falcon" } else { b"zen" };
        image[48..80].fill(0);
        image[48..48 + layout.len()].copy_from_slice(layout);
        image[80] = if pick & 2 == 0 { 2 } else { 3 };
    }
    let crc = u64::from(crc32fast::hash(&image[..120]));
    image[120..128].copy_from_slice(&crc.to_le_bytes());
    let page = crate::alloc::PAGE_SIZE as usize;
    if known && image.len() >= 2 * page {
        // The page count the page table must state for this pool size (a base image's page
        // table describes a larger pool).
        let pages = crate::alloc::PageManager::pages_for(image.len() as u64);
        image[4096 + 16..4096 + 24].copy_from_slice(&pages.to_le_bytes());
        // The meta page's CRC (engine::meta): over its first 4 KiB with the CRC word zeroed.
        let crc_at = if pick & 1 == 0 {
            crate::engine::falcon::layout::meta::F_CRC
        } else {
            crate::engine::zen::layout::meta::F_CRC
        } as usize;
        let meta = &mut image[page..page + 4096];
        meta[crc_at..crc_at + 8].fill(0);
        let crc = u64::from(crc32fast::hash(meta));
        meta[crc_at..crc_at + 8].copy_from_slice(&crc.to_le_bytes());
        // Catalog slot A (both designs keep it at meta + 4 KiB): seq, len, CRC, 24-byte header.
        let at = page + 4096;
        let word = |image: &[u8], o: usize| {
            u64::from_le_bytes(image[at + o..at + o + 8].try_into().unwrap())
        };
        let (seq, len) = (word(image, 0), word(image, 8));
        if seq != 0 && len <= 8192 {
            let payload = &image[at + 24..at + 24 + len as usize];
            let mut h = crc32fast::Hasher::new();
            h.update(&seq.to_le_bytes());
            h.update(&len.to_le_bytes());
            h.update(payload);
            let crc = u64::from(h.finalize());
            image[at + 16..at + 24].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

/// The words of a Falcon window slot and its inline payload (see `engine::falcon::layout::slot`).
pub struct WindowSlot<'a> {
    /// State word.
    pub state: u64,
    /// Commit tid.
    pub tid: u64,
    /// Payload length word.
    pub len: u64,
    /// CRC word.
    pub crc: u64,
    /// Spilled word.
    pub spilled: u64,
    /// Bytes written after the slot header.
    pub payload: &'a [u8],
}

/// A copy of a Falcon-design `base` image with slot 0 of thread 0's window replaced by `slot`
/// (`None` for a Zen image, or a payload longer than the slot).
pub fn plant_window_slot(base: &BaseImage, slot: &WindowSlot<'_>) -> Option<Vec<u8>> {
    use crate::engine::falcon::layout::slot;
    let win = window_page(base)? as usize;
    let slot_bytes = 512usize; // db_config's window_slot_bytes
    if slot.payload.len() > slot_bytes - slot::HEADER as usize {
        return None;
    }
    let mut image = base.bytes.clone();
    for (at, v) in [
        (slot::TID, slot.tid),
        (slot::LEN, slot.len),
        (slot::CRC, slot.crc),
        (slot::SPILLED, slot.spilled),
        (slot::STATE, slot.state),
    ] {
        let at = win + at as usize;
        image[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    let at = win + slot::HEADER as usize;
    image[at..at + slot.payload.len()].copy_from_slice(slot.payload);
    Some(image)
}

/// The window page of thread 0 in a base image of the Falcon design (found in its page table).
pub fn window_page(base: &BaseImage) -> Option<u64> {
    let opts = PoolOptions::new(base.engine.layout(), base.domain).with_counting(false);
    let pool = Pool::from_image(&base.bytes, &opts).ok()?;
    let pages = crate::alloc::PageManager::open(&pool).ok()?;
    let found =
        pages.allocated(&pool).ok()?.into_iter().find(|(_, tag)| {
            tag.kind == crate::engine::falcon::layout::kind::WINDOW && tag.owner == 0
        });
    found.map(|(index, _)| pages.page_offset(index))
}

/// One fuzz case of the window-decoder target. The input is a redo payload:
/// [`window::decode`](crate::engine::falcon::window::decode) must refuse it or return entries
/// that lie inside it and encode back to a payload that decodes to the same entries. A payload
/// that decodes is then planted as the committed slot 0 of thread 0's window in a Falcon-design
/// base image (byte 0 of the input picks which; under ADR with a valid CRC) and the image is
/// recovered: replay of arbitrary entries must end in `Ok` or an error. Returns the recovery's
/// result, or `None` when the payload was refused or does not fit a slot.
pub fn window_decode_case(input: &[u8]) -> Option<Result<ImageSummary, String>> {
    use crate::engine::falcon::layout::slot;
    use crate::engine::falcon::window;
    let (&pick, payload) = input.split_first()?;
    let entries = window::decode(payload)?;
    let mut again = Vec::new();
    for e in &entries {
        let inside = payload.as_ptr_range();
        assert!(e.bytes.is_empty() || inside.contains(&e.bytes.as_ptr()));
        window::encode(
            &mut again,
            e.kind,
            e.table,
            e.tuple,
            e.key,
            e.field_offset,
            e.bytes,
        );
    }
    let decoded_again = window::decode(&again).expect("an encoding decodes");
    assert_eq!(decoded_again.len(), entries.len());
    for (a, b) in entries.iter().zip(&decoded_again) {
        assert_eq!(
            (a.kind, a.table, a.tuple, a.key, a.field_offset, a.bytes),
            (b.kind, b.table, b.tuple, b.key, b.field_offset, b.bytes)
        );
    }
    // Falcon-design variants only (Zen has no window).
    let falcon: Vec<usize> = (0..BASE_IMAGES)
        .filter(|&i| VARIANTS[i % VARIANTS.len()].0 != EngineKind::Zen)
        .collect();
    let base = base_image(falcon[usize::from(pick) % falcon.len()]);
    // A tid of thread 0 above every write_ts of the base image, so every entry is replayed.
    let tid = 1u64 << 55;
    let adr = base.domain == PersistenceDomain::Adr;
    let slot = WindowSlot {
        state: if adr {
            slot::COMMITTED_CRC
        } else {
            slot::COMMITTED
        },
        tid,
        len: payload.len() as u64,
        crc: if adr {
            window::slot_crc(tid, payload)
        } else {
            0
        },
        spilled: 0,
        payload,
    };
    let image = plant_window_slot(base, &slot)?;
    Some(open_image(&image, Some(base.engine)))
}

/// Seed inputs per fuzz target (`crash_image`, `pool_open`, `window_decode`), so that the fuzzers
/// start from inputs that reach deep: every base image unpatched, pool starts whose header passes
/// and whose page table is real, and redo payloads naming real tuple slots of each table.
pub fn seed_inputs() -> Vec<(&'static str, Vec<u8>)> {
    use crate::engine::falcon::layout::{kind, tuple};
    use crate::engine::falcon::window::{encode, EntryKind};
    let mut seeds = Vec::new();
    for i in 0..BASE_IMAGES {
        seeds.push(("crash_image", vec![i as u8]));
        // One patch of each op on the first hot line.
        for op in 0..8u8 {
            seeds.push(("crash_image", vec![i as u8, op, 0, 0, 8, 1, 0, 0, 0]));
        }
    }
    for i in [0usize, VARIANTS.len() - 1] {
        let base = base_image(i);
        seeds.push(("pool_open", [&[0u8][..], &base.bytes[..4096]].concat()));
        // Mode 1|8|4: 6 MiB pool, sealed header with a known layout; header page, superblock and
        // page table from the base image.
        let page = crate::alloc::PAGE_SIZE as usize;
        let framed = [
            &[1u8
                | 4
                | 8
                | if base.engine == EngineKind::Zen {
                    16
                } else {
                    0
                }][..],
            &base.bytes[..256],
            &base.bytes[4096..4096 + 256],
            &base.bytes[8192..8192 + 512],
            &base.bytes[page..page + 4096 + 1024],
        ]
        .concat();
        seeds.push(("pool_open", framed));
    }
    seeds.push(("pool_open", b"PMTXPOOL".to_vec()));
    for pick in 0..BASE_IMAGES as u8 {
        let base = base_image(usize::from(pick));
        if base.engine == EngineKind::Zen {
            continue;
        }
        let opts = PoolOptions::new(base.engine.layout(), base.domain).with_counting(false);
        let Ok(pool) = Pool::from_image(&base.bytes, &opts) else {
            continue;
        };
        let Ok(pages) = crate::alloc::PageManager::open(&pool) else {
            continue;
        };
        let mut payload = Vec::new();
        for (index, tag) in pages.allocated(&pool).unwrap_or_default() {
            if tag.kind != kind::HEAP {
                continue;
            }
            let page = pages.page_offset(index);
            let (row, table) = if tag.value == 0 { (24, 0) } else { (200, 1) };
            let slot = tuple::slot_size(row);
            encode(
                &mut payload,
                EntryKind::Update,
                table,
                page + slot,
                1,
                0,
                &[7; 8],
            );
            encode(
                &mut payload,
                EntryKind::Insert,
                table,
                page + 40 * slot,
                99,
                0,
                &vec![1; row],
            );
            encode(
                &mut payload,
                EntryKind::Delete,
                table,
                page + 2 * slot,
                2,
                0,
                &[],
            );
        }
        seeds.push(("window_decode", [&[pick][..], &payload].concat()));
    }
    seeds
}

/// Crash-image inputs that once found a bug (kept under `fuzz/regressions/crash_image/` too):
/// `(name, input)`.
pub fn regression_inputs() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    // A committed slot 0 of thread 0's window whose payload claims to be spilled and 2^40 bytes
    // long: recovery allocated the claimed length (fixed in falcon::recovery::read_spill).
    for (pick, base) in (0..VARIANTS.len()).map(|i| (i, base_image(i))) {
        if base.engine != EngineKind::Falcon {
            continue;
        }
        let Some(win) = window_page(base) else {
            continue;
        };
        let Some(line) = base.hot_lines.iter().position(|&l| l == win) else {
            continue;
        };
        let line = (line as u16).to_le_bytes();
        let state = if base.domain == PersistenceDomain::Adr {
            0xC0A2u32
        } else {
            0xC0A1
        };
        let mut input = vec![pick as u8];
        // op 2: a 32-bit word; op 3: the value repeated in both halves (0x100 → 2^40 + 0x100).
        for (op, word, value) in [(2u8, 0u8, state), (2, 4, 1), (3, 2, 0x100)] {
            input.extend_from_slice(&[op, line[0], line[1], word]);
            input.extend_from_slice(&value.to_le_bytes());
        }
        out.push(("spilled-slot-huge-length", input));
    }
    out
}

/// The heap pages of a Falcon-design base image: `(table, page offset)`.
pub fn heap_pages(base: &BaseImage) -> Vec<(u32, u64)> {
    use crate::engine::falcon::layout::kind;
    let opts = PoolOptions::new(base.engine.layout(), base.domain).with_counting(false);
    let Ok(pool) = Pool::from_image(&base.bytes, &opts) else {
        return Vec::new();
    };
    let Ok(pages) = crate::alloc::PageManager::open(&pool) else {
        return Vec::new();
    };
    pages
        .allocated(&pool)
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, tag)| tag.kind == kind::HEAP)
        .map(|(index, tag)| (tag.value as u32, pages.page_offset(index)))
        .collect()
}

/// Pool-open inputs that once found a bug (kept under `fuzz/regressions/pool_open/` too).
pub fn pool_open_regressions() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    let page = crate::alloc::PAGE_SIZE as usize;
    let base = base_image(0);
    // A catalog whose secondary index names column 7 of a two-column table, with a valid CRC:
    // the schema was never validated after loading, and the first index use panicked out of
    // bounds (fixed in catalog::CatalogStore::read_slot).
    let catalog = br#"{"tables":[{"name":"accounts","columns":[{"name":"balance","ty":"u64"},{"name":"owner","ty":{"bytes":16}}],"primary_index":"ordered","secondary":[{"name":"by_owner","columns":[7]}]}]}"#;
    let mut slot = vec![0u8; 24];
    slot[..8].copy_from_slice(&5u64.to_le_bytes());
    slot[8..16].copy_from_slice(&(catalog.len() as u64).to_le_bytes());
    slot.extend_from_slice(catalog);
    let framed = [
        &[1u8 | 4 | 8][..],
        &base.bytes[..256],
        &base.bytes[4096..4096 + 256],
        &base.bytes[8192..8192 + 512],
        &base.bytes[page..page + 4096],
        &slot,
    ]
    .concat();
    out.push(("catalog-secondary-unknown-column", framed));
    out
}
