//! The `pmtx` command: see `pmtx --help`.

fn main() -> std::process::ExitCode {
    pmtx::cli::main()
}
