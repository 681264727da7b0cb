//! A real `actionfs serve` for the serve benches: spawned with its
//! sandbox base in a fresh directory and negotiated.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use actionfs_protocol::backend::client::Client;

pub struct Served {
    pub client: Client,
    pub child: Child,
    pub dir: tempfile::TempDir,
}

impl Served {
    /// Starts the backend below `ACTIONFS_BENCH_DIR` (default: /var/tmp;
    /// below /tmp, writable in Bazel's jail, `serve` builds no native
    /// sandbox) with `ACTIONFS_BENCH_OPTS` and `options`.
    pub fn start(options: &[&str]) -> Served {
        let parent = std::env::var_os("ACTIONFS_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        let dir = tempfile::tempdir_in(parent).unwrap();
        std::fs::create_dir_all(dir.path().join("execroot/ws")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_actionfs"))
            .args(["serve", "--workspace"])
            .arg(dir.path().join("execroot/ws"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
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

    /// Closes stdin and checks the backend exited 0.
    pub fn stop(mut self) {
        self.client.close().unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
