//! Replays the fuzz corpora (fuzz/corpus) and any crash reproducers
//! (fuzz/artifacts) through the same harness the fuzz targets run, so that
//! what fuzzing found stays fixed without libFuzzer or nightly.

use std::path::Path;

use actionfs_testkit::fuzz::{apply_stream, decode_stream, Fixture};

/// Contents of every saved input; entries that vanish while being read (a
/// fuzzer reducing the corpus meanwhile) are skipped.
fn inputs(target: &str) -> Vec<Vec<u8>> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for dir in [
        fuzz.join("corpus").join(target),
        fuzz.join("artifacts").join(target),
    ] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()));
        }
    }
    files.sort();
    files.iter().filter_map(|f| std::fs::read(f).ok()).collect()
}

#[test]
fn the_request_stream_corpus_still_passes() {
    let files = inputs("request_stream");
    assert!(
        files.len() >= 90,
        "the corpus is missing: {} files",
        files.len()
    );
    for bytes in files {
        decode_stream(&bytes);
    }
}

#[test]
fn the_sandbox_build_corpus_still_passes() {
    let files = inputs("sandbox_build");
    assert!(!files.is_empty(), "the corpus is missing");
    let dir = tempfile::tempdir().unwrap();
    let fixture = Fixture::create(&dir.path().join("fixture")).unwrap();
    for bytes in files {
        apply_stream(&fixture, &bytes);
    }
}
