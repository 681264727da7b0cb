//! Hostile input, faults and access control, against the real daemon on a
//! real mount. Each class of bad input gets a clear answer, the daemon keeps
//! serving, and no partial sandbox is left (docs/BAD_INPUT.md).

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use actionfs_protocol::Mapping;
use actionfs_testkit::tier::{self, require, Need};
use actionfs_testkit::*;

/// Sends raw bytes for sandbox `id` and returns the error it got.
fn raw_error(d: &Daemon, id: &str, bytes: &[u8]) -> String {
    let answer = d.client().call_raw(id, bytes).unwrap();
    answer
        .error
        .unwrap_or_else(|| panic!("{id}: expected an error"))
}

/// The daemon still creates, serves and destroys sandboxes.
fn still_serving(d: &Daemon, good: &Path) {
    d.create(sandbox("alive", vec![ro("/g", good)]));
    assert_eq!(fs::read_to_string(d.path("alive/g")).unwrap(), "good");
    d.destroy("alive");
}

#[test]
fn oversized_and_nul_laden_names_are_refused() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    let long_id = "i".repeat(300);
    assert!(d
        .create_err(sandbox(&long_id, vec![]))
        .contains("longer than 255"));
    let long_path = format!("/{}", ["p"; 3000].join("/"));
    assert!(d
        .create_err(sandbox("p", vec![ro(&long_path, &good)]))
        .contains("longer than 4096"));
    let long_name = format!("/{}", "n".repeat(300));
    assert!(d
        .create_err(sandbox("n", vec![ro(&long_name, &good)]))
        .contains("longer than 255"));
    for (id, body) in [
        ("nul-id", r#"{"C":{"i":"nul-id\u0000x","m":[]}}"#),
        (
            "nul-path",
            r#"{"C":{"i":"nul-path","m":[{"p":"/a\u0000b","u":"/tmp"}]}}"#,
        ),
    ] {
        // The id with a NUL is answered under that very id.
        let answer_id = if id == "nul-id" { "nul-id\u{0}x" } else { id };
        let error = raw_error(&d, answer_id, body.as_bytes());
        assert!(error.contains("NUL"), "{id}: {error}");
    }
    assert_eq!(names(&d.mnt), ["empty"]);
    still_serving(&d, &good);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn non_utf8_and_deeply_nested_input_is_answered_without_a_crash_and_reading_goes_on() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (what, bytes, id, said) in [
        (
            "non-UTF-8",
            b"{\"C\":{\"i\":\"\xff\xfe\",\"m\":[]}}\n".to_vec(),
            None,
            "invalid unicode code point",
        ),
        (
            "deep nesting",
            [
                b"{\"C\":{\"i\":\"x\",\"m\":".to_vec(),
                vec![b'['; 100_000],
                vec![b']'; 100_000],
                b"}}\n".to_vec(),
            ]
            .concat(),
            Some("x"),
            "malformed request at line 1, column 261: nested deeper than 128 levels",
        ),
    ] {
        let fx = Fixture::new();
        let good = fx.write("src/good", "good");
        let d = fx.start(&[]);
        d.create(sandbox("before", vec![ro("/g", &good)]));
        d.client().write_raw(&bytes).unwrap();
        // The next request is still read and served (within a deadline,
        // so that a daemon that stopped reading fails the test).
        let after = actionfs_protocol::encode_request(&actionfs_protocol::Request::Create(
            sandbox("after", vec![ro("/g", &good)]),
        ));
        let answers = d
            .client()
            .call_raw_within(&["after"], after.as_bytes(), Duration::from_secs(20))
            .unwrap_or_else(|err| panic!("{what}: {err}"));
        assert_eq!(answers[0].error, None, "{what}");
        let unnamed = d.client().unexpected_responses();
        assert!(
            matches!(unnamed.as_slice(), [answer] if answer.id.as_deref() == id),
            "{what}: {unnamed:?}"
        );
        assert!(
            unnamed[0].error.as_deref().unwrap().contains(said),
            "{what}: {unnamed:?}"
        );
        assert_eq!(
            fs::read_to_string(d.path("after/g")).unwrap(),
            "good",
            "{what}"
        );
        assert_eq!(d.terminate(), BY_SIGTERM, "{what}");
    }
}

