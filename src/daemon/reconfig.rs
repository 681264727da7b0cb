//! Applying the request stream to the sandboxes.
//!
//! One reader decodes requests in order and resolves their prefixes (prefix
//! registration must follow stream order, since later requests use earlier
//! prefixes). It then hands each request to a worker chosen by hashing the
//! sandbox id: requests for one id run in order on one worker, requests for
//! different ids run in parallel, and each is answered as soon as it is done.
//!
//! What a request does is the [`Backend`]'s business (the daemon's is
//! `hybrid::Sandboxes`), so the loop is tested here with a stand-in. Every
//! request gets exactly one answer, even when the backend panics: a client
//! such as Bazel waits for it with no timeout.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{self, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use actionfs_protocol::{
    decode_in_place, Decoded, InPlace, PrefixTable, Request, RequestReader, Response,
    ResponseWriter, Typed,
};
use parking_lot::Mutex;

use crate::daemon::record::Recording;
use crate::sandbox::backend::Backend;
use crate::sandbox::layout::Draft;
use crate::stats::{RequestKind, Stats};

/// Where answers go. If the reader of our output goes away (EPIPE), answers
/// are dropped from then on and the file system keeps serving.
pub struct ResponseSink {
    writer: Mutex<Option<ResponseWriter<Box<dyn Write + Send>>>>,
    recording: Option<Recording>,
}

impl ResponseSink {
    pub fn new(output: Box<dyn Write + Send>) -> ResponseSink {
        ResponseSink {
            writer: Mutex::new(Some(ResponseWriter::new(output))),
            recording: None,
        }
    }

    /// A sink that also records the stream: requests read through
    /// [`serve`] and the answers sent here.
    pub fn recorded(output: Box<dyn Write + Send>, recording: Recording) -> ResponseSink {
        ResponseSink {
            recording: Some(recording),
            ..ResponseSink::new(output)
        }
    }

