//! The `baton` binary end to end: `baton dev` in a child process, the client commands
//! against it, their output and exit codes; and the benchmark's report.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

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
        vec!["run", ""],                                     // 400
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
fn the_benchmark_prints_one_json_line_for_both_variants() {
    for variant in ["A", "B"] {
        let v = bench_report(&["--iterations", "40", "--variant", variant]);
        for key in [
            "iterations",
            "variant",
            "wall_s",
            "per_step_ms",
            "steps_per_s",
            "db_bytes",
            "peak_rss_mb",
            "written",
            "fsyncs_per_step",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert_eq!(v["iterations"], 40);
        assert_eq!(v["variant"], variant);
        assert!(v["db_bytes"].as_u64().unwrap() > 40 * 500, "{v}");
        // A lone run's step commits alone: one synced commit each (the store's checkpoints
        // add a little), no step left unsynced.
        let fsyncs = v["fsyncs_per_step"].as_f64().unwrap();
        assert!((1.0..1.5).contains(&fsyncs), "{v}");
        assert_machine_figures(&v);
    }
    // Observed as `baton dev` observes (the default), or not at all, to compare; with no
    // OTLP endpoint set, no exporter is made either way.
    for telemetry in ["dev", "none"] {
        let v = bench_report(&["--iterations", "20", "--telemetry", telemetry]);
        assert_eq!(v["telemetry"], telemetry);
        assert_eq!(v["steps"], 21, "{v}");
    }
    for bad in [
        &["bench", "--iterations", "0"][..],
        &["bench", "--iterations", "2", "--parked", "0"],
        &["bench", "--iterations", "2", "--parked", "5", "--runs", "5"],
        &["bench", "--iterations", "20", "--telemetry", "otlp"],
        &[
            "bench",
            "--iterations",
            "20",
            "--runs",
            "2",
            "--telemetry",
            "none",
        ],
    ] {
        let out = Command::new(BIN).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

/// Runs `baton bench` with `args`; it must succeed and print one JSON line, returned.
fn bench_report(args: &[&str]) -> Value {
    let out = Command::new(BIN).arg("bench").args(args).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert_eq!(text.trim().lines().count(), 1, "{text}");
    serde_json::from_str(text.trim()).unwrap()
}

/// What the machine gave the benchmark: the disk's own sync time (a median and a 90th
/// percentile) and the share of CPU time the hypervisor gave to other guests.
fn assert_machine_figures(v: &Value) {
    let steal = v["cpu_steal_pct"].as_f64();
    assert!(
        matches!(steal, Some(p) if (0.0..=100.0).contains(&p)),
        "cpu_steal_pct in {v}"
    );
    let (p50, p90) = (
        v["disk_sync"]["p50_ms"].as_f64(),
        v["disk_sync"]["p90_ms"].as_f64(),
    );
    assert!(
        // (On a tmpfs a sync may round to 0.)
        matches!((p50, p90), (Some(a), Some(b)) if a >= 0.0 && a <= b),
        "disk_sync in {v}"
    );
}

/// Parked runs: each parks on its question, holds little while it waits, and completes
/// once when answered (the benchmark checks every run, and fails otherwise).
#[test]
fn two_hundred_parked_runs_are_answered_in_any_order_and_complete_once() {
    let v = bench_report(&["--parked", "200", "--iterations", "2"]);
    assert_eq!(v["all_completed_once"], true, "{v}");
    assert_eq!(v["parked"], 200);
    assert_eq!(v["inbox_first_page"]["count"], 20, "{v}");
    assert!(v["rss_mb_parked"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn a_thousand_runs_at_once_all_complete_through_the_api() {
    let v = bench_report(&["--runs", "1000", "--iterations", "3"]);
    // The benchmark itself reads every run back and fails unless each completed with its
    // three echo results in its timeline.
    assert_eq!(v["all_completed"], true, "{v}");
    assert_eq!(v["runs"], 1000);
    // Each run's three echo steps and its answer were all stepped (the step timings count
    // only what had finished when the last run was seen complete: a run's final step may
    // still be acknowledging its message then).
    let stepped = v["steps_with_cached_timeline"].as_u64().unwrap()
        + v["steps_loading_timeline"].as_u64().unwrap();
    assert!(stepped >= 4000, "{v}");
    assert!(v["steps"].as_u64().unwrap() >= 3000, "{v}");
    assert_eq!(v["api_creates"]["count"], 1000, "{v}");
    assert!(v["steps_per_s"].as_f64().unwrap() > 0.0, "{v}");
    // Many runs' commits shared each fsync.
    assert!(v["steps_per_synced_commit"].as_f64().unwrap() > 1.0, "{v}");
    assert!(v["fsyncs_per_step"].as_f64().unwrap() < 1.0, "{v}");
    assert_machine_figures(&v);
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
#[path = "../../tests/tests/common/moto.rs"]
mod moto;
#[allow(dead_code)]
#[path = "../../tests/tests/common/python.rs"]
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

/// `baton dev` started as a README recipe starts it: no `--script`, the model configured by
/// the environment alone (`envs`; every model variable not named is unset). Its stdout and
/// stderr go to files in `data`.
fn start_dev_as_users_do(data: &Path, args: &[&str], envs: &[(&str, String)]) -> Dev {
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["dev", "--addr", &format!("127.0.0.1:{port}"), "--data"])
        .arg(data)
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .stdout(std::fs::File::create(data.join("stdout")).unwrap())
        .stderr(std::fs::File::create(data.join("stderr")).unwrap());
    for var in [
        "BATON_TOKEN",
        "BATON_MODEL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
        "BATON_AGENTS_FILE",
        "BATON_AGENTS_JSON",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "baton dev exited ({status}): {}",
                std::fs::read_to_string(data.join("stderr")).unwrap()
            );
        }
        assert!(Instant::now() < deadline, "baton dev did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Dev {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    }
}

/// Starts a run of `agent` and waits until it finishes; returns the run.
fn run_to_the_end(dev: &Dev, data: &Path, agent: &str) -> Value {
    let out = baton(
        dev,
        data,
        &["run", "Say hello", "--agent", agent, "--wait", "--json"],
    );
    let run = json(&out);
    assert_eq!(run["status"], "completed", "{run:#}");
    run
}

/// An OpenAI-compatible chat completion that says `text`.
fn openai_reply(text: &str) -> wiremock::ResponseTemplate {
    wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}))
}

/// An Anthropic Messages reply that says `text`.
fn anthropic_reply(text: &str) -> wiremock::ResponseTemplate {
    wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 12, "output_tokens": 3}}))
}

