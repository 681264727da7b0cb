//! The request codec and prefix resolution on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    actionfs::fuzz_harness::decode_stream(bytes);
});
