//! Command-line parsing, compatible with sandboxfs 0.2's flags.
//!
//! Flags take their value as `--flag=value` or `--flag value`. Any mistake
//! is a [`UsageError`], which the binary reports with exit status 2.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use actionfs_protocol::{Mapping, PrefixTable, ResolvedMapping};

use crate::calibrate::CalibrateArgs;
use crate::config::{Allow, DaemonConfig};
use crate::hybrid::cutoff::NativeBelow;
use crate::materialize::Method;

/// The version line Bazel parses: it must be `sandboxfs X.Y.Z` exactly, and
/// 0.2.0 or later selects the JSON protocol actionfs speaks.
pub const BAZEL_VERSION_LINE: &str = "sandboxfs 0.2.0";

pub const HELP: &str = "\
usage: actionfs [OPTIONS] MOUNTPOINT
       actionfs materialize [-v] [--spec=FILE|-] [--method=M] [--threads=N] DEST
       actionfs rmtree [-v] DIR
       actionfs calibrate [--quick] [--dir=PATH] [--method=M] [--write=PATH]

Mounts a sandbox file system at MOUNTPOINT. Sandboxes are created and
destroyed by JSON requests read from the input (the sandboxfs 0.2 protocol,
see protocol/SPEC.md); each is answered with one line on the output. The
mount stays up until SIGTERM, SIGINT or SIGHUP, or an external unmount.

options:
  --allow=self|root|other  who may use the mount (default: self); root and
                           other need user_allow_other in /etc/fuse.conf
                           unless the daemon runs as root
  --input=PATH|-           read requests from PATH (default -: stdin)
  --output=PATH|-          write answers to PATH (default -: stdout)
  --mapping=TYPE:PATH:TARGET
                           map TARGET (absolute) at PATH (absolute, inside
                           the mount) before any request; TYPE is ro or rw;
                           repeatable, applied in order; unmapped parents
                           become read-only virtual directories
  --ttl=DURATION           how long the kernel caches names and attributes,
                           e.g. 60s, 500ms, 0s (default: 60s)
  --xattrs                 pass extended attributes through to underlying
                           files (default: report them unsupported)
  --passthrough=auto|off   auto (default): the kernel reads and writes
                           files directly (FUSE passthrough, Linux 6.9+,
                           needs CAP_SYS_ADMIN), falling back, logged, to
                           serving data through the daemon; off: always
                           serve data through the daemon
  --native_below=N|auto|0  build sandboxes of fewer than N mappings as real
                           files outside the mount (shown as MOUNTPOINT/ID,
                           a symlink to them) instead of in the FUSE view;
                           auto: the cutoff measured by `actionfs calibrate`
                           (see --calibration), else the shipped default
                           (tmpfs: all native; disk: all FUSE);
                           0 (default): every sandbox in the FUSE view
  --native_method=M        how native sandboxes place inputs: symlink
                           (default), hardlink, clone, copy or auto
  --native_dir=PATH        where native sandboxes are built (default:
                           MOUNTPOINT.native; same file system as the
                           inputs for hardlink and clone)
  --calibration=PATH       the file `calibrate --write` saved, for
                           --native_below=auto (default: the first of
                           $ACTIONFS_CALIBRATION, ~/.config/actionfs/
                           calibration.json, /etc/actionfs/calibration.json)
  --node_cache             accepted for sandboxfs compatibility; no effect
  --reconfig_threads=N     apply up to N requests at once (default: number
                           of CPUs)
  --help                   print this help and exit
  --version                print the version and exit (the first line is
                           the sandboxfs version Bazel checks)

exit status: 0 after a clean unmount, 1 on a runtime error, 2 on a usage
error. Set RUST_LOG=debug for a log of every request on stderr.