#[tokio::test]
async fn baton_dev_runs_with_each_real_model_configuration_of_the_readme() {
    use wiremock::matchers::{header, method, path, path_regex};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-test"))
        .respond_with(openai_reply("Hello from OpenAI."))
        .mount(&mock)
        .await;
    Mock::given(method("POST"))
        .and(path("/local/v1/chat/completions"))
        .respond_with(openai_reply("Hello from llama."))
        .mount(&mock)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "sk-ant-test"))
        .respond_with(anthropic_reply("Hello from Claude."))
        .mount(&mock)
        .await;
    Mock::given(method("POST"))
        .and(path_regex("^/model/[^/]+/converse$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "output": {"message": {"role": "assistant", "content": [{"text": "Hello from Bedrock."}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15},
            "metrics": {"latencyMs": 4}})))
        .mount(&mock)
        .await;
    let uri = mock.uri();
    let aws = |k: &'static str, v: &str| (k, v.to_owned());
    // (name, environment, the run's answer, what start-up says)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        // OPENAI_API_KEY=sk-... BATON_MODEL=gpt-4o-mini baton dev
        (
            "openai",
            vec![
                ("OPENAI_API_KEY", "sk-test".into()),
                ("OPENAI_BASE_URL", format!("{uri}/v1")),
                ("BATON_MODEL", "gpt-4o-mini".into()),
            ],
            "Hello from OpenAI.",
            "model openai:gpt-4o-mini at",
        ),
        // OPENAI_BASE_URL=http://127.0.0.1:11434/v1 BATON_MODEL=llama3.1 baton dev
        (
            "local server, no key",
            vec![
                ("OPENAI_BASE_URL", format!("{uri}/local/v1")),
                ("BATON_MODEL", "llama3.1".into()),
            ],
            "Hello from llama.",
            "model openai:llama3.1 at",
        ),
        (
            "anthropic",
            vec![
                ("ANTHROPIC_API_KEY", "sk-ant-test".into()),
                ("ANTHROPIC_BASE_URL", uri.clone()),
                ("BATON_MODEL", "anthropic:claude-sonnet-4-5".into()),
            ],
            "Hello from Claude.",
            "model anthropic:claude-sonnet-4-5 at",
        ),
        (
            "bedrock",
            vec![
                aws("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", &uri),
                aws("AWS_REGION", "us-east-1"),
                aws("AWS_ACCESS_KEY_ID", "AKIDTEST"),
                aws("AWS_SECRET_ACCESS_KEY", "secret"),
                (
                    "BATON_MODEL",
                    "bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0".into(),
                ),
            ],
            "Hello from Bedrock.",
            "model bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0 at Amazon Bedrock",
        ),
    ];
    for (name, envs, answer, says) in cases {
        let data = tempfile::tempdir().unwrap();
        let mut dev = start_dev_as_users_do(data.path(), &[], &envs);
        let run = run_to_the_end(&dev, data.path(), "orchestrator");
        assert_eq!(run["result"], answer, "{name}: {run:#}");
        assert_eq!(run["usage"]["totalTokens"], 15, "{name}: {run:#}");
        let status = terminate(&mut dev);
        assert!(status.success(), "{name}: {status:?}");
        let stdout = std::fs::read_to_string(data.path().join("stdout")).unwrap();
        assert!(stdout.contains(says), "{name}: {stdout}");
        let stderr = std::fs::read_to_string(data.path().join("stderr")).unwrap();
        let warned = stderr.contains("warning: OPENAI_API_KEY is not set");
        assert_eq!(warned, name == "local server, no key", "{name}: {stderr}");
    }
    // The local server was sent no key.
    let requests = mock.received_requests().await.unwrap();
    let local: Vec<_> = requests
        .iter()
        .filter(|r| r.url.path().starts_with("/local/"))
        .collect();
    assert!(!local.is_empty());
    assert!(
        local
            .iter()
            .all(|r| !r.headers.contains_key("authorization"))
    );
}

