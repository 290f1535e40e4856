# Sourced by the scripts: one place for the paths they share.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/hypd-target}
export HYPD_VENV=${HYPD_VENV:-$HOME/.cache/hypd/venv}
export PATH="$HOME/.cargo/bin:$HYPD_VENV/bin:$PATH"
