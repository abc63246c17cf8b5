//! A full disk: `baton dev` on a 16 MB tmpfs that fills and empties, every accepted run
//! finishing once it is freed.

use super::models::openai_reply;
use super::*;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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
