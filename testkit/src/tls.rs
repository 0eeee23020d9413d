//! Certificates for TLS tests, made with `openssl` in a directory the test
//! owns: a CA with a server certificate for `127.0.0.1` and `localhost`
//! signed by it ([`server_certs`]), and a CA that signed nothing
//! ([`unrelated_ca`]), to check that a wrong CA is refused. The shared test
//! PostgreSQL brings its own certificates (`scripts/services`); these serve
//! the servers a test starts itself (webhook receiver, redis-server).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};

/// Days the certificates are valid: longer than any test run.
const DAYS: &str = "2";

/// A CA and a server certificate it signed, as PEM files.
#[derive(Debug, Clone)]
pub struct ServerCerts {
    /// The CA's certificate (`ca.crt`): what a client trusts.
    pub ca: PathBuf,
    /// The server's certificate (`server.crt`), for 127.0.0.1 and localhost.
    pub cert: PathBuf,
    /// The server's private key (`server.key`).
    pub key: PathBuf,
}

/// Runs `openssl` with `args` in `dir`; its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("run openssl")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A new key (`key`) and a certificate (`crt`) for `subject`, made in `dir`;
/// `more` adds the signing CA and the extensions.
fn new_cert(dir: &Path, subject: &str, (key, crt): (&str, &str), more: &[&str]) -> Result<()> {
    let args = [
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", subject,
        "-keyout", key, "-out", crt,
    ];
    openssl(dir, &[&args[..], more].concat())
}

/// A self-signed CA named `cn` in `dir`: `<name>.key` and `<name>.crt`;
/// returns the certificate's path.
fn make_ca(dir: &Path, name: &str, cn: &str) -> Result<PathBuf> {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    let ca = ["-addext", "basicConstraints=critical,CA:TRUE"];
    new_cert(dir, &format!("/CN={cn}"), (&key, &crt), &ca)?;
    Ok(dir.join(crt))
}

/// A CA (`ca.crt`, `ca.key`) and a server certificate for 127.0.0.1 and
/// localhost signed by it (`server.crt`, `server.key`), made in `dir`.
pub fn server_certs(dir: &Path) -> Result<ServerCerts> {
    let ca = make_ca(dir, "ca", "oncely test CA")?;
    let signed = [
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-addext",
        "subjectAltName=DNS:localhost,IP:127.0.0.1",
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-addext",
        "extendedKeyUsage=serverAuth",
    ];
    new_cert(dir, "/CN=localhost", ("server.key", "server.crt"), &signed)?;
    Ok(ServerCerts {
        ca,
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    })
}

/// A CA that signed nothing a server has (`other-ca.crt` in `dir`): trusting
/// only it, a client must refuse every server.
pub fn unrelated_ca(dir: &Path) -> Result<PathBuf> {
    make_ca(dir, "other-ca", "not the oncely test CA")
}
