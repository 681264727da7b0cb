//! actionfs's Linux mechanisms: the forms of the system calls that differ
//! by platform, behind the same names as the other platform's crate, so the
//! core (`actionfs::sys`) re-exports whichever one it is built for; and the
//! kernel's FUSE ABI that the io_uring transport speaks ([`fuse_abi`]).
//!
//! The crate is empty on other systems, so the whole workspace builds (and
//! its tests run) everywhere.
#![cfg(target_os = "linux")]

mod calls;
pub mod fuse_abi;
mod identity;
mod resolve;

pub use calls::*;
pub use identity::*;
pub use resolve::*;
