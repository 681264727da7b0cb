//! The daemon's life: prepare the mount point, mount, serve requests and
//! kernel calls, and unmount on a signal or external unmount ([`stop`]).
//!
//! Three threads report to the main one: the FUSE session (ends when the
//! mount goes away), the signal watcher, and the request reader. The reader
//! ending (stdin EOF, or a fatal protocol error) does not stop the daemon:
//! the mount keeps serving until a signal or an unmount, as Bazel expects.

use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use fuser::{Config, MountOption, SessionACL};
use signal_hook::consts::SIGUSR1;
use signal_hook::iterator::Signals;

mod checks;
pub mod config;
pub mod control;
mod error;
pub mod flag_values;
pub mod mount;
pub mod reconfig;
pub mod record;
pub mod stop;
mod unmount_guard;

pub use error::DaemonError;
use stop::Event;
pub use stop::Stopped;

use crate::daemon::config::DaemonConfig;
use crate::daemon::control::{Control, ControlSocket};
use crate::daemon::record::Recording;
use crate::fuse::options::Allow;
use crate::fuse::transport::{self, RingOffer, Transport};
use crate::fuse::{Dispatcher, FuseShell, NotifierInvalidator};
use crate::sandbox::access_log::AccessLog;
use crate::sandbox::hybrid::cutoff;
use crate::sandbox::hybrid::{NativeSandboxes, Sandboxes};
use crate::sandbox::tree::{FsConfig, SandboxFs};
use crate::stats::Stats;
use reconfig::ResponseSink;

/// Who asks the daemon for sandboxes.
pub enum FrontEnd {
    /// The sandboxfs 0.2 stream on stdin (or `--input`), answered on
    /// stdout (or `--output`); its end leaves the mount up.
    SandboxfsStream,
    /// A front end of the caller's that owns the daemon's life
    /// (`actionfs serve`): see [`Owner`].
    Owning(Owner),
}

/// A front end that owns the daemon's life. Its client (Bazel) does not
/// manage the mount: it sends one stop signal at most and has failed what
/// was in flight by then, or it kills the process. So a stop signal
/// unmounts at once (a busy mount is detached, not waited for), and a
/// watcher process detaches the mount if the process dies without
/// unmounting it.
pub struct Owner {
    /// Run on its own thread once the mount serves; its return unmounts
    /// the file system and stops the daemon ([`Stopped::FrontEndDone`]).
    pub serve: Box<dyn FnOnce(Arc<Sandboxes>) + Send>,
    /// Called on the main thread at a stop signal, before the unmount:
    /// ends what the front end is doing, in bounded time.
    pub on_signal: OnSignal,
}

/// A front end with what it reads and writes opened.
/// An owning front end's hook, run on a stop signal with its number.
pub type OnSignal = Box<dyn FnOnce(i32) + Send>;

enum Requests {
    Stream {
        input: Box<dyn Read + Send>,
        output: Box<dyn Write + Send>,
    },
    Owning(Owner),
}

/// Runs the daemon until it is told to stop, and says how it stopped. An
/// error means exit status 1.
pub fn run(options: DaemonConfig) -> Result<Stopped, DaemonError> {
    run_with(options, FrontEnd::SandboxfsStream)
}

/// [`run`], with sandboxes asked for by `front_end`.
pub fn run_with(options: DaemonConfig, front_end: FrontEnd) -> Result<Stopped, DaemonError> {
    // The umask stays the user's: what the daemon makes itself follows it.
    // Requests' creates, whose modes the kernel has masked already, are
    // made by threads with a umask of their own (`sys::as_caller`).
    raise_fd_limit();
    one_malloc_arena();
    crate::sys::no_huge_pages();
    let mut signals =
        Signals::new(stop::STOP_SIGNALS.iter().chain([&SIGUSR1])).map_err(DaemonError::Signals)?;
    let started = start(&options, Some(front_end))?;
    {
        let events = started.sender.clone();
        let report = started.report.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    if signal == SIGUSR1 {
                        log::warn!("stats (SIGUSR1): {}", report());
                        continue;
                    }
                    if events.send(Event::Signal(signal)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|source| DaemonError::Thread {
                name: "signal watcher",
                source,
            })?;
    }
    started.wait()
}

