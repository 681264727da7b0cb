//! Cutting a byte stream into top-level JSON values.
//!
//! Requests arrive back to back with no separator, and a value must be
//! handed out as soon as its closing bracket arrives. The framer reads
//! whatever the stream has, scans it for the end of the value (tracking
//! strings, escapes and bracket depth, nothing more), and returns the
//! value's bytes. Checking the JSON is the parser's job, done afterwards on
//! the whole slice at once, which is several times faster than parsing
//! from the stream a byte at a time.
//!
//! Every top-level value must be an object or an array (requests are
//! objects); anything else cannot be framed without the next byte and is a
//! fatal error, as is a value longer than the limit.

use std::io::{self, Read};

/// Why no further value can be framed.
#[derive(Debug)]
pub enum FrameError {
    /// The stream ended inside a value.
    Truncated,
    /// A value starts with something other than `{` or `[`.
    NotAContainer {
        offset: u64,
        found: u8,
    },
    /// The current value is longer than the limit.
    TooLarge {
        limit: u64,
    },
    Io(io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Truncated => f.write_str("input ended inside a JSON value"),
            FrameError::NotAContainer { offset, found } => write!(
                f,
                "expected '{{' at byte {offset}, found {:?}",
                char::from(*found)
            ),
            FrameError::TooLarge { limit } => {
                write!(f, "a request is larger than {limit} bytes")
            }
            FrameError::Io(err) => write!(f, "read: {err}"),
        }
    }
}

/// Where the scan of the current value stands.
#[derive(Default)]
struct Scan {
    /// Bytes of the buffer already scanned (from the value's start).
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

/// Frames values read from `R`.
pub struct Framer<R> {
    input: R,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    start: usize,
    /// Stream offset of `buf[0]`, for messages.
    offset: u64,
    limit: u64,
    eof: bool,
}

const READ_SIZE: usize = 64 * 1024;

impl<R: Read> Framer<R> {
    pub fn new(input: R, limit: u64) -> Self {
        Framer {
            input,
            buf: Vec::with_capacity(READ_SIZE),
            start: 0,
            offset: 0,
            limit,
            eof: false,
        }
    }

    /// The next value's bytes, or `None` at the end of the stream (only
    /// whitespace left).
    pub fn next_value(&mut self) -> Result<Option<&[u8]>, FrameError> {
        // Skip whitespace, reading as needed.
        loop {
            let pending = &self.buf[self.start..];
            match pending.iter().position(|b| !b.is_ascii_whitespace()) {
                Some(skip) => {
                    self.start += skip;
                    break;
                }
                None => {
                    self.start = self.buf.len();
                    if !self.fill()? {
                        return Ok(None);
                    }
                }
            }
        }
        let first = self.buf[self.start];
        if first != b'{' && first != b'[' {
            return Err(FrameError::NotAContainer {
                offset: self.offset + self.start as u64,
                found: first,
            });
        }
        let mut scan = Scan::default();
        loop {
            if let Some(len) = scan_value(&self.buf[self.start..], &mut scan) {
                if len as u64 > self.limit {
                    return Err(FrameError::TooLarge { limit: self.limit });
                }
                let value = self.start..self.start + len;
                self.start += len;
                return Ok(Some(&self.buf[value]));
            }
            if (self.buf.len() - self.start) as u64 > self.limit {
                return Err(FrameError::TooLarge { limit: self.limit });
            }
            if !self.fill()? {
                return Err(FrameError::Truncated);
            }
        }
    }

