//! `actionfs replay-actions` on a hand-written execution log, without
//! Bazel: an exec root in a temporary directory as a local build leaves
//! it, and a log in Bazel 4.2.3's JSON format whose actions are /bin/sh
//! commands. Serve-mode tests mount (FUSE sandboxes of `actionfs serve`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use actionfs_protocol::backend::digest::sha256_hex;
use actionfs_testkit::bin;
use actionfs_testkit::tier::{require, Need};
use serde_json::{json, Value};

const WS: &str = "ws";

/// An exec root (`<dir>/execroot/ws`) after a local build of three
/// actions, and the log of that build (plus two spawns to skip).
struct Build {
    dir: tempfile::TempDir,
    spawns: Vec<Value>,
}

fn digest(bytes: &[u8]) -> Value {
    json!({
        "hash": sha256_hex(bytes),
        "sizeBytes": bytes.len().to_string(),
        "hashFunctionName": "SHA-256"
    })
}

fn file(path: &str, bytes: &[u8]) -> Value {
    json!({"path": path, "digest": digest(bytes)})
}

fn spawn(argv: &[&str], inputs: Vec<Value>, listed: &[&str], actual: Vec<Value>) -> Value {
    json!({
        "commandArgs": argv,
        "environmentVariables": [
            {"name": "PATH", "value": "/usr/bin:/bin"},
            {"name": "GREETING", "value": "hello from the log"}
        ],
        "platform": {"properties": []},
        "inputs": inputs,
        "listedOutputs": listed,
        "remotable": true,
        "cacheable": true,
        "timeoutMillis": "0",
        "progressMessage": "Executing genrule",
        "mnemonic": "Genrule",
        "actualOutputs": actual,
        "runner": "local",
        "remoteCacheHit": false,
        "status": "",
        "exitCode": 0,
        "remoteCacheable": true
    })
}

const A: &[u8] = b"alpha\n";
const B: &[u8] = b"beta\n";
const TOOL: &[u8] = b"#!/bin/sh\nmkdir -p \"$2/sub\" && cp \"$1\" \"$2/copy\" && wc -l < \"$1\" > \"$2/sub/count\" && echo \"$GREETING\" >> \"$2/sub/count\"\n";
const AB: &[u8] = b"alpha\nbeta\n";
const UPPER: &[u8] = b"ALPHA\nBETA\nhello from the log\n";
const COUNT: &[u8] = b"2\nhello from the log\n";

impl Build {
    /// In /var/tmp: a serve base below /tmp, writable in Bazel's jail,
    /// gets no native sandbox.
    fn new() -> Build {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let build = Build {
            dir,
            spawns: Vec::new(),
        };
        // Sources reached through a top-level symlink, as Bazel's exec
        // root reaches the workspace.
        let src = build.dir.path().join("workspace/src");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("a.txt"), A).unwrap();
        fs::write(src.join("b.txt"), B).unwrap();
        fs::write(src.join("tool.sh"), TOOL).unwrap();
        fs::set_permissions(src.join("tool.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        let root = build.exec_root();
        fs::create_dir_all(&root).unwrap();
        std::os::unix::fs::symlink(&src, root.join("src")).unwrap();
        // What the build made.
        for (path, bytes) in [
            ("bazel-out/bin/ab.txt", AB),
            ("bazel-out/bin/upper.txt", UPPER),
            ("bazel-out/bin/tree/copy", AB),
            ("bazel-out/bin/tree/sub/count", COUNT),
        ] {
            let path = root.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, bytes).unwrap();
        }
        let mut build = build;
        build.spawns = vec![
            spawn(
                &["/bin/sh", "-c", "cat src/a.txt src/b.txt > bazel-out/bin/ab.txt"],
                vec![file("src/a.txt", A), file("src/b.txt", B)],
                &["bazel-out/bin/ab.txt"],
                vec![file("bazel-out/bin/ab.txt", AB)],
            ),
            // Skipped: served from a cache.
            json!({
                "commandArgs": ["/bin/false"],
                "listedOutputs": ["bazel-out/bin/cached"],
                "mnemonic": "Genrule",
                "runner": "remote cache hit",
                "remoteCacheHit": true,
                "status": "",
                "exitCode": 0
            }),
            // A generated input, the environment, a file output.
            spawn(
                &[
                    "/bin/sh",
                    "-c",
                    "tr a-z A-Z < bazel-out/bin/ab.txt > bazel-out/bin/upper.txt && echo \"$GREETING\" >> bazel-out/bin/upper.txt",
                ],
                vec![file("bazel-out/bin/ab.txt", AB)],
                &["bazel-out/bin/upper.txt"],
                vec![file("bazel-out/bin/upper.txt", UPPER)],
            ),
            // Skipped: no outputs.
            spawn(&["/bin/true"], vec![], &[], vec![]),
            // A tree artifact output, a tool run by its exec path.
            spawn(
                &["src/tool.sh", "bazel-out/bin/ab.txt", "bazel-out/bin/tree"],
                vec![file("src/tool.sh", TOOL), file("bazel-out/bin/ab.txt", AB)],
                &["bazel-out/bin/tree"],
                vec![
                    file("bazel-out/bin/tree/copy", AB),
                    file("bazel-out/bin/tree/sub/count", COUNT),
                ],
            ),
        ];
        build
    }

