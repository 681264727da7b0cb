//! FUSE passthrough: with it, the kernel reads and writes the underlying
//! files itself and no READ or WRITE reaches the daemon; without the
//! privilege for it, the daemon says so once and serves data itself.
//!
//! Which requests reached the daemon is read from the counters it logs at
//! exit, which count them on either transport. (/dev/fuse is root-only on
//! the test machines, so the unprivileged case runs as root of a user
//! namespace rather than as another user.)

use std::fs;
use std::io::Write;
use std::process::Command;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

/// Kernel requests of `kind` (e.g. "read") the daemon counted.
fn requests_of(fx: &Fixture, kind: &str) -> u64 {
    fuse_requests(&fx.stats_at_exit(), kind)
}

/// Reads an input and writes, appends to and reads back an output through
/// the mount, checking every byte against the underlying files.
fn exercise(fx: &Fixture, d: &Daemon) {
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(fx.path("src/input"), &content).unwrap();
    d.create(sandbox(
        "s",
        vec![
            ro("/in", &fx.path("src/input")),
            rw("/out", &fx.path("scratch")),
        ],
    ));
    for _ in 0..2 {
        assert_eq!(fs::read(d.path("s/in")).unwrap(), content);
    }
    let out = d.path("s/out/result");
    fs::write(&out, &content[..1000]).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(&out)
        .unwrap()
        .write_all(b"tail")
        .unwrap();
    let mut expected = content[..1000].to_vec();
    expected.extend_from_slice(b"tail");
    assert_eq!(fs::read(fx.path("scratch/result")).unwrap(), expected);
    assert_eq!(fs::read(&out).unwrap(), expected);
    assert_eq!(fs::metadata(&out).unwrap().len(), 1004);
    // Read-only stays read-only whichever way data flows.
    assert_eq!(
        errno(fs::OpenOptions::new().write(true).open(d.path("s/in"))),
        libc::EPERM
    );
    d.destroy("s");
}

#[test]
fn with_passthrough_file_data_never_reaches_the_daemon() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start_logged(&["--zero_message_opens=off"], "debug");
    exercise(&fx, &d);
    assert_eq!(d.terminate(), BY_SIGTERM);
    let log = fx.log();
    assert!(log.contains("FUSE passthrough on"), "{log}");
    assert!(
        requests_of(&fx, "open") >= 2,
        "opens are still the daemon's"
    );
    assert_eq!(requests_of(&fx, "read"), 0, "reads went through the daemon");
    assert_eq!(
        requests_of(&fx, "write"),
        0,
        "writes went through the daemon"
    );
}

#[test]
fn small_inputs_are_served_from_the_page_cache_so_a_read_costs_no_getattr() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    // A compiler opens an input, reads it and fstats it. With passthrough
    // every read makes the kernel drop the cached atime, so each fstat was
    // a GETATTR round trip; a small input read from the page cache costs
    // one READ, once.
    let fx = Fixture::new();
    let small = "#include <stdio.h>\n".repeat(100);
    fs::write(fx.path("src/small.h"), &small).unwrap();
    let d = fx.start_logged(&["--zero_message_opens=off", "--ttl=60s"], "debug");
    d.create(sandbox("s", vec![ro("/small.h", &fx.path("src/small.h"))]));
    let path = d.path("s/small.h");
    let first = fs::metadata(&path).unwrap();
    for _ in 0..20 {
        let mut file = fs::File::open(&path).unwrap();
        let mut read = String::new();
        std::io::Read::read_to_string(&mut file, &mut read).unwrap();
        assert_eq!(read, small);
        assert_eq!(file.metadata().unwrap().len(), first.len());
    }
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert_eq!(requests_of(&fx, "open"), 20);
    assert_eq!(requests_of(&fx, "read"), 1, "pages read once, then kept");
    assert!(
        requests_of(&fx, "getattr") <= 2,
        "{} GETATTRs for 20 reads",
        requests_of(&fx, "getattr")
    );
}

#[test]
fn passthrough_off_serves_data_through_the_daemon() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start_logged(&["--passthrough=off", "--zero_message_opens=off"], "debug");
    exercise(&fx, &d);
    assert_eq!(d.terminate(), BY_SIGTERM);
    let log = fx.log();
    assert!(!log.contains("FUSE passthrough on"), "{log}");
    assert!(requests_of(&fx, "read") > 0);
    assert!(requests_of(&fx, "write") > 0);
}

#[test]
fn without_cap_sys_admin_passthrough_falls_back_and_says_so_once() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    // Root of a new user namespace may mount FUSE (in its own mount
    // namespace) but lacks CAP_SYS_ADMIN where passthrough checks for it.
    // Everything runs inside: the mount is invisible outside.
    let fx = Fixture::new();
    let content: String = (0..50_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    fs::write(fx.path("src/input"), &content).unwrap();
    fs::write(
        fx.path("requests"),
        format!(
            r#"{{"C":{{"i":"s","m":[{{"p":"/in","u":"{}"}},{{"p":"/out","u":"{}","w":true}}]}}}}"#,
            fx.path("src/input").display(),
            fx.path("scratch").display()
        ),
    )
    .unwrap();
    let script = r#"
        "$BIN" --zero_message_opens=off --input="$DIR/requests" --output="$DIR/answers" "$DIR/mnt" 2>"$DIR/daemon.log" &
        daemon=$!
        for _ in $(seq 100); do [ -e "$DIR/mnt/s/in" ] && break; sleep 0.05; done
        cat "$DIR/mnt/s/in" > "$DIR/read1" && cat "$DIR/mnt/s/in" > "$DIR/read2" &&
            printf written > "$DIR/mnt/s/out/result"
        status=$?
        kill -TERM $daemon; wait $daemon
        exit $status
    "#;
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", script])
        .env("BIN", bin())
        .env("DIR", fx.dir.path())
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = fx.log();
    assert!(out.status.success(), "{out:?}\n{log}");
    assert_eq!(fs::read_to_string(fx.path("read1")).unwrap(), content);
    assert_eq!(fs::read_to_string(fx.path("read2")).unwrap(), content);
    assert_eq!(fs::read(fx.path("scratch/result")).unwrap(), b"written");
    assert_eq!(
        log.matches("FUSE passthrough off").count(),
        1,
        "one warning, not one per open:\n{log}"
    );
    assert!(log.contains("needs CAP_SYS_ADMIN"), "{log}");
}
