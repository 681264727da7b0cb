//! The macOS checks: a FUSE implementation (macFUSE or FUSE-T) and
//! clonefile(2) in the sandbox base (APFS).

use std::path::Path;

use super::{try_clone, Base, Check, Decision};

pub const NAME: &str = "macOS";

const MACFUSE: &str = "/Library/Filesystems/macfuse.fs";
const FUSE_T: [&str; 2] = [
    "/usr/local/lib/libfuse-t.dylib",
    "/Library/Application Support/fuse-t",
];

pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| format!("Darwin {}", u.release().to_string_lossy()))
        .unwrap_or_else(|err| format!("unknown ({err})"))
}

pub fn fs_type(dir: &Path) -> String {
    nix::sys::statfs::statfs(dir)
        .map(|st| st.filesystem_type_name().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

pub fn checks() -> Vec<Check> {
    const KEY: &str = "fuse_install";
    const TITLE: &str = "FUSE";
    let macfuse = Path::new(MACFUSE).exists();
    let fuse_t = FUSE_T.iter().find(|p| Path::new(p).exists());
    let check = match (macfuse, fuse_t) {
        (true, _) => Check::ok(KEY, TITLE, format!("macFUSE is installed ({MACFUSE})")),
        (false, Some(path)) => Check::ok(KEY, TITLE, format!("FUSE-T is installed ({path})")),
        (false, None) => Check::fail(KEY, TITLE, "neither macFUSE nor FUSE-T is installed")
            .fix("brew install --cask macfuse"),
    };
    vec![check]
}

pub fn clone_check(base: &Base) -> Check {
    const KEY: &str = "reflink";
    const TITLE: &str = "clonefile";
    let Some(dir) = &base.existing else {
        return Check::warn(KEY, TITLE, "cannot try: the sandbox base does not exist");
    };
    match try_clone(dir) {
        Ok(()) => Check::ok(
            KEY,
            TITLE,
            format!(
                "clonefile works on {}: clone and auto share blocks",
                base.fs_type
            ),
        ),
        Err(err) if err.raw_os_error() == Some(libc::ENOTSUP) => Check::warn(
            KEY,
            TITLE,
            format!(
                "{} cannot clone files (clonefile: {err}): --native_method=clone fails",
                base.fs_type
            ),
        )
        .fix("put the sandbox base on an APFS volume"),
        Err(err) => Check::warn(KEY, TITLE, format!("could not try in {dir:?}: {err}")),
    }
}

pub fn decisions(_checks: &[Check]) -> Vec<Decision> {
    vec![
        Decision {
            title: "transport",
            choice: "macfuse".to_owned(),
            why: "the FUSE device of macFUSE (or FUSE-T's) is the only transport on macOS"
                .to_owned(),
        },
        Decision {
            title: "open mode",
            choice: "decided at mount".to_owned(),
            why: "--zero_message_opens=auto skips OPEN where the FUSE implementation offers it; \
                  there is no passthrough on macOS"
                .to_owned(),
        },
    ]
}
