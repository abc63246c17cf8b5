//! The `baton` binary end to end: `baton dev` in a child process, the client commands
//! against it, their output and exit codes; and the benchmark's report.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod bench;
mod disk;
mod models;
mod new;
mod preflight;

const BIN: &str = env!("CARGO_BIN_EXE_baton");

struct Dev {
    child: Child,
    endpoint: String,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_dev(data: &Path) -> Dev {
    let port = free_port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/orchestrator.json");
    let child = Command::new(BIN)
        .args(["dev", "--addr", &format!("127.0.0.1:{port}"), "--data"])
        .arg(data)
        .arg("--script")
        .arg(script)
        .env_remove("BATON_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "baton dev did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Dev { child, endpoint }
}

fn baton(dev: &Dev, data: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--endpoint")
        .arg(&dev.endpoint)
        .arg("--data")
        .arg(data)
        .env_remove("BATON_TOKEN")
        .env_remove("BATON_ENDPOINT")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn the_cli_drives_a_run_through_a_cta_to_completion() {
    let data = tempfile::tempdir().unwrap();
    let dev = start_dev(data.path());
    // The server made a token and stored it where the client finds it, for its user's
    // eyes only, as is everything it keeps there (the database holds the link key).
    assert!(data.path().join("token").exists());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let made = data.path().join("made-by-dev");
        let dev = start_dev(&made);
        drop(dev);
        assert_eq!(mode(&made), 0o700);
        for f in [
            "token",
            "baton.lock",
            "baton.db",
            "baton.db-wal",
            "baton.db-shm",
        ] {
            let path = made.join(f);
            if f == "token" || path.exists() {
                assert_eq!(mode(&path), 0o600, "{f}");
            }
        }
    }

    let out = baton(&dev, data.path(), &["run", "Ship it", "--wait"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("status waiting"), "{text}");
    assert!(text.contains("spawn_subagent"), "{text}");
    assert!(text.contains("CTA cta_"), "{text}");
    let run_id = text.split_whitespace().nth(1).unwrap().to_owned();

    let ctas = json(&baton(&dev, data.path(), &["ctas", "--json"]));
    let cta_id = ctas["ctas"][0]["ctaId"].as_str().unwrap().to_owned();
    let listed = stdout(&baton(&dev, data.path(), &["ctas"]));
    assert!(
        listed.contains(&cta_id) && listed.contains("Proceed?"),
        "{listed}"
    );

    // A wrong kind is refused with exit code 2 and a one-line message.
    let wrong = baton(&dev, data.path(), &["answer", &cta_id, "--text", "yes"]);
    assert_eq!(wrong.status.code(), Some(2), "{wrong:?}");
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("409") && err.contains("kind"), "{err}");

    let ok = baton(&dev, data.path(), &["answer", &cta_id, "--approve"]);
    assert!(ok.status.success(), "{ok:?}");
    assert!(stdout(&ok).contains("answered"));
    let again = baton(
        &dev,
        data.path(),
        &["answer", &cta_id, "--reject", "--reason", "late"],
    );
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("409"));

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = json(&baton(&dev, data.path(), &["show", &run_id, "--json"]));
        if run["status"] == "completed" {
            assert_eq!(run["result"], "All done.");
            break;
        }
        assert!(Instant::now() < deadline, "{run:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let shown = stdout(&baton(&dev, data.path(), &["show", &run_id]));
    assert!(shown.contains("result: All done."), "{shown}");
    // The script's replies are priced as BATON_MODEL's (gpt-4o-mini by default): 4,800
    // tokens in and 98 out, and its two subagents' 768.
    assert!(
        shown.contains("tokens 4800 in / 98 out  cost $0.000779"),
        "{shown}"
    );
    assert!(
        shown.contains("(with subagents: 5666 tokens, $0.000898)"),
        "{shown}"
    );

    // A follow-up turn: the script has no fourth reply, so that turn fails, clearly.
    let said = baton(&dev, data.path(), &["say", &run_id, "and now?"]);
    assert!(said.status.success(), "{said:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = json(&baton(&dev, data.path(), &["show", &run_id, "--json"]));
        if run["status"] == "failed" {
            assert!(
                run["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("no reply 3"),
                "{run:#}"
            );
            // The first turn's usage closes it; the follow-up's turn starts after.
            assert_eq!(run["timeline"][7]["type"], "usage", "{run:#}");
            assert_eq!(run["timeline"][8]["text"], "and now?");
            break;
        }
        assert!(Instant::now() < deadline, "{run:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cancel = baton(&dev, data.path(), &["cancel", &run_id]);
    assert_eq!(cancel.status.code(), Some(2), "{cancel:?}");
    assert!(String::from_utf8_lossy(&cancel.stderr).contains("run_ended"));

    // A failed run is final: a trigger or a message is refused, saying how to go on.
    for args in [
        vec!["trigger", run_id.as_str(), "nightly"],
        vec!["say", run_id.as_str(), "still there?"],
    ] {
        let refused = baton(&dev, data.path(), &args);
        assert_eq!(refused.status.code(), Some(2), "{refused:?}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("run_ended") && err.contains("fork"), "{err}");
    }

    // On a completed run, a trigger starts a turn no one wrote (the script has no reply for
    // it, so it fails); a hidden message is marked so; bad data is refused before anything
    // is sent.
    let completed = |dev: &Dev| {
        let out = baton(
            dev,
            data.path(),
            &["run", "Look", "--agent", "explore", "--wait"],
        );
        assert!(out.status.success(), "{out:?}");
        let text = stdout(&out);
        assert!(text.contains("status completed"), "{text}");
        text.split_whitespace().nth(1).unwrap().to_owned()
    };
    let run_id = completed(&dev);
    let bad = baton(
        &dev,
        data.path(),
        &["trigger", &run_id, "nightly", "--payload", "{"],
    );
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let fired = baton(
        &dev,
        data.path(),
        &["trigger", &run_id, "nightly", "--payload", r#"{"day": 3}"#],
    );
    assert!(fired.status.success(), "{fired:?}");
    let trigger = last_turn(&dev, data.path(), &run_id, 2);
    assert_eq!(trigger["trigger"], "nightly", "{trigger}");
    assert!(trigger["text"].as_str().unwrap().contains(r#"{"day":3}"#));
    let run_id = completed(&dev);
    let hidden = baton(
        &dev,
        data.path(),
        &["say", &run_id, "psst", "--hidden", "--tier", "high"],
    );
    assert!(hidden.status.success(), "{hidden:?}");
    let said = last_turn(&dev, data.path(), &run_id, 2);
    assert_eq!(
        (&said["visible"], &said["tier"]),
        (&Value::from(false), &Value::from("high"))
    );

    // Your runs, newest first.
    let second = baton(&dev, data.path(), &["run", "Ship it again", "-q"]);
    let second = stdout(&second).trim().to_owned();
    let listed = stdout(&baton(&dev, data.path(), &["runs", "--limit", "1"]));
    assert!(
        listed.contains(&second) && listed.contains("Ship it again"),
        "{listed}"
    );
    assert!(!listed.contains(&run_id), "one a page: {listed}");
    assert!(listed.contains("more: baton runs --cursor "), "{listed}");
    let cursor = listed.rsplit("--cursor ").next().unwrap().trim();
    let next = stdout(&baton(
        &dev,
        data.path(),
        &["runs", "--limit", "1", "--cursor", cursor],
    ));
    assert!(next.contains(&run_id), "{next}");
    let mangled = baton(&dev, data.path(), &["runs", "--cursor", "a/b"]);
    assert_eq!(mangled.status.code(), Some(2), "{mangled:?}");
}

/// The run's `n`-th turn's `user` entry, once that turn has failed (the script has no reply
/// for it).
fn last_turn(dev: &Dev, data: &Path, run_id: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = json(&baton(dev, data, &["show", run_id, "--json"]));
        let users: Vec<Value> = run["timeline"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["type"] == "user")
            .cloned()
            .collect();
        if run["status"] == "failed" && users.len() == n {
            return users[n - 1].clone();
        }
        assert!(Instant::now() < deadline, "{run:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn baton_watch_follows_a_run_and_exits_with_its_outcome() {
    let data = tempfile::tempdir().unwrap();
    let dev = start_dev(data.path());
    // Followed from its start: the subagents' spawns and answers, then the question, with
    // how to answer it; exit 5 (waiting for a human).
    let out = baton(&dev, data.path(), &["run", "Ship it", "--follow"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let text = stdout(&out);
    let run_id = text
        .lines()
        .next()
        .unwrap()
        .strip_prefix("run ")
        .unwrap()
        .to_owned();
    assert!(text.contains("> Ship it"), "{text}");
    assert!(text.contains("spawn_subagent = "), "{text}");
    assert!(text.contains("Proceed?"), "{text}");
    let answer = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("answer: baton answer "))
        .unwrap_or_else(|| panic!("no way to answer: {text}"));
    assert!(
        answer.ends_with("--approve | --reject [--reason TEXT]"),
        "{answer}"
    );
    let cta_id = answer.split_whitespace().next().unwrap();

    // Watched while it waits: it waits for a human, so the watch says so at once.
    let parked = baton(&dev, data.path(), &["watch", &run_id]);
    assert_eq!(parked.status.code(), Some(5), "{parked:?}");
    assert!(stdout(&parked).contains(cta_id), "{}", stdout(&parked));
    // Answered, then watched (whether the reply is under way or done by then): the watch
    // shows the reply and exits 0.
    let answered = baton(&dev, data.path(), &["answer", cta_id, "--approve"]);
    assert!(answered.status.success(), "{answered:?}");
    let watched = baton(&dev, data.path(), &["watch", &run_id]);
    assert_eq!(watched.status.code(), Some(0), "{watched:?}");
    let text = stdout(&watched);
    assert!(text.contains("assistant: All done.\n"), "{text}");
    assert!(text.contains("status completed"), "{text}");

    // A run that fails (the script has no reply for `code`): exit 3, with why.
    let failed = baton(
        &dev,
        data.path(),
        &["run", "Fix it", "--agent", "code", "--follow"],
    );
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    assert!(
        stdout(&failed).contains("status failed"),
        "{}",
        stdout(&failed)
    );
    // An unknown run: refused, exit 2.
    let unknown = baton(&dev, data.path(), &["watch", "run_nope"]);
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
}

#[test]
fn a_second_server_on_one_data_directory_refuses_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let first = start_dev(dir.path());
    let second = Command::new(BIN)
        .args([
            "dev",
            "--addr",
            &format!("127.0.0.1:{}", free_port()),
            "--data",
        ])
        .arg(dir.path())
        .env_remove("BATON_TOKEN")
        .output()
        .unwrap();
    assert!(!second.status.success(), "the second server started");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        said.contains("in use by another Baton server")
            && said.contains(&format!("process {}", first.child.id())),
        "{said}"
    );
    // The first still serves; once it is gone (killed: the OS lets go of its lock), another
    // starts on the same directory.
    let health = Command::new(BIN)
        .args(["runs", "--endpoint", &first.endpoint, "--data"])
        .arg(dir.path())
        .env_remove("BATON_TOKEN")
        .env_remove("BATON_ENDPOINT")
        .output()
        .unwrap();
    assert!(health.status.success(), "{health:?}");
    drop(first);
    let again = start_dev(dir.path());
    drop(again);
}

#[test]
fn bad_input_and_refused_requests_exit_with_code_2() {
    let data = tempfile::tempdir().unwrap();
    let dev = start_dev(data.path());
    let cases: Vec<Vec<&str>> = vec![
        vec!["answer", "cta_x"],                             // no answer flag
        vec!["answer", "cta_x", "--approve", "--text", "y"], // two answers
        vec!["answer", "cta_missing", "--approve"],          // 404
        vec!["show", "run_missing"],                         // 404
        vec!["show", "../etc"],                              // not an id
        vec!["run", "x", "--sandbox", "no spaces"],          // 400
        vec!["run", "x", "--agent", "nobody"],               // 400
        vec!["frobnicate"],                                  // unknown command
    ];
    for args in cases {
        let out = baton(&dev, data.path(), &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    let out = Command::new(BIN)
        .args(["ctas", "--endpoint", &dev.endpoint, "--token", "wrong"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    // An unreachable server is not the caller's fault: exit 1.
    let out = Command::new(BIN)
        .args([
            "ctas",
            "--endpoint",
            &format!("http://127.0.0.1:{}", free_port()),
            "--token",
            "t",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn dev_aws_without_an_emulator_refuses_unless_told_it_is_real() {
    // No AWS_ENDPOINT_URL: no resources may be created in whatever account is configured.
    let out = Command::new(BIN)
        .args(["dev", "--aws", "--addr", "127.0.0.1:0"])
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--yes-real-aws"), "{err}");
    assert!(err.contains("AWS_ENDPOINT_URL"), "{err}");
    // The flag only makes sense with --aws.
    let out = Command::new(BIN)
        .args(["dev", "--yes-real-aws"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // An invalid variable stops start-up with its name.
    let out = Command::new(BIN)
        .args(["dev", "--addr", "127.0.0.1:0"])
        .env("BATON_LLM_MAX_RETRIES", "lots")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("BATON_LLM_MAX_RETRIES"));
}

// moto's server, started as the workspace's scenario tests start it: the `moto_server` on
// `PATH`, else the one their virtualenv under `target/` gets from PyPI (no set-up step).
#[path = "../../../tests/tests/common/moto.rs"]
mod moto;
#[allow(dead_code)]
#[path = "../../../tests/tests/common/python.rs"]
mod python;

/// The target directory these tests were built in (the test binary is
/// `<target>/<profile>/deps/<name>`): where `python.rs` keeps its virtualenv.
fn target_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Sends SIGTERM, as a process manager or `kill` does, and waits for the exit.
fn terminate(dev: &mut Dev) -> std::process::ExitStatus {
    let pid = dev.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = dev.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_stops_both_dev_servers_gracefully_and_a_parked_run_resumes_at_once() {
    let moto = moto::Moto::start();
    let data = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/orchestrator.json");
    let start = |aws: bool| {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.args(["dev", "--addr", &format!("127.0.0.1:{port}"), "--data"])
            .arg(data.path())
            .arg("--script")
            .arg(&script)
            .env("BATON_TOKEN", "t0k")
            .env("AWS_ENDPOINT_URL", &moto.url)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if aws {
            cmd.arg("--aws");
        }
        let child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "baton dev did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Dev {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    };
    let client = |dev: &Dev, args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .arg("--endpoint")
            .arg(&dev.endpoint)
            .env("BATON_TOKEN", "t0k")
            .output()
            .unwrap()
    };
    for aws in [false, true] {
        let mut dev = start(aws);
        let out = client(&dev, &["run", "Ship it", "--wait", "--json"]);
        let run = json(&out);
        assert_eq!(run["status"], "waiting", "{run:#}");
        let run_id = run["runId"].as_str().unwrap().to_owned();
        let status = terminate(&mut dev);
        assert!(
            status.success(),
            "aws={aws}: SIGTERM must stop gracefully: {status:?}"
        );
        // Started again, the parked run takes its answer at once: nothing was left in
        // flight to wait out a visibility timeout.
        let dev = start(aws);
        let ctas = json(&client(&dev, &["ctas", "--json"]));
        let cta = ctas["ctas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["runId"] == run_id.as_str())
            .unwrap()["ctaId"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            client(&dev, &["answer", &cta, "--approve"])
                .status
                .success()
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let run = json(&client(&dev, &["show", &run_id, "--json"]));
            if run["status"] == "completed" {
                break;
            }
            assert!(Instant::now() < deadline, "aws={aws}: {run:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Every `baton` command line in the README's and the docs' code blocks names a subcommand
/// and flags that its `--help` lists, and no usage line shows an option as required that is
/// not: the help and the documentation say the same.
#[test]
fn the_help_of_every_subcommand_agrees_with_the_readme_and_the_docs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    let mut checked = 0;
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut in_code = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if !in_code {
                continue;
            }
            // Each command of the line: `$(…)` substitutions taken out as commands of their
            // own, then the line cut at pipes and `;`/`&`.
            let mut rest = line.to_owned();
            let mut commands = Vec::new();
            while let Some(open) = rest.rfind("$(") {
                let Some(len) = rest[open..].find(')') else {
                    break;
                };
                commands.push(rest[open + 2..open + len].to_owned());
                rest.replace_range(open..open + len + 1, "X");
            }
            commands.push(rest);
            let commands: Vec<String> = commands
                .iter()
                .flat_map(|c| c.split(['|', ';', '&']).map(str::to_owned))
                .collect();
            for command in commands {
                checked += check_baton_command(&page, line, &command);
            }
        }
    }
    assert!(checked > 20, "only {checked} flags found");
}

/// Checks one shell command: if it is `baton <sub> [flags]` (after env assignments or a
/// path), its subcommand exists and its `--help` lists each flag. Returns the flags checked.
fn check_baton_command(page: &Path, line: &str, command: &str) -> usize {
    let words: Vec<&str> = command.split_whitespace().collect();
    let Some(at) = words
        .iter()
        .position(|w| *w == "baton" || w.ends_with("/baton"))
    else {
        return 0;
    };
    let Some(sub) = words
        .get(at + 1)
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase()))
    else {
        return 0;
    };
    let help = Command::new(BIN).args([sub, "--help"]).output().unwrap();
    assert!(
        help.status.success(),
        "{}: `baton {sub}` is no command: {line}",
        page.display()
    );
    let help = String::from_utf8_lossy(&help.stdout);
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(!usage.contains("--endpoint"), "{usage}");
    let mut checked = 0;
    for word in words[at + 2..].iter().take_while(|w| !w.starts_with('#')) {
        let flag = word.trim_matches(|c| matches!(c, '[' | ']' | '"' | ')'));
        let flag = flag.split('=').next().unwrap_or_default();
        if flag.starts_with('-') && flag.len() > 1 {
            assert!(
                help.contains(flag),
                "{}: `baton {sub} {flag}` is not in its --help: {line}",
                page.display()
            );
            checked += 1;
        }
    }
    checked
}

/// `baton dev --users`: a file that is not one, and agents whose questions go to someone it
/// does not know, stop the start with exit code 2 and a line naming the problem.
#[test]
fn a_users_file_is_checked_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.json");
    let agents = dir.path().join("agents.json");
    let start = |users_text: &str, agents_text: &str| {
        std::fs::write(&users, users_text).unwrap();
        std::fs::write(&agents, agents_text).unwrap();
        Command::new(BIN)
            .args(["dev", "--addr", "127.0.0.1:0", "--data"])
            .arg(dir.path().join("data"))
            .arg("--users")
            .arg(&users)
            .arg("--agents")
            .arg(&agents)
            .env_remove("BATON_TOKEN")
            .output()
            .unwrap()
    };
    let team = r#"{"agents": {"a": {"tools": [], "questions": {"assignees": ["group:ops", "user:zed"]}}}}"#;
    let alice =
        r#"{"users": [{"token": "alice-token-0123456789", "user": "alice", "groups": ["ops"]}]}"#;
    let cases = [
        (
            r#"{"users": [{"token": "short", "user": "alice"}]}"#,
            team,
            "shorter than 16",
        ),
        (
            r#"{"users": [{"token": "alice-token-0123456789", "user": "local"}]}"#,
            team,
            "the server's owner",
        ),
        (r#"{"people": []}"#, team, "unknown field"),
        (alice, team, "`user:zed`, whom the users file does not know"),
    ];
    for (users_text, agents_text, says) in cases {
        let out = start(users_text, agents_text);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{users_text}: {err}");
        assert!(err.contains(says), "{users_text}: {err}");
    }
}

/// `baton dev` with an e-mail channel needs an SMTP server to send through: without
/// BATON_SMTP_URL, or with one that is not an `smtp(s)://` URL, it does not start (exit code
/// 2, a line naming the channel or the variable, and never the URL's password).
#[test]
fn an_e_mail_channel_needs_a_good_smtp_url_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents.json");
    std::fs::write(
        &agents,
        r#"{"notifiers": {"ops-mail": {"type": "email", "from": "baton@example.com",
                                       "to": {"group:ops": "ops@example.com"}}},
            "agents": {"a": {"tools": [], "questions": {"assignees": ["group:ops"], "notify": ["ops-mail"]}}}}"#,
    )
    .unwrap();
    let start = |smtp: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["dev", "--addr", "127.0.0.1:0", "--data"])
            .arg(dir.path().join("data"))
            .arg("--agents")
            .arg(&agents)
            .env_remove("BATON_TOKEN")
            .env_remove("BATON_SMTP_URL");
        if let Some(url) = smtp {
            cmd.env("BATON_SMTP_URL", url);
        }
        cmd.output().unwrap()
    };
    for (smtp, says) in [
        (None, "e-mail channels (`ops-mail`) need an SMTP server"),
        (
            Some("http://user:s3cret@mail.example.com"),
            "BATON_SMTP_URL",
        ),
    ] {
        let out = start(smtp);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{smtp:?}: {err}");
        assert!(
            err.contains(says) && !err.contains("s3cret"),
            "{smtp:?}: {err}"
        );
    }
}
