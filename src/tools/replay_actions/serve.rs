//! Mode `serve`: each action through a sandbox backend (`actionfs serve`),
//! as Bazel's `SandboxBackendSpawnRunner` drives one.
//!
//! One backend per run, started as `BIN serve --workspace <exec root>` and
//! negotiated with the `--backend-opt` values as options. Per action: its
//! input tree (`<ws>/<tree path>` for each input, built once before the
//! runs) is pushed, only the directory blobs (and content entries) this
//! backend has not been sent yet, never the empty Directory (it
//! serializes to no bytes; Bazel never pushes it); Create (on
//! MissingContent, exactly the named digests are pushed and Create is
//! retried, 3 attempts in all, as Bazel does); the action runs in
//! `<Ok.path>/<ws>`; on success Collect into this mode's exec root;
//! Destroy; the action's scratch directory (`<mode dir>/scratch/<id>`,
//! holding `tmp`, which `writable_dirs` maps `/tmp` to, and `test_tmpdir`
//! for a test's TEST_TMPDIR) is removed.
//!
//! Content entries, by `--content`:
//! - `bazel` (the default), as Bazel 7's runner: a virtual input (param
//!   file, empty runfiles marker) inline with RETENTION_SINGLE_USE in
//!   every action's Push; a runfiles member by the relative location
//!   `<ws>/<its exec path>` (relative to `Manifest.exec_root`), REUSE;
//!   every other leaf none, read from the default place
//!   `Manifest.exec_root/<ws>/<exec path>`, the original exec root.
//!   A MissingContent naming a digest with no entry fails the action, as
//!   it does in Bazel, which holds no bytes to push for it;
//! - `default`: no entry at all; `location`: every leaf's absolute path
//!   in the exec root; `inline`: every leaf's bytes (to exercise the
//!   backend's store).
//!
//! The answer to Create may ask for a confinement: a custom one wraps the
//! action's argv; unconfined runs it as it is; none runs it in Bazel's
//! jail with `--jail` ([`super::jail`]), else as it is (to measure the
//! backend alone). With no jail, `/tmp` in the action is the host's
//! `/tmp`: `writable_dirs` maps it, but only a jail would apply that.
//!
//! Every answer is awaited at most `SANDBOX_BACKEND_REQUEST_TIMEOUT_SECS`
//! (default 60, as Bazel); after a timeout the backend is killed at the end
//! of the run, not closed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actionfs_protocol::backend::client::{Client, ClientError};
use actionfs_protocol::backend::digest::{digest_of, HASH_FUNCTION};
use actionfs_protocol::backend::sandbox::{
    self, collect, content, create, destroy, negotiate, request::Op, response,
};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};

use super::error::RequestError;
use super::jail::Jail;
use super::plan::{Action, Input, Plan, Source};
use super::run::{self, make_dir, remove, results_root, Wrapper};
use super::steps::{Step, StepClock};
use super::{Error, Session};

/// Create attempts per action, MissingContent answers included (Bazel's).
const CREATE_ATTEMPTS: usize = 3;

/// What is pushed as content for each leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentMode {
    /// As Bazel 7's runner: virtual inputs inline (single use), runfiles
    /// members by relative location, the rest nothing.
    Bazel,
    /// Nothing: the backend reads leaves from the default place.
    Default,
    /// Each leaf's path in the exec root.
    Location,
    /// Each leaf's bytes.
    Inline,
}

impl ContentMode {
    pub fn parse(text: &str) -> Option<ContentMode> {
        match text {
            "bazel" => Some(ContentMode::Bazel),
            "default" | "none" => Some(ContentMode::Default),
            "location" => Some(ContentMode::Location),
            "inline" => Some(ContentMode::Inline),
            _ => None,
        }
    }
}

