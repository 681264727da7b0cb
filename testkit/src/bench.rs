//! What the benchmarks read from their environment.

use std::path::PathBuf;

/// The directory named by `var`, else `default`.
pub fn dir_from_env(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// Where benchmark inputs live: ACTIONFS_BENCH_DIR, else tmpfs.
pub fn bench_dir() -> PathBuf {
    dir_from_env("ACTIONFS_BENCH_DIR", "/dev/shm")
}

/// Input counts: ACTIONFS_BENCH_SIZES (comma-separated), else `default`.
pub fn sizes(default: &[usize]) -> Vec<usize> {
    match std::env::var("ACTIONFS_BENCH_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse().expect("a size"))
            .collect(),
        Err(_) => default.to_vec(),
    }
}
