//! The browser the console's test drives, and the client that drives it, which no one here
//! wrote: Debian's Chromium (`apt-get install chromium`, done here when missing and allowed)
//! and Playwright's Node client, `playwright-core` from npm (installed under `target/` from
//! `tests/browser/package-lock.json` the first time; it never downloads a browser). Without
//! them the test fails saying what is missing; it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::python::run;

/// Chromium's executable: `BATON_CHROMIUM`, else Debian's, installed if missing (as root).
pub fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("BATON_CHROMIUM") {
        return PathBuf::from(p);
    }
    let debian = PathBuf::from("/usr/bin/chromium");
    if !debian.exists() {
        once("chromium", || {
            run(Command::new("apt-get")
                .args(["install", "-y", "-q", "chromium"])
                .env("DEBIAN_FRONTEND", "noninteractive"))
        });
    }
    assert!(
        debian.exists(),
        "the console's browser test needs Chromium: install Debian's (apt-get install chromium) \
         or set BATON_CHROMIUM"
    );
    debian
}

/// The `node_modules` holding `playwright-core`, installed once with `npm ci`.
pub fn node_modules() -> PathBuf {
    npm_ci("browser", "browser-node", "playwright-core")
}

/// The `node_modules` of `tests/<src>/package-lock.json`, installed once under
/// `target/<name>` with `npm ci` (`package` is one it must hold). Installed means its
/// `installed.json` holds that lock, written once `npm ci` has finished: a test that found
/// it missing and waited for another's install does not run `npm ci` again (which empties
/// `node_modules` under the test already using it), and a cut-off install is done again.
pub fn npm_ci(src: &str, name: &str, package: &str) -> PathBuf {
    let root = super::target_dir().join(name);
    let modules = root.join("node_modules");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let lock = std::fs::read(src.join("package-lock.json")).expect("the package lock");
    let marker = root.join("installed.json");
    let installed = || std::fs::read(&marker).is_ok_and(|m| m == lock);
    if !installed() {
        once(name, || {
            if installed() {
                return Ok(());
            }
            std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
            for f in ["package.json", "package-lock.json"] {
                std::fs::copy(src.join(f), root.join(f)).map_err(|e| format!("{f}: {e}"))?;
            }
            run(Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
                .current_dir(&root))?;
            std::fs::write(&marker, &lock).map_err(|e| e.to_string())
        });
    }
    assert!(
        modules.join(package).join("package.json").exists(),
        "{name}: npm ci installed no {package}"
    );
    modules
}

/// Runs `f` in one test process at a time (a lock directory under `target/`).
fn once(name: &str, f: impl FnOnce() -> Result<(), String>) {
    let lock = super::target_dir().join(format!("{name}.lock"));
    let _ = std::fs::create_dir_all(lock.parent().expect("parent"));
    let deadline = Instant::now() + Duration::from_secs(600);
    while std::fs::create_dir(&lock).is_err() {
        assert!(
            Instant::now() < deadline,
            "waited 10 minutes for {}",
            lock.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = f();
    let _ = std::fs::remove_dir(&lock);
    if let Err(e) = result {
        panic!("cannot set up {name} for the tests: {e}");
    }
}

/// Runs the browser script `tests/browser/<name>` with `cfg` (its `BATON_BROWSER`), given
/// the browser and the client it drives, and fails unless it says it all passed.
pub async fn run_script(name: &str, mut cfg: serde_json::Value) {
    cfg["chromium"] = serde_json::json!(chromium());
    cfg["nodeModules"] = serde_json::json!(node_modules());
    cfg["shots"] = serde_json::json!(super::target_dir().join("browser-artifacts"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("browser")
        .join(name);
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .env("BATON_BROWSER", cfg.to_string())
            .output()
            .expect("node runs")
    })
    .await
    .expect("the script's thread");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{said}");
    assert!(out.status.success(), "the browser test failed:\n{said}");
    assert!(said.contains("browser: all passed"), "{said}");
}
