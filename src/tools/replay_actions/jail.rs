//! `--jail linux-sandbox[=PATH]`: Bazel's own Linux jail around each
//! action, as Bazel builds its command line.
//!
//! - Mode `serve`, when Create's answer leaves `confinement` unset:
//!   `SandboxBackendSpawn.builtin()` (Bazel 7+, at 1d5a428b) runs
//!   `linux-sandbox -w PATH... -N -- ARGV` with the process's cwd at
//!   `root/<ws>` and no `-W`: writable = the action's scratch directory
//!   (which holds its `/tmp`), `/dev`, `/tmp`, `/private/tmp`,
//!   `/private/var/tmp` and the returned root; `-N` (a network namespace
//!   with loopback) unless the action may use the network, which the 4.2.3
//!   log cannot say (it has no execution info), so always.
//! - Mode `symlinks`: Bazel's `linux-sandbox` strategy
//!   (`LinuxSandboxedSpawnRunner`): the forest, and
//!   `linux-sandbox -T SECS -t 15 -w <sandbox exec root> [-w TEST_TMPDIR]
//!   -w /dev/shm -w /tmp -N -- ARGV` from the sandbox exec root (its tmp
//!   is inside it). `-T` only with a timeout (tests); `-t` is
//!   `--local_termination_grace_seconds`' default. Bazel's runner names
//!   `/dev/shm`, not `/dev`.
//!
//! - Modes `reuse*`: Bazel 9's `LinuxSandboxedSpawnRunner` with its
//!   defaults (`LinuxSandboxCommandLineBuilder.java`, bazelbuild
//!   1b5712c6): `linux-sandbox [-T SECS] -t 15 -w /dev/shm -w <sandbox
//!   exec root> -w /tmp [-w TEST_TMPDIR] -M <sandbox>/_hermetic_tmp -m
//!   /tmp -S <sandbox>/stats.out -- ARGV` from the sandbox exec root, no
//!   `-W`. No `-N`: Bazel 9 allows the network by default
//!   (`--sandbox_default_allow_network`) and blocks it only for an action
//!   whose execution info asks, which the 4.2.3 log does not record.
//!   Debian's 4.2.3 binary takes every one of these flags (`-M`/`-m` mount
//!   read-only there, and the later `-w /tmp` makes the mount writable, as
//!   in Bazel 9). The hermetic `/tmp` (`-M`/`-m`) is left out when the
//!   sandbox or an exec root is below `/tmp`: the mount would hide them.
//!   Bazel 9 passes nothing else by default (`-C` cgroups, `-e` tmpfs, `-R`,
//!   `-U`, `-H`, `-D` are behind flags that default off).
//!
//! `--jail landlock`: actionfs's own jail ([`crate::jail`]) instead:
//! serve is negotiated with `--jail=landlock` and its Create answers carry
//! the wrapper; symlinks mode wraps each action in the same helper with
//! the strategy's writable set.
//!
//! Bazel 4.2.3's `linux-sandbox` (the one Debian ships) dies on a writable
//! path that does not exist (`mount(/private/tmp, ...): No such file or
//! directory`); later ones skip it. So missing paths are left out, which
//! is what a later binary does with them.

use std::path::{Path, PathBuf};

/// Where Debian's bazel-bootstrap puts it.
const DEBIAN: &str = "/usr/libexec/x86_64-linux-gnu/bazel/linux-sandbox";

/// `--local_termination_grace_seconds`' default: the `-t` Bazel passes.
const KILL_DELAY_SECS: u64 = 15;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Jail {
    /// Bazel's: the `linux-sandbox` binary.
    LinuxSandbox { path: PathBuf },
    /// actionfs's: the wrapper's program (`actionfs-jail`), and whether
    /// it makes its namespaces here (as serve's probe finds).
    Landlock {
        program: Vec<String>,
        namespaces: bool,
    },
}

impl Jail {
    /// `linux-sandbox`, `linux-sandbox=PATH` (without a path, Debian's,
    /// else the one on PATH) or `landlock`.
    pub fn parse(text: &str) -> Result<Jail, String> {
        if text == "landlock" {
            let program = crate::serve::confine::wrapper_program();
            let namespaces = crate::serve::confine::probe_namespaces(&program).is_ok();
            return Ok(Jail::Landlock {
                program,
                namespaces,
            });
        }
        let path = match text.split_once('=') {
            Some(("linux-sandbox", path)) if !path.is_empty() => PathBuf::from(path),
            None if text == "linux-sandbox" => {
                if Path::new(DEBIAN).exists() {
                    PathBuf::from(DEBIAN)
                } else {
                    on_path("linux-sandbox").ok_or_else(|| {
                        format!("no linux-sandbox at {DEBIAN} nor on PATH: give linux-sandbox=PATH")
                    })?
                }
            }
            _ => return Err("takes linux-sandbox, linux-sandbox=PATH or landlock".to_owned()),
        };
        Ok(Jail::LinuxSandbox { path })
    }

