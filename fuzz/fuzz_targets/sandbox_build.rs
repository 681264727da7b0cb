//! Request validation and sandbox building in the core, on arbitrary
//! request streams whose prefix 1 points at a small real tree.
#![no_main]

use std::sync::OnceLock;

use actionfs_testkit::fuzz::{apply_stream, Fixture};

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("actionfs-fuzz-{}", std::process::id()));
        Fixture::create(&root).expect("fixture tree")
    })
}

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    apply_stream(fixture(), bytes);
});
