//! The one way oncely opens PostgreSQL connections: capture's control,
//! snapshot and signal connections, the replication stream's TLS, the
//! warehouse sink's pool and both of `oncely verify`'s readers take their
//! TLS settings from a [`PgTls`] (libpq's `sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`) and connect through a [`PgConnector`].
//!
//! A connection that cannot succeed by trying again is told apart by type,
//! never by message text ([`ConnectError::is_fatal`]): TLS settings that
//! cannot be loaded, a server certificate that verification refused (with
//! rustls's reason), and a server that refuses a connection without TLS but
//! accepts one with it (`hostssl` in `pg_hba.conf` while `sslmode` is
//! `disable`), which names the key to set.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;
use tokio_postgres::config::SslMode as Wire;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::tls::{client_config, refused_certificate, ClientIdentity, TlsError, Verify};

/// `sslmode`: how a connection is secured, with libpq's names and meanings.
/// Every configuration defaults to [`DEFAULT_SSLMODE`]. Only `verify-full`
/// stops an active attacker: the others either send in the clear, or accept
/// any certificate, or (`verify-ca`) any certificate of the CA for any host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, plain otherwise. The certificate is not
    /// checked, unless `sslrootcert` is set: then its chain is (as libpq does;
    /// the replication stream then requires TLS, which its client can verify
    /// only that way).
    Prefer,
    /// TLS or no connection. The certificate is not checked, unless
    /// `sslrootcert` is set: then its chain is (like `verify-ca`, as libpq does).
    Require,
    /// TLS, and the server's certificate must chain to a CA of `sslrootcert`.
    VerifyCa,
    /// `verify-ca`, and the certificate must also name the host connected to.
    VerifyFull,
}

/// `sslmode` when unset, for capture and the warehouse sink alike: libpq's
/// default (TLS when the server offers it).
pub const DEFAULT_SSLMODE: SslMode = SslMode::Prefer;

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// The TLS settings of one PostgreSQL connection. `keys` names the table
/// they are configured in (`database` for capture, `sink` for the warehouse)
/// so that every message names the key to change.
#[derive(Clone, PartialEq, Eq)]
pub struct PgTls {
    /// `sslmode`.
    pub sslmode: SslMode,
    /// `sslrootcert`: PEM file of the CAs to trust.
    pub sslrootcert: Option<PathBuf>,
    /// `sslcert`: the client certificate (PEM).
    pub sslcert: Option<PathBuf>,
    /// `sslkey`: the client certificate's key (PEM), already resolved.
    pub sslkey: Option<PathBuf>,
    /// The configuration table of these keys.
    pub keys: &'static str,
}

