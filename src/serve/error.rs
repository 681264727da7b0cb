//! Why `serve` refused a request, with what it was about, and the one
//! place a refusal becomes the protocol's answer.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use actionfs_protocol::backend::frame::FrameError;
use actionfs_protocol::backend::sandbox::{self, collect, create, destroy};
use actionfs_protocol::resolve::ResolveError;

use super::outputs::OutputError;
use crate::sandbox::backend::Refusal;
use crate::sandbox::merkle::InvalidDirectory;
use crate::sandbox::store::StoreError;
use crate::sandbox::tree::SandboxError;
use crate::sandbox::tree::SymlinkTargetError;

/// Why a Create, Collect or Destroy did not do what it asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a failure: Bazel pushes these digests and asks again.
    #[error("missing content: {}", .0.join(", "))]
    MissingContent(Vec<String>),
    #[error("{0}")]
    InvalidId(ResolveError),
    #[error("it already exists (destroy it first)")]
    Exists,
    #[error("no such sandbox")]
    NoSuchSandbox,
    #[error(
        "hash function {0:?} is not supported (only SHA-256 is; run Bazel with \
         --digest_function=sha256)"
    )]
    HashFunction(String),
    #[error("the manifest has no input_root_digest")]
    NoInputRoot,
    #[error("input_root_digest {0:?} is not a SHA-256 hash")]
    RootNotSha256(String),
    /// The input tree itself is malformed.
    #[error(transparent)]
    Tree(InvalidDirectory),
    #[error(transparent)]
    Output(OutputError),
    #[error("writable dir {path:?}: {why}")]
    WritableDir { path: String, why: WritableDirFault },
    #[error(
        "exec_root {exec_root:?} {fault}, and inputs without pushed content are read below it"
    )]
    DefaultPlacesUnreadable {
        exec_root: PathBuf,
        fault: ExecRootFault,
    },
    /// `input` is `None` where the digest was asked for by no one path.
    #[error("{}pushed content was refused: {refusal}", input_prefix(.input.as_deref(), "its "))]
    PushedContentRefused {
        input: Option<String>,
        refusal: Arc<PushRefusal>,
    },
    /// An input's default place cannot serve it.
    #[error("input {input}: {why}")]
    DefaultPlace { input: String, why: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Io(SyscallFailed),
    /// The symlink targets' holders could not be made.
    #[error(transparent)]
    SymlinkTargets(SymlinkTargetError),
    /// The core refused to build or serve the sandbox.
    #[error("{0}")]
    Core(Refusal),
    #[error("collect: {0}")]
    Collect(OutputError),
    #[error("collect: exec_root {0:?} is not absolute")]
    CollectExecRootNotAbsolute(PathBuf),
    #[error("destroy: {0}")]
    Destroy(Refusal),
    /// A directory blob handed on by a predecessor is not one.
    #[error(transparent)]
    DirectoryBlob(InvalidDirectory),
}

/// `input {input}: {then}`, or nothing without an input.
fn input_prefix(input: Option<&str>, then: &str) -> String {
    match input {
        Some(input) => format!("input {input}: {then}"),
        None => String::new(),
    }
}

/// A system call that failed, and on which path.
#[derive(Debug, thiserror::Error)]
#[error("{syscall} {path:?}: {source}")]
pub struct SyscallFailed {
    pub syscall: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl SyscallFailed {
    fn new(syscall: &'static str, path: impl Into<PathBuf>, source: io::Error) -> SyscallFailed {
        SyscallFailed {
            syscall,
            path: path.into(),
            source,
        }
    }
}

/// What is wrong with a writable directory of a manifest.
#[derive(Debug, thiserror::Error)]
pub enum WritableDirFault {
    #[error("{0}")]
    Path(super::outputs::PathFault),
    #[error("it is the workspace itself")]
    IsTheWorkspace,
    #[error("host path {0:?} is not absolute")]
    HostNotAbsolute(String),
}

/// Why default places cannot be read below an exec root.
#[derive(Debug, thiserror::Error)]
pub enum ExecRootFault {
    #[error("is not absolute")]
    NotAbsolute,
    /// The daemon would read its own view.
    #[error("is inside the mount point {0:?}")]
    InsideTheMount(PathBuf),
    /// A native sandbox's link, say: its tree goes with its Destroy.
    #[error("is inside the backend's own directory {0:?}")]
    InsideTheBackend(PathBuf),
}

impl Error {
    pub fn io(syscall: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io(SyscallFailed::new(syscall, path, source))
    }

