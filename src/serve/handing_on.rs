//! What a backend that keeps state (`--keep_state=on`) takes from its
//! predecessor as it starts and hands on to its successor when Bazel
//! closes its stdin, besides the store's content (`store::warm`): the
//! stashed native trees, where looks found files, and directory blobs,
//! each a file of the claimed state directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::service::Service;
use super::state_dir::Claimed;
use super::taken_again::TakenAgain;
use super::{looks_handed, trees_handed};
use crate::sandbox::hybrid::handoff;

/// The state directory's files, where a backend keeps state.
#[derive(Default)]
pub struct StateFiles {
    stashes: Option<PathBuf>,
    looks: Option<PathBuf>,
    directories: Option<PathBuf>,
}

/// What a predecessor handed on being taken again, on threads of their
/// own, beside the requests served.
pub struct Adopting {
    looks: Option<TakenAgain>,
    directories: Option<TakenAgain>,
}

impl StateFiles {
    /// In the claimed state directory (none without one).
    pub fn of(claimed: Option<&Claimed>) -> StateFiles {
        claimed.map_or_else(StateFiles::default, |claimed| StateFiles {
            stashes: Some(claimed.stashes()),
            looks: Some(claimed.looks()),
            directories: Some(claimed.directories()),
        })
    }

    /// Starts reading the stashes handed on, beside the store's adoption
    /// and the mount, not by the first Create (see `handoff`).
    pub fn read_stashes(&self) -> Option<handoff::Reading> {
        self.stashes
            .as_ref()
            .filter(|dir| dir.exists())
            .map(|dir| handoff::Reading::start(dir.clone()))
    }

    /// Starts taking again where looks found files and the directory
    /// blobs handed on.
    pub fn adopt(&self, service: &Arc<Service>, workspace: &Path) -> Adopting {
        Adopting {
            looks: self
                .looks
                .as_deref()
                .and_then(|file| looks_handed::look_again(service, file, workspace)),
            directories: self
                .directories
                .as_deref()
                .and_then(|file| trees_handed::decode_again(service, file)),
        }
    }

    /// Hands the stashed trees, where looks found files and the directory
    /// blobs on to the next backend; `own` is this backend's directory.
    pub fn hand_on(&self, service: &Service, own: &Path, workspace: &Path) {
        if let Some(to) = &self.stashes {
            match service.hand_on_stashes(to, own) {
                Some(Ok(n)) => log::info!("handed {n} stashed trees on in {to:?}"),
                Some(Err(err)) => log::warn!("cannot hand stashed trees on: {err}"),
                None => {}
            }
        }
        if let Some(file) = &self.looks {
            looks_handed::hand_on(service, file, workspace);
        }
        if let Some(file) = &self.directories {
            trees_handed::hand_on(service, file);
        }
    }
}

impl Adopting {
    /// Stops what is still being taken again (the requests ended).
    pub fn stop(self) {
        if let Some(looking) = self.looks {
            looking.stop();
        }
        if let Some(decoding) = self.directories {
            decoding.stop();
        }
    }
}
