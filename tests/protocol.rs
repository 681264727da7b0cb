//! The request/response protocol as the real daemon speaks it: answers,
//! errors, and the promise that a failed request leaves nothing behind.

use std::fs;
use std::path::Path;
use std::time::Duration;

use actionfs_protocol::{CreateSandbox, Mapping, Response};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

/// Asserts that a failed create of `id` left nothing: the id is not in the
/// mount, and creating it properly afterwards works.
fn assert_no_trace(d: &Daemon, id: &str, good: &Path) {
    assert!(
        !names(&d.mnt).contains(&id.to_string()),
        "{id:?} is visible after failing"
    );
    d.create(sandbox(id, vec![ro("/ok", good)]));
    assert_eq!(
        fs::read_to_string(d.path(&format!("{id}/ok"))).unwrap(),
        "good"
    );
    d.destroy(id);
}

#[test]
fn every_bad_create_is_answered_with_a_precise_error_and_leaves_nothing() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    let missing = fx.path("src/missing");
    let cases: Vec<(&str, CreateSandbox, &str)> = vec![
        (
            "a",
            sandbox("a", vec![ro("relative/path", &good)]),
            "relative/path",
        ),
        ("b", sandbox("b", vec![ro("/x/../y", &good)]), "/x/../y"),
        (
            "c",
            // A missing input is no error (it is absent from the sandbox),
            // but a mapped directory with nested mappings is checked.
            sandbox(
                "c",
                vec![
                    ro("/ok", &good),
                    ro("/gone", &missing),
                    ro("/gone/x", &good),
                ],
            ),
            "missing",
        ),
        (
            "d",
            sandbox("d", vec![ro("/same", &good), ro("/same", &good)]),
            "mapped twice",
        ),
        (
            "e",
            sandbox("e", vec![ro("/f", &good), ro("/f/below", &good)]),
            "non-directory",
        ),
        (
            "f",
            sandbox("f", vec![ro("/x", &good)]).with_mapping(Mapping {
                path_prefix: 77,
                path: "p".into(),
                underlying_path: "/u".into(),
                ..Mapping::default()
            }),
            "unknown prefix 77",
        ),
        (
            "g",
            sandbox("g", vec![]).with_prefix(5, "not/absolute"),
            "prefix 5",
        ),
        (
            "h",
            sandbox("h", vec![ro("/inside", &d.mnt.join("empty"))]),
            "inside the mount point",
        ),
    ];
    for (id, create, expected) in cases {
        let message = d.create_err(create);
        assert!(
            message.contains(&format!("{id:?}")),
            "error must name sandbox {id}: {message}"
        );
        assert!(
            message.contains(expected),
            "error for {id} must mention {expected:?}: {message}"
        );
        assert_no_trace(&d, id, &good);
    }
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn bad_ids_duplicates_and_unknown_destroys_are_errors() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    for bad in ["", ".", "..", "a/b"] {
        let message = d.create_err(sandbox(bad, vec![ro("/x", &good)]));
        assert!(message.contains("sandbox id"), "{bad:?}: {message}");
    }
    assert_eq!(names(&d.mnt), ["empty"]);

    d.create(sandbox("dup", vec![ro("/first", &good)]));
    let message = d.create_err(sandbox("dup", vec![ro("/second", &good)]));
    assert!(message.contains("already exists"), "{message}");
    assert_eq!(
        names(&d.path("dup")),
        ["first"],
        "the original must be untouched"
    );

    let err = d.client().destroy("never-created").unwrap_err().to_string();
    assert!(
        err.contains("never-created") && err.contains("does not exist"),
        "{err}"
    );
    d.destroy("dup");
    assert!(
        d.client().destroy("dup").is_err(),
        "a second destroy must fail"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn prefixes_persist_across_requests_even_after_a_failed_create() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    let src = fx.path("src");
    // Prefixes defined after the mappings that use them, as Bazel writes.
    let failing = CreateSandbox {
        id: "1".into(),
        mappings: vec![
            Mapping {
                path_prefix: 1,
                path: "ws/good".into(),
                underlying_path_prefix: 2,
                underlying_path: "good".into(),
                ..Mapping::default()
            },
            // Fails: nothing can be mapped below a file.
            Mapping {
                path_prefix: 1,
                path: "ws/good/bad".into(),
                underlying_path_prefix: 2,
                underlying_path: "good".into(),
                ..Mapping::default()
            },
        ],
        prefixes: [(1, "/".to_string()), (2, src.to_str().unwrap().to_string())].into(),
    };
    let message = d.create_err(failing);
    assert!(message.contains("non-directory"), "{message}");
    // Request 2 relies on prefixes 1 and 2 from the failed request.
    d.create(CreateSandbox {
        id: "2".into(),
        mappings: vec![Mapping {
            path_prefix: 1,
            path: "ws/good".into(),
            underlying_path_prefix: 2,
            underlying_path: "good".into(),
            ..Mapping::default()
        }],
        prefixes: Default::default(),
    });
    assert_eq!(fs::read_to_string(d.path("2/ws/good")).unwrap(), "good");
    // Re-registering a prefix to another path is refused...
    let message = d.create_err(sandbox("3", vec![]).with_prefix(2, "/elsewhere"));
    assert!(message.contains("prefix 2"), "{message}");
    // ...and re-registering it to the same path is fine.
    d.create(sandbox("4", vec![]).with_prefix(2, src.to_str().unwrap()));
    assert_eq!(d.terminate(), BY_SIGTERM);
    let _ = good;
}

