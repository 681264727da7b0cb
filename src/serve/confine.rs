//! Which jail `serve`'s actions run in, and what Create answers about it
//! (`--jail`): actionfs's own Landlock jail (a `custom` wrapper),
//! Bazel's (`confinement` unset: linux-sandbox on Linux, Seatbelt on
//! macOS) or none (`unconfined`).

use std::path::Path;

use actionfs_protocol::backend::sandbox::{create::result::ok::Confinement, CustomConfinement};
use actionfs_protocol::backend::sandbox::{Manifest, Unconfined};

use crate::jail::{self, Rules};

/// What `--jail` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JailAsked {
    Landlock,
    Bazel,
    None,
}

/// The jail in force, once the kernel was asked.
#[derive(Clone, Debug)]
pub enum Jail {
    Landlock {
        /// The wrapper's program (`actionfs-jail`, or `actionfs __jail`).
        program: Vec<String>,
        /// The host read-only but the action's writable paths
        /// ([`Rules::namespaces`]), where user namespaces are allowed.
        namespaces: bool,
    },
    Bazel,
    None,
}

/// Set to `off`, `serve` takes user namespaces to be refused: how the
/// fallback is tested where they are allowed.
pub const NAMESPACES_OVERRIDE: &str = "ACTIONFS_JAIL_NAMESPACES";

impl Jail {
    /// The jail for `asked` on this kernel: without Landlock ABI
    /// [`jail::MIN_ABI`], Bazel's, said once on stderr (Bazel keeps the
    /// backend's last lines for its messages).
    pub fn choose(asked: JailAsked) -> Jail {
        match asked {
            JailAsked::Bazel => Jail::Bazel,
            JailAsked::None => Jail::None,
            JailAsked::Landlock => {
                let abi = jail::landlock_abi();
                if abi < jail::MIN_ABI {
                    eprintln!(
                        "actionfs serve: this kernel's Landlock ABI is {abi} (needs {}), so \
                         actions run in Bazel's jail (linux-sandbox) instead of actionfs's",
                        jail::MIN_ABI
                    );
                    return Jail::Bazel;
                }
                let program = wrapper_program();
                let namespaces = match probe_namespaces(&program) {
                    Ok(()) => true,
                    Err(why) => {
                        eprintln!(
                            "actionfs serve: no namespaces for actionfs's jail here ({why}): \
                             Landlock alone cannot keep actions from changing inputs' modes and \
                             times, so every sandbox is served by FUSE"
                        );
                        false
                    }
                };
                Jail::Landlock {
                    program,
                    namespaces,
                }
            }
        }
    }

    /// Whether native sandboxes are safe in this jail: their inputs lead
    /// to the store and the source tree, which only a read-only view of
    /// the host keeps from `chmod` and `utime` (Landlock cannot).
    pub fn keeps_inputs_metadata(&self) -> bool {
        match self {
            Jail::Landlock { namespaces, .. } => *namespaces,
            Jail::Bazel => true,
            Jail::None => false,
        }
    }

    /// Create's `confinement` for a sandbox at `root` whose workspace
    /// directory is made in `scratch` (native inputs are symlinks there:
    /// a symlink's target is ruled where it resolves, so allowing writes
    /// here allows none into the store or the exec root).
    pub fn confinement(
        &self,
        manifest: &Manifest,
        root: &Path,
        scratch: &Path,
    ) -> Option<Confinement> {
        let (program, namespaces) = match self {
            Jail::Bazel => return None,
            Jail::None => return Some(Confinement::Unconfined(Unconfined {})),
            Jail::Landlock {
                program,
                namespaces,
            } => (program, *namespaces),
        };
        let rules = Rules {
            namespaces,
            ..rules(manifest, root, scratch)
        };
        Some(Confinement::Custom(CustomConfinement {
            name: "actionfs-landlock".into(),
            wrapper: rules.wrapper(program),
            env: Default::default(),
        }))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Jail::Landlock { .. } => "landlock",
            Jail::Bazel => "bazel",
            Jail::None => "none",
        }
    }
}

