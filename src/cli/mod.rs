pub mod capture;
pub mod gap;
pub mod sink;
pub mod status;
pub mod verify;

/// Inserts a signal row (`id`, `type`, `data`) into capture's signal table
/// `schema`.`table`: the one way `oncely capture snapshot` and a sink's gap
/// recovery ask the running capture for something.
pub async fn insert_signal(
    client: &tokio_postgres::Client,
    (schema, table): (&str, &str),
    id: &str,
    kind: &str,
    data: Option<&str>,
) -> Result<u64, tokio_postgres::Error> {
    let sql = format!(
        "INSERT INTO {}.{} (id, type, data) VALUES ($1, $2, $3)",
        oncely_core::sql::quote_ident(schema),
        oncely_core::sql::quote_ident(table)
    );
    client.execute(&sql, &[&id, &kind, &data]).await
}

/// Logs go to stderr; `RUST_LOG` overrides the default `info` level.
pub fn init_tracing() {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // sqlparser's debug logs quote the snapshot filters it parses, values
    // and all: never shown.
    if let Ok(quiet) = "sqlparser=off".parse() {
        filter = filter.add_directive(quiet);
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
