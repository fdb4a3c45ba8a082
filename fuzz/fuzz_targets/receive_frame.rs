//! Arbitrary frames to a device with live RC and UD QPs: no panic, bounded
//! output. The input is split into frames at 0xFFFF markers so one run can
//! drive a sequence (e.g. a WRITE FIRST then its LAST).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let (mut dev, mem, _qpns) = common::device();
    let mut now = 0;
    for frame in data.split(|&b| b == 0xff).take(64) {
        now += 1_000_000;
        dev.receive(&mem, frame, now);
        dev.poll(&mem, now);
        let out = std::iter::from_fn(|| dev.pop_tx()).take(100_000).count();
        assert!(out < 100_000, "unbounded output");
        while dev.pop_event().is_some() {}
    }
});
