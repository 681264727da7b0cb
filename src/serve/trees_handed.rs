//! Directory blobs handed from one backend to the next
//! (`--keep_state=on`). Bazel pushes every blob again to a new backend,
//! but a tree's first walk also decodes and checks each of its
//! directories, which a warm backend did once (the first Creates' walks
//! cost a hundred times a warm one's, docs/BENCHMARKS.md). So the blobs a backend holds go to the next, which decodes and checks
//! each on a thread of its own as it starts and keeps it under the digest
//! of its own bytes (nothing in the file is believed), and the next
//! build's Creates walk trees already decoded.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::daemon::stop::LOG;

use super::service::Service;
use super::taken_again::TakenAgain;
use crate::sandbox::handed_on::{Damage, HandedOnError};

/// The first bytes of the file, naming its format.
const MAGIC: &[u8] = b"actionfs directories 1\n";

/// Decodes, checks and keeps, on a thread of its own, the directory blobs
/// handed on in `file` (see [`TakenAgain`]); `None` if there are none.
pub fn decode_again(service: &Arc<Service>, file: &Path) -> Option<TakenAgain> {
    let service = service.clone();
    TakenAgain::start(
        "trees-again",
        file,
        "directories handed on are not decoded again",
        |file| {
            let bytes = std::fs::read(file).map_err(|source| HandedOnError::Io {
                syscall: "read",
                path: file.to_owned(),
                source,
            })?;
            let blobs = decode(&bytes).map_err(|(at, damage)| HandedOnError::Damaged {
                path: file.to_owned(),
                at,
                damage,
            })?;
            Ok(blobs.into_iter().map(<[u8]>::to_vec).collect())
        },
        move |blobs: Vec<Vec<u8>>, stopping| {
            let began = Instant::now();
            let (offered, mut kept) = (blobs.len(), 0);
            for blob in blobs {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                match service.take_directory(blob) {
                    Ok(()) => kept += 1,
                    Err(why) => log::warn!("a directory handed on is refused: {why}"),
                }
            }
            log::info!(
                target: LOG,
                "decoded {kept} of {offered} directories a previous backend held, in {:.1} ms",
                began.elapsed().as_secs_f64() * 1e3
            );
        },
    )
}

/// Hands the directory blobs `service`'s store holds on in `file`,
/// written whole and then named, so that the next backend reads all or
/// nothing.
pub fn hand_on(service: &Service, file: &Path) {
    let blobs = service.directory_blobs();
    if blobs.is_empty() {
        return;
    }
    let partial = file.with_extension("new");
    let written =
        std::fs::write(&partial, encode(&blobs)).and_then(|()| std::fs::rename(&partial, file));
    match written {
        Ok(()) => log::info!(
            target: LOG,
            "handed {} directories on in {file:?}",
            blobs.len()
        ),
        Err(err) => log::warn!("cannot hand directories on in {file:?}: {err}"),
    }
}

/// The file holding `blobs`: the magic, then each blob's length (8 bytes,
/// little-endian) and bytes.
fn encode(blobs: &[Arc<[u8]>]) -> Vec<u8> {
    let total: usize = blobs.iter().map(|blob| 8 + blob.len()).sum();
    let mut out = Vec::with_capacity(MAGIC.len() + total);
    out.extend_from_slice(MAGIC);
    for blob in blobs {
        out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        out.extend_from_slice(blob);
    }
    out
}

/// The blobs of file `bytes`, or what is wrong at which offset (refused
/// whole).
fn decode(bytes: &[u8]) -> Result<Vec<&[u8]>, (usize, Damage)> {
    let foreign = Damage::Foreign {
        what: "a list of directories",
    };
    let mut rest = bytes.strip_prefix(MAGIC).ok_or((0, foreign))?;
    let mut blobs = Vec::new();
    while !rest.is_empty() {
        let at = bytes.len() - rest.len();
        let (len, after) = rest
            .split_first_chunk::<8>()
            .ok_or((at, Damage::CutShort))?;
        let len = u64::from_le_bytes(*len);
        if usize::try_from(len).map_or(true, |len| len > after.len()) {
            return Err((at, Damage::Length(len)));
        }
        let len = len as usize;
        let (blob, after) = after.split_at(len);
        blobs.push(blob);
        rest = after;
    }
    Ok(blobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_read_back_as_written_and_a_cut_or_foreign_file_is_refused() {
        let blobs: Vec<Arc<[u8]>> = vec![Arc::from(&b"\x0a\x01a"[..]), Arc::from(&b""[..])];
        let bytes = encode(&blobs);
        let read = decode(&bytes).unwrap();
        assert_eq!(read, [&b"\x0a\x01a"[..], &b""[..]]);
        let cut = decode(&bytes[..MAGIC.len() + 10]).unwrap_err();
        assert_eq!(cut, (MAGIC.len(), Damage::Length(3)));
        assert_eq!(
            decode(&bytes[..MAGIC.len() + 3]).unwrap_err(),
            (MAGIC.len(), Damage::CutShort)
        );
        assert!(matches!(
            decode(b"actionfs directories 0\n").unwrap_err(),
            (0, Damage::Foreign { .. })
        ));
        assert_eq!(decode(MAGIC).unwrap(), Vec::<&[u8]>::new());
    }
}
