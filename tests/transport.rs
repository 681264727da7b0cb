//! The two transports: which one serves the mount, that a forced io_uring
//! really carries the requests (so a run of the suite on io_uring cannot
//! silently fall back to /dev/fuse), and that an unprivileged daemon
//! mounting through fusermount3 gets the ring too.
//!
//! Whether the kernel offers the ring is this machine's state
//! (/sys/module/fuse/parameters/enable_uring); the tests read it and check
//! what the daemon must do either way, without changing it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel offers FUSE-over-io_uring now.
fn kernel_offers_ring() -> bool {
    fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "Y")
}

/// Stats, lookups, opens and reads through the mount.
fn some_requests(fx: &Fixture, d: &Daemon) {
    let input = fx.write("src/input", "ring data");
    d.create(sandbox("s", vec![ro("/dir/in", &input)]));
    for _ in 0..3 {
        assert_eq!(fs::read_to_string(d.path("s/dir/in")).unwrap(), "ring data");
    }
    assert!(fs::metadata(d.path("s/dir/absent")).is_err());
    assert_eq!(
        fs::read_dir(d.path("s/dir")).unwrap().count(),
        1,
        "one entry listed"
    );
}

#[test]
fn forcing_io_uring_serves_on_the_ring_or_refuses_to_start() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    if !kernel_offers_ring() {
        // Refused before mounting, with the reason and the fix.
        let out = fx
            .command(&["--transport=io_uring"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--transport=io_uring") && stderr.contains("enable_uring"),
            "{stderr}"
        );
        assert!(!is_mounted(&fx.mnt()));
        return;
    }
    let d = fx.start_logged(&["--transport=io_uring"], "info");
    some_requests(&fx, &d);
    assert_ring_threads_pinned_and_batch(d.client().pid());
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(!is_mounted(&fx.mnt()));
    // Counted at exit, when no request (a RELEASEDIR after a close) is
    // still in flight.
    let stats = fx.stats_at_exit();
    assert_eq!(stats["live"]["transport"], "io_uring", "{stats}");
    let on_ring = stats["fuse_on_ring"].as_u64().unwrap();
    // Everything but FORGET (which stays on /dev/fuse) came on the ring.
    let not_forgets = stats["fuse_requests"].as_u64().unwrap() - fuse_requests(&stats, "forget");
    assert!(fuse_requests(&stats, "lookup") > 0, "{stats}");
    assert_eq!(on_ring, not_forgets, "{stats}");
    assert!(fx.log().contains("transport: io_uring"), "{}", fx.log());
}

/// Every ring thread of daemon `pid` is pinned to one CPU and runs
/// SCHED_BATCH (a request that does not block its sender must not preempt
/// it: see the transport's queue).
fn assert_ring_threads_pinned_and_batch(pid: u32) {
    const SCHED_BATCH: u32 = 3;
    let mut rings = 0;
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !comm.starts_with("fuse-ring-") {
            continue;
        }
        rings += 1;
        let stat = fs::read_to_string(task.join("stat")).unwrap();
        // Fields after the parenthesised name; policy is field 41.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let policy: u32 = after_name.split(' ').nth(41 - 3).unwrap().parse().unwrap();
        assert_eq!(policy, SCHED_BATCH, "{comm}: {stat}");
        let status = fs::read_to_string(task.join("status")).unwrap();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        assert!(
            cpus.parse::<u32>().is_ok(),
            "{comm}: pinned to one CPU, not {cpus}"
        );
    }
    assert!(rings > 0, "no fuse-ring thread in daemon {pid}");
}

#[test]
fn classic_never_uses_the_ring() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start_logged(&["--transport=classic"], "info");
    some_requests(&fx, &d);
    let stats = fx.stats_now(&d);
    assert_eq!(stats["live"]["transport"], "classic /dev/fuse", "{stats}");
    assert_eq!(stats["fuse_on_ring"], 0, "{stats}");
    assert!(fuse_requests(&stats, "lookup") > 0, "{stats}");
    let log = fx.log();
    assert_eq!(
        log.matches("transport: ").count(),
        1,
        "one line says which:\n{log}"
    );
    assert!(
        log.contains("transport: classic /dev/fuse (--transport=classic)"),
        "{log}"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn auto_uses_the_ring_exactly_when_the_kernel_offers_it() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start_logged(&["--transport=auto"], "info");
    some_requests(&fx, &d);
    let stats = fx.stats_now(&d);
    let log = fx.log();
    assert_eq!(
        log.matches("transport: ").count(),
        1,
        "one line says which:\n{log}"
    );
    if kernel_offers_ring() {
        assert!(log.contains("transport: io_uring"), "{log}");
        assert!(stats["fuse_on_ring"].as_u64().unwrap() > 0, "{stats}");
    } else {
        // The line names the setting and the command that changes it.
        assert!(
            log.contains("transport: classic /dev/fuse (enable_uring is N: echo Y >"),
            "{log}"
        );
        assert_eq!(stats["fuse_on_ring"], 0, "{stats}");
    }
    assert_eq!(d.terminate(), BY_SIGTERM);
}

