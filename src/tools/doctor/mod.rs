//! `actionfs doctor`: checks, on this machine and as this user, each fact a
//! mount and a fast sandbox depend on, one line per check (ok, warn or
//! fail, with the command that fixes it), and says which transport, open
//! mode and native cutoff the daemon would choose here and why. Its exit
//! status says whether the daemon can mount: a failed check is one that
//! stops the mount, a warning one that only costs speed or a feature.
//!
//! The platform's checks are in `linux.rs` and `macos.rs`; what they share
//! (the report, the sandbox base, the cutoff) is here.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::sandbox::hybrid::cutoff::{self, NativeBelow, Policy, ALWAYS_NATIVE};

pub mod transport_choice;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as platform;

#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
use macos as platform;

/// The name of the file system `dir` is on (replay-actions says where its
/// exec roots and sandbox bases are).
pub fn fs_type(dir: &std::path::Path) -> String {
    platform::fs_type(dir)
}

/// What `doctor` was asked for.
#[derive(Debug)]
pub struct DoctorArgs {
    pub json: bool,
    /// Where sandboxes would live.
    pub sandbox_base: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Ok,
    /// Works, but slower or without a feature.
    Warn,
    /// The daemon cannot mount.
    Fail,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Ok => "ok",
            State::Warn => "warn",
            State::Fail => "fail",
        }
    }
}

/// One checked fact.
#[derive(Clone, Debug)]
pub struct Check {
    /// The key in `--json` (`dev_fuse`, `reflink`...).
    pub key: &'static str,
    /// What it is called on a line.
    pub title: &'static str,
    pub state: State,
    pub detail: String,
    /// The command that fixes it, where one does.
    pub fix: Option<String>,
}

impl Check {
    fn new(key: &'static str, title: &'static str, state: State, detail: String) -> Check {
        Check {
            key,
            title,
            state,
            detail,
            fix: None,
        }
    }

    pub fn ok(key: &'static str, title: &'static str, detail: impl Into<String>) -> Check {
        Check::new(key, title, State::Ok, detail.into())
    }

    pub fn warn(key: &'static str, title: &'static str, detail: impl Into<String>) -> Check {
        Check::new(key, title, State::Warn, detail.into())
    }

    pub fn fail(key: &'static str, title: &'static str, detail: impl Into<String>) -> Check {
        Check::new(key, title, State::Fail, detail.into())
    }

    pub fn fix(mut self, command: impl Into<String>) -> Check {
        self.fix = Some(command.into());
        self
    }
}

/// A choice the daemon would make here, and why.
#[derive(Clone, Debug)]
pub struct Decision {
    pub title: &'static str,
    /// Short and stable, for scripts (`classic`, `zero_message_opens`...).
    pub choice: String,
    pub why: String,
}

/// The sandbox base as seen by the checks.
#[derive(Clone, Debug)]
pub struct Base {
    pub path: PathBuf,
    /// The directory looked at: `path`, or its nearest existing ancestor.
    pub existing: Option<PathBuf>,
    /// The file system's name (`tmpfs`, `ext4`, `apfs`...).
    pub fs_type: String,
    pub memory: bool,
}

impl Base {
    pub fn look(path: &Path) -> Base {
        let existing = path.ancestors().find(|a| a.is_dir()).map(Path::to_owned);
        let fs_type = existing
            .as_deref()
            .map(platform::fs_type)
            .unwrap_or_else(|| "unknown".to_owned());
        Base {
            path: path.to_owned(),
            memory: existing.as_deref().is_some_and(cutoff::on_tmpfs),
            existing,
            fs_type,
        }
    }
}

/// Everything `doctor` found.
pub struct Report {
    pub platform: &'static str,
    /// The kernel's release string.
    pub kernel: String,
    pub uid: u32,
    pub checks: Vec<Check>,
    pub base: Base,
    pub decisions: Vec<Decision>,
}

impl Report {
    /// No failed check: the daemon can mount here.
    pub fn can_mount(&self) -> bool {
        self.checks.iter().all(|c| c.state != State::Fail)
    }