#[tokio::test]
async fn baton_dev_runs_the_examples_agents_file_and_names_the_variables_it_needs() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer};
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(anthropic_reply("Order 7 shipped."))
        .mount(&mock)
        .await;
    let data = tempfile::tempdir().unwrap();
    // Without the variables its headers use, it does not start, and says which.
    let out = Command::new(BIN)
        .args(["dev", "--addr", "127.0.0.1:0", "--data"])
        .arg(data.path())
        .args(["--agents", "examples/agents.json"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env_remove("ORDERS_KEY")
        .env_remove("CALC_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CALC_TOKEN") || err.contains("ORDERS_KEY"),
        "{err}"
    );
    // With them (and a model for its `ops` agent) a run of `ops` completes.
    let envs = [
        ("ORDERS_KEY", "k".to_owned()),
        ("CALC_TOKEN", "t".to_owned()),
        ("ANTHROPIC_API_KEY", "sk-ant-test".to_owned()),
        ("ANTHROPIC_BASE_URL", mock.uri()),
        ("AWS_REGION", "us-east-1".to_owned()),
    ];
    let mut dev = start_dev_as_users_do(data.path(), &["--agents", "examples/agents.json"], &envs);
    let run = run_to_the_end(&dev, data.path(), "ops");
    assert_eq!(run["result"], "Order 7 shipped.", "{run:#}");
    assert!(terminate(&mut dev).success());
    let stdout = std::fs::read_to_string(data.path().join("stdout")).unwrap();
    for says in [
        "model anthropic:claude-sonnet-4-5 at",
        "for ops",
        "model bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0",
        "for researcher",
    ] {
        assert!(stdout.contains(says), "{says}: {stdout}");
    }
}