    fn exec_root(&self) -> PathBuf {
        self.dir.path().join("execroot").join(WS)
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// Writes the log as Bazel does: pretty objects, one after another.
    fn log(&self) -> PathBuf {
        let path = self.dir.path().join("exec.json");
        let text: String = self
            .spawns
            .iter()
            .map(|s| serde_json::to_string_pretty(s).unwrap())
            .collect();
        fs::write(&path, text).unwrap();
        path
    }

    fn replay(&self, extra: &[&str]) -> Output {
        let log = self.log();
        let out = Command::new(bin())
            .arg("replay-actions")
            .arg("--execlog")
            .arg(&log)
            .arg("--exec-root")
            .arg(self.exec_root())
            .arg("--out")
            .arg(self.out())
            .args(extra)
            .output()
            .unwrap();
        eprintln!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Every file under the exec root with its bytes (through the source
    /// symlink too).
    fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        fn walk(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push((path.clone(), fs::read(&path).unwrap()));
                }
            }
        }
        let mut files = Vec::new();
        walk(&self.exec_root(), &mut files);
        files.sort();
        files
    }
}

/// A mode's row of the table of time per action by step, in ms: setup,
/// run, collect, teardown.
fn steps_of(text: &str, mode: &str) -> [f64; 4] {
    let table = text
        .split_once("time per action by step")
        .unwrap_or_else(|| panic!("no table of steps:\n{text}"))
        .1;
    let row = table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(mode))
        .unwrap_or_else(|| panic!("no {mode} row:\n{text}"));
    let ms: Vec<f64> = row
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    ms.try_into()
        .unwrap_or_else(|ms| panic!("four steps, not {ms:?}:\n{text}"))
}

/// Each serve run's builds by its backend's counts: [native, including
/// from stashes; FUSE; FUSE fallback].
fn built_counts(text: &str) -> Vec<[u32; 3]> {
    text.lines()
        .filter_map(|line| line.split_once("backend: built ").map(|(_, rest)| rest))
        .map(|rest| {
            let n: Vec<u32> = rest
                .split(", ")
                .take(4)
                .map(|part| part.split(' ').next().unwrap().parse().unwrap())
                .collect();
            [n[0] + n[1], n[2], n[3]]
        })
        .collect()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn replays_unsandboxed_and_in_symlink_sandboxes_matching_the_log() {
    let build = Build::new();
    let before = build.snapshot();
    let out = build.replay(&[
        "--modes",
        "unsandboxed,symlinks",
        "--jobs",
        "2",
        "--runs",
        "2",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("5 spawns in")
            && text.contains("3 to replay, 2 skipped (1 cache hit, 1 no outputs)"),
        "{text}"
    );
    for mode in ["unsandboxed", "symlinks"] {
        for run in [1, 2] {
            assert!(
                text.contains(&format!(
                    "{mode} run {run}: 3/3 actions ok, 4 outputs compared, 0 mismatches"
                )),
                "{text}"
            );
        }
    }
    // The forest's ratio is its median over unsandboxed's (unsandboxed's
    // own 1.00x is one by construction), to the rounding of the medians.
    let row = |mode: &str| -> Vec<f64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(mode) && l.ends_with('x'));
        let fields: Vec<&str> = line
            .unwrap_or_else(|| panic!("no {mode} row: {text}"))
            .split_whitespace()
            .collect();
        vec![
            fields[6].parse().unwrap(),
            fields[9].trim_end_matches('x').parse().unwrap(),
        ]
    };
    let (forest, unsandboxed) = (row("symlinks"), row("unsandboxed"));
    // Medians are printed to the millisecond (these actions take a few),
    // the ratio to the hundredth: it lies within what those roundings allow.
    let half_ms = 0.0005;
    let lowest = (forest[0] - half_ms) / (unsandboxed[0] + half_ms) - 0.005;
    let highest = (forest[0] + half_ms) / (unsandboxed[0] - half_ms).max(half_ms) + 0.005;
    assert!(
        (lowest..=highest).contains(&forest[1]),
        "{lowest}..={highest}: {text}"
    );
    // Each mode's time by step: the forest makes and removes its links,
    // unsandboxed has no sandbox to remove.
    let [setup, run, _collect, teardown] = steps_of(&text, "symlinks");
    assert!(setup > 0.0 && run > 0.0 && teardown > 0.0, "{text}");
    let [_, run, collect, teardown] = steps_of(&text, "unsandboxed");
    assert!(run > 0.0 && collect == 0.0 && teardown == 0.0, "{text}");
    // The original exec root is as it was, and nothing is left behind.
    assert_eq!(build.snapshot(), before);
    assert!(!build.out().exists(), "{:?} left behind", build.out());
}

#[test]
fn keep_leaves_each_modes_exec_root() {
    let build = Build::new();
    let out = build.replay(&["--modes=symlinks,unsandboxed", "--keep"]);
    assert!(out.status.success(), "{out:?}");
    for mode in ["symlinks", "unsandboxed"] {
        let results = build.out().join(mode).join("execroot").join(WS);
        assert_eq!(
            fs::read(results.join("bazel-out/bin/upper.txt")).unwrap(),
            UPPER
        );
        assert_eq!(
            fs::read(results.join("bazel-out/bin/tree/sub/count")).unwrap(),
            COUNT
        );
    }
    // Per-action sandboxes are gone even when kept.
    let sandboxes = build.out().join("symlinks/sandbox");
    assert_eq!(fs::read_dir(sandboxes).unwrap().count(), 0);
    assert!(stdout(&out).contains(&format!("kept: {}", build.out().display())));
}

