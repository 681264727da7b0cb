//! actionfs's own jail for an action: a wrapper that confines itself
//! (Landlock, a small seccomp filter and, where user namespaces are
//! allowed, a read-only view of the host), then spawns the action and
//! stays until it and everything it started are gone.
//!
//! `serve` answers Create with a `custom` confinement whose wrapper is
//! [`Rules::wrapper`]: the jail's program, the rules as flags, then `--`;
//! Bazel appends the action's argv (process-wrapper first). The program
//! is the small `actionfs-jail` helper beside `actionfs` where it is
//! installed, else `actionfs __jail` (the same code; one exec costs more,
//! see docs/BENCHMARKS.md).
//!
//! What the rules say (the wrapper applies them, [`landlock`]):
//! - everything is readable and executable, but `hide` paths;
//! - `write` hierarchies are writable (make, remove, rename, truncate);
//! - with `dev`, the usual character devices (`/dev/null`, `/dev/tty`,
//!   ...) and `/dev/pts` are writable, never `/dev` whole (`/dev/shm`,
//!   where the store may live, stays read-only, as in linux-sandbox);
//! - without `network`, no TCP bind or connect, and no socket but Unix,
//!   netlink and TCP ones (seccomp), so no UDP either;
//! - with `namespaces`, the host is seen through read-only mounts but for
//!   the `write` hierarchies (a user and mount namespace, [`namespaces`]):
//!   Landlock cannot rule `chmod`, `chown`, `utime` or extended
//!   attributes, a read-only mount refuses them all. The mounts then rule
//!   the file system alone unless a path is hidden (Landlock's file rules
//!   would only repeat them, and cost a walk at every open): device nodes
//!   and FIFOs are written as the user's permissions allow, as in
//!   linux-sandbox, in a `/dev` whose entries cannot change;
//! - in every case, nothing the action starts outlives it: the wrapper is
//!   the subreaper of its processes and kills what is left when its
//!   first process exits ([`supervise`]).

#[cfg(target_os = "linux")]
pub mod landlock;
#[cfg(target_os = "linux")]
pub mod namespaces;
#[cfg(target_os = "linux")]
pub mod supervise;

use std::ffi::OsString;
use std::path::PathBuf;

/// The name of the helper binary installed beside `actionfs`.
pub const HELPER: &str = "actionfs-jail";
/// The hidden subcommand of `actionfs` that runs the same jail.
pub const SUBCOMMAND: &str = "__jail";
/// The wrapper's only argument when asked whether [`Rules::namespaces`]
/// can be had here: exits 0 if so, else says why on stderr.
pub const PROBE_NAMESPACES: &str = "--probe-namespaces";

/// The lowest Landlock ABI this jail uses: 6 brings the signal and
/// abstract Unix socket scopes; 4 the TCP rules, 3 truncate.
pub const MIN_ABI: i32 = 6;

/// What one action may do, as the wrapper's flags carry it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// Hierarchies (or files) the action may write.
    pub write: Vec<PathBuf>,
    /// The usual device nodes are writable.
    pub dev: bool,
    /// Paths the action may not read.
    pub hide: Vec<PathBuf>,
    /// TCP and every socket family allowed.
    pub network: bool,
    /// The host read-only but `write` (a user and mount namespace).
    pub namespaces: bool,
}

impl Rules {
    /// The wrapper argv: `program...`, the rules as flags, `--`.
    pub fn wrapper(&self, program: &[String]) -> Vec<String> {
        let mut argv = program.to_vec();
        for path in &self.write {
            argv.push("--write".into());
            argv.push(path.to_string_lossy().into_owned());
        }
        for path in &self.hide {
            argv.push("--hide".into());
            argv.push(path.to_string_lossy().into_owned());
        }
        if self.dev {
            argv.push("--dev".into());
        }
        if self.network {
            argv.push("--network".into());
        }
        if self.namespaces {
            argv.push("--namespaces".into());
        }
        argv.push("--".into());
        argv
    }

