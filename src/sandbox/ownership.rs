//! The one check that a directory is the daemon's user's alone, before
//! the daemon keeps anything in it or takes anything from it. In a place
//! other users share (`/dev/shm`, a sandbox base) any name can be
//! anyone's, and a directory someone else may write is one whose entries
//! they can swap. What differs between callers is spelled out in
//! [`Rules`]; every caller goes through [`check`].

use std::fmt;
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::sandbox::file_kind::FileKind;

/// Group and other permission bits that let someone else write.
const OTHERS_WRITE: u32 = 0o022;
/// Group and other permission bits of any kind.
const OTHERS_ANY: u32 = 0o077;

/// What a directory must be to count as ours alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    pub symlink: Symlink,
    pub others: Others,
    /// The file system it must be on (`st_dev`), for a caller that moves
    /// things into it by rename.
    pub device: Option<u64>,
    pub excess: Excess,
}

/// A symlink found where the directory should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Symlink {
    /// Refused: whoever made it chose where it leads.
    Refused,
    /// Followed: the user named it (`--native_dir` may be a link to their
    /// own directory), and the directory it leads to is checked.
    Followed,
}

/// What others (the group and everyone else) may do in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Others {
    /// Nothing at all (mode `0700` or less): it holds state no one else
    /// may read.
    NoAccess,
    /// Read and enter, not write: what is in it may be shown to others
    /// (an action's inputs), not changed by them.
    NoWrite,
}

impl Others {
    fn forbidden_bits(self) -> u32 {
        match self {
            Others::NoAccess => OTHERS_ANY,
            Others::NoWrite => OTHERS_WRITE,
        }
    }
}

/// What is done about permission bits [`Rules::others`] forbids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Excess {
    /// The directory is refused.
    Refused,
    /// They are taken away (`chmod`) from a directory that is ours: one
    /// an older daemon, or a umask of 0, left open.
    TakenAway,
}

impl Rules {
    /// State a backend keeps or takes from a predecessor in a shared base
    /// (the state directory, a store's hand-off): ours, not a symlink,
    /// closed to everyone else.
    pub const PRIVATE: Rules = Rules {
        symlink: Symlink::Refused,
        others: Others::NoAccess,
        device: None,
        excess: Excess::Refused,
    };

    /// The native directory and those the daemon makes in it: everything
    /// below becomes an action's inputs, which others may read but not
    /// swap; the user may name it through a symlink.
    pub const NATIVE_DIR: Rules = Rules {
        symlink: Symlink::Followed,
        others: Others::NoWrite,
        device: None,
        excess: Excess::TakenAway,
    };

    /// Where a pool of stashes goes beside writable directories on device
    /// `dev`: stashes move in and out by rename, so it is on that file
    /// system, and no one else may write it (a directory we did not make,
    /// so it is refused rather than changed).
    pub fn stash_parent(dev: u64) -> Rules {
        Rules {
            symlink: Symlink::Refused,
            others: Others::NoWrite,
            device: Some(dev),
            excess: Excess::Refused,
        }
    }
}

/// The rule a directory broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// It must be a directory (with [`Symlink::Refused`], a symlink to one
    /// is not).
    Directory(Symlink),
    /// It must be on this device.
    Device(u64),
    /// Its owner must be this uid, the daemon's effective one.
    Owner(u32),
    /// Others may not do more than this.
    Others(Others),
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Directory(Symlink::Refused) => {
                f.write_str("it must be a directory, not a symlink to one")
            }
            Rule::Directory(Symlink::Followed) => f.write_str("it must be a directory"),
            Rule::Device(dev) => write!(f, "it must be on the file system of device {dev}"),
            Rule::Owner(uid) => write!(f, "its owner must be uid {uid}, the daemon's"),
            Rule::Others(Others::NoAccess) => f.write_str("no one else may have any access to it"),
            Rule::Others(Others::NoWrite) => f.write_str("no one else may write to it"),
        }
    }
}

/// What was found at the path, as the check saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub kind: FileKind,
    pub uid: u32,
    /// Permission bits (`& 0o7777`).
    pub mode: u32,
    pub device: u64,
}

