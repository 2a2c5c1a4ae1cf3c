//! The fault × configuration matrix's CI subset (needs root: localkube runs pods as processes
//! in network namespaces). Each cell is a cluster under a continuous `SET` + `WAIT 1` writer,
//! one fault on shard 0, and the exact end state (see `support/matrix.rs`); the full matrix is
//! the `bench_fault_matrix` example.
//!
//! The subset covers the cell that lost acknowledged writes before a restarted primary held
//! for its replica (kill, RDB `save 3600 1`, 3×1), a kill with AOF on one shard (only the
//! operator can promote there) and with two replicas, a kill without persistence on two
//! shards on Valkey 8.0, a freeze with RDB, the operator down while a primary dies on two
//! shards, a slot move's source primary killed during a scale-out from two shards, every
//! server of a shard killed at once (the loss is reported: `ShardRestarted`), and a kill with
//! RDB over TLS (Valkey 8.0).

mod support;

use support::matrix::{Cell, Fault, HEADER, Persistence, run_cells};
use support::*;

const CELLS: &[Cell] = &[
    Cell::new(Fault::Kill, Persistence::Rdb, 3, 1, 9),
    Cell::new(Fault::Kill, Persistence::Aof, 1, 1, 9),
    Cell::new(Fault::Kill, Persistence::Off, 2, 1, 8),
    Cell::new(Fault::Freeze, Persistence::Rdb, 3, 1, 9),
    Cell::new(Fault::Kill, Persistence::Aof, 2, 2, 9),
    Cell::new(Fault::OperatorDown, Persistence::Rdb, 2, 1, 9),
    Cell::new(Fault::MigrationSource, Persistence::Aof, 2, 1, 9),
    Cell::new(Fault::KillShard, Persistence::Off, 2, 1, 9),
    Cell::new(Fault::Kill, Persistence::Rdb, 3, 1, 8).with_tls(),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_fault_matrix_subset() -> anyhow::Result<()> {
    let Some(mut fx) = Fixture::start().await? else {
        return Ok(());
    };
    let operator = tokio::sync::Mutex::new(fx.operator.take());
    let (rows, failures) = run_cells(&fx, &operator, CELLS, 3).await;
    fx.operator = operator.into_inner();
    fx.stop().await;
    eprintln!("{HEADER}");
    for r in &rows {
        eprintln!("{}", r.markdown());
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} of {} cells failed:\n{}",
        failures.len(),
        CELLS.len(),
        failures.join("\n")
    );
    Ok(())
}
