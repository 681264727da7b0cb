//! `actionfs serve`'s jails against real actions: Bazel's linux-sandbox
//! (Create leaves confinement unset) and actionfs's own (`--jail=landlock`,
//! the wrapper Create answers with), each action run exactly as Bazel's
//! client runs it; what each jail lets an action do to its inputs, its
//! outputs, the network, other processes; and which jail `--jail` picks.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use actionfs_protocol::backend::digest::digest_of;
use actionfs_protocol::backend::sandbox::{self, create, Manifest};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};
use actionfs_testkit::backend::{assert_built_as, shown, Backend, Place, WS};
use actionfs_testkit::serve::LOGGED;
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::{wait_for, xattr};

/// Runs `script` in the sandbox at `root` inside Bazel's linux-sandbox, as
/// `SandboxBackendSpawn.builtin()` wraps an action when Create leaves
/// `confinement` unset: writable are the action's scratch directory,
/// `/dev`, `/tmp` and the returned root; a network namespace; the working
/// directory is `root/<workspace>`. (Bazel also lists /private/tmp and
/// /private/var/tmp, macOS paths that Bazel 4.2.3's linux-sandbox refuses
/// where they do not exist.)
fn run_in_bazel_jail(root: &Path, scratch: &Path, script: &str) -> std::process::Output {
    run_argv_in_bazel_jail(root, scratch, &["/bin/sh", "-c", script])
}

/// As [`run_in_bazel_jail`], `argv` instead of a shell's script.
fn run_argv_in_bazel_jail(root: &Path, scratch: &Path, argv: &[&str]) -> std::process::Output {
    let mut jail = Command::new(actionfs_testkit::tier::linux_sandbox());
    for writable in [scratch, Path::new("/dev"), Path::new("/tmp"), root] {
        jail.arg("-w").arg(writable);
    }
    jail.args(["-N", "--"])
        .args(argv)
        .current_dir(root.join(WS))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap()
}

/// Every configuration a user may run `serve` in: the defaults, every
/// sandbox FUSE and every sandbox native, each on tmpfs and on disk.
/// Each with how its sandboxes must be built ("fuse" or "native"): the
/// defaults native on tmpfs only, and below /tmp every one FUSE.
fn modes_on_file_systems() -> Vec<(String, PathBuf, Vec<&'static str>, &'static str)> {
    let mut all = Vec::new();
    for (fs_name, parent) in [
        ("tmpfs", "/dev/shm"),
        ("disk", "/var/tmp"),
        // Writable in Bazel's jail.
        ("/tmp", "/tmp"),
    ] {
        for (mode, options) in [
            ("defaults", vec![]),
            ("fuse", vec!["--native_below=0"]),
            ("native", vec!["--native_below=1000000000"]),
        ] {
            let built = match (mode, fs_name) {
                (_, "/tmp") | ("fuse", _) | ("defaults", "disk") => "fuse",
                _ => "native",
            };
            all.push((
                format!("{mode} on {fs_name}"),
                parent.into(),
                options,
                built,
            ));
        }
    }
    all
}

/// The two inputs of the jail tests, pushed: `src/a.txt` from the exec
/// root ("source") and `src/b.txt` pushed inline ("pushed").
fn source_and_pushed(b: &Backend) -> Tree {
    let source = b.write_input("src/a.txt", b"source\n");
    let pushed = b"pushed\n";
    let mut tb = TreeBuilder::new();
    tb.add_file("ws/src/a.txt", source, false).unwrap();
    tb.add_file("ws/src/b.txt", digest_of(pushed), false)
        .unwrap();
    let tree = tb.build();
    b.push_tree_with_inline(&tree, &[pushed]);
    tree
}

/// After the attempts of a jail test: the source in the exec root is as
/// written, the output `out/x` is collected with both inputs' bytes, and
/// sandbox "1" is destroyed.
fn assert_source_kept_and_output_collected(b: &Backend, name: &str) {
    assert_eq!(
        fs::read(b.exec_root().join("ws/src/a.txt")).unwrap(),
        b"source\n",
        "{name}: the action changed the source"
    );
    let collected = b.collect_ok("1");
    assert_eq!(
        fs::read(collected.join("ws/out/x")).unwrap(),
        b"source\npushed\n",
        "{name}"
    );
    b.destroy_ok("1");
}

#[test]
fn an_action_in_bazels_linux_sandbox_writes_its_outputs_and_never_its_inputs() {
    if !require(&[Need::Mount, Need::LinuxSandbox]) {
        return;
    }
    for (name, parent, options, built) in modes_on_file_systems() {
        let b = Backend::start_on(&parent, &options);
        let tree = source_and_pushed(&b);
        let scratch = b.root().join("bazel-scratch/1");
        fs::create_dir_all(scratch.join("tmp")).unwrap();
        let mut manifest = b.manifest(&tree, &[("/ws/out/x", "file")]);
        manifest.writable_dirs =
            HashMap::from([("/tmp".into(), scratch.join("tmp").display().to_string())]);
        let root = b.create_ok("1", manifest);
        assert_built_as(&b, built, &root);
        let ran = run_in_bazel_jail(&root, &scratch, "cat src/a.txt src/b.txt > out/x");
        assert!(
            ran.status.success(),
            "{name}: the action cannot write its output in the jail: {}\n{}",
            String::from_utf8_lossy(&ran.stderr),
            b.log()
        );
        // Neither input can be changed, through any path the jail leaves.
        for input in ["src/a.txt", "src/b.txt"] {
            for attempt in [
                format!("echo changed > {input}"),
                format!("echo changed >> {input}"),
                format!("truncate -s 0 {input}"),
                format!("cp /etc/hostname {input}"),
            ] {
                let _ = run_in_bazel_jail(&root, &scratch, &attempt);
                let ws = root.join(WS);
                let expected: &[u8] = if input == "src/a.txt" {
                    b"source\n"
                } else {
                    b"pushed\n"
                };
                assert_eq!(
                    fs::read(ws.join(input)).unwrap(),
                    expected,
                    "{name}: `{attempt}` in the jail changed the input"
                );
            }
        }
        assert_source_kept_and_output_collected(&b, &name);
        if parent == Path::new("/tmp") && !options.contains(&"--native_below=0") {
            assert!(
                b.log()
                    .contains("'s jail, so every sandbox is served by FUSE"),
                "{name}: {}",
                b.log()
            );
        }
        b.close();
    }
}

