//! Bounded concurrency: the operator's many independent calls of one pass (a node's live
//! settings, a ValkeyNode write, a step's targets) run a few at a time, never one by one and
//! never all at once.

use std::future::Future;

use futures::StreamExt;

/// Calls `f` on every item, at most `limit` calls in flight, and returns the results in the
/// items' order.
pub async fn map_in_order<T, R, Fut>(
    items: impl IntoIterator<Item = T>,
    limit: usize,
    f: impl FnMut(T) -> Fut,
) -> Vec<R>
where
    Fut: Future<Output = R>,
{
    // The calls are made before the stream polls them: a stream holding `f` would have to be
    // `Send` for every lifetime `f` could be called with, which closures borrowing the pass's
    // state are not.
    let calls: Vec<Fut> = items.into_iter().map(f).collect();
    futures::stream::iter(calls)
        .buffered(limit.max(1))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::map_in_order;

    #[tokio::test]
    async fn results_keep_the_items_order_and_at_most_limit_run_at_once() {
        let running = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        let out = map_in_order(0..20u64, 4, |i| {
            let (running, peak) = (&running, &peak);
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                // Later items finish first: the order must come from the items, not the clock.
                tokio::time::sleep(Duration::from_millis(20 - i)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                i * 10
            }
        })
        .await;
        assert_eq!(out, (0..20).map(|i| i * 10).collect::<Vec<_>>());
        assert_eq!(peak.load(Ordering::SeqCst), 4);
    }
}
