//! A real `actionfs serve` for the serve benches: spawned with its
//! sandbox base in a fresh directory and negotiated.

use std::path::PathBuf;

use actionfs_testkit::serve::ServeProcess;

pub struct Served {
    serve: ServeProcess,
    pub dir: tempfile::TempDir,
}

/// The process's own methods (client, stats) are the bench's.
impl std::ops::Deref for Served {
    type Target = ServeProcess;
    fn deref(&self) -> &ServeProcess {
        &self.serve
    }
}

impl Served {
    /// Starts the backend (`ACTIONFS_BIN`, else this build's) below
    /// `ACTIONFS_BENCH_DIR` (default: /var/tmp; below /tmp, writable in
    /// Bazel's jail, `serve` builds no native sandbox) with
    /// `ACTIONFS_BENCH_OPTS` and `options`.
    pub fn start(options: &[&str]) -> Served {
        let parent = actionfs_testkit::bench::dir_from_env("ACTIONFS_BENCH_DIR", "/var/tmp");
        let dir = tempfile::tempdir_in(parent).unwrap();
        let workspace = dir.path().join("execroot/ws");
        std::fs::create_dir_all(&workspace).unwrap();
        // ACTIONFS_BIN: another build as the backend (scripts/bench-ab).
        let bin = std::env::var_os("ACTIONFS_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_actionfs")));
        // The log is read back for its SIGUSR1 reports; shown at the stop.
        let log = dir.path().join("backend.log");
        let serve = ServeProcess::spawn(bin, &workspace, Some(&log), &[]);
        let extra = std::env::var("ACTIONFS_BENCH_OPTS").unwrap_or_default();
        let all: Vec<&str> = extra
            .split_whitespace()
            .chain(options.iter().copied())
            .collect();
        // No --transport: the backend's default, or ACTIONFS_BENCH_OPTS's.
        let sent = serve.negotiate_or_panic(dir.path(), None, &all);
        println!("backend options {sent:?}");
        Served { serve, dir }
    }

    pub fn exec_root(&self) -> String {
        self.dir.path().join("execroot").display().to_string()
    }

    /// Closes stdin, shows the backend's log, checks it exited 0.
    pub fn stop(mut self) {
        self.serve.close_input().unwrap();
        let status = self.serve.wait();
        eprint!("{}", self.serve.log());
        assert!(status.success());
    }
}

pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
