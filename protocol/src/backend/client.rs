//! Driving a sandbox backend from Rust, as Bazel does: for test suites and
//! replay tools.
//!
//! A [`Client`] mints each request's `rid` (1, 2, ...), writes the request
//! whole under a lock, and lets a reader thread hand each response to the
//! caller waiting for its `rid`, so any number of threads can have requests
//! in flight at once and answers may come in any order. When the backend's
//! output ends or breaks, every caller still waiting, and every later one,
//! gets the reason.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::frame::{read_frame, write_frame, FrameError, MAX_FRAME};
use super::sandbox::{self, request::Op, response, Request, Response};

/// Why a request got no usable answer.
#[derive(Debug)]
pub enum ClientError {
    /// Writing to the backend, or waiting for it, failed.
    Io(io::Error),
    /// The backend's output is not a stream of framed responses.
    Frame(FrameError),
    /// The backend's output ended before the answer came.
    Closed,
    /// The answer is not of the request's kind (say, a Destroy result for a
    /// Create), or has no result at all.
    WrongAnswer,
    /// The backend answered a `rid` that no request is waiting for; the
    /// client stops reading, as it can no longer trust the answers.
    UnknownRid(u64),
    /// [`Client::send`] was given a Push, which gets no answer: use
    /// [`Client::push`].
    NoAnswer,
}

impl ClientError {
    /// The same error, for another caller (an `io::Error` keeps its kind
    /// and message only).
    fn duplicate(&self) -> ClientError {
        match self {
            ClientError::Io(err) => ClientError::Io(copy_io(err)),
            ClientError::Frame(err) => ClientError::Frame(match err {
                FrameError::BadVarint => FrameError::BadVarint,
                FrameError::TooLong { len, max } => FrameError::TooLong {
                    len: *len,
                    max: *max,
                },
                FrameError::Truncated { expected, got } => FrameError::Truncated {
                    expected: *expected,
                    got: *got,
                },
                FrameError::Decode(err) => FrameError::Decode(err.clone()),
                FrameError::Io(err) => FrameError::Io(copy_io(err)),
            }),
            ClientError::Closed => ClientError::Closed,
            ClientError::WrongAnswer => ClientError::WrongAnswer,
            ClientError::UnknownRid(rid) => ClientError::UnknownRid(*rid),
            ClientError::NoAnswer => ClientError::NoAnswer,
        }
    }
}

fn copy_io(err: &io::Error) -> io::Error {
    io::Error::new(err.kind(), err.to_string())
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(err) => write!(f, "talking to the backend: {err}"),
            ClientError::Frame(err) => write!(f, "backend output: {err}"),
            ClientError::Closed => write!(f, "the backend closed its output before answering"),
            ClientError::WrongAnswer => {
                write!(f, "the backend's answer does not match the request's op")
            }
            ClientError::UnknownRid(rid) => {
                write!(
                    f,
                    "the backend answered rid {rid}, which no request is waiting for"
                )
            }
            ClientError::NoAnswer => write!(f, "a push gets no answer: use Client::push"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Io(err) => Some(err),
            ClientError::Frame(err) => Some(err),
            _ => None,
        }
    }
}

impl From<io::Error> for ClientError {
    fn from(err: io::Error) -> Self {
        ClientError::Io(err)
    }
}

impl From<FrameError> for ClientError {
    fn from(err: FrameError) -> Self {
        ClientError::Frame(err)
    }
}

/// What a caller of [`Client::send`] receives: the response to its request,
/// or why there will be none.
pub type Answer = Result<Response, ClientError>;

