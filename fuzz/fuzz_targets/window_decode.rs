//! Falcon's window/redo decoder on arbitrary payloads.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    pmtx::crashtest::fuzz::window_decode_case(input);
});
