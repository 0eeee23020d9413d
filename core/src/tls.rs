//! TLS client settings shared by capture, the sinks and verify: the rustls
//! crypto provider, CA files, client certificates, and certificate verifiers
//! for the libpq-style `sslmode`s.
//!
//! One provider (ring) is used everywhere and installed as the process
//! default, because crates that build their own rustls configuration (the
//! `redis` crate) need one and the dependency graph compiles more than one.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// Why TLS settings could not be built (never contains key material).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file cannot be read or holds no certificate.
    #[error("CA file {path}: {reason}")]
    CaFile {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The client certificate or its key cannot be read.
    #[error("client certificate {path}: {reason}")]
    ClientCert {
        /// The certificate or key file.
        path: String,
        /// What is wrong (never the key's content).
        reason: String,
    },
    /// rustls refused the settings.
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    /// The certificate verifier could not be built.
    #[error("certificate verifier: {0}")]
    Verifier(String),
}

/// The crypto provider of every TLS connection the sinks open; installed as
/// the process default on first use (a default installed earlier is kept).
pub fn provider() -> Arc<CryptoProvider> {
    if let Some(p) = CryptoProvider::get_default() {
        return p.clone();
    }
    // Losing a race to another installer is fine: use whatever won.
    let _ = rustls::crypto::ring::default_provider().install_default();
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// The certificates of a PEM file, as trust anchors.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let err = |reason: String| TlsError::CaFile {
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no certificate in the file".into()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| err(e.to_string()))?;
    }
    Ok(roots)
}

/// A client certificate (PEM chain, leaf first) and its private key (PEM:
/// PKCS#8, PKCS#1 or SEC1), as libpq's `sslcert` and `sslkey`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate file.
    pub cert: std::path::PathBuf,
    /// The key file.
    pub key: std::path::PathBuf,
}

impl ClientIdentity {
    fn load(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
        let err = |path: &Path, reason: String| TlsError::ClientCert {
            path: path.display().to_string(),
            reason,
        };
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| err(&self.cert, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err(&self.cert, e.to_string()))?;
        if certs.is_empty() {
            return Err(err(&self.cert, "no certificate in the file".into()));
        }
        // The PEM error names the file's problem, never its content.
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| err(&self.key, format!("no usable private key: {e}")))?;
        Ok((certs, key))
    }
}

/// True when `e`, or an error along its source chain, is a server
/// certificate that TLS verification refused — found by type, never by text.
/// Such an error is fatal: retrying cannot fix a certificate or a CA file.
pub fn is_certificate_error(e: &(dyn std::error::Error + 'static)) -> bool {
    refused_certificate(e).is_some()
}

/// Why TLS verification refused the server's certificate (rustls's reason,
/// e.g. `invalid peer certificate: UnknownIssuer`), when `e` or an error
/// along its source chain is such a refusal.
pub fn refused_certificate(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(reason) = refusal(err) {
            return Some(reason);
        }
        next = err.source();
    }
    None
}

fn refusal(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    if let Some(e @ rustls::Error::InvalidCertificate(_)) = err.downcast_ref::<rustls::Error>() {
        return Some(e.to_string());
    }
    if let Some(io) = err.downcast_ref::<std::io::Error>() {
        return io.get_ref().and_then(|inner| refused_certificate(inner));
    }
    if let Some(shared) = err.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
        return refused_certificate(shared.as_ref());
    }
    None
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Encrypt only: any certificate is accepted (the handshake's signatures
    /// are still checked). libpq's `require` without a root certificate.
    Nothing,
    /// The chain must lead to a trusted CA; the host name is not checked
    /// (libpq's `verify-ca`).
    Chain,
    /// Chain and host name (libpq's `verify-full`).
    Full,
}

/// A client configuration verifying as `verify` says, trusting the CAs of
/// `ca_file` (needed unless `verify` is [`Verify::Nothing`]), presenting
/// `identity` when the server asks for a client certificate.
pub fn client_config(
    verify: Verify,
    ca_file: Option<&Path>,
    identity: Option<&ClientIdentity>,
) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let verifier: Arc<dyn ServerCertVerifier> = match (verify, ca_file) {
        (Verify::Nothing, _) => Arc::new(AnyCertificate(provider)),
        (_, None) => {
            return Err(TlsError::Verifier(
                "verifying the server needs a CA file".into(),
            ))
        }
        (v, Some(path)) => {
            let roots = Arc::new(load_roots(path)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
            if v == Verify::Full {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    Ok(match identity {
        Some(identity) => {
            let (certs, key) = identity.load()?;
            builder.with_client_auth_cert(certs, key)?
        }
        None => builder.with_no_client_auth(),
    })
}

/// Accepts any server certificate, checking only the handshake signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Full verification minus the host name: a certificate for another name,
/// signed by a trusted CA, is accepted.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The chain is checked before the name: a name error means the chain is good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let missing = Path::new("/nonexistent/oncely-ca.pem");
        let e = load_roots(missing).expect_err("missing");
        assert!(e.to_string().contains("/nonexistent/oncely-ca.pem"), "{e}");
        let empty = std::env::temp_dir().join(format!("oncely-empty-ca-{}", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = load_roots(&empty).expect_err("empty");
        assert!(e.to_string().contains("no certificate"), "{e}");
        std::fs::remove_file(empty).expect("remove");
        assert!(client_config(Verify::Full, None, None).is_err());
        assert!(client_config(Verify::Nothing, None, None).is_ok());
        let identity = ClientIdentity {
            cert: missing.to_path_buf(),
            key: missing.to_path_buf(),
        };
        let e = client_config(Verify::Nothing, None, Some(&identity)).expect_err("no cert");
        assert!(
            e.to_string().contains("client certificate /nonexistent"),
            "{e}"
        );
    }
}
