//! Arbitrary bytes to the frame parser: no panic, every error a value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = vrnic::wire::parse_frame(data);
});
