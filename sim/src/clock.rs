//! The sim's clock: simulated seconds that pass `scale` times as fast as real ones, from
//! which every state machine is read, and the deadlines the Kubernetes controllers sleep
//! until. Every state machine compares "now" with the instant its state changes through
//! [`reached`], so a controller pass that runs inside [`recording`] learns the soonest
//! such instant among all it looked at: the one moment it must run again, with no
//! polling and no second copy of the state machines' timings. The clock is shared by
//! every part of the world, so it is its own lock.

use std::cell::Cell;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// Simulated time: `scale` simulated seconds pass per real second. Shared by every part
/// of the world and read far more often than changed, so it is its own lock.
#[derive(Debug)]
pub struct Clock {
    rate: RwLock<Rate>,
}

#[derive(Clone, Copy, Debug)]
struct Rate {
    base_real: Instant,
    base_sim: f64,
    scale: f64,
    boot_epoch: f64,
}

impl Rate {
    fn now(&self) -> f64 {
        self.base_sim + self.base_real.elapsed().as_secs_f64() * self.scale
    }
}

fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The longest a controller sleeps for a deadline: far beyond any transition, and small
/// enough for a `Duration` and a timer.
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 3600);

impl Clock {
    pub fn new(scale: f64) -> Self {
        Self {
            rate: RwLock::new(Rate {
                base_real: Instant::now(),
                base_sim: 0.0,
                scale,
                boot_epoch: epoch_now(),
            }),
        }
    }

    fn rate(&self) -> Rate {
        *self.rate.read().unwrap_or_else(|e| e.into_inner())
    }

    fn change(&self, f: impl FnOnce(&mut Rate)) {
        f(&mut self.rate.write().unwrap_or_else(|e| e.into_inner()));
    }

    /// Simulated seconds since the sim started.
    pub fn now(&self) -> f64 {
        self.rate().now()
    }

    pub fn scale(&self) -> f64 {
        self.rate().scale
    }

    /// Changes the speed from now on; time already passed stays passed.
    pub fn set_scale(&self, scale: f64) {
        self.change(|r| {
            r.base_sim = r.now();
            r.base_real = Instant::now();
            r.scale = scale;
        });
    }

    /// Starts time again from zero at the same speed, as a fresh world does.
    pub fn restart(&self) {
        self.change(|r| {
            r.base_sim = 0.0;
            r.base_real = Instant::now();
            r.boot_epoch = epoch_now();
        });
    }

    /// Jumps simulated time forward, for unit tests that need an exact instant.
    #[cfg(test)]
    pub fn advance(&self, secs: f64) {
        self.change(|r| r.base_sim += secs);
    }

    /// A simulated instant as epoch seconds: boot time plus simulated seconds, so
    /// timestamps advance at the sim's speed.
    pub fn epoch(&self, sim: f64) -> f64 {
        self.rate().boot_epoch + sim
    }

    /// The real time in which `secs` simulated seconds pass at the current speed; none
    /// when that is never (the clock stands still, or nothing is due).
    pub fn real_time_for(&self, secs: f64) -> Option<Duration> {
        let scale = self.scale();
        if !(secs.is_finite() && scale > 0.0) {
            return None;
        }
        let real = (secs.max(0.0) / scale).min(LONGEST_WAIT.as_secs_f64());
        Some(Duration::from_secs_f64(real))
    }
}

thread_local! {
    /// The soonest deadline (simulated seconds from the instant compared with) of the
    /// [`recording`] under way on this thread, if one is.
    static SOONEST: Cell<Option<f64>> = const { Cell::new(None) };
}

/// Whether instant `at` has come by `now` (both simulated or both epoch seconds). When it
/// has not, and a [`recording`] is under way, `at` is a deadline of what is recorded.
pub fn reached(now: f64, at: f64) -> bool {
    if now >= at {
        return true;
    }
    SOONEST.with(|s| {
        if let Some(soonest) = s.get() {
            s.set(Some(soonest.min(at - now)));
        }
    });
    false
}

/// Runs `f` (synchronous, so nothing else runs on this thread meanwhile) and returns,
/// with its answer, the simulated seconds until the soonest instant it compared against
/// through [`reached`] and found still to come; infinite when there was none.
pub fn recording<T>(f: impl FnOnce() -> T) -> (T, f64) {
    /// Puts back the recording this one is nested in, also if `f` panics.
    struct Restore(Option<f64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let inner = SOONEST.with(|s| s.replace(self.0));
            if let (Some(outer), Some(inner)) = (self.0, inner) {
                SOONEST.with(|s| s.set(Some(outer.min(inner))));
            }
        }
    }
    let restore = Restore(SOONEST.with(|s| s.replace(Some(f64::INFINITY))));
    let out = f();
    let soonest = SOONEST.with(Cell::get).unwrap_or(f64::INFINITY);
    drop(restore);
    (out, soonest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_rescales_without_losing_time() {
        let c = Clock::new(1000.0);
        std::thread::sleep(Duration::from_millis(20));
        let before = c.now();
        assert!(before >= 20.0, "{before}");
        c.set_scale(0.0);
        let frozen = c.now();
        std::thread::sleep(Duration::from_millis(10));
        assert!((c.now() - frozen).abs() < 1e-9);
        assert!(frozen >= before);
        c.restart();
        assert!(c.now().abs() < 1e-9);
    }

    #[test]
    fn a_recording_keeps_the_soonest_instant_still_to_come() {
        let ((), none) = recording(|| {
            assert!(reached(10.0, 5.0));
            assert!(reached(10.0, 10.0));
        });
        assert_eq!(none, f64::INFINITY, "only instants still to come count");
        let (answer, soonest) = recording(|| {
            let a = reached(100.0, 130.0);
            let b = reached(100.0, 105.0);
            let c = reached(100.0, 90.0);
            (a, b, c)
        });
        assert_eq!(answer, (false, false, true));
        assert_eq!(soonest, 5.0);
        // Outside a recording nothing is kept.
        assert!(!reached(0.0, 1.0));
        let ((), later) = recording(|| {
            reached(0.0, 8.0);
        });
        assert_eq!(later, 8.0);
    }

    #[test]
    fn a_nested_recording_reports_its_own_and_counts_towards_the_outer() {
        let ((inner, ()), outer) = recording(|| {
            reached(0.0, 50.0);
            let ((), inner) = recording(|| {
                reached(0.0, 20.0);
            });
            (inner, ())
        });
        assert_eq!(inner, 20.0);
        assert_eq!(outer, 20.0);
        let result = std::panic::catch_unwind(|| {
            recording(|| {
                reached(0.0, 1.0);
                panic!("a pass that fails");
            })
        });
        assert!(result.is_err());
        assert!(!reached(0.0, 0.5), "the failed recording is over");
        assert_eq!(recording(|| ()).1, f64::INFINITY);
    }

    #[test]
    fn deadlines_become_real_time_at_the_current_speed() {
        let c = Clock::new(600.0);
        assert_eq!(c.real_time_for(300.0), Some(Duration::from_millis(500)));
        assert_eq!(c.real_time_for(f64::INFINITY), None);
        assert_eq!(c.real_time_for(-1.0), Some(Duration::ZERO));
        c.set_scale(0.0);
        assert_eq!(
            c.real_time_for(300.0),
            None,
            "a stopped clock never gets there"
        );
        c.set_scale(1e-12);
        assert_eq!(c.real_time_for(1e9), Some(LONGEST_WAIT));
    }
}
