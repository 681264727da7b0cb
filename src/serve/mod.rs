//! `actionfs serve --workspace WS`: the front end for Bazel's sandbox
//! backend protocol (Bazel 7 and later, `--sandbox_backend`).
//!
//! Bazel sends each action's inputs as a content-addressed REAPI tree:
//! directory blobs and content arrive in Pushes and go to the store
//! ([`crate::sandbox::store`]); a Create names a root digest, which
//! the core's [`crate::sandbox::merkle`] walks into a layout for the same core the sandboxfs stream
//! uses (FUSE view or native tree, by the measured cutoff). A digest's
//! bytes never change, so the mount runs with zero-message opens: the
//! kernel opens and caches inputs with no message per open.
//!
//! Read in this order: this file (start, Negotiate, stop), [`options`]
//! (what Negotiate may say), [`base`] (the directory everything is made
//! in, and dead predecessors' leftovers), [`session`] (the request loop), [`service`]
//! (what each request does), [`kept`] (what a Create keeps of a tree for
//! the next), [`outputs`] (declared outputs and Collect).

mod base;
mod capture;
pub mod confine;
mod departures;
mod error;
mod handing_on;
mod jail;
mod kept;
mod looks_handed;
pub mod options;
mod outputs;
mod service;
mod session;
mod slots;
mod state_dir;
mod taken_again;
mod trees_handed;

use std::io::{self, BufReader};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actionfs_protocol::backend::frame::{read_frame, MAX_FRAME};
use actionfs_protocol::backend::sandbox::{negotiate, request::Op, response, Request, Version};
use parking_lot::Mutex;

use crate::daemon::config::DaemonConfig;
use crate::daemon::{self, FrontEnd, OnSignal, Owner, Stopped};
use crate::fuse::options::{Allow, ZeroMessageOpens};
use crate::sandbox::hybrid::cutoff::{self, NativeBelow};
use crate::sandbox::hybrid::Sandboxes;
use crate::sandbox::materialize::Trash;
use crate::sandbox::store::ContentStore;
use base::Base;
use confine::Jail;
pub use error::StartError;
use options::BackendOptions;
use service::{Dirs, Service};
use session::{Answers, Halt};
use state_dir::Claimed;

/// `actionfs serve`'s command line; everything else comes in Negotiate.
#[derive(Debug)]
pub struct ServeArgs {
    pub workspace: PathBuf,
}

/// How `actionfs serve` ended.
pub enum Served {
    /// The client closed the stream: everything was removed (the store's
    /// content handed on, with --keep_state=on), exit 0.
    Closed,
    /// A stop signal: everything was removed; exit by it.
    Signal(i32),
}

/// How long a stop signal waits for the requests being applied before
/// everything is removed under them: a Create of many inputs takes a
/// second or so; one stuck (on a file that never answers) is not waited
/// for.
const HALT_WAIT: Duration = Duration::from_secs(5);

/// Standard output as a plain file, so that an answer is one write(2):
/// Rust's `Stdout` is line-buffered and split every frame at its last
/// 0x0A byte (frequent in protobuf), waking the client twice per answer.
fn unbuffered_stdout() -> Box<dyn io::Write + Send> {
    use std::os::fd::AsFd;
    match io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => Box::new(std::fs::File::from(fd)),
        Err(err) => {
            log::warn!("cannot duplicate stdout ({err}); answers go through its line buffer");
            Box::new(io::stdout())
        }
    }
}