#[test]
fn input_ending_inside_a_value_is_reported_as_truncated() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    d.create(sandbox("before", vec![ro("/g", &good)]));
    // An unterminated value is not an error while more input may come
    // (nested within the depth limit, past which it would be broken)...
    let open = [b"{\"C\":{\"i\":\"x\",\"m\":".to_vec(), vec![b'['; 100]].concat();
    d.client().write_raw(&open).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(d.client().unexpected_responses().is_empty());
    // ...and is, once the input ends.
    d.client().close_input();
    assert!(wait_for(Duration::from_secs(10), || !d
        .client()
        .unexpected_responses()
        .is_empty()));
    let fatal = &d.client().unexpected_responses()[0];
    assert_eq!(fatal.id, None);
    assert!(
        fatal.error.as_deref().unwrap().contains("truncated"),
        "{fatal:?}"
    );
    assert_eq!(fs::read_to_string(d.path("before/g")).unwrap(), "good");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_hundred_thousand_mappings_in_one_request() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    let mappings: Vec<Mapping> = (0..100_000)
        .map(|n| ro(&format!("/ws/d{}/f{n}", n % 500), &good))
        .collect();
    d.create(sandbox("huge", mappings));
    assert_eq!(
        fs::read_to_string(d.path("huge/ws/d7/f99507")).unwrap(),
        "good"
    );
    assert_eq!(names(&d.path("huge/ws")).len(), 500);
    d.destroy("huge");
    assert_eq!(errno(fs::metadata(d.path("huge"))), libc::ENOENT);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn prefixes_into_the_mount_itself_are_refused() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    d.create(sandbox("real", vec![ro("/g", &good)]));
    let mut create = sandbox(
        "loop",
        vec![Mapping {
            path: "/x".into(),
            underlying_path_prefix: 1,
            underlying_path: "real/g".into(),
            ..Mapping::default()
        }],
    );
    create.prefixes.insert(1, d.mnt.to_str().unwrap().into());
    let error = d.create_err(create);
    assert!(error.contains("inside the mount point"), "{error}");
    still_serving(&d, &good);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn sockets_fifos_and_devices_are_shown_but_never_opened_by_the_daemon() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let fifo = fx.path("src/fifo");
    let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let socket_path = fx.path("src/sock");
    let _socket = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    let good = fx.write("src/good", "good");
    let d = fx.start(&[]);
    d.create(sandbox(
        "odd",
        vec![
            ro("/fifo", &fifo),
            ro("/sock", &socket_path),
            ro("/null", Path::new("/dev/null")),
        ],
    ));
    assert!(fs::symlink_metadata(d.path("odd/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(fs::symlink_metadata(d.path("odd/sock"))
        .unwrap()
        .file_type()
        .is_socket());
    assert!(fs::symlink_metadata(d.path("odd/null"))
        .unwrap()
        .file_type()
        .is_char_device());
    // The mount is nodev: the device cannot be opened through it.
    assert_eq!(errno(fs::File::open(d.path("odd/null"))), libc::EACCES);
    // A FIFO is the kernel's own pipe on the view's inode: opening it with
    // O_NONBLOCK does not reach (or block) the daemon.
    let pipe = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(d.path("odd/fifo"));
    assert!(pipe.is_ok(), "{pipe:?}");
    drop(pipe);
    still_serving(&d, &good);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn underlying_files_deleted_or_replaced_while_mounted() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let file = fx.write("src/f", "first");
    let doomed = fx.write("src/doomed", "doomed");
    // Attributes may lag up to --ttl; page contents must never be stale.
    let d = fx.start(&["--ttl=0s"]);
    d.create(sandbox(
        "s",
        vec![
            ro("/f", &file),
            ro("/doomed", &doomed),
            ro("/dir", &fx.path("src")),
        ],
    ));
    assert_eq!(fs::read_to_string(d.path("s/f")).unwrap(), "first");
    // Replaced (a new inode at the path): the view shows the new content,
    // not pages cached from the old file.
    let replacement = fx.write("src/f.new", "second, longer");
    fs::rename(&replacement, &file).unwrap();
    assert_eq!(fs::read_to_string(d.path("s/f")).unwrap(), "second, longer");
    // Deleted: opening fails with the underlying error; the daemon lives.
    fs::remove_file(&doomed).unwrap();
    assert_eq!(errno(fs::File::open(d.path("s/doomed"))), libc::ENOENT);
    assert_eq!(errno(fs::File::open(d.path("s/dir/doomed"))), libc::ENOENT);
    still_serving(&d, &fx.write("src/good", "good"));
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_full_underlying_file_system_reports_enospc_and_the_daemon_survives() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let fx = Fixture::new();
    let small = fx.path("small");
    fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&small)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted && !tier::skip("cannot mount a small tmpfs here") {
        return;
    }
    let _unmount = UnmountOnDrop(small.clone());
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![rw("/out", &small)]));
    let mut file = fs::File::create(d.path("s/out/big")).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    let err = (0..64)
        .find_map(|_| file.write_all(&chunk).err())
        .expect("the disk never filled");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(file);
    let full = free_bytes(&small);
    fs::remove_file(d.path("s/out/big")).unwrap();
    // The daemon closes its descriptor of the removed file when the kernel
    // forgets the inode; FORGET is queued by the unlink but served by
    // another thread, so the space comes back just after, not during it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while free_bytes(&small) <= full && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        free_bytes(&small) > full,
        "the removed file's space never came back"
    );
    fs::write(d.path("s/out/small"), "fits").unwrap();
    assert_eq!(fs::read_to_string(small.join("small")).unwrap(), "fits");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