// ---- actionfs's own jail (`--jail=landlock`, the default) ----

/// What Bazel's runner sends as `confinement_setting` (its
/// `SandboxBackendSpawnRunner`): the action's scratch directory and the
/// platform's device and temporary directories, nothing inaccessible.
fn bazels_confinement(scratch: &Path) -> sandbox::ConfinementSetting {
    sandbox::ConfinementSetting {
        writable_paths: [scratch.to_str().unwrap(), "/dev", "/tmp"]
            .into_iter()
            .chain(["/private/tmp", "/private/var/tmp"])
            .map(Into::into)
            .collect(),
        inaccessible_paths: Vec::new(),
        allow_network: false,
    }
}

/// [`bazels_confinement`] with `hidden` inaccessible
/// (`--sandbox_block_path`).
fn bazels_confinement_hiding(scratch: &Path, hidden: &[&Path]) -> sandbox::ConfinementSetting {
    sandbox::ConfinementSetting {
        inaccessible_paths: hidden.iter().map(|p| p.display().to_string()).collect(),
        ..bazels_confinement(scratch)
    }
}

/// A Create whose confinement lets the action write where the backend
/// keeps its store and native trees (Bazel's `--sandbox_writable_path`
/// adds `/dev/shm`, the default base, to every action's writable paths)
/// is served by FUSE, which refuses writes to inputs; in that jail a
/// native sandbox's input links would lead the action's writes into the
/// store. The same backend's other Creates stay native.
#[test]
fn a_create_that_may_write_the_store_is_served_by_fuse() {
    if !require(&[Need::Mount]) {
        return;
    }
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    for jail in ["--jail=landlock", "--jail=bazel"] {
        let b = Backend::start_on(shm, &[jail]);
        let input = b.write_input("src/a.txt", b"input\n");
        let tree = b.push_files([("ws/src/a.txt", input)]);
        let on_fuse = |root: &Path| {
            nix::sys::statfs::statfs(&root.join(WS))
                .unwrap()
                .filesystem_type()
                == nix::sys::statfs::FUSE_SUPER_MAGIC
        };
        let scratch = b.root().join("scratch");
        fs::create_dir_all(&scratch).unwrap();
        let mut manifest = b.manifest(&tree, &[("/ws/out/x", "file")]);
        manifest.confinement_setting = Some(bazels_confinement(&scratch));
        let root = b.create_ok("plain", manifest.clone());
        assert!(!on_fuse(&root), "{jail}: the usual paths: native");
        manifest
            .confinement_setting
            .as_mut()
            .unwrap()
            .writable_paths
            .push("/dev/shm".into());
        let root = b.create_ok("shm", manifest);
        assert!(
            on_fuse(&root),
            "{jail}: /dev/shm writable: FUSE\n{}",
            b.log()
        );
        assert_eq!(fs::read(root.join("ws/src/a.txt")).unwrap(), b"input\n");
        assert_eq!(b.stats()["built"]["fuse"].as_u64(), Some(1), "{jail}");
        b.destroy_ok("plain");
        b.destroy_ok("shm");
        b.close();
    }
}

/// Creates `id`, expecting Ok with a custom confinement; returns the
/// root and the wrapper.
fn create_jailed(
    b: &Backend,
    id: &str,
    manifest: Manifest,
) -> (PathBuf, sandbox::CustomConfinement) {
    use create::result::ok::Confinement;
    match b.client().create(id, manifest).unwrap().outcome {
        Some(create::result::Outcome::Ok(create::result::Ok {
            path,
            confinement: Some(Confinement::Custom(custom)),
        })) => (PathBuf::from(path), custom),
        other => panic!(
            "create {id}: expected a custom confinement, got {other:?}\n{}",
            b.log()
        ),
    }
}

/// Runs `argv` as `SandboxBackendSpawn.custom()` runs an action: the
/// wrapper's argv before the action's, its env over the action's, cwd
/// `root/<workspace>`.
fn run_jailed(
    root: &Path,
    jail: &sandbox::CustomConfinement,
    argv: &[&str],
) -> std::process::Output {
    let mut command = Command::new(&jail.wrapper[0]);
    command
        .args(&jail.wrapper[1..])
        .args(argv)
        .current_dir(root.join(WS))
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    command.envs(&jail.env);
    command.output().unwrap()
}

fn sh_jailed(root: &Path, jail: &sandbox::CustomConfinement, script: &str) -> std::process::Output {
    run_jailed(root, jail, &["/bin/sh", "-c", script])
}

/// A sandbox of two inputs (one from the exec root, one pushed) and the
/// output `out/x`, confined as Bazel would ask; returns the root, the
/// wrapper and the action's scratch directory.
fn jailed_sandbox(
    b: &Backend,
    id: &str,
    setting: impl FnOnce(&Path) -> sandbox::ConfinementSetting,
) -> (PathBuf, sandbox::CustomConfinement, PathBuf) {
    let tree = source_and_pushed(b);
    let scratch = b.root().join(format!("bazel-scratch/{id}"));
    fs::create_dir_all(scratch.join("tmp")).unwrap();
    let mut manifest = b.manifest(&tree, &[("/ws/out/x", "file")]);
    manifest.writable_dirs =
        HashMap::from([("/tmp".into(), scratch.join("tmp").display().to_string())]);
    manifest.confinement_setting = Some(setting(&scratch));
    let (root, jail) = create_jailed(b, id, manifest);
    (root, jail, scratch)
}

