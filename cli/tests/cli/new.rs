//! `baton new`: a project of one's own, written whole or not at all; `baton template`.

use std::path::Path;
use std::process::Command;

use super::BIN;

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn new(args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("new").args(args).output().unwrap()
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

#[test]
fn baton_new_writes_a_project_over_batons_own_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shop-bot");
    let repo = repo();
    let out = new(&[
        dir.to_str().unwrap(),
        "--baton-path",
        repo.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");

    let manifest = read(dir.join("Cargo.toml"));
    let sdk = repo.join("shared/sdk");
    assert!(
        manifest.contains(&format!("baton-sdk = {{ path = \"{}\" }}", sdk.display())),
        "{manifest}"
    );
    assert!(manifest.contains("shop-bot-tools = { path = \"tools\" }"));
    // Baton's release profile and lints, as Baton's manifest has them.
    assert!(manifest.contains("lto = \"fat\"") && manifest.contains("unsafe_code = \"forbid\""));
    // Baton's own files, as they are.
    assert_eq!(
        read(dir.join("template.yaml")),
        read(repo.join("template.yaml"))
    );
    assert_eq!(read(dir.join("Cargo.lock")), read(repo.join("Cargo.lock")));
    assert_eq!(
        read(dir.join("clippy.toml")),
        read(repo.join("clippy.toml"))
    );
    for file in ["lib.rs", "github.rs", "skills.rs"] {
        assert_eq!(
            read(dir.join("tools/src").join(file)),
            read(repo.join("examples/starter/src").join(file)),
            "{file}"
        );
    }
    assert!(read(dir.join("tools/Cargo.toml")).contains("name = \"shop-bot-tools\""));
    assert!(read(dir.join("samconfig.toml")).contains("stack_name = \"shop-bot\""));
    // Each function is one call over the project's tools; the live channel's authorizer
    // builds no catalog and links none of them.
    for (f, role) in [
        ("api", "Api"),
        ("orchestrator", "Steps"),
        ("subagent", "Steps"),
        ("events", "Events"),
    ] {
        let main = read(dir.join(format!("functions/{f}/src/main.rs")));
        assert!(
            main.contains(&format!(
                "baton_sdk::lambda::main(baton_sdk::lambda::Role::{role}, shop_bot_tools::extensions())"
            )),
            "{f}: {main}"
        );
    }
    assert!(!read(dir.join("functions/live/Cargo.toml")).contains("shop-bot-tools"));
    assert!(
        read(dir.join("dev/src/main.rs"))
            .contains("baton_sdk::dev::main(shop_bot_tools::extensions())")
    );
    let readme = read(dir.join("README.md"));
    assert!(readme.starts_with("# shop-bot\n") && readme.contains("## Upgrade Baton"));
    let ci = std::fs::metadata(dir.join("ci.sh")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(ci.permissions().mode() & 0o111, 0o111, "ci.sh runs");
    assert!(
        !read(dir.join("README.md")).contains("{{"),
        "every placeholder filled"
    );
    assert!(!manifest.contains("{{"));

    // By git: the URL, at this version's tag unless one is given.
    let git = tmp.path().join("other");
    let out = new(&[
        git.to_str().unwrap(),
        "--baton-git",
        "https://git.example.com/baton.git",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(read(git.join("Cargo.toml")).contains(&format!(
        "baton-sdk = {{ git = \"https://git.example.com/baton.git\", tag = \"v{}\" }}",
        env!("CARGO_PKG_VERSION")
    )));
}

#[test]
fn baton_new_refuses_with_code_2_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo();
    let repo = repo.to_str().unwrap();
    let refused = |args: &[&str], says: &str| {
        let out = new(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    };
    let fresh = tmp.path().join("fresh");
    let fresh = fresh.to_str().unwrap();
    refused(&[fresh], "say where Baton's crates come from");
    refused(&[fresh, "--baton-path", "/"], "is not a Baton checkout");
    refused(
        &[fresh, "--name", "Shop Bot", "--baton-path", repo],
        "is not a project name",
    );
    refused(&[fresh, "--baton-tag", "v9"], "--baton-git");
    assert!(!Path::new(fresh).exists(), "nothing written");
    // A directory that holds something is not written into.
    let used = tmp.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("notes.txt"), "mine").unwrap();
    refused(
        &[used.to_str().unwrap(), "--baton-path", repo],
        "is not empty",
    );
    let left: Vec<_> = std::fs::read_dir(&used).unwrap().collect();
    assert_eq!(left.len(), 1);
    assert_eq!(read(used.join("notes.txt")), "mine");
}

#[test]
fn baton_template_prints_the_template_it_deploys() {
    let out = Command::new(BIN).arg("template").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        read(repo().join("template.yaml"))
    );
}
