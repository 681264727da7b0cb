//! What a backend that keeps state (`--keep_state=on`) takes from its
//! predecessor as it starts and hands on to its successor when Bazel
//! closes its stdin: each kind a file of the claimed state directory,
//! behind one interface ([`HandedOn`]): the stashed native trees, where
//! looks found files, and directory blobs. The store's content is handed
//! on beside them (`store::warm`) but taken again as the store opens,
//! before any of these: its index is the store's own.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::service::Service;
use super::state_dir::Claimed;
use super::taken_again::TakenAgain;
use super::{looks_handed, trees_handed};
use crate::sandbox::hybrid::handoff;

/// One kind of state handed from a backend to the next.
pub trait HandedOn: Send + Sync {
    /// Takes again what the predecessor handed on, before the first
    /// request is served; what goes on in the background meanwhile.
    fn take_again(&self, service: &Arc<Service>, workspace: &Path) -> Option<TakenAgain>;

    /// Hands this backend's on, once every sandbox is gone; `own` is the
    /// backend's directory.
    fn hand_on(&self, service: &Service, own: &Path, workspace: &Path);
}

/// The stashed native trees (`hybrid::handoff`): read from the start,
/// beside the store's adoption and the mount, so that the first Create
/// does not wait for them.
struct Stashes {
    dir: PathBuf,
    reading: Mutex<Option<handoff::Reading>>,
}

impl HandedOn for Stashes {
    fn take_again(&self, service: &Arc<Service>, _: &Path) -> Option<TakenAgain> {
        if let Some(reading) = self.reading.lock().take() {
            service.adopt_stashes(reading);
        }
        None
    }

    fn hand_on(&self, service: &Service, own: &Path, _: &Path) {
        match service.hand_on_stashes(&self.dir, own) {
            Some(Ok(n)) => log::info!("handed {n} stashed trees on in {:?}", self.dir),
            Some(Err(err)) => log::warn!("cannot hand stashed trees on: {err}"),
            None => {}
        }
    }
}

/// Where looks at default places found files (`looks_handed`).
struct Looks(PathBuf);

impl HandedOn for Looks {
    fn take_again(&self, service: &Arc<Service>, workspace: &Path) -> Option<TakenAgain> {
        looks_handed::look_again(service, &self.0, workspace)
    }

    fn hand_on(&self, service: &Service, _: &Path, workspace: &Path) {
        looks_handed::hand_on(service, &self.0, workspace);
    }
}

/// The store's directory blobs (`trees_handed`).
struct Directories(PathBuf);

impl HandedOn for Directories {
    fn take_again(&self, service: &Arc<Service>, _: &Path) -> Option<TakenAgain> {
        trees_handed::decode_again(service, &self.0)
    }

    fn hand_on(&self, service: &Service, _: &Path, _: &Path) {
        trees_handed::hand_on(service, &self.0);
    }
}

/// Every kind a backend keeping state hands on (none without a claimed
/// state directory).
#[derive(Default)]
pub struct StateFiles {
    kinds: Vec<Box<dyn HandedOn>>,
}

/// What a predecessor handed on being taken again, on threads of their
/// own, beside the requests served.
pub struct Adopting(Vec<TakenAgain>);

impl StateFiles {
    /// In the claimed state directory; starts reading the stashes.
    pub fn of(claimed: Option<&Claimed>) -> StateFiles {
        let Some(claimed) = claimed else {
            return StateFiles::default();
        };
        let stashes = claimed.stashes();
        let reading = stashes
            .exists()
            .then(|| handoff::Reading::start(stashes.clone()));
        StateFiles {
            kinds: vec![
                Box::new(Stashes {
                    dir: stashes,
                    reading: Mutex::new(reading),
                }),
                Box::new(Looks(claimed.looks())),
                Box::new(Directories(claimed.directories())),
            ],
        }
    }

    /// Takes every kind again (see [`HandedOn::take_again`]).
    pub fn adopt(&self, service: &Arc<Service>, workspace: &Path) -> Adopting {
        Adopting(
            self.kinds
                .iter()
                .filter_map(|kind| kind.take_again(service, workspace))
                .collect(),
        )
    }

    /// Hands every kind on (see [`HandedOn::hand_on`]).
    pub fn hand_on(&self, service: &Service, own: &Path, workspace: &Path) {
        for kind in &self.kinds {
            kind.hand_on(service, own, workspace);
        }
    }
}

impl Adopting {
    /// Stops what is still being taken again (the requests ended).
    pub fn stop(self) {
        for taking in self.0 {
            taking.stop();
        }
    }
}