#[test]
fn a_wrong_logged_digest_fails_naming_the_output_in_each_mode() {
    let mut build = Build::new();
    let wrong = b"something else\n";
    build.spawns[2]["actualOutputs"][0]["digest"] = digest(wrong);
    let out = build.replay(&["--modes", "unsandboxed,symlinks,reuse"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    for mode in ["unsandboxed", "symlinks", "reuse"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("MISMATCH {mode} run 1:")))
            .unwrap_or_else(|| panic!("no mismatch for {mode}: {text}"));
        assert!(
            line.contains("#3 Genrule")
                && line.contains("bazel-out/bin/upper.txt")
                && line.contains(&format!("expected {}", sha256_hex(wrong)))
                && line.contains(&format!("got {}", sha256_hex(UPPER))),
            "{line}"
        );
    }
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("3 outputs differ from the log"),
        "{out:?}"
    );
    assert!(!build.out().exists());
}

#[test]
fn a_failed_action_fails_the_replay_and_unsandboxed_skips_what_needs_it() {
    let mut build = Build::new();
    build.spawns[0]["commandArgs"] = json!(["/bin/sh", "-c", "echo broken >&2; exit 7"]);
    let out = build.replay(&["--modes", "unsandboxed,symlinks"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text.contains(
            "FAILED unsandboxed run 1: #1 Genrule (bazel-out/bin/ab.txt) failed: exit status: 7"
        ) && text.contains("broken"),
        "{text}"
    );
    // Its dependents read a file it did not make: not run.
    assert!(
        text.contains(
            "FAILED unsandboxed run 1: #3 Genrule (bazel-out/bin/upper.txt) not run: #1 Genrule"
        ),
        "{text}"
    );
    // A symlink sandbox reads the original exec root: they run and match.
    assert!(text.contains("symlinks run 1: 2/3 actions ok"), "{text}");
}

#[test]
fn usage_errors_and_bad_logs_are_told() {
    let build = Build::new();
    let out = Command::new(bin())
        .args([
            "replay-actions",
            "--execlog",
            "x",
            "--exec-root",
            "y",
            "--modes",
            "fuse",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("serve, unsandboxed, symlinks, reuse"));

    let log = build.dir.path().join("bad.json");
    fs::write(&log, "{\"commandArgs\": [\"true\"]} {").unwrap();
    let out = Command::new(bin())
        .arg("replay-actions")
        .arg("--execlog")
        .arg(&log)
        .arg("--exec-root")
        .arg(build.exec_root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.json") && err.contains("1 spawns read"),
        "{err}"
    );
}

#[test]
fn replays_through_serve_in_each_content_mode_and_backend_option() {
    if !require(&[Need::Mount]) {
        return;
    }
    let build = Build::new();
    let before = build.snapshot();
    // Not below /tmp, where serve makes every sandbox FUSE.
    let base_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let base = base_dir.path().join("base");
    fs::create_dir_all(&base).unwrap();
    let sandbox_base = format!("--backend-opt=--sandbox_base={}", base.display());
    for extra in [
        &["--content=default"][..],
        &["--content=location"][..],
        &["--content=inline"][..],
        &["--backend-opt=--native_below=0"][..],
        &["--backend-opt=--native_below=1000000000"][..],
    ] {
        let mut args = vec![
            "--modes=serve,unsandboxed",
            "--jobs=2",
            "--runs=2",
            &sandbox_base,
        ];
        args.extend_from_slice(extra);
        let out = build.replay(&args);
        let text = stdout(&out);
        assert!(out.status.success(), "{extra:?}: {out:?}");
        for run in [1, 2] {
            assert!(
                text.contains(&format!(
                    "serve run {run}: 3/3 actions ok, 4 outputs compared, 0 mismatches"
                )) && text.contains("backend exit status: 0"),
                "{extra:?}: {text}"
            );
        }
        // How the backend built the sandboxes, by its own counts: outputs
        // alone match whether a sandbox is native or FUSE. A native one
        // may come from a stash whenever a Destroy's stash arrived first.
        let want = match extra[0] {
            "--backend-opt=--native_below=0" => Some([0, 3, 0]),
            "--backend-opt=--native_below=1000000000" => Some([3, 0, 0]),
            _ => None,
        };
        let built = built_counts(&text);
        assert_eq!(built.len(), 2, "{extra:?}: {text}");
        if let Some(want) = want {
            assert!(built.iter().all(|b| *b == want), "{extra:?}: {text}");
        }
        // Every request of serve's is a step of its own.
        assert!(
            steps_of(&text, "serve").iter().all(|ms| *ms > 0.0),
            "{extra:?}: {text}"
        );
        assert!(!build.out().exists());
        assert_eq!(
            fs::read_dir(&base).unwrap().count(),
            0,
            "{extra:?}: left in the base"
        );
    }
    assert_eq!(build.snapshot(), before);
}

#[test]
fn serve_names_a_wrong_digest_and_a_refused_option() {
    if !require(&[Need::Mount]) {
        return;
    }
    let mut build = Build::new();
    build.spawns[4]["actualOutputs"][1]["digest"] = digest(b"not the count");
    let out = build.replay(&["--modes=serve"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("MISMATCH serve run 1: #5 Genrule")
                && l.contains("bazel-out/bin/tree/sub/count")),
        "{text}"
    );

    let out = build.replay(&["--modes=serve", "--backend-opt=--no_such_option"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text.contains("serve run 1: could not start: the backend refused Negotiate")
            && text.contains("--no_such_option"),
        "{text}"
    );
}

/// A build as Bazel 4.2.3 logs what Bazel 7 treats specially: a tool with
/// a runfiles tree (a source data file, the tool itself, an empty marker)
/// read by two actions that also read one param file; and an empty tree
/// artifact that the log leaves out of its reader's inputs.
struct RealBuild {
    build: Build,
}

const DATA: &[u8] = b"runfiles data\n";
const PARAMS: &[u8] = b"-o\nout\n";
const RTOOL: &[u8] = b"#!/bin/sh\ncat \"$0.runfiles/ws/src/data.txt\" \"$1\"\n";

impl RealBuild {
    fn new() -> RealBuild {
        let mut build = Build::new();
        let root = build.exec_root();
        let src = build.dir.path().join("workspace/src");
        fs::write(src.join("data.txt"), DATA).unwrap();
        let bin = root.join("bazel-out/bin");
        fs::write(bin.join("rtool"), RTOOL).unwrap();
        fs::set_permissions(bin.join("rtool"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(bin.join("x-2.params"), PARAMS).unwrap();
        // The runfiles tree as a local build leaves it: absolute links.
        let runfiles = bin.join("rtool.runfiles");
        fs::create_dir_all(runfiles.join("ws/src")).unwrap();
        fs::write(runfiles.join("MANIFEST"), "ws/src/data.txt ...\n").unwrap();
        std::os::unix::fs::symlink(src.join("data.txt"), runfiles.join("ws/src/data.txt")).unwrap();
        std::os::unix::fs::symlink(bin.join("rtool"), runfiles.join("ws/rtool")).unwrap();
        fs::write(runfiles.join("ws/src/__init__.py"), "").unwrap();
        fs::create_dir_all(bin.join("empty")).unwrap();
        let out1 = [DATA, PARAMS].concat();
        let out2 = [DATA, A].concat();
        fs::write(bin.join("r1"), &out1).unwrap();
        fs::write(bin.join("r2"), &out2).unwrap();
        fs::write(bin.join("listing"), "").unwrap();
        // The runfiles members by their exec paths (the tool twice), as
        // 4.2.3 logs them.
        let tool_inputs = || {
            vec![
                file("bazel-out/bin/rtool", RTOOL),
                file("bazel-out/bin/rtool", RTOOL),
                file("src/data.txt", DATA),
                file("bazel-out/bin/x-2.params", PARAMS),
            ]
        };
        let mut second = tool_inputs();
        second.push(file("src/a.txt", A));
        build.spawns = vec![
            spawn(
                &[
                    "bazel-out/bin/rtool",
                    "bazel-out/bin/x-2.params",
                    "bazel-out/bin/r1",
                ],
                tool_inputs(),
                &["bazel-out/bin/r1"],
                vec![file("bazel-out/bin/r1", &out1)],
            ),
            spawn(
                &[
                    "/bin/sh",
                    "-c",
                    "bazel-out/bin/rtool src/a.txt > bazel-out/bin/r2",
                ],
                second,
                &["bazel-out/bin/r2"],
                vec![file("bazel-out/bin/r2", &out2)],
            ),
            spawn(
                &["/bin/sh", "-c", "mkdir -p bazel-out/bin/empty"],
                vec![],
                &["bazel-out/bin/empty"],
                vec![],
            ),
            // Fails unless the empty tree artifact is there.
            spawn(
                &[
                    "/bin/sh",
                    "-c",
                    "test -d \"$1\" && ls -A \"$1\" > bazel-out/bin/listing",
                    "",
                    "bazel-out/bin/empty",
                ],
                vec![],
                &["bazel-out/bin/listing"],
                vec![file("bazel-out/bin/listing", b"")],
            ),
        ];
        // The first action's tool writes to stdout: make it write its
        // output the way the log says instead.
        build.spawns[0]["commandArgs"] = json!([
            "/bin/sh",
            "-c",
            "bazel-out/bin/rtool bazel-out/bin/x-2.params > bazel-out/bin/r1"
        ]);
        RealBuild { build }
    }
}

/// What a backend was sent: every Push's blobs and content entries (one
/// map per Push), and every Create's manifest.
struct Sent {
    pushes: Vec<actionfs_protocol::backend::sandbox::Push>,
    roots: Vec<actionfs_protocol::backend::reapi::Digest>,
}

fn read_sent(path: &Path) -> Sent {
    use actionfs_protocol::backend::frame::read_frame;
    use actionfs_protocol::backend::sandbox::{request::Op, Request};
    let bytes = fs::read(path).unwrap();
    let mut reader = bytes.as_slice();
    let mut sent = Sent {
        pushes: Vec::new(),
        roots: Vec::new(),
    };
    while let Some(request) = read_frame::<Request>(&mut reader, 1 << 30).unwrap() {
        match request.op {
            Some(Op::Push(push)) => sent.pushes.push(push),
            Some(Op::Create(create)) => sent
                .roots
                .push(create.manifest.unwrap().input_root_digest.unwrap()),
            _ => {}
        }
    }
    sent
}

/// A backend that records its input on the way to `actionfs serve`.
fn recording_backend(dir: &Path) -> (PathBuf, PathBuf) {
    let record = dir.join("stdin.bin");
    let script = dir.join("recording-backend");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\ntee '{}' | exec '{}' \"$@\"\n",
            record.display(),
            bin()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    (script, record)
}

#[test]
fn pushes_content_as_bazel_7_does_and_never_the_empty_directory() {
    use actionfs_protocol::backend::digest::digest_of;
    use actionfs_protocol::backend::reapi::Directory;
    use actionfs_protocol::backend::sandbox::{content, Retention};
    use prost::Message;
    if !require(&[Need::Mount]) {
        return;
    }
    let real = RealBuild::new();
    let build = &real.build;
    let base = build.dir.path().join("base");
    fs::create_dir_all(&base).unwrap();
    let (backend, record) = recording_backend(build.dir.path());
    // Today's serve refuses relative locations and the empty directory,
    // so only what it was sent is asserted here, not its success.
    let out = build.replay(&[
        "--modes=serve,symlinks,unsandboxed",
        "--jobs=1",
        &format!("--backend={}", backend.display()),
        &format!("--backend-opt=--sandbox_base={}", base.display()),
    ]);
    let text = stdout(&out);
    // The other modes prove the plan: the runfiles tree and the empty
    // directory are where the actions look.
    for mode in ["symlinks", "unsandboxed"] {
        assert!(
            text.contains(&format!(
                "{mode} run 1: 4/4 actions ok, 3 outputs compared, 0 mismatches"
            )),
            "{text}"
        );
    }
    let sent = read_sent(&record);
    let mut blobs = std::collections::HashMap::new();
    let mut entries = Vec::new();
    for push in &sent.pushes {
        for (hash, blob) in &push.blobs {
            assert!(!blob.is_empty(), "the empty Directory {hash} was pushed");
            blobs.insert(hash.clone(), blob.clone());
        }
        entries.extend(push.content.clone());
    }
    let entry_for = |bytes: &[u8]| -> Vec<(Option<content::Source>, i32)> {
        let hash = sha256_hex(bytes);
        entries
            .iter()
            .filter(|(h, _)| **h == hash)
            .map(|(_, c)| (c.source.clone(), c.retention))
            .collect()
    };
    // The param file: inline, single use, in each of its two actions' Push.
    let single = Retention::SingleUse as i32;
    assert_eq!(
        entry_for(PARAMS),
        vec![(Some(content::Source::Inline(PARAMS.to_vec())), single); 2]
    );
    // The empty runfiles marker: inline (no bytes), single use.
    assert_eq!(
        entry_for(b""),
        vec![(Some(content::Source::Inline(vec![])), single); 2]
    );
    // Runfiles members: by location relative to Manifest.exec_root, once.
    let reuse = Retention::Reuse as i32;
    assert_eq!(
        entry_for(DATA),
        [(
            Some(content::Source::Location("ws/src/data.txt".into())),
            reuse
        )]
    );
    assert_eq!(
        entry_for(RTOOL),
        [(
            Some(content::Source::Location("ws/bazel-out/bin/rtool".into())),
            reuse
        )]
    );
    // Everything else: from the default place.
    assert!(entry_for(A).is_empty(), "{entries:?}");
    assert_eq!(entries.len(), 6, "{entries:?}");

    // The trees: the runfiles member at its runfiles path; the empty tree
    // artifact a directory with the empty digest, its blob never pushed.
    let dir = |digest: &actionfs_protocol::backend::reapi::Digest| -> Directory {
        if digest.size_bytes == 0 {
            return Directory::default();
        }
        Directory::decode(blobs[&digest.hash].as_slice()).unwrap()
    };
    let walk = |root: &actionfs_protocol::backend::reapi::Digest, path: &str| {
        let mut current = dir(root);
        let names: Vec<&str> = path.split('/').collect();
        for name in &names[..names.len() - 1] {
            let node = current.directories.iter().find(|d| d.name == *name);
            current = dir(node
                .unwrap_or_else(|| panic!("no {name} in {path}"))
                .digest
                .as_ref()
                .unwrap());
        }
        current
    };
    assert_eq!(sent.roots.len(), 4, "one Create per action");
    let data = walk(
        &sent.roots[0],
        "ws/bazel-out/bin/rtool.runfiles/ws/src/data.txt",
    );
    let node = data.files.iter().find(|f| f.name == "data.txt").unwrap();
    assert_eq!(node.digest.as_ref().unwrap().hash, sha256_hex(DATA));
    let bin_dir = walk(&sent.roots[3], "ws/bazel-out/bin/empty");
    let empty = bin_dir
        .directories
        .iter()
        .find(|d| d.name == "empty")
        .unwrap();
    assert_eq!(empty.digest.as_ref().unwrap(), &digest_of(b""));
}

/// A build of one action that writes outside every writable path of a
/// jail (the returned directory, in /var/tmp: not below /tmp, which both
/// jails leave writable, as the target directory is for a checkout in
/// /tmp), then its output; and the `--backend-opt` naming a sandbox base
/// of the build's own.
fn escaping_build() -> (Build, tempfile::TempDir, String) {
    let mut build = Build::new();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let script = format!(
        "touch {}/written && cat src/a.txt src/b.txt > bazel-out/bin/ab.txt",
        outside.path().display()
    );
    build.spawns[0]["commandArgs"] = json!(["/bin/sh", "-c", script]);
    build.spawns.truncate(1);
    let base = build.dir.path().join("base");
    fs::create_dir_all(&base).unwrap();
    let sandbox_base = format!("--backend-opt=--sandbox_base={}", base.display());
    (build, outside, sandbox_base)
}

#[test]
fn jail_runs_actions_in_linux_sandbox() {
    if !require(&[Need::Mount, Need::LinuxSandbox]) {
        return;
    }
    let (build, outside_dir, sandbox_base) = escaping_build();
    let outside = outside_dir.path().to_owned();
    let jail = format!(
        "--jail=linux-sandbox={}",
        actionfs_testkit::tier::linux_sandbox().display()
    );
    // FUSE sandboxes: the ones today's serve can run in the jail.
    let fuse = "--backend-opt=--native_below=0";
    let args = ["--modes=serve,symlinks", &sandbox_base, fuse];

    let out = build.replay(&[&args[..], &[jail.as_str()]].concat());
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text.contains("jail: linux-sandbox ("), "{text}");
    assert_each_mode_failed_to_escape(&text, &outside, "Read-only file system");
    // Unsandboxed stays bare, in the jail's run too.
    let out = build.replay(&["--modes=unsandboxed", &jail]);
    assert!(out.status.success(), "{out:?}");
    assert!(outside.join("written").exists());
    fs::remove_file(outside.join("written")).unwrap();

    // Without --jail, nothing is jailed.
    let out = build.replay(&args);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("jail: none"), "{text}");
    assert!(outside.join("written").exists());
}

/// The escaping action (#1) failed in serve's and the forest's jail alike,
/// refused with `error` writing to `outside`, which holds nothing.
fn assert_each_mode_failed_to_escape(text: &str, outside: &Path, error: &str) {
    for mode in ["serve", "symlinks"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("FAILED {mode} run 1: #1")))
            .unwrap_or_else(|| panic!("{mode} was not jailed: {text}"));
        assert!(line.contains("failed"), "{line}");
    }
    assert!(
        text.contains(&format!("{}/written", outside.display())) && text.contains(error),
        "{text}"
    );
    assert!(!outside.join("written").exists());
}

/// How actionfs's jail refuses a write outside: the host is read-only
/// where its wrapper makes namespaces, else Landlock refuses.
fn landlock_refusal() -> &'static str {
    let helper = Path::new(&bin()).with_file_name(actionfs::jail::HELPER);
    let program = [helper.display().to_string()];
    match actionfs::serve::confine::probe_namespaces(&program) {
        Ok(()) => "Read-only file system",
        Err(_) => "Permission denied",
    }
}

