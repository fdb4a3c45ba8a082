//! Arbitrary control commands and doorbells to a device with objects of
//! every kind: every command is answered, nothing panics. The input is a
//! sequence of records `[kind, len, bytes...]`; kind 0xDB is a doorbell.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vrnic::fuzzing::fuzz_control(data);
});
