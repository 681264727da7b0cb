//! A real `actionfs serve` for the serve benches: spawned with its
//! sandbox base in a fresh directory and negotiated.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actionfs_protocol::backend::client::Client;

pub struct Served {
    pub client: Client,
    pub child: Child,
    pub dir: tempfile::TempDir,
}

impl Served {
    /// Starts the backend (`ACTIONFS_BIN`, else this build's) below
    /// `ACTIONFS_BENCH_DIR` (default: /var/tmp; below /tmp, writable in
    /// Bazel's jail, `serve` builds no native sandbox) with
    /// `ACTIONFS_BENCH_OPTS` and `options`.
    pub fn start(options: &[&str]) -> Served {
        let parent = std::env::var_os("ACTIONFS_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        let dir = tempfile::tempdir_in(parent).unwrap();
        std::fs::create_dir_all(dir.path().join("execroot/ws")).unwrap();
        // ACTIONFS_BIN: another build as the backend (scripts/bench-ab).
        let bin = std::env::var_os("ACTIONFS_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_actionfs")));
        let mut child = Command::new(bin)
            .args(["serve", "--workspace"])
            .arg(dir.path().join("execroot/ws"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Read back for its SIGUSR1 reports; shown at the stop.
            .stderr(std::fs::File::create(dir.path().join("backend.log")).unwrap())
            .spawn()
            .unwrap();
        let client = Client::new(
            Box::new(child.stdin.take().unwrap()),
            Box::new(child.stdout.take().unwrap()),
        );
        let mut all = vec![format!("--sandbox_base={}", dir.path().display())];
        if let Ok(extra) = std::env::var("ACTIONFS_BENCH_OPTS") {
            all.extend(extra.split_whitespace().map(str::to_owned));
        }
        all.extend(options.iter().map(|o| o.to_string()));
        println!("backend options {all:?}");
        client.negotiate(all).unwrap();
        Served { client, child, dir }
    }

    pub fn exec_root(&self) -> String {
        self.dir.path().join("execroot").display().to_string()
    }

    fn log(&self) -> String {
        read_log(&self.dir)
    }

    /// The backend's counters now: its SIGUSR1 report, read from its log.
    #[allow(dead_code)] // not every bench reads them
    pub fn stats(&self) -> serde_json::Value {
        const MARK: &str = "stats (SIGUSR1): ";
        let before = self.log().matches(MARK).count();
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::SIGUSR1).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.matches(MARK).count() > before {
                let (_, rest) = log.rsplit_once(MARK).unwrap();
                if let Some((line, _)) = rest.split_once('\n') {
                    return serde_json::from_str(line).unwrap();
                }
            }
            assert!(Instant::now() < deadline, "no stats report:\n{log}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Closes stdin, shows the backend's log, checks it exited 0.
    pub fn stop(mut self) {
        self.client.close().unwrap();
        let status = self.child.wait().unwrap();
        eprint!("{}", read_log(&self.dir));
        assert!(status.success());
    }
}

fn read_log(dir: &tempfile::TempDir) -> String {
    std::fs::read_to_string(dir.path().join("backend.log")).unwrap_or_default()
}

pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
