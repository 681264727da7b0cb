//! Where actionfs refuses what sandboxfs 0.2.0 refused, its error carries
//! sandboxfs's words (scripts written for sandboxfs grep for them), checked
//! here through the real binary with the patterns of sandboxfs's own
//! integration suite (docs/PARITY.md). Our context (mapping number, path,
//! syscall) stays around them; other tests check that.

use std::path::Path;
use std::process::{Command, Stdio};

use actionfs_protocol::{CreateSandbox, Mapping};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;
use regex::Regex;

/// Starts the daemon with `args` and a mount point that does not exist:
/// every error here comes from checking the arguments, which happens
/// before the mount point is looked at. Returns its stderr after checking
/// it exited 1 with nothing on stdout.
fn refused_start(args: &[String]) -> String {
    let out = Command::new(bin())
        .args(args)
        .arg("irrelevant-mount-point")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout not empty");
    stderr
}

fn assert_matches(pattern: &str, text: &str) {
    assert!(
        Regex::new(pattern).unwrap().is_match(text),
        "want a match for {pattern:?} in:\n{text}"
    );
}

fn mapping(kind: &str, path: &str, underlying: &Path) -> String {
    format!("--mapping={kind}:{path}:{}", underlying.display())
}

#[test]
fn mount_root_mapped_to_a_file_says_failed_to_map_root() {
    let fx = Fixture::new();
    let file = fx.write("src/file", "");
    let stderr = refused_start(&[mapping("ro", "/", &file)]);
    let file = file.display();
    assert_matches(
        &format!("Failed to map root: .*{file}.* not a directory"),
        &stderr,
    );
    assert_matches("mapping #0: ", &stderr);
}

#[test]
fn mount_root_mapped_to_nothing_says_stat_failed() {
    let fx = Fixture::new();
    let stderr = refused_start(&[mapping("ro", "/", &fx.path("non-existent"))]);
    assert_matches("Failed to map root: stat failed .*/non-existent", &stderr);
    assert_matches("lstat: No such file or directory", &stderr);
}

#[test]
fn a_path_mapped_twice_says_already_mapped() {
    let fx = Fixture::new();
    let one = fx.write("src/1", "");
    let two = fx.write("src/2", "");
    let stderr = refused_start(&[
        mapping("ro", "/", &fx.path("src")),
        mapping("ro", "/a/a", &one),
        mapping("ro", "/a/b", &fx.path("src")),
        mapping("ro", "/a/a", &two),
    ]);
    assert_matches("Cannot map .*'/a/a .* Already mapped\n", &stderr);
    assert_matches("mapping #3: ", &stderr);
}

#[test]
fn a_file_mapped_over_a_directory_of_nested_mappings_says_already_mapped() {
    let fx = Fixture::new();
    let file = fx.write("src/file", "");
    let stderr = refused_start(&[
        mapping("ro", "/a/b/c", &fx.path("src")),
        mapping("ro", "/a", &file),
    ]);
    assert_matches("Cannot map .*'/a .* Already mapped", &stderr);
    assert_matches("nested mappings need a directory", &stderr);
}

#[test]
fn a_mapping_below_a_file_says_already_mapped() {
    let fx = Fixture::new();
    let file = fx.write("src/file", "");
    let stderr = refused_start(&[mapping("ro", "/a", &file), mapping("ro", "/a/b", &file)]);
    assert_matches(
        "mapping #1: Cannot map '/a/b -> .*': Already mapped",
        &stderr,
    );
}

#[test]
fn the_mount_root_mapped_late_says_root_can_be_mapped_at_most_once() {
    let fx = Fixture::new();
    let src = fx.path("src");
    let stderr = refused_start(&[mapping("ro", "/a", &src), mapping("ro", "/", &src)]);
    assert_matches(
        "mapping #1: Cannot map '/ -> .*': Root can be mapped at most once",
        &stderr,
    );
}

#[test]
fn a_missing_input_stream_says_failed_to_open_reconfiguration_input() {
    let fx = Fixture::new();
    let missing = fx.path("non-existent/file");
    let stderr = refused_start(&[format!("--input={}", missing.display())]);
    assert_matches(
        &regex::escape(&format!(
            "Failed to open reconfiguration input '{}': No such file or directory",
            missing.display()
        )),
        &stderr,
    );
}