/// Serves one client on stdin and stdout until it closes the stream. An
/// error (a frame that cannot be read, options refused, a mount that
/// cannot be made) has been logged in one line; exit 1.
pub fn run(args: &ServeArgs) -> Result<Served, StartError> {
    let mut input = BufReader::with_capacity(1 << 20, io::stdin());
    let answers = Arc::new(Answers::new(unbuffered_stdout()));
    let first: Request = match read_frame(&mut input, MAX_FRAME) {
        Ok(Some(request)) => request,
        Ok(None) => return Ok(Served::Closed),
        Err(source) => return Err(StartError::UnreadableFrame { frame: 1, source }),
    };
    let rid = first.rid;
    let Some(Op::Negotiate(negotiate)) = first.op else {
        return Err(StartError::NotNegotiate { rid });
    };
    let negotiation = Negotiation { answers, rid };
    let refuse = |why: StartError| Err(negotiation.refuse(why));
    if !negotiate.versions.is_empty() && !negotiate.versions.contains(&(Version::Version1 as i32)) {
        return refuse(StartError::NoVersionInCommon(negotiate.versions));
    }
    let mut options = match options::parse(&negotiate.options) {
        Ok(options) => options,
        Err(why) => return refuse(StartError::Options(why)),
    };
    let parent = options
        .sandbox_base
        .clone()
        .unwrap_or_else(default_sandbox_base);
    let base = match Base::make(&parent) {
        Ok((base, swept)) => {
            // One line, not a log record: Bazel keeps only the last 8 KiB.
            if !swept.is_empty() {
                eprintln!("actionfs serve: {swept}");
            }
            base
        }
        Err(why) => return refuse(why),
    };
    let jail = Jail::choose(options.jail);
    keep_inputs_read_only(&mut options, base.path(), &jail);
    let warm = options.keep_state.then(|| warm_state_dir(&parent));
    let claimed = match options.keep_state.then(|| Claimed::claim(&parent)) {
        None => None,
        Some(Ok(Some(claimed))) => {
            log::info!("keeping state in {:?}", claimed.path());
            Some(claimed)
        }
        Some(Ok(None)) => {
            eprintln!(
                "actionfs serve: another backend keeps its state on {parent:?}: this one keeps \
                 its store in its own directory and hands on only content"
            );
            None
        }
        Some(Err(why)) => {
            eprintln!(
                "actionfs serve: cannot keep state on {parent:?} ({why}); handing on only content"
            );
            None
        }
    };
    let served = serve_in(
        base.path(),
        Keeping {
            warm: warm.as_deref(),
            claimed: claimed.as_ref(),
        },
        &options,
        jail,
        args,
        input,
        negotiation.clone(),
    );
    if let Err(why) = base.remove() {
        log::error!("cannot remove what this backend made: {why}");
    }
    if let Some(claimed) = claimed {
        claimed.release();
    }
    served
}

/// The Negotiate request, answered exactly once: refused here if the
/// start fails before the daemon runs, else accepted once the mount
/// serves, or refused with the daemon's error.
#[derive(Clone)]
struct Negotiation {
    answers: Arc<Answers>,
    rid: u64,
}

impl Negotiation {
    /// Answers Error; returns `why` for the caller's own error.
    fn refuse(&self, why: StartError) -> StartError {
        self.answers.send(self.rid, negotiated(Err(&why)));
        why
    }

    fn accept(&self) {
        self.answers.send(self.rid, negotiated(Ok(())));
    }
}

/// What this backend keeps for the next one: the store's content
/// (`warm`) and, in a claimed state directory, the rest.
#[derive(Clone, Copy)]
struct Keeping<'a> {
    warm: Option<&'a Path>,
    claimed: Option<&'a Claimed>,
}

