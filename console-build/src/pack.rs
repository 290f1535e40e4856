//! One request per page: wasm-split cuts the bundle into a chunk per set of split points
//! that share code (over a hundred files, dozens per page), and a console reached
//! through an SSM tunnel pays a round trip for each. Here every split point gets a
//! *pack*, the concatenation of every chunk it needs, and the split loader is rewritten
//! to fetch a split point's pack once and instantiate its chunks from slices of it.
//!
//! The loader is wasm-split's generated JS, edited in place: its format is that of the
//! `wasm_split_cli_support` version in Cargo.lock, and every edit checks that it found
//! exactly what it expects, so a changed format fails the build instead of the page.
//! The manifest Leptos reads to preload a page's chunks is rewritten to name the pack,
//! so the server's `<link rel="preload">` and the loader's fetch are the same request.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};

/// What [`pack`] made: per split point, its pack's file stem and size.
pub struct Packed {
    pub packs: BTreeMap<String, (String, usize)>,
    pub chunks: usize,
}

/// The pack of split point `split` (a manifest key): a `.wasm` name because Leptos's
/// preload links append `.wasm` to whatever the manifest lists.
fn pack_stem(split: &str) -> String {
    format!("pack_{}", split.trim_start_matches('_'))
}

/// Replaces the chunk files of `pkg` with one pack per split point and rewrites the
/// loader (`loader`) and the manifest (`manifest`) to use them.
pub fn pack(pkg: &Path, loader: &str, manifest: &str) -> Result<Packed> {
    let manifest_path = pkg.join(manifest);
    let splits: BTreeMap<String, Vec<String>> =
        serde_json::from_str(&fs::read_to_string(&manifest_path)?)
            .with_context(|| format!("reading {}", manifest_path.display()))?;
    let loader_path = pkg.join(loader);
    let js = fs::read_to_string(&loader_path)
        .with_context(|| format!("reading {}", loader_path.display()))?;

    // Each split point's own module ("split_<name>") is in its pack and no other's:
    // loading it is what opens the pack (see the loader's `packed`).
    let mut index = BTreeMap::<String, (String, Vec<(String, usize, usize)>)>::new();
    let mut new_manifest = BTreeMap::<String, Vec<String>>::new();
    let mut packs = BTreeMap::new();
    let mut chunks = std::collections::BTreeSet::new();
    for (split, stems) in &splits {
        let own = stems
            .iter()
            .find(|s| s.starts_with("split_"))
            .with_context(|| format!("the manifest lists no own module for {split}"))?;
        let stem = pack_stem(split);
        let mut bytes = Vec::new();
        let mut slices = Vec::new();
        for s in stems {
            let chunk = fs::read(pkg.join(format!("{s}.wasm")))
                .with_context(|| format!("reading chunk {s} of {split}"))?;
            slices.push((s.clone(), bytes.len(), chunk.len()));
            bytes.extend_from_slice(&chunk);
            chunks.insert(s.clone());
        }
        fs::write(pkg.join(format!("{stem}.wasm")), &bytes)?;
        packs.insert(split.clone(), (stem.clone(), bytes.len()));
        index.insert(own.clone(), (stem.clone(), slices));
        new_manifest.insert(split.clone(), vec![stem]);
    }
    let js = rewrite_loader(&js, &index, chunks.len())?;
    for c in &chunks {
        fs::remove_file(pkg.join(format!("{c}.wasm")))?;
    }
    fs::write(&loader_path, js)?;
    fs::write(&manifest_path, serde_json::to_string_pretty(&new_manifest)?)?;
    Ok(Packed {
        packs,
        chunks: chunks.len(),
    })
}

/// The loader's own fetch of one module, and what replaces it.
const FETCH_OPEN: &str = "fetch(new URL(\"./";
const FETCH_CLOSE: &str = ".wasm\", import.meta.url))";
const STREAMING: &str = "WebAssembly.instantiateStreaming(src, imports)";
const FROM_BYTES: &str = "WebAssembly.instantiate(await src, imports)";
/// In `makeLoad`, dependencies are started before the module itself; the module must go
/// first, since fetching a split point's own module is what opens its pack.
const DEPS_FIRST: &str =
    "const parallelStuff = deps.map(d => d());\n        const instantiate = fetcher();";
const MODULE_FIRST: &str =
    "const instantiate = fetcher();\n        const parallelStuff = deps.map(d => d());";

/// Each module's pack: own module → pack stem and the slices (module, start, end) of
/// every module in it.
type PackIndex = BTreeMap<String, (String, Vec<(String, usize, usize)>)>;

