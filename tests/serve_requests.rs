//! `actionfs serve`'s request stream as a whole: Negotiate and its options
//! (refused by name, the default sandbox base, a failed start), hundreds
//! of requests in flight answered in any order, a Destroy sent before its
//! Create is answered, stdin closed with requests in flight, a corrupt
//! frame, and bad input answered with an error while the backend keeps
//! serving.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use actionfs_protocol::backend::digest::{digest_of, sha256_hex};
use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::sandbox::{
    self, collect, create, destroy, negotiate, Manifest, Push,
};
use actionfs_protocol::backend::tree::TreeBuilder;
use actionfs_testkit::backend::{assert_nothing_left, Backend, WS};
use actionfs_testkit::serve::{ServeProcess, BACKEND_DIR_PREFIX, LOGGED};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::{bin, mounts, mounts_below, proc_state, transport, wait_for};
use prost::Message;

#[test]
fn bad_input_gets_an_error_and_the_backend_keeps_serving() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let good = {
        let mut tb = TreeBuilder::new();
        tb.add_file("ws/f", b.write_input("f", b"f"), false)
            .unwrap();
        tb.build()
    };
    b.push_tree(&good);

    // A directory blob whose bytes do not hash to its key.
    let wrong = reapi::Directory {
        files: vec![],
        directories: vec![reapi::DirectoryNode {
            name: "ws".into(),
            digest: Some(good.root.clone()),
        }],
        symlinks: vec![],
        node_properties: None,
    };
    let lying_hash = sha256_hex(b"not these bytes");
    b.client()
        .push(Push {
            blobs: [(lying_hash.clone(), wrong.encode_to_vec())].into(),
            content: HashMap::new(),
        })
        .unwrap();
    let mut lying = b.manifest(&good, &[]);
    lying.input_root_digest = Some(reapi::Digest {
        hash: lying_hash,
        size_bytes: 1,
    });
    let err = b.create_error("lying", lying);
    assert!(err.contains("hash"), "{err}");

    // Entry names that are not one path component, or repeat.
    let file = |name: &str| reapi::FileNode {
        name: name.into(),
        digest: Some(digest_of(b"f")),
        is_executable: false,
        node_properties: None,
    };
    for (what, files) in [
        ("empty", vec![file("")]),
        ("dot", vec![file(".")]),
        ("dotdot", vec![file("..")]),
        ("slash", vec![file("a/b")]),
        ("nul", vec![file("a\0b")]),
        ("repeat", vec![file("a"), file("a")]),
    ] {
        let ws = reapi::Directory {
            files,
            ..Default::default()
        };
        let ws_bytes = ws.encode_to_vec();
        let top = reapi::Directory {
            directories: vec![reapi::DirectoryNode {
                name: WS.into(),
                digest: Some(digest_of(&ws_bytes)),
            }],
            ..Default::default()
        };
        let top_bytes = top.encode_to_vec();
        b.client()
            .push(Push {
                blobs: [
                    (sha256_hex(&ws_bytes), ws_bytes),
                    (sha256_hex(&top_bytes), top_bytes.clone()),
                ]
                .into(),
                content: HashMap::new(),
            })
            .unwrap();
        let mut manifest = b.manifest(&good, &[]);
        manifest.input_root_digest = Some(digest_of(&top_bytes));
        let err = b.create_error(what, manifest);
        assert!(err.contains("name"), "{what}: {err}");
    }

    // Output keys outside the workspace or through "..".
    for key in ["/elsewhere/x", "/ws/../x", "ws/x", "/ws/a/../../x"] {
        let err = b.create_error("out", b.manifest(&good, &[(key, "file")]));
        assert!(err.contains(key), "{key}: {err}");
    }
    // Outputs where the input tree has a file, or below one.
    for key in ["/ws/f", "/ws/f/below"] {
        let err = b.create_error("out", b.manifest(&good, &[(key, "file")]));
        assert!(err.contains("as a file or symlink"), "{key}: {err}");
    }
    // Another hash function.
    let mut md5 = b.manifest(&good, &[]);
    md5.hash_function = "MD5".into();
    assert!(b.create_error("md5", md5).contains("MD5"));

    // A create for an id that exists; collect and destroy of unknown ids.
    b.create_ok("1", b.manifest(&good, &[]));
    assert!(b
        .create_error("1", b.manifest(&good, &[]))
        .contains("already exists"));
    match b.client().collect("nope", "/tmp").unwrap().outcome {
        Some(collect::result::Outcome::Error(e)) => assert!(e.message.contains("nope")),
        other => panic!("collect of an unknown id: {other:?}"),
    }
    match b.client().destroy("nope").unwrap().outcome {
        Some(destroy::result::Outcome::Error(e)) => assert!(e.message.contains("nope")),
        other => panic!("destroy of an unknown id: {other:?}"),
    }
    // Nothing half-made: every refused id can be created afresh now.
    for id in ["lying", "empty", "dot", "out", "md5"] {
        b.create_ok(id, b.manifest(&good, &[]));
        b.destroy_ok(id);
    }
    b.destroy_ok("1");
    // Scratch directories leave after the Destroy's answer (departures).
    let scratch_left = || -> Vec<PathBuf> {
        fs::read_dir(b.base())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                path.file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with(BACKEND_DIR_PREFIX))
            })
            .flat_map(|backend| fs::read_dir(backend.join("scratch")).unwrap())
            .map(|entry| entry.unwrap().path())
            .collect()
    };
    assert!(
        wait_for(Duration::from_secs(10), || scratch_left().is_empty()),
        "{:?}",
        scratch_left()
    );
    b.close();
}

