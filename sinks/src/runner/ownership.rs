//! Partitions nobody in the group owns, and the rebalance that assigns them.
//!
//! A static member (`group.instance.id`) that restarts within the session
//! timeout rejoins without a rebalance: the broker hands it the assignment
//! the group made before (Kafka's classic protocol rebalances for a static
//! member's rejoin only when the group's protocol would change, not when its
//! subscription did), and librdkafka (JoinGroup v5, no KIP-814) is not told
//! it leads the group, so no member runs the assignor again. A topic created
//! while the member was down — or before the group's first assignment was
//! replaced — then belongs to no one, for ever: the member's subscription
//! already names it, so no later metadata refresh looks like a change.
//!
//! So a static member checks, every [`CHECK_INTERVAL`], the group's
//! assignment (DescribeGroups: every member's assignment) against the
//! partitions of the topics it subscribes to. Partitions unowned in two
//! checks in a row, with the group stable both times (a new topic takes a
//! metadata refresh to be noticed by live members), make it change its
//! subscription to the matching topics without the unowned ones and, a few
//! seconds later, back: each change is a rejoin with changed metadata as a
//! known member, which the broker answers with a rebalance, and the second
//! one brings the unowned topics in.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::context::RunnerContext;
use super::shared::Shared;
use crate::sink::TopicPartition;

/// How often the group's assignment is checked.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How long the narrowed subscription stays before the full one is restored.
const RESTORE_AFTER: Duration = Duration::from_secs(3);
/// Timeout of the metadata and group requests of one check.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The check's state, kept by the poll thread.
pub(crate) struct OwnershipCheck {
    last: Instant,
    /// Unowned at the previous check.
    suspects: BTreeSet<TopicPartition>,
    /// When to subscribe to the full subscription again.
    restore_at: Option<Instant>,
}

impl OwnershipCheck {
    pub(crate) fn new() -> Self {
        Self {
            last: Instant::now(),
            suspects: BTreeSet::new(),
            restore_at: None,
        }
    }

    /// Runs the check when due, and restores the subscription when due.
    pub(crate) fn tick(
        &mut self,
        consumer: &BaseConsumer<RunnerContext>,
        shared: &Shared,
        subscription: &[&str],
    ) {
        if let Some(at) = self.restore_at {
            if Instant::now() >= at {
                self.restore_at = None;
                if let Err(e) = consumer.subscribe(subscription) {
                    tracing::warn!("subscribe again: {e}");
                }
                self.last = Instant::now();
            }
            return;
        }
        if self.last.elapsed() < CHECK_INTERVAL {
            return;
        }
        self.last = Instant::now();
        let Some((matched, unowned)) = check(consumer, shared, subscription) else {
            self.suspects.clear();
            return;
        };
        let lasting: BTreeSet<TopicPartition> =
            unowned.intersection(&self.suspects).cloned().collect();
        self.suspects = unowned;
        if lasting.is_empty() {
            return;
        }
        let partitions: Vec<String> = lasting.iter().map(ToString::to_string).collect();
        let topics: BTreeSet<&str> = lasting.iter().map(|tp| tp.topic.as_str()).collect();
        tracing::warn!(
            group = %shared.group,
            partitions = %partitions.join(", "),
            "partitions of subscribed topics nobody owns (a static member rejoined with an \
             assignment made before they existed): asking the group to rebalance"
        );
        shared.metrics.unowned_partition_rebalances.inc();
        let narrowed: Vec<&str> = matched
            .iter()
            .map(String::as_str)
            .filter(|t| !topics.contains(t))
            .collect();
        let result = if narrowed.is_empty() {
            // Nothing else to subscribe to: leave and join again.
            consumer.unsubscribe();
            consumer.subscribe(subscription)
        } else {
            self.restore_at = Some(Instant::now() + RESTORE_AFTER);
            consumer.subscribe(&narrowed)
        };
        if let Err(e) = result {
            tracing::warn!("subscribe for a rebalance: {e}");
        }
        self.suspects.clear();
    }
}

