//! The wire formats actionfs speaks.
//!
//! - The reconfiguration protocol of sandboxfs 0.2 (Bazel's
//!   `--experimental_use_sandboxfs`): a daemon mounts a file system and
//!   reads JSON requests on its standard input; each request creates or
//!   destroys one sandbox, a top-level directory of the mount. It answers
//!   each request with one line on its standard output. See `SPEC.md` beside
//!   this crate for the full wire format.
//! - Bazel's sandbox backend protocol (`BINARY serve`), in [`backend`]:
//!   length-delimited protobuf requests and responses over standard input
//!   and output. See `BACKEND.md` beside this crate.
//!
//! Read the modules in this order:
//! - [`types`]: the sandboxfs messages, field by field;
//! - [`frame`]: how a byte stream is cut into JSON values;
//! - [`codec`]: how those values become requests, and responses bytes;
//! - [`inplace`]: the same, for creates, without building the request;
//! - [`resolve`]: how prefixes and mapping paths become absolute paths;
//! - [`client`]: driving a sandboxfs daemon from Rust;
//! - [`backend`]: the sandbox backend protocol, whose module doc lists its
//!   own modules in order (messages, framing, digests, trees, client).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod client;
pub mod codec;
pub mod frame;
pub mod inplace;
pub mod resolve;
pub mod types;

pub use client::{Client, ClientError};
pub use codec::{
    decode_value, encode_request, Decoded, FatalError, RequestReader, ResponseReader,
    ResponseWriter, Typed,
};
pub use frame::{FrameError, Framer};
pub use inplace::{decode_in_place, InPlace, MappingSink};
pub use resolve::{validate_sandbox_id, PrefixTable, ResolveError, ResolvedMapping};
pub use types::{CreateSandbox, Mapping, PrefixId, Request, Response};