#[test]
fn baton_dev_starts_with_the_repo_agents_example_once_its_sandboxes_are_named() {
    // As docs/agents.md starts it: without BATON_SANDBOXES it names the variable and stops.
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["dev", "--addr", "127.0.0.1:0", "--data"])
        .arg(data.path())
        .args(["--agents", "examples/repo-agents.json"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env_remove("BATON_SANDBOXES")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("BATON_SANDBOXES"),
        "{out:?}"
    );
    // With it, it serves: a run whose subagents have no sandbox starts no MCP server (each
    // is started per sandbox) and parks on its question as the script says.
    let sandboxes = tempfile::tempdir().unwrap();
    let envs = [("BATON_SANDBOXES", sandboxes.path().display().to_string())];
    let args = [
        "--agents",
        "examples/repo-agents.json",
        "--script",
        "examples/orchestrator.json",
    ];
    let dev = start_dev_as_users_do(data.path(), &args, &envs);
    let run = json(&baton(
        &dev,
        data.path(),
        &["run", "Ship it", "--wait", "--json"],
    ));
    assert_eq!(run["status"], "waiting", "{run:#}");
}

#[test]
fn baton_dev_runs_the_plan_example_through_its_approval() {
    let data = tempfile::tempdir().unwrap();
    let dev = start_dev_as_users_do(data.path(), &["--script", "examples/plan.json"], &[]);
    let run = json(&baton(
        &dev,
        data.path(),
        &["run", "Fix billing", "--wait", "--json"],
    ));
    assert_eq!(run["status"], "waiting", "{run:#}");
    let ctas = json(&baton(&dev, data.path(), &["ctas", "--json"]));
    let cta = ctas["ctas"][0]["ctaId"].as_str().unwrap().to_owned();
    assert!(
        baton(&dev, data.path(), &["answer", &cta, "--approve"])
            .status
            .success()
    );
    let run_id = run["runId"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = json(&baton(&dev, data.path(), &["show", run_id, "--json"]));
        if run["status"] == "completed" {
            let tool = run["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "agent_orchestrate")
                .cloned()
                .unwrap();
            assert_eq!(tool["result"]["output"]["success"], true, "{tool:#}");
            break;
        }
        assert!(Instant::now() < deadline, "{run:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The control side of a `baton dev` whose data directory is on a 16 MB disk of its own (a
/// tmpfs in a mount namespace of its own, so no privilege is needed): the test asks a
/// shell in that namespace to fill the disk or free it, through files in `ctl`.
struct SmallDisk {
    dev: Dev,
    ctl: tempfile::TempDir,
}

impl SmallDisk {
    fn start(envs: &[(&str, String)]) -> SmallDisk {
        let ctl = tempfile::tempdir().unwrap();
        let mnt = ctl.path().join("disk");
        std::fs::create_dir(&mnt).unwrap();
        let port = free_port();
        let script = r#"
            set -e
            mount -t tmpfs -o size=16m tmpfs "$MNT"
            "$BIN" dev --addr "127.0.0.1:$PORT" --data "$MNT/data" >"$CTL/stdout" 2>"$CTL/stderr" &
            dev=$!
            while [ ! -e "$CTL/stop" ]; do
              if [ -e "$CTL/fill" ]; then
                rm "$CTL/fill"
                cat /dev/zero >"$MNT/filler" 2>/dev/null || true
                touch "$CTL/filled"
              fi
              if [ -e "$CTL/free" ]; then
                rm "$CTL/free" "$MNT/filler"
                touch "$CTL/freed"
              fi
              sleep 0.05
            done
            kill -TERM $dev
            wait $dev
        "#;
        let mut cmd = Command::new("unshare");
        cmd.args(["--user", "--map-root-user", "--mount", "bash", "-c", script])
            .env("MNT", &mnt)
            .env("CTL", ctl.path())
            .env("BIN", BIN)
            .env("PORT", port.to_string())
            .env_remove("BATON_TOKEN")
            .env("BATON_TOKEN", "t0k")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("unshare (util-linux) runs");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "baton dev on a small disk exited ({status}): {}",
                    std::fs::read_to_string(ctl.path().join("stderr")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "baton dev did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        SmallDisk {
            dev: Dev {
                child,
                endpoint: format!("http://127.0.0.1:{port}"),
            },
            ctl,
        }
    }

    /// Asks the namespace's shell to do `what` (`fill`, `free`) and waits until it has.
    fn ask(&self, what: &str, done: &str) {
        std::fs::write(self.ctl.path().join(what), "").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ctl.path().join(done).exists() {
            assert!(Instant::now() < deadline, "{what} never done");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn client(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .arg("--endpoint")
            .arg(&self.dev.endpoint)
            .env("BATON_TOKEN", "t0k")
            .output()
            .unwrap()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::fs::write(self.ctl.path().join("stop"), "");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && matches!(self.dev.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[tokio::test]
async fn after_a_full_disk_is_freed_every_accepted_run_finishes_within_a_minute() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer};
    // Each think takes 1.5 s: the disk fills while the runs think.
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(openai_reply("Done.").set_delay(Duration::from_millis(1500)))
        .mount(&mock)
        .await;
    let disk = SmallDisk::start(&[("OPENAI_BASE_URL", format!("{}/v1", mock.uri()))]);
    let runs: Vec<String> = (0..8)
        .map(|i| {
            let run = json(&disk.client(&["run", &format!("task {i}"), "--json"]));
            run["runId"].as_str().unwrap().to_owned()
        })
        .collect();
    disk.ask("fill", "filled");
    // A request that must write is refused, saying why, and changes nothing.
    let refused = disk.client(&["run", "one more"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("503") && err.contains("disk"), "{err}");
    // The runs' commits fail while it is full (nothing can be recorded on the run then: its
    // `lastError` is a write too); the log says why, and they wait.
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = disk.ctl.path().join("stderr");
    let found_full = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("step failed; it will be retried")
                    && l.contains("the disk holding the data directory is full")
            })
    };
    while !found_full() {
        assert!(Instant::now() < deadline, "no step found the disk full");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Minutes of failures would dead-letter a run for a cause that is not its own: none is.
    std::thread::sleep(Duration::from_secs(12));
    disk.ask("free", "freed");
    let freed = Instant::now();
    for id in &runs {
        loop {
            let run = json(&disk.client(&["show", id, "--json"]));
            if run["status"] == "completed" {
                assert_eq!(run["result"], "Done.", "{run:#}");
                break;
            }
            assert_ne!(run["status"], "failed", "{run:#}");
            assert!(
                freed.elapsed() < Duration::from_secs(60),
                "not finished a minute after the disk was freed: {run:#}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    eprintln!(
        "all runs finished {:?} after the disk was freed",
        freed.elapsed()
    );
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

/// A stand-in of Lambda's `GetAccountSettings` (moto has none), answering as AWS documents
/// it: an account of `total` concurrent executions, `unreserved` of them not reserved.
async fn lambda_account(total: u32, unreserved: u32) -> wiremock::MockServer {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers};
    let server = MockServer::start().await;
    Mock::given(matchers::method("GET"))
        .and(matchers::path_regex("^/2016-08-19/account-settings/?$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "AccountLimit": {"TotalCodeSize": 80530636800u64, "CodeSizeUnzipped": 262144000,
                             "CodeSizeZipped": 52428800, "ConcurrentExecutions": total,
                             "UnreservedConcurrentExecutions": unreserved},
            "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": 0}})))
        .mount(&server)
        .await;
    server
}

/// Service Quotas (awsJson 1.1) on `server`: Bedrock's quotas as the account has them (its
/// tokens-per-minute quota lowered to 400,000) and AWS's defaults.
async fn bedrock_quotas(server: &wiremock::MockServer) {
    use wiremock::{Mock, ResponseTemplate, matchers};
    let quota = |name: &str, code: &str, value: f64| {
        serde_json::json!({"ServiceCode": "bedrock", "ServiceName": "Amazon Bedrock",
            "QuotaName": name, "QuotaCode": code, "Value": value, "Unit": "None",
            "Adjustable": true, "GlobalQuota": false,
            "QuotaArn": format!("arn:aws:servicequotas:us-east-1:123456789012:bedrock/{code}")})
    };
    let tpm = "Cross-Region InvokeModel tokens per minute for Anthropic Claude Haiku 4.5";
    let rpm = "Cross-Region InvokeModel requests per minute for Anthropic Claude Haiku 4.5";
    let other = "On-demand InvokeModel tokens per minute for Anthropic Claude Haiku 4.5";
    for (target, quotas) in [
        ("ListServiceQuotas", vec![quota(tpm, "L-TPM", 400_000.0)]),
        (
            "ListAWSDefaultServiceQuotas",
            vec![
                quota(tpm, "L-TPM", 4_000_000.0),
                quota(rpm, "L-RPM", 800.0),
                quota(other, "L-OD", 4_000_000.0),
            ],
        ),
    ] {
        Mock::given(matchers::method("POST"))
            .and(matchers::header(
                "x-amz-target",
                format!("ServiceQuotasV20190624.{target}").as_str(),
            ))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "application/x-amz-json-1.1")
                    .set_body_json(serde_json::json!({"Quotas": quotas})),
            )
            .mount(server)
            .await;
    }
}

#[tokio::test]
async fn preflight_says_whether_the_account_can_run_the_stack() {
    let preflight = |url: String, args: &[&str]| {
        let out = Command::new(BIN)
            .arg("preflight")
            .args(args)
            .env("AWS_ENDPOINT_URL", url)
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (
            out.status.code(),
            text + &String::from_utf8_lossy(&out.stderr),
        )
    };
    // An established account: 1,000, none reserved. The defaults' 156 fit.
    let big = lambda_account(1000, 1000).await;
    let (code, text) = preflight(big.uri(), &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("may run 156 invocations at once"), "{text}");
    assert!(
        text.contains("OrchestratorFunction") && text.contains("52"),
        "{text}"
    );
    // A new account's 10: not even the mappings' least fit; it says what to do.
    let new = lambda_account(10, 10).await;
    let (code, text) = preflight(
        new.uri(),
        &["--parameter-overrides", "StepsMaxConcurrency=2"],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("NO") && text.contains("higher quota"),
        "{text}"
    );
    // Too many asked of a large account; a reservation that leaves Lambda less than 100.
    let (code, text) = preflight(
        big.uri(),
        &["--parameter-overrides", "StepsMaxConcurrency=400"],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("may run 1206 invocations"), "{text}");
    let (code, text) = preflight(
        big.uri(),
        &[
            "--parameter-overrides",
            "ReservedConcurrency=460",
            "StepsMaxConcurrency=50",
        ],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("at most 450"), "{text}");
    let (code, text) = preflight(
        big.uri(),
        &["--parameter-overrides", "ReservedConcurrency=40"],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("give it at least 52"), "{text}");
    // A stack name whose queue names would pass SQS's 80 characters.
    let long = "a".repeat(57);
    let (code, text) = preflight(big.uri(), &["--stack-name", &long]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("at most 56"), "{text}");
    // An agent thinking with Bedrock: the model's per-minute quotas (Service Quotas, the
    // account's value over the default) against the step functions' invocations at once.
    let bedrock = lambda_account(1000, 1000).await;
    bedrock_quotas(&bedrock).await;
    let model = "Model=bedrock:global.anthropic.claude-haiku-4-5-20251001-v1:0";
    let (code, text) = preflight(bedrock.uri(), &["--parameter-overrides", model]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("NO   Bedrock `Cross-Region InvokeModel tokens per minute")
            && text.contains("(L-TPM) is 400000")
            && text.contains("104 invocations"),
        "{text}"
    );
    let (code, text) = preflight(
        bedrock.uri(),
        &["--parameter-overrides", model, "StepsMaxConcurrency=20"],
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("ok   Bedrock") && text.contains("(L-RPM) is 800"),
        "{text}"
    );
    // Without Bedrock, its quotas are not read.
    let (_, text) = preflight(big.uri(), &[]);
    assert!(text.contains("its quotas not read"), "{text}");
    // Bad input: exit 2, said.
    for bad in [
        &["--parameter-overrides", "NoSuchParameter=1"][..],
        &["--parameter-overrides", "=1"],
    ] {
        let (code, text) = preflight(big.uri(), bad);
        assert_eq!(code, Some(2), "{bad:?}: {text}");
    }
}
