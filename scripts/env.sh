# Sourced by the scripts: one place for the paths they share.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/hypd-target}
export HYPD_VENV=${HYPD_VENV:-$HOME/.cache/hypd/venv}
# The MLflow the sim's tracking servers are (scripts/setup installs it in the venv); a
# sim without it gives them a URL nothing answers.
export HYPD_SIM_MLFLOW=${HYPD_SIM_MLFLOW:-$HYPD_VENV/bin/mlflow}
# wasm-opt for release bundles: binaryen from npm (scripts/setup installs it). Debian's
# binaryen 108 rewrites the wasm-bindgen externref table's export to the function
# table, which breaks a split bundle at load.
export HYPD_BINARYEN=${HYPD_BINARYEN:-$HOME/.cache/hypd/binaryen}
# The MCP conformance suite and the Node 22 it runs on (scripts/setup --tests installs
# both; end2end/py/test_conformance.py puts their bin directory first on its PATH).
export HYPD_CONFORMANCE=${HYPD_CONFORMANCE:-$HOME/.cache/hypd/conformance}
export PATH="$HOME/.cargo/bin:$HYPD_VENV/bin:$HYPD_BINARYEN/node_modules/.bin:$PATH"
