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
    /// The wrapper's program (`actionfs-jail`, or `actionfs __jail`).
    Landlock(Vec<String>),
    Bazel,
    None,
}

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
                Jail::Landlock(wrapper_program())
            }
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
        let program = match self {
            Jail::Bazel => return None,
            Jail::None => return Some(Confinement::Unconfined(Unconfined {})),
            Jail::Landlock(program) => program,
        };
        Some(Confinement::Custom(CustomConfinement {
            name: "actionfs-landlock".into(),
            wrapper: rules(manifest, root, scratch).wrapper(program),
            env: Default::default(),
        }))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Jail::Landlock(_) => "landlock",
            Jail::Bazel => "bazel",
            Jail::None => "none",
        }
    }
}

/// The rules of one action: writable are the sandbox root, its scratch
/// directory, the writable directories' host paths and what
/// `confinement_setting` lists, but `/dev` only as its device nodes.
pub fn rules(manifest: &Manifest, root: &Path, scratch: &Path) -> Rules {
    let mut rules = Rules {
        write: vec![root.to_owned(), scratch.to_owned()],
        dev: true,
        hide: Vec::new(),
        network: false,
    };
    let mut hosts: Vec<&String> = manifest.writable_dirs.values().collect();
    hosts.sort();
    rules.write.extend(hosts.into_iter().map(Into::into));
    if let Some(setting) = &manifest.confinement_setting {
        for path in &setting.writable_paths {
            if Path::new(path) == Path::new("/dev") {
                continue;
            }
            rules.write.push(path.into());
        }
        rules.hide = setting.inaccessible_paths.iter().map(Into::into).collect();
        rules.network = setting.allow_network;
    }
    rules.write.dedup();
    rules
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
