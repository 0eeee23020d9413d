//! Opening the warehouse: the connection pool through `oncely-core`'s
//! connection builder, and the schema and positions table (moved unchanged
//! from `mod.rs`).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use oncely_core::postgres::{ConnectError, PgConnector};

use oncely_core::sql::quote_ident as quote;

use super::error::{pool_error, to_sink_error};
use super::table::Catalog;
use super::{MetaColumns, PostgresConfig, PostgresSink};
use crate::error::SinkError;
use crate::naming::{Owner, TargetClaims};

/// `host:port/db` of a connection config, for errors (no user, no password).
pub fn place_of(pg: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .zip(pg.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(host, port)| match host {
            tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
            tokio_postgres::config::Host::Unix(p) => format!("{}:{port}", p.display()),
        })
        .collect();
    format!("{}/{}", hosts.join(","), pg.get_dbname().unwrap_or(""))
}

impl PostgresSink {
    /// Connects, creates the target schema and the positions table.
    pub async fn connect(config: &PostgresConfig) -> Result<Self, SinkError> {
        let url = config.url.expose();
        let mut pg: tokio_postgres::Config = url.parse().map_err(|_| {
            SinkError::fatal("sink.url is not a valid PostgreSQL connection string")
        })?;
        if let Some(password) = &config.password {
            pg.password(password.expose());
        }
        let place = place_of(&pg);
        pg.connect_timeout(Duration::from_millis(config.connect_timeout_ms));
        pg.application_name("oncely-sink-postgres");
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        if let Some(warning) = config.tls().unverified_credentials(&pg) {
            tracing::warn!("{warning}");
        }
        let tls = connector(config)?;
        tls.configure(&mut pg);
        // One connection first, through the builder's checks, so that a
        // refused certificate or a server that requires SSL is said at start.
        match tls.connect(&pg, "warehouse check").await {
            Ok(client) => drop(client),
            Err(ConnectError::Postgres(e)) => {
                return Err(to_sink_error(
                    &format!("connect to the warehouse at {place}"),
                    e,
                ))
            }
            Err(e) => {
                return Err(SinkError::fatal(format!(
                    "postgres: connect to the warehouse at {place}: {e}"
                )))
            }
        }
        let manager = Manager::from_config(pg, tls.make_tls(), manager_config);
        let pool = Pool::builder(manager)
            .max_size(config.pool_max_size)
            .build()
            .map_err(|e| SinkError::fatal_from("build the connection pool", e))?;
        let catalog = Catalog::new(
            &config.target_schema,
            MetaColumns::new(&config.meta_column_prefix),
        );
        let positions = catalog.qualified(&config.positions_table);
        let sink = Self {
            pool,
            catalog,
            config: config.clone(),
            positions,
            prebuilt_used: AtomicU64::new(0),
            place,
            claims: TargetClaims::new("warehouse table", super::TABLE_FORMAT),
        };
        // The positions table is the sink's before any source table's.
        sink.claims.claim_as(
            &config.positions_table,
            Owner::sink("the sink's positions table", super::POSITIONS_TABLE),
        )?;
        sink.setup().await?;
        Ok(sink)
    }

    async fn setup(&self) -> Result<(), SinkError> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.place))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| to_sink_error("begin setup", e))?;
        let ddl = format!(
            "SELECT pg_advisory_xact_lock(hashtext('oncely-sink-postgres-setup'));\
             CREATE SCHEMA IF NOT EXISTS {};\
             CREATE TABLE IF NOT EXISTS {} (group_id text NOT NULL, topic text NOT NULL, \
             partition integer NOT NULL, next_offset bigint NOT NULL, \
             updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (group_id, topic, partition))",
            quote(&self.config.target_schema),
            self.positions
        );
        tx.batch_execute(&ddl)
            .await
            .map_err(|e| to_sink_error("create the schema and the positions table", e))?;
        tx.commit()
            .await
            .map_err(|e| to_sink_error("commit setup", e))
    }
}

/// The warehouse connections' TLS settings (`sslmode`, `sslrootcert`,
/// `sslcert`, `sslkey`), loaded once: the one
/// PostgreSQL connection builder of `oncely-core` (public for `oncely
/// verify`, which reads the warehouse as the sink writes it).
pub fn connector(config: &PostgresConfig) -> Result<PgConnector, SinkError> {
    config
        .tls()
        .connector()
        .map_err(|e| SinkError::fatal_from("postgres", e))
}