/// Rewrites wasm-split's loader: every module comes from `packed(name)`, and a split
/// point's own module opens its pack (`index`: own module → pack stem and the slices of
/// every module in it).
fn rewrite_loader(js: &str, index: &PackIndex, chunks: usize) -> Result<String> {
    ensure!(
        js.matches(DEPS_FIRST).count() == 1,
        "the split loader's makeLoad is not the one this build knows (wasm_split_cli_support changed?)"
    );
    let mut js = js.replacen(DEPS_FIRST, MODULE_FIRST, 1);
    let mut out = String::with_capacity(js.len());
    let mut fetches = 0;
    let mut rest = js.as_str();
    while let Some(at) = rest.find(FETCH_OPEN) {
        let after = &rest[at + FETCH_OPEN.len()..];
        let end = after
            .find(FETCH_CLOSE)
            .context("an unterminated fetch in the split loader")?;
        let name = &after[..end];
        out.push_str(&rest[..at]);
        out.push_str(&format!("packed({name:?})"));
        rest = &after[end + FETCH_CLOSE.len()..];
        fetches += 1;
    }
    out.push_str(rest);
    if fetches != chunks {
        bail!("the split loader fetches {fetches} modules; the manifest names {chunks}");
    }
    if out.matches(STREAMING).count() != fetches {
        bail!("the split loader does not instantiate each module it fetches by streaming");
    }
    js = out.replace(STREAMING, FROM_BYTES);

    let table: serde_json::Map<String, serde_json::Value> = index
        .iter()
        .map(|(own, (stem, slices))| {
            let slices: serde_json::Map<_, _> = slices
                .iter()
                .map(|(m, at, len)| (m.clone(), serde_json::json!([at, len])))
                .collect();
            (
                own.clone(),
                serde_json::json!({ "url": format!("./{stem}.wasm"), "modules": slices }),
            )
        })
        .collect();
    js.push_str(&format!(
        "\n// Added by console-build (console-build/src/pack.rs): every module comes from its\n\
         // split point's pack, fetched once for all the modules it holds.\n\
         const PACKS = {};\n{}",
        serde_json::Value::Object(table),
        PACKED_JS
    ));
    Ok(js)
}

/// `packed(name)`: the bytes of module `name`. A split point's own module fetches its
/// pack and hands every module in it that is not already known its slice; any other
/// module was handed one by the pack of the split point that needs it, because
/// `makeLoad` fetches the split point's own module before its dependencies. A failed
/// fetch is forgotten, so the next load tries again.
const PACKED_JS: &str = r#"const modules = new Map();
function packed(name) {
    const pack = PACKS[name];
    if (pack !== undefined) {
        const whole = fetch(new URL(pack.url, import.meta.url)).then(r => {
            if (!r.ok) throw new Error(`${pack.url}: ${r.status} ${r.statusText}`);
            return r.arrayBuffer();
        });
        for (const [module, [at, len]] of Object.entries(pack.modules)) {
            if (modules.has(module)) continue;
            const slice = whole.then(b => b.slice(at, at + len));
            modules.set(module, slice);
            slice.catch(() => { if (modules.get(module) === slice) modules.delete(module); });
        }
    }
    const bytes = modules.get(name);
    if (bytes === undefined) return Promise.reject(new Error(`no pack holds ${name}`));
    return bytes;
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    const LOADER: &str = r#"function makeLoad(fetcher, deps) {
    const loader = async () => {
        const parallelStuff = deps.map(d => d());
        const instantiate = fetcher();
        await Promise.all(parallelStuff);
    };
}
const __chunk_1 = makeLoad(() => {
    const src = fetch(new URL("./chunk_1.wasm", import.meta.url));
    return async (imports) => (WebAssembly.instantiateStreaming(src, imports));
}
, []);
export const __wasm_split_load_a = wrapAsyncCb(makeLoad(() => {
    const src = fetch(new URL("./split_a.wasm", import.meta.url));
    return async (imports) => (WebAssembly.instantiateStreaming(src, imports));
}
, [__chunk_1]));
"#;

    #[test]
    fn chunks_become_one_pack_per_split_point_and_the_loader_reads_it() {
        let dir = std::env::temp_dir().join(format!("console-build-pack-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("chunk_1.wasm"), b"ONE").unwrap();
        fs::write(dir.join("split_a.wasm"), b"AA").unwrap();
        fs::write(dir.join("loader.js"), LOADER).unwrap();
        fs::write(dir.join("m.json"), r#"{"a": ["chunk_1", "split_a"]}"#).unwrap();

        let packed = pack(&dir, "loader.js", "m.json").unwrap();

        assert_eq!(packed.chunks, 2);
        assert_eq!(fs::read(dir.join("pack_a.wasm")).unwrap(), b"ONEAA");
        assert!(!dir.join("chunk_1.wasm").exists() && !dir.join("split_a.wasm").exists());
        let manifest = fs::read_to_string(dir.join("m.json")).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&manifest).unwrap(),
            serde_json::json!({"a": ["pack_a"]})
        );
        let js = fs::read_to_string(dir.join("loader.js")).unwrap();
        assert!(!js.contains("fetch(new URL(\"./chunk"), "{js}");
        assert!(js.contains(r#"packed("chunk_1")"#) && js.contains(r#"packed("split_a")"#));
        assert!(js.contains(MODULE_FIRST));
        assert!(js.contains(
            r#"{"split_a":{"modules":{"chunk_1":[0,3],"split_a":[3,2]},"url":"./pack_a.wasm"}}"#
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_loader_of_another_shape_fails_the_build() {
        let index = BTreeMap::new();
        let err = rewrite_loader("function makeLoad() {}", &index, 0).unwrap_err();
        assert!(err.to_string().contains("makeLoad"), "{err}");
    }
}
