//! Recovery of mutated crash images of every durable engine: byte 0 picks one of the base images
//! (engine × domain × crash point, `pmtx::crashtest::fuzz`), the rest are byte/word patches.
//! Opening, recovery, a read of every row and the structure check must end in `Ok` or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let _ = pmtx::crashtest::fuzz::mutated_image_case(input);
});
