//! Helpers used by more than one target, so they need a crate of their own:
//! `kafka` by both packages' integration tests, `webhook` by the root tests
//! and the `webhook_receiver` and `bench_http` examples, `connect` by the
//! Debezium compatibility test and the `bench_vs_debezium` example, `tls`
//! (test certificates) by both packages' TLS tests. Only ever a
//! dev-dependency: nothing here ships.
pub mod connect;
pub mod kafka;
pub mod tls;
pub mod webhook;