/// A mount served by this process for a library's caller (see
/// [`crate::stage`]): no signal handlers, no request reader, nothing
/// process-wide changed. Dropping it unmounts (detaching a busy mount).
pub struct Embedded {
    sandboxes: Arc<Sandboxes>,
    /// Behind a lock only to be shared: nothing uses it before the drop.
    started: parking_lot::Mutex<Option<Started>>,
}

impl Embedded {
    /// Mounts at `options.mount_point`; the caller makes its sandboxes.
    pub fn start(options: &DaemonConfig) -> Result<Embedded, DaemonError> {
        let started = start(options, None)?;
        Ok(Embedded {
            sandboxes: started.sandboxes.clone(),
            started: parking_lot::Mutex::new(Some(started)),
        })
    }

    pub fn sandboxes(&self) -> &Arc<Sandboxes> {
        &self.sandboxes
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Some(started) = self.started.get_mut().take() {
            started.unmount_now();
        }
    }
}

/// A mount that serves, and what stops it.
struct Started {
    sandboxes: Arc<Sandboxes>,
    events: Receiver<Event>,
    /// For the threads that report to `events` (dropped when waiting, so
    /// that their ending is seen).
    sender: Sender<Event>,
    mounted: stop::Mounted,
    mount_point: std::path::PathBuf,
    native: Option<Arc<NativeSandboxes>>,
    report: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// Serves until dropped, then removes its socket.
    control_socket: Option<ControlSocket>,
    /// For a mount this process serves for others (embedded, or owned by
    /// a front end): detaches it if the process dies first. Released once
    /// it is unmounted.
    guard: Option<unmount_guard::UnmountGuard>,
    /// An owning front end's hook, for a stop signal.
    on_signal: Option<OnSignal>,
}

impl Started {
    /// Waits for a reason to stop (a signal, an unmount, the front end's
    /// end) and unmounts.
    fn wait(self) -> Result<Stopped, DaemonError> {
        drop(self.sender);
        let outcome = stop::wait_and_unmount(
            &self.events,
            self.mounted,
            &self.mount_point,
            self.on_signal,
        );
        drop(self.guard);
        drop(self.control_socket);
        log::info!("stats at exit: {}", (self.report)());
        Self::destroy_native(self.native);
        outcome
    }

    /// Unmounts now, detaching the mount if it is busy.
    fn unmount_now(self) {
        drop(self.sender);
        stop::unmount_or_detach(&self.events, self.mounted, &self.mount_point);
        drop(self.guard);
        Self::destroy_native(self.native);
    }

    /// Native sandboxes outlive the mount unless removed: an undestroyed
    /// FUSE sandbox vanishes with the unmount, and so must they.
    fn destroy_native(native: Option<Arc<NativeSandboxes>>) {
        if let Some(native) = native {
            native.destroy_all();
        }
    }
}