materialize builds one sandbox as real files under DEST (missing or empty),
from a spec holding one CreateSandbox request exactly as on the wire
({\"C\":{...}}, prefixes included; default - reads stdin). --method is
symlink, hardlink, clone (FICLONE / clonefile), copy, or auto (default:
per file, hard link, else clone, else symlink). --threads (at most 2)
defaults to 2 from 200 mappings on, else 1. On failure DEST is left as
it was. rmtree deletes DIR like rm -rf, never following symlinks. With -v
both print what they did and how long it took.

calibrate times whole actions (create a sandbox, stat every input, read
10% or all of them, write an output, destroy) in FUSE and native
sandboxes from 10 to 20,000 inputs (--quick: 10 to 5,000, fewer runs)
under --dir (default: the temporary directory; give the directory your
sandboxes live in, e.g. Bazel's output base), prints the curve and the
recommended --native_below, and with --write saves it for
--native_below=auto. --method is the native method (default symlink).
";

/// `actionfs materialize`.
#[derive(Clone, Debug)]
pub struct MaterializeArgs {
    /// `None` means stdin.
    pub spec: Option<PathBuf>,
    pub method: Method,
    /// 0: chosen by size.
    pub threads: usize,
    pub verbose: bool,
    pub dest: PathBuf,
}

#[derive(Debug)]
pub enum Command {
    Help,
    Version,
    Serve(DaemonConfig),
    Materialize(MaterializeArgs),
    Rmtree { dir: PathBuf, verbose: bool },
    Calibrate(CalibrateArgs),
}

#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn usage(message: impl Into<String>) -> UsageError {
    UsageError(message.into())
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut args = args.into_iter().peekable();
    match args.peek().and_then(|a| a.to_str()) {
        Some("materialize") => {
            args.next();
            return parse_materialize(args);
        }
        Some("rmtree") => {
            args.next();
            return parse_rmtree(args);
        }
        Some("calibrate") => {
            args.next();
            return parse_calibrate(args);
        }
        _ => {}
    }
    let mut allow = Allow::OwnerOnly;
    let mut input = None;
    let mut output = None;
    let mut mappings = Vec::new();
    let mut ttl = Duration::from_secs(60);
    let mut xattrs = false;
    let mut passthrough = true;
    let mut native_below = NativeBelow::Off;
    let mut native_method = Method::Symlink;
    let mut native_dir = None;
    let mut calibration = None;
    let mut reconfig_threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut positional = Vec::new();

    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|bad| usage(format!("argument {bad:?} is not valid UTF-8")))?;
        if !arg.starts_with("--") || arg == "--" {
            if arg != "--" {
                positional.push(arg);
            }
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
            None => (arg.clone(), None),
        };
        let mut value = |what: &str| -> Result<String, UsageError> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => args
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| usage(format!("{name} needs {what}"))),
            }
        };
        match name.as_str() {
            "--help" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--allow" => {
                allow = match value("self, root or other")?.as_str() {
                    "self" => Allow::OwnerOnly,
                    "root" => Allow::RootAndOwner,
                    "other" => Allow::Everyone,
                    other => {
                        return Err(usage(format!(
                            "--allow takes self, root or other, not {other:?}"
                        )))
                    }
                }
            }
            "--input" => input = stream_path(value("a path or -")?),
            "--output" => output = stream_path(value("a path or -")?),
            "--mapping" => mappings.push(parse_mapping(&value("TYPE:PATH:TARGET")?)?),
            "--ttl" => ttl = parse_duration(&value("a duration such as 60s")?)?,
            "--xattrs" => xattrs = true,
            "--passthrough" => {
                passthrough = match value("auto or off")?.as_str() {
                    "auto" => true,
                    "off" => false,
                    other => {
                        return Err(usage(format!(
                            "--passthrough takes auto or off, not {other:?}"
                        )))
                    }
                }
            }
            "--native_below" => {
                let text = value("a count, 0 or auto")?;
                native_below = NativeBelow::parse(&text).ok_or_else(|| {
                    usage(format!(
                        "--native_below takes a count, 0 or auto, not {text:?}"
                    ))
                })?
            }
            "--native_method" => {
                let text = value("a method")?;
                native_method = Method::parse(&text).ok_or_else(|| {
                    usage(format!(
                        "--native_method takes symlink, hardlink, clone, copy or auto, not {text:?}"
                    ))
                })?;
            }
            "--native_dir" => native_dir = Some(PathBuf::from(value("a path")?)),
            "--calibration" => calibration = Some(PathBuf::from(value("a path")?)),
            "--node_cache" => {}
            "--reconfig_threads" => {
                let text = value("a number")?;
                reconfig_threads =
                    text.parse()
                        .ok()
                        .filter(|&n: &usize| n > 0)
                        .ok_or_else(|| {
                            usage(format!(
                                "--reconfig_threads takes a positive number, not {text:?}"
                            ))
                        })?;
            }
            _ => return Err(usage(format!("unknown flag {name}"))),
        }
        if matches!(name.as_str(), "--xattrs" | "--node_cache") && inline.is_some() {
            return Err(usage(format!("{name} takes no value")));
        }
    }

    let mount_point = match positional.as_slice() {
        [one] => PathBuf::from(one),
        [] => return Err(usage("missing MOUNTPOINT")),
        [_, extra @ ..] => {
            return Err(usage(format!(
                "only one MOUNTPOINT may be given; unexpected {extra:?}"
            )))
        }
    };
    Ok(Command::Serve(DaemonConfig {
        allow,
        input,
        output,
        mappings,
        ttl,
        xattrs,
        passthrough,
        native_below,
        native_method,
        native_dir,
        calibration,
        reconfig_threads,
        mount_point,
    }))
}

