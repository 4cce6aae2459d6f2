//! `pmtx plot`: figures (PNG or SVG) from the JSON of `pmtx bench ... --json`.

use super::CliResult;
use crate::bench::plot::{self, Figure};
use std::path::PathBuf;

/// Arguments of `pmtx plot`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// JSON files written by `pmtx bench ... --json` (their runs are plotted together).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output image, `.png` or `.svg`. With one `--figure` it is written as named; otherwise each
    /// figure gets its own file with the figure's name before the extension
    /// (fig.png → fig-throughput.png, fig-ratio.png, fig-cdf.png, fig-kinds.png).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Figures to draw, comma-separated (default: every figure the inputs support).
    #[arg(long, value_delimiter = ',')]
    pub figure: Vec<Figure>,
}

pub(crate) fn run(args: Args) -> CliResult {
    let runs = plot::load_runs(&args.inputs)?;
    let written = if args.figure.is_empty() {
        let mut written = Vec::new();
        for figure in Figure::ALL {
            if let Err(e) = figure.applies_to(&runs) {
                eprintln!("skipping: {e}");
                continue;
            }
            let path = plot::output_path(&args.out, figure, false);
            plot::draw_figure(&runs, figure, &path)?;
            written.push(path);
        }
        written
    } else {
        plot::plot(&runs, &args.figure, &args.out)?
    };
    for path in written {
        outln!("wrote {}", path.display());
    }
    Ok(())
}