/// The rules of one action: writable are the sandbox root, its scratch
/// directory, the writable directories' host paths and what
/// `confinement_setting` lists, but `/dev` only as its device nodes.
/// Without a setting (Bazel always sends one), what Bazel's jail would
/// allow: the host's `/tmp` too (where Bazel points TMPDIR), no network.
pub fn rules(manifest: &Manifest, root: &Path, scratch: &Path) -> Rules {
    let mut rules = Rules {
        write: vec![root.to_owned(), scratch.to_owned()],
        dev: true,
        hide: Vec::new(),
        network: false,
        namespaces: false,
    };
    let mut hosts: Vec<&String> = manifest.writable_dirs.values().collect();
    hosts.sort();
    rules.write.extend(hosts.into_iter().map(Into::into));
    match &manifest.confinement_setting {
        Some(setting) => {
            for path in &setting.writable_paths {
                if Path::new(path) != Path::new("/dev") {
                    rules.write.push(path.into());
                }
            }
            rules.hide = setting.inaccessible_paths.iter().map(Into::into).collect();
            rules.network = setting.allow_network;
        }
        None => rules.write.push("/tmp".into()),
    }
    rules.write.dedup();
    rules
}

/// Asks the wrapper whether it can make its namespaces here (a process
/// of its own, as each action's wrapper would); says why not.
pub fn probe_namespaces(program: &[String]) -> Result<(), NoNamespaces> {
    if std::env::var(NAMESPACES_OVERRIDE).as_deref() == Ok("off") {
        return Err(NoNamespaces::Overridden);
    }
    let probed = std::process::Command::new(&program[0])
        .args(&program[1..])
        .arg(jail::PROBE_NAMESPACES)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| NoNamespaces::Spawn {
            program: program[0].clone(),
            source,
        })?;
    if probed.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&probed.stderr);
    Err(NoNamespaces::Refused(said.trim().to_owned()))
}

/// Why actionfs's jail has no namespaces here.
#[derive(Debug, thiserror::Error)]
pub enum NoNamespaces {
    #[error("{NAMESPACES_OVERRIDE}=off")]
    Overridden,
    #[error("{program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    /// In the wrapper's words (which call the kernel refused).
    #[error("{0}")]
    Refused(String),
}

/// `actionfs-jail` beside this executable (a smaller program, faster to
/// exec), else this executable's `__jail`.
pub fn wrapper_program() -> Vec<String> {
    let Ok(exe) = std::env::current_exe() else {
        return vec!["actionfs".into(), jail::SUBCOMMAND.into()];
    };
    let helper = exe.with_file_name(jail::HELPER);
    if helper.is_file() {
        return vec![helper.to_string_lossy().into_owned()];
    }
    vec![exe.to_string_lossy().into_owned(), jail::SUBCOMMAND.into()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use actionfs_protocol::backend::sandbox::ConfinementSetting;

    #[test]
    fn rules_take_bazels_setting_with_dev_as_device_nodes() {
        let mut manifest = Manifest {
            writable_dirs: [("/tmp".to_owned(), "/s/1/tmp".to_owned())].into(),
            ..Default::default()
        };
        let (root, scratch) = (Path::new("/m/1"), Path::new("/b/scratch/1"));
        let without = rules(&manifest, root, scratch);
        let paths = |r: &Rules| {
            r.write
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            paths(&without),
            ["/m/1", "/b/scratch/1", "/s/1/tmp", "/tmp"]
        );
        assert!(without.dev && !without.network && without.hide.is_empty());
        manifest.confinement_setting = Some(ConfinementSetting {
            writable_paths: vec!["/s/1".into(), "/dev".into(), "/tmp".into()],
            inaccessible_paths: vec!["/home".into()],
            allow_network: true,
        });
        let with = rules(&manifest, root, scratch);
        assert_eq!(
            paths(&with),
            ["/m/1", "/b/scratch/1", "/s/1/tmp", "/s/1", "/tmp"]
        );
        assert!(with.dev && with.network);
        assert_eq!(with.hide, [Path::new("/home")]);
    }
}
