//! Looks at default places handed from one backend to the next
//! (`--keep_state=on`). A look remembered is void once no backend
//! watches, so what is handed on is only where looks found files: the
//! next backend looks at each again on a thread of its own as it starts,
//! so that the Creates of the next build find them remembered, as a warm
//! backend's would, rather than each making its first looks.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::daemon::stop::LOG;
use crate::sandbox::default_place::FilesFound;

use super::service::Service;
use super::taken_again::TakenAgain;

/// Looks again, on a thread of its own, at the looks handed on in `file`
/// (see [`TakenAgain`]); `None` if there are none.
pub fn look_again(service: &Arc<Service>, file: &Path, workspace: &Path) -> Option<TakenAgain> {
    let (service, workspace) = (service.clone(), workspace.to_owned());
    TakenAgain::start(
        "looks-again",
        file,
        "looks handed on are not looked at again",
        |file: &Path| FilesFound::read(file).map_err(|err| err.to_string()),
        move |found, stopping| {
            if found.workspace != workspace {
                // Another output base's: its directories would take
                // watches this workspace's need.
                log::info!(
                    target: LOG,
                    "looks handed on are of another workspace ({:?}): not looked at again",
                    found.workspace
                );
                return;
            }
            let began = Instant::now();
            let here = service.looks().look_again(&found, stopping);
            log::info!(
                target: LOG,
                "looked again at {} files in {} directories a previous backend found: {here} \
                 still there, in {:.1} ms",
                found.files(),
                found.dirs.len(),
                began.elapsed().as_secs_f64() * 1e3
            );
        },
    )
}

/// Hands the looks `service` remembers on in `file`, for the next backend
/// of `workspace`.
pub fn hand_on(service: &Service, file: &Path, workspace: &Path) {
    let found = service.looks().found(workspace);
    if found.dirs.is_empty() {
        return;
    }
    match found.write(file) {
        Ok(()) => log::info!(
            target: LOG,
            "handed on where looks found {} files, in {file:?}",
            found.files()
        ),
        Err(err) => log::warn!("cannot hand looks on in {file:?}: {err}"),
    }
}
