//! console-build: builds the console (wasm bundle split per page, JS glue, stylesheet,
//! assets, under the site root) and the server binary, as `cargo leptos build --split`
//! did for this workspace, from the settings in Cargo.toml's
//! `[[workspace.metadata.leptos]]`. It exists so that a fresh machine needs no
//! separately installed build tool: cargo-leptos took ~21 minutes to install and
//! wasm-bindgen-cli ~4 more, while this is a small crate of the workspace, built with
//! it, whose wasm-bindgen is pinned by the same Cargo.lock as the frontend's.
//!
//! ```text
//! cargo run -q -p console-build -- [--release] [--frontend-only] [--bin NAME]...
//! ```
//!
//! The server is built at the workspace level (`cargo build --bin hypd`, no `-p`), so
//! its dependencies get the same features as in `cargo test` and `cargo clippy` and are
//! compiled once for all of them.

mod cargo;
mod config;
mod cores;
mod features;
mod front;
mod pack;
mod site;

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::config::Config;

const USAGE: &str = "usage: console-build [--release] [--frontend-only] [--bin NAME]...
  --release        release server, and wasm-opt on the bundle
  --frontend-only  only the site (bundle, stylesheet, assets), not the server
  --bin NAME       also build this workspace binary with the server (e.g. hypd-sim)";

#[derive(Debug, Default, PartialEq)]
struct Args {
    release: bool,
    frontend_only: bool,
    extra_bins: Vec<String>,
}

impl Args {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Args> {
        let mut parsed = Args::default();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--release" => parsed.release = true,
                "--frontend-only" => parsed.frontend_only = true,
                "--bin" => match args.next() {
                    Some(name) => parsed.extra_bins.push(name),
                    None => bail!("--bin needs a binary's name\n{USAGE}"),
                },
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument `{other}`\n{USAGE}"),
            }
        }
        if parsed.frontend_only && !parsed.extra_bins.is_empty() {
            bail!("--bin builds binaries, --frontend-only builds none\n{USAGE}");
        }
        Ok(parsed)
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("console-build: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse(std::env::args().skip(1))?;
    let cfg = Config::load()?;
    let started = Instant::now();

    // The wasm and the server are compiled at once: each ends in a long single-threaded
    // step (the bundle's fat LTO, the server's link) during which the other keeps the
    // second core busy. They have separate target directories, hence separate locks.
    std::thread::scope(|s| {
        let server = (!args.frontend_only).then(|| s.spawn(|| build_server(&cfg, &args)));
        let site = build_site(&cfg, args.release);
        let server = match server {
            Some(handle) => handle.join().expect("the server build thread panicked"),
            None => Ok(()),
        };
        site.and(server)
    })?;

    eprintln!(
        "console-build: done in {:.1} s: site in {}{}",
        started.elapsed().as_secs_f64(),
        cfg.show(&cfg.site_root),
        if args.frontend_only {
            String::new()
        } else {
            let dir = if args.release { "release" } else { "debug" };
            format!(
                ", server {}",
                cfg.target_dir.join(dir).join(&cfg.bin_target).display()
            )
        }
    );
    Ok(())
}

fn build_site(cfg: &Config, release: bool) -> Result<()> {
    front::compile(cfg)?;
    front::bundle(cfg, release)?;
    site::style(cfg, &cfg.pkg_dir())?;
    site::assets(cfg)
}

/// The server (and any `--bin`) from the workspace root with no `-p`: cargo then unifies
/// features over the default members, as `cargo test --all-targets` does. `-p server`
/// alone would resolve a narrower set and compile the server and its dependencies a
/// second time. The frontend is not a default member, so `hydrate` stays out.
fn build_server(cfg: &Config, args: &Args) -> Result<()> {
    let mut cmd = cargo::command();
    cmd.current_dir(&cfg.workspace_root)
        .args(["build", "--bin", &cfg.bin_target]);
    for bin in &args.extra_bins {
        cmd.args(["--bin", bin]);
    }
    if args.release {
        cmd.arg("--release");
    }
    let exe = cfg.target_dir.join("debug").join(&cfg.bin_target);
    let linked_before = modified(&exe);
    cargo::run(&mut cmd, "the server build (cargo build)")?;
    // Only a dev build shares its artifacts with `cargo test`, and only one that
    // compiled something can have drifted: a warm run skips the check (~1 s).
    if !args.release && modified(&exe) != linked_before {
        features::warn_if_tests_differ(cfg)?;
    }
    Ok(())
}

fn modified(path: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args> {
        Args::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_flags_and_extra_binaries() {
        assert_eq!(parse(&[]).unwrap(), Args::default());
        let a = parse(&["--release", "--bin", "hypd-sim"]).unwrap();
        assert!(a.release && !a.frontend_only);
        assert_eq!(a.extra_bins, ["hypd-sim"]);
        assert!(parse(&["--frontend-only"]).unwrap().frontend_only);
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        assert!(parse(&["--split"]).is_err());
        assert!(parse(&["--bin"]).is_err());
        assert!(parse(&["--frontend-only", "--bin", "hypd-sim"]).is_err());
    }
}
