//! `pmtx` writing into a pipe whose reader has gone (`pmtx ... | head`) ends quietly with status
//! 0, like a C tool killed by SIGPIPE, instead of panicking in `println!`, and leaves no scratch
//! pool behind.

use std::process::{Command, Stdio};

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // Its scratch pool goes to a folder of the test's own, which must be empty afterwards: the
    // quiet exit runs no destructors, so it removes the pool itself.
    let scratch = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmtx"))
        .arg("demo")
        .env("PMTX_SCRATCH_DIR", scratch.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pmtx runs");
    // Close the read end before pmtx writes anything: its first write fails with EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("pmtx ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "pmtx panicked: {stderr}");
    assert!(out.status.success(), "status {:?}: {stderr}", out.status);
    let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().collect();
    assert!(left.is_empty(), "scratch pools left behind: {left:?}");
}
