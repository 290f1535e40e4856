//! The site's static files besides the wasm bundle: the stylesheet, copied as written
//! (plain CSS with no build step: cargo-leptos only ran it through lightningcss, whose
//! minifying saved ~1 kB gzipped and whose compile time is not worth it here), and the
//! assets directory mirrored to the site root. Files are written only when their bytes
//! change, so a running server and the browser's cache see no churn.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::config::Config;

/// Writes the stylesheet into `pkg_dir` as `<output-name>.css`, where the shell links it.
pub fn style(cfg: &Config, pkg_dir: &Path) -> Result<()> {
    let css = fs::read(&cfg.style_file)
        .with_context(|| format!("reading the stylesheet {}", cfg.show(&cfg.style_file)))?;
    fs::create_dir_all(pkg_dir)?;
    write_if_changed(&pkg_dir.join(format!("{}.css", cfg.output_name)), &css)
}

/// Makes the site root hold exactly the assets directory plus the generated pkg
/// directory: copies what is new or changed, removes what the assets no longer have.
pub fn assets(cfg: &Config) -> Result<()> {
    let src = &cfg.assets_dir;
    if !src.is_dir() {
        bail!("the assets directory {} does not exist", cfg.show(src));
    }
    // A `pkg` in the assets would be overwritten by (and overwrite) the bundle.
    if src.join(&cfg.site_pkg_dir).exists() {
        bail!(
            "{} holds `{}`, the name of the generated bundle's directory",
            cfg.show(src),
            cfg.site_pkg_dir
        );
    }
    let keep = |name: &std::ffi::OsStr| {
        name == cfg.site_pkg_dir.as_str() || crate::front::is_staging(name)
    };
    mirror(src, &cfg.site_root, &keep)
}

/// Mirrors `src` into `dest`, leaving alone the top-level entries `keep` names.
fn mirror(src: &Path, dest: &Path, keep: &dyn Fn(&std::ffi::OsStr) -> bool) -> Result<()> {
    fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let mut wanted = HashSet::<OsString>::new();
    for entry in fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let to = dest.join(&name);
        if entry.file_type()?.is_dir() {
            if to.is_file() {
                fs::remove_file(&to)?;
            }
            mirror(&entry.path(), &to, &|_| false)?;
        } else {
            if to.is_dir() {
                fs::remove_dir_all(&to)?;
            }
            write_if_changed(&to, &fs::read(entry.path())?)?;
        }
        wanted.insert(name);
    }
    for entry in fs::read_dir(dest)? {
        let entry = entry?;
        let name = entry.file_name();
        if wanted.contains(&name) || keep(&name) {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<()> {
    if fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_copies_changes_and_removes_leftovers_but_keeps_the_bundle() {
        let dir = std::env::temp_dir().join(format!("console-build-site-{}", std::process::id()));
        let (src, dest) = (dir.join("public"), dir.join("site"));
        fs::create_dir_all(src.join("img")).unwrap();
        fs::write(src.join("favicon.svg"), b"new").unwrap();
        fs::write(src.join("img/a.png"), b"a").unwrap();
        fs::create_dir_all(dest.join("pkg")).unwrap();
        fs::create_dir_all(dest.join("old-dir")).unwrap();
        fs::write(dest.join("pkg/hypd.js"), b"js").unwrap();
        fs::write(dest.join("favicon.svg"), b"old").unwrap();
        fs::write(dest.join("stale.txt"), b"x").unwrap();

        mirror(&src, &dest, &|n| n == "pkg").unwrap();

        assert_eq!(fs::read(dest.join("favicon.svg")).unwrap(), b"new");
        assert_eq!(fs::read(dest.join("img/a.png")).unwrap(), b"a");
        assert_eq!(fs::read(dest.join("pkg/hypd.js")).unwrap(), b"js");
        assert!(!dest.join("stale.txt").exists());
        assert!(!dest.join("old-dir").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
