//! Bazel's sandbox backend protocol: the wire format of `BINARY serve`.
//!
//! Bazel starts a backend and sends it protobuf [`sandbox::Request`]s on its
//! standard input; the backend answers with [`sandbox::Response`]s on its
//! standard output, each carrying its request's `rid`, in any order. Every
//! message is preceded by its length as a varint. See `BACKEND.md` beside
//! this crate for the whole protocol.
//!
//! Read the modules in this order:
//! - [`sandbox`] and [`reapi`]: the messages, generated from the `.proto`
//!   files under `proto/` by prost (see `proto/SOURCES.md`);
//! - [`frame`]: how messages are cut out of a byte stream and written to one;
//! - [`digest`]: SHA-256 digests as the protocol spells them;
//! - [`tree`]: building the REAPI Merkle tree a manifest points to;
//! - [`client`]: driving a backend from Rust, as Bazel does.

pub mod client;
pub mod digest;
pub mod frame;
pub mod tree;

/// The generated code, nested by protobuf package as prost's cross-package
/// paths (`super::super::build::...`) expect. The files are prost-build's
/// output, unedited: `tests/backend_codegen.rs` regenerates and compares
/// them, so rustfmt and the lints stay out of them.
#[allow(clippy::all, clippy::pedantic, rustdoc::all)]
mod generated {
    pub mod bazel {
        pub mod sandbox {
            include!("gen/bazel.sandbox.rs");
        }
    }
    pub mod build {
        pub mod bazel {
            pub mod remote {
                pub mod execution {
                    pub mod v2 {
                        include!("gen/build.bazel.remote.execution.v2.rs");
                    }
                }
            }
        }
    }
}

/// The messages of protobuf package `bazel.sandbox`: [`sandbox::Request`],
/// [`sandbox::Response`] and what they carry.
pub use generated::bazel::sandbox;
/// The messages of protobuf package `build.bazel.remote.execution.v2` that
/// the protocol uses: [`reapi::Digest`], [`reapi::Directory`] and its nodes.
pub use generated::build::bazel::remote::execution::v2 as reapi;