impl fmt::Debug for PgTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key's path may come from a secret reference: say only whether it is set.
        f.debug_struct("PgTls")
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("sslcert", &self.sslcert)
            .field("sslkey", &self.sslkey.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A TLS setting that cannot work: which key (`database.sslrootcert`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `{key}`: {message}")]
pub struct SettingError {
    /// The full key, e.g. `database.sslrootcert`.
    pub key: String,
    /// What to change.
    pub message: String,
}

impl From<SettingError> for crate::config::ConfigError {
    fn from(e: SettingError) -> Self {
        Self::new(e.key, e.message)
    }
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The CA, certificate or key files cannot be used. Fatal.
    #[error("TLS settings (`{keys}.sslrootcert`, `{keys}.sslcert`, `{keys}.sslkey`): {source}")]
    Settings {
        /// The configuration table.
        keys: &'static str,
        /// What is wrong.
        source: TlsError,
    },
    /// TLS verification refused the server's certificate. Fatal.
    #[error("the server's certificate was refused ({reason}): `{keys}.sslrootcert` must hold the CA that signed it, and under `{keys}.sslmode = \"verify-full\"` it must name the host connected to")]
    CertificateRefused {
        /// The configuration table.
        keys: &'static str,
        /// rustls's reason, e.g. `invalid peer certificate: UnknownIssuer`.
        reason: String,
    },
    /// The server refused the connection without TLS and accepted one with
    /// TLS (`hostssl` in its `pg_hba.conf`) while `sslmode` is `disable`. Fatal.
    #[error("the server requires SSL for this user and database: it refused the connection without SSL ({server}) and accepts one over SSL; set `{keys}.sslmode` to `require`, `verify-ca` or `verify-full` (with `{keys}.sslrootcert`)")]
    SslRequired {
        /// The configuration table.
        keys: &'static str,
        /// The server's message.
        server: String,
    },
    /// Anything else; classify the error as any other database error. Its
    /// message is the server's (no source: it would repeat it).
    #[error("{}", describe(.0))]
    Postgres(tokio_postgres::Error),
}

impl ConnectError {
    /// Whether trying again cannot help, whatever the database error
    /// classification of the caller says ([`ConnectError::Postgres`] is
    /// left to it: use [`ConnectError::postgres`]).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, ConnectError::Postgres(_))
    }

    /// The database error of [`ConnectError::Postgres`].
    pub fn postgres(&self) -> Option<&tokio_postgres::Error> {
        match self {
            ConnectError::Postgres(e) => Some(e),
            _ => None,
        }
    }
}

/// A client error with the server's message (tokio-postgres shows only
/// `db error` for one).
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

impl PgTls {
    /// `sslmode` alone, no files, for the configuration table `keys`.
    pub fn new(sslmode: SslMode, keys: &'static str) -> Self {
        PgTls {
            sslmode,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            keys,
        }
    }

    fn key(&self, name: &str, message: impl Into<String>) -> SettingError {
        SettingError {
            key: format!("{}.{name}", self.keys),
            message: message.into(),
        }
    }

    /// Checks the combination: verification needs a CA file, a client
    /// certificate needs its key (and the other way round), and files are
    /// not set under `disable`, which would ignore them.
    pub fn check(&self) -> Result<(), SettingError> {
        let verifies = matches!(self.sslmode, SslMode::VerifyCa | SslMode::VerifyFull);
        if verifies && self.sslrootcert.is_none() {
            return Err(self.key(
                "sslrootcert",
                format!(
                    "required by sslmode {} (the PEM file of the CA to trust)",
                    self.sslmode
                ),
            ));
        }
        if self.sslmode == SslMode::Disable {
            for (name, set) in [
                ("sslrootcert", self.sslrootcert.is_some()),
                ("sslcert", self.sslcert.is_some()),
                ("sslkey", self.sslkey.is_some()),
            ] {
                if set {
                    return Err(self.key(
                        name,
                        "set, but `sslmode` is disable: choose require, verify-ca or verify-full",
                    ));
                }
            }
        }
        match (&self.sslcert, &self.sslkey) {
            (Some(_), None) => Err(self.key(
                "sslkey",
                "required with `sslcert` (the client certificate's private key)",
            )),
            (None, Some(_)) => Err(self.key(
                "sslcert",
                "required with `sslkey` (the client certificate the key belongs to)",
            )),
            _ => Ok(()),
        }
    }

    fn identity(&self) -> Option<ClientIdentity> {
        match (&self.sslcert, &self.sslkey) {
            (Some(cert), Some(key)) => Some(ClientIdentity {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        }
    }

    /// What goes on the wire and what is verified, libpq's way: `require`
    /// with a CA file verifies the chain.
    fn plan(&self) -> (Wire, Verify) {
        match (self.sslmode, self.sslrootcert.is_some()) {
            (SslMode::Disable, _) => (Wire::Disable, Verify::Nothing),
            (SslMode::Prefer, false) => (Wire::Prefer, Verify::Nothing),
            (SslMode::Prefer, true) => (Wire::Prefer, Verify::Chain),
            (SslMode::Require, false) => (Wire::Require, Verify::Nothing),
            (SslMode::Require | SslMode::VerifyCa, _) => (Wire::Require, Verify::Chain),
            (SslMode::VerifyFull, _) => (Wire::Require, Verify::Full),
        }
    }

    /// Loads the CA and client certificate once, for any number of connections.
    pub fn connector(&self) -> Result<PgConnector, ConnectError> {
        let settings = |source| ConnectError::Settings {
            keys: self.keys,
            source,
        };
        let (wire, verify) = self.plan();
        let identity = self.identity();
        let config = match wire {
            // Never used on the wire; tokio-postgres wants a connector anyway.
            Wire::Disable => client_config(Verify::Nothing, None, None),
            _ => client_config(verify, self.sslrootcert.as_deref(), identity.as_ref()),
        }
        .map_err(settings)?;
        Ok(PgConnector {
            settings: self.clone(),
            wire,
            tls: MakeRustlsConnect::new(config),
        })
    }

    /// The same settings for the replication stream (pgwire-replication,
    /// which loads the files itself). `host` is the host connected to: an IP
    /// address is also the name verified under `verify-full`, as tokio-postgres
    /// does.
    pub fn replication(&self, host: &str) -> pgwire_replication::TlsConfig {
        use pgwire_replication::{SslMode as Repl, TlsConfig};
        let ca = self.sslrootcert.clone();
        let mut tls = match self.plan() {
            (Wire::Disable, _) => TlsConfig::disabled(),
            (Wire::Prefer, Verify::Nothing) => TlsConfig {
                mode: Repl::Prefer,
                ..TlsConfig::default()
            },
            (_, Verify::Nothing) => TlsConfig::require(),
            (_, Verify::Chain) => TlsConfig::verify_ca(ca),
            (_, Verify::Full) => TlsConfig::verify_full(ca),
        };
        if tls.mode == Repl::VerifyFull && host.parse::<std::net::IpAddr>().is_ok() {
            tls = tls.with_sni_hostname(host);
        }
        if let Some(identity) = self.identity() {
            tls = tls.with_client_cert(identity.cert, identity.key);
        }
        tls
    }

    /// A warning for start-up when `pg`'s password would travel to a server
    /// reached over the network without `verify-full`, the one mode that
    /// stops an active attacker from reading or relaying it; `None` when no
    /// password is set or every host is a Unix socket or a loopback address
    /// (nothing crosses a network). Names the host and the key, never the password.
    pub fn unverified_credentials(&self, pg: &tokio_postgres::Config) -> Option<String> {
        use tokio_postgres::config::Host;
        if self.sslmode == SslMode::VerifyFull || pg.get_password().is_none() {
            return None;
        }
        let remote: Vec<&str> = pg
            .get_hosts()
            .iter()
            .filter_map(|host| match host {
                Host::Tcp(name) if !is_loopback(name) => Some(name.as_str()),
                _ => None,
            })
            .collect();
        if remote.is_empty() {
            return None;
        }
        let how = match self.plan() {
            (Wire::Disable, _) => "in the clear",
            (Wire::Prefer, Verify::Nothing) => {
                "over TLS only if the server offers it, and without checking its certificate"
            }
            (_, Verify::Nothing) => "over TLS without checking the server's certificate",
            (Wire::Prefer, _) => {
                "over TLS only if the server offers it, without checking the name in its certificate"
            }
            _ => "over TLS without checking the name in the server's certificate",
        };
        Some(format!(
            "the password for {} is sent {how} (`{keys}.sslmode = \"{mode}\"`): an attacker on the network could read or relay it; set `{keys}.sslmode = \"verify-full\"` with `{keys}.sslrootcert`",
            remote.join(", "),
            keys = self.keys,
            mode = self.sslmode,
        ))
    }
}

/// `localhost` or a loopback address.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Opens connections with one set of TLS settings (cheap to clone).
#[derive(Clone)]
pub struct PgConnector {
    settings: PgTls,
    wire: Wire,
    tls: MakeRustlsConnect,
}

impl PgConnector {
    /// Sets `pg`'s `sslmode` to these settings'.
    pub fn configure(&self, pg: &mut tokio_postgres::Config) {
        pg.ssl_mode(self.wire);
    }

    /// The TLS connector, for a pool (call [`PgConnector::configure`] on its config).
    pub fn make_tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// Connects; the connection is driven by a task of its own, which ends
    /// when the client drops and logs how it ended as `what`'s.
    pub async fn connect(
        &self,
        pg: &tokio_postgres::Config,
        what: &'static str,
    ) -> Result<Client, ConnectError> {
        let mut pg = pg.clone();
        self.configure(&mut pg);
        match pg.connect(self.tls.clone()).await {
            Ok((client, connection)) => {
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::warn!("{what} connection closed: {}", describe(&e));
                    }
                });
                Ok(client)
            }
            Err(e) => Err(self.explain(&pg, e).await),
        }
    }

    /// Tells a failed connection's error apart: a refused certificate, or
    /// a refusal without TLS where a connection over TLS gets through (one
    /// more connection, made only then, with the same credentials over TLS
    /// without verification: never weaker than the plain one refused).
    pub async fn explain(
        &self,
        pg: &tokio_postgres::Config,
        e: tokio_postgres::Error,
    ) -> ConnectError {
        let keys = self.settings.keys;
        if let Some(reason) = refused_certificate(&e) {
            return ConnectError::CertificateRefused { keys, reason };
        }
        let refused_plain = self.wire == Wire::Disable
            && e.code() == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION);
        if refused_plain && accepted_over_tls(pg).await {
            return ConnectError::SslRequired {
                keys,
                server: e
                    .as_db_error()
                    .map_or_else(|| describe(&e), |db| db.message().to_owned()),
            };
        }
        ConnectError::Postgres(e)
    }
}