/// The input tree of each action, as the backend sees it: every input at
/// `<ws>/<tree path>`, each empty directory input as an empty directory,
/// and the workspace directory even when empty.
pub fn trees(plan: &Plan) -> Result<Vec<Tree>, Error> {
    plan.actions
        .iter()
        .map(|action| {
            let mut builder = TreeBuilder::new();
            let in_tree = |source| Error::InputTree {
                action: action.name(),
                source,
            };
            builder.add_dir(&plan.workspace).map_err(in_tree)?;
            for input in &action.inputs {
                builder
                    .add_file(
                        &format!("{}/{}", plan.workspace, input.path),
                        input.digest.clone(),
                        input.executable,
                    )
                    .map_err(in_tree)?;
            }
            for dir in &action.empty_dirs {
                builder
                    .add_dir(&format!("{}/{dir}", plan.workspace))
                    .map_err(in_tree)?;
            }
            Ok(builder.build())
        })
        .collect()
}

pub struct Serve<'a> {
    plan: &'a Plan,
    trees: &'a [Tree],
    content: ContentMode,
    client: Client,
    /// Digest hashes (blobs and content) this backend was sent.
    pushed: Mutex<HashSet<String>>,
    /// `<mode dir>/execroot`: Collect's exec root.
    collect_root: String,
    /// `<mode dir>/execroot/<ws>`.
    results: PathBuf,
    /// `<mode dir>/scratch`: a scratch directory per action below it.
    scratch: PathBuf,
    jail: Option<&'a Jail>,
    timeout: Duration,
    /// A request went unanswered: kill the backend at the end.
    timed_out: AtomicBool,
    reports: BackendReports,
    /// From its spawn to Negotiate's answer: what Bazel's first action
    /// waits for beyond its own sandbox (untimed in the steps).
    ready_in: Duration,
}

/// The user's backend options, and the jail's unless they name one: with
/// no `--jail` for replay, `--jail=bazel`, so that Create leaves
/// confinement unset and the action runs bare.
fn with_jail(options: &[String], jail: Option<&Jail>) -> Vec<String> {
    let mut all = options.to_vec();
    if !options.iter().any(|o| o.starts_with("--jail")) {
        all.push(Jail::serve_option(jail).to_owned());
    }
    all
}

impl<'a> Serve<'a> {
    /// Starts the backend and negotiates.
    pub fn start(
        plan: &'a Plan,
        trees: &'a [Tree],
        mode_dir: &Path,
        backend: &Path,
        options: &[String],
        content: ContentMode,
        jail: Option<&'a Jail>,
    ) -> Result<Serve<'a>, Error> {
        let results = results_root(mode_dir, &plan.workspace);
        let scratch = mode_dir.join("scratch");
        make_dir(&results)?;
        make_dir(&scratch)?;
        let mut command = Command::new(backend);
        command.arg("serve").arg("--workspace").arg(&plan.exec_root);
        let reports = BackendReports::forward(&mut command)?;
        let spawned = Instant::now();
        let client = Client::spawn(command).map_err(|source| Error::StartBackend {
            backend: backend.to_owned(),
            source,
        })?;
        let timeout = Duration::from_secs(
            std::env::var("SANDBOX_BACKEND_REQUEST_TIMEOUT_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(60),
        );
        let serve = Serve {
            plan,
            trees,
            content,
            client,
            pushed: Mutex::new(HashSet::new()),
            collect_root: mode_dir.join("execroot").to_string_lossy().into_owned(),
            results,
            scratch,
            jail,
            timeout,
            timed_out: AtomicBool::new(false),
            reports,
            ready_in: Duration::ZERO,
        };
        let negotiated = serve.call(
            "",
            Op::Negotiate(sandbox::Negotiate {
                options: with_jail(options, jail),
                versions: vec![sandbox::Version::Version1 as i32],
            }),
        );
        let ready_in = spawned.elapsed();
        let refused = match negotiated {
            Ok(response::Result::Negotiate(negotiate::Result {
                outcome: Some(negotiate::result::Outcome::Ok(_)),
            })) => None,
            Ok(response::Result::Negotiate(negotiate::Result {
                outcome: Some(negotiate::result::Outcome::Error(err)),
            })) => Some(Error::refused("Negotiate", err.message)),
            Ok(other) => Some(Error::wrong_answer("Negotiate", &other)),
            Err(source) => Some(Error::request("Negotiate", source)),
        };
        match refused {
            None => Ok(Serve { ready_in, ..serve }),
            Some(why) => {
                let (note, ended) = match Box::new(serve).finish() {
                    Ok(note) => (note, None),
                    Err(ended) => (None, Some(Box::new(ended))),
                };
                Err(Error::Negotiate {
                    why: Box::new(why),
                    note,
                    ended,
                })
            }
        }
    }

