//! `baton new DIR`: a project of the user's own, outside Baton's checkout, that depends on
//! Baton's crates by one line (`baton-sdk`, by git tag or by path) and adds its own tools.
//!
//! What it writes comes from Baton's own files where Baton has them, so that it cannot drift
//! from them: the template (`template.yaml`, as Baton deploys it: the project's functions sit
//! at the same `functions/<name>` paths), `samconfig.toml`, `clippy.toml`, the release
//! profile, the lints,
//! the versions of the crates the tools use, `Cargo.lock` (the versions Baton was tested
//! with), and the tools crate itself, which is `examples/starter` (built and tested in
//! Baton's workspace). The rest is the templates in `new/`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::{TEMPLATE, refuse};

#[derive(Args)]
pub struct NewArgs {
    /// The project's directory: new, or empty.
    dir: PathBuf,
    /// The project's name (a crate name: lowercase letters, digits, `-`; default: DIR's name).
    #[arg(long)]
    name: Option<String>,
    /// Depend on the Baton checkout at this path (for trying a change to Baton, and for CI).
    #[arg(long, conflicts_with_all = ["baton_git", "baton_tag"])]
    baton_path: Option<PathBuf>,
    /// Depend on Baton's repository at this git URL, at --baton-tag.
    #[arg(long)]
    baton_git: Option<String>,
    /// The tag of --baton-git to build with [default: this baton's version, v0.1.0].
    #[arg(long, requires = "baton_git")]
    baton_tag: Option<String>,
}

/// The tools crate (`examples/starter`), as Baton builds and tests it.
const STARTER: [(&str, &str); 3] = [
    ("lib.rs", include_str!("../../examples/starter/src/lib.rs")),
    (
        "github.rs",
        include_str!("../../examples/starter/src/github.rs"),
    ),
    (
        "skills.rs",
        include_str!("../../examples/starter/src/skills.rs"),
    ),
];
const STARTER_MANIFEST: &str = include_str!("../../examples/starter/Cargo.toml");
const WORKSPACE: &str = include_str!("../../Cargo.toml");
const LOCK: &str = include_str!("../../Cargo.lock");
const SAMCONFIG: &str = include_str!("../../samconfig.toml");
const CLIPPY: &str = include_str!("../../clippy.toml");

/// The Lambda functions: name, `baton-sdk` feature, role, and whether its catalog is built
/// (the live channel's authorizer builds none).
const FUNCTIONS: [(&str, &str, &str, bool); 5] = [
    ("api", "api", "Api", true),
    ("orchestrator", "steps", "Steps", true),
    ("subagent", "steps", "Steps", true),
    ("events", "events", "Events", true),
    ("live", "lambda", "LiveAuthorizer", false),
];

pub fn run(args: &NewArgs) -> ExitCode {
    let files = match plan(args) {
        Ok(files) => files,
        Err(e) => return refuse(e),
    };
    match write(&args.dir, &files) {
        Ok(()) => {
            println!(
                "baton new: wrote {} files in {}; next: cd {} && cargo test (its README says the rest)",
                files.len(),
                args.dir.display(),
                args.dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("baton: new: {e} (nothing of the project was kept)");
            ExitCode::FAILURE
        }
    }
}

/// Every file of the project, by its path under DIR; or why not (nothing is written).
fn plan(args: &NewArgs) -> Result<Vec<(PathBuf, String)>, String> {
    match std::fs::read_dir(&args.dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!(
                    "new: {} is not empty (give a new or an empty directory)",
                    args.dir.display()
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("new: {}: {e}", args.dir.display())),
    }
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.to_lowercase().replace('_', "-"))
            .ok_or_else(|| format!("new: {} has no name: give --name", args.dir.display()))?,
    };
    check_name(&name)?;
    let baton = baton_dependency(args)?;
    let tools = format!("{}_tools", name.replace('-', "_"));
    let vars = |text: &str| {
        text.replace("{{name}}", &name)
            .replace("{{tools}}", &tools)
            .replace("{{version}}", env!("CARGO_PKG_VERSION"))
    };

    let mut files: Vec<(PathBuf, String)> = vec![
        ("Cargo.toml".into(), vars(&manifest(&baton)?)),
        ("Cargo.lock".into(), LOCK.to_owned()),
        ("template.yaml".into(), TEMPLATE.to_owned()),
        ("samconfig.toml".into(), samconfig(&name)?),
        ("README.md".into(), vars(include_str!("new/README.md"))),
        ("ci.sh".into(), vars(include_str!("new/ci.sh"))),
        (
            ".gitignore".into(),
            "/target\n/.aws-sam\n/.baton\n".to_owned(),
        ),
        ("clippy.toml".into(), CLIPPY.to_owned()),
        (
            "script.json".into(),
            include_str!("new/script.json").to_owned(),
        ),
        ("tools/Cargo.toml".into(), tools_manifest(&name)?),
        ("dev/Cargo.toml".into(), vars(include_str!("new/dev.toml"))),
        ("dev/src/main.rs".into(), vars(include_str!("new/dev.rs"))),
    ];
    for (file, text) in STARTER {
        files.push((Path::new("tools/src").join(file), text.to_owned()));
    }
    for (function, feature, role, catalog) in FUNCTIONS {
        let fvars = |text: &str| {
            vars(text)
                .replace("{{function}}", function)
                .replace("{{feature}}", feature)
                .replace("{{role}}", role)
        };
        let (toml, main) = match catalog {
            true => (
                include_str!("new/function.toml"),
                include_str!("new/function.rs"),
            ),
            false => (include_str!("new/live.toml"), include_str!("new/live.rs")),
        };
        let dir = Path::new("functions").join(function);
        files.push((dir.join("Cargo.toml"), fvars(toml)));
        files.push((dir.join("src/main.rs"), fvars(main)));
    }
    Ok(files)
}