    /// Reads the flags [`Rules::wrapper`] wrote; returns the rules and the
    /// action's argv (what follows `--`, never empty).
    pub fn parse(
        args: impl IntoIterator<Item = OsString>,
    ) -> Result<(Rules, Vec<OsString>), String> {
        let mut rules = Rules::default();
        let mut args = args.into_iter();
        loop {
            let Some(arg) = args.next() else {
                return Err("no `--` before the action's argv".into());
            };
            match arg.to_str() {
                Some("--") => break,
                Some("--dev") => rules.dev = true,
                Some("--network") => rules.network = true,
                Some("--namespaces") => rules.namespaces = true,
                Some(flag @ ("--write" | "--hide")) => {
                    let path =
                        PathBuf::from(args.next().ok_or_else(|| format!("{flag} needs a path"))?);
                    if !path.is_absolute() {
                        return Err(format!("{flag} {path:?}: not absolute"));
                    }
                    if flag == "--write" {
                        rules.write.push(path);
                    } else {
                        rules.hide.push(path);
                    }
                }
                _ => return Err(format!("unknown flag {arg:?}")),
            }
        }
        let action: Vec<OsString> = args.collect();
        if action.is_empty() {
            return Err("no action after `--`".into());
        }
        Ok((rules, action))
    }
}

/// Set to a number, the ABI [`landlock_abi`] reports instead of the
/// kernel's: how the fallback to Bazel's jail is tested on a kernel that
/// has Landlock.
pub const ABI_OVERRIDE: &str = "ACTIONFS_LANDLOCK_ABI";

/// The Landlock ABI of this kernel (0: none), or [`ABI_OVERRIDE`]'s.
pub fn landlock_abi() -> i32 {
    if let Some(abi) = std::env::var(ABI_OVERRIDE)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return abi;
    }
    #[cfg(target_os = "linux")]
    {
        landlock::abi()
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// The arguments after the program name, from a C `main`'s `argc` and
/// `argv`: a `no_main` program has no others on musl (glibc also hands
/// them to std).
///
/// # Safety
/// `argv` must hold `argc` valid NUL-terminated strings, as `main` gets.
pub unsafe fn args_from_main(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
) -> impl Iterator<Item = OsString> {
    use std::os::unix::ffi::OsStringExt;
    (1..usize::try_from(argc).unwrap_or(0)).map(move |i| {
        // SAFETY: i < argc, and the caller vouches for argv's strings.
        let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) };
        OsString::from_vec(arg.to_bytes().to_vec())
    })
}

/// The jail's entry point, for `actionfs-jail` and `actionfs __jail`:
/// applies the rules in `args`, runs the action and returns the exit
/// status to use (the action's, or 127 and the error on stderr); an
/// action killed by a signal kills the wrapper with it.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let args: Vec<OsString> = args.into_iter().collect();
    if args.len() == 1 && args[0] == PROBE_NAMESPACES {
        return probe_namespaces();
    }
    let (rules, action) = match Rules::parse(args) {
        Ok(parsed) => parsed,
        Err(why) => {
            eprintln!("{HELPER}: {why}");
            return 2;
        }
    };
    #[cfg(target_os = "linux")]
    {
        supervise::run(&rules, &action)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (rules, action);
        eprintln!("{HELPER}: Landlock is Linux's; this system has no such jail");
        127
    }
}

fn probe_namespaces() -> i32 {
    #[cfg(target_os = "linux")]
    let probed = namespaces::probe();
    #[cfg(not(target_os = "linux"))]
    let probed: Result<(), String> = Err("namespaces are Linux's".into());
    match probed {
        Ok(()) => 0,
        Err(why) => {
            eprintln!("{why}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_parses_back_to_its_rules() {
        let rules = Rules {
            write: vec!["/a b".into(), "/c".into()],
            dev: true,
            hide: vec!["/secret".into()],
            network: false,
            namespaces: true,
        };
        let mut argv = rules.wrapper(&["jail".into()]);
        assert_eq!(argv[0], "jail");
        assert_eq!(argv.last().unwrap(), "--");
        argv.extend(["/bin/true".to_owned(), "--write".to_owned()]);
        let (parsed, action) = Rules::parse(argv.into_iter().skip(1).map(OsString::from)).unwrap();
        assert_eq!(parsed, rules);
        assert_eq!(action, ["/bin/true", "--write"]);
        assert!(
            Rules::parse(["--write".into(), "rel".into(), "--".into(), "x".into()])
                .unwrap_err()
                .contains("not absolute")
        );
        assert!(Rules::parse(["--".into()]).is_err());
    }
}