/// Writes go only to the sandbox's writable parts, the writable paths
/// and device nodes: never to an input, by its sandbox path, by where
/// it resolves (the store, the exec root), through a hard link, by a
/// rename, from a child in a session of its own; never elsewhere.
#[test]
fn an_action_in_the_landlock_jail_writes_its_outputs_and_never_its_inputs() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    for (name, parent, options, built) in modes_on_file_systems() {
        let b = Backend::start_on(&parent, &options);
        let (root, jail, scratch) = jailed_sandbox(&b, "1", bazels_confinement);
        assert_built_as(&b, built, &root);
        // Outputs, the writable dir (its host path, as $0), /dev/null,
        // directories and renames inside the sandbox.
        let ran = run_jailed(
            &root,
            &jail,
            &[
                "/bin/sh",
                "-c",
                "cat src/a.txt src/b.txt > out/x && echo t > \"$0/tmp/t\" && echo n > /dev/null \
                 && mkdir out/d && mv out/x out/d/y && mv out/d/y out/x",
                scratch.to_str().unwrap(),
            ],
        );
        assert!(ran.status.success(), "{name}: {}\n{}", shown(&ran), b.log());
        assert_eq!(fs::read(scratch.join("tmp/t")).unwrap(), b"t\n", "{name}");
        let ws = root.join(WS);
        let resolved: Vec<PathBuf> = ["src/a.txt", "src/b.txt"]
            .iter()
            .map(|input| fs::canonicalize(ws.join(input)).unwrap())
            .collect();
        let outside = b.root().join("outside");
        let shm = PathBuf::from(format!(
            "/dev/shm/actionfs-jail-test-{}",
            std::process::id()
        ));
        let mut attempts = vec![
            format!("echo x > {}", outside.display()),
            format!("echo x > {}", shm.display()),
            format!("mkdir {}", outside.display()),
        ];
        for (input, target) in ["src/a.txt", "src/b.txt"].iter().zip(&resolved) {
            let target = target.display();
            attempts.extend([
                format!("echo changed > {input}"),
                format!("echo changed >> {input}"),
                format!("truncate -s 0 {input}"),
                format!("cp /etc/hostname {input}"),
                format!("echo changed > {target}"),
                format!("truncate -s 0 {target}"),
                // truncate(2) by path, and an open for reading with
                // O_TRUNC (which truncates): Landlock's truncate right,
                // not its write right, is what refuses these.
                format!("perl -e 'truncate(\"{target}\", 0) or die \"$!\"'"),
                format!(
                    "perl -MFcntl -e 'sysopen(F, \"{input}\", O_RDONLY|O_TRUNC) or die \"$!\"'"
                ),
                format!("mv {target} out/stolen"),
                format!("mv out/x {target}"),
                format!("ln {target} out/h && echo changed > out/h"),
                format!("setsid -w sh -c 'echo changed > {target}'"),
            ]);
        }
        for attempt in &attempts {
            let out = sh_jailed(&root, &jail, attempt);
            assert!(
                !out.status.success(),
                "{name}: `{attempt}` succeeded: {}",
                shown(&out)
            );
            for (input, expected) in [("src/a.txt", &b"source\n"[..]), ("src/b.txt", b"pushed\n")] {
                assert_eq!(
                    fs::read(ws.join(input)).unwrap(),
                    expected,
                    "{name}: `{attempt}` changed {input}"
                );
            }
            assert!(
                !outside.exists() && !shm.exists(),
                "{name}: `{attempt}` wrote outside"
            );
        }
        assert_source_kept_and_output_collected(&b, &name);
        b.close();
    }
}

/// `confinement_setting.inaccessible_paths` cannot be read, by their
/// path or through a symlink; what is beside them can.
#[test]
fn inaccessible_paths_are_unreadable_in_the_landlock_jail() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    let b = Backend::start(&[]);
    let secret = b.root().join("secret");
    let beside = b.root().join("beside");
    fs::create_dir_all(&secret).unwrap();
    fs::write(secret.join("key"), b"key\n").unwrap();
    fs::write(&beside, b"beside\n").unwrap();
    let link = b.root().join("link-to-secret");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let (root, jail, _) = jailed_sandbox(&b, "1", |scratch| {
        bazels_confinement_hiding(scratch, &[&secret])
    });
    let read = |path: &Path| sh_jailed(&root, &jail, &format!("cat {}", path.display()));
    for denied in [secret.join("key"), link.join("key")] {
        let out = read(&denied);
        assert!(
            !out.status.success(),
            "{denied:?} was read: {}",
            shown(&out)
        );
    }
    let out = sh_jailed(&root, &jail, &format!("ls {}", secret.display()));
    assert!(
        !out.status.success(),
        "{secret:?} was listed: {}",
        shown(&out)
    );
    let out = read(&beside);
    assert_eq!(out.stdout, b"beside\n", "{}", shown(&out));
    let out = sh_jailed(&root, &jail, "cat src/a.txt src/b.txt");
    assert_eq!(out.stdout, b"source\npushed\n", "{}", shown(&out));
    b.close();
}

/// An inaccessible path below /dev makes the jail rule every other entry
/// of /dev one by one; /dev/stdout and its like lead to the action's
/// pipes there, which are no file system objects to rule: the jail must
/// still start (it failed every action with EBADFD).
#[test]
fn an_inaccessible_path_below_dev_leaves_the_jail_working_with_piped_output() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    if !Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let b = Backend::start(&[]);
    let hidden = tempfile::tempdir_in("/dev/shm").unwrap();
    fs::write(hidden.path().join("key"), b"key\n").unwrap();
    let (root, jail, _) = jailed_sandbox(&b, "1", |scratch| {
        bazels_confinement_hiding(scratch, &[hidden.path()])
    });
    // stdout and stderr are pipes (Command::output).
    let out = sh_jailed(&root, &jail, "cat src/a.txt src/b.txt");
    assert_eq!(out.stdout, b"source\npushed\n", "{}", shown(&out));
    let key = hidden.path().join("key");
    let out = sh_jailed(&root, &jail, &format!("cat {}", key.display()));
    assert!(!out.status.success(), "{key:?} was read: {}", shown(&out));
    b.destroy_ok("1");
    b.close();
}

