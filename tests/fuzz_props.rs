//! The fuzz targets' properties (fuzz/, README "Fuzzing"), as a short proptest for CI: pool open
//! on arbitrary bytes, recovery of mutated crash images of every durable engine, and the window
//! decoder never panic, hang or touch their input; they end in `Ok` or a clear error.

use pmtx::crashtest::fuzz::{self, BASE_IMAGES};

#[test]
fn every_base_image_opens_clean() {
    for i in 0..BASE_IMAGES {
        let base = fuzz::base_image(i);
        let summary = fuzz::open_image(&base.bytes, Some(base.engine))
            .unwrap_or_else(|e| panic!("base image {i} ({} {}): {e}", base.engine, base.domain));
        assert!(summary.rows_read > 0, "base image {i} has rows");
    }
}

/// Writes the fuzzers' seed corpus (`scripts/fuzz.sh` runs this when a corpus is empty).
#[test]
#[ignore = "writes fuzz/corpus; run by scripts/fuzz.sh"]
fn write_fuzz_seeds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (n, (target, bytes)) in fuzz::seed_inputs().into_iter().enumerate() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{n:03}")), bytes).unwrap();
    }
    let regressions = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    for (n, (name, bytes)) in fuzz::regression_inputs().into_iter().enumerate() {
        let dir = regressions.join("crash_image");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}-{n}")), bytes).unwrap();
    }
    for (name, bytes) in fuzz::pool_open_regressions() {
        let dir = regressions.join("pool_open");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn seeds_pass() {
    for (target, bytes) in fuzz::seed_inputs() {
        match target {
            "crash_image" => drop(fuzz::mutated_image_case(&bytes)),
            "pool_open" => drop(fuzz::pool_open_case(&bytes)),
            _ => {
                let r = fuzz::window_decode_case(&bytes).expect("a seed payload decodes and fits");
                r.unwrap_or_else(|e| panic!("a seed payload replays: {e}"));
            }
        }
    }
}

use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Patches as the crash-image target reads them: op, hot line (u16), byte, value (u32).
fn patches() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((any::<u8>(), any::<u16>(), any::<u8>(), any::<u32>()), 1..6).prop_map(
        |ps| {
            ps.into_iter()
                .flat_map(|(op, line, at, v)| {
                    let mut p = vec![op];
                    p.extend_from_slice(&line.to_le_bytes());
                    p.push(at);
                    p.extend_from_slice(&v.to_le_bytes());
                    p
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(config(40))]

    /// Recovery of a mutated crash image of any durable engine ends in Ok or an error.
    #[test]
    fn mutated_crash_images_recover_or_are_refused(pick in 0..BASE_IMAGES as u8, p in patches()) {
        let input = [&[pick][..], &p].concat();
        let _ = fuzz::mutated_image_case(&input);
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Pool open on arbitrary bytes, raw or with a header made to pass, ends in Ok or an error.
    #[test]
    fn arbitrary_pool_bytes_open_or_are_refused(
        mode in any::<u8>(),
        bytes in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let input = [&[mode][..], &bytes].concat();
        let _ = fuzz::pool_open_case(&input);
    }

    /// The window decoder refuses or round-trips arbitrary bytes; what decodes replays or is
    /// refused when planted in a Falcon window.
    #[test]
    fn arbitrary_redo_payloads_decode_or_are_refused(
        pick in any::<u8>(),
        bytes in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let input = [&[pick][..], &bytes].concat();
        let _ = fuzz::window_decode_case(&input);
    }
}

/// Every input the fuzzers ever found a bug with (fuzz/regressions/TARGET/) passes.
#[test]
fn fuzz_regressions_pass() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    for target in ["crash_image", "pool_open", "window_decode"] {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for file in dir {
            let path = file.unwrap().path();
            let input = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| match target {
                "crash_image" => drop(fuzz::mutated_image_case(&input)),
                "pool_open" => drop(fuzz::pool_open_case(&input)),
                _ => drop(fuzz::window_decode_case(&input)),
            });
            assert!(outcome.is_ok(), "{} panics", path.display());
        }
    }
}

/// A Falcon-design base image: falcon under eADR (no slot CRC) or ADR, crashed at 70 %.
fn falcon_base(domain: pmtx::pmem::PersistenceDomain) -> &'static fuzz::BaseImage {
    (0..BASE_IMAGES)
        .map(fuzz::base_image)
        .find(|b| b.engine == pmtx::engine::EngineKind::Falcon && b.domain == domain)
        .unwrap()
}

/// A committed window slot whose spilled payload claims 2^40 bytes (a damaged length word): recovery
/// allocated the claimed length before reading the spill chain, which aborts the process.
#[test]
fn a_spilled_slot_with_a_huge_length_is_refused_without_allocating_it() {
    use pmtx::engine::falcon::layout::slot;
    for domain in [
        pmtx::pmem::PersistenceDomain::Eadr,
        pmtx::pmem::PersistenceDomain::Adr,
    ] {
        let base = falcon_base(domain);
        let image = fuzz::plant_window_slot(
            base,
            &fuzz::WindowSlot {
                state: if domain == pmtx::pmem::PersistenceDomain::Adr {
                    slot::COMMITTED_CRC
                } else {
                    slot::COMMITTED
                },
                tid: 1 << 55,
                len: 1 << 40,
                crc: 0,
                spilled: 1,
                payload: &[],
            },
        )
        .unwrap();
        let _ = fuzz::open_image(&image, Some(base.engine));
    }
    // The same damage as crash-image fuzz inputs (kept in fuzz/regressions/crash_image/).
    let inputs = fuzz::regression_inputs();
    assert!(!inputs.is_empty());
    for (_, input) in inputs {
        let _ = fuzz::mutated_image_case(&input);
    }
}

/// A redo entry aimed at a real tuple slot (or just off one): kind, heap page, slot, misalignment,
/// key, field offset, length.
fn entry() -> impl Strategy<Value = (u32, usize, u64, u64, u64, u32, usize)> {
    (
        1u32..=3,
        0usize..4,
        0u64..64,
        prop_oneof![Just(0u64), 0u64..300],
        0u64..40,
        0u32..260,
        0usize..260,
    )
}

proptest! {
    #![proptest_config(config(24))]

    /// Payloads of well-formed entries naming real (or nearly real) tuple slots: decoded, planted
    /// as a committed slot and replayed by recovery, they end in Ok or an error.
    #[test]
    fn redo_entries_on_real_tuples_replay_or_are_refused(
        pick in any::<u8>(),
        entries in prop::collection::vec(entry(), 1..4),
    ) {
        use pmtx::engine::falcon::window::{encode, EntryKind};
        let falcon: Vec<usize> = (0..BASE_IMAGES)
            .filter(|&i| fuzz::base_image(i).engine != pmtx::engine::EngineKind::Zen)
            .collect();
        let index = falcon[usize::from(pick) % falcon.len()];
        let pages = fuzz::heap_pages(fuzz::base_image(index));
        prop_assume!(!pages.is_empty());
        let mut payload = Vec::new();
        for (kind, page, slot, off, key, field, len) in entries {
            let kind = [EntryKind::Update, EntryKind::Insert, EntryKind::Delete][kind as usize - 1];
            let (table, page) = pages[page % pages.len()];
            let slot_bytes = if table == 0 { 64 } else { 240 };
            encode(&mut payload, kind, table, page + slot * slot_bytes + off, key, field, &vec![9; len]);
        }
        // The input picks the base image among the Falcon-design ones the same way.
        let pick = falcon.iter().position(|&i| i == index).unwrap() as u8;
        let _ = fuzz::window_decode_case(&[&[pick][..], &payload].concat());
    }
}

/// `pmtx check` on mutated crash images written to files: exit 0 or 1 (never a panic), and the
/// file is byte-for-byte what it was.
#[test]
fn check_on_mutated_image_files_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (i, patch) in [
        [2u8, 3, 0, 0, 0xff, 0xff, 0, 0],
        [6, 40, 0, 0, 0, 0, 0, 0],
        [1, 200, 1, 3, 0x10, 0, 0, 0],
    ]
    .iter()
    .enumerate()
    {
        let base = fuzz::base_image(i * 4);
        let mut image = base.bytes.clone();
        fuzz::apply_patches(&mut image, &base.hot_lines, patch);
        let path = dir.path().join(format!("image-{i}.pool"));
        std::fs::write(&path, &image).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pmtx"))
            .arg("check")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "image {i}: {:?} {stderr}",
            out.status
        );
        assert!(
            std::fs::read(&path).unwrap() == image,
            "image {i}: check wrote to the file"
        );
    }
}

/// The pool-open target's framed seeds reach the engine's recovery (not only the header).
#[test]
fn framed_pool_open_seeds_reach_recovery() {
    let framed: Vec<_> = fuzz::seed_inputs()
        .into_iter()
        .filter(|(t, b)| *t == "pool_open" && b.len() > 3000 && b[0] & 1 == 1)
        .collect();
    assert!(!framed.is_empty());
    for (_, input) in framed {
        let summary = fuzz::pool_open_case(&input);
        assert!(summary.is_ok(), "{summary:?}");
    }
}

/// A catalog with a valid CRC whose secondary index names a column the table does not have:
/// loading it did not validate the schemas, and the first use of the index panicked (out of
/// bounds in `Schema::column_offset`). Now a clear "catalog is corrupt" error.
#[test]
fn a_catalog_naming_an_unknown_column_is_refused_not_panicked_on() {
    for (name, input) in fuzz::pool_open_regressions() {
        let result = std::panic::catch_unwind(|| fuzz::pool_open_case(&input));
        let err = match result {
            Ok(Err(e)) => e,
            other => panic!("{name}: expected an error, got {other:?}"),
        };
        assert!(
            err.contains("catalog") && err.contains("unknown column"),
            "{name}: {err}"
        );
    }
}
