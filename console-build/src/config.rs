//! The build's settings: the `[[workspace.metadata.leptos]]` table of the workspace's
//! Cargo.toml, read through `cargo metadata` so paths resolve exactly as cargo resolves
//! them (workspace root, `CARGO_TARGET_DIR`). That table is the one place for the
//! bundle's names, paths and wasm-opt arguments; a key this tool does not know is an
//! error, so a stale or misspelt setting cannot be silently ignored.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value};

/// Everything the build reads from the workspace, resolved to absolute paths.
#[derive(Debug)]
pub struct Config {
    pub workspace_root: PathBuf,
    /// Cargo's target directory (`CARGO_TARGET_DIR` or the workspace's `target/`).
    pub target_dir: PathBuf,
    /// Base name of the bundle's files (`hypd.js`, `hypd.wasm`, `hypd.css`).
    pub output_name: String,
    /// The workspace binary that serves the console.
    pub bin_target: String,
    /// The package whose cdylib is the wasm entry, and the file name cargo gives it.
    pub lib_package: String,
    pub lib_wasm_name: String,
    /// Cargo profile of the wasm build (the bundle is built for size in every build).
    pub lib_profile: String,
    pub site_root: PathBuf,
    /// The site's directory of generated files, relative to `site_root` (its URL path).
    pub site_pkg_dir: String,
    pub style_file: PathBuf,
    pub assets_dir: PathBuf,
    /// wasm-opt's arguments for release bundles, before the file names.
    pub wasm_opt_args: Vec<String>,
}

const TABLE: &str = "[[workspace.metadata.leptos]]";

impl Config {
    /// Reads the workspace through `cargo metadata` (the cargo that runs this tool, so
    /// both agree on the workspace and the target directory).
    pub fn load() -> Result<Config> {
        let out = crate::cargo::command()
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .context("running cargo metadata")?;
        if !out.status.success() {
            bail!(
                "cargo metadata failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let meta: Value =
            serde_json::from_slice(&out.stdout).context("reading cargo metadata's output")?;
        let cfg = Config::from_metadata(&meta)?;
        // `cargo run` hands this tool the [env] of .cargo/config.toml, the value every
        // build of the server compiles in as the name of the wasm the page loads.
        if let Ok(name) = std::env::var("LEPTOS_OUTPUT_NAME")
            && name != cfg.output_name
        {
            bail!(
                "LEPTOS_OUTPUT_NAME is `{name}` (.cargo/config.toml) but {TABLE} \
                 `output-name` is `{}`: the page would ask for a file the bundle lacks",
                cfg.output_name
            );
        }
        Ok(cfg)
    }

    fn from_metadata(meta: &Value) -> Result<Config> {
        let path = |key: &str| -> Result<PathBuf> {
            meta[key]
                .as_str()
                .map(PathBuf::from)
                .ok_or_else(|| anyhow!("cargo metadata has no {key}"))
        };
        let workspace_root = path("workspace_root")?;
        let target_dir = path("target_directory")?;

        let tables = meta["metadata"]["leptos"]
            .as_array()
            .ok_or_else(|| anyhow!("Cargo.toml has no {TABLE} table"))?;
        let [table] = tables.as_slice() else {
            bail!(
                "Cargo.toml has {} {TABLE} tables; this workspace builds one console",
                tables.len()
            );
        };
        let mut table = Table(
            table
                .as_object()
                .ok_or_else(|| anyhow!("{TABLE} is not a table"))?
                .clone(),
        );

        let lib_package = table.string("lib-package")?;
        let config = Config {
            output_name: table.string("output-name")?,
            bin_target: table.string("bin-target")?,
            lib_wasm_name: cdylib_name(meta, &lib_package)?,
            lib_package,
            lib_profile: table.string("lib-profile")?,
            site_root: workspace_root.join(table.string("site-root")?),
            site_pkg_dir: table.string("site-pkg-dir")?,
            style_file: workspace_root.join(table.string("style-file")?),
            assets_dir: workspace_root.join(table.string("assets-dir")?),
            wasm_opt_args: table.strings("wasm-opt-args")?,
            workspace_root,
            target_dir,
        };
        if let Some(key) = table.0.keys().next() {
            bail!("{TABLE} has `{key}`, which console-build does not use: remove it or use it");
        }
        Ok(config)
    }

    /// Where the wasm build goes: its own target directory, as cargo-leptos kept it,
    /// because it is built with RUSTFLAGS the native builds do not have and would
    /// otherwise invalidate their fingerprints in turn.
    pub fn front_target_dir(&self) -> PathBuf {
        self.target_dir.join("front")
    }

    /// The wasm cargo links for the entry package.
    pub fn input_wasm(&self) -> PathBuf {
        let profile_dir = match self.lib_profile.as_str() {
            "dev" => "debug",
            other => other,
        };
        self.front_target_dir()
            .join("wasm32-unknown-unknown")
            .join(profile_dir)
            .join(format!("{}.wasm", self.lib_wasm_name))
    }

    pub fn pkg_dir(&self) -> PathBuf {
        self.site_root.join(&self.site_pkg_dir)
    }

    /// Shows a path relative to the workspace, as the user typed the settings.
    pub fn show<'a>(&self, path: &'a Path) -> std::path::Display<'a> {
        path.strip_prefix(&self.workspace_root)
            .unwrap_or(path)
            .display()
    }
}

