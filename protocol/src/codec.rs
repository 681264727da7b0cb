//! Reading requests from, and writing responses to, byte streams.
//!
//! Bazel writes requests back to back with no separator (`{..}{..}`), and
//! waits for each answer before it writes anything that depends on it, so the
//! decoder must hand out a request as soon as its closing brace arrives,
//! without waiting for the next byte. Objects are self-delimiting, which is
//! what makes that possible.
//!
//! Decoding happens in two steps. First the stream is cut into values
//! ([`crate::frame`]); then each value is parsed and typed as a
//! [`Request`]. A syntax error is fatal, because nothing after it can be
//! trusted to start at a value boundary; a value that is well-formed JSON
//! but not a valid request is answered with an error for the sandbox it
//! names, and reading goes on.

use std::io::{self, BufRead, Read, Write};

use crate::frame::{FrameError, Framer};
use crate::types::{Request, Response};

/// What the decoder makes of one JSON value.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A valid request.
    Request(Request),
    /// Well-formed JSON naming sandbox `id`, but not a valid request. The
    /// caller answers `id` with `message` and keeps reading.
    Invalid { id: String, message: String },
}

/// An error after which no further request can be read.
#[derive(Debug, PartialEq, Eq)]
pub struct FatalError {
    pub message: String,
}

impl std::fmt::Display for FatalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FatalError {}

/// The largest request accepted: far above any real one (Bazel's largest
/// recorded request is 250 KB; 100k mappings take about 5 MB), and a bound
/// on what a client that never ends a value can make the daemon buffer.
pub const MAX_REQUEST_BYTES: u64 = 256 << 20;

/// Incremental decoder of a request stream.
///
/// Iterating yields one item per JSON value: `Ok` for a request (valid or
/// not), `Err` once for a fatal error, then nothing more.
pub struct RequestReader<R: Read> {
    framer: Framer<R>,
    finished: bool,
}

impl<R: Read> RequestReader<R> {
    pub fn new(input: R) -> Self {
        Self::with_limit(input, MAX_REQUEST_BYTES)
    }

    /// A decoder that refuses requests of more than `limit` bytes.
    pub fn with_limit(input: R, limit: u64) -> Self {
        RequestReader {
            framer: Framer::new(input, limit),
            finished: false,
        }
    }
}

impl<R: Read> RequestReader<R> {
    /// The next value as `decode` makes it from its bytes (see
    /// [`crate::inplace`]), framing errors fatal as for `next`.
    pub fn next_with<T>(
        &mut self,
        decode: impl FnOnce(&[u8]) -> Result<T, FatalError>,
    ) -> Option<Result<T, FatalError>> {
        if self.finished {
            return None;
        }
        let item = match self.framer.next_value() {
            Ok(None) => return None,
            Ok(Some(value)) => decode(value),
            Err(err) => Err(FatalError {
                message: match err {
                    FrameError::Truncated => format!("truncated request: {err}"),
                    FrameError::Io(_) => format!("cannot read requests: {err}"),
                    FrameError::TooLarge { .. } | FrameError::NotAContainer { .. } => {
                        format!("malformed request stream: {err}")
                    }
                },
            }),
        };
        if item.is_err() {
            self.finished = true;
        }
        Some(item)
    }
}

impl<R: Read> Iterator for RequestReader<R> {
    type Item = Result<Decoded, FatalError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(decode_value)
    }
}

/// Types one complete JSON value as a request. A value that is not valid
/// JSON is fatal: nothing after it can be trusted to start a value.
pub fn decode_value(json: &[u8]) -> Result<Decoded, FatalError> {
    match serde_json::from_slice::<Request>(json) {
        Ok(request) => Ok(Decoded::Request(request)),
        // Which kind of failure it was is only known by parsing again,
        // untyped: serde_json reports a non-object as a syntax error.
        Err(err) => match serde_json::from_slice::<serde::de::IgnoredAny>(json) {
            Err(syntax) => Err(FatalError {
                message: format!("malformed request stream: {syntax}"),
            }),
            Ok(_) => invalid_request(json, err),
        },
    }
}

