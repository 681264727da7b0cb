//! What the fuzz targets (fuzz/) run, kept here so that a regression test
//! replays the saved corpus and crash reproducers through the same code.
//! Every function must return normally for any input: a panic is a bug.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use actionfs_protocol::codec::encode_request;
use actionfs_protocol::{
    decode_in_place, decode_value, validate_sandbox_id, Decoded, InPlace, MappingSink, PrefixTable,
    Request, RequestReader,
};

use actionfs::sandbox::tree::{FsConfig, SandboxFs, ROOT_INO};

/// Decodes a byte stream; checks that every valid request survives an
/// encode/decode round trip and that its prefixes and mappings resolve
/// without a panic, and that the in-place decoder answers every value as
/// the reference decoder does.
pub fn decode_stream(bytes: &[u8]) {
    let (mut reference, mut in_place) = (PrefixTable::new(), PrefixTable::new());
    let mut reader = RequestReader::new(bytes);
    while let Some(item) = reader.next_with(|value| {
        let expected = reference_answer(value, &mut reference);
        assert_eq!(
            in_place_answer(value, &mut in_place),
            expected,
            "{}",
            String::from_utf8_lossy(value)
        );
        Some(())
    }) {
        if item.is_err() {
            break;
        }
    }
    let mut prefixes = PrefixTable::new();
    for item in RequestReader::new(bytes) {
        let Ok(Decoded::Request(request)) = item else {
            continue;
        };
        let again: Vec<_> = RequestReader::new(encode_request(&request).as_bytes()).collect();
        assert!(
            matches!(again.as_slice(), [Ok(Decoded::Request(r))] if *r == request),
            "round trip changed {request:?} into {again:?}"
        );
        let _ = validate_sandbox_id(request.id());
        if let Request::Create(create) = &request {
            // Each mapping on its own (not resolve_create, which stops at the
            // first error), so every one of them is exercised.
            if prefixes.register(&create.prefixes).is_ok() {
                for mapping in &create.mappings {
                    let _ = prefixes.resolve(mapping);
                }
            }
        }
    }
}

/// Mappings as a create's answer lists them.
#[derive(Default)]
struct Listed(Vec<String>);

impl MappingSink for Listed {
    fn mapping(&mut self, index: usize, path: &str, underlying: &str, writable: bool) {
        self.0
            .push(format!("#{index} {path} -> {underlying} {writable}"));
    }
}

/// What the reference decoder and resolution make of one value.
fn reference_answer(value: &[u8], prefixes: &mut PrefixTable) -> String {
    match decode_value(value) {
        Err(fatal) => format!("fatal {}", fatal.message),
        Ok(Decoded::Invalid { id, message }) => format!("invalid {id:?}: {message}"),
        Ok(Decoded::Request(Request::Destroy(id))) => format!("destroy {id}"),
        Ok(Decoded::Request(Request::Create(create))) => match prefixes.resolve_create(&create) {
            Ok(mappings) => {
                let mut listed = Listed::default();
                for (index, m) in mappings.iter().enumerate() {
                    let underlying = m.underlying.to_string_lossy();
                    listed.mapping(index, &m.path, &underlying, m.writable);
                }
                format!("create {} {:?}", create.id, listed.0)
            }
            Err(err) => format!("refused {}: sandbox {:?}: {err}", create.id, create.id),
        },
    }
}

/// The same through the in-place decoder (the daemon's path).
fn in_place_answer(value: &[u8], prefixes: &mut PrefixTable) -> String {
    match decode_in_place(value, prefixes, |_| Listed::default()) {
        InPlace::Create { id, sink } => format!("create {id} {:?}", sink.0),
        InPlace::Destroy(id) => format!("destroy {id}"),
        InPlace::Refused { id, message } => format!("refused {id}: {message}"),
        InPlace::Fallback => reference_answer(value, prefixes),
    }
}

/// A small real tree that fuzzed mappings point into: a file, a directory
/// with a file and a subdirectory, and a symlink.
pub struct Fixture {
    pub root: PathBuf,
}

impl Fixture {
    pub fn create(root: &Path) -> std::io::Result<Fixture> {
        std::fs::create_dir_all(root.join("d/sub"))?;
        std::fs::write(root.join("f"), "f")?;
        std::fs::write(root.join("d/g"), "g")?;
        if !root.join("l").exists() {
            std::os::unix::fs::symlink("f", root.join("l"))?;
        }
        Ok(Fixture {
            root: root.to_owned(),
        })
    }
}

/// Applies a stream of requests to a fresh core whose prefix 1 is the
/// fixture, then looks around every sandbox that was made.
pub fn apply_stream(fixture: &Fixture, bytes: &[u8]) {
    let config = FsConfig {
        mount_point: fixture.root.join("mnt"),
        xattrs: false,
        track_access: false,
    };
    let fs = SandboxFs::new(config, &[]).expect("an empty view");
    let mut prefixes = PrefixTable::new();
    let base = [(1, fixture.root.to_string_lossy().into_owned())].into();
    prefixes.register(&base).expect("prefix 1");
    for item in RequestReader::new(bytes).take(64) {
        let Ok(Decoded::Request(request)) = item else {
            continue;
        };
        match request {
            Request::Destroy(id) => {
                let _ = fs.destroy_sandbox(&id);
            }
            Request::Create(create) => {
                let Ok(mappings) = prefixes.resolve_create(&create) else {
                    continue;
                };
                if fs.create_sandbox(&create.id, &mappings).is_ok() {
                    explore(&fs, ROOT_INO, OsStr::new(&create.id), 4);
                }
            }
        }
    }
}

/// Looks up `name` in `dir` and, for directories, everything listed below
/// it, `depth` levels down.
fn explore(fs: &SandboxFs, dir: u64, name: &OsStr, depth: usize) {
    let Ok(attr) = fs.lookup(dir, name) else {
        return;
    };
    let _ = fs.getattr(attr.ino, None);
    if depth == 0 {
        return;
    }
    if let Ok(names) = fs.list(attr.ino) {
        for child in names.iter().take(16) {
            explore(fs, attr.ino, child, depth - 1);
        }
    }
    fs.forget(attr.ino, 1);
}