#[derive(Default)]
struct Shared {
    /// Requests sent and not yet answered.
    waiters: HashMap<u64, Sender<Answer>>,
    /// Why the reader stopped, once it has.
    ended: Option<ClientError>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic elsewhere leaves the map consistent: each change is one call.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A connection to a backend; see the module doc.
pub struct Client {
    input: Mutex<Option<Box<dyn Write + Send>>>,
    shared: Arc<Mutex<Shared>>,
    next_rid: AtomicU64,
    reader: Option<JoinHandle<()>>,
    child: Option<Child>,
}

impl Client {
    /// Starts `cmd` (such as `actionfs serve --workspace WS`) with piped
    /// stdin and stdout; its stderr is left as the caller set it (inherited
    /// by default).
    pub fn spawn(mut cmd: Command) -> io::Result<Client> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let input = child.stdin.take().expect("stdin was piped");
        let output = child.stdout.take().expect("stdout was piped");
        let mut client = Client::new(Box::new(input), Box::new(output));
        client.child = Some(child);
        Ok(client)
    }

    /// Talks to a backend over `input` (its requests) and `output` (its
    /// responses), with no child process: for backends in the same process.
    pub fn new(input: Box<dyn Write + Send>, output: Box<dyn Read + Send>) -> Client {
        let shared = Arc::<Mutex<Shared>>::default();
        let reader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("backend-responses".into())
                .spawn(move || route_responses(output, &shared))
                .expect("spawning the response reader")
        };
        Client {
            input: Mutex::new(Some(input)),
            shared,
            next_rid: AtomicU64::new(1),
            reader: Some(reader),
            child: None,
        }
    }

    /// The backend's process id, if [`Client::spawn`] started it.
    pub fn child_id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends a request for `op` and returns where its answer will arrive,
    /// without waiting: for tests that keep several requests in flight.
    /// The answer is not checked against the op. A Push is refused
    /// ([`ClientError::NoAnswer`]): send it with [`Client::push`].
    pub fn send(&self, sandbox_id: &str, op: Op) -> Result<Receiver<Answer>, ClientError> {
        if matches!(op, Op::Push(_)) {
            return Err(ClientError::NoAnswer);
        }
        let rid = self.next_rid.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        {
            let mut shared = lock(&self.shared);
            if let Some(why) = &shared.ended {
                return Err(why.duplicate());
            }
            // Before writing, so that the reader finds it however fast the
            // answer comes.
            shared.waiters.insert(rid, tx);
        }
        let request = Request {
            rid,
            sandbox_id: sandbox_id.to_owned(),
            op: Some(op),
        };
        if let Err(err) = self.write(&request) {
            lock(&self.shared).waiters.remove(&rid);
            return Err(err);
        }
        Ok(rx)
    }

    /// Sends a request and waits for its answer.
    fn call(&self, sandbox_id: &str, op: Op) -> Result<response::Result, ClientError> {
        let rx = self.send(sandbox_id, op)?;
        // The reader answers every waiter before it lets go of the map, so
        // a hang-up without an answer cannot happen; take it as an end.
        let response = rx.recv().map_err(|_| ClientError::Closed)??;
        response.result.ok_or(ClientError::WrongAnswer)
    }

    /// Negotiates the protocol version (offering `VERSION_1`) and hands the
    /// backend its options. Bazel sends this first.
    pub fn negotiate(
        &self,
        options: Vec<String>,
    ) -> Result<sandbox::negotiate::Result, ClientError> {
        let op = Op::Negotiate(sandbox::Negotiate {
            options,
            versions: vec![sandbox::Version::Version1 as i32],
        });
        match self.call("", op)? {
            response::Result::Negotiate(result) => Ok(result),
            _ => Err(ClientError::WrongAnswer),
        }
    }

    /// Sends blobs and content to the backend's store. There is no answer:
    /// this returns once the request is written.
    pub fn push(&self, push: sandbox::Push) -> Result<(), ClientError> {
        if let Some(why) = &lock(&self.shared).ended {
            return Err(why.duplicate());
        }
        let rid = self.next_rid.fetch_add(1, Ordering::Relaxed);
        self.write(&Request {
            rid,
            sandbox_id: String::new(),
            op: Some(Op::Push(push)),
        })
    }

    /// Creates sandbox `sandbox_id` from `manifest`.
    pub fn create(
        &self,
        sandbox_id: &str,
        manifest: sandbox::Manifest,
    ) -> Result<sandbox::create::Result, ClientError> {
        let op = Op::Create(sandbox::Create {
            manifest: Some(manifest),
        });
        match self.call(sandbox_id, op)? {
            response::Result::Create(result) => Ok(result),
            _ => Err(ClientError::WrongAnswer),
        }
    }

    /// Moves the declared outputs of sandbox `sandbox_id` under `exec_root`.
    pub fn collect(
        &self,
        sandbox_id: &str,
        exec_root: &str,
    ) -> Result<sandbox::collect::Result, ClientError> {
        let op = Op::Collect(sandbox::Collect {
            exec_root: exec_root.to_owned(),
        });
        match self.call(sandbox_id, op)? {
            response::Result::Collect(result) => Ok(result),
            _ => Err(ClientError::WrongAnswer),
        }
    }

    /// Destroys sandbox `sandbox_id`.
    pub fn destroy(&self, sandbox_id: &str) -> Result<sandbox::destroy::Result, ClientError> {
        match self.call(sandbox_id, Op::Destroy(sandbox::Destroy {}))? {
            response::Result::Destroy(result) => Ok(result),
            _ => Err(ClientError::WrongAnswer),
        }
    }

    /// Closes the backend's input, as Bazel does at the end, and waits for
    /// its output to end and (if [`Client::spawn`] started it) for it to
    /// exit. Returns its exit status; an error if the output broke the
    /// protocol (a bad frame, an unknown rid) at any point.
    pub fn close(mut self) -> Result<Option<ExitStatus>, ClientError> {
        lock_input(&self.input).take();
        if let Some(reader) = self.reader.take() {
            // The reader does not panic; if it did, the waiters already
            // have their answers, and the status below still matters.
            let _ = reader.join();
        }
        let status = match self.child.take() {
            Some(mut child) => Some(child.wait()?),
            None => None,
        };
        match &lock(&self.shared).ended {
            None | Some(ClientError::Closed) => Ok(status),
            Some(why) => Err(why.duplicate()),
        }
    }

    fn write(&self, request: &Request) -> Result<(), ClientError> {
        let mut input = lock_input(&self.input);
        let input = input.as_mut().ok_or(ClientError::Closed)?;
        write_frame(input, request)?;
        input.flush()?;
        Ok(())
    }
}

