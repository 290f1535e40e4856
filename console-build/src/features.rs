//! Whether `cargo test` would compile the server a second time. Cargo resolves
//! features per build, and a test build adds those the dev-dependencies turn on: any
//! crate whose features differ is compiled again, with everything above it up to the
//! server. server/Cargo.toml turns those features on for the normal build as well;
//! this check notices when a new dev-dependency makes the two sets drift apart again.

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail};

use crate::config::Config;

/// Prints a warning naming the features only the test build has, on crates the
/// server's build also compiles (a crate only tests use costs nothing twice).
pub fn warn_if_tests_differ(cfg: &Config) -> Result<()> {
    let build = resolve(cfg, "features,normal,build")?;
    let test = resolve(cfg, "features")?;
    let extra = only_in_tests(&build, &test);
    if !extra.is_empty() {
        eprintln!(
            "console-build: warning: `cargo test` turns on features this build does not ({}), \
             so it will compile the server and what it uses again; turn them on in \
             server/Cargo.toml's [dependencies] too (see the comment there)",
            extra.join(", ")
        );
    }
    Ok(())
}

/// `crate/feature` for each feature the test build turns on, on a crate the build has.
fn only_in_tests(
    (build_crates, build_features): &(Crates, Features),
    (_, test_features): &(Crates, Features),
) -> Vec<String> {
    test_features
        .difference(build_features)
        .filter(|(krate, _)| build_crates.contains(krate))
        .map(|(krate, feature)| format!("{krate}/{feature}"))
        .collect()
}

type Crates = BTreeSet<String>;
type Features = BTreeSet<(String, String)>;

/// The crates and `(crate, feature)` pairs of the default members' build along the given
/// kinds of edges (`cargo tree`, which resolves features as a build of them would).
fn resolve(cfg: &Config, edges: &str) -> Result<(Crates, Features)> {
    let out = crate::cargo::command()
        .current_dir(&cfg.workspace_root)
        .args(["tree", "--prefix", "none", "-e", edges])
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo tree failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

/// Reads `cargo tree --prefix none -e features` lines: `name vX.Y.Z …` for a crate,
/// `name feature "f"` for one of its features, either possibly followed by ` (*)`.
fn parse(tree: &str) -> (Crates, Features) {
    let mut crates = Crates::new();
    let mut features = Features::new();
    for line in tree.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some(second)) = (words.next(), words.next()) else {
            continue;
        };
        if second == "feature" {
            if let Some(feature) = words.next() {
                features.insert((name.to_owned(), feature.trim_matches('"').to_owned()));
            }
        } else if second.starts_with('v') {
            crates.insert(name.to_owned());
        }
    }
    (crates, features)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_crates_and_features() {
        let (crates, features) = parse(
            "server v0.1.0 (/ws/server)\nreqwest v0.12.28\nreqwest feature \"blocking\"\n\
             reqwest feature \"json\" (*)\n\n",
        );
        assert_eq!(crates, ["reqwest", "server"].map(String::from).into());
        assert!(features.contains(&("reqwest".into(), "blocking".into())));
        assert!(features.contains(&("reqwest".into(), "json".into())));
        assert_eq!(features.len(), 2);
    }

    #[test]
    fn names_test_features_of_shared_crates_only() {
        let build = parse("server v0.1.0\nreqwest v0.12.28\nreqwest feature \"json\"\n");
        let test = parse(
            "server v0.1.0\nreqwest v0.12.28\nreqwest feature \"json\"\n\
             reqwest feature \"blocking\"\ntempfile v3.27.0\ntempfile feature \"default\"\n",
        );
        assert_eq!(only_in_tests(&build, &test), ["reqwest/blocking"]);
        assert!(only_in_tests(&build, &build).is_empty());
    }
}