/// Subcommand flags as given: name (with dashes) and optional `=value`.
type Flags = Vec<(String, Option<String>)>;

/// Splits subcommand arguments into `--flag[=value]` pairs and positionals.
fn split_flags(args: impl Iterator<Item = OsString>) -> Result<(Flags, Vec<String>), UsageError> {
    let (mut flags, mut positional) = (Vec::new(), Vec::new());
    for arg in args {
        let arg = arg
            .into_string()
            .map_err(|bad| usage(format!("argument {bad:?} is not valid UTF-8")))?;
        if arg == "-v" {
            flags.push(("-v".to_owned(), None));
        } else if let Some(flag) = arg.strip_prefix("--") {
            let (name, value) = match flag.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (flag.to_owned(), None),
            };
            flags.push((format!("--{name}"), value));
        } else {
            positional.push(arg);
        }
    }
    Ok((flags, positional))
}

fn one_positional(positional: Vec<String>, what: &str) -> Result<PathBuf, UsageError> {
    match <[String; 1]>::try_from(positional) {
        Ok([one]) => Ok(PathBuf::from(one)),
        Err(other) if other.is_empty() => Err(usage(format!("missing {what}"))),
        Err(other) => Err(usage(format!(
            "only one {what} may be given, got {other:?}"
        ))),
    }
}

fn parse_materialize(args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let (flags, positional) = split_flags(args)?;
    let mut parsed = MaterializeArgs {
        spec: None,
        method: Method::Auto,
        threads: 0,
        verbose: false,
        dest: PathBuf::new(),
    };
    for (name, value) in flags {
        let need = |what: &str| {
            value
                .clone()
                .ok_or_else(|| usage(format!("{name} needs {what} (as {name}=...)")))
        };
        match name.as_str() {
            "-v" => parsed.verbose = true,
            "--spec" => parsed.spec = stream_path(need("a file or -")?),
            "--method" => {
                let text = need("a method")?;
                parsed.method = Method::parse(&text).ok_or_else(|| {
                    usage(format!(
                        "--method takes symlink, hardlink, clone, copy or auto, not {text:?}"
                    ))
                })?;
            }
            "--threads" => {
                let text = need("a number")?;
                parsed.threads = text
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
                    .ok_or_else(|| {
                        usage(format!("--threads takes a positive number, not {text:?}"))
                    })?;
            }
            _ => return Err(usage(format!("unknown flag {name} for materialize"))),
        }
    }
    parsed.dest = one_positional(positional, "DEST")?;
    Ok(Command::Materialize(parsed))
}

fn parse_rmtree(args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let (flags, positional) = split_flags(args)?;
    let mut verbose = false;
    for (name, _) in flags {
        match name.as_str() {
            "-v" => verbose = true,
            _ => return Err(usage(format!("unknown flag {name} for rmtree"))),
        }
    }
    let dir = one_positional(positional, "DIR")?;
    Ok(Command::Rmtree { dir, verbose })
}

fn parse_calibrate(args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let (flags, positional) = split_flags(args)?;
    if let Some(extra) = positional.first() {
        return Err(usage(format!("calibrate takes no argument {extra:?}")));
    }
    let mut parsed = CalibrateArgs {
        dir: std::env::temp_dir(),
        quick: false,
        method: Method::Symlink,
        write: None,
    };
    for (name, value) in flags {
        let needs = |what: &str| {
            value
                .clone()
                .ok_or_else(|| usage(format!("{name} needs {what}")))
        };
        match name.as_str() {
            "--quick" => parsed.quick = true,
            "--dir" => parsed.dir = PathBuf::from(needs("a directory")?),
            "--write" => parsed.write = Some(PathBuf::from(needs("a path")?)),
            "--method" => {
                let text = needs("a method")?;
                parsed.method = Method::parse(&text)
                    .ok_or_else(|| usage(format!("--method {text:?} is not a method")))?;
            }
            _ => return Err(usage(format!("unknown flag {name} for calibrate"))),
        }
    }
    Ok(Command::Calibrate(parsed))
}

fn stream_path(value: String) -> Option<PathBuf> {
    (value != "-").then(|| PathBuf::from(value))
}

/// `ro:/path/in/mount:/underlying` or `rw:...`.
fn parse_mapping(text: &str) -> Result<ResolvedMapping, UsageError> {
    let mut parts = text.splitn(3, ':');
    let (Some(kind), Some(path), Some(target)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(usage(format!("--mapping {text:?} is not TYPE:PATH:TARGET")));
    };
    let writable = match kind {
        "ro" => false,
        "rw" => true,
        _ => {
            return Err(usage(format!(
                "--mapping {text:?}: TYPE must be ro or rw, not {kind:?}"
            )))
        }
    };
    PrefixTable::new()
        .resolve(&Mapping {
            path: path.to_owned(),
            underlying_path: target.to_owned(),
            writable,
            ..Mapping::default()
        })
        .map_err(|err| usage(format!("--mapping {text:?}: {err}")))
}

