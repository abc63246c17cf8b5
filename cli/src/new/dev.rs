//! This project's `baton`: Baton's command line — `dev` (the API, the console and the
//! worker on an embedded store), the client (`run`, `show`, `ctas`, `answer`, ...), `bench`,
//! `template` — with this project's tools, plugins and agents in its catalog.
//! `cargo run -p dev -- --help` lists the commands.

fn main() -> std::process::ExitCode {
    baton_sdk::dev::main({{tools}}::extensions())
}
