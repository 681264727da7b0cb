//! Why replay-actions, or one action of a replay, failed: what was being
//! done, to which path, action or backend request, and the error below.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use actionfs_protocol::backend::client::ClientError;
use actionfs_protocol::backend::tree::TreeError;

use super::execlog::ExecLogError;

/// Why replay-actions (or one action, one mode's run) failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation on one path: `syscall` names it as a user would
    /// (`mkdir -p`, `readdir`, `lstat`, ...).
    #[error("{syscall} {}: {source}", .path.display())]
    Io {
        syscall: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A file operation from one path to another (`rename`, `moving`,
    /// `copying`, `staging`; `to` joins them).
    #[error("{op} {} {to_word} {}: {source}", .from.display(), .to.display())]
    Move {
        op: &'static str,
        from: PathBuf,
        to_word: &'static str,
        to: PathBuf,
        source: io::Error,
    },
    /// A path given on the command line (`--exec-root`, `--execlog`,
    /// `--out`) cannot be used.
    #[error("{flag} {}: {source}", .path.display())]
    Flag {
        flag: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("--out {} is not empty", .0.display())]
    OutNotEmpty(PathBuf),
    #[error("finding this executable: {0}")]
    CurrentExe(io::Error),
    /// Removing a tree like `rm -rf`.
    #[error(transparent)]
    Remove(#[from] crate::sandbox::materialize::Error),
    /// The execution log does not parse.
    #[error("{}: {source}", .path.display())]
    ExecLog { path: PathBuf, source: ExecLogError },

    // Planning: what the log asks cannot be replayed as it is.
    #[error("{0:?} has no UTF-8 basename to name the workspace")]
    NoWorkspaceName(PathBuf),
    /// An error planning spawn `number` (1-based) of the log.
    #[error("spawn {number} of the log: {source}")]
    Spawn { number: usize, source: Box<Error> },
    #[error("commandArgs is empty")]
    EmptyCommand,
    #[error("{0:?} is not a plain relative exec path")]
    NotExecPath(String),
    #[error("output {0} has no digest")]
    NoDigest(String),
    #[error(
        "output {path} has a {function} digest, not SHA-256: build with \
         --digest_function=sha256"
    )]
    NotSha256 { path: String, function: String },
    #[error("{0:?} is not UTF-8")]
    NotUtf8(PathBuf),
    /// An input the log names is not in the exec root.
    #[error(
        "input {input}: {source} at {}: is --exec-root the exec root of the build that \
         wrote the log?",
        .host.display()
    )]
    InputMissing {
        input: String,
        host: PathBuf,
        source: io::Error,
    },
    #[error("runfiles member {}: readlink {}: {source}", .member.display(), .link.display())]
    RunfilesLink {
        member: PathBuf,
        link: PathBuf,
        source: io::Error,
    },
    #[error(
        "runfiles member {}: its links never lead into the exec root {}",
        .member.display(),
        .exec_root.display()
    )]
    RunfilesOutside { member: PathBuf, exec_root: PathBuf },

    // Running an action.
    #[error("cannot run {program:?} in {}: {source}", .cwd.display())]
    CannotRun {
        program: String,
        cwd: PathBuf,
        source: io::Error,
    },
    /// The action exited non-zero; `tail` is the end of what it said.
    #[error("{status} in {}{}", .cwd.display(), indented(.tail))]
    ActionFailed {
        status: ExitStatus,
        cwd: PathBuf,
        tail: String,
    },
    /// What was being done around an action (`removing the sandbox`,
    /// `stashing the sandbox`) when `source` happened.
    #[error("{doing}: {source}")]
    While {
        doing: &'static str,
        source: Box<Error>,
    },
    #[error("starting the {name} thread: {source}")]
    Thread { name: String, source: io::Error },
    #[error("{failed} background jobs failed, first: {first}")]
    Background { failed: usize, first: Box<Error> },
    #[error("rename {} to {} (tree deleter): {source}", .from.display(), .to.display())]
    ToTrash {
        from: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    #[error("{} is not empty after the tree deleter finished", .0.display())]
    TrashNotEmpty(PathBuf),
    #[error("{} is gone before it was stashed", .0.display())]
    GoneBeforeStash(PathBuf),
    #[error("mkdir {} (reuse-shm's base): {source}", .path.display())]
    ShmBase { path: PathBuf, source: io::Error },

    // Mode serve: the backend.
    #[error("the input tree of {action}: {source}")]
    InputTree { action: String, source: TreeError },
    #[error("cannot start {} serve: {source}", .backend.display())]
    StartBackend { backend: PathBuf, source: io::Error },
    #[error("a pipe for the backend's stderr: {0}")]
    StderrPipe(nix::Error),
    #[error("a thread for the backend's stderr: {0}")]
    StderrThread(io::Error),
    /// A request (`Negotiate`, `Push`, `Create`, ...) got no answer.
    #[error("{op}: {source}")]
    Request {
        op: &'static str,
        source: RequestError,
    },
    /// The backend answered a request with an error.
    #[error("{}: {message}", refused_prefix(.op))]
    Refused { op: &'static str, message: String },
    /// The backend answered a request with another request's answer.
    #[error("{op} answered {answer}")]
    WrongAnswer { op: &'static str, answer: String },
    #[error("{op}: an answer with no outcome")]
    NoOutcome { op: &'static str },
    #[error(
        "Create: still missing {} digests after {attempts} attempts: {}",
        .missing.len(),
        .missing.join(" ")
    )]
    StillMissing {
        attempts: usize,
        missing: Vec<String>,
    },
    /// `why` tells why the digest is not one Bazel could push.
    #[error("the backend asked for {hash}, {why}")]
    Unpushable { hash: String, why: String },
    #[error("Create: a custom confinement with no wrapper")]
    NoWrapper,
    #[error(
        "Create left confinement unset, though serve was asked for --jail=landlock \
         (no Landlock here? its stderr says)"
    )]
    ConfinementUnset,
    /// Negotiate failed; then the backend ended with `note` or `ended`.
    #[error("{why}{}", ended_note(.note, .ended))]
    Negotiate {
        why: Box<Error>,
        note: Option<String>,
        ended: Option<Box<Error>>,
    },
    #[error("the backend was killed: a request went unanswered")]
    BackendKilled,
    #[error("the backend ended with {0}")]
    BackendExit(ExitStatus),
    #[error("closing the backend: {0}")]
    CloseBackend(ClientError),

    // The whole replay.
    #[error("no action to replay")]
    NoAction,
    #[error(
        "replay-actions failed: {mismatches} outputs differ from the log, {failures} failures"
    )]
    Failed { mismatches: usize, failures: usize },
}

