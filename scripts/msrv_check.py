#!/usr/bin/env python3
"""MSRV check without an old toolchain (issue 21): only the machine's one toolchain exists here.

Two halves, both in CI:
- this script: every crate that the locked build pulls in for Linux (normal dependencies, with the
  default features and with none) declares a `rust-version` no newer than pmtx's own;
- `cargo clippy` (in .ci/run): its `incompatible_msrv` lint, warn by default and denied there,
  flags any standard-library API stabilised after pmtx's `rust-version`.
What neither checks is language syntax newer than the MSRV; a machine with that toolchain would run
`cargo +<msrv> check --lib --no-default-features` and `cargo +<msrv> build` instead.
"""
import json
import subprocess
import sys


def version(text):
    return tuple(int(part) for part in text.split("."))


def crates_in(features):
    tree = subprocess.run(
        ["cargo", "tree", "--locked", "-e", "normal", "--prefix", "none",
         "--target", "x86_64-unknown-linux-gnu", *features],
        check=True, capture_output=True, text=True).stdout
    return {tuple(line.split()[:2]) for line in tree.splitlines() if line.strip()}


def main():
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True, capture_output=True, text=True).stdout)
    root = next(p for p in meta["packages"] if p["name"] == "pmtx")
    msrv = version(root["rust_version"])
    failures = []
    for label, features in [("default features", []), ("no default features", ["--no-default-features"])]:
        used = crates_in(features)
        for package in meta["packages"]:
            declared = package.get("rust_version")
            if (package["name"], "v" + package["version"]) in used and declared \
                    and version(declared) > msrv:
                failures.append(f"{package['name']} {package['version']} needs Rust {declared} "
                                f"({label}); pmtx declares {root['rust_version']}")
        print(f"msrv: {len(used)} crates with {label}")
    if failures:
        print("msrv check failed:\n  " + "\n  ".join(sorted(set(failures))), file=sys.stderr)
        sys.exit(1)
    print(f"msrv: each declares Rust {root['rust_version']} or older")


if __name__ == "__main__":
    main()
