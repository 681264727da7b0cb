//! The control socket (`--control=PATH`): a Unix socket through which
//! other processes drive a running daemon, as `actionfs ctl` does.
//!
//! It speaks the request protocol of stdin (create and destroy, prefixes
//! per connection) plus three requests of its own, each a one-key object:
//!
//! - `{"List":null}` -> `{"sandboxes":[{"id":..,"kind":"fuse"|"native","mappings":N}]}`
//! - `{"Stats":null}` -> `{"stats":{...}}` (what SIGUSR1 logs)
//! - `{"Accessed":"ID"}` -> `{"id":ID,"inputs":[{"path","underlying","access"}]}`
//!
//! Every request gets one answer line; a failure is `{"error":"..."}`
//! (with `"id"` when it concerns a sandbox). Only processes of the daemon's
//! own user may connect: the socket is made mode 0600, and every peer's
//! uid is checked (SO_PEERCRED) before anything is read, which also covers
//! the instant between bind(2) and chmod(2). A request is applied only
//! once it has arrived whole, so a client that goes away mid-request
//! leaves nothing half-made.

mod session;

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::sandbox::hybrid::Sandboxes;

/// What a control connection may reach.
pub struct Control {
    pub sandboxes: Arc<Sandboxes>,
    /// The figures beside the counters in `Stats` answers.
    pub live_figures: Box<dyn Fn() -> Value + Send + Sync>,
}

/// A bound control socket; the file is removed when this is dropped.
pub struct ControlSocket {
    path: PathBuf,
    /// Until [`ControlSocket::serve`] hands it to the accepting thread.
    listener: Option<UnixListener>,
}

impl ControlSocket {
    /// Binds `path`, replacing a stale socket no daemon answers on.
    /// Clients may connect at once; they are served from [`serve`] on.
    pub fn bind(path: &Path) -> io::Result<ControlSocket> {
        let context = |what: &str, err: io::Error| {
            io::Error::new(
                err.kind(),
                format!("control socket {path:?}: {what}: {err}"),
            )
        };
        clear_stale(path).map_err(|e| context("replacing a stale socket", e))?;
        let listener = UnixListener::bind(path).map_err(|e| context("bind", e))?;
        let socket = ControlSocket {
            path: path.to_owned(),
            listener: Some(listener),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| context("chmod", e))?;
        Ok(socket)
    }

    /// Serves connections, each on its own thread, from now on.
    pub fn serve(&mut self, control: Arc<Control>) -> io::Result<()> {
        let Some(listener) = self.listener.take() else {
            return Ok(());
        };
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, control))
            .map(drop)
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_file(&self.path) {
            log::warn!("control socket {:?}: cannot remove it: {err}", self.path);
        }
    }
}

/// Removes a socket left by a daemon that is gone. A socket someone
/// answers on, or a file that is not a socket, is never touched.
fn clear_stale(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
        Ok(meta) if !meta.file_type().is_socket() => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "exists and is not a socket",
        )),
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another daemon is serving on it",
            )),
            Err(_) => std::fs::remove_file(path),
        },
    }
}

fn accept_loop(listener: UnixListener, control: Arc<Control>) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let control = control.clone();
                let spawned = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || session::serve(stream, &control));
                if let Err(err) = spawned {
                    log::warn!("control socket: cannot serve a client: spawn: {err}");
                }
            }
            Err(err) => {
                log::warn!("control socket: accept: {err}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}