/// Where the jail has its mount namespace and nothing is hidden, the
/// host is kept read-only by the mounts alone: Landlock's file rules
/// would only repeat them, at the price of a walk to `/` at every open.
/// Seen through what only Landlock refuses: writing to a FIFO outside the
/// writable paths (a read-only mount lets a FIFO be written, as it does a
/// device). With a path hidden, Landlock rules the file system again
/// (EACCES), as it does without namespaces. Either way nothing outside
/// is made or changed.
#[test]
fn with_namespaces_the_mounts_alone_keep_the_host_read_only_unless_a_path_is_hidden() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    let b = Backend::start(&[]);
    let outside = b.root().join("outside");
    let fifo = b.root().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let hidden = tempfile::tempdir_in(b.root()).unwrap();
    for hide in [false, true] {
        let id = if hide { "hidden" } else { "plain" };
        let hiding: &[&Path] = if hide { &[hidden.path()] } else { &[] };
        let (root, jail, _) =
            jailed_sandbox(&b, id, |scratch| bazels_confinement_hiding(scratch, hiding));
        let namespaces = jail.wrapper.iter().any(|arg| arg == "--namespaces");
        let out = sh_jailed(&root, &jail, &format!("echo x > {}", outside.display()));
        assert!(
            !out.status.success() && !outside.exists(),
            "{id}: wrote {outside:?}"
        );
        // A reader that does not wait, so that a writer's open does not.
        let mut reader = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let out = sh_jailed(&root, &jail, &format!("echo through > {}", fifo.display()));
        let mut got = String::new();
        let _ = reader.read_to_string(&mut got);
        let by_mounts_alone = namespaces && !hide;
        if by_mounts_alone {
            assert!(out.status.success(), "{id}: {}", shown(&out));
            assert_eq!(got, "through\n", "{id}");
        } else {
            assert!(
                !out.status.success(),
                "{id}: Landlock let the FIFO be written"
            );
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
                "{id} (namespaces: {namespaces}): {}",
                shown(&out)
            );
        }
        let out = sh_jailed(&root, &jail, "cat src/a.txt src/b.txt > out/x");
        assert!(out.status.success(), "{id}: {}", shown(&out));
        b.destroy_ok(id);
    }
    b.close();
}

/// Without `allow_network`: no TCP connect or bind (loopback included),
/// no UDP or raw socket; Unix sockets work. With it, all work.
#[test]
fn the_landlock_jail_allows_network_only_when_the_action_may_use_it() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        r#"
import socket, sys
def attempt(what, f):
    try:
        f(); print(what, "ok")
    except OSError as e:
        print(what, "refused", e.errno)
attempt("connect", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5))
attempt("bind", lambda: socket.socket().bind(("127.0.0.1", 0)))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {port})))
attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("unix", lambda: socket.socket(socket.AF_UNIX).bind("out/sock"))
"#
    );
    if !python3_or_skip() {
        return;
    }
    for allow_network in [false, true] {
        let b = Backend::start(&[]);
        let (root, jail, _) = jailed_sandbox(&b, "1", |scratch| sandbox::ConfinementSetting {
            allow_network,
            ..bazels_confinement(scratch)
        });
        let out = run_jailed(&root, &jail, &["python3", "-c", &probe]);
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let expected = if allow_network {
            "connect ok\nbind ok\nudp ok\nudp6 ok\nunix ok\n".to_owned()
        } else {
            format!(
                "connect refused {e}\nbind refused {e}\nudp refused {af}\nudp6 refused {af}\nunix ok\n",
                e = libc::EACCES,
                af = libc::EAFNOSUPPORT
            )
        };
        assert_eq!(
            said,
            expected,
            "allow_network {allow_network}: {}",
            shown(&out)
        );
        b.close();
    }
}

/// No signal reaches a process outside the action; the action's own
/// children can be signalled.
#[test]
fn an_action_in_the_landlock_jail_signals_only_its_own_processes() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    let b = Backend::start(&[]);
    let (root, jail, _) = jailed_sandbox(&b, "1", bazels_confinement);
    let mut outsider = Command::new("sleep").arg("600").spawn().unwrap();
    for signal in ["0", "TERM", "KILL"] {
        let out = sh_jailed(&root, &jail, &format!("kill -{signal} {}", outsider.id()));
        assert!(
            !out.status.success(),
            "kill -{signal} reached outside: {}",
            shown(&out)
        );
    }
    assert!(outsider.try_wait().unwrap().is_none(), "the outsider died");
    let out = sh_jailed(
        &root,
        &jail,
        "sleep 600 & kill -TERM $! && wait $!; echo $?",
    );
    assert_eq!(out.stdout, b"143\n", "{}", shown(&out));
    outsider.kill().unwrap();
    outsider.wait().unwrap();
    b.close();
}

// ---- No action changes an input, in any jail (issue 57) ----

/// Tries every way to change a file's bytes or metadata on each input
/// named, snapshotting each before and after (as the action sees it);
/// `snap` only snapshots. Prints JSON: {"tried": [[input, call, errno or
/// null]], "before": {...}, "after": {...}}.
const TAMPER: &str = r#"
import hashlib, json, os, sys
what, inputs = sys.argv[1], sys.argv[2:]
def snap(p):
    st = os.stat(p)
    try:
        xattrs = sorted(os.listxattr(p))
    except OSError as e:
        xattrs = "errno %d" % e.errno
    with open(p, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid, "size": st.st_size,
            "mtime": st.st_mtime_ns, "ctime": st.st_ctime_ns, "nlink": st.st_nlink,
            "xattrs": xattrs, "sha256": digest}
