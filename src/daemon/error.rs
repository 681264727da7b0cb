//! Why the daemon could not start or stopped with an error (exit status 1).

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::sandbox::hybrid::cutoff::CalibrationError;
use crate::sandbox::layout::PlanError;

#[derive(Debug)]
pub enum DaemonError {
    /// The mount point is missing, stale beyond repair, or unusable.
    MountPoint {
        path: PathBuf,
        source: io::Error,
    },
    NotADirectory(PathBuf),
    /// `--allow=root|other` without `user_allow_other`.
    AllowOtherRefused,
    Input {
        path: PathBuf,
        source: io::Error,
    },
    Output {
        path: PathBuf,
        source: io::Error,
    },
    /// A `--mapping` cannot be served.
    Mapping(PlanError),
    Calibration(CalibrationError),
    NativeDir(crate::sandbox::hybrid::NativeDirError),
    Signals(io::Error),
    Mount {
        path: PathBuf,
        source: io::Error,
    },
    Thread {
        name: &'static str,
        source: io::Error,
    },
    Unmount {
        path: PathBuf,
        source: io::Error,
    },
    Session(io::Error),
    AccessLog {
        path: PathBuf,
        source: io::Error,
    },
    Record {
        path: PathBuf,
        source: io::Error,
    },
    Control(io::Error),
    /// `--transport=io_uring` where the kernel does not offer it.
    Transport(String),
    /// Every thread that could stop the daemon ended without saying why.
    ThreadsEnded,
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonError::MountPoint { path, source } => write!(f, "mount point {path:?}: {source}"),
            DaemonError::NotADirectory(path) => {
                write!(f, "mount point {path:?} is not a directory")
            }
            DaemonError::AllowOtherRefused => f.write_str(
                "--allow=root and --allow=other need 'user_allow_other' in /etc/fuse.conf \
                 when actionfs does not run as root",
            ),
            // sandboxfs 0.2.0's words, which scripts grep for.
            DaemonError::Input { path, source } => write!(
                f,
                "Failed to open reconfiguration input '{}': {source}",
                path.display()
            ),
            DaemonError::Output { path, source } => write!(
                f,
                "Failed to open reconfiguration output '{}': {source}",
                path.display()
            ),
            DaemonError::Mapping(err) => write!(f, "--mapping: {err}"),
            DaemonError::Calibration(err) => write!(f, "{err}"),
            DaemonError::NativeDir(err) => write!(f, "native sandbox directory: {err}"),
            DaemonError::Signals(err) => write!(f, "cannot install signal handlers: {err}"),
            DaemonError::Mount { path, source } => write!(f, "cannot mount at {path:?}: {source}"),
            DaemonError::Thread { name, source } => {
                write!(f, "cannot start the {name} thread: {source}")
            }
            DaemonError::Unmount { path, source } => write!(f, "cannot unmount {path:?}: {source}"),
            DaemonError::Session(err) => write!(f, "FUSE session failed: {err}"),
            DaemonError::AccessLog { path, source } => {
                write!(f, "cannot open the access log {path:?}: {source}")
            }
            DaemonError::Record { path, source } => {
                write!(f, "cannot create the recording {path:?}: {source}")
            }
            DaemonError::Control(err) => write!(f, "{err}"),
            DaemonError::Transport(why) => write!(f, "{why}"),
            DaemonError::ThreadsEnded => f.write_str("every daemon thread ended unexpectedly"),
        }
    }
}

impl std::error::Error for DaemonError {}
