//! Replays the request streams recorded between a real Bazel 4.2.3 and
//! sandboxfs 0.2.0 (../shared/traces/bazel-4.2.3) through the real daemon:
//! every create and destroy must succeed, as it did for the reference, and
//! mapped files must read back as the files they map.

use std::fs;
use std::time::Instant;

use actionfs_protocol::{PrefixTable, Request, Response};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::traces::{self, load, populate, traces_dir};
use actionfs_testkit::*;

fn recorded_answers(stem: &str) -> Vec<Response> {
    let raw = fs::read_to_string(traces_dir().join(format!("{stem}.responses.json"))).unwrap();
    raw.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn replay(stem: &str) {
    let fx = Fixture::new();
    let requests = load(stem, fx.dir.path());
    let files = populate(&requests);
    let recorded = recorded_answers(stem);
    assert_eq!(
        recorded.len(),
        requests.len(),
        "{stem}: one answer per request"
    );
    assert!(
        recorded.iter().all(|r| r.error.is_none()),
        "the reference answered all ok"
    );

    // The client sends the probe itself; the recorded stream starts with it.
    assert!(matches!(&requests[0], Request::Create(c) if c.id == "empty" && c.mappings.is_empty()));
    let d = fx.start(&[]);
    let mut prefixes = PrefixTable::new();
    let (mut checked, mut mappings) = (0, 0);
    let started = Instant::now();
    for request in &requests[1..] {
        d.client()
            .call(request)
            .unwrap_or_else(|err| panic!("{stem}: {:?} failed: {err}", request.id()));
        let Request::Create(create) = request else {
            continue;
        };
        prefixes.register(&create.prefixes).unwrap();
        mappings += create.mappings.len();
        // Read back a spread of the mapped files through the mount.
        let step = (create.mappings.len() / 25).max(1);
        for mapping in create.mappings.iter().step_by(step) {
            let resolved = prefixes.resolve(mapping).unwrap();
            if resolved.writable {
                continue;
            }
            let in_view = d
                .mnt
                .join(&create.id)
                .join(resolved.path.trim_start_matches('/'));
            let content = fs::read_to_string(&in_view)
                .unwrap_or_else(|err| panic!("{stem}: reading {in_view:?}: {err}"));
            assert_eq!(
                content,
                resolved.underlying.to_str().unwrap(),
                "{in_view:?}"
            );
            checked += 1;
        }
    }
    eprintln!(
        "{stem}: {} requests, {mappings} mappings over {files} files, {checked} files read back, {:?}",
        requests.len(),
        started.elapsed()
    );
    assert!(d.client().unexpected_responses().is_empty());
    // Bazel never destroys the probe; everything else is gone.
    assert_eq!(
        names(&d.mnt),
        ["empty"],
        "{stem}: sandboxes left after the replay"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn replay_mixed_linuxsandbox_mapsymlinks() {
    if !require(&[Need::Mount]) || !traces::available() {
        return;
    }
    replay("mixed-linuxsandbox-mapsymlinks");
}

#[test]
fn replay_mixed_processwrapper() {
    if !require(&[Need::Mount]) || !traces::available() {
        return;
    }
    replay("mixed-processwrapper");
}

#[test]
fn replay_stress_linuxsandbox() {
    if !require(&[Need::Mount]) || !traces::available() {
        return;
    }
    replay("stress-linuxsandbox");
}

#[test]
fn replay_second_server_build() {
    if !require(&[Need::Mount]) || !traces::available() {
        return;
    }
    replay("second-server-build-2");
}

#[test]
fn replay_local_strategy_probe_only() {
    if !require(&[Need::Mount]) || !traces::available() {
        return;
    }
    replay("local-strategy-with-sandboxfs-flag");
}