    /// How the report names it.
    pub fn describe(&self) -> String {
        match self {
            Jail::LinuxSandbox { path } => format!("linux-sandbox ({})", path.display()),
            Jail::Landlock {
                program,
                namespaces,
            } => format!(
                "landlock ({}{})",
                program.join(" "),
                if *namespaces { ", namespaces" } else { "" }
            ),
        }
    }

    /// The backend option that makes serve's Create answer for this jail:
    /// Bazel's leaves confinement unset (then [`Jail::builtin`] applies).
    pub fn serve_option(jail: Option<&Jail>) -> &'static str {
        match jail {
            Some(Jail::Landlock { .. }) => "--jail=landlock",
            // No jail: unset too, and the action runs bare.
            _ => "--jail=bazel",
        }
    }

    /// `SandboxBackendSpawn.builtin()`'s argv before the action's, for an
    /// action with scratch directory `scratch` in the sandbox at `root`;
    /// `None` for actionfs's jail, which serve's answer carries.
    pub fn builtin(&self, scratch: &Path, root: &Path) -> Option<Vec<String>> {
        let Jail::LinuxSandbox { path } = self else {
            return None;
        };
        let writable = [
            scratch,
            Path::new("/dev"),
            Path::new("/tmp"),
            Path::new("/private/tmp"),
            Path::new("/private/var/tmp"),
            root,
        ];
        Some(command(path, &[], &writable))
    }

    /// `LinuxSandboxedSpawnRunner`'s argv before the action's, for an
    /// action in the sandbox exec root `exec_root`.
    pub fn strategy(
        &self,
        exec_root: &Path,
        test_tmpdir: Option<&Path>,
        timeout_secs: u64,
    ) -> Vec<String> {
        let shm = std::fs::canonicalize("/dev/shm").unwrap_or_else(|_| "/dev/shm".into());
        let path = match self {
            Jail::LinuxSandbox { path } => path,
            Jail::Landlock {
                program,
                namespaces,
            } => {
                let mut write = vec![exec_root.to_owned()];
                write.extend(test_tmpdir.map(Path::to_owned));
                write.extend([shm, PathBuf::from("/tmp")]);
                let rules = crate::jail::Rules {
                    write,
                    dev: true,
                    hide: Vec::new(),
                    network: false,
                    namespaces: *namespaces,
                };
                return rules.wrapper(program);
            }
        };
        let mut flags = Vec::new();
        if timeout_secs > 0 {
            flags.extend(["-T".to_owned(), timeout_secs.to_string()]);
        }
        flags.extend(["-t".to_owned(), KILL_DELAY_SECS.to_string()]);
        let mut writable = vec![exec_root];
        writable.extend(test_tmpdir);
        writable.extend([shm.as_path(), Path::new("/tmp")]);
        command(path, &flags, &writable)
    }
}