    pub fn send(&self, response: &Response) {
        if let Some(recording) = &self.recording {
            recording.answer(response);
        }
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

/// A request ready to apply: prefixes resolved, paths validated, the
/// layout drafted.
pub(crate) enum Job {
    Create { id: String, draft: Box<Draft> },
    Destroy { id: String },
}

impl Job {
    fn id(&self) -> &str {
        match self {
            Job::Create { id, .. } | Job::Destroy { id } => id,
        }
    }
}

/// Reads and applies requests from `input` until it ends or cannot be
/// read on (see `RequestReader`); a broken request is answered and
/// skipped. Returns once every request read has been answered. Fails
/// only if the workers cannot be started.
pub fn serve<R: Read>(
    input: R,
    backend: Arc<dyn Backend>,
    sink: Arc<ResponseSink>,
    workers: usize,
    stats: Arc<Stats>,
) -> io::Result<()> {
    let (queues, handles) = start_workers(workers.max(1), &backend, &sink, &stats)?;
    let mut prefixes = PrefixTable::new();
    let mut reader = RequestReader::new(input);
    while let Some(item) = reader.next_with(|bytes| read_in_place(bytes, &sink, &mut prefixes)) {
        let incoming = match item {
            Ok(Typed::Fast(incoming)) => incoming,
            Ok(Typed::Reference(decoded)) => read_decoded(decoded, &sink, &mut prefixes),
            Err(fatal) => {
                log::error!("{fatal}; no more requests will be read, the mount stays up");
                sink.send(&Response::fatal(fatal.message));
                break;
            }
        };
        let job = match incoming {
            Incoming::Job(job) => job,
            Incoming::Refused(response) => {
                log::warn!("{}", response.error.as_deref().unwrap_or_default());
                sink.send(&response);
                continue;
            }
        };
        let queue = &queues[worker_for(job.id(), queues.len())];
        if let Err(lost) = queue.send(job) {
            // Workers catch panics, so this is unreachable in practice;
            // the request still gets its answer.
            let id = lost.0.id().to_owned();
            log::error!("reconfiguration worker for sandbox {id:?} is gone");
            sink.send(&Response::error(id, "internal error: worker gone"));
        }
    }
    drop(queues);
    for handle in handles {
        let _ = handle.join();
    }
    Ok(())
}

/// What one request read from the stream comes to.
enum Incoming {
    Job(Job),
    /// Answered at once, without reaching the backend.
    Refused(Response),
}

/// Decodes one request's bytes in place (a create drafted as its mappings
/// are read); `None` leaves it to the reference decoder: what this path
/// does not take, and every request while recording (which writes
/// requests as decoded).
fn read_in_place(
    bytes: &[u8],
    sink: &ResponseSink,
    prefixes: &mut PrefixTable,
) -> Option<Incoming> {
    if sink.recording.is_some() {
        return None;
    }
    match decode_in_place(bytes, prefixes, |id| Draft::new(Some(id))) {
        InPlace::Create { id, sink: draft } => Some(Incoming::Job(Job::Create {
            id: id.into_owned(),
            draft: Box::new(draft),
        })),
        InPlace::Destroy(id) => Some(Incoming::Job(Job::Destroy {
            id: id.into_owned(),
        })),
        InPlace::Refused { id, message } => Some(Incoming::Refused(Response::error(id, message))),
        InPlace::Fallback => None,
    }
}

/// A request as the reference decoder typed it.
fn read_decoded(decoded: Decoded, sink: &ResponseSink, prefixes: &mut PrefixTable) -> Incoming {
    match decoded {
        Decoded::Request(request) => {
            if let Some(recording) = &sink.recording {
                recording.request(&request);
            }
            match prepare(prefixes, request) {
                Ok(job) => Incoming::Job(job),
                Err((id, message)) => Incoming::Refused(Response::error(id, message)),
            }
        }
        Decoded::Invalid {
            id: Some(id),
            message,
        } => {
            let message = format!("sandbox {id:?}: {message}");
            Incoming::Refused(Response::error(id, message))
        }
        Decoded::Invalid { id: None, message } => Incoming::Refused(Response::unnamed(message)),
    }
}

/// Registers the request's prefixes and resolves its mappings.
pub(crate) fn prepare(
    prefixes: &mut PrefixTable,
    request: Request,
) -> Result<Job, (String, String)> {
    match request {
        Request::Destroy(id) => Ok(Job::Destroy { id }),
        // Prefixes stay registered even if the sandbox later fails: the
        // client considers them sent and will use them again.
        Request::Create(create) => match prefixes.resolve_create(&create) {
            Ok(mappings) => Ok(Job::Create {
                draft: Box::new(Draft::of(&mappings, Some(&create.id))),
                id: create.id,
            }),
            Err(err) => {
                let message = format!("sandbox {:?}: {err}", create.id);
                Err((create.id, message))
            }
        },
    }
}

/// The worker that applies every request for sandbox `id`.
pub(crate) fn worker_for(id: &str, workers: usize) -> usize {
    let mut hasher = DefaultHasher::new();
    id.hash(&mut hasher);
    (hasher.finish() % workers as u64) as usize
}

type Workers = (Vec<Sender<Job>>, Vec<JoinHandle<()>>);

fn start_workers(
    count: usize,
    backend: &Arc<dyn Backend>,
    sink: &Arc<ResponseSink>,
    stats: &Arc<Stats>,
) -> io::Result<Workers> {
    let mut queues = Vec::with_capacity(count);
    let mut handles = Vec::with_capacity(count);
    for n in 0..count {
        let (tx, rx) = channel::<Job>();
        let backend = backend.clone();
        let sink = sink.clone();
        let stats = stats.clone();
        let handle = std::thread::Builder::new()
            .name(format!("reconfig-{n}"))
            .spawn(move || {
                for job in rx {
                    sink.send(&apply(&*backend, job, &stats));
                }
            })?;
        queues.push(tx);
        handles.push(handle);
    }
    Ok((queues, handles))
}

/// Applies one job and builds its answer. A panic in the backend is a bug;
/// it is answered as an internal error and logged, and serving goes on.
pub(crate) fn apply(backend: &dyn Backend, job: Job, stats: &Stats) -> Response {
    let started = Instant::now();
    let id = job.id().to_owned();
    let kind = match job {
        Job::Create { .. } => RequestKind::Create,
        Job::Destroy { .. } => RequestKind::Destroy,
    };
    let outcome = catch_unwind(AssertUnwindSafe(move || match job {
        Job::Create { id, draft } => {
            let count = draft.mapping_count();
            backend
                .create(&id, *draft)
                .map(|how| format!("{how} create with {count} mappings"))
        }
        Job::Destroy { id } => backend.destroy(&id).map(|()| "destroy".to_owned()),
    }));
    stats.request(kind, started.elapsed(), matches!(outcome, Ok(Ok(_))));
    match outcome {
        Ok(Ok(what)) => {
            log::debug!("sandbox {id:?}: {what} took {:?}", started.elapsed());
            Response::ok(id)
        }
        Ok(Err(refusal)) => {
            let message = refusal.to_string();
            log::warn!("{message}");
            Response::error(id, message)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            log::error!("sandbox {id:?}: internal error (a bug): {what}; still serving");
            Response::error(
                id.clone(),
                format!("sandbox {id:?}: internal error: {what}"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::backend::Refusal;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Condvar;

    /// A stand-in backend that records what it was asked, in order per id,
    /// and fails or panics on request.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<(String, String, Vec<String>)>>,
        threads: Mutex<std::collections::HashMap<String, String>>,
        /// `create` of this id blocks until released.
        hold: Mutex<Option<String>>,
        released: (std::sync::Mutex<bool>, Condvar),
        creates: AtomicUsize,
    }

    impl Recorder {
        fn note(&self, what: &str, id: &str, mappings: Vec<String>) {
            let thread = std::thread::current().name().unwrap_or("").to_owned();
            let mut threads = self.threads.lock();
            let first = threads.entry(id.to_owned()).or_insert(thread.clone());
            assert_eq!(*first, thread, "requests for {id} ran on two workers");
            self.calls
                .lock()
                .push((what.to_owned(), id.to_owned(), mappings));
        }

        fn release(&self) {
            *self.released.0.lock().unwrap() = true;
            self.released.1.notify_all();
        }
    }

    impl Backend for Recorder {
        fn create(&self, id: &str, draft: Draft) -> Result<&'static str, Refusal> {
            self.creates.fetch_add(1, Ordering::SeqCst);
            if self.hold.lock().as_deref() == Some(id) {
                let mut released = self.released.0.lock().unwrap();
                while !*released {
                    released = self.released.1.wait(released).unwrap();
                }
            }
            let paths = draft
                .describe()
                .into_iter()
                .map(|(path, underlying, _)| format!("{path}={}", underlying.display()))
                .collect();
            self.note("create", id, paths);
            match id {
                "boom" => panic!("injected panic for {id}"),
                "bad" => Err("sandbox \"bad\": refused by the backend".into()),
                _ => Ok("test"),
            }
        }

        fn destroy(&self, id: &str) -> Result<(), Refusal> {
            self.note("destroy", id, Vec::new());
            Ok(())
        }
    }

    /// Runs `input` through the loop with `workers` workers; returns the
    /// answers as (id, error) pairs in the order written.
    fn run(
        backend: Arc<Recorder>,
        input: &str,
        workers: usize,
    ) -> Vec<(Option<String>, Option<String>)> {
        let output = SharedBuf::default();
        let sink = Arc::new(ResponseSink::new(Box::new(output.clone())));
        let stats = Arc::new(Stats::default());
        serve(input.as_bytes(), backend, sink, workers, stats.clone()).unwrap();
        let counted = stats.to_json(serde_json::Value::Null)["requests"].clone();
        let answered = text_lines(&output);
        let counted = counted["create"]["count"].as_u64().unwrap()
            + counted["destroy"]["count"].as_u64().unwrap();
        assert!(
            counted as usize <= answered,
            "every request counted is answered"
        );
        let text = String::from_utf8(output.0.lock().clone()).unwrap();
        text.lines()
            .map(|line| {
                let r: Response = serde_json::from_str(line).unwrap();
                (r.id, r.error)
            })
            .collect()
    }

    fn text_lines(output: &SharedBuf) -> usize {
        String::from_utf8(output.0.lock().clone())
            .unwrap()
            .lines()
            .count()
    }

    #[derive(Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn prefixes_resolve_in_stream_order_and_persist_after_a_failure() {
        let backend = Arc::new(Recorder::default());
        let input = concat!(
            r#"{"C":{"i":"a","m":[{"x":1,"p":"in","y":2,"u":"f"}],"q":{"1":"/ws","2":"/src"}}}"#,
            r#"{"C":{"i":"b","m":[{"x":9,"p":"x","u":"/u"}],"q":{"3":"/late"}}}"#,
            r#"{"C":{"i":"c","m":[{"x":3,"p":"y","y":2,"u":"g"}]}}"#,
        );
        let answers = run(backend.clone(), input, 2);
        assert_eq!(answers.len(), 3);
        let error_of = |id: &str| {
            answers
                .iter()
                .find(|(i, _)| i.as_deref() == Some(id))
                .unwrap()
                .1
                .clone()
        };
        assert_eq!(error_of("a"), None);
        let b = error_of("b").unwrap();
        assert!(b.contains("Prefix 9 does not exist"), "{b}");
        assert_eq!(error_of("c"), None, "prefix 3 came with the failed request");
        let calls = backend.calls.lock();
        let created: Vec<_> = calls
            .iter()
            .map(|(_, id, m)| (id.as_str(), m.clone()))
            .collect();
        assert!(created.contains(&("a", vec!["/ws/in=/src/f".to_owned()])));
        assert!(created.contains(&("c", vec!["/late/y=/src/g".to_owned()])));
        assert!(
            !created.iter().any(|(id, _)| *id == "b"),
            "b never reached the backend"
        );
    }

    #[test]
    fn every_request_gets_one_answer_even_when_the_backend_fails_or_panics() {
        let backend = Arc::new(Recorder::default());
        let input = concat!(
            r#"{"C":{"i":"ok1","m":[]}}"#,
            r#"{"C":{"i":"boom","m":[]}}"#,
            r#"{"C":{"i":"bad","m":[]}}"#,
            r#"{"D":"ok1"}"#,
            r#"{"C":{"i":"boom2","m":"not a list"}}"#,
            r#"{"C":{"i":"ok2","m":[]}}"#,
        );
        let answers = run(backend.clone(), input, 3);
        let mut ids: Vec<_> = answers.iter().map(|(id, _)| id.clone().unwrap()).collect();
        ids.sort();
        assert_eq!(ids, ["bad", "boom", "boom2", "ok1", "ok1", "ok2"]);
        for (id, error) in &answers {
            let id = id.as_deref().unwrap();
            match id {
                "boom" => {
                    let error = error.as_deref().unwrap();
                    assert!(
                        error.contains("internal error") && error.contains("injected panic"),
                        "{error}"
                    );
                }
                "bad" => assert_eq!(
                    error.as_deref(),
                    Some("sandbox \"bad\": refused by the backend")
                ),
                "boom2" => assert!(error.as_deref().unwrap().contains("invalid request")),
                _ => assert_eq!(error, &None, "{id}"),
            }
        }
        // The worker that caught the panic kept serving: ok2 may share it.
        assert_eq!(backend.creates.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn requests_for_one_id_run_in_order_on_one_worker_while_others_proceed() {
        let backend = Arc::new(Recorder::default());
        // Pick ids that land on different workers of two.
        let slow = "slow";
        let other = (0..100)
            .map(|n| format!("other{n}"))
            .find(|id| worker_for(id, 2) != worker_for(slow, 2))
            .unwrap();
        *backend.hold.lock() = Some(slow.to_owned());
        let input = format!(
            r#"{{"C":{{"i":"{slow}","m":[]}}}}{{"D":"{slow}"}}{{"C":{{"i":"{other}","m":[]}}}}{{"D":"{other}"}}"#
        );
        let releaser = {
            let backend = backend.clone();
            let other = other.clone();
            std::thread::spawn(move || {
                // The other id's create and destroy finish while slow waits.
                for _ in 0..500 {
                    if backend.calls.lock().iter().filter(|c| c.1 == other).count() == 2 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                backend.release();
            })
        };
        let answers = run(backend.clone(), &input, 2);
        releaser.join().unwrap();
        assert_eq!(answers.len(), 4);
        let calls = backend.calls.lock();
        let order: Vec<_> = calls
            .iter()
            .map(|(what, id, _)| format!("{what} {id}"))
            .collect();
        assert_eq!(
            order,
            [
                format!("create {other}"),
                format!("destroy {other}"),
                format!("create {slow}"),
                format!("destroy {slow}"),
            ]
        );
    }

    #[test]
    fn a_syntax_error_is_answered_and_reading_resumes_at_the_next_request() {
        let backend = Arc::new(Recorder::default());
        let answers = run(
            backend.clone(),
            r#"{"C":{"i":"a","m":[]}} {"C": oops {"D":"a"}"#,
            1,
        );
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert!(answers.contains(&(Some("a".to_owned()), None)));
        assert!(answers
            .iter()
            .any(|(id, error)| id.is_none() && error.is_some()));
        assert_eq!(
            backend.calls.lock().len(),
            2,
            "the destroy after the error ran"
        );
    }
}
