//! The command line: one grammar for the daemon and every subcommand,
//! parsed by clap. Flags take `--flag value` or `--flag=value`, `--` ends
//! the options, and `-h`/`--help` works on the command and on each
//! subcommand. Every flag of sandboxfs 0.2 is accepted, with its spelling.
//!
//! Help and version are ordinary flags (help a global one) checked after a
//! first parse that requires nothing, so an unknown flag next to them is
//! still a usage error (exit 2), `-h` works after any subcommand or verb
//! without its arguments, and help wins over version; a second parse
//! checks what is required. The first line of `--version` is what Bazel
//! parses to pick the protocol. The grammar itself, as help, the man
//! pages and the completions show it, is [`crate::tools::command_line`].

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches};

use crate::daemon::config::DaemonConfig;
use crate::tools::calibrate::CalibrateArgs;
use crate::tools::command_line::{Cli, CtlVerb, ServeArgs, Sub};
use crate::tools::oneshot::MaterializeArgs;

/// The definition as documented: help renders it, and the tests hold the
/// manual to it.
pub use crate::tools::command_line::command;

/// The version line Bazel parses: it must be `sandboxfs X.Y.Z` exactly, and
/// 0.2.0 or later selects the JSON protocol actionfs speaks.
pub const BAZEL_VERSION_LINE: &str = "sandboxfs 0.2.0";

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Print this help text and exit 0.
    Help(String),
    Version,
    Serve(Box<DaemonConfig>),
    Materialize(MaterializeArgs),
    Rmtree {
        dir: PathBuf,
        verbose: bool,
    },
    Calibrate(CalibrateArgs),
    /// `actionfs stage-root`: one REAPI input root from a NativeLink CAS.
    StageRoot(crate::tools::stage_root::StageRootArgs),
    Ctl(crate::tools::ctl::CtlArgs),
    Replay(crate::tools::replay::ReplayArgs),
    ReplayActions(crate::tools::replay_actions::ReplayActionsArgs),
    /// `actionfs serve --workspace WS`: a backend for Bazel's sandbox
    /// backend protocol.
    Backend(crate::serve::ServeArgs),
    Doctor(crate::tools::doctor::DoctorArgs),
    /// `actionfs man`: print the manual page, or write every page to a
    /// directory.
    Man {
        dir: Option<PathBuf>,
    },
    Completions(clap_complete::Shell),
}

/// A usage error, rendered with the usage line; exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `command` with nothing required, for a first pass that looks for `-h`:
/// help must show even where a subcommand's arguments are missing.
fn lenient(command: clap::Command) -> clap::Command {
    command
        .subcommand_required(false)
        .arg_required_else_help(false)
        .mut_args(|arg| arg.required(false))
        .mut_subcommands(lenient)
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let argv: Vec<OsString> = std::iter::once(OsString::from("actionfs"))
        .chain(args)
        .collect();
    // First pass: an unknown flag is an error even next to -h; then help
    // (of the innermost subcommand named), then version.
    let mut relaxed = lenient(Cli::command());
    let matches = match relaxed.try_get_matches_from_mut(&argv) {
        Ok(matches) => matches,
        Err(err) => {
            // Told with the real requirements in its usage line.
            let mut command = Cli::command();
            let err = command.try_get_matches_from_mut(&argv).err().unwrap_or(err);
            return Err(usage_error(&mut command, &err));
        }
    };
    let mut path = Vec::new();
    let mut innermost = &matches;
    while let Some((name, sub)) = innermost.subcommand() {
        path.push(name.to_owned());
        innermost = sub;
    }
    if innermost.get_flag("help") {
        return Ok(Command::Help(help_of(&path)));
    }
    if matches.get_flag("version") {
        return Ok(Command::Version);
    }
    let mut command = Cli::command();
    let matches = command
        .try_get_matches_from_mut(&argv)
        .map_err(|err| usage_error(&mut command, &err))?;
    let cli = Cli::from_arg_matches(&matches).map_err(|err| usage_error(&mut command, &err))?;
    match cli.subcommand {
        Some(sub) => subcommand(sub, &mut command),
        None => serve(cli.serve, &mut command),
    }
}

/// The long help of the (sub)command at `path` (`[]`: the daemon's).
fn help_of(path: &[String]) -> String {
    let mut command = command();
    let mut target = &mut command;
    for name in path {
        target = target
            .find_subcommand_mut(name)
            .expect("a parsed subcommand exists");
    }
    target.render_long_help().to_string()
}

