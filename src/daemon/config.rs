//! What the daemon is asked to do: the runtime's own configuration types,
//! filled in by the command line (`cli`) or by tests, and read by the
//! daemon, the mount and the core.

use std::path::PathBuf;
use std::time::Duration;

use actionfs_protocol::ResolvedMapping;

use crate::fuse::options::{Allow, ZeroMessageOpens};
use crate::sandbox::hybrid::cutoff::NativeBelow;
use crate::sandbox::materialize::Method;

/// Everything the daemon needs to run, however it was asked for.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub allow: Allow,
    /// `None` means stdin.
    pub input: Option<PathBuf>,
    /// `None` means stdout.
    pub output: Option<PathBuf>,
    pub mappings: Vec<ResolvedMapping>,
    pub ttl: Duration,
    pub xattrs: bool,
    /// Try FUSE passthrough for file data.
    pub passthrough: bool,
    pub zero_message_opens: ZeroMessageOpens,
    /// Which transport carries FUSE requests (`--transport`).
    pub transport: crate::fuse::transport::Asked,
    pub native_below: NativeBelow,
    pub native_method: Method,
    /// Destroyed native sandboxes kept per file system for reuse.
    pub native_stashes: usize,
    /// `None`: next to the mount point.
    pub native_dir: Option<PathBuf>,
    pub calibration: Option<PathBuf>,
    pub reconfig_threads: usize,
    pub mount_point: PathBuf,
    /// Where to write what each sandbox did with its inputs, at destroy.
    pub access_log: Option<PathBuf>,
    /// The control socket (`control`).
    pub control: Option<PathBuf>,
    /// Where to record the request stream (`record`).
    pub record: Option<PathBuf>,
}
