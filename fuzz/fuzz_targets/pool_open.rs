//! Pool open on arbitrary bytes: `Pool::from_image`, then the whole open path.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let _ = pmtx::crashtest::fuzz::pool_open_case(input);
});
