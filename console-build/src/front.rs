//! The browser bundle: the frontend compiled to wasm, split into an entry module and
//! per-page chunks (wasm-split), given its JS glue (wasm-bindgen) and, for release,
//! shrunk by wasm-opt. The glue must come from the wasm-bindgen of Cargo.lock (the
//! library is pinned with `=` in the workspace), and the split bundle must keep the
//! names Leptos's server side and the split loader look for, or the page cannot load.
//!
//! Splitting and bindgen take a few seconds and wasm-opt minutes, so they run only when
//! their input changed: a stamp records the hash of what they were made from and of
//! every file they wrote.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};
use wasm_bindgen_cli_support::Bindgen;

use crate::config::Config;

/// The module the split chunks import their loader from. Leptos's `HydrationScripts`
/// (server side) names this exact file when it preloads a page's chunks, and the
/// manifest below, so neither may be renamed.
const SPLIT_LOADER: &str = "__wasm_split.______________________.js";
const SPLIT_MANIFEST: &str = "__wasm_split_manifest.json";

/// The oldest wasm-opt known to keep a split bundle loadable: Debian's binaryen 108
/// points the export of wasm-bindgen's externref table at the function table. 132 is
/// the version scripts/setup and the Dockerfile install.
const MIN_BINARYEN: u32 = 132;

/// Compiles the frontend crate to wasm. `-Clink-args=--emit-relocs` keeps the
/// relocations wasm-split needs to cut the module apart (the one flag cargo-leptos adds
/// for `--split`); `--cfg erase_components` is left out on purpose (see
/// docs/ARCHITECTURE.md: it made the split pages larger).
pub fn compile(cfg: &Config) -> Result<()> {
    // Appended to the caller's RUSTFLAGS, which cargo would otherwise drop in favour of
    // ours; config-file rustflags are ignored whenever RUSTFLAGS is set (the workspace
    // has none).
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !rustflags.is_empty() {
        rustflags.push(' ');
    }
    rustflags.push_str("-Clink-args=--emit-relocs");

    let mut cmd = crate::cargo::command();
    cmd.current_dir(&cfg.workspace_root)
        .args(["build", "--lib", "--target", "wasm32-unknown-unknown"])
        .args(["--package", &cfg.lib_package])
        .args(["--profile", &cfg.lib_profile])
        .arg("--target-dir")
        .arg(cfg.front_target_dir())
        .env("RUSTFLAGS", rustflags);
    // The server is compiled at the same time; one progress bar on the terminal is
    // readable, two redrawing the same line are not.
    if std::env::var_os("CARGO_TERM_PROGRESS_WHEN").is_none() {
        cmd.env("CARGO_TERM_PROGRESS_WHEN", "never");
    }
    crate::cargo::run(&mut cmd, "the wasm build (cargo build of the frontend)")
}