/// Once INIT granted the ring, the kernel holds every request until each
/// queue has registered; queues that cannot start (here: no descriptor
/// left for their rings) must leave a mount that answers on /dev/fuse, or
/// a daemon that exits 1, never a mount where every access hangs.
#[test]
fn queues_that_cannot_start_never_leave_a_hanging_mount() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    // Around the daemon's own descriptors at mount time (stdio, signal
    // socket pair, /dev/fuse and its copies): from none left for any ring
    // to some rings but not all.
    for limit in 9..=12 {
        let fx = Fixture::new();
        let input = fx.write("src/input", "data");
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={limit}:{limit}"))
            .arg(bin())
            .args(["--native_below=0", "--transport=auto"])
            .arg(format!(
                "--mapping=ro:/:{}",
                input.parent().unwrap().display()
            ))
            .arg(fx.mnt())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(fx.path("daemon.log")).unwrap());
        let mut daemon = command.spawn().unwrap();
        let path = fx.mnt().join("input");
        // Mounted, or the daemon gave up already.
        let settled = wait_for(Duration::from_secs(10), || {
            is_mounted(&fx.mnt()) || daemon.try_wait().unwrap().is_some()
        });
        assert!(
            settled,
            "limit {limit}: neither mounted nor ended\n{}",
            fx.log()
        );
        let mut reader = Command::new("cat")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let answered = wait_for(Duration::from_secs(10), || {
            reader.try_wait().unwrap().is_some()
        });
        if !answered {
            let _ = reader.kill();
        }
        let _ = reader.wait();
        let status = daemon.try_wait().unwrap();
        let _ = daemon.kill();
        let _ = daemon.wait();
        if is_mounted(&fx.mnt()) {
            let _ = Command::new("umount").arg("-l").arg(fx.mnt()).status();
        }
        // The read may fail (the daemon itself may be out of descriptors
        // for the file), but it returns.
        assert!(
            answered,
            "limit {limit}: a read hangs in the mount\n{}",
            fx.log()
        );
        if let Some(status) = status {
            assert_eq!(status.code(), Some(1), "limit {limit}\n{}", fx.log());
        }
    }
}

/// Opens /dev/fuse to everyone until dropped (it is root-only here).
struct DevFuseOpen(u32);

impl DevFuseOpen {
    fn new() -> DevFuseOpen {
        let mode = fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777;
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
        DevFuseOpen(mode)
    }
}

impl Drop for DevFuseOpen {
    fn drop(&mut self) {
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0));
    }
}

/// As `auto_uses_the_ring_exactly_when_the_kernel_offers_it`, for a daemon
/// run by a user, which mounts through fusermount3.
#[test]
fn an_unprivileged_daemon_mounting_through_fusermount3_gets_the_ring() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let offered = kernel_offers_ring();
    let fx = Fixture::new();
    fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(&fx.mnt(), nobody, None).unwrap();
    let input = fx.write("src/input", "as nobody");
    fs::set_permissions(fx.path("src"), fs::Permissions::from_mode(0o755)).unwrap();
    let _open = DevFuseOpen::new();
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()])
        .args(["--native_below=0", "--transport=auto"])
        .arg(fx.mnt())
        .env("RUST_LOG", "info")
        .stderr(fs::File::create(fx.path("daemon.log")).unwrap());
    let d = fx.start_command(command);
    d.create(sandbox("s", vec![ro("/in", &input)]));
    let read = as_nobody(&["cat".as_ref(), d.path("s/in").as_os_str()]);
    assert!(read.status.success(), "{read:?}\n{}", fx.log());
    assert_eq!(read.stdout, b"as nobody");
    let stats = fx.stats_now(&d);
    if offered {
        assert_eq!(stats["live"]["transport"], "io_uring", "{stats}");
        assert!(stats["fuse_on_ring"].as_u64().unwrap() > 0, "{stats}");
    } else {
        assert_eq!(stats["live"]["transport"], "classic /dev/fuse", "{stats}");
        assert_eq!(stats["fuse_on_ring"], 0, "{stats}");
    }
    assert!(
        mounts().iter().any(|mount| mount.point == fx.mnt()
            && mount
                .options
                .split(',')
                .any(|option| option == "user_id=65534")),
        "mounted by the user through fusermount3"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(!is_mounted(&fx.mnt()));
}
