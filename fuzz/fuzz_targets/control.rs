//! Arbitrary control commands (and doorbells) to a device with objects:
//! every command gets an answer, nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vrnic::abi::{self, Pod};

mod common;

fuzz_target!(|data: &[u8]| {
    let (mut dev, mem, _qpns) = common::device();
    let mut resp = [0u8; 256];
    for chunk in data.chunks(64).take(64) {
        if chunk.first() == Some(&0xdb) {
            if let Some(db) = abi::Doorbell::read_from(&chunk[1..]) {
                dev.doorbell(&mem, &db, 0);
            }
            continue;
        }
        let n = dev.control(&mem, chunk, &mut resp);
        assert!(n >= 8);
        while dev.pop_tx().is_some() {}
    }
    let _ = abi::Handle::default().as_bytes();
});
