//! Why a file one backend handed on to the next (the index of its stashes,
//! `hybrid::handoff`; where its looks found files, `default_place::handed`)
//! is refused whole: a truncated or foreign file is not half believed.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HandedOnError {
    #[error("{syscall} {path:?}: {source}")]
    Io {
        syscall: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// What is wrong, and the offset in the file of the field it is in.
    #[error("{path:?}: {damage} at byte {at}")]
    Damaged {
        path: PathBuf,
        at: usize,
        damage: Damage,
    },
    /// The thread reading it panicked.
    #[error("{path:?}: the thread reading it panicked")]
    Unread { path: PathBuf },
}

/// What makes a handed-on file unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    /// Its first bytes do not name this format (`what` it should be).
    #[error("not {what} of this version")]
    Foreign { what: &'static str },
    #[error("cut short")]
    CutShort,
    /// A length or count larger than the bytes left.
    #[error("a length of {0} longer than the file")]
    Length(u64),
    #[error("{0} bytes after the last stash")]
    Trailing(usize),
    #[error("directories nested deeper than {0}")]
    TooDeep(usize),
    #[error("names out of order, or a name twice, in one directory")]
    NamesOutOfOrder,
    #[error("an entry of kind {0}")]
    UnknownKind(u8),
    #[error("a field with no NUL after it")]
    Unterminated,
    #[error("a count of {0} files longer than the file")]
    FileCount(usize),
    #[error("a number that is none")]
    NotANumber,
    #[error("a name that is not UTF-8")]
    NameNotUtf8,
    #[error("a name that is not one path component")]
    NameNotOneComponent,
}