/// Mounts and starts every thread but the signal watcher; `front_end`
/// `None` leaves making sandboxes to the caller.
fn start(options: &DaemonConfig, front_end: Option<FrontEnd>) -> Result<Started, DaemonError> {
    // Every argument is checked before anything is changed, mappings and
    // stream paths first: the first mistake is the one reported.
    let fs = Arc::new(
        SandboxFs::new(
            FsConfig {
                mount_point: checks::absolute_mount_point(&options.mount_point),
                xattrs: options.xattrs,
                track_access: options.access_log.is_some(),
            },
            &options.mappings,
        )
        .map_err(DaemonError::Mapping)?,
    );
    // The stream's input is opened with the arguments' checks, its
    // output once the start can no longer fail for a bad argument.
    let input = match &front_end {
        Some(FrontEnd::SandboxfsStream) => Some(open_input(options)?),
        _ => None,
    };
    checks::paths_to_make(options)?;
    let (policy, policy_source) =
        cutoff::resolve(&options.native_below, options.calibration.as_deref())
            .map_err(DaemonError::Calibration)?;
    if !mount::allow_permitted(options.allow) {
        return Err(DaemonError::AllowOtherRefused);
    }
    let (transport, why) = transport::choose(options.transport)
        .map_err(|err| DaemonError::Transport(err.to_string()))?;
    let checked = checks::mount_point(&options.mount_point)?;
    let mount_point = checked.path;

    // From here on, what is made is removed again if the start fails.
    let mut created = checks::Created::default();
    if checked.stale {
        mount::clear_stale(&options.mount_point).map_err(|source| DaemonError::MountPoint {
            path: options.mount_point.clone(),
            source,
        })?;
    }
    let requests = match (front_end, input) {
        (None, _) => None,
        (Some(FrontEnd::Owning(serve)), _) => Some(Requests::Owning(serve)),
        (Some(FrontEnd::SandboxfsStream), input) => Some(Requests::Stream {
            input: input.expect("opened above for the stream"),
            output: open_output(options, &mut created)?,
        }),
    };
    let native = open_native(options, &mount_point, policy, &policy_source, &mut created)?;
    let access_log = match &options.access_log {
        Some(path) => Some(
            created
                .make(path, || AccessLog::open(path))
                .map_err(|source| DaemonError::AccessLog {
                    path: path.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    // Bound before mounting, so that a socket in use fails the start
    // with nothing mounted. It removes itself when dropped.
    let mut control_socket = match &options.control {
        Some(path) => Some(ControlSocket::bind(path).map_err(DaemonError::Control)?),
        None => None,
    };
    let recording =
        match &options.record {
            Some(path) => Some(created.make(path, || Recording::create(path)).map_err(
                |source| DaemonError::Record {
                    path: path.clone(),
                    source,
                },
            )?),
            None => None,
        };
    let stats = Arc::new(Stats::default());

    let dispatch = Arc::new(Dispatcher::new(
        fs.clone(),
        stats.clone(),
        kernel_ttl(options),
        options.passthrough,
        options.zero_message_opens,
    ));
    let ring = Arc::new(RingOffer::new(transport == Transport::IoUring));
    let session = fuser::Session::new(
        FuseShell::new(dispatch.clone(), ring.clone()),
        &mount_point,
        &session_config(options.allow, transport),
    )
    .map_err(|source| DaemonError::Mount {
        path: mount_point.clone(),
        source,
    })?;
    let mounted = stop::Mounted::new(&mount_point);
    hand_out_device(&session, &dispatch, &fs);
    log::info!("mounted at {mount_point:?}");
    // On error the session is dropped, which unmounts.
    let transport = start_transport(&session, &ring, &dispatch, options, &why)?;
    // Only a start that serves keeps what it made: queues that cannot
    // start end it as one refused.
    created.keep();

    let (events, event) = channel();
    serve_session(session, events.clone())?;
    let report: Arc<dyn Fn() -> serde_json::Value + Send + Sync> = {
        let (fs, stats) = (fs.clone(), stats.clone());
        Arc::new(move || stats.to_json(live_figures(&fs, transport)))
    };
    let sandboxes = Arc::new(Sandboxes::new(
        fs.clone(),
        native.clone(),
        stats.clone(),
        access_log,
    ));
    if let Some(socket) = &mut control_socket {
        let control = Arc::new(Control {
            sandboxes: sandboxes.clone(),
            live_figures: Box::new(move || live_figures(&fs, transport)),
        });
        socket
            .serve(control)
            .map_err(|source| DaemonError::Thread {
                name: "control socket",
                source,
            })?;
        log::info!("control socket at {:?}", options.control);
    }
    // Before the front end serves, so that no sandbox exists unwatched.
    let guard = match &requests {
        None | Some(Requests::Owning(_)) => watch(&mount_point),
        Some(Requests::Stream { .. }) => None,
    };
    let on_signal = match requests {
        None => None,
        Some(requests) => serve_requests(
            requests,
            sandboxes.clone(),
            &events,
            recording,
            options.reconfig_threads,
            stats,
        )?,
    };
    Ok(Started {
        sandboxes,
        events: event,
        sender: events,
        mounted,
        mount_point,
        native,
        report,
        control_socket,
        guard,
        on_signal,
    })
}

/// Hands the `/dev/fuse` descriptor to what writes to it beside fuser:
/// the dispatcher (passthrough's backing ids) and the invalidator (each
/// its own duplicate). Without one, passthrough is off and a destroy
/// invalidates whole subtrees.
fn hand_out_device<FS: fuser::Filesystem>(
    session: &fuser::Session<FS>,
    dispatch: &Dispatcher,
    fs: &SandboxFs,
) {
    let duplicate = || std::os::fd::AsFd::as_fd(session).try_clone_to_owned();
    match duplicate() {
        Ok(device) => dispatch.set_device(device),
        Err(err) => dispatch.passthrough().disable(&format!(
            "cannot duplicate the /dev/fuse descriptor ({err})"
        )),
    }
    let device = duplicate()
        .inspect_err(|err| {
            log::warn!(
                "cannot duplicate the /dev/fuse descriptor ({err}); destroy will invalidate \
                 whole subtrees"
            )
        })
        .ok();
    fs.set_invalidator(Arc::new(NotifierInvalidator::new(
        session.notifier(),
        device,
    )));
}

/// Runs the classic session loop on its thread, and says on `events`
/// when it ends.
fn serve_session<FS: fuser::Filesystem + Send + 'static>(
    session: fuser::Session<FS>,
    events: Sender<Event>,
) -> Result<(), DaemonError> {
    // The session would unmount again when its mount handle is dropped
    // (after ours succeeded: "Failed to umount filesystem: Invalid
    // argument", or a newer mount at the same path gone). The daemon
    // unmounts by itself (`stop`), so that handle is never dropped.
    let background = ManuallyDrop::new(session.spawn().map_err(|source| DaemonError::Thread {
        name: "FUSE session",
        source,
    })?);
    // SAFETY: `background` is never dropped nor used again, so the join
    // handle read out of it has exactly one owner.
    let session_thread = unsafe { std::ptr::read(&background.guard) };
    std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            let ended = session_thread
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the FUSE session panicked")));
            let _ = events.send(Event::SessionEnded(ended));
        })
        .map(drop)
        .map_err(|source| DaemonError::Thread {
            name: "FUSE session watcher",
            source,
        })
}

/// Starts what makes sandboxes: an owning front end on its thread (its
/// stop-signal hook returned), or the sandboxfs stream's reader.
fn serve_requests(
    requests: Requests,
    sandboxes: Arc<Sandboxes>,
    events: &Sender<Event>,
    recording: Option<Recording>,
    threads: usize,
    stats: Arc<Stats>,
) -> Result<Option<OnSignal>, DaemonError> {
    match requests {
        Requests::Owning(Owner { serve, on_signal }) => {
            let events = events.clone();
            std::thread::Builder::new()
                .name("front end".into())
                .spawn(move || {
                    serve(sandboxes);
                    let _ = events.send(Event::FrontEndDone);
                })
                .map_err(|source| DaemonError::Thread {
                    name: "front end",
                    source,
                })?;
            Ok(Some(on_signal))
        }
        Requests::Stream { input, output } => {
            let sink = Arc::new(match recording {
                Some(recording) => ResponseSink::recorded(output, recording),
                None => ResponseSink::new(output),
            });
            let backend: Arc<dyn crate::sandbox::backend::Backend> = sandboxes;
            std::thread::Builder::new()
                .name("requests".into())
                .spawn(
                    move || match reconfig::serve(input, backend, sink, threads, stats) {
                        Ok(()) => stop::input_ended(),
                        Err(err) => log::error!(
                            "cannot start reconfiguration workers: {err}; no requests are read"
                        ),
                    },
                )
                .map_err(|source| DaemonError::Thread {
                    name: "request reader",
                    source,
                })?;
            Ok(None)
        }
    }
}

/// The watcher of `mount_point` ([`unmount_guard`]); without one, the
/// mount outlives a killed process, and that is said.
fn watch(mount_point: &Path) -> Option<unmount_guard::UnmountGuard> {
    unmount_guard::UnmountGuard::watch(mount_point)
        .inspect_err(|err| {
            log::warn!(
                "{mount_point:?} stays mounted if this process dies before unmounting it: no \
                 watcher ({err})"
            )
        })
        .ok()
}

/// Starts the io_uring queues if that transport was chosen and the kernel
/// granted it at INIT, and says in one log line which transport serves
/// the mount and why. Where `--transport=io_uring` forced the ring, not
/// getting it is an error; under auto the mount stays on `/dev/fuse`.
fn start_transport<FS: fuser::Filesystem>(
    session: &fuser::Session<FS>,
    ring: &RingOffer,
    dispatch: &Arc<Dispatcher>,
    options: &DaemonConfig,
    why: &str,
) -> Result<Transport, DaemonError> {
    let forced = options.transport == transport::Asked::IoUring;
    let fall_back = |failure: String| {
        if forced {
            return Err(DaemonError::Transport(format!(
                "--transport=io_uring, but {failure}"
            )));
        }
        log::warn!("transport: classic /dev/fuse ({failure})");
        Ok(Transport::Classic)
    };
    if !ring.wanted() {
        log::info!("transport: classic /dev/fuse ({why})");
        return Ok(Transport::Classic);
    }
    if !ring.granted() {
        return fall_back("the kernel did not grant FUSE-over-io_uring at INIT".to_owned());
    }
    #[cfg(target_os = "linux")]
    {
        use crate::fuse::uring;
        // Unpinned only to measure what pinning brings.
        let pin = std::env::var_os("ACTIONFS_URING_PIN").is_none_or(|v| v != "0");
        let acl = uring::Acl {
            allow: options.allow,
            owner: nix::unistd::geteuid().as_raw(),
        };
        let device = std::os::fd::AsFd::as_fd(session);
        match uring::start(device, dispatch.clone(), acl, pin) {
            Ok(queues) => {
                log::info!(
                    "transport: io_uring, {queues} queues, one per CPU{} ({why})",
                    if pin {
                        ", threads pinned"
                    } else {
                        ", threads not pinned"
                    }
                );
                Ok(Transport::IoUring)
            }
            Err(err) if err.classic_works => fall_back(format!(
                "the io_uring queues could not start: {}",
                err.error
            )),
            // The kernel holds requests for rings that will not come.
            Err(err) => Err(DaemonError::Transport(format!(
                "the io_uring queues could not start ({}), and the kernel would not go back \
                 to /dev/fuse",
                err.error
            ))),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (session, dispatch);
        fall_back("FUSE-over-io_uring is Linux only".to_owned())
    }
}

/// The figures `ctl stats` and SIGUSR1 show beside the counters.
fn live_figures(fs: &SandboxFs, transport: Transport) -> serde_json::Value {
    let mut live = crate::stats::process_figures();
    live["transport"] = transport.name().into();
    live["sandboxes"] = fs.sandbox_ids().len().into();
    live["inodes_known"] = fs.known_inodes().into();
    live["open_handles"] = fs.open_handles().into();
    let (kept, cap) = fs.inode_descriptors();
    live["inode_descriptors"] = kept.into();
    live["inode_descriptor_cap"] = cap.into();
    live["zero_message_opens"] = fs.zero_message_opens().into();
    live
}

/// Opens the native sandbox directory if hybrid mode is on.
fn open_native(
    options: &DaemonConfig,
    mount_point: &Path,
    policy: cutoff::Policy,
    source: &str,
    created: &mut checks::Created,
) -> Result<Option<Arc<NativeSandboxes>>, DaemonError> {
    let dir = match &options.native_dir {
        Some(dir) => dir.clone(),
        None => {
            let mut name = mount_point.as_os_str().to_owned();
            name.push(".native");
            std::path::PathBuf::from(name)
        }
    };
    let method = options.native_method;
    let native = NativeSandboxes::new(&dir, policy.clone(), method, options.native_stashes);
    match policy {
        cutoff::Policy::Below(0) => {
            if options.native_below != cutoff::NativeBelow::Off {
                log::info!("hybrid: every sandbox in FUSE (cutoff 0 from {source})");
            }
            return Ok(None);
        }
        cutoff::Policy::Below(below) => {
            created
                .make(&dir, || native.open_now())
                .map_err(DaemonError::NativeDir)?;
            log::info!(
                "hybrid: sandboxes of fewer than {below} mappings (from {source}) are built in \
                 {dir:?} by {}",
                method.name()
            );
        }
        cutoff::Policy::ByFileSystem => log::info!(
            "hybrid: sandboxes whose files would be made on tmpfs are built natively by {} \
             (in {dir:?} and their writable directories), the others in FUSE",
            method.name()
        ),
    }
    Ok(Some(Arc::new(native)))
}

/// How long the kernel may cache names and attributes. With
/// `--allow=root`, the kernel lets every user in (allow_other) and the
/// session refuses the others per request; a name or attribute the kernel
/// cached would be served to them without asking, so nothing is cached.
fn kernel_ttl(options: &DaemonConfig) -> std::time::Duration {
    if options.allow == Allow::RootAndOwner && !options.ttl.is_zero() {
        log::info!(
            "--allow=root: the kernel caches nothing (--ttl={:?} ignored), so that users the \
             mount refuses cannot see what root or the owner looked up",
            options.ttl
        );
        return std::time::Duration::ZERO;
    }
    options.ttl
}

/// Makes every thread allocate from one glibc arena. With an arena per
/// thread, memory freed when a sandbox is destroyed stays scattered over
/// partly used pages in each arena and cannot be returned: measured with
/// the stress trace (benches/memory.rs), 5 MiB stayed after destroying
/// everything, against 0.9 MiB with one arena, which also cut the bytes
/// per mapped node by a fifth. The daemon allocates little on its hot
/// paths, so the shared arena's lock is not contended.
fn one_malloc_arena() {
    // SAFETY: mallopt only sets a tunable; it is called before any other
    // thread exists, so no allocation races with it.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn open_input(options: &DaemonConfig) -> Result<Box<dyn Read + Send>, DaemonError> {
    match &options.input {
        None => {
            widen_input_pipe();
            Ok(Box::new(io::stdin()))
        }
        Some(path) => File::open(path)
            .map(|f| Box::new(f) as Box<dyn Read + Send>)
            .map_err(|source| DaemonError::Input {
                path: path.clone(),
                source,
            }),
    }
}

fn open_output(
    options: &DaemonConfig,
    created: &mut checks::Created,
) -> Result<Box<dyn Write + Send>, DaemonError> {
    match &options.output {
        None => Ok(Box::new(io::stdout())),
        Some(path) => created
            .make(path, || File::create(path))
            .map(|f| Box::new(f) as Box<dyn Write + Send>)
            .map_err(|source| DaemonError::Output {
                path: path.clone(),
                source,
            }),
    }
}

/// `transport`: on io_uring, `/dev/fuse` carries only FORGETs and
/// INTERRUPTs, so one thread reads it.
fn session_config(allow: Allow, transport: Transport) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("actionfs".into()),
        MountOption::Subtype("actionfs".into()),
        // The kernel checks permissions against the attributes we report,
        // exactly as on the underlying files.
        MountOption::DefaultPermissions,
    ];
    config.acl = match allow {
        Allow::OwnerOnly => SessionACL::Owner,
        Allow::RootAndOwner => SessionACL::RootAndOwner,
        Allow::Everyone => SessionACL::All,
    };
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    config.n_threads = Some(match transport {
        Transport::Classic => cpus.max(2),
        Transport::IoUring => 1,
    });
    config.clone_fd = cfg!(target_os = "linux");
    config
}

/// Lets a client write a large request (megabytes for a sandbox of
/// 100,000 inputs) into our input pipe in fewer, larger pieces: with the
/// default 64 KiB, writer and reader take turns every 64 KiB, a wake-up
/// each. Not a pipe, or refused: nothing changes.
fn widen_input_pipe() {
    #[cfg(target_os = "linux")]
    {
        const PIPE_BYTES: libc::c_int = 1 << 20;
        // SAFETY: fcntl on our own standard input; no memory is passed.
        let done = unsafe { libc::fcntl(libc::STDIN_FILENO, libc::F_SETPIPE_SZ, PIPE_BYTES) };
        if done < 0 {
            log::debug!(
                "input pipe left at its size: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// A daemon holds one descriptor per open file of every action; the
/// default soft limit of 1024 is too low for a large build.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(err) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                log::info!("cannot raise the open file limit: {err}");
            }
        }
    }
}
