//! Streams a full RDB snapshot of one node to a file (or nowhere) and prints what was
//! received and how fast (plain TCP; the user needs `+psync +replconf`).
//!
//! `cargo run --release -p valkey-ops --example snapshot -- ADDR USER PASSWORD [OUT.rdb]`

use std::time::Instant;

use valkey_ops::client::ClientConfig;
use valkey_ops::snapshot::{SnapshotOptions, stream_snapshot};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, user, password, rest @ ..] = args.as_slice() else {
        eprintln!("usage: snapshot ADDR USER PASSWORD [OUT.rdb]");
        std::process::exit(2);
    };
    let config = ClientConfig::new(user.as_str(), password.as_str());
    let options = SnapshotOptions::default();
    let t = Instant::now();
    let result = match rest.first() {
        Some(path) => {
            let mut file = tokio::fs::File::create(path).await.expect("create output");
            stream_snapshot(addr, &config, &options, &mut file).await
        }
        None => stream_snapshot(addr, &config, &options, &mut tokio::io::sink()).await,
    };
    match result {
        Ok(info) => {
            let secs = t.elapsed().as_secs_f64();
            println!("{info:#?}");
            println!(
                "{} bytes in {secs:.2} s = {:.1} MB/s",
                info.bytes,
                info.bytes as f64 / secs / 1e6
            );
        }
        Err(e) => {
            eprintln!("snapshot failed: {e}");
            std::process::exit(1);
        }
    }
}