fn lock_input(
    input: &Mutex<Option<Box<dyn Write + Send>>>,
) -> MutexGuard<'_, Option<Box<dyn Write + Send>>> {
    input
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for Client {
    /// A client dropped without [`Client::close`] closes the backend's
    /// input and kills the child it started; it does not wait for the
    /// output to end.
    fn drop(&mut self) {
        lock_input(&self.input).take();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The reader thread: hands each response to its waiter until the output
/// ends or breaks, then tells every waiter why, and drains what is left so
/// that the backend never blocks on a full pipe.
fn route_responses(output: Box<dyn Read + Send>, shared: &Mutex<Shared>) {
    let mut output = BufReader::new(output);
    let why = loop {
        match read_frame::<Response>(&mut output, MAX_FRAME) {
            Ok(Some(response)) => {
                let waiter = lock(shared).waiters.remove(&response.rid);
                match waiter {
                    // The caller may have stopped waiting; that is its call.
                    Some(tx) => drop(tx.send(Ok(response))),
                    None => break ClientError::UnknownRid(response.rid),
                }
            }
            Ok(None) => break ClientError::Closed,
            Err(err) => break ClientError::Frame(err),
        }
    };
    {
        let mut shared = lock(shared);
        for (_, tx) in shared.waiters.drain() {
            let _ = tx.send(Err(why.duplicate()));
        }
        shared.ended = Some(why);
    }
    let _ = io::copy(&mut output, &mut io::sink());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sandbox::{collect, create, destroy, negotiate};
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::Duration;

    const PATIENCE: Duration = Duration::from_secs(10);

    /// What the fake backend answers to a request, if anything.
    type Answerer = Box<dyn Fn(&Request) -> Option<Response> + Send>;

    /// A backend in a thread, on two socket pairs. It holds back its
    /// answers until it has `batch` of them and then writes them newest
    /// first (at the end of its input, whatever it holds). It returns the
    /// requests it read.
    fn fake(batch: usize, answer: Answerer) -> (Client, JoinHandle<Vec<Request>>) {
        let (client_in, backend_in) = UnixStream::pair().unwrap();
        let (backend_out, client_out) = UnixStream::pair().unwrap();
        let backend = std::thread::spawn(move || {
            let mut input = BufReader::new(backend_in);
            let mut output = backend_out;
            let mut seen = Vec::new();
            let mut held = Vec::new();
            let mut flush = |held: &mut Vec<Response>| {
                for response in held.drain(..).rev() {
                    write_frame(&mut output, &response).unwrap();
                }
            };
            while let Some(request) = read_frame::<Request>(&mut input, MAX_FRAME).unwrap() {
                if let Some(response) = answer(&request) {
                    held.push(response);
                }
                seen.push(request);
                if held.len() >= batch {
                    flush(&mut held);
                }
            }
            flush(&mut held);
            seen
        });
        (
            Client::new(Box::new(client_in), Box::new(client_out)),
            backend,
        )
    }

    /// Answers each op with success, a Create with path /sandbox/ID.
    fn well_behaved(request: &Request) -> Option<Response> {
        let result = match request.op.as_ref()? {
            Op::Push(_) => return None,
            Op::Negotiate(_) => response::Result::Negotiate(negotiate::Result {
                outcome: Some(negotiate::result::Outcome::Ok(negotiate::result::Ok {
                    version: sandbox::Version::Version1 as i32,
                })),
            }),
            Op::Create(_) => response::Result::Create(create::Result {
                outcome: Some(create::result::Outcome::Ok(create::result::Ok {
                    path: format!("/sandbox/{}", request.sandbox_id),
                    confinement: None,
                })),
            }),
            Op::Collect(_) => response::Result::Collect(collect::Result {
                outcome: Some(collect::result::Outcome::Ok(collect::result::Ok {})),
            }),
            Op::Destroy(_) => response::Result::Destroy(destroy::Result {
                outcome: Some(destroy::result::Outcome::Ok(destroy::result::Ok {})),
            }),
        };
        Some(Response {
            rid: request.rid,
            result: Some(result),
        })
    }

    fn created_path(result: &create::Result) -> &str {
        match &result.outcome {
            Some(create::result::Outcome::Ok(ok)) => &ok.path,
            other => panic!("not created: {other:?}"),
        }
    }

    fn create_op() -> Op {
        Op::Create(sandbox::Create {
            manifest: Some(sandbox::Manifest::default()),
        })
    }

    #[test]
    fn client_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Client>();
        check::<ClientError>();
    }

    #[test]
    fn typed_calls_round_trip() {
        let (client, backend) = fake(1, Box::new(well_behaved));
        let negotiated = client.negotiate(vec!["x=1".into(), "y".into()]).unwrap();
        assert_eq!(
            negotiated.outcome,
            Some(negotiate::result::Outcome::Ok(negotiate::result::Ok {
                version: 0
            }))
        );
        let push = sandbox::Push {
            blobs: [("h".to_string(), vec![1, 2, 3])].into(),
            content: HashMap::new(),
        };
        client.push(push.clone()).unwrap();
        let manifest = sandbox::Manifest {
            mnemonic: "Javac".into(),
            ..Default::default()
        };
        let created = client.create("s1", manifest.clone()).unwrap();
        assert_eq!(created_path(&created), "/sandbox/s1");
        assert!(matches!(
            client.collect("s1", "/exec").unwrap().outcome,
            Some(collect::result::Outcome::Ok(_))
        ));
        assert!(matches!(
            client.destroy("s1").unwrap().outcome,
            Some(destroy::result::Outcome::Ok(_))
        ));
        assert_eq!(client.close().unwrap(), None);

        let seen = backend.join().unwrap();
        let rids: Vec<u64> = seen.iter().map(|r| r.rid).collect();
        assert_eq!(rids, [1, 2, 3, 4, 5]);
        let ids: Vec<&str> = seen.iter().map(|r| &*r.sandbox_id).collect();
        assert_eq!(ids, ["", "", "s1", "s1", "s1"]);
        assert_eq!(
            seen[0].op,
            Some(Op::Negotiate(sandbox::Negotiate {
                options: vec!["x=1".into(), "y".into()],
                versions: vec![0],
            }))
        );
        assert_eq!(seen[1].op, Some(Op::Push(push)));
        assert_eq!(
            seen[2].op,
            Some(Op::Create(sandbox::Create {
                manifest: Some(manifest)
            }))
        );
        assert_eq!(
            seen[3].op,
            Some(Op::Collect(sandbox::Collect {
                exec_root: "/exec".into()
            }))
        );
        assert_eq!(seen[4].op, Some(Op::Destroy(sandbox::Destroy {})));
    }

    #[test]
    fn answers_out_of_order_reach_their_callers() {
        let (client, backend) = fake(3, Box::new(well_behaved));
        let a = client.send("a", create_op()).unwrap();
        let b = client.send("b", create_op()).unwrap();
        // Nothing comes back before the third request.
        assert_eq!(
            a.recv_timeout(Duration::from_millis(50)).unwrap_err(),
            RecvTimeoutError::Timeout
        );
        let c = client.send("c", create_op()).unwrap();
        for (rx, id, rid) in [(c, "c", 3), (a, "a", 1), (b, "b", 2)] {
            let response = rx.recv_timeout(PATIENCE).unwrap().unwrap();
            assert_eq!(response.rid, rid);
            match response.result {
                Some(response::Result::Create(result)) => {
                    assert_eq!(created_path(&result), format!("/sandbox/{id}"))
                }
                other => panic!("{other:?}"),
            }
        }
        client.close().unwrap();
        assert_eq!(backend.join().unwrap().len(), 3);
    }

    #[test]
    fn many_threads_share_one_client() {
        let (client, backend) = fake(1, Box::new(well_behaved));
        std::thread::scope(|scope| {
            for t in 0..4 {
                let client = &client;
                scope.spawn(move || {
                    for i in 0..25 {
                        let id = format!("t{t}-{i}");
                        let created = client.create(&id, Default::default()).unwrap();
                        assert_eq!(created_path(&created), format!("/sandbox/{id}"));
                        client.destroy(&id).unwrap();
                    }
                });
            }
        });
        client.close().unwrap();
        let mut rids: Vec<u64> = backend.join().unwrap().iter().map(|r| r.rid).collect();
        rids.sort_unstable();
        assert_eq!(rids, (1..=200).collect::<Vec<_>>());
    }

    #[test]
    fn mismatched_answers_are_wrong() {
        // Every request gets a Destroy result, or none at all for sandbox
        // "empty".
        let (client, _backend) = fake(
            1,
            Box::new(|request: &Request| {
                let result = (request.sandbox_id != "empty")
                    .then(|| response::Result::Destroy(destroy::Result::default()));
                Some(Response {
                    rid: request.rid,
                    result,
                })
            }),
        );
        assert!(matches!(
            client.create("s", Default::default()),
            Err(ClientError::WrongAnswer)
        ));
        assert!(matches!(
            client.negotiate(vec![]),
            Err(ClientError::WrongAnswer)
        ));
        assert!(matches!(
            client.collect("s", "/e"),
            Err(ClientError::WrongAnswer)
        ));
        assert!(client.destroy("s").is_ok());
        assert!(matches!(
            client.destroy("empty"),
            Err(ClientError::WrongAnswer)
        ));
        // Wrong answers do not break the connection.
        assert!(client.close().is_ok());
    }

    #[test]
    fn backend_that_quits_closes_every_caller() {
        let (client_in, backend_in) = UnixStream::pair().unwrap();
        let (backend_out, client_out) = UnixStream::pair().unwrap();
        // Reads two requests, then quits without answering.
        let backend = std::thread::spawn(move || {
            let mut input = BufReader::new(backend_in);
            for _ in 0..2 {
                read_frame::<Request>(&mut input, MAX_FRAME)
                    .unwrap()
                    .unwrap();
            }
            drop(backend_out);
        });
        let client = Client::new(Box::new(client_in), Box::new(client_out));
        let first = client.send("a", create_op()).unwrap();
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| client.destroy("b"));
            assert!(matches!(waiting.join().unwrap(), Err(ClientError::Closed)));
        });
        assert!(matches!(
            first.recv_timeout(PATIENCE).unwrap(),
            Err(ClientError::Closed)
        ));
        backend.join().unwrap();
        // Later requests are refused at once.
        assert!(matches!(client.destroy("c"), Err(ClientError::Closed)));
        assert!(matches!(
            client.push(Default::default()),
            Err(ClientError::Closed)
        ));
        // A clean end is no error for close.
        assert_eq!(client.close().unwrap(), None);
    }

    #[test]
    fn unknown_rid_stops_the_client() {
        let (client, _backend) = fake(
            1,
            Box::new(|request: &Request| {
                let mut response = well_behaved(request)?;
                response.rid += 1000;
                Some(response)
            }),
        );
        let err = client.destroy("s").unwrap_err();
        assert!(matches!(err, ClientError::UnknownRid(1001)), "{err}");
        assert!(matches!(
            client.destroy("s"),
            Err(ClientError::UnknownRid(1001))
        ));
        assert!(matches!(client.close(), Err(ClientError::UnknownRid(1001))));
    }

    #[test]
    fn broken_output_is_a_frame_error() {
        let (client_in, _backend_in) = UnixStream::pair().unwrap();
        let (mut backend_out, client_out) = UnixStream::pair().unwrap();
        let client = Client::new(Box::new(client_in), Box::new(client_out));
        let rx = client.send("s", create_op()).unwrap();
        // A five-byte body of which two arrive.
        backend_out.write_all(&[5, 1, 2]).unwrap();
        drop(backend_out);
        match rx.recv_timeout(PATIENCE).unwrap() {
            Err(ClientError::Frame(FrameError::Truncated {
                expected: 5,
                got: 2,
            })) => {}
            other => panic!("{other:?}"),
        }
        let err = client.close().unwrap_err();
        assert_eq!(
            err.to_string(),
            "backend output: input ended inside a frame: expected 5 bytes, got 2"
        );
    }

    #[test]
    fn send_refuses_a_push() {
        let (client, backend) = fake(1, Box::new(well_behaved));
        assert!(matches!(
            client.send("", Op::Push(Default::default())),
            Err(ClientError::NoAnswer)
        ));
        client.close().unwrap();
        assert!(backend.join().unwrap().is_empty());
    }

    #[test]
    fn spawned_backend_status_comes_back() {
        // Reads one byte of the request, then exits without answering.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "head -c 1 >/dev/null; exit 3"]);
        let client = Client::spawn(cmd).unwrap();
        assert!(client.child_id().is_some());
        assert!(matches!(client.negotiate(vec![]), Err(ClientError::Closed)));
        let status = client.close().unwrap().unwrap();
        assert_eq!(status.code(), Some(3));
    }
}