/// `60s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, UsageError> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| usage(format!("--ttl {text:?} is not a duration such as 60s")))?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1e3,
        "us" => number / 1e6,
        "ns" => number / 1e9,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => {
            return Err(usage(format!(
                "--ttl {text:?} has an unknown unit {unit:?}"
            )))
        }
    };
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| usage(format!("--ttl {text:?} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    fn options(args: &[&str]) -> DaemonConfig {
        match parse_strs(args) {
            Ok(Command::Serve(options)) => options,
            other => panic!("{args:?} gave {other:?}"),
        }
    }

    #[test]
    fn bazel_command_line() {
        let o = options(&["--allow=self", "/out/sandbox/sandboxfs"]);
        assert_eq!(o.allow, Allow::OwnerOnly);
        assert_eq!(o.mount_point, PathBuf::from("/out/sandbox/sandboxfs"));
        assert_eq!(o.ttl, Duration::from_secs(60));
        assert!(o.input.is_none() && o.output.is_none());
    }

    #[test]
    fn every_flag_in_both_spellings() {
        let o = options(&[
            "--allow",
            "other",
            "--input=/in",
            "--output",
            "/out",
            "--mapping=ro:/:/src",
            "--mapping",
            "rw:/scratch:/tmp/s",
            "--ttl=500ms",
            "--xattrs",
            "--node_cache",
            "--reconfig_threads=3",
            "/mnt",
        ]);
        assert_eq!(o.allow, Allow::Everyone);
        assert_eq!(o.input, Some(PathBuf::from("/in")));
        assert_eq!(o.output, Some(PathBuf::from("/out")));
        assert_eq!(o.mappings.len(), 2);
        assert_eq!(o.mappings[1].path, "/scratch");
        assert!(o.mappings[1].writable);
        assert_eq!(o.ttl, Duration::from_millis(500));
        assert!(o.xattrs);
        assert_eq!(o.reconfig_threads, 3);
    }

    #[test]
    fn usage_errors_name_the_problem() {
        for (args, expected) in [
            (&[][..], "missing MOUNTPOINT"),
            (&["/a", "/b"][..], "only one MOUNTPOINT"),
            (&["--bogus", "/m"][..], "unknown flag --bogus"),
            (&["--allow=everyone", "/m"][..], "--allow"),
            (&["--mapping=xx:/a:/b", "/m"][..], "TYPE must be ro or rw"),
            (&["--mapping=ro:a:/b", "/m"][..], "not absolute"),
            (&["--mapping=ro:/a", "/m"][..], "TYPE:PATH:TARGET"),
            (&["--ttl=5parsecs", "/m"][..], "unknown unit"),
            (&["--reconfig_threads=0", "/m"][..], "positive number"),
            (&["--xattrs=yes", "/m"][..], "takes no value"),
            (&["/m", "--allow"][..], "--allow needs"),
        ] {
            let err = parse_strs(args).unwrap_err();
            assert!(err.0.contains(expected), "{args:?}: {err}");
        }
    }

    #[test]
    fn subcommands() {
        let Ok(Command::Materialize(m)) = parse_strs(&[
            "materialize",
            "-v",
            "--spec=s.json",
            "--method=clone",
            "--threads=2",
            "/d",
        ]) else {
            panic!("materialize did not parse");
        };
        assert_eq!(m.method, Method::Clone);
        assert_eq!((m.threads, m.verbose), (2, true));
        assert_eq!(m.spec, Some(PathBuf::from("s.json")));
        assert_eq!(m.dest, PathBuf::from("/d"));
        assert!(matches!(
            parse_strs(&["rmtree", "/x"]),
            Ok(Command::Rmtree { verbose: false, .. })
        ));
        for (args, expected) in [
            (
                &["materialize", "--method=magic", "/d"][..],
                "--method takes",
            ),
            (&["materialize"][..], "missing DEST"),
            (&["rmtree", "/a", "/b"][..], "only one DIR"),
            (&["rmtree", "--force", "/a"][..], "unknown flag --force"),
        ] {
            let err = parse_strs(args).unwrap_err();
            assert!(err.0.contains(expected), "{args:?}: {err}");
        }
    }

    #[test]
    fn help_and_version_win() {
        assert!(matches!(parse_strs(&["--help"]), Ok(Command::Help)));
        assert!(matches!(
            parse_strs(&["--version", "/m"]),
            Ok(Command::Version)
        ));
    }
}
