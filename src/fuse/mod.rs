//! Everything that speaks FUSE: the dispatcher that serves the kernel's
//! requests from the core, the two transports that carry them (the shell
//! over fuser's `/dev/fuse` loop, and the io_uring queues), the choice
//! between them, the kernel cache notifications the core asks for, and
//! the passthrough bookkeeping for file data.

mod dispatch;
mod notify;
pub mod options;
mod passthrough;
mod shell;
pub mod transport;
#[cfg(target_os = "linux")]
pub mod uring;

pub use dispatch::{Ctx, Dispatcher, Entry, Open};
pub use notify::NotifierInvalidator;
pub use shell::FuseShell;