before = {p: snap(p) for p in inputs}
tried = []
if what == "tamper":
    me = (os.getuid(), os.getgid())
    def fd(p, flags=os.O_RDONLY):
        return os.open(p, flags)
    for p in inputs:
        t = os.path.realpath(p)
        n = p.replace("/", "_")
        calls = [
            ("chmod", lambda: os.chmod(p, 0o777)),
            ("chmod where it resolves", lambda: os.chmod(t, 0o777)),
            ("fchmodat", lambda: os.chmod(os.path.basename(p), 0o700,
                dir_fd=fd(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY))),
            ("fchmod O_RDONLY", lambda: os.fchmod(fd(p), 0o777)),
            ("fchmod O_PATH", lambda: os.fchmod(fd(p, os.O_PATH), 0o777)),
            ("chmod /proc/self/fd of O_PATH", lambda: os.chmod("/proc/self/fd/%d" % fd(p, os.O_PATH), 0o777)),
            ("chown", lambda: os.chown(p, *me)),
            ("lchown where it resolves", lambda: os.lchown(t, *me)),
            ("fchown", lambda: os.fchown(fd(p), *me)),
            ("utimensat", lambda: os.utime(p, ns=(10**9, 10**9))),
            ("utimensat now", lambda: os.utime(p)),
            ("futimens", lambda: os.utime(fd(p), ns=(10**9, 10**9))),
            ("setxattr", lambda: os.setxattr(p, "user.tamper", b"1")),
            ("fsetxattr", lambda: os.setxattr(fd(p), "user.tamper", b"1")),
            ("removexattr", lambda: os.removexattr(p, "user.keep")),
            ("fremovexattr", lambda: os.removexattr(fd(p), "user.keep")),
            ("truncate", lambda: os.truncate(p, 0)),
            ("ftruncate O_RDWR", lambda: os.ftruncate(fd(p, os.O_RDWR), 0)),
            ("open O_WRONLY|O_TRUNC", lambda: fd(p, os.O_WRONLY | os.O_TRUNC)),
            ("open O_RDONLY|O_TRUNC", lambda: fd(p, os.O_RDONLY | os.O_TRUNC)),
            ("append", lambda: os.write(fd(p, os.O_WRONLY | os.O_APPEND), b"x")),
            # linkat(AT_SYMLINK_FOLLOW): a dir_fd makes Python call linkat.
            ("link (following)", lambda: os.link(p, "out/link_" + n, src_dir_fd=fd(".", os.O_DIRECTORY),
                follow_symlinks=True)),
            ("link where it resolves", lambda: os.link(t, "out/link2_" + n)),
            ("rename where it resolves", lambda: os.rename(t, "out/moved_" + n)),
            ("rename over where it resolves",
                lambda: (open("out/over_" + n, "w").close(), os.rename("out/over_" + n, t))),
        ]
        for call, attempt in calls:
            try:
                attempt()
                tried.append([p, call, None])
            except OSError as e:
                tried.append([p, call, e.errno])
print(json.dumps({"tried": tried, "before": before, "after": {p: snap(p) for p in inputs}}))
"#;

/// What the user's tree holds for a file, seen from outside any jail.
fn user_view(path: &Path) -> (u32, u32, u32, u64, i64, i64, u64, bool, Vec<u8>) {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).unwrap();
    let keep = xattr::get(path, "user.keep").is_some();
    (
        meta.mode(),
        meta.uid(),
        meta.gid(),
        meta.size(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        meta.ctime_nsec() + meta.ctime() * 1_000_000_000,
        meta.nlink(),
        keep,
        fs::read(path).unwrap(),
    )
}

/// One jail and way of building sandboxes a user may run `serve` with.
struct JailMode {
    name: &'static str,
    parent: &'static str,
    options: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    built: &'static str,
    /// Create leaves confinement to Bazel (linux-sandbox).
    bazels: bool,
}

/// Every jail `serve` answers, each with native and FUSE sandboxes where
/// it builds both: actionfs's with namespaces (the default here), without
/// them (user namespaces refused: every sandbox FUSE), and Bazel's.
fn jail_modes() -> Vec<JailMode> {
    const NO_NAMESPACES: &[(&str, &str)] = &[
        ("RUST_LOG", "warn,actionfs::lifecycle=info"),
        ("ACTIONFS_JAIL_NAMESPACES", "off"),
    ];
    let mode = |name, parent, options, env, built, bazels| JailMode {
        name,
        parent,
        options,
        env,
        built,
        bazels,
    };
    let mut modes = vec![
        mode(
            "actionfs's jail, defaults on tmpfs",
            "/dev/shm",
            &[][..],
            LOGGED,
            "native",
            false,
        ),
        mode(
            "actionfs's jail, FUSE",
            "/dev/shm",
            &["--native_below=0"],
            LOGGED,
            "fuse",
            false,
        ),
        mode(
            "actionfs's jail, native on disk",
            "/var/tmp",
            &["--native_below=1000000000"],
            LOGGED,
            "native",
            false,
        ),
        mode(
            "actionfs's jail without namespaces",
            "/dev/shm",
            &["--native_below=1000000000"],
            NO_NAMESPACES,
            "fuse",
            false,
        ),
    ];
    modes.extend([
        mode(
            "Bazel's jail, native",
            "/dev/shm",
            &["--jail=bazel"],
            LOGGED,
            "native",
            true,
        ),
        mode(
            "Bazel's jail, FUSE",
            "/dev/shm",
            &["--jail=bazel", "--native_below=0"],
            LOGGED,
            "fuse",
            true,
        ),
    ]);
    modes
}

impl JailMode {
    fn start(&self) -> Backend {
        let place = Place::on(Path::new(self.parent));
        Backend::start_with(&place, WS, "backend", self.options, self.env)
    }

    /// Creates `id` as Bazel would ask (its `/tmp` a writable dir in
    /// `scratch`, Bazel's confinement setting); returns the root and
    /// the wrapper Create answered with (none for Bazel's jail).
    fn create(
        &self,
        b: &Backend,
        id: &str,
        tree: &Tree,
        scratch: &Path,
    ) -> (PathBuf, Option<sandbox::CustomConfinement>) {
        use create::result::ok::Confinement;
        fs::create_dir_all(scratch.join("tmp")).unwrap();
        let mut manifest = b.manifest(tree, &[("/ws/out", "dir")]);
        manifest.writable_dirs =
            HashMap::from([("/tmp".into(), scratch.join("tmp").display().to_string())]);
        manifest.confinement_setting = Some(bazels_confinement(scratch));
        let ok = match b.client().create(id, manifest).unwrap().outcome {
            Some(create::result::Outcome::Ok(ok)) => ok,
            other => panic!("{}: create {id}: {other:?}\n{}", self.name, b.log()),
        };
        let root = PathBuf::from(&ok.path);
        assert_built_as(b, self.built, &root);
        match (ok.confinement, self.bazels) {
            (None, true) => (root, None),
            (Some(Confinement::Custom(custom)), false) => (root, Some(custom)),
            (other, _) => panic!("{}: confinement {other:?}", self.name),
        }
    }