#[test]
fn jail_landlock_runs_actions_in_actionfs_jail() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    let (mut build, outside_dir, sandbox_base) = escaping_build();
    let outside = outside_dir.path().to_owned();
    let args = ["--modes=serve,symlinks", &sandbox_base, "--jail=landlock"];
    let out = build.replay(&args);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text.contains("jail: landlock ("), "{text}");
    assert_each_mode_failed_to_escape(&text, &outside, landlock_refusal());

    // The action that writes only its output passes in both modes.
    build.spawns[0]["commandArgs"] = json!([
        "/bin/sh",
        "-c",
        "cat src/a.txt src/b.txt > bazel-out/bin/ab.txt"
    ]);
    let out = build.replay(&args);
    assert!(out.status.success(), "{out:?}\n{}", stdout(&out));
}

/// A log for the reuse modes: two Genrule actions with a slower action
/// of another mnemonic between them (so that an in-memory stash is
/// listed before the second Genrule looks), each Genrule writing where
/// its sandbox was and its output's inode to `side` (not an output, so
/// the digests stay the log's).
fn reuse_build() -> (Build, PathBuf) {
    let mut build = Build::new();
    let side = build.dir.path().join("side");
    let root = build.exec_root();
    fs::write(root.join("bazel-out/bin/slow.txt"), A).unwrap();
    let note = format!(
        "echo \"$(pwd) $(stat -c %i bazel-out/bin/ab.txt 2>/dev/null || stat -f %i bazel-out/bin/ab.txt)\" >> '{}'",
        side.display()
    );
    build.spawns = vec![
        spawn(
            &[
                "/bin/sh",
                "-c",
                &format!("cat src/a.txt src/b.txt > bazel-out/bin/ab.txt && {note}"),
            ],
            vec![file("src/a.txt", A), file("src/b.txt", B)],
            &["bazel-out/bin/ab.txt"],
            vec![file("bazel-out/bin/ab.txt", AB)],
        ),
        spawn(
            &["/bin/sh", "-c", "sleep 0.3; cp src/a.txt bazel-out/bin/slow.txt"],
            vec![file("src/a.txt", A)],
            &["bazel-out/bin/slow.txt"],
            vec![file("bazel-out/bin/slow.txt", A)],
        ),
        // Reads a.txt too: its link is kept, b.txt's removed, ab.txt's made.
        spawn(
            &[
                "/bin/sh",
                "-c",
                "tr a-z A-Z < bazel-out/bin/ab.txt > bazel-out/bin/upper.txt && echo \"$GREETING\" >> bazel-out/bin/upper.txt && test -L src/a.txt && test ! -e src/b.txt",
            ],
            vec![file("bazel-out/bin/ab.txt", AB), file("src/a.txt", A)],
            &["bazel-out/bin/upper.txt"],
            vec![file("bazel-out/bin/upper.txt", UPPER)],
        ),
    ];
    build.spawns[1]["mnemonic"] = json!("Slow");
    (build, side)
}

