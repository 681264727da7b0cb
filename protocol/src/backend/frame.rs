//! Framing: each message on the wire is its length as a base-128 varint,
//! then that many bytes of protobuf (protobuf's "delimited" form).
//!
//! [`read_frame`] reads one message and tells a clean end of input (at a
//! frame boundary) from one inside a frame. It reads the length a byte at a
//! time, so give it a buffered reader. [`write_frame`] builds the whole frame
//! first and hands it to one `write_all`, so writers that share a stream
//! only need a lock around the call.

use std::fmt;
use std::io::{self, Read, Write};

use prost::Message;

/// The longest message body accepted, in bytes: a longer frame is refused
/// before its body is read.
pub const MAX_FRAME: usize = 256 << 20;

/// The most bytes a varint of a `u64` takes.
const MAX_VARINT: usize = 10;

/// Why no message could be read.
#[derive(Debug)]
pub enum FrameError {
    /// The length prefix runs past 10 bytes or does not fit in 64 bits.
    BadVarint,
    /// The length prefix announces a body longer than the limit.
    TooLong { len: u64, max: usize },
    /// The input ended inside a frame: inside the length prefix (then
    /// `expected` is one more than the `got` bytes of prefix read), or
    /// inside the body (`got` of the `expected` body bytes arrived).
    Truncated { expected: u64, got: u64 },
    /// The body is not a valid message of the expected type.
    Decode(prost::DecodeError),
    /// Reading failed.
    Io(io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadVarint => write!(
                f,
                "bad frame length: the varint is longer than {MAX_VARINT} bytes or overflows 64 bits"
            ),
            FrameError::TooLong { len, max } => {
                write!(f, "frame of {len} bytes is longer than the limit of {max}")
            }
            FrameError::Truncated { expected, got } => write!(
                f,
                "input ended inside a frame: expected {expected} bytes, got {got}"
            ),
            FrameError::Decode(err) => write!(f, "frame body is not a valid message: {err}"),
            FrameError::Io(err) => write!(f, "reading a frame: {err}"),
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FrameError::Decode(err) => Some(err),
            FrameError::Io(err) => Some(err),
            _ => None,
        }
    }
}

impl From<io::Error> for FrameError {
    fn from(err: io::Error) -> Self {
        FrameError::Io(err)
    }
}

impl From<prost::DecodeError> for FrameError {
    fn from(err: prost::DecodeError) -> Self {
        FrameError::Decode(err)
    }
}

/// Writes `msg` as one frame: its length as a varint, then its bytes, in a
/// single `write_all`. Does not flush. A message longer than [`MAX_FRAME`]
/// is refused (`InvalidInput`), since the other side would refuse it.
pub fn write_frame<M: Message>(w: &mut impl Write, msg: &M) -> io::Result<()> {
    let len = msg.encoded_len();
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("message of {len} bytes is longer than the frame limit of {MAX_FRAME}"),
        ));
    }
    w.write_all(&msg.encode_length_delimited_to_vec())
}

/// Reads one frame and decodes its body as an `M`, refusing a body longer
/// than `max` bytes. `Ok(None)` means the input ended cleanly, before the
/// first byte of a frame; an end anywhere else is [`FrameError::Truncated`].
pub fn read_frame<M: Message + Default>(
    r: &mut impl Read,
    max: usize,
) -> Result<Option<M>, FrameError> {
    let Some(len) = read_length(r)? else {
        return Ok(None);
    };
    if len > max as u64 {
        return Err(FrameError::TooLong { len, max });
    }
    // Grow the buffer as bytes arrive rather than trusting the prefix with
    // an allocation up front.
    let mut body = Vec::with_capacity((len as usize).min(64 << 10));
    r.take(len).read_to_end(&mut body)?;
    if (body.len() as u64) < len {
        return Err(FrameError::Truncated {
            expected: len,
            got: body.len() as u64,
        });
    }
    Ok(Some(M::decode(body.as_slice())?))
}

/// Reads a varint length prefix; `None` at end of input before its first
/// byte.
fn read_length(r: &mut impl Read) -> Result<Option<u64>, FrameError> {
    let mut value: u64 = 0;
    for i in 0..MAX_VARINT {
        let Some(byte) = read_byte(r)? else {
            if i == 0 {
                return Ok(None);
            }
            return Err(FrameError::Truncated {
                expected: i as u64 + 1,
                got: i as u64,
            });
        };
        let bits = u64::from(byte & 0x7f);
        // The tenth byte holds the 64th bit alone.
        if i == MAX_VARINT - 1 && bits > 1 {
            return Err(FrameError::BadVarint);
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some(value));
        }
    }
    Err(FrameError::BadVarint)
}