/// Mounts below `base`, answers Negotiate once the mount serves, and
/// serves until the stream ends.
fn serve_in(
    base: &Path,
    keeping: Keeping<'_>,
    options: &BackendOptions,
    jail: Jail,
    args: &ServeArgs,
    input: BufReader<io::Stdin>,
    negotiation: Negotiation,
) -> Result<Served, StartError> {
    let dirs = make_dirs(base).map_err(|why| negotiation.refuse(why))?;
    // In the claimed state directory, its files keep their paths from one
    // backend to the next, as the stashes handed on there need.
    let store_dir = keeping
        .claimed
        .map_or_else(|| base.join("store"), Claimed::store);
    let state = handing_on::StateFiles::of(keeping.claimed);
    let store = Arc::new(
        open_store(&store_dir, keeping.warm, options, base)
            .map_err(|why| negotiation.refuse(why))?,
    );
    let handing_store_on = keeping.warm.map(|warm| (store.clone(), warm));
    // Beside the scratch directories, so that a rename takes one there.
    let trash = Trash::open(&base.join("trash"), 1)
        .map_err(|err| negotiation.refuse(StartError::Remove(err)))?;
    log::info!(
        "serving the sandbox backend protocol for {:?} below {base:?}, jail {}",
        args.workspace,
        jail.name()
    );
    let halt = Arc::new(Halt::default());
    let requests = RequestLoop {
        workers: options
            .reconfig_threads
            .unwrap_or_else(|| 4 * std::thread::available_parallelism().map_or(2, |n| n.get())),
        // Bazel's Manifest.exec_root: the exec root's parent.
        locations_root: args
            .workspace
            .parent()
            .unwrap_or(&args.workspace)
            .to_owned(),
        workspace: args.workspace.clone(),
        own: base.to_owned(),
        choices: service::Choices {
            capture_below: options.capture_below,
            slots: options.slots,
        },
        jail,
        dirs,
        store,
        trash,
        state,
        input,
        negotiation: negotiation.clone(),
        halt: halt.clone(),
        fatal: Arc::default(),
        served: Arc::default(),
        serving: Arc::default(),
    };
    let (fatal, served) = (requests.fatal.clone(), requests.served.clone());
    let on_signal = on_stop_signal(halt, requests.serving.clone());
    let stopped = daemon::run_with(
        daemon_config(options, base),
        FrontEnd::Owning(Owner {
            serve: Box::new(move |sandboxes| requests.run(sandboxes)),
            on_signal,
        }),
    );
    // A signal wins over what the request loop says after being halted.
    if let Ok(Stopped::BySignal(signal)) = stopped {
        return Ok(Served::Signal(signal));
    }
    if let Some(why) = fatal.lock().take() {
        return Err(why);
    }
    match stopped {
        Ok(Stopped::FrontEndDone | Stopped::Unmounted) => {
            // Bazel closed stdin, its sandboxes are gone: what the store
            // kept goes to the next backend (a signal or an error hands
            // nothing on).
            if let Some((store, warm)) = handing_store_on {
                hand_store_on(&store, warm);
            }
            Ok(Served::Closed)
        }
        Ok(Stopped::BySignal(signal)) => Ok(Served::Signal(signal)),
        Err(err) => {
            // Negotiate is answered once the mount serves; a start that
            // failed before that answers it now.
            let err = StartError::Daemon(err);
            Err(match served.load(Ordering::SeqCst) {
                true => err,
                false => negotiation.refuse(err),
            })
        }
    }
}

/// What a stop signal does: halts the request loop, then, if nothing is
/// left running, destroys every sandbox while the mount still serves
/// (so that the kernel hears of each), waiting for their scratch
/// directories' deletion.
fn on_stop_signal(halt: Arc<Halt>, serving: Arc<Mutex<Option<Arc<Service>>>>) -> OnSignal {
    Box::new(move |signal| {
        let running = halt.halt(HALT_WAIT);
        if running > 0 {
            log::warn!(
                "signal {signal}: {running} requests still running after {HALT_WAIT:?}; removing \
                 everything under them"
            );
            return;
        }
        if let Some(service) = serving.lock().take() {
            service.destroy_all();
        }
    })
}

/// Hands the store's content on to the next backend in `warm`.
fn hand_store_on(store: &ContentStore, warm: &Path) {
    match store.hand_on(warm) {
        Ok(handed) => log::info!(
            "handed {} inputs ({:.1} MiB) on to the next backend in {warm:?}",
            handed.entries,
            handed.bytes as f64 / (1 << 20) as f64
        ),
        Err(err) => log::warn!("cannot hand the store on: {err}"),
    }
}

/// The backend's directories below `base`: the mount point, the scratch
/// directories' parent, symlink targets and the empty directory.
fn make_dirs(base: &Path) -> Result<Dirs, StartError> {
    let dirs = Dirs {
        mount: base.join("mnt"),
        scratch: base.join("scratch"),
        links: base.join("links"),
        empty: base.join("empty"),
    };
    for dir in [&dirs.mount, &dirs.scratch, &dirs.links, &dirs.empty] {
        std::fs::DirBuilder::new()
            .mode(if dir == &dirs.empty { 0o555 } else { 0o755 })
            .create(dir)
            .map_err(|err| StartError::io("mkdir", dir, err))?;
    }
    Ok(dirs)
}

