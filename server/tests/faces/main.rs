//! `hypd` as a process, through each of its faces: REST (`api`), the command line
//! (`cli`), the live channel (`events`) and the listener, probes and logs (`serve`). One
//! test binary, as `operations` is one: each links the whole server, and on two cores
//! every extra link is a minute of every build.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod cli;
mod events;
mod serve;
