//! A client that drives a daemon over its stdin and stdout, for test suites
//! and tools written in Rust.
//!
//! Several threads may call [`Client::create`] and [`Client::destroy`] at
//! once: requests are written whole under a lock, and a reader thread hands
//! each response to the caller waiting for its id.

use std::collections::HashMap;
use std::io::{self, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::codec::{encode_request, ResponseReader};
use crate::types::{CreateSandbox, Request, Response};

/// Why a request did not succeed.
#[derive(Debug)]
pub enum ClientError {
    /// The daemon answered with an error for this sandbox.
    Rejected(String),
    /// The daemon could not be reached, or stopped answering.
    Io(io::Error),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Rejected(message) => write!(f, "daemon rejected the request: {message}"),
            ClientError::Io(err) => write!(f, "daemon unreachable: {err}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(err: io::Error) -> Self {
        ClientError::Io(err)
    }
}

type Waiters = Arc<Mutex<HashMap<String, Sender<Response>>>>;

/// A running daemon.
pub struct Client {
    child: Child,
    stdin: Mutex<Option<ChildStdin>>,
    waiters: Waiters,
    /// Fatal answers (`"id": null`) and answers nobody waited for.
    unexpected: Arc<Mutex<Vec<Response>>>,
    reader: Option<JoinHandle<()>>,
}

impl Client {
    /// Starts `command` (a daemon binary with its flags and mount point),
    /// sends Bazel's start-up probe (sandbox `empty`) and waits for its
    /// answer, which means the mount is ready.
    pub fn start(mut command: Command) -> Result<Client, ClientError> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout was piped");
        let waiters: Waiters = Arc::default();
        let unexpected: Arc<Mutex<Vec<Response>>> = Arc::default();
        let reader = {
            let waiters = waiters.clone();
            let unexpected = unexpected.clone();
            std::thread::spawn(move || route_responses(stdout, waiters, unexpected))
        };
        let client = Client {
            child,
            stdin: Mutex::new(stdin),
            waiters,
            unexpected,
            reader: Some(reader),
        };
        client.create(&CreateSandbox {
            id: "empty".into(),
            ..Default::default()
        })?;
        Ok(client)
    }

    /// Creates a sandbox and waits for the daemon's answer.
    pub fn create(&self, create: &CreateSandbox) -> Result<(), ClientError> {
        self.call(&Request::Create(create.clone()))
    }

    /// Destroys a sandbox and waits for the daemon's answer.
    pub fn destroy(&self, id: &str) -> Result<(), ClientError> {
        self.call(&Request::Destroy(id.to_owned()))
    }

    /// Sends any request and waits for the answer to its id.
    pub fn call(&self, request: &Request) -> Result<(), ClientError> {
        let response = self.call_raw(request.id(), encode_request(request).as_bytes())?;
        match response.error {
            None => Ok(()),
            Some(message) => Err(ClientError::Rejected(message)),
        }
    }

    /// Writes raw bytes (which must end a request for `id`) and waits for
    /// the answer to `id`. For tests that send malformed input.
    pub fn call_raw(&self, id: &str, bytes: &[u8]) -> Result<Response, ClientError> {
        let (tx, rx) = channel();
        self.waiters.lock().unwrap().insert(id.to_owned(), tx);
        if let Err(err) = self.write_raw(bytes) {
            self.waiters.lock().unwrap().remove(id);
            return Err(err.into());
        }
        rx.recv().map_err(|_| {
            ClientError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the daemon closed its output before answering {id:?}"),
            ))
        })
    }

    /// Writes raw bytes and waits up to `limit` for the answers to each of
    /// `ids`, in that order; a missing answer is an error, so a test of a
    /// daemon that stops answering fails instead of hanging.
    pub fn call_raw_within(
        &self,
        ids: &[&str],
        bytes: &[u8],
        limit: std::time::Duration,
    ) -> Result<Vec<Response>, ClientError> {
        let receivers: Vec<_> = ids
            .iter()
            .map(|id| {
                let (tx, rx) = channel();
                self.waiters.lock().unwrap().insert((*id).to_owned(), tx);
                rx
            })
            .collect();
        let forget = || {
            let mut waiters = self.waiters.lock().unwrap();
            for id in ids {
                waiters.remove(*id);
            }
        };
        if let Err(err) = self.write_raw(bytes) {
            forget();
            return Err(err.into());
        }
        let deadline = std::time::Instant::now() + limit;
        let mut answers = Vec::with_capacity(ids.len());
        for (id, rx) in ids.iter().zip(receivers) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(answer) => answers.push(answer),
                Err(_) => {
                    forget();
                    return Err(ClientError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no answer for {id:?} within {limit:?}"),
                    )));
                }
            }
        }
        Ok(answers)
    }

    /// Writes raw bytes to the daemon's input without waiting for anything.
    pub fn write_raw(&self, bytes: &[u8]) -> io::Result<()> {
        let mut stdin = self.stdin.lock().unwrap();
        let stdin = stdin
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "input already closed"))?;
        stdin.write_all(bytes)?;
        stdin.flush()
    }

    /// Closes the daemon's input, as Bazel does at the end of a build.
    pub fn close_input(&self) {
        self.stdin.lock().unwrap().take();
    }

    /// Answers that matched no waiting request, fatal ones included.
    pub fn unexpected_responses(&self) -> Vec<Response> {
        self.unexpected.lock().unwrap().clone()
    }

    /// Process id of the daemon.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal to the daemon.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: kill(2) with a pid we own and a plain signal number.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Does what Bazel does at the end of a build: close stdin, send SIGTERM
    /// and wait for the daemon to exit.
    pub fn terminate(mut self) -> io::Result<ExitStatus> {
        self.close_input();
        self.signal(libc::SIGTERM)?;
        self.wait()
    }

    /// Waits up to `limit` for the daemon to exit; `None` if it is still
    /// running then.
    pub fn wait_timeout(&mut self, limit: std::time::Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if self.child.try_wait()?.is_some() {
                return self.wait().map(Some);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Waits for the daemon to exit.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait()?;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Ok(status)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.wait();
        }
    }
}

fn route_responses(
    stdout: std::process::ChildStdout,
    waiters: Waiters,
    unexpected: Arc<Mutex<Vec<Response>>>,
) {
    for response in ResponseReader::new(BufReader::new(stdout)) {
        let Ok(response) = response else { break };
        let waiter = response
            .id
            .as_ref()
            .and_then(|id| waiters.lock().unwrap().remove(id));
        match waiter {
            Some(tx) => {
                let _ = tx.send(response);
            }
            None => unexpected.lock().unwrap().push(response),
        }
    }
    // Output closed: wake every caller still waiting.
    waiters.lock().unwrap().clear();
}
