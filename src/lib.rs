//! actionfs: a sandbox file system for build tools.
//!
//! Data flows one way: requests on stdin are decoded by the protocol crate,
//! [`reconfig`] applies them to the [`tree`] with a pool of workers, and the
//! FUSE shell ([`fuse_shell`]) serves the kernel's requests from the same
//! tree. [`daemon`] wires these together and owns the mount's lifecycle.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod calibrate;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dirfd;
pub mod file_kind;
pub mod fuse;
pub mod hybrid;
pub mod layout;
pub mod materialize;
pub mod mount;
pub mod reconfig;
mod sys;
pub mod tools;
pub mod tree;
