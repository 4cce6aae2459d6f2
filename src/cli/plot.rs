//! `pmtx plot` (placeholder: its issue's branch replaces this file).

use super::CliResult;

/// Arguments (placeholder).
#[derive(clap::Args, Debug)]
pub struct Args {}

pub(crate) fn run(_args: Args) -> CliResult {
    Err("not built yet".into())
}