/// Everything the request loop needs, moved into the daemon's front end
/// and run once the mount serves.
struct RequestLoop {
    workers: usize,
    locations_root: PathBuf,
    workspace: PathBuf,
    /// This backend's directory.
    own: PathBuf,
    choices: service::Choices,
    jail: Jail,
    dirs: Dirs,
    store: Arc<ContentStore>,
    trash: Trash,
    state: handing_on::StateFiles,
    input: BufReader<io::Stdin>,
    negotiation: Negotiation,
    halt: Arc<Halt>,
    /// The request loop's error, for the caller.
    fatal: Arc<Mutex<Option<StartError>>>,
    /// Whether Negotiate was answered.
    served: Arc<AtomicBool>,
    /// For a stop signal, which comes while the request loop has it.
    serving: Arc<Mutex<Option<Arc<Service>>>>,
}

impl RequestLoop {
    fn run(self, sandboxes: Arc<Sandboxes>) {
        let mount = self.dirs.mount.clone();
        let service = Arc::new(Service::new(
            sandboxes,
            self.store,
            self.dirs,
            self.trash,
            self.locations_root,
            self.jail,
            self.choices,
        ));
        let adopting = self.state.adopt(&service, &self.workspace);
        *self.serving.lock() = Some(service.clone());
        let (served, negotiation) = (&self.served, &self.negotiation);
        // One more than apply at once: the one that reads meanwhile.
        let ended = session::serve(
            self.input,
            service.clone(),
            negotiation.answers.clone(),
            self.workers + 1,
            self.halt.clone(),
            || {
                served.store(true, Ordering::SeqCst);
                negotiation.accept();
                log::info!("sandboxes appear in {mount:?}");
            },
        );
        adopting.stop();
        service.destroy_all();
        // Bazel closed stdin: what the state directory keeps goes to the
        // next backend (a signal or an error hands nothing on).
        if ended.is_ok() && !self.halt.is_halted() {
            self.state.hand_on(&service, &self.own, &self.workspace);
        }
        *self.fatal.lock() = ended.err();
    }
}

/// Native sandboxes link to the store, which must then be read-only in
/// the jail, metadata included: where the base is writable there (below
/// /tmp, which Bazel's jail and actionfs's both leave writable), with no
/// jail at all, or in actionfs's jail without namespaces (Landlock alone
/// lets `chmod` and `utime` through a link), every sandbox is served by
/// FUSE, which refuses changes to inputs itself.
fn keep_inputs_read_only(options: &mut BackendOptions, base: &Path, chosen: &Jail) {
    if options.native_below == NativeBelow::Off {
        return;
    }
    if matches!(chosen, Jail::None) {
        eprintln!(
            "actionfs serve: --jail=none, so every sandbox is served by FUSE (native ones would \
             let actions change captured inputs)"
        );
        options.native_below = NativeBelow::Off;
    } else if !chosen.keeps_inputs_metadata() {
        // Choose said why, once.
        options.native_below = NativeBelow::Off;
    } else if match chosen {
        Jail::Landlock { .. } => jail::writable_in_landlock_jail(base),
        _ => jail::writable_in_bazels_jail(base),
    } {
        eprintln!(
            "actionfs serve: {} is writable in {}'s jail, so every sandbox is served by FUSE \
             (native ones would let actions change captured inputs); choose another \
             --sandbox_base for native sandboxes",
            base.display(),
            if matches!(chosen, Jail::Landlock { .. }) {
                "actionfs"
            } else {
                "Bazel"
            }
        );
        options.native_below = NativeBelow::Off;
    }
}

fn negotiated(outcome: Result<(), &StartError>) -> response::Result {
    use negotiate::result::Outcome;
    response::Result::Negotiate(negotiate::Result {
        outcome: Some(match outcome {
            Ok(()) => Outcome::Ok(negotiate::result::Ok {
                version: Version::Version1 as i32,
            }),
            Err(why) => Outcome::Error(actionfs_protocol::backend::sandbox::Error {
                message: why.to_string(),
            }),
        }),
    })
}

