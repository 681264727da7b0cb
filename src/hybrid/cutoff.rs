//! The input count below which sandboxes are built natively: given, off,
//! or `auto` (measured on this machine by `actionfs calibrate`, else the
//! default shipped from the benchmarks in docs/BENCHMARKS.md).

use std::path::{Path, PathBuf};

/// Cutoff shipped with actionfs, from the hybrid benchmark
/// (docs/BENCHMARKS.md, "Hybrid sandboxes"): on the 2-vCPU machine it was
/// measured on, a native symlink sandbox beat the FUSE view at every size
/// from 10 to 20,000 inputs, on tmpfs and on xfs, and cost less per input,
/// so `auto` without a calibration builds every sandbox natively.
/// `calibrate` measures it anew where FUSE round trips are cheaper.
pub const SHIPPED: usize = super::calibrate::ALWAYS_NATIVE;

/// What `--native_below` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeBelow {
    /// `0`: always FUSE.
    Off,
    Fixed(usize),
    /// The calibrated cutoff, else [`SHIPPED`].
    Auto,
}

impl NativeBelow {
    pub fn parse(text: &str) -> Result<NativeBelow, String> {
        match text {
            "auto" => Ok(NativeBelow::Auto),
            "0" => Ok(NativeBelow::Off),
            n => n
                .parse()
                .map(NativeBelow::Fixed)
                .map_err(|_| format!("--native_below takes a count, 0 or auto, not {n:?}")),
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

/// Reads the cutoff saved by `calibrate --write`.
pub fn read_calibration(path: &Path) -> Result<usize, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path:?}: {e}"))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{path:?}: {e}"))?;
    value
        .get("native_below")
        .and_then(serde_json::Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| format!("{path:?}: no \"native_below\" count"))
}

/// The cutoff to use and where it came from (for the log). `explicit` is
/// a calibration file named on the command line, which must be readable.
pub fn resolve(asked: &NativeBelow, explicit: Option<&Path>) -> Result<(usize, String), String> {
    match asked {
        NativeBelow::Off => Ok((0, "--native_below=0".to_owned())),
        NativeBelow::Fixed(n) => Ok((*n, "--native_below".to_owned())),
        NativeBelow::Auto => {
            if let Some(path) = explicit {
                return read_calibration(path).map(|n| (n, format!("{path:?}")));
            }
            for path in calibration_candidates() {
                match read_calibration(&path) {
                    Ok(n) => return Ok((n, format!("{path:?}"))),
                    Err(err) if path.exists() => log::warn!("ignoring calibration {err}"),
                    Err(_) => {}
                }
            }
            Ok((SHIPPED, "the shipped default".to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_parse_and_resolve_from_the_named_file() {
        assert_eq!(NativeBelow::parse("0"), Ok(NativeBelow::Off));
        assert_eq!(NativeBelow::parse("250"), Ok(NativeBelow::Fixed(250)));
        assert_eq!(NativeBelow::parse("auto"), Ok(NativeBelow::Auto));
        assert!(NativeBelow::parse("-1").is_err());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.json");
        std::fs::write(&file, r#"{"native_below": 321, "curve": []}"#).unwrap();
        assert_eq!(resolve(&NativeBelow::Auto, Some(&file)).unwrap().0, 321);
        assert_eq!(resolve(&NativeBelow::Fixed(7), Some(&file)).unwrap().0, 7);
        std::fs::write(&file, "{}").unwrap();
        assert!(resolve(&NativeBelow::Auto, Some(&file)).is_err());
        assert!(resolve(&NativeBelow::Auto, Some(&dir.path().join("none"))).is_err());
    }
}
