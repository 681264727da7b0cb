//! `actionfs serve` as Bazel runs it: stdin and stdout piped to a
//! [`Client`], stderr to a log the test reads back.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use actionfs_protocol::backend::client::{Answer, Client, ClientError};
use actionfs_protocol::backend::reapi::Digest;
use actionfs_protocol::backend::sandbox::{self, create, negotiate, Manifest};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};

/// RUST_LOG for a backend whose log a test reads: the SIGUSR1 report
/// (warn) and what the start removed of dead backends (lifecycle, info).
pub const LOGGED: &[(&str, &str)] = &[("RUST_LOG", "warn,actionfs::lifecycle=info")];

/// What a backend's own directory on the sandbox base is named: this,
/// then its pid ([`backend_dir_name`]).
pub const BACKEND_DIR_PREFIX: &str = "actionfs-serve-";

pub fn backend_dir_name(pid: u32) -> String {
    format!("{BACKEND_DIR_PREFIX}{pid}")
}

/// Where on the sandbox base a backend hands its store on to the next
/// backend of its user (`--keep_state=on`).
pub fn warm_dir_name() -> String {
    format!("actionfs-warm-{}", nix::unistd::geteuid())
}

/// Where on the sandbox base a backend of this user keeps its state while
/// it runs, and hands on what it stashed, where its looks found files and
/// its directory blobs (`--keep_state=on`).
pub fn state_dir_name() -> String {
    format!("actionfs-state-{}", nix::unistd::geteuid())
}

/// How long [`ServeProcess::wait`] waits for the exit: a backend that does
/// not end is a failure, never a hung test.
const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// One `actionfs serve` process and a client on its pipes. Dropping it
/// kills the process if it is still running.
pub struct ServeProcess {
    child: Child,
    client: Option<Client>,
    log: Option<PathBuf>,
}

impl ServeProcess {
    /// Starts `bin serve --workspace WORKSPACE` with `env` added, its
    /// stderr to a new file at `log` (else discarded).
    pub fn spawn(
        bin: impl AsRef<OsStr>,
        workspace: &Path,
        log: Option<&Path>,
        env: &[(&str, &str)],
    ) -> ServeProcess {
        let stderr = match log {
            Some(path) => fs::File::create(path)
                .unwrap_or_else(|err| panic!("{path:?}: {err}"))
                .into(),
            None => Stdio::null(),
        };
        let mut child = Command::new(bin)
            .args(["serve", "--workspace"])
            .arg(workspace)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawning actionfs serve");
        // Not Client::spawn: the test keeps the child, to signal and wait.
        let client = Client::new(
            Box::new(child.stdin.take().unwrap()),
            Box::new(child.stdout.take().unwrap()),
        );
        ServeProcess {
            child,
            client: Some(client),
            log: log.map(Path::to_owned),
        }
    }

    /// Negotiates `--sandbox_base=BASE`, then `--transport=T` if
    /// `transport` is set, then `options`; panics, with the log, unless
    /// the answer is Ok. Returns the options sent.
    pub fn negotiate_or_panic(
        &self,
        base: &Path,
        transport: Option<String>,
        options: &[&str],
    ) -> Vec<String> {
        let mut all = vec![format!("--sandbox_base={}", base.display())];
        all.extend(transport.map(|t| format!("--transport={t}")));
        all.extend(options.iter().map(|o| o.to_string()));
        match self.client().negotiate(all.clone()).unwrap().outcome {
            Some(negotiate::result::Outcome::Ok(_)) => all,
            other => panic!("negotiate {all:?}: {other:?}\n{}", self.log()),
        }
    }

    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("the client is not closed")
    }

    /// The client, for a test that closes it elsewhere (another thread).
    pub fn take_client(&mut self) -> Client {
        self.client.take().expect("the client is not closed")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its directory on the sandbox base.
    pub fn dir_name(&self) -> String {
        backend_dir_name(self.pid())
    }

    /// Its stderr so far (empty if discarded).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|path| fs::read_to_string(path).ok())
            .unwrap_or_default()
    }

    /// Whether `what` shows in its log within 10 s (work it does on a
    /// thread of its own as it starts).
    pub fn logs(&self, what: &str) -> bool {
        crate::wait_for(Duration::from_secs(10), || self.log().contains(what))
    }

    /// Its counters now: the report SIGUSR1 makes it log (at warn).
    pub fn stats(&self) -> serde_json::Value {
        crate::signalled_report(self.pid(), || self.log())
    }

    pub fn signal(&self, signal: libc::c_int) {
        let pid = crate::nix_pid(self.pid());
        // SAFETY: kill with a valid signal number has no memory effects.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// Pushes the tree's blobs (no content).
    pub fn push_tree(&self, tree: &Tree) {
        self.client().push(tree.to_push()).unwrap();
    }

    /// The tree of `files` (path from the root, digest; each a regular,
    /// non-executable file), its blobs pushed (no content).
    pub fn push_files<P: AsRef<str>>(&self, files: impl IntoIterator<Item = (P, Digest)>) -> Tree {
        let mut builder = TreeBuilder::new();
        for (path, digest) in files {
            builder.add_file(path.as_ref(), digest, false).unwrap();
        }
        let tree = builder.build();
        self.push_tree(&tree);
        tree
    }

    /// Creates `id`, expecting Ok; returns the sandbox root.
    pub fn create_ok(&self, id: &str, manifest: Manifest) -> PathBuf {
        match self.client().create(id, manifest).unwrap().outcome {
            Some(create::result::Outcome::Ok(ok)) => PathBuf::from(ok.path),
            other => panic!("create {id}: {other:?}\n{}", self.log()),
        }
    }

    /// Sends a Create without waiting for its answer.
    pub fn send_create(&self, id: &str, manifest: Manifest) -> Receiver<Answer> {
        self.client()
            .send(
                id,
                sandbox::request::Op::Create(sandbox::Create {
                    manifest: Some(manifest),
                }),
            )
            .unwrap()
    }

    /// Closes its stdin, as Bazel does at the end, and waits for its
    /// stdout to end (not for the exit: see [`ServeProcess::wait`]). Err
    /// if the output broke the protocol.
    pub fn close_input(&mut self) -> Result<(), ClientError> {
        self.take_client().close().map(drop)
    }

    /// Its exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits for the exit, at most a minute: past that, kills it and
    /// panics with the log.
    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + EXIT_LIMIT;
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!("still running {EXIT_LIMIT:?} later\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills it unless it has exited, and reaps it.
    pub fn kill(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