impl Found {
    fn of(meta: &Metadata) -> Found {
        Found {
            kind: FileKind::from_std(meta.file_type()),
            uid: meta.uid(),
            mode: meta.permissions().mode() & 0o7777,
            device: meta.dev(),
        }
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FileKind::Directory => "a directory",
            FileKind::Symlink => "a symlink",
            FileKind::RegularFile => "a file",
            _ => "a special file",
        };
        write!(
            f,
            "owner uid {}, mode {:o}, {kind} on device {}",
            self.uid, self.mode, self.device
        )
    }
}

/// Why a directory is not ours alone, or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error("{syscall} {path:?}: {source}")]
    Io {
        syscall: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{path:?} is not ours alone ({found}): {broken}")]
    Broken {
        path: PathBuf,
        found: Found,
        broken: Rule,
    },
}

impl OwnershipError {
    /// Whether nothing is at the path (which some callers take as "none").
    pub fn is_not_found(&self) -> bool {
        matches!(self, OwnershipError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Checks `dir` against `rules`: the first rule it breaks is the error.
/// With [`Excess::TakenAway`], forbidden bits of others on a directory
/// that passes every other rule are removed instead.
pub fn check(dir: &Path, rules: &Rules) -> Result<(), OwnershipError> {
    let (syscall, meta) = match rules.symlink {
        Symlink::Refused => ("lstat", std::fs::symlink_metadata(dir)),
        Symlink::Followed => ("stat", std::fs::metadata(dir)),
    };
    let meta = meta.map_err(|source| OwnershipError::Io {
        syscall,
        path: dir.to_owned(),
        source,
    })?;
    let found = Found::of(&meta);
    let euid = nix::unistd::geteuid().as_raw();
    let forbidden = found.mode & rules.others.forbidden_bits();
    let broken = if found.kind != FileKind::Directory {
        Some(Rule::Directory(rules.symlink))
    } else if rules.device.is_some_and(|dev| dev != found.device) {
        Some(Rule::Device(rules.device.expect("checked")))
    } else if found.uid != euid {
        Some(Rule::Owner(euid))
    } else if forbidden != 0 && rules.excess == Excess::Refused {
        Some(Rule::Others(rules.others))
    } else {
        None
    };
    if let Some(broken) = broken {
        return Err(OwnershipError::Broken {
            path: dir.to_owned(),
            found,
            broken,
        });
    }
    if forbidden != 0 {
        std::fs::set_permissions(
            dir,
            std::fs::Permissions::from_mode(found.mode & !forbidden),
        )
        .map_err(|source| OwnershipError::Io {
            syscall: "chmod",
            path: dir.to_owned(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn dir_of_mode(parent: &Path, name: &str, mode: u32) -> PathBuf {
        let dir = parent.join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        dir
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn broken(result: Result<(), OwnershipError>) -> Rule {
        match result {
            Err(OwnershipError::Broken { broken, .. }) => broken,
            other => panic!("not refused by a rule: {other:?}"),
        }
    }

    fn all_rules(dev: u64) -> [Rules; 3] {
        [Rules::PRIVATE, Rules::NATIVE_DIR, Rules::stash_parent(dev)]
    }

    #[test]
    fn a_directory_of_ours_closed_to_others_passes_every_rule() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir_of_mode(tmp.path(), "ours", 0o700);
        let dev = std::fs::metadata(&dir).unwrap().dev();
        for rules in all_rules(dev) {
            check(&dir, &rules).unwrap();
        }
        assert_eq!(mode_of(&dir), 0o700);
    }

    #[test]
    fn a_directory_others_may_read_passes_only_where_they_may() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir_of_mode(tmp.path(), "readable", 0o755);
        let dev = std::fs::metadata(&dir).unwrap().dev();
        assert_eq!(
            broken(check(&dir, &Rules::PRIVATE)),
            Rule::Others(Others::NoAccess)
        );
        check(&dir, &Rules::NATIVE_DIR).unwrap();
        check(&dir, &Rules::stash_parent(dev)).unwrap();
        assert_eq!(mode_of(&dir), 0o755, "nothing forbidden, nothing changed");
    }

    #[test]
    fn group_or_world_write_is_refused_or_taken_away_as_the_rules_say() {
        let tmp = tempfile::tempdir().unwrap();
        for (name, mode) in [("group", 0o770), ("world", 0o707), ("both", 0o777)] {
            let dir = dir_of_mode(tmp.path(), name, mode);
            let dev = std::fs::metadata(&dir).unwrap().dev();
            let err = check(&dir, &Rules::PRIVATE).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("is not ours alone (owner uid")
                    && text.contains(&format!("{mode:o}")),
                "{text}"
            );
            assert_eq!(broken(Err(err)), Rule::Others(Others::NoAccess));
            assert_eq!(
                broken(check(&dir, &Rules::stash_parent(dev))),
                Rule::Others(Others::NoWrite),
                "{name}"
            );
            assert_eq!(mode_of(&dir), mode, "refused, not changed");
            check(&dir, &Rules::NATIVE_DIR).unwrap();
            assert_eq!(mode_of(&dir), mode & !0o022, "{name}: write taken away");
            check(&dir, &Rules::stash_parent(dev)).unwrap();
        }
    }

    #[test]
    fn a_symlink_in_place_of_the_directory_is_refused_unless_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let target = dir_of_mode(tmp.path(), "target", 0o700);
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dev = std::fs::metadata(&target).unwrap().dev();
        for rules in [Rules::PRIVATE, Rules::stash_parent(dev)] {
            let err = check(&link, &rules).unwrap_err();
            assert!(err.to_string().contains("a symlink"), "{err}");
            assert_eq!(broken(Err(err)), Rule::Directory(Symlink::Refused));
        }
        check(&link, &Rules::NATIVE_DIR).unwrap();
        // Followed to something that is no directory: refused all the same.
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let to_file = tmp.path().join("to-file");
        std::os::unix::fs::symlink(&file, &to_file).unwrap();
        assert_eq!(
            broken(check(&to_file, &Rules::NATIVE_DIR)),
            Rule::Directory(Symlink::Followed)
        );
        for rules in all_rules(dev) {
            assert!(matches!(broken(check(&file, &rules)), Rule::Directory(_)));
        }
    }

    #[test]
    fn a_directory_on_another_device_is_refused_where_one_is_required() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir_of_mode(tmp.path(), "here", 0o700);
        let here = std::fs::metadata(&dir).unwrap().dev();
        // The device of another mounted file system.
        let elsewhere = ["/proc", "/dev", "/sys", "/"]
            .iter()
            .map(|path| std::fs::metadata(path).unwrap().dev())
            .find(|&dev| dev != here)
            .expect("another file system is mounted");
        let err = check(&dir, &Rules::stash_parent(elsewhere)).unwrap_err();
        assert!(
            err.to_string().contains(&format!("device {elsewhere}")),
            "{err}"
        );
        assert_eq!(broken(Err(err)), Rule::Device(elsewhere));
        check(&dir, &Rules::stash_parent(here)).unwrap();
    }

    /// Root only: it takes a chown to make a directory another user owns.
    #[test]
    fn a_directory_another_user_owns_is_refused_by_every_rule_and_left_alone() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir_of_mode(tmp.path(), "theirs", 0o777);
        let nobody = nix::unistd::Uid::from_raw(65534);
        nix::unistd::chown(&dir, Some(nobody), None).unwrap();
        let dev = std::fs::metadata(&dir).unwrap().dev();
        for rules in all_rules(dev) {
            let err = check(&dir, &rules).unwrap_err();
            assert!(err.to_string().contains("owner uid 65534"), "{err}");
            assert_eq!(broken(Err(err)), Rule::Owner(0));
        }
        assert_eq!(mode_of(&dir), 0o777, "another user's is never changed");
        let ours = dir_of_mode(tmp.path(), "closed-but-theirs", 0o700);
        nix::unistd::chown(&ours, Some(nobody), None).unwrap();
        assert_eq!(broken(check(&ours, &Rules::PRIVATE)), Rule::Owner(0));
    }

    #[test]
    fn nothing_there_is_an_error_naming_the_call_and_path() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        for (rules, call) in [(Rules::PRIVATE, "lstat"), (Rules::NATIVE_DIR, "stat")] {
            let err = check(&missing, &rules).unwrap_err();
            assert!(err.is_not_found(), "{err}");
            let text = err.to_string();
            assert!(
                text.starts_with(call) && text.contains(&format!("{missing:?}")),
                "{text}"
            );
        }
    }
}
