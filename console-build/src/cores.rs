//! One step over many files on every core (wasm-opt on the chunks, compression of the
//! bundle): the 2-core builders would otherwise spend minutes on one core. The first
//! failure stops the rest, so a broken build ends at once.

use std::sync::Mutex;

use anyhow::Result;

/// Runs `step` on each of `items`, taken from the end, one thread per core; the first
/// error is the answer and the items not started are dropped.
pub fn each<T: Send>(items: Vec<T>, step: impl Fn(T) -> Result<()> + Sync) -> Result<()> {
    let queue = Mutex::new(items);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let next = queue.lock().expect("queue lock").pop();
                        let Some(item) = next else { return Ok(()) };
                        if let Err(e) = step(item) {
                            queue.lock().expect("queue lock").clear();
                            return Err(e);
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a build worker panicked"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_item_is_done_once_and_a_failure_stops_the_rest() {
        let done = AtomicUsize::new(0);
        each((0..50).collect(), |_| {
            done.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(done.load(Ordering::Relaxed), 50);

        let started = AtomicUsize::new(0);
        let err = each((0..1000).collect(), |i: u32| {
            started.fetch_add(1, Ordering::Relaxed);
            anyhow::ensure!(i != 999, "item {i}");
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "item 999");
        assert!(started.load(Ordering::Relaxed) < 1000);
    }
}
