//! `oncely sink` against its targets: conformance, crashes, groups, webhooks.
mod conformance;
mod elasticsearch_crash;
mod http;
mod postgres_crash;
mod redis_crash;
mod runner_crash;
mod runner_group;
mod start_stop;
