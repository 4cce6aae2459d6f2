//! The `pmtx` command line: one subcommand per file.

/// `println!` for the CLI's output: a closed pipe (`pmtx recover --json | head`) ends the process
/// quietly, as SIGPIPE does for C tools, where `println!` would panic.
macro_rules! outln {
    () => {
        $crate::cli::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` with [`outln!`]'s handling of a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}

/// Writes to stdout; exits with status 0 if the reader closed the pipe, and with status 1 (and a
/// message) on any other output error. Exiting runs no destructors, so the scratch pools of the
/// run are removed first (as on a signal).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        crate::pmem::scratch::remove_all();
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("pmtx: error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// Prints the database's durability warning, if any ([`crate::db::Db::durability_warning`]), once
/// per pool path.
pub(crate) fn warn_durability(db: &crate::db::Db) {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if let Some(w) = db.durability_warning() {
        let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        if !warned.iter().any(|seen| seen == w) {
            eprintln!("pmtx: warning: {w}");
            warned.push(w.to_string());
        }
    }
}

mod bench;
mod bench_ptm;
mod bench_tatp;
mod bench_tpcc;
pub(crate) mod check;
mod compare;
mod crashtest;
mod demo;
mod inspect;
mod plot;
mod recover;
mod reproduce;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// pmtx: transactional storage engines for persistent memory.
#[derive(Parser, Debug)]
#[command(name = "pmtx", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print a pool's header, mapping (DAX/MAP_SYNC or not), domain, size and space used.
    Inspect(inspect::InspectArgs),
    /// Run a benchmark: load a workload, warm up, measure; print a table and optionally JSON.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Open a pool, run its engine's recovery, and report each phase and its duration.
    Recover(recover::RecoverArgs),
    /// Check a pool's integrity without writing a byte (works on a pool in use): header, page
    /// table, free pages, meta page, catalog, log windows, tuple headers, indexes. Exit status 0
    /// clean, 1 damage found, 2 could not check.
    Check(check::CheckArgs),
    /// Create a scratch pool, write and persist through the pmem layer, and show what a simulated
    /// crash can lose under ADR and under eADR.
    Demo(demo::DemoArgs),
    /// Crash-consistency suite: crash a workload at PM events, recover each image, check it.
    Crashtest(crashtest::Args),
    /// Run a workload on pmtx engines and on peers (LMDB, PMDK) in one invocation: the same
    /// keys, records and threads; `pmtx bench`'s table and JSON with a ratio to each peer.
    #[command(subcommand, after_help = compare::peers_help())]
    Compare(compare::CompareCommand),
    /// Plot the JSON results of `pmtx bench` runs as PNG figures.
    Plot(plot::Args),
    /// Run a small version of a paper's headline experiment with the PM media model and NVM
    /// latency emulation on, and print it beside the paper's figure (docs/REPRODUCE.md).
    Reproduce(reproduce::Args),
}

/// Parses the process arguments and runs the command; errors are printed and give exit status 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    remove_scratch_files_on_signals();
    let result = match cli.command {
        Command::Check(args) => return check::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Recover(args) => recover::run(args),
        Command::Crashtest(args) => crashtest::run(args),
        Command::Compare(cmd) => compare::run(cmd),
        Command::Plot(args) => plot::run(args),
        Command::Reproduce(args) => reproduce::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", error_report(&*e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its chain of causes, one line each; a cause whose text the line before already
/// shows (as `"open failed: {source}"` does) is not repeated.
pub(crate) fn error_report(e: &dyn std::error::Error) -> String {
    let mut report = format!("pmtx: error: {e}\n");
    let mut shown = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !shown.contains(&text) {
            report.push_str(&format!("  caused by: {text}\n"));
        }
        shown = text;
        source = cause.source();
    }
    report
}

/// SIGINT, SIGTERM and SIGHUP end the process without running destructors: remove the scratch
/// pools and directories first (`pmem::scratch`), then exit as a signalled process would (130).
fn remove_scratch_files_on_signals() {
    let installed = ctrlc::set_handler(|| {
        let removed = crate::pmem::scratch::remove_all();
        if removed > 0 {
            eprintln!("pmtx: interrupted: removed {removed} scratch pool(s)");
        }
        std::process::exit(130);
    });
    if let Err(e) = installed {
        eprintln!("pmtx: warning: no signal handler ({e}): an interrupted run may leave scratch pools in /dev/shm");
    }
}

/// Any command's error.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Formats nanoseconds since the Unix epoch as a UTC date and time, `2026-11-24 23:56:28 UTC`.
pub(crate) fn utc_time(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (proleptic Gregorian), after H. Hinnant's `civil_from_days`.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Formats a byte count for people.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed_and_sizes_print_well() {
        Cli::command().debug_assert();
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_time(951_782_400_000_000_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(
            utc_time(1_795_564_588_121_187_924),
            "2026-11-24 23:56:28 UTC"
        );
    }

    #[test]
    fn an_error_chain_prints_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "Permission denied");
        let e = crate::pmem::PoolError::Io {
            path: "/p".into(),
            op: "open",
            source: io,
        };
        assert_eq!(
            error_report(&e),
            "pmtx: error: pool /p: open failed: Permission denied\n"
        );
        #[derive(Debug)]
        struct Loading(std::io::Error);
        impl std::fmt::Display for Loading {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("loading failed")
            }
        }
        impl std::error::Error for Loading {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Loading(std::io::Error::other("disk on fire"));
        assert_eq!(
            error_report(&e),
            "pmtx: error: loading failed\n  caused by: disk on fire\n"
        );
    }
}