/// The message of the Error that Negotiate of `options` is answered
/// with; panics on any other answer.
fn negotiate_refused(serve: &ServeProcess, options: Vec<String>) -> String {
    let answer = serve.client().negotiate(options.clone()).unwrap();
    match answer.outcome {
        Some(negotiate::result::Outcome::Error(e)) => e.message,
        other => panic!("negotiate {options:?}: {other:?}"),
    }
}

#[test]
fn an_unknown_option_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let mut serve = ServeProcess::spawn(bin(), Path::new("/nonexistent/ws"), None, LOGGED);
    let why = negotiate_refused(
        &serve,
        vec![
            format!("--sandbox_base={}", root.path().display()),
            "--frobnicate=3".into(),
        ],
    );
    assert!(why.contains("--frobnicate"), "{why}");
    let _ = serve.close_input();
    let status = serve.wait();
    assert!(!status.success());
    assert!(fs::read_dir(root.path()).unwrap().next().is_none());
}

/// A Create that cannot finish until the test lets it: its one input's
/// default place is in the mount of another daemon (the sandboxfs front
/// end, a real FUSE server) that the test stops with SIGSTOP, so the
/// backend's look at that place waits in the kernel until
/// [`Held::release`]. No timing: the wait ends only when released.
struct Held {
    daemon: actionfs_testkit::Daemon,
    _fx: actionfs_testkit::Fixture,
    manifest: Manifest,
    stopped: bool,
}

impl Held {
    fn new(b: &Backend) -> Held {
        use actionfs_testkit::{ro, sandbox, Fixture};
        let fx = Fixture::new();
        let file = fx.write("src/f", "held\n");
        let daemon = fx.start(&[]);
        daemon.create(sandbox("x", vec![ro("/ws/f", &file)]));
        let tree = b.push_files([("ws/f", digest_of(b"held\n"))]);
        let mut manifest = b.manifest(&tree, &[]);
        // Nothing has looked below x yet: the first lookup must be asked.
        manifest.exec_root = daemon.path("x").display().to_string();
        let mut held = Held {
            daemon,
            _fx: fx,
            manifest,
            stopped: false,
        };
        held.signal(libc::SIGSTOP);
        held
    }

    fn signal(&mut self, signal: libc::c_int) {
        let pid = self.daemon.client().pid() as libc::pid_t;
        // SAFETY: kill with a valid signal number has no memory effects.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        self.stopped = signal == libc::SIGSTOP;
        // kill returns before the stop: one thread takes the signal and
        // stops the others only when it next runs, and on a busy machine
        // the FUSE threads went on answering for that long (a held Create
        // read its input in 11 of 100 loaded runs).
        if self.stopped {
            assert!(
                wait_for(Duration::from_secs(60), || every_thread_stopped(pid)),
                "the daemon's threads did not all stop"
            );
        }
    }

