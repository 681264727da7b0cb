//! The control socket (`--control`), `actionfs ctl`, the access log and
//! record/replay, driven through the real binary and a real mount.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;
use serde_json::{json, Value};

fn socket(fx: &Fixture) -> PathBuf {
    fx.path("control.sock")
}

fn ctl(fx: &Fixture, args: &[&str]) -> Output {
    let control = format!("--control={}", socket(fx).display());
    Command::new(bin())
        .arg("ctl")
        .arg(&control)
        .args(args)
        .output()
        .unwrap()
}

fn ctl_json(fx: &Fixture, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = ctl(fx, &all);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ctl {args:?}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Sends raw bytes on a connection and reads `answers` answer lines.
fn exchange(stream: &UnixStream, bytes: &[u8], answers: usize) -> Vec<Value> {
    (&*stream).write_all(bytes).unwrap();
    let mut reader = BufReader::new(stream);
    (0..answers)
        .map(|_| {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
        })
        .collect()
}

fn ids(list: &Value) -> Vec<String> {
    list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Ten inputs under `src/`, mapped at `/ws/inN` beside a writable `/ws`.
fn ten_inputs(fx: &Fixture) -> Vec<String> {
    let mut maps = vec![format!("rw:/ws:{}", fx.path("out").display())];
    fs::create_dir_all(fx.path("out")).unwrap();
    for i in 0..10 {
        let src = fx.write(&format!("src/in{i}"), &format!("input {i}"));
        maps.push(format!("ro:/ws/in{i}:{}", src.display()));
    }
    maps
}

fn create_args(id: &str, maps: &[String]) -> Vec<String> {
    let mut args = vec!["create".to_owned(), id.to_owned()];
    for map in maps {
        args.push("--map".to_owned());
        args.push(map.clone());
    }
    args
}

fn start_with_control(fx: &Fixture, extra: &[&str]) -> Daemon {
    let control = format!("--control={}", socket(fx).display());
    let mut args = vec![control.as_str()];
    args.extend_from_slice(extra);
    fx.start_logged(&args, "info")
}

#[test]
fn every_ctl_verb_works_by_hand() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let log = fx.path("access.jsonl");
    let access_log = format!("--access_log={}", log.display());
    let d = start_with_control(&fx, &[&access_log]);
    let maps = ten_inputs(&fx);
    let args = create_args("by-hand", &maps);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ctl(&fx, &args);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "created by-hand\n");
    assert_eq!(
        fs::read_to_string(d.path("by-hand/ws/in7")).unwrap(),
        "input 7"
    );

    // From a spec file as on the wire, its id replaced.
    let spec = fx.path("spec.json");
    let input = fx.path("src/in0");
    fs::write(
        &spec,
        json!({"C": {"i": "ignored", "m": [{"p": "/x", "u": input}]}}).to_string(),
    )
    .unwrap();
    let out = ctl(
        &fx,
        &["create", "from-spec", "--spec", spec.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        fs::read_to_string(d.path("from-spec/x")).unwrap(),
        "input 0"
    );

    let list = ctl_json(&fx, &["list"]);
    assert_eq!(ids(&list), ["by-hand", "empty", "from-spec"], "{list}");
    let by_hand = &list["sandboxes"][0];
    assert_eq!(
        (by_hand["kind"].as_str(), by_hand["mappings"].as_u64()),
        (Some("fuse"), Some(11))
    );
    let human = String::from_utf8(ctl(&fx, &["list"]).stdout).unwrap();
    assert!(
        human
            .lines()
            .any(|l| l.starts_with("by-hand") && l.contains("fuse")),
        "{human}"
    );

    let stats = ctl_json(&fx, &["stats"]);
    assert_eq!(stats["stats"]["live"]["sandboxes"], 3, "{stats}");
    assert!(
        stats["stats"]["fuse"]["lookup"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert!(stats["stats"]["requests"]["create"].is_object(), "{stats}");

    let accessed = ctl_json(&fx, &["accessed", "by-hand"]);
    assert_eq!(
        accessed["inputs"].as_array().unwrap().len(),
        10,
        "{accessed}"
    );
    let human = String::from_utf8(ctl(&fx, &["accessed", "by-hand"]).stdout).unwrap();
    assert!(
        human.contains("10 inputs: 1 read, 0 looked up only, 9 untouched"),
        "{human}"
    );

    for id in ["by-hand", "from-spec"] {
        let out = ctl(&fx, &["destroy", id]);
        assert!(out.status.success(), "{out:?}");
    }
    // An error the daemon answers: exit 1, the message on stderr.
    let out = ctl(&fx, &["destroy", "by-hand"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not exist"),
        "{out:?}"
    );
    assert_eq!(ids(&ctl_json(&fx, &["list"])), ["empty"]);
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(!socket(&fx).exists(), "the socket is removed at exit");
}

/// `--json` and `--control` go anywhere on the `ctl` line, and `ctl stats`
/// prints a table for people: the opcodes sent, and no row for the others.
#[test]
fn ctl_flags_follow_the_verb_and_stats_is_a_table() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = start_with_control(&fx, &["--access_log=/dev/null"]);
    let control = format!("--control={}", socket(&fx).display());
    let run = |args: &[&str]| Command::new(bin()).arg("ctl").args(args).output().unwrap();
    let maps = ten_inputs(&fx);
    let mut args = create_args("late-flags", &maps);
    args.push(control.clone());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&args);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        fs::read_to_string(d.path("late-flags/ws/in3")).unwrap(),
        "input 3"
    );
    for args in [
        ["accessed", "late-flags", "--json", &control],
        ["accessed", "--json", "late-flags", &control],
        ["--json", "accessed", &control, "late-flags"],
    ] {
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let answer: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {out:?}"));
        assert_eq!(answer["inputs"].as_array().unwrap().len(), 10, "{answer}");
    }

    let out = run(&["stats", &control]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    // Counters only grow, so an opcode at zero afterwards was never sent.
    let after = run(&["stats", "--json", &control]);
    let stats: Value = serde_json::from_slice(&after.stdout).unwrap();
    let stats = &stats["stats"];
    assert!(
        table.starts_with(&format!("sandboxes  {} now", stats["live"]["sandboxes"])),
        "{table}"
    );
    assert!(table.contains("RSS "), "{table}");
    let create = table.lines().find(|l| l.starts_with("create")).unwrap();
    assert_eq!(create.split_whitespace().nth(1), Some("2"), "{table}");
    let rows: Vec<(&str, u64)> = table
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(|l| {
            let mut words = l.split_whitespace();
            (
                words.next().unwrap(),
                words.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert!(rows.iter().any(|(op, _)| *op == "lookup"), "{table}");
    for (op, n) in &rows {
        assert!(*n > 0, "{table}");
        assert!(stats["fuse"][op].as_u64().unwrap() >= *n, "{op}: {stats}");
    }
    for (op, n) in stats["fuse"].as_object().unwrap() {
        if n == 0 {
            assert!(
                !rows.iter().any(|(row, _)| row == op),
                "{op} unsent: {table}"
            );
        }
    }
    assert_eq!(stats["fuse"]["write"], 0, "nothing was written: {stats}");
    assert!(!table.contains("{"), "not JSON: {table}");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

/// The access log is exact: an action that reads 3 of 10 inputs and
/// stats one more is reported as such, in both open modes.
#[test]
fn the_access_log_says_exactly_what_was_read_looked_up_and_untouched() {
    if !require(&[Need::Mount]) {
        return;
    }
    for mode in ["--zero_message_opens=on", "--zero_message_opens=off"] {
        let fx = Fixture::new();
        let log = fx.path("access.jsonl");
        let access_log = format!("--access_log={}", log.display());
        let d = start_with_control(&fx, &[&access_log, mode]);
        let maps = ten_inputs(&fx);
        // Two sandboxes of the same inputs, one after the other, as Bazel
        // runs actions, both reading in1: what the first left cached must
        // not hide the second's read, nor count for it.
        for (id, reads) in [("first", [1, 4, 7]), ("second", [1, 2, 9])] {
            let args = create_args(id, &maps);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            assert!(ctl(&fx, &args).status.success());
            let ws = d.path(&format!("{id}/ws"));
            let mut cat = Command::new("cat");
            for i in reads {
                cat.arg(ws.join(format!("in{i}")));
            }
            assert!(cat.output().unwrap().status.success());
            assert!(Command::new("stat")
                .arg(ws.join("in5"))
                .output()
                .unwrap()
                .status
                .success());
            assert!(ctl(&fx, &["destroy", id]).status.success());
        }
        assert_eq!(d.terminate(), BY_SIGTERM);
        let lines: Vec<Value> = fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let expect = |id: &str, read: [u32; 3]| {
            let read: Vec<String> = read.iter().map(|i| format!("/ws/in{i}")).collect();
            let untouched: Vec<String> = (0..10)
                .filter(|i| *i != 5 && !read.contains(&format!("/ws/in{i}")))
                .map(|i| format!("/ws/in{i}"))
                .collect();
            json!({"id": id, "declared": 10, "read": read,
                   "lookup_only": ["/ws/in5"], "untouched": untouched})
        };
        assert_eq!(
            lines,
            [expect("first", [1, 4, 7]), expect("second", [1, 2, 9])],
            "{mode}"
        );
    }
}

#[test]
fn two_clients_at_once_bad_json_and_a_client_gone_mid_request() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = start_with_control(&fx, &[]);
    let input = fx.write("src/a", "a");
    let first = UnixStream::connect(socket(&fx)).unwrap();
    let second = UnixStream::connect(socket(&fx)).unwrap();
    let create = |id: &str| json!({"C": {"i": id, "m": [{"p": "/a", "u": input}]}}).to_string();
    // Both connections open at once, each with requests in turn.
    let a = exchange(&first, create("one").as_bytes(), 1);
    let b = exchange(&second, create("two").as_bytes(), 1);
    assert_eq!(
        (a[0]["error"].clone(), b[0]["error"].clone()),
        (Value::Null, Value::Null)
    );
    let both = exchange(&first, br#"{"List":null}"#, 1);
    assert_eq!(ids(&both[0]), ["empty", "one", "two"]);

    // Malformed JSON and an unknown request: errors, and the same
    // connection keeps working.
    let answers = exchange(&second, br#"{"List":nul}{"Frobnicate":1}{"List":null}"#, 3);
    assert!(
        answers[0]["error"].as_str().unwrap().contains("malformed"),
        "{answers:?}"
    );
    assert!(
        answers[1]["error"]
            .as_str()
            .unwrap()
            .contains("expected CreateSandbox"),
        "{answers:?}"
    );
    assert_eq!(ids(&answers[2]), ["empty", "one", "two"]);

    // Half a request, then the client is gone: nothing is made.
    {
        let gone = UnixStream::connect(socket(&fx)).unwrap();
        let whole = create("half");
        (&gone)
            .write_all(&whole.as_bytes()[..whole.len() / 2])
            .unwrap();
    }
    let after = exchange(&first, br#"{"List":null}"#, 1);
    assert_eq!(ids(&after[0]), ["empty", "one", "two"]);
    assert!(!d.path("half").exists());
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn another_user_is_refused_even_where_the_socket_mode_lets_it_connect() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let fx = Fixture::new();
    let d = start_with_control(&fx, &[]);
    let mode = fs::metadata(socket(&fx)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Open the way for the test user, so that only the peer check is left.
    fs::set_permissions(fx.path(""), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(socket(&fx), fs::Permissions::from_mode(0o666)).unwrap();
    let control = format!("--control={}", socket(&fx).display());
    let out = as_nobody(&[bin(), "ctl", &control, "--json", "list"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let answer: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(error.contains("refused a client of uid 65534"), "{answer}");
    assert!(answer.get("sandboxes").is_none());
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(
        fx.log().contains("refused a client of uid 65534"),
        "{}",
        fx.log()
    );
}

#[test]
fn a_stale_socket_is_replaced_and_one_in_use_is_refused() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    // A socket nobody answers on, as a killed daemon leaves it.
    drop(std::os::unix::net::UnixListener::bind(socket(&fx)).unwrap());
    let d = start_with_control(&fx, &[]);
    assert_eq!(ids(&ctl_json(&fx, &["list"])), ["empty"]);
    // A second daemon on the same socket fails to start and leaves it.
    let other = Fixture::new();
    let control = format!("--control={}", socket(&fx).display());
    let out = other.command(&[&control]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        other.log().contains("another daemon is serving on it"),
        "{}",
        other.log()
    );
    assert!(!is_mounted(&other.mnt()), "the refused daemon left a mount");
    assert_eq!(ids(&ctl_json(&fx, &["list"])), ["empty"]);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

fn replay(fx: &Fixture, file: &Path, extra: &[&str]) -> Output {
    let mnt = fx.path("replay-mnt");
    fs::create_dir_all(&mnt).unwrap();
    Command::new(bin())
        .arg("replay")
        .args(extra)
        .arg(file)
        .arg(&mnt)
        .args(["--", "--native_below=0"])
        .output()
        .unwrap()
}

#[test]
fn a_recorded_stream_replays_against_a_fresh_daemon() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let recording = fx.path("stream.jsonl");
    let record = format!("--record={}", recording.display());
    let d = fx.start(&[&record]);
    let input = fx.write("src/a", "a");
    for i in 0..5 {
        d.create(sandbox(&format!("s{i}"), vec![ro("/a", &input)]));
    }
    // A refused request is recorded with its answer, and replays as one.
    let refused = d.client().create(&sandbox("s0", vec![ro("/a", &input)]));
    assert!(refused.is_err());
    for i in 0..5 {
        d.destroy(&format!("s{i}"));
    }
    assert_eq!(d.terminate(), BY_SIGTERM);
    let lines = fs::read_to_string(&recording).unwrap();
    assert_eq!(lines.matches("\"request\"").count(), 12, "{lines}");
    assert_eq!(lines.matches("\"answer\"").count(), 12, "{lines}");

    let out = replay(&fx, &recording, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("replayed 11 requests"), "{stdout}");
    assert!(stdout.contains("create   n=6"), "{stdout}");
    assert!(stdout.contains("destroy  n=5"), "{stdout}");
    assert!(
        stdout.contains("failed: 1, answers differing from the recording: 0"),
        "{stdout}"
    );
    assert!(!is_mounted(&fx.path("replay-mnt")));
}

#[test]
fn the_recorded_bazel_streams_replay() {
    if !require(&[Need::Mount]) || !traces::available() {
        return;
    }
    let fx = Fixture::new();
    let trace = traces::traces_dir().join("mixed-linuxsandbox-mapsymlinks.requests.json");
    let root = fx.path("trace-root");
    let populate = format!("--populate={}", root.display());
    let out = replay(&fx, &trace, &[&populate]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("failed: 0"), "{stdout}");
}

/// Every FUSE request is timed: after real opens, reads, stats, listings
/// and writes through the mount, each opcode the daemon was sent has
/// service-time figures over exactly its requests (the counts at exit,
/// when nothing is in flight), with p50 <= p90 <= p99 <= max, and `ctl
/// stats` prints them on each opcode's row.
#[test]
fn every_opcode_sent_has_its_service_times_in_the_stats() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    // Data served by the daemon, so that READ and WRITE reach it.
    let d = start_with_control(&fx, &["--passthrough=off", "--zero_message_opens=off"]);
    let maps = ten_inputs(&fx);
    let args = create_args("timed", &maps);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(ctl(&fx, &args).status.success());
    for i in 0..10 {
        let path = d.path(&format!("timed/ws/in{i}"));
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("input {i}"));
        assert_eq!(fs::metadata(&path).unwrap().len(), 7);
    }
    let listed = fs::read_dir(d.path("timed/ws")).unwrap().count();
    assert_eq!(listed, 10);
    fs::write(d.path("timed/ws/out"), "written").unwrap();
    assert_eq!(fs::read_to_string(fx.path("out/out")).unwrap(), "written");

    let out = ctl(&fx, &["stats"]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    let header = table.lines().find(|l| l.starts_with("opcode")).unwrap();
    assert_eq!(
        header
            .split("   (")
            .next()
            .unwrap()
            .split_whitespace()
            .count(),
        12,
        "opcode, count and 5 columns of 'X us': {header}"
    );
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.iter().any(|r| r[0] == "read"), "{table}");
    for row in &rows {
        assert_eq!(row.len(), 7, "{table}");
        // A request counted but not answered yet when asked has none.
        if row[2] != "-" {
            let us: Vec<f64> = row[2..].iter().map(|c| c.parse().unwrap()).collect();
            assert!(
                us[1] <= us[2] && us[2] <= us[3] && us[3] <= us[4],
                "{row:?}"
            );
        }
    }
    d.destroy("timed");
    assert_eq!(d.terminate(), BY_SIGTERM);

    let stats = fx.stats_at_exit();
    let latency = stats["fuse_latency_us"].as_object().expect("latencies");
    for op in [
        "lookup",
        "getattr",
        "open",
        "read",
        "release",
        "opendir",
        "readdir",
        "releasedir",
        "create",
        "write",
    ] {
        assert!(fuse_requests(&stats, op) > 0, "{op} was sent: {stats}");
    }
    for (op, n) in stats["fuse"].as_object().unwrap() {
        let n = n.as_u64().unwrap();
        let Some(l) = latency.get(op) else {
            assert_eq!(n, 0, "{op} was sent but not timed: {stats}");
            continue;
        };
        assert_eq!(l["count"].as_u64(), Some(n), "{op}: {stats}");
        let us = |key: &str| l[key].as_f64().unwrap();
        assert!(us("mean") > 0.0, "{op}: {l}");
        assert!(
            us("p50") <= us("p90") && us("p90") <= us("p99") && us("p99") <= us("max"),
            "{op}: {l}"
        );
        assert!(us("mean") <= us("max"), "{op}: {l}");
    }
    assert_eq!(
        latency.len(),
        stats["fuse"]
            .as_object()
            .unwrap()
            .values()
            .filter(|n| *n != 0)
            .count()
    );
}