/// A well-formed value that is not a request: answered for the sandbox it
/// names, or fatal if it names none.
fn invalid_request(json: &[u8], err: serde_json::Error) -> Result<Decoded, FatalError> {
    match named_id(json) {
        Some(id) => Ok(Decoded::Invalid {
            id,
            message: format!("invalid request: {err}"),
        }),
        None => Err(FatalError {
            message: format!("invalid request that names no sandbox id: {err}"),
        }),
    }
}

/// Finds the sandbox id in a value that failed to type as a request, so the
/// error can be answered to the action that caused it.
fn named_id(json: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    let object = value.as_object()?;
    if object.len() != 1 {
        return None;
    }
    let (tag, body) = object.iter().next()?;
    match tag.as_str() {
        "C" | "CreateSandbox" => {
            let body = body.as_object()?;
            body.get("i")
                .or_else(|| body.get("id"))?
                .as_str()
                .map(str::to_owned)
        }
        "D" | "DestroySandbox" => body.as_str().map(str::to_owned),
        _ => None,
    }
}

/// Encodes one response as a single line, newline included.
pub fn encode_response(response: &Response) -> String {
    let mut line = serde_json::to_string(response).expect("a response always serializes");
    line.push('\n');
    line
}

/// Encodes one request exactly as Bazel would write it (no separator).
pub fn encode_request(request: &Request) -> String {
    serde_json::to_string(request).expect("a request always serializes")
}

/// Writes responses, one line each, flushing every line so the reader sees
/// it at once.
pub struct ResponseWriter<W: Write> {
    output: W,
}

impl<W: Write> ResponseWriter<W> {
    pub fn new(output: W) -> Self {
        ResponseWriter { output }
    }

    pub fn write(&mut self, response: &Response) -> io::Result<()> {
        self.output
            .write_all(encode_response(response).as_bytes())?;
        self.output.flush()
    }
}

/// Reads responses (any whitespace between them) from a daemon's output.
pub struct ResponseReader<R: Read> {
    values: serde_json::StreamDeserializer<'static, serde_json::de::IoRead<R>, Response>,
}

impl<R: BufRead> ResponseReader<R> {
    pub fn new(input: R) -> Self {
        ResponseReader {
            values: serde_json::Deserializer::from_reader(input).into_iter(),
        }
    }
}

impl<R: BufRead> Iterator for ResponseReader<R> {
    type Item = io::Result<Response>;

    fn next(&mut self) -> Option<Self::Item> {
        self.values.next().map(|r| r.map_err(io::Error::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{CreateSandbox, Mapping};

    fn decode_all(input: &str) -> Vec<Result<Decoded, FatalError>> {
        RequestReader::new(input.as_bytes()).collect()
    }

    #[test]
    fn concatenated_requests_without_separator() {
        let items = decode_all(r#"{"C":{"i":"empty","m":[]}}{"D":"13"}"#);
        assert_eq!(
            items,
            vec![
                Ok(Decoded::Request(Request::Create(CreateSandbox {
                    id: "empty".into(),
                    ..Default::default()
                }))),
                Ok(Decoded::Request(Request::Destroy("13".into()))),
            ]
        );
    }

    #[test]
    fn long_names_are_aliases_and_defaults_apply() {
        let items = decode_all(
            r#" {"CreateSandbox":{"id":"a","mappings":[{"path":"/x","underlying_path":"/u",
                "writable":true}],"prefixes":{"3":"/p"}}}
                {"DestroySandbox":"a"} "#,
        );
        let Ok(Decoded::Request(Request::Create(create))) = &items[0] else {
            panic!("not a create: {items:?}");
        };
        assert_eq!(
            create.mappings,
            vec![Mapping {
                path_prefix: 0,
                path: "/x".into(),
                underlying_path_prefix: 0,
                underlying_path: "/u".into(),
                writable: true,
            }]
        );
        assert_eq!(create.prefixes.get(&3).map(String::as_str), Some("/p"));
        assert_eq!(items[1], Ok(Decoded::Request(Request::Destroy("a".into()))));
    }