/// The metadata table, emptied as it is read so that leftovers can be reported.
struct Table(Map<String, Value>);

impl Table {
    fn take(&mut self, key: &str) -> Result<Value> {
        self.0
            .remove(key)
            .ok_or_else(|| anyhow!("{TABLE} has no `{key}`"))
    }

    fn string(&mut self, key: &str) -> Result<String> {
        match self.take(key)? {
            Value::String(s) if !s.is_empty() => Ok(s),
            other => bail!("{TABLE} `{key}` must be a non-empty string, not {other}"),
        }
    }

    fn strings(&mut self, key: &str) -> Result<Vec<String>> {
        let value = self.take(key)?;
        let items = value
            .as_array()
            .ok_or_else(|| anyhow!("{TABLE} `{key}` must be a list of strings"))?;
        items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow!("{TABLE} `{key}` must be a list of strings"))
            })
            .collect()
    }
}

/// The file stem cargo gives the package's cdylib: its lib target's name with `-` as
/// `_`.
fn cdylib_name(meta: &Value, package: &str) -> Result<String> {
    let packages = meta["packages"].as_array().into_iter().flatten();
    let pkg = packages
        .into_iter()
        .find(|p| p["name"] == package)
        .ok_or_else(|| anyhow!("{TABLE} `lib-package`: no workspace package {package}"))?;
    let targets = pkg["targets"].as_array().into_iter().flatten();
    for target in targets {
        let kinds = target["kind"].as_array().into_iter().flatten();
        if kinds.into_iter().any(|k| k == "cdylib") {
            let name = target["name"]
                .as_str()
                .ok_or_else(|| anyhow!("cargo metadata: a target of {package} has no name"))?;
            return Ok(name.replace('-', "_"));
        }
    }
    bail!("{TABLE} `lib-package`: {package} has no cdylib target to build for wasm")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metadata(table: Value) -> Value {
        json!({
            "workspace_root": "/ws",
            "target_directory": "/t",
            "packages": [{"name": "frontend", "targets": [
                {"name": "frontend", "kind": ["cdylib", "rlib"]}
            ]}],
            "metadata": {"leptos": [table]},
        })
    }

    fn table() -> Value {
        json!({
            "output-name": "hypd",
            "bin-target": "hypd",
            "lib-package": "frontend",
            "lib-profile": "wasm-release",
            "site-root": "target/site",
            "site-pkg-dir": "pkg",
            "style-file": "style/main.css",
            "assets-dir": "public",
            "wasm-opt-args": ["-O1"],
        })
    }

    #[test]
    fn reads_the_table_and_resolves_paths() {
        let c = Config::from_metadata(&metadata(table())).unwrap();
        assert_eq!(c.pkg_dir(), Path::new("/ws/target/site/pkg"));
        assert_eq!(
            c.input_wasm(),
            Path::new("/t/front/wasm32-unknown-unknown/wasm-release/frontend.wasm")
        );
        assert_eq!(c.wasm_opt_args, ["-O1"]);
    }

    #[test]
    fn an_unknown_key_is_an_error() {
        let mut t = table();
        t["reload-port"] = json!(3098);
        let err = Config::from_metadata(&metadata(t)).unwrap_err();
        assert!(err.to_string().contains("`reload-port`"), "{err}");
    }

    #[test]
    fn a_missing_key_is_an_error() {
        let mut t = table();
        t.as_object_mut().unwrap().remove("lib-profile");
        let err = Config::from_metadata(&metadata(t)).unwrap_err();
        assert!(err.to_string().contains("`lib-profile`"), "{err}");
    }
}
