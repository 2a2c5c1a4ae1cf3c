//! Benchmark: the whole fault × configuration matrix on localkube (needs root). Every cell is
//! a cluster under a continuous `SET` + `WAIT 1` writer, one fault on shard 0, and the exact
//! end state (`tests/support/matrix.rs`); the run prints one Markdown table: cell,
//! acknowledged and lost writes, longest write and durable gaps, time from the fault to Ready
//! with the exact layout, and what the status said meanwhile. CI runs a subset
//! (`operator_root_fault_matrix`).
//!
//! ```sh
//! cargo run --release -p e2e --example bench_fault_matrix -- [--parallel 3] [--only kill-rdb,opdown]
//! ```
//!
//! `--only` keeps the cells whose name contains any of the given parts.

#[path = "../tests/support/mod.rs"]
mod support;

use anyhow::{Context, bail};
use support::Fixture;
use support::matrix::{Cell, Fault, HEADER, Persistence, run_cells};

/// Every fault with persistence off, RDB and AOF on 3×1 Valkey 9.1 (a replica killed in its
/// full sync with AOF only); every shard count; two replicas; Valkey 8.0; TLS.
fn cells() -> Vec<Cell> {
    use Persistence::{Aof, Off, Rdb};
    let mut v = Vec::new();
    for fault in [
        Fault::Kill,
        Fault::KillShard,
        Fault::Freeze,
        Fault::Partition,
        Fault::OperatorDown,
        Fault::NodeStop,
        Fault::MigrationSource,
        Fault::MigrationTarget,
    ] {
        for p in [Off, Rdb, Aof] {
            v.push(Cell::new(fault, p, 3, 1, 9));
        }
    }
    for p in [Off, Rdb, Aof] {
        v.push(Cell::new(Fault::Kill, p, 1, 1, 9));
        v.push(Cell::new(Fault::Kill, p, 2, 1, 9));
        v.push(Cell::new(Fault::OperatorDown, p, 1, 1, 9));
        v.push(Cell::new(Fault::Kill, p, 3, 2, 9));
        v.push(Cell::new(Fault::Kill, p, 3, 1, 8));
    }
    v.push(Cell::new(Fault::OperatorDown, Rdb, 2, 1, 9));
    v.push(Cell::new(Fault::Freeze, Rdb, 3, 1, 8));
    v.push(Cell::new(Fault::Freeze, Aof, 1, 1, 9));
    // A killed replica resynchronises partially when its files carry the replication
    // offset (RDB, and the RDB a replica without persistence keeps from its full sync); with
    // AOF it needs a full sync, which the fault interrupts.
    v.push(Cell::new(Fault::ReplicaSync, Aof, 3, 1, 9));
    v.push(Cell::new(Fault::MigrationSource, Aof, 3, 1, 8));
    v.push(Cell::new(Fault::MigrationTarget, Rdb, 3, 1, 8));
    // TLS (Valkey 8.0): the start script's hold asks its peers over TLS.
    for p in [Off, Rdb, Aof] {
        v.push(Cell::new(Fault::Kill, p, 3, 1, 8).with_tls());
    }
    v.push(Cell::new(Fault::KillShard, Rdb, 3, 1, 8).with_tls());
    v.push(Cell::new(Fault::Freeze, Aof, 3, 1, 8).with_tls());
    v.push(Cell::new(Fault::OperatorDown, Aof, 2, 1, 8).with_tls());
    v
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let mut parallel = 3usize;
    let mut only: Vec<String> = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--parallel" => parallel = value.parse()?,
            "--only" => only = value.split(',').map(String::from).collect(),
            _ => bail!("unknown flag {flag}"),
        }
    }
    let cells: Vec<Cell> = cells()
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| c.name().contains(o.as_str())))
        .collect();
    let Some(mut fx) = Fixture::start().await? else {
        return Ok(());
    };
    let operator = tokio::sync::Mutex::new(fx.operator.take());
    let (rows, failures) = run_cells(&fx, &operator, &cells, parallel).await;
    fx.operator = operator.into_inner();
    fx.stop().await;
    println!("{HEADER}");
    for r in &rows {
        println!("{}", r.markdown());
    }
    for f in &failures {
        println!("FAILED {f}");
    }
    println!("{} cells, {} failed", cells.len(), failures.len());
    Ok(())
}