/// A clap error as the user sees it: the problem, then the usage line of
/// the command it concerns.
fn usage_error(command: &mut clap::Command, err: &clap::Error) -> UsageError {
    let mut text = err.render().to_string().trim_end().to_owned();
    if !text.contains("Usage:") {
        text.push_str("\n\n");
        text.push_str(command.render_usage().to_string().trim_end());
    }
    UsageError(text)
}

/// A usage error of our own about `command` (the top level, or a
/// subcommand by name).
fn missing(command: &mut clap::Command, sub: Option<&str>, what: &str) -> UsageError {
    let target = match sub {
        Some(name) => command
            .find_subcommand_mut(name)
            .expect("a known subcommand"),
        None => command,
    };
    let err = target.error(ErrorKind::MissingRequiredArgument, what);
    usage_error(target, &err)
}

fn serve(args: ServeArgs, command: &mut clap::Command) -> Result<Command, UsageError> {
    let mount_point = match <[PathBuf; 1]>::try_from(args.mount_point) {
        Ok([one]) => one,
        Err(given) => {
            let (kind, message) = if given.is_empty() {
                (
                    ErrorKind::MissingRequiredArgument,
                    "missing MOUNTPOINT".to_owned(),
                )
            } else {
                (
                    ErrorKind::TooManyValues,
                    format!("only one MOUNTPOINT may be given, not {given:?}"),
                )
            };
            let err = command.error(kind, message);
            return Err(usage_error(command, &err));
        }
    };
    if let Some(path) = &args.cpu_profile {
        log::warn!("--cpu_profile={path:?} is accepted for compatibility and ignored");
    }
    Ok(Command::Serve(Box::new(DaemonConfig {
        allow: args.allow,
        input: stream_path(args.input),
        output: stream_path(args.output),
        mappings: args.mappings,
        ttl: args.ttl,
        xattrs: args.xattrs,
        passthrough: args.passthrough == "auto",
        zero_message_opens: args.zero_message_opens,
        transport: args.transport,
        native_below: args.native_below,
        native_method: args.native_method,
        native_stashes: args.native_stashes,
        native_dir: args.native_dir,
        calibration: args.calibration,
        reconfig_threads: args
            .reconfig_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
        mount_point,
        access_log: args.access_log,
        control: args.control,
        record: args.record,
    })))
}

fn subcommand(sub: Sub, command: &mut clap::Command) -> Result<Command, UsageError> {
    Ok(match sub {
        Sub::Materialize {
            verbose,
            spec,
            method,
            threads,
            dest,
        } => Command::Materialize(MaterializeArgs {
            spec: stream_path(spec),
            method,
            threads: threads.unwrap_or(0),
            verbose,
            dest,
        }),
        Sub::Rmtree { verbose, dir } => Command::Rmtree { dir, verbose },
        Sub::StageRoot {
            cas,
            digest,
            mechanism,
            outputs,
            verbose,
            dest,
        } => {
            let (hash, size) = digest
                .split_once('/')
                .and_then(|(hash, size)| Some((hash.to_owned(), size.parse::<i64>().ok()?)))
                .ok_or_else(|| {
                    UsageError(format!(
                        "--digest {digest:?}: expected HASH/SIZE (64 hex digits, a slash, the \
                         size in bytes)"
                    ))
                })?;
            Command::StageRoot(crate::tools::stage_root::StageRootArgs {
                cas,
                hash,
                size,
                mechanism,
                outputs,
                verbose,
                dest,
            })
        }
        Sub::Ctl {
            control,
            json,
            verb,
        } => Command::Ctl(crate::tools::ctl::CtlArgs {
            control: control
                .ok_or_else(|| missing(command, Some("ctl"), "missing --control=PATH"))?,
            json,
            verb: match verb {
                CtlVerb::Create { id, maps, spec } => {
                    crate::tools::ctl::Verb::Create { id, maps, spec }
                }
                CtlVerb::Destroy { id } => crate::tools::ctl::Verb::Destroy(id),
                CtlVerb::List => crate::tools::ctl::Verb::List,
                CtlVerb::Stats => crate::tools::ctl::Verb::Stats,
                CtlVerb::Accessed { id } => crate::tools::ctl::Verb::Accessed(id),
            },
        }),
        Sub::Replay {
            flood,
            window,
            populate,
            file,
            mount_point,
            daemon_flags,
        } => Command::Replay(crate::tools::replay::ReplayArgs {
            file,
            mount_point,
            flood,
            window,
            populate,
            daemon_flags,
        }),
        Sub::ReplayActions {
            execlog,
            exec_root,
            jobs,
            modes,
            runs,
            backend_opts,
            backend,
            content,
            backend_state,
            jail,
            out,
            keep,
        } => Command::ReplayActions(crate::tools::replay_actions::ReplayActionsArgs {
            execlog,
            exec_root,
            jobs: jobs
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            modes: modes
                .iter()
                .enumerate()
                .filter(|(i, m)| !modes[..*i].contains(m))
                .map(|(_, m)| *m)
                .collect(),
            runs,
            backend_opts,
            backend,
            content,
            backend_state,
            jail,
            out,
            keep,
        }),
        Sub::Calibrate {
            quick,
            sizes,
            dir,
            method,
            native_stashes,
            write,
        } => Command::Calibrate(CalibrateArgs {
            dir: dir.unwrap_or_else(std::env::temp_dir),
            quick,
            sizes,
            method,
            native_stashes,
            write,
        }),
        Sub::Serve { workspace } => Command::Backend(crate::serve::ServeArgs { workspace }),
        Sub::Doctor { json, sandbox_base } => Command::Doctor(crate::tools::doctor::DoctorArgs {
            json,
            sandbox_base: sandbox_base.unwrap_or_else(std::env::temp_dir),
        }),
        Sub::Man { dir } => Command::Man { dir },
        Sub::Completions { shell } => Command::Completions(shell),
    })
}

