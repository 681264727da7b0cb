//! The command line's definition: one clap grammar for the daemon and
//! every subcommand, with each flag's help. [`command`] is what `--help`,
//! the man pages and the completions ([`super::man`]) show; `cli.rs` parses
//! with it and dispatches on what it finds. It lives here, below the
//! dispatcher, so that the tools that render it need not import the
//! dispatcher that runs them.

use std::path::PathBuf;
use std::time::Duration;

use actionfs_protocol::{Mapping, PrefixTable, ResolvedMapping};
use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};

use crate::daemon::flag_values::{
    parse_allow, parse_duration, parse_method, parse_native_below, parse_positive, parse_transport,
    parse_zero_message_opens,
};
use crate::fuse::options::{Allow, ZeroMessageOpens};
use crate::fuse::transport::Asked;
use crate::sandbox::hybrid::cutoff::NativeBelow;
use crate::sandbox::materialize::Method;

#[derive(Parser, Debug)]
#[command(
    name = "actionfs",
    about = "A sandbox file system for build tools (the sandboxfs 0.2 protocol)",
    long_about = "Mounts a sandbox file system at MOUNTPOINT. Sandboxes are created and \
destroyed by JSON requests read from the input (the sandboxfs 0.2 protocol, see \
protocol/SPEC.md); each is answered with one line on the output. The mount stays up \
until SIGTERM, SIGINT, SIGHUP or SIGQUIT, or an external unmount.",
    after_long_help = "exit status: 0 after a clean unmount (end of input or an external \
unmount), 1 on a runtime error, 2 on a usage error; after a signal the daemon unmounts and \
exits by that signal. Set RUST_LOG=debug for a log of every request on stderr.",
    override_usage = "actionfs [OPTIONS] MOUNTPOINT\n       actionfs <COMMAND> [OPTIONS] ...",
    // Help is our own global flag (below), so that it works on every
    // subcommand yet loses to an unknown flag. (clap's setting is global.)
    disable_help_flag = true,
    disable_help_subcommand = true,
    disable_version_flag = true,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) subcommand: Option<Sub>,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    /// Print this help and exit
    #[arg(short = 'h', long = "help", action = ArgAction::SetTrue, global = true)]
    pub(crate) help: bool,
    /// Print the version and exit (the first line is the sandboxfs version
    /// Bazel checks)
    #[arg(long = "version", action = ArgAction::SetTrue)]
    pub(crate) version: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Who may use the mount: self, root or other; root and other need
    /// user_allow_other in /etc/fuse.conf unless the daemon runs as root
    #[arg(long, value_name = "self|root|other", default_value = "self", value_parser = parse_allow)]
    pub(crate) allow: Allow,
    /// Read requests from PATH (-: stdin)
    #[arg(long, value_name = "PATH|-", default_value = "-")]
    pub(crate) input: String,
    /// Write answers to PATH (-: stdout)
    #[arg(long, value_name = "PATH|-", default_value = "-")]
    pub(crate) output: String,
    /// Map TARGET (absolute) at PATH (absolute, inside the mount) before
    /// any request; TYPE is ro or rw; repeatable, applied in order;
    /// unmapped parents become read-only virtual directories
    #[arg(long = "mapping", value_name = "TYPE:PATH:TARGET", value_parser = parse_mapping)]
    pub(crate) mappings: Vec<ResolvedMapping>,
    /// How long the kernel caches names and attributes, e.g. 60s, 500ms,
    /// 0s (with --allow=root it never caches)
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,
    /// Pass extended attributes through to underlying files (default:
    /// report them unsupported)
    #[arg(long)]
    pub(crate) xattrs: bool,
    /// auto: the kernel reads and writes files directly (FUSE
    /// passthrough, Linux 6.9+, needs CAP_SYS_ADMIN) for writable files
    /// and read-only ones of 64 KiB or more (smaller ones are kept in the
    /// page cache), falling back, logged, to serving data through the
    /// daemon; off: always the daemon
    #[arg(long, value_name = "auto|off", default_value = "auto", value_parser = ["auto", "off"])]
    pub(crate) passthrough: String,
    /// off (default): every open asks the daemon, which keeps the opened
    /// file for the handle (passthrough where available); auto: the same
    /// as off; on: opt-in fast mode that changes semantics: the kernel
    /// opens files without asking (no OPEN or RELEASE round trip, no
    /// passthrough), read-only files show no write permission, a file
    /// removed or replaced underneath between its open and its first read
    /// is not read as it was, an in-place rewrite shows only after --ttl,
    /// and a deleted output's space is held until the kernel forgets its
    /// inode (see the man page)
    #[arg(long = "zero_message_opens", value_name = "off|auto|on", default_value = "off", value_parser = parse_zero_message_opens)]
    pub(crate) zero_message_opens: ZeroMessageOpens,
    /// How FUSE requests travel: io_uring (one queue per CPU, Linux 6.14+
    /// with /sys/module/fuse/parameters/enable_uring set to Y), classic
    /// /dev/fuse, or auto: io_uring where the kernel offers it
    #[arg(long, value_name = "auto|io_uring|classic", default_value = "auto", value_parser = parse_transport)]
    pub(crate) transport: Asked,
    /// Build sandboxes of fewer than N mappings as real files outside the
    /// mount (MOUNTPOINT/ID is then a symlink to them); auto: the cutoff
    /// `actionfs calibrate` measured, else per sandbox from the file system
    /// its files would be made on (tmpfs: native, else FUSE); 0: every
    /// sandbox in the FUSE view
    #[arg(long = "native_below", value_name = "N|auto|0", default_value = "auto", value_parser = parse_native_below)]
    pub(crate) native_below: NativeBelow,
    /// How native sandboxes place inputs: symlink, hardlink, clone, copy
    /// or auto
    #[arg(long = "native_method", value_name = "METHOD", default_value = "symlink", value_parser = parse_method)]
    pub(crate) native_method: Method,
    /// Destroyed native sandboxes kept per file system to build the next
    /// ones from (symlink method only; 0 turns reuse off)
    #[arg(long = "native_stashes", value_name = "N", default_value_t = 8)]
    pub(crate) native_stashes: usize,
    /// Where native sandboxes are built (default: MOUNTPOINT.native; the
    /// inputs' file system for hardlink and clone)
    #[arg(long = "native_dir", value_name = "PATH")]
    pub(crate) native_dir: Option<PathBuf>,
    /// The file `calibrate --write` saved, for --native_below=auto
    /// (default: the first of $ACTIONFS_CALIBRATION,
    /// ~/.config/actionfs/calibration.json, /etc/actionfs/calibration.json)
    #[arg(long, value_name = "PATH")]
    pub(crate) calibration: Option<PathBuf>,
    /// Accepted for sandboxfs compatibility; no effect
    #[arg(long = "node_cache")]
    pub(crate) node_cache: bool,
    /// Accepted for sandboxfs compatibility; actionfs has no built-in CPU
    /// profiler, so this only logs a warning (use perf)
    #[arg(long = "cpu_profile", value_name = "PATH")]
    pub(crate) cpu_profile: Option<PathBuf>,
    /// Apply up to N requests at once (default: number of CPUs)
    #[arg(long = "reconfig_threads", value_name = "N", value_parser = parse_positive)]
    pub(crate) reconfig_threads: Option<usize>,
    /// Also take requests on a Unix socket at PATH (mode 0600, the
    /// daemon's user only), for `actionfs ctl`
    #[arg(long, value_name = "PATH")]
    pub(crate) control: Option<PathBuf>,
    /// Track what each FUSE sandbox does with its inputs and append one
    /// JSON line per sandbox to FILE when it is destroyed (read, looked up
    /// only, untouched); inodes are then not shared between sandboxes
    #[arg(long = "access_log", value_name = "FILE")]
    pub(crate) access_log: Option<PathBuf>,
    /// Record the request stream with timestamps and answers to FILE, for
    /// `actionfs replay`
    #[arg(long, value_name = "FILE")]
    pub(crate) record: Option<PathBuf>,
    /// Where to mount (a directory)
    // A list, so that a second one is reported as such.
    #[arg(value_name = "MOUNTPOINT")]
    pub(crate) mount_point: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Sub {
    /// Build one sandbox as real files under DEST (missing or empty), from a
    /// spec holding one CreateSandbox request exactly as on the wire
    #[command(
        override_usage = "actionfs materialize [OPTIONS] DEST",
        long_about = "Builds one sandbox as real files under DEST (missing or empty), from a \
spec holding one CreateSandbox request exactly as on the wire ({\"C\":{...}}, prefixes \
included). On failure DEST is left as it was."
    )]
    Materialize {
        /// Print what was made and how long it took
        #[arg(short = 'v', long = "verbose")]
        verbose: bool,
        /// The request (-: stdin)
        #[arg(long, value_name = "FILE|-", default_value = "-")]
        spec: String,
        /// symlink, hardlink, clone (FICLONE / clonefile), copy, or auto
        /// (per file: hard link, else clone, else symlink)
        #[arg(long, value_name = "METHOD", default_value = "auto", value_parser = parse_method)]
        method: Method,
        /// Threads making leaves (at most 2; default: 2 from 200 mappings
        /// on, else 1)
        #[arg(long, value_name = "N", value_parser = parse_positive)]
        threads: Option<usize>,
        /// Where to build the sandbox
        #[arg(value_name = "DEST")]
        dest: PathBuf,
    },
    /// Lay out a remote action's REAPI input root from a NativeLink CAS
    #[command(
        name = "stage-root",
        override_usage = "actionfs stage-root --cas DIR --digest HASH/SIZE [OPTIONS] DEST",
        long_about = "Lays out the REAPI input root of directory digest HASH/SIZE under DEST \
(missing or an empty directory) from a CAS in NativeLink's filesystem-store layout \
(DIR/d/HASH-SIZE), as a worker patched to use actionfs::stage would: to look at or rerun a \
remote action's inputs by hand. Files are hard links to the CAS's blobs (or clones or \
copies), executables links to 0555 copies, symlinks made verbatim. On failure DEST is left \
as it was; remove the root with `actionfs rmtree DEST`."
    )]
    StageRoot {
        /// The CAS's content_path (holding d/)
        #[arg(long, value_name = "DIR")]
        cas: PathBuf,
        /// The input root's directory digest, as HASH/SIZE
        #[arg(long, value_name = "HASH/SIZE")]
        digest: String,
        /// hardlink, clone, copy, or auto (per file: hard link, else clone,
        /// else copy)
        #[arg(long, value_name = "MECHANISM", default_value = "auto", value_parser = parse_mechanism)]
        mechanism: crate::stage::Mechanism,
        /// An output path (relative to the root) whose parent to make;
        /// repeatable
        #[arg(long = "output", value_name = "PATH")]
        outputs: Vec<String>,
        /// Print what was made and how long it took
        #[arg(short = 'v', long = "verbose")]
        verbose: bool,
        /// Where to lay the root out
        #[arg(value_name = "DEST")]
        dest: PathBuf,
    },
    /// Delete DIR like rm -rf, never following symlinks
    #[command(override_usage = "actionfs rmtree [-v] DIR")]
    Rmtree {
        /// Print what was removed and how long it took
        #[arg(short = 'v', long = "verbose")]
        verbose: bool,
        /// The tree to delete
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Time whole actions in FUSE and native sandboxes and recommend
    /// --native_below
    #[command(
        override_usage = "actionfs calibrate [OPTIONS]",
        long_about = "Times whole actions (create a sandbox, stat every input, read 10% or \
all of them, write an output, destroy) in FUSE and native sandboxes from 10 to 20,000 inputs \
under --dir, prints the curve and the recommended --native_below, and with --write saves it \
for --native_below=auto. Shows its progress on stderr when that is a terminal."
    )]
    Calibrate {
        /// 10 to 5,000 inputs and fewer runs
        #[arg(long)]
        quick: bool,
        /// Measure only these input counts (comma-separated, e.g.
        /// 10,100,1000) instead of the default series
        #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = parse_positive)]
        sizes: Vec<usize>,
        /// Where sandboxes would live, e.g. Bazel's output base (default:
        /// the temporary directory)
        #[arg(long, value_name = "PATH")]
        dir: Option<PathBuf>,
        /// The native method measured
        #[arg(long, value_name = "METHOD", default_value = "symlink", value_parser = parse_method)]
        method: Method,
        /// Stashes the native daemon keeps: the measured actions repeat
        /// their inputs, as a build's do, so the default 8 measures reuse
        /// and 0 measures every sandbox built afresh
        #[arg(long = "native_stashes", value_name = "N", default_value_t = 8)]
        native_stashes: usize,
        /// Save the result where --native_below=auto finds it
        #[arg(long, value_name = "PATH")]
        write: Option<PathBuf>,
    },
    /// Drive a running daemon through its control socket (--control)
    #[command(override_usage = "actionfs ctl --control=PATH [--json] VERB [ARGS]")]
    Ctl {
        /// The daemon's control socket (required; before or after VERB)
        // Global, so it may follow the verb; clap cannot require a global
        // flag, so `subcommand` does.
        #[arg(long, value_name = "PATH", global = true)]
        control: Option<PathBuf>,
        /// Print the daemon's JSON answer as it is
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        verb: CtlVerb,
    },
    /// Re-drive a request stream recorded with --record (or one of Bazel's
    /// raw streams) against a fresh daemon and print latency percentiles
    #[command(
        override_usage = "actionfs replay [OPTIONS] FILE MOUNTPOINT [-- DAEMON FLAGS]",
        long_about = "Re-drives a request stream recorded with --record (or one of Bazel's \
raw streams) against a fresh daemon and prints latency percentiles. Shows its progress on \
stderr when that is a terminal."
    )]
    Replay {
        /// Send as fast as the daemon answers (at most --window requests
        /// in flight) instead of at the recorded times
        #[arg(long)]
        flood: bool,
        /// Requests in flight at most when flooding or for a raw stream
        #[arg(long, value_name = "N", default_value = "8", value_parser = parse_positive)]
        window: usize,
        /// Point the placeholder roots of the traces in shared/traces
        /// (/BAZEL_OUTPUT_BASE, /BAZEL_WORKSPACE) into DIR and create every
        /// underlying path the stream names
        #[arg(long, value_name = "DIR")]
        populate: Option<PathBuf>,
        /// The recording or raw request stream
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Where the fresh daemon mounts
        #[arg(value_name = "MOUNTPOINT")]
        mount_point: PathBuf,
        /// Flags for the daemon (after --)
        #[arg(last = true, value_name = "DAEMON FLAGS")]
        daemon_flags: Vec<String>,
    },
    /// Replay the actions of a Bazel execution log through a sandbox
    /// backend and baselines, check each output's digest, and time them
    #[command(
        override_usage = "actionfs replay-actions --execlog FILE --exec-root DIR [OPTIONS]",
        long_about = "Replays the actions of a Bazel execution log (--execution_log_json_file) \
in each mode: serve (through `actionfs serve`, as Bazel's sandbox backend runner does), \
unsandboxed (Bazel's local strategy, in a fresh exec root), symlinks (Bazel 6's classic \
sandbox: a fresh symlink forest per action, deleted in the action's path), and Bazel 7-9's own \
sandbox with its defaults: reuse (sandbox directories reused from a stash per mnemonic, \
outputs renamed into the exec root, the rest deleted in the background; the sandbox base \
beside the mode's exec root, as <output_base>/sandbox is), reuse-shm (the same with the base \
on /dev/shm, --sandbox_base=/dev/shm) and reuse-inmemory \
(--experimental_inmemory_sandbox_stashes). Checks every output against the log's digest and prints each mode's wall \
time. Exits 1 unless every action succeeded and every output matched in every mode. Shows \
its progress on stderr when that is a terminal."
    )]
    ReplayActions {
        /// The JSON execution log of a local build (Bazel's
        /// --execution_log_json_file)
        #[arg(long, value_name = "FILE")]
        execlog: PathBuf,
        /// The exec root of the build that wrote the log (bazel info
        /// execution_root), which holds every input
        #[arg(long = "exec-root", value_name = "DIR")]
        exec_root: PathBuf,
        /// Actions at once (default: CPUs)
        #[arg(long, value_name = "N", value_parser = parse_positive)]
        jobs: Option<usize>,
        /// Modes to replay in, alternating: serve, unsandboxed, symlinks
        /// (Bazel 6's sandbox), reuse, reuse-shm, reuse-inmemory (Bazel
        /// 7-9's, its base beside the exec root, on /dev/shm, or beside it
        /// with stashes in memory)
        #[arg(
            long,
            value_name = "MODE,...",
            value_delimiter = ',',
            default_value = "serve,unsandboxed,symlinks",
            value_parser = parse_replay_mode
        )]
        modes: Vec<crate::tools::replay_actions::Mode>,
        /// Replays of the whole log per mode, for the timings
        #[arg(long, value_name = "K", default_value = "1", value_parser = parse_positive)]
        runs: usize,
        /// An option for the backend, sent in Negotiate (repeatable), e.g.
        /// --backend-opt=--native_below=0
        #[arg(long = "backend-opt", value_name = "OPT", allow_hyphen_values = true)]
        backend_opts: Vec<String>,
        /// The backend binary, run as `BIN serve --workspace DIR` (default:
        /// this actionfs)
        #[arg(long, value_name = "BIN")]
        backend: Option<PathBuf>,
        /// In mode serve, what is pushed as content: as Bazel 7 does
        /// (bazel: param files inline, runfiles members by relative
        /// location, the rest none), nothing (default), every input's
        /// path (location) or bytes (inline)
        #[arg(
            long,
            value_name = "bazel|default|location|inline",
            default_value = "bazel",
            value_parser = parse_content
        )]
        content: crate::tools::replay_actions::ContentMode,
        /// In mode serve, what each run's backend starts with: nothing and
        /// leaves nothing (cold, --keep_state=off), the store the previous
        /// run's backend handed on (adopted, --keep_state=on), or a whole
        /// untimed pass of the log served first by the same backend (warm)
        #[arg(
            long = "backend-state",
            value_name = "cold|adopted|warm",
            default_value = "cold",
            value_parser = parse_backend_state
        )]
        backend_state: crate::tools::replay_actions::BackendState,
        /// Run serve's, symlinks' and the reuse modes' actions in a jail:
        /// Bazel's, as Bazel does (linux-sandbox, or linux-sandbox=PATH;
        /// the reuse modes with Bazel 9's command line), or actionfs's own
        /// (landlock) (default: none)
        #[arg(long, value_name = "linux-sandbox[=PATH]|landlock", value_parser = parse_jail)]
        jail: Option<crate::tools::replay_actions::Jail>,
        /// Where each mode's exec root goes (missing or empty; default: a
        /// new directory in the temporary directory)
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Keep the output directory (each mode's last run)
        #[arg(long)]
        keep: bool,
    },
    /// Serve Bazel's sandbox backend protocol on stdin and stdout (Bazel 7
    /// and later with --sandbox_backend); options arrive in its Negotiate
    /// request, not on the command line
    // Its long help lists the Negotiate options: see `command`.
    Serve {
        /// The workspace Bazel builds (its exec root's name is the
        /// sandboxes' top directory)
        #[arg(long, value_name = "DIR")]
        workspace: PathBuf,
    },
    /// Check whether this machine can mount and serve fast sandboxes, and
    /// say what the daemon would choose here
    #[command(
        override_usage = "actionfs doctor [--json] [--sandbox-base DIR]",
        long_about = "Checks, one line each (ok, warn or fail, with the command that fixes \
it), what a mount needs on this machine, and says which transport, open mode and native \
cutoff the daemon would choose here and why. Exits 1 when the daemon cannot mount."
    )]
    Doctor {
        /// Print one JSON object instead of lines
        #[arg(long)]
        json: bool,
        /// Where sandboxes would live (Bazel's --sandbox_base; default: the
        /// temporary directory): its file system and whether it can clone
        #[arg(long = "sandbox-base", alias = "sandbox_base", value_name = "DIR")]
        sandbox_base: Option<PathBuf>,
    },
    /// Print the manual page, generated from this command line
    #[command(override_usage = "actionfs man [--dir DIR]")]
    Man {
        /// Write actionfs.1 and a page per subcommand (actionfs-ctl.1, ...)
        /// into DIR instead of printing actionfs.1
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Print shell completions (bash, zsh, fish, elvish or powershell)
    #[command(override_usage = "actionfs completions SHELL")]
    Completions {
        /// The shell to complete for
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum CtlVerb {
    /// Create sandbox ID from --map flags and/or a --spec file
    Create {
        /// The new sandbox's id
        #[arg(value_name = "ID")]
        id: String,
        /// ro:/PATH:/UNDERLYING or rw:/PATH:/UNDERLYING (repeatable)
        #[arg(long = "map", value_name = "TYPE:PATH:UNDERLYING", value_parser = parse_ctl_map)]
        maps: Vec<(bool, String, String)>,
        /// A CreateSandbox request as on the wire; its id is replaced by ID
        #[arg(long, value_name = "FILE")]
        spec: Option<PathBuf>,
    },
    /// Destroy sandbox ID
    Destroy {
        /// The sandbox's id
        #[arg(value_name = "ID")]
        id: String,
    },
    /// List the sandboxes
    List,
    /// Print the daemon's counters and figures
    Stats,
    /// For each declared input of sandbox ID: read, looked up only, or
    /// never touched (needs --access_log on the daemon)
    Accessed {
        /// The sandbox's id
        #[arg(value_name = "ID")]
        id: String,
    },
}

fn parse_ctl_map(text: &str) -> Result<(bool, String, String), String> {
    let mapping = parse_mapping(text)?;
    Ok((
        mapping.writable,
        mapping.path,
        mapping.underlying.to_string_lossy().into_owned(),
    ))
}

/// The command line as documented: what `--help`, `actionfs man` and the
/// completions show. The daemon's MOUNTPOINT is parsed as a list, so that
/// a missing or second one gets our own words, but it is one required
/// argument, and shown so.
pub fn command() -> clap::Command {
    let mut command = Cli::command()
        .mut_arg("mount_point", |arg| {
            arg.required(true).action(ArgAction::Set).num_args(1)
        })
        .mut_subcommand("serve", |serve| serve.long_about(serve_long_about()));
    command.build();
    command
}

/// `actionfs serve`'s long help, naming the options its own grammar
/// takes in Negotiate ([`crate::serve::options`]).
fn serve_long_about() -> String {
    format!(
        "Serves Bazel's sandbox backend protocol: length-delimited protobuf requests on stdin, \
answers on stdout. Bazel starts it as `BINARY serve --workspace WS`; its \
--sandbox_backend_opt values arrive in the first request (Negotiate), not on the command \
line: {} (`actionfs man`, SUBCOMMANDS). Everything it makes is below \
SANDBOX_BASE/actionfs-serve-PID, which it holds locked while it lives. Closing stdin unmounts, \
removes every sandbox and the store, and exits 0. SIGTERM, SIGINT, SIGHUP or SIGQUIT does the \
same at once (a busy mount is detached, requests in flight get no answer) and the process then \
dies by that signal. After SIGKILL a watcher process detaches the mount; the next serve on the \
base removes what dead backends left there (never a live one's, whose lock is held) and says so \
in one line on stderr.",
        crate::serve::options::synopsis().join(", ")
    )
}

fn parse_mechanism(text: &str) -> Result<crate::stage::Mechanism, String> {
    crate::stage::Mechanism::parse(text)
        .ok_or_else(|| "takes hardlink, clone, copy or auto".to_owned())
}

fn parse_replay_mode(text: &str) -> Result<crate::tools::replay_actions::Mode, String> {
    crate::tools::replay_actions::Mode::parse(text).ok_or_else(|| {
        "takes serve, unsandboxed, symlinks, reuse, reuse-shm or reuse-inmemory".to_owned()
    })
}

fn parse_content(text: &str) -> Result<crate::tools::replay_actions::ContentMode, String> {
    crate::tools::replay_actions::ContentMode::parse(text)
        .ok_or_else(|| "takes bazel, default, location or inline".to_owned())
}

fn parse_backend_state(text: &str) -> Result<crate::tools::replay_actions::BackendState, String> {
    crate::tools::replay_actions::BackendState::parse(text)
        .ok_or_else(|| "takes cold, adopted or warm".to_owned())
}

fn parse_jail(text: &str) -> Result<crate::tools::replay_actions::Jail, String> {
    crate::tools::replay_actions::Jail::parse(text)
}

/// `ro:/path/in/mount:/underlying` or `rw:...`.
fn parse_mapping(text: &str) -> Result<ResolvedMapping, String> {
    let mut parts = text.splitn(3, ':');
    let (Some(kind), Some(path), Some(target)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("is not TYPE:PATH:TARGET".to_owned());
    };
    let writable = match kind {
        "ro" => false,
        "rw" => true,
        _ => return Err(format!("TYPE must be ro or rw, not {kind:?}")),
    };
    PrefixTable::new()
        .resolve(&Mapping {
            path: path.to_owned(),
            underlying_path: target.to_owned(),
            writable,
            ..Mapping::default()
        })
        .map_err(|err| err.to_string())
}