    /// Runs `argv` as Bazel would in this jail.
    fn run(
        &self,
        root: &Path,
        jail: Option<&sandbox::CustomConfinement>,
        scratch: &Path,
        argv: &[&str],
    ) -> std::process::Output {
        match jail {
            Some(jail) => run_jailed(root, jail, argv),
            None => run_argv_in_bazel_jail(root, scratch, argv),
        }
    }
}

/// The inputs to tamper with: a small source (captured into the store),
/// a 3 MiB one (served from its default place), an executable, a
/// source that is a symlink to a file outside the exec root, and pushed
/// bytes. Each source carries the extended attribute `user.keep`.
/// Returns the tree, the inputs' paths in the workspace and the user's
/// files behind them.
fn inputs_to_tamper_with(b: &Backend) -> (Tree, Vec<String>, Vec<PathBuf>) {
    let ws = b.exec_root().join(WS);
    let small = b.write_input("src/small.txt", b"small\n");
    let big_bytes: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    let big = b.write_input("src/big.bin", &big_bytes);
    let tool = b.write_input("bin/tool.sh", b"#!/bin/sh\necho tool\n");
    fs::set_permissions(ws.join("bin/tool.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let elsewhere = b.root().join("sources/real.txt");
    fs::create_dir_all(elsewhere.parent().unwrap()).unwrap();
    fs::write(&elsewhere, b"real\n").unwrap();
    std::os::unix::fs::symlink(&elsewhere, ws.join("src/linked.txt")).unwrap();
    let pushed = b"pushed\n";
    let users = vec![
        ws.join("src/small.txt"),
        ws.join("src/big.bin"),
        ws.join("bin/tool.sh"),
        elsewhere.clone(),
    ];
    for file in &users {
        xattr::set(file, "user.keep", b"1");
    }
    let mut tb = TreeBuilder::new();
    tb.add_file("ws/src/small.txt", small, false).unwrap();
    tb.add_file("ws/src/big.bin", big, false).unwrap();
    tb.add_file("ws/bin/tool.sh", tool, true).unwrap();
    tb.add_file("ws/src/linked.txt", digest_of(b"real\n"), false)
        .unwrap();
    tb.add_file("ws/src/pushed.txt", digest_of(pushed), false)
        .unwrap();
    let tree = tb.build();
    b.push_tree_with_inline(&tree, &[pushed]);
    let inputs = [
        "src/small.txt",
        "src/big.bin",
        "bin/tool.sh",
        "src/linked.txt",
        "src/pushed.txt",
    ]
    .map(String::from)
    .to_vec();
    (tree, inputs, users)
}

fn python3_or_skip() -> bool {
    Command::new("python3").arg("-c").arg("1").output().is_ok()
        || actionfs_testkit::tier::skip("no python3")
}

/// No action changes an input's bytes or metadata (mode, owner, times,
/// extended attributes, link count) by any call, through its sandbox
/// path, where it resolves (the store, the exec root, the source tree a
/// symlinked source leads to), by an fd (`O_RDONLY`, `O_PATH`): not as
/// the action itself sees it, not as a later sandbox of the same tree
/// does, not in the user's tree. In every jail `serve` answers, native
/// and FUSE. (Before the namespaces, actionfs's jail let `chmod`,
/// `chown`, `utime` and extended attributes through a native input's
/// link to the store or to the user's file.)
#[test]
fn no_action_changes_an_inputs_bytes_or_metadata_in_any_jail() {
    if !require(&[Need::Mount, Need::Landlock, Need::LinuxSandbox]) || !python3_or_skip() {
        return;
    }
    for mode in jail_modes() {
        let name = mode.name;
        let b = mode.start();
        let (tree, inputs, users) = inputs_to_tamper_with(&b);
        let user_before: Vec<_> = users.iter().map(|f| user_view(f)).collect();
        let scratch = b.root().join("bazel-scratch/1");
        let (root, jail) = mode.create(&b, "1", &tree, &scratch);
        let mut argv = vec!["python3", "-c", TAMPER, "tamper"];
        argv.extend(inputs.iter().map(String::as_str));
        let out = mode.run(&root, jail.as_ref(), &scratch, &argv);
        assert!(out.status.success(), "{name}: {}\n{}", shown(&out), b.log());
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let allowed: Vec<String> = report["tried"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t[2].is_null())
            .map(|t| format!("{} on {}", t[1], t[0]))
            .collect();
        assert!(allowed.is_empty(), "{name}: allowed: {allowed:#?}");
        // removexattr refused because it may not, not because nothing was
        // there (the sources carry user.keep; what the store copied does
        // not).
        assert_eq!(
            report["tried"].as_array().unwrap().len(),
            inputs.len() * 25,
            "{name}"
        );
        assert_eq!(
            report["before"], report["after"],
            "{name}: as the action saw its inputs"
        );
        for (file, before) in users.iter().zip(&user_before) {
            assert_eq!(&user_view(file), before, "{name}: the user's {file:?}");
        }
        b.destroy_ok("1");
        // A later sandbox of the same tree sees what the first saw.
        let scratch = b.root().join("bazel-scratch/2");
        let (root, jail) = mode.create(&b, "2", &tree, &scratch);
        let mut argv = vec!["python3", "-c", TAMPER, "snap"];
        argv.extend(inputs.iter().map(String::as_str));
        let out = mode.run(&root, jail.as_ref(), &scratch, &argv);
        assert!(out.status.success(), "{name}: {}", shown(&out));
        let later: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for input in &inputs {
            for field in ["mode", "uid", "gid", "size", "mtime", "xattrs", "sha256"] {
                assert_eq!(
                    later["before"][input][field], report["before"][input][field],
                    "{name}: {input}'s {field} in a later sandbox"
                );
            }
        }
        b.destroy_ok("2");
        b.close();
    }
}

/// What an action may change stays changeable in every jail: `chmod +x`
/// and `touch -d` on an output, `cp -p`, `tar x` and `install -m` into
/// an output directory, a file in its writable `/tmp`; Collect brings
/// the modes out.
#[test]
fn outputs_and_writable_dirs_take_modes_times_and_copies_in_every_jail() {
    if !require(&[Need::Mount, Need::Landlock, Need::LinuxSandbox]) {
        return;
    }
    for mode in jail_modes() {
        let name = mode.name;
        let b = mode.start();
        let (tree, _, _) = inputs_to_tamper_with(&b);
        let scratch = b.root().join("bazel-scratch/1");
        let (root, jail) = mode.create(&b, "1", &tree, &scratch);
        let script = "set -e; mkdir -p out/tree out/x; echo x > out/run && chmod +x out/run \
             && touch -d 2001-01-01 out/run && cp -p bin/tool.sh src/small.txt out/tree/ \
             && tar cf out/t.tar -C out tree && tar xf out/t.tar -C out/x \
             && install -m 0750 src/small.txt out/installed \
             && echo t > \"$0/tmp/t\" && chmod 0600 \"$0/tmp/t\" && touch -d 2002-02-02 \"$0/tmp/t\"";
        let out = mode.run(
            &root,
            jail.as_ref(),
            &scratch,
            &["/bin/sh", "-c", script, scratch.to_str().unwrap()],
        );
        assert!(out.status.success(), "{name}: {}\n{}", shown(&out), b.log());
        let tmp = fs::metadata(scratch.join("tmp/t")).unwrap();
        assert_eq!(tmp.permissions().mode() & 0o7777, 0o600, "{name}");
        let collected = b.collect_ok("1").join("ws/out");
        let mode_of = |rel: &str| {
            fs::metadata(collected.join(rel))
                .unwrap_or_else(|e| panic!("{name}: {rel}: {e}"))
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode_of("run") & 0o111, 0o111, "{name}: chmod +x");
        assert_eq!(mode_of("tree/tool.sh") & 0o111, 0o111, "{name}: cp -p");
        assert_eq!(mode_of("x/tree/tool.sh") & 0o111, 0o111, "{name}: tar x");
        assert_eq!(mode_of("installed"), 0o750, "{name}: install -m");
        let run = fs::metadata(collected.join("run")).unwrap();
        assert_eq!(
            run.modified().unwrap(),
            std::time::UNIX_EPOCH + Duration::from_secs(978_307_200),
            "{name}: touch -d 2001-01-01 (UTC)"
        );
        b.destroy_ok("1");
        b.close();
    }
}

/// Whether a process whose command line holds `marker` is running.
fn processes_marked(marker: &str) -> Vec<String> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok().map(|c| (e, c)))
        .filter(|(_, cmdline)| String::from_utf8_lossy(cmdline).contains(marker))
        .map(|(e, cmdline)| {
            format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            )
        })
        .collect()
}