#[test]
fn malformed_values_with_an_id_are_answered_and_reading_goes_on() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    let answer = d
        .client()
        .call_raw("typed", br#"{"C":{"i":"typed","m":"not a list"}}"#)
        .unwrap();
    let message = answer.error.expect("an error");
    assert!(message.contains("invalid type"), "{message}");
    let answer = d
        .client()
        .call_raw("extra", br#"{"C":{"i":"extra","m":[],"zzz":1}}"#)
        .unwrap();
    assert!(answer.error.unwrap().contains("unknown field"));
    // Still reading.
    d.create(sandbox("after", vec![ro("/g", &good)]));
    assert_eq!(fs::read_to_string(d.path("after/g")).unwrap(), "good");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_syntax_error_is_fatal_for_requests_but_the_mount_keeps_serving() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    d.create(sandbox("kept", vec![ro("/g", &good)]));
    d.client().write_raw(br#"{"C":{"i":"x",]]"#).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || !d
            .client()
            .unexpected_responses()
            .is_empty()),
        "no fatal answer"
    );
    let fatal = d.client().unexpected_responses();
    assert_eq!(fatal.len(), 1, "{fatal:?}");
    assert_eq!(fatal[0].id, None);
    assert!(
        fatal[0].error.as_deref().unwrap().contains("malformed"),
        "{fatal:?}"
    );
    // Requests are no longer read, but files are still served.
    d.client().write_raw(br#"{"D":"kept"}"#).unwrap();
    assert_eq!(fs::read_to_string(d.path("kept/g")).unwrap(), "good");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn concurrent_requests_for_different_sandboxes_all_succeed() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&["--reconfig_threads=4"]);
    std::thread::scope(|scope| {
        for t in 0..8 {
            let d = &d;
            let good = &good;
            scope.spawn(move || {
                for n in 0..25 {
                    let id = format!("t{t}-{n}");
                    d.create(sandbox(&id, vec![ro("/ws/g", good)]));
                    assert_eq!(
                        fs::read_to_string(d.path(&format!("{id}/ws/g"))).unwrap(),
                        "good"
                    );
                    if n % 2 == 0 {
                        d.destroy(&id);
                    }
                }
            });
        }
    });
    // 8 threads x 13 kept sandboxes, plus the probe.
    assert_eq!(names(&d.mnt).len(), 8 * 12 + 1);
    assert!(d.client().unexpected_responses().is_empty());
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn wire_format_with_input_and_output_files() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    // Bazel's framing: objects back to back with no separator.
    let requests = format!(
        concat!(
            r#"{{"C":{{"i":"empty","m":[]}}}}"#,
            r#"{{"C":{{"i":"1","m":[{{"x":1,"p":"g","y":0,"u":"{}"}}],"q":{{"1":"/ws"}}}}}}"#,
            r#"{{"D":"1"}}{{"D":"1"}}"#,
            r#"{{"CreateSandbox":{{"id":"long","mappings":[],"prefixes":{{}}}}}}"#,
        ),
        good.display()
    );
    fs::write(fx.path("requests.json"), requests).unwrap();
    let input = format!("--input={}", fx.path("requests.json").display());
    let output = format!("--output={}", fx.path("responses.json").display());
    let mut child = ChildGuard(fx.command(&[&input, &output]).spawn().unwrap(), fx.mnt());
    let read_lines = || fs::read_to_string(fx.path("responses.json")).unwrap_or_default();
    assert!(
        wait_for(Duration::from_secs(10), || read_lines().lines().count()
            == 5),
        "{}",
        read_lines()
    );
    let text = read_lines();
    let responses: Vec<Response> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // One line per answer, exactly the two keys Bazel accepts.
    for line in text.lines() {
        assert!(
            line.starts_with(r#"{"id":"#) && line.contains(r#","error":"#),
            "{line}"
        );
    }
    // Answers for different ids come in any order; for one id, in order.
    let for_id = |id: &str| -> Vec<Option<String>> {
        responses
            .iter()
            .filter(|r| r.id.as_deref() == Some(id))
            .map(|r| r.error.clone())
            .collect()
    };
    assert_eq!(for_id("empty"), [None]);
    assert_eq!(for_id("long"), [None]);
    let one = for_id("1");
    assert_eq!(one.len(), 3);
    assert_eq!(&one[..2], [None, None]);
    assert!(
        one[2].as_deref().unwrap().contains("does not exist"),
        "{one:?}"
    );
    // Input ended; the mount still serves.
    assert_eq!(names(&fx.mnt()), ["empty", "long"]);
    // SAFETY: kill(2) with our own child's pid and a plain signal.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    assert_eq!(shell_status(child.0.wait().unwrap()), BY_SIGTERM);
    assert!(!is_mounted(&fx.mnt()));
}

/// Kills a raw daemon and clears its mount if a test fails midway.
struct ChildGuard(std::process::Child, std::path::PathBuf);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if is_mounted(&self.1) {
            let _ = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.1)
                .status();
        }
    }
}

trait CreateExt {
    fn with_mapping(self, mapping: Mapping) -> Self;
    fn with_prefix(self, id: u64, path: &str) -> Self;
}

impl CreateExt for CreateSandbox {
    fn with_mapping(mut self, mapping: Mapping) -> Self {
        self.mappings.push(mapping);
        self
    }

    fn with_prefix(mut self, id: u64, path: &str) -> Self {
        self.prefixes.insert(id, path.into());
        self
    }
}