    fn release(&mut self) {
        self.signal(libc::SIGCONT);
    }

    fn send(&self, b: &Backend, id: &str) -> std::sync::mpsc::Receiver<Answer> {
        b.send_create(id, self.manifest.clone())
    }
}

impl Drop for Held {
    /// Never leaves a stopped daemon (nor a backend waiting on it) behind
    /// a failed test.
    fn drop(&mut self) {
        if self.stopped {
            self.release();
        }
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in
/// /proc/PID/task/TID/stat, after the parenthesised name).
fn every_thread_stopped(pid: libc::pid_t) -> bool {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .map(|task| task.unwrap().path().join("stat"))
        .all(|stat| proc_state(&stat) == Some('T'))
}

type Answer = actionfs_protocol::backend::client::Answer;

/// The path of a Create's Ok answer; panics on anything else.
fn created(id: &str, answer: Answer) -> PathBuf {
    match answer.unwrap().result {
        Some(sandbox::response::Result::Create(create::Result {
            outcome: Some(create::result::Outcome::Ok(ok)),
        })) => {
            assert!(ok.path.ends_with(id), "{} for {id}", ok.path);
            PathBuf::from(ok.path)
        }
        other => panic!("{id}: {other:?}"),
    }
}

fn still_due(answer: &std::sync::mpsc::Receiver<Answer>) -> bool {
    matches!(answer.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty))
}

#[test]
fn hundreds_of_requests_in_flight_are_answered_in_any_order() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let mut tb = TreeBuilder::new();
    for n in 0..20 {
        tb.add_file(
            &format!("ws/d{}/f{n}", n % 4),
            b.write_input(&format!("d{}/f{n}", n % 4), format!("{n}").as_bytes()),
            false,
        )
        .unwrap();
    }
    let tree = tb.build();
    b.push_tree(&tree);
    // The first request cannot finish until released; a backend that
    // answers in request order answers none of the others before it.
    let mut held = Held::new(&b);
    let first = held.send(&b, "held");
    let ids: Vec<String> = (0..300).map(|n| format!("s{n}")).collect();
    let pending: Vec<_> = ids
        .iter()
        .map(|id| {
            b.client()
                .send(
                    id,
                    sandbox::request::Op::Create(sandbox::Create {
                        manifest: Some(b.manifest(&tree, &[])),
                    }),
                )
                .unwrap()
        })
        .collect();
    let mut answers: Vec<Option<Answer>> = (0..ids.len()).map(|_| None).collect();
    let overtook = wait_for(Duration::from_secs(60), || {
        for (slot, answer) in answers.iter_mut().zip(&pending) {
            if slot.is_none() {
                *slot = answer.try_recv().ok();
            }
        }
        answers.iter().any(Option::is_some)
    });
    assert!(
        overtook,
        "no later request was answered while the first one waited: answers in request order\n{}",
        b.log()
    );
    if let Ok(answer) = first.try_recv() {
        panic!(
            "the held Create was answered before it could read its input: {answer:?}\n{}",
            b.log()
        );
    }
    assert!(still_due(&first), "the held Create's answer was lost");
    let overtaking = answers.iter().filter(|a| a.is_some()).count();
    held.release();
    let root = created("held", first.recv().unwrap());
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), b"held\n");
    for ((id, slot), answer) in ids.iter().zip(answers).zip(pending) {
        created(id, slot.unwrap_or_else(|| answer.recv().unwrap()));
    }
    eprintln!(
        "{overtaking} of {} answered while the first waited",
        ids.len()
    );
    let pending: Vec<_> = ids
        .iter()
        .chain([&"held".to_owned()])
        .map(|id| {
            b.client()
                .send(id, sandbox::request::Op::Destroy(sandbox::Destroy {}))
                .unwrap()
        })
        .collect();
    for answer in pending {
        assert!(matches!(
            answer.recv().unwrap().unwrap().result,
            Some(sandbox::response::Result::Destroy(destroy::Result {
                outcome: Some(destroy::result::Outcome::Ok(_))
            }))
        ));
    }
    b.close();
}

