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
            "Already mapped",
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
            "Prefix 77 does not exist",
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
fn only_the_first_mapping_may_map_the_root() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let dir = fx.path("src");
    let d = fx.start(&[]);
    for (id, mappings, bad) in [
        (
            "twice",
            vec![ro("/", &dir), ro("/", &fx.path("scratch"))],
            1,
        ),
        ("after", vec![ro("/a", &good), ro("/", &dir)], 1),
        (
            "third",
            vec![rw("/", &fx.path("scratch")), ro("/g", &good), ro("/", &dir)],
            2,
        ),
    ] {
        let message = d.create_err(sandbox(id, mappings));
        assert!(
            message.contains(&format!("sandbox {id:?}"))
                && message.contains(&format!("mapping #{bad}: Cannot map '/ -> "))
                && message.contains("Root can be mapped at most once"),
            "{id}: {message}"
        );
        assert_no_trace(&d, id, &good);
    }
    // First, it is the sandbox's directory, and the others go inside.
    d.create(sandbox(
        "first",
        vec![rw("/", &fx.path("scratch")), ro("/g", &good)],
    ));
    fs::write(d.path("first/made"), "out").unwrap();
    assert_eq!(fs::read_to_string(fx.path("scratch/made")).unwrap(), "out");
    assert_eq!(fs::read_to_string(d.path("first/g")).unwrap(), "good");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_sandbox_whose_root_is_mapped_to_a_file_is_that_file() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let out = fx.write("scratch/out", "old");
    let bad_below = fx.write("src/other", "other");
    // As FUSE, and where small sandboxes would be built natively.
    for args in [&[][..], &["--native_below=100"][..]] {
        let d = fx.start(args);
        d.create(sandbox("ro", vec![ro("/", &good)]));
        let shown = fs::symlink_metadata(d.path("ro")).unwrap();
        assert!(shown.is_file(), "{args:?}: {shown:?}");
        assert_eq!(shown.len(), 4);
        assert_eq!(fs::read_to_string(d.path("ro")).unwrap(), "good");
        let written = fs::OpenOptions::new()
            .append(true)
            .open(d.path("ro"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"more"));
        assert!(
            written.is_err(),
            "{args:?}: a read-only root file was written"
        );
        assert_eq!(fs::read_to_string(&good).unwrap(), "good");
        d.create(sandbox("rw", vec![rw("/", &out)]));
        fs::write(d.path("rw"), "new").unwrap();
        assert_eq!(fs::read_to_string(&out).unwrap(), "new");
        // Nothing can be mapped below a file.
        let message = d.create_err(sandbox("below", vec![ro("/", &good), ro("/x", &bad_below)]));
        assert!(
            message.contains("mapping #1")
                && message.contains("\"/\" is mapped to a non-directory"),
            "{message}"
        );
        d.destroy("ro");
        d.destroy("rw");
        assert!(!d.path("ro").exists() && !d.path("rw").exists());
        assert_eq!(d.terminate(), BY_SIGTERM);
        fs::write(&out, "old").unwrap();
    }
}

/// How long a test waits for an answer before calling the daemon hung.
const ANSWER_DEADLINE: Duration = Duration::from_secs(20);

#[test]
fn a_broken_request_is_answered_at_once_and_the_next_request_is_served() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    let good_create = |id: &str| {
        actionfs_protocol::encode_request(&actionfs_protocol::Request::Create(sandbox(
            id,
            vec![ro("/g", &good)],
        )))
    };
    // One request per line, as a person or a script writes them: the bad
    // line is answered before anything follows it.
    let answers = d
        .client()
        .call_raw_within(
            &["syn"],
            b"{\"C\":{\"i\":\"syn\",\"m\":[}\n",
            ANSWER_DEADLINE,
        )
        .expect("the broken request is answered");
    let message = answers[0].error.as_deref().expect("an error");
    // Line 1 began with the client's start-up probe (26 bytes).
    assert_eq!(
        message,
        "sandbox \"syn\": malformed request at line 1, column 48: expected a value or ']', \
         found '}'; skipped to the next request"
    );
    let answers = d
        .client()
        .call_raw_within(&["next"], good_create("next").as_bytes(), ANSWER_DEADLINE)
        .expect("the next request is answered");
    assert_eq!(answers[0].error, None);
    assert_eq!(fs::read_to_string(d.path("next/g")).unwrap(), "good");
    // Back to back on one line, as Bazel writes them.
    let stream = format!("{{\"C\":{{\"i\":\"b1\",\"m\":[}}}}{}", good_create("b2"));
    let answers = d
        .client()
        .call_raw_within(&["b1", "b2"], stream.as_bytes(), ANSWER_DEADLINE)
        .expect("both are answered");
    assert!(answers[0]
        .error
        .as_deref()
        .unwrap()
        .contains("malformed request"));
    assert_eq!(answers[1].error, None);
    assert_eq!(fs::read_to_string(d.path("b2/g")).unwrap(), "good");
    // A request left open is ended by the next one.
    let stream = format!("{{\"C\":{{\"i\":\"open\",\"m\":[\n{}", good_create("b3"));
    let answers = d
        .client()
        .call_raw_within(&["open", "b3"], stream.as_bytes(), ANSWER_DEADLINE)
        .expect("both are answered");
    assert!(
        answers[0]
            .error
            .as_deref()
            .unwrap()
            .contains("a new request begins here, before this one was closed"),
        "{answers:?}"
    );
    assert_eq!(answers[1].error, None);
    // Nothing of the broken ones was created.
    let listed = names(&d.mnt);
    for broken in ["syn", "b1", "open"] {
        assert!(
            !listed.contains(&broken.to_string()),
            "{broken} was created"
        );
    }
    // Broken before naming any sandbox: answered with a null id, and the
    // next request is still served.
    let answers = d
        .client()
        .call_raw_within(
            &["after"],
            format!("{{\"C\":}}\n{}", good_create("after")).as_bytes(),
            ANSWER_DEADLINE,
        )
        .expect("the request after is answered");
    assert_eq!(answers[0].error, None);
    let unnamed = d.client().unexpected_responses();
    assert_eq!(unnamed.len(), 1, "{unnamed:?}");
    assert_eq!(unnamed[0].id, None);
    assert!(
        unnamed[0]
            .error
            .as_deref()
            .unwrap()
            .ends_with("expected a value, found '}'; skipped to the next request"),
        "{unnamed:?}"
    );
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