    /// Whether a Create refused for this failed (counted as such):
    /// missing content is asked of Bazel, which pushes it.
    pub fn is_failure(&self) -> bool {
        !matches!(self, Error::MissingContent(_))
    }

    /// The answer's text for sandbox `id`: it names the sandbox once, in
    /// front (the core's own refusals name it already).
    fn answer_text(&self, id: &str) -> String {
        let names_it = |refusal: &Refusal| {
            refusal
                .downcast_ref::<SandboxError>()
                .is_some_and(SandboxError::names_the_sandbox)
        };
        match self {
            Error::Core(refusal) if names_it(refusal) => refusal.to_string(),
            other => format!("sandbox {id:?}: {other}"),
        }
    }
}

/// Create's answer: the sandbox's path and confinement, the digests to
/// push, or why not.
pub fn create_answer(id: &str, created: Result<create::result::Ok, Error>) -> create::Result {
    use create::result::Outcome;
    let outcome = match created {
        Ok(ok) => Outcome::Ok(ok),
        Err(Error::MissingContent(digest_hashes)) => {
            Outcome::MissingContent(create::result::MissingContent { digest_hashes })
        }
        Err(err) => Outcome::Error(answer_error(id, &err)),
    };
    create::Result {
        outcome: Some(outcome),
    }
}

pub fn collect_answer(id: &str, collected: Result<(), Error>) -> collect::Result {
    use collect::result::Outcome;
    collect::Result {
        outcome: Some(match collected {
            Ok(()) => Outcome::Ok(collect::result::Ok {}),
            Err(err) => Outcome::Error(answer_error(id, &err)),
        }),
    }
}

pub fn destroy_answer(id: &str, destroyed: Result<(), Error>) -> destroy::Result {
    use destroy::result::Outcome;
    destroy::Result {
        outcome: Some(match destroyed {
            Ok(()) => Outcome::Ok(destroy::result::Ok {}),
            Err(err) => Outcome::Error(answer_error(id, &err)),
        }),
    }
}

fn answer_error(id: &str, err: &Error) -> sandbox::Error {
    sandbox::Error {
        message: err.answer_text(id),
    }
}

/// Why `serve` could not start, or stopped serving before the client
/// closed the stream; before the mount serves, it is Negotiate's answer.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The stream cannot be resynchronised after a frame that cannot be read.
    #[error(
        "request frame #{frame} cannot be read: {source}; stopping (the stream cannot be \
         resynchronised)"
    )]
    UnreadableFrame { frame: u64, source: FrameError },
    #[error("request {rid}: the first request must be Negotiate; stopping")]
    NotNegotiate { rid: u64 },
    #[error(
        "no protocol version in common: the client offers {0:?}, this backend speaks VERSION_1"
    )]
    NoVersionInCommon(Vec<i32>),
    /// A backend option refused (in the command line parser's words).
    #[error("{0}")]
    Options(String),
    #[error("--sandbox_base {0:?} is not absolute")]
    SandboxBaseNotAbsolute(PathBuf),
    #[error(transparent)]
    Io(SyscallFailed),
    #[error(transparent)]
    Remove(#[from] crate::sandbox::materialize::Error),
    #[error("{0:?} is still mounted after a detach")]
    StillMounted(PathBuf),
    #[error("content store: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Daemon(#[from] crate::daemon::DaemonError),
}

impl StartError {
    pub fn io(syscall: &'static str, path: impl Into<PathBuf>, source: io::Error) -> StartError {
        StartError::Io(SyscallFailed::new(syscall, path, source))
    }
}

/// Why a pushed entry was not kept.
#[derive(Debug, thiserror::Error)]
pub enum PushRefusal {
    #[error("a content entry with neither bytes nor a location")]
    NoSource,
    #[error(transparent)]
    Store(StoreError),
}

impl PushRefusal {
    /// Whether pushing the same entry again cannot help: the entry itself
    /// is wrong (bytes that are not its digest's, no bytes at all, a
    /// location that is no file, too large). Otherwise a system call
    /// failed (a full disk, a location missing when read), and the entry
    /// is asked for again: Bazel pushes each entry once unless told
    /// MissingContent.
    pub fn is_lasting(&self) -> bool {
        !matches!(self, PushRefusal::Store(StoreError::Io { .. }))
    }
}