    /// Reads more bytes; false at the end of the stream.
    fn fill(&mut self) -> Result<bool, FrameError> {
        if self.eof {
            return Ok(false);
        }
        // Drop consumed bytes first, so the buffer holds one value at most
        // (plus what was read beyond it).
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.offset += self.start as u64;
            self.start = 0;
        }
        let filled = self.buf.len();
        self.buf.resize(filled + READ_SIZE, 0);
        let read = loop {
            match self.input.read(&mut self.buf[filled..]) {
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match read {
            Ok(n) => {
                self.buf.truncate(filled + n);
                self.eof = n == 0;
                Ok(n > 0)
            }
            Err(err) => {
                self.buf.truncate(filled);
                Err(FrameError::Io(err))
            }
        }
    }
}

/// Scans `bytes` (a value's start onwards) from where `scan` stopped;
/// returns the value's length once its closing bracket is in `bytes`.
fn scan_value(bytes: &[u8], scan: &mut Scan) -> Option<usize> {
    let mut at = scan.scanned;
    while at < bytes.len() {
        let byte = bytes[at];
        at += 1;
        if scan.in_string {
            if scan.escaped {
                scan.escaped = false;
            } else if byte == b'\\' {
                scan.escaped = true;
            } else if byte == b'"' {
                scan.in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => scan.in_string = true,
            b'{' | b'[' => scan.depth += 1,
            b'}' | b']' => {
                scan.depth = scan.depth.saturating_sub(1);
                if scan.depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    scan.scanned = at;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out one byte per read, as a slow pipe might.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.split_first() {
                Some((&byte, rest)) if !buf.is_empty() => {
                    buf[0] = byte;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    fn frames(input: &[u8], trickle: bool) -> (Vec<String>, Option<String>) {
        let mut values = Vec::new();
        let mut check = |framer: &mut dyn FnMut() -> Result<Option<Vec<u8>>, FrameError>| loop {
            match framer() {
                Ok(Some(value)) => values.push(String::from_utf8(value).unwrap()),
                Ok(None) => return None,
                Err(err) => return Some(err.to_string()),
            }
        };
        let error = if trickle {
            let mut framer = Framer::new(Trickle(input), 1 << 20);
            check(&mut || framer.next_value().map(|v| v.map(<[u8]>::to_vec)))
        } else {
            let mut framer = Framer::new(input, 1 << 20);
            check(&mut || framer.next_value().map(|v| v.map(<[u8]>::to_vec)))
        };
        (values, error)
    }

    #[test]
    fn values_back_to_back_with_brackets_and_escapes_in_strings() {
        let input = br#" {"D":"a"}{"C":{"i":"}{\"[","m":[{"p":"/x\\"}]}}
            [1,{"a":[]}] "#;
        for trickle in [false, true] {
            let (values, error) = frames(input, trickle);
            assert_eq!(
                values,
                [
                    r#"{"D":"a"}"#,
                    r#"{"C":{"i":"}{\"[","m":[{"p":"/x\\"}]}}"#,
                    r#"[1,{"a":[]}]"#
                ]
            );
            assert_eq!(error, None);
        }
    }

    #[test]
    fn a_value_is_handed_out_before_the_next_byte_arrives() {
        // A reader that would block (here: fail) after the first value.
        struct Then<'a>(&'a [u8], bool);
        impl Read for Then<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.1 {
                    return Err(io::Error::other("would block"));
                }
                self.1 = true;
                buf[..self.0.len()].copy_from_slice(self.0);
                Ok(self.0.len())
            }
        }
        let mut framer = Framer::new(Then(br#"{"D":"a"}"#, false), 1 << 20);
        assert_eq!(framer.next_value().unwrap(), Some(&br#"{"D":"a"}"#[..]));
    }

    #[test]
    fn truncation_scalars_and_oversized_values_are_errors() {
        let (values, error) = frames(br#"{"D":"a"}{"C":{"i":"b""#, true);
        assert_eq!(values.len(), 1);
        assert_eq!(error.unwrap(), "input ended inside a JSON value");
        let (_, error) = frames(br#"{"D":"a"} 42"#, false);
        assert_eq!(error.unwrap(), "expected '{' at byte 10, found '4'");
        let big = format!(r#"{{"m":"{}"}}"#, "x".repeat(300_000));
        let mut framer = Framer::new(big.as_bytes(), 100_000);
        assert!(matches!(
            framer.next_value(),
            Err(FrameError::TooLarge { limit: 100_000 })
        ));
    }
}