/// Unmounts a file system the test mounted, also when the test fails.
struct UnmountOnDrop(std::path::PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn free_bytes(dir: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    st.blocks_free() as u64 * st.fragment_size() as u64
}

#[test]
fn a_read_only_mapping_cannot_be_changed_through_a_shared_writable_mmap() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "input bytes");
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![ro("/in", &input)]));
    let file = fs::File::open(d.path("s/in")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: mmap of an open fd; the result is checked and unmapped.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_eq!(
        map,
        libc::MAP_FAILED,
        "a writable shared map of a read-only file"
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    assert_eq!(fs::read_to_string(&input).unwrap(), "input bytes");
    drop(file);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn allow_self_shuts_other_users_out_and_allow_other_lets_them_in() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    for (flag, others_allowed) in [("--allow=self", false), ("--allow=other", true)] {
        let fx = Fixture::new();
        fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let input = fx.write("src/in", "data");
        fs::set_permissions(&input, fs::Permissions::from_mode(0o644)).unwrap();
        let d = fx.start(&[flag]);
        d.create(sandbox("s", vec![ro("/in", &input)]));
        let file = d.path("s/in");
        let file = file.to_str().unwrap();
        for args in [
            &["stat", file][..],
            &["cat", file][..],
            &["ls", d.mnt.to_str().unwrap()][..],
        ] {
            let out = as_nobody(args);
            let (ok, stderr) = (out.status.success(), String::from_utf8_lossy(&out.stderr));
            assert_eq!(ok, others_allowed, "{flag} {args:?}: {stderr}");
            if !others_allowed {
                assert!(
                    stderr.contains("Permission denied"),
                    "{flag} {args:?}: {stderr}"
                );
            }
        }
        // The owner always gets in.
        assert_eq!(fs::read_to_string(d.path("s/in")).unwrap(), "data");
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

#[test]
fn a_killed_daemon_leaves_a_mount_the_next_start_clears() {
    if !require(&[Need::Mount]) {
        return;
    }
    // The stale-mount path, once more from the fault side: kill -9 while a
    // reader is inside the mount, then a new daemon on the same point.
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let mut first = fx.start(&[]);
    first.create(sandbox("s", vec![ro("/g", &good)]));
    let mut reader = Command::new("sleep")
        .arg("30")
        .current_dir(first.path("s"))
        .spawn()
        .unwrap();
    let mut client = first.client.take().unwrap();
    client.signal(libc::SIGKILL).unwrap();
    client.wait().unwrap();
    std::mem::forget(first);
    let second = fx.start(&[]);
    still_serving(&second, &good);
    let _ = reader.kill();
    let _ = reader.wait();
    assert_eq!(second.terminate(), BY_SIGTERM);
    assert!(!is_mounted(&fx.mnt()));
}

#[test]
fn io_errors_of_the_underlying_file_system_reach_the_caller() {
    if !require(&[Need::Mount, Need::LoopDevice]) {
        return;
    }
    let xfs = match LoopXfs::new() {
        Ok(xfs) => xfs,
        Err(why) => {
            tier::skip(&format!("no loop-mounted xfs here: {why}"));
            return;
        }
    };
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let data = xfs.path().join("data");
    fs::write(&data, vec![1u8; 1 << 20]).unwrap();
    fs::create_dir(xfs.path().join("out")).unwrap();
    let d = fx.start(&[]);
    d.create(sandbox(
        "s",
        vec![ro("/data", &data), rw("/out", &xfs.path().join("out"))],
    ));
    // Force the file system down: from now on its I/O fails with EIO.
    let down = Command::new("xfs_io")
        .args(["-x", "-c", "shutdown"])
        .arg(xfs.path())
        .status()
        .unwrap();
    assert!(down.success());
    assert_eq!(errno(fs::read(d.path("s/data"))), libc::EIO);
    assert_eq!(errno(fs::write(d.path("s/out/new"), "x")), libc::EIO);
    still_serving(&d, &good);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn permission_errors_reach_the_caller_as_eacces() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let fx = Fixture::new();
    fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let secret = fx.write("src/secret", "root only");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(fx.path("scratch"), fs::Permissions::from_mode(0o755)).unwrap();
    let d = fx.start(&["--allow=other"]);
    d.create(sandbox(
        "s",
        vec![ro("/secret", &secret), rw("/out", &fx.path("scratch"))],
    ));
    let write = format!("echo x > {}", d.path("s/out/new").display());
    let secret_path = d.path("s/secret").display().to_string();
    for args in [
        vec!["sh", "-c", write.as_str()],
        vec!["cat", secret_path.as_str()],
    ] {
        let out = as_nobody(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Permission denied"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!fx.path("scratch/new").exists());
    still_serving(&d, &fx.write("src/good", "good"));
    assert_eq!(d.terminate(), BY_SIGTERM);
}
