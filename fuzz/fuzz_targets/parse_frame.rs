//! Arbitrary bytes to the frame parser: no panic, every error a value, and
//! a RoCE packet it accepts survives emit + parse unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vrnic::fuzzing::fuzz_parse(data);
});