fn stream_path(value: String) -> Option<PathBuf> {
    (value != "-").then(|| PathBuf::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Duration;

    use crate::fuse::options::Allow;
    use crate::sandbox::hybrid::cutoff::NativeBelow;
    use crate::sandbox::materialize::Method;

    fn parse_strs(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    fn options(args: &[&str]) -> DaemonConfig {
        match parse_strs(args) {
            Ok(Command::Serve(options)) => *options,
            other => panic!("{args:?} gave {other:?}"),
        }
    }

    fn usage(args: &[&str]) -> String {
        match parse_strs(args) {
            Err(UsageError(message)) => message,
            other => panic!("{args:?} should be a usage error, gave {other:?}"),
        }
    }

    #[test]
    fn bazel_command_line() {
        let o = options(&["--allow=self", "/out/sandbox/sandboxfs"]);
        assert_eq!(o.allow, Allow::OwnerOnly);
        assert_eq!(o.mount_point, PathBuf::from("/out/sandbox/sandboxfs"));
        assert_eq!(o.ttl, Duration::from_secs(60));
        assert!(o.input.is_none() && o.output.is_none());
        // Bazel's flags cannot pass ours: the defaults must be the fast ones.
        assert_eq!(o.native_below, NativeBelow::Auto);
    }

    #[test]
    fn every_flag_in_both_spellings_and_double_dash_ends_options() {
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
            "--cpu_profile",
            "/tmp/p",
            "--reconfig_threads=3",
            "--native_below",
            "auto",
            "--",
            "--looks-like-a-flag",
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
        assert_eq!(o.native_below, NativeBelow::Auto);
        assert_eq!(o.mount_point, PathBuf::from("--looks-like-a-flag"));
    }

    #[test]
    fn usage_errors_name_the_problem_and_show_the_usage() {
        for (args, expected) in [
            (&[][..], "missing MOUNTPOINT"),
            (&["/a", "/b"][..], "only one MOUNTPOINT"),
            (&["--bogus", "/m"][..], "--bogus"),
            (&["--allow=everyone", "/m"][..], "self, root or other"),
            (&["--mapping=xx:/a:/b", "/m"][..], "TYPE must be ro or rw"),
            (&["--mapping=ro:a:/b", "/m"][..], "not absolute"),
            (&["--mapping=ro:/a", "/m"][..], "TYPE:PATH:TARGET"),
            (&["--ttl=5parsecs", "/m"][..], "unknown unit"),
            (&["--reconfig_threads=0", "/m"][..], "positive number"),
            (&["/m", "--allow"][..], "--allow"),
        ] {
            let err = usage(args);
            assert!(err.contains(expected), "{args:?}: {err}");
            assert!(
                err.contains("Usage: actionfs"),
                "{args:?}: no usage line: {err}"
            );
        }
    }

    #[test]
    fn help_and_version_lose_to_an_unknown_flag_and_help_wins_over_version() {
        assert!(matches!(parse_strs(&["-h"]), Ok(Command::Help(_))));
        assert!(matches!(parse_strs(&["--help"]), Ok(Command::Help(_))));
        assert!(matches!(parse_strs(&["--version"]), Ok(Command::Version)));
        assert!(matches!(
            parse_strs(&["--version", "/m"]),
            Ok(Command::Version)
        ));
        assert!(matches!(
            parse_strs(&["--version", "--help"]),
            Ok(Command::Help(_))
        ));
        assert!(matches!(
            parse_strs(&["--help", "--version"]),
            Ok(Command::Help(_))
        ));
        for args in [&["--help", "--bogus"][..], &["--bogus", "--version"][..]] {
            assert!(usage(args).contains("--bogus"), "{args:?}");
        }
    }

    #[test]
    fn replay_actions_defaults_and_backend_options() {
        use crate::tools::replay_actions::{ContentMode, Mode};
        let Ok(Command::ReplayActions(r)) =
            parse_strs(&["replay-actions", "--execlog", "l.json", "--exec-root=/e"])
        else {
            panic!("replay-actions did not parse");
        };
        assert_eq!(r.modes, [Mode::Serve, Mode::Unsandboxed, Mode::Symlinks]);
        assert_eq!(
            (r.runs, r.content, r.keep, r.jail),
            (1, ContentMode::Bazel, false, None)
        );
        assert!(r.jobs > 0 && r.backend.is_none() && r.backend_opts.is_empty());
        let Ok(Command::ReplayActions(r)) = parse_strs(&[
            "replay-actions",
            "--execlog=l.json",
            "--exec-root",
            "/e",
            "--modes=symlinks,serve,symlinks,reuse,reuse-shm,reuse-inmemory",
            "--backend-opt",
            "--native_below=0",
            "--backend-opt=--ttl=1s",
            "--jobs=3",
            "--runs",
            "5",
            "--content=inline",
            "--jail=linux-sandbox=/opt/ls",
            "--keep",
        ]) else {
            panic!("replay-actions did not parse");
        };
        assert_eq!(
            r.modes,
            [
                Mode::Symlinks,
                Mode::Serve,
                Mode::Reuse,
                Mode::ReuseShm,
                Mode::ReuseInMemory
            ]
        );
        assert_eq!(r.backend_opts, ["--native_below=0", "--ttl=1s"]);
        assert_eq!(
            (r.jobs, r.runs, r.content, r.keep),
            (3, 5, ContentMode::Inline, true)
        );
        assert_eq!(
            r.jail.unwrap(),
            crate::tools::replay_actions::Jail::LinuxSandbox {
                path: "/opt/ls".into()
            }
        );
        for (args, expected) in [
            (&["replay-actions", "--exec-root=/e"][..], "--execlog"),
            (
                &[
                    "replay-actions",
                    "--execlog=l",
                    "--exec-root=/e",
                    "--runs=0",
                ][..],
                "positive",
            ),
            (
                &[
                    "replay-actions",
                    "--execlog=l",
                    "--exec-root=/e",
                    "--content=copy",
                ][..],
                "location",
            ),
        ] {
            let err = usage(args);
            assert!(err.contains(expected), "{args:?}: {err}");
        }
    }

    #[test]
    fn subcommands_take_the_same_grammar() {
        for args in [
            &[
                "materialize",
                "-v",
                "--spec=s.json",
                "--method=clone",
                "--threads=2",
                "/d",
            ][..],
            &[
                "materialize",
                "--verbose",
                "--spec",
                "s.json",
                "--method",
                "clone",
                "--threads",
                "2",
                "/d",
            ][..],
        ] {
            let Ok(Command::Materialize(m)) = parse_strs(args) else {
                panic!("{args:?} did not parse");
            };
            assert_eq!(m.method, Method::Clone);
            assert_eq!((m.threads, m.verbose), (2, true));
            assert_eq!(m.spec, Some(PathBuf::from("s.json")));
            assert_eq!(m.dest, PathBuf::from("/d"));
        }
        assert!(matches!(
            parse_strs(&["rmtree", "--", "-odd-name"]),
            Ok(Command::Rmtree { verbose: false, dir }) if dir == Path::new("-odd-name")
        ));
        let Ok(Command::Calibrate(c)) = parse_strs(&["calibrate", "--quick", "--dir", "/x"]) else {
            panic!("calibrate did not parse");
        };
        assert!(c.quick && c.dir == Path::new("/x"));
        for sub in ["materialize", "rmtree", "calibrate"] {
            let Ok(Command::Help(help)) = parse_strs(&[sub, "-h"]) else {
                panic!("{sub} -h is not help");
            };
            assert!(help.contains(&format!("Usage: actionfs {sub}")), "{help}");
        }
        for (args, expected) in [
            (
                &["materialize", "--method=magic", "/d"][..],
                "symlink, hardlink",
            ),
            (&["materialize"][..], "DEST"),
            (&["rmtree", "/a", "/b"][..], "'/b'"),
            (&["rmtree", "--force", "/a"][..], "--force"),
        ] {
            let err = usage(args);
            assert!(err.contains(expected), "{args:?}: {err}");
        }
    }
}
