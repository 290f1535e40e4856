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

/// Writes the stylesheet into `pkg_dir` as `<output-name>.css`, where the shell links it,
/// with its compressed copies.
pub fn style(cfg: &Config, pkg_dir: &Path) -> Result<()> {
    let css = fs::read(&cfg.style_file)
        .with_context(|| format!("reading the stylesheet {}", cfg.show(&cfg.style_file)))?;
    fs::create_dir_all(pkg_dir)?;
    let path = pkg_dir.join(format!("{}.css", cfg.output_name));
    write_if_changed(&path, &css)?;
    write_compressed(&path, &css)
}

/// The extensions of the files a browser downloads from the bundle directory.
const SERVED: [&str; 3] = ["wasm", "js", "css"];

/// Writes `.br` and `.gz` beside every file under `dir` that a browser downloads, for the
/// server to send as they are: brotli at its highest quality is ~20% smaller than gzip on
/// wasm and far too slow to run per request, and gzip stays for clients without brotli.
/// One thread per core, the largest files first.
pub fn precompress(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    served_files(dir, &mut files)?;
    files.sort_by_key(|(len, _)| *len);
    crate::cores::each(files, |(_, path)| {
        write_compressed(&path, &fs::read(&path)?)
    })
}

fn served_files(dir: &Path, out: &mut Vec<(u64, std::path::PathBuf)>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            served_files(&path, out)?;
        } else if path
            .extension()
            .is_some_and(|e| SERVED.iter().any(|s| e == *s))
        {
            out.push((entry.metadata()?.len(), path));
        }
    }
    Ok(())
}

/// `path.br` and `path.gz` made from `bytes` (the contents of `path`), written when
/// they differ from what is there.
fn write_compressed(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let with = |ext: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(ext);
        std::path::PathBuf::from(name)
    };
    let mut br = Vec::new();
    let params = brotli::enc::BrotliEncoderParams {
        quality: 11,
        lgwin: 22,
        ..Default::default()
    };
    brotli::BrotliCompress(&mut &bytes[..], &mut br, &params)
        .with_context(|| format!("brotli of {}", path.display()))?;
    write_if_changed(&with(".br"), &br)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes)?;
    write_if_changed(&with(".gz"), &gz.finish()?)
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
