//! Starting cargo from inside `cargo run`: the nested builds must see the environment a
//! plain `cargo build` in a shell sees, or their fingerprints differ from the test
//! build's and everything is compiled twice.

use std::process::{Command, ExitStatus};

use anyhow::{Context, Result, bail};

/// A cargo command: the cargo that started this tool (`$CARGO`, so a rustup toolchain
/// override applies), without the variables `cargo run` sets for the program it runs.
/// Those describe console-build itself; inherited by the nested cargo they would reach
/// every compiler it starts, where a crate reading one with `option_env!` would see
/// console-build's value.
pub fn command() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PKG_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
            )
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Runs a command to completion, its output going straight to the terminal.
pub fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status: ExitStatus = cmd.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
