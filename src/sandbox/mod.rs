//! The core: a sandbox as a tree of nodes served through FUSE ([`tree`]) or
//! as real files ([`materialize`]), from one [`layout`]; [`hybrid`] picks
//! which per sandbox; [`store`] keeps content pushed by digest for the
//! sandboxes that reference it; [`merkle`] walks input trees given by
//! directory digests, whose files nobody pushed are found at their
//! [`default_place`]. Nothing here knows about FUSE or the request
//! stream.

pub mod access_log;
pub mod backend;
pub mod default_place;
pub mod dirfd;
pub mod file_kind;
pub mod handed_on;
pub mod hybrid;
pub mod layout;
pub mod materialize;
pub mod merkle;
pub mod ownership;
pub(crate) mod sharded;
pub mod store;
pub mod tree;