impl Jail {
    /// Bazel 9's `LinuxSandboxedSpawnRunner` argv before the action's,
    /// for the sandbox `sandbox` (`<base>/linux-sandbox/<id>`) whose exec
    /// root is `exec_root`; `hermetic_tmp` adds `-M <sandbox>/_hermetic_tmp
    /// -m /tmp` (the directory is the caller's to make). actionfs's jail
    /// wraps it as the classic strategy's ([`Jail::strategy`]).
    pub fn bazel9(
        &self,
        sandbox: &Path,
        exec_root: &Path,
        test_tmpdir: Option<&Path>,
        timeout_secs: u64,
        hermetic_tmp: bool,
    ) -> Vec<String> {
        let Jail::LinuxSandbox { path } = self else {
            return self.strategy(exec_root, test_tmpdir, timeout_secs);
        };
        let shm = std::fs::canonicalize("/dev/shm").unwrap_or_else(|_| "/dev/shm".into());
        let mut argv = vec![path.to_string_lossy().into_owned()];
        if timeout_secs > 0 {
            argv.extend(["-T".to_owned(), timeout_secs.to_string()]);
        }
        argv.extend(["-t".to_owned(), KILL_DELAY_SECS.to_string()]);
        let mut writable = vec![shm.as_path(), exec_root, Path::new("/tmp")];
        writable.extend(test_tmpdir);
        let mut seen = Vec::new();
        for path in writable {
            // Bazel 4.2.3's binary dies on a writable path that is missing.
            if path.exists() && !seen.contains(&path) {
                seen.push(path);
                argv.extend(["-w".to_owned(), path.to_string_lossy().into_owned()]);
            }
        }
        if hermetic_tmp {
            let tmp = sandbox.join("_hermetic_tmp");
            argv.extend(["-M".to_owned(), tmp.to_string_lossy().into_owned()]);
            argv.extend(["-m".to_owned(), "/tmp".to_owned()]);
        }
        let stats = sandbox.join("stats.out");
        argv.extend(["-S".to_owned(), stats.to_string_lossy().into_owned()]);
        argv.push("--".to_owned());
        argv
    }
}

/// No `-N`: Bazel adds it only for an action that may not use the
/// network (`--sandbox_default_allow_network` is true, and a 4.2.3 log
/// cannot say which actions block it), as [`Jail::bazel9`] leaves it out.
fn command(path: &Path, flags: &[String], writable: &[&Path]) -> Vec<String> {
    let mut argv = vec![path.to_string_lossy().into_owned()];
    argv.extend(flags.iter().cloned());
    let mut seen = Vec::new();
    for path in writable {
        if path.exists() && !seen.contains(path) {
            seen.push(*path);
            argv.extend(["-w".to_owned(), path.to_string_lossy().into_owned()]);
        }
    }
    argv.push("--".to_owned());
    argv
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_builds_bazels_command_lines() {
        let jail = Jail::parse("linux-sandbox=/opt/ls").unwrap();
        assert_eq!(
            jail,
            Jail::LinuxSandbox {
                path: "/opt/ls".into()
            }
        );
        assert!(Jail::parse("bwrap").is_err() && Jail::parse("linux-sandbox=").is_err());
        let argv = jail.builtin(Path::new("/usr"), Path::new("/")).unwrap();
        // Missing paths (macOS's) left out; the root last; no -N (the
        // network allowed, Bazel's default), then --.
        assert_eq!(
            argv,
            ["/opt/ls", "-w", "/usr", "-w", "/dev", "-w", "/tmp", "-w", "/", "--"]
        );
        let argv = jail.strategy(Path::new("/"), None, 60);
        assert_eq!(&argv[..7], ["/opt/ls", "-T", "60", "-t", "15", "-w", "/"]);
        assert!(argv.ends_with(&["-w".to_owned(), "/tmp".into(), "--".into()]));
        assert!(!argv.contains(&"-N".to_owned()), "{argv:?}");
        let landlock = Jail::parse("landlock").unwrap();
        assert_eq!(landlock.builtin(Path::new("/usr"), Path::new("/")), None);
        let argv = landlock.strategy(Path::new("/x"), None, 60);
        assert_eq!(&argv[argv.len() - 8..argv.len() - 6], ["--write", "/x"]);
        assert!(argv.ends_with(&["--write".into(), "/tmp".into(), "--dev".into(), "--".into()]));
        // Bazel 9's: no -N, the hermetic /tmp, the stats file.
        let argv = jail.bazel9(Path::new("/s"), Path::new("/"), None, 0, true);
        assert_eq!(&argv[..3], ["/opt/ls", "-t", "15"]);
        assert!(!argv.contains(&"-N".to_owned()), "{argv:?}");
        assert!(argv.ends_with(&[
            "-w".into(),
            "/tmp".into(),
            "-M".into(),
            "/s/_hermetic_tmp".into(),
            "-m".into(),
            "/tmp".into(),
            "-S".into(),
            "/s/stats.out".into(),
            "--".into()
        ]));
        let argv = jail.bazel9(Path::new("/s"), Path::new("/"), None, 9, false);
        assert_eq!(&argv[..5], ["/opt/ls", "-T", "9", "-t", "15"]);
        assert!(!argv.contains(&"-M".to_owned()), "{argv:?}");
        assert_eq!(
            landlock.bazel9(Path::new("/s"), Path::new("/x"), None, 0, true),
            landlock.strategy(Path::new("/x"), None, 0)
        );
    }
}