/// The topics matching the subscription and their partitions no member owns;
/// `None` when the group is not stable or a request failed.
fn check(
    consumer: &BaseConsumer<RunnerContext>,
    shared: &Shared,
    subscription: &[&str],
) -> Option<(Vec<String>, BTreeSet<TopicPartition>)> {
    let groups = consumer
        .fetch_group_list(Some(&shared.config.group_id), REQUEST_TIMEOUT)
        .map_err(|e| tracing::debug!("describe group: {e}"))
        .ok()?;
    let group = groups.groups().first()?;
    if group.state() != "Stable" {
        return None;
    }
    let mut owned = BTreeSet::new();
    for member in group.members() {
        for (topic, partitions) in parse_assignment(member.assignment()?)? {
            owned.extend(
                partitions
                    .into_iter()
                    .map(|p| TopicPartition::new(topic.clone(), p)),
            );
        }
    }
    let metadata = consumer
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .map_err(|e| tracing::debug!("metadata: {e}"))
        .ok()?;
    let matcher = Matcher::new(subscription);
    let mut matched = Vec::new();
    let mut unowned = BTreeSet::new();
    for topic in metadata.topics() {
        if topic.error().is_some() || !matcher.matches(topic.name()) {
            continue;
        }
        matched.push(topic.name().to_owned());
        for p in topic.partitions() {
            let tp = TopicPartition::new(topic.name(), p.id());
            if !owned.contains(&tp) {
                unowned.insert(tp);
            }
        }
    }
    Some((matched, unowned))
}

/// librdkafka's subscription: names, and regular expressions starting with `^`.
struct Matcher {
    names: BTreeSet<String>,
    patterns: Vec<regex::Regex>,
}

impl Matcher {
    fn new(subscription: &[&str]) -> Self {
        let (patterns, names): (Vec<&str>, Vec<&str>) =
            subscription.iter().partition(|s| s.starts_with('^'));
        Self {
            names: names.into_iter().map(str::to_owned).collect(),
            // Checked when the config was read; one that fails here matches nothing.
            patterns: patterns
                .into_iter()
                .filter_map(|p| regex::Regex::new(p).ok())
                .collect(),
        }
    }

    fn matches(&self, topic: &str) -> bool {
        self.names.contains(topic) || self.patterns.iter().any(|p| p.is_match(topic))
    }
}

/// A consumer-protocol assignment (any version): `int16` version, then
/// `[topic: string, partitions: [int32]]`; what follows (user data) is ignored.
fn parse_assignment(bytes: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    let mut r = Reader(bytes);
    if bytes.is_empty() {
        return Some(Vec::new()); // a member without partitions
    }
    r.i16()?;
    let topics = usize::try_from(r.i32()?).ok()?;
    let mut out = Vec::with_capacity(topics.min(1024));
    for _ in 0..topics {
        let len = usize::try_from(r.i16()?).ok()?;
        let name = String::from_utf8(r.take(len)?.to_vec()).ok()?;
        let n = usize::try_from(r.i32()?).ok()?;
        let mut partitions = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            partitions.push(r.i32()?);
        }
        out.push((name, partitions));
    }
    Some(out)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut out = vec![0, 1];
        out.extend_from_slice(&(topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            out.extend_from_slice(&(t.len() as i16).to_be_bytes());
            out.extend_from_slice(t.as_bytes());
            out.extend_from_slice(&(ps.len() as i32).to_be_bytes());
            for p in *ps {
                out.extend_from_slice(&p.to_be_bytes());
            }
        }
        out.extend_from_slice(&(-1i32).to_be_bytes()); // no user data
        out
    }

    #[test]
    fn assignments_parse_and_garbage_does_not() {
        let bytes = assignment(&[("a", &[0, 2]), ("b.c", &[1])]);
        assert_eq!(
            parse_assignment(&bytes),
            Some(vec![("a".into(), vec![0, 2]), ("b.c".into(), vec![1])])
        );
        assert_eq!(parse_assignment(&[]), Some(vec![]));
        assert_eq!(parse_assignment(&bytes[..9]), None);
    }

    #[test]
    fn subscriptions_match_names_and_patterns() {
        let m = Matcher::new(&["orders", "^shop\\..*"]);
        assert!(m.matches("orders"));
        assert!(m.matches("shop.public.t"));
        assert!(!m.matches("orders2"));
        assert!(!m.matches("xshop.public.t"));
    }
}
