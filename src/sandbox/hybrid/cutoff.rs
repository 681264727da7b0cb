//! The input count below which sandboxes are built natively: given, off,
//! or `auto` (measured on this machine by `actionfs calibrate`, else the
//! default shipped from the benchmarks in docs/BENCHMARKS.md for the kind
//! of file system the native sandboxes would live on).

use std::fmt;
use std::path::{Path, PathBuf};

/// The cutoff meaning "build every sandbox natively".
pub const ALWAYS_NATIVE: usize = 1_000_000_000;

/// Cutoffs shipped with actionfs, from the hybrid benchmark and calibrate
/// runs (docs/BENCHMARKS.md, "Hybrid sandboxes"), by the kind of file
/// system native sandboxes would be built on. On tmpfs a native symlink
/// sandbox beat the FUSE view at every size from 10 to 20,000 inputs, so
/// there every sandbox is native. On the root disk (ext4), where creating
/// inodes is slow after the deletes a build does, FUSE won at every size
/// from 10 to 5,000 inputs, so there none is.
pub const SHIPPED_TMPFS: usize = ALWAYS_NATIVE;
pub const SHIPPED_DISK: usize = 0;

/// The shipped cutoff for native sandboxes built in `dir` (or, if it does
/// not exist yet, its nearest existing ancestor).
pub fn shipped_for(dir: &Path) -> usize {
    if on_tmpfs(dir) {
        SHIPPED_TMPFS
    } else {
        SHIPPED_DISK
    }
}

pub use crate::sys::on_tmpfs;

/// What `--native_below` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeBelow {
    /// `0`: always FUSE.
    Off,
    Fixed(usize),
    /// The calibrated cutoff, else [`shipped_for`] the native directory.
    Auto,
}

impl NativeBelow {
    /// `None` for text that is not a count, 0 or auto.
    pub fn parse(text: &str) -> Option<NativeBelow> {
        match text {
            "auto" => Some(NativeBelow::Auto),
            "0" => Some(NativeBelow::Off),
            n => n.parse().ok().map(NativeBelow::Fixed),
        }
    }
}

/// Where `calibrate --write` results are looked for, in order:
/// $ACTIONFS_CALIBRATION, then $HOME/.config/actionfs/calibration.json,
/// then /etc/actionfs/calibration.json (Bazel starts the daemon with only
/// PATH set, so only the last is seen under Bazel).
pub fn calibration_candidates() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(path) = std::env::var_os("ACTIONFS_CALIBRATION") {
        paths.push(PathBuf::from(path));
    }
    if let Some(home) = std::env::var_os("HOME") {
        paths.push(Path::new(&home).join(".config/actionfs/calibration.json"));
    }
    paths.push(PathBuf::from("/etc/actionfs/calibration.json"));
    paths
}

/// A calibration file that cannot be used, and why.
#[derive(Debug)]
pub struct CalibrationError {
    pub path: PathBuf,
    pub problem: CalibrationProblem,
}

#[derive(Debug)]
pub enum CalibrationProblem {
    Read(std::io::Error),
    Parse(serde_json::Error),
    NoCutoff,
}

impl fmt::Display for CalibrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "calibration {:?}: ", self.path)?;
        match &self.problem {
            CalibrationProblem::Read(err) => write!(f, "{err}"),
            CalibrationProblem::Parse(err) => write!(f, "{err}"),
            CalibrationProblem::NoCutoff => f.write_str("no \"native_below\" count"),
        }
    }
}

impl std::error::Error for CalibrationError {}

/// Reads the cutoff saved by `calibrate --write`.
pub fn read_calibration(path: &Path) -> Result<usize, CalibrationError> {
    let fail = |problem| CalibrationError {
        path: path.to_owned(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(CalibrationProblem::Read(e)))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fail(CalibrationProblem::Parse(e)))?;
    value
        .get("native_below")
        .and_then(serde_json::Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| fail(CalibrationProblem::NoCutoff))
}

/// How sandboxes are split between the FUSE view and native trees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Fewer than this many mappings: native (0: never).
    Below(usize),
    /// Per sandbox, from the file system its files would be made on: on
    /// tmpfs native ([`SHIPPED_TMPFS`]), elsewhere FUSE ([`SHIPPED_DISK`]).
    ByFileSystem,
}

impl Policy {
    /// Whether a sandbox of `mappings` mappings whose files would be made
    /// in `made_in` is built natively.
    pub fn wants_native(&self, mappings: usize, made_in: &Path) -> bool {
        match self {
            Policy::Below(below) => mappings < *below,
            Policy::ByFileSystem => mappings < shipped_for(made_in),
        }
    }

    pub fn never_native(&self) -> bool {
        *self == Policy::Below(0)
    }
}

/// The policy to use and where it came from (for the log). `explicit` is
/// a calibration file named on the command line, which must be readable.
pub fn resolve(
    asked: &NativeBelow,
    explicit: Option<&Path>,
) -> Result<(Policy, String), CalibrationError> {
    match asked {
        NativeBelow::Off => Ok((Policy::Below(0), "--native_below=0".to_owned())),
        NativeBelow::Fixed(n) => Ok((Policy::Below(*n), "--native_below".to_owned())),
        NativeBelow::Auto => {
            if let Some(path) = explicit {
                return read_calibration(path).map(|n| (Policy::Below(n), format!("{path:?}")));
            }
            for path in calibration_candidates() {
                match read_calibration(&path) {
                    Ok(n) => return Ok((Policy::Below(n), format!("{path:?}"))),
                    Err(err) if path.exists() => log::warn!("ignoring {err}"),
                    Err(_) => {}
                }
            }
            Ok((
                Policy::ByFileSystem,
                "the file system each sandbox's files are made on".to_owned(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_parse_and_resolve_from_the_named_file() {
        assert_eq!(NativeBelow::parse("0"), Some(NativeBelow::Off));
        assert_eq!(NativeBelow::parse("250"), Some(NativeBelow::Fixed(250)));
        assert_eq!(NativeBelow::parse("auto"), Some(NativeBelow::Auto));
        assert!(NativeBelow::parse("-1").is_none());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.json");
        std::fs::write(&file, r#"{"native_below": 321, "curve": []}"#).unwrap();
        let auto = |file: &Path| resolve(&NativeBelow::Auto, Some(file)).map(|r| r.0);
        assert_eq!(auto(&file).unwrap(), Policy::Below(321));
        assert_eq!(
            resolve(&NativeBelow::Fixed(7), Some(&file)).unwrap().0,
            Policy::Below(7)
        );
        std::fs::write(&file, "{}").unwrap();
        assert!(auto(&file).is_err());
        assert!(auto(&dir.path().join("none")).is_err());
    }

    #[test]
    fn by_file_system_sandboxes_made_on_tmpfs_are_native_and_others_not() {
        let policy = Policy::ByFileSystem;
        if on_tmpfs(Path::new("/dev/shm")) {
            assert!(policy.wants_native(20_000, Path::new("/dev/shm/not-yet/x")));
        }
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        if !on_tmpfs(disk.path()) {
            assert!(!policy.wants_native(1, disk.path()));
        }
        assert!(Policy::Below(5).wants_native(4, disk.path()));
        assert!(!Policy::Below(5).wants_native(5, Path::new("/dev/shm")));
    }
}