/// Nothing an action leaves running outlives it: a `setsid` daemon and
/// a double fork's orphan (each forking again) are gone when the
/// action's wrapper returns, so before Bazel asks for Collect, in every
/// jail (in actionfs's they outlived it before).
#[test]
fn nothing_an_action_leaves_running_outlives_it_in_any_jail() {
    if !require(&[Need::Mount, Need::Landlock, Need::LinuxSandbox]) || !python3_or_skip() {
        return;
    }
    for (n, mode) in jail_modes().into_iter().enumerate() {
        let name = mode.name;
        let b = mode.start();
        let (tree, _, _) = inputs_to_tamper_with(&b);
        let scratch = b.root().join("bazel-scratch/1");
        let (root, jail) = mode.create(&b, "1", &tree, &scratch);
        let marker = format!("leftover-{}-{n}", std::process::id());
        let stay = "import os, time; os.fork(); open('out/up.%d' % os.getpid(), 'w').close(); \
                    time.sleep(600)";
        let script = format!(
            "mkdir -p out; setsid python3 -c \"{stay}\" {marker} </dev/null >/dev/null 2>&1 & \
             (python3 -c \"{stay}\" {marker} </dev/null >/dev/null 2>&1 &); \
             while [ $(ls out | grep -c '^up') -lt 4 ]; do sleep 0.05; done"
        );
        let out = mode.run(&root, jail.as_ref(), &scratch, &["/bin/sh", "-c", &script]);
        assert!(out.status.success(), "{name}: {}\n{}", shown(&out), b.log());
        let left = processes_marked(&marker);
        for line in &left {
            let pid: i32 = line.split(':').next().unwrap().parse().unwrap();
            // SAFETY: a signal to a process this test's action started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "{name}: outlived the action: {left:#?}");
        b.destroy_ok("1");
        b.close();
    }
}

/// A backend of `mode` with sandbox "1" and its wrapper, for the
/// signal tests.
fn sandbox_for_signals(mode: &JailMode) -> (Backend, PathBuf, sandbox::CustomConfinement) {
    let b = mode.start();
    let (tree, _, _) = inputs_to_tamper_with(&b);
    let scratch = b.root().join("bazel-scratch/1");
    let (root, jail) = mode.create(&b, "1", &tree, &scratch);
    (b, root, jail.unwrap())
}

/// `sh -c script` through `jail`, as Bazel runs an action in `root`.
fn wrapped(root: &Path, jail: &sandbox::CustomConfinement, script: &str) -> Command {
    let mut command = Command::new(&jail.wrapper[0]);
    command
        .args(&jail.wrapper[1..])
        .args(["/bin/sh", "-c", script])
        .current_dir(root.join(WS))
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    command
}

/// Signals Bazel sends the wrapper reach the action (which can catch
/// them: it starts with every signal at its default, none blocked), and
/// the wrapper ends as the action did: its exit code, or its signal.
#[test]
fn signals_to_actionfs_jail_reach_the_action_and_its_end_is_the_wrappers() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    for mode in jail_modes().into_iter().filter(|m| !m.bazels) {
        let name = mode.name;
        let (b, root, jail) = sandbox_for_signals(&mode);
        for (script, signal, expected_code, expected_signal) in [
            (
                "trap 'echo caught; exit 7' TERM; touch out/ready; while :; do sleep 0.05; done",
                libc::SIGTERM,
                Some(7),
                None,
            ),
            (
                "touch out/ready; while :; do sleep 0.05; done",
                libc::SIGINT,
                None,
                Some(libc::SIGINT),
            ),
            ("kill -SEGV $$", 0, None, Some(libc::SIGSEGV)),
        ] {
            let _ = fs::remove_file(root.join("ws/out/ready"));
            let child = wrapped(&root, &jail, script)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            if signal != 0 {
                assert!(
                    wait_for(Duration::from_secs(20), || root
                        .join("ws/out/ready")
                        .exists()),
                    "{name}: the action never started"
                );
                // SAFETY: a signal to the wrapper this test spawned.
                unsafe { libc::kill(child.id() as i32, signal) };
            }
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                (out.status.code(), out.status.signal()),
                (expected_code, expected_signal),
                "{name}: `{script}`: {}",
                shown(&out)
            );
            if expected_code == Some(7) {
                assert_eq!(out.stdout, b"caught\n", "{name}");
            }
        }
        b.destroy_ok("1");
        b.close();
    }
}

