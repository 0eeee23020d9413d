//! `oncely verify --capture capture.toml --sink sink.toml...`: compare the
//! source tables with every target, after waiting for them to catch up.
use std::path::PathBuf;
use std::time::Duration;

use oncely::verify::{self, Options};

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The capture configuration (source database, captured tables, topics).
    #[arg(long)]
    pub capture: PathBuf,
    /// A sink configuration (postgres, elasticsearch or redis); repeat for each target.
    #[arg(long = "sink", required = true)]
    pub sinks: Vec<PathBuf>,
    /// How long to wait for capture and the sinks to catch up, e.g. 120s, 2m, 500ms.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Compare at once, without waiting for the targets to catch up.
    #[arg(long)]
    pub no_wait: bool,
    /// Do not wait for capture's committed offset record: for topics another
    /// producer wrote (a real Debezium connector), which has none. Verify then
    /// waits only for the sinks to apply what the topics hold when it starts,
    /// so let the producer publish the source's changes first.
    #[arg(long)]
    pub no_capture_offset: bool,
    /// Differing keys listed per table.
    #[arg(long, default_value_t = 5)]
    pub examples: usize,
    /// While differences remain, wait for the targets again and compare again,
    /// up to this many times (for a source that keeps changing).
    #[arg(long, default_value_t = 0)]
    pub retries: u32,
    /// Print the report as JSON (long values as prefix, length and hash).
    #[arg(long)]
    pub json: bool,
}

/// Prints the report; differences are an error (non-zero exit).
pub async fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let report = verify::run(&Options {
        capture: args.capture.clone(),
        sinks: args.sinks.clone(),
        wait: !args.no_wait,
        capture_offset: !args.no_capture_offset,
        timeout: args.timeout,
        examples: args.examples,
        retries: args.retries,
    })
    .await?;
    if args.json {
        println!("{:#}", report.to_json());
    } else {
        println!("{report}");
    }
    if report.is_equal() {
        Ok(())
    } else {
        anyhow::bail!(
            "{} of {} table copies differ from the source",
            report.differing(),
            report.compared()
        )
    }
}

/// `120s`, `2m`, `500ms`, or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with ms, s, m or h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        other => Err(format!("{s:?}: unknown unit {other:?} (ms, s, m, h)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert!(parse_duration("3 weeks").is_err());
    }
}
