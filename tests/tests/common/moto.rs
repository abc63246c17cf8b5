//! moto's server on a free loopback port, started by the test and stopped when dropped.
//! The `moto_server` on `PATH` if there is one (CI installs it), else the one the tests'
//! virtualenv under `target/` gets from PyPI the first time (see `python.rs`): `cargo test`
//! needs no set-up step. Without Python or PyPI these tests fail saying so; they never skip.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `moto_server` from `PATH`, else from the tests' virtualenv.
fn moto_server() -> std::path::PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("moto_server"))
            .find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| super::python::venv_bin().join("moto_server"))
}

pub struct Moto {
    child: Child,
    pub url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    pub fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(moto_server())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start moto_server ({e})"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}