/// A crate name a user would type: Cargo takes more, but a project's name becomes its tools
/// crate's (`NAME-tools`) and a stack's name, and both take this much.
fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    match ok {
        true => Ok(()),
        false => Err(format!(
            "new: `{name}` is not a project name: lowercase letters, digits and `-`, starting \
             with a letter, at most 40 (give one with --name)"
        )),
    }
}

/// `baton-sdk`'s line in the project's `[workspace.dependencies]`.
fn baton_dependency(args: &NewArgs) -> Result<String, String> {
    match (&args.baton_path, &args.baton_git) {
        (Some(path), _) => {
            let path = std::fs::canonicalize(path)
                .map_err(|e| format!("new: --baton-path {}: {e}", path.display()))?;
            if !path.join("shared/sdk/Cargo.toml").is_file() {
                return Err(format!(
                    "new: --baton-path {} is not a Baton checkout (no shared/sdk/Cargo.toml)",
                    path.display()
                ));
            }
            let sdk = path.join("shared/sdk");
            let sdk = sdk
                .to_str()
                .ok_or_else(|| format!("new: --baton-path {} is not UTF-8", path.display()))?;
            Ok(format!("{{ path = {} }}", toml_string(sdk)))
        }
        (None, Some(url)) => {
            let tag = args
                .baton_tag
                .clone()
                .unwrap_or_else(|| format!("v{}", env!("CARGO_PKG_VERSION")));
            Ok(format!(
                "{{ git = {}, tag = {} }}",
                toml_string(url),
                toml_string(&tag)
            ))
        }
        (None, None) => Err(
            "new: say where Baton's crates come from: --baton-git URL (at --baton-tag, default \
             this baton's version) or --baton-path DIR (a checkout)"
                .to_owned(),
        ),
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The project's workspace manifest: the template, with Baton's lints and profiles and the
/// versions of the crates the tools use, taken from Baton's own manifest.
fn manifest(baton: &str) -> Result<String, String> {
    let mut deps = String::new();
    for krate in [
        "base64", "reqwest", "schemars", "serde", "tokio", "wiremock",
    ] {
        let line = WORKSPACE
            .lines()
            .find(|l| l.starts_with(&format!("{krate} = ")))
            .ok_or_else(|| format!("new: Baton's Cargo.toml names no `{krate}`"))?;
        deps.push_str(line);
        deps.push('\n');
    }
    let lints = section(WORKSPACE, "[workspace.lints.rust]", "[profile.release]")?;
    let profiles = &WORKSPACE[WORKSPACE
        .find("[profile.release]")
        .ok_or("new: Baton's Cargo.toml has no release profile")?..];
    Ok(include_str!("new/Cargo.toml")
        .replace("{{baton}}", baton)
        .replace("{{dependencies}}", deps.trim_end())
        .replace("{{lints_and_profiles}}", &format!("{lints}{profiles}")))
}

/// From `start` up to (not including) `end`.
fn section<'a>(text: &'a str, start: &str, end: &str) -> Result<&'a str, String> {
    let a = text
        .find(start)
        .ok_or_else(|| format!("new: Baton's Cargo.toml has no {start}"))?;
    let b = text[a..]
        .find(end)
        .ok_or_else(|| format!("new: Baton's Cargo.toml has no {end} after {start}"))?;
    Ok(&text[a..a + b])
}

/// Baton's samconfig.toml, the stack named after the project.
fn samconfig(name: &str) -> Result<String, String> {
    let line = "stack_name = \"baton\"";
    if !SAMCONFIG.contains(line) {
        return Err("new: Baton's samconfig.toml names no stack".to_owned());
    }
    Ok(SAMCONFIG.replace(line, &format!("stack_name = \"{name}\"")))
}

/// The starter's manifest, as the project's `tools` crate.
fn tools_manifest(name: &str) -> Result<String, String> {
    let mut out = String::new();
    for line in STARTER_MANIFEST.lines() {
        if line.starts_with("name = ") {
            out.push_str(&format!("name = \"{name}-tools\"\n"));
        } else if line.starts_with("description = ") {
            out.push_str(&format!(
                "description = \"{name}'s own tools, plugins and agents, over Baton.\"\n"
            ));
        } else if !line.starts_with("license.") {
            out.push_str(line);
            out.push('\n');
        }
    }
    match out.contains(&format!("name = \"{name}-tools\"")) {
        true => Ok(out),
        false => Err("new: the starter's Cargo.toml has no name".to_owned()),
    }
}

/// Writes every file, or none: on an error what was written goes (and DIR, if this made it).
fn write(dir: &Path, files: &[(PathBuf, String)]) -> std::io::Result<()> {
    let made = !dir.exists();
    let result = (|| {
        std::fs::create_dir_all(dir)?;
        for (path, text) in files {
            let path = dir.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, text)?;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join("ci.sh"), std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(())
    })();
    if result.is_err() {
        if made {
            let _ = std::fs::remove_dir_all(dir);
        } else if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let _ = match entry.path().is_dir() {
                    true => std::fs::remove_dir_all(entry.path()),
                    false => std::fs::remove_file(entry.path()),
                };
            }
        }
    }
    result
}
