//! Puts the git revision the binary was built from into IRONWIRE_GIT_REV
//! for `--version` ("unknown" outside a git checkout, e.g. from a source
//! tarball or without git installed).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    let rev = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=IRONWIRE_GIT_REV={rev}");
    // HEAD's reflog changes with every commit and checkout, in a worktree too.
    if let Some(log) = git(&["rev-parse", "--git-path", "logs/HEAD"]) {
        println!("cargo:rerun-if-changed={log}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