/// Why a request to the backend got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("no answer in {secs} s")]
    Timeout { secs: u64 },
}

impl Error {
    /// A failed file operation on `path`.
    pub fn io(syscall: &'static str, path: &Path, source: io::Error) -> Error {
        let path = path.to_owned();
        Error::Io {
            syscall,
            path,
            source,
        }
    }

    /// The backend refused request `op`.
    pub fn refused(op: &'static str, message: String) -> Error {
        Error::Refused { op, message }
    }

    /// The backend answered request `op` with `answer`, not its own.
    pub fn wrong_answer(op: &'static str, answer: &impl std::fmt::Debug) -> Error {
        let answer = format!("{answer:?}");
        Error::WrongAnswer { op, answer }
    }

    /// Request `op` got no answer.
    pub fn request(op: &'static str, source: RequestError) -> Error {
        Error::Request { op, source }
    }

    /// A failed operation from `from` to `to` (`op FROM to TO`).
    pub fn moving(
        op: &'static str,
        from: impl Into<PathBuf>,
        to: impl Into<PathBuf>,
        source: io::Error,
    ) -> Error {
        Error::Move {
            op,
            from: from.into(),
            to_word: "to",
            to: to.into(),
            source,
        }
    }

    /// This error, as what went wrong `doing` something.
    pub fn during(self, doing: &'static str) -> Error {
        Error::While {
            doing,
            source: Box::new(self),
        }
    }
}

fn indented(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(":\n    {tail}")
    }
}

fn refused_prefix(op: &str) -> String {
    if op == "Negotiate" {
        "the backend refused Negotiate".to_owned()
    } else {
        op.to_owned()
    }
}

fn ended_note(note: &Option<String>, ended: &Option<Box<Error>>) -> String {
    match (note, ended) {
        (Some(note), _) => format!(" ({note})"),
        (None, Some(ended)) => format!(" ({ended})"),
        (None, None) => String::new(),
    }
}
