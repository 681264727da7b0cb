//! The request loop of `actionfs serve`: one reader cuts stdin into
//! frames and applies Pushes itself, in stream order (a Push must be in
//! the store before any later Create reads it); Create, Collect and
//! Destroy go to a worker chosen by hashing the sandbox id, so requests
//! for one sandbox run one at a time and in order while others run beside
//! them, each answered as soon as it is done. A stop signal [`Halt`]s it.

use std::io::{self, BufRead, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actionfs_protocol::backend::frame::{read_frame, write_frame, MAX_FRAME};
use actionfs_protocol::backend::sandbox::{
    collect, create, destroy, negotiate, request::Op, response, Manifest, Request, Response,
};
use parking_lot::{Condvar, Mutex};

use super::service::Service;
use crate::daemon::reconfig::worker_for;

/// Where answers go, one whole frame at a time. If the client stops
/// reading (EPIPE), answers are dropped from then on.
pub struct Answers {
    out: Mutex<Option<Box<dyn Write + Send>>>,
}

impl Answers {
    pub fn new(out: Box<dyn Write + Send>) -> Answers {
        Answers {
            out: Mutex::new(Some(out)),
        }
    }

    pub fn send(&self, rid: u64, result: response::Result) {
        let response = Response {
            rid,
            result: Some(result),
        };
        let mut out = self.out.lock();
        let Some(writer) = out.as_mut() else {
            return;
        };
        if let Err(err) = write_frame(writer, &response).and_then(|()| writer.flush()) {
            log::error!(
                "cannot write the answer to request {rid}: {err}; later answers are dropped"
            );
            *out = None;
        }
    }
}

/// Stops the request loop from outside (a stop signal): from then on no
/// request is applied (nor answered: the client has given up on this
/// backend), so that nothing writes below the base while it is removed.
#[derive(Default)]
pub struct Halt {
    state: Mutex<Applying>,
    idle: Condvar,
}

#[derive(Default)]
struct Applying {
    halted: bool,
    /// Requests being applied now.
    running: usize,
}

impl Halt {
    /// Halts, and waits up to `limit` for the requests being applied to
    /// end. Returns how many still run then (stuck, say, on a file that
    /// never answers): the caller must not wait for them.
    pub fn halt(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut state = self.state.lock();
        state.halted = true;
        while state.running > 0 && !self.idle.wait_until(&mut state, deadline).timed_out() {}
        state.running
    }

    /// Applies `apply` unless halted (then `None`).
    fn run<T>(&self, apply: impl FnOnce() -> T) -> Option<T> {
        {
            let mut state = self.state.lock();
            if state.halted {
                return None;
            }
            state.running += 1;
        }
        // Counted out even if `apply` panics.
        struct Done<'a>(&'a Halt);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut state = self.0.state.lock();
                state.running -= 1;
                if state.running == 0 {
                    self.0.idle.notify_all();
                }
            }
        }
        let _done = Done(self);
        Some(apply())
    }
}

/// A request for one sandbox, for its worker.
struct Job {
    rid: u64,
    id: String,
    op: SandboxOp,
}

enum SandboxOp {
    Create(Box<Manifest>),
    Collect { exec_root: String },
    Destroy,
}

/// Reads and applies requests until the input ends or `halt` halts it,
/// then waits until every request read has been answered (or dropped, once
/// halted). A frame that cannot be read is fatal (a byte stream cannot be
/// resynchronised): the error says what and where.
pub fn serve(
    mut input: impl BufRead,
    service: Arc<Service>,
    answers: Arc<Answers>,
    workers: usize,
    halt: Arc<Halt>,
) -> Result<(), String> {
    let (queues, handles) = start_workers(workers.max(1), &service, &answers, &halt)
        .map_err(|err| format!("cannot start the request workers: {err}"))?;
    let mut frames = 0u64;
    let ended = loop {
        let request: Request = match read_frame(&mut input, MAX_FRAME) {
            Ok(Some(request)) => request,
            Ok(None) => break Ok(()),
            Err(err) => {
                break Err(format!(
                    "request frame #{} cannot be read: {err}; stopping (the stream cannot be \
                     resynchronised)",
                    frames + 2
                ))
            }
        };
        frames += 1;
        let rid = request.rid;
        match request.op {
            Some(Op::Push(push)) => {
                if halt.run(|| service.push(push)).is_none() {
                    break Ok(());
                }
            }
            Some(Op::Negotiate(_)) => answers.send(
                rid,
                response::Result::Negotiate(negotiate::Result {
                    outcome: Some(negotiate::result::Outcome::Error(
                        actionfs_protocol::backend::sandbox::Error {
                            message: "Negotiate was already answered; send it once, first"
                                .to_owned(),
                        },
                    )),
                }),
            ),
            Some(op) => {
                let op = match op {
                    Op::Create(create) => {
                        SandboxOp::Create(Box::new(create.manifest.unwrap_or_default()))
                    }
                    Op::Collect(collect) => SandboxOp::Collect {
                        exec_root: collect.exec_root,
                    },
                    Op::Destroy(_) => SandboxOp::Destroy,
                    Op::Push(_) | Op::Negotiate(_) => unreachable!("matched above"),
                };
                let worker = worker_for(&request.sandbox_id, queues.len());
                let job = Job {
                    rid,
                    id: request.sandbox_id,
                    op,
                };
                // A Destroy answers after a rename or two: applied here, it
                // saves the hand-over to a worker (a thread wake), unless
                // an earlier request of its sandbox may still be queued
                // there (requests of one sandbox apply in order).
                if matches!(job.op, SandboxOp::Destroy) && queues[worker].is_idle() {
                    if let Some(answer) = halt.run(|| apply(&service, job)) {
                        answers.send(rid, answer);
                    }
                    continue;
                }
                if queues[worker].send(job).is_err() {
                    break Err("a request worker ended".to_owned());
                }
            }
            None => log::error!(
                "request {rid} names no operation this backend knows; it gets no answer"
            ),
        }
    };
    drop(queues);
    for handle in handles {
        let _ = handle.join();
    }
    ended
}

