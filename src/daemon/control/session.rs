//! One control connection: check the peer, then read requests and answer
//! each on its own line until the client closes.

use std::io::{BufWriter, Write};
use std::os::unix::net::UnixStream;

use actionfs_protocol::{decode_value, Decoded, Framer, PrefixTable, Response};
use serde_json::{json, Value};

use super::Control;
use crate::daemon::reconfig::{apply, prepare};
use crate::sandbox::access_log::inputs_json;

/// Longest request accepted, as on stdin.
const REQUEST_LIMIT: u64 = 1 << 30;

pub fn serve(stream: UnixStream, control: &Control) {
    let Ok(reader) = stream.try_clone() else {
        return;
    };
    let mut out = BufWriter::new(&stream);
    if let Err(refusal) = check_peer(&stream) {
        log::warn!("control socket: {refusal}");
        let _ = answer(&mut out, &json!({ "error": refusal.to_string() }));
        return;
    }
    let mut framer = Framer::new(reader, REQUEST_LIMIT);
    let mut prefixes = PrefixTable::new();
    loop {
        let reply = match framer.next_value() {
            Ok(Some(bytes)) => handle(control, &mut prefixes, bytes),
            Ok(None) => return,
            Err(err) if err.is_recoverable() => json!({
                "error": format!("malformed request at {err}; skipped to the next request")
            }),
            Err(err) => {
                // The stream cannot be cut into requests any more.
                let _ = answer(
                    &mut out,
                    &json!({ "error": format!("bad request stream: {err}") }),
                );
                return;
            }
        };
        if answer(&mut out, &reply).is_err() {
            return;
        }
    }
}

/// Refuses peers running as another user than the daemon.
fn check_peer(stream: &UnixStream) -> Result<(), PeerRefused> {
    let (uid, pid) = crate::sys::peer_credentials(stream).map_err(PeerRefused::Unknown)?;
    let ours = nix::unistd::geteuid().as_raw();
    if uid != ours {
        return Err(PeerRefused::OtherUser { uid, pid, ours });
    }
    Ok(())
}

/// Why a client of the control socket is refused.
#[derive(Debug, thiserror::Error)]
enum PeerRefused {
    #[error("cannot tell who connected: {0}")]
    Unknown(nix::errno::Errno),
    #[error(
        "refused a client of uid {uid}{}: only uid {ours} may use this socket",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    OtherUser {
        uid: u32,
        pid: Option<i32>,
        ours: u32,
    },
}

fn answer(out: &mut impl Write, reply: &Value) -> std::io::Result<()> {
    let mut line = reply.to_string();
    line.push('\n');
    out.write_all(line.as_bytes())?;
    out.flush()
}

/// Answers one request.
fn handle(control: &Control, prefixes: &mut PrefixTable, bytes: &[u8]) -> Value {
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(err) => return json!({ "error": format!("malformed JSON: {err}") }),
    };
    if let Some((verb, argument)) = value
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    {
        match verb.as_str() {
            "List" => return list(control),
            "Stats" => {
                let stats = control.sandboxes.stats();
                return json!({ "stats": stats.to_json((control.live_figures)()) });
            }
            "Accessed" => return accessed(control, argument),
            _ => {}
        }
    }
    let sandboxes = control.sandboxes.clone();
    match decode_value(bytes) {
        Ok(Decoded::Request(request)) => match prepare(prefixes, request) {
            Ok(job) => response(apply(&*sandboxes, job, sandboxes.stats())),
            Err((id, message)) => response(Response::error(id, message)),
        },
        Ok(Decoded::Invalid {
            id: Some(id),
            message,
        }) => response(Response::error(
            id.clone(),
            format!("sandbox {id:?}: {message}"),
        )),
        Ok(Decoded::Invalid { id: None, message }) => json!({
            "error": format!(
                "{message}; expected CreateSandbox, DestroySandbox, List, Stats or Accessed"
            )
        }),
        Err(fatal) => json!({
            "error": format!(
                "{}; expected CreateSandbox, DestroySandbox, List, Stats or Accessed",
                fatal.message
            )
        }),
    }
}

fn response(response: Response) -> Value {
    serde_json::to_value(response).expect("a response always serializes")
}

fn list(control: &Control) -> Value {
    let sandboxes: Vec<Value> = control
        .sandboxes
        .list()
        .into_iter()
        .map(|s| {
            json!({
                "id": s.id,
                "kind": if s.native { "native" } else { "fuse" },
                "mappings": s.mappings,
            })
        })
        .collect();
    json!({ "sandboxes": sandboxes })
}

fn accessed(control: &Control, argument: &Value) -> Value {
    let Some(id) = argument.as_str() else {
        return json!({ "error": "Accessed takes a sandbox id (a string)" });
    };
    match control.sandboxes.fs().accessed(id) {
        Ok(inputs) => inputs_json(id, &inputs),
        Err(err) => json!({ "id": id, "error": err.to_string() }),
    }
}
