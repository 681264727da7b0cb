//! actionfs: a sandbox file system for build tools.
//!
//! # Data flow
//!
//! Requests on stdin are decoded by the protocol crate (`protocol/`), and
//! [`daemon::reconfig`] hands each to a pool of workers, one request in
//! flight per sandbox id. A worker asks [`sandbox::hybrid`] to make or
//! remove the sandbox: the [`sandbox::layout`] is drafted once, then built
//! either as nodes of the FUSE view ([`sandbox::tree`]) or as real files by
//! the [`sandbox::materialize`]r, whichever the measured cutoff picks. The
//! kernel's requests reach the same tree through one dispatcher and its two
//! transports in [`fuse`]. [`daemon`] wires these together and owns the
//! mount's lifecycle. Nothing flows backwards: the sandbox core knows
//! nothing of FUSE or of the request stream.
//!
//! # Layout, one folder per concern
//!
//! - [`sandbox`]: the core. A sandbox's layout, the FUSE tree, the native
//!   materializer, the hybrid policy that picks between them, and the
//!   descriptor-relative path resolution they share. Tested without a
//!   mount.
//! - [`fuse`]: the transports from the kernel to the core: one dispatcher
//!   holding every per-request decision, the classic `/dev/fuse` shell
//!   (through fuser) and the FUSE-over-io_uring queues, kernel cache
//!   notifications, passthrough bookkeeping.
//! - [`daemon`]: the daemon's life: configuration, argument checks, mount
//!   and unmount, the request loop, signals, statistics, the control
//!   socket, the access log and recording.
//! - [`tools`]: every subcommand but the daemon: `ctl`, `replay`,
//!   `replay-actions`, `calibrate`, `doctor`, `man` and `completions`, `materialize`,
//!   `rmtree` and `stage-root`, the progress line they share, and the
//!   command line's definition (`tools::command_line`) that `man` renders.
//! - [`stage`]: the library remote-execution workers call to lay out an
//!   action's REAPI input root from their CAS (NativeLink's layout).
//! - [`jail`]: actionfs's own jail for `serve`'s actions (Landlock and
//!   seccomp, applied before exec by `actionfs-jail`).
//! - [`cli`]: the command line parsed with that grammar; `main.rs`
//!   dispatches on it.
//! - `sys`: the platform's mechanisms, from the `linux/` or `macos/` crate.

#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(target_os = "linux")]
pub mod allocator;
mod background;
pub mod cli;
pub mod daemon;
pub mod fuse;
pub use actionfs_jail as jail;
pub mod sandbox;
pub mod serve;
pub mod stage;
pub mod stats;
mod sys;
pub mod tools;
