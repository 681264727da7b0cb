//! `actionfs ctl`: drives a running daemon through its control socket
//! (`--control=PATH`, see [`crate::control`]). Prints for people by
//! default and the daemon's JSON answer with `--json`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use actionfs_protocol::{CreateSandbox, Decoded, Mapping, Request, RequestReader};
use serde_json::{json, Value};

/// What `ctl` was asked to do.
#[derive(Debug)]
pub struct CtlArgs {
    pub control: PathBuf,
    pub json: bool,
    pub verb: Verb,
}

#[derive(Debug)]
pub enum Verb {
    Create {
        id: String,
        /// `(writable, path in the sandbox, underlying path)`.
        maps: Vec<(bool, String, String)>,
        spec: Option<PathBuf>,
    },
    Destroy(String),
    List,
    Stats,
    Accessed(String),
}

/// A failure of `ctl` itself or an error the daemon answered.
#[derive(Debug)]
pub struct CtlError(String);

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub fn run(args: &CtlArgs) -> Result<(), CtlError> {
    let request = request_for(&args.verb)?;
    let answer = call(&args.control, &request)?;
    if args.json {
        println!("{answer}");
    } else {
        print_human(&args.verb, &answer);
    }
    match answer.get("error") {
        Some(Value::String(message)) => Err(CtlError(message.clone())),
        _ => Ok(()),
    }
}

fn request_for(verb: &Verb) -> Result<Value, CtlError> {
    Ok(match verb {
        Verb::Create { id, maps, spec } => {
            let mut create = match spec {
                Some(path) => read_spec(path)?,
                None => CreateSandbox::default(),
            };
            create.id = id.clone();
            create
                .mappings
                .extend(maps.iter().map(|(writable, path, underlying)| Mapping {
                    path: path.clone(),
                    underlying_path: underlying.clone(),
                    writable: *writable,
                    ..Mapping::default()
                }));
            serde_json::to_value(Request::Create(create)).expect("a request serializes")
        }
        Verb::Destroy(id) => {
            serde_json::to_value(Request::Destroy(id.clone())).expect("a request serializes")
        }
        Verb::List => json!({ "List": null }),
        Verb::Stats => json!({ "Stats": null }),
        Verb::Accessed(id) => json!({ "Accessed": id }),
    })
}

/// One CreateSandbox request as on the wire.
fn read_spec(path: &PathBuf) -> Result<CreateSandbox, CtlError> {
    let bytes = std::fs::read(path).map_err(|e| CtlError(format!("spec {path:?}: {e}")))?;
    match RequestReader::new(bytes.as_slice()).next() {
        Some(Ok(Decoded::Request(Request::Create(create)))) => Ok(create),
        Some(Ok(Decoded::Invalid { message, .. })) => {
            Err(CtlError(format!("spec {path:?}: {message}")))
        }
        Some(Err(err)) => Err(CtlError(format!("spec {path:?}: {}", err.message))),
        _ => Err(CtlError(format!(
            "spec {path:?}: expected one CreateSandbox request"
        ))),
    }
}

fn call(control: &PathBuf, request: &Value) -> Result<Value, CtlError> {
    let fail = |what: &str, err: std::io::Error| CtlError(format!("{control:?}: {what}: {err}"));
    let mut stream = UnixStream::connect(control).map_err(|e| fail("connect", e))?;
    // A daemon that refuses us answers and closes before reading our request,
    // so a failed send may still leave its answer to read: read it first.
    let sent = stream
        .write_all(request.to_string().as_bytes())
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write));
    let mut line = String::new();
    let received = BufReader::new(stream).read_line(&mut line);
    if line.is_empty() {
        sent.map_err(|e| fail("send", e))?;
        received.map_err(|e| fail("receive", e))?;
    }
    serde_json::from_str(&line).map_err(|e| {
        CtlError(format!(
            "{control:?}: the answer is not JSON ({e}): {line:?}"
        ))
    })
}

fn print_human(verb: &Verb, answer: &Value) {
    if answer.get("error").is_some_and(|e| !e.is_null()) {
        return; // main prints the error
    }
    match verb {
        Verb::Create { id, .. } => println!("created {id}"),
        Verb::Destroy(id) => println!("destroyed {id}"),
        Verb::List => {
            let sandboxes = answer["sandboxes"].as_array().cloned().unwrap_or_default();
            println!("{:<24} {:<7} {:>9}", "ID", "KIND", "MAPPINGS");
            for s in sandboxes {
                println!(
                    "{:<24} {:<7} {:>9}",
                    s["id"].as_str().unwrap_or("?"),
                    s["kind"].as_str().unwrap_or("?"),
                    s["mappings"]
                );
            }
        }
        Verb::Stats => println!(
            "{}",
            serde_json::to_string_pretty(&answer["stats"]).unwrap_or_default()
        ),
        Verb::Accessed(_) => {
            let inputs = answer["inputs"].as_array().cloned().unwrap_or_default();
            let count = |access: &str| inputs.iter().filter(|i| i["access"] == access).count();
            for input in &inputs {
                println!(
                    "{:<7} {}  ({})",
                    input["access"].as_str().unwrap_or("?"),
                    input["path"].as_str().unwrap_or("?"),
                    input["underlying"].as_str().unwrap_or("?")
                );
            }
            println!(
                "{} inputs: {} read, {} looked up only, {} untouched",
                inputs.len(),
                count("read"),
                count("lookup"),
                count("none")
            );
        }
    }
}
