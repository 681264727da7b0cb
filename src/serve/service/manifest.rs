//! What a Create's manifest must say, checked before anything is made:
//! pure functions of the manifest (and of its walked tree).

use std::path::Path;

use actionfs_protocol::backend::digest::is_sha256_hex;
use actionfs_protocol::backend::reapi::Digest;
use actionfs_protocol::backend::sandbox::Manifest;

use crate::sandbox::merkle::Walked;
use crate::serve::error::{Error, WritableDirFault};
use crate::serve::outputs::{self, Output};

/// The input root's digest, which must be SHA-256, as the tree's must.
pub fn input_root(manifest: &Manifest) -> Result<&Digest, Error> {
    check_hash_function(&manifest.hash_function)?;
    let root = manifest
        .input_root_digest
        .as_ref()
        .ok_or(Error::NoInputRoot)?;
    if !is_sha256_hex(&root.hash) {
        return Err(Error::RootNotSha256(root.hash.clone()));
    }
    Ok(root)
}

/// The declared outputs, checked against the tree and sorted by path.
pub fn outputs(manifest: &Manifest, walked: &Walked) -> Result<Vec<Output>, Error> {
    let ws = walked.top.as_str();
    let mut outs = Vec::with_capacity(manifest.outputs.len());
    for (key, output) in &manifest.outputs {
        outs.push(outputs::check(ws, key, &output.r#type, &output.dest).map_err(Error::Output)?);
    }
    outs.sort_by(|a, b| a.path.cmp(&b.path));
    outputs::check_against_tree(&outs, walked).map_err(Error::Output)?;
    Ok(outs)
}

/// The writable directories (sandbox path, host path), sorted.
pub fn writable_dirs<'m>(
    manifest: &'m Manifest,
    workspace: &str,
) -> Result<Vec<(&'m String, &'m String)>, Error> {
    let mut writable: Vec<(&String, &String)> = manifest.writable_dirs.iter().collect();
    writable.sort();
    for (path, host) in &writable {
        let refused = |why| Error::WritableDir {
            path: path.to_string(),
            why,
        };
        outputs::check_sandbox_path(path).map_err(|why| refused(WritableDirFault::Path(why)))?;
        if path.strip_prefix('/') == Some(workspace) {
            return Err(refused(WritableDirFault::IsTheWorkspace));
        }
        if !Path::new(host).is_absolute() {
            return Err(refused(WritableDirFault::HostNotAbsolute(host.to_string())));
        }
    }
    Ok(writable)
}

fn check_hash_function(name: &str) -> Result<(), Error> {
    let normalized: String = name
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .collect::<String>()
        .to_ascii_uppercase();
    match normalized.as_str() {
        "SHA256" => Ok(()),
        _ => Err(Error::HashFunction(name.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sha256_is_accepted() {
        for ok in ["SHA-256", "sha256", "SHA256"] {
            assert!(check_hash_function(ok).is_ok(), "{ok}");
        }
        for bad in ["SHA-1", "BLAKE3", "", "MD5"] {
            let err = check_hash_function(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