/// A worker's queue, and how many of its jobs are not yet applied.
struct Queue {
    jobs: Sender<Job>,
    unapplied: Arc<AtomicUsize>,
}

impl Queue {
    fn send(&self, job: Job) -> Result<(), ()> {
        self.unapplied.fetch_add(1, Ordering::SeqCst);
        self.jobs.send(job).map_err(|_| {
            self.unapplied.fetch_sub(1, Ordering::SeqCst);
        })
    }

    /// Whether every job sent has been applied.
    fn is_idle(&self) -> bool {
        self.unapplied.load(Ordering::SeqCst) == 0
    }
}

fn start_workers(
    count: usize,
    service: &Arc<Service>,
    answers: &Arc<Answers>,
    halt: &Arc<Halt>,
) -> io::Result<(Vec<Queue>, Vec<std::thread::JoinHandle<()>>)> {
    let mut queues = Vec::with_capacity(count);
    let mut handles = Vec::with_capacity(count);
    for n in 0..count {
        let (queue, jobs) = channel::<Job>();
        let unapplied = Arc::new(AtomicUsize::new(0));
        let (service, answers, halt) = (service.clone(), answers.clone(), halt.clone());
        let left = unapplied.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("serve-{n}"))
                .spawn(move || {
                    for job in jobs {
                        let rid = job.rid;
                        // Once halted, what is queued is dropped.
                        let answer = halt.run(|| apply(&service, job));
                        // Applied: a later request of the sandbox may apply
                        // on the reader now (answers may come in any order).
                        left.fetch_sub(1, Ordering::SeqCst);
                        if let Some(answer) = answer {
                            answers.send(rid, answer);
                        }
                    }
                })?,
        );
        queues.push(Queue {
            jobs: queue,
            unapplied,
        });
    }
    Ok((queues, handles))
}

/// Applies one request; a panic becomes an Error answer of the request's
/// kind, since the client waits for one.
fn apply(service: &Service, job: Job) -> response::Result {
    let Job { id, op, .. } = job;
    let kind = Kind::of(&op);
    let done = catch_unwind(AssertUnwindSafe(|| match op {
        SandboxOp::Create(manifest) => response::Result::Create(service.create(&id, *manifest)),
        SandboxOp::Collect { exec_root } => {
            response::Result::Collect(service.collect(&id, &exec_root))
        }
        SandboxOp::Destroy => response::Result::Destroy(service.destroy(&id)),
    }));
    done.unwrap_or_else(|_| {
        kind.error(format!(
            "sandbox {id:?}: the backend failed applying this request (a bug; see its log)"
        ))
    })
}

#[derive(Clone, Copy)]
enum Kind {
    Create,
    Collect,
    Destroy,
}

impl Kind {
    fn of(op: &SandboxOp) -> Kind {
        match op {
            SandboxOp::Create(_) => Kind::Create,
            SandboxOp::Collect { .. } => Kind::Collect,
            SandboxOp::Destroy => Kind::Destroy,
        }
    }

    /// An Error answer in this request's arm.
    fn error(self, message: String) -> response::Result {
        let error = actionfs_protocol::backend::sandbox::Error { message };
        match self {
            Kind::Create => response::Result::Create(create::Result {
                outcome: Some(create::result::Outcome::Error(error)),
            }),
            Kind::Collect => response::Result::Collect(collect::Result {
                outcome: Some(collect::result::Outcome::Error(error)),
            }),
            Kind::Destroy => response::Result::Destroy(destroy::Result {
                outcome: Some(destroy::result::Outcome::Error(error)),
            }),
        }
    }
}
