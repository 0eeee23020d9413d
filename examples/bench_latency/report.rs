//! What a run prints: the latency table per phase and target, how fast
//! each observer's polls were answered, and the index's own statistics.

use std::collections::BTreeMap;
use std::time::Instant;

use elasticsearch::Elasticsearch;
use serde_json::Value;

use super::{ProbeTimes, Seen};

/// Prints the latency table; returns the highest rate whose step kept lag
/// bounded (the writer reached 95 % of it and the p99 of its second half stayed under 1 s).
pub fn latencies(
    phases: &[(u64, u64)],
    achieved: &[f64],
    targets: &[&'static str],
    seen: &BTreeMap<&'static str, Seen>,
) -> Option<u64> {
    println!(
        "| phase | target rate | achieved | target | p50 ms | p99 ms | max ms | transactions |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut sustained: Option<u64> = None;
    for (phase, (rate, seconds)) in phases.iter().enumerate().skip(1) {
        let mut step_ok = achieved[phase] >= 0.95 * *rate as f64;
        for &target in targets {
            let all = seen[target].lock().unwrap();
            let mut lat: Vec<f64> = all.iter().filter(|s| s.0 == phase).map(|s| s.2).collect();
            let first = all.iter().find(|s| s.0 == phase).map(|s| s.1);
            let mut second_half: Vec<f64> = all
                .iter()
                .filter(|s| {
                    s.0 == phase
                        && first.is_some_and(|f| {
                            s.1.duration_since(f).as_secs_f64() >= *seconds as f64 / 2.0
                        })
                })
                .map(|s| s.2)
                .collect();
            let (p50, p99, max) = percentiles(&mut lat);
            let (_, p99_late, _) = percentiles(&mut second_half);
            step_ok &= p99_late < 1.0;
            println!(
                "| {phase} | {rate} | {:.0} | {target} | {:.0} | {:.0} | {:.0} | {} |",
                achieved[phase],
                p50 * 1e3,
                p99 * 1e3,
                max * 1e3,
                lat.len()
            );
        }
        if phase >= 1 && step_ok {
            sustained = Some(sustained.map_or(*rate, |s| s.max(*rate)));
        }
    }
    sustained
}

/// How long each target took to answer a poll: a stall in a target that its
/// reads also show is the target's, one they don't is upstream of it.
pub fn probe_times(probe_time: &BTreeMap<&'static str, ProbeTimes>) {
    let (now, wall) = (Instant::now(), chrono::Utc::now());
    for (target, times) in probe_time {
        let times = times.lock().unwrap();
        let mut took: Vec<f64> = times.iter().map(|t| t.1).collect();
        let (p50, p99, max) = percentiles(&mut took);
        let slow: Vec<String> = times
            .iter()
            .filter(|t| t.1 >= 0.5)
            .map(|t| {
                let ago = chrono::Duration::from_std(now - t.0).unwrap_or_default();
                format!(
                    "{:.0} ms at {}",
                    t.1 * 1e3,
                    (wall - ago).format("%H:%M:%S%.3f")
                )
            })
            .collect();
        println!(
            "{target} observer: {} polls answered in p50 {:.1} / p99 {:.1} / max {:.0} ms{}",
            took.len(),
            p50 * 1e3,
            p99 * 1e3,
            max * 1e3,
            if slow.is_empty() {
                String::new()
            } else {
                format!("; slow (>= 500 ms): {}", slow.join(", "))
            }
        );
    }
}

/// What the index did during the run: refreshes (a real-time get of a document
/// changed since the last refresh forces an internal one), merges, gets, GC.
pub async fn print_index_stats(es: &Elasticsearch, index: &str) {
    let stats = async {
        es.indices()
            .stats(elasticsearch::indices::IndicesStatsParts::Index(&[index]))
            .send()
            .await?
            .json::<Value>()
            .await
    };
    let Ok(stats) = stats.await else {
        return eprintln!("cannot read the index's stats");
    };
    let t = &stats["indices"][index]["total"];
    println!(
        "elasticsearch index: {} refreshes ({} scheduled or explicit) taking {} ms, \
         {} merges taking {} ms, {} segments at the end, {} gets taking {} ms, {} docs indexed taking {} ms",
        t["refresh"]["total"],
        t["refresh"]["external_total"],
        t["refresh"]["total_time_in_millis"],
        t["merges"]["total"],
        t["merges"]["total_time_in_millis"],
        t["segments"]["count"],
        t["get"]["total"],
        t["get"]["time_in_millis"],
        t["indexing"]["index_total"],
        t["indexing"]["index_time_in_millis"],
    );
}

fn percentiles(v: &mut [f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}