/// A Destroy is applied on the request reader when nothing of its
/// sandbox is queued; one sent while its sandbox's Create is still being
/// applied must wait for it, not answer "no such sandbox".
#[test]
fn a_destroy_sent_before_its_create_is_answered_applies_after_it() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let mut held = Held::new(&b);
    let create = held.send(&b, "held");
    let destroy = b
        .client()
        .send("held", sandbox::request::Op::Destroy(sandbox::Destroy {}))
        .unwrap();
    // A second Negotiate, which the reader answers itself, in order: the
    // Destroy before it was read, and not answered on the way.
    let again = b
        .client()
        .send(
            "",
            sandbox::request::Op::Negotiate(sandbox::Negotiate {
                options: Vec::new(),
                versions: vec![sandbox::Version::Version1 as i32],
            }),
        )
        .unwrap();
    assert!(
        matches!(
            again.recv().unwrap().unwrap().result,
            Some(sandbox::response::Result::Negotiate(_))
        ),
        "{}",
        b.log()
    );
    assert!(still_due(&create), "the held Create was answered");
    assert!(still_due(&destroy), "the Destroy overtook its Create");
    held.release();
    created("held", create.recv().unwrap());
    match destroy.recv().unwrap().unwrap().result {
        Some(sandbox::response::Result::Destroy(destroy::Result {
            outcome: Some(destroy::result::Outcome::Ok(_)),
        })) => {}
        other => panic!("the Destroy after its Create: {other:?}\n{}", b.log()),
    }
    b.close();
}

#[test]
fn closing_stdin_with_requests_in_flight_answers_them_and_removes_everything() {
    if !require(&[Need::Mount]) {
        return;
    }
    let mut b = Backend::start(&[]);
    let tree = b.push_files([("ws/f", b.write_input("f", b"f"))]);
    // In flight for sure when stdin closes: the held Create cannot finish
    // until released, after the close, nor can those queued behind it.
    let mut held = Held::new(&b);
    let first = held.send(&b, "held");
    let pending: Vec<_> = (0..50)
        .map(|n| b.send_create(&format!("s{n}"), b.manifest(&tree, &[("/ws/o", "file")])))
        .collect();
    let client = b.take_client();
    let closing = std::thread::spawn(move || client.close());
    assert!(still_due(&first), "answered before its input could be read");
    let running = b.try_wait();
    assert!(
        running.is_none(),
        "the backend ended with a Create in flight: {running:?}"
    );
    held.release();
    closing
        .join()
        .unwrap()
        .expect("the backend's output kept to the protocol");
    let status = b.wait();
    assert!(status.success(), "exit {status:?}\n{}", b.log());
    // Every request read before the end was answered, the held one too.
    created("held", first.recv().unwrap());
    for (n, answer) in pending.into_iter().enumerate() {
        created(&format!("s{n}"), answer.recv().unwrap());
    }
    assert_nothing_left(b.base(), &b.log());
}

