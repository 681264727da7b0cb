//! The Rust for the backend protocol's messages is generated from
//! `proto/` and checked in under `src/backend/gen/`, so that building the
//! crate needs neither a protobuf compiler nor code generation. This test
//! generates it afresh and fails if the checked-in files differ.
//!
//! To regenerate after editing a .proto file:
//!
//! ```text
//! ACTIONFS_REGENERATE=1 cargo test -p actionfs-protocol --test backend_codegen
//! ```

use std::fs;
use std::path::{Path, PathBuf};

/// The files prost-build writes, one per protobuf package.
const GENERATED: [&str; 2] = ["bazel.sandbox.rs", "build.bazel.remote.execution.v2.rs"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `proto/` with protox and writes prost-build's Rust into `out`.
fn generate(out: &Path) {
    let proto = crate_dir().join("proto");
    let descriptors = protox::compile(["bazel/sandbox/sandbox.proto"], [&proto])
        .unwrap_or_else(|err| panic!("compiling {}: {err:?}", proto.display()));
    prost_build::Config::new()
        .out_dir(out)
        .compile_fds(descriptors)
        .unwrap_or_else(|err| panic!("generating Rust into {}: {err}", out.display()));
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("listing {}: {err}", dir.display()))
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn checked_in_code_matches_the_protos() {
    let fresh = tempfile::tempdir().unwrap();
    generate(fresh.path());
    assert_eq!(
        file_names(fresh.path()),
        GENERATED,
        "prost-build wrote other files than expected; update GENERATED here and the \
         modules in src/backend/mod.rs"
    );

    let checked_in = crate_dir().join("src/backend/gen");
    let regenerate = std::env::var_os("ACTIONFS_REGENERATE").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for name in GENERATED {
        let new = fs::read_to_string(fresh.path().join(name)).unwrap();
        let path = checked_in.join(name);
        let old = fs::read_to_string(&path).unwrap_or_default();
        if new == old {
            continue;
        }
        if regenerate {
            fs::write(&path, &new)
                .unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
            eprintln!("rewrote {}", path.display());
        } else {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "the generated code is stale or was edited by hand: {}\n\
         regenerate it from protocol/proto/ with\n    \
         ACTIONFS_REGENERATE=1 cargo test -p actionfs-protocol --test backend_codegen\n\
         and commit the result",
        stale.join(", ")
    );
}