/// Makes `<site>/<pkg>` from the compiled wasm, unless the stamp says it already was.
pub fn bundle(cfg: &Config, release: bool) -> Result<()> {
    let input = fs::read(cfg.input_wasm())
        .with_context(|| format!("reading {}", cfg.input_wasm().display()))?;
    let key = stamp_key(cfg, &input, release)?;
    let stamp_path = stamp_path(cfg);
    let pkg = cfg.pkg_dir();
    if Stamp::read(&stamp_path).is_some_and(|s| s.key == key && s.matches(&pkg)) {
        eprintln!(
            "console-build: {} is up to date (the wasm has not changed)",
            cfg.show(&pkg)
        );
        return Ok(());
    }

    // Built beside the live directory and swapped in whole, so a running server never
    // serves a half-written bundle and files of an earlier build (a chunk that no
    // longer exists) do not linger. Beside it, not in the target directory, because a
    // rename cannot cross file systems.
    let staging = cfg.site_root.join(".pkg-new");
    remove_dir_if_present(&staging)?;
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let work = cfg.front_target_dir().join("console-build");
    fs::create_dir_all(&work)?;

    let t = Instant::now();
    let main_wasm = work.join(format!("{}_split.wasm", cfg.output_name));
    let chunks = split(cfg, &input, &staging, &main_wasm)?;
    drop(input);
    bindgen(cfg, &main_wasm, &staging)?;
    eprintln!(
        "console-build: split into {} chunks and bound in {:.1} s",
        chunks.len(),
        t.elapsed().as_secs_f64()
    );

    if release {
        let t = Instant::now();
        let mut files = chunks;
        files.push(staging.join(format!("{}.wasm", cfg.output_name)));
        let n = files.len();
        optimize(&cfg.wasm_opt_args, files)?;
        eprintln!(
            "console-build: wasm-opt on {n} files in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }

    let t = Instant::now();
    let packed = crate::pack::pack(&staging, SPLIT_LOADER, SPLIT_MANIFEST)?;
    crate::site::precompress(&staging)?;
    eprintln!(
        "console-build: {} chunks in {} packs (largest {} kB), compressed in {:.1} s",
        packed.chunks,
        packed.packs.len(),
        packed.packs.values().map(|(_, n)| n).max().unwrap_or(&0) / 1000,
        t.elapsed().as_secs_f64()
    );

    let stamp = Stamp {
        key,
        files: hash_tree(&staging)?,
    };
    // The stylesheet lives in the same directory: carried into the new one so the swap
    // never leaves the site without it (it is not in the stamp, which is about the wasm).
    crate::site::style(cfg, &staging)?;
    swap_in(&staging, &pkg)?;
    stamp.write(&stamp_path)?;
    Ok(())
}

/// Splits the module at its `#[lazy]` points: the chunks and the loader go straight to
/// the bundle, the rest (the entry) to `main_wasm` for wasm-bindgen.
fn split(cfg: &Config, input: &[u8], out_dir: &Path, main_wasm: &Path) -> Result<Vec<PathBuf>> {
    let main_module = format!("./{}.js", cfg.output_name);
    let link_name = format!("./{SPLIT_LOADER}");
    let mut opts = wasm_split_cli_support::Options::new(input);
    opts.output_dir = out_dir;
    opts.main_out_path = main_wasm;
    opts.main_module = &main_module;
    opts.link_name = &link_name;
    let split = wasm_split_cli_support::transform(opts)
        .map_err(|e| anyhow!("wasm-split of {}: {e:?}", cfg.input_wasm().display()))?;
    // Sorted so the same wasm always gives the same bytes.
    let manifest: BTreeMap<_, _> = split.prefetch_map.into_iter().collect();
    fs::write(
        out_dir.join(SPLIT_MANIFEST),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(split.split_modules)
}

/// Generates the JS glue for the entry module, as the wasm-bindgen CLI does for
/// `--target web --keep-lld-exports --no-demangle`: the chunks call the entry's
/// functions by the names lld gave them, so those exports must stay and keep their
/// mangled names. No TypeScript declarations: nothing reads them.
///
/// wasm-bindgen warns that the `target_features` section is missing: the wasm-release
/// profile strips it. It then learns of reference types from the runtime's externref
/// intrinsics, as it did under cargo-leptos (which hid the CLI's output).
fn bindgen(cfg: &Config, main_wasm: &Path, out_dir: &Path) -> Result<()> {
    let mut b = Bindgen::new();
    b.web(true)?
        .input_path(main_wasm)
        .out_name(&cfg.output_name)
        .keep_lld_exports(true)
        .demangle(false)
        .typescript(false)
        // The CLI's default (Bindgen::new's is the opposite): the glue names its wasm
        // when called without a path. Leptos always passes one; kept for identical glue.
        .omit_default_module_path(false);
    b.generate(out_dir)
        .with_context(|| format!("wasm-bindgen of {}", main_wasm.display()))?;
    // Leptos's hydration script asks for `<name>.wasm`, not wasm-bindgen's `_bg` name.
    fs::rename(
        out_dir.join(format!("{}_bg.wasm", cfg.output_name)),
        out_dir.join(format!("{}.wasm", cfg.output_name)),
    )?;
    Ok(())
}

/// Runs wasm-opt on every file, one process per core: binaryen from npm runs in node,
/// a few seconds a file, and the bundle has over a hundred.
fn optimize(args: &[String], files: Vec<PathBuf>) -> Result<()> {
    check_wasm_opt()?;
    crate::cores::each(files, |file| {
        let out = Command::new("wasm-opt")
            .args(args)
            .arg(&file)
            .arg("-o")
            .arg(&file)
            .output()
            .context("starting wasm-opt")?;
        if !out.status.success() {
            bail!(
                "wasm-opt failed on {}:\n{}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    })
}

fn check_wasm_opt() -> Result<()> {
    let out = Command::new("wasm-opt").arg("--version").output().context(
        "wasm-opt not found: release bundles need binaryen (scripts/setup installs it; \
             scripts/env.sh puts it on PATH)",
    )?;
    // "wasm-opt version 132 (version_132)"
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .and_then(|v| v.parse::<u32>().ok());
    match version {
        Some(v) if v >= MIN_BINARYEN => Ok(()),
        _ => bail!(
            "wasm-opt on PATH is `{}`; release bundles need binaryen {MIN_BINARYEN} or later \
             (scripts/setup installs it; scripts/env.sh puts it on PATH)",
            text.trim()
        ),
    }
}

/// Replaces `pkg` with `staging` by two renames.
fn swap_in(staging: &Path, pkg: &Path) -> Result<()> {
    let old = staging.with_file_name(".pkg-old");
    remove_dir_if_present(&old)?;
    if pkg.exists() {
        fs::rename(pkg, &old).with_context(|| format!("moving {} aside", pkg.display()))?;
    }
    fs::rename(staging, pkg).with_context(|| format!("moving the bundle to {}", pkg.display()))?;
    remove_dir_if_present(&old)
}

fn remove_dir_if_present(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// What the bundle is made from: the wasm, the mode, wasm-opt's arguments and this
/// tool's own binary (a rebuilt console-build may split or bind differently). The
/// binary counts by size and modification time: hashing tens of MB on every run would
/// cost more than the rest of a warm run.
fn stamp_key(cfg: &Config, input: &[u8], release: bool) -> Result<String> {
    let mut h = Sha256::new();
    h.update(input);
    h.update(cfg.output_name.as_bytes());
    if release {
        h.update(b"\0release");
        for arg in &cfg.wasm_opt_args {
            h.update(b"\0");
            h.update(arg.as_bytes());
        }
    }
    let exe = std::env::current_exe().context("locating console-build's own binary")?;
    let meta = fs::metadata(&exe)?;
    let mtime = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(format!("\0{}\0{}", meta.len(), mtime.as_nanos()).as_bytes());
    Ok(hex(&h.finalize()))
}

/// One stamp per site directory (clones may share a target directory, each with its
/// own `target/site`), kept in the wasm build's target directory beside its input.
fn stamp_path(cfg: &Config) -> PathBuf {
    let site = hex(&Sha256::digest(
        cfg.pkg_dir().as_os_str().as_encoded_bytes(),
    ));
    cfg.front_target_dir()
        .join("console-build")
        .join(format!("stamp-{}", &site[..16]))
}

/// The stamp: the key on the first line, then `<sha256> <path>` for every file written.
struct Stamp {
    key: String,
    files: Vec<(String, String)>,
}

impl Stamp {
    fn read(path: &Path) -> Option<Stamp> {
        let text = fs::read_to_string(path).ok()?;
        let mut lines = text.lines();
        let key = lines.next()?.to_owned();
        let files = lines
            .map(|l| l.split_once(' ').map(|(h, p)| (p.to_owned(), h.to_owned())))
            .collect::<Option<Vec<_>>>()?;
        Some(Stamp { key, files })
    }

    fn write(&self, path: &Path) -> Result<()> {
        let mut text = format!("{}\n", self.key);
        for (file, hash) in &self.files {
            text.push_str(&format!("{hash} {file}\n"));
        }
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Whether the directory still holds every file as it was written (someone may have
    /// deleted the site or copied another build into it).
    fn matches(&self, dir: &Path) -> bool {
        !self.files.is_empty()
            && self.files.iter().all(|(file, hash)| {
                fs::read(dir.join(file)).is_ok_and(|b| hex(&Sha256::digest(&b)) == *hash)
            })
    }
}

/// `(relative path, sha256)` of every file under `dir`, sorted.
fn hash_tree(dir: &Path) -> Result<Vec<(String, String)>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                walk(root, &path, out)?;
            } else {
                let rel = path.strip_prefix(root)?;
                let rel = rel
                    .to_str()
                    .filter(|r| !r.contains(['\n', ' ']))
                    .ok_or_else(|| anyhow!("unexpected file name {}", rel.display()))?;
                out.push((rel.to_owned(), hex(&Sha256::digest(fs::read(&path)?))));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `name` is a directory this module keeps beside the bundle while building.
pub fn is_staging(name: &OsStr) -> bool {
    name == ".pkg-new" || name == ".pkg-old"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_round_trips_and_notices_a_changed_file() {
        let dir = std::env::temp_dir().join(format!("console-build-test-{}", std::process::id()));
        let pkg = dir.join("pkg");
        fs::create_dir_all(pkg.join("snippets")).unwrap();
        fs::write(pkg.join("a.wasm"), b"one").unwrap();
        fs::write(pkg.join("snippets/b.js"), b"two").unwrap();
        let stamp = Stamp {
            key: "k".into(),
            files: hash_tree(&pkg).unwrap(),
        };
        stamp.write(&dir.join("stamp")).unwrap();

        let read = Stamp::read(&dir.join("stamp")).unwrap();
        assert_eq!(read.key, "k");
        assert_eq!(read.files.len(), 2);
        assert!(read.matches(&pkg));
        fs::write(pkg.join("snippets/b.js"), b"changed").unwrap();
        assert!(!read.matches(&pkg));
        fs::remove_dir_all(&dir).unwrap();
    }
}
