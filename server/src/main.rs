//! The `hypd` binary: everything lives in the library so tests drive the same code.

fn main() -> std::process::ExitCode {
    hypd::faces::cli::main()
}
