//! The Python programs the tests run, which no one here wrote: the MCP Python SDK (its
//! FastMCP server), `mcp-server-time` and `mcp-server-git`, published MCP servers, and
//! aiosmtpd (an SMTP server). They are installed into
//! a virtualenv under `target/` the first time a test needs them (`python3 -m venv` and
//! `pip install`, from PyPI), so `cargo test` needs no set-up step. Without python3 or
//! PyPI these tests fail, saying why; they never skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What the virtualenv holds; a change makes a new one. moto (the AWS emulator) is there for
/// a machine that has no `moto_server` of its own.
const REQUIREMENTS: &[&str] = &[
    "mcp<2",
    "mcp-server-time",
    "mcp-server-git==2026.10.10",
    "moto[dynamodb,sqs,events,scheduler]",
    "flask",
    "flask-cors",
    "opentelemetry-proto==1.45.2",
    "protobuf>=5.29,<8",
    "prometheus-client",
    "mcp-proxy==0.13.0",
    "aiosmtpd",
];

/// The virtualenv's `bin` directory, created and filled once (across test processes: the
/// first takes a lock directory, the others wait for its `ready` mark).
pub fn venv_bin() -> PathBuf {
    let root = super::target_dir().join("test-python");
    let bin = root.join("bin");
    let ready = root.join(format!(
        "ready-{}",
        REQUIREMENTS
            .join(",")
            .replace(['<', '>', '/', '[', ']', ','], "_")
    ));
    if ready.exists() {
        return bin;
    }
    std::fs::create_dir_all(root.parent().expect("parent")).expect("target dir");
    let lock = root.with_extension("lock");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if ready.exists() {
            return bin;
        }
        match std::fs::create_dir(&lock) {
            Ok(()) => break,
            Err(_) => {
                assert!(
                    Instant::now() < deadline,
                    "waited 10 minutes for {}",
                    lock.display()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    let result = (|| {
        if !bin.join("python").exists() {
            run(Command::new("python3").args(["-m", "venv"]).arg(&root))?;
        }
        run(Command::new(bin.join("python"))
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(REQUIREMENTS))?;
        std::fs::write(&ready, b"").map_err(|e| e.to_string())
    })();
    let _ = std::fs::remove_dir(&lock);
    if let Err(e) = result {
        panic!(
            "cannot set up the tests' Python tools in {}: {e}",
            root.display()
        );
    }
    bin
}

/// Runs `cmd` to its end; its stderr is the error when it fails.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A sandbox host as `examples/sandbox-agents.json` expects one: `mcp-proxy` (from PyPI) on a
/// free port, serving each of `servers` (`(name, command line)`: stdio MCP servers) over
/// streamable HTTP at `/servers/<name>/mcp`; killed when dropped.
pub struct McpProxy {
    child: Child,
    pub url: String,
}

impl McpProxy {
    pub fn start(servers: &[(String, String)]) -> Self {
        let port = free_port();
        let mut cmd = Command::new(venv_bin().join("mcp-proxy"));
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        for (name, command) in servers {
            cmd.args(["--named-server", name, command]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mcp-proxy");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mcp-proxy did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for McpProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tests/mcp/calc_server.py` (FastMCP over streamable HTTP) on a free port; killed when
/// dropped, or by [`McpHttpServer::kill`].
pub struct McpHttpServer {
    child: Child,
    pub url: String,
}

impl McpHttpServer {
    pub fn start() -> Self {
        let bin = venv_bin();
        let port = free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/calc_server.py");
        let child = Command::new(bin.join("python"))
            .arg(script)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the FastMCP server");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the FastMCP server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for McpHttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An SMTP server on loopback (`tests/mail/smtp_sink.py`, on aiosmtpd): what it takes, each
/// message as the sink decoded it (`from`, `to`, `subject`, `text`, `delivery`); killed
/// when dropped.
pub struct SmtpSink {
    child: Child,
    pub url: String,
    taken: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl SmtpSink {
    pub fn start() -> Self {
        use std::io::BufRead;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mail/smtp_sink.py");
        let mut child = Command::new(venv_bin().join("python"))
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the SMTP sink");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines
            .next()
            .and_then(Result::ok)
            .expect("the SMTP sink's port");
        let port = serde_json::from_str::<serde_json::Value>(&first).expect("JSON")["port"]
            .as_u64()
            .expect("a port");
        let taken = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = taken.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let message = serde_json::from_str(&line).expect("a JSON line");
                into.lock().unwrap().push(message);
            }
        });
        Self {
            child,
            url: format!("smtp://127.0.0.1:{port}"),
            taken,
        }
    }

    /// The messages taken so far.
    pub fn taken(&self) -> Vec<serde_json::Value> {
        self.taken.lock().unwrap().clone()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
