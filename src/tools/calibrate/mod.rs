//! `actionfs calibrate`: measures where FUSE starts to beat native
//! sandboxes on this machine and this sandbox base directory, with the
//! same action workload as `benches/hybrid.rs`, and recommends the cutoff.
//!
//! For each input count the two modes run alternately (so that noise hits
//! both alike), for both read fractions; the comparison uses the median of
//! each. The cutoff is the smallest measured count from which FUSE is
//! faster at every larger count, on the sum of the two fractions' medians
//! (0, every sandbox in FUSE, if that is the smallest count measured).
//! If FUSE wins nowhere, the per-input cost of each mode (a straight-line
//! fit) says whether it would win further out: where the lines cross, or
//! never ([`ALWAYS_NATIVE`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod synthetic;
pub mod workload;

use workload::Lab;

use crate::sandbox::hybrid::cutoff::ALWAYS_NATIVE;
use crate::sandbox::materialize::Method;
use crate::tools::progress::Progress;

const FRACTIONS: [f64; 2] = [0.1, 1.0];

#[derive(Debug)]
pub struct CalibrateArgs {
    /// Where sandboxes would live (the measurement's scratch goes there).
    pub dir: PathBuf,
    pub quick: bool,
    /// Input counts to measure instead of the default series.
    pub sizes: Vec<usize>,
    pub method: Method,
    /// Passed to the native daemon: 0 measures without reuse.
    pub native_stashes: usize,
    pub write: Option<PathBuf>,
}

/// One measured input count: median action time per mode and fraction.
struct Point {
    inputs: usize,
    /// [fraction][fuse, native]
    medians: [[Duration; 2]; 2],
}

impl Point {
    fn total(&self, mode: usize) -> Duration {
        self.medians[0][mode] + self.medians[1][mode]
    }

    fn fuse_wins(&self) -> bool {
        self.total(0) < self.total(1)
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// A calibration step that failed, and why.
#[derive(Debug)]
pub struct CalibrateError {
    pub step: String,
    pub source: std::io::Error,
}

impl std::fmt::Display for CalibrateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.source)
    }
}

impl std::error::Error for CalibrateError {}

/// Attaches the step that failed to an I/O error.
fn during(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> CalibrateError {
    let step = step.into();
    move |source| CalibrateError { step, source }
}

pub fn run(args: &CalibrateArgs) -> Result<(), CalibrateError> {
    let mut sizes: Vec<usize> = if !args.sizes.is_empty() {
        args.sizes.clone()
    } else if args.quick {
        vec![10, 100, 1_000, 5_000]
    } else {
        vec![10, 30, 100, 300, 1_000, 3_000, 10_000, 20_000]
    };
    sizes.sort_unstable();
    sizes.dedup();
    let reps = if args.quick { 3 } else { 7 };
    let binary = std::env::current_exe().map_err(during("finding the actionfs binary"))?;
    let largest = *sizes.last().expect("sizes");
    // Every action, warm-ups included: sizes x fractions x runs x modes.
    let actions = sizes.len() * FRACTIONS.len() * (reps + 1) * 2;
    let mut progress = Progress::new("calibrate", actions);
    progress.note(&format!(
        "calibrating in {:?}: {largest} input files, FUSE against native {}, {reps} runs each",
        args.dir,
        args.method.name()
    ));
    let lab =
        Lab::new(&args.dir, largest).map_err(during(format!("making inputs in {:?}", args.dir)))?;
    let fuse = lab
        .mount(&binary, &["--native_below=0".to_owned()])
        .map_err(during("starting a FUSE daemon"))?;
    let native = lab
        .mount(
            &binary,
            &[
                format!("--native_below={ALWAYS_NATIVE}"),
                format!("--native_method={}", args.method.name()),
                format!("--native_stashes={}", args.native_stashes),
            ],
        )
        .map_err(during("starting a native daemon"))?;
    let mounts = [&fuse, &native];

    let mut points = Vec::new();
    for &inputs in &sizes {
        let mut medians = [[Duration::ZERO; 2]; 2];
        for (f, &fraction) in FRACTIONS.iter().enumerate() {
            let mut samples = [Vec::new(), Vec::new()];
            // One warm-up action per mode, then alternate.
            for rep in 0..=reps {
                for (mode, mounted) in mounts.iter().enumerate() {
                    let took = lab
                        .action(mounted, inputs, fraction)
                        .map_err(during(format!("an action with {inputs} inputs")))?;
                    progress.step();
                    if rep > 0 {
                        samples[mode].push(took);
                    }
                }
            }
            for mode in 0..2 {
                medians[f][mode] = median(std::mem::take(&mut samples[mode]));
            }
        }
        let point = Point { inputs, medians };
        progress.note(&format!(
            "  {inputs:>6} inputs: FUSE {:>10.3} ms, native {:>10.3} ms (f=0.1 + f=1.0)",
            point.total(0).as_secs_f64() * 1e3,
            point.total(1).as_secs_f64() * 1e3
        ));
        points.push(point);
    }
    drop((fuse, native, progress));

    let (cutoff, why) = choose(&points);
    print_report(&points, cutoff, &why, &args.dir, args.method);
    if let Some(path) = &args.write {
        save(path, &points, cutoff, &args.dir, args.method)?;
        println!("saved to {path:?}; --native_below=auto will use it (see --calibration)");
    }
    Ok(())
}

/// The recommended cutoff and the reason, from the measured curve.
fn choose(points: &[Point]) -> (usize, String) {
    let first_win = (0..points.len()).find(|&i| points[i..].iter().all(Point::fuse_wins));
    match first_win {
        Some(0) => (
            0,
            "FUSE was faster at every size measured: every sandbox in FUSE".to_owned(),
        ),
        Some(i) => (
            points[i].inputs,
            format!(
                "FUSE was faster from {} inputs on, native below",
                points[i].inputs
            ),
        ),
        None => extrapolate(points),
    }
}

/// Fits time = a + b * inputs to each mode and finds where they cross.
fn extrapolate(points: &[Point]) -> (usize, String) {
    // A line needs two sizes (`--sizes` may name one).
    if points.len() < 2 {
        return (
            ALWAYS_NATIVE,
            "native was faster at the one size measured; measure more sizes to see where \
             FUSE would win: build every sandbox natively"
                .to_owned(),
        );
    }
    let fit = |mode: usize| {
        let n = points.len() as f64;
        let xs: Vec<f64> = points.iter().map(|p| p.inputs as f64).collect();
        let ys: Vec<f64> = points.iter().map(|p| p.total(mode).as_secs_f64()).collect();
        let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
        let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        let slope = sxy / sxx;
        (my - slope * mx, slope)
    };
    let ((a_fuse, b_fuse), (a_native, b_native)) = (fit(0), fit(1));
    if b_fuse >= b_native {
        return (
            ALWAYS_NATIVE,
            format!(
                "native was faster at every size measured, and costs less per input \
                 ({:.1} us against {:.1} us for FUSE): build every sandbox natively",
                b_native * 5e5,
                b_fuse * 5e5
            ),
        );
    }
    let crossing = ((a_fuse - a_native) / (b_native - b_fuse)).max(1.0) as usize;
    (
        crossing,
        format!("native was faster at every size measured; the fitted lines cross at {crossing}"),
    )
}

fn print_report(points: &[Point], cutoff: usize, why: &str, dir: &Path, method: Method) {
    println!("| inputs | FUSE f=0.1 ms | native f=0.1 ms | FUSE f=1 ms | native f=1 ms | faster |");
    println!("|---|---|---|---|---|---|");
    for p in points {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
            p.inputs,
            ms(p.medians[0][0]),
            ms(p.medians[0][1]),
            ms(p.medians[1][0]),
            ms(p.medians[1][1]),
            if p.fuse_wins() { "FUSE" } else { "native" }
        );
    }
    println!("sandbox base {dir:?}, native method {}", method.name());
    println!("{why}");
    println!("recommended: --native_below={cutoff}");
}

