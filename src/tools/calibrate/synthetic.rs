//! A realistic input tree for benchmarks and calibration: files of a few
//! KB, 20 to a directory, in directories 3 to 5 levels deep, mapped one
//! mapping per file as Bazel maps an action's inputs.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use actionfs_protocol::ResolvedMapping;

/// Files per directory.
pub const FILES_PER_DIR: usize = 20;

/// A generated tree of input files.
pub struct SyntheticTree {
    pub root: PathBuf,
    /// Paths of the files, relative to `root`.
    pub files: Vec<PathBuf>,
    /// Paths of the directories, relative to `root`, parents first.
    pub dirs: Vec<PathBuf>,
}

/// Relative directory of file number `index`: the directory number's
/// base-8 digits, at least three levels.
fn dir_of(index: usize) -> PathBuf {
    let mut number = index / FILES_PER_DIR;
    let mut digits = Vec::new();
    while number > 0 || digits.len() < 3 {
        digits.push(number % 8);
        number /= 8;
    }
    digits.iter().rev().map(|d| format!("d{d}")).collect()
}

impl SyntheticTree {
    /// Creates `count` files of `size` bytes under `root` (which must not
    /// exist yet).
    pub fn create(root: &Path, count: usize, size: usize) -> io::Result<SyntheticTree> {
        fs::create_dir(root)?;
        let content = vec![b'x'; size];
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut files = Vec::with_capacity(count);
        for index in 0..count {
            let dir = dir_of(index);
            if index % FILES_PER_DIR == 0 {
                for ancestor in dir
                    .ancestors()
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .skip(1)
                {
                    if !root.join(ancestor).exists() {
                        fs::create_dir(root.join(ancestor))?;
                        dirs.push(ancestor.to_owned());
                    }
                }
            }
            let file = dir.join(format!("f{index}.txt"));
            fs::write(root.join(&file), &content)?;
            files.push(file);
        }
        Ok(SyntheticTree {
            root: root.to_owned(),
            files,
            dirs,
        })
    }

    /// One read-only mapping per file, under `prefix` inside the sandbox.
    pub fn mappings(&self, prefix: &str) -> Vec<ResolvedMapping> {
        self.files
            .iter()
            .map(|file| ResolvedMapping {
                path: format!("{prefix}/{}", file.display()),
                underlying: self.root.join(file),
                writable: false,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_is_realistic() {
        let dir = tempfile::tempdir().unwrap();
        let tree = SyntheticTree::create(&dir.path().join("t"), 1000, 100).unwrap();
        assert_eq!(tree.files.len(), 1000);
        let depth = |p: &PathBuf| p.components().count();
        assert!(
            tree.files.iter().all(|f| (4..=6).contains(&depth(f))),
            "3-5 dirs + file"
        );
        assert_eq!(
            fs::read(tree.root.join(&tree.files[999])).unwrap().len(),
            100
        );
        // Parents come before children.
        for (i, dir) in tree.dirs.iter().enumerate() {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                assert!(tree.dirs[..i].contains(&parent.to_owned()), "{dir:?}");
            }
        }
        assert_eq!(tree.mappings("/ws")[0].path, "/ws/d0/d0/d0/f0.txt");
    }
}