    #[test]
    fn wrong_type_with_an_id_is_answered_and_reading_goes_on() {
        let items = decode_all(r#"{"C":{"i":"s1","m":5}}{"D":"s2"}"#);
        match &items[0] {
            Ok(Decoded::Invalid { id, message }) => {
                assert_eq!(id, "s1");
                assert!(message.contains("invalid type"), "{message}");
            }
            other => panic!("expected an invalid request, got {other:?}"),
        }
        assert_eq!(
            items[1],
            Ok(Decoded::Request(Request::Destroy("s2".into())))
        );
    }

    #[test]
    fn unknown_key_is_answered_with_an_error() {
        let items = decode_all(r#"{"C":{"i":"s1","m":[],"z":1}}"#);
        assert!(
            matches!(&items[0], Ok(Decoded::Invalid { id, message })
                if id == "s1" && message.contains("unknown field")),
            "{items:?}"
        );
    }

    #[test]
    fn syntax_error_is_fatal_and_ends_the_stream() {
        let items = decode_all(r#"{"D":"a"}{"C":{"i":"b",]}{"D":"c"}"#);
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(items[0].is_ok());
        let err = items[1].as_ref().unwrap_err();
        assert!(err.message.contains("malformed"), "{}", err.message);
    }

    #[test]
    fn truncated_input_is_fatal() {
        let items = decode_all(r#"{"D":"a"}{"C":{"i":"b""#);
        assert_eq!(items.len(), 2);
        assert!(items[1].as_ref().unwrap_err().message.contains("truncated"));
    }

    #[test]
    fn value_without_id_is_fatal() {
        let items = decode_all(r#"[1,2]"#);
        assert_eq!(items.len(), 1);
        assert!(items[0]
            .as_ref()
            .unwrap_err()
            .message
            .contains("names no sandbox"));
    }

    #[test]
    fn an_oversized_request_is_fatal() {
        let small = r#"{"D":"a"}"#;
        let big = format!(
            r#"{{"C":{{"i":"b","m":[{}]}}}}"#,
            vec![r#"{"p":"/x","u":"/y"}"#; 5000].join(",")
        );
        let input = format!("{small}{big}{small}");
        let items: Vec<_> = RequestReader::with_limit(input.as_bytes(), 64 * 1024).collect();
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(items[0].is_ok());
        let err = items[1].as_ref().unwrap_err();
        assert!(
            err.message.contains("larger than 65536 bytes"),
            "{}",
            err.message
        );
        // Under the limit, the same request passes.
        let items: Vec<_> = RequestReader::with_limit(input.as_bytes(), 1 << 20).collect();
        assert!(items.iter().all(Result::is_ok) && items.len() == 3);
    }

    #[test]
    fn request_round_trips_through_the_encoder() {
        let request = Request::Create(CreateSandbox {
            id: "7".into(),
            mappings: vec![Mapping {
                path_prefix: 1,
                path: "a".into(),
                underlying_path_prefix: 2,
                underlying_path: "b".into(),
                writable: false,
            }],
            prefixes: [(1, "/".to_string()), (2, "/src".to_string())].into(),
        });
        let wire = encode_request(&request);
        assert_eq!(
            wire,
            r#"{"C":{"i":"7","m":[{"x":1,"p":"a","y":2,"u":"b"}],"q":{"1":"/","2":"/src"}}}"#
        );
        assert_eq!(decode_all(&wire), vec![Ok(Decoded::Request(request))]);
    }

    #[test]
    fn responses_are_single_lines() {
        assert_eq!(
            encode_response(&Response::ok("a")),
            "{\"id\":\"a\",\"error\":null}\n"
        );
        assert_eq!(
            encode_response(&Response::fatal("bad \"x\"")),
            "{\"id\":null,\"error\":\"bad \\\"x\\\"\"}\n"
        );
    }
}