fn read_byte(r: &mut impl Read) -> io::Result<Option<u8>> {
    let mut byte = [0u8];
    loop {
        match r.read(&mut byte) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(byte[0])),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sandbox::{self, request::Op, Request};
    use std::io::{BufReader, Cursor};

    fn negotiate(rid: u64) -> Request {
        Request {
            rid,
            sandbox_id: String::new(),
            op: Some(Op::Negotiate(sandbox::Negotiate {
                options: vec!["a".into(), "b=c".into()],
                versions: vec![sandbox::Version::Version1 as i32],
            })),
        }
    }

    fn varint(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::encode_varint(v, &mut out);
        out
    }

    fn read<M: Message + Default>(bytes: &[u8]) -> Result<Option<M>, FrameError> {
        read_frame(&mut BufReader::new(Cursor::new(bytes)), MAX_FRAME)
    }

    #[test]
    fn round_trips_several_frames() {
        let mut wire = Vec::new();
        for rid in 1..=3 {
            write_frame(&mut wire, &negotiate(rid)).unwrap();
        }
        // An empty message is a frame of length zero.
        write_frame(&mut wire, &Request::default()).unwrap();
        let mut r = BufReader::new(Cursor::new(wire));
        for rid in 1..=3 {
            let got: Request = read_frame(&mut r, MAX_FRAME).unwrap().unwrap();
            assert_eq!(got, negotiate(rid));
        }
        let empty: Request = read_frame(&mut r, MAX_FRAME).unwrap().unwrap();
        assert_eq!(empty, Request::default());
        assert!(read_frame::<Request>(&mut r, MAX_FRAME).unwrap().is_none());
        // And stays at the end.
        assert!(read_frame::<Request>(&mut r, MAX_FRAME).unwrap().is_none());
    }

    #[test]
    fn writes_the_delimited_form() {
        let msg = negotiate(7);
        let mut wire = Vec::new();
        write_frame(&mut wire, &msg).unwrap();
        let mut expected = varint(msg.encoded_len() as u64);
        expected.extend(msg.encode_to_vec());
        assert_eq!(wire, expected);
        assert_eq!(
            Request::decode_length_delimited(wire.as_slice()).unwrap(),
            msg
        );
    }

    #[test]
    fn long_length_prefix_round_trips() {
        // A body over 16 KiB takes a three-byte prefix.
        let msg = sandbox::Push {
            blobs: [("h".to_string(), vec![7u8; 20_000])].into(),
            content: Default::default(),
        };
        let mut wire = Vec::new();
        write_frame(&mut wire, &msg).unwrap();
        assert_eq!(wire.len() - msg.encoded_len(), 3);
        assert_eq!(read::<sandbox::Push>(&wire).unwrap().unwrap(), msg);
    }

    #[test]
    fn empty_input_is_a_clean_end() {
        assert!(read::<Request>(&[]).unwrap().is_none());
    }

    #[test]
    fn end_inside_the_length_is_truncated() {
        match read::<Request>(&[0x80, 0x80]) {
            Err(FrameError::Truncated {
                expected: 3,
                got: 2,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn end_inside_the_body_is_truncated() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &negotiate(1)).unwrap();
        let len = wire.len() - 1;
        wire.truncate(wire.len() - 4);
        match read::<Request>(&wire) {
            Err(FrameError::Truncated { expected, got }) => {
                assert_eq!((expected, got), (len as u64, len as u64 - 4));
            }
            other => panic!("{other:?}"),
        }
        // A length with no body at all.
        match read::<Request>(&[5]) {
            Err(FrameError::Truncated {
                expected: 5,
                got: 0,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn eleven_byte_varint_is_bad() {
        let mut wire = vec![0x80; 10];
        wire.push(0x00);
        assert!(matches!(read::<Request>(&wire), Err(FrameError::BadVarint)));
    }

    #[test]
    fn varint_past_64_bits_is_bad() {
        // Ten bytes whose last carries more than bit 63.
        let mut wire = vec![0xff; 9];
        wire.push(0x02);
        assert!(matches!(read::<Request>(&wire), Err(FrameError::BadVarint)));
        // u64::MAX itself is a valid varint, refused only as too long.
        let wire = varint(u64::MAX);
        assert_eq!(wire.len(), 10);
        assert!(matches!(
            read::<Request>(&wire),
            Err(FrameError::TooLong {
                len: u64::MAX,
                max: MAX_FRAME
            })
        ));
    }

    #[test]
    fn too_long_is_refused_before_the_body() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &negotiate(1)).unwrap();
        let body = wire.len() as u64 - 1;
        let mut r = BufReader::new(Cursor::new(&wire));
        match read_frame::<Request>(&mut r, 4) {
            Err(FrameError::TooLong { len, max: 4 }) => assert_eq!(len, body),
            other => panic!("{other:?}"),
        }
        // Exactly the limit is fine.
        let mut r = BufReader::new(Cursor::new(&wire));
        assert!(read_frame::<Request>(&mut r, body as usize)
            .unwrap()
            .is_some());
    }

    #[test]
    fn bad_body_is_a_decode_error() {
        // Field 1 with wire type 7, which does not exist.
        let err = read::<Request>(&[1, 0x0f]).unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)), "{err:?}");
        assert!(err
            .to_string()
            .starts_with("frame body is not a valid message"));
    }

    #[test]
    fn read_errors_are_io() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let err = read_frame::<Request>(&mut Failing, MAX_FRAME).unwrap_err();
        assert!(matches!(err, FrameError::Io(_)));
        assert_eq!(err.to_string(), "reading a frame: disk on fire");
    }

    #[test]
    fn interrupted_reads_are_retried() {
        struct Interrupting(Cursor<Vec<u8>>, bool);
        impl Read for Interrupting {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.1 = !self.1;
                if self.1 {
                    return Err(io::ErrorKind::Interrupted.into());
                }
                // One byte at a time, to cut the body too.
                let n = buf.len().min(1);
                self.0.read(&mut buf[..n])
            }
        }
        let mut wire = Vec::new();
        write_frame(&mut wire, &negotiate(9)).unwrap();
        let mut r = Interrupting(Cursor::new(wire), false);
        assert_eq!(
            read_frame::<Request>(&mut r, MAX_FRAME).unwrap().unwrap(),
            negotiate(9)
        );
        assert!(read_frame::<Request>(&mut r, MAX_FRAME).unwrap().is_none());
    }

    #[test]
    fn messages_are_one_line() {
        let errors = [
            FrameError::BadVarint,
            FrameError::TooLong { len: 9, max: 1 },
            FrameError::Truncated {
                expected: 2,
                got: 1,
            },
        ];
        for err in errors {
            let text = err.to_string();
            assert!(!text.contains('\n') && !text.is_empty(), "{text:?}");
        }
    }
}
