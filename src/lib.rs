//! actionfs: a sandbox file system for build tools.
//!
//! # Data flow
//!
//! Requests on stdin are decoded by the protocol crate (`protocol/`), and
//! [`reconfig`] hands each to a pool of workers, one request in flight per
//! sandbox id. A worker asks [`hybrid`] to make or remove the sandbox: the
//! [`layout`] is planned once, then built either as nodes of the FUSE view
//! ([`tree`]) or as real files by the [`materialize`]r, whichever the
//! measured cutoff picks. The kernel's requests reach the same [`tree`]
//! through the thin FUSE shell in [`fuse`]. [`daemon`] wires these together
//! and owns the mount's lifecycle. Nothing flows backwards: the tree knows
//! nothing of FUSE or of the request stream.
//!
//! # Layout
//!
//! - [`cli`] parses the command line into [`config`], the runtime's own
//!   settings; `main.rs` dispatches to the daemon or a subcommand.
//! - [`daemon`]: mount, threads, signals, unmount; [`mount`]: stale mounts
//!   and unmounting.
//! - [`reconfig`]: the request loop and its [`reconfig::Backend`] seam.
//! - [`hybrid`]: the backend: FUSE or native per sandbox ([`hybrid::cutoff`]
//!   decides where).
//! - [`layout`]: a sandbox's shape, its mappings applied in order and each
//!   underlying path pinned ([`dirfd::Anchor`]).
//! - [`tree`]: the file-system core (nodes, inode table, handles, one module
//!   per kind of operation), tested without a mount.
//! - [`fuse`]: the shell from fuser to the core, kernel cache notifications,
//!   passthrough bookkeeping.
//! - [`dirfd`]: directories and the `*at` calls relative to them, including
//!   resolution beneath a pinned directory that never follows a symlink.
//! - [`materialize`]: native sandboxes (symlink, hardlink, clone, copy) and
//!   `rm -rf`-style teardown; [`tools`]: the `materialize` and `rmtree`
//!   subcommands; [`calibrate`]: the `calibrate` subcommand and the action
//!   workload it shares with the benchmarks; [`doctor`]: what this machine
//!   offers a mount ([`transport_choice`]: which FUSE transport and why);
//!   [`man`]: the manual pages and completions generated from [`cli`];
//!   [`progress`]: a progress line on a terminal.
//! - `sys`: the few calls whose form differs between Linux and macOS;
//!   `sharded`: the sharded maps the core and shell keep state in;
//!   [`file_kind`]: file types.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod access_log;
pub mod calibrate;
pub mod cli;
pub mod config;
pub mod control;
pub mod ctl;
pub mod daemon;
pub mod dirfd;
pub mod doctor;
pub mod file_kind;
pub mod fuse;
pub mod hybrid;
pub mod layout;
pub mod man;
pub mod materialize;
pub mod mount;
pub mod progress;
pub mod reconfig;
pub mod record;
pub mod replay;
mod sharded;
pub mod stats;
mod sys;
pub mod tools;
pub mod transport_choice;
pub mod tree;
