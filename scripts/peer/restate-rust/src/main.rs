//! The peer benchmark's workload on Restate's Rust SDK: a durable loop of N steps, each a
//! journaled 1 KB echo (`ctx.run`), as `baton bench` runs N iterations of a scripted agent
//! whose every iteration is one `echo` tool call with a 1 KB argument. The same payloads as
//! `baton bench` and `scripts/peer/restate_loop.py` (the Python SDK's peer).
//!
//! usage: restate-loop ADDR   (serves the `loop` service there; scripts/bench-restate.sh)

use restate_sdk::prelude::*;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 ";
const PAYLOAD: usize = 1024;

/// A 1 KB string that differs per step and does not compress to nothing.
fn payload(i: u64) -> String {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = String::with_capacity(PAYLOAD);
    while out.len() < PAYLOAD {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
    }
    out
}

struct Loop;

#[service(name = "loop")]
impl Loop {
    #[handler]
    async fn run(&self, ctx: Context<'_>, n: u64) -> Result<u64, HandlerError> {
        let mut echoed = 0;
        for i in 0..n {
            let arg = payload(i);
            let out: String = ctx.run(|| async move { Ok(arg) }).name("echo").await?;
            echoed += out.len() as u64;
        }
        Ok(echoed)
    }
}

#[tokio::main]
async fn main() {
    let Some(addr) = std::env::args().nth(1).and_then(|a| a.parse().ok()) else {
        eprintln!("usage: restate-loop ADDR (e.g. 127.0.0.1:9080)");
        std::process::exit(2);
    };
    HttpServer::new(Endpoint::builder().bind(Loop).build())
        .listen_and_serve(addr)
        .await;
}