/// Without `--sandbox_base`: /dev/shm where it is a tmpfs we may write,
/// else /var/tmp (unlike /tmp, read-only in Bazel's jail: see
/// [`keep_inputs_read_only`]), else the temporary directory: on tmpfs
/// sandboxes are built natively, and on a disk each scratch directory
/// made and removed is slow (docs/BENCHMARKS.md).
fn default_sandbox_base() -> PathBuf {
    let usable = |dir: &Path| {
        nix::unistd::access(
            dir,
            nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
        )
        .is_ok()
    };
    let shm = Path::new("/dev/shm");
    if usable(shm) && cutoff::on_tmpfs(shm) {
        return shm.to_owned();
    }
    let var_tmp = Path::new("/var/tmp");
    if usable(var_tmp) && !jail::writable_in_bazels_jail(var_tmp) {
        return var_tmp.to_owned();
    }
    std::env::temp_dir()
}

/// Where a backend hands its store's content on to the next one of the
/// same user on the same base (`--keep_state`): per user, since the
/// default base, /dev/shm, is shared and sticky (another user's hand-off
/// could be neither taken nor replaced).
pub fn warm_state_dir(base: &Path) -> PathBuf {
    base.join(format!("actionfs-warm-{}", nix::unistd::geteuid()))
}

/// The store, with what a predecessor handed on to `warm` if given; one
/// line on stderr says what was adopted, or why nothing could be.
fn open_store(
    dir: &Path,
    warm: Option<&Path>,
    options: &BackendOptions,
    base: &Path,
) -> Result<ContentStore, StartError> {
    let bound = store_bound(options, base);
    let Some(warm) = warm else {
        return Ok(ContentStore::open(dir, bound)?);
    };
    let (store, adopted) = ContentStore::open_adopting(dir, bound, warm)?;
    match adopted {
        Ok(None) => {}
        Ok(Some(adopted)) => {
            let dropped = match adopted.dropped {
                0 => String::new(),
                n => format!("; dropped {n} entries that failed a check"),
            };
            eprintln!(
                "actionfs serve: adopted {} inputs ({:.1} MiB) a previous backend kept in {}{dropped}",
                adopted.entries,
                adopted.bytes as f64 / (1 << 20) as f64,
                warm.display()
            );
        }
        Err(err) => eprintln!(
            "actionfs serve: cannot adopt what a previous backend kept, starting empty: {err}"
        ),
    }
    Ok(store)
}

/// `--store_max_bytes`, else 8 GiB, but at most a quarter of a tmpfs the
/// store would fill with memory.
fn store_bound(options: &BackendOptions, base: &Path) -> u64 {
    const DEFAULT: u64 = 8 << 30;
    if let Some(bound) = options.store_max_bytes {
        return bound;
    }
    if !cutoff::on_tmpfs(base) {
        return DEFAULT;
    }
    match nix::sys::statvfs::statvfs(base) {
        // The counts' types differ between platforms.
        #[allow(clippy::unnecessary_cast)]
        Ok(fs) => DEFAULT.min(fs.blocks() as u64 * fs.fragment_size() as u64 / 4),
        Err(_) => DEFAULT,
    }
}

fn daemon_config(options: &BackendOptions, base: &Path) -> DaemonConfig {
    DaemonConfig {
        allow: Allow::OwnerOnly,
        input: None,
        output: None,
        mappings: Vec::new(),
        ttl: options.ttl,
        xattrs: false,
        passthrough: options.passthrough,
        // Inputs are content-addressed: their bytes never change, so the
        // kernel may open and cache them without asking.
        zero_message_opens: ZeroMessageOpens::On,
        transport: options.transport,
        native_below: options.native_below.clone(),
        native_method: options.native_method,
        native_stashes: options.native_stashes,
        native_dir: Some(base.join("native")),
        calibration: options.calibration.clone(),
        reconfig_threads: 1,
        mount_point: base.join("mnt"),
        access_log: None,
        control: None,
        record: None,
    }
}