    pub fn to_json(&self) -> Value {
        let checks: Map<String, Value> = self
            .checks
            .iter()
            .map(|c| {
                let value = json!({"state": c.state.name(), "detail": c.detail, "fix": c.fix});
                (c.key.to_owned(), value)
            })
            .collect();
        let decisions: Map<String, Value> = self
            .decisions
            .iter()
            .map(|d| {
                let key = d.title.replace(' ', "_");
                (key, json!({"choice": d.choice, "why": d.why}))
            })
            .collect();
        json!({
            "platform": self.platform,
            "kernel": self.kernel,
            "uid": self.uid,
            "can_mount": self.can_mount(),
            "checks": checks,
            "sandbox_base": {
                "path": self.base.path,
                "fs_type": self.base.fs_type,
                "tmpfs": self.base.memory,
            },
            "would_choose": decisions,
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {}, uid {}, sandbox base {:?}",
            self.platform, self.kernel, self.uid, self.base.path
        )?;
        for check in &self.checks {
            writeln!(
                f,
                "{:<5} {:<14} {}",
                check.state.name(),
                check.title,
                check.detail
            )?;
            if let Some(fix) = &check.fix {
                writeln!(f, "{:<20} fix: {fix}", "")?;
            }
        }
        writeln!(f, "the daemon would choose here:")?;
        for decision in &self.decisions {
            writeln!(
                f,
                "  {:<14} {}: {}",
                decision.title, decision.choice, decision.why
            )?;
        }
        if self.can_mount() {
            writeln!(f, "a mount can work here")
        } else {
            let failed: Vec<&str> = self
                .checks
                .iter()
                .filter(|c| c.state == State::Fail)
                .map(|c| c.title)
                .collect();
            writeln!(f, "the daemon cannot mount here: {}", failed.join(", "))
        }
    }
}

/// The daemon cannot mount here (exit status 1).
#[derive(Debug)]
pub struct CannotMount(pub Vec<&'static str>);

impl fmt::Display for CannotMount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "doctor: the daemon cannot mount here ({} failed)",
            self.0.join(", ")
        )
    }
}

/// Checks this machine and prints the report.
pub fn run(args: &DoctorArgs) -> Result<(), CannotMount> {
    let report = examine(&args.sandbox_base);
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    if report.can_mount() {
        Ok(())
    } else {
        Err(CannotMount(
            report
                .checks
                .iter()
                .filter(|c| c.state == State::Fail)
                .map(|c| c.key)
                .collect(),
        ))
    }
}

/// Every check and decision for a daemon whose sandboxes live in
/// `sandbox_base`.
pub fn examine(sandbox_base: &Path) -> Report {
    let base = Base::look(sandbox_base);
    let mut checks = platform::checks();
    checks.push(base_check(&base));
    checks.push(platform::clone_check(&base));
    let mut decisions = platform::decisions(&checks);
    decisions.push(cutoff_decision(&base));
    Report {
        platform: platform::NAME,
        kernel: platform::kernel_release(),
        uid: nix::unistd::geteuid().as_raw(),
        checks,
        base,
        decisions,
    }
}

fn base_check(base: &Base) -> Check {
    const KEY: &str = "sandbox_base";
    const TITLE: &str = "sandbox base";
    let Some(existing) = &base.existing else {
        return Check::warn(KEY, TITLE, format!("{:?}: no such directory", base.path))
            .fix(format!("mkdir -p {}", shell_word(&base.path)));
    };
    let kind = if base.memory { "memory" } else { "disk" };
    let mut detail = format!("{} ({kind})", base.fs_type);
    if existing != &base.path {
        detail.push_str(&format!(
            "; {:?} does not exist yet, judged by {existing:?}",
            base.path
        ));
    }
    Check::ok(KEY, TITLE, detail)
}

/// The cutoff `--native_below=auto` (the default) would use for
/// sandboxes made in the base, from the same code the daemon runs.
fn cutoff_decision(base: &Base) -> Decision {
    let title = "native cutoff";
    let (policy, source) = match cutoff::resolve(&NativeBelow::Auto, None) {
        Ok(resolved) => resolved,
        Err(err) => {
            return Decision {
                title,
                choice: "error".to_owned(),
                why: err.to_string(),
            }
        }
    };
    let (below, why) = match policy {
        Policy::Below(n) => (n, format!("calibrated cutoff from {source}")),
        Policy::ByFileSystem => {
            let n = cutoff::shipped_for(&base.path);
            let why = if base.memory {
                "no calibration; the sandbox base is on tmpfs, where native sandboxes won at \
                 every size measured"
            } else {
                "no calibration; the sandbox base is on disk, where FUSE sandboxes won at every \
                 size measured"
            };
            (
                n,
                format!("{why} (`actionfs calibrate --write` measures this machine)"),
            )
        }
    };
    let choice = match below {
        0 => "every sandbox FUSE".to_owned(),
        ALWAYS_NATIVE => "every sandbox native".to_owned(),
        n => format!("native below {n} mappings"),
    };
    Decision { title, choice, why }
}

/// `path` as one shell word, for a fix command.
fn shell_word(path: &Path) -> String {
    let text = path.to_string_lossy();
    if text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,".contains(c))
    {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// Clones a small file inside `dir` and says whether the file system did
/// it: `Ok(())`, or the error of the clone call.
fn try_clone(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let scratch = dir.join(format!(".actionfs-doctor-{}", std::process::id()));
    std::fs::create_dir(&scratch)?;
    let attempt = (|| {
        std::fs::write(scratch.join("source"), b"actionfs doctor clone probe\n")?;
        let handle = std::fs::File::open(&scratch)?;
        crate::sys::clone_file(handle.as_fd(), c"source", handle.as_fd(), c"clone")
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    attempt
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fix_commands_quote_odd_paths() {
        assert_eq!(shell_word(Path::new("/dev/shm/x")), "/dev/shm/x");
        assert_eq!(shell_word(Path::new("/a b/it's")), r"'/a b/it'\''s'");
    }
}
