//! `baton`: the local dev server, a client for any Baton API, the benchmarks and `baton new`,
//! with Baton's built-in agents and tools (a project's own `dev` binary adds its own).

/// mimalloc, not the system's: with many runs stepping on a few threads, glibc's malloc
/// took a sixth of the CPU (`baton bench --runs 100`, docs/performance.md, "Many runs at once").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Where transparent huge pages are `always` (a common kernel default), each range
    // mimalloc frees and reuses faults in a fresh 2 MB page to zero: a tenth of the CPU of
    // `baton bench --runs 100 --iterations 100` (task clock 3.1-3.2 s with them, 2.7-2.9 s
    // without). The flag is the process's; children it starts (stdio MCP servers) inherit
    // it. Best effort: a kernel without the flag keeps its huge pages.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    baton_cli::main(Default::default())
}