#[test]
fn a_missing_output_directory_says_failed_to_open_reconfiguration_output() {
    let fx = Fixture::new();
    let missing = fx.path("non-existent/file");
    let stderr = refused_start(&[format!("--output={}", missing.display())]);
    assert_matches(
        &regex::escape(&format!(
            "Failed to open reconfiguration output '{}': No such file or directory",
            missing.display()
        )),
        &stderr,
    );
}

/// Starts a daemon, sends `before` (each must succeed), then `request`, and
/// returns its error.
fn refused_create(fx: &Fixture, before: &[CreateSandbox], request: CreateSandbox) -> String {
    let d = fx.start(&[]);
    for create in before {
        d.create(create.clone());
    }
    let error = d.create_err(request);
    assert_eq!(d.terminate(), BY_SIGTERM);
    error
}

#[test]
fn a_sandbox_root_mapped_late_says_root_can_be_mapped_at_most_once() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/subdir/good", "");
    let subdir = fx.path("src/subdir");
    let error = refused_create(
        &fx,
        &[],
        sandbox("sb", vec![ro("/too-late", &good), ro("/", &subdir)]),
    );
    assert_matches("Root can be mapped at most once", &error);
    assert_matches(r#"^sandbox "sb": mapping #1: Cannot map '/ -> "#, &error);
}

#[test]
fn a_second_create_of_a_sandbox_says_already_mapped() {
    if !require(&[Need::Mount]) {
        return;
    }
    // sandboxfs's MapTwice: the same id and path sent twice.
    let fx = Fixture::new();
    let subdir = fx.path("src");
    let file = fx.write("scratch/file", "");
    let error = refused_create(
        &fx,
        &[sandbox("sb", vec![ro("/foo", &subdir)])],
        sandbox("sb", vec![ro("/foo", &file)]),
    );
    assert_matches("Already mapped", &error);
    assert_matches(r#"^sandbox "sb": .*already exists"#, &error);
}

#[test]
fn a_path_mapped_twice_in_a_sandbox_says_already_mapped() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "");
    let error = refused_create(
        &fx,
        &[],
        sandbox("sb", vec![ro("/a", &good), ro("/a", &good)]),
    );
    assert_matches(
        r#"^sandbox "sb": mapping #1: Cannot map '/a -> .*/src/good': Already mapped$"#,
        &error,
    );
}

#[test]
fn an_unknown_prefix_says_prefix_does_not_exist() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let file = fx.write("src/file", "");
    let mut create = sandbox("sb", vec![ro("/", &fx.path("src"))]);
    create.mappings.insert(
        0,
        Mapping {
            path_prefix: 5,
            path: "foo".into(),
            underlying_path: file.to_str().unwrap().into(),
            ..Mapping::default()
        },
    );
    let error = refused_create(&fx, &[], create);
    assert_matches("Prefix 5 does not exist", &error);
    assert_matches(r#"^sandbox "sb": mapping #0 "#, &error);
}

#[test]
fn an_empty_id_says_identifier_cannot_be_empty() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "");
    let d = fx.start(&[]);
    let error = d.create_err(sandbox("", vec![ro("/a", &good)]));
    assert_matches("Identifier cannot be empty", &error);
    let error = match d.client().destroy("") {
        Err(actionfs_protocol::ClientError::Rejected(message)) => message,
        other => panic!("a destroy of \"\" should be refused, got {other:?}"),
    };
    assert_matches("Identifier cannot be empty", &error);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_missing_directory_of_nested_mappings_says_stat_failed() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "");
    let missing = fx.path("src/missing");
    let error = refused_create(
        &fx,
        &[],
        sandbox("sb", vec![ro("/gone", &missing), ro("/gone/x", &good)]),
    );
    assert_matches(
        r#"^sandbox "sb": mapping #0: Cannot map '/gone -> .*/src/missing': Stat failed for ".*/src/missing": lstat: No such file or directory"#,
        &error,
    );
}
