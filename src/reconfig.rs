//! Applying the request stream to the tree.
//!
//! One reader decodes requests in order and resolves their prefixes (prefix
//! registration must follow stream order, since later requests use earlier
//! prefixes). It then hands each request to a worker chosen by hashing the
//! sandbox id: requests for one id run in order on one worker, requests for
//! different ids run in parallel, and each is answered as soon as it is done.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use actionfs_protocol::{
    validate_sandbox_id, Decoded, PrefixTable, Request, RequestReader, ResolvedMapping, Response,
    ResponseWriter,
};
use parking_lot::Mutex;

use crate::hybrid::{NativeOutcome, NativeSandboxes};
use crate::tree::SandboxFs;

/// Where answers go. If the reader of our output goes away (EPIPE), answers
/// are dropped from then on and the file system keeps serving.
pub struct ResponseSink {
    writer: Mutex<Option<ResponseWriter<Box<dyn Write + Send>>>>,
}

impl ResponseSink {
    pub fn new(output: Box<dyn Write + Send>) -> ResponseSink {
        ResponseSink {
            writer: Mutex::new(Some(ResponseWriter::new(output))),
        }
    }

    pub fn send(&self, response: &Response) {
        let mut writer = self.writer.lock();
        let Some(out) = writer.as_mut() else {
            return;
        };
        if let Err(err) = out.write(response) {
            log::warn!(
                "cannot write the answer for sandbox {:?}: {err}; later answers are dropped",
                response.id
            );
            *writer = None;
        }
    }
}

/// A request ready to apply: prefixes resolved, paths validated.
enum Job {
    Create {
        id: String,
        mappings: Vec<ResolvedMapping>,
    },
    Destroy {
        id: String,
    },
}

/// Reads and applies requests from `input` until it ends or turns
/// malformed; returns once every request read has been answered.
/// `native`: where small sandboxes are built natively, if anywhere.
pub fn serve<R: Read>(
    input: R,
    fs: Arc<SandboxFs>,
    native: Option<Arc<NativeSandboxes>>,
    sink: Arc<ResponseSink>,
    workers: usize,
) {
    let (queues, handles) = start_workers(workers.max(1), &fs, &native, &sink);
    let mut prefixes = PrefixTable::new();
    for item in RequestReader::new(input) {
        let job = match item {
            Ok(Decoded::Request(request)) => match prepare(&mut prefixes, request) {
                Ok(job) => job,
                Err((id, message)) => {
                    log::warn!("{message}");
                    sink.send(&Response::error(id, message));
                    continue;
                }
            },
            Ok(Decoded::Invalid { id, message }) => {
                let message = format!("sandbox {id:?}: {message}");
                log::warn!("{message}");
                sink.send(&Response::error(id, message));
                continue;
            }
            Err(fatal) => {
                log::error!("{fatal}; no more requests will be read, the mount stays up");
                sink.send(&Response::fatal(fatal.message));
                break;
            }
        };
        let id = match &job {
            Job::Create { id, .. } | Job::Destroy { id } => id,
        };
        let queue = &queues[worker_for(id, queues.len())];
        if queue.send(job).is_err() {
            log::error!("reconfiguration worker died; stopping");
            break;
        }
    }
    drop(queues);
    for handle in handles {
        let _ = handle.join();
    }
}

/// Registers the request's prefixes and resolves its mappings.
fn prepare(prefixes: &mut PrefixTable, request: Request) -> Result<Job, (String, String)> {
    match request {
        Request::Destroy(id) => Ok(Job::Destroy { id }),
        // Prefixes stay registered even if the sandbox later fails: the
        // client considers them sent and will use them again.
        Request::Create(create) => match prefixes.resolve_create(&create) {
            Ok(mappings) => Ok(Job::Create {
                id: create.id,
                mappings,
            }),
            Err(err) => {
                let message = format!("sandbox {:?}: {err}", create.id);
                Err((create.id, message))
            }
        },
    }
}

/// Builds a sandbox natively and shows it in the view, or falls back to
/// FUSE where the materializer cannot build it. Returns how it was made.
fn create_native(
    fs: &SandboxFs,
    native: &NativeSandboxes,
    id: &str,
    mappings: &[ResolvedMapping],
) -> (Result<(), String>, &'static str) {
    if let Err(err) = validate_sandbox_id(id) {
        return (Err(err.to_string()), "native");
    }
    if fs.has_sandbox(id) {
        return (Err(format!("sandbox {id:?} already exists")), "native");
    }
    match native.create(id, mappings, &fs.config().mount_point) {
        NativeOutcome::Built { link } => {
            let shown = fs.create_sandbox_link(id, &link);
            if shown.is_err() {
                if let Err(err) = native.destroy(id) {
                    log::error!("{err}");
                }
            }
            (shown, "native")
        }
        NativeOutcome::Rejected(message) => (Err(message), "native"),
        NativeOutcome::Unsupported(why) => {
            log::info!("sandbox {id:?}: served by FUSE, as it cannot be built natively: {why}");
            (fs.create_sandbox(id, mappings), "FUSE (fallback)")
        }
    }
}

fn worker_for(id: &str, workers: usize) -> usize {
    let mut hasher = DefaultHasher::new();
    id.hash(&mut hasher);
    (hasher.finish() % workers as u64) as usize
}

fn start_workers(
    count: usize,
    fs: &Arc<SandboxFs>,
    native: &Option<Arc<NativeSandboxes>>,
    sink: &Arc<ResponseSink>,
) -> (Vec<Sender<Job>>, Vec<JoinHandle<()>>) {
    (0..count)
        .map(|n| {
            let (tx, rx) = channel::<Job>();
            let fs = fs.clone();
            let native = native.clone();
            let sink = sink.clone();
            let handle = std::thread::Builder::new()
                .name(format!("reconfig-{n}"))
                .spawn(move || {
                    for job in rx {
                        sink.send(&apply(&fs, native.as_deref(), job));
                    }
                })
                .expect("cannot start a reconfiguration thread");
            (tx, handle)
        })
        .unzip()
}

fn apply(fs: &SandboxFs, native: Option<&NativeSandboxes>, job: Job) -> Response {
    let started = Instant::now();
    let (id, result, what) = match job {
        Job::Create { id, mappings } => {
            let native = native.filter(|n| n.wants(mappings.len()));
            let (result, how) = match native {
                Some(native) => create_native(fs, native, &id, &mappings),
                None => (fs.create_sandbox(&id, &mappings), "FUSE"),
            };
            let what = format!("{how} create with {} mappings", mappings.len());
            (id, result, what)
        }
        Job::Destroy { id } => {
            let result = fs.destroy_sandbox(&id).and_then(|()| match native {
                Some(native) => native.destroy(&id).map(drop),
                None => Ok(()),
            });
            (id, result, "destroy".to_owned())
        }
    };
    match result {
        Ok(()) => {
            log::debug!("sandbox {id:?}: {what} took {:?}", started.elapsed());
            Response::ok(id)
        }
        Err(message) => {
            log::warn!("{message}");
            Response::error(id, message)
        }
    }
}
