//! Arbitrary frames to the receive path of a device with RC, UC and UD QPs,
//! an SRQ and MRs (`vrnic::fuzzing::Target`), its own RC requests in
//! flight: no panic, bounded output per frame. The input is a sequence of
//! records `[flags, len_lo, len_hi, bytes...]` (`vrnic::fuzzing::REC_*`:
//! fix the checksums so the frame reaches the transport, revive fallen
//! QPs, advance the clock).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vrnic::fuzzing::fuzz_receive(data);
});