/// A frame that cannot be decoded ends the backend with one line on
/// stderr, a non-zero status and nothing mounted.
#[test]
fn a_corrupt_frame_ends_the_backend_with_nothing_mounted() {
    if !require(&[Need::Mount]) {
        return;
    }
    let cases: [(&str, Vec<u8>); 3] = [
        ("bad varint", vec![0xff; 11]),
        ("length past the bound", vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
        ("truncated", vec![0x20, 0x08, 0x01]),
    ];
    for (what, bytes) in cases {
        let root = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin())
            .args(["serve", "--workspace", "/nonexistent/ws"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let negotiate = sandbox::Request {
            rid: 1,
            sandbox_id: String::new(),
            op: Some(sandbox::request::Op::Negotiate(sandbox::Negotiate {
                options: vec![format!("--sandbox_base={}", root.path().display())],
                versions: vec![0],
            })),
        };
        stdin
            .write_all(&negotiate.encode_length_delimited_to_vec())
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let answer: sandbox::Response =
            actionfs_protocol::backend::frame::read_frame(&mut stdout, 1 << 20)
                .unwrap()
                .unwrap();
        assert!(answer.result.is_some());
        stdin.write_all(&bytes).unwrap();
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        assert!(!output.status.success(), "{what}: exit 0");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            stderr
                .trim_end()
                .lines()
                .filter(|l| l.contains("frame"))
                .count(),
            1,
            "{what}: {stderr}"
        );
        let mounts = mounts_below(root.path());
        assert!(mounts.is_empty(), "{what}: {mounts:?}");
        assert!(
            fs::read_dir(root.path()).unwrap().next().is_none(),
            "{what}: left files"
        );
    }
}

/// Without --sandbox_base the backend works below /dev/shm where that is
/// tmpfs (measured faster), and leaves nothing there when it stops.
#[test]
fn the_default_sandbox_base_is_dev_shm_where_it_is_tmpfs() {
    if !require(&[Need::Mount]) {
        return;
    }
    let shm_is_tmpfs = mounts()
        .iter()
        .any(|mount| mount.point == Path::new("/dev/shm") && mount.fs_type == "tmpfs");
    let exec_root = tempfile::tempdir().unwrap();
    fs::create_dir_all(exec_root.path().join(WS)).unwrap();
    fs::write(exec_root.path().join("ws/f"), b"f").unwrap();
    let mut serve = ServeProcess::spawn(bin(), &exec_root.path().join(WS), None, LOGGED);
    let client = serve.client();
    // Nothing handed on: a test leaves nothing in /dev/shm.
    let options: Vec<String> = transport()
        .map(|t| format!("--transport={t}"))
        .into_iter()
        .chain(["--keep_state=off".to_owned()])
        .collect();
    client.negotiate(options).unwrap();
    let mut tb = TreeBuilder::new();
    tb.add_file("ws/f", digest_of(b"f"), false).unwrap();
    let tree = tb.build();
    client.push(tree.to_push()).unwrap();
    let manifest = Manifest {
        exec_root: exec_root.path().display().to_string(),
        hash_function: "SHA-256".into(),
        input_root_digest: Some(tree.root.clone()),
        ..Default::default()
    };
    let Some(create::result::Outcome::Ok(ok)) = client.create("1", manifest).unwrap().outcome
    else {
        panic!("create failed");
    };
    // The backend's own directory on the base: the sandbox is its
    // `mnt/ID`, or its `native/links/ID` if built natively.
    let base = Path::new(&ok.path)
        .ancestors()
        .find(|dir| {
            dir.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with(BACKEND_DIR_PREFIX))
        })
        .unwrap_or_else(|| panic!("{} is not in a backend's directory", ok.path))
        .to_owned();
    let expected_parent = if shm_is_tmpfs {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    assert_eq!(base.parent().unwrap(), expected_parent, "{}", ok.path);
    assert_eq!(fs::read(Path::new(&ok.path).join("ws/f")).unwrap(), b"f");
    serve.close_input().unwrap();
    assert!(serve.wait().success());
    assert!(!base.exists(), "{base:?} outlived the backend");
}

/// A start that fails (here: the sandbox base does not exist) answers
/// Negotiate with an Error saying why, and exits 1 with nothing made.
#[test]
fn a_failed_start_answers_negotiate_with_the_reason() {
    let mut serve = ServeProcess::spawn(bin(), Path::new("/nonexistent/ws"), None, LOGGED);
    let why = negotiate_refused(&serve, vec!["--sandbox_base=/nonexistent/base".into()]);
    assert!(why.contains("/nonexistent/base"), "{why}");
    let _ = serve.close_input();
    assert_eq!(serve.wait().code(), Some(1));
}

#[test]
fn hard_linked_native_inputs_are_refused_at_negotiate() {
    if !require(&[Need::Mount]) {
        return;
    }
    for method in ["hardlink", "auto"] {
        let root = tempfile::tempdir().unwrap();
        let mut serve = ServeProcess::spawn(bin(), root.path(), None, LOGGED);
        let why = negotiate_refused(&serve, vec![format!("--native_method={method}")]);
        assert!(
            why.contains("--native_method")
                && why.contains(method)
                && why.contains("could change it"),
            "{why}"
        );
        let _ = serve.close_input();
        assert!(!serve.wait().success());
    }
}