/// A wrapper started with SIGINT, SIGQUIT and SIGHUP ignored (a shell's
/// `&` ignores the first two, `nohup` the third) still passes them on,
/// and the action starts with them at their defaults, as linux-sandbox
/// and process-wrapper restore every signal: before, both inherited them
/// ignored and a SIGINT to the wrapper ended nothing (found when a
/// backgrounded `.ci/run` hung in the test above).
#[test]
fn signals_the_wrapper_was_started_ignoring_still_reach_the_action() {
    if !require(&[Need::Mount, Need::Landlock]) {
        return;
    }
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    for mode in jail_modes().into_iter().filter(|m| !m.bazels) {
        let name = mode.name;
        let (b, root, jail) = sandbox_for_signals(&mode);
        for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP] {
            let _ = fs::remove_file(root.join("ws/out/ready"));
            let script = "touch out/ready; while :; do sleep 0.05; done";
            let mut command = wrapped(&root, &jail, script);
            command
                .stdout(Stdio::null())
                // A group of its own, so that a failure kills the action too.
                .process_group(0);
            // SAFETY: signal() only, between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    for ignored in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP] {
                        libc::signal(ignored, libc::SIG_IGN);
                    }
                    Ok(())
                });
            }
            let mut child = command.spawn().unwrap();
            assert!(
                wait_for(Duration::from_secs(20), || root
                    .join("ws/out/ready")
                    .exists()),
                "{name}: the action never started"
            );
            // SAFETY: a signal to the wrapper this test spawned.
            unsafe { libc::kill(child.id() as i32, signal) };
            let ended = wait_for(Duration::from_secs(20), || {
                child.try_wait().unwrap().is_some()
            });
            if !ended {
                // SAFETY: SIGKILL to the group this test made for the wrapper.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                panic!("{name}: signal {signal} to the wrapper ended nothing");
            }
            let status = child.wait().unwrap();
            assert_eq!(status.signal(), Some(signal), "{name}: {status:?}");
        }
        b.destroy_ok("1");
        b.close();
    }
}

/// `--jail` picks Create's confinement: actionfs's wrapper (the default
/// where Landlock is), Bazel's (unset) or none.
#[test]
fn the_jail_option_picks_creates_confinement() {
    if !require(&[Need::Mount]) {
        return;
    }
    use create::result::ok::Confinement;
    for (option, expect) in [
        (None, "landlock"),
        (Some("--jail=landlock"), "landlock"),
        (Some("--jail=bazel"), "bazel"),
        (Some("--jail=none"), "none"),
    ] {
        let b = Backend::start(&option.into_iter().collect::<Vec<_>>());
        let tree = b.push_files([("ws/f", b.write_input("f", b"f"))]);
        let answer = b
            .client()
            .create("1", b.manifest(&tree, &[]))
            .unwrap()
            .outcome;
        let Some(create::result::Outcome::Ok(ok)) = answer else {
            panic!("{option:?}: {answer:?}");
        };
        let landlock = actionfs::jail::landlock_abi() >= actionfs::jail::MIN_ABI;
        match (expect, ok.confinement) {
            ("landlock", Some(Confinement::Custom(custom))) if landlock => {
                assert!(Path::new(&custom.wrapper[0]).is_file(), "{custom:?}");
                assert_eq!(custom.wrapper.last().unwrap(), "--", "{custom:?}");
            }
            ("landlock", None) if !landlock => assert!(b.log().contains("Landlock ABI")),
            ("bazel", None) | ("none", Some(Confinement::Unconfined(_))) => {}
            (_, other) => panic!("{option:?}: {other:?}"),
        }
        b.destroy_ok("1");
        b.close();
    }
}

/// On a kernel without Landlock ABI 6 (pretended with
/// ACTIONFS_LANDLOCK_ABI), `serve` leaves confinement to Bazel and says
/// so once on stderr, however many sandboxes it makes.
#[test]
fn without_landlock_serve_falls_back_to_bazels_jail_and_says_so_once() {
    if !require(&[Need::Mount]) {
        return;
    }
    let env = [(actionfs::jail::ABI_OVERRIDE, "5")];
    let mut b = Backend::start_with(&Place::new(), WS, "backend", &[], &env);
    let tree = b.push_files([("ws/f", b.write_input("f", b"f"))]);
    for id in ["1", "2"] {
        match b
            .client()
            .create(id, b.manifest(&tree, &[]))
            .unwrap()
            .outcome
        {
            Some(create::result::Outcome::Ok(ok)) => {
                assert_eq!(ok.confinement, None, "sandbox {id}")
            }
            other => panic!("create {id}: {other:?}"),
        }
        b.destroy_ok(id);
    }
    b.close_input().unwrap();
    assert!(b.wait().success());
    let said = b.log();
    assert_eq!(
        said.matches("Landlock ABI is 5 (needs 6), so actions run in Bazel's jail")
            .count(),
        1,
        "{said}"
    );
}