/// The numbers in a reuse mode's run line: from a stash, fresh, links
/// kept, made, entries removed, outputs copied, trees deleted.
fn reuse_counts(text: &str, mode: &str, run: usize) -> [u64; 7] {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{mode} run {run}:")))
        .unwrap_or_else(|| panic!("no {mode} run {run} line:\n{text}"));
    let after = |key: &str| -> u64 {
        let rest = line
            .split_once(key)
            .unwrap_or_else(|| panic!("no {key:?} in {line}"))
            .1;
        rest.trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let [from_stash, fresh] = {
        let s = line.split_once("sandboxes: ").unwrap().1;
        let n: Vec<u64> = s
            .split(", ")
            .take(2)
            .map(|p| p.split(' ').next().unwrap().parse().unwrap())
            .collect();
        [n[0], n[1]]
    };
    let links = line.split_once("links: ").unwrap().1;
    let kept: u64 = links.split(' ').next().unwrap().parse().unwrap();
    let made: u64 = links
        .split_once(", ")
        .unwrap()
        .1
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let removed: u64 = line
        .split_once(" entries removed")
        .unwrap()
        .0
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    [
        from_stash,
        fresh,
        kept,
        made,
        removed,
        after("outputs copied:"),
        after("trees deleted in the background:"),
    ]
}

#[test]
fn reuse_modes_reuse_a_stash_by_mnemonic_as_bazel_7_does() {
    let (build, side) = reuse_build();
    let out = build.replay(&[
        "--modes=reuse,reuse-shm,reuse-inmemory,symlinks",
        "--jobs=1",
        "--keep",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    let out_dir = fs::canonicalize(build.out()).unwrap();
    for mode in ["reuse", "reuse-shm", "reuse-inmemory", "symlinks"] {
        assert!(
            text.contains(&format!(
                "{mode} run 1: 3/3 actions ok, 3 outputs compared, 0 mismatches"
            )),
            "{text}"
        );
    }
    for mode in ["reuse", "reuse-shm", "reuse-inmemory"] {
        let [from_stash, fresh, kept, made, removed, copied, deleted] =
            reuse_counts(&text, mode, 1);
        // #1 and Slow fresh; #3 takes #1's stash: a.txt's link kept,
        // ab.txt's made (2 + 1 + 1 in all), b.txt's removed.
        assert_eq!(
            (from_stash, fresh, kept, made, removed),
            (1, 2, 1, 4, 1),
            "{mode}: {text}"
        );
        // On /dev/shm the outputs cross to the disk exec root: copied.
        let expect_copied = if mode == "reuse-shm" { 3 } else { 0 };
        assert_eq!(copied, expect_copied, "{mode}: {text}");
        // Every sandbox's remains (3) went to the deleter, and were deleted.
        assert!(deleted >= 3, "{mode}: {text}");
        let exec_root = out_dir.join(mode).join("execroot").join(WS);
        assert!(
            text.contains(&format!("exec root {}", exec_root.display())),
            "{text}"
        );
    }
    // Links in a stash point to absolute paths in the mode's exec root.
    for mode in ["reuse", "reuse-inmemory"] {
        let base = out_dir.join(mode).join("sandbox");
        let exec_root = out_dir.join(mode).join("execroot").join(WS);
        let genrule = base.join("sandbox_stash/Genrule");
        let stashes: Vec<PathBuf> = fs::read_dir(&genrule)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(stashes.len(), 1, "{stashes:?}");
        let ws = stashes[0].join("execroot").join(WS);
        for input in ["src/a.txt", "bazel-out/bin/ab.txt"] {
            assert_eq!(
                fs::read_link(ws.join(input)).unwrap(),
                exec_root.join(input),
                "{mode} {input}"
            );
        }
        assert!(fs::symlink_metadata(ws.join("src/b.txt")).is_err());
        let slow = base.join("sandbox_stash/Slow");
        assert_eq!(fs::read_dir(slow).unwrap().count(), 1);
        // Nothing else is left: no sandbox, no trash, no listing.
        for dir in ["processwrapper-sandbox", "_moved_trash_dir"] {
            assert_eq!(fs::read_dir(base.join(dir)).unwrap().count(), 0, "{dir}");
        }
        if mode == "reuse-inmemory" {
            assert_eq!(
                fs::read_dir(base.join("tmp_sandbox_stash"))
                    .unwrap()
                    .count(),
                0
            );
        }
    }
    // Outputs renamed, not copied: the inode the action saw in its
    // sandbox is the exec root's.
    let seen = fs::read_to_string(&side).unwrap();
    for mode in ["reuse", "reuse-inmemory"] {
        let sandboxes = out_dir.join(mode).join("sandbox/processwrapper-sandbox");
        let line = seen
            .lines()
            .find(|l| l.starts_with(&format!("{}/", sandboxes.display())))
            .unwrap_or_else(|| panic!("no {mode} sandbox in {seen}"));
        let inode: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        let result = out_dir.join(mode).join("execroot/ws/bazel-out/bin/ab.txt");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(result).unwrap().ino(), inode, "{mode}: {line}");
    }
    // reuse-shm's base was on /dev/shm, and is gone.
    let shm = text
        .lines()
        .find(|l| l.starts_with("reuse-shm run 1:"))
        .and_then(|l| l.split_once("sandbox base ").map(|(_, r)| r.to_owned()))
        .unwrap();
    let shm = PathBuf::from(shm.split(' ').next().unwrap());
    assert!(
        shm.starts_with("/dev/shm") && seen.contains(&format!("{}/", shm.display())),
        "{shm:?} {seen}"
    );
    assert!(!shm.exists(), "{shm:?} left behind");

    // Without --keep nothing at all is left.
    fs::remove_dir_all(build.out()).unwrap();
    let out = build.replay(&["--modes=reuse,reuse-inmemory,reuse-shm", "--runs=2"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!build.out().exists());
}

#[test]
fn reuse_modes_build_what_bazel_would() {
    let build = Build::new();
    let modes = "--modes=reuse,reuse-shm,reuse-inmemory";
    let out = build.replay(&[modes, "--jobs=2", "--runs=2"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    for mode in ["reuse", "reuse-shm", "reuse-inmemory"] {
        for run in [1, 2] {
            assert!(
                text.contains(&format!(
                    "{mode} run {run}: 3/3 actions ok, 4 outputs compared, 0 mismatches"
                )),
                "{text}"
            );
        }
        let [setup, run, collect, teardown] = steps_of(&text, mode);
        assert!(
            setup > 0.0 && run > 0.0 && collect > 0.0 && teardown > 0.0,
            "{text}"
        );
    }
    // Runfiles trees, param files, an empty tree artifact.
    let real = RealBuild::new();
    let out = real.build.replay(&[modes, "--jobs=1"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    for mode in ["reuse", "reuse-shm", "reuse-inmemory"] {
        assert!(
            text.contains(&format!(
                "{mode} run 1: 4/4 actions ok, 3 outputs compared, 0 mismatches"
            )),
            "{text}"
        );
        // The second rtool action takes the first's stash and keeps its
        // links, runfiles ones too (in memory, the stash may still be in
        // the lister's hands when it looks, as in Bazel).
        if mode != "reuse-inmemory" {
            let [from_stash, _, kept, ..] = reuse_counts(&text, mode, 1);
            assert!(from_stash == 3 && kept >= 5, "{mode}: {text}");
        }
    }
    assert!(!real.build.out().exists());
}

#[test]
fn jail_linux_sandbox_runs_reuse_with_bazel_9s_hermetic_tmp() {
    if !require(&[Need::Mount, Need::LinuxSandbox]) {
        return;
    }
    let mut build = Build::new();
    let name = format!("actionfs-hermetic-{}", std::process::id());
    build.spawns[0]["commandArgs"] = json!([
        "/bin/sh",
        "-c",
        format!("touch /tmp/{name} && test -w /dev/shm && cat src/a.txt src/b.txt > bazel-out/bin/ab.txt")
    ]);
    let jail = format!(
        "--jail=linux-sandbox={}",
        actionfs_testkit::tier::linux_sandbox().display()
    );
    let out = build.replay(&["--modes=reuse,reuse-inmemory", &jail]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    for mode in ["reuse", "reuse-inmemory"] {
        assert!(
            text.contains(&format!(
                "{mode} run 1: 3/3 actions ok, 4 outputs compared, 0 mismatches"
            )) && !text.contains("no hermetic /tmp"),
            "{text}"
        );
    }
    // /tmp was the sandbox's own.
    assert!(!Path::new("/tmp").join(&name).exists());
    assert!(!build.out().exists());

    // Jailed: writing outside fails.
    let (build, outside_dir, _) = escaping_build();
    let out = build.replay(&["--modes=reuse", &jail]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text.contains("FAILED reuse run 1: #1") && text.contains("Read-only file system"),
        "{text}"
    );
    assert!(!outside_dir.path().join("written").exists());
}

#[test]
fn jail_landlock_wraps_reuse_actions() {
    if !require(&[Need::Landlock]) {
        return;
    }
    let (build, outside_dir, _) = escaping_build();
    let out = build.replay(&["--modes=reuse", "--jail=landlock"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text.contains("FAILED reuse run 1: #1") && text.contains(landlock_refusal()),
        "{text}"
    );
    assert!(!outside_dir.path().join("written").exists());
}