fn save(
    path: &Path,
    points: &[Point],
    cutoff: usize,
    dir: &Path,
    method: Method,
) -> Result<(), CalibrateError> {
    let curve: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            serde_json::json!({
                "inputs": p.inputs,
                "fuse_ms": [p.medians[0][0].as_secs_f64() * 1e3, p.medians[1][0].as_secs_f64() * 1e3],
                "native_ms": [p.medians[0][1].as_secs_f64() * 1e3, p.medians[1][1].as_secs_f64() * 1e3],
            })
        })
        .collect();
    let value = serde_json::json!({
        "native_below": cutoff,
        "native_method": method.name(),
        "sandbox_base": dir,
        "fractions": FRACTIONS,
        "curve": curve,
    });
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(during(format!("mkdir {parent:?}")))?;
    }
    let text = serde_json::to_string_pretty(&value).expect("serializable");
    std::fs::write(path, text + "\n").map_err(during(format!("writing {path:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(inputs: usize, fuse_ms: u64, native_ms: u64) -> Point {
        let (f, n) = (
            Duration::from_millis(fuse_ms),
            Duration::from_millis(native_ms),
        );
        Point {
            inputs,
            medians: [[f, n], [f, n]],
        }
    }

    #[test]
    fn the_cutoff_is_where_fuse_starts_winning_for_good() {
        let curve = [
            point(10, 5, 1),
            point(100, 3, 4),
            point(1000, 20, 10),
            point(10000, 50, 100),
            point(20000, 90, 200),
        ];
        assert_eq!(choose(&curve).0, 10000);
        assert_eq!(choose(&curve[3..]).0, 0, "FUSE everywhere: hybrid off");
    }

    #[test]
    fn without_a_win_the_fitted_lines_decide() {
        // Native grows faster: the lines cross beyond the measured range.
        let crossing = [point(10, 10, 1), point(1000, 20, 12), point(2000, 30, 23)];
        let (cutoff, _) = choose(&crossing);
        assert!(cutoff > 2000 && cutoff < ALWAYS_NATIVE, "{cutoff}");
        // Native is cheaper per input too: never FUSE.
        let never = [point(10, 10, 1), point(1000, 30, 11), point(2000, 50, 21)];
        assert_eq!(choose(&never).0, ALWAYS_NATIVE);
        // One size (`--sizes=10`): no line to fit.
        assert_eq!(choose(&[point(10, 10, 1)]).0, ALWAYS_NATIVE);
    }
}
