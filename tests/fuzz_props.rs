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