/// Whether the server gets past `pg_hba.conf` for `pg` over TLS: it
/// connects, or refuses with anything but `28000` (a wrong password is past it).
async fn accepted_over_tls(pg: &tokio_postgres::Config) -> bool {
    let Ok(config) = client_config(Verify::Nothing, None, None) else {
        return false;
    };
    let mut probe = pg.clone();
    probe.ssl_mode(Wire::Require);
    match probe.connect(MakeRustlsConnect::new(config)).await {
        Ok((client, connection)) => {
            drop(client);
            let _ = connection.await;
            true
        }
        Err(e) => e
            .code()
            .is_some_and(|c| *c != SqlState::INVALID_AUTHORIZATION_SPECIFICATION),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tls(mode: SslMode) -> PgTls {
        PgTls::new(mode, "database")
    }

    #[test]
    fn settings_that_cannot_work_name_their_key() {
        let err = |t: PgTls| t.check().expect_err("refused").key;
        assert_eq!(err(tls(SslMode::VerifyFull)), "database.sslrootcert");
        assert_eq!(err(tls(SslMode::VerifyCa)), "database.sslrootcert");
        let mut t = tls(SslMode::Disable);
        t.sslrootcert = Some("/ca.pem".into());
        assert_eq!(err(t), "database.sslrootcert");
        let mut t = tls(SslMode::Disable);
        t.sslcert = Some("/c.pem".into());
        t.sslkey = Some("/k.pem".into());
        assert_eq!(err(t), "database.sslcert");
        let mut t = tls(SslMode::Require);
        t.sslcert = Some("/c.pem".into());
        assert_eq!(err(t), "database.sslkey");
        let mut t = tls(SslMode::Require);
        t.sslkey = Some("/k.pem".into());
        assert_eq!(err(t), "database.sslcert");
        for mode in [SslMode::Disable, SslMode::Prefer, SslMode::Require] {
            tls(mode).check().expect("no files needed");
        }
    }

    #[test]
    fn modes_follow_libpq() {
        let plan = |mode, ca: bool| {
            let mut t = tls(mode);
            t.sslrootcert = ca.then(|| "/ca.pem".into());
            t.plan()
        };
        assert_eq!(
            plan(SslMode::Disable, false),
            (Wire::Disable, Verify::Nothing)
        );
        assert_eq!(
            plan(SslMode::Prefer, false),
            (Wire::Prefer, Verify::Nothing)
        );
        // libpq: a root certificate is checked whenever TLS is used.
        assert_eq!(plan(SslMode::Prefer, true), (Wire::Prefer, Verify::Chain));
        assert_eq!(
            plan(SslMode::Require, false),
            (Wire::Require, Verify::Nothing)
        );
        // libpq: `require` with a root certificate verifies it as verify-ca.
        assert_eq!(plan(SslMode::Require, true), (Wire::Require, Verify::Chain));
        assert_eq!(
            plan(SslMode::VerifyCa, true),
            (Wire::Require, Verify::Chain)
        );
        assert_eq!(
            plan(SslMode::VerifyFull, true),
            (Wire::Require, Verify::Full)
        );
    }

    #[test]
    fn the_stream_gets_the_same_settings() {
        use pgwire_replication::SslMode as Repl;
        let mut t = tls(SslMode::VerifyFull);
        t.sslrootcert = Some("/ca.pem".into());
        t.sslcert = Some("/c.pem".into());
        t.sslkey = Some("/k.pem".into());
        let r = t.replication("127.0.0.1");
        assert_eq!(r.mode, Repl::VerifyFull);
        assert_eq!(r.ca_pem_path.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(r.sni_hostname.as_deref(), Some("127.0.0.1"));
        assert!(r.is_mtls());
        assert_eq!(t.replication("db.example").sni_hostname, None);
        let mut t = tls(SslMode::Require);
        assert_eq!(t.replication("h").mode, Repl::Require);
        t.sslrootcert = Some("/ca.pem".into());
        assert_eq!(t.replication("h").mode, Repl::VerifyCa);
        assert_eq!(tls(SslMode::Prefer).replication("h").mode, Repl::Prefer);
        let mut t = tls(SslMode::Prefer);
        t.sslrootcert = Some("/ca.pem".into());
        assert_eq!(t.replication("h").mode, Repl::VerifyCa);
        assert_eq!(tls(SslMode::Disable).replication("h").mode, Repl::Disable);
    }

    #[test]
    fn a_password_over_an_unverified_network_connection_is_warned_of() {
        let pg = |url: &str| url.parse::<tokio_postgres::Config>().expect("url");
        let remote = pg("postgres://app:s3cret-pw@db.example:5432/app");
        for mode in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
        ] {
            let mut t = PgTls::new(mode, "sink");
            t.sslrootcert = (mode == SslMode::VerifyCa).then(|| "/ca.pem".into());
            let warning = t.unverified_credentials(&remote).expect("warned");
            assert!(warning.contains("db.example"), "{warning}");
            assert!(
                warning.contains(&format!("`sink.sslmode = \"{mode}\"`")),
                "{warning}"
            );
            assert!(warning.contains("verify-full"), "{warning}");
            assert!(!warning.contains("s3cret-pw"), "{warning}");
        }
        let mut full = tls(SslMode::VerifyFull);
        full.sslrootcert = Some("/ca.pem".into());
        assert_eq!(full.unverified_credentials(&remote), None);
        let prefer = tls(SslMode::Prefer);
        assert_eq!(
            prefer.unverified_credentials(&pg("postgres://app@db.example/app")),
            None
        );
        for local in [
            "postgres://app:pw@localhost/app",
            "postgres://app:pw@127.0.0.1:15432/app",
            "postgres://app:pw@[::1]/app",
            "host=/var/run/postgresql user=app password=pw",
        ] {
            assert_eq!(prefer.unverified_credentials(&pg(local)), None, "{local}");
        }
        let both = pg("host=127.0.0.1,db.example user=app password=pw");
        let warning = prefer.unverified_credentials(&both).expect("warned");
        assert!(warning.contains("for db.example is sent"), "{warning}");
    }

    #[test]
    fn the_key_path_is_not_shown() {
        let mut t = tls(SslMode::Require);
        t.sslcert = Some("/c.pem".into());
        t.sslkey = Some("/secret/k.pem".into());
        assert!(!format!("{t:?}").contains("/secret/k.pem"));
    }

    #[test]
    fn unreadable_files_are_settings_errors() {
        let mut t = tls(SslMode::VerifyFull);
        t.sslrootcert = Some("/nonexistent/ca.pem".into());
        let e = t.connector().err().expect("refused");
        assert!(e.is_fatal());
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        assert!(tls(SslMode::Disable).connector().is_ok());
    }
}