    /// Sends `op` and waits for its answer, at most the timeout.
    fn call(&self, id: &str, op: Op) -> Result<response::Result, RequestError> {
        let answer = self.client.send(id, op)?;
        match answer.recv_timeout(self.timeout) {
            Ok(Ok(response)) => Ok(response.result.ok_or(ClientError::WrongAnswer)?),
            Ok(Err(err)) => Err(err.into()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                self.timed_out.store(true, Ordering::Relaxed);
                Err(RequestError::Timeout {
                    secs: self.timeout.as_secs(),
                })
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(ClientError::Closed.into()),
        }
    }

    /// The content entry for `input`, if this mode sends one.
    fn content(&self, input: &Input) -> Result<Option<sandbox::Content>, Error> {
        let host = || self.plan.exec_root.join(&input.path);
        let read =
            |host: PathBuf| std::fs::read(&host).map_err(|err| Error::io("reading", &host, err));
        let (retention, source) = match (self.content, &input.source) {
            (ContentMode::Bazel, Source::Natural) | (ContentMode::Default, _) => return Ok(None),
            (ContentMode::Bazel, Source::Virtual) => (
                sandbox::Retention::SingleUse,
                content::Source::Inline(read(host())?),
            ),
            // Relative to Manifest.exec_root, as Bazel names it.
            (ContentMode::Bazel, Source::Runfiles(exec_path)) => (
                sandbox::Retention::Reuse,
                content::Source::Location(format!("{}/{exec_path}", self.plan.workspace)),
            ),
            (ContentMode::Inline, _) => (
                sandbox::Retention::Reuse,
                content::Source::Inline(read(host())?),
            ),
            (ContentMode::Location, _) => (
                sandbox::Retention::Reuse,
                content::Source::Location(host().to_string_lossy().into_owned()),
            ),
        };
        Ok(Some(sandbox::Content {
            retention: retention as i32,
            source: Some(source),
        }))
    }

    /// Pushes what of the action's tree and content entries this backend
    /// was not sent (single-use entries every time, as Bazel does); or,
    /// with `only`, exactly those digests. Never the empty Directory.
    fn push(&self, action: &Action, tree: &Tree, only: Option<&[String]>) -> Result<(), Error> {
        let mut pushed = self
            .pushed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut push = sandbox::Push::default();
        match only {
            None => {
                for (hash, blob) in &tree.blobs {
                    if !blob.is_empty() && !pushed.contains(hash) {
                        push.blobs.insert(hash.clone(), blob.clone());
                    }
                }
                for input in &action.inputs {
                    let hash = &input.digest.hash;
                    if push.content.contains_key(hash) {
                        continue;
                    }
                    let single_use =
                        self.content == ContentMode::Bazel && input.source == Source::Virtual;
                    if single_use || !pushed.contains(hash) {
                        if let Some(entry) = self.content(input)? {
                            push.content.insert(hash.clone(), entry);
                        }
                    }
                }
            }
            Some(hashes) => {
                let leaves: HashMap<&str, &Input> = action
                    .inputs
                    .iter()
                    .map(|input| (input.digest.hash.as_str(), input))
                    .collect();
                for hash in hashes {
                    let entry = match leaves.get(hash.as_str()) {
                        Some(input) => self.content(input)?,
                        None => None,
                    };
                    if let Some(entry) = entry {
                        push.content.insert(hash.clone(), entry);
                    } else if let Some(blob) = tree.blobs.get(hash).filter(|b| !b.is_empty()) {
                        push.blobs.insert(hash.clone(), blob.clone());
                    } else {
                        return Err(Error::Unpushable {
                            hash: hash.clone(),
                            why: self.unpushable(hash, leaves.get(hash.as_str()).copied()),
                        });
                    }
                }
            }
        }
        let hashes: Vec<String> = push
            .blobs
            .keys()
            .chain(push.content.keys())
            .cloned()
            .collect();
        if hashes.is_empty() {
            return Ok(());
        }
        self.client.push(push).map_err(|err| Error::Request {
            op: "Push",
            source: err.into(),
        })?;
        pushed.extend(hashes);
        Ok(())
    }

    /// Why a digest the backend asked for cannot be pushed, as Bazel could
    /// not: it has bytes only for blobs and content entries.
    fn unpushable(&self, hash: &str, leaf: Option<&Input>) -> String {
        if let Some(input) = leaf {
            format!(
                "the digest of {}, which Bazel leaves at the default place and holds no bytes for",
                input.path
            )
        } else if *hash == digest_of(b"").hash {
            "the empty Directory, which serializes to no bytes and is never pushed".to_owned()
        } else {
            "which is not in the action's tree".to_owned()
        }
    }

    /// The manifest, and `writable_dirs` made in `scratch` as Bazel does:
    /// `/tmp` -> `scratch/tmp`, and a test's TEST_TMPDIR (keyed
    /// `/<ws>/<path>` when relative) -> `scratch/test_tmpdir`; the
    /// confinement setting as Bazel sends it.
    fn manifest(
        &self,
        action: &Action,
        tree: &Tree,
        scratch: &Path,
    ) -> Result<sandbox::Manifest, Error> {
        let ws = &self.plan.workspace;
        let tmp = scratch.join("tmp");
        make_dir(&tmp)?;
        let mut writable_dirs =
            HashMap::from([("/tmp".to_owned(), tmp.to_string_lossy().into_owned())]);
        if let Some(dir) = run::test_tmpdir(action) {
            let host = scratch.join("test_tmpdir");
            make_dir(&host)?;
            let key = if dir.starts_with('/') {
                dir.to_owned()
            } else {
                format!("/{ws}/{dir}")
            };
            writable_dirs.insert(key, host.to_string_lossy().into_owned());
        }
        Ok(sandbox::Manifest {
            mnemonic: action.mnemonic.clone(),
            exec_root: self
                .plan
                .exec_root
                .parent()
                .expect("the exec root is absolute and has a basename")
                .to_string_lossy()
                .into_owned(),
            hash_function: HASH_FUNCTION.to_owned(),
            input_root_digest: Some(tree.root.clone()),
            outputs: action
                .outputs
                .iter()
                .map(|output| {
                    (
                        format!("/{ws}/{}", output.path),
                        sandbox::Output {
                            r#type: if output.dir { "dir" } else { "file" }.to_owned(),
                            dest: String::new(),
                        },
                    )
                })
                .collect(),
            writable_dirs,
            // SandboxBackendSpawnRunner's: the scratch directory and the
            // platform's temporary and device directories; no network, as
            // `-N` (the 4.2.3 log cannot say which actions may use it).
            confinement_setting: Some(sandbox::ConfinementSetting {
                writable_paths: [
                    &*scratch.to_string_lossy(),
                    "/dev",
                    "/tmp",
                    "/private/tmp",
                    "/private/var/tmp",
                ]
                .map(str::to_owned)
                .to_vec(),
                inaccessible_paths: Vec::new(),
                allow_network: false,
            }),
        })
    }

    /// Creates the sandbox, pushing what the backend says it misses;
    /// returns its answer.
    fn create(
        &self,
        id: &str,
        action: &Action,
        tree: &Tree,
        manifest: &sandbox::Manifest,
    ) -> Result<create::result::Ok, Error> {
        for attempt in 1..=CREATE_ATTEMPTS {
            let answer = self.call(
                id,
                Op::Create(sandbox::Create {
                    manifest: Some(manifest.clone()),
                }),
            );
            let outcome = match answer {
                Ok(response::Result::Create(create::Result { outcome })) => outcome,
                Ok(other) => return Err(Error::wrong_answer("Create", &other)),
                Err(source) => return Err(Error::request("Create", source)),
            };
            match outcome {
                Some(create::result::Outcome::Ok(ok)) => return Ok(ok),
                Some(create::result::Outcome::Error(err)) => {
                    return Err(Error::refused("Create", err.message))
                }
                Some(create::result::Outcome::MissingContent(missing)) => {
                    if attempt == CREATE_ATTEMPTS {
                        return Err(Error::StillMissing {
                            attempts: CREATE_ATTEMPTS,
                            missing: missing.digest_hashes,
                        });
                    }
                    self.push(action, tree, Some(&missing.digest_hashes))?;
                }
                None => return Err(Error::NoOutcome { op: "Create" }),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Runs the action in the sandbox and collects its outputs.
    fn run_and_collect(
        &self,
        id: &str,
        action: &Action,
        created: &create::result::Ok,
        scratch: &Path,
        clock: &StepClock,
    ) -> Result<(), Error> {
        clock.time(Step::Run, || self.run_action(action, created, scratch))?;
        clock.time(Step::Collect, || self.collect(id, action))
    }

    /// Runs the action in the sandbox, confined as the Create answer says.
    fn run_action(
        &self,
        action: &Action,
        created: &create::result::Ok,
        scratch: &Path,
    ) -> Result<(), Error> {
        let cwd = Path::new(&created.path).join(&self.plan.workspace);
        match &created.confinement {
            Some(create::result::ok::Confinement::Custom(custom)) => {
                if custom.wrapper.is_empty() {
                    return Err(Error::NoWrapper);
                }
                let wrapper = Wrapper {
                    argv: &custom.wrapper,
                    env: &custom.env,
                };
                run::command(action, &cwd, Some(&wrapper))?;
            }
            None if self.jail.is_some() => {
                let jail = self.jail.expect("checked");
                let argv = jail
                    .builtin(scratch, Path::new(&created.path))
                    .ok_or(Error::ConfinementUnset)?;
                let env = HashMap::new();
                run::command(
                    action,
                    &cwd,
                    Some(&Wrapper {
                        argv: &argv,
                        env: &env,
                    }),
                )?;
            }
            Some(create::result::ok::Confinement::Unconfined(_)) | None => {
                run::command(action, &cwd, None)?;
            }
        }
        Ok(())
    }

    /// Collect into this mode's exec root.
    fn collect(&self, id: &str, action: &Action) -> Result<(), Error> {
        for output in &action.outputs {
            run::make_parent(&self.results, &output.path)?;
        }
        match self.call(
            id,
            Op::Collect(sandbox::Collect {
                exec_root: self.collect_root.clone(),
            }),
        ) {
            Ok(response::Result::Collect(collect::Result {
                outcome: Some(collect::result::Outcome::Ok(_)),
            })) => Ok(()),
            Ok(response::Result::Collect(collect::Result {
                outcome: Some(collect::result::Outcome::Error(err)),
            })) => Err(Error::refused("Collect", err.message)),
            Ok(other) => Err(Error::wrong_answer("Collect", &other)),
            Err(source) => Err(Error::request("Collect", source)),
        }
    }

    fn destroy(&self, id: &str) -> Result<(), Error> {
        match self.call(id, Op::Destroy(sandbox::Destroy {})) {
            Ok(response::Result::Destroy(destroy::Result {
                outcome: Some(destroy::result::Outcome::Ok(_)),
            })) => Ok(()),
            Ok(response::Result::Destroy(destroy::Result {
                outcome: Some(destroy::result::Outcome::Error(err)),
            })) => Err(Error::refused("Destroy", err.message)),
            Ok(other) => Err(Error::wrong_answer("Destroy", &other)),
            Err(source) => Err(Error::request("Destroy", source)),
        }
    }
}

impl Session for Serve<'_> {
    fn replay(&self, index: usize, action: &Action, clock: &StepClock) -> Result<(), Error> {
        let tree = &self.trees[index];
        let id = format!("a{}", action.number);
        let scratch = self.scratch.join(&id);
        make_dir(&scratch)?;
        let created = clock.time(Step::Setup, || {
            self.push(action, tree, None)?;
            let manifest = self.manifest(action, tree, &scratch)?;
            self.create(&id, action, tree, &manifest)
        });
        let result = created.and_then(|created| {
            let ran = self.run_and_collect(&id, action, &created, &scratch, clock);
            let destroyed = clock.time(Step::Teardown, || self.destroy(&id));
            ran.and(destroyed)
        });
        let removed = remove(&scratch);
        result.and(removed)
    }

    /// Closes the backend's input and waits for it to exit, which must be
    /// with status 0; kills it instead if a request timed out.
    fn finish(self: Box<Self>) -> Result<Option<String>, Error> {
        if self.timed_out.load(Ordering::Relaxed) {
            // Dropping the client kills the backend.
            drop(self.client);
            return Err(Error::BackendKilled);
        }
        // The backend's own figures for the run, asked for before it goes.
        let summary = self
            .client
            .child_id()
            .and_then(|pid| self.reports.ask(pid))
            .map_or("backend: no stats report".to_owned(), |stats| {
                super::report::backend_summary(&stats, self.plan.actions.len())
            });
        match self.client.close() {
            Ok(Some(status)) if status.success() => Ok(Some(format!(
                "backend {status}, ready in {:.1} ms; {summary}",
                self.ready_in.as_secs_f64() * 1e3
            ))),
            Ok(Some(status)) => Err(Error::BackendExit(status)),
            Ok(None) => Ok(None),
            Err(err) => Err(Error::CloseBackend(err)),
        }
    }
}

/// The backend's stderr, passed on line by line, but for its SIGUSR1
/// reports (one long JSON line each), which are kept for
/// [`BackendReports::ask`].
struct BackendReports {
    last: std::sync::Arc<Mutex<(usize, Option<String>)>>,
}

impl BackendReports {
    const MARK: &'static str = "stats (SIGUSR1): ";

    fn forward(command: &mut Command) -> Result<BackendReports, Error> {
        use std::io::BufRead;
        let piped = nix::unistd::pipe().and_then(|(reader, writer)| {
            // Only the backend's stderr holds the write end, or the
            // reader's end of file would wait for other children too.
            for fd in [&reader, &writer] {
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
                )?;
            }
            Ok((reader, writer))
        });
        let (reader, writer) = piped.map_err(Error::StderrPipe)?;
        command.stderr(std::process::Stdio::from(writer));
        let reader = std::fs::File::from(reader);
        let last = std::sync::Arc::new(Mutex::new((0, None)));
        let kept = last.clone();
        std::thread::Builder::new()
            .name("backend-stderr".into())
            .spawn(move || {
                for line in std::io::BufReader::new(reader).lines() {
                    let Ok(line) = line else { break };
                    match line.split_once(Self::MARK) {
                        Some((_, json)) => {
                            let mut kept = kept.lock().unwrap();
                            *kept = (kept.0 + 1, Some(json.to_owned()));
                        }
                        None => eprintln!("{line}"),
                    }
                }
            })
            .map_err(Error::StderrThread)?;
        Ok(BackendReports { last })
    }

    /// Sends SIGUSR1 to the backend and waits (at most 10 s) for the
    /// report it writes.
    fn ask(&self, pid: u32) -> Option<serde_json::Value> {
        let seen = self.last.lock().unwrap().0;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
        nix::sys::signal::kill(pid, nix::sys::signal::SIGUSR1).ok()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let (n, Some(json)) = &*self.last.lock().unwrap() {
                if *n > seen {
                    return serde_json::from_str(json).ok();
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}
