//! Looks handed from one backend to the next: the files a backend's looks
//! found, by directory, written as it ends and read by its successor,
//! which looks at each again (its own watch, then its own `fstatat`)
//! before remembering it. What the file says is only where to look: a
//! file changed, missing or made up is found so by that look.
//!
//! Format: the line `actionfs looks 1`, the workspace the looks were made
//! for, then for each directory its path, the number of its files and
//! each file's name and size, every field ended by a NUL (no path or name
//! holds one).

use std::ffi::OsStr;
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::sandbox::handed_on::{Damage, HandedOnError};

const HEADER: &[u8] = b"actionfs looks 1\n";

/// A directory's files found, by name, each with the size found.
pub type Files = Vec<(Box<str>, i64)>;

/// Files found at their default places, each with the size found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesFound {
    /// The workspace whose builds made the looks (`serve --workspace`):
    /// another's directories are not worth a look or a watch.
    pub workspace: PathBuf,
    /// Directories in the order they were first looked at, so that a
    /// successor looks first where the build looks first.
    pub dirs: Vec<(PathBuf, Files)>,
}

impl FilesFound {
    pub fn files(&self) -> usize {
        self.dirs.iter().map(|(_, files)| files.len()).sum()
    }

    /// Writes to `to` through a temporary file beside it and a rename, so
    /// that a reader finds a whole file or none.
    pub fn write(&self, to: &Path) -> io::Result<()> {
        let partial = to.with_extension("partial");
        let file = std::fs::File::create(&partial)?;
        let mut out = BufWriter::new(file);
        out.write_all(HEADER)?;
        field(&mut out, self.workspace.as_os_str().as_bytes())?;
        for (dir, files) in &self.dirs {
            field(&mut out, dir.as_os_str().as_bytes())?;
            field(&mut out, files.len().to_string().as_bytes())?;
            for (name, size) in files {
                field(&mut out, name.as_bytes())?;
                field(&mut out, size.to_string().as_bytes())?;
            }
        }
        out.into_inner().map_err(|err| err.into_error())?;
        std::fs::rename(&partial, to)
    }

    /// Reads what [`FilesFound::write`] wrote; an error says what is wrong
    /// where.
    pub fn read(from: &Path) -> Result<FilesFound, HandedOnError> {
        let bytes = std::fs::read(from).map_err(|source| HandedOnError::Io {
            syscall: "read",
            path: from.to_owned(),
            source,
        })?;
        let Some(body) = bytes.strip_prefix(HEADER) else {
            return Err(HandedOnError::Damaged {
                path: from.to_owned(),
                at: 0,
                damage: Damage::Foreign {
                    what: "a list of looks",
                },
            });
        };
        let mut fields = Fields {
            rest: body,
            from,
            at: HEADER.len(),
            field_at: HEADER.len(),
        };
        let mut found = FilesFound {
            workspace: PathBuf::from(OsStr::from_bytes(fields.next()?)),
            dirs: Vec::new(),
        };
        while !fields.rest.is_empty() {
            let dir = PathBuf::from(OsStr::from_bytes(fields.next()?));
            let count: usize = fields.number()?;
            // At least four bytes a file: a count beyond is a lie.
            if count > fields.rest.len() / 4 {
                return Err(fields.wrong(Damage::FileCount(count)));
            }
            let mut files = Vec::with_capacity(count);
            for _ in 0..count {
                let name = std::str::from_utf8(fields.next()?)
                    .map_err(|_| fields.wrong(Damage::NameNotUtf8))?;
                if name.is_empty() || name.contains('/') {
                    return Err(fields.wrong(Damage::NameNotOneComponent));
                }
                let name: Box<str> = name.into();
                files.push((name, fields.number()?));
            }
            found.dirs.push((dir, files));
        }
        Ok(found)
    }
}

fn field(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    out.write_all(bytes)?;
    out.write_all(&[0])
}

struct Fields<'a> {
    rest: &'a [u8],
    from: &'a Path,
    /// Offset of `rest` in the file.
    at: usize,
    /// Offset of the field read last (or being read), for errors.
    field_at: usize,
}

impl<'a> Fields<'a> {
    fn next(&mut self) -> Result<&'a [u8], HandedOnError> {
        self.field_at = self.at;
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.wrong(Damage::Unterminated))?;
        let (field, rest) = (&self.rest[..end], &self.rest[end + 1..]);
        self.rest = rest;
        self.at += end + 1;
        Ok(field)
    }

    fn number<N: std::str::FromStr>(&mut self) -> Result<N, HandedOnError> {
        let field = self.next()?;
        std::str::from_utf8(field)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| self.wrong(Damage::NotANumber))
    }

    /// `damage` in the field read last.
    fn wrong(&self, damage: Damage) -> HandedOnError {
        HandedOnError::Damaged {
            path: self.from.to_owned(),
            at: self.field_at,
            damage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_is_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("looks");
        let found = FilesFound {
            workspace: PathBuf::from("/out/execroot/ws"),
            dirs: vec![
                (
                    PathBuf::from("/exec/ws/pkg"),
                    vec![("a.h".into(), 12), ("b c.h".into(), 0)],
                ),
                (PathBuf::from(OsStr::from_bytes(b"/odd/\xff")), vec![]),
                (PathBuf::from("/exec/ws"), vec![("BUILD".into(), 1 << 40)]),
            ],
        };
        found.write(&file).unwrap();
        assert_eq!(FilesFound::read(&file).unwrap(), found);
        assert_eq!(found.files(), 3);
        assert!(!tmp.path().join("looks.partial").exists());
    }

    #[test]
    fn a_damaged_file_is_refused_saying_where() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("looks");
        let cases: [(&[u8], &str); 7] = [
            (b"something else\n", "not a list of looks"),
            (b"actionfs looks 1\n/ws", "no NUL"),
            (b"actionfs looks 1\n/ws\x00/d\x001\x00ab\x0012", "no NUL"),
            (
                b"actionfs looks 1\n/ws\x00/d\x00x\x00",
                "a number that is none",
            ),
            (
                b"actionfs looks 1\n/ws\x00/d\x00999\x00a\x001\x00",
                "longer than the file",
            ),
            (
                b"actionfs looks 1\n/ws\x00/d\x001\x00a/b\x001\x00",
                "one path component",
            ),
            (
                b"actionfs looks 1\n/ws\x00/d\x001\x00\xff\x001\x00",
                "not UTF-8",
            ),
        ];
        for (bytes, why) in cases {
            std::fs::write(&file, bytes).unwrap();
            let err = FilesFound::read(&file).expect_err(why).to_string();
            assert!(err.contains(why) && err.contains("looks"), "{why}: {err}");
        }
    }
}
