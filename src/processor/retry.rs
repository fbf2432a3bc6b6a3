//! The retry curve: `base * 2^(attempts-1)`, times a jitter factor in [0.8, 1.2], capped.

use std::time::Duration;

use rand::{Rng, RngExt};

/// The delay before the next attempt after `attempts` attempts have been consumed.
pub fn backoff(attempts: u32, base_seconds: f64, cap_seconds: f64, rng: &mut impl Rng) -> Duration {
    let exponent = attempts.saturating_sub(1).min(60) as i32;
    let raw = base_seconds * 2f64.powi(exponent);
    let jittered = raw * rng.random_range(0.8..=1.2);
    Duration::from_secs_f64(jittered.min(cap_seconds).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn follows_the_contract_curve_within_jitter() {
        let mut rng = StdRng::seed_from_u64(7);
        for attempts in 1..=6u32 {
            let expected = 10.0 * 2f64.powi(attempts as i32 - 1);
            for _ in 0..200 {
                let d = backoff(attempts, 10.0, 600.0, &mut rng).as_secs_f64();
                let (lo, hi) = ((expected * 0.8).min(600.0), (expected * 1.2).min(600.0));
                assert!(
                    d >= lo - 1e-9 && d <= hi + 1e-9,
                    "attempt {attempts}: {d} not in [{lo}, {hi}]"
                );
            }
        }
    }

    #[test]
    fn is_capped_and_deterministic_for_a_seed() {
        let a = backoff(30, 10.0, 600.0, &mut StdRng::seed_from_u64(1));
        assert_eq!(a, Duration::from_secs(600));
        let x = backoff(2, 10.0, 600.0, &mut StdRng::seed_from_u64(42));
        let y = backoff(2, 10.0, 600.0, &mut StdRng::seed_from_u64(42));
        assert_eq!(x, y);
        assert!(x >= Duration::from_secs(16) && x <= Duration::from_secs(24));
    }
}
