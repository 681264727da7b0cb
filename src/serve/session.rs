//! The request loop of `actionfs serve`, leader and followers: of a few
//! threads, the one holding the input (the leader) cuts it into frames
//! and applies Pushes itself, in stream order (a Push must be in the
//! store before any later Create reads it). A Create, Collect or Destroy
//! it takes for itself, handing the input to the next thread, unless a
//! request of the same sandbox is still being applied: then it queues
//! behind it, for the thread applying that one. So requests for one
//! sandbox run one at a time and in order while others run beside them,
//! each answered as soon as it is done, and no request waits for a
//! thread to wake before it is applied. A stop signal [`Halt`]s it.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actionfs_protocol::backend::frame::{read_frame, write_frame, MAX_FRAME};
use actionfs_protocol::backend::sandbox::{
    collect, create, destroy, negotiate, request::Op, response, Manifest, Request, Response,
};
use parking_lot::{Condvar, Mutex};

use super::error::StartError;
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

    pub fn is_halted(&self) -> bool {
        self.state.lock().halted
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

/// Reads and applies requests on `threads` threads until the input ends
/// or `halt` halts it, then waits until every request read has been
/// answered (or dropped, once halted). `ready` is called once every
/// thread has started, before the first request is read: a client told
/// then finds no thread still starting when its first requests come. A
/// frame that cannot be read is fatal (a byte stream cannot be
/// resynchronised): the error says what and where.
pub fn serve(
    input: impl BufRead + Send,
    service: Arc<Service>,
    answers: Arc<Answers>,
    threads: usize,
    halt: Arc<Halt>,
    ready: impl FnOnce(),
) -> Result<(), StartError> {
    let threads = threads.max(1);
    let session = Session {
        input: Mutex::new(Input {
            frames: 0,
            ended: None,
            reader: input,
        }),
        // Slots, not threads: more of them, fewer sandboxes that wait
        // for another one hashed alike.
        lanes: (0..threads * LANES_PER_THREAD)
            .map(|_| Mutex::default())
            .collect(),
        service: &service,
        answers: &answers,
        halt: &halt,
    };
    let started = Started::default();
    std::thread::scope(|scope| {
        let mut spawned = 0;
        for n in 1..threads {
            let (session, started) = (&session, &started);
            let spawn = std::thread::Builder::new()
                .name(format!("serve-{n}"))
                .spawn_scoped(scope, move || {
                    crate::sys::short_slices();
                    started.one();
                    session.run()
                });
            if let Err(err) = spawn {
                // Fewer threads apply fewer requests at once; none is lost.
                log::warn!("cannot start request thread {n} ({err}); going on with {n}");
                break;
            }
            spawned += 1;
        }
        crate::sys::short_slices();
        started.wait_for(spawned);
        ready();
        session.run();
    });
    let ended = session.input.into_inner().ended;
    ended.unwrap_or(Ok(()))
}

const LANES_PER_THREAD: usize = 8;

/// How many request threads have started.
#[derive(Default)]
struct Started {
    count: Mutex<usize>,
    changed: Condvar,
}

impl Started {
    fn one(&self) {
        *self.count.lock() += 1;
        self.changed.notify_one();
    }

    fn wait_for(&self, threads: usize) {
        let mut count = self.count.lock();
        while *count < threads {
            self.changed.wait(&mut count);
        }
    }
}

/// What the request threads share.
struct Session<'a, R> {
    /// Held by the leader while it reads (and applies Pushes).
    input: Mutex<Input<R>>,
    /// Requests of one sandbox go to one lane, applied one at a time.
    lanes: Vec<Mutex<Lane>>,
    service: &'a Service,
    answers: &'a Answers,
    halt: &'a Halt,
}

struct Input<R> {
    reader: R,
    frames: u64,
    /// Set once the input ended, or could not be read (why).
    ended: Option<Result<(), StartError>>,
}

/// A lane: whether a thread applies its requests now, and those waiting.
#[derive(Default)]
struct Lane {
    busy: bool,
    waiting: VecDeque<Job>,
}

impl<R: BufRead> Session<'_, R> {
    /// One thread's life: lead until it takes a request, apply it (and
    /// those of its lane queued meanwhile), again, until the input ends.
    fn run(&self) {
        while let Some((lane, job)) = self.lead() {
            self.apply_lane(lane, job);
        }
    }

    /// Reads requests until one is for an idle lane, which it takes
    /// (marked busy); `None` once the input ended.
    fn lead(&self) -> Option<(usize, Job)> {
        let mut input = self.input.lock();
        loop {
            if input.ended.is_some() {
                return None;
            }
            let request: Request = match read_frame(&mut input.reader, MAX_FRAME) {
                Ok(Some(request)) => request,
                Ok(None) => {
                    input.ended = Some(Ok(()));
                    return None;
                }
                Err(source) => {
                    input.ended = Some(Err(StartError::UnreadableFrame {
                        frame: input.frames + 2,
                        source,
                    }));
                    return None;
                }
            };
            input.frames += 1;
            let rid = request.rid;
            let op = match request.op {
                Some(Op::Push(push)) => {
                    if self.halt.run(|| self.service.push(push)).is_none() {
                        input.ended = Some(Ok(()));
                        return None;
                    }
                    continue;
                }
                Some(Op::Negotiate(_)) => {
                    self.answers.send(rid, negotiate_again());
                    continue;
                }
                Some(Op::Create(create)) => {
                    SandboxOp::Create(Box::new(create.manifest.unwrap_or_default()))
                }
                Some(Op::Collect(collect)) => SandboxOp::Collect {
                    exec_root: collect.exec_root,
                },
                Some(Op::Destroy(_)) => SandboxOp::Destroy,
                None => {
                    log::error!(
                        "request {rid} names no operation this backend knows; it gets no answer"
                    );
                    continue;
                }
            };
            let lane = worker_for(&request.sandbox_id, self.lanes.len());
            let job = Job {
                rid,
                id: request.sandbox_id,
                op,
            };
            let mut state = self.lanes[lane].lock();
            if state.busy {
                // Its thread applies it after the ones before it.
                state.waiting.push_back(job);
                continue;
            }
            state.busy = true;
            return Some((lane, job));
        }
    }

    /// Applies `job`, then whatever of lane `lane` came meanwhile, in
    /// order; leaves the lane idle.
    fn apply_lane(&self, lane: usize, mut job: Job) {
        loop {
            let rid = job.rid;
            // Once halted, nothing more is applied or answered.
            if let Some(answer) = self.halt.run(|| apply(self.service, job)) {
                self.answers.send(rid, answer);
            }
            let mut state = self.lanes[lane].lock();
            match state.waiting.pop_front() {
                Some(next) => job = next,
                None => {
                    state.busy = false;
                    return;
                }
            }
        }
    }
}

/// The answer to a Negotiate after the first.
fn negotiate_again() -> response::Result {
    response::Result::Negotiate(negotiate::Result {
        outcome: Some(negotiate::result::Outcome::Error(
            actionfs_protocol::backend::sandbox::Error {
                message: "Negotiate was already answered; send it once, first".to_owned(),
            },
        )),
    })
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
