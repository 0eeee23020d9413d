//! Set-up shared by the tests: where the services are (`common`), a captured
//! database and its capture process (`capture`), the whole pipeline as
//! processes (`e2e`), the schema-change tests' load-and-kill loop over any source
//! (`chaos`) and what the tests check on the topics (`checks`), the sink tests' workload (`sink`), `oncely sink` as a
//! process (`runner`) and a TCP relay that cuts or slows a service (`relay`). Kafka helpers, the webhook receiver and Kafka Connect
//! live in the `oncely-testkit` crate, which examples use too.
pub mod capture;
pub mod chaos;
pub mod checks;
pub mod common;
pub mod e2e;
pub mod relay;
pub mod runner;
pub mod sink;
