//! The request codec and prefix resolution on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    actionfs_testkit::fuzz::decode_stream(bytes);
});
